//! The commands of the `promptforge` binary, one module each. A command parses its flags,
//! builds what it needs through [`crate::session`], and reports through [`crate::report`];
//! no command imports another.

pub(crate) mod batch;
pub(crate) mod cache;
pub(crate) mod check;
pub(crate) mod describe;
pub(crate) mod lsp;
pub(crate) mod mcp;
pub(crate) mod models;
pub(crate) mod replay;
pub(crate) mod run;
pub(crate) mod runs;

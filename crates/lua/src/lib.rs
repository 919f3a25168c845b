//! `promptforge-lua`: the section VM.
//!
//! A section VM is a fresh Lua 5.5 state per section entry: the sandbox (only `string`,
//! `table`, `math` and the listed base functions), the Engine globals installed in the
//! specified order, the guards on `var`, `sys` and `_G`, deterministic `pairs`/`next`, error
//! values, and the yield shims through which suspending calls reach the engine. It does no I/O.

pub(crate) mod conversation;
pub mod json;
mod json_raw;
mod loop_list;
mod loop_raw;
mod loop_walk;
pub mod models;
pub(crate) mod order;
pub(crate) mod raise;
pub(crate) mod substitution;
pub mod task_id;
pub mod untrusted;
pub mod vm;

pub use promptforge_protocol::errors;

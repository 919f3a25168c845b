//! `promptforge-syntax`: the prompt-file grammar.
//!
//! Turns the text of a prompt file into a [`Prompt`]: the frontmatter contract, the H1 title
//! and body, the section tree with its blocks and list items, and every Lua region compiled
//! with Lua 5.5. Failures are [`ParseError`]s with one of the five parse error kinds and the
//! spec's exact message. This crate runs nothing.

pub mod compile;
pub mod error;
pub mod frontmatter;
pub mod heading_ref;
pub mod names;
pub mod outline;
pub mod prompt;
mod relines;
mod scan;

pub use compile::LuaRegion;
pub use error::{ParseError, ParseErrorKind};
pub use frontmatter::Frontmatter;
pub use outline::{Outline, OutlineFence, OutlineHeading};
pub use prompt::{Block, Prompt, ProseBlock, Section, SectionId};

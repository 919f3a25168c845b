//! `promptforge-protocol`: the data every layer of PromptForge exchanges, and nothing else.
//!
//! Invariant: plain data with serde derives and pure functions over it; no Lua, no I/O, no
//! clock. The section VM (`promptforge-lua`) decodes what a section asks for into these types
//! once, the engine carries them in its effects, and the Harness performs them; each layer
//! depends on this crate for the shared vocabulary instead of on the layer above or below it.
//!
//! - [`conversation`]: message records, content and parts, tool calls, tool specs, a model's
//!   reply and its usage (chapter 11).
//! - [`effect`]: the effects a run asks its Host for (model rounds, store operations, tool
//!   calls, operator questions, timers), their ids and delivery classes.
//! - [`errors`]: run error kinds, error values, and the answer to a suspended call.
//! - [`store`]: store paths, patterns, line ranges, and the store's operations, answers and
//!   failures (chapter 09).
//! - [`host`]: what a Host tells a run at prepare (Plugins, tools, its current model).
//! - [`request`]: what a section asks its engine for when it suspends, one typed request per
//!   suspending call.

pub mod conversation;
pub mod effect;
pub mod errors;
pub mod host;
pub mod request;
pub mod store;

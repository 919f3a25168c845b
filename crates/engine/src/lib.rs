//! `promptforge-engine`: one run of a prompt, as a state machine that never does I/O itself.
//!
//! The engine walks the prompt (prepare, the H1 pass, the main walk), runs each section's Lua
//! in a fresh section VM from `promptforge-lua`, and ends every run in exactly one
//! [`Outcome`]. The Host drives it with [`Run::step`] and answers Harness work with
//! [`Run::resume`]; the seed and start instant arrive in the [`RunContext`].

pub mod args;
pub mod determinism;
pub mod events;
pub mod outcome;
pub mod prepare;
pub mod run;
pub mod store_path;
pub mod when;

pub use events::Event;
pub use outcome::{Outcome, RunError, RunErrorKind, first_step};
pub use prepare::{HostState, ModelInfo, PluginInfo, ThinkingCapability, ToolInfo};
pub use run::{Effect, EffectId, Run, RunContext, Step};

//! `promptforge-engine`: one run of a prompt, as a state machine that never does I/O itself.
//!
//! The engine walks the prompt (prepare, the H1 pass, the main walk), runs each section's Lua
//! in a fresh section VM from `promptforge-lua`, keeps every concurrent line of work (the main
//! walk, fanout arms, tasks) as a strand it schedules, and ends every run in exactly one
//! [`Outcome`]. The Host drives it with [`Run::step`] and answers Harness work with
//! [`Run::resume`]; the [`protocol`] module holds every type the two exchange, and the seed and
//! start instant arrive in the [`RunContext`].

// The in-process driver the integration tests use (`tests/util`), shared with the unit tests
// of the run's rooms: it names the crate by its public name.
#[cfg(test)]
extern crate self as promptforge_engine;
#[cfg(test)]
#[path = "../tests/util/mod.rs"]
pub(crate) mod driver;

pub mod args;
mod context;
pub mod determinism;
mod entry;
pub mod events;
mod failure;
mod fanout;
mod ids;
pub mod outcome;
pub mod prepare;
pub mod protocol;
pub use promptforge_protocol::store as store_path;
mod report;
mod requests;
pub mod run;
mod scheduler;
mod strand;
mod tasks;
mod visible;
mod walk;
pub mod when;

pub use events::{AbandonReason, Event, EventKind, Origin, TaskEnding};
pub use outcome::{Outcome, RunError, RunErrorKind, first_step};
pub use prepare::{HostState, ModelInfo, PluginInfo, ThinkingCapability, ToolInfo};
pub use protocol::{
    Answer, Batch, Commits, Delivery, Effect, EffectId, ErrorValue, PROVISIONAL, Step,
    is_provisional,
};
pub use run::{EffectSite, Run, RunContext};

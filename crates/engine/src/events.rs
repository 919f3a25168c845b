//! The run's event stream: lifecycle reports and author checkpoints, as values.
//!
//! Reports carry section names and never values (no shared globals, no argument text).

use crate::outcome::Outcome;

/// One event of a run, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A walked section entry started (the H1 pass reports none).
    SectionStarted {
        /// Section name.
        section: String,
        /// The entry's `sys.id`.
        id: String,
    },
    /// The shared library replay started in a section VM.
    SharedLoadStarted {
        /// Section name (the title in the H1 pass).
        section: String,
    },
    /// The shared library replay succeeded.
    SharedLoadSucceeded {
        /// Section name.
        section: String,
    },
    /// The shared library replay failed.
    SharedLoadFailed {
        /// Section name.
        section: String,
    },
    /// A Lua block started.
    BlockStarted {
        /// Section name.
        section: String,
        /// The block's location label.
        label: String,
    },
    /// A Lua block succeeded.
    BlockSucceeded {
        /// Section name.
        section: String,
        /// The block's location label.
        label: String,
    },
    /// A Lua block failed.
    BlockFailed {
        /// Section name.
        section: String,
    },
    /// An author checkpoint from `log`.
    Log {
        /// The section whose code called `log`.
        section: String,
        /// The message, verbatim.
        message: String,
    },
    /// The section VM's teardown started.
    TeardownStarted {
        /// Section name.
        section: String,
    },
    /// The section VM's teardown succeeded.
    TeardownSucceeded {
        /// Section name.
        section: String,
    },
    /// A walked section finished (failed sections never do).
    SectionFinished {
        /// Section name.
        section: String,
    },
    /// The run ended with this outcome.
    RunEnded {
        /// The outcome.
        outcome: Outcome,
    },
}

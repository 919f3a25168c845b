//! `promptforge-engine`: one run of a prompt, as a state machine that never does I/O itself.
//!
//! This crate owns run outcomes and the run error kinds, and the first step of every run: the
//! parse result and the `promptforge:` version gate.

pub mod outcome;

pub use outcome::{Outcome, RunError, RunErrorKind, first_step};

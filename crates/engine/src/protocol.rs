//! The protocol between a run and its Host, as the engine speaks it: every type of the
//! `promptforge-protocol` crate's effects and answers (re-exported here, one definition), and
//! what one [`Run::step`](crate::Run::step) returns.

pub use promptforge_protocol::effect::*;
pub use promptforge_protocol::errors::{Answer, ErrorValue, RunErrorKind};

use crate::outcome::Outcome;

/// What [`Run::step`](crate::Run::step) returns.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// The run waits on Harness work: answer each outstanding effect with
    /// [`Run::resume`](crate::Run::resume), in any order, then step again.
    Effects(Batch),
    /// The run ended.
    Done(Outcome),
}

//! A `fanout` in progress (chapter 14): its caller, its arms in collection order, each arm's
//! member and end, and the bytes of the results gathered so far. The run drives it
//! (`run/fanout.rs`); this record holds what it keeps between arms.

use serde_json::Value as Json;

use crate::ids::TaskId;
use crate::strand::StrandId;

/// How an arm ended, kept until every arm has.
#[derive(Debug)]
pub(crate) enum ArmEnd {
    /// With this result ('' when it ran off its walk).
    Done(String),
    /// Its `models.loop` ran past the round cap.
    Exhausted,
}

/// A fanout in progress.
#[derive(Debug)]
pub(crate) struct Fanout {
    /// The strand parked on the `fanout` call.
    pub(crate) caller: StrandId,
    /// The arms' task ids, in collection order.
    pub(crate) arms: Vec<TaskId>,
    /// Each arm's member (an exhausted arm's stub names it).
    pub(crate) items: Vec<Json>,
    pub(crate) ends: Vec<Option<ArmEnd>>,
    pub(crate) remaining: usize,
    /// The bytes of the results gathered so far: they are delivered into the caller's VM,
    /// so more than its memory ceiling fails the fanout before they pile up here.
    pub(crate) bytes: usize,
}

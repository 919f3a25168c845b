//! Strands: the lines of work a run keeps side by side.
//!
//! A strand is one chain stack: the main walk, one fanout arm, or one task. Its bottom chain is
//! the strand's own (task `0`, or the task's id); every `call` pushes a chain on top, and only
//! the top chain's section entry runs. A strand owns its stack, its claims identity, its slot
//! under the concurrency limit, its round count and, while parked on tasks, what it waits for.
//! Strands never touch each other: the run moves answers and results between them.

use std::collections::VecDeque;
use std::sync::Arc;

use promptforge_lua::vm::{Answer, LuaFailure, Request, SectionVm};
use promptforge_syntax::SectionId;
use serde_json::Value as Json;

use crate::determinism::ChainRef;
use crate::events::Event;
use crate::ids::TaskId;
use crate::protocol::EffectId;
use crate::scheduler::{ChainKey, Physical, Work};

/// The deepest a `call`, task or fanout arm may nest, counting the first.
pub const CALL_DEPTH_CAP: u32 = 8;

/// The main walk's strand.
pub(crate) const MAIN: StrandId = 0;

/// How a strand's own chain ended.
#[derive(Debug)]
pub(crate) enum StrandEnd {
    /// With this result (`None`: it ran off its walk).
    Returned(Option<String>),
    /// With this failure; `h1_gate` when the H1 pass's own blocks failed.
    Failed {
        failure: promptforge_lua::vm::LuaFailure,
        h1_gate: bool,
    },
}

/// A task notice waiting for the model of the section that started the task.
#[derive(Debug, Clone)]
pub(crate) struct Notice {
    pub(crate) task: TaskId,
    pub(crate) text: String,
}

pub(crate) use crate::ids::StrandId;

/// Where a section entry sits, for its blocks and for error classification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// The H1 pass.
    H1,
    /// A section (on any walk).
    Section(SectionId),
}

/// What a section entry is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Replaying the shared library.
    Shared,
    /// Running its blocks.
    Blocks,
}

/// What a suspended entry waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Harness work.
    Effect(EffectId, Work),
    /// A chain its `call` started (the chain above it on the stack).
    Chain,
    /// Tasks: the strand's [`TaskWait`] says which.
    Tasks,
}

/// A section entry in progress: its VM, its stage, and the next block to run.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) place: Place,
    pub(crate) name: String,
    pub(crate) vm: SectionVm,
    pub(crate) stage: Stage,
    pub(crate) next_block: usize,
    /// A coroutine (shared load or block) is in progress.
    pub(crate) running: bool,
    /// What the coroutine waits on, if it is suspended.
    pub(crate) waiting: Option<Wait>,
    /// The answer to deliver at the next resume.
    pub(crate) answer: Option<Answer>,
    /// Tasks this entry's model started, in start order (they end with the section).
    pub(crate) model_tasks: Vec<TaskId>,
    /// Task notices waiting for this entry's next round, in arrival order.
    pub(crate) notices: Vec<Notice>,
    /// A suspended call not dispatched yet: the strand ran ahead to it, and it waits for the
    /// committed order to reach it.
    pub(crate) pending: Option<Box<Request>>,
    /// The model round or bound tool call the entry waits on, reported when its answer is
    /// delivered.
    pub(crate) awaiting: Option<Awaiting>,
}

/// A model round or bound tool call an entry waits on, for its event.
#[derive(Debug, Clone)]
pub(crate) enum Awaiting {
    /// A model round on this model.
    Round { model: String, model_id: String },
    /// A bound tool call by this alias.
    Tool { alias: String },
}

impl Entry {
    /// Hand the suspended call its answer: the entry runs again at the next advance.
    pub(crate) fn answer_with(&mut self, answer: Answer) {
        self.waiting = None;
        self.answer = Some(answer);
    }
}

/// One level of a walk: a list of sibling sections (the children of `parent`, or the top
/// level) and the next one to enter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Level {
    pub(crate) parent: Option<SectionId>,
    pub(crate) next: usize,
}

/// What a chain's first entry receives besides the chain's own input: a task's or an arm's
/// `item` and `sys.index`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seed {
    pub(crate) item: Option<Json>,
    pub(crate) index: Option<i64>,
}

/// A chain: a walk begun by the run, a `call`, a fanout arm, or a spawn.
#[derive(Debug)]
pub(crate) struct Chain {
    /// The chain id (`0` for the main walk; a child is `{parent}.{n}`).
    pub(crate) id: TaskId,
    /// Its node in the admission tree.
    pub(crate) key: ChainKey,
    /// Entries started so far (`sys.id` is `{id}.{n}`).
    pub(crate) entries: u64,
    /// Children started so far (called chains, tasks, arms, timed waits).
    pub(crate) children: u32,
    /// The walk's levels (a jump to a child pushes one; a level that runs out pops).
    pub(crate) levels: Vec<Level>,
    /// The chain's `var`.
    pub(crate) var: Json,
    /// The chain's input: `args` and its (frozen, after the H1 pass) `argv`.
    pub(crate) args: Arc<str>,
    pub(crate) argv: Arc<Json>,
    /// Call depth (0 for the main walk).
    pub(crate) depth: u32,
    /// The section entry in progress.
    pub(crate) entry: Option<Box<Entry>>,
    /// For the first entry only: the `item` and `sys.index` it gets.
    pub(crate) seed: Option<Seed>,
    /// Tasks this chain spawned (or its model started), in spawn order.
    pub(crate) owned: Vec<TaskId>,
    /// Model tasks and notices the H1 pass hands to the walk's next entry.
    pub(crate) carried: Option<Box<(Vec<TaskId>, Vec<Notice>)>>,
}

impl Chain {
    /// Every task the chain owns: the ones it spawned (or its model started), then those the
    /// H1 pass handed to it.
    pub(crate) fn all_owned(&self) -> Vec<TaskId> {
        let mut ids = self.owned.clone();
        if let Some(carried) = &self.carried {
            ids.extend(carried.0.iter().cloned());
        }
        ids
    }
}

/// What a queued task needs to start its chain once it is admitted.
#[derive(Debug)]
pub(crate) struct Start {
    pub(crate) section: SectionId,
    pub(crate) var: Arc<Json>,
    pub(crate) args: Arc<str>,
    pub(crate) argv: Arc<Json>,
    pub(crate) seed: Seed,
}

/// A strand's place under the concurrency limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// The main walk: it never waits for a slot.
    Exempt,
    /// Waiting to be admitted (first run, or taking its slot back after a wait).
    Queued,
    /// Holding a slot.
    Held,
    /// Parked on a wait on tasks, its slot given back.
    Lent,
}

/// A wait on tasks a strand is parked on.
#[derive(Debug, Clone)]
pub(crate) enum TaskWait {
    /// `tasks.join_any`: the first member to end.
    JoinAny {
        members: Vec<TaskId>,
        timer: Option<EffectId>,
    },
    /// `tasks.join`: every member (positions kept, duplicates included).
    Join {
        members: Vec<TaskId>,
        timer: Option<EffectId>,
    },
    /// `fanout`: every arm.
    Fanout(u64),
    /// The model's `await_tasks`: the first of the section's model tasks to end.
    Await {
        timer: Option<EffectId>,
        /// The timeout as the model gave it, for `slept {seconds} seconds`.
        seconds: Option<f64>,
    },
}

impl TaskWait {
    /// The timer behind the wait, if it has one.
    pub(crate) fn timer(&self) -> Option<EffectId> {
        match self {
            TaskWait::JoinAny { timer, .. }
            | TaskWait::Join { timer, .. }
            | TaskWait::Await { timer, .. } => *timer,
            TaskWait::Fanout(_) => None,
        }
    }
}

/// One line of work.
#[derive(Debug)]
pub(crate) struct Strand {
    pub(crate) id: StrandId,
    /// The strand's task id (`0` for the main walk).
    pub(crate) task: TaskId,
    /// The chain stack; empty until a queued task is first admitted.
    pub(crate) stack: Vec<Chain>,
    /// Set until the first admission: what the bottom chain starts from.
    pub(crate) start: Option<Box<Start>>,
    /// The claims identity every chain of the strand shares.
    pub(crate) claims: ChainRef,
    /// The chain that owns this task (`None` for the main walk).
    pub(crate) owner: Option<ChainKey>,
    /// Spawn position, for admission order.
    pub(crate) seq: u64,
    pub(crate) slot: Slot,
    /// The task's round count.
    pub(crate) turns: u32,
    /// The wait on tasks the strand is parked on.
    pub(crate) wait: Option<TaskWait>,
    /// The depth of the strand's own chain.
    pub(crate) depth: u32,
    /// Work done ahead of the committed order, not committed yet.
    pub(crate) ahead: Option<Box<Ahead>>,
    /// Where the strand stopped running ahead when it was not at a suspended call: what the
    /// committed order does next on it.
    pub(crate) cont: Option<Box<Cont>>,
    /// Started in fact before the committed order admitted it.
    pub(crate) started_ahead: bool,
    /// Started before a slot was free in fact (prepared while the Host waits): its effects
    /// are held until it gets one.
    pub(crate) held: bool,
    /// Its own chain ended in fact, ahead of the committed order.
    pub(crate) zombie: bool,
    /// What the strand counts for in the admission tree's physical tally.
    pub(crate) physical: Physical,
}

/// What the committed order does on a strand that stopped running ahead between calls.
#[derive(Debug)]
pub(crate) enum Cont {
    /// Its own chain ended this way.
    End(StrandEnd),
    /// A chain failed this way (a cancel, which ends the run).
    Failed {
        place: Place,
        failure: LuaFailure,
        around: bool,
    },
}

/// What starts a segment of work done ahead, in the committed order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// The task's admission (its first run).
    Admission,
    /// The answer to this effect.
    Effect(EffectId),
}

/// A strand's state as others may see it (`tasks.status`, a stop's teardown), where the
/// committed order last left it.
#[derive(Debug, Clone, Default)]
pub(crate) struct View {
    /// The section of its own chain's entry.
    pub(crate) section: Option<String>,
    /// What it waits on, as if it held its slot (whether it is queued is read from its slot
    /// when the view is read).
    pub(crate) blocked: Option<&'static str>,
    /// Its round count.
    pub(crate) turns: u32,
    /// Each chain's entry in progress, bottom first.
    pub(crate) entries: Vec<Option<String>>,
}

/// One stretch of a strand's work done ahead: from the answer (or admission) that starts it to
/// the next wait. Committing it releases its events and gives its effects their final ids,
/// exactly as running it at that point of the order would have.
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) trigger: Trigger,
    pub(crate) events: Vec<Event>,
    /// The effects it issued, by provisional id, in issue order.
    pub(crate) issued: Vec<EffectId>,
    /// The strand as it was at the segment's end.
    pub(crate) end: View,
    /// It ended at a point only the committed order may pass (a pending call or a `Cont`).
    pub(crate) paused: bool,
}

/// A strand's work ahead of the committed order.
#[derive(Debug)]
pub(crate) struct Ahead {
    /// The strand where the committed order left it.
    pub(crate) view: View,
    /// The segments not committed yet, oldest first.
    pub(crate) segments: VecDeque<Segment>,
}

impl Strand {
    /// A strand that has run nothing yet: no chain, no wait, no work ahead.
    pub(crate) fn new(
        id: StrandId,
        task: TaskId,
        claims: ChainRef,
        owner: Option<ChainKey>,
        seq: u64,
        slot: Slot,
        depth: u32,
    ) -> Strand {
        Strand {
            id,
            task,
            stack: Vec::new(),
            start: None,
            claims,
            owner,
            seq,
            slot,
            turns: 0,
            wait: None,
            depth,
            ahead: None,
            cont: None,
            started_ahead: false,
            held: false,
            zombie: false,
            physical: Physical::None,
        }
    }

    /// The running chain.
    pub(crate) fn top(&self) -> Option<&Chain> {
        self.stack.last()
    }

    /// The running chain, mutably.
    pub(crate) fn top_mut(&mut self) -> Option<&mut Chain> {
        self.stack.last_mut()
    }

    /// The round count where the committed order left it.
    pub(crate) fn committed_turns(&self) -> u32 {
        self.ahead.as_ref().map_or(self.turns, |a| a.view.turns)
    }

    /// The segment the committed order takes next, if the strand is ahead.
    pub(crate) fn front_trigger(&self) -> Option<Trigger> {
        self.ahead
            .as_ref()
            .and_then(|a| a.segments.front())
            .map(|s| s.trigger)
    }
}

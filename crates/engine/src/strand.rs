//! Strands: the lines of work a run keeps side by side.
//!
//! A strand is one chain stack: the main walk, one fanout arm, or one task. Its bottom chain is
//! the strand's own (task `0`, or the task's id); every `call` pushes a chain on top, and only
//! the top chain's section entry runs. A strand owns its stack, its claims identity, its slot
//! under the concurrency limit, its round count and, while parked on tasks, what it waits for.
//! Strands never touch each other: the run moves answers and results between them.

use std::sync::Arc;

use promptforge_lua::vm::{Answer, SectionVm};
use promptforge_syntax::SectionId;
use serde_json::Value as Json;

use crate::determinism::ChainRef;
use crate::ids::TaskId;
use crate::protocol::EffectId;
use crate::scheduler::{ChainKey, Work};
use crate::tasks::Notice;

/// A strand's id: its position in creation order (never reused within a run).
pub(crate) type StrandId = u64;

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
}

impl Strand {
    /// The running chain.
    pub(crate) fn top(&self) -> Option<&Chain> {
        self.stack.last()
    }

    /// The running chain, mutably.
    pub(crate) fn top_mut(&mut self) -> Option<&mut Chain> {
        self.stack.last_mut()
    }
}

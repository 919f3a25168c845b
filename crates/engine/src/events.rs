//! The run's event stream: lifecycle reports and author checkpoints, as values.
//!
//! Every event names the task it happened on (`0` for the main walk), so the stream of a run
//! whose tasks interleave can be read per task; the events of one task come in the order that
//! task did things, and the whole stream is the same on every run with the same prompt, seed,
//! start instant and answers. Reports carry section names and task ids, never values (no shared
//! globals, no argument text, no results).

use crate::outcome::Outcome;

/// One event of a run, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The task the event happened on (`0` for the main walk and the chains it calls).
    pub task: String,
    /// What happened.
    pub kind: EventKind,
}

/// Who started a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The prompt: `tasks.spawn` or a fanout arm.
    Author,
    /// The model, through its `task` built-in.
    Model,
}

impl Origin {
    /// `author` or `model`, as `tasks.status` reads it.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Author => "author",
            Origin::Model => "model",
        }
    }
}

/// How a task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskEnding {
    /// Its chain returned or ran off its walk.
    Succeeded,
    /// Its chain failed.
    Failed,
    /// Its owner (or a failing sibling arm's fail-fast) stopped it.
    Cancelled,
    /// Its owner ended while it was live, for this reason.
    Abandoned(AbandonReason),
}

/// Why a live task was abandoned (chapter 15, "Abandon reasons").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbandonReason {
    /// The owner ended normally.
    OwnerReturned,
    /// The owner failed.
    OwnerFailed,
    /// The owner's `models.loop` ran past its round cap.
    ToolLoopExhausted,
    /// The owner was stopped from outside.
    OwnerAborted,
    /// The run itself ended.
    RunTerminated,
}

impl AbandonReason {
    /// The reason's tag.
    pub fn as_str(self) -> &'static str {
        match self {
            AbandonReason::OwnerReturned => "owner_returned",
            AbandonReason::OwnerFailed => "owner_failed",
            AbandonReason::ToolLoopExhausted => "tool_loop_exhausted",
            AbandonReason::OwnerAborted => "owner_aborted",
            AbandonReason::RunTerminated => "run_terminated",
        }
    }

    /// The phrase the model is told.
    pub fn phrase(self) -> &'static str {
        match self {
            AbandonReason::OwnerReturned => "the section ended",
            AbandonReason::OwnerFailed => "the owner failed",
            AbandonReason::ToolLoopExhausted => "the tool loop was exhausted",
            AbandonReason::OwnerAborted => "the owner was aborted",
            AbandonReason::RunTerminated => "the run ended",
        }
    }
}

/// A fanout arm's place, for a display: `index` of `of` (1-based), and a short preview of its
/// item (a string as written, anything else as compact JSON; at most 40 characters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arm {
    /// Its 1-based position.
    pub index: usize,
    /// How many arms the fanout has.
    pub of: usize,
    /// Its item, shortened.
    pub item: String,
}

/// How a model round ended, as its event reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoundEnd {
    /// A reply: its finish reason, the provider's token counts, and how many tool calls.
    Reply {
        /// The finish reason (`stop`, `tool_calls`, `length`, ...), when the provider gave one.
        finish_reason: Option<String>,
        /// Input tokens, as the provider reported them.
        prompt_tokens: Option<u64>,
        /// Output tokens, as the provider reported them.
        completion_tokens: Option<u64>,
        /// The number of tool calls in the reply.
        tool_calls: usize,
    },
    /// The provider refused the request as too large for the context window.
    Overflow,
    /// The round failed with this error kind.
    Failed {
        /// The error value's kind.
        kind: String,
    },
}

/// What ran a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolVia {
    /// A `tools.add_local` handler, in the section's VM.
    Local,
    /// A bound tool slot, through the Host.
    Bound,
    /// A task built-in the model called (`task`, `task_wait`, ...).
    Task,
}

impl ToolVia {
    /// `local`, `bound` or `task`.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolVia::Local => "local",
            ToolVia::Bound => "bound",
            ToolVia::Task => "task",
        }
    }

    /// The tag's value, if it is one.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "local" => Some(ToolVia::Local),
            "bound" => Some(ToolVia::Bound),
            "task" => Some(ToolVia::Task),
            _ => None,
        }
    }
}

/// What an event reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
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
    /// A walked section finished (failed and stopped sections never do).
    SectionFinished {
        /// Section name.
        section: String,
    },
    /// A task (or fanout arm) was spawned; the event's `task` is the spawner's.
    TaskSpawned {
        /// The new task's id.
        id: String,
        /// The section it runs, without heading marks.
        target: String,
        /// Who started it.
        origin: Origin,
        /// For a fanout arm: where it stands among its siblings and its item, for a display
        /// (never part of the `--events` stream, which stays free of values).
        arm: Option<Arm>,
    },
    /// A task was admitted and started running (the event's `task` is the task).
    TaskStarted,
    /// A model round's answer reached the section that asked for it (in the run's committed
    /// order, so the stream is the same however fast answers arrive; no timings).
    ModelRound {
        /// The section whose code made the round.
        section: String,
        /// The role label (or the model id of a `models.get` id handle).
        model: String,
        /// The catalog model id the round ran on.
        model_id: String,
        /// How the round ended.
        end: RoundEnd,
    },
    /// A tool call ended: a local tool's handler returned or raised, a bound tool answered,
    /// or a task built-in the model called returned.
    ToolCall {
        /// The section whose code (or model) made the call.
        section: String,
        /// The alias or built-in name.
        tool: String,
        /// What ran it.
        via: ToolVia,
        /// Whether it succeeded.
        ok: bool,
    },
    /// A task ended (the event's `task` is the task); recorded exactly once per task.
    TaskEnded {
        /// How.
        ending: TaskEnding,
    },
    /// The run ended with this outcome.
    RunEnded {
        /// The outcome.
        outcome: Outcome,
    },
}

//! One run as a sans-IO state machine: the public face ([`Run::new`], [`Run::step`],
//! [`Run::resume`], [`Run::cancel`]) and the arena of strands it schedules.
//!
//! The Host drives a run with `step`, which runs every runnable strand (the main walk, each
//! fanout arm, each task) in id order until all of them wait on Harness work or the run ends,
//! and answers effects with `resume`, in any order and at any time. The engine takes answers in
//! the order of [`crate::protocol::Delivery`], one at a time, running every strand an answer
//! unblocks before it takes the next, so nothing observable depends on when an answer arrived.
//! It never reads a clock, a random source, the network or the disk: the seed and start instant
//! arrive in the [`RunContext`], and everything observable is derived from them and the answers.
//!
//! The work is split by concern: `walk` advances one strand's chains and section entries,
//! `dispatch` turns a suspended call into work, `fanout` and `tasks` start strands and wait on
//! them, `failure` classifies what ends a chain, and `scheduler` decides the order of answers
//! and admissions.

mod dispatch;
mod fanout;
mod tasks;
mod walk;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use promptforge_lua::models::{ModelDesc, ModelsState, RoleDesc, ThinkingMode};
use promptforge_lua::vm::BoundTool;
use promptforge_syntax::Prompt;
use serde_json::{Map, Value as Json};

use crate::args::derive_argv;
use crate::determinism::Claims;
use crate::entry::EntrySetup;
use crate::events::{AbandonReason, Event, EventKind, TaskEnding};
use crate::failure::run_outcome;
use crate::fanout::Fanouts;
use crate::ids::TaskId;
use crate::outcome::{Outcome, RunError, RunErrorKind, first_step};
use crate::prepare::{ThinkingCapability, bound_slots, requirements_notice};
use crate::protocol::{Answer, EffectId, Step};
use crate::scheduler::{Admission, Delivered, Effects, Work};
use crate::strand::{
    Ahead, Chain, Cont, Level, Place, Segment, Slot, Strand, StrandId, TaskWait, Trigger, View,
    Wait,
};
use crate::tasks::Tasks;

pub use crate::context::{DEFAULT_CONCURRENCY, DEFAULT_ROUND_CAP, RunContext};

/// Where an effect was issued: the section, and the prompt line of the Lua code that made
/// the call when a Lua block made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectSite {
    /// The section name.
    pub section: String,
    /// The prompt file line of the call (for a call from a block).
    pub line: Option<u32>,
}

/// The first-party Plugin that lets a prompt ask the operator.
pub const USER_INPUT_PLUGIN: &str = "promptforge/user-input";
/// The global its prelude defines.
const INPUT_GLOBAL: &str = "input";

pub use crate::strand::CALL_DEPTH_CAP;
pub(crate) use crate::strand::{MAIN, StrandEnd};

/// How far one advance of a strand got.
#[derive(Debug)]
pub(crate) enum Progress {
    /// More to do right away.
    Continue,
    /// The strand waits (on Harness work, a called chain's Harness work, or tasks).
    Parked,
    /// The strand ran ahead to a point only the committed order may pass.
    Paused,
    /// The strand's own chain ended.
    Ended(StrandEnd),
}

/// One run of a prompt.
#[derive(Debug)]
pub struct Run {
    pub(crate) prompt: Arc<Prompt>,
    pub(crate) ctx: RunContext,
    started: bool,
    pub(crate) outcome: Option<Outcome>,
    pub(crate) events: Vec<Event>,
    /// The run's input as the H1 pass starts (derived from `args`).
    argv: Arc<Json>,
    /// What every section entry's VM gets from the run (`sys.when`, the model state, the
    /// nonce, the bound tools, the input prelude, ...).
    pub(crate) setup: EntrySetup,
    /// The happens-before checker over store claims.
    pub(crate) claims: Claims,
    /// Every live strand but the one being advanced.
    pub(crate) strands: BTreeMap<StrandId, Box<Strand>>,
    next_strand: StrandId,
    next_seq: u64,
    /// Strands with something to do, advanced lowest id first.
    pub(crate) runnable: BTreeSet<StrandId>,
    pub(crate) effects: Effects,
    pub(crate) admission: Admission,
    admission_dirty: bool,
    pub(crate) tasks: Tasks,
    pub(crate) fanouts: Fanouts,
    /// Where each effect was issued, when the context asks (`effect_sites`).
    pub(crate) sites: BTreeMap<EffectId, EffectSite>,
    /// The strand being advanced ahead of the committed order, while one is.
    pub(crate) ahead: Option<StrandId>,
    /// What that strand's current segment has reported and issued so far.
    ahead_events: Vec<Event>,
    pub(crate) ahead_issued: Vec<EffectId>,
    /// A slot may have come free in fact: try starting a queued task ahead.
    ahead_room: bool,
    /// Queued tasks prepared while the Host waits, their work held for a slot.
    held_strands: u32,
    /// Waiters queued to take their slot back (nothing starts ahead while there are any).
    requeued: BTreeSet<StrandId>,
}

impl Run {
    /// Create a run of a parsed prompt.
    pub fn new(prompt: Arc<Prompt>, ctx: RunContext) -> Run {
        let args = ctx.args.clone().unwrap_or_default();
        let argv = Arc::new(derive_argv(&prompt.frontmatter.args, &args));
        let models = Rc::new(RefCell::new(models_state(&prompt, &ctx)));
        let setup = EntrySetup::new(&prompt, &ctx, models);
        let admission = Admission::new(ctx.concurrency);
        let effects = Effects::new(ctx.host.live_operator);
        Run {
            prompt,
            ctx,
            started: false,
            outcome: None,
            events: Vec::new(),
            argv,
            setup,
            claims: Claims::new(),
            strands: BTreeMap::new(),
            next_strand: MAIN,
            next_seq: 0,
            runnable: BTreeSet::new(),
            effects,
            admission,
            admission_dirty: false,
            tasks: Tasks::default(),
            fanouts: Fanouts::default(),
            sites: BTreeMap::new(),
            ahead: None,
            ahead_events: Vec::new(),
            ahead_issued: Vec::new(),
            ahead_room: false,
            held_strands: 0,
            requeued: BTreeSet::new(),
        }
    }

    /// Take the events recorded since the last call, in order.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Take what the run committed since the last call: the final ids of effects issued
    /// ahead, and the answers taken, in the order taken (what a record keeps).
    pub fn take_commits(&mut self) -> crate::protocol::Commits {
        self.effects.take_commits()
    }

    /// Turn running ahead on or off (see [`RunContext::run_ahead`]); call it before the
    /// first step.
    pub fn set_run_ahead(&mut self, on: bool) {
        self.ctx.run_ahead = on;
    }

    /// Ask the run to stop; it ends as cancelled at its next step.
    pub fn cancel(&self) {
        self.ctx.cancel.store(true, Ordering::Relaxed);
    }

    /// The task (as events name it: `0` for the main walk) that issued an outstanding effect,
    /// for a Host's progress display; `None` once the effect is answered or withdrawn.
    pub fn effect_task(&self, id: EffectId) -> Option<String> {
        let strand = self.effects.strand_of(id)?;
        self.strands.get(&strand).map(|s| s.task.to_string())
    }

    /// Where an effect was issued (kept only when [`RunContext::effect_sites`] is on).
    pub fn effect_site(&self, id: EffectId) -> Option<&EffectSite> {
        self.sites.get(&id)
    }

    /// Answer an effect (in any order). Unknown, withdrawn or repeated ids are ignored.
    pub fn resume(&mut self, id: EffectId, answer: Answer) {
        self.effects.answer(id, answer);
    }

    /// Run until every strand waits on Harness work or the run ends. While the run waits, the
    /// batch holds the effects issued (and withdrawn) since the last call, possibly none.
    pub fn step(&mut self) -> Step {
        loop {
            if let Some(outcome) = &self.outcome {
                return Step::Done(outcome.clone());
            }
            if self.ctx.cancel.load(Ordering::Relaxed) {
                self.end(Outcome::Cancelled);
                continue;
            }
            if !self.started {
                self.started = true;
                self.start();
                continue;
            }
            if self.admission_dirty {
                self.admit();
            }
            if let Some(id) = self.runnable.pop_first() {
                self.advance_strand(id);
                continue;
            }
            if let Some(delivered) = self.effects.next() {
                self.deliver(delivered);
                continue;
            }
            if self.ctx.run_ahead && self.run_ahead_once() {
                continue;
            }
            if !self.effects.any_live() {
                // No strand can run and nothing is in flight: no answer can ever come.
                self.fail(
                    RunErrorKind::Internal,
                    "internal invariant violated: every chain waits and no Harness work is in flight",
                );
                continue;
            }
            return Step::Effects(self.effects.take_batch());
        }
    }

    /// Record an event on a task (held with the segment when the strand runs ahead).
    pub(crate) fn event(&mut self, task: &TaskId, kind: EventKind) {
        let event = Event {
            task: task.to_string(),
            kind,
        };
        if self.ahead.is_some() {
            self.ahead_events.push(event);
        } else {
            self.events.push(event);
        }
    }

    /// End the run (the first outcome wins): every live task is abandoned, every outstanding
    /// effect withdrawn, every section VM dropped.
    pub(crate) fn end(&mut self, outcome: Outcome) {
        if self.outcome.is_some() {
            return;
        }
        let live: Vec<(TaskId, bool)> = self
            .tasks
            .live()
            .map(|(id, record)| (id.clone(), record.owner_strand == MAIN))
            .collect();
        for (id, direct) in live {
            let reason = if direct {
                AbandonReason::RunTerminated
            } else {
                AbandonReason::OwnerAborted
            };
            self.record_ending(&id, TaskEnding::Abandoned(reason));
        }
        self.effects.withdraw_all();
        self.ahead_events.clear();
        self.ahead_issued.clear();
        self.strands.clear();
        self.runnable.clear();
        self.fanouts.clear();
        self.events.push(Event {
            task: TaskId::root().to_string(),
            kind: EventKind::RunEnded {
                outcome: outcome.clone(),
            },
        });
        self.outcome = Some(outcome);
    }

    pub(crate) fn fail(&mut self, kind: RunErrorKind, message: impl Into<String>) {
        self.end(Outcome::Failed(RunError::new(kind, message)));
    }

    /// The first step: parse checks and the version gate, then prepare, then the main walk
    /// (with the H1 pass first when the H1 body holds anything that runs).
    fn start(&mut self) {
        if let Err(err) = first_step(Ok(&self.prompt)) {
            self.end(Outcome::Failed(err));
            return;
        }
        if let Some(notice) = requirements_notice(&self.prompt.frontmatter, &self.ctx.host) {
            self.fail(RunErrorKind::RequirementsUnmet, notice);
            return;
        }
        self.setup.bound_tools = bound_slots(&self.prompt.frontmatter, &self.ctx.host)
            .into_iter()
            .map(|(alias, path, tool)| BoundTool {
                alias,
                path,
                description: tool.description,
                parameters: serde_json::from_str(&tool.parameters)
                    .unwrap_or_else(|_| serde_json::json!({"type": "object", "properties": {}})),
                untrusted: tool.untrusted,
            })
            .collect();
        self.setup.input_plugin = self.find_input_plugin();
        // A Plugin's prelude global may not be bound by the frontmatter as well.
        if self.setup.input_plugin.is_some() {
            let fm = &self.prompt.frontmatter;
            if fm.tool(INPUT_GLOBAL).is_some() || fm.role(INPUT_GLOBAL).is_some() {
                self.fail(
                    RunErrorKind::Lua,
                    format!(
                        "Plugin `{USER_INPUT_PLUGIN}`: its prelude defines the global `{INPUT_GLOBAL}`, which the prompt's frontmatter binds as a tool or model alias"
                    ),
                );
                return;
            }
        }
        let root = TaskId::root();
        let key = self.admission.add_chain(None);
        let claims = self.claims.root(root.to_string());
        let chain = Chain {
            id: root.clone(),
            key,
            // The H1 pass always takes entry 0.0.
            entries: 1,
            children: 0,
            levels: vec![Level {
                parent: None,
                next: 0,
            }],
            var: Json::Object(Map::new()),
            args: Arc::from(self.ctx.args.clone().unwrap_or_default()),
            argv: self.argv.clone(),
            depth: 0,
            entry: None,
            seed: None,
            owned: Vec::new(),
            carried: None,
        };
        let seq = self.take_seq();
        let mut main = Box::new(Strand::new(MAIN, root, claims, None, seq, Slot::Exempt, 0));
        main.stack.push(chain);
        self.next_strand = MAIN + 1;
        if !self.prompt.h1_blocks.is_empty() {
            let title = self.prompt.title.clone();
            match self.new_entry(&main, Place::H1, title.clone(), "0.0") {
                Ok(entry) => {
                    if let Some(chain) = main.top_mut() {
                        chain.entry = Some(entry);
                    }
                }
                Err(failure) => {
                    self.teardown(&main.task, &title);
                    if let Progress::Ended(end) =
                        self.chain_failed(&mut main, Place::H1, failure, true)
                    {
                        self.strand_ended(main, end);
                    }
                    return;
                }
            }
        }
        self.strands.insert(MAIN, main);
        self.runnable.insert(MAIN);
    }

    /// `Some(connected)` when the prompt declares `promptforge/user-input` and the Host
    /// provides it: its prelude then installs `input` in every section VM.
    fn find_input_plugin(&self) -> Option<bool> {
        self.prompt.frontmatter.plugin(USER_INPUT_PLUGIN)?;
        let plugin = self
            .ctx
            .host
            .plugins
            .iter()
            .find(|p| p.id == USER_INPUT_PLUGIN)?;
        Some(plugin.activation_failure.is_none())
    }

    pub(crate) fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    pub(crate) fn take_strand_id(&mut self) -> StrandId {
        let id = self.next_strand;
        self.next_strand += 1;
        id
    }

    /// Admit queued strands that fit under the concurrency limit.
    pub(crate) fn admit(&mut self) {
        self.admission_dirty = false;
        self.ahead_room = true;
        for id in self.admission.admit() {
            let Some(mut strand) = self.strands.remove(&id) else {
                continue;
            };
            strand.slot = Slot::Held;
            self.requeued.remove(&id);
            let first = strand.start.is_some() || strand.started_ahead;
            strand.started_ahead = false;
            // Prepared while the Host waited: its slot is here, so its work goes out.
            if self.unhold(&mut strand) {
                self.effects.release(id);
            }
            self.recount(&mut strand);
            if first {
                self.event(&strand.task, EventKind::TaskStarted);
            }
            self.strands.insert(id, strand);
            self.runnable.insert(id);
        }
    }

    /// Bring a strand's count in the physical tally up to date.
    pub(crate) fn recount(&mut self, strand: &mut Strand) {
        self.set_physical(strand, physical_of(strand));
    }

    /// Make a strand count for `to` in the physical tally.
    fn set_physical(&mut self, strand: &mut Strand, to: crate::scheduler::Physical) {
        if let Some(owner) = strand.owner {
            self.admission.recount(owner, strand.physical, to);
        }
        strand.physical = to;
        self.ahead_room = true;
    }

    /// A prepared strand's work is no longer held back; whether it was prepared (its held
    /// effects are for the caller to release or withdraw).
    fn unhold(&mut self, strand: &mut Strand) -> bool {
        if !strand.held {
            return false;
        }
        strand.held = false;
        self.held_strands = self.held_strands.saturating_sub(1);
        true
    }

    /// Queue a strand for a slot (its first run, or its slot back after a wait).
    pub(crate) fn queue_for_slot(&mut self, strand: &mut Strand) {
        if let Some(owner) = strand.owner {
            if strand.start.is_none() {
                // A waiter taking its slot back, at its old place: admission takes it before
                // anything queued after it, so nothing starts ahead meanwhile.
                self.requeued.insert(strand.id);
            }
            strand.slot = Slot::Queued;
            self.admission.enqueue(owner, strand.seq, strand.id);
            self.admission_dirty = true;
            self.recount(strand);
        }
    }

    /// Give back the slot a strand holds.
    pub(crate) fn release_slot(&mut self, strand: &mut Strand, then: Slot) {
        if strand.slot == Slot::Held
            && let Some(owner) = strand.owner
        {
            self.admission.release(owner);
            self.admission_dirty = true;
            strand.slot = then;
            self.recount(strand);
        }
    }

    /// Advance a strand until it parks or its own chain ends, in the committed order. A strand
    /// that ran ahead has its first segment committed instead of run again, and goes on from
    /// where it paused.
    fn advance_strand(&mut self, id: StrandId) {
        let Some(mut strand) = self.strands.remove(&id) else {
            return;
        };
        match strand.front_trigger() {
            Some(Trigger::Admission) => {
                if !self.commit_segment(&mut strand) {
                    self.strands.insert(id, strand);
                    return;
                }
            }
            Some(Trigger::Effect(_)) => {
                // Its committed wait is still out: nothing to do in the order yet.
                self.strands.insert(id, strand);
                return;
            }
            None => {
                if let Some(start) = strand.start.take() {
                    self.start_chain(&mut strand, *start);
                }
            }
        }
        let mut first = strand.cont.take().map(|cont| match *cont {
            Cont::End(end) => Progress::Ended(end),
            Cont::Failed {
                place,
                failure,
                around,
            } => self.chain_failed(&mut strand, place, failure, around),
        });
        let end = loop {
            if self.outcome.is_some() {
                return;
            }
            let progress = match first.take() {
                Some(progress) => progress,
                None => self.advance_top(&mut strand),
            };
            match progress {
                Progress::Continue => {}
                Progress::Parked | Progress::Paused => {
                    self.strands.insert(id, strand);
                    return;
                }
                Progress::Ended(end) => break end,
            }
        };
        self.strand_ended(strand, end);
    }

    /// One piece of work ahead of the committed order, if there is any: a strand whose own
    /// answer arrived before older ones runs on it; else a queued task starts when a slot is
    /// free in fact.
    fn run_ahead_once(&mut self) -> bool {
        let (strands, runnable) = (&self.strands, &self.runnable);
        let ready = self.effects.take_ahead(|sid, id| {
            !runnable.contains(&sid) && strands.get(&sid).is_some_and(|s| can_run_ahead(s, id))
        });
        if let Some(ready) = ready {
            let replied = is_reply(ready.work, &ready.answer);
            self.advance_ahead(
                ready.strand,
                Trigger::Effect(ready.id),
                Some((ready.answer, replied)),
            );
            return true;
        }
        if !self.ahead_room || !self.requeued.is_empty() {
            return false;
        }
        self.ahead_room = false;
        let strands = &self.strands;
        let fresh = self.admission.next_ahead(|sid| {
            strands
                .get(&sid)
                .is_some_and(|s| (s.start.is_some() || s.held) && s.slot == Slot::Queued)
        });
        let Some(sid) = fresh else {
            return false;
        };
        if self.strands.get(&sid).is_some_and(|s| s.held) {
            // Prepared already: its held work goes out now.
            if let Some(mut strand) = self.strands.remove(&sid) {
                self.unhold(&mut strand);
                self.effects.release(sid);
                self.recount(&mut strand);
                self.strands.insert(sid, strand);
            }
        } else {
            self.advance_ahead(sid, Trigger::Admission, None);
        }
        true
    }

    /// Whether [`Run::prepare_ahead`] could find work: run-ahead is on, the run is going, a
    /// slot to hold a prepared strand is free, and some task is queued. A Host skips its
    /// preparing (and what it does to make room for it) when this is false.
    pub fn may_prepare_ahead(&self) -> bool {
        self.ctx.run_ahead
            && self.outcome.is_none()
            && self.started
            && self.held_strands < self.ctx.concurrency
            && self.admission.has_queued()
    }

    /// Use the time the Host spends waiting: start the next queued task (in the order
    /// admission would take it) before any slot is free, its work held until one is, so that
    /// when a slot frees its first request goes out at once instead of after its section
    /// entry. At most the concurrency limit's worth are prepared. Returns whether it did
    /// anything; a Host calls it while nothing has arrived, one task at a time.
    pub fn prepare_ahead(&mut self) -> bool {
        if !self.may_prepare_ahead() {
            return false;
        }
        let strands = &self.strands;
        let fresh = self.admission.next_prepare(|sid| {
            strands
                .get(&sid)
                .is_some_and(|s| s.start.is_some() && s.slot == Slot::Queued)
        });
        let Some(sid) = fresh else {
            return false;
        };
        if let Some(strand) = self.strands.get_mut(&sid) {
            strand.held = true;
            self.held_strands += 1;
        }
        self.advance_ahead(sid, Trigger::Admission, None);
        true
    }

    /// Run a strand ahead of the committed order, from an answer of its own (or its first
    /// start), to its next wait or to a point only the order may pass: its events are held
    /// and its effects go out under provisional ids, as one segment the order commits later.
    fn advance_ahead(&mut self, id: StrandId, trigger: Trigger, answer: Option<(Answer, bool)>) {
        let Some(mut strand) = self.strands.remove(&id) else {
            return;
        };
        if strand.ahead.is_none() {
            strand.ahead = Some(Box::new(Ahead {
                view: view_of(&strand),
                segments: std::collections::VecDeque::new(),
            }));
        }
        match (trigger, answer) {
            (Trigger::Effect(_), Some((answer, replied))) => {
                if let Some(entry) = strand.top_mut().and_then(|c| c.entry.as_mut()) {
                    entry.answer_with(answer);
                }
                if replied {
                    strand.turns += 1;
                }
            }
            _ => {
                if let Some(start) = strand.start.take() {
                    strand.started_ahead = true;
                    self.recount(&mut strand);
                    self.start_chain(&mut strand, *start);
                }
            }
        }
        self.ahead = Some(id);
        self.setup.models.borrow_mut().ahead = true;
        let progress = loop {
            match self.advance_top(&mut strand) {
                Progress::Continue if self.outcome.is_none() => {}
                other => break other,
            }
        };
        self.setup.models.borrow_mut().ahead = false;
        self.ahead = None;
        let events = std::mem::take(&mut self.ahead_events);
        let issued = std::mem::take(&mut self.ahead_issued);
        if self.outcome.is_some() {
            return;
        }
        let paused = match progress {
            Progress::Parked => false,
            Progress::Ended(end) => {
                strand.cont = Some(Box::new(Cont::End(end)));
                strand.zombie = true;
                self.recount(&mut strand);
                true
            }
            Progress::Paused | Progress::Continue => true,
        };
        let end = view_of(&strand);
        if let Some(ahead) = strand.ahead.as_mut() {
            ahead.segments.push_back(Segment {
                trigger,
                events,
                issued,
                end,
                paused,
            });
        }
        self.strands.insert(id, strand);
    }

    /// Commit a strand's first segment of work done ahead: its events join the run's, its
    /// effects get their final ids. Returns whether the strand paused at its end (the order
    /// goes on with it now).
    fn commit_segment(&mut self, strand: &mut Strand) -> bool {
        let Some(ahead) = strand.ahead.as_mut() else {
            return false;
        };
        let Some(segment) = ahead.segments.pop_front() else {
            return false;
        };
        self.events.extend(segment.events);
        for provisional in segment.issued {
            let Some(id) = self.effects.commit(provisional) else {
                continue;
            };
            if let Some(site) = self.sites.remove(&provisional) {
                self.sites.insert(id, site);
            }
            for later in ahead.segments.iter_mut() {
                if later.trigger == Trigger::Effect(provisional) {
                    later.trigger = Trigger::Effect(id);
                }
            }
            if let Some(entry) = strand.stack.last_mut().and_then(|c| c.entry.as_mut())
                && let Some(Wait::Effect(waited, work)) = entry.waiting
                && waited == provisional
            {
                entry.waiting = Some(Wait::Effect(id, work));
            }
        }
        ahead.view = segment.end;
        if ahead.segments.is_empty() {
            strand.ahead = None;
        }
        segment.paused
    }

    /// A strand's own chain ended: the main walk's end is the run's; a task's end goes to
    /// whoever waits on it.
    pub(crate) fn strand_ended(&mut self, mut strand: Box<Strand>, end: StrandEnd) {
        if strand.id != MAIN {
            self.release_slot(&mut strand, Slot::Exempt);
            self.task_ended(strand, end);
            return;
        }
        let outcome = match end {
            StrandEnd::Returned(result) => {
                Outcome::Completed(result.unwrap_or_else(|| "done".to_owned()))
            }
            StrandEnd::Failed { failure, h1_gate } => run_outcome(failure, h1_gate),
        };
        self.end(outcome);
    }

    /// Take one answer: it goes to the entry waiting on it, or it is a wait's timeout. An
    /// answer the strand already ran ahead on commits the segment it started.
    fn deliver(&mut self, delivered: Delivered) {
        let Some(answer) = delivered.answer else {
            let Some(mut strand) = self.strands.remove(&delivered.strand) else {
                return;
            };
            if strand.front_trigger() == Some(Trigger::Effect(delivered.id))
                && self.commit_segment(&mut strand)
            {
                self.runnable.insert(delivered.strand);
            }
            self.strands.insert(delivered.strand, strand);
            return;
        };
        let Some(strand) = self.strands.get_mut(&delivered.strand) else {
            return;
        };
        if strand.wait.as_ref().and_then(TaskWait::timer) == Some(delivered.id) {
            self.wait_timed_out(delivered.strand);
            return;
        }
        let Some(entry) = strand.top_mut().and_then(|c| c.entry.as_mut()) else {
            return;
        };
        if !matches!(entry.waiting, Some(Wait::Effect(id, _)) if id == delivered.id) {
            return;
        }
        let replied = is_reply(delivered.work, &answer);
        entry.answer_with(answer);
        if replied {
            strand.turns += 1;
        }
        self.runnable.insert(delivered.strand);
    }

    /// A parked wait ended with this answer: the strand runs again (after taking its slot back,
    /// when it lent it).
    pub(crate) fn wake(&mut self, id: StrandId, answer: Answer) {
        let Some(mut strand) = self.strands.remove(&id) else {
            return;
        };
        if let Some(timer) = strand.wait.take().and_then(|w| w.timer()) {
            self.effects.withdraw(timer);
        }
        if let Some(entry) = strand.top_mut().and_then(|c| c.entry.as_mut()) {
            entry.answer_with(answer);
        }
        if strand.slot == Slot::Lent {
            self.queue_for_slot(&mut strand);
        } else {
            self.runnable.insert(id);
        }
        self.strands.insert(id, strand);
    }

    /// Stop a strand that is not running (a cancel, a fail-fast, its owner's end): its VMs
    /// are dropped, its outstanding work withdrawn, its slot freed, and every task its chains
    /// own abandoned in turn. A strand that ran ahead is stopped where the committed order
    /// left it: its uncommitted work is dropped unseen, and its teardowns name the entries the
    /// order had.
    pub(crate) fn stop_strand(&mut self, mut strand: Box<Strand>) {
        self.runnable.remove(&strand.id);
        strand.zombie = false;
        strand.started_ahead = false;
        // Its held effects, if any, are withdrawn with its segments below.
        self.unhold(&mut strand);
        self.requeued.remove(&strand.id);
        // Whatever it counted for in fact, it counts for nothing now.
        self.set_physical(&mut strand, crate::scheduler::Physical::None);
        let ahead = strand.ahead.take();
        strand.cont = None;
        match strand.slot {
            Slot::Held => self.release_slot(&mut strand, Slot::Exempt),
            Slot::Queued => {
                if let Some(owner) = strand.owner {
                    self.admission.dequeue(owner, strand.seq);
                }
            }
            Slot::Lent | Slot::Exempt => {}
        }
        if let Some(wait) = strand.wait.take() {
            if let Some(timer) = wait.timer() {
                self.effects.withdraw(timer);
            }
            if let TaskWait::Fanout(fanout) = wait {
                self.stop_fanout(fanout, AbandonReason::OwnerAborted);
            }
        }
        let task = strand.task.clone();
        if let Some(ahead) = ahead {
            for segment in &ahead.segments {
                if let Trigger::Effect(id) = segment.trigger {
                    self.effects.withdraw(id);
                }
                for id in &segment.issued {
                    self.effects.withdraw(*id);
                }
            }
            while let Some(chain) = strand.stack.pop() {
                if let Some(Wait::Effect(id, _)) = chain.entry.as_ref().and_then(|e| e.waiting) {
                    self.effects.withdraw(id);
                }
                self.admission.remove_chain(chain.key);
            }
            // A task that had not started where the order left it has no entries to tear down.
            for name in ahead.view.entries.iter().rev().flatten() {
                self.teardown(&task, name);
            }
            return;
        }
        while let Some(chain) = strand.stack.pop() {
            if let Some(entry) = &chain.entry {
                if let Some(Wait::Effect(id, _)) = entry.waiting {
                    self.effects.withdraw(id);
                }
                let name = entry.name.clone();
                self.teardown(&task, &name);
            }
            self.abandon_owned(&chain.all_owned(), AbandonReason::OwnerAborted);
            self.admission.remove_chain(chain.key);
        }
    }

    pub(crate) fn teardown(&mut self, task: &TaskId, section: &str) {
        self.event(
            task,
            EventKind::TeardownStarted {
                section: section.to_owned(),
            },
        );
        self.event(
            task,
            EventKind::TeardownSucceeded {
                section: section.to_owned(),
            },
        );
    }
}

/// The run-wide model state: the declared roles and, when the Host has one, its current model.
fn models_state(prompt: &Prompt, ctx: &RunContext) -> ModelsState {
    ModelsState {
        roles: prompt
            .frontmatter
            .models
            .iter()
            .map(|role| RoleDesc {
                label: role.label.clone(),
                keywords: role
                    .keywords
                    .iter()
                    .map(|k| k.as_str().to_owned())
                    .collect(),
                thinking: role.thinking(),
                description: role.description.clone(),
            })
            .collect(),
        model: ctx.host.model.as_ref().map(|m| ModelDesc {
            id: m.id.clone(),
            context: m.context,
            description: m.description.clone(),
            thinking: match m.thinking {
                ThinkingCapability::Never => ThinkingMode::Never,
                ThinkingCapability::Always => ThinkingMode::Always,
                ThinkingCapability::Switchable => ThinkingMode::Switchable,
            },
        }),
        default: None,
        has_snapshot: ctx.snapshot.is_some(),
        tools_always: Vec::new(),
        tools_always_version: 0,
        tools_bound: !prompt.frontmatter.tools.is_empty(),
        ahead: false,
    }
}

/// What a strand counts for in the physical tally: a task ended ahead still holding its
/// committed slot frees it in fact; a task started ahead of its admission uses one.
fn physical_of(strand: &Strand) -> crate::scheduler::Physical {
    use crate::scheduler::Physical;
    if strand.zombie {
        if strand.slot == Slot::Held {
            Physical::Zombie
        } else {
            Physical::None
        }
    } else if strand.slot == Slot::Lent {
        Physical::Lent
    } else if strand.started_ahead && !strand.held {
        Physical::Ahead
    } else {
        Physical::None
    }
}

/// Whether a strand may run ahead on the answer to `id`: it waits on exactly that effect in
/// its running entry, and nothing other strands do can reach it before the order does (it
/// owns no tasks, its entry's model started none, and it is not parked on tasks).
fn can_run_ahead(s: &Strand, id: EffectId) -> bool {
    if s.cont.is_some() || s.wait.is_some() || s.start.is_some() {
        return false;
    }
    if s.stack
        .iter()
        .any(|c| !c.owned.is_empty() || c.carried.is_some())
    {
        return false;
    }
    let Some(entry) = s.top().and_then(|c| c.entry.as_ref()) else {
        return false;
    };
    entry.pending.is_none()
        && entry.model_tasks.is_empty()
        && entry.notices.is_empty()
        && matches!(entry.waiting, Some(Wait::Effect(waited, _)) if waited == id)
}

/// Whether an answer to work of this kind is a model reply that counts as a round (not a
/// context overflow handed to the compactor).
fn is_reply(work: Work, answer: &Answer) -> bool {
    work == Work::Chat && matches!(answer, Answer::Value(v) if v.get("overflow").is_none())
}

/// A strand as others see it now (one that has not started has no section, wait or entries).
fn view_of(strand: &Strand) -> View {
    let (section, blocked) = crate::tasks::running_activity(strand);
    View {
        section,
        blocked,
        turns: strand.turns,
        entries: strand
            .stack
            .iter()
            .map(|c| c.entry.as_ref().map(|e| e.name.clone()))
            .collect(),
    }
}

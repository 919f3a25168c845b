//! One run as a sans-IO state machine: prepare, the H1 pass, the main walk, the outcome.
//!
//! The host drives a [`Run`] with [`Run::step`], which executes Lua until every chain waits on
//! Harness work ([`Step::Effects`]) or the run ends ([`Step::Done`]), and answers effects with
//! [`Run::resume`] in any order. The engine never reads a clock, a random source, the network
//! or the disk: the seed and start instant arrive in the [`RunContext`], and everything
//! observable is derived from them and from the answers.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use promptforge_lua::models::{ModelDesc, ModelsState, RoleDesc, ThinkingMode};
use promptforge_lua::vm::{
    Answer, ArgvMode, BlockStep, DEFAULT_LOG_EVENTS, FailureKind, LuaFailure, Request, SectionVm,
    VisibleSection, VmConfig,
};
use promptforge_syntax::heading_ref::parse_heading_ref;
use promptforge_syntax::{Block, Prompt, SectionId};
use serde_json::{Map, Value as Json};

use promptforge_lua::json::display_value;
use promptforge_lua::untrusted::nonce_for_run;
use promptforge_lua::vm::{BoundTool, ErrorValue};

use crate::args::derive_argv;
use crate::determinism::{ChainRef, Claims};
use crate::events::Event;
use crate::outcome::{Outcome, RunError, RunErrorKind, first_step};
use crate::prepare::{HostState, ThinkingCapability, bound_slots, requirements_notice};
use crate::store_path::{BoundArg, LineRange, StoreAnswer, StoreError, StoreOp, line_range};
use crate::when::render_when;

/// What the Host gives a run when it creates it.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// The run's seed.
    pub seed: u64,
    /// The start instant, in milliseconds since the Unix epoch.
    pub start_ms: i64,
    /// The run's argument string (`None`: no argument, read as the empty string).
    pub args: Option<String>,
    /// The Host-state snapshot `ui()` returns, when the Host has one.
    pub snapshot: Option<Json>,
    /// `sys.execution`: the run's name, assigned by the Host.
    pub execution: String,
    /// What the Host provides (Plugins, the current model).
    pub host: HostState,
    /// Log checkpoints allowed per section VM.
    pub log_events: u32,
    /// Raised by the Host to cancel the run.
    pub cancel: Arc<AtomicBool>,
    /// The run's default round cap for `models.loop` (24 unless the Harness sets another).
    pub round_cap: u32,
}

impl RunContext {
    /// A context with the given seed and start instant and everything else defaulted.
    pub fn new(seed: u64, start_ms: i64) -> Self {
        RunContext {
            seed,
            start_ms,
            args: None,
            snapshot: None,
            execution: String::new(),
            host: HostState::default(),
            log_events: DEFAULT_LOG_EVENTS,
            cancel: Arc::new(AtomicBool::new(false)),
            round_cap: DEFAULT_ROUND_CAP,
        }
    }
}

/// The default round cap of a `models.loop` call.
pub const DEFAULT_ROUND_CAP: u32 = 24;

/// An effect id: unique within a run, assigned in issue order.
pub type EffectId = u64;

/// Harness work the engine asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// One model round.
    ModelRound(ModelRound),
    /// One store operation (path already validated, claim already recorded).
    Store(StoreOp),
    /// `input.ask()`: the operator's next message, through the `promptforge/user-input`
    /// Plugin's ask tool (the Host answers `{text, available}`).
    Ask,
    /// A call to a bound tool (answered with the tool's output text, or a `tool` error).
    Tool {
        /// The alias it was called by.
        alias: String,
        /// The tool path.
        path: String,
        /// The arguments (a JSON object).
        args: Json,
    },
}

/// The model a round runs on, as the section resolved it (a model handle's settings).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct ModelTarget {
    /// The role label, or the raw model id for a `models.get` id handle.
    pub name: String,
    /// The catalog model id.
    pub model_id: String,
    /// The context window.
    pub context: u64,
    /// The thinking switch (`None`: the model's own default).
    pub thinking: Option<bool>,
    /// Sampling temperature, when `models.use` set one.
    pub temperature: Option<f64>,
    /// Reply token cap, when `models.use` set one.
    pub max_tokens: Option<u64>,
}

/// One model round: the composed messages (records as JSON: `role`, `content`, and
/// `tool_calls` / `tool_call_id`), the tools on offer, and the model settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRound {
    /// A `models.infer` round (rather than a `models.loop` round).
    pub infer: bool,
    /// The model and its settings.
    pub model: ModelTarget,
    /// The messages to send, in order.
    pub messages: Vec<Json>,
    /// The tools offered (name, description, parameters schema).
    pub tools: Vec<Json>,
}

/// What [`Run::step`] returns.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Work for the Harness; answer each with [`Run::resume`], in any order.
    Effects(Vec<(EffectId, Effect)>),
    /// The run ended.
    Done(Outcome),
}

/// Where a section entry sits, for its blocks and for error classification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The H1 pass.
    H1,
    /// A section (on the main walk or in a called chain).
    Section(SectionId),
}

/// What a section entry is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Replaying the shared library.
    Shared,
    /// Running its blocks.
    Blocks,
}

/// What a suspended entry waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Harness work.
    Effect(EffectId),
    /// A chain its `call` started (the chain above it on the stack).
    Chain,
}

/// A section entry in progress: its VM, its stage, and the next block to run.
#[derive(Debug)]
struct Entry {
    place: Place,
    name: String,
    vm: SectionVm,
    stage: Stage,
    next_block: usize,
    /// A coroutine (shared load or block) is in progress.
    running: bool,
    /// What the coroutine waits on, if it is suspended.
    waiting: Option<Wait>,
    /// The answer to deliver at the next resume.
    answer: Option<Answer>,
}

/// One level of a walk: a list of sibling sections and the next one to enter.
#[derive(Debug, Clone)]
struct Level {
    siblings: Vec<SectionId>,
    next: usize,
}

/// A chain: the main walk, or a walk that a `call` started. Calls nest, so the running chains
/// form a stack; the chain on top runs while the ones below wait on their calls.
#[derive(Debug)]
struct Chain {
    /// The chain id (`0` for the main walk; a called chain is `{parent}.{n}`).
    id: String,
    /// Entries started so far (`sys.id` is `{id}.{n}`).
    entries: u64,
    /// Child chains started so far.
    children: u64,
    /// The walk's levels (a jump to a child pushes one; a level that runs out pops).
    levels: Vec<Level>,
    /// The chain's `var`.
    var: Json,
    /// The chain's input: `args` and its (frozen, after the H1 pass) `argv`.
    args: String,
    argv: Json,
    /// Call depth (0 for the main walk).
    depth: u32,
    /// The section entry in progress.
    entry: Option<Box<Entry>>,
    /// The nearest enclosing task (`sys.taskid`): `0`, or an arm's id.
    task_id: String,
    /// For a fanout arm: its member and position, given to its first entry only.
    item: Option<(Json, usize)>,
    /// A fanout the entry waits on: its arms run beside each other.
    fanout: Option<Box<Fanout>>,
}

/// A fanout in progress: one arm per member, in collection order.
#[derive(Debug)]
struct Fanout {
    arms: Vec<Arm>,
    /// The calling chain's claims identity (arms fork from it and join it).
    caller_claims: ChainRef,
}

/// One arm: its own chain stack (a task chain at the bottom), its claims identity, and how it
/// ended.
#[derive(Debug)]
struct Arm {
    stack: Vec<Chain>,
    claims: ChainRef,
    item: Json,
    end: Option<ArmEnd>,
}

/// How an arm's chain ended.
#[derive(Debug)]
enum ArmEnd {
    /// With this result ('' when it ran off its walk).
    Done(String),
    /// With this failure.
    Failed(LuaFailure),
}

/// The first-party Plugin that lets a prompt ask the operator.
pub const USER_INPUT_PLUGIN: &str = "promptforge/user-input";
/// The global its prelude defines.
const INPUT_GLOBAL: &str = "input";

/// The deepest a `call` may nest, counting the first call.
pub const CALL_DEPTH_CAP: u32 = 8;

/// One run of a prompt.
#[derive(Debug)]
pub struct Run {
    prompt: Arc<Prompt>,
    ctx: RunContext,
    started: bool,
    /// The chain stack; the main walk is at the bottom.
    chains: Vec<Chain>,
    events: Vec<Event>,
    outcome: Option<Outcome>,
    /// The run's input as the H1 pass starts (derived from `args`).
    argv: Json,
    when: String,
    labels: Arc<[String]>,
    /// The next effect id.
    next_effect: EffectId,
    /// Effects issued and not yet returned by `step`.
    issued: Vec<(EffectId, Effect)>,
    /// Answers received for effects, by id, not yet delivered.
    answers: BTreeMap<EffectId, Answer>,
    /// Run-wide model roles, the current model and the prompt-wide default.
    models: Rc<RefCell<ModelsState>>,
    /// The happens-before checker over store claims.
    claims: Claims,
    /// The run's nonce for `untrusted` envelopes.
    nonce: String,
    /// The bound tool slots (filled at prepare).
    bound_tools: Arc<[BoundTool]>,
    /// The claims identity of the chain stack being advanced.
    claim_ref: ChainRef,
    /// Whether the chain stack being advanced is a fanout arm's.
    in_arm: bool,
    /// Set when an arm's own chain ends, for the fanout to collect.
    arm_end: Option<ArmEnd>,
}

impl Run {
    /// Create a run of a parsed prompt.
    pub fn new(prompt: Arc<Prompt>, ctx: RunContext) -> Run {
        let args = ctx.args.clone().unwrap_or_default();
        let argv = derive_argv(&prompt.frontmatter.args, &args);
        let labels: Arc<[String]> = prompt.lua_regions().map(|r| r.label.clone()).collect();
        let when = render_when(ctx.start_ms);
        let models = Rc::new(RefCell::new(models_state(&prompt, &ctx)));
        let mut claims = Claims::new();
        let main_chain = claims.root("0");
        let nonce = nonce_for_run(ctx.seed);
        Run {
            prompt,
            ctx,
            started: false,
            chains: Vec::new(),
            events: Vec::new(),
            outcome: None,
            argv,
            when,
            labels,
            next_effect: 0,
            issued: Vec::new(),
            answers: BTreeMap::new(),
            models,
            claims,
            nonce,
            bound_tools: Arc::from(Vec::new()),
            claim_ref: main_chain,
            in_arm: false,
            arm_end: None,
        }
    }

    /// Take the events recorded since the last call, in order.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Ask the run to stop; it ends as cancelled at its next step.
    pub fn cancel(&self) {
        self.ctx.cancel.store(true, Ordering::Relaxed);
    }

    /// Answer an effect (in any order). Unknown or repeated ids are ignored.
    pub fn resume(&mut self, id: EffectId, answer: Answer) {
        self.answers.insert(id, answer);
    }

    /// Run until every chain waits on Harness work or the run ends. While the run waits, the
    /// returned list holds the effects issued since the last call (possibly none).
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
            if !self.advance_current() {
                return Step::Effects(std::mem::take(&mut self.issued));
            }
        }
    }

    /// Do one unit of work on the chain stack being advanced; `false` when it is blocked on
    /// Harness work.
    fn advance_current(&mut self) -> bool {
        let Some(chain) = self.chains.last_mut() else {
            self.fail(RunErrorKind::Internal, "no chain is running");
            return true;
        };
        if chain.fanout.is_some() {
            return self.advance_fanout();
        }
        match chain.entry.take() {
            Some(entry) => {
                if let Some(Wait::Effect(id)) = entry.waiting
                    && !self.answers.contains_key(&id)
                {
                    chain.entry = Some(entry);
                    return false;
                }
                self.advance_entry(entry);
            }
            None => self.enter_next(),
        }
        true
    }

    /// Advance a fanout's live arms, each until it blocks or ends, in collection order. A
    /// failing arm (other than round-cap exhaustion) cancels its siblings and fails the
    /// fanout; when every arm has ended, the caller gets the results.
    fn advance_fanout(&mut self) -> bool {
        let Some(mut fan) = self.chains.last_mut().and_then(|c| c.fanout.take()) else {
            return true;
        };
        let mut ran = false;
        let mut failed = None;
        for (index, arm) in fan.arms.iter_mut().enumerate() {
            if arm.end.is_some() {
                continue;
            }
            std::mem::swap(&mut self.chains, &mut arm.stack);
            let claims = std::mem::replace(&mut self.claim_ref, arm.claims);
            let in_arm = std::mem::replace(&mut self.in_arm, true);
            while self.outcome.is_none() && self.arm_end.is_none() && self.advance_current() {
                ran = true;
            }
            std::mem::swap(&mut self.chains, &mut arm.stack);
            self.claim_ref = claims;
            self.in_arm = in_arm;
            arm.end = self.arm_end.take();
            if self.outcome.is_some() {
                return true;
            }
            if let Some(ArmEnd::Failed(failure)) = &arm.end
                && !is_exhausted(failure)
            {
                failed = Some(index);
                break;
            }
        }
        let finished = failed.is_some() || fan.arms.iter().all(|a| a.end.is_some());
        if !finished {
            if let Some(chain) = self.chains.last_mut() {
                chain.fanout = Some(fan);
            }
            return ran;
        }
        // Every arm is delivered (or cancelled): join them into the caller.
        for arm in &fan.arms {
            let _ = self.claims.join(fan.caller_claims, arm.claims);
        }
        let answer = match failed.and_then(|i| fan.arms.get(i)) {
            Some(Arm {
                end: Some(ArmEnd::Failed(failure)),
                ..
            }) => Answer::Error(error_value_of(failure)),
            _ => Answer::Value(Json::Array(
                fan.arms
                    .iter()
                    .map(|arm| match &arm.end {
                        Some(ArmEnd::Done(text)) => {
                            serde_json::json!({"ok": true, "exhausted": false, "text": text})
                        }
                        _ => serde_json::json!({
                            "ok": false,
                            "exhausted": true,
                            "text": format!(
                                "## {}\n\nUNKNOWN\n\n(section incomplete: tool loop exhausted)",
                                display_value(&arm.item)
                            ),
                        }),
                    })
                    .collect(),
            )),
        };
        // Dropping the arms cancels any still live (their VMs go with them).
        drop(fan);
        if let Some(entry) = self.chains.last_mut().and_then(|c| c.entry.as_mut()) {
            entry.waiting = None;
            entry.answer = Some(answer);
        }
        true
    }

    fn end(&mut self, outcome: Outcome) {
        if self.outcome.is_none() {
            self.events.push(Event::RunEnded {
                outcome: outcome.clone(),
            });
            self.outcome = Some(outcome);
        }
    }

    fn fail(&mut self, kind: RunErrorKind, message: impl Into<String>) {
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
        self.bound_tools = bound_slots(&self.prompt.frontmatter, &self.ctx.host)
            .into_iter()
            .map(|(alias, path, tool)| BoundTool {
                alias,
                path,
                description: tool.description,
                parameters: serde_json::from_str(&tool.parameters)
                    .unwrap_or_else(|_| serde_json::json!({"type": "object", "properties": {}})),
            })
            .collect();
        // A Plugin's prelude global may not be bound by the frontmatter as well.
        if self.input_plugin().is_some() {
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
        self.chains.push(Chain {
            id: "0".into(),
            // The H1 pass always takes entry 0.0.
            entries: 1,
            children: 0,
            levels: vec![Level {
                siblings: self.prompt.top_level.clone(),
                next: 0,
            }],
            var: Json::Object(Map::new()),
            args: self.ctx.args.clone().unwrap_or_default(),
            argv: self.argv.clone(),
            depth: 0,
            entry: None,
            task_id: "0".into(),
            item: None,
            fanout: None,
        });
        if !self.prompt.h1_blocks.is_empty() {
            let title = self.prompt.title.clone();
            self.new_entry(Place::H1, title, "0.0");
        }
    }

    /// `Some(connected)` when the prompt declares `promptforge/user-input` and the Host
    /// provides it: its prelude then installs `input` in every section VM.
    fn input_plugin(&self) -> Option<bool> {
        self.prompt.frontmatter.plugin(USER_INPUT_PLUGIN)?;
        let plugin = self
            .ctx
            .host
            .plugins
            .iter()
            .find(|p| p.id == USER_INPUT_PLUGIN)?;
        Some(plugin.activation_failure.is_none())
    }

    fn section_ids_visible_from(&self, place: Place) -> Vec<SectionId> {
        let prompt = &self.prompt;
        match place {
            Place::H1 => prompt.top_level.clone(),
            Place::Section(id) => {
                let Some(section) = prompt.section(id) else {
                    return Vec::new();
                };
                self.siblings_of(id)
                    .iter()
                    .filter(|s| **s != id)
                    .chain(section.children.iter())
                    .copied()
                    .collect()
            }
        }
    }

    /// The sibling list a section belongs to (itself included).
    fn siblings_of(&self, id: SectionId) -> &[SectionId] {
        let prompt = &self.prompt;
        match prompt.section(id).and_then(|s| s.parent) {
            Some(parent) => prompt
                .section(parent)
                .map_or(&[][..], |p| p.children.as_slice()),
            None => &prompt.top_level,
        }
    }

    fn visible_from(&self, place: Place) -> Vec<VisibleSection> {
        self.section_ids_visible_from(place)
            .iter()
            .filter_map(|id| {
                self.prompt.section(*id).map(|s| VisibleSection {
                    level: usize::from(s.level),
                    name: s.name.clone(),
                    items: s.items.clone(),
                })
            })
            .collect()
    }

    /// Resolve a heading reference against the sections visible from `place`.
    fn resolve(&self, place: Place, target: &str) -> Result<SectionId, String> {
        let reference = parse_heading_ref(target).map_err(|e| e.to_string())?;
        let visible = self.section_ids_visible_from(place);
        visible
            .iter()
            .copied()
            .find(|id| {
                self.prompt.section(*id).is_some_and(|s| {
                    usize::from(s.level) == reference.level && s.name == reference.name
                })
            })
            .ok_or_else(|| {
                let list = visible
                    .iter()
                    .filter_map(|id| self.prompt.section(*id).map(|s| s.heading_ref()))
                    .collect::<Vec<_>>()
                    .join(", ");
                format!("section heading `{reference}` not found; available sections: {list}")
            })
    }

    fn sys_fields(&self, name: &str, id: &str, task_id: &str, index: Option<usize>) -> Json {
        let mut sys = Map::new();
        sys.insert("when".into(), Json::String(self.when.clone()));
        sys.insert("id".into(), Json::String(id.to_owned()));
        sys.insert("taskid".into(), Json::String(task_id.to_owned()));
        if let Some(index) = index {
            sys.insert("index".into(), Json::from(index));
        }
        sys.insert("section_name".into(), Json::String(name.to_owned()));
        sys.insert("execution".into(), Json::String(self.ctx.execution.clone()));
        sys.insert(
            "section_count".into(),
            Json::from(self.prompt.top_level.len()),
        );
        Json::Object(sys)
    }

    /// Build a section VM for the top chain (the shared library replay then runs as the
    /// entry's first stage) and make it the chain's entry.
    fn new_entry(&mut self, place: Place, name: String, id: &str) {
        // An arm's member and position reach only its first entry, the worker section.
        let item = self.chains.last_mut().and_then(|c| c.item.take());
        let Some(chain) = self.chains.last() else {
            return;
        };
        let argv = match place {
            Place::H1 => ArgvMode::Writable(chain.argv.clone()),
            Place::Section(_) => ArgvMode::Frozen(chain.argv.clone()),
        };
        let cfg = VmConfig {
            section_name: name.clone(),
            args: chain.args.clone(),
            argv,
            var: chain.var.clone(),
            sys: self.sys_fields(&name, id, &chain.task_id, item.as_ref().map(|(_, i)| *i)),
            item: item.map(|(member, _)| member),
            snapshot: self.ctx.snapshot.clone(),
            visible: self.visible_from(place),
            log_events: self.ctx.log_events,
            cancel: self.ctx.cancel.clone(),
            region_labels: self.labels.clone(),
            random_seed: self.ctx.seed ^ fnv1a(id.as_bytes()),
            models: self.models.clone(),
            round_cap: self
                .prompt
                .frontmatter
                .max_tool_iterations
                .unwrap_or(self.ctx.round_cap),
            nonce: self.nonce.clone(),
            input_plugin: self.input_plugin(),
            bound_tools: self.bound_tools.clone(),
        };
        match SectionVm::new(cfg) {
            Ok(vm) => {
                self.events.push(Event::SharedLoadStarted {
                    section: name.clone(),
                });
                let entry = Box::new(Entry {
                    place,
                    name,
                    vm,
                    stage: Stage::Shared,
                    next_block: 0,
                    running: false,
                    waiting: None,
                    answer: None,
                });
                if let Some(chain) = self.chains.last_mut() {
                    chain.entry = Some(entry);
                }
            }
            Err(failure) => {
                self.teardown(&name);
                self.chain_failed(place, failure, true);
            }
        }
    }

    fn flush_logs(&mut self, vm: &mut SectionVm, name: &str) {
        for message in vm.take_logs() {
            self.events.push(Event::Log {
                section: name.to_owned(),
                message,
            });
        }
    }

    fn teardown(&mut self, name: &str) {
        self.events.push(Event::TeardownStarted {
            section: name.to_owned(),
        });
        self.events.push(Event::TeardownSucceeded {
            section: name.to_owned(),
        });
    }

    /// Enter the top chain's next section, or end the chain when its walk runs out.
    fn enter_next(&mut self) {
        let Some(chain) = self.chains.last_mut() else {
            return;
        };
        let id = loop {
            let Some(level) = chain.levels.last_mut() else {
                // The walk ran past its end: no result.
                self.finish_chain(None);
                return;
            };
            match level.siblings.get(level.next) {
                Some(&id) => {
                    level.next += 1;
                    break id;
                }
                None => {
                    chain.levels.pop();
                }
            }
        };
        let entry_id = format!("{}.{}", chain.id, chain.entries);
        chain.entries += 1;
        let Some(name) = self.prompt.section(id).map(|s| s.name.clone()) else {
            self.fail(RunErrorKind::Internal, "section index out of range");
            return;
        };
        self.events.push(Event::SectionStarted {
            section: name.clone(),
            id: entry_id.clone(),
        });
        self.new_entry(Place::Section(id), name, &entry_id);
    }

    fn blocks_of(&self, place: Place) -> &[Block] {
        match place {
            Place::H1 => &self.prompt.h1_blocks,
            Place::Section(id) => self
                .prompt
                .section(id)
                .map_or(&[][..], |s| s.blocks.as_slice()),
        }
    }

    /// Put an entry back as the top chain's entry.
    fn park(&mut self, entry: Box<Entry>) {
        if let Some(chain) = self.chains.last_mut() {
            chain.entry = Some(entry);
        }
    }

    /// Run the entry (its shared library replay, then its blocks) until a coroutine suspends,
    /// the entry ends, or the run ends.
    fn advance_entry(&mut self, mut entry: Box<Entry>) {
        if let Some(Wait::Effect(id)) = entry.waiting.take() {
            entry.answer = self.answers.remove(&id);
        }
        loop {
            if !entry.running {
                match entry.stage {
                    Stage::Shared => {
                        // Every section VM replays the shared library; a prompt without one
                        // replays an empty library, which runs nothing but still reports it.
                        let Some(shared) = self.prompt.shared.clone() else {
                            self.events.push(Event::SharedLoadSucceeded {
                                section: entry.name.clone(),
                            });
                            if let Err(failure) = entry.vm.install_alias_globals() {
                                return self.entry_failed(entry, failure);
                            }
                            entry.stage = Stage::Blocks;
                            continue;
                        };
                        if let Err(failure) = entry.vm.start_shared(&shared) {
                            return self.shared_failed(entry, failure);
                        }
                    }
                    Stage::Blocks => {
                        let prompt = self.prompt.clone();
                        let blocks = match entry.place {
                            Place::H1 => &prompt.h1_blocks[..],
                            Place::Section(id) => {
                                prompt.section(id).map_or(&[][..], |s| s.blocks.as_slice())
                            }
                        };
                        // The next Lua block; prose blocks are read by the block after them.
                        let mut index = entry.next_block;
                        while index < blocks.len() && !matches!(blocks[index], Block::Lua(_)) {
                            index += 1;
                        }
                        let Some(Block::Lua(region)) = blocks.get(index) else {
                            return self.finish_entry(entry, None, None);
                        };
                        let prose = match index.checked_sub(1).and_then(|i| blocks.get(i)) {
                            Some(Block::Prose(p)) => p.text.as_str(),
                            _ => "",
                        };
                        entry.next_block = index + 1;
                        self.events.push(Event::BlockStarted {
                            section: entry.name.clone(),
                            label: region.label.clone(),
                        });
                        if let Err(failure) = entry.vm.start_block(region, prose) {
                            return self.entry_failed(entry, failure);
                        }
                    }
                }
                entry.running = true;
            }
            let answer = entry.answer.take();
            let step = entry.vm.resume(answer);
            let name = entry.name.clone();
            self.flush_logs(&mut entry.vm, &name);
            // A recorded jump wins over however the block ended (pcall cannot cancel it).
            if entry.stage == Stage::Blocks
                && !matches!(step, BlockStep::Suspended(_))
                && let Some(target) = entry.vm.take_jump()
            {
                entry.running = false;
                self.block_succeeded(&entry);
                return self.finish_entry(entry, None, Some(target));
            }
            match step {
                BlockStep::Suspended(request) => match self.dispatch(&entry, &request) {
                    Ok(Dispatch::Effect(effect)) => {
                        let id = self.next_effect;
                        self.next_effect += 1;
                        self.issued.push((id, effect));
                        entry.waiting = Some(Wait::Effect(id));
                        return self.park(entry);
                    }
                    Ok(Dispatch::Answer(answer)) => {
                        entry.answer = Some(answer);
                    }
                    Ok(Dispatch::Call(chain)) => {
                        entry.waiting = Some(Wait::Chain);
                        self.park(entry);
                        self.chains.push(*chain);
                        return;
                    }
                    Ok(Dispatch::Fanout(fanout)) => {
                        entry.waiting = Some(Wait::Chain);
                        self.park(entry);
                        if let Some(chain) = self.chains.last_mut() {
                            chain.fanout = Some(fanout);
                        }
                        return;
                    }
                    Ok(Dispatch::Fail(error)) => {
                        let name = entry.name.clone();
                        drop(entry);
                        self.teardown(&name);
                        self.end(Outcome::Failed(error));
                        return;
                    }
                    Err(message) => {
                        let failure = LuaFailure {
                            kind: FailureKind::Internal,
                            message,
                            traceback: None,
                            error: None,
                        };
                        return match entry.stage {
                            Stage::Shared => self.shared_failed(entry, failure),
                            Stage::Blocks => self.entry_failed(entry, failure),
                        };
                    }
                },
                BlockStep::Failed(failure) => {
                    return match entry.stage {
                        Stage::Shared => self.shared_failed(entry, failure),
                        Stage::Blocks => self.entry_failed(entry, failure),
                    };
                }
                BlockStep::Finished(result) => {
                    entry.running = false;
                    if entry.stage == Stage::Shared {
                        self.events.push(Event::SharedLoadSucceeded {
                            section: entry.name.clone(),
                        });
                        if let Err(failure) = entry.vm.install_alias_globals() {
                            return self.entry_failed(entry, failure);
                        }
                        entry.stage = Stage::Blocks;
                        continue;
                    }
                    self.block_succeeded(&entry);
                    if let Some(result) = result {
                        return self.finish_entry(entry, Some(result), None);
                    }
                    // A block's end reads var back: a reassigned var fails here.
                    if let Err(failure) = entry.vm.read_back_var() {
                        return self.entry_failed_after_block(entry, failure);
                    }
                }
            }
        }
    }

    fn block_succeeded(&mut self, entry: &Entry) {
        let label = self
            .blocks_of(entry.place)
            .get(entry.next_block.saturating_sub(1))
            .and_then(Block::as_lua)
            .map(|r| r.label.clone())
            .unwrap_or_default();
        self.events.push(Event::BlockSucceeded {
            section: entry.name.clone(),
            label,
        });
    }

    /// The shared library failed to load: `Lua` wherever it happens (H1 pass included).
    fn shared_failed(&mut self, entry: Box<Entry>, failure: LuaFailure) {
        self.events.push(Event::SharedLoadFailed {
            section: entry.name.clone(),
        });
        let (place, name) = (entry.place, entry.name.clone());
        drop(entry);
        self.teardown(&name);
        self.chain_failed(place, failure, true);
    }

    /// The entry ran out of blocks, returned, or jumped: read back, tear down, and move on.
    fn finish_entry(&mut self, entry: Box<Entry>, result: Option<String>, jump: Option<String>) {
        let var = entry.vm.read_back_var();
        let argv = match entry.place {
            Place::H1 if result.is_none() => Some(entry.vm.read_back_argv()),
            _ => None,
        };
        let name = entry.name.clone();
        let place = entry.place;
        drop(entry);
        self.teardown(&name);
        let var = match var {
            Ok(var) => var,
            Err(failure) => return self.chain_failed(place, failure, true),
        };
        let argv = match argv.transpose() {
            Ok(argv) => argv,
            Err(failure) => return self.chain_failed(place, failure, true),
        };
        if let Some(chain) = self.chains.last_mut() {
            chain.var = var;
            if let Some(argv) = argv {
                chain.argv = argv;
            }
        }
        if let Place::Section(_) = place {
            self.events.push(Event::SectionFinished { section: name });
        }
        if let Some(result) = result {
            return self.finish_chain(Some(result));
        }
        if let Some(target) = jump {
            self.apply_jump(place, &target);
        }
    }

    /// Move the top chain's walk to a jump's target: a sibling (or, from the H1 pass, any
    /// top-level section) continues the walk there; a direct child starts a child walk whose
    /// end resumes the parent level after the jumper. A bad target fails with `Lua`.
    fn apply_jump(&mut self, place: Place, target: &str) {
        let id = match self.resolve(place, target) {
            Ok(id) => id,
            Err(message) => {
                let failure = LuaFailure {
                    kind: FailureKind::Run("Lua".into()),
                    message: message.clone(),
                    traceback: None,
                    error: Some(Box::new(ErrorValue {
                        kind: "lua".into(),
                        message,
                        fields: Json::Object(Map::new()),
                        run_kind: "Lua".into(),
                    })),
                };
                return self.chain_failed(place, failure, true);
            }
        };
        let is_child = match place {
            Place::Section(from) => self
                .prompt
                .section(from)
                .is_some_and(|s| s.children.contains(&id)),
            Place::H1 => false,
        };
        let siblings = self.siblings_of(id).to_vec();
        let index = siblings.iter().position(|s| *s == id).unwrap_or(0);
        let Some(chain) = self.chains.last_mut() else {
            return;
        };
        if is_child {
            chain.levels.push(Level {
                siblings,
                next: index,
            });
        } else if let Some(level) = chain.levels.last_mut() {
            level.next = index;
        }
    }

    /// The top chain ended: with a result, or by running off its walk.
    fn finish_chain(&mut self, result: Option<String>) {
        if self.chains.len() <= 1 && self.in_arm {
            // An arm's own chain: its result goes to the fanout.
            self.chains.clear();
            self.arm_end = Some(ArmEnd::Done(result.unwrap_or_default()));
            return;
        }
        if self.chains.len() <= 1 {
            // The main walk: its result is the run's, or the done fallback.
            self.end(Outcome::Completed(
                result.unwrap_or_else(|| "done".to_owned()),
            ));
            return;
        }
        self.chains.pop();
        // A called chain's result is what `call` returns ('' when it ran off its walk).
        if let Some(caller) = self.chains.last_mut().and_then(|c| c.entry.as_mut()) {
            caller.waiting = None;
            caller.answer = Some(Answer::Value(Json::String(result.unwrap_or_default())));
        }
    }

    /// A failure ended the top chain: the main walk's failure ends the run; a called chain's
    /// failure is raised at its caller's `call`, as the chain's own error value.
    fn chain_failed(&mut self, place: Place, failure: LuaFailure, around: bool) {
        if self.chains.len() <= 1 && self.in_arm && failure.kind != FailureKind::Cancelled {
            self.chains.clear();
            self.arm_end = Some(ArmEnd::Failed(failure));
            return;
        }
        if self.chains.len() <= 1 || failure.kind == FailureKind::Cancelled {
            return self.fail_from_lua(place, failure, around);
        }
        self.chains.pop();
        let error = error_value_of(&failure);
        if let Some(caller) = self.chains.last_mut().and_then(|c| c.entry.as_mut()) {
            caller.waiting = None;
            caller.answer = Some(Answer::Error(error));
        }
    }

    fn entry_failed(&mut self, entry: Box<Entry>, failure: LuaFailure) {
        self.events.push(Event::BlockFailed {
            section: entry.name.clone(),
        });
        let (place, name) = (entry.place, entry.name.clone());
        drop(entry);
        self.teardown(&name);
        self.chain_failed(place, failure, false);
    }

    fn entry_failed_after_block(&mut self, entry: Box<Entry>, failure: LuaFailure) {
        let (place, name) = (entry.place, entry.name.clone());
        drop(entry);
        self.teardown(&name);
        self.chain_failed(place, failure, true);
    }

    /// Turn a suspended call's request into Harness work, an immediate answer (a store call
    /// whose arguments fail, a `call` that cannot start), a called chain, or the end of the
    /// run (a claims conflict, never catchable).
    fn dispatch(&mut self, entry: &Entry, request: &Request) -> Result<Dispatch, String> {
        match request.op.as_str() {
            "store" => {}
            "call" => return Ok(self.start_call(entry, &request.payload)),
            "fanout" => return Ok(self.start_fanout(entry, &request.payload)),
            _ => return parse_request(request).map(Dispatch::Effect),
        }
        let op = match store_op(&request.payload) {
            Ok(op) => op,
            Err(answer) => return Ok(Dispatch::Answer(answer)),
        };
        let access = match op.access() {
            Ok(access) => access,
            Err(err) => return Ok(Dispatch::Answer(store_error_answer(&err))),
        };
        if let Err(conflict) = self.claims.claim(self.claim_ref, &access) {
            return Ok(Dispatch::Fail(conflict.to_run_error()));
        }
        Ok(Dispatch::Effect(Effect::Store(op)))
    }

    /// `call(target, input?)`: start a called chain at the target, or refuse at the call.
    fn start_call(&mut self, entry: &Entry, payload: &Json) -> Dispatch {
        let target = payload
            .get("target")
            .and_then(Json::as_str)
            .unwrap_or_default();
        let input = payload.get("input").and_then(Json::as_str);
        let Some(parent) = self.chains.last() else {
            return Dispatch::Answer(lua_error_answer("no chain is running".into()));
        };
        let depth = parent.depth + 1;
        let id = match self.resolve(entry.place, target) {
            Ok(id) => id,
            Err(message) => return Dispatch::Answer(lua_error_answer(message)),
        };
        if depth > CALL_DEPTH_CAP {
            return Dispatch::Answer(lua_error_answer(format!(
                "call recursion exceeded cap of {CALL_DEPTH_CAP}"
            )));
        }
        // The called chain starts from a copy of the caller's var, taken now.
        let var = match entry.vm.read_back_var() {
            Ok(var) => var,
            Err(failure) => return Dispatch::Answer(lua_error_answer(failure.message)),
        };
        let (args, argv) = match input {
            Some(input) => (
                input.to_owned(),
                derive_argv(&self.prompt.frontmatter.args, input),
            ),
            None => (parent.args.clone(), parent.argv.clone()),
        };
        match self.child_chain(id, depth, var, args, argv, None) {
            Some(chain) => Dispatch::Call(Box::new(chain)),
            None => Dispatch::Answer(lua_error_answer("no chain is running".into())),
        }
    }

    /// A child chain of the top chain, under the top chain's next child id, whose walk starts
    /// at section `start` among its siblings; `None` when no chain is running. A fanout arm
    /// (`arm`: its member and position) is a task of its own; any other child runs in its
    /// parent's task.
    fn child_chain(
        &mut self,
        start: SectionId,
        depth: u32,
        var: Json,
        args: String,
        argv: Json,
        arm: Option<(Json, usize)>,
    ) -> Option<Chain> {
        let siblings = self.siblings_of(start).to_vec();
        let next = siblings.iter().position(|s| *s == start).unwrap_or(0);
        let parent = self.chains.last_mut()?;
        let id = format!("{}.{}", parent.id, parent.children);
        parent.children += 1;
        let task_id = if arm.is_some() {
            id.clone()
        } else {
            parent.task_id.clone()
        };
        Some(Chain {
            id,
            entries: 0,
            children: 0,
            levels: vec![Level { siblings, next }],
            var,
            args,
            argv,
            depth,
            entry: None,
            task_id,
            item: arm,
            fanout: None,
        })
    }

    /// `fanout(worker, collection)`: one arm per member, each a task chain one level deeper,
    /// starting at the worker section with a copy of the caller's var; or a refusal at the call.
    fn start_fanout(&mut self, entry: &Entry, payload: &Json) -> Dispatch {
        let worker = payload
            .get("worker")
            .and_then(Json::as_str)
            .unwrap_or_default();
        let items = match payload.get("items") {
            Some(Json::Array(items)) => items.clone(),
            _ => Vec::new(),
        };
        let Some(parent) = self.chains.last() else {
            return Dispatch::Answer(lua_error_answer("no chain is running".into()));
        };
        let depth = parent.depth + 1;
        let id = match self.resolve(entry.place, worker) {
            Ok(id) => id,
            Err(message) => return Dispatch::Answer(lua_error_answer(message)),
        };
        if let Some(section) = self.prompt.section(id)
            && section.items.is_some()
        {
            return Dispatch::Answer(lua_error_answer(format!(
                "section `{}` is a list section, not a worker template",
                section.name
            )));
        }
        if depth > CALL_DEPTH_CAP {
            return Dispatch::Answer(lua_error_answer(format!(
                "fanout recursion exceeded cap of {CALL_DEPTH_CAP}"
            )));
        }
        let var = match entry.vm.read_back_var() {
            Ok(var) => var,
            Err(failure) => return Dispatch::Answer(lua_error_answer(failure.message)),
        };
        let (args, argv) = (parent.args.clone(), parent.argv.clone());
        let caller_claims = self.claim_ref;
        let mut arms = Vec::with_capacity(items.len());
        for (index, item) in items.into_iter().enumerate() {
            let arm = Some((item.clone(), index + 1));
            let Some(chain) =
                self.child_chain(id, depth, var.clone(), args.clone(), argv.clone(), arm)
            else {
                break;
            };
            let claims = self
                .claims
                .fork(caller_claims, chain.id.clone())
                .unwrap_or(caller_claims);
            arms.push(Arm {
                stack: vec![chain],
                claims,
                item,
                end: None,
            });
        }
        Dispatch::Fanout(Box::new(Fanout {
            arms,
            caller_claims,
        }))
    }

    /// Classify a Lua failure that ends the run. `around` marks failures around the blocks
    /// (shared library load, read-backs), which stay `Lua` even in the H1 pass.
    fn fail_from_lua(&mut self, place: Place, failure: LuaFailure, around: bool) {
        let kind = match &failure.kind {
            FailureKind::Cancelled => {
                self.end(Outcome::Cancelled);
                return;
            }
            FailureKind::Quota => RunErrorKind::Quota,
            FailureKind::Internal => RunErrorKind::Internal,
            FailureKind::Run(name) => RunErrorKind::from_name(name).unwrap_or(RunErrorKind::Lua),
            FailureKind::Lua if place == Place::H1 && !around => RunErrorKind::RequirementsUnmet,
            FailureKind::Lua => RunErrorKind::Lua,
        };
        let message = match failure.kind {
            FailureKind::Quota if failure.message.contains("event budget") => {
                "lua log event quota exceeded".to_owned()
            }
            FailureKind::Quota => "lua log byte quota exceeded".to_owned(),
            _ => failure.message,
        };
        let mut error = RunError::new(kind, message);
        error.traceback = failure.traceback;
        self.end(Outcome::Failed(error));
    }
}

/// Whether an arm's failure is round-cap exhaustion (the one failure a fanout survives).
fn is_exhausted(failure: &LuaFailure) -> bool {
    failure
        .error
        .as_ref()
        .is_some_and(|e| e.kind == "tool_loop_exhausted")
}

/// A failure as the error value raised at its caller (`call`, `fanout`), unchanged.
fn error_value_of(failure: &LuaFailure) -> ErrorValue {
    let mut error = failure.error.clone().map_or_else(
        || ErrorValue {
            kind: "lua".into(),
            message: failure.message.clone(),
            fields: Json::Object(Map::new()),
            run_kind: String::new(),
        },
        |e| *e,
    );
    match failure.kind {
        FailureKind::Quota => error.run_kind = "Quota".into(),
        FailureKind::Internal => {
            error.kind = "internal".into();
            error.run_kind = "Internal".into();
        }
        _ => {}
    }
    error
}

/// What a suspended call's request becomes.
#[derive(Debug)]
enum Dispatch {
    /// Work for the Harness.
    Effect(Effect),
    /// An answer the engine gives at once.
    Answer(Answer),
    /// A `call` starts this chain; the caller waits on it.
    Call(Box<Chain>),
    /// A `fanout` starts these arms; the caller waits on them all.
    Fanout(Box<Fanout>),
    /// The run ends.
    Fail(RunError),
}

/// A `lua`-kind error value answered at once.
fn lua_error_answer(message: String) -> Answer {
    Answer::Error(ErrorValue {
        kind: "lua".into(),
        message,
        fields: Json::Object(Map::new()),
        // No run error kind of its own: an ordinary Lua failure (the H1 gate applies).
        run_kind: String::new(),
    })
}

/// A store error as the error value raised at the call (run error kind `Vfs`).
pub fn store_error_answer(err: &StoreError) -> Answer {
    let mut fields = Map::new();
    if let Ok(Json::Object(map)) = serde_json::to_value(err) {
        for (key, value) in map {
            if key != "message" {
                fields.insert(key, value);
            }
        }
    }
    Answer::Error(ErrorValue {
        kind: "store".into(),
        message: err.message.clone(),
        fields: Json::Object(fields),
        run_kind: "Vfs".into(),
    })
}

/// A store answer as the value the call returns.
pub fn store_answer(answer: StoreAnswer) -> Answer {
    Answer::Value(match answer {
        StoreAnswer::Text(text) => Json::String(text),
        StoreAnswer::Bool(b) => Json::Bool(b),
        StoreAnswer::List(items) => Json::Array(items.into_iter().map(Json::String).collect()),
        StoreAnswer::Unit => Json::Null,
    })
}

/// The store operation a `store.*` call asks for, or the argument error to raise at the call.
fn store_op(payload: &Json) -> Result<StoreOp, Answer> {
    let text = |key: &str| {
        payload
            .get(key)
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let range = || -> Result<Option<LineRange>, Answer> {
        let bound = |key: &str| {
            let raw = payload.get(key);
            let ty = raw
                .and_then(|b| b.get("type"))
                .and_then(Json::as_str)
                .unwrap_or("nil");
            let value = raw.and_then(|b| b.get("value"));
            match (ty, value) {
                ("nil", _) => BoundArg::Nil,
                ("integer", Some(v)) => v.as_i64().map_or(BoundArg::Nil, BoundArg::Integer),
                ("number", Some(v)) => v.as_f64().map_or(BoundArg::Nil, BoundArg::Number),
                (other, _) => BoundArg::Other(match other {
                    "string" => "string",
                    "boolean" => "boolean",
                    "table" => "table",
                    "function" => "function",
                    "thread" => "thread",
                    _ => "userdata",
                }),
            }
        };
        line_range(bound("first"), bound("last")).map_err(lua_error_answer)
    };
    let op = text("op");
    Ok(match op.as_str() {
        "read" => StoreOp::Read {
            path: text("path"),
            range: range()?,
        },
        "read_numbered" => StoreOp::ReadNumbered {
            path: text("path"),
            range: range()?,
        },
        "write" => StoreOp::Write {
            path: text("path"),
            contents: text("contents"),
        },
        "append" => StoreOp::Append {
            path: text("path"),
            contents: text("contents"),
        },
        "str_replace" => StoreOp::StrReplace {
            path: text("path"),
            old: text("old"),
            new: text("new"),
        },
        "delete" => StoreOp::Delete { path: text("path") },
        "exists" => StoreOp::Exists { path: text("path") },
        "glob" => StoreOp::Glob {
            pattern: text("pattern"),
        },
        other => {
            return Err(lua_error_answer(format!(
                "unknown store operation `{other}`"
            )));
        }
    })
}

/// Parse a suspended call's request into an effect for the Harness.
fn parse_request(request: &Request) -> Result<Effect, String> {
    match request.op.as_str() {
        "model.infer" => {
            let model: ModelTarget =
                serde_json::from_value(request.payload.get("model").cloned().unwrap_or(Json::Null))
                    .map_err(|e| format!("malformed model.infer request: {e}"))?;
            let prompt = request
                .payload
                .get("prompt")
                .and_then(Json::as_str)
                .unwrap_or_default()
                .to_owned();
            Ok(Effect::ModelRound(ModelRound {
                infer: true,
                model,
                messages: vec![serde_json::json!({"role": "user", "content": prompt})],
                tools: Vec::new(),
            }))
        }
        "input.ask" => Ok(Effect::Ask),
        "tool.call" => {
            let text = |key: &str| {
                request
                    .payload
                    .get(key)
                    .and_then(Json::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            let args = match request.payload.get("args") {
                Some(Json::Object(map)) => Json::Object(map.clone()),
                _ => Json::Object(Map::new()),
            };
            Ok(Effect::Tool {
                alias: text("alias"),
                path: text("path"),
                args,
            })
        }
        "model.loop" => {
            let model: ModelTarget =
                serde_json::from_value(request.payload.get("model").cloned().unwrap_or(Json::Null))
                    .map_err(|e| format!("malformed model.loop request: {e}"))?;
            let list = |key: &str| match request.payload.get(key) {
                Some(Json::Array(items)) => items.clone(),
                _ => Vec::new(),
            };
            Ok(Effect::ModelRound(ModelRound {
                infer: false,
                model,
                messages: list("messages"),
                tools: list("tools"),
            }))
        }
        other => Err(format!("unsupported suspending request `{other}`")),
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
    }
}

/// A small, stable hash (FNV-1a) for deriving per-entry seeds from entry ids.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

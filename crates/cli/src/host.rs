//! The CLI Host's side of a run: performing the engine's effects for real, all at once.
//!
//! Every effect a step issues starts at once: store operations are performed on the spot (the
//! protocol wants them answered before the next step), model rounds and timers run as tasks on
//! a tokio runtime, and operator questions go, one at a time, to the person at the terminal.
//! Each answer is handed to the run as it arrives and the run steps again; the engine takes
//! answers in an order of its own, so what the run does never depends on which answer came
//! first. A Ctrl-C wakes the loop, the run ends cancelled, and everything in flight is dropped.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use promptforge_engine::protocol::{
    ASK_TOOL_PATH, Answer, Effect, EffectId, ErrorValue, ModelRound, RunErrorKind, Step,
    store_answer, store_error_answer,
};
use promptforge_engine::{Event, Outcome, Run};
use promptforge_harness::mcp::McpPlugins;
use promptforge_harness::model::{
    ModelDescription, ModelError, ModelProvider, ReplyObserver, Usage, reply_answer, round_request,
};
use promptforge_harness::store::Store;
use promptforge_harness::web::WebPlugin;
use serde_json::{Value as Json, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::AbortHandle;

use crate::record::{Check, Divergence, Recorder, Replay};
use crate::ui::{Progress, RoundLine};
use crate::witness::Witness;

/// Held while a store operation runs: the cancel watchdog takes it before it ends the process,
/// so a forced exit never lands in the middle of a write.
pub static STORE_GATE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The current model: its catalog description and the provider that answers its rounds.
#[derive(Debug, Clone)]
pub struct CurrentModel {
    /// What the catalog knows about it.
    pub description: ModelDescription,
    /// The provider.
    pub provider: Arc<dyn ModelProvider>,
}

/// The operator behind `input.ask()`: answers given on the command line, a terminal, a
/// person reached through a client (an MCP client's elicitation), or nobody (no input broker).
#[derive(Debug)]
pub enum Operator {
    /// `--input TEXT` answers, in order.
    Scripted(VecDeque<String>),
    /// A person at the terminal on stdin.
    Terminal,
    /// A person behind a client, asked one question per call.
    Remote(RemoteOperator),
    /// No input broker.
    Nobody,
}

impl Operator {
    /// Whether the Host has an input broker.
    pub fn connected(&self) -> bool {
        !matches!(self, Operator::Nobody)
    }

    /// Whether a person answers, whenever they answer (not answers given up front).
    pub fn is_person(&self) -> bool {
        matches!(self, Operator::Terminal | Operator::Remote(_))
    }
}

/// What a remote operator is asked: `input.ask()` takes no question (chapter 05), so the Host
/// says which section asks; the future ends with the person's text, byte for byte, or the
/// reason there is none (a tool call failure for the run).
pub type RemoteAsk = Arc<
    dyn Fn(Option<String>) -> std::pin::Pin<Box<dyn Future<Output = Result<String, String>> + Send>>
        + Send
        + Sync,
>;

/// A person reached through a client.
#[derive(Clone)]
pub struct RemoteOperator(pub RemoteAsk);

impl std::fmt::Debug for RemoteOperator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemoteOperator")
    }
}

/// The fixed answer when nobody is there to ask (chapter 05).
const NO_OPERATOR: &str = "User input is unavailable in this host; continue without it.";

/// What reaches the Host's loop from work in flight.
#[derive(Debug)]
pub enum HostMessage {
    /// An effect's answer.
    Answer(EffectId, Answer),
    /// A model round ended with a reply (and its usage, when the provider reported it); its
    /// answer follows.
    Replied(EffectId, Option<Usage>),
    /// Look at the cancel flag (sent by the Ctrl-C handler).
    Wake,
}

/// The two ends of the Host's message channel; the sender also goes to the Ctrl-C handler.
pub fn channel() -> (UnboundedSender<HostMessage>, UnboundedReceiver<HostMessage>) {
    unbounded_channel()
}

/// How an operator answer is shaped: `input.ask()` reads `{text, available}`, the ask tool
/// only the text.
#[derive(Debug, Clone, Copy)]
enum AskShape {
    Ask,
    Tool,
}

/// Where the Host's notes for people go (a retry, a server's message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notes {
    /// Lines on stderr (above the progress display when one is drawn).
    Stderr,
    /// JSON lines on stdout, with the events (`--events`).
    JsonStdout,
    /// Kept for the run's diagnosis only (batch runs, whose own display owns the terminal).
    Keep,
}

/// What the Host learned about the run's model failures, for the hint a person sees at the
/// end: the server's own words and the Harness's detail (the URL tried, what to check).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnosis {
    /// The last status and message a model server refused a round with.
    pub server_message: Option<(u16, String)>,
    /// The last model failure's detail beyond its fixed text.
    pub detail: Option<String>,
    /// A model round failed on the infrastructure: the backend unreachable, timing out, or
    /// refusing with a status (a batch's `--retry-errors` runs such a run again).
    pub infrastructure: bool,
    /// The notes already shown on stderr: each says its piece once per run, however many
    /// rounds (a fanout's arms waiting out one rate limit) meet the same thing.
    pub(crate) noted: std::collections::BTreeSet<String>,
}

type SharedDiagnosis = Arc<std::sync::Mutex<Diagnosis>>;

/// Performs effects for one run.
#[derive(Debug)]
pub struct Host {
    model: Option<CurrentModel>,
    web: Option<Arc<WebPlugin>>,
    operator: Operator,
    store: Store,
    cancel: Arc<AtomicBool>,
    runtime: HostRuntime,
    tx: UnboundedSender<HostMessage>,
    rx: UnboundedReceiver<HostMessage>,
    /// The terminal operator's thread, started on the first question.
    terminal: Option<std::sync::mpsc::Sender<(EffectId, AskShape)>>,
    /// Questions the run withdrew (a cancelled task's): the terminal thread skips them.
    withdrawn: Withdrawn,
    /// Where notes go.
    notes: Notes,
    /// The live display and the run's totals.
    progress: Progress,
    /// Model rounds in flight across every run that shares it (a batch's concurrency limit).
    round_slots: Option<Arc<tokio::sync::Semaphore>>,
    diagnosis: SharedDiagnosis,
    /// Operator questions on the terminal not yet answered.
    asking: std::collections::BTreeSet<EffectId>,
    /// Writes the run down as it goes (`--record`).
    recorder: Option<Recorder>,
    /// Answers the run from a record (`replay`).
    replay: Option<Replay>,
    /// The MCP Plugins, and whether this Host stops their servers when it is done (it does
    /// when they run on its own runtime).
    mcp: Option<(Arc<McpPlugins>, bool)>,
    /// The response cache, when `--cache` is on.
    cache: Option<crate::response_cache::RunCache>,
}

/// The tokio runtime a Host drives its effects on: its own, or one shared by many runs (a
/// batch). Runs that share a provider must share a runtime: a pooled connection lives on the
/// runtime that opened it, and dies with it.
#[derive(Debug)]
enum HostRuntime {
    /// A current-thread runtime of this run's own, driven by the Host loop.
    Own(tokio::runtime::Runtime),
    /// A multi-thread runtime's handle, shared with other runs.
    Shared(tokio::runtime::Handle),
}

impl HostRuntime {
    fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        match self {
            HostRuntime::Own(runtime) => runtime.block_on(future),
            HostRuntime::Shared(handle) => handle.block_on(future),
        }
    }

    fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self {
            // From the Host loop, between its waits, a task spawned straight onto the runtime
            // goes through its shared queue and wakes the driver with a system call (one a
            // round); spawned from inside the runtime's own `block_on` (a future that is ready
            // at once, polled before any task runs) it joins the local queue.
            HostRuntime::Own(runtime) if tokio::runtime::Handle::try_current().is_err() => {
                // The task's handle is the point: it is returned, not awaited.
                #[allow(clippy::async_yields_async)]
                runtime.block_on(async move { tokio::spawn(future) })
            }
            HostRuntime::Own(runtime) => runtime.spawn(future),
            HostRuntime::Shared(handle) => handle.spawn(future),
        }
    }
}

/// Show a note for people where the Host's notes go.
fn note(notes: Notes, text: &str, json: impl FnOnce() -> Json) {
    match notes {
        Notes::Stderr => crate::ui::print_line(&format!(
            "{} {text}",
            crate::ui::paint("note:", crate::ui::Tone::Note)
        )),
        // A Host event: no secret the Host holds is written in it.
        Notes::JsonStdout => outln!(
            "{}",
            promptforge_harness::secrets::redact(&json().to_string())
        ),
        Notes::Keep => {}
    }
}

impl RoundWatch {
    /// A note for people, shown on stderr only the first time its text comes up in the run
    /// (the round's own line shows every retry); a Host event every time under `--events`.
    fn note_once(&self, text: &str, json: impl FnOnce() -> Json) {
        if self.notes == Notes::Stderr {
            let mut diagnosis = self.diagnosis.lock().unwrap_or_else(|e| e.into_inner());
            if !diagnosis.noted.insert(text.to_owned()) {
                return;
            }
        }
        note(self.notes, text, json);
    }
}

/// Watches a model round in flight for the Host: its reply streams onto its progress line,
/// and its retries are reported, so a round waiting out a rate limit never looks hung.
struct RoundWatch {
    effect: EffectId,
    notes: Notes,
    line: Arc<RoundLine>,
    diagnosis: SharedDiagnosis,
}

impl ReplyObserver for RoundWatch {
    fn text(&self, fragment: &str) {
        self.line.text(fragment);
    }

    fn reasoning(&self, _fragment: &str) {
        self.line.reasoning();
    }

    fn server_message(&self, status: u16, message: &str) {
        self.diagnosis
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .server_message = Some((
            status,
            promptforge_harness::secrets::redact(message).into_owned(),
        ));
        self.note_once(
            &format!("the model server answered {status}: {message}"),
            || {
                json!({"host_event": "model_server_message", "effect": self.effect,
                       "status": status, "message": message})
            },
        );
    }

    fn retry(&self, attempt: u32, wait: std::time::Duration, error: &ModelError) {
        self.line.waiting(&error.to_string(), wait);
        // Said once per run; each round's line counts down its own wait.
        self.note_once(
            &format!("{error}; the round is sent again after a wait (shown on its line)"),
            || {
                json!({"host_event": "model_retry", "effect": self.effect, "attempt": attempt,
                       "wait_ms": wait.as_millis() as u64, "reason": error.to_string()})
            },
        );
    }
}

/// The ids of withdrawn questions, shared with the terminal thread.
type Withdrawn = Arc<std::sync::Mutex<std::collections::BTreeSet<EffectId>>>;

/// An `internal` error value for a failure on the Harness's side.
fn internal(message: impl Into<String>, run_kind: RunErrorKind) -> Answer {
    Answer::Error(ErrorValue::new("internal", message, Some(run_kind)))
}

/// A `tool` error value: a failed tool call or operator question.
fn tool_failure(message: &str) -> Answer {
    Answer::Error(ErrorValue::new(
        "tool",
        format!("tool call failure: {message}"),
        Some(RunErrorKind::Tool),
    ))
}

/// An operator's answer in the shape its caller reads.
fn operator_answer(shape: AskShape, text: String, available: bool) -> Answer {
    match shape {
        AskShape::Ask => Answer::Value(json!({"text": text, "available": available})),
        AskShape::Tool => Answer::Value(Json::String(text)),
    }
}

impl Host {
    /// A Host with this current model (or none), store, operator, cancel flag and message
    /// channel.
    pub fn new(
        model: Option<CurrentModel>,
        web: Option<Arc<WebPlugin>>,
        store: Store,
        operator: Operator,
        cancel: Arc<AtomicBool>,
        (tx, rx): (UnboundedSender<HostMessage>, UnboundedReceiver<HostMessage>),
    ) -> Result<Host, String> {
        // One thread: the Host loop drives the runtime itself (`block_on` while it waits for
        // an answer), so a round's request, its reply and the engine's next step all happen
        // on the thread that runs the engine. Worker threads cost every round two cross-thread
        // wake-ups (the spawn and the answer), most of a round's CPU time against a fast
        // server; the rounds' I/O gains nothing from them, since it is waiting, not computing.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the async runtime: {e}"))?;
        Ok(Host {
            model,
            web,
            operator,
            store,
            cancel,
            runtime: HostRuntime::Own(runtime),
            tx,
            rx,
            terminal: None,
            withdrawn: Arc::default(),
            notes: Notes::Stderr,
            progress: Progress::new(false),
            round_slots: None,
            diagnosis: Arc::default(),
            asking: Default::default(),
            recorder: None,
            replay: None,
            mcp: None,
            cache: None,
        })
    }

    /// Where the Host's notes go (default: stderr).
    pub fn notes(mut self, notes: Notes) -> Self {
        self.notes = notes;
        self
    }

    /// Draw the live progress display on stderr.
    pub fn progress(mut self, draw: bool) -> Self {
        self.progress = Progress::new(draw);
        self
    }

    /// Report the run's progress to `reporter` as well.
    pub fn reporting(mut self, reporter: crate::ui::Reporter) -> Self {
        self.progress.set_reporter(reporter);
        self
    }

    /// Drive effects on a multi-thread runtime shared with other runs (a batch), whose
    /// providers' connection pools live on it.
    pub fn shared_runtime(mut self, handle: tokio::runtime::Handle) -> Self {
        self.runtime = HostRuntime::Shared(handle);
        self
    }

    /// Offer the MCP servers of the config as Plugins `mcp/NAME`. Servers started for a run
    /// on the Host's own runtime stop when the Host is dropped; on a shared runtime, whoever
    /// shares them stops them.
    pub fn mcp(mut self, plugins: Arc<McpPlugins>) -> Self {
        let own = matches!(self.runtime, HostRuntime::Own(_));
        self.mcp = Some((plugins, own));
        self
    }

    /// Activate the MCP Plugins the prompt declares (`mcp/NAME` with a configured server):
    /// each server starts, all at once, and lists its tools; the registry entries come back
    /// in declaration order for the run's Host state.
    pub fn activate_mcp(
        &self,
        frontmatter: &promptforge_syntax::frontmatter::Frontmatter,
    ) -> Vec<promptforge_engine::PluginInfo> {
        let Some((plugins, _)) = &self.mcp else {
            return Vec::new();
        };
        let wanted: Vec<&str> = frontmatter
            .plugins
            .iter()
            .filter_map(|p| promptforge_harness::mcp::server_of_plugin(&p.id))
            .filter(|name| plugins.configured(name))
            .collect();
        if wanted.is_empty() {
            return Vec::new();
        }
        let infos = self.runtime.block_on(futures_util::future::join_all(
            wanted.iter().map(|name| plugins.plugin_info(name)),
        ));
        infos.into_iter().flatten().collect()
    }

    /// Write the run down as it goes.
    pub fn recorder(mut self, recorder: Recorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// Take the recorder back (to write the outcome).
    pub fn take_recorder(&mut self) -> Option<Recorder> {
        self.recorder.take()
    }

    /// Answer the run from a record instead of performing its effects (until a divergence,
    /// and after it too with `--then-live`).
    pub fn replay(mut self, replay: Replay) -> Self {
        self.replay = Some(replay);
        self
    }

    /// Where the replay diverged from its record, if it did.
    pub fn divergence(&self) -> Option<&Divergence> {
        self.replay.as_ref().and_then(|r| r.divergence.as_ref())
    }

    /// Share a limit on model rounds in flight with other runs (a batch).
    /// Answer model rounds from the response cache where it can, and keep new replies there.
    pub(crate) fn cache(mut self, cache: crate::response_cache::RunCache) -> Self {
        self.cache = Some(cache);
        self
    }

    pub fn round_slots(mut self, slots: Arc<tokio::sync::Semaphore>) -> Self {
        self.round_slots = Some(slots);
        self
    }

    /// The run's store (to collect the output file after the run).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The run's store, to look into after the run.
    pub fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    /// The live display and the run's totals.
    pub fn progress_state(&mut self) -> &mut Progress {
        &mut self.progress
    }

    /// What the run's model failures said.
    pub fn diagnosis(&self) -> Diagnosis {
        self.diagnosis
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether a provider of this Host binds answers by the order effects reach it (the
    /// scripted model and the scripted network answer at issue, in issue order).
    fn binds_in_issue_order(&self) -> bool {
        let scripted_model = self
            .model
            .as_ref()
            .is_some_and(|m| m.provider.binds_in_order());
        let scripted_web = self.web.as_ref().is_some_and(|w| w.is_immediate());
        scripted_model || scripted_web
    }

    /// Every part watching the run (the progress display, the recorder, the replay source),
    /// driven through one trait at the same points of the loop.
    fn witnesses(&mut self) -> impl Iterator<Item = &mut dyn Witness> {
        let progress: &mut dyn Witness = &mut self.progress;
        let recorder = self.recorder.as_mut().map(|r| r as &mut dyn Witness);
        let replay = self.replay.as_mut().map(|r| r as &mut dyn Witness);
        std::iter::once(progress).chain(recorder).chain(replay)
    }

    /// Drive a run to its end, handing every event to `on_event` as it happens.
    pub fn drive(&mut self, run: &mut Run, on_event: &mut dyn FnMut(&Event)) -> Outcome {
        // Strands run ahead on their own answers unless a provider here binds answers by issue
        // order (its effects must then go out in the committed order), or this is a replay
        // (which hands answers back in the recorded order one at a time anyway).
        // `PROMPTFORGE_RUN_AHEAD=off` keeps every strand in the committed order (a way to
        // rule run-ahead out when chasing a problem; results are the same either way).
        let off = std::env::var("PROMPTFORGE_RUN_AHEAD").is_ok_and(|v| v == "off");
        if off || self.binds_in_issue_order() || self.replay.is_some() {
            run.set_run_ahead(false);
        }
        let mut in_flight: BTreeMap<EffectId, AbortHandle> = BTreeMap::new();
        // Steps taken so far (a version-1 replay hands answers back by them), and answers the
        // run has taken (a record numbers answers by them, and a replay hands each back when
        // the run has taken the ones before it).
        let mut steps: u64 = 0;
        let mut taken: u64 = 0;
        // Answers from outside arrived since the last step (a journal syncs them first).
        let mut arrived = false;
        loop {
            if let Some(replay) = &mut self.replay {
                let counter = replay.counter(steps, taken);
                let answers = replay.answers_before(counter);
                let cancel = replay.cancel_before(counter);
                for (id, answer) in answers {
                    // A resumed run's journal keeps them again, in this run's order.
                    if let Some(recorder) = &mut self.recorder {
                        recorder.answered(id, &answer);
                    }
                    run.resume(id, answer);
                }
                if cancel {
                    run.cancel();
                }
            }
            let step = run.step();
            steps += 1;
            for event in run.take_events() {
                for witness in self.witnesses() {
                    witness.event(&event);
                }
                on_event(&event);
            }
            let commits = run.take_commits();
            taken += commits.taken.len() as u64;
            let batch = match step {
                Step::Done(outcome) => {
                    for handle in in_flight.values() {
                        handle.abort();
                    }
                    // Replies that streamed before the end (a race's loser, a cancelled or
                    // failed run) still cost their tokens: counted, and kept in the record.
                    while let Ok(message) = self.rx.try_recv() {
                        match message {
                            HostMessage::Replied(id, usage) => {
                                for witness in self.witnesses() {
                                    witness.round_finished(id, Some(usage.as_ref()));
                                }
                            }
                            HostMessage::Answer(id, answer) => {
                                for witness in self.witnesses() {
                                    witness.answered(id, &answer);
                                }
                            }
                            HostMessage::Wake => {}
                        }
                    }
                    // What the order issued in the last step never went out: recorded, as
                    // withdrawn.
                    let unsent: Vec<EffectId> = commits.unsent.iter().map(|(id, _)| *id).collect();
                    for witness in self.witnesses() {
                        witness.step(&commits.unsent, &commits, &unsent, &|_| None);
                        witness.ended();
                    }
                    return outcome;
                }
                Step::Effects(batch) => batch,
            };
            for id in &batch.withdrawn {
                if let Some(handle) = in_flight.remove(id) {
                    handle.abort();
                }
            }
            if self.terminal.is_some() && !batch.withdrawn.is_empty() {
                let mut withdrawn = self.withdrawn.lock().unwrap_or_else(|e| e.into_inner());
                withdrawn.extend(batch.withdrawn.iter().copied());
            }
            let mut answered = false;
            let mut stopped = false;
            for witness in self.witnesses() {
                witness.step(&batch.issued, &commits, &batch.withdrawn, &|id| {
                    run.effect_task(id)
                });
            }
            // Answers from outside that this step took (or that an effect issued ahead had
            // and whose issue it committed) are made durable before anything it issued goes
            // out: nothing the world sees depends on an answer a crash could lose.
            if std::mem::take(&mut arrived) || !commits.renamed.is_empty() {
                let files: Vec<Arc<std::fs::File>> =
                    self.witnesses().filter_map(|w| w.durable()).collect();
                self.sync(files);
            }
            for (id, effect) in batch.issued {
                // Issued and withdrawn in one step: recorded above, never started.
                if batch.withdrawn.contains(&id) {
                    continue;
                }
                let check = self
                    .replay
                    .as_mut()
                    .map(|replay| replay.check(id, &effect, run.effect_site(id)));
                if let Some(check) = check {
                    match check {
                        Check::FromRecord => {
                            self.operator_answered(&effect);
                            // The store's state is rebuilt as the run goes, so a replay that
                            // turns live after a divergence finds the files it made.
                            if let Effect::Store(op) = &effect {
                                let answer = match self.store.perform(op) {
                                    Ok(answer) => store_answer(answer),
                                    Err(err) => store_error_answer(&err),
                                };
                                if let Some(replay) = &mut self.replay {
                                    replay.performed(id, answer);
                                }
                            }
                            continue;
                        }
                        Check::Live => {}
                        Check::Arrived(answer) => {
                            self.operator_answered(&effect);
                            answered |= self.follow(run, &mut in_flight, id, Started::Now(answer));
                            continue;
                        }
                        Check::Stop => {
                            run.cancel();
                            stopped = true;
                            break;
                        }
                    }
                }
                let task = round_task(run, id, &effect);
                let started = self.start(id, effect, task);
                answered |= self.follow(run, &mut in_flight, id, started);
            }
            if answered || stopped {
                continue;
            }
            if let Some(replay) = &mut self.replay
                && (!replay.live || replay.owes_answers())
            {
                if replay.has_more(replay.counter(steps, taken)) {
                    continue;
                }
                if !replay.live {
                    // The record ends here, but the run still waits for an answer: name the
                    // oldest effect it issued that the record has no answer to.
                    let effect = replay.unanswered().unwrap_or(steps);
                    let site = run.effect_site(effect);
                    replay.divergence = Some(Divergence {
                        effect,
                        section: site.map(|s| s.section.clone()),
                        line: site.and_then(|s| s.line),
                        recorded: None,
                        new: None,
                        what: "the run waits for an answer the record does not have".to_owned(),
                    });
                    if !replay.then_live() {
                        run.cancel();
                        continue;
                    }
                    // `--then-live`: what the record has no answer for is performed now.
                    self.go_live(run, &mut in_flight);
                    continue;
                }
            }
            // A replay that went live at a divergence in this step: the effects it had matched
            // and the record has no answer for would otherwise wait for ever.
            if self.replay.as_ref().is_some_and(|r| r.live) && self.go_live(run, &mut in_flight) {
                continue;
            }
            // Use the wait: let the requests just started go out, then prepare the next
            // queued tasks (their section entries run now, their first requests held until a
            // slot frees) while nothing has arrived, one task at a time. With nothing queued
            // the wait below sends them (a pass of the runtime less per round).
            if run.may_prepare_ahead() {
                if let HostRuntime::Own(runtime) = &self.runtime {
                    runtime.block_on(tokio::task::yield_now());
                }
                while self.rx.is_empty()
                    && !self.cancel.load(Ordering::Relaxed)
                    && run.prepare_ahead()
                {}
            }
            // A journal's lines reach the system before the wait (a kill while waiting leaves
            // whole lines), without waiting for the disk.
            for witness in self.witnesses() {
                witness.idle();
            }
            // Wait for the next answer (or a Ctrl-C), then take every one that has arrived.
            // The runtime's tasks (rounds, timers, tool calls) make progress while it waits.
            let Some(first) = self.runtime.block_on(self.rx.recv()) else {
                run.cancel();
                continue;
            };
            let mut message = Some(first);
            while let Some(next) = message {
                match next {
                    HostMessage::Answer(id, answer) => {
                        in_flight.remove(&id);
                        arrived = true;
                        if self.asking.remove(&id) && self.asking.is_empty() {
                            self.progress.pause(false);
                        }
                        for witness in self.witnesses() {
                            witness.round_finished(id, None);
                            witness.answered(id, &answer);
                        }
                        run.resume(id, answer);
                    }
                    HostMessage::Replied(id, usage) => {
                        for witness in self.witnesses() {
                            witness.round_finished(id, Some(usage.as_ref()));
                        }
                    }
                    HostMessage::Wake => {}
                }
                message = self.rx.try_recv().ok();
            }
            if self.cancel.load(Ordering::Relaxed) {
                for witness in self.witnesses() {
                    witness.cancelled();
                }
                run.cancel();
            }
        }
    }

    /// A live replay performs the effects it matched that the record has no answer for: a
    /// store operation gets the answer it had when performed from the record (never a second
    /// go), an effect a killed run was answered (`resume`) its answer again, the rest go out.
    /// Whether the run got an answer now.
    fn go_live(&mut self, run: &mut Run, in_flight: &mut BTreeMap<EffectId, AbortHandle>) -> bool {
        let Some(replay) = &mut self.replay else {
            return false;
        };
        let live = replay.go_live_unanswered();
        let known: Vec<Option<Answer>> = live
            .iter()
            .map(|(id, effect)| {
                replay
                    .take_performed(*id)
                    .or_else(|| replay.take_arrived(*id, effect))
            })
            .collect();
        let mut answered = false;
        for ((id, effect), known) in live.into_iter().zip(known) {
            let task = round_task(run, id, &effect);
            let started = match known {
                Some(answer) => {
                    self.operator_answered(&effect);
                    Started::Now(answer)
                }
                None => self.start(id, effect, task),
            };
            answered |= self.follow(run, in_flight, id, started);
        }
        answered
    }

    /// Sync files to the disk before the run steps on the answers they hold. The sync runs
    /// on a blocking thread while the runtime goes on reading the replies in flight (a sync
    /// takes a tenth of a millisecond to milliseconds, and the loop's thread is the one that
    /// reads every socket); answers that arrive meanwhile are synced with the next step.
    fn sync(&mut self, files: Vec<Arc<std::fs::File>>) {
        if files.is_empty() {
            return;
        }
        let synced = self.runtime.block_on(async move {
            let done = tokio::task::spawn_blocking(move || {
                files.iter().try_for_each(|file| file.sync_data())
            })
            .await;
            match done {
                Ok(result) => result,
                Err(e) => Err(std::io::Error::other(e.to_string())),
            }
        });
        if let Err(e) = synced {
            note(
                self.notes,
                &format!(
                    "cannot sync the run journal to the disk ({e}); a lost machine may lose its last answers"
                ),
                || json!({"host_event": "journal_unsynced", "error": e.to_string()}),
            );
        }
    }

    /// An operator question answered from a record: the `--input` answer it took when it
    /// was asked is used up all the same, so the next question gets the next one.
    fn operator_answered(&mut self, effect: &Effect) {
        if let (true, Operator::Scripted(answers)) = (effect.asks_operator(), &mut self.operator) {
            answers.pop_front();
        }
    }

    /// Start one effect (`task`: the task that issued a model round, for the display).
    /// What to do once an effect is started: an answer now goes to the witnesses and the run
    /// (`true`), a task is kept in flight. Whether the run got an answer.
    fn follow(
        &mut self,
        run: &mut Run,
        in_flight: &mut BTreeMap<EffectId, AbortHandle>,
        id: EffectId,
        started: Started,
    ) -> bool {
        match started {
            Started::Now(answer) => {
                for witness in self.witnesses() {
                    witness.answered(id, &answer);
                }
                run.resume(id, answer);
                true
            }
            Started::Task(handle) => {
                in_flight.insert(id, handle);
                false
            }
            Started::Later => false,
        }
    }

    fn start(&mut self, id: EffectId, effect: Effect, task: Option<String>) -> Started {
        match effect {
            Effect::Store(op) => {
                let _gate = STORE_GATE.lock().unwrap_or_else(|e| e.into_inner());
                Started::Now(match self.store.perform(&op) {
                    Ok(answer) => store_answer(answer),
                    Err(err) => store_error_answer(&err),
                })
            }
            Effect::ModelRound(round) => self.model_round(id, round, task),
            Effect::Timer { duration } => {
                let tx = self.tx.clone();
                Started::Task(
                    self.runtime
                        .spawn(async move {
                            tokio::time::sleep(duration).await;
                            let _ = tx.send(HostMessage::Answer(id, Answer::Value(Json::Null)));
                        })
                        .abort_handle(),
                )
            }
            Effect::Ask => self.ask(id, AskShape::Ask, task),
            Effect::Tool { alias, path, args } => {
                if path == ASK_TOOL_PATH {
                    self.ask(id, AskShape::Tool, task)
                } else if let Some(web) = self.web.clone().filter(|_| WebPlugin::owns(&path)) {
                    self.web_call(id, web, path, args)
                } else if let Some((mcp, _)) = self.mcp.as_ref().filter(|_| McpPlugins::owns(&path))
                {
                    let (mcp, tx) = (mcp.clone(), self.tx.clone());
                    // Withdrawing the call (a cancelled run or task) aborts this task, and
                    // dropping the request tells the server to cancel it.
                    Started::Task(
                        self.runtime
                            .spawn(async move {
                                let answer = match mcp.call(&path, &args).await {
                                    Ok(text) => Answer::Value(Json::String(text)),
                                    Err(message) => tool_failure(&message),
                                };
                                let _ = tx.send(HostMessage::Answer(id, answer));
                            })
                            .abort_handle(),
                    )
                } else {
                    Started::Now(tool_failure(&format!(
                        "this Host has no tool at {path} (alias {alias})"
                    )))
                }
            }
        }
    }

    /// An operator question: answered at once from `--input` or by nobody; asked on the
    /// terminal, one question at a time, otherwise.
    fn ask(&mut self, id: EffectId, shape: AskShape, section: Option<String>) -> Started {
        match &mut self.operator {
            Operator::Remote(remote) => {
                let (tx, ask) = (self.tx.clone(), remote.0.clone());
                // Withdrawing the question (a cancelled task or run) aborts this task, and
                // dropping the request tells the client to stop asking.
                Started::Task(
                    self.runtime
                        .spawn(async move {
                            let answer = match ask(section).await {
                                Ok(text) => operator_answer(shape, text, true),
                                Err(message) => tool_failure(&message),
                            };
                            let _ = tx.send(HostMessage::Answer(id, answer));
                        })
                        .abort_handle(),
                )
            }
            Operator::Nobody => Started::Now(operator_answer(shape, NO_OPERATOR.into(), false)),
            Operator::Scripted(answers) => Started::Now(match answers.pop_front() {
                Some(text) => operator_answer(shape, text, true),
                None => tool_failure("the operator has no more answers"),
            }),
            Operator::Terminal => {
                let (tx, withdrawn) = (self.tx.clone(), self.withdrawn.clone());
                let terminal = self
                    .terminal
                    .get_or_insert_with(|| spawn_terminal(tx, withdrawn));
                if terminal.send((id, shape)).is_err() {
                    return Started::Now(tool_failure("the operator's terminal is gone"));
                }
                // The person types on the terminal the display draws on: hide it meanwhile.
                self.asking.insert(id);
                self.progress.pause(true);
                Started::Later
            }
        }
    }

    /// A web tool call: run to its end on the spot over a network that never waits (the
    /// scripted one, so calls bind their answers in issue order), else as a task.
    fn web_call(&self, id: EffectId, web: Arc<WebPlugin>, path: String, args: Json) -> Started {
        let answer = |result: Result<String, promptforge_harness::web::ToolFailure>| match result {
            Ok(text) => Answer::Value(Json::String(text)),
            Err(failure) => tool_failure(&failure.message),
        };
        if web.is_immediate() {
            return Started::Now(answer(self.runtime.block_on(web.call(&path, &args))));
        }
        let tx = self.tx.clone();
        Started::Task(
            self.runtime
                .spawn(async move {
                    let result = web.call(&path, &args).await;
                    let _ = tx.send(HostMessage::Answer(id, answer(result)));
                })
                .abort_handle(),
        )
    }

    /// A model round: answered at once by a provider that needs no I/O (the scripted model,
    /// which so binds each reply in issue order), else run as a task on the runtime.
    fn model_round(&mut self, id: EffectId, round: ModelRound, task: Option<String>) -> Started {
        let Some(model) = &self.model else {
            return Started::Now(internal(
                "model access is turned off or not configured",
                RunErrorKind::Completion,
            ));
        };
        let request = round_request(&model.description.model, &round);
        let infer = round.infer;
        self.progress.round_sent(task.as_deref());
        if let Some(result) = model.provider.answer_at_once(&request) {
            if let Ok(reply) = &result {
                for witness in self.witnesses() {
                    witness.round_finished(id, Some(reply.usage.as_ref()));
                }
            }
            return Started::Now(round_answer(infer, result, &self.diagnosis, self.notes));
        }
        // The response cache: a hit is answered now, with the reply and usage it had.
        let cache_key = self.cache.as_mut().and_then(|cache| {
            let identity = json!({
                "id": model.description.id,
                "base_url": model.description.base_url,
                "model": model.description.model,
            });
            // A request that cannot be written as JSON is not cached (it has no key).
            let request = serde_json::to_value(&request).ok()?;
            Some(cache.key(&identity, &request, task.as_deref().unwrap_or("0")))
        });
        if let (Some(cache), Some(key)) = (&self.cache, &cache_key)
            && let Some(answer) = cache.get(key)
        {
            let usage: Option<Usage> = serde_json::from_value(answer["usage"].clone()).ok();
            self.progress.round_cached(usage.as_ref());
            for witness in self.witnesses() {
                witness.cached(id);
                witness.round_finished(id, Some(usage.as_ref()));
            }
            if self.notes == Notes::JsonStdout {
                note(
                    self.notes,
                    "",
                    || json!({"host_event": "model_cached", "effect": id}),
                );
            }
            return Started::Now(Answer::Value(answer));
        }
        let keep = cache_key.and_then(|key| self.cache.as_ref().map(|c| (c.cache.clone(), key)));
        let provider = model.provider.clone();
        let tx = self.tx.clone();
        let watch = RoundWatch {
            effect: id,
            notes: self.notes,
            line: self.progress.round_started(id, task),
            diagnosis: self.diagnosis.clone(),
        };
        let slots = self.round_slots.clone();
        Started::Task(
            self.runtime
                .spawn(async move {
                    // A batch's runs share one limit on rounds in flight.
                    let _slot = match &slots {
                        Some(slots) => slots.acquire().await.ok(),
                        None => None,
                    };
                    let result = provider.stream(&request, &watch).await;
                    if let Ok(reply) = &result {
                        let _ = tx.send(HostMessage::Replied(id, reply.usage));
                        // Only replies are kept: never an error, a refusal or an overflow.
                        if let Some((cache, key)) = keep {
                            // SQLite may wait on another process's write: off the runtime.
                            let answer = reply_answer(reply);
                            let kept = tokio::task::spawn_blocking(move || {
                                cache
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .put(&key, &answer)
                            })
                            .await;
                            if let Ok(Err(e)) = kept {
                                tracing::warn!("{e}");
                            }
                        }
                    }
                    let answer = round_answer(infer, result, &watch.diagnosis, watch.notes);
                    let _ = tx.send(HostMessage::Answer(id, answer));
                })
                .abort_handle(),
        )
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some((mcp, true)) = self.mcp.take() {
            self.runtime.block_on(mcp.shutdown());
        }
    }
}

/// What the Host says of an effect as it starts it: a model round's task (for the display),
/// an operator question's section (when the run keeps effect sites), else nothing.
fn round_task(run: &Run, id: EffectId, effect: &Effect) -> Option<String> {
    match effect {
        Effect::ModelRound(_) => run.effect_task(id),
        _ if effect.asks_operator() => run.effect_site(id).map(|site| site.section.clone()),
        _ => None,
    }
}

/// How a started effect will be answered.
enum Started {
    /// Right now.
    Now(Answer),
    /// By a task on the runtime (abortable).
    Task(AbortHandle),
    /// Through the message channel, by the operator's thread.
    Later,
}

/// A round's result as the engine reads it: a `models.loop` round that overflowed the context
/// goes to its compactor; every other failure is an `internal` error value (run error kind
/// `Completion`).
fn round_answer(
    infer: bool,
    result: Result<promptforge_harness::model::Reply, ModelError>,
    diagnosis: &SharedDiagnosis,
    notes: Notes,
) -> Answer {
    match result {
        Ok(reply) => Answer::Value(reply_answer(&reply)),
        Err(err) if !infer && err.is_context_overflow() => Answer::Value(json!({"overflow": true})),
        Err(err) => {
            if !matches!(err, ModelError::Disabled) {
                diagnosis
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .infrastructure = true;
            }
            // The run's message is the spec's fixed text; what the Harness knows beyond it
            // (the URL tried, where its setting came from, a redirect's target) goes to
            // the person running it.
            if let Some(detail) = err.detail() {
                diagnosis.lock().unwrap_or_else(|e| e.into_inner()).detail =
                    Some(detail.to_owned());
                if notes == Notes::JsonStdout {
                    note(notes, "", || {
                        json!({"host_event": "model_failure", "message": err.to_string(),
                               "detail": detail})
                    });
                }
            }
            internal(err.to_string(), RunErrorKind::Completion)
        }
    }
}

/// The terminal operator: a thread that asks each question in turn on stderr and reads the
/// answer line from stdin, skipping questions the run has withdrawn.
fn spawn_terminal(
    tx: UnboundedSender<HostMessage>,
    withdrawn: Withdrawn,
) -> std::sync::mpsc::Sender<(EffectId, AskShape)> {
    let (questions, inbox) = std::sync::mpsc::channel::<(EffectId, AskShape)>();
    std::thread::spawn(move || {
        use std::io::{BufRead, Write};
        while let Ok((id, shape)) = inbox.recv() {
            if withdrawn
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id)
            {
                continue;
            }
            {
                use std::io::Write as _;
                let _ = write!(std::io::stderr(), "> ");
            }
            let _ = std::io::stderr().flush();
            let mut line = String::new();
            let answer = match std::io::stdin().lock().read_line(&mut line) {
                Ok(0) => tool_failure("the operator closed the input"),
                Ok(_) => {
                    let text = line.strip_suffix('\n').unwrap_or(&line);
                    let text = text.strip_suffix('\r').unwrap_or(text);
                    operator_answer(shape, text.to_owned(), true)
                }
                Err(e) => tool_failure(&format!("cannot read the operator's answer: {e}")),
            };
            if tx.send(HostMessage::Answer(id, answer)).is_err() {
                break;
            }
        }
    });
    questions
}

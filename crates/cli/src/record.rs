//! Runs written down and played back: `run --record FILE` and `promptforge replay FILE`.
//!
//! The engine is sans-IO, so a run is exactly its context, the effects it issued and the
//! answers it was given. A record is JSON lines:
//!
//! 1. a header: the tool version, the prompt's path and SHA-256, the seed, the start instant,
//!    the argument string, the Host state the run saw (its Plugins, the current model's
//!    description, whether the operator was a person), the concurrency limit and the snapshot;
//! 2. each effect by its final id once the run's committed order issued it
//!    (`{"effect": ID, "request": ...}`; an effect a strand issued running ahead goes out under
//!    a provisional id and is written when its issue is committed), each answer once the run
//!    took it (`{"answer": ID, "value": ..., "step": K}`, K the number of answers the run had
//!    taken before it), each withdrawal, each event; answers handed over but never taken (a
//!    race's loser, a cancelled run) come last, without a `step`;
//! 3. the outcome, last.
//!
//! Replaying hands the answers back one at a time in the order the run took them, by effect
//! id, and checks each request against the recorded one, so concurrent arms and tasks replay
//! exactly, however the recorded run's answers arrived, and no provider is asked. (Records of
//! version 1 numbered answers by the Host's steps instead; they replay step by step.) API
//! keys, headers and environment values never reach a record: they live in the Harness's
//! providers, never in an effect or an answer.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use promptforge_engine::protocol::{Answer, Commits, Effect, EffectId, is_provisional};
use promptforge_engine::{Event, HostState, Outcome};
use serde::{Deserialize, Serialize};

use crate::witness::Witness;
use serde_json::{Value as Json, json};

/// The record format's version (2: answers numbered in the order the run took them; 3: the
/// event stream reports model rounds and tool calls).
pub(crate) const RECORD_VERSION: u32 = 3;

/// The events a record before version 3 never held, left out of a replay's comparison with it.
const EVENTS_SINCE_3: [&str; 2] = ["model_round", "tool_call"];

/// The first version whose answers are numbered by the run's taking order.
const TAKEN_ORDER: u32 = 2;

/// The first line of a record.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Header {
    /// Always `promptforge-run`.
    pub record: String,
    pub version: u32,
    /// `promptforge X.Y.Z`.
    pub tool: String,
    pub prompt: PromptId,
    pub seed: u64,
    /// The start instant, RFC 3339 with milliseconds, and as milliseconds since the epoch.
    pub when: String,
    pub start_ms: i64,
    pub args: Option<String>,
    /// What the Host provided: Plugins, the current model's description, the operator.
    pub host: HostState,
    pub concurrency: u32,
    pub snapshot: Option<Json>,
}

/// The recorded prompt.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct PromptId {
    pub path: PathBuf,
    pub sha256: String,
}

/// The SHA-256 of a prompt's text, in hex.
pub(crate) fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where a record goes: a file (`--record`), or a temporary file the run history (or the
/// OpenTelemetry export) reads when the run ends. Never memory: a record grows with the run,
/// and a run's memory must not.
#[derive(Debug)]
enum Sink {
    File(std::io::BufWriter<std::fs::File>),
    Temp(std::io::BufWriter<std::fs::File>, tempfile::TempPath),
}

/// How a run was started, kept in its journal so `promptforge resume` can start it the same
/// way: the command line, the folder it ran in, and the prompt's text as it ran.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Invocation {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub prompt: String,
}

/// A record that is also the run's journal in the history: every answer is written the moment
/// it arrives (an `arrived` line, before the run takes it and its `answer` line follows), and
/// made durable before the run's next step, so a run killed at any point can be resumed
/// without asking again for anything it was answered.
#[derive(Debug)]
struct Journal {
    /// Lines written since the file was last synced.
    dirty: bool,
    /// The file, to `fdatasync` at each step that takes a new answer (`None`: written to the
    /// system only, which a killed process does not lose, but a lost machine may).
    sync: Option<Arc<std::fs::File>>,
    /// The file belongs to the history, which removes it once the run is kept.
    owned: bool,
}

/// Whether journals sync their answers to the disk (`PROMPTFORGE_JOURNAL_SYNC=off` turns it
/// off).
fn journal_sync() -> bool {
    !std::env::var("PROMPTFORGE_JOURNAL_SYNC").is_ok_and(|v| v == "off")
}

/// Take a file's lock (the lock a run holds on its record and journal while it lives):
/// `Ok(true)` when this process holds it now, `Ok(false)` when another process does.
pub(crate) fn take_lock(file: &std::fs::File) -> std::io::Result<bool> {
    match file.try_lock() {
        Ok(()) => Ok(true),
        Err(std::fs::TryLockError::WouldBlock) => Ok(false),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Open a record file for writing: locked first (a run holds its record's lock while it
/// lives; another run, or a second `resume`, is refused rather than emptying the file under
/// it), then emptied.
fn open_locked(path: &Path) -> std::io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    if !take_lock(&file)? {
        return Err(std::io::Error::other(
            "it is in use by another run (its lock is held)",
        ));
    }
    // A regular file is emptied; a device or a pipe (`--record /dev/stdout`) has nothing to
    // empty.
    if file.metadata()?.is_file() {
        file.set_len(0)?;
    }
    Ok(file)
}

/// Make a file's directory entry durable (a new or renamed journal).
fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent()
        && let Ok(dir) = std::fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
}

/// Writes a record as the run goes. Each line after the header carries `t`, the
/// milliseconds since the run started by the Host's clock (for timelines; never compared).
#[derive(Debug)]
pub(crate) struct Recorder {
    out: Sink,
    path: Option<PathBuf>,
    /// Set when the record is also the run's journal.
    journal: Option<Journal>,
    started: std::time::Instant,
    failed: Option<String>,
    /// Effects issued ahead, by provisional id, until their issue is committed: the request
    /// as JSON text, the issuing task and when it went out.
    ahead: HashMap<EffectId, (String, Option<String>, u64)>,
    /// Provisional ids whose issue was committed, to their final ids.
    finals: HashMap<EffectId, EffectId>,
    /// Answers handed over and not taken yet, by id: the answer as JSON text and when.
    answers: HashMap<EffectId, (String, u64)>,
    /// Model rounds answered from the response cache, by id (their answer lines say so).
    cached: std::collections::HashSet<EffectId>,
    /// Answers taken so far (the next answer line's `step`).
    taken: u64,
}

/// Where a finished record is.
#[derive(Debug)]
pub(crate) enum Written {
    /// In this file (`--record`).
    File(PathBuf),
    /// In a temporary file, removed when this is dropped.
    Temp(tempfile::TempPath),
    /// In the history's journal of the run, which the history removes once it keeps the run;
    /// the file stays open, and so locked, until then (a `resume` meanwhile is refused).
    Journal(PathBuf, std::fs::File),
}

impl Written {
    /// The file holding the record.
    pub(crate) fn path(&self) -> &Path {
        match self {
            Written::File(path) | Written::Journal(path, _) => path,
            Written::Temp(path) => path,
        }
    }
}

impl Recorder {
    /// Create (or truncate) the record file and write its header.
    pub(crate) fn create(path: &Path, header: &Header) -> Result<Recorder, String> {
        let file = open_locked(path).map_err(|e| format!("--record {}: {e}", path.display()))?;
        Recorder::start(
            Sink::File(std::io::BufWriter::new(file)),
            Some(path),
            header,
        )
    }

    /// Record into a temporary file (the run history keeps it when the run ends).
    pub(crate) fn temporary(header: &Header) -> Result<Recorder, String> {
        let (file, path) = tempfile::NamedTempFile::new()
            .map_err(|e| format!("cannot record the run: {e}"))?
            .into_parts();
        Recorder::start(
            Sink::Temp(std::io::BufWriter::new(file), path),
            None,
            header,
        )
    }

    /// Record into the run's journal at `path` (the history's): the record, plus each answer
    /// as it arrives, synced before the run steps on it.
    pub(crate) fn journal(
        path: &Path,
        header: &Header,
        invocation: &Invocation,
    ) -> Result<Recorder, String> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("the run journal {}: {e}", dir.display()))?;
        }
        let file =
            open_locked(path).map_err(|e| format!("the run journal {}: {e}", path.display()))?;
        Recorder::start(
            Sink::File(std::io::BufWriter::new(file)),
            Some(path),
            header,
        )?
        .journaled(invocation, true)
    }

    /// The journal of a resumed run: a new file at `path` (taking the old one's place) that
    /// starts with everything the old one was answered (`carried` lines), synced before the
    /// run starts, so a resume killed in turn loses nothing either.
    /// `owned`: the journal is the history's own file (not the user's `--record` file, which
    /// stays when the run is kept).
    pub(crate) fn resumed(
        path: &Path,
        old: &Record,
        invocation: &Invocation,
        owned: bool,
    ) -> Result<Recorder, String> {
        let next = PathBuf::from(format!("{}.next", path.display()));
        let file =
            open_locked(&next).map_err(|e| format!("the run journal {}: {e}", next.display()))?;
        let started = Recorder::start(
            Sink::File(std::io::BufWriter::new(file)),
            Some(path),
            &old.header,
        )
        .and_then(|r| r.journal_started(invocation, owned));
        let mut recorder = match started {
            Ok(recorder) => recorder,
            Err(e) => {
                let _ = std::fs::remove_file(&next);
                return Err(e);
            }
        };
        for (step, answers) in &old.answers {
            for (id, answer) in answers {
                recorder.carried(*id, old.requests.get(id), answer, Some(*step));
            }
        }
        for (id, answer) in &old.arrived {
            recorder.carried(*id, old.requests.get(id), answer, None);
        }
        let renamed = recorder
            .sync_journal(&next.display().to_string())
            .and_then(|()| recorder.failed.take().map_or(Ok(()), Err))
            .and_then(|()| {
                std::fs::rename(&next, path)
                    .map_err(|e| format!("the run journal {}: {e}", path.display()))
            });
        if let Err(e) = renamed {
            let _ = std::fs::remove_file(&next);
            return Err(e);
        }
        sync_dir(path);
        Ok(recorder)
    }

    /// Make this record the run's journal too: hold the file's lock while the run lasts (so
    /// `resume` can tell a running run from a killed one), keep how the run was started, and
    /// write answers as they arrive.
    /// `owned`: the file is the history's own (removed once the run is kept), not the user's
    /// `--record` file.
    pub(crate) fn journaled(
        self,
        invocation: &Invocation,
        owned: bool,
    ) -> Result<Recorder, String> {
        let mut recorder = self.journal_started(invocation, owned)?;
        recorder.sync_journal(&recorder.shown_path())?;
        if let Some(path) = &recorder.path {
            sync_dir(path);
        }
        match recorder.failed.take() {
            Some(failed) => Err(failed),
            None => Ok(recorder),
        }
    }

    /// The file's name as errors show it.
    fn shown_path(&self) -> String {
        self.path
            .as_ref()
            .map_or_else(String::new, |p| p.display().to_string())
    }

    /// The journal's opening lines, not yet synced: [`Recorder::journaled`] syncs them at
    /// once; a resumed run's journal, written beside the old one, syncs once its carried
    /// answers are in, just before it takes the old one's place.
    fn journal_started(mut self, invocation: &Invocation, owned: bool) -> Result<Recorder, String> {
        let name = self.shown_path();
        // The file was locked when it was opened (`open_locked`), and stays locked while the
        // run lives.
        self.write(&json!({ "invocation": invocation }));
        let sync = match &self.out {
            Sink::File(out) if journal_sync() => {
                let file = out
                    .get_ref()
                    .try_clone()
                    .map_err(|e| format!("the run journal {name}: {e}"))?;
                Some(Arc::new(file))
            }
            _ => None,
        };
        self.journal = Some(Journal {
            dirty: true,
            sync,
            owned,
        });
        Ok(self)
    }

    /// What the journal holds reaches the disk (nothing to do when nothing is new or the
    /// journal is not synced); `shown` names the file in an error.
    fn sync_journal(&mut self, shown: &str) -> Result<(), String> {
        match self.durable_now() {
            Some(file) => file
                .sync_data()
                .map_err(|e| format!("the run journal {shown}: {e}")),
            None => Ok(()),
        }
    }

    /// An answer a resumed run starts from, with its effect's request.
    fn carried(
        &mut self,
        id: EffectId,
        request: Option<&Json>,
        answer: &Answer,
        step: Option<u64>,
    ) {
        let mut line = json!({"carried": id, "request": request, "value": answer});
        if let (Some(step), Some(map)) = (step, line.as_object_mut()) {
            map.insert("step".to_owned(), json!(step));
        }
        self.write(&line);
    }

    /// Hand the journal's new lines to the system, when anything was written since last
    /// time, and give back the file to sync to the disk (the Host syncs it off its loop's
    /// thread, so replies in flight are still read meanwhile, and steps when it is done).
    fn durable_now(&mut self) -> Option<Arc<std::fs::File>> {
        let journal = self.journal.as_mut()?;
        if !journal.dirty || self.failed.is_some() {
            return None;
        }
        journal.dirty = false;
        let sync = journal.sync.clone();
        if self.flush_journal() { sync } else { None }
    }

    /// Write out what the journal holds in memory; `false` when it cannot be written (the
    /// recorder has failed, and says why).
    fn flush_journal(&mut self) -> bool {
        let flushed = match &mut self.out {
            Sink::File(out) | Sink::Temp(out, _) => out.flush(),
        };
        match flushed {
            Ok(()) => true,
            Err(e) => {
                self.fail(format!("cannot write the run journal: {e}"));
                false
            }
        }
    }

    fn start(out: Sink, path: Option<&Path>, header: &Header) -> Result<Recorder, String> {
        let mut recorder = Recorder {
            out,
            path: path.map(Path::to_path_buf),
            journal: None,
            started: std::time::Instant::now(),
            failed: None,
            ahead: HashMap::new(),
            finals: HashMap::new(),
            answers: HashMap::new(),
            cached: std::collections::HashSet::new(),
            taken: 0,
        };
        recorder.write(&serde_json::to_value(header).map_err(|e| e.to_string())?);
        Ok(recorder)
    }

    fn write(&mut self, value: &Json) {
        if self.failed.is_some() {
            return;
        }
        let written = match &mut self.out {
            Sink::File(out) | Sink::Temp(out, _) => serde_json::to_writer(&mut *out, value)
                .map_err(std::io::Error::from)
                .and_then(|()| out.write_all(b"\n")),
        };
        if let Err(e) = written {
            let name = self
                .path
                .as_ref()
                .map_or("(a temporary file)".to_owned(), |p| p.display().to_string());
            self.fail(format!("cannot write the record {name}: {e}"));
        }
    }

    fn line(&mut self, mut value: Json) {
        let t = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if let Some(map) = value.as_object_mut() {
            map.insert("t".to_owned(), json!(t));
        }
        self.write(&value);
    }

    /// An effect as issued, and the task that issued it (for timelines). One issued ahead
    /// is held until its issue is committed ([`Recorder::commits`]).
    fn issued(&mut self, id: EffectId, effect: &Effect, task: Option<String>) {
        let t = self.elapsed();
        let id = self.final_id(id);
        if is_provisional(id) {
            let request = serde_json::to_string(effect).unwrap_or_else(|_| "null".to_owned());
            self.ahead.insert(id, (request, task, t));
            return;
        }
        // Written straight from the effect: a model round's request can be large, and
        // building a JSON value of it first would copy it all once more.
        let task = serde_json::to_string(&task).unwrap_or_else(|_| "null".to_owned());
        self.raw(|out| {
            write!(out, r#"{{"effect":{id},"request":"#)?;
            serde_json::to_writer(&mut *out, effect)?;
            writeln!(out, r#","task":{task},"t":{t}}}"#)?;
            Ok(())
        });
    }

    /// Whether it writes a file the user named (`--record`), not a temporary one or the
    /// history's journal.
    pub(crate) fn is_file(&self) -> bool {
        matches!(self.out, Sink::File(_)) && !self.journal.as_ref().is_some_and(|j| j.owned)
    }

    /// A write failed: said at once (the run goes on, without its record or journal), and
    /// again when the run ends.
    fn fail(&mut self, message: String) {
        if self.failed.is_none() {
            crate::ui::print_line(&format!(
                "warning: {message}; the run goes on without its record (it cannot be resumed if it is killed)"
            ));
            self.failed = Some(message);
        }
    }

    /// The id a record keeps for an id the Host knows.
    fn final_id(&self, id: EffectId) -> EffectId {
        self.finals.get(&id).copied().unwrap_or(id)
    }

    /// One step of the run, in the order a record needs it: the effects it issued (held while
    /// provisional), then what it committed (final ids, answers taken), then its withdrawals.
    fn record_step(
        &mut self,
        issued: &[(EffectId, Effect)],
        commits: &Commits,
        withdrawn: &[EffectId],
        task: &dyn Fn(EffectId) -> Option<String>,
    ) {
        for (id, effect) in issued {
            self.issued(*id, effect, task(*id));
        }
        self.commits(commits);
        for id in withdrawn {
            self.withdrawn(*id);
        }
    }

    /// What the run committed in a step: effects issued ahead get their final ids (and are
    /// written), and the answers it took are written in the order it took them.
    fn commits(&mut self, commits: &Commits) {
        for &(provisional, id) in &commits.renamed {
            self.finals.insert(provisional, id);
            if let Some((request, task, t)) = self.ahead.remove(&provisional) {
                let task = serde_json::to_string(&task).unwrap_or_else(|_| "null".to_owned());
                self.raw(|out| {
                    writeln!(
                        out,
                        r#"{{"effect":{id},"request":{request},"task":{task},"t":{t}}}"#
                    )?;
                    Ok(())
                });
            }
            if let Some(answer) = self.answers.remove(&provisional) {
                self.arrived(id, &answer.0);
                self.answers.insert(id, answer);
            }
            if self.cached.remove(&provisional) {
                self.cached.insert(id);
            }
        }
        for id in &commits.taken {
            let step = self.taken;
            self.taken += 1;
            let cached = if self.cached.remove(id) {
                r#","cached":true"#
            } else {
                ""
            };
            if let Some((answer, t)) = self.answers.remove(id) {
                self.raw(|out| {
                    writeln!(
                        out,
                        r#"{{"answer":{id},"value":{answer},"step":{step}{cached},"t":{t}}}"#
                    )?;
                    Ok(())
                });
            }
        }
    }

    fn elapsed(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Write one line with `write`, straight into the sink.
    fn raw(
        &mut self,
        write: impl FnOnce(&mut dyn Write) -> Result<(), Box<dyn std::error::Error>>,
    ) {
        if self.failed.is_some() {
            return;
        }
        let written = match &mut self.out {
            Sink::File(out) | Sink::Temp(out, _) => write(out),
        };
        if let Err(e) = written {
            self.fail(format!("cannot write the record: {e}"));
        }
    }

    /// An answer as the Host handed it over: written once the run takes it (and, in a
    /// journal, at once, unless it answers an effect issued ahead whose id is not final yet).
    fn record_answer(&mut self, id: EffectId, answer: &Answer) {
        let t = self.elapsed();
        let id = self.final_id(id);
        let text = serde_json::to_string(answer).unwrap_or_else(|_| "null".to_owned());
        if !is_provisional(id) {
            self.arrived(id, &text);
        }
        self.answers.insert(id, (text, t));
    }

    /// A journal's `arrived` line: the answer to effect `id`, as JSON text.
    fn arrived(&mut self, id: EffectId, answer: &str) {
        let Some(journal) = &mut self.journal else {
            return;
        };
        journal.dirty = true;
        self.raw(|out| {
            writeln!(out, r#"{{"arrived":{id},"value":{answer}}}"#)?;
            Ok(())
        });
    }

    fn withdrawn(&mut self, id: EffectId) {
        let id = self.final_id(id);
        if is_provisional(id) {
            // Issued ahead and never committed: the run never made it, but a reply it got
            // still cost what it cost.
            self.uncommitted(id);
            return;
        }
        self.line(json!({"withdrawn": id}));
    }

    /// Drop an effect issued ahead that was never committed; a model reply it got is kept as
    /// a cost line (`{"uncommitted": "model_round", "value": ...}`), which the history counts
    /// and a replay skips.
    fn uncommitted(&mut self, provisional: EffectId) {
        let effect = self.ahead.remove(&provisional);
        let answer = self.answers.remove(&provisional);
        let round = effect
            .as_ref()
            .is_some_and(|(request, _, _)| request.starts_with(r#"{"effect":"model_round""#));
        if let (true, Some((answer, t))) = (round, answer) {
            self.raw(|out| {
                writeln!(
                    out,
                    r#"{{"uncommitted":"model_round","value":{answer},"t":{t}}}"#
                )?;
                Ok(())
            });
        }
    }

    /// The run was cancelled after it had taken this many answers.
    fn record_cancel(&mut self) {
        let taken = self.taken;
        self.line(json!({"cancel": taken}));
    }

    /// An event: the bytes `line` would write for `{"event": ..., "t": ...}` (keys in
    /// order), written straight from the event's JSON. The history recognises event lines by
    /// their opening `{"event":`.
    fn record_event(&mut self, event: &Event) {
        let t = self.elapsed();
        let value = crate::report::event_json(event);
        self.raw(|out| {
            out.write_all(br#"{"event":"#)?;
            serde_json::to_writer(&mut *out, &value)?;
            writeln!(out, r#","t":{t}}}"#)?;
            Ok(())
        });
    }

    /// Write the outcome and flush; a write that failed along the way is reported here.
    pub(crate) fn finish(mut self, outcome: &Outcome) -> Result<Written, String> {
        // Answers handed over but never taken (a race's loser, a run that ended first): kept
        // for what they cost, with no place in the order. Never-committed ones are dropped.
        let provisional: Vec<EffectId> = self
            .answers
            .keys()
            .copied()
            .filter(|id| is_provisional(*id))
            .collect();
        for id in provisional {
            self.uncommitted(id);
        }
        let mut untaken: Vec<(EffectId, (String, u64))> =
            std::mem::take(&mut self.answers).into_iter().collect();
        untaken.sort_by_key(|(id, _)| *id);
        for (id, (answer, t)) in untaken {
            self.raw(|out| {
                writeln!(out, r#"{{"answer":{id},"value":{answer},"t":{t}}}"#)?;
                Ok(())
            });
        }
        let outcome =
            serde_json::to_value(crate::report::outcome_json(outcome)).unwrap_or(Json::Null);
        self.line(json!({"outcome": outcome}));
        if let Some(failed) = self.failed.take() {
            return Err(failed);
        }
        let owned = self.journal.as_ref().is_some_and(|j| j.owned);
        match self.out {
            Sink::File(out) => {
                let path = self.path.unwrap_or_default();
                let file = out.into_inner().map_err(|e| {
                    format!("cannot write the record {}: {}", path.display(), e.error())
                })?;
                if owned {
                    Ok(Written::Journal(path, file))
                } else {
                    Ok(Written::File(path))
                }
            }
            Sink::Temp(mut out, path) => {
                out.flush()
                    .map_err(|e| format!("cannot write the record: {e}"))?;
                Ok(Written::Temp(path))
            }
        }
    }
}

/// A record read back.
#[derive(Debug)]
pub(crate) struct Record {
    pub header: Header,
    /// Each effect's recorded request, by id.
    pub requests: BTreeMap<EffectId, Json>,
    /// The answers, by when the run took them (version 2: the number of answers taken before
    /// each; version 1: the Host's step count when it handed each over), in record order.
    pub answers: BTreeMap<u64, Vec<(EffectId, Answer)>>,
    /// When the run was cancelled, counted the same way.
    pub cancels: Vec<u64>,
    /// The events, as JSON.
    pub events: Vec<Json>,
    /// The outcome, as JSON.
    pub outcome: Option<Json>,
    /// A journal's answers that arrived but were not taken (a killed run's last ones).
    pub arrived: BTreeMap<EffectId, Answer>,
    /// How a journal's run was started.
    pub invocation: Option<Invocation>,
}

impl Record {
    pub(crate) fn load(path: &Path) -> Result<Record, String> {
        let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut lines = BufReader::new(file).lines().enumerate();
        let bad = |n: usize, what: &str| format!("{}:{}: {what}", path.display(), n + 1);
        let header: Header = match lines.next() {
            Some((n, line)) => {
                let line = line.map_err(|e| bad(n, &e.to_string()))?;
                serde_json::from_str(&line)
                    .map_err(|e| bad(n, &format!("not a PromptForge run record ({e})")))?
            }
            None => return Err(format!("{}: the file is empty", path.display())),
        };
        if header.record != "promptforge-run" || !(1..=RECORD_VERSION).contains(&header.version) {
            return Err(format!(
                "{}: a record of format {} version {}; this promptforge reads promptforge-run version {RECORD_VERSION}",
                path.display(),
                header.record,
                header.version
            ));
        }
        let mut record = Record {
            header,
            requests: BTreeMap::new(),
            answers: BTreeMap::new(),
            cancels: Vec::new(),
            events: Vec::new(),
            outcome: None,
            arrived: BTreeMap::new(),
            invocation: None,
        };
        // A resumed run's journal starts with what the run before it was answered (`carried`,
        // in the order that run took them); the resumed run takes those again first, then its
        // own. Both merge into one taking order.
        let mut carried: Vec<(u64, EffectId, Answer)> = Vec::new();
        // A journal's writer may have been killed in the middle of a line: its last line may
        // be unfinished (cut anywhere, even inside a character). Only that line is forgiven.
        let mut lines = lines.peekable();
        while let Some((n, line)) = lines.next() {
            let last = lines.peek().is_none();
            let line = match line {
                Ok(line) => line,
                Err(_) if last => break,
                Err(e) => return Err(bad(n, &e.to_string())),
            };
            if line.trim().is_empty() {
                continue;
            }
            let value: Json = match serde_json::from_str(&line) {
                Ok(value) => value,
                Err(_) if last && record.outcome.is_none() => break,
                Err(e) => return Err(bad(n, &format!("not JSON ({e})"))),
            };
            let id = |key: &str| value.get(key).and_then(Json::as_u64);
            let answer_of = |v: &Json| -> Result<Answer, String> {
                serde_json::from_value(v.clone())
                    .map_err(|e| bad(n, &format!("not an answer ({e})")))
            };
            if let (Some(id), Some(request)) = (id("effect"), value.get("request")) {
                // The run's own request, over what a resumed run carried for that id.
                record.requests.insert(id, request.clone());
            } else if let (Some(effect), Some(answer)) = (id("arrived"), value.get("value")) {
                record.arrived.insert(effect, answer_of(answer)?);
            } else if let (Some(effect), Some(answer)) = (id("carried"), value.get("value")) {
                if let Some(request) = value.get("request").filter(|r| !r.is_null()) {
                    record
                        .requests
                        .entry(effect)
                        .or_insert_with(|| request.clone());
                }
                let answer = answer_of(answer)?;
                match id("step") {
                    Some(step) => carried.push((step, effect, answer)),
                    None => {
                        record.arrived.insert(effect, answer);
                    }
                }
            } else if let Some(invocation) = value.get("invocation") {
                record.invocation = serde_json::from_value(invocation.clone()).ok();
            } else if let (Some(effect), Some(answer)) = (id("answer"), value.get("value")) {
                let answer = answer_of(answer)?;
                // An answer without a step was never taken: nothing to replay.
                if let Some(step) = id("step") {
                    record
                        .answers
                        .entry(step)
                        .or_default()
                        .push((effect, answer));
                }
            } else if let Some(step) = id("cancel") {
                record.cancels.push(step);
            } else if let Some(event) = value.get("event") {
                record.events.push(event.clone());
            } else if let Some(outcome) = value.get("outcome") {
                record.outcome = Some(outcome.clone());
            } else if id("withdrawn").is_none() && value.get("uncommitted").is_none() {
                return Err(bad(n, "not a record line"));
            }
        }
        if !carried.is_empty() {
            carried.sort_by_key(|(step, _, _)| *step);
            let own: Vec<(EffectId, Answer)> = std::mem::take(&mut record.answers)
                .into_values()
                .flatten()
                .collect();
            // Where the resumed run took an answer of its own for an id, its answer stands,
            // at the carried place.
            let mut mine: HashMap<EffectId, Answer> = own.iter().cloned().collect();
            let mut seen = std::collections::HashSet::new();
            let order: Vec<(EffectId, Answer)> = carried
                .into_iter()
                .map(|(_, id, answer)| {
                    let answer = mine.remove(&id).unwrap_or(answer);
                    (id, answer)
                })
                .chain(own)
                .filter(|(id, _)| seen.insert(*id))
                .collect();
            for (step, (id, answer)) in order.into_iter().enumerate() {
                record.answers.insert(step as u64, vec![(id, answer)]);
            }
        }
        // An answer the run took is handed over at its place in the order, not as arrived.
        for list in record.answers.values() {
            for (id, _) in list {
                record.arrived.remove(id);
            }
        }
        Ok(record)
    }
}

/// Where a replay stopped following its record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Divergence {
    pub effect: EffectId,
    /// The section that issued it and the prompt line, when known.
    pub section: Option<String>,
    pub line: Option<u32>,
    pub recorded: Option<Json>,
    pub new: Option<Json>,
    /// What happened, in words.
    pub what: String,
}

impl Divergence {
    /// The report: what diverged, where in the prompt, and a diff of the two requests.
    pub(crate) fn report(&self, record: &Path, prompt: &Path) -> String {
        let mut out = format!("replay diverged at effect {}: {}", self.effect, self.what);
        match (&self.section, self.line) {
            (Some(section), Some(line)) => out.push_str(&format!(
                "\n  issued by section `{section}` at {}:{line}",
                prompt.display()
            )),
            (Some(section), None) => out.push_str(&format!(
                "\n  issued by section `{section}` of {}",
                prompt.display()
            )),
            _ => {}
        }
        let pretty = |v: &Option<Json>| match v {
            Some(v) => serde_json::to_string_pretty(v).unwrap_or_default() + "\n",
            None => String::new(),
        };
        let (old, new) = (pretty(&self.recorded), pretty(&self.new));
        if !old.is_empty() || !new.is_empty() {
            let diff = similar::TextDiff::from_lines(&old, &new);
            let old_name = format!("recorded request ({})", record.display());
            let new_name = format!("this run's request ({})", prompt.display());
            out.push('\n');
            out.push_str(
                &diff
                    .unified_diff()
                    .context_radius(3)
                    .header(&old_name, &new_name)
                    .to_string(),
            );
        }
        out.trim_end().to_owned()
    }
}

/// A replay in progress: the record's answers, handed over step by step.
#[derive(Debug)]
pub(crate) struct Replay {
    requests: BTreeMap<EffectId, Json>,
    answers: BTreeMap<u64, Vec<(EffectId, Answer)>>,
    cancels: Vec<u64>,
    /// Recorded answers for effects this run issued, waiting for their step (or, once live,
    /// for the next step), with the effect itself (to perform it for real if the record
    /// turns out to have no answer for it and the replay goes live).
    matched: BTreeMap<EffectId, Effect>,
    /// What the store answered when a store operation taken from the record was performed
    /// again (the store is rebuilt as the replay goes): a store effect the record has no
    /// answer for gets this answer when the replay goes live, never a second perform.
    performed: std::collections::HashMap<EffectId, Answer>,
    /// After a divergence with `--then-live`: effects are performed for real from here on.
    pub live: bool,
    then_live: bool,
    /// Answers are keyed by the run's taking order (version 2), not by Host steps.
    by_taken: bool,
    /// The first divergence.
    pub divergence: Option<Divergence>,
    /// Answers a killed run was handed but never took (`resume`): once live, an effect the
    /// run issues again with the same request gets its answer from here, not from the world.
    arrived: BTreeMap<EffectId, Answer>,
}

/// What to do with an issued effect.
#[derive(Debug)]
pub(crate) enum Check {
    /// Answered from the record: do not perform it.
    FromRecord,
    /// Perform it for real (a live replay).
    Live,
    /// Answer it now with this answer, which a killed run had already been given (`resume`).
    Arrived(Answer),
    /// The replay stops here.
    Stop,
}

impl Replay {
    pub(crate) fn new(record: &Record, then_live: bool) -> Replay {
        Replay {
            requests: record.requests.clone(),
            answers: record.answers.clone(),
            cancels: record.cancels.clone(),
            matched: BTreeMap::new(),
            performed: std::collections::HashMap::new(),
            live: false,
            then_live,
            by_taken: record.header.version >= TAKEN_ORDER,
            divergence: None,
            arrived: record.arrived.clone(),
        }
    }

    /// The answer a killed run had already been given for effect `id`, when this run issued
    /// it with the recorded request. Never for a store operation: the store is rebuilt by
    /// performing those again.
    pub(crate) fn take_arrived(&mut self, id: EffectId, effect: &Effect) -> Option<Answer> {
        if matches!(effect, Effect::Store(_)) || !self.arrived.contains_key(&id) {
            return None;
        }
        let new = serde_json::to_value(effect).unwrap_or(Json::Null);
        if self.requests.get(&id) != Some(&new) {
            return None;
        }
        self.arrived.remove(&id)
    }

    /// The count this record's answers are keyed by: the answers the run has taken
    /// (version 2, handed back one at a time so the run takes them exactly in the recorded
    /// order), or the Host's steps (version 1).
    pub(crate) fn counter(&self, steps: u64, taken: u64) -> u64 {
        if self.by_taken { taken } else { steps }
    }

    /// Check an issued effect against the record.
    pub(crate) fn check(
        &mut self,
        id: EffectId,
        effect: &Effect,
        site: Option<&promptforge_engine::EffectSite>,
    ) -> Check {
        if self.live {
            return match self.take_arrived(id, effect) {
                Some(answer) => Check::Arrived(answer),
                None => Check::Live,
            };
        }
        let new = serde_json::to_value(effect).unwrap_or(Json::Null);
        let recorded = self.requests.get(&id);
        if recorded == Some(&new) {
            self.matched.insert(id, effect.clone());
            return Check::FromRecord;
        }
        let what = match recorded {
            Some(_) => format!("the {} request differs from the recorded one", kind(effect)),
            None => format!(
                "the record has no effect {id} (this run issued a {})",
                kind(effect)
            ),
        };
        self.divergence = Some(Divergence {
            effect: id,
            section: site.map(|s| s.section.clone()),
            line: site.and_then(|s| s.line),
            recorded: recorded.cloned(),
            new: Some(new),
            what,
        });
        if self.then_live {
            self.live = true;
            Check::Live
        } else {
            Check::Stop
        }
    }

    /// The recorded answers to hand over before the run's next step (`steps` taken so far):
    /// those recorded at this step, or once live every answer still owed to a matched effect.
    pub(crate) fn answers_before(&mut self, steps: u64) -> VecDeque<(EffectId, Answer)> {
        let mut out = VecDeque::new();
        if self.live {
            let owed: Vec<u64> = self.answers.keys().copied().collect();
            for step in owed {
                if let Some(list) = self.answers.remove(&step) {
                    for (id, answer) in list {
                        if self.matched.remove(&id).is_some() {
                            out.push_back((id, answer));
                        }
                    }
                }
            }
            return out;
        }
        if self.by_taken {
            // The next answer in the taking order, once the run has issued its effect.
            let issued = self
                .answers
                .get(&steps)
                .is_some_and(|list| list.iter().all(|(id, _)| self.matched.contains_key(id)));
            if !issued {
                return out;
            }
        }
        if let Some(list) = self.answers.remove(&steps) {
            for (id, answer) in list {
                self.matched.remove(&id);
                out.push_back((id, answer));
            }
        }
        out
    }

    /// Whether the record cancelled the run before this step.
    pub(crate) fn cancel_before(&self, steps: u64) -> bool {
        !self.live && self.cancels.contains(&steps)
    }

    /// The run no longer wants this effect's answer: it is owed nothing for it.
    fn withdrawn(&mut self, id: EffectId) {
        self.matched.remove(&id);
    }

    /// The oldest effect this run issued (and the record has) that the record holds no
    /// answer for: where a record with an answer missing diverges.
    pub(crate) fn unanswered(&self) -> Option<EffectId> {
        let answered: std::collections::BTreeSet<EffectId> =
            self.answers.values().flatten().map(|(id, _)| *id).collect();
        self.matched
            .keys()
            .copied()
            .find(|id| !answered.contains(id))
    }

    /// Keep what the store answered a store operation taken from the record.
    pub(crate) fn performed(&mut self, id: EffectId, answer: Answer) {
        self.performed.insert(id, answer);
    }

    /// What the store answered `id` when it was performed from the record.
    pub(crate) fn take_performed(&mut self, id: EffectId) -> Option<Answer> {
        self.performed.remove(&id)
    }

    /// Whether the replay may go live when the record ends (`--then-live`).
    pub(crate) fn then_live(&self) -> bool {
        self.then_live
    }

    /// Go live where the record ends: the effects the run issued that the record has no
    /// answer for, to perform for real (their recorded answers, if any, still come first).
    pub(crate) fn go_live_unanswered(&mut self) -> Vec<(EffectId, Effect)> {
        let answered: std::collections::BTreeSet<EffectId> =
            self.answers.values().flatten().map(|(id, _)| *id).collect();
        let unanswered: Vec<EffectId> = self
            .matched
            .keys()
            .copied()
            .filter(|id| !answered.contains(id))
            .collect();
        self.live = true;
        unanswered
            .into_iter()
            .filter_map(|id| self.matched.remove(&id).map(|effect| (id, effect)))
            .collect()
    }

    /// Whether a live replay still owes recorded answers to effects it matched.
    pub(crate) fn owes_answers(&self) -> bool {
        !self.matched.is_empty() && !self.answers.is_empty()
    }

    /// Whether the record has answers still to hand over: at a later step (version 1), or
    /// next, at `counter` answers taken, for an effect the run has issued (version 2: when
    /// the run did not take or never issued the next answer's effect, the record has nothing
    /// more to give it).
    pub(crate) fn has_more(&self, counter: u64) -> bool {
        if self.by_taken {
            let next = self
                .answers
                .get(&counter)
                .is_some_and(|list| list.iter().all(|(id, _)| self.matched.contains_key(id)));
            return next || self.cancels.contains(&counter);
        }
        !self.answers.is_empty() || !self.cancels.is_empty()
    }
}

fn kind(effect: &Effect) -> &'static str {
    match effect {
        Effect::ModelRound(_) => "model round",
        Effect::Store(_) => "store call",
        Effect::Timer { .. } => "timer",
        Effect::Ask => "operator question",
        Effect::Tool { .. } => "tool call",
    }
}

/// Compare a replay's events and outcome with the record's: `None` when byte-identical, else
/// the first difference.
pub(crate) fn compare(record: &Record, events: &[Json], outcome: &Json) -> Option<String> {
    let shown = |v: &Json| v.to_string();
    let kept: Vec<Json>;
    let events = if record.header.version < 3 {
        kept = events
            .iter()
            .filter(|e| {
                !e.get("event")
                    .and_then(Json::as_str)
                    .is_some_and(|kind| EVENTS_SINCE_3.contains(&kind))
            })
            .cloned()
            .collect();
        &kept[..]
    } else {
        events
    };
    for (n, recorded) in record.events.iter().enumerate() {
        match events.get(n) {
            Some(new) if shown(new) == shown(recorded) => {}
            Some(new) => {
                return Some(format!(
                    "event {} differs:\n  recorded: {}\n  replayed: {}",
                    n + 1,
                    shown(recorded),
                    shown(new)
                ));
            }
            None => {
                return Some(format!(
                    "the replay ended after {} events; the record has {}",
                    events.len(),
                    record.events.len()
                ));
            }
        }
    }
    if events.len() > record.events.len() {
        return Some(format!(
            "the replay has {} events; the record has {}",
            events.len(),
            record.events.len()
        ));
    }
    match &record.outcome {
        Some(recorded) if shown(recorded) == shown(outcome) => None,
        Some(recorded) => Some(format!(
            "the outcome differs:\n  recorded: {}\n  replayed: {}",
            shown(recorded),
            shown(outcome)
        )),
        None => Some("the record has no outcome (the recorded run never ended)".to_owned()),
    }
}

/// The recorder writes down everything it is told, in the order a record needs.
impl Witness for Recorder {
    fn event(&mut self, event: &Event) {
        self.record_event(event);
    }

    fn step(
        &mut self,
        issued: &[(EffectId, Effect)],
        commits: &Commits,
        withdrawn: &[EffectId],
        task: &dyn Fn(EffectId) -> Option<String>,
    ) {
        self.record_step(issued, commits, withdrawn, task);
    }

    fn answered(&mut self, id: EffectId, answer: &Answer) {
        self.record_answer(id, answer);
    }

    fn cached(&mut self, id: EffectId) {
        let id = self.final_id(id);
        self.cached.insert(id);
    }

    fn durable(&mut self) -> Option<Arc<std::fs::File>> {
        self.durable_now()
    }

    fn idle(&mut self) {
        if self.journal.is_some() && self.failed.is_none() {
            self.flush_journal();
        }
    }

    fn cancelled(&mut self) {
        self.record_cancel();
    }
}

/// The replay source owes no answer to an effect the run withdrew.
impl Witness for Replay {
    fn step(
        &mut self,
        _issued: &[(EffectId, Effect)],
        _commits: &Commits,
        withdrawn: &[EffectId],
        _task: &dyn Fn(EffectId) -> Option<String>,
    ) {
        for id in withdrawn {
            self.withdrawn(*id);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use promptforge_engine::HostState;

    fn header() -> Header {
        Header {
            record: "promptforge-run".to_owned(),
            version: RECORD_VERSION,
            tool: "promptforge test".to_owned(),
            prompt: PromptId {
                path: PathBuf::from("p.md"),
                sha256: String::new(),
            },
            seed: 7,
            when: String::new(),
            start_ms: 0,
            args: None,
            host: HostState::default(),
            concurrency: 8,
            snapshot: None,
        }
    }

    fn invocation() -> Invocation {
        Invocation {
            argv: vec!["promptforge".into(), "run".into(), "p.md".into()],
            cwd: PathBuf::from("/"),
            prompt: "# P".to_owned(),
        }
    }

    fn timer() -> Effect {
        Effect::Timer {
            duration: std::time::Duration::from_millis(1),
        }
    }

    fn value(text: &str) -> Answer {
        Answer::Value(Json::String(text.to_owned()))
    }

    fn issue(recorder: &mut Recorder, ids: &[EffectId], taken: &[EffectId]) {
        let issued: Vec<(EffectId, Effect)> = ids.iter().map(|id| (*id, timer())).collect();
        let commits = Commits {
            taken: taken.to_vec(),
            ..Commits::default()
        };
        recorder.record_step(&issued, &commits, &[], &|_| None);
    }

    #[test]
    fn a_journal_keeps_answers_as_they_arrive_and_a_resume_carries_them_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal").join("h-1.jsonl");
        let mut recorder = Recorder::journal(&path, &header(), &invocation()).unwrap();
        // Effects 0, 1 and 2 go out; 1 is answered and taken, 2 is answered but not taken
        // when the process dies (no outcome, nothing flushed after the last sync).
        issue(&mut recorder, &[0, 1, 2], &[]);
        recorder.record_answer(1, &value("one"));
        assert!(recorder.durable_now().is_some(), "a new answer is synced");
        assert!(recorder.durable_now().is_none(), "and only once");
        issue(&mut recorder, &[], &[1]);
        recorder.record_answer(2, &value("two"));
        recorder.durable_now();
        drop(recorder);

        let old = Record::load(&path).unwrap();
        assert_eq!(old.invocation, Some(invocation()));
        assert_eq!(old.answers.len(), 1);
        assert_eq!(old.answers[&0], vec![(1, value("one"))]);
        assert_eq!(old.arrived.keys().copied().collect::<Vec<_>>(), [2]);
        assert!(old.outcome.is_none());

        // The resumed run's journal starts with both, then goes on: it takes 1 again, then 2,
        // then 0, whose answer only it got; killed again, what it kept merges in that order.
        let mut resumed = Recorder::resumed(&path, &old, &invocation(), true).unwrap();
        issue(&mut resumed, &[0, 1, 2], &[]);
        resumed.record_answer(1, &value("one"));
        resumed.record_answer(2, &value("two"));
        resumed.record_answer(0, &value("zero"));
        issue(&mut resumed, &[], &[1, 2, 0]);
        resumed.durable_now();
        drop(resumed);
        assert!(!PathBuf::from(format!("{}.next", path.display())).exists());
        let again = Record::load(&path).unwrap();
        let order: Vec<(u64, EffectId)> = again
            .answers
            .iter()
            .flat_map(|(step, list)| list.iter().map(move |(id, _)| (*step, *id)))
            .collect();
        assert_eq!(order, [(0, 1), (1, 2), (2, 0)]);
        assert!(again.arrived.is_empty());
        assert_eq!(again.requests.len(), 3);
    }

    #[test]
    fn a_journal_cut_in_the_middle_of_a_line_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h-1.jsonl");
        let mut recorder = Recorder::journal(&path, &header(), &invocation()).unwrap();
        issue(&mut recorder, &[0], &[]);
        recorder.record_answer(0, &value("zero"));
        recorder.durable_now();
        drop(recorder);
        // The process died while writing a long line: half of it, cut inside a character.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice("{\"effect\":1,\"request\":{\"x\":\"é".as_bytes());
        bytes.pop();
        std::fs::write(&path, &bytes).unwrap();
        let record = Record::load(&path).unwrap();
        assert_eq!(record.arrived.len(), 1);
        assert_eq!(record.requests.len(), 1);
        // A record that ended has no unfinished line to forgive.
        let ended = dir.path().join("ended.jsonl");
        std::fs::write(
            &ended,
            format!(
                "{}\n{{\"outcome\":{{\"outcome\":\"cancelled\"}}}}\n{{\"effect\":",
                serde_json::to_string(&header()).unwrap()
            ),
        )
        .unwrap();
        assert!(Record::load(&ended).is_err());
    }

    #[test]
    fn a_journal_in_use_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.jsonl");
        let _running = Recorder::journal(&path, &header(), &invocation()).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        assert!(matches!(
            file.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
    }
}

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

/// Writes a record as the run goes. Each line after the header carries `t`, the
/// milliseconds since the run started by the Host's clock (for timelines; never compared).
#[derive(Debug)]
pub(crate) struct Recorder {
    out: Sink,
    path: Option<PathBuf>,
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
}

impl Written {
    /// The file holding the record.
    pub(crate) fn path(&self) -> &Path {
        match self {
            Written::File(path) => path,
            Written::Temp(path) => path,
        }
    }
}

impl Recorder {
    /// Create (or truncate) the record file and write its header.
    pub(crate) fn create(path: &Path, header: &Header) -> Result<Recorder, String> {
        let file =
            std::fs::File::create(path).map_err(|e| format!("--record {}: {e}", path.display()))?;
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

    fn start(out: Sink, path: Option<&Path>, header: &Header) -> Result<Recorder, String> {
        let mut recorder = Recorder {
            out,
            path: path.map(Path::to_path_buf),
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
            self.failed = Some(format!("cannot write the record {name}: {e}"));
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

    /// Whether it writes a file the user named (`--record`), not a temporary one.
    pub(crate) fn is_file(&self) -> bool {
        matches!(self.out, Sink::File(_))
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
            self.failed = Some(format!("cannot write the record: {e}"));
        }
    }

    /// An answer as the Host handed it over: written once the run takes it.
    fn record_answer(&mut self, id: EffectId, answer: &Answer) {
        let t = self.elapsed();
        let id = self.final_id(id);
        let text = serde_json::to_string(answer).unwrap_or_else(|_| "null".to_owned());
        self.answers.insert(id, (text, t));
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
        match self.out {
            Sink::File(mut out) => {
                let path = self.path.unwrap_or_default();
                out.flush()
                    .map_err(|e| format!("cannot write the record {}: {e}", path.display()))?;
                Ok(Written::File(path))
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
        };
        for (n, line) in lines {
            let line = line.map_err(|e| bad(n, &e.to_string()))?;
            if line.trim().is_empty() {
                continue;
            }
            let value: Json =
                serde_json::from_str(&line).map_err(|e| bad(n, &format!("not JSON ({e})")))?;
            let id = |key: &str| value.get(key).and_then(Json::as_u64);
            if let (Some(id), Some(request)) = (id("effect"), value.get("request")) {
                record.requests.insert(id, request.clone());
            } else if let (Some(effect), Some(answer)) = (id("answer"), value.get("value")) {
                let answer: Answer = serde_json::from_value(answer.clone())
                    .map_err(|e| bad(n, &format!("not an answer ({e})")))?;
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
}

/// What to do with an issued effect.
#[derive(Debug)]
pub(crate) enum Check {
    /// Answered from the record: do not perform it.
    FromRecord,
    /// Perform it for real (a live replay).
    Live,
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
        }
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
            return Check::Live;
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

//! `promptforge batch PROMPT --inputs FILE.jsonl`: run one prompt once per input line (and
//! `--repeat N` times each), check each result against the line's expectations, and write
//! one result line per run in input order; `promptforge merge` joins the result files of
//! `--shard I/N` slices back into the one file an unsharded batch writes.
//!
//! Memory stays flat in the number of inputs: lines are read as the workers take them, each
//! run has a store in memory that goes when the run ends, and results are written as soon as
//! every earlier one is, so only runs in flight (and the few that finished ahead of a slower
//! earlier one) are held. The run-wide concurrency limit holds across runs: `--concurrency`
//! workers each drive one run at a time, and every run's model rounds share one limit.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use promptforge_engine::{Outcome, Run, RunContext, RunErrorKind};
use promptforge_harness::store::Store;
use promptforge_syntax::Prompt;
use promptforge_syntax::frontmatter::ArgsDecl;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::host::{Notes, Operator, channel};
use crate::report::Ui;
use crate::session::{CacheFlags, ModelFlags, Session, start_instant};
use crate::source::read_prompt;
use crate::ui::{Totals, duration_text, plural, thousands};

#[derive(Debug, Args)]
pub struct BatchArgs {
    /// The prompt file to run.
    #[arg(value_name = "PROMPT")]
    prompt: PathBuf,
    /// The inputs: one JSON object a line (`args` or `arg`, optional `seed`, `expect`,
    /// `contains`, `matches`, `inputs`).
    #[arg(long, value_name = "FILE.jsonl")]
    inputs: PathBuf,
    /// Write the results here (one JSON line per run, in input order) instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Skip the runs whose result is already in the --out file.
    #[arg(long, requires = "out")]
    resume: bool,
    /// Run again only the runs whose result in the --out file is an infrastructure failure
    /// (the model backend unreachable or refusing), never one that failed an expectation.
    #[arg(long, requires = "out")]
    retry_errors: bool,
    /// Run every input N times as independent samples, each with its own seed.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// With --repeat: the pass rate (0 to 1) every input must reach for exit status 0.
    #[arg(long, value_name = "RATE", default_value_t = 1.0)]
    pass_rate: f64,
    /// Run only the I-th (from 0) of N deterministic slices of the inputs: input k belongs to
    /// slice k mod N.
    #[arg(long, value_name = "I/N")]
    shard: Option<String>,
    /// The batch's seed: each input's seed derives from it and the input's position, unless
    /// the line sets its own (default 0, so a batch and its shards reproduce).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The start instant of every run, RFC 3339; default: now, once for the whole batch.
    #[arg(long, value_name = "RFC3339")]
    when: Option<String>,
    #[command(flatten)]
    models: ModelFlags,
    #[command(flatten)]
    cache: CacheFlags,
    /// The most model rounds in flight across the whole batch, and the most runs at once.
    #[arg(long, value_name = "N", default_value_t = promptforge_engine::run::DEFAULT_CONCURRENCY,
          value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
}

/// `promptforge merge FILE...`: shard results into one file.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// Result files written by `batch --shard I/N --out FILE`.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Write the merged results here instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// The inputs file, read twice (checked whole before the first run, then fed to the workers
/// line by line). A regular file is opened again; anything else (a pipe, `<(...)`,
/// `/dev/stdin` from a pipe, a named FIFO) can be read only once, so it is first copied to an
/// unnamed temporary file, keeping memory flat in the number of inputs either way.
struct Inputs {
    path: PathBuf,
    copy: Option<std::fs::File>,
}

impl Inputs {
    fn new(path: &Path) -> Result<Inputs, String> {
        let failed = |e: std::io::Error| format!("--inputs {}: {e}", path.display());
        let meta = std::fs::metadata(path).map_err(failed)?;
        let copy = if meta.is_file() {
            None
        } else {
            let mut from = std::fs::File::open(path).map_err(failed)?;
            let mut copy = tempfile::tempfile().map_err(failed)?;
            std::io::copy(&mut from, &mut copy).map_err(failed)?;
            Some(copy)
        };
        Ok(Inputs {
            path: path.to_path_buf(),
            copy,
        })
    }

    /// The folder an input's `input_file` is read from: the inputs file's, or the current
    /// one for standard input and the descriptors a shell hands over (`/dev/stdin`,
    /// `/dev/fd/N` from `<(...)`, `/proc/self/fd/N`), whose folders name nothing of the
    /// user's, whether they are a pipe or a redirected file. A named FIFO keeps its folder.
    fn dir(&self) -> PathBuf {
        let handed_over = self.path.starts_with("/dev") || self.path.starts_with("/proc");
        match self.path.parent() {
            Some(parent) if !handed_over => parent.to_path_buf(),
            _ => PathBuf::new(),
        }
    }

    /// A reader from the first line.
    fn open(&self) -> Result<std::fs::File, String> {
        let failed = |e: std::io::Error| format!("--inputs {}: {e}", self.path.display());
        match &self.copy {
            None => std::fs::File::open(&self.path).map_err(failed),
            Some(copy) => {
                let mut file = copy.try_clone().map_err(failed)?;
                std::io::Seek::rewind(&mut file).map_err(failed)?;
                Ok(file)
            }
        }
    }
}

/// One line of the inputs file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputLine {
    /// The raw argument string.
    args: Option<String>,
    /// Structured args: a JSON object, sent as its JSON text.
    arg: Option<serde_json::Map<String, Json>>,
    /// This input's seed (each repeat derives its own from it).
    seed: Option<u64>,
    /// The result must equal this text.
    expect: Option<String>,
    /// The result must contain this text, or each of these.
    contains: Option<OneOrMany>,
    /// The result must match this regular expression (or each of these).
    matches: Option<OneOrMany>,
    /// Operator answers for `input.ask()`, in order.
    inputs: Option<Vec<String>>,
    /// A label copied to the result line.
    id: Option<Json>,
    /// The file placed in this run's store as the prompt's declared input file (a path
    /// relative to the inputs file's folder).
    input_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn items(&self) -> Vec<&str> {
        match self {
            OneOrMany::One(s) => vec![s.as_str()],
            OneOrMany::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// One run's result line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ResultLine {
    /// The input's position among the file's inputs, from 0.
    index: u64,
    /// The input's line in the file, from 1.
    line: u64,
    /// Which sample of the input, from 0.
    repeat: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<Json>,
    seed: u64,
    /// `passed`, `failed` (an expectation did not hold) or `errored` (the run did not
    /// complete).
    status: String,
    /// The run's outcome object.
    outcome: Json,
    /// The expectations that did not hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    failures: Vec<String>,
    /// The run ended on an infrastructure failure (`--retry-errors` runs it again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    infrastructure: bool,
    rounds: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    /// Dollars, when the model's price is known and every reply reported its tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cost: Option<f64>,
    /// Rounds whose reply reported no tokens (the cost is then unknown).
    #[serde(default, skip_serializing_if = "is_zero")]
    unmetered: u64,
    /// Wall time of the run in milliseconds.
    ms: u64,
    /// What the whole batch is, so `merge` can tell a missing slice: the inputs in the file,
    /// the samples of each, and this line's slice (`I/N`) when the batch was sliced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    inputs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    repeats: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shard: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ResultLine {
    /// Why the run did not pass, for the summary: its first expectation miss, or its error.
    fn reason(&self) -> Option<String> {
        match self.status.as_str() {
            "passed" => None,
            "failed" => self.failures.first().cloned(),
            _ => Some(match &self.outcome["error"] {
                Json::Object(error) => format!(
                    "errored: {}: {}",
                    error.get("kind").and_then(Json::as_str).unwrap_or(""),
                    trimmed(error.get("message").and_then(Json::as_str).unwrap_or(""))
                ),
                _ => format!(
                    "errored: {}",
                    self.outcome["outcome"].as_str().unwrap_or("unknown")
                ),
            }),
        }
    }

    fn key(&self) -> (u64, u32) {
        (self.index, self.repeat)
    }
}

/// `I/N` with `0 <= I < N`.
fn parse_shard(text: &str) -> Result<(u64, u64), String> {
    let bad = || format!("--shard {text:?}: write it as I/N with 0 <= I < N, such as 0/4");
    let (i, n) = text.split_once('/').ok_or_else(bad)?;
    let (i, n): (u64, u64) = (
        i.trim().parse().map_err(|_| bad())?,
        n.trim().parse().map_err(|_| bad())?,
    );
    if n == 0 || i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

/// A seed mixed from two numbers (SplitMix64's finaliser): inputs and repeats get seeds
/// that differ in every bit, the same on every machine.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One run to do.
#[derive(Debug)]
struct Job {
    seq: u64,
    index: u64,
    line: u64,
    repeat: u32,
    seed: u64,
    input: Arc<InputLine>,
}

/// What every run of the batch shares.
struct Shared {
    /// The inputs file's folder (an input's `input_file` is read from there).
    inputs_dir: PathBuf,
    /// The inputs in the file, the samples of each, and the slice (for the result lines).
    inputs: u64,
    repeats: u32,
    shard: Option<String>,
    prompt: Arc<Prompt>,
    /// The current model and the web Plugin, for every run.
    session: Session,
    start_ms: i64,
    concurrency: u32,
    slots: Arc<tokio::sync::Semaphore>,
    cancel: Arc<AtomicBool>,
    /// The response cache, when `--cache` is on (each run keys its rounds by its repeat).
    cache: Option<Arc<Mutex<crate::response_cache::ResponseCache>>>,
    /// The Host channels of the runs in flight, by job: Ctrl-C wakes each, so a run waiting
    /// on a model round sees the cancel at once instead of after the round.
    waking: Wakers,
    /// The runtime every run's effects run on (the providers' connections live on it).
    runtime: tokio::runtime::Handle,
    /// The config's MCP servers, when the prompt declares one: started once, for every run.
    mcp: Option<Arc<promptforge_harness::mcp::McpPlugins>>,
}

/// The Host channels of the runs in flight, by job sequence number.
type Wakers =
    Arc<Mutex<BTreeMap<u64, tokio::sync::mpsc::UnboundedSender<crate::host::HostMessage>>>>;

/// Text shortened for a summary line: one line, at most 60 characters.
fn trimmed(text: &str) -> String {
    const MOST: usize = 60;
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= MOST {
        return line;
    }
    let mut cut: String = line.chars().take(MOST - 1).collect();
    cut.push('…');
    cut
}

fn check_expectations(input: &InputLine, result: &str) -> Result<Vec<String>, String> {
    let mut failures = Vec::new();
    let got = || format!("got {:?}", trimmed(result));
    if let Some(expect) = &input.expect
        && result != expect
    {
        failures.push(format!("expect: wanted {:?}, {}", trimmed(expect), got()));
    }
    if let Some(contains) = &input.contains {
        for needle in contains.items() {
            if !result.contains(needle) {
                failures.push(format!("contains: wanted {needle:?} in it, {}", got()));
            }
        }
    }
    if let Some(matches) = &input.matches {
        for pattern in matches.items() {
            let re = regex::Regex::new(pattern)
                .map_err(|e| format!("matches {pattern:?} is not a regular expression: {e}"))?;
            if !re.is_match(result) {
                failures.push(format!("matches: wanted a match of {pattern:?}, {}", got()));
            }
        }
    }
    Ok(failures)
}

fn run_one(shared: &Shared, job: &Job) -> ResultLine {
    let started = Instant::now();
    let input = &job.input;
    let mut ctx = RunContext::new(job.seed, shared.start_ms);
    ctx.args = match (&input.args, &input.arg) {
        (Some(args), _) => Some(args.clone()),
        (None, Some(object)) => Some(Json::Object(object.clone()).to_string()),
        (None, None) => None,
    };
    ctx.cancel = shared.cancel.clone();
    ctx.concurrency = shared.concurrency;
    ctx.execution = shared.prompt.frontmatter.name.clone();
    let operator = match &input.inputs {
        Some(answers) => Operator::Scripted(answers.iter().cloned().collect()),
        None => Operator::Nobody,
    };
    shared.session.offer(&mut ctx, &operator);
    // This input's own file, placed as the prompt's declared input file.
    let mut store = Store::memory();
    let placed = match (&shared.prompt.frontmatter.input, &input.input_file) {
        (Some(decl), Some(file)) => {
            let file = shared.inputs_dir.join(file);
            promptforge_harness::store::place_input_file(&mut store, &decl.path, &file)
                .map_err(|e| format!("input_file {}: {e}", file.display()))
        }
        (None, Some(file)) => Err(format!(
            "input_file {}: this prompt declares no input file to place it as",
            file.display()
        )),
        _ => Ok(()),
    };
    // A file that cannot be placed is this input's fault, not the infrastructure's.
    let input_fault = placed.is_err();
    let (tx, rx) = channel();
    shared
        .waking
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(job.seq, tx.clone());
    let host = placed.and_then(|()| {
        shared
            .session
            .host(store, operator, shared.cancel.clone(), (tx, rx))
    });
    let (outcome, totals, infrastructure) = match host {
        Ok(host) => {
            let mut host = host
                .notes(Notes::Keep)
                .round_slots(shared.slots.clone())
                .shared_runtime(shared.runtime.clone());
            if let Some(cache) = &shared.cache {
                host = host.cache(crate::response_cache::RunCache::new(
                    cache.clone(),
                    job.repeat,
                ));
            }
            if let Some(mcp) = &shared.mcp {
                host = host.mcp(mcp.clone());
            }
            ctx.host
                .plugins
                .extend(host.activate_mcp(&shared.prompt.frontmatter));
            let mut run = Run::new(shared.prompt.clone(), ctx);
            let outcome = host.drive(&mut run, &mut |_| {});
            let diagnosis = host.diagnosis();
            let infra = matches!(&outcome, Outcome::Failed(err)
                if err.kind == RunErrorKind::Completion && diagnosis.infrastructure);
            (outcome, host.progress_state().totals(), infra)
        }
        Err(message) => (
            Outcome::Failed(promptforge_engine::RunError::new(
                RunErrorKind::Internal,
                message,
            )),
            Totals::default(),
            !input_fault,
        ),
    };
    let (status, failures) = match &outcome {
        Outcome::Completed(result) => match check_expectations(input, result) {
            Ok(failures) if failures.is_empty() => ("passed", failures),
            Ok(failures) => ("failed", failures),
            Err(bad) => ("failed", vec![bad]),
        },
        _ => ("errored", Vec::new()),
    };
    shared
        .waking
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&job.seq);
    ResultLine {
        index: job.index,
        line: job.line,
        repeat: job.repeat,
        id: input.id.clone(),
        seed: job.seed,
        status: status.to_owned(),
        outcome: serde_json::to_value(crate::report::outcome_json(&outcome)).unwrap_or(Json::Null),
        failures,
        infrastructure,
        rounds: totals.rounds,
        prompt_tokens: totals.prompt_tokens,
        completion_tokens: totals.completion_tokens,
        cost: totals.cost(
            shared
                .session
                .model
                .as_ref()
                .and_then(|m| m.description.price.as_ref()),
        ),
        unmetered: totals.unmetered,
        ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        inputs: Some(shared.inputs),
        repeats: Some(shared.repeats),
        shard: shared.shard.clone(),
    }
}

/// The results already in `path` (for `--resume` and `--retry-errors`), by run; a line that
/// is not a result is an error (the file is not ours to overwrite).
fn read_results(path: &Path) -> Result<BTreeMap<(u64, u32), ResultLine>, String> {
    read_results_mending(path, false)
}

/// [`read_results`], where a last line cut short (a batch killed mid-write) is dropped with a
/// note, and with `mend` also cut from the file (and a last line that lacks only its newline
/// gets one), so results can be appended after it. Any other bad line is still refused.
fn read_results_mending(
    path: &Path,
    mend: bool,
) -> Result<BTreeMap<(u64, u32), ResultLine>, String> {
    let mut done = BTreeMap::new();
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(done),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    let mut reader = BufReader::new(file);
    let mut bytes = Vec::new();
    let (mut n, mut offset) = (0usize, 0u64);
    let mut fix: Option<(u64, bool)> = None;
    loop {
        bytes.clear();
        let read = reader.read_until(b'\n', &mut bytes).map_err(cannot)?;
        if read == 0 {
            break;
        }
        n += 1;
        let start = offset;
        offset += read as u64;
        let whole = bytes.ends_with(b"\n");
        let text = String::from_utf8_lossy(&bytes);
        if text.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<ResultLine>(&text) {
            Ok(result) => {
                if !whole {
                    fix = Some((offset, true));
                }
                done.insert(result.key(), result);
            }
            // Cut short: a result line that ends in the middle (its JSON runs out), not any
            // other text that happens to lack a newline.
            Err(e)
                if !whole
                    && e.classify() == serde_json::error::Category::Eof
                    && text.starts_with("{\"index\":") =>
            {
                errln!(
                    "note: {}:{n}: the last line is cut short (the batch was stopped while \
                     writing it); it is dropped and its run is done again",
                    path.display()
                );
                fix = Some((start, false));
            }
            Err(e) => {
                return Err(format!(
                    "{}:{n}: not a batch result line ({e}); refusing to resume into it",
                    path.display()
                ));
            }
        }
    }
    if mend && let Some((at, newline)) = fix {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| format!("cannot mend {}: {e}", path.display()))?;
        file.set_len(at)
            .and_then(|()| {
                use std::io::Seek;
                file.seek(std::io::SeekFrom::End(0))?;
                if newline {
                    file.write_all(b"\n")?;
                }
                file.sync_all()
            })
            .map_err(|e| format!("cannot mend {}: {e}", path.display()))?;
    }
    Ok(done)
}

/// How many of a batch's runs are missing, and the first few of them (input, repeat).
type Missing = (u64, Vec<(u64, u32)>);

/// Which runs of the batch the results lack, when their lines say what the batch was
/// (`(inputs, repeats)` from any line); `None` for results of an older promptforge.
fn missing_runs(all: &BTreeMap<(u64, u32), ResultLine>) -> Option<Result<Missing, String>> {
    let first = all.values().next()?;
    let (inputs, repeats) = (first.inputs?, first.repeats?);
    // Slices of one batch agree on what the batch is.
    if let Some(other) = all
        .values()
        .find(|r| r.inputs.is_some_and(|i| i != inputs) || r.repeats.is_some_and(|n| n != repeats))
    {
        return Some(Err(format!(
            "the results are of different batches: one says {} with {} each, another {} with {} (an inputs file or --repeat changed between slices)",
            plural(inputs, "input"),
            plural(u64::from(repeats), "sample"),
            plural(other.inputs.unwrap_or(0), "input"),
            plural(u64::from(other.repeats.unwrap_or(0)), "sample")
        )));
    }
    // Counted, with the first few named (a corrupt count must not build a huge list).
    let expected = inputs.saturating_mul(u64::from(repeats));
    let count = expected.saturating_sub(
        all.keys()
            .filter(|(index, repeat)| *index < inputs && *repeat < repeats)
            .count() as u64,
    );
    let mut named = Vec::new();
    'outer: for index in 0..inputs {
        for repeat in 0..repeats {
            if named.len() >= 5 {
                break 'outer;
            }
            if !all.contains_key(&(index, repeat)) {
                named.push((index, repeat));
            }
        }
    }
    Some(Ok((count, named)))
}

/// Counts for the summary.
#[derive(Debug, Default)]
struct Tally {
    passed: u64,
    failed: u64,
    errored: u64,
    totals: Totals,
    run_ms: u64,
    /// The summed cost of the runs that made rounds, while every one of them had one.
    cost: Option<f64>,
    /// Runs that made rounds without a known cost.
    uncosted: u64,
    /// Per input, by index.
    per_input: BTreeMap<u64, InputTally>,
}

/// One input's runs in the summary.
#[derive(Debug)]
struct InputTally {
    line: u64,
    id: Option<Json>,
    passes: u32,
    runs: u32,
    /// Why its first run that did not pass did not.
    reason: Option<String>,
}

impl Tally {
    fn add(&mut self, r: &ResultLine) {
        match r.status.as_str() {
            "passed" => self.passed += 1,
            "failed" => self.failed += 1,
            _ => self.errored += 1,
        }
        self.totals.rounds += r.rounds;
        self.totals.prompt_tokens += r.prompt_tokens;
        self.totals.completion_tokens += r.completion_tokens;
        self.totals.unmetered += r.unmetered;
        self.run_ms += r.ms;
        match r.cost {
            Some(cost) => *self.cost.get_or_insert(0.0) += cost,
            None if r.rounds > 0 => self.uncosted += 1,
            None => {}
        }
        let entry = self.per_input.entry(r.index).or_insert(InputTally {
            line: r.line,
            id: r.id.clone(),
            passes: 0,
            runs: 0,
            reason: None,
        });
        entry.runs += 1;
        if r.status == "passed" {
            entry.passes += 1;
        } else if entry.reason.is_none() {
            entry.reason = r.reason();
        }
    }

    fn runs(&self) -> u64 {
        self.passed + self.failed + self.errored
    }

    /// Inputs whose pass rate is under `rate`.
    fn below(&self, rate: f64) -> usize {
        self.per_input
            .values()
            .filter(|t| f64::from(t.passes) < rate * f64::from(t.runs))
            .count()
    }

    fn print(&self, repeat: u32, wall: Option<std::time::Duration>) {
        let mut out = std::io::stderr().lock();
        let _ = writeln!(out, "batch summary");
        let _ = writeln!(
            out,
            "  runs      {} ({} × {})",
            self.runs(),
            plural(self.per_input.len() as u64, "input"),
            plural(u64::from(repeat), "repeat")
        );
        let _ = writeln!(out, "  passed    {}", self.passed);
        let _ = writeln!(out, "  failed    {}", self.failed);
        let _ = writeln!(out, "  errored   {}", self.errored);
        let _ = writeln!(
            out,
            "  tokens    {} in / {} out over {}",
            thousands(self.totals.prompt_tokens),
            thousands(self.totals.completion_tokens),
            plural(self.totals.rounds, "round")
        );
        let cost = match (self.cost, self.uncosted) {
            (_, 0) if self.totals.rounds == 0 => "none (no model rounds)".to_owned(),
            (Some(cost), 0) => format!("${cost:.4}"),
            (Some(cost), n) => format!(
                "${cost:.4} for the runs with a known cost; unknown for {}",
                plural(n, "run")
            ),
            (None, _) => "unknown (no catalog price, or tokens not reported)".to_owned(),
        };
        let _ = writeln!(out, "  cost      {cost}");
        let mean = self.run_ms.checked_div(self.runs()).unwrap_or(0);
        let time = match wall {
            Some(wall) => format!("{} wall, ", duration_text(wall)),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "  time      {time}{} per run on average",
            duration_text(std::time::Duration::from_millis(mean))
        );
        if repeat > 1 {
            let all = self
                .per_input
                .values()
                .filter(|t| t.passes == t.runs)
                .count();
            let _ = writeln!(
                out,
                "  inputs    {all} of {} passed all their runs",
                self.per_input.len()
            );
            // Only the inputs that missed, each with why its first miss did.
            for (index, t) in self.per_input.iter().filter(|(_, t)| t.passes < t.runs) {
                let label = match &t.id {
                    Some(id) => format!("input {index} (line {}, id {id})", t.line),
                    None => format!("input {index} (line {})", t.line),
                };
                let pct = f64::from(t.passes) * 100.0 / f64::from(t.runs.max(1));
                let why = t.reason.as_deref().unwrap_or("did not pass");
                let _ = writeln!(
                    out,
                    "    {label}: {}/{} passed ({pct:.0}%): {why}",
                    t.passes, t.runs
                );
            }
        }
    }
}

/// Where results go, in input order.
struct Writer {
    sink: Box<dyn Write + Send>,
    next: u64,
    /// Results waiting for the ones before them; `None`: a run the batch's own stop cut short,
    /// which is no result (`--resume` runs it again).
    waiting: BTreeMap<u64, Option<ResultLine>>,
    tally: Tally,
}

impl Writer {
    fn put(&mut self, seq: u64, result: Option<ResultLine>) -> Result<(), String> {
        self.waiting.insert(seq, result);
        while let Some(result) = self.waiting.remove(&self.next) {
            self.next += 1;
            let Some(result) = result else {
                continue;
            };
            let line = serde_json::to_string(&result).map_err(|e| e.to_string())?;
            writeln!(self.sink, "{line}")
                .and_then(|()| self.sink.flush())
                .map_err(|e| format!("cannot write a result: {e}"))?;
            self.tally.add(&result);
        }
        Ok(())
    }
}

/// How many problems of an inputs file are listed before the rest are only counted.
const INPUT_PROBLEMS_SHOWN: usize = 20;

/// Read every input line before the first run (streaming, one line at a time) and count
/// them: a line that is not an input, gives both `args` and `arg`, has a `matches` pattern
/// that is not a regular expression, or whose `arg` object the declaration refuses (see
/// [`complete_args`](crate::declared::complete_args)) is found now, all of them at once, not
/// after the model calls of the lines before it.
fn scan_inputs(inputs: &Inputs, decl: &ArgsDecl) -> Result<u64, String> {
    let path = &inputs.path;
    let file = inputs.open()?;
    let mut count = 0;
    let mut problems = Vec::new();
    let mut more = 0usize;
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| format!("--inputs {}: {e}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        count += 1;
        let at = format!("{}:{}", path.display(), n + 1);
        let found = match parse_input(&line, decl) {
            Ok(input) => input
                .matches
                .iter()
                .flat_map(OneOrMany::items)
                .find_map(|pattern| {
                    regex::Regex::new(pattern)
                        .err()
                        .map(|e| format!("matches {pattern:?} is not a regular expression: {e}"))
                }),
            Err(problem) => Some(problem),
        };
        if let Some(problem) = found {
            if problems.len() < INPUT_PROBLEMS_SHOWN {
                problems.push(format!("{at}: {problem}"));
            } else {
                more += 1;
            }
        }
    }
    if problems.is_empty() {
        return Ok(count);
    }
    if more > 0 {
        problems.push(format!(
            "... and {}",
            crate::ui::plural(more as u64, "more line")
        ));
    }
    Err(format!(
        "the inputs file has problems; nothing ran:\n{}",
        problems.join("\n")
    ))
}

/// One input line, its `arg` object completed by the prompt's declaration.
fn parse_input(line: &str, decl: &ArgsDecl) -> Result<InputLine, String> {
    let mut input: InputLine =
        serde_json::from_str(line).map_err(|e| format!("not an input line: {e}"))?;
    if input.args.is_some() && input.arg.is_some() {
        return Err("give `args` (a string) or `arg` (an object), not both".to_owned());
    }
    if let Some(object) = &mut input.arg {
        crate::declared::complete_args(decl, object).map_err(|e| format!("arg: {e}"))?;
    }
    Ok(input)
}

pub fn batch(args: &BatchArgs, ui: Ui) -> ExitCode {
    match batch_inner(args, ui) {
        Ok(code) => code,
        Err(message) => {
            errln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn batch_inner(args: &BatchArgs, ui: Ui) -> Result<ExitCode, String> {
    if !(0.0..=1.0).contains(&args.pass_rate) {
        return Err(format!(
            "--pass-rate {}: give a rate from 0 to 1",
            args.pass_rate
        ));
    }
    let shard = args.shard.as_deref().map(parse_shard).transpose()?;
    let text = read_prompt(&args.prompt)?;
    let prompt = Prompt::parse(&text)
        .map_err(|err| crate::source::parse_failure_line(&args.prompt, &err))?;
    if let Some(decl) = &prompt.frontmatter.input {
        errln!(
            "note: this prompt reads the input file `{}`: each input line may name one with \
             `input_file` (a path from the inputs file's folder); inputs without one run without it",
            decl.path
        );
    }
    let session = Session::open(&args.models, None)?;
    let start_ms = start_instant(args.when.as_deref())?;

    // What is done already, and what to run again.
    let previous = if args.resume || args.retry_errors {
        match &args.out {
            Some(out) => read_results_mending(out, true)?,
            None => BTreeMap::new(),
        }
    } else {
        BTreeMap::new()
    };
    // A run recorded already is done, unless --retry-errors and it ended on the
    // infrastructure; one not recorded runs, except under --retry-errors alone.
    let wanted = |key: &(u64, u32)| match previous.get(key) {
        Some(recorded) => args.retry_errors && recorded.infrastructure,
        None => !args.retry_errors || args.resume,
    };

    let inputs = Inputs::new(&args.inputs)?;
    let total_inputs = scan_inputs(&inputs, &prompt.frontmatter.args)?;
    let declared = prompt.frontmatter.args.clone();
    let prompt = Arc::new(prompt);
    let in_shard = |index: u64| shard.is_none_or(|(i, n)| index % n == i);
    let planned: u64 = (0..total_inputs)
        .filter(|&index| in_shard(index))
        .map(|index| (0..args.repeat).filter(|&r| wanted(&(index, r))).count() as u64)
        .sum();

    let cancel = Arc::new(AtomicBool::new(false));
    let waking: Wakers = Arc::default();
    {
        let (cancel, waking) = (cancel.clone(), waking.clone());
        if let Err(e) = ctrlc::set_handler(move || {
            cancel.store(true, Ordering::Relaxed);
            for tx in waking.lock().unwrap_or_else(|e| e.into_inner()).values() {
                let _ = tx.send(crate::host::HostMessage::Wake);
            }
        }) {
            errln!("warning: cannot install the Ctrl-C handler: {e}");
        }
    }
    // One runtime for the whole batch: runs share the model provider, and its pooled
    // connections must outlive any one run.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let mcp = session.mcp_for(&prompt.frontmatter)?;
    let shared = Arc::new(Shared {
        inputs_dir: inputs.dir(),
        inputs: total_inputs,
        repeats: args.repeat,
        shard: args.shard.clone(),
        mcp,
        runtime: runtime.handle().clone(),
        prompt: prompt.clone(),
        session,
        start_ms,
        concurrency: args.concurrency,
        slots: Arc::new(tokio::sync::Semaphore::new(args.concurrency as usize)),
        cancel: cancel.clone(),
        waking: waking.clone(),
        cache: args.cache.open(false)?,
    });

    // The results: new ones are appended as they come, so an interrupted batch resumes.
    let appending = !previous.is_empty();
    let sink: Box<dyn Write + Send> = match &args.out {
        Some(out) => Box::new(std::io::BufWriter::new(
            std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .append(appending)
                .truncate(!appending)
                .open(out)
                .map_err(|e| format!("--out {}: {e}", out.display()))?,
        )),
        None => Box::new(crate::ui::QuietStdout),
    };
    let writer = Arc::new(Mutex::new(Writer {
        sink,
        next: 0,
        waiting: BTreeMap::new(),
        tally: Tally::default(),
    }));

    let bar = if ui.progress {
        let bar = crate::ui::screen_bar(ProgressBar::with_draw_target(
            Some(planned),
            ProgressDrawTarget::hidden(),
        ));
        if let Ok(style) =
            ProgressStyle::with_template("{elapsed:>4} [{wide_bar}] {pos}/{len} {msg}  ")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        // Drawn from the start: a batch whose first runs take a while is not silent.
        bar.set_message(format!("starting {}", plural(planned, "run")));
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    } else {
        ProgressBar::hidden()
    };

    // The jobs, read from the file as the workers take them.
    let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel::<Job>(args.concurrency as usize * 2);
    let jobs_rx = Arc::new(Mutex::new(jobs_rx));
    let failure: Arc<Mutex<Option<String>>> = Arc::default();
    let running = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..args.concurrency {
            let (jobs_rx, shared, writer, bar, failure, running) = (
                jobs_rx.clone(),
                shared.clone(),
                writer.clone(),
                bar.clone(),
                failure.clone(),
                running.clone(),
            );
            scope.spawn(move || {
                loop {
                    let job = {
                        let rx = jobs_rx.lock().unwrap_or_else(|e| e.into_inner());
                        rx.recv()
                    };
                    let Ok(job) = job else { break };
                    running.fetch_add(1, Ordering::Relaxed);
                    {
                        // Messages are set under the writer's lock, each with the count as
                        // it is then, so the last one drawn is never a stale count.
                        let writer = writer.lock().unwrap_or_else(|e| e.into_inner());
                        if writer.tally.runs() == 0 {
                            let now = running.load(Ordering::Relaxed);
                            bar.set_message(format!("running {now}"));
                        }
                    }
                    let result = run_one(&shared, &job);
                    running.fetch_sub(1, Ordering::Relaxed);
                    // A run the batch's own stop (Ctrl-C, a bad inputs line, a closed
                    // stdout) cut short did not finish: it is no result.
                    let unfinished = shared.cancel.load(Ordering::Relaxed)
                        && result.outcome["outcome"] == "cancelled";
                    let mut writer = writer.lock().unwrap_or_else(|e| e.into_inner());
                    if let Err(e) = writer.put(job.seq, (!unfinished).then_some(result)) {
                        *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                        shared.cancel.store(true, Ordering::Relaxed);
                    }
                    // Results to a reader that went away: stop taking inputs, quietly.
                    if args.out.is_none() && crate::ui::stdout_gone() {
                        shared.cancel.store(true, Ordering::Relaxed);
                    }
                    let t = &writer.tally;
                    bar.set_message(format!(
                        "running {} · passed {} · failed {} · errored {}",
                        running.load(Ordering::Relaxed),
                        t.passed,
                        t.failed,
                        t.errored
                    ));
                    drop(writer);
                    bar.inc(1);
                }
            });
        }
        // Feed the workers.
        let feed = || -> Result<(), String> {
            let file = inputs.open()?;
            let mut index = 0u64;
            let mut seq = 0u64;
            for (n, line) in BufReader::new(file).lines().enumerate() {
                let line = line.map_err(|e| format!("--inputs {}: {e}", args.inputs.display()))?;
                if line.trim().is_empty() {
                    continue;
                }
                let this = index;
                index += 1;
                if !in_shard(this) {
                    continue;
                }
                // Every line passed `scan_inputs` already; a file changed since fails here.
                let input = parse_input(&line, &declared)
                    .map_err(|e| format!("{}:{}: {e}", args.inputs.display(), n + 1))?;
                let input = Arc::new(input);
                let base = input.seed.unwrap_or_else(|| mix(args.seed, this));
                for repeat in 0..args.repeat {
                    if !wanted(&(this, repeat)) {
                        continue;
                    }
                    if cancel.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    let seed = if repeat == 0 {
                        base
                    } else {
                        mix(base, u64::from(repeat))
                    };
                    let job = Job {
                        seq,
                        index: this,
                        line: n as u64 + 1,
                        repeat,
                        seed,
                        input: input.clone(),
                    };
                    seq += 1;
                    if jobs_tx.send(job).is_err() {
                        return Ok(());
                    }
                }
            }
            Ok(())
        };
        let fed = feed();
        drop(jobs_tx);
        if let Err(e) = fed {
            cancel.store(true, Ordering::Relaxed);
            *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        }
    });
    bar.finish_and_clear();
    crate::ui::clear_screen();
    let wall = started.elapsed();
    if let Some(mcp) = &shared.mcp {
        runtime.block_on(mcp.shutdown());
    }
    if let Some(message) = failure.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Err(message);
    }
    let writer = match Arc::try_unwrap(writer) {
        Ok(writer) => writer.into_inner().unwrap_or_else(|e| e.into_inner()),
        Err(_) => return Err("internal: a batch worker outlived the batch".to_owned()),
    };
    let Writer { sink, tally, .. } = writer;
    drop(sink);
    // A resumed or retried batch appended its new results: put the file back in input order,
    // the latest result of each run winning.
    let tally = match (&args.out, appending) {
        (Some(out), true) => {
            let merged = read_results(out)?;
            write_sorted(out, merged.values())?;
            let mut tally = Tally::default();
            for r in merged.values() {
                tally.add(r);
            }
            tally
        }
        _ => tally,
    };
    if !ui.quiet {
        tally.print(args.repeat, Some(wall));
    }
    if args.out.is_none() && crate::ui::stdout_gone() {
        return Ok(ExitCode::SUCCESS);
    }
    if cancel.load(Ordering::Relaxed) {
        errln!("cancelled: the results so far are written; --resume continues");
        return Ok(ExitCode::from(130));
    }
    Ok(exit_code(&tally, args.repeat, args.pass_rate))
}

fn exit_code(tally: &Tally, repeat: u32, pass_rate: f64) -> ExitCode {
    let ok = if repeat > 1 {
        tally.below(pass_rate) == 0
    } else {
        tally.failed == 0 && tally.errored == 0
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Write results to `path` in input order, through a temporary file renamed over it.
fn write_sorted<'a>(
    path: &Path,
    results: impl Iterator<Item = &'a ResultLine>,
) -> Result<(), String> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    {
        let mut out = std::io::BufWriter::new(tmp.as_file_mut());
        for r in results {
            let line = serde_json::to_string(r).map_err(|e| e.to_string())?;
            writeln!(out, "{line}").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        out.flush()
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    tmp.persist(path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(())
}

/// `promptforge merge`: the shards' results as one file in input order, with the summary.
pub fn merge(args: &MergeArgs) -> ExitCode {
    let mut all: BTreeMap<(u64, u32), ResultLine> = BTreeMap::new();
    let mut slices: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for file in &args.files {
        let results = match read_results(file) {
            Ok(results) => results,
            Err(message) => {
                errln!("error: {message}");
                return ExitCode::from(2);
            }
        };
        for (key, mut result) in results {
            // Merged, the results are the whole batch's: no longer one slice's.
            if let Some(slice) = result.shard.take() {
                slices.insert(slice);
            }
            if all.insert(key, result).is_some() {
                errln!(
                    "error: input {} repeat {} appears in more than one file ({} is one); \
                     were two shards given the same I/N?",
                    key.0,
                    key.1,
                    file.display()
                );
                return ExitCode::from(2);
            }
        }
    }
    let missing = match missing_runs(&all) {
        Some(Err(message)) => {
            errln!("error: {message}");
            return ExitCode::from(2);
        }
        Some(Ok((count, named))) if count > 0 => Some((count, named)),
        _ => None,
    };
    if let Some((count, missing)) = missing {
        let slices: Vec<&str> = slices.iter().map(String::as_str).collect();
        let shown: Vec<String> = missing
            .iter()
            .map(|(index, repeat)| format!("input {index} repeat {repeat}"))
            .collect();
        let more = if count > missing.len() as u64 {
            ", ..."
        } else {
            ""
        };
        let slices = if slices.is_empty() {
            String::new()
        } else {
            format!(" (slices given: {})", slices.join(", "))
        };
        errln!(
            "error: the results are incomplete: {} of the batch's runs are missing ({}{more}){slices}; \
             merge every slice's results, or run `batch --resume` on the slice that lacks them",
            count,
            shown.join(", ")
        );
        return ExitCode::from(2);
    }
    let written = match &args.out {
        Some(out) => write_sorted(out, all.values()),
        None => {
            let mut out = crate::ui::QuietStdout;
            all.values().try_for_each(|r| {
                let line = serde_json::to_string(r).map_err(|e| e.to_string())?;
                writeln!(out, "{line}").map_err(|e| e.to_string())
            })
        }
    };
    if let Err(message) = written {
        errln!("error: {message}");
        return ExitCode::from(2);
    }
    let mut tally = Tally::default();
    let mut repeat = 1;
    for r in all.values() {
        tally.add(r);
        repeat = repeat.max(r.repeat + 1);
    }
    tally.print(repeat, None);
    exit_code(&tally, repeat, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_parse_and_refuse_nonsense() {
        assert_eq!(parse_shard("0/4"), Ok((0, 4)));
        assert_eq!(parse_shard("3/4"), Ok((3, 4)));
        for bad in ["4/4", "1/0", "a/b", "2", "-1/3"] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn seeds_differ_per_input_and_repeat_and_never_change() {
        assert_ne!(mix(0, 0), mix(0, 1));
        assert_ne!(mix(0, 1), mix(1, 0));
        assert_eq!(mix(7, 3), mix(7, 3));
        // Fixed forever: a recorded batch reproduces on every machine and version.
        assert_eq!(mix(0, 0), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn expectations_report_each_miss() {
        let input: InputLine = serde_json::from_str(
            r#"{"args":"x","expect":"hello","contains":["ell","zz"],"matches":"^h.*o$"}"#,
        )
        .unwrap_or_default();
        assert_eq!(
            check_expectations(&input, "hello"),
            Ok(vec![
                "contains: wanted \"zz\" in it, got \"hello\"".to_owned()
            ])
        );
        assert_eq!(
            check_expectations(&input, "help"),
            Ok(vec![
                "expect: wanted \"hello\", got \"help\"".to_owned(),
                "contains: wanted \"ell\" in it, got \"help\"".to_owned(),
                "contains: wanted \"zz\" in it, got \"help\"".to_owned(),
                "matches: wanted a match of \"^h.*o$\", got \"help\"".to_owned(),
            ])
        );
        // What was got is shown on one line, trimmed.
        let long = "word ".repeat(30);
        let misses = check_expectations(&input, &long).unwrap_or_default();
        assert!(
            misses[0].starts_with("expect: wanted \"hello\", got \"word word")
                && misses[0].ends_with("…\""),
            "{misses:?}"
        );
        let bad: InputLine = serde_json::from_str(r#"{"matches":"("}"#).unwrap_or_default();
        assert!(check_expectations(&bad, "x").is_err());
    }
}

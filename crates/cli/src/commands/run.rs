//! `promptforge run PROMPT`: run a prompt and report its one outcome.
//!
//! With `--json`, stdout holds exactly one JSON object (the outcome, in the shape of the
//! conformance contract); with `--events`, stdout holds JSON lines only: every event, the
//! Host's notes, and the outcome last. Otherwise the result goes to stdout and a failure to
//! stderr as `error[KIND]: message` with the prompt location and a hint where the Host can
//! tell what to do. On a terminal a live progress display and a summary line go to stderr.
//! Exit status: 0 completed, 1 failed, 130 cancelled, 2 usage error before any run.

pub(crate) mod resume;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use promptforge_engine::store_path::{StoreAnswer, StoreOp};
use promptforge_engine::{Event, Outcome, Run, RunContext, RunError, RunErrorKind};
use promptforge_harness::store::{collect_output_file, place_input_file};

use crate::host::{CurrentModel, Diagnosis, HostMessage, Notes, Operator, channel};
use promptforge_engine::EventKind;
use promptforge_syntax::Prompt;
use std::io::IsTerminal;

use crate::report::{Ui, event_json, exit_code, outcome_json};
use crate::session::{
    CacheFlags, ModelFlags, Session, StoreDir, header_for, keep_record, open_store, os_seed,
    read_snapshot, start_instant,
};
use crate::source::read_prompt;

#[derive(Debug, Args)]
#[command(disable_help_flag = true)]
pub struct RunArgs {
    /// The prompt file to run.
    #[arg(value_name = "PROMPT", required_unless_present = "help")]
    prompt: Option<PathBuf>,
    /// Print help; with PROMPT, first what that prompt takes (its args, roles, tools, files).
    #[arg(short = 'h', long = "help", action = clap::ArgAction::SetTrue)]
    help: bool,
    /// The run's raw argument string (`args`); `-` reads it from stdin.
    #[arg(long = "args", value_name = "STRING")]
    run_args: Option<String>,
    /// One structured argument, NAME=VALUE, typed by the prompt's `args:` declaration
    /// (repeatable; see `promptforge describe PROMPT`).
    #[arg(long = "arg", value_name = "NAME=VALUE", conflicts_with = "run_args")]
    arg: Vec<String>,
    /// Print exactly one JSON object, the run's outcome, on stdout.
    #[arg(long)]
    json: bool,
    /// The run's seed (unsigned 64-bit); default: from the OS.
    #[arg(long)]
    seed: Option<u64>,
    /// The run's start instant, RFC 3339 (`sys.when`); default: now.
    #[arg(long, value_name = "RFC3339")]
    when: Option<String>,
    #[command(flatten)]
    models: ModelFlags,
    #[command(flatten)]
    cache: CacheFlags,
    /// A JSON object file: the Host-state snapshot that `ui()` returns.
    #[arg(long, value_name = "FILE")]
    snapshot: Option<PathBuf>,
    /// An operator answer for the input broker (repeatable, in order).
    #[arg(long = "input", value_name = "TEXT")]
    inputs: Vec<String>,
    /// The run's store is this directory on disk (default: a fresh directory under the
    /// system temp folder, removed after the run unless it failed or --keep-store is given).
    #[arg(long, value_name = "DIR")]
    pub(crate) store: Option<PathBuf>,
    /// Keep the fresh store directory after the run and print its path.
    #[arg(long, conflicts_with = "store")]
    keep_store: bool,
    /// Place this host file in the store as the prompt's declared `input:` file.
    #[arg(long, value_name = "PATH")]
    input_file: Option<PathBuf>,
    /// Copy the prompt's declared `output:` file here after the run.
    #[arg(long, value_name = "PATH")]
    output_file: Option<PathBuf>,
    /// Print every event of the run (lifecycle reports and `log` checkpoints) and the Host's
    /// notes on stdout as JSON lines, the outcome last; nothing else goes to stdout.
    #[arg(long)]
    events: bool,
    /// The most tasks (fanout arms included) that run at once; a prompt can only lower it
    /// with `tasks.concurrency`.
    #[arg(long, value_name = "N", default_value_t = promptforge_engine::run::DEFAULT_CONCURRENCY,
          value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// Write the run down as JSON lines (its context, every effect with its answer, the
    /// events and the outcome) for `promptforge replay`.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// Keep this run out of the run history (`promptforge runs`).
    #[arg(long)]
    no_history: bool,
    /// Run again whenever the prompt or a file it reads changes (with the response cache on,
    /// so only changed rounds reach the model); Ctrl-C ends it.
    #[arg(long, conflicts_with_all = ["json", "events", "record"])]
    pub(crate) watch: bool,
    /// Set by `promptforge resume`: the killed run this run continues.
    #[arg(skip)]
    pub(crate) resume: Option<resume::Resume>,
}

impl RunArgs {
    fn prompt_path(&self) -> &std::path::Path {
        self.prompt.as_deref().unwrap_or(std::path::Path::new("-"))
    }
}

/// The argument string: `--args` (`-` reads stdin), or `--arg` pairs typed by the prompt's
/// declaration.
fn argument_string(args: &RunArgs, prompt: &Prompt) -> Result<Option<String>, String> {
    if !args.arg.is_empty() {
        let (text, notes) = crate::declared::structured_args(&prompt.frontmatter.args, &args.arg)?;
        for note in notes {
            errln!("note: {note}");
        }
        return Ok(Some(text));
    }
    match args.run_args.as_deref() {
        Some("-") => {
            use std::io::Read;
            let mut text = String::new();
            std::io::stdin()
                .take(promptforge_harness::limits::PROMPT_FILE_CAP + 1)
                .read_to_string(&mut text)
                .map_err(|e| {
                    format!("--args -: cannot read the argument string from stdin: {e}")
                })?;
            if text.len() as u64 > promptforge_harness::limits::PROMPT_FILE_CAP {
                return Err(format!(
                    "--args -: the argument string is larger than {} bytes",
                    promptforge_harness::limits::PROMPT_FILE_CAP
                ));
            }
            Ok(Some(text))
        }
        other => Ok(other.map(str::to_owned)),
    }
}

/// Build the run's context from the flags (usage errors before any run).
fn context(args: &RunArgs, cancel: Arc<AtomicBool>) -> Result<RunContext, String> {
    // A resumed run is the killed one again: its seed, start instant and snapshot.
    if let Some(resume) = &args.resume {
        let header = &resume.record.header;
        let mut ctx = RunContext::new(header.seed, header.start_ms);
        ctx.snapshot = header.snapshot.clone();
        ctx.cancel = cancel;
        ctx.concurrency = header.concurrency;
        return Ok(ctx);
    }
    let start_ms = start_instant(args.when.as_deref())?;
    let mut ctx = RunContext::new(args.seed.unwrap_or_else(os_seed), start_ms);
    ctx.snapshot = args.snapshot.as_deref().map(read_snapshot).transpose()?;
    ctx.cancel = cancel;
    ctx.concurrency = args.concurrency;
    Ok(ctx)
}

/// The config files (the model catalog and its `[search]` table), read at most once per run
/// and only when something needs them (`--script` with `--web-script` needs nothing).
/// Show an event: every event as a JSON line on stdout with `--events`; otherwise the
/// author's `log` checkpoints on stderr as `[section] message`, unless stdout carries `--json`.
fn show_event(event: &Event, all: bool, json: bool) {
    if all {
        outln!("{}", event_json(event));
    } else if let (EventKind::Log { section, message }, false) = (&event.kind, json) {
        crate::ui::print_line(&format!("[{section}] {message}"));
    }
}

/// A record's header for this run.
fn record_header(args: &RunArgs, text: &str, ctx: &RunContext) -> crate::record::Header {
    header_for(args.prompt_path(), text, ctx)
}

/// What became of a run, for the report: its outcome and what the Host saw.
struct Finished {
    outcome: Outcome,
    /// The current model's id and price.
    model: Option<CurrentModel>,
    diagnosis: Diagnosis,
    /// The summary line, when the progress display was drawn.
    summary: Option<String>,
    /// The run's record, to keep once the outcome is out.
    record: Option<PendingRecord>,
    /// The parsed prompt, for pointing at its lines.
    prompt: Option<Arc<Prompt>>,
}

fn execute(
    args: &RunArgs,
    text: &str,
    mut ctx: RunContext,
    ui: &Ui,
    messages: (
        tokio::sync::mpsc::UnboundedSender<HostMessage>,
        tokio::sync::mpsc::UnboundedReceiver<HostMessage>,
    ),
) -> Result<Finished, String> {
    let finished = |outcome| Finished {
        outcome,
        model: None,
        diagnosis: Diagnosis::default(),
        summary: None,
        record: None,
        prompt: None,
    };
    let parsed = Prompt::parse(text);
    ctx.args = match (&parsed, &args.resume) {
        (_, Some(resume)) => resume.record.header.args.clone(),
        (Ok(prompt), None) => argument_string(args, prompt)?,
        (Err(_), None) => args.run_args.clone().filter(|a| a != "-"),
    };
    let prompt = match parsed {
        Ok(prompt) => prompt,
        Err(err) => {
            // A prompt that does not parse is a run too: its record holds the outcome.
            let outcome = Outcome::Failed(err.into());
            if let Some(path) = &args.record {
                crate::record::Recorder::create(path, &record_header(args, text, &ctx))?
                    .finish(&outcome)?;
            }
            return Ok(finished(outcome));
        }
    };
    let session = Session::open(&args.models, None)?;
    let model = session.model.clone();
    // A store that fails as the run starts fails the run with `Vfs` (chapter 16).
    let (mut store, dir) = match open_store(args.store.as_deref()) {
        Ok(store) => store,
        Err(detail) => {
            errln!("error: {detail}");
            return Ok(finished(Outcome::Failed(RunError::new(
                RunErrorKind::Vfs,
                "store operation failed",
            ))));
        }
    };
    let tidy = |dir: &StoreDir| {
        if dir.fresh {
            let _ = std::fs::remove_dir_all(&dir.path);
        }
    };
    if let Some(decl) = &prompt.frontmatter.input {
        match &args.input_file {
            Some(file) => {
                if let Err(e) = place_input_file(&mut store, &decl.path, file) {
                    tidy(&dir);
                    return Err(format!("--input-file {}: {e}", file.display()));
                }
            }
            None => {
                // A store the Host seeded already may hold it; otherwise say what to pass.
                let present = store.perform(&StoreOp::Exists {
                    path: decl.path.clone(),
                });
                // The declaration tells the Host what to put in place; the run never acts on
                // it (chapter 02), so it runs without the file, and the prompt decides.
                if !matches!(present, Ok(StoreAnswer::Bool(true))) {
                    crate::ui::print_line(&format!(
                        "note: this prompt reads the input file `{}` ({}), and it is not in the store: the run goes on without it (pass it with --input-file PATH)",
                        decl.path, decl.description
                    ));
                }
            }
        }
    }
    ctx.execution = prompt.frontmatter.name.clone();
    // The operator: `--input` answers, else a person at the terminal, else nobody. A person
    // at the terminal answers when they answer; answers given with --input (or no operator at
    // all) come at once, in the order the run asks.
    let operator = if !args.inputs.is_empty() {
        Operator::Scripted(args.inputs.iter().cloned().collect())
    } else if std::io::stdin().is_terminal() {
        Operator::Terminal
    } else {
        Operator::Nobody
    };
    session.offer(&mut ctx, &operator);
    let output = prompt.frontmatter.output.clone();
    let notes = if args.events {
        Notes::JsonStdout
    } else {
        Notes::Stderr
    };
    let mut host = session
        .host(store, operator, ctx.cancel.clone(), messages)?
        .notes(notes)
        .progress(ui.progress && !args.json && !args.events);
    match args.cache.open(args.watch) {
        Ok(Some(cache)) => host = host.cache(crate::response_cache::RunCache::new(cache, 0)),
        Ok(None) => {}
        Err(e) => {
            tidy(&dir);
            return Err(e);
        }
    }
    match session.mcp_for(&prompt.frontmatter) {
        Ok(Some(plugins)) => host = host.mcp(plugins),
        Ok(None) => {}
        Err(e) => {
            tidy(&dir);
            return Err(e);
        }
    }
    ctx.host
        .plugins
        .extend(host.activate_mcp(&prompt.frontmatter));
    let history = (!args.no_history).then(crate::history::location).flatten();
    let otel = crate::otel::endpoint();
    let started_row;
    if let Some(resume) = &args.resume {
        // The killed run's answers first (in the order it took them), then live; its journal
        // goes on in a new file that starts with them.
        host = host
            .recorder(crate::record::Recorder::resumed(
                &resume.journal,
                &resume.record,
                &resume.invocation,
                resume.owned,
            )?)
            .replay(crate::record::Replay::new(&resume.record, true));
        started_row = Some(resume.id);
    } else {
        let header = record_header(args, text, &ctx);
        let (recorder, row) =
            start_record(args, text, &header, history.as_deref(), otel.is_some())?;
        if let Some(recorder) = recorder {
            host = host.recorder(recorder);
        }
        started_row = row;
    }
    crate::history::started(history.as_deref(), started_row);
    let info = crate::otel::RunInfo {
        name: prompt.frontmatter.name.clone(),
        provider: model
            .as_ref()
            .map(|m| m.description.provider.as_str().to_owned()),
        model: model.as_ref().map(|m| m.description.model.clone()),
        started: std::time::SystemTime::now(),
        price: model.as_ref().and_then(|m| m.description.price),
    };
    let started = std::time::Instant::now();
    let prompt = Arc::new(prompt);
    let mut run = Run::new(prompt.clone(), ctx);
    let (events, json) = (args.events, args.json);
    let outcome = host.drive(&mut run, &mut |event| show_event(event, events, json));
    // Kept once the outcome is reported: the history write and an OpenTelemetry export are
    // never on the way to the result.
    if let Some(divergence) = host.divergence().filter(|d| d.recorded.is_some()) {
        crate::ui::print_line(&format!(
            "note: the resumed run asked differently from the killed one; it went on live from there\n{}",
            divergence.report(
                args.resume
                    .as_ref()
                    .map_or(args.prompt_path(), |r| r.journal.as_path()),
                args.prompt_path()
            )
        ));
    }
    let record = host.take_recorder().map(|recorder| PendingRecord {
        recorder,
        outcome: outcome.clone(),
        wall_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        history,
        started: started_row,
        otel,
        info,
    });
    let summary = host.progress_state().drawn().then(|| {
        let price = model.as_ref().and_then(|m| m.description.price.as_ref());
        let id = model.as_ref().map(|m| m.description.id.as_str());
        host.progress_state().summary(&outcome, price, id)
    });
    // The declared output file: copied out when asked; otherwise it stays in the store, and a
    // fresh store that holds it is kept so nothing the run made is lost.
    // A failed run's store is kept when it holds anything, for a look at what it left.
    let holds_files =
        || std::fs::read_dir(&dir.path).is_ok_and(|mut entries| entries.next().is_some());
    let mut keep = args.keep_store || (matches!(outcome, Outcome::Failed(_)) && holds_files());
    let mut told_path = false;
    if let (Some(decl), Some(file)) = (&output, &args.output_file) {
        if let Err(e) = collect_output_file(host.store(), &decl.path, file) {
            crate::ui::print_line(&format!(
                "warning: cannot collect the output file `{}`: {e}",
                decl.path
            ));
            keep = true;
        }
    } else if let Some(decl) = &output {
        let present = host.store_mut().perform(&StoreOp::Exists {
            path: decl.path.clone(),
        });
        if matches!(present, Ok(StoreAnswer::Bool(true))) {
            keep = true;
            told_path = true;
            crate::ui::print_line(&format!(
                "output file `{}` is in the store at {} (pass --output-file PATH to copy it out)",
                decl.path,
                dir.path.display()
            ));
        }
    }
    let diagnosis = host.diagnosis();
    drop(host);
    if dir.fresh {
        if keep {
            if !args.events && !told_path {
                crate::ui::print_line(&format!("store kept at {}", dir.path.display()));
            }
        } else {
            tidy(&dir);
        }
    }
    Ok(Finished {
        outcome,
        model,
        diagnosis,
        summary,
        record,
        prompt: Some(prompt),
    })
}

/// A finished run's record, kept after its outcome is reported.
struct PendingRecord {
    recorder: crate::record::Recorder,
    outcome: Outcome,
    wall_ms: u64,
    history: Option<std::path::PathBuf>,
    /// The run's row in the history, made when it started.
    started: Option<i64>,
    otel: Option<String>,
    info: crate::otel::RunInfo,
}

impl PendingRecord {
    fn keep(self) -> Option<String> {
        keep_record(
            self.recorder,
            &self.outcome,
            self.wall_ms,
            self.history.as_deref(),
            self.started,
            self.otel.as_deref(),
            &self.info,
        )
    }
}

/// The run's record as it starts. With the history on, the run goes into it at once and the
/// record is its journal (the `--record` file when there is one, else a file beside the
/// history), so a killed run can be resumed; with the history off, a `--record` file, or a
/// temporary record for an OpenTelemetry export. A history that cannot take the run is a
/// warning: the run goes on without a journal. Returns the recorder and the run's row.
fn start_record(
    args: &RunArgs,
    text: &str,
    header: &crate::record::Header,
    history: Option<&std::path::Path>,
    otel: bool,
) -> Result<(Option<crate::record::Recorder>, Option<i64>), String> {
    use crate::record::{Invocation, Recorder};
    let invocation = || Invocation {
        argv: std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        cwd: std::env::current_dir().unwrap_or_default(),
        prompt: text.to_owned(),
    };
    let record_file = args
        .record
        .as_deref()
        .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()));
    if let Some(db) = history {
        let begun = crate::history::History::open(db).and_then(|mut h| {
            let (id, journal) = h.begin(header, record_file.as_deref())?;
            let recorder = match &record_file {
                Some(path) => {
                    Recorder::create(path, header).and_then(|r| r.journaled(&invocation(), false))
                }
                None => Recorder::journal(&journal, header, &invocation()),
            };
            match recorder {
                Ok(recorder) => Ok((recorder, id)),
                Err(e) => {
                    // No journal: the row made for it goes (the run is added when it ends).
                    let _ = h.forget(id);
                    Err(e)
                }
            }
        });
        match begun {
            Ok((recorder, id)) => return Ok((Some(recorder), Some(id))),
            Err(e) => crate::ui::print_line(&format!(
                "warning: {e} (the run goes on, and cannot be resumed if it is killed)"
            )),
        }
    }
    let recorder = match &args.record {
        Some(path) => Some(Recorder::create(path, header)?),
        None if history.is_some() || otel => Some(Recorder::temporary(header)?),
        None => None,
    };
    Ok((recorder, None))
}

/// What a person is told to do about a failure, when the Host can tell.
/// The `hint:` lines on stderr, secrets taken out.
fn print_hints(args: &RunArgs, finished: &Finished) {
    let no_args = args.arg.is_empty() && args.run_args.is_none();
    for hint in hints(args.prompt_path(), no_args, finished) {
        errln!(
            "{} {}",
            crate::ui::paint("hint:", crate::ui::Tone::Hint),
            promptforge_harness::secrets::redact(&hint)
        );
    }
}

fn hints(path: &std::path::Path, no_args: bool, finished: &Finished) -> Vec<String> {
    let Outcome::Failed(err) = &finished.outcome else {
        return Vec::new();
    };
    let mut hints = Vec::new();
    let message = err.message.as_str();
    if let Some(prompt) = &finished.prompt {
        hints.extend(prompt_hints(path, prompt, err));
        // Chapter 06: a run given no arguments runs anyway (`args:` is never enforced), so a
        // prompt that needs them fails somewhere inside; say what it takes.
        let required: Vec<String> = prompt
            .frontmatter
            .args
            .args
            .iter()
            .filter(|a| a.is_required())
            .map(|a| format!("{} ({})", a.name, a.ty.as_str()))
            .collect();
        if no_args && !required.is_empty() && err.kind == RunErrorKind::Lua {
            hints.push(format!(
                "the run was given no arguments, and this prompt declares required args: {}; \
                 pass them as --arg NAME=VALUE (or --args JSON); `promptforge describe {}` lists them",
                required.join(", "),
                path.display()
            ));
        }
    }
    if err.kind == RunErrorKind::Binding
        && message.starts_with(promptforge_protocol::errors::BINDING_REQUIRED)
    {
        // The prompt runs a round with no role selected: a --model cannot fix that.
        hints.push(
            "a model round ran with no model role selected: call `models.use('ROLE')` in the \
             section or `models.default('ROLE')` in the H1 body first, with ROLE declared \
             under `models:` in the frontmatter"
                .to_owned(),
        );
    }
    if finished.model.is_none()
        && (message.contains("is not a bound model role")
            || message.contains("model access is turned off or not configured"))
    {
        hints.push(
            "no model is selected: pass --model ID (a catalog id, or a quick id such as \
             openai:gpt-4.1 or ollama:qwen3:8b), or set `default = \"ID\"` in promptforge.toml; \
             `promptforge models` lists what is configured"
                .to_owned(),
        );
    }
    if message.contains("needs promptforge/input-broker") {
        hints.push(
            "this prompt asks the operator: pass answers with --input TEXT (repeatable), or run \
             it from a terminal"
                .to_owned(),
        );
    }
    for line in message.lines() {
        if let Some(server) = line
            .strip_prefix("- missing required Plugin: mcp/")
            .filter(|name| !name.contains('/'))
        {
            hints.push(format!(
                "mcp/{server} is an MCP server of the Host's: add a [mcp.servers.{server}] table with its `command` or `url` to promptforge.toml (see docs/mcp.md)"
            ));
        }
    }
    if err.kind == RunErrorKind::Completion {
        if let Some(detail) = &finished.diagnosis.detail {
            hints.push(detail.clone());
        }
        if let Some((status, said)) = &finished.diagnosis.server_message {
            hints.push(format!("the model server answered {status}: {said}"));
        }
    }
    hints
}

/// Hints that point into the prompt: where a missing placeholder is (the failure is raised
/// where the block reads `prose`), and which roles exist when a label names none.
fn prompt_hints(path: &std::path::Path, prompt: &Prompt, err: &RunError) -> Vec<String> {
    let mut hints = Vec::new();
    let failing_line = crate::source::run_failure_location(err).map(|(line, _)| line);
    if let Some((line, column, placeholder)) =
        crate::source::placeholder_site(prompt, &err.message, failing_line)
    {
        hints.push(format!(
            "the placeholder {placeholder} is at {}:{line}:{column}",
            path.display()
        ));
    }
    if let Some(label) = crate::source::unbound_role(&err.message) {
        let declared: Vec<&str> = prompt
            .frontmatter
            .models
            .iter()
            .map(|role| role.label.as_str())
            .collect();
        if declared.is_empty() {
            hints.push(format!(
                "this prompt declares no model roles; add `{label}` under `models:` in its frontmatter"
            ));
        } else if !declared.contains(&label) {
            hints.push(format!(
                "`{label}` is not declared; the prompt's model roles: {}",
                declared.join(", ")
            ));
        }
    }
    hints
}

fn report(args: &RunArgs, finished: &Finished, verbose: u8) -> ExitCode {
    let outcome = &finished.outcome;
    if args.json || args.events {
        match serde_json::to_string(&outcome_json(outcome)) {
            Ok(line) => outln!("{line}"),
            Err(e) => {
                errln!("error: cannot encode the outcome: {e}");
                return ExitCode::from(1);
            }
        }
        // stdout holds only the outcome, with the spec's fixed message; what the Host knows
        // beyond it (the URL tried, the variable it came from) still goes to stderr.
        if matches!(outcome, Outcome::Failed(_)) {
            print_hints(args, finished);
        }
    } else {
        if let Some(summary) = &finished.summary {
            errln!("{summary}");
        }
        match outcome {
            Outcome::Completed(result) => crate::report::print_result(result),
            Outcome::Cancelled => errln!("cancelled"),
            Outcome::Failed(err) => {
                let message = promptforge_harness::secrets::redact(&err.message);
                errln!(
                    "{}",
                    crate::source::run_failure_line(args.prompt_path(), err, &message)
                );
                print_hints(args, finished);
                // A model server's failure is told by the lines above; the Lua stack that
                // waited on it adds nothing, so it is not offered (`-v` still prints it).
                let from_the_model =
                    err.kind == RunErrorKind::Completion || finished.diagnosis.infrastructure;
                match (&err.traceback, verbose) {
                    (Some(traceback), 1..) => errln!("{traceback}"),
                    (Some(_), 0) if !from_the_model => errln!("(-v shows the Lua traceback)"),
                    _ => {}
                }
            }
        }
    }
    exit_code(outcome)
}

/// How long a cancelled run may take to unwind before the process ends it.
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// The last resort behind a cancel: the engine stops a run at its next Lua instruction or
/// library call, but one C call can run for as long as its input makes it (a catastrophic
/// pattern, say). If the run has not ended `CANCEL_GRACE` after Ctrl-C, report it cancelled
/// and exit, after any store operation in progress has finished (the store gate).
fn cancel_watchdog(finished: &AtomicBool, json: bool) {
    std::thread::sleep(CANCEL_GRACE);
    if finished.load(Ordering::Relaxed) {
        return;
    }
    let _gate = crate::host::STORE_GATE
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if finished.load(Ordering::Relaxed) {
        return;
    }
    crate::ui::clear_screen();
    // The run ends here, cancelled: its history row says so (its record is lost).
    crate::history::abandon_started();
    if json {
        outln!(r#"{{"outcome":"cancelled"}}"#);
    } else {
        errln!("cancelled");
    }
    std::process::exit(130);
}

/// `promptforge run PROMPT --help`: what the prompt takes, then the flags.
fn prompt_help(args: &RunArgs) -> ExitCode {
    use clap::CommandFactory;
    if let Some(path) = &args.prompt {
        match crate::declared::load(path) {
            Ok(description) => outln!("{}\n", description.text("")),
            Err(message) => errln!("error: {message}\n"),
        }
    }
    let mut command = crate::Cli::command();
    command.build();
    let help = command
        .find_subcommand_mut("run")
        .map(|run| run.render_long_help().to_string())
        .unwrap_or_default();
    outln!("{help}");
    ExitCode::SUCCESS
}

pub fn run(args: &RunArgs, ui: Ui) -> ExitCode {
    if args.help {
        return prompt_help(args);
    }
    if args.watch {
        if args.prompt_path() == std::path::Path::new("-") {
            errln!("error: --watch needs a prompt file to watch, not `-`");
            return ExitCode::from(2);
        }
        return watch(args, ui);
    }
    if args.resume.is_none()
        && args.prompt_path() == std::path::Path::new("-")
        && args.run_args.as_deref() == Some("-")
    {
        errln!(
            "error: --args -: stdin already carries the prompt (`run -`); pass the arguments with --args STRING or --arg"
        );
        return ExitCode::from(2);
    }
    // A resumed run runs the text the killed one ran.
    let read = match &args.resume {
        Some(resume) => Ok(resume.invocation.prompt.clone()),
        None => read_prompt(args.prompt_path()),
    };
    let text = match read {
        Ok(text) => text,
        Err(message) => {
            errln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let ctx = match context(args, cancel.clone()) {
        Ok(ctx) => ctx,
        Err(message) => {
            errln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    // Ctrl-C cancels the run cleanly: the engine polls the flag from every coroutine, and the
    // Host's loop wakes to end the run and drop the work in flight.
    let (tx, rx) = channel();
    let (flag, wake) = (cancel.clone(), tx.clone());
    let finished = Arc::new(AtomicBool::new(false));
    let (done, json) = (finished.clone(), args.json || args.events);
    if let Err(e) = ctrlc::set_handler(move || {
        flag.store(true, Ordering::Relaxed);
        let _ = wake.send(HostMessage::Wake);
        cancel_watchdog(&done, json);
    }) {
        errln!("warning: cannot install the Ctrl-C handler: {e}");
    }
    let outcome = execute(args, &text, ctx, &ui, (tx, rx));
    // Holding the gate while the outcome is reported: the watchdog either ended the process
    // before this point or sees the run finished, so one outcome is ever printed.
    let _gate = crate::host::STORE_GATE
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    finished.store(true, Ordering::Relaxed);
    match outcome {
        Ok(mut finished) => {
            let code = report(args, &finished, ui.verbose);
            // The result is out (and flushed) before the run is written to the history.
            let _ = std::io::Write::flush(&mut std::io::stdout());
            if let Some(record) = finished.record.take()
                && let Some(failed) = record.keep()
            {
                // The record the user asked for is not there: that is a failure.
                errln!("error: {failed}");
                return if code == ExitCode::SUCCESS {
                    ExitCode::FAILURE
                } else {
                    code
                };
            }
            code
        }
        Err(message) => {
            errln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

/// How often `--watch` looks at the files it watches.
const WATCH_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// How long the files must stay unchanged before `--watch` runs again (an editor's save is
/// often several writes).
const WATCH_DEBOUNCE: std::time::Duration = std::time::Duration::from_millis(300);

/// The files a run reads: the prompt, its `--input-file`, the `--script` and `--web-script`
/// files, and the project's `promptforge.toml` (the nearest from the working directory up, or
/// the one that would be created there).
fn watched_files(args: &RunArgs) -> Vec<PathBuf> {
    let mut files = vec![args.prompt_path().to_path_buf()];
    files.extend(args.input_file.clone());
    files.extend(args.models.script.clone());
    files.extend(args.models.web_script.clone());
    if let Ok(cwd) = std::env::current_dir() {
        let project = cwd
            .ancestors()
            .map(|dir| dir.join("promptforge.toml"))
            .find(|file| file.is_file())
            .unwrap_or_else(|| cwd.join("promptforge.toml"));
        files.push(project);
    }
    files
}

/// What the watched files look like now: each one's modification time and size, or none.
fn stamp(files: &[PathBuf]) -> Vec<Option<(std::time::SystemTime, u64)>> {
    files
        .iter()
        .map(|file| {
            std::fs::metadata(file)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        })
        .collect()
}

/// `run --watch`: run, show the result and what changed since the last run, wait for a
/// watched file to change (and settle), and run again, until Ctrl-C. The response cache is
/// on, so only rounds whose request changed reach the model. A file that does not parse shows
/// its problems and the loop waits for the next save.
fn watch(args: &RunArgs, ui: Ui) -> ExitCode {
    // One Ctrl-C handler for the whole loop: it cancels the run in flight and ends the loop.
    let stop = Arc::new(AtomicBool::new(false));
    type Current = (
        Arc<AtomicBool>,
        tokio::sync::mpsc::UnboundedSender<HostMessage>,
    );
    let current: Arc<std::sync::Mutex<Option<Current>>> = Arc::default();
    {
        let (stop, current) = (stop.clone(), current.clone());
        if let Err(e) = ctrlc::set_handler(move || {
            stop.store(true, Ordering::Relaxed);
            if let Some((cancel, wake)) = &*current.lock().unwrap_or_else(|e| e.into_inner()) {
                cancel.store(true, Ordering::Relaxed);
                let _ = wake.send(HostMessage::Wake);
            }
        }) {
            errln!("warning: cannot install the Ctrl-C handler: {e}");
        }
    }
    let files = watched_files(args);
    // One seed for every run of the loop, so a prompt whose requests depend on it (the
    // untrusted envelope's nonce, `math.random`) asks the same again and the cache answers.
    let seed = args.seed.unwrap_or_else(os_seed);
    // And one start instant (`sys.when`), for the same reason.
    let mut start_ms: Option<i64> = None;
    let mut last_result: Option<String> = None;
    let mut n = 0u64;
    loop {
        n += 1;
        let seen = stamp(&files);
        errln!(
            "{}",
            crate::ui::paint(&format!("── run {n} ──"), crate::ui::Tone::Note)
        );
        match read_prompt(args.prompt_path()) {
            Err(message) => errln!("error: {message}"),
            Ok(text) => {
                let cancel = Arc::new(AtomicBool::new(false));
                match context(args, cancel.clone()) {
                    Err(message) => errln!("error: {message}"),
                    Ok(mut ctx) => {
                        ctx.seed = seed;
                        ctx.start_ms = *start_ms.get_or_insert(ctx.start_ms);
                        let (tx, rx) = channel();
                        *current.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some((cancel.clone(), tx.clone()));
                        // A Ctrl-C that came before the run could be told.
                        if stop.load(Ordering::Relaxed) {
                            cancel.store(true, Ordering::Relaxed);
                        }
                        let outcome = execute(args, &text, ctx, &ui, (tx, rx));
                        *current.lock().unwrap_or_else(|e| e.into_inner()) = None;
                        match outcome {
                            Ok(mut finished) => {
                                report(args, &finished, ui.verbose);
                                let _ = std::io::Write::flush(&mut std::io::stdout());
                                if let Some(record) = finished.record.take() {
                                    let _ = record.keep();
                                }
                                if let Outcome::Completed(result) = &finished.outcome {
                                    show_change(last_result.as_deref(), result);
                                    last_result = Some(result.clone());
                                }
                            }
                            Err(message) => errln!("error: {message}"),
                        }
                    }
                }
            }
        }
        if stop.load(Ordering::Relaxed) {
            return ExitCode::from(130);
        }
        errln!(
            "watching {} for changes; Ctrl-C ends",
            crate::ui::plural(files.len() as u64, "file")
        );
        // Wait for a change, then for the files to settle.
        let mut settled = seen;
        let mut changed_at: Option<std::time::Instant> = None;
        loop {
            std::thread::sleep(WATCH_POLL);
            if stop.load(Ordering::Relaxed) {
                return ExitCode::from(130);
            }
            let now = stamp(&files);
            if now != settled {
                settled = now;
                changed_at = Some(std::time::Instant::now());
            } else if changed_at.is_some_and(|at| at.elapsed() >= WATCH_DEBOUNCE) {
                break;
            }
        }
    }
}

/// What changed in the result since the last run, as a short line diff on stderr.
fn show_change(before: Option<&str>, now: &str) {
    let Some(before) = before else {
        return;
    };
    if before == now {
        errln!("(the result is unchanged since the last run)");
        return;
    }
    errln!("changed since the last run:");
    let diff = similar::TextDiff::from_lines(before, now);
    for change in diff.iter_all_changes() {
        let (sign, tone) = match change.tag() {
            similar::ChangeTag::Delete => ("-", Some(crate::ui::Tone::Bad)),
            similar::ChangeTag::Insert => ("+", Some(crate::ui::Tone::Good)),
            similar::ChangeTag::Equal => continue,
        };
        let line = format!("{sign} {}", change.value().trim_end_matches('\n'));
        match tone {
            Some(tone) => errln!("{}", crate::ui::paint(&line, tone)),
            None => errln!("{line}"),
        }
    }
}

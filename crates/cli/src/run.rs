//! `promptforge run PROMPT`: run a prompt and report its one outcome.
//!
//! With `--json`, stdout holds exactly one JSON object (the outcome, in the shape of the
//! conformance contract); without it, the result goes to stdout and a failure to stderr as
//! `error[KIND]: message` with the prompt location. Exit status: 0 completed, 1 failed,
//! 130 cancelled, 2 usage error before any run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use promptforge_engine::store_path::{StoreAnswer, StoreOp};
use promptforge_engine::{Event, Outcome, Run, RunContext, RunError, RunErrorKind};
use promptforge_harness::model::{Catalog, Environment, ScriptedModel};
use promptforge_harness::store::{Store, collect_output_file, place_input_file};
use promptforge_harness::web::{RealNetwork, ScriptedNetwork, WebPlugin};

use crate::host::{CurrentModel, Host, HostMessage, Operator, channel};
use promptforge_engine::run::USER_INPUT_PLUGIN;
use promptforge_engine::{EventKind, TaskEnding};
use promptforge_engine::{PluginInfo, ToolInfo};
use promptforge_syntax::Prompt;
use serde::Serialize;
use std::io::IsTerminal;

use crate::source::read_prompt;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The prompt file to run.
    #[arg(value_name = "PROMPT")]
    prompt: PathBuf,
    /// The run's raw argument string (`args`).
    #[arg(long = "args", value_name = "STRING")]
    run_args: Option<String>,
    /// Print exactly one JSON object, the run's outcome, on stdout.
    #[arg(long)]
    json: bool,
    /// The run's seed (unsigned 64-bit); default: from the OS.
    #[arg(long)]
    seed: Option<u64>,
    /// The run's start instant, RFC 3339 (`sys.when`); default: now.
    #[arg(long, value_name = "RFC3339")]
    when: Option<String>,
    /// Register the web Plugin over a scripted network and search backend (the conformance
    /// `--web-script` format) instead of the real network.
    #[arg(long, value_name = "FILE")]
    web_script: Option<PathBuf>,
    /// Answer every model round from a scripted model file.
    #[arg(long, value_name = "FILE", conflicts_with = "model")]
    script: Option<PathBuf>,
    /// The current model: a catalog id or a quick id such as `openai:gpt-4.1`
    /// (default: the catalog's `default`, if any). See `promptforge models`.
    #[arg(long, value_name = "ID")]
    model: Option<String>,
    /// A JSON object file: the Host-state snapshot that `ui()` returns.
    #[arg(long, value_name = "FILE")]
    snapshot: Option<PathBuf>,
    /// An operator answer for the input broker (repeatable, in order).
    #[arg(long = "input", value_name = "TEXT")]
    inputs: Vec<String>,
    /// The run's store is this directory on disk (default: a fresh directory under the
    /// system temp folder, reported on stderr and kept after the run).
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
    /// Place this host file in the store as the prompt's declared `input:` file.
    #[arg(long, value_name = "PATH")]
    input_file: Option<PathBuf>,
    /// Copy the prompt's declared `output:` file here after the run.
    #[arg(long, value_name = "PATH")]
    output_file: Option<PathBuf>,
    /// Print every event of the run (lifecycle reports and `log` checkpoints) on stderr, one
    /// JSON object a line. Without it, `log` checkpoints show on stderr unless `--json`.
    #[arg(long)]
    events: bool,
    /// The most tasks (fanout arms included) that run at once; a prompt can only lower it
    /// with `tasks.concurrency`.
    #[arg(long, value_name = "N", default_value_t = promptforge_engine::run::DEFAULT_CONCURRENCY,
          value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
}

/// The outcome object of the CLI contract.
#[derive(Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
enum OutcomeJson {
    Completed { result: String },
    Cancelled,
    Failed { error: ErrorJson },
}

#[derive(Debug, Serialize)]
struct ErrorJson {
    kind: String,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    parse_kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    column: Option<u32>,
}

fn outcome_json(outcome: &Outcome) -> OutcomeJson {
    match outcome {
        Outcome::Completed(result) => OutcomeJson::Completed {
            result: result.clone(),
        },
        Outcome::Cancelled => OutcomeJson::Cancelled,
        Outcome::Failed(err) => OutcomeJson::Failed {
            error: ErrorJson {
                kind: err.kind.to_string(),
                message: err.message.clone(),
                parse_kind: err.parse_kind.map(|k| k.to_string()),
                line: err.line,
                column: err.column,
            },
        },
    }
}

/// The run's start instant in milliseconds since the epoch: `--when`, or now.
fn start_instant(args: &RunArgs) -> Result<i64, String> {
    match &args.when {
        Some(text) => chrono::DateTime::parse_from_rfc3339(text)
            .map(|t| t.timestamp_millis())
            .map_err(|e| format!("--when {text:?} is not an RFC 3339 instant: {e}")),
        None => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_err(|e| format!("the system clock is before 1970: {e}"))?;
            i64::try_from(now.as_millis())
                .map_err(|e| format!("the system clock is out of range: {e}"))
        }
    }
}

/// A seed from the OS when `--seed` is not given: std's `RandomState` is keyed from the
/// operating system's randomness, which is all a seed needs.
fn os_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0x5eed);
    hasher.finish()
}

fn read_snapshot(path: &std::path::Path) -> Result<serde_json::Value, String> {
    let text = promptforge_harness::limits::read_capped_text(
        path,
        promptforge_harness::limits::SNAPSHOT_FILE_CAP,
    )
    .map_err(|e| format!("--snapshot: {e}"))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("--snapshot {} is not JSON: {e}", path.display()))?;
    if !value.is_object() {
        return Err(format!(
            "--snapshot {} must hold a JSON object",
            path.display()
        ));
    }
    Ok(value)
}

/// Build the run's context from the flags (usage errors before any run).
fn context(args: &RunArgs, cancel: Arc<AtomicBool>) -> Result<RunContext, String> {
    let start_ms = start_instant(args)?;
    let mut ctx = RunContext::new(args.seed.unwrap_or_else(os_seed), start_ms);
    ctx.args = args.run_args.clone();
    ctx.snapshot = args.snapshot.as_deref().map(read_snapshot).transpose()?;
    ctx.cancel = cancel;
    ctx.concurrency = args.concurrency;
    Ok(ctx)
}

/// The config files (the model catalog and its `[search]` table), read at most once per run
/// and only when something needs them (`--script` with `--web-script` needs nothing).
#[derive(Debug, Default)]
struct Config(std::cell::OnceCell<Result<Catalog, String>>);

impl Config {
    fn catalog(&self) -> Result<&Catalog, String> {
        self.0
            .get_or_init(|| {
                let cwd = std::env::current_dir()
                    .map_err(|e| format!("cannot read the working directory: {e}"))?;
                Catalog::load_standard(&cwd).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// The Host's current model: the scripted model, `--model`, or the catalog's default.
fn current_model(args: &RunArgs, config: &Config) -> Result<Option<CurrentModel>, String> {
    if let Some(path) = &args.script {
        let scripted = ScriptedModel::load(path).map_err(|e| e.to_string())?;
        let Some(description) = scripted.model().cloned() else {
            return Ok(None);
        };
        return Ok(Some(CurrentModel {
            description,
            provider: Arc::new(scripted),
        }));
    }
    let catalog = config.catalog()?;
    let id = match &args.model {
        Some(id) => id.clone(),
        None => match catalog.default_id() {
            Some(id) => id.to_owned(),
            None => return Ok(None),
        },
    };
    let resolved = catalog
        .resolve(&id, &Environment::Process)
        .map_err(|e| e.to_string())?;
    Ok(Some(CurrentModel {
        description: resolved.description,
        provider: resolved.provider,
    }))
}

/// The web Plugin: over the scripted network of `--web-script` (a script that cannot be read
/// is a usage error), else over the real network with the search backend of the config's
/// `[search]` table. Without a backend the Plugin reports the missing search provider, and a
/// setup problem (a bad `[search]` table, a key not set) its own line, each only to a prompt
/// that declares the Plugin.
fn web_plugin(args: &RunArgs, config: &Config) -> Result<WebPlugin, String> {
    if let Some(path) = &args.web_script {
        let network = ScriptedNetwork::load(path)
            .map_err(|e| format!("--web-script {}: {e}", path.display()))?;
        let search = network.search_backend();
        return Ok(WebPlugin::new(Arc::new(network), search));
    }
    let real = || -> Result<WebPlugin, String> {
        let search = config
            .catalog()?
            .search_backend(&Environment::Process)
            .map_err(|e| e.to_string())?;
        Ok(WebPlugin::new(Arc::new(RealNetwork::new()?), search))
    };
    Ok(real().unwrap_or_else(WebPlugin::unavailable))
}

/// Show an event on stderr: every event as a JSON line with `--events`; otherwise the
/// author's `log` checkpoints as `[section] message`, unless stdout carries `--json`.
fn show_event(event: &Event, all: bool, json: bool) {
    if all {
        eprintln!("{}", event_json(event));
    } else if let (EventKind::Log { section, message }, false) = (&event.kind, json) {
        eprintln!("[{section}] {message}");
    }
}

fn event_json(event: &Event) -> serde_json::Value {
    use serde_json::json;
    let mut value = match &event.kind {
        EventKind::SectionStarted { section, id } => {
            json!({"event": "section_started", "section": section, "id": id})
        }
        EventKind::SharedLoadStarted { section } => {
            json!({"event": "shared_load_started", "section": section})
        }
        EventKind::SharedLoadSucceeded { section } => {
            json!({"event": "shared_load_succeeded", "section": section})
        }
        EventKind::SharedLoadFailed { section } => {
            json!({"event": "shared_load_failed", "section": section})
        }
        EventKind::BlockStarted { section, label } => {
            json!({"event": "block_started", "section": section, "block": label})
        }
        EventKind::BlockSucceeded { section, label } => {
            json!({"event": "block_succeeded", "section": section, "block": label})
        }
        EventKind::BlockFailed { section } => json!({"event": "block_failed", "section": section}),
        EventKind::Log { section, message } => {
            json!({"event": "log", "section": section, "message": message})
        }
        EventKind::TeardownStarted { section } => {
            json!({"event": "teardown_started", "section": section})
        }
        EventKind::TeardownSucceeded { section } => {
            json!({"event": "teardown_succeeded", "section": section})
        }
        EventKind::SectionFinished { section } => {
            json!({"event": "section_finished", "section": section})
        }
        EventKind::TaskSpawned { id, target, origin } => json!({
            "event": "task_spawned", "id": id, "target": target, "origin": origin.as_str()
        }),
        EventKind::TaskStarted => json!({"event": "task_started"}),
        EventKind::TaskEnded { ending } => {
            let (state, reason) = match ending {
                TaskEnding::Succeeded => ("succeeded", None),
                TaskEnding::Failed => ("failed", None),
                TaskEnding::Cancelled => ("cancelled", None),
                TaskEnding::Abandoned(reason) => ("abandoned", Some(reason.as_str())),
            };
            let mut value = json!({"event": "task_ended", "ending": state});
            if let (Some(reason), Some(map)) = (reason, value.as_object_mut()) {
                map.insert("reason".into(), json!(reason));
            }
            value
        }
        EventKind::RunEnded { outcome } => json!({"event": "run_ended", "outcome": match outcome {
            Outcome::Completed(_) => "completed",
            Outcome::Cancelled => "cancelled",
            Outcome::Failed(_) => "failed",
        }}),
    };
    if let Some(map) = value.as_object_mut() {
        map.insert("task".into(), json!(event.task));
    }
    value
}

/// The run's store: `--store DIR`, or a fresh directory under the system temp folder.
fn open_store(args: &RunArgs) -> Result<Store, String> {
    let dir = match &args.store {
        Some(dir) => dir.clone(),
        None => {
            let dir = tempfile::Builder::new()
                .prefix("promptforge-store-")
                .tempdir()
                .map_err(|e| format!("cannot create a store directory: {e}"))?
                .keep();
            eprintln!("store: {}", dir.display());
            dir
        }
    };
    Store::directory(&dir).map_err(|e| format!("cannot open the store at {}: {e}", dir.display()))
}

fn execute(
    args: &RunArgs,
    text: &str,
    mut ctx: RunContext,
    messages: (
        tokio::sync::mpsc::UnboundedSender<HostMessage>,
        tokio::sync::mpsc::UnboundedReceiver<HostMessage>,
    ),
) -> Result<Outcome, String> {
    let prompt = match Prompt::parse(text) {
        Ok(prompt) => prompt,
        Err(err) => return Ok(Outcome::Failed(err.into())),
    };
    let config = Config::default();
    let model = current_model(args, &config)?;
    // A store that fails as the run starts fails the run with `Vfs` (chapter 16).
    let mut store = match open_store(args) {
        Ok(store) => store,
        Err(detail) => {
            eprintln!("error: {detail}");
            return Ok(Outcome::Failed(RunError::new(
                RunErrorKind::Vfs,
                "store operation failed",
            )));
        }
    };
    if let Some(decl) = &prompt.frontmatter.input {
        match &args.input_file {
            Some(file) => place_input_file(&mut store, &decl.path, file)
                .map_err(|e| format!("--input-file {}: {e}", file.display()))?,
            None => {
                // A store the Host seeded already may hold it; otherwise say what to pass.
                let present = store.perform(&StoreOp::Exists {
                    path: decl.path.clone(),
                });
                if !matches!(present, Ok(StoreAnswer::Bool(true))) {
                    return Err(format!(
                        "this prompt reads the input file `{}` ({}): pass it with --input-file PATH",
                        decl.path, decl.description
                    ));
                }
            }
        }
    }
    ctx.execution = prompt.frontmatter.name.clone();
    // A person at the terminal answers when they answer; answers given with --input (or no
    // operator at all) come at once, in the order the run asks.
    ctx.host.model = model.as_ref().map(|m| m.description.engine_info());
    // The operator: `--input` answers, else a person at the terminal, else nobody.
    let operator = if !args.inputs.is_empty() {
        Operator::Scripted(args.inputs.iter().cloned().collect())
    } else if std::io::stdin().is_terminal() {
        Operator::Terminal
    } else {
        Operator::Nobody
    };
    ctx.host.live_operator = matches!(operator, Operator::Terminal);
    ctx.host.plugins.push(PluginInfo {
        id: USER_INPUT_PLUGIN.to_owned(),
        tools: vec![ToolInfo::new(
            "ask",
            "Ask the operator: returns their next message. Takes no arguments.",
        )],
        conflicts: Vec::new(),
        activation_failure: (!operator.connected()).then(|| {
            format!(
                "{USER_INPUT_PLUGIN} needs promptforge/input-broker, and this host provides none"
            )
        }),
    });
    let web = web_plugin(args, &config)?;
    ctx.host.plugins.push(web.info());
    let output = prompt.frontmatter.output.clone();
    let mut host = Host::new(
        model,
        Some(Arc::new(web)),
        store,
        operator,
        ctx.cancel.clone(),
        messages,
    )?
    .json_events(args.events);
    let mut run = Run::new(Arc::new(prompt), ctx);
    let (events, json) = (args.events, args.json);
    let outcome = host.drive(&mut run, &mut |event| show_event(event, events, json));
    if let (Some(decl), Some(file)) = (&output, &args.output_file) {
        if let Err(e) = collect_output_file(host.store(), &decl.path, file) {
            eprintln!(
                "warning: cannot collect the output file `{}`: {e}",
                decl.path
            );
        }
    } else if let Some(decl) = &output {
        eprintln!(
            "output file `{}` is in the store (pass --output-file PATH to copy it out)",
            decl.path
        );
    }
    Ok(outcome)
}

fn report(args: &RunArgs, outcome: &Outcome) -> ExitCode {
    if args.json {
        match serde_json::to_string(&outcome_json(outcome)) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("error: cannot encode the outcome: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        match outcome {
            Outcome::Completed(result) => {
                // The result is exact; on a terminal, end the line so the prompt comes back clean.
                use std::io::IsTerminal;
                if std::io::stdout().is_terminal() && !result.ends_with('\n') {
                    println!("{result}");
                } else {
                    print!("{result}");
                }
            }
            Outcome::Cancelled => eprintln!("cancelled"),
            Outcome::Failed(err) => {
                let kind = match err.parse_kind {
                    Some(parse_kind) => format!("{}/{parse_kind}", err.kind),
                    None => err.kind.to_string(),
                };
                eprintln!("error[{kind}]: {}", err.message);
                if let Some(traceback) = &err.traceback {
                    eprintln!("{traceback}");
                }
                if let Some(line) = err.line {
                    eprintln!(
                        "  --> {}:{line}:{}",
                        args.prompt.display(),
                        err.column.unwrap_or(1)
                    );
                }
            }
        }
    }
    match outcome {
        Outcome::Completed(_) => ExitCode::SUCCESS,
        Outcome::Failed(_) => ExitCode::from(1),
        Outcome::Cancelled => ExitCode::from(130),
    }
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
    if json {
        println!(r#"{{"outcome":"cancelled"}}"#);
    } else {
        eprintln!("cancelled");
    }
    std::process::exit(130);
}

pub fn run(args: &RunArgs) -> ExitCode {
    let text = match read_prompt(&args.prompt) {
        Ok(text) => text,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let ctx = match context(args, cancel.clone()) {
        Ok(ctx) => ctx,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    // Ctrl-C cancels the run cleanly: the engine polls the flag from every coroutine, and the
    // Host's loop wakes to end the run and drop the work in flight.
    let (tx, rx) = channel();
    let (flag, wake) = (cancel.clone(), tx.clone());
    let finished = Arc::new(AtomicBool::new(false));
    let (done, json) = (finished.clone(), args.json);
    if let Err(e) = ctrlc::set_handler(move || {
        flag.store(true, Ordering::Relaxed);
        let _ = wake.send(HostMessage::Wake);
        cancel_watchdog(&done, json);
    }) {
        eprintln!("warning: cannot install the Ctrl-C handler: {e}");
    }
    let outcome = execute(args, &text, ctx, (tx, rx));
    // Holding the gate while the outcome is reported: the watchdog either ended the process
    // before this point or sees the run finished, so one outcome is ever printed.
    let _gate = crate::host::STORE_GATE
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    finished.store(true, Ordering::Relaxed);
    match outcome {
        Ok(outcome) => report(args, &outcome),
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

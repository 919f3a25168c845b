//! `promptforge run PROMPT`: run a prompt and report its one outcome.
//!
//! With `--json`, stdout holds exactly one JSON object (the outcome, in the shape of the
//! conformance contract); with `--events`, stdout holds JSON lines only: every event, the
//! Host's notes, and the outcome last. Otherwise the result goes to stdout and a failure to
//! stderr as `error[KIND]: message` with the prompt location and a hint where the Host can
//! tell what to do. On a terminal a live progress display and a summary line go to stderr.
//! Exit status: 0 completed, 1 failed, 130 cancelled, 2 usage error before any run.

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

use crate::host::{CurrentModel, Diagnosis, Host, HostMessage, Notes, Operator, channel};
use promptforge_engine::run::USER_INPUT_PLUGIN;
use promptforge_engine::{EventKind, TaskEnding};
use promptforge_engine::{PluginInfo, ToolInfo};
use promptforge_syntax::Prompt;
use serde::Serialize;
use std::io::IsTerminal;

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
    /// system temp folder, removed after the run unless it failed or --keep-store is given).
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
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
}

impl RunArgs {
    fn prompt_path(&self) -> &std::path::Path {
        self.prompt.as_deref().unwrap_or(std::path::Path::new("-"))
    }
}

/// The outcome object of the CLI contract.
#[derive(Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub(crate) enum OutcomeJson {
    Completed { result: String },
    Cancelled,
    Failed { error: ErrorJson },
}

#[derive(Debug, Serialize)]
pub(crate) struct ErrorJson {
    kind: String,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    parse_kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    column: Option<u32>,
}

pub(crate) fn outcome_json(outcome: &Outcome) -> OutcomeJson {
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
pub(crate) fn start_instant(when: Option<&str>) -> Result<i64, String> {
    match when {
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
pub(crate) fn os_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0x5eed);
    hasher.finish()
}

pub(crate) fn read_snapshot(path: &std::path::Path) -> Result<serde_json::Value, String> {
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

/// The argument string: `--args` (`-` reads stdin), or `--arg` pairs typed by the prompt's
/// declaration.
fn argument_string(args: &RunArgs, prompt: &Prompt) -> Result<Option<String>, String> {
    if !args.arg.is_empty() {
        return crate::describe::structured_args(&prompt.frontmatter.args, &args.arg).map(Some);
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
    let start_ms = start_instant(args.when.as_deref())?;
    let mut ctx = RunContext::new(args.seed.unwrap_or_else(os_seed), start_ms);
    ctx.snapshot = args.snapshot.as_deref().map(read_snapshot).transpose()?;
    ctx.cancel = cancel;
    ctx.concurrency = args.concurrency;
    Ok(ctx)
}

/// The config files (the model catalog and its `[search]` table), read at most once per run
/// and only when something needs them (`--script` with `--web-script` needs nothing).
#[derive(Debug, Default)]
pub(crate) struct Config(std::cell::OnceCell<Result<Catalog, String>>);

impl Config {
    pub(crate) fn catalog(&self) -> Result<&Catalog, String> {
        self.0
            .get_or_init(|| {
                let cwd = std::env::current_dir()
                    .map_err(|e| format!("cannot read the working directory: {e}"))?;
                Catalog::load_standard(&cwd).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The MCP Plugins of the config's `[mcp.servers]` tables, when the prompt declares one
    /// (`mcp/NAME`); a config that cannot be read then is an error, as for a model.
    pub(crate) fn mcp_plugins(
        &self,
        frontmatter: &promptforge_syntax::frontmatter::Frontmatter,
    ) -> Result<Option<Arc<promptforge_harness::mcp::McpPlugins>>, String> {
        let declares = frontmatter
            .plugins
            .iter()
            .any(|p| promptforge_harness::mcp::server_of_plugin(&p.id).is_some());
        if !declares {
            return Ok(None);
        }
        let servers = self.catalog()?.mcp_servers().clone();
        Ok(Some(Arc::new(promptforge_harness::mcp::McpPlugins::new(
            servers,
        ))))
    }
}

/// The Host's current model: the scripted model of `script`, the `model` id, or the
/// catalog's default.
pub(crate) fn current_model(
    script: Option<&std::path::Path>,
    model: Option<&str>,
    config: &Config,
) -> Result<Option<CurrentModel>, String> {
    if let Some(path) = script {
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
    let id = match model {
        Some(id) => id.to_owned(),
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
pub(crate) fn web_plugin(
    web_script: Option<&std::path::Path>,
    config: &Config,
) -> Result<WebPlugin, String> {
    if let Some(path) = web_script {
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

/// Tell the run which Plugins this Host offers: the input broker (when there is an operator)
/// and the web Plugin.
pub(crate) fn offer_plugins(ctx: &mut RunContext, operator: &Operator, web: &WebPlugin) {
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
    ctx.host.plugins.push(web.info());
}

/// Show an event: every event as a JSON line on stdout with `--events`; otherwise the
/// author's `log` checkpoints on stderr as `[section] message`, unless stdout carries `--json`.
fn show_event(event: &Event, all: bool, json: bool) {
    if all {
        outln!("{}", event_json(event));
    } else if let (EventKind::Log { section, message }, false) = (&event.kind, json) {
        crate::ui::print_line(&format!("[{section}] {message}"));
    }
}

pub(crate) fn event_json(event: &Event) -> serde_json::Value {
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

/// The run's store directory and whether it is a fresh one of ours (removed after the run
/// unless kept).
#[derive(Debug)]
pub(crate) struct StoreDir {
    pub(crate) path: PathBuf,
    pub(crate) fresh: bool,
}

/// The run's store: `store`, or a fresh directory under the system temp folder.
pub(crate) fn open_store(store: Option<&std::path::Path>) -> Result<(Store, StoreDir), String> {
    let dir = match store {
        Some(dir) => StoreDir {
            path: dir.to_path_buf(),
            fresh: false,
        },
        None => StoreDir {
            path: tempfile::Builder::new()
                .prefix("promptforge-store-")
                .tempdir()
                .map_err(|e| format!("cannot create a store directory: {e}"))?
                .keep(),
            fresh: true,
        },
    };
    let store = Store::directory(&dir.path)
        .map_err(|e| format!("cannot open the store at {}: {e}", dir.path.display()))?;
    Ok((store, dir))
}

/// A record's header for this run.
fn record_header(args: &RunArgs, text: &str, ctx: &RunContext) -> crate::record::Header {
    header_for(args.prompt_path(), text, ctx)
}

/// A record's header for a run of the prompt at `path`, whose text is `text`.
pub(crate) fn header_for(
    path: &std::path::Path,
    text: &str,
    ctx: &RunContext,
) -> crate::record::Header {
    crate::record::Header {
        record: "promptforge-run".to_owned(),
        version: crate::record::RECORD_VERSION,
        tool: concat!("promptforge ", env!("CARGO_PKG_VERSION")).to_owned(),
        prompt: crate::record::PromptId {
            // Absolute, so a replay from another folder finds the prompt.
            path: std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
            sha256: crate::record::sha256_hex(text),
        },
        seed: ctx.seed,
        when: chrono::DateTime::from_timestamp_millis(ctx.start_ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_default(),
        start_ms: ctx.start_ms,
        args: ctx.args.clone(),
        host: ctx.host.clone(),
        concurrency: ctx.concurrency,
        snapshot: ctx.snapshot.clone(),
    }
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
    };
    let parsed = Prompt::parse(text);
    ctx.args = match &parsed {
        Ok(prompt) => argument_string(args, prompt)?,
        Err(_) => args.run_args.clone().filter(|a| a != "-"),
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
    let config = Config::default();
    let model = current_model(args.script.as_deref(), args.model.as_deref(), &config)?;
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
    ctx.host.model = model.as_ref().map(|m| m.description.engine_info());
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
    let web = match web_plugin(args.web_script.as_deref(), &config) {
        Ok(web) => web,
        Err(e) => {
            tidy(&dir);
            return Err(e);
        }
    };
    offer_plugins(&mut ctx, &operator, &web);
    let output = prompt.frontmatter.output.clone();
    let notes = if args.events {
        Notes::JsonStdout
    } else {
        Notes::Stderr
    };
    let mut host = Host::new(
        model.clone(),
        Some(Arc::new(web)),
        store,
        operator,
        ctx.cancel.clone(),
        messages,
    )?
    .notes(notes)
    .progress(ui.progress && !args.json && !args.events);
    match config.mcp_plugins(&prompt.frontmatter) {
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
    if let Some(path) = &args.record {
        let header = record_header(args, text, &ctx);
        host = host.recorder(crate::record::Recorder::create(path, &header)?);
    } else if history.is_some() || otel.is_some() {
        let header = record_header(args, text, &ctx);
        host = host.recorder(crate::record::Recorder::temporary(&header)?);
    }
    let info = crate::otel::RunInfo {
        name: prompt.frontmatter.name.clone(),
        provider: model
            .as_ref()
            .map(|m| m.description.provider.as_str().to_owned()),
        model: model.as_ref().map(|m| m.description.model.clone()),
        started: std::time::SystemTime::now(),
    };
    let started = std::time::Instant::now();
    let mut run = Run::new(Arc::new(prompt), ctx);
    let (events, json) = (args.events, args.json);
    let outcome = host.drive(&mut run, &mut |event| show_event(event, events, json));
    // Kept once the outcome is reported: the history write and an OpenTelemetry export are
    // never on the way to the result.
    let record = host.take_recorder().map(|recorder| PendingRecord {
        recorder,
        outcome: outcome.clone(),
        wall_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        history,
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
    })
}

/// A finished run's record, kept after its outcome is reported.
struct PendingRecord {
    recorder: crate::record::Recorder,
    outcome: Outcome,
    wall_ms: u64,
    history: Option<std::path::PathBuf>,
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
            self.otel.as_deref(),
            &self.info,
        )
    }
}

/// Finish a run's record and keep it: exported to the OpenTelemetry endpoint when one is set,
/// and added to the run history when it is on. A failure to keep it in the history or export
/// it is a warning; a record file the user asked for (`--record`) that could not be written
/// is returned, for the command to fail on.
pub(crate) fn keep_record(
    recorder: crate::record::Recorder,
    outcome: &Outcome,
    wall_ms: u64,
    history: Option<&std::path::Path>,
    otel: Option<&str>,
    info: &crate::otel::RunInfo,
) -> Option<String> {
    let asked = recorder.is_file();
    let finished = match recorder.finish(outcome) {
        Ok(written) => Ok(written),
        Err(e) if asked => return Some(e),
        Err(e) => Err(e),
    };
    let kept = finished.and_then(|written| {
        let path = written.path();
        let open = || {
            std::fs::File::open(path)
                .map(std::io::BufReader::new)
                .map_err(|e| format!("{}: {e}", path.display()))
        };
        if let Some(url) = otel {
            let sent = std::fs::read(path)
                .map_err(|e| format!("{}: {e}", path.display()))
                .and_then(|bytes| crate::otel::export(url, &bytes, info));
            if let Err(e) = sent {
                crate::ui::print_line(&format!("warning: {e}"));
            }
        }
        match history {
            Some(db) => crate::history::History::open(db)?
                .add(open()?, wall_ms)
                .map(|_| ()),
            None => Ok(()),
        }
    });
    if let Err(e) = kept {
        crate::ui::print_line(&format!("warning: {e}"));
    }
    None
}

/// What a person is told to do about a failure, when the Host can tell.
/// The `hint:` lines on stderr, secrets taken out.
fn print_hints(finished: &Finished) {
    for hint in hints(finished) {
        errln!("hint: {}", promptforge_harness::secrets::redact(&hint));
    }
}

fn hints(finished: &Finished) -> Vec<String> {
    let Outcome::Failed(err) = &finished.outcome else {
        return Vec::new();
    };
    let mut hints = Vec::new();
    let message = err.message.as_str();
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
            print_hints(finished);
        }
    } else {
        if let Some(summary) = &finished.summary {
            errln!("{summary}");
        }
        match outcome {
            Outcome::Completed(result) => {
                // The result is exact; on a terminal, end the line so the prompt comes back clean.
                if std::io::stdout().is_terminal() && !result.ends_with('\n') {
                    outln!("{result}");
                } else {
                    out!("{result}");
                }
            }
            Outcome::Cancelled => errln!("cancelled"),
            Outcome::Failed(err) => {
                let kind = match err.parse_kind {
                    Some(parse_kind) => format!("{}/{parse_kind}", err.kind),
                    None => err.kind.to_string(),
                };
                errln!(
                    "error[{kind}]: {}",
                    promptforge_harness::secrets::redact(&err.message)
                );
                if let Some(line) = err.line {
                    errln!(
                        "  --> {}:{line}:{}",
                        args.prompt_path().display(),
                        err.column.unwrap_or(1)
                    );
                }
                print_hints(finished);
                match (&err.traceback, verbose) {
                    (Some(traceback), 1..) => errln!("{traceback}"),
                    (Some(_), 0) => errln!("(-v shows the Lua traceback)"),
                    (None, _) => {}
                }
            }
        }
    }
    exit_code(outcome)
}

/// A run's exit status: 0 completed, 1 failed, 130 cancelled.
pub(crate) fn exit_code(outcome: &Outcome) -> ExitCode {
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
        outln!(r#"{{"outcome":"cancelled"}}"#);
    } else {
        errln!("cancelled");
    }
    std::process::exit(130);
}

/// How the terminal is used: from the global flags and whether stderr is a terminal.
#[derive(Debug, Clone, Copy)]
pub struct Ui {
    /// Draw live progress (stderr is a terminal and `--quiet` is not given).
    pub progress: bool,
    /// `-v` count.
    pub verbose: u8,
}

/// `promptforge run PROMPT --help`: what the prompt takes, then the flags.
fn prompt_help(args: &RunArgs) -> ExitCode {
    use clap::CommandFactory;
    if let Some(path) = &args.prompt {
        match crate::describe::load(path) {
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
    let text = match read_prompt(args.prompt_path()) {
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

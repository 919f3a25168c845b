//! `promptforge mcp`: prompts as MCP tools for any agent (`mcp serve`), and the tools of the
//! MCP servers the config lists (`mcp tools NAME`).
//!
//! `mcp serve DIR...` is an MCP server (rmcp) over stdio, or streamable HTTP with `--http`.
//! Every prompt file found under the directories is a tool and an MCP prompt: a call runs the
//! prompt as `promptforge run` would (the server's model configuration, a memory store, no
//! operator), with its run recorded in the history; the result comes back as text (and as
//! structured content when it is a JSON object), a failed run as a tool error naming its run
//! error kind. A client's cancellation cancels the run; progress notifications report the
//! sections, tasks and model rounds. The files are watched: an edit, a new file or a removed
//! one changes the lists and tells every client (`notifications/tools/list_changed`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};
use promptforge_engine::{Outcome, Run, RunContext};
use promptforge_harness::mcp::McpPlugins;
use promptforge_harness::store::Store;
use promptforge_syntax::Prompt;
use promptforge_syntax::frontmatter::{ArgType, Frontmatter};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams, CompleteResult,
    CompletionInfo, ContentBlock, ErrorData, GetPromptRequestParams, GetPromptResponse,
    GetPromptResult, Implementation, JsonObject, ListPromptsResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, PromptArgument, PromptMessage, Reference,
    Role, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{Peer, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value as Json, json};

use crate::host::{Notes, Operator, channel};
use crate::session::{Config, ModelFlags, Session};

mod ask;

#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(subcommand)]
    command: McpCommand,
}

#[derive(Debug, Subcommand)]
enum McpCommand {
    /// Serve the prompt files under DIR... as MCP tools and prompts (stdio, or HTTP with --http).
    Serve(ServeArgs),
    /// List the tools of the MCP server [mcp.servers.NAME] of promptforge.toml, with the tool
    /// path each is bound by (`mcp/NAME/TOOL`).
    Tools(ToolsArgs),
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Directories (or single files) to find prompt files in; default: the working directory.
    #[arg(value_name = "DIR")]
    dirs: Vec<PathBuf>,
    /// Serve streamable HTTP at ADDR (endpoint /mcp) instead of stdio; ADDR defaults to
    /// 127.0.0.1:8808. A non-loopback address needs --token-env.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:8808")]
    http: Option<String>,
    /// Require `Authorization: Bearer TOKEN` on every HTTP request, TOKEN read from this
    /// environment variable.
    #[arg(long, value_name = "VAR", requires = "http")]
    token_env: Option<String>,
    /// Also accept HTTP requests a web page at this origin sends (`https://app.example`;
    /// repeatable). Requests with any other `Origin` header are refused; requests without one
    /// (agents, CLIs) and pages on this machine (`http://localhost:PORT`) are accepted.
    #[arg(long, value_name = "ORIGIN", requires = "http")]
    allow_origin: Vec<String>,
    /// What every call runs with (`--model` defaults to the config's `default`).
    #[command(flatten)]
    models: ModelFlags,
    /// Run every call with this seed (default: a fresh seed per call).
    #[arg(long)]
    seed: Option<u64>,
    /// Keep no run history for the calls.
    #[arg(long)]
    no_history: bool,
    /// The most calls that run at once; more wait their turn.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    max_runs: u32,
    /// The most calls that wait for a turn; past them a call is refused as busy.
    #[arg(long, value_name = "N", default_value_t = 32)]
    max_waiting: u32,
    /// The server's memory budget in megabytes: while the process uses more, new calls are
    /// refused as busy (running ones finish).
    #[arg(long, value_name = "MB", default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
    memory_mb: u64,
    /// Over HTTP: a session with no traffic for this many seconds is closed and its calls
    /// stopped (a client that went away without ending its session). A call that runs longer
    /// without sending progress is stopped too: ask for progress, or raise this.
    #[arg(long, value_name = "SECS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..), requires = "http")]
    idle_timeout: u64,
    /// For clients that take tasks (SEP-2663): a call still running after this many seconds
    /// (or that asks its user) comes back as a task to poll; 0 makes every call a task.
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    task_after: f64,
    /// On MCP 2026-07-28, how long a run that asked its user waits for the client to come
    /// back with the answer before it is cancelled.
    #[arg(long, value_name = "SECS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    answer_within: u64,
}

#[derive(Debug, Args)]
struct ToolsArgs {
    /// The server's name, as in [mcp.servers.NAME].
    name: String,
    /// Print the tools as JSON.
    #[arg(long)]
    json: bool,
}

pub fn mcp(args: &McpArgs) -> ExitCode {
    let result = match &args.command {
        McpCommand::Serve(serve_args) => serve(serve_args),
        McpCommand::Tools(tools_args) => tools(tools_args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            errln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

/// `mcp tools NAME`: start the server and list its tools.
fn tools(args: &ToolsArgs) -> Result<ExitCode, String> {
    let config = Config::default();
    let servers = config.catalog()?.mcp_servers().clone();
    let plugins = crate::session::mcp_plugins(servers);
    let rt = runtime()?;
    let listed = rt.block_on(async {
        let listed = plugins.tools(&args.name).await;
        plugins.shutdown().await;
        listed
    })?;
    if args.json {
        let tools: Vec<Json> = listed
            .iter()
            .map(|t| {
                json!({"path": format!("mcp/{}/{}", args.name, t.segment), "name": t.name,
                       "description": t.description, "input_schema": t.input_schema})
            })
            .collect();
        outln!("{}", Json::Array(tools));
        return Ok(ExitCode::SUCCESS);
    }
    if listed.is_empty() {
        outln!("mcp/{}: the server lists no tools", args.name);
    }
    let width = listed
        .iter()
        .map(|t| t.segment.len() + args.name.len() + 5)
        .max()
        .unwrap_or(0);
    for tool in &listed {
        let path = format!("mcp/{}/{}", args.name, tool.segment);
        let renamed = if tool.name == tool.segment {
            String::new()
        } else {
            format!(" (the server's `{}`)", tool.name)
        };
        let about = tool.description.lines().next().unwrap_or("");
        outln!("{path:width$}  {about}{renamed}");
    }
    Ok(ExitCode::SUCCESS)
}

/// One prompt file the server offers.
#[derive(Debug)]
struct Entry {
    path: PathBuf,
    /// The file's text as parsed (its hash goes into each call's record).
    text: String,
    prompt: Arc<Prompt>,
    tool: Tool,
    mcp_prompt: rmcp::model::Prompt,
}

/// What a directory scan found: the prompts by name, and a fingerprint of the files.
#[derive(Debug, Default)]
struct Library {
    entries: BTreeMap<String, Arc<Entry>>,
    stamp: Vec<(PathBuf, Option<SystemTime>, u64)>,
}

fn fingerprint(files: &[PathBuf]) -> Vec<(PathBuf, Option<SystemTime>, u64)> {
    files
        .iter()
        .map(|path| {
            let meta = std::fs::metadata(path).ok();
            (
                path.clone(),
                meta.as_ref().and_then(|m| m.modified().ok()),
                meta.map_or(0, |m| m.len()),
            )
        })
        .collect()
}

/// Scan the directories; problems (a prompt that does not parse, two prompts of one name)
/// are told on stderr, each once while it lasts (`told` holds the ones told already).
fn scan(dirs: &[PathBuf], told: &Mutex<std::collections::BTreeSet<String>>) -> Library {
    let mut problems: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let library = scan_quietly(dirs, &mut problems);
    let mut told = told.lock().unwrap_or_else(|e| e.into_inner());
    for problem in problems.difference(&told) {
        errln!("promptforge mcp: skipped {problem}");
    }
    *told = problems;
    library
}

fn scan_quietly(dirs: &[PathBuf], problems: &mut std::collections::BTreeSet<String>) -> Library {
    let files = crate::source::prompt_files(dirs);
    let stamp = fingerprint(&files);
    let mut entries: BTreeMap<String, Arc<Entry>> = BTreeMap::new();
    for path in files {
        let Ok(text) = crate::source::read_prompt(&path) else {
            continue;
        };
        // Plain Markdown (a README) is not a prompt program: only files that open with a
        // frontmatter are reported when they do not parse.
        let prompt = match Prompt::parse(&text) {
            Ok(prompt) => prompt,
            Err(err) => {
                if crate::source::looks_like_a_prompt(&text) {
                    problems.insert(crate::source::parse_failure_line(&path, &err));
                }
                continue;
            }
        };
        let name = tool_name(&prompt.frontmatter.name);
        if let Some(first) = entries.get(&name) {
            problems.insert(format!(
                "{}: the tool name `{name}` is taken by {}",
                path.display(),
                first.path.display()
            ));
            continue;
        }
        if prompt.frontmatter.input.is_some() {
            problems.insert(format!(
                "{}: it reads an input file, which an MCP call cannot pass",
                path.display()
            ));
            continue;
        }
        let tool = tool_of(&name, &prompt);
        let mcp_prompt = mcp_prompt_of(&name, &prompt);
        entries.insert(
            name,
            Arc::new(Entry {
                path,
                text,
                prompt: Arc::new(prompt),
                tool,
                mcp_prompt,
            }),
        );
    }
    Library { entries, stamp }
}

/// The JSON Schema of a prompt's arguments: one property per declared arg (its type, its
/// description and default), required when neither optional nor defaulted (the server fills
/// a default in); fields beyond the declared ones are allowed, as chapter 06 allows them in
/// the argument string. A prompt that takes free text takes one string, `args`.
pub(crate) fn input_schema(fm: &Frontmatter) -> JsonObject {
    if !fm.args.is_structured() {
        let schema = json!({
            "type": "object",
            "properties": {"args": {
                "type": "string",
                "description": "Free text for the prompt (its argv.prose)"
            }},
        });
        return as_object(schema);
    }
    let mut properties = serde_json::Map::new();
    let mut required = Vec::new();
    for arg in &fm.args.args {
        let mut property = serde_json::Map::new();
        property.insert("type".into(), Json::String(arg.ty.as_str().to_owned()));
        if let Some(description) = &arg.description {
            property.insert("description".into(), Json::String(description.clone()));
        }
        if let Some(default) = &arg.default {
            property.insert("default".into(), crate::declared::arg_value_json(default));
        }
        if arg.is_required() {
            required.push(Json::String(arg.name.clone()));
        }
        properties.insert(arg.name.clone(), Json::Object(property));
    }
    as_object(json!({
        "type": "object",
        "properties": properties,
        "required": required,
    }))
}

fn as_object(value: Json) -> JsonObject {
    match value {
        Json::Object(map) => map,
        _ => JsonObject::new(),
    }
}

/// A prompt as a tool: its name, description, argument schema, and annotations: a prompt
/// with no Plugins touches nothing outside its own run (its store is the run's own), one with
/// Plugins reaches the world; no run is idempotent, since a model answers it.
fn tool_of(name: &str, prompt: &Prompt) -> Tool {
    let fm = &prompt.frontmatter;
    let reaches_out = !fm.plugins.is_empty();
    let annotations = ToolAnnotations::with_title(prompt.title.clone())
        .read_only(!reaches_out)
        .destructive(false)
        .idempotent(false)
        .open_world(reaches_out);
    Tool::new(name.to_owned(), fm.description.clone(), input_schema(fm))
        .with_title(prompt.title.clone())
        .with_annotations(annotations)
}

fn mcp_prompt_of(name: &str, prompt: &Prompt) -> rmcp::model::Prompt {
    let fm = &prompt.frontmatter;
    let arguments: Vec<PromptArgument> = if fm.args.is_structured() {
        fm.args
            .args
            .iter()
            .map(|arg| {
                let mut argument =
                    PromptArgument::new(arg.name.clone()).with_required(arg.is_required());
                if let Some(description) = &arg.description {
                    argument = argument.with_description(description.clone());
                }
                argument
            })
            .collect()
    } else {
        vec![
            PromptArgument::new("args")
                .with_description("Free text for the prompt (its argv.prose)")
                .with_required(false),
        ]
    };
    rmcp::model::Prompt::new(
        name.to_owned(),
        Some(fm.description.clone()),
        Some(arguments),
    )
    .with_title(prompt.title.clone())
}

/// Why a call's arguments make no argument string.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// Not the shape the tool takes at all (free text that is not a string).
    Shape(String),
    /// The declaration refuses the object (a required arg missing, a value of another type):
    /// a tool execution error the model can read and correct, not a protocol error.
    Declared(String),
}

/// A call's arguments as the run's argument string: the free text, or the JSON object with
/// the declared defaults filled in and the declared types checked
/// ([`complete_args`](crate::declared::complete_args)).
fn argument_string(fm: &Frontmatter, arguments: &JsonObject) -> Result<Option<String>, Refusal> {
    if fm.args.is_structured() {
        let mut object = arguments.clone();
        crate::declared::complete_args(&fm.args, &mut object).map_err(Refusal::Declared)?;
        return Ok(Some(Json::Object(object).to_string()));
    }
    match arguments.get("args") {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(text)) => Ok(Some(text.clone())),
        Some(other) => Err(Refusal::Shape(format!(
            "`args` must be a string, got {other}"
        ))),
    }
}

/// MCP prompt arguments are strings: each becomes its declared type.
fn typed_prompt_arguments(fm: &Frontmatter, given: &JsonObject) -> Result<JsonObject, String> {
    if !fm.args.is_structured() {
        return Ok(given.clone());
    }
    let mut out = JsonObject::new();
    for (name, value) in given {
        let Some(decl) = fm.args.get(name) else {
            out.insert(name.clone(), value.clone());
            continue;
        };
        let typed = match (value, decl.ty) {
            (Json::String(text), ArgType::Integer) => text
                .trim()
                .parse::<i64>()
                .map(Json::from)
                .map_err(|_| format!("argument `{name}` must be an integer, got {text:?}"))?,
            (Json::String(text), ArgType::Number) => text
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Json::Number)
                .ok_or_else(|| format!("argument `{name}` must be a number, got {text:?}"))?,
            (Json::String(text), ArgType::Boolean) => match text.trim() {
                "true" => Json::Bool(true),
                "false" => Json::Bool(false),
                _ => {
                    return Err(format!(
                        "argument `{name}` must be true or false, got {text:?}"
                    ));
                }
            },
            (other, _) => other.clone(),
        };
        out.insert(name.clone(), typed);
    }
    Ok(out)
}

/// The values to offer for argument `name` of a prompt, given what was typed so far.
fn completions(fm: &Frontmatter, name: &str, typed: &str) -> Vec<String> {
    let Some(decl) = fm.args.is_structured().then(|| fm.args.get(name)).flatten() else {
        return Vec::new();
    };
    let mut values: Vec<String> = Vec::new();
    if let Some(default) = &decl.default {
        values.push(match crate::declared::arg_value_json(default) {
            Json::String(text) => text,
            other => other.to_string(),
        });
    }
    if decl.ty == ArgType::Boolean {
        for word in ["false", "true"] {
            if !values.iter().any(|v| v == word) {
                values.push(word.to_owned());
            }
        }
    }
    values.retain(|v| v.starts_with(typed));
    values
}

/// The MCP tool name of a prompt name: MCP names keep to `A-Z a-z 0-9 _ - .` and at most 128
/// characters, so any other character becomes `_` and a longer name is cut.
fn tool_name(name: &str) -> String {
    let mapped: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(128)
        .collect();
    if mapped.is_empty() {
        "_".to_owned()
    } else {
        mapped
    }
}

/// What every call shares.
struct Shared {
    dirs: Vec<PathBuf>,
    library: RwLock<Library>,
    /// The current model and the web Plugin, for every call.
    session: Session,
    mcp: Arc<McpPlugins>,
    seed: Option<u64>,
    history: Option<PathBuf>,
    runtime: tokio::runtime::Handle,
    /// The connected clients (stdio, and HTTP sessions), for list-changed notifications.
    peers: Mutex<Vec<Peer<RoleServer>>>,
    /// Calls run as tasks (SEP-2663), for clients that asked.
    tasks: rmcp::task_manager::TaskManager,
    /// Runs parked between the requests of a 2026-07-28 call that asks its user.
    asking: ask::Asking,
    /// `--task-after`: when a call from a client that takes tasks becomes one, in seconds.
    task_after: f64,
    /// Resource subscriptions (`resources/subscribe`): who asked to hear of which URI.
    subscriptions: Mutex<Vec<(Peer<RoleServer>, String)>>,
    /// Changes for clients that listen (the stateless protocol's subscriptions).
    changes: tokio::sync::broadcast::Sender<()>,
    /// The scan's problems told on stderr already.
    told: Mutex<std::collections::BTreeSet<String>>,
    /// How many calls run at once, how many wait, and the memory budget.
    admission: CallAdmission,
}

/// Admission of calls: `--max-runs` at once, `--max-waiting` queued behind them, and no new
/// call while the process is over its memory budget. The 64 MiB Lua cap bounds one run; this
/// bounds the server.
#[derive(Debug)]
struct CallAdmission {
    slots: Arc<tokio::sync::Semaphore>,
    max_runs: u32,
    waiting: std::sync::atomic::AtomicU32,
    max_waiting: u32,
    budget_bytes: u64,
    /// The process's resident memory now (a test may stand in its own reading).
    resident: fn() -> u64,
}

/// A call's turn to run; the slot comes back when it is dropped.
#[derive(Debug)]
struct Turn {
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl CallAdmission {
    fn new(max_runs: u32, max_waiting: u32, budget_mb: u64) -> Self {
        CallAdmission {
            slots: Arc::new(tokio::sync::Semaphore::new(max_runs as usize)),
            max_runs,
            waiting: std::sync::atomic::AtomicU32::new(0),
            max_waiting,
            budget_bytes: budget_mb.saturating_mul(1024 * 1024),
            resident: resident_bytes,
        }
    }

    /// Wait for a turn, or say why there is none: the server is over its memory budget, the
    /// queue is full, or the call was cancelled while it waited (`Ok(None)`).
    async fn enter(
        &self,
        ct: &tokio_util::sync::CancellationToken,
    ) -> Result<Option<Turn>, String> {
        self.within_budget()?;
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(Some(Turn { _permit: permit }));
        }
        let queued = self.waiting.fetch_add(1, Ordering::SeqCst);
        // Counted out however this ends, the future dropped mid-wait included.
        let _queued = Waiting(&self.waiting);
        if queued >= self.max_waiting {
            return Err(format!(
                "the server is busy: {} calls are running and {queued} waiting (--max-runs, --max-waiting); try again later",
                self.max_runs
            ));
        }
        let turn = tokio::select! {
            permit = self.slots.clone().acquire_owned() => {
                permit.ok().map(|permit| Turn { _permit: permit })
            }
            () = ct.cancelled() => None,
        };
        if turn.is_some() {
            // The memory may have grown while this call waited.
            self.within_budget()?;
        }
        Ok(turn)
    }

    /// Refuse a new call while the process is over its memory budget, unless no call runs
    /// (memory the allocator keeps after a spike must not refuse every call for ever).
    fn within_budget(&self) -> Result<(), String> {
        let running = self.max_runs as usize - self.slots.available_permits();
        let resident = (self.resident)();
        if resident > self.budget_bytes && running > 0 {
            return Err(format!(
                "the server is busy: it uses {} MB, over its memory budget of {} MB (--memory-mb); try again when running calls finish",
                resident / (1024 * 1024),
                self.budget_bytes / (1024 * 1024)
            ));
        }
        Ok(())
    }
}

/// One call counted as waiting for a turn, until dropped.
struct Waiting<'a>(&'a std::sync::atomic::AtomicU32);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// This process's resident memory in bytes (Linux's `/proc/self/status`; 0 elsewhere, where
/// the budget then never refuses).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("dirs", &self.dirs)
            .finish_non_exhaustive()
    }
}

/// The MCP server: one per connection (HTTP sessions each get one), all sharing [`Shared`].
#[derive(Debug, Clone)]
struct PromptServer(Arc<Shared>);

impl PromptServer {
    fn entry(&self, name: &str) -> Option<Arc<Entry>> {
        self.0
            .library
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .get(name)
            .cloned()
    }

    /// Run a prompt for a call: on a blocking thread (the Host drives its effects on the
    /// shared runtime), cancelled when `ct` fires, its progress sent to `progress`.
    async fn run(
        &self,
        entry: Arc<Entry>,
        args: Option<String>,
        ct: tokio_util::sync::CancellationToken,
        progress: Option<tokio::sync::mpsc::UnboundedSender<String>>,
        operator: Operator,
    ) -> Result<(Outcome, Option<OutputFile>), String> {
        let Some(turn) = self.0.admission.enter(&ct).await? else {
            return Ok((Outcome::Cancelled, None));
        };
        let cancel = Arc::new(AtomicBool::new(false));
        let (tx, rx) = channel();
        let wake = tx.clone();
        let shared = self.0.clone();
        let job = {
            let cancel = cancel.clone();
            // The turn goes with the run: its slot is free only when the run has ended.
            tokio::task::spawn_blocking(move || {
                let ended = run_entry(&shared, &entry, args, cancel, (tx, rx), progress, operator);
                drop(turn);
                ended
            })
        };
        // Dropped before the run ends (a task past its time, a request gone), this future
        // cancels the run rather than leave it running unseen.
        let stop = StopOnDrop {
            cancel: cancel.clone(),
            wake: wake.clone(),
            armed: true,
        };
        tokio::pin!(job);
        let outcome = tokio::select! {
            done = &mut job => done.map_err(run_stopped),
            () = ct.cancelled() => {
                stop.stop();
                job.await.map_err(run_stopped)
            }
        };
        stop.disarm();
        outcome
    }

    /// Run a prompt for a request: progress forwarded when the request asked for it (all of
    /// it sent before this returns), cancelled with the request.
    async fn call(
        &self,
        entry: Arc<Entry>,
        args: Option<String>,
        cx: &RequestContext<RoleServer>,
    ) -> Result<(Outcome, Option<OutputFile>), ErrorData> {
        let (progress, forwarding) = forward_progress(cx);
        let operator = operator_for(cx, &entry);
        let outcome = self
            .run(entry, args, cx.ct.clone(), progress, operator)
            .await;
        if let Some(forwarding) = forwarding {
            let _ = forwarding.await;
        }
        outcome.map_err(|message| ErrorData::internal_error(message, None))
    }

    /// A tool call on MCP 2026-07-28 from a client that can ask its user: the run's asks
    /// come back as `input_required` results, and the client's next call with the answers
    /// (and the sealed `requestState`) goes on with the same run (see `ask.rs`).
    async fn call_asking(
        &self,
        entry: Arc<Entry>,
        args: Option<String>,
        request: CallToolRequestParams,
        arguments: JsonObject,
        cx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = entry.tool.name.to_string();
        let (pending, resumed) = match &request.request_state {
            Some(state) => {
                let resumed = self.0.asking.resume(
                    state,
                    &name,
                    &arguments,
                    request.input_responses.as_ref(),
                );
                match resumed {
                    Ok((pending, handle)) => (pending, Some(handle)),
                    Err(message) => return Err(ErrorData::invalid_params(message, None)),
                }
            }
            None => {
                let server = self.clone();
                let pending = ask::Pending::start(|operator, cancel| {
                    tokio::spawn(
                        async move { server.run(entry, args, cancel, None, operator).await },
                    )
                });
                (pending, None)
            }
        };
        let step = self
            .0
            .asking
            .step(pending, resumed, &name, &arguments, &cx.ct)
            .await;
        match step {
            ask::Step::Ended(Ok((outcome, output))) => {
                Ok(tool_result(&outcome, output.as_ref()).into())
            }
            ask::Step::Ended(Err(message)) => Err(ErrorData::internal_error(message, None)),
            ask::Step::Asks(result) => Ok(result.into()),
        }
    }

    /// A tool call from a client that declared the tasks extension (SEP-2663). The server
    /// decides per call: a run that ends within `--task-after` returns its result as usual;
    /// one that runs longer, or asks its user first, becomes a task the client polls with
    /// `tasks/get` (its asks are the task's input requests, answered with `tasks/update`;
    /// `tasks/cancel` cancels it). A run longer than the client's request timeout is so not
    /// lost; a task lives for [`TASK_TTL_MS`] from when it is made.
    async fn call_as_task(
        &self,
        entry: Arc<Entry>,
        args: Option<String>,
        cx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        use rmcp::task_manager::{TaskExit, TaskOptions};
        let server = self.clone();
        let name = entry.tool.name.to_string();
        let pending = ask::Pending::start_asking(ask::can_elicit(cx), |operator, cancel| {
            tokio::spawn(async move { server.run(entry, args, cancel, None, operator).await })
        });
        let wait = Duration::from_secs_f64(self.0.task_after);
        let (pending, first) = match pending.decide(wait, &cx.ct).await {
            ask::TaskStart::Ended(Ok((outcome, output))) => {
                return Ok(tool_result(&outcome, output.as_ref()).into());
            }
            ask::TaskStart::Ended(Err(message)) => {
                return Err(ErrorData::internal_error(message, None));
            }
            ask::TaskStart::Task(pending, first) => (pending, first),
        };
        let options = TaskOptions::new()
            .with_ttl_ms(TASK_TTL_MS)
            .with_poll_interval_ms(TASK_POLL_MS)
            .with_status_message(format!("running {name}"));
        let task = self.0.tasks.spawn(options, move |task| {
            Box::pin(async move {
                match pending.run_as_task(first, name.clone(), task).await {
                    Ok((Outcome::Cancelled, _)) => Err(TaskExit::Cancelled),
                    Ok((outcome, output)) => Ok(tool_result(&outcome, output.as_ref())),
                    Err(message) => Err(TaskExit::Error(ErrorData::internal_error(message, None))),
                }
            })
        });
        Ok(rmcp::model::CreateTaskResult::new(task).into())
    }

    /// Tell every client the lists changed.
    async fn announce(&self) {
        let peers: Vec<Peer<RoleServer>> = {
            let mut peers = self.0.peers.lock().unwrap_or_else(|e| e.into_inner());
            peers.retain(|p| !p.is_transport_closed());
            peers.clone()
        };
        for peer in peers {
            let _ = peer.notify_tool_list_changed().await;
            let _ = peer.notify_prompt_list_changed().await;
            let _ = peer.notify_resource_list_changed().await;
        }
        let _ = self.0.changes.send(());
    }

    /// The resource subscriptions of the clients still connected.
    fn subscriptions(&self) -> std::sync::MutexGuard<'_, Vec<(Peer<RoleServer>, String)>> {
        let mut subscriptions = self
            .0
            .subscriptions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        subscriptions.retain(|(p, _)| !p.is_transport_closed());
        subscriptions
    }

    /// Tell the clients subscribed to these prompt files' resources that they changed.
    async fn updated(&self, names: &[String]) {
        let told: Vec<(Peer<RoleServer>, String)> = {
            self.subscriptions()
                .iter()
                .filter(|(_, uri)| names.iter().any(|name| *uri == prompt_uri(name)))
                .cloned()
                .collect()
        };
        for (peer, uri) in told {
            let _ = peer
                .notify_resource_updated(rmcp::model::ResourceUpdatedNotificationParam::new(uri))
                .await;
        }
    }
}

/// How long a task lives from when it is made (an hour).
const TASK_TTL_MS: u64 = 60 * 60 * 1000;

/// How often a client is asked to poll a task.
const TASK_POLL_MS: u64 = 500;

/// The most resource subscriptions one client may hold, so no client can use up the
/// server's room for the others.
const MAX_SUBSCRIPTIONS_PER_CLIENT: usize = 1024;

/// The most resource subscriptions the server keeps across all its clients (a backstop on
/// memory when many clients connect).
const MAX_SUBSCRIPTIONS: usize = 16 * 1024;

/// Whether a client may add a subscription, given how many it holds, how many the server
/// holds, and whether it holds this one already (then nothing is added, and that is no
/// error). `Ok(true)`: add it.
fn subscription_room(mine: usize, total: usize, already: bool) -> Result<bool, String> {
    if already {
        return Ok(false);
    }
    if mine >= MAX_SUBSCRIPTIONS_PER_CLIENT {
        return Err(format!(
            "too many resource subscriptions for this client (at most {MAX_SUBSCRIPTIONS_PER_CLIENT}); unsubscribe from some first"
        ));
    }
    if total >= MAX_SUBSCRIPTIONS {
        return Err(format!(
            "too many resource subscriptions on this server (at most {MAX_SUBSCRIPTIONS} across its clients)"
        ));
    }
    Ok(true)
}

/// Whether two handles are the same client connection (rmcp gives a peer no id: the handles
/// of one connection share the client's `initialize` information, one allocation).
fn same_peer(a: &Peer<RoleServer>, b: &Peer<RoleServer>) -> bool {
    match (a.peer_info(), b.peer_info()) {
        (Some(a), Some(b)) => Arc::ptr_eq(&a, &b),
        _ => false,
    }
}

/// Cancels a run when dropped, unless disarmed (the run ended).
struct StopOnDrop {
    cancel: Arc<AtomicBool>,
    wake: tokio::sync::mpsc::UnboundedSender<crate::host::HostMessage>,
    armed: bool,
}

impl StopOnDrop {
    /// Cancels the run now (and wakes its Host to see it).
    fn stop(&self) {
        self.cancel.store(true, Ordering::Relaxed);
        let _ = self.wake.send(crate::host::HostMessage::Wake);
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.stop();
        }
    }
}

/// The failure of a run whose thread ended without an outcome (it panicked or was aborted).
fn run_stopped(e: tokio::task::JoinError) -> String {
    format!("the run stopped: {e}")
}

/// A served prompt file as a resource: `promptforge://prompts/NAME`, NAME its tool name.
const PROMPT_URI: &str = "promptforge://prompts/";

fn prompt_uri(name: &str) -> String {
    format!("{PROMPT_URI}{name}")
}

/// The file a run declared as its `output:`, as the run left it in its store.
#[derive(Debug, Clone)]
struct OutputFile {
    /// The tool name of the prompt whose run wrote it (its URI names the prompt).
    prompt: String,
    /// Its store path.
    path: String,
    bytes: Vec<u8>,
}

impl OutputFile {
    /// As an embedded resource: text when it is UTF-8, else base64, with a MIME type by its
    /// extension. The URI names the prompt and the store path; it is not readable later (the
    /// run's store is gone), which an embedded resource does not need.
    fn resource(&self) -> rmcp::model::ResourceContents {
        use base64::Engine as _;
        use rmcp::model::ResourceContents;
        let uri = format!("{}/output/{}", prompt_uri(&self.prompt), self.path);
        match std::str::from_utf8(&self.bytes) {
            Ok(text) => {
                ResourceContents::text(text, uri).with_mime_type(text_mime_type(&self.path))
            }
            Err(_) => ResourceContents::blob(
                base64::engine::general_purpose::STANDARD.encode(&self.bytes),
                uri,
            )
            .with_mime_type(binary_mime_type(&self.path)),
        }
    }
}

/// The extension's part of a store path, lowercased.
fn extension(path: &str) -> String {
    path.rsplit_once('.')
        .map(|(_, ext)| ext.to_ascii_lowercase())
        .unwrap_or_default()
}

/// A text file's MIME type by its extension (a handful: what prompts write).
fn text_mime_type(path: &str) -> &'static str {
    match extension(path).as_str() {
        "md" | "markdown" => "text/markdown",
        "json" => "application/json",
        "jsonl" | "ndjson" => "application/jsonl",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        _ => "text/plain",
    }
}

/// A binary file's MIME type by its extension.
fn binary_mime_type(path: &str) -> &'static str {
    match extension(path).as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        _ => "application/octet-stream",
    }
}

/// One call's run, as `promptforge run` would do it with no operator and a memory store.
fn run_entry(
    shared: &Shared,
    entry: &Entry,
    args: Option<String>,
    cancel: Arc<AtomicBool>,
    messages: (
        tokio::sync::mpsc::UnboundedSender<crate::host::HostMessage>,
        tokio::sync::mpsc::UnboundedReceiver<crate::host::HostMessage>,
    ),
    progress: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    operator: Operator,
) -> (Outcome, Option<OutputFile>) {
    let start_ms = chrono::Utc::now().timestamp_millis();
    let seed = shared.seed.unwrap_or_else(crate::session::os_seed);
    let mut ctx = RunContext::new(seed, start_ms);
    ctx.args = args.clone();
    ctx.cancel = cancel.clone();
    ctx.execution = entry.prompt.frontmatter.name.clone();
    // A question to the client's user names the section that asks.
    ctx.effect_sites = matches!(operator, Operator::Remote(_));

    shared.session.offer(&mut ctx, &operator);
    let host = shared
        .session
        .host(Store::memory(), operator, cancel, messages);
    let mut host = match host {
        Ok(host) => host
            .notes(Notes::Keep)
            .shared_runtime(shared.runtime.clone())
            .mcp(shared.mcp.clone()),
        Err(message) => {
            let failed = Outcome::Failed(promptforge_engine::RunError::new(
                promptforge_engine::protocol::RunErrorKind::Internal,
                message,
            ));
            return (failed, None);
        }
    };
    if let Some(progress) = progress {
        host = host.reporting(crate::ui::Reporter(Box::new(move |message| {
            let _ = progress.send(message);
        })));
    }
    ctx.host
        .plugins
        .extend(host.activate_mcp(&entry.prompt.frontmatter));
    if shared.history.is_some() {
        let header = crate::session::header_for(&entry.path, &entry.text, &ctx);
        match crate::record::Recorder::temporary(&header) {
            Ok(recorder) => host = host.recorder(recorder),
            Err(e) => crate::ui::print_line(&format!("warning: {e}")),
        }
    }
    let info = crate::otel::RunInfo {
        name: entry.prompt.frontmatter.name.clone(),
        provider: shared
            .session
            .model
            .as_ref()
            .map(|m| m.description.provider.as_str().to_owned()),
        model: shared
            .session
            .model
            .as_ref()
            .map(|m| m.description.model.clone()),
        started: SystemTime::now(),
        price: shared
            .session
            .model
            .as_ref()
            .and_then(|m| m.description.price),
    };
    let started = std::time::Instant::now();
    let mut run = Run::new(entry.prompt.clone(), ctx);
    let outcome = host.drive(&mut run, &mut |_| {});
    // A completed run's declared output file goes back with its result.
    let output = match (&outcome, &entry.prompt.frontmatter.output) {
        (Outcome::Completed(_), Some(decl)) => {
            host.store()
                .read_bytes(&decl.path)
                .ok()
                .map(|bytes| OutputFile {
                    prompt: entry.tool.name.to_string(),
                    path: decl.path.clone(),
                    bytes,
                })
        }
        _ => None,
    };
    if let Some(recorder) = host.take_recorder() {
        let wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let _ = crate::session::keep_record(
            recorder,
            &outcome,
            wall_ms,
            shared.history.as_deref(),
            None,
            crate::otel::endpoint().as_deref(),
            &info,
        );
    }
    (outcome, output)
}

/// Who answers a run's `input.ask()` on a call: the person behind the client, asked with
/// `elicitation/create`, when the client can ask its user and the connection was made with
/// `initialize`; else nobody (a 2026-07-28 tool call that can elicit goes through
/// [`PromptServer::call_asking`] instead). Decided once per call, before the run starts, so
/// `input.connected()` is fixed for the run (chapter 05): a prompt that requires the Plugin
/// is refused when the client cannot ask, and one that takes it optionally gets the fixed
/// no-operator sentence for each ask.
fn operator_for(cx: &RequestContext<RoleServer>, entry: &Entry) -> Operator {
    if ask::can_elicit(cx) && !ask::is_modern(cx) {
        ask::asking_peer(&cx.peer, &entry.tool.name)
    } else {
        Operator::Nobody
    }
}

/// A run's outcome as a tool result: the result text (and the object, when it is a JSON
/// object), or a tool error naming the run error kind.
fn tool_result(outcome: &Outcome, output: Option<&OutputFile>) -> CallToolResult {
    match outcome {
        Outcome::Completed(result) => {
            let mut content = vec![ContentBlock::text(result.clone())];
            // The declared output file, as an embedded resource beside the result text.
            content.extend(output.map(|file| ContentBlock::resource(file.resource())));
            let mut called = CallToolResult::success(content);
            if let Ok(value @ Json::Object(_)) = serde_json::from_str::<Json>(result) {
                called.structured_content = Some(value);
            }
            called
        }
        Outcome::Failed(err) => CallToolResult::error(vec![ContentBlock::text(format!(
            "the run failed with run error kind {}: {}",
            err.kind, err.message
        ))]),
        Outcome::Cancelled => {
            CallToolResult::error(vec![ContentBlock::text("the run was cancelled")])
        }
    }
}

/// Forward a run's progress messages to the client as progress notifications, when the
/// request asked for them. The task ends when the run drops its sender; the response waits
/// for it, so every notification reaches the client before the result.
fn forward_progress(
    cx: &RequestContext<RoleServer>,
) -> (
    Option<tokio::sync::mpsc::UnboundedSender<String>>,
    Option<tokio::task::JoinHandle<()>>,
) {
    let Some(token) = cx.meta.get_progress_token() else {
        return (None, None);
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let peer = cx.peer.clone();
    let forwarding = tokio::spawn(async move {
        let mut n = 0u32;
        while let Some(message) = rx.recv().await {
            n += 1;
            let param =
                ProgressNotificationParam::new(token.clone(), f64::from(n)).with_message(message);
            if peer.notify_progress(param).await.is_err() {
                break;
            }
        }
    });
    (Some(tx), Some(forwarding))
}

impl ServerHandler for PromptServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_prompts()
                .enable_prompts_list_changed()
                .enable_completions()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_resources_list_changed()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("promptforge", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Each tool runs a PromptForge prompt file with the arguments given and returns its result.",
        )
    }

    async fn list_tools(
        &self,
        _page: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let library = self.0.library.read().unwrap_or_else(|e| e.into_inner());
        Ok(ListToolsResult::with_all_items(
            library.entries.values().map(|e| e.tool.clone()).collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.entry(name).map(|e| e.tool.clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(entry) = self.entry(&request.name) else {
            return Err(ErrorData::invalid_params(
                format!("unknown tool: {}", request.name),
                None,
            ));
        };
        let arguments = request.arguments.clone().unwrap_or_default();
        let args = match argument_string(&entry.prompt.frontmatter, &arguments) {
            Ok(args) => args,
            Err(Refusal::Shape(message)) => return Err(ErrorData::invalid_params(message, None)),
            // Input validation errors are tool execution errors (MCP 2025-11-25), so the
            // model sees which argument to fix; nothing runs.
            Err(Refusal::Declared(message)) => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(message)]).into());
            }
        };
        if cx
            .client_capabilities()
            .is_some_and(|caps| caps.supports_tasks())
        {
            return self.call_as_task(entry, args, &cx).await;
        }
        if ask::is_modern(&cx) && ask::can_elicit(&cx) {
            return self.call_asking(entry, args, request, arguments, &cx).await;
        }
        let (outcome, output) = self.call(entry, args, &cx).await?;
        Ok(tool_result(&outcome, output.as_ref()).into())
    }

    async fn list_prompts(
        &self,
        _page: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let library = self.0.library.read().unwrap_or_else(|e| e.into_inner());
        Ok(ListPromptsResult::with_all_items(
            library
                .entries
                .values()
                .map(|e| e.mcp_prompt.clone())
                .collect(),
        ))
    }

    /// An MCP prompt is the message the prompt program computes: getting one runs it and
    /// returns its result as a user message.
    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let Some(entry) = self.entry(&request.name) else {
            return Err(ErrorData::invalid_params(
                format!("unknown prompt: {}", request.name),
                None,
            ));
        };
        let given = request.arguments.unwrap_or_default();
        let typed = typed_prompt_arguments(&entry.prompt.frontmatter, &given)
            .map_err(|message| ErrorData::invalid_params(message, None))?;
        let args = argument_string(&entry.prompt.frontmatter, &typed).map_err(|refusal| {
            let (Refusal::Shape(message) | Refusal::Declared(message)) = refusal;
            ErrorData::invalid_params(message, None)
        })?;
        let description = entry.prompt.frontmatter.description.clone();
        let (outcome, output) = self.call(entry, args, &cx).await?;
        match &outcome {
            Outcome::Completed(result) => {
                let mut messages = vec![PromptMessage::new_text(Role::User, result.clone())];
                // The declared output file follows as an embedded resource.
                messages.extend(output.map(|file| {
                    PromptMessage::new(Role::User, ContentBlock::resource(file.resource()))
                }));
                Ok(GetPromptResult::new(messages)
                    .with_description(description)
                    .into())
            }
            Outcome::Failed(err) => Err(ErrorData::internal_error(
                format!(
                    "the run failed with run error kind {}: {}",
                    err.kind, err.message
                ),
                None,
            )),
            Outcome::Cancelled => Err(ErrorData::internal_error("the run was cancelled", None)),
        }
    }

    /// Completions for a prompt's arguments: `true`/`false` for a boolean, the default for
    /// an arg that has one, each only when it starts with what was typed.
    async fn complete(
        &self,
        request: CompleteRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let Reference::Prompt(prompt) = &request.r#ref else {
            return Ok(CompleteResult::default());
        };
        let Some(entry) = self.entry(&prompt.name) else {
            return Err(ErrorData::invalid_params(
                format!("unknown prompt: {}", prompt.name),
                None,
            ));
        };
        let values = completions(
            &entry.prompt.frontmatter,
            &request.argument.name,
            &request.argument.value,
        );
        Ok(CompletionInfo::with_all_values(values)
            .map(CompleteResult::new)
            .unwrap_or_default())
    }

    /// SEP-2663 `tasks/get`: a task's status, its questions out, or its result.
    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        Ok(rmcp::model::GetTaskResult::new(
            self.0.tasks.get_task(&request.task_id)?,
        ))
    }

    /// SEP-2663 `tasks/update`: the client's answers to a task's questions.
    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.0
            .tasks
            .update_task(&request.task_id, request.input_responses)
    }

    /// SEP-2663 `tasks/cancel`: the task's run is cancelled (it ends `cancelled`, as a
    /// cancelled call would).
    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.0.tasks.cancel_task(&request.task_id)
    }

    /// Every served prompt file, as a text resource.
    async fn list_resources(
        &self,
        _page: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, ErrorData> {
        let library = self.0.library.read().unwrap_or_else(|e| e.into_inner());
        Ok(rmcp::model::ListResourcesResult::with_all_items(
            library
                .entries
                .iter()
                .map(|(name, entry)| {
                    rmcp::model::Resource::new(prompt_uri(name), name.clone())
                        .with_title(format!("{} (prompt file)", entry.prompt.title))
                        .with_description(entry.prompt.frontmatter.description.clone())
                        .with_mime_type("text/markdown")
                        .with_size(entry.text.len() as u64)
                })
                .collect(),
        ))
    }

    async fn list_resource_templates(
        &self,
        _page: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourceTemplatesResult, ErrorData> {
        Ok(rmcp::model::ListResourceTemplatesResult::with_all_items(
            vec![
                rmcp::model::ResourceTemplate::new(format!("{PROMPT_URI}{{name}}"), "prompt-file")
                    .with_title("A served prompt file")
                    .with_description(
                        "The Markdown source of the prompt file served as the tool and prompt NAME",
                    )
                    .with_mime_type("text/markdown"),
            ],
        ))
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, ErrorData> {
        let entry = request
            .uri
            .strip_prefix(PROMPT_URI)
            .and_then(|name| self.entry(name));
        let Some(entry) = entry else {
            return Err(ErrorData::resource_not_found(
                format!(
                    "no resource {}: this server's resources are its prompt files, {PROMPT_URI}NAME",
                    request.uri
                ),
                None,
            ));
        };
        Ok(rmcp::model::ReadResourceResult::new(vec![
            rmcp::model::ResourceContents::text(entry.text.clone(), request.uri)
                .with_mime_type("text/markdown"),
        ])
        .into())
    }

    /// Hear of changes to a resource: a prompt file's edits are told as
    /// `notifications/resources/updated` (a URI that names no file yet is kept, and told
    /// when such a file appears).
    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let mut subscriptions = self.subscriptions();
        let (mine, already) = subscriptions
            .iter()
            .filter(|(p, _)| same_peer(p, &cx.peer))
            .fold((0, false), |(n, seen), (_, uri)| {
                (n + 1, seen || *uri == request.uri)
            });
        match subscription_room(mine, subscriptions.len(), already) {
            Ok(true) => subscriptions.push((cx.peer.clone(), request.uri)),
            Ok(false) => {}
            Err(message) => return Err(ErrorData::invalid_request(message, None)),
        }
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions()
            .retain(|(p, uri)| !(*uri == request.uri && same_peer(p, &cx.peer)));
        Ok(())
    }

    async fn on_initialized(&self, cx: NotificationContext<RoleServer>) {
        self.0
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cx.peer.clone());
    }
}

/// Rescan the directories twice a second and announce a change. (Polling: it sees edits on
/// every file system, network mounts and container bind mounts included, where change
/// notifications are not delivered, and a stat per prompt file costs nothing next to a run.)
async fn watch(server: PromptServer) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let dirs = server.0.dirs.clone();
        let current = {
            let library = server.0.library.read().unwrap_or_else(|e| e.into_inner());
            library.stamp.clone()
        };
        let files =
            tokio::task::spawn_blocking(move || fingerprint(&crate::source::prompt_files(&dirs)))
                .await;
        let Ok(stamp) = files else { continue };
        if stamp == current {
            continue;
        }
        let scanning = server.clone();
        let Ok(library) =
            tokio::task::spawn_blocking(move || scan(&scanning.0.dirs, &scanning.0.told)).await
        else {
            continue;
        };
        let (changed, updated) = {
            let mut old = server.0.library.write().unwrap_or_else(|e| e.into_inner());
            let same = old.entries.len() == library.entries.len()
                && old
                    .entries
                    .iter()
                    .zip(library.entries.iter())
                    .all(|(a, b)| {
                        a.0 == b.0 && a.1.tool == b.1.tool && a.1.mcp_prompt == b.1.mcp_prompt
                    });
            // The files whose text changed, appeared or went: their resources were updated.
            let updated: Vec<String> = old
                .entries
                .keys()
                .chain(library.entries.keys())
                .filter(|name| {
                    old.entries.get(*name).map(|e| &e.text)
                        != library.entries.get(*name).map(|e| &e.text)
                })
                .cloned()
                .collect::<std::collections::BTreeSet<String>>()
                .into_iter()
                .collect();
            *old = library;
            (!same, updated)
        };
        if changed {
            server.announce().await;
        }
        if !updated.is_empty() {
            server.updated(&updated).await;
        }
    }
}

fn serve(args: &ServeArgs) -> Result<ExitCode, String> {
    let dirs = if args.dirs.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        args.dirs.clone()
    };
    for dir in &dirs {
        if !dir.exists() {
            return Err(format!("{}: no such file or directory", dir.display()));
        }
    }
    let token = match &args.token_env {
        Some(var) => match std::env::var(var) {
            // Header values lose surrounding white space on the way: compare the trimmed
            // token (a CRLF .env file leaves a `\r`).
            Ok(token) if !token.trim().is_empty() => Some(token.trim().to_owned()),
            Ok(token) if !token.is_empty() => {
                return Err(format!(
                    "--token-env {var}: the token is only white space; set it to a secret"
                ));
            }
            _ => return Err(format!("--token-env {var}: the variable is not set")),
        },
        None => None,
    };
    let http = args.http.as_deref().map(http_address).transpose()?;
    if let Some(addr) = http
        && !addr.ip().is_loopback()
        && token.is_none()
    {
        return Err(format!(
            "--http {addr} is not a loopback address: anyone who reaches it could run these prompts; set --token-env VAR to require a bearer token"
        ));
    }
    let session = Session::open(&args.models, None)?;
    // The config's MCP servers are there for prompts that bind them; a config that cannot be
    // read leaves them out (the prompts that need one then say so when called).
    let servers = match session.config.catalog() {
        Ok(catalog) => catalog.mcp_servers().clone(),
        Err(e) => {
            errln!(
                "promptforge mcp: warning: {e}; prompts that bind an MCP server (mcp/NAME) will find none"
            );
            Default::default()
        }
    };
    let rt = runtime()?;
    let told = Mutex::new(std::collections::BTreeSet::new());
    let library = scan(&dirs, &told);
    let count = library.entries.len();
    let (changes, _) = tokio::sync::broadcast::channel(16);
    let shared = Arc::new(Shared {
        dirs,
        library: RwLock::new(library),
        session,
        mcp: Arc::new(crate::session::mcp_plugins(servers)),
        seed: args.seed,
        history: (!args.no_history).then(crate::history::location).flatten(),
        runtime: rt.handle().clone(),
        peers: Mutex::new(Vec::new()),
        subscriptions: Mutex::new(Vec::new()),
        asking: ask::Asking::new(Duration::from_secs(args.answer_within))?,
        tasks: rmcp::task_manager::TaskManager::new(),
        task_after: if args.task_after.is_finite() {
            args.task_after.clamp(0.0, 86_400.0)
        } else {
            0.0
        },
        changes,
        told,
        admission: CallAdmission::new(args.max_runs, args.max_waiting, args.memory_mb),
    });
    let server = PromptServer(shared.clone());
    let result = rt.block_on(async {
        tokio::spawn(watch(server.clone()));
        let served = match http {
            None => {
                errln!(
                    "promptforge mcp: serving {} over stdio",
                    crate::ui::plural(count as u64, "prompt")
                );
                serve_stdio(server).await
            }
            Some(addr) => {
                let idle = Duration::from_secs(args.idle_timeout);
                serve_http(server, addr, token, args.allow_origin.clone(), idle).await
            }
        };
        // Runs waiting for their users' answers, and calls running as tasks, end cancelled.
        shared.asking.cancel_all().await;
        shared.tasks.shutdown();
        shared.mcp.shutdown().await;
        served
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    result.map(|()| ExitCode::SUCCESS)
}

/// `--http ADDR`: an address (`127.0.0.1:8808`, `[::1]:0`) or a host name and port
/// (`localhost:0`), the name resolved to its first address.
fn http_address(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bad = |why: String| {
        format!(
            "--http {text}: {why}; write it as HOST:PORT, such as 127.0.0.1:8808 or localhost:0"
        )
    };
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| bad("no port".to_owned()))?;
    port.parse::<u16>()
        .map_err(|_| bad(format!("`{port}` is not a port")))?;
    if host.is_empty() {
        return Err(bad("no host".to_owned()));
    }
    use std::net::ToSocketAddrs;
    text.to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad(format!("{host} has no address")))
}

/// Ctrl-C, SIGTERM (`systemctl stop`, `docker stop`, Kubernetes) or SIGHUP: the server stops
/// as it does on Ctrl-C. The handlers are registered when this is called, not when the future
/// is first polled, so a signal that comes right after the server says it is serving is not
/// the default action that kills the process.
fn stop_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        )
    };
    // Ctrl-C is registered by its first poll; the process-wide handler is ours either way.
    async move {
        #[cfg(unix)]
        {
            match signals {
                (Ok(mut term), Ok(mut hup)) => {
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        _ = term.recv() => {}
                        _ = hup.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn serve_stdio(server: PromptServer) -> Result<(), String> {
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("the MCP client did not connect: {e}"))?;
    let cancel = running.cancellation_token();
    tokio::select! {
        done = running.waiting() => done
            .map(|_| ())
            .map_err(|e| format!("the MCP connection failed: {e}")),
        () = stop_signal() => {
            // Calls in flight are cancelled through their requests, and end as cancelled.
            cancel.cancel();
            Ok(())
        }
    }
}

async fn serve_http(
    server: PromptServer,
    addr: SocketAddr,
    token: Option<String>,
    allowed_origins: Vec<String>,
    idle: Duration,
) -> Result<(), String> {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let mut config = StreamableHttpServerConfig::default();
    if !addr.ip().is_loopback() {
        // Reached under other names than localhost; the bearer token guards it.
        config = config.disable_allowed_hosts();
    }
    let factory = server.clone();
    let service: StreamableHttpService<PromptServer, LocalSessionManager> =
        StreamableHttpService::new(
            move || Ok(factory.clone()),
            Arc::new({
                let mut sessions = LocalSessionManager::default();
                sessions.session_config.keep_alive = Some(idle);
                sessions
            }),
            config,
        );
    let token = Arc::new(token);
    let origins = Arc::new(allowed_origins);
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(move |req, next| {
            let (token, origins) = (token.clone(), origins.clone());
            guard(token, origins, req, next)
        }));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("--http {addr}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("--http {addr}: {e}"))?;
    let count = server
        .0
        .library
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .entries
        .len();
    // The signals are ours before the server says it is serving.
    let stop = stop_signal();
    errln!(
        "promptforge mcp: serving {} at http://{bound}/mcp",
        crate::ui::plural(count as u64, "prompt")
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
        .map_err(|e| format!("the HTTP server failed: {e}"))
}

/// Whether a request's `Origin` may reach the server (the MCP transport's guard against DNS
/// rebinding): no header (an agent or a CLI), a page on this machine (`localhost` or a
/// loopback address, any port), or an origin given with `--allow-origin`. `null` (a sandboxed
/// or file page) and every other origin are refused.
fn origin_allowed(origin: Option<&str>, allowed: &[String]) -> bool {
    let Some(origin) = origin else {
        return true;
    };
    let origin = origin.trim();
    if allowed
        .iter()
        .any(|a| a.trim_end_matches('/').eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let Ok(url) = url::Url::parse(origin) else {
        return false;
    };
    matches!(url.scheme(), "http" | "https") && promptforge_harness::model::is_loopback(&url)
}

async fn guard(
    token: Arc<Option<String>>,
    origins: Arc<Vec<String>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .map(|v| v.to_str().unwrap_or("?"));
    if !origin_allowed(origin, &origins) {
        let origin = origin.unwrap_or_default().to_owned();
        return (
            StatusCode::FORBIDDEN,
            format!(
                "requests from origin {origin} are not accepted (pass --allow-origin {origin} to mcp serve to accept them)"
            ),
        )
            .into_response();
    }
    if let Some(expected) = token.as_ref() {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let ok = given.is_some_and(|given| constant_time_eq(given.as_bytes(), expected.as_bytes()));
        if !ok {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "a bearer token is required",
            )
                .into_response();
        }
    }
    let json_body = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|e| e.trim().eq_ignore_ascii_case("application/json"))
        });
    let response = next.run(req).await;
    // rmcp answers a JSON body it cannot read with 415, as if the media type were wrong; the
    // media type was right and the body is what is bad: 400, with JSON-RPC's parse error.
    if json_body && response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error: the request body is not a JSON-RPC message"}}"#,
        )
            .into_response();
    }
    response
}

/// Compare without returning early at the first difference, so the time taken does not tell
/// how much of a guessed token was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_has_room_of_its_own_for_subscriptions() {
        assert_eq!(subscription_room(0, 0, false), Ok(true));
        // Subscribing again to what it holds adds nothing and is no error.
        assert_eq!(subscription_room(1, 1, true), Ok(false));
        // One client's full room does not stop another.
        assert!(
            subscription_room(
                MAX_SUBSCRIPTIONS_PER_CLIENT,
                MAX_SUBSCRIPTIONS_PER_CLIENT,
                false
            )
            .is_err_and(|e| e.contains("for this client"))
        );
        assert_eq!(
            subscription_room(0, MAX_SUBSCRIPTIONS_PER_CLIENT, false),
            Ok(true)
        );
        assert!(
            subscription_room(3, MAX_SUBSCRIPTIONS, false)
                .is_err_and(|e| e.contains("on this server"))
        );
    }

    fn prompt(frontmatter: &str) -> Prompt {
        let text = format!(
            "---\nname: t\ndescription: d\npromptforge: 0\n{frontmatter}---\n\n# T\n\n## S\n\n```lua\nreturn 'x'\n```\n"
        );
        match Prompt::parse(&text) {
            Ok(p) => p,
            Err(e) => panic!("{e:?}"),
        }
    }

    #[test]
    fn free_text_prompts_take_one_string() {
        let p = prompt("");
        let schema = Json::Object(input_schema(&p.frontmatter));
        assert_eq!(schema["properties"]["args"]["type"], "string");
        let mut given = JsonObject::new();
        given.insert("args".into(), json!("hello"));
        assert_eq!(
            argument_string(&p.frontmatter, &given),
            Ok(Some("hello".into()))
        );
        assert_eq!(
            argument_string(&p.frontmatter, &JsonObject::new()),
            Ok(None)
        );
        given.insert("args".into(), json!(3));
        assert!(argument_string(&p.frontmatter, &given).is_err());
    }

    #[test]
    fn declared_args_become_typed_properties() {
        let p = prompt(
            "args:\n  topic:\n    type: string\n    description: What about\n  count:\n    type: integer\n    default: 3\n  loud:\n    type: boolean\n    optional: true\n",
        );
        let schema = Json::Object(input_schema(&p.frontmatter));
        assert_eq!(schema["properties"]["topic"]["type"], "string");
        assert_eq!(schema["properties"]["topic"]["description"], "What about");
        assert_eq!(schema["properties"]["count"]["type"], "integer");
        assert_eq!(schema["properties"]["count"]["default"], 3);
        assert_eq!(schema["required"], json!(["topic"]));
        // Fields beyond the declared args are allowed (chapter 06).
        assert!(schema.get("additionalProperties").is_none());
        let mut given = JsonObject::new();
        given.insert("count".into(), json!("7"));
        given.insert("loud".into(), json!("true"));
        let typed = typed_prompt_arguments(&p.frontmatter, &given);
        assert_eq!(
            typed.map(Json::Object),
            Ok(json!({"count": 7, "loud": true}))
        );
        given.insert("count".into(), json!("seven"));
        assert!(typed_prompt_arguments(&p.frontmatter, &given).is_err());
    }

    #[test]
    fn results_that_are_objects_are_structured() {
        let done = tool_result(&Outcome::Completed("{\"a\":1}".into()), None);
        assert_eq!(done.structured_content, Some(json!({"a": 1})));
        assert_eq!(done.is_error, Some(false));
        let plain = tool_result(&Outcome::Completed("[1]".into()), None);
        assert_eq!(plain.structured_content, None);
        let failed = tool_result(
            &Outcome::Failed(promptforge_engine::RunError::new(
                promptforge_engine::protocol::RunErrorKind::Tool,
                "tool call failure: x",
            )),
            None,
        );
        assert_eq!(failed.is_error, Some(true));
        let text = failed.content[0].as_text().map(|t| t.text.clone());
        assert_eq!(
            text.as_deref(),
            Some("the run failed with run error kind Tool: tool call failure: x")
        );
    }

    #[test]
    fn output_files_embed_as_text_or_base64_with_a_mime_type() {
        let text = OutputFile {
            prompt: "p".into(),
            path: "out/report.md".into(),
            bytes: b"# Report".to_vec(),
        };
        let json = serde_json::to_value(text.resource()).unwrap_or_default();
        assert_eq!(
            json,
            json!({"uri": "promptforge://prompts/p/output/out/report.md",
                   "mimeType": "text/markdown", "text": "# Report"})
        );
        let png = OutputFile {
            prompt: "p".into(),
            path: "chart.PNG".into(),
            bytes: vec![0x89, b'P', b'N', b'G', 0xff],
        };
        let json = serde_json::to_value(png.resource()).unwrap_or_default();
        assert_eq!(json["mimeType"], "image/png");
        assert_eq!(json["blob"], "iVBOR/8=");
        let done = tool_result(&Outcome::Completed("ok".into()), Some(&png));
        assert_eq!(done.content.len(), 2);
    }

    #[test]
    fn tool_names_keep_to_the_mcp_characters() {
        assert_eq!(tool_name("greet"), "greet");
        assert_eq!(tool_name("vfs-end-to-end"), "vfs-end-to-end");
        assert_eq!(tool_name("Research a person"), "Research_a_person");
        assert_eq!(tool_name("café"), "caf_");
        assert_eq!(tool_name(&"x".repeat(200)).len(), 128);
    }

    #[test]
    fn completions_offer_defaults_and_booleans() {
        let p = prompt(
            "args:\n  loud:\n    type: boolean\n    optional: true\n  mood:\n    type: string\n    default: calm\n",
        );
        assert_eq!(completions(&p.frontmatter, "loud", ""), ["false", "true"]);
        assert_eq!(completions(&p.frontmatter, "loud", "t"), ["true"]);
        assert_eq!(completions(&p.frontmatter, "mood", "c"), ["calm"]);
        assert!(completions(&p.frontmatter, "nope", "").is_empty());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn calls_past_the_limit_wait_then_are_refused_and_the_memory_budget_holds() {
        let ct = tokio_util::sync::CancellationToken::new();
        let admission = CallAdmission::new(2, 1, 100);
        let a = admission.enter(&ct).await.unwrap().unwrap();
        let _b = admission.enter(&ct).await.unwrap().unwrap();
        // A third call waits for a turn; a fourth finds the queue full.
        let waiting = admission.enter(&ct);
        tokio::pin!(waiting);
        assert!(
            futures_util::poll!(&mut waiting).is_pending(),
            "the third call waits"
        );
        let busy = admission.enter(&ct).await.unwrap_err();
        assert_eq!(
            busy,
            "the server is busy: 2 calls are running and 1 waiting (--max-runs, --max-waiting); try again later"
        );
        drop(a);
        let third = waiting.await.unwrap();
        assert!(third.is_some(), "a freed turn goes to the waiting call");
        // A call cancelled while it waits leaves the queue.
        let cancelled = tokio_util::sync::CancellationToken::new();
        cancelled.cancel();
        assert!(admission.enter(&cancelled).await.unwrap().is_none());
        assert_eq!(admission.waiting.load(Ordering::SeqCst), 0);
        // Over the memory budget, no new call starts while one runs; with none running, one
        // may (memory the allocator kept must not refuse every call for ever).
        let mut heavy = CallAdmission::new(8, 8, 100);
        heavy.resident = || 300 * 1024 * 1024;
        let alone = heavy.enter(&ct).await.unwrap();
        assert!(alone.is_some(), "nothing runs: the call is admitted");
        let refused = heavy.enter(&ct).await.unwrap_err();
        assert!(
            refused.starts_with(
                "the server is busy: it uses 300 MB, over its memory budget of 100 MB"
            ),
            "{refused}"
        );
        assert!(resident_bytes() > 0 || !std::path::Path::new("/proc/self/status").exists());
    }

    #[test]
    fn http_addresses_take_names() {
        assert_eq!(
            http_address("127.0.0.1:8808"),
            Ok("127.0.0.1:8808".parse().unwrap())
        );
        assert!(http_address("localhost:0").is_ok_and(|a| a.ip().is_loopback() && a.port() == 0));
        for bad in ["localhost", "localhost:x", ":80", "127.0.0.1:99999"] {
            assert!(http_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn origins_from_elsewhere_are_refused() {
        let allowed = vec!["https://app.example".to_owned()];
        for ok in [
            None,
            Some("http://localhost:5173"),
            Some("http://127.0.0.1:8808"),
            Some("http://[::1]:3000"),
            Some("https://app.example"),
            Some("HTTPS://APP.EXAMPLE"),
        ] {
            assert!(origin_allowed(ok, &allowed), "{ok:?}");
        }
        for bad in [
            Some("http://evil.example"),
            Some("null"),
            Some("http://localhost.evil.example"),
            Some("http://127.0.0.1.nip.io"),
            Some("file://"),
            Some(""),
        ] {
            assert!(!origin_allowed(bad, &allowed), "{bad:?}");
        }
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}

//! The section VM: a fresh, sandboxed Lua 5.5 state per section entry.
//!
//! [`SectionVm::new`] builds the sandbox and installs the Engine globals in the spec's order
//! (through the Lua shim in `shim/vm.lua`); [`SectionVm::load_shared`] replays the shared
//! library; [`SectionVm::start_block`] and [`SectionVm::resume`] run one block as a coroutine
//! that either finishes, fails, or suspends with a [`Request`] for the engine. Nothing here
//! performs I/O.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use mlua::{
    Function, HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, Thread, Value, VmState,
    chunk::ChunkMode, thread::ThreadStatus,
};
use promptforge_syntax::LuaRegion;
use promptforge_syntax::heading_ref::parse_heading_ref;
use serde_json::Value as Json;

use crate::json::{self, lua_type_name};
use crate::substitution::{self, Data, Sources, SysLookup};

/// The memory ceiling of one section VM.
pub const MEMORY_LIMIT: usize = 64 * 1024 * 1024;
/// Default log checkpoints per section VM.
pub const DEFAULT_LOG_EVENTS: u32 = 1024;
/// Log bytes allowed per allowed checkpoint.
pub const LOG_BYTES_PER_EVENT: u64 = 256;
/// How often (in VM instructions) the cancel flag is polled.
const CANCEL_POLL_INSTRUCTIONS: u32 = 1000;

const SHIM_NAME: &str = "=promptforge/vm.lua";
const SHIM_SOURCE: &str = include_str!("shim/vm.lua");
/// Registry key of the shim's private API table.
const API_KEY: &str = "promptforge.api";

/// A section the calling code can address by heading reference (its visible set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisibleSection {
    /// Heading level (2..=6).
    pub level: usize,
    /// Section name.
    pub name: String,
    /// List items, for a list section.
    pub items: Option<Vec<String>>,
}

/// How `argv` behaves in this VM.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgvMode {
    /// The H1 pass: `argv` is an ordinary writable global starting at this value (null = nil).
    Writable(Json),
    /// Every other section: `argv` is frozen at this value (null = nil).
    Frozen(Json),
}

/// Everything a section VM needs to be built.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// The name errors and `sys.section_name` use: a section's name, or the title in the H1 pass.
    pub section_name: String,
    /// The chain's argument string (`args`).
    pub args: String,
    /// The chain's input.
    pub argv: ArgvMode,
    /// The starting `var` (a JSON object).
    pub var: Json,
    /// The `sys` fields (a JSON object; JSON null fields read as nil).
    pub sys: Json,
    /// The Host-state snapshot, when the Host supplied one (`ui`).
    pub snapshot: Option<Json>,
    /// The sections `list_from_section` can reach.
    pub visible: Vec<VisibleSection>,
    /// Log checkpoints allowed in this VM.
    pub log_events: u32,
    /// Raised by the Host to cancel; polled from every coroutine.
    pub cancel: Arc<AtomicBool>,
    /// Labels of every Lua region of the prompt (for error locations).
    pub region_labels: Vec<String>,
    /// Seed for `math.random` in this VM (derived by the engine from the run seed).
    pub random_seed: u64,
}

/// A suspending call's request, parsed from what the shim yielded.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// A request of a kind this build does not know (rejected by the engine).
    Unknown(String),
}

/// The answer the engine gives a suspended block.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The call succeeded with this value.
    Value(Json),
}

/// The first value a block returned, rendered by the scalar return rule.
pub type BlockResult = Option<String>;

/// What kind of failure left Lua.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// An ordinary Lua failure (run error kind `Lua`, or `RequirementsUnmet` in the H1 pass).
    Lua,
    /// A log quota ran out (run error kind `Quota`).
    Quota,
    /// The Lua machinery itself failed.
    Internal,
    /// The Host cancelled the run.
    Cancelled,
}

/// A failure that left a block, the shared library load, or a read-back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuaFailure {
    /// What failed.
    pub kind: FailureKind,
    /// The run message (location-tagged where the spec says so).
    pub message: String,
    /// The traceback taken where the error was raised, when there is one.
    pub traceback: Option<String>,
}

impl LuaFailure {
    fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        LuaFailure {
            kind,
            message: message.into(),
            traceback: None,
        }
    }

    fn internal(err: &mlua::Error) -> Self {
        LuaFailure::new(FailureKind::Internal, format!("lua runtime failure: {err}"))
    }
}

/// One step of a running block.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockStep {
    /// The block suspended on a call to the engine.
    Suspended(Request),
    /// The block finished; `Some` when it returned a scalar result.
    Finished(BlockResult),
    /// The block failed.
    Failed(LuaFailure),
}

/// Where an error was raised, recorded by the message handler.
#[derive(Debug, Default)]
struct ErrorSite {
    location: Option<(String, usize)>,
    traceback: Option<String>,
}

/// The state of `prose` in the running block.
#[derive(Debug)]
enum Prose {
    /// No block is running (the shared library load): `prose` reads nil.
    Unset,
    /// The block's raw pending prose, not yet read.
    Pending(String),
    /// Rendered at the first read; every later read returns it.
    Rendered(String),
}

/// State the Rust primitives share with the VM (kept as Lua app data).
#[derive(Debug)]
struct Shared {
    prose: Prose,
    args: String,
    log_events_left: u32,
    log_bytes_left: u64,
    logs: Vec<String>,
    visible: Vec<VisibleSection>,
    snapshot: Option<Json>,
    cancel: Arc<AtomicBool>,
    site: ErrorSite,
    region_labels: Vec<String>,
    in_h1: bool,
    /// The chain's input, as substitution reads it (null = nil).
    argv: Json,
    /// The `sys` fields, as substitution reads them.
    sys: Json,
}

/// A section VM.
#[derive(Debug)]
pub struct SectionVm {
    lua: Lua,
    api: Table,
    block: Option<Thread>,
    /// The block function, handed to the runner on the block's first resume.
    pending_first: Option<Function>,
    shared: Rc<RefCell<Shared>>,
}

/// Render a block's first returned value by the scalar return rule.
fn scalar_result(value: &Value) -> Result<BlockResult, String> {
    match value {
        Value::Nil => Ok(None),
        Value::String(s) => Ok(Some(s.to_string_lossy())),
        Value::Integer(i) => Ok(Some(json::format_integer(*i))),
        Value::Number(n) => Ok(Some(json::format_number(*n))),
        Value::Boolean(b) => Ok(Some(b.to_string())),
        other => Err(format!(
            "cannot return a {} as a result",
            lua_type_name(other)
        )),
    }
}

/// Find the first `[string "{label}"]:{line}:` marker of one of the prompt's regions.
fn first_marker(message: &str, labels: &[String]) -> Option<(String, usize)> {
    let mut rest = message;
    while let Some(start) = rest.find("[string \"") {
        let after = &rest[start + 9..];
        if let Some(end) = after.find("\"]:") {
            let label = &after[..end];
            let digits: String = after[end + 3..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if labels.iter().any(|l| l == label)
                && let Ok(line) = digits.parse()
            {
                return Some((label.to_owned(), line));
            }
        }
        rest = after;
    }
    None
}

impl SectionVm {
    /// Build a section VM: the sandbox and the Engine globals (steps 1-8 of the setup order).
    pub fn new(cfg: VmConfig) -> Result<SectionVm, LuaFailure> {
        let lua = Lua::new_with(
            StdLib::STRING | StdLib::TABLE | StdLib::MATH | StdLib::COROUTINE,
            LuaOptions::new(),
        )
        .map_err(|e| LuaFailure::internal(&e))?;
        lua.set_memory_limit(MEMORY_LIMIT)
            .map_err(|e| LuaFailure::internal(&e))?;
        let in_h1 = matches!(cfg.argv, ArgvMode::Writable(_));
        let shared = Rc::new(RefCell::new(Shared {
            prose: Prose::Unset,
            args: cfg.args.clone(),
            log_events_left: cfg.log_events,
            log_bytes_left: u64::from(cfg.log_events) * LOG_BYTES_PER_EVENT,
            logs: Vec::new(),
            visible: cfg.visible.clone(),
            snapshot: cfg.snapshot.clone(),
            cancel: cfg.cancel.clone(),
            site: ErrorSite::default(),
            region_labels: cfg.region_labels.clone(),
            in_h1,
            argv: match &cfg.argv {
                ArgvMode::Writable(v) | ArgvMode::Frozen(v) => v.clone(),
            },
            sys: cfg.sys.clone(),
        }));
        let cancel = cfg.cancel.clone();
        lua.set_global_hook(
            HookTriggers::new().every_nth_instruction(CANCEL_POLL_INSTRUCTIONS),
            move |_, _| {
                if cancel.load(Ordering::Relaxed) {
                    Err(mlua::Error::RuntimeError("run cancelled".into()))
                } else {
                    Ok(VmState::Continue)
                }
            },
        )
        .map_err(|e| LuaFailure::internal(&e))?;
        let build = || -> mlua::Result<Table> {
            let host = Self::host_table(&lua, &shared)?;
            let cfg_table = lua.create_table()?;
            cfg_table.raw_set("h1", in_h1)?;
            cfg_table.raw_set("args", cfg.args.as_str())?;
            let argv = match &cfg.argv {
                ArgvMode::Writable(v) | ArgvMode::Frozen(v) => json::from_json(&lua, v)?,
            };
            cfg_table.raw_set("argv", argv)?;
            let var = match json::from_json(&lua, &cfg.var)? {
                Value::Table(t) => t,
                _ => lua.create_table()?,
            };
            cfg_table.raw_set("var", var)?;
            let sys_table = lua.create_table()?;
            let sys_null = lua.create_table()?;
            if let Json::Object(fields) = &cfg.sys {
                for (k, v) in fields {
                    if v.is_null() {
                        sys_null.raw_set(k.as_str(), true)?;
                    } else {
                        sys_table.raw_set(k.as_str(), json::from_json(&lua, v)?)?;
                    }
                }
            }
            cfg_table.raw_set("sys", sys_table)?;
            cfg_table.raw_set("sys_null", sys_null)?;
            cfg_table.raw_set("has_ui", cfg.snapshot.is_some())?;
            let shim: Function = lua
                .load(shim_bytecode())
                .set_name(SHIM_NAME)
                .set_mode(ChunkMode::Binary)
                .into_function()?;
            let api: Table = shim.call((host, cfg_table))?;
            lua.set_named_registry_value(API_KEY, &api)?;
            crate::order::install(&lua)?;
            // Deterministic math.random: seeded per VM from the run seed.
            let math: Table = lua.globals().raw_get("math")?;
            let seed_fn: Function = math.raw_get("randomseed")?;
            // Lua 5.5 takes the seed as an integer; reinterpreting the bits keeps all 64.
            seed_fn.call::<()>(i64::from_ne_bytes(cfg.random_seed.to_ne_bytes()))?;
            Ok(api)
        };
        let api = build().map_err(|e| LuaFailure::internal(&e))?;
        Ok(SectionVm {
            lua,
            api,
            block: None,
            pending_first: None,
            shared,
        })
    }

    fn host_table(lua: &Lua, shared: &Rc<RefCell<Shared>>) -> mlua::Result<Table> {
        let host = lua.create_table()?;

        let s = shared.clone();
        host.raw_set(
            "control_pending",
            lua.create_function(move |_, ()| Ok(s.borrow().cancel.load(Ordering::Relaxed)))?,
        )?;

        host.raw_set(
            "normalize",
            lua.create_function(|_, e: Value| {
                Ok(match e {
                    Value::Error(err) => (
                        Some("internal".to_owned()),
                        Some(format!("lua runtime failure: {err}")),
                    ),
                    _ => (None, None),
                })
            })?,
        )?;

        host.raw_set(
            "json_copy",
            lua.create_function(|lua, (value, path): (Value, String)| {
                match json::to_json(&value, &path) {
                    Ok(data) => Ok((json::from_json(lua, &data)?, None)),
                    Err(not_json) => Ok((
                        Value::Nil,
                        Some(format!(
                            "{} must be JSON data, got {}",
                            not_json.path, not_json.type_name
                        )),
                    )),
                }
            })?,
        )?;

        host.raw_set(
            "debug_notation",
            lua.create_function(|_, key: Value| {
                Ok(match key {
                    Value::Integer(i) => format!("Integer({i})"),
                    Value::Number(n) => format!("Number({n:?})"),
                    Value::Boolean(b) => format!("Boolean({b})"),
                    other => other.type_name().to_string(),
                })
            })?,
        )?;

        let s = shared.clone();
        host.raw_set(
            "log",
            lua.create_function(move |_, (count, message): (usize, Value)| {
                let mut st = s.borrow_mut();
                Ok(check_log(&mut st, count, &message))
            })?,
        )?;

        let s = shared.clone();
        host.raw_set(
            "ui",
            lua.create_function(move |lua, ()| {
                let snapshot = s.borrow().snapshot.clone();
                match snapshot {
                    Some(value) => json::from_json(lua, &value),
                    None => Ok(Value::Nil),
                }
            })?,
        )?;

        let s = shared.clone();
        host.raw_set(
            "list_from_section",
            lua.create_function(move |lua, heading: Value| {
                let st = s.borrow();
                let text = match &heading {
                    Value::String(text) => text.to_string_lossy(),
                    other => {
                        return Ok((
                            Value::Nil,
                            Some(format!(
                                "heading must be a string, got {}",
                                lua_type_name(other)
                            )),
                        ));
                    }
                };
                let reference = match parse_heading_ref(&text) {
                    Ok(r) => r,
                    Err(e) => return Ok((Value::Nil, Some(e.to_string()))),
                };
                let Some(section) = st
                    .visible
                    .iter()
                    .find(|v| v.level == reference.level && v.name == reference.name)
                else {
                    let list = st
                        .visible
                        .iter()
                        .map(|v| format!("{} {}", "#".repeat(v.level), v.name))
                        .collect::<Vec<_>>()
                        .join(", ");
                    return Ok((
                        Value::Nil,
                        Some(format!(
                            "section heading `{reference}` not found; available sections: {list}"
                        )),
                    ));
                };
                match &section.items {
                    Some(items) => {
                        let t = lua.create_sequence_from(items.iter().map(String::as_str))?;
                        Ok((Value::Table(t), None))
                    }
                    None => Ok((
                        Value::Nil,
                        Some(format!(
                            "section `{}` has no pre-parsed items",
                            section.name
                        )),
                    )),
                }
            })?,
        )?;

        let s = shared.clone();
        host.raw_set(
            "on_error",
            lua.create_function(move |lua, e: Value| {
                let labels = s.borrow().region_labels.clone();
                let mut location = None;
                let mut level = 1;
                while location.is_none() {
                    let Some(frame) = lua.inspect_stack(level, |d| {
                        let source = d.source().source.map(|s| s.into_owned());
                        (source, d.current_line())
                    }) else {
                        break;
                    };
                    if let (Some(source), Some(line)) = frame
                        && labels.contains(&source)
                    {
                        location = Some((source, line));
                    }
                    level += 1;
                }
                let traceback = lua.traceback(None, 1).ok().map(|t| t.to_string_lossy());
                s.borrow_mut().site = ErrorSite {
                    location,
                    traceback,
                };
                Ok(e)
            })?,
        )?;

        let s = shared.clone();
        host.raw_set(
            "render_prose",
            lua.create_function(move |lua, ()| {
                let template = {
                    let st = s.borrow();
                    match &st.prose {
                        Prose::Unset => return Ok((Value::Nil, None)),
                        Prose::Rendered(text) => {
                            return Ok((Value::String(lua.create_string(text)?), None));
                        }
                        Prose::Pending(template) => template.clone(),
                    }
                };
                match render_prose(lua, &s, &template)? {
                    Ok(text) => {
                        let value = Value::String(lua.create_string(&text)?);
                        s.borrow_mut().prose = Prose::Rendered(text);
                        Ok((value, None))
                    }
                    Err(message) => Ok((Value::Nil, Some(message))),
                }
            })?,
        )?;

        Ok(host)
    }

    /// Replay the shared library (step 9). A scalar return is discarded; any failure is `Lua`.
    pub fn load_shared(&mut self, region: &LuaRegion) -> Result<(), LuaFailure> {
        let f = self.load_region(region)?;
        let run: Function = self
            .api
            .raw_get("run_shared")
            .map_err(|e| LuaFailure::internal(&e))?;
        let values: MultiValue = run.call(f).map_err(|e| LuaFailure::internal(&e))?;
        let mut values = values.into_iter();
        let ok = matches!(values.next(), Some(Value::Boolean(true)));
        let first = values.next().unwrap_or(Value::Nil);
        if ok {
            return match scalar_result(&first) {
                Ok(_) => Ok(()),
                Err(message) => Err(LuaFailure::new(FailureKind::Lua, message)),
            };
        }
        Err(self.failure_from(first))
    }

    fn load_region(&self, region: &LuaRegion) -> Result<Function, LuaFailure> {
        self.lua
            .load(&region.bytecode[..])
            .set_name(region.label.as_str())
            .set_mode(ChunkMode::Binary)
            .into_function()
            .map_err(|e| LuaFailure::internal(&e))
    }

    /// Start a block as a new coroutine. `prose` is its raw pending prose ('' when none).
    pub fn start_block(&mut self, region: &LuaRegion, prose: &str) -> Result<(), LuaFailure> {
        let f = self.load_region(region)?;
        let runner: Function = self
            .api
            .raw_get("run_block")
            .map_err(|e| LuaFailure::internal(&e))?;
        let thread = self
            .lua
            .create_thread(runner)
            .map_err(|e| LuaFailure::internal(&e))?;
        // The first resume passes the block function to the runner.
        self.shared.borrow_mut().prose = Prose::Pending(prose.to_owned());
        self.block = Some(thread);
        self.pending_first = Some(f);
        Ok(())
    }

    /// Run the current block until it finishes, fails, or suspends.
    pub fn resume(&mut self, answer: Option<Result<Json, Json>>) -> BlockStep {
        let Some(thread) = self.block.clone() else {
            return BlockStep::Failed(LuaFailure::new(
                FailureKind::Internal,
                "no block is running",
            ));
        };
        let result: mlua::Result<MultiValue> = match self.pending_first.take() {
            Some(f) => thread.resume(f),
            None => {
                let args = match answer {
                    Some(Ok(value)) => json::from_json(&self.lua, &value).map(|v| (true, v)),
                    Some(Err(err)) => json::from_json(&self.lua, &err).map(|v| (false, v)),
                    None => Ok((true, Value::Nil)),
                };
                match args {
                    Ok(args) => thread.resume(args),
                    Err(e) => Err(e),
                }
            }
        };
        let values = match result {
            Ok(values) => values,
            Err(e) => {
                self.block = None;
                return BlockStep::Failed(self.classify_mlua_error(&e));
            }
        };
        if thread.status() == ThreadStatus::Resumable {
            let request = values.into_iter().next().unwrap_or(Value::Nil);
            return BlockStep::Suspended(parse_request(&request));
        }
        self.block = None;
        self.shared.borrow_mut().prose = Prose::Unset;
        let mut values = values.into_iter();
        let ok = matches!(values.next(), Some(Value::Boolean(true)));
        let first = values.next().unwrap_or(Value::Nil);
        if ok {
            match scalar_result(&first) {
                Ok(result) => BlockStep::Finished(result),
                Err(message) => BlockStep::Failed(LuaFailure::new(FailureKind::Lua, message)),
            }
        } else {
            BlockStep::Failed(self.failure_from(first))
        }
    }

    fn classify_mlua_error(&self, e: &mlua::Error) -> LuaFailure {
        if self.shared.borrow().cancel.load(Ordering::Relaxed) {
            return LuaFailure::new(FailureKind::Cancelled, "cancelled");
        }
        match e {
            mlua::Error::MemoryError(message) => LuaFailure::new(FailureKind::Lua, message.clone()),
            other => LuaFailure::internal(other),
        }
    }

    /// Classify an error value that left a block or the shared library load.
    fn failure_from(&self, e: Value) -> LuaFailure {
        if self.shared.borrow().cancel.load(Ordering::Relaxed) {
            return LuaFailure::new(FailureKind::Cancelled, "cancelled");
        }
        let site = std::mem::take(&mut self.shared.borrow_mut().site);
        let labels = self.shared.borrow().region_labels.clone();
        let classify: mlua::Result<Function> = self.api.raw_get("classify");
        let classified = classify
            .and_then(|f| f.call::<(String, Option<String>, Option<String>, bool)>(e.clone()));
        let (kind, message, quota, is_value) = match classified {
            Ok(c) => c,
            Err(err) => return LuaFailure::internal(&err),
        };
        let message = match message {
            Some(m) => m,
            None => match &e {
                Value::String(s) => s.to_string_lossy(),
                Value::Integer(i) => json::format_integer(*i),
                Value::Number(n) => json::format_number(*n),
                Value::Nil => "nil".to_owned(),
                other => format!("(error object is a {} value)", lua_type_name(other)),
            },
        };
        let failure_kind = match (kind.as_str(), quota.is_some()) {
            (_, true) => FailureKind::Quota,
            ("internal", _) => FailureKind::Internal,
            _ => FailureKind::Lua,
        };
        // The run message opens with a `{location}:{line}: ` tag: taken from the first
        // region marker in the text, or, for an Engine error value, from where it was raised.
        let tagged = if let Some((label, line)) = first_marker(&message, &labels) {
            format!("{label}:{line}: {message}")
        } else if let (true, Some((label, line))) = (is_value, &site.location) {
            format!("{label}:{line}: {message}")
        } else {
            message
        };
        LuaFailure {
            kind: failure_kind,
            message: tagged,
            traceback: site.traceback,
        }
    }

    /// Read `var` back: fails when the global was reassigned; otherwise the JSON data.
    pub fn read_back_var(&self) -> Result<Json, LuaFailure> {
        let ok: bool = self
            .api
            .raw_get::<Function>("var_ok")
            .and_then(|f| f.call(()))
            .map_err(|e| LuaFailure::internal(&e))?;
        if !ok {
            return Err(LuaFailure::new(FailureKind::Lua, VAR_REASSIGNED));
        }
        let data: Value = self
            .api
            .raw_get("var_data")
            .map_err(|e| LuaFailure::internal(&e))?;
        json::to_json(&data, "var").map_err(|not_json| {
            LuaFailure::new(
                FailureKind::Lua,
                format!(
                    "{} must be JSON data, got {}",
                    not_json.path, not_json.type_name
                ),
            )
        })
    }

    /// Read `argv` back at the end of the H1 pass (the freeze).
    pub fn read_back_argv(&self) -> Result<Json, LuaFailure> {
        let value: Value = self
            .api
            .raw_get::<Function>("argv")
            .and_then(|f| f.call(()))
            .map_err(|e| LuaFailure::internal(&e))?;
        json::to_json(&value, "argv").map_err(|not_json| {
            LuaFailure::new(
                FailureKind::Lua,
                format!(
                    "{} must be JSON data, got {}",
                    not_json.path, not_json.type_name
                ),
            )
        })
    }

    /// Take the log checkpoints recorded since the last call.
    pub fn take_logs(&mut self) -> Vec<String> {
        std::mem::take(&mut self.shared.borrow_mut().logs)
    }

    /// Whether this VM runs the H1 pass.
    pub fn in_h1(&self) -> bool {
        self.shared.borrow().in_h1
    }
}

/// The compiled shim, compiled once per process.
fn shim_bytecode() -> &'static [u8] {
    static BYTECODE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTECODE.get_or_init(|| {
        let lua = Lua::new_with(StdLib::NONE, LuaOptions::new());
        lua.ok()
            .and_then(|lua| {
                lua.load(SHIM_SOURCE)
                    .set_name(SHIM_NAME)
                    .into_function()
                    .ok()
                    .map(|f| f.dump(false))
            })
            .unwrap_or_default()
    })
}

fn parse_request(value: &Value) -> Request {
    match value {
        Value::Table(t) => Request::Unknown(
            t.raw_get::<Option<String>>("op")
                .ok()
                .flatten()
                .unwrap_or_default(),
        ),
        other => Request::Unknown(lua_type_name(other).to_owned()),
    }
}

/// The `log` rules and quotas. Returns the error message and the quota it exhausted, if any.
fn check_log(st: &mut Shared, count: usize, message: &Value) -> (Option<String>, Option<String>) {
    if count != 1 {
        return (Some("log expects exactly one argument".into()), None);
    }
    if st.log_events_left == 0 {
        return (
            Some("lua log event budget exceeded".into()),
            Some("event".into()),
        );
    }
    st.log_events_left -= 1;
    let text = match message {
        Value::String(s) => match s.to_str() {
            Ok(text) => text.to_owned(),
            Err(_) => return (Some("log message must be a UTF-8 string".into()), None),
        },
        _ => return (Some("log message must be a UTF-8 string".into()), None),
    };
    if text.chars().count() > 256 {
        return (
            Some("log message must be at most 256 characters".into()),
            None,
        );
    }
    if text
        .chars()
        .any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}')
    {
        return (
            Some("log message must not contain newline or control characters".into()),
            None,
        );
    }
    let bytes = text.len() as u64;
    if bytes > st.log_bytes_left {
        return (
            Some("lua log cumulative byte budget exceeded".into()),
            Some("byte".into()),
        );
    }
    st.log_bytes_left -= bytes;
    st.logs.push(text);
    (None, None)
}

/// Render the running block's prose with the section's current state. The `var` read-back
/// runs first: a reassigned `var` fails the read.
fn render_prose(
    lua: &Lua,
    shared: &Rc<RefCell<Shared>>,
    template: &str,
) -> mlua::Result<Result<String, String>> {
    let api: Table = lua.named_registry_value(API_KEY)?;
    let var_ok: bool = api.raw_get::<Function>("var_ok")?.call(())?;
    if !var_ok {
        return Ok(Err(VAR_REASSIGNED.to_owned()));
    }
    let var_data: Value = api.raw_get("var_data")?;
    let (args, argv, sys) = {
        let st = shared.borrow();
        (st.args.clone(), st.argv.clone(), st.sys.clone())
    };
    let sys_lookup = |name: &str| -> SysLookup {
        match sys.get(name) {
            Some(value) => match json::from_json(lua, value) {
                Ok(v) => SysLookup::Value(v),
                Err(_) => SysLookup::Value(Value::Nil),
            },
            None => SysLookup::Unknown,
        }
    };
    let sources = Sources {
        args: &args,
        argv: if argv.is_null() {
            None
        } else {
            Some(Data::Json(&argv))
        },
        item: None,
        var: Data::Lua(var_data),
        sys: &sys_lookup,
        globals: lua.globals(),
    };
    Ok(substitution::render(template, &sources).map_err(|e| e.message()))
}

/// The read-back failure for a reassigned `var`.
const VAR_REASSIGNED: &str = "the `var` global was reassigned; write `var.<field>` instead";

//! The scripted model of `promptforge run --script FILE` (conformance README, "Scripted model
//! file").
//!
//! ```json
//! {
//!   "model": {"id": "scripted", "context": 128000, "thinking": "Switchable",
//!             "description": "a scripted model"},
//!   "replies": [
//!     "a plain text reply",
//!     {"text": "optional text", "tool_calls": [{"id": "call_1", "name": "search", "arguments": {"q": "x"}}]},
//!     {"when": "substring", "text": "reply for the first round whose last user message contains it"},
//!     {"when_tool": "substring", "text": "reply for the first round whose latest tool result contains it"},
//!     {"echo": true},
//!     {"fail": "status", "status": 503},
//!     {"fail": "overflow"},
//!     {"text": "", "finish_reason": "length"}
//!   ]
//! }
//! ```
//!
//! How a round picks its reply: first the earliest unused entry with a condition the round
//! meets: `when`, a text the round's last user message contains (text parts joined), or
//! `when_tool`, a text the round's latest tool result (its last `tool` record) contains;
//! otherwise the earliest unused entry without a condition. Entries with a condition are kept
//! for their round and never answer in order. A round that finds nothing fails like a
//! provider whose reply cannot be understood.
//!
//! Reply forms: a string is a text reply with finish reason `stop`; an object may hold `text`
//! (default empty), `tool_calls` (each `{id, name, arguments}`, `arguments` optional and passed
//! through as given, so a script can hand the engine malformed arguments), `finish_reason`
//! (default `tool_calls` when there are calls, else `stop`; `null` for none) and `usage`
//! (`{prompt_tokens, completion_tokens, reasoning_tokens?}`, an extension for precheck tests);
//! `{echo: true}` replies with the round's last user message; `{fail: "status", status: N}`
//! fails as a provider answering HTTP status N (300 to 599) with an empty body would;
//! `{fail: "overflow"}` fails as a provider rejecting the request as too long for its context
//! window (status 400). Every object may also hold one of `when` and `when_tool`. Other keys
//! are errors.
//!
//! `model` is optional (without it the Host has no current model); it needs `id`, and takes
//! `context` (default 128000), `thinking` (`Never`, `Always` or `Switchable`, default
//! `Switchable`) and `description` (default empty).

use std::fmt;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use serde_json::{Map, Value};

use super::error::{ModelError, classify_http_failure};
use super::provider::{ModelFuture, ModelProvider, ReplyObserver};
use super::types::{
    ChatRequest, FinishReason, ModelDescription, ProviderKind, Reply, ThinkingCapability, ToolCall,
    Usage,
};

/// A script file that could not be read or understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ScriptError {
    message: String,
}

impl ScriptError {
    fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

/// What one script entry answers.
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptedReply {
    /// A reply: text, tool calls, finish reason, usage.
    Reply(Reply),
    /// Reply with the round's last user message.
    Echo,
    /// Fail as a provider answering this HTTP status.
    Status(u16),
    /// Fail as a provider rejecting the request as too long for the context window.
    Overflow,
}

/// The round a conditional entry is kept for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// `when`: the first round whose last user message contains this text.
    User(String),
    /// `when_tool`: the first round whose latest tool result contains this text.
    Tool(String),
}

impl Condition {
    fn holds(&self, request: &ChatRequest) -> bool {
        match self {
            Condition::User(text) => request
                .last_user_text()
                .is_some_and(|u| u.contains(text.as_str())),
            Condition::Tool(text) => request
                .last_tool_text()
                .is_some_and(|t| t.contains(text.as_str())),
        }
    }
}

/// One entry of `replies`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptEntry {
    /// Kept for the first round that meets it (`when` or `when_tool`).
    pub when: Option<Condition>,
    /// What the entry answers.
    pub reply: ScriptedReply,
}

/// A parsed script file.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    /// The Host's current model, if the script names one.
    pub model: Option<ModelDescription>,
    /// The replies, in file order.
    pub replies: Vec<ScriptEntry>,
}

type Fields = Map<String, Value>;

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn check_keys(fields: &Fields, allowed: &[&str], at: &str) -> Result<(), ScriptError> {
    for key in fields.keys() {
        if !allowed.contains(&key.as_str()) {
            return Err(ScriptError::new(format!(
                "{at}: unknown key `{key}`; expected one of: {}",
                allowed.join(", ")
            )));
        }
    }
    Ok(())
}

fn string_field(fields: &Fields, key: &str, at: &str) -> Result<Option<String>, ScriptError> {
    match fields.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ScriptError::new(format!(
            "{at}: `{key}` must be a string, got {}",
            type_name(other)
        ))),
    }
}

fn count_field(value: &Value, at: &str, key: &str) -> Result<u64, ScriptError> {
    value.as_u64().ok_or_else(|| {
        ScriptError::new(format!(
            "{at}: `{key}` must be a whole number of tokens, got {value}"
        ))
    })
}

impl Script {
    /// Parse a script from its JSON text.
    pub fn parse(text: &str) -> Result<Self, ScriptError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| ScriptError::new(format!("the script is not valid JSON: {e}")))?;
        let Value::Object(top) = value else {
            return Err(ScriptError::new(format!(
                "the script must be a JSON object with `model` and `replies`, got {}",
                type_name(&value)
            )));
        };
        check_keys(&top, &["model", "replies"], "the script")?;
        let model = match top.get("model") {
            None | Some(Value::Null) => None,
            Some(model) => Some(parse_model(model)?),
        };
        let replies = match top.get("replies") {
            None => Vec::new(),
            Some(Value::Array(entries)) => entries
                .iter()
                .enumerate()
                .map(|(i, entry)| parse_entry(entry, i + 1))
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(ScriptError::new(format!(
                    "the script's `replies` must be an array, got {}",
                    type_name(other)
                )));
            }
        };
        Ok(Self { model, replies })
    }

    /// Read and parse a script file.
    pub fn load(path: &Path) -> Result<Self, ScriptError> {
        let bytes =
            crate::limits::read_capped(path, crate::limits::SCRIPT_FILE_CAP).map_err(|e| {
                let detail = match e {
                    crate::limits::ReadError::Io(err) => err.to_string(),
                    other => other.describe(path),
                };
                ScriptError::new(format!(
                    "cannot read the script {}: {detail}",
                    path.display()
                ))
            })?;
        let text = String::from_utf8(bytes).map_err(|_| {
            ScriptError::new(format!("the script {} is not valid UTF-8", path.display()))
        })?;
        Self::parse(&text)
            .map_err(|e| ScriptError::new(format!("script {}: {}", path.display(), e.message)))
    }
}

fn parse_model(value: &Value) -> Result<ModelDescription, ScriptError> {
    let at = "the script's `model`";
    let Value::Object(fields) = value else {
        return Err(ScriptError::new(format!(
            "{at} must be an object, got {}",
            type_name(value)
        )));
    };
    check_keys(fields, &["id", "context", "thinking", "description"], at)?;
    let id = string_field(fields, "id", at)?
        .ok_or_else(|| ScriptError::new(format!("{at} must set `id`")))?;
    if id.is_empty() || id.chars().any(char::is_control) {
        return Err(ScriptError::new(format!(
            "{at}: `id` must be non-empty text with no control characters"
        )));
    }
    let context = match fields.get("context") {
        None => 128_000,
        Some(v) => {
            let n = count_field(v, at, "context")?;
            if n == 0 {
                return Err(ScriptError::new(format!(
                    "{at}: `context` must be at least 1"
                )));
            }
            n
        }
    };
    let thinking = match string_field(fields, "thinking", at)?.as_deref() {
        None | Some("Switchable") => ThinkingCapability::Switchable,
        Some("Never") => ThinkingCapability::Never,
        Some("Always") => ThinkingCapability::Always,
        Some(other) => {
            return Err(ScriptError::new(format!(
                "{at}: `thinking` must be Never, Always or Switchable, got \"{other}\""
            )));
        }
    };
    let description = string_field(fields, "description", at)?.unwrap_or_default();
    Ok(ModelDescription {
        model: id.clone(),
        id,
        provider: ProviderKind::Scripted,
        base_url: None,
        api_key_env: None,
        context,
        thinking,
        description,
        price: None,
    })
}

fn parse_entry(value: &Value, n: usize) -> Result<ScriptEntry, ScriptError> {
    let at = format!("replies[{n}]");
    let fields = match value {
        Value::String(text) => {
            return Ok(ScriptEntry {
                when: None,
                reply: ScriptedReply::Reply(Reply::text(text.clone())),
            });
        }
        Value::Object(fields) => fields,
        other => {
            return Err(ScriptError::new(format!(
                "{at} must be a string or an object, got {}",
                type_name(other)
            )));
        }
    };
    let when = match (
        string_field(fields, "when", &at)?,
        string_field(fields, "when_tool", &at)?,
    ) {
        (Some(_), Some(_)) => {
            return Err(ScriptError::new(format!(
                "{at}: give `when` or `when_tool`, not both"
            )));
        }
        (Some(text), None) => Some(Condition::User(text)),
        (None, Some(text)) => Some(Condition::Tool(text)),
        (None, None) => None,
    };
    if let Some(fail) = fields.get("fail") {
        let reply = match fail.as_str() {
            Some("status") => {
                check_keys(fields, &["when", "when_tool", "fail", "status"], &at)?;
                let status = fields
                    .get("status")
                    .and_then(Value::as_u64)
                    .and_then(|s| u16::try_from(s).ok())
                    .filter(|s| (300..=599).contains(s))
                    .ok_or_else(|| {
                        ScriptError::new(format!(
                            "{at}: `fail: \"status\"` needs `status`, an HTTP status from 300 to 599"
                        ))
                    })?;
                ScriptedReply::Status(status)
            }
            Some("overflow") => {
                check_keys(fields, &["when", "when_tool", "fail"], &at)?;
                ScriptedReply::Overflow
            }
            _ => {
                return Err(ScriptError::new(format!(
                    "{at}: `fail` must be \"status\" or \"overflow\", got {fail}"
                )));
            }
        };
        return Ok(ScriptEntry { when, reply });
    }
    if let Some(echo) = fields.get("echo") {
        check_keys(fields, &["when", "when_tool", "echo"], &at)?;
        if echo != &Value::Bool(true) {
            return Err(ScriptError::new(format!(
                "{at}: `echo` must be true, got {echo}"
            )));
        }
        return Ok(ScriptEntry {
            when,
            reply: ScriptedReply::Echo,
        });
    }
    check_keys(
        fields,
        &[
            "when",
            "when_tool",
            "text",
            "tool_calls",
            "finish_reason",
            "usage",
        ],
        &at,
    )?;
    if !fields.contains_key("text") && !fields.contains_key("tool_calls") {
        return Err(ScriptError::new(format!(
            "{at} must be a string, or an object with `text` and/or `tool_calls`, `echo`, or `fail`"
        )));
    }
    let text = string_field(fields, "text", &at)?.unwrap_or_default();
    let tool_calls = match fields.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(i, call)| parse_call(call, &format!("{at}.tool_calls[{}]", i + 1)))
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ScriptError::new(format!(
                "{at}: `tool_calls` must be an array, got {}",
                type_name(other)
            )));
        }
    };
    let finish_reason = match fields.get("finish_reason") {
        None if tool_calls.is_empty() => Some(FinishReason::Stop),
        None => Some(FinishReason::ToolCalls),
        Some(Value::Null) => None,
        Some(Value::String(reason)) => Some(FinishReason::from(reason.as_str())),
        Some(other) => {
            return Err(ScriptError::new(format!(
                "{at}: `finish_reason` must be a string or null, got {}",
                type_name(other)
            )));
        }
    };
    let usage = match fields.get("usage") {
        None | Some(Value::Null) => None,
        Some(usage) => Some(parse_usage(usage, &format!("{at}.usage"))?),
    };
    Ok(ScriptEntry {
        when,
        reply: ScriptedReply::Reply(Reply {
            text,
            tool_calls,
            finish_reason,
            usage,
            reasoning: Vec::new(),
        }),
    })
}

fn parse_call(value: &Value, at: &str) -> Result<ToolCall, ScriptError> {
    let Value::Object(fields) = value else {
        return Err(ScriptError::new(format!(
            "{at} must be an object with `id`, `name` and `arguments`, got {}",
            type_name(value)
        )));
    };
    check_keys(fields, &["id", "name", "arguments"], at)?;
    let id = string_field(fields, "id", at)?
        .ok_or_else(|| ScriptError::new(format!("{at} must set `id`")))?;
    let name = string_field(fields, "name", at)?
        .ok_or_else(|| ScriptError::new(format!("{at} must set `name`")))?;
    let arguments = fields
        .get("arguments")
        .cloned()
        .unwrap_or_else(|| Value::Object(Map::new()));
    Ok(ToolCall {
        id,
        name,
        arguments,
    })
}

fn parse_usage(value: &Value, at: &str) -> Result<Usage, ScriptError> {
    let Value::Object(fields) = value else {
        return Err(ScriptError::new(format!(
            "{at} must be an object, got {}",
            type_name(value)
        )));
    };
    check_keys(
        fields,
        &["prompt_tokens", "completion_tokens", "reasoning_tokens"],
        at,
    )?;
    let get = |key: &str| -> Result<Option<u64>, ScriptError> {
        fields.get(key).map(|v| count_field(v, at, key)).transpose()
    };
    Ok(Usage {
        prompt_tokens: get("prompt_tokens")?.unwrap_or(0),
        completion_tokens: get("completion_tokens")?.unwrap_or(0),
        reasoning_tokens: get("reasoning_tokens")?,
    })
}

#[derive(Debug)]
struct State {
    entries: Vec<(ScriptEntry, bool)>,
    /// The unused entries with a `when`, in script order (a round tries them first).
    when_unused: Vec<usize>,
    /// Every entry without a `when` before this index is used: plain entries are only ever
    /// taken first-unused-first, so a round finds the next one without scanning from the top
    /// (a long script played in order stays linear, not quadratic).
    plain_from: usize,
    rounds: usize,
    requests: Vec<ChatRequest>,
}

/// A [`ModelProvider`] that answers rounds from a [`Script`], in the order the engine issues
/// them. It records every request it receives ([`requests`](Self::requests)) for tests.
pub struct ScriptedModel {
    model: Option<ModelDescription>,
    state: Mutex<State>,
}

impl fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedModel")
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl ScriptedModel {
    /// A scripted model playing `script`.
    pub fn new(script: Script) -> Self {
        let entries: Vec<(ScriptEntry, bool)> =
            script.replies.into_iter().map(|e| (e, false)).collect();
        let when_unused = entries
            .iter()
            .enumerate()
            .filter(|(_, (entry, _))| entry.when.is_some())
            .map(|(i, _)| i)
            .collect();
        Self {
            model: script.model,
            state: Mutex::new(State {
                entries,
                when_unused,
                plain_from: 0,
                rounds: 0,
                requests: Vec::new(),
            }),
        }
    }

    /// Parse `text` and play it.
    pub fn from_json(text: &str) -> Result<Self, ScriptError> {
        Script::parse(text).map(Self::new)
    }

    /// Load the script file at `path` and play it.
    pub fn load(path: &Path) -> Result<Self, ScriptError> {
        Script::load(path).map(Self::new)
    }

    /// The Host's current model the script names, if any.
    pub fn model(&self) -> Option<&ModelDescription> {
        self.model.as_ref()
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.lock().requests.clone()
    }

    /// How many entries no round has used yet.
    pub fn remaining(&self) -> usize {
        self.lock().entries.iter().filter(|(_, used)| !used).count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn answer(&self, request: &ChatRequest) -> Result<Reply, ModelError> {
        let last_user = request.last_user_text();
        let mut state = self.lock();
        state.rounds += 1;
        let round = state.rounds;
        state.requests.push(request.clone());
        // The first unused entry whose `when` holds, else the first unused one without a
        // `when`.
        let by_when = state.when_unused.iter().position(|&i| {
            state
                .entries
                .get(i)
                .and_then(|(entry, _)| entry.when.as_ref())
                .is_some_and(|c| c.holds(request))
        });
        let pick = match by_when {
            Some(slot) => Some(state.when_unused.remove(slot)),
            None => {
                let from = state.plain_from;
                let next = state
                    .entries
                    .iter()
                    .skip(from)
                    .position(|(entry, used)| !used && entry.when.is_none())
                    .map(|offset| from + offset);
                if let Some(i) = next {
                    state.plain_from = i + 1;
                }
                next
            }
        };
        let Some(pick) = pick else {
            return Err(ModelError::malformed(format!(
                "the scripted model has no reply left for round {round}"
            )));
        };
        let Some((entry, used)) = state.entries.get_mut(pick) else {
            return Err(ModelError::malformed("the scripted model lost its place"));
        };
        *used = true;
        match &entry.reply {
            ScriptedReply::Reply(reply) => Ok(reply.clone()),
            ScriptedReply::Echo => Ok(Reply::text(last_user.unwrap_or_default())),
            ScriptedReply::Status(status) => Err(classify_http_failure(*status, "")),
            ScriptedReply::Overflow => Err(ModelError::ContextOverflow { status: 400 }),
        }
    }
}

impl ModelProvider for ScriptedModel {
    fn answer_at_once(&self, request: &ChatRequest) -> Option<Result<Reply, ModelError>> {
        Some(self.answer(request))
    }

    fn binds_in_order(&self) -> bool {
        true
    }

    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
        observer: &'a dyn ReplyObserver,
    ) -> ModelFuture<'a> {
        let result = self.answer(request);
        if let Ok(reply) = &result
            && !reply.text.is_empty()
        {
            observer.text(&reply.text);
        }
        Box::pin(std::future::ready(result))
    }
}

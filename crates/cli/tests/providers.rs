#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point
//! The same prompt runs unchanged against the scripted model, the OpenAI-shaped test server and
//! the Anthropic-shaped test server.
//!
//! Each prompt here is run three times through the real `promptforge` binary: with `--script`
//! (a script file answering the rounds in order), with `--model fake-openai` and with
//! `--model fake-anthropic`, the last two defined by a `promptforge.toml` in the run's working
//! directory that points at fake servers on 127.0.0.1 started by the test. The three runs must
//! complete with the same result text.
//!
//! The fake servers speak each provider's real wire format: they check every request against
//! the provider's request schema (roles, alternation, where the system text goes, the token
//! cap field, temperature range, the thinking switch, headers) and against the round the prompt
//! is expected to send next (the merged messages, the sampling options and the thinking switch
//! of that round). A request that breaks either is answered with status 400 and recorded as a
//! violation; a good one is answered with a server-sent event stream in the provider's shape,
//! split into several deltas, with reasoning deltas when thinking is on (which must never reach
//! the reply).

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use serde_json::{Value, json};
use support::{LocalServer, promptforge};

/// The wire model names the catalog entries send.
const OPENAI_MODEL: &str = "fake-gpt";
const ANTHROPIC_MODEL: &str = "fake-claude";
/// The Anthropic entry's `max_output_tokens`: the cap sent when a round sets none.
const ANTHROPIC_DEFAULT_MAX: u64 = 1000;
/// The Anthropic entry's `thinking_budget`.
const ANTHROPIC_BUDGET: u64 = 1024;
/// How long one run of the binary may take before it counts as hung.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// What a round looks like once the wire format is taken off.
// ---------------------------------------------------------------------------------------------

/// One round as the model sees it, whatever the wire format.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    /// The system text, if any.
    system: Option<String>,
    /// The conversation turns after the system text: `(role, text)`.
    turns: Vec<(String, String)>,
    /// Sampling temperature, if sent.
    temperature: Option<f64>,
    /// The token cap, if sent (Anthropic always sends one).
    max_tokens: Option<u64>,
    /// The thinking switch: `Some(true)` on, `Some(false)` off, `None` not sent.
    thinking: Option<bool>,
}

/// A round the prompt is expected to send, and the reply the model gives it.
#[derive(Debug, Clone)]
struct Round {
    system: Option<&'static str>,
    turns: Vec<(&'static str, &'static str)>,
    temperature: Option<f64>,
    /// The prompt's `max_tokens` option, if it set one.
    max_tokens: Option<u64>,
    thinking: Option<bool>,
    reply: &'static str,
}

impl Round {
    /// What the server must see for this round; `default_max` is the cap the provider sends
    /// when the prompt sets none (`None`: the provider sends no cap).
    fn seen(&self, default_max: Option<u64>) -> Seen {
        Seen {
            system: self.system.map(str::to_owned),
            turns: self
                .turns
                .iter()
                .map(|(role, text)| ((*role).to_owned(), (*text).to_owned()))
                .collect(),
            temperature: self.temperature,
            max_tokens: self.max_tokens.or(default_max),
            thinking: self.thinking,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The fake servers.
// ---------------------------------------------------------------------------------------------

/// One fake provider's state: the rounds it expects, in order, and what went wrong.
#[derive(Debug, Default)]
struct Fake {
    rounds: Vec<Round>,
    next: usize,
    violations: Vec<String>,
}

type Shared = Arc<Mutex<Fake>>;

/// The two fake servers, running on a tokio runtime in a background thread until dropped.
struct Servers {
    openai_base: String,
    anthropic_base: String,
    openai_addr: SocketAddr,
    anthropic_addr: SocketAddr,
    openai: Shared,
    anthropic: Shared,
    _servers: (LocalServer, LocalServer),
}

impl Servers {
    /// Start both servers, each expecting `rounds` in order.
    fn start(rounds: &[Round]) -> Servers {
        let openai: Shared = Arc::new(Mutex::new(Fake {
            rounds: rounds.to_vec(),
            ..Fake::default()
        }));
        let anthropic: Shared = Arc::new(Mutex::new(Fake {
            rounds: rounds.to_vec(),
            ..Fake::default()
        }));
        let o_server = LocalServer::start(
            Router::new()
                .route("/v1/chat/completions", post(openai_handler))
                .with_state(openai.clone()),
        );
        let a_server = LocalServer::start(
            Router::new()
                .route("/v1/messages", post(anthropic_handler))
                .with_state(anthropic.clone()),
        );
        let (openai_addr, anthropic_addr) = (o_server.addr, a_server.addr);
        Servers {
            openai_base: format!("http://{openai_addr}/v1"),
            anthropic_base: format!("http://{anthropic_addr}"),
            openai_addr,
            anthropic_addr,
            openai,
            anthropic,
            _servers: (o_server, a_server),
        }
    }

    /// The catalog file pointing at both servers.
    fn config(&self) -> String {
        format!(
            r#"[models."fake-openai"]
provider = "openai"
model = "{OPENAI_MODEL}"
base_url = "{}"
api_key_env = ""
context = 100000
thinking = "Switchable"
description = "the OpenAI-shaped test server"

[models."fake-anthropic"]
provider = "anthropic"
model = "{ANTHROPIC_MODEL}"
base_url = "{}"
api_key_env = ""
context = 100000
thinking = "Switchable"
max_output_tokens = {ANTHROPIC_DEFAULT_MAX}
thinking_budget = {ANTHROPIC_BUDGET}
description = "the Anthropic-shaped test server"
"#,
            self.openai_base, self.anthropic_base
        )
    }

    /// Assert that a server saw every expected round and nothing wrong.
    fn assert_clean(name: &str, fake: &Shared) {
        let fake = fake.lock().unwrap();
        assert!(
            fake.violations.is_empty(),
            "{name} server saw bad requests: {:#?}",
            fake.violations
        );
        assert_eq!(
            fake.next,
            fake.rounds.len(),
            "{name} server answered {} of {} rounds",
            fake.next,
            fake.rounds.len()
        );
    }
}

fn bad_request(fake: &Shared, message: String) -> Response {
    {
        let mut fake = fake.lock().unwrap();
        let round = fake.next + 1;
        fake.violations.push(format!("round {round}: {message}"));
    }
    let body = json!({"error": {"type": "invalid_request_error", "message": message}});
    Response::builder()
        .status(StatusCode::BAD_REQUEST)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn sse_response(events: Vec<String>) -> Response {
    let chunks: Vec<Result<Bytes, std::convert::Infallible>> =
        events.into_iter().map(|e| Ok(Bytes::from(e))).collect();
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(futures_util::stream::iter(chunks)))
        .unwrap()
}

/// The reply text in a few deltas (word by word, at most four pieces).
fn deltas(text: &str) -> Vec<String> {
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    let per = words.len().div_ceil(4).max(1);
    words.chunks(per).map(|c| c.concat()).collect()
}

/// Check the request against the next expected round; on success, take that round.
fn take_round(fake: &Shared, seen: &Seen, default_max: Option<u64>) -> Result<Round, String> {
    let mut fake = fake.lock().unwrap();
    let Some(round) = fake.rounds.get(fake.next).cloned() else {
        return Err(format!(
            "no round is expected after {} rounds, got {seen:?}",
            fake.next
        ));
    };
    let want = round.seen(default_max);
    if *seen != want {
        return Err(format!(
            "the request does not match round {}:\n  expected {want:?}\n  got      {seen:?}",
            fake.next + 1
        ));
    }
    fake.next += 1;
    Ok(round)
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn only_keys(value: &Value, allowed: &[&str], at: &str) -> Result<(), String> {
    let Some(object) = value.as_object() else {
        return Err(format!("{at} must be an object"));
    };
    for key in object.keys() {
        if !allowed.contains(&key.as_str()) {
            return Err(format!("{at} has unexpected key `{key}`"));
        }
    }
    Ok(())
}

fn non_empty_string(value: Option<&Value>, at: &str) -> Result<String, String> {
    match value.and_then(Value::as_str) {
        Some(text) if !text.is_empty() => Ok(text.to_owned()),
        _ => Err(format!("{at} must be a non-empty string")),
    }
}

fn positive_integer(value: &Value, at: &str) -> Result<u64, String> {
    value
        .as_u64()
        .filter(|n| *n >= 1)
        .ok_or_else(|| format!("{at} must be a positive integer, got {value}"))
}

fn temperature(value: Option<&Value>, max: f64) -> Result<Option<f64>, String> {
    match value {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(t) if (0.0..=max).contains(&t) => Ok(Some(t)),
            _ => Err(format!(
                "temperature must be a number in [0, {max}], got {v}"
            )),
        },
    }
}

/// Turns must start with `user`, alternate, and end with `user` (no tools in these prompts).
fn check_alternation(turns: &[(String, String)]) -> Result<(), String> {
    if turns.is_empty() {
        return Err("messages must hold at least one user turn".into());
    }
    for (i, (role, _)) in turns.iter().enumerate() {
        let want = if i.is_multiple_of(2) {
            "user"
        } else {
            "assistant"
        };
        if role != want {
            return Err(format!(
                "turn {} is `{role}`, expected `{want}`: turns must alternate starting with user",
                i + 1
            ));
        }
    }
    if turns.len().is_multiple_of(2) {
        return Err("the last turn must be a user turn".into());
    }
    Ok(())
}

// --- OpenAI chat completions ------------------------------------------------------------------

/// The OpenAI chat-completions request schema, as this catalog entry must send it.
fn openai_seen(headers: &HeaderMap, body: &Value) -> Result<Seen, String> {
    if !header(headers, "content-type").is_some_and(|v| v.starts_with("application/json")) {
        return Err("content-type must be application/json".into());
    }
    if headers.contains_key("authorization") {
        return Err("no API key is configured, so no authorization header may be sent".into());
    }
    only_keys(
        body,
        &[
            "model",
            "messages",
            "stream",
            "stream_options",
            "temperature",
            "max_completion_tokens",
            "reasoning_effort",
        ],
        "the body",
    )?;
    if body.get("model").and_then(Value::as_str) != Some(OPENAI_MODEL) {
        return Err(format!("model must be `{OPENAI_MODEL}`"));
    }
    if body.get("stream") != Some(&Value::Bool(true)) {
        return Err("stream must be true".into());
    }
    if body.get("stream_options") != Some(&json!({"include_usage": true})) {
        return Err("stream_options must be {\"include_usage\": true}".into());
    }
    let max_tokens = body
        .get("max_completion_tokens")
        .map(|v| positive_integer(v, "max_completion_tokens"))
        .transpose()?;
    let thinking = match body.get("reasoning_effort") {
        None => None,
        Some(v) => match v.as_str() {
            Some("none" | "minimal") => Some(false),
            Some("low" | "medium" | "high") => Some(true),
            _ => return Err(format!("reasoning_effort {v} is not a known effort")),
        },
    };
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Err("messages must be an array".into());
    };
    let mut system = None;
    let mut turns = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        only_keys(message, &["role", "content"], &at)?;
        let role = non_empty_string(message.get("role"), &format!("{at}.role"))?;
        let content = non_empty_string(message.get("content"), &format!("{at}.content"))?;
        match role.as_str() {
            "system" if i == 0 => system = Some(content),
            "system" => return Err(format!("{at} is a system message after the first record")),
            "user" | "assistant" => turns.push((role, content)),
            other => return Err(format!("{at}.role `{other}` is not valid here")),
        }
    }
    check_alternation(&turns)?;
    Ok(Seen {
        system,
        turns,
        temperature: temperature(body.get("temperature"), 2.0)?,
        max_tokens,
        thinking,
    })
}

fn openai_events(round: &Round) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        let value = json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1_767_225_600,
            "model": OPENAI_MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        format!("data: {value}\n\n")
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    if round.thinking == Some(true) {
        events.push(chunk(
            json!({"reasoning_content": "Thinking it over. "}),
            Value::Null,
        ));
    }
    for piece in deltas(round.reply) {
        events.push(chunk(json!({"content": piece}), Value::Null));
    }
    events.push(chunk(json!({}), json!("stop")));
    let usage = json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1_767_225_600,
        "model": OPENAI_MODEL,
        "choices": [],
        "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42},
    });
    events.push(format!("data: {usage}\n\n"));
    events.push("data: [DONE]\n\n".to_owned());
    events
}

async fn openai_handler(State(fake): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let json = match serde_json::from_slice::<Value>(&body) {
        Ok(json) => json,
        Err(e) => return bad_request(&fake, format!("the body is not JSON: {e}")),
    };
    let round = openai_seen(&headers, &json).and_then(|seen| take_round(&fake, &seen, None));
    match round {
        Ok(round) => sse_response(openai_events(&round)),
        Err(message) => bad_request(&fake, message),
    }
}

// --- Anthropic Messages -----------------------------------------------------------------------

/// The text of a string or an array of text blocks.
fn anthropic_text(value: Option<&Value>, at: &str) -> Result<String, String> {
    match value {
        Some(Value::String(text)) if !text.is_empty() => Ok(text.clone()),
        Some(Value::Array(blocks)) if !blocks.is_empty() => {
            let mut text = String::new();
            for (i, block) in blocks.iter().enumerate() {
                let at = format!("{at}[{i}]");
                only_keys(block, &["type", "text"], &at)?;
                if block.get("type").and_then(Value::as_str) != Some("text") {
                    return Err(format!("{at} must be a text block"));
                }
                text.push_str(&non_empty_string(block.get("text"), &format!("{at}.text"))?);
            }
            Ok(text)
        }
        _ => Err(format!(
            "{at} must be a non-empty string or a non-empty array of text blocks"
        )),
    }
}

/// The Anthropic Messages request schema.
fn anthropic_seen(headers: &HeaderMap, body: &Value) -> Result<Seen, String> {
    if !header(headers, "content-type").is_some_and(|v| v.starts_with("application/json")) {
        return Err("content-type must be application/json".into());
    }
    if header(headers, "anthropic-version") != Some("2023-06-01") {
        return Err("the anthropic-version header must be 2023-06-01".into());
    }
    if headers.contains_key("x-api-key") || headers.contains_key("authorization") {
        return Err("no API key is configured, so no key header may be sent".into());
    }
    only_keys(
        body,
        &[
            "model",
            "messages",
            "system",
            "max_tokens",
            "temperature",
            "thinking",
            "stream",
            "metadata",
            "stop_sequences",
        ],
        "the body",
    )?;
    if body.get("model").and_then(Value::as_str) != Some(ANTHROPIC_MODEL) {
        return Err(format!("model must be `{ANTHROPIC_MODEL}`"));
    }
    if body.get("stream") != Some(&Value::Bool(true)) {
        return Err("stream must be true".into());
    }
    let Some(max_tokens) = body.get("max_tokens") else {
        return Err("max_tokens is required".into());
    };
    let max_tokens = positive_integer(max_tokens, "max_tokens")?;
    let thinking = match body.get("thinking") {
        None => None,
        Some(t) if *t == json!({"type": "disabled"}) => Some(false),
        Some(t) => {
            only_keys(t, &["type", "budget_tokens"], "thinking")?;
            let budget = t.get("budget_tokens").and_then(Value::as_u64).unwrap_or(0);
            if t.get("type").and_then(Value::as_str) != Some("enabled") {
                return Err(format!("thinking {t} is neither enabled nor disabled"));
            }
            if budget < 1024 || budget >= max_tokens {
                return Err(format!(
                    "thinking.budget_tokens must be at least 1024 and less than max_tokens, got {budget}"
                ));
            }
            Some(true)
        }
    };
    let temperature = temperature(body.get("temperature"), 1.0)?;
    if thinking == Some(true) && temperature.is_some() {
        return Err("temperature may not be set with thinking enabled".into());
    }
    let system = match body.get("system") {
        None => None,
        some => Some(anthropic_text(some, "system")?),
    };
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Err("messages must be an array".into());
    };
    let mut turns = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        only_keys(message, &["role", "content"], &at)?;
        let role = non_empty_string(message.get("role"), &format!("{at}.role"))?;
        if role != "user" && role != "assistant" {
            return Err(format!(
                "{at}.role `{role}` is not user or assistant (system text goes in the top-level `system` field)"
            ));
        }
        let text = anthropic_text(message.get("content"), &format!("{at}.content"))?;
        turns.push((role, text));
    }
    check_alternation(&turns)?;
    Ok(Seen {
        system,
        turns,
        temperature,
        max_tokens: Some(max_tokens),
        thinking,
    })
}

fn anthropic_events(round: &Round) -> Vec<String> {
    let event = |name: &str, value: Value| format!("event: {name}\ndata: {value}\n\n");
    let mut events = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": ANTHROPIC_MODEL,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 30, "output_tokens": 1},
        }}),
    )];
    let mut index = 0;
    if round.thinking == Some(true) {
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "thinking", "thinking": ""}}),
        ));
        events.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index,
                   "delta": {"type": "thinking_delta", "thinking": "Thinking it over. "}}),
        ));
        events.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index,
                   "delta": {"type": "signature_delta", "signature": "c2lnbmF0dXJl"}}),
        ));
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    events.push(event(
        "content_block_start",
        json!({"type": "content_block_start", "index": index,
               "content_block": {"type": "text", "text": ""}}),
    ));
    events.push(event("ping", json!({"type": "ping"})));
    for piece in deltas(round.reply) {
        events.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index,
                   "delta": {"type": "text_delta", "text": piece}}),
        ));
    }
    events.push(event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": index}),
    ));
    events.push(event(
        "message_delta",
        json!({"type": "message_delta",
               "delta": {"stop_reason": "end_turn", "stop_sequence": null},
               "usage": {"output_tokens": 12}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    events
}

async fn anthropic_handler(
    State(fake): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let json = match serde_json::from_slice::<Value>(&body) {
        Ok(json) => json,
        Err(e) => return bad_request(&fake, format!("the body is not JSON: {e}")),
    };
    let round = anthropic_seen(&headers, &json)
        .and_then(|seen| take_round(&fake, &seen, Some(ANTHROPIC_DEFAULT_MAX)));
    match round {
        Ok(round) => sse_response(anthropic_events(&round)),
        Err(message) => bad_request(&fake, message),
    }
}

// ---------------------------------------------------------------------------------------------
// Running the binary.
// ---------------------------------------------------------------------------------------------

/// The scripted model file answering `rounds` in order.
fn script(rounds: &[Round]) -> String {
    json!({
        "model": {"id": "scripted-fake", "context": 100000, "thinking": "Switchable",
                  "description": "the scripted model"},
        "replies": rounds.iter().map(|r| r.reply).collect::<Vec<_>>(),
    })
    .to_string()
}

/// Run `prompt.md` in `dir` with the extra flags; the outcome JSON.
fn run(dir: &Path, store: &str, how: &[&str]) -> Value {
    // Only the project file counts: no user config file, no proxy between us and 127.0.0.1.
    let mut command = promptforge(dir);
    command
        .args(["run", "prompt.md", "--json", "--seed", "7"])
        .args(["--when", "2026-03-04T05:06:07Z", "--store"])
        .arg(dir.join(store))
        .args(how)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > RUN_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("promptforge run {how:?} did not finish in {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("promptforge run {how:?}: stdout is not one JSON object ({e}):\n{stdout}\nstderr:\n{stderr}")
    })
}

/// Run `prompt` three ways and check each gives `want` as its result.
fn same_everywhere(prompt: &str, rounds: &[Round], want: &str) {
    let servers = Servers::start(rounds);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("prompt.md"), prompt).unwrap();
    std::fs::write(dir.path().join("script.json"), script(rounds)).unwrap();
    std::fs::write(dir.path().join("promptforge.toml"), servers.config()).unwrap();
    std::fs::create_dir_all(dir.path().join("xdg")).unwrap();

    let ways: [(&str, &[&str]); 3] = [
        ("scripted", &["--script", "script.json"]),
        ("openai", &["--model", "fake-openai"]),
        ("anthropic", &["--model", "fake-anthropic"]),
    ];
    let mut results = Vec::new();
    for (name, flags) in ways {
        let outcome = run(dir.path(), &format!("store-{name}"), flags);
        assert_eq!(
            outcome.get("outcome").and_then(Value::as_str),
            Some("completed"),
            "{name}: {outcome}\nopenai server: {:?}\nanthropic server: {:?}",
            servers.openai.lock().unwrap().violations,
            servers.anthropic.lock().unwrap().violations,
        );
        let result = outcome
            .get("result")
            .and_then(Value::as_str)
            .unwrap()
            .to_owned();
        results.push((name, result));
    }
    Servers::assert_clean("the OpenAI-shaped", &servers.openai);
    Servers::assert_clean("the Anthropic-shaped", &servers.anthropic);
    for (name, result) in &results {
        assert_eq!(result, want, "the {name} run's result");
    }
}

// ---------------------------------------------------------------------------------------------
// The prompts.
// ---------------------------------------------------------------------------------------------

const TAGLINE: &str = r"---
name: lighthouse-tagline
description: Drafts a tagline on the default role, then critiques it on a second role with sampling options
promptforge: 0
models:
  writer: {}
  critic:
    keywords: [no-thinking]
    description: Short, blunt critique
---

# Lighthouse tagline

```lua
models.default('writer')
```

## Draft

Write a one-line tagline for a small lighthouse museum.

```lua
var.draft = models.infer(prose)
```

## Critique

```lua
local critic = models.use('critic', { temperature = 0.25, max_tokens = 120 })
local verdict = models.infer('Critique this tagline in one sentence: ' .. var.draft)
return var.draft .. '\n' .. verdict .. '\n' .. critic.max_tokens .. ' tokens at ' .. critic.temperature
```
";

#[test]
fn infer_on_the_default_role_then_on_a_role_with_options() {
    let rounds = [
        Round {
            system: None,
            turns: vec![(
                "user",
                "Write a one-line tagline for a small lighthouse museum.",
            )],
            temperature: None,
            max_tokens: None,
            thinking: None,
            reply: "Where the light still keeps watch.",
        },
        Round {
            system: None,
            turns: vec![(
                "user",
                "Critique this tagline in one sentence: Where the light still keeps watch.",
            )],
            temperature: Some(0.25),
            max_tokens: Some(120),
            thinking: Some(false),
            reply: "Evocative, but it never says it is a museum.",
        },
    ];
    same_everywhere(
        TAGLINE,
        &rounds,
        "Where the light still keeps watch.\nEvocative, but it never says it is a museum.\n120 tokens at 0.25",
    );
}

const TUTOR: &str = r"---
name: river-tutor
description: Two loops over one message list that opens with two system records
promptforge: 0
models:
  tutor:
    description: A patient geography tutor
---

# River tutor

```lua
models.default('tutor')
```

## Lesson

```lua
local msgs = messages.new()
  :system('You are a patient geography tutor.')
  :system('Answer in one short sentence.')
  :user('Which river flows through Cairo?')
models.loop(msgs)
msgs:user('Which sea does it flow into?')
models.loop(msgs)
local roles = {}
for i, record in ipairs(msgs) do
  roles[i] = record.role
end
return table.concat(roles, ',') .. '\n' .. msgs[4].content .. '\n' .. msgs[#msgs].content
```
";

#[test]
fn two_loops_on_one_list_with_a_merged_system_block() {
    let system = "You are a patient geography tutor.\n\nAnswer in one short sentence.";
    let rounds = [
        Round {
            system: Some(system),
            turns: vec![("user", "Which river flows through Cairo?")],
            temperature: None,
            max_tokens: None,
            thinking: None,
            reply: "The Nile flows through Cairo.",
        },
        Round {
            system: Some(system),
            turns: vec![
                ("user", "Which river flows through Cairo?"),
                ("assistant", "The Nile flows through Cairo."),
                ("user", "Which sea does it flow into?"),
            ],
            temperature: None,
            max_tokens: None,
            thinking: None,
            reply: "It flows into the Mediterranean Sea.",
        },
    ];
    same_everywhere(
        TUTOR,
        &rounds,
        "system,system,user,assistant,user,assistant\nThe Nile flows through Cairo.\nIt flows into the Mediterranean Sea.",
    );
}

const SORT_CHECK: &str = r"---
name: sort-check
description: A thinking conversation under models.use options, then a check pinned to another role
promptforge: 0
models:
  solver:
    keywords: [thinking]
  checker:
    keywords: [no-thinking, fast]
---

# Sort check

## Solve

```lua
models.use('solver', { max_tokens = 2048 })
local msgs = messages.new()
  :user('Here are three numbers: 42, 7, 19.')
  :user('List them in ascending order.')
models.loop(msgs)
var.sorted = msgs[#msgs].content
var.count = #msgs
```

## Check

```lua
local checker = models.get('checker')
local answer = models.infer(checker, 'Is this list in ascending order? ' .. var.sorted)
return var.sorted .. ' | ' .. answer .. ' | ' .. var.count .. ' records'
```
";

#[test]
fn loop_with_options_and_thinking_then_infer_on_a_pinned_handle() {
    let rounds = [
        Round {
            system: None,
            turns: vec![(
                "user",
                "Here are three numbers: 42, 7, 19.\n\nList them in ascending order.",
            )],
            temperature: None,
            max_tokens: Some(2048),
            thinking: Some(true),
            reply: "7, 19, 42",
        },
        Round {
            system: None,
            turns: vec![("user", "Is this list in ascending order? 7, 19, 42")],
            temperature: None,
            max_tokens: None,
            thinking: Some(false),
            reply: "Yes.",
        },
    ];
    same_everywhere(SORT_CHECK, &rounds, "7, 19, 42 | Yes. | 3 records");
}

// ---------------------------------------------------------------------------------------------
// The fake servers refuse malformed requests.
// ---------------------------------------------------------------------------------------------

/// POST `body` to `path` over a plain HTTP/1.1 connection; the status code and response body.
fn post_raw(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"));
    (status, response)
}

#[test]
fn the_fake_servers_answer_400_to_malformed_requests() {
    let round = Round {
        system: Some("Be brief."),
        turns: vec![("user", "Hello?")],
        temperature: None,
        max_tokens: None,
        thinking: None,
        reply: "Hello.",
    };
    let servers = Servers::start(std::slice::from_ref(&round));
    let json_type = ("content-type", "application/json");
    let version = ("anthropic-version", "2023-06-01");
    let good_openai = json!({
        "model": OPENAI_MODEL, "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}],
    });
    let good_anthropic = json!({
        "model": ANTHROPIC_MODEL, "stream": true, "max_tokens": ANTHROPIC_DEFAULT_MAX,
        "system": "Be brief.", "messages": [{"role": "user", "content": "Hello?"}],
    });
    let with = |base: &Value, key: &str, value: Value| {
        let mut changed = base.clone();
        changed[key] = value;
        changed
    };
    let without = |base: &Value, key: &str| {
        let mut changed = base.clone();
        changed.as_object_mut().unwrap().remove(key);
        changed
    };

    let openai_bad = [
        ("not JSON", "{\"model\": ".to_owned(), vec![json_type]),
        (
            "stream off",
            with(&good_openai, "stream", json!(false)).to_string(),
            vec![json_type],
        ),
        (
            "system after user",
            with(
                &good_openai,
                "messages",
                json!([{"role": "user", "content": "Hello?"}, {"role": "system", "content": "Be brief."}]),
            )
            .to_string(),
            vec![json_type],
        ),
        (
            "two user turns in a row",
            with(
                &good_openai,
                "messages",
                json!([{"role": "user", "content": "Hello"}, {"role": "user", "content": "?"}]),
            )
            .to_string(),
            vec![json_type],
        ),
        (
            "temperature out of range",
            with(&good_openai, "temperature", json!(2.5)).to_string(),
            vec![json_type],
        ),
        (
            "the wrong token-cap field",
            with(&good_openai, "max_tokens", json!(10)).to_string(),
            vec![json_type],
        ),
        (
            "an unexpected round",
            with(&good_openai, "temperature", json!(0.5)).to_string(),
            vec![json_type],
        ),
    ];
    for (what, body, headers) in &openai_bad {
        let (status, response) =
            post_raw(servers.openai_addr, "/v1/chat/completions", headers, body);
        assert_eq!(status, 400, "OpenAI-shaped server, {what}: {response}");
    }
    let anthropic_bad = [
        (
            "no anthropic-version header",
            good_anthropic.to_string(),
            vec![json_type],
        ),
        (
            "max_tokens missing",
            without(&good_anthropic, "max_tokens").to_string(),
            vec![json_type, version],
        ),
        (
            "a system role inside messages",
            without(
                &with(
                    &good_anthropic,
                    "messages",
                    json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]),
                ),
                "system",
            )
            .to_string(),
            vec![json_type, version],
        ),
        (
            "an empty text block",
            with(
                &good_anthropic,
                "messages",
                json!([{"role": "user", "content": [{"type": "text", "text": ""}]}]),
            )
            .to_string(),
            vec![json_type, version],
        ),
        (
            "temperature with thinking on",
            with(
                &with(
                    &good_anthropic,
                    "thinking",
                    json!({"type": "enabled", "budget_tokens": 1024}),
                ),
                "temperature",
                json!(0.5),
            )
            .to_string(),
            vec![json_type, version],
        ),
        (
            "a conversation that starts with the assistant",
            with(
                &good_anthropic,
                "messages",
                json!([{"role": "assistant", "content": "Hi"}, {"role": "user", "content": "Hello?"}]),
            )
            .to_string(),
            vec![json_type, version],
        ),
    ];
    for (what, body, headers) in &anthropic_bad {
        let (status, response) = post_raw(servers.anthropic_addr, "/v1/messages", headers, body);
        assert_eq!(status, 400, "Anthropic-shaped server, {what}: {response}");
    }

    // The well-formed requests are accepted and streamed back.
    let (status, response) = post_raw(
        servers.openai_addr,
        "/v1/chat/completions",
        &[json_type],
        &good_openai.to_string(),
    );
    assert_eq!(status, 200, "{response}");
    assert!(response.contains("data: [DONE]"), "{response}");
    let (status, response) = post_raw(
        servers.anthropic_addr,
        "/v1/messages",
        &[json_type, version],
        &good_anthropic.to_string(),
    );
    assert_eq!(status, 200, "{response}");
    assert!(response.contains("event: message_stop"), "{response}");
    assert_eq!(servers.openai.lock().unwrap().next, 1);
    assert_eq!(servers.anthropic.lock().unwrap().next, 1);
    assert_eq!(
        servers.openai.lock().unwrap().violations.len(),
        openai_bad.len()
    );
    assert_eq!(
        servers.anthropic.lock().unwrap().violations.len(),
        anthropic_bad.len()
    );
}

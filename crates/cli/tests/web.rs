#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point
//! The web Plugin through the real `promptforge` binary: a model that calls `fetch` inside
//! `models.loop` gets the enveloped page back in the provider's wire shape, a search backend
//! configured in `promptforge.toml` as `docs/web.md` says is reached over HTTP, and a Host with
//! no search backend refuses a prompt that declares the Plugin.
//!
//! Every server here runs on 127.0.0.1 inside the test; pages come from a `--web-script`
//! (the fetch policy keeps real fetches off loopback, as it must).

mod support;

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use support::{LocalServer, promptforge};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::{Value, json};

/// Requests a fake server received: (path and query, headers as `name: value` lines, body).
type Seen = Arc<Mutex<Vec<(String, String, Value)>>>;

/// A fake HTTP server on 127.0.0.1 that records what it is sent.
struct Fake {
    base: String,
    seen: Seen,
    _server: LocalServer,
}

impl Fake {
    fn start(app: impl FnOnce(Seen) -> Router) -> Fake {
        let seen: Seen = Arc::default();
        let server = LocalServer::start(app(seen.clone()));
        Fake {
            base: server.base(),
            seen,
            _server: server,
        }
    }
}

fn record(seen: &Seen, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> usize {
    let lines: Vec<String> = headers
        .iter()
        .map(|(n, v)| format!("{}: {}", n, v.to_str().unwrap_or("")))
        .collect();
    let body = serde_json::from_slice(body).unwrap_or(Value::Null);
    let mut seen = seen.lock().unwrap();
    seen.push((uri.to_string(), lines.join("\n"), body));
    seen.len()
}

fn json_response(body: Value) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// An OpenAI-shaped chat endpoint: round 1 calls `fetch`, round 2 answers in text.
async fn openai(State(seen): State<Seen>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let round = record(&seen, &uri, &headers, &body);
    let chunk = |delta: Value, finish: Value| {
        let value = json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
                           "model": "fake", "choices": [{"index": 0, "delta": delta,
                           "finish_reason": finish}]});
        format!("data: {value}\n\n")
    };
    let events = if round == 1 {
        vec![
            chunk(
                json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0,
                  "id": "call_1", "type": "function",
                  "function": {"name": "fetch", "arguments": "{\"url\": \"https://example.com/\"}"}}]}),
                Value::Null,
            ),
            chunk(json!({}), json!("tool_calls")),
        ]
    } else {
        vec![
            chunk(
                json!({"role": "assistant", "content": "A page about examples."}),
                Value::Null,
            ),
            chunk(json!({}), json!("stop")),
        ]
    };
    let mut events = events;
    events.push("data: [DONE]\n\n".to_owned());
    let chunks: Vec<Result<Bytes, std::convert::Infallible>> =
        events.into_iter().map(|e| Ok(Bytes::from(e))).collect();
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(futures_util::stream::iter(chunks)))
        .unwrap()
}

/// An Anthropic-shaped messages endpoint: round 1 calls `fetch`, round 2 answers in text.
async fn anthropic(
    State(seen): State<Seen>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let round = record(&seen, &uri, &headers, &body);
    let event = |name: &str, value: Value| format!("event: {name}\ndata: {value}\n\n");
    let mut events = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "m", "type": "message",
               "role": "assistant", "model": "fake", "content": [], "stop_reason": null,
               "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 1}}}),
    )];
    let stop = if round == 1 {
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block":
                   {"type": "tool_use", "id": "toolu_1", "name": "fetch", "input": {}}}),
        ));
        events.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta":
                   {"type": "input_json_delta", "partial_json": "{\"url\": \"https://example.com/\"}"}}),
        ));
        "tool_use"
    } else {
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": ""}}),
        ));
        events.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": "A page about examples."}}),
        ));
        "end_turn"
    };
    events.push(event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
               "usage": {"output_tokens": 5}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    let chunks: Vec<Result<Bytes, std::convert::Infallible>> =
        events.into_iter().map(|e| Ok(Bytes::from(e))).collect();
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(futures_util::stream::iter(chunks)))
        .unwrap()
}

const PAGE: &str = "<html><body><nav>Home</nav><article><h1>Example</h1><p>This domain is for \
    use in illustrative examples in documents, and you may use it in literature without asking \
    for permission.</p></article></body></html>";

fn run(dir: &Path, prompt: &str, flags: &[&str], env: &[(&str, &str)]) -> Value {
    std::fs::write(dir.join("prompt.md"), prompt).unwrap();
    std::fs::create_dir_all(dir.join("xdg")).unwrap();
    let store = tempfile::tempdir().unwrap();
    let mut command = promptforge(dir);
    command
        .args(["run", "prompt.md", "--json", "--seed", "7"])
        .args(["--when", "2026-03-04T05:06:07Z", "--store"])
        .arg(store.path())
        .args(flags)
        .env_remove("PROMPTFORGE_GATEWAY_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON object ({e}):\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

const LOOP_PROMPT: &str = r"---
name: page-summary
description: Fetches a page and summarizes it
promptforge: 0
models:
  writer: {}
plugins: [promptforge/web]
tools:
  fetch: promptforge/web/fetch
---

# Page summary

## Summarize

Fetch https://example.com/ and summarize it.

```lua
models.default('writer')
tools.add('fetch')
local msgs = messages.new()
msgs:user(prose)
models.loop(msgs)
return msgs[3].content .. '\n---\n' .. msgs[#msgs].content
```
";

/// A `promptforge.toml` in `dir` naming the model `fake`, of this provider kind at this URL.
fn write_model_config(dir: &Path, provider: &str, base_url: &str) {
    std::fs::write(
        dir.join("promptforge.toml"),
        format!(
            "[models.fake]\nprovider = \"{provider}\"\nmodel = \"fake\"\nbase_url = \"{base_url}\"\napi_key_env = \"\"\n"
        ),
    )
    .unwrap();
}

/// Run `LOOP_PROMPT` on the model `fake` (this provider kind at this URL) over a scripted
/// page: the run completes with the fake's reply, and the tool record is returned.
fn fetch_in_a_loop(provider: &str, base_url: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    write_model_config(dir.path(), provider, base_url);
    let web = json!({
        "dns": {"example.com": ["93.184.215.14"]},
        "pages": {"https://example.com/": {"status": 200,
            "headers": {"content-type": "text/html; charset=utf-8"}, "body": PAGE}},
        "search": []
    });
    std::fs::write(dir.path().join("web.json"), web.to_string()).unwrap();
    let outcome = run(
        dir.path(),
        LOOP_PROMPT,
        &["--model", "fake", "--web-script", "web.json"],
        &[],
    );
    assert_eq!(outcome["outcome"], "completed", "{outcome}");
    let result = outcome["result"].as_str().unwrap();
    let (record, reply) = result.split_once("\n---\n").unwrap();
    assert_eq!(reply, "A page about examples.");
    record.to_owned()
}

#[test]
fn a_model_calling_fetch_reads_the_enveloped_page_in_the_openai_wire_shape() {
    let fake = Fake::start(|seen| {
        Router::new()
            .route("/v1/chat/completions", post(openai))
            .with_state(seen)
    });
    let record = fetch_in_a_loop("openai", &format!("{}/v1", fake.base));
    let seen = fake.seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "two rounds");
    // Round 1 offers the tool under its alias with the chapter's schema.
    let tools = &seen[0].2["tools"];
    assert_eq!(tools[0]["type"], "function");
    assert_eq!(tools[0]["function"]["name"], "fetch");
    assert_eq!(
        tools[0]["function"]["description"],
        "Fetch a web page and return its main content as markdown."
    );
    assert_eq!(
        tools[0]["function"]["parameters"]["required"],
        json!(["url"])
    );
    assert_eq!(
        tools[0]["function"]["parameters"]["properties"]["max_chars"]["maximum"],
        40000
    );
    // Round 2 carries the assistant's call and the tool record holding the enveloped page.
    let messages = seen[1].2["messages"].as_array().unwrap();
    let assistant = &messages[messages.len() - 2];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["tool_calls"][0]["id"], "call_1");
    assert_eq!(assistant["tool_calls"][0]["type"], "function");
    assert_eq!(assistant["tool_calls"][0]["function"]["name"], "fetch");
    let tool = &messages[messages.len() - 1];
    assert_eq!(tool["role"], "tool");
    assert_eq!(tool["tool_call_id"], "call_1");
    let content = tool["content"].as_str().unwrap();
    assert_eq!(content, record, "the model reads exactly the tool record");
    assert!(
        content.starts_with("The text inside the untrusted_input_"),
        "{content}"
    );
    assert!(
        content
            .contains("url: https://example.com/\ntruncated: false\nextraction: readability\n\n"),
        "{content}"
    );
    assert!(content.contains("illustrative examples"), "{content}");
}

#[test]
fn a_model_calling_fetch_reads_the_enveloped_page_in_the_anthropic_wire_shape() {
    let fake = Fake::start(|seen| {
        Router::new()
            .route("/v1/messages", post(anthropic))
            .with_state(seen)
    });
    let record = fetch_in_a_loop("anthropic", &fake.base);
    let seen = fake.seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "two rounds");
    let tools = &seen[0].2["tools"];
    assert_eq!(tools[0]["name"], "fetch");
    assert_eq!(tools[0]["input_schema"]["required"], json!(["url"]));
    let messages = seen[1].2["messages"].as_array().unwrap();
    let assistant = &messages[messages.len() - 2];
    assert_eq!(assistant["role"], "assistant");
    let call = assistant["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap();
    assert_eq!(call["id"], "toolu_1");
    assert_eq!(call["input"], json!({"url": "https://example.com/"}));
    let user = &messages[messages.len() - 1];
    assert_eq!(user["role"], "user");
    let block = &user["content"][0];
    assert_eq!(block["type"], "tool_result");
    assert_eq!(block["tool_use_id"], "toolu_1");
    let content = match &block["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts[0]["text"].as_str().unwrap().to_owned(),
        other => panic!("tool_result content {other}"),
    };
    assert_eq!(content, record, "the model reads exactly the tool record");
    assert!(
        content.starts_with("The text inside the untrusted_input_"),
        "{content}"
    );
    assert!(content.contains("illustrative examples"), "{content}");
}

/// A SearXNG-shaped and a gateway-shaped search API.
fn search_app(seen: Seen) -> Router {
    async fn searx(State(seen): State<Seen>, uri: Uri, headers: HeaderMap) -> Response {
        record(&seen, &uri, &headers, b"");
        json_response(json!({"query": "ignored", "results": [
            {"title": "Tokio", "url": "https://tokio.rs/", "content": "An async runtime", "engine": "x"},
            {"title": "smol", "url": "https://github.com/smol-rs/smol", "content": "A small runtime"}
        ]}))
    }
    async fn gateway(
        State(seen): State<Seen>,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        record(&seen, &uri, &headers, &body);
        json_response(json!({"results": [
            {"title": "Tokio", "url": "https://tokio.rs/", "description": "An async runtime",
             "age": "1 day", "rank": 1}
        ]}))
    }
    Router::new()
        .route("/search", get(searx))
        .route("/gw/search", post(gateway))
        .with_state(seen)
}

const SEARCH_PROMPT: &str = r"---
name: search-once
description: Runs one web search and returns the results
promptforge: 0
plugins: [promptforge/web]
tools:
  search: promptforge/web/search
---

# Search once

## Search

```lua
return tools.call('search', { query = 'rust async runtime', count = 1 })
```
";

#[test]
fn a_search_backend_configured_in_promptforge_toml_is_reached_over_http() {
    let fake = Fake::start(search_app);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("promptforge.toml"),
        format!(
            "[search]\nprovider = \"searxng\"\nbase_url = \"{}/search\"\n",
            fake.base
        ),
    )
    .unwrap();
    let outcome = run(dir.path(), SEARCH_PROMPT, &[], &[]);
    assert_eq!(outcome["outcome"], "completed", "{outcome}");
    let result = outcome["result"].as_str().unwrap();
    assert!(result.contains("<untrusted_input_"), "{result}");
    assert!(
        result.contains(
            r#"{"query":"rust async runtime","results":[{"title":"Tokio","url":"https://tokio.rs/","description":"An async runtime"}]}"#
        ),
        "{result}"
    );
    let seen = fake.seen.lock().unwrap();
    assert!(
        seen[0]
            .0
            .starts_with("/search?q=rust+async+runtime&format=json"),
        "{:?}",
        seen[0].0
    );

    // The gateway: the key comes from the variable the config names, the arguments as given.
    drop(seen);
    std::fs::write(
        dir.path().join("promptforge.toml"),
        format!(
            "[search]\nprovider = \"gateway\"\nbase_url = \"{}/gw/search\"\napi_key_env = \"TEST_GATEWAY_KEY\"\n",
            fake.base
        ),
    )
    .unwrap();
    let outcome = run(
        dir.path(),
        SEARCH_PROMPT,
        &[],
        &[("TEST_GATEWAY_KEY", "sekret")],
    );
    assert_eq!(outcome["outcome"], "completed", "{outcome}");
    assert!(
        outcome["result"].as_str().unwrap().contains(
            r#"[{"title":"Tokio","url":"https://tokio.rs/","description":"An async runtime","age":"1 day"}]"#
        ),
        "{outcome}"
    );
    let seen = fake.seen.lock().unwrap();
    let (path, headers, body) = &seen[1];
    assert_eq!(path, "/gw/search");
    assert!(
        headers.contains("authorization: Bearer sekret"),
        "{headers}"
    );
    assert_eq!(body, &json!({"query": "rust async runtime", "count": 1}));
}

#[test]
fn without_a_search_backend_the_plugin_names_the_missing_service() {
    let dir = tempfile::tempdir().unwrap();
    let outcome = run(dir.path(), SEARCH_PROMPT, &[], &[]);
    assert_eq!(outcome["outcome"], "failed", "{outcome}");
    assert_eq!(outcome["error"]["kind"], "RequirementsUnmet");
    assert_eq!(
        outcome["error"]["message"],
        "the environment cannot satisfy this prompt:\n- promptforge/web needs promptforge/search-provider, and this host provides none"
    );
    // A key the config needs but the environment lacks fails the Plugin's activation, with a
    // line naming the variable, for a prompt that declares it, and for nothing else.
    std::fs::write(
        dir.path().join("promptforge.toml"),
        "[search]\nprovider = \"brave\"\napi_key_env = \"TEST_BRAVE_KEY_UNSET\"\n",
    )
    .unwrap();
    let outcome = run(dir.path(), SEARCH_PROMPT, &[], &[]);
    assert_eq!(outcome["error"]["kind"], "RequirementsUnmet", "{outcome}");
    let message = outcome["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("the environment cannot satisfy this prompt:\n- promptforge/web cannot start: the [search] table in ")
            && message.ends_with("the brave search key is not set: export TEST_BRAVE_KEY_UNSET"),
        "{message}"
    );
    let plain = "---\nname: plain\ndescription: d\npromptforge: 0\n---\n\n# Plain\n\n## Main\n\n```lua\nreturn 'ok'\n```\n";
    let outcome = run(dir.path(), plain, &[], &[]);
    assert_eq!(outcome["result"], "ok", "{outcome}");
}

/// Answers 429 (Retry-After 0) once, then like `openai` round 2.
async fn limited_once(
    State(seen): State<Seen>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let n = record(&seen, &uri, &headers, &body);
    if n == 1 {
        return Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .header("retry-after", "0")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"error": {"message": "slow down"}}"#))
            .unwrap();
    }
    let value = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake",
                       "choices": [{"index": 0, "delta": {"role": "assistant", "content": "after the wait"},
                                    "finish_reason": "stop"}]});
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .body(Body::from(format!("data: {value}\n\ndata: [DONE]\n\n")))
        .unwrap()
}

#[test]
fn a_rate_limited_round_is_retried_and_each_retry_is_an_event() {
    let fake = Fake::start(|seen| {
        Router::new()
            .route("/v1/chat/completions", post(limited_once))
            .with_state(seen)
    });
    let dir = tempfile::tempdir().unwrap();
    write_model_config(dir.path(), "openai", &format!("{}/v1", fake.base));
    std::fs::write(
        dir.path().join("prompt.md"),
        "---\nname: r\ndescription: d\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# R\n\n## Main\n\n```lua\nmodels.default('w')\nreturn models.infer('hi')\n```\n",
    )
    .unwrap();
    let output = promptforge(dir.path())
        .args([
            "run",
            "prompt.md",
            "--json",
            "--events",
            "--model",
            "fake",
            "--store",
        ])
        .arg(dir.path().join("store"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stdout.contains(r#""result":"after the wait""#),
        "{stdout}\n{stderr}"
    );
    let retry: Value = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["host_event"] == "model_retry")
        .unwrap_or_else(|| panic!("no retry event in:\n{stdout}\n{stderr}"));
    assert_eq!(retry["attempt"], 1);
    assert_eq!(retry["wait_ms"], 0);
    assert_eq!(
        retry["reason"],
        "the model backend is limiting the request rate (status 429)"
    );
    assert_eq!(fake.seen.lock().unwrap().len(), 2);
}

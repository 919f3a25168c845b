//! The Anthropic provider against a fake Messages API server on 127.0.0.1 that validates every
//! request against the API's rules (headers, required `max_tokens`, top-level `system`, strict
//! user/assistant alternation, `tool_use` / `tool_result` pairing, the thinking budget).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "model_fake.rs"]
mod fake;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use fake::{FakeServer, Piece, Step, Validator, event, only_keys, sse, status, string};
use promptforge_harness::model::{
    AnthropicOptions, AnthropicProvider, ChatRequest, FinishReason, Message, ModelError,
    ModelLimits, ModelProvider, OversizeKind, ReasoningBlock, ReplyObserver, ThinkingSwitch,
    ToolCall, ToolSpec,
};
use serde_json::{Value, json};

const PATH: &str = "/v1/messages";
const KEY: &str = "sk-ant-test";

fn check_block(block: &Value, role: &str, at: &str) -> Result<(), String> {
    match (role, block.get("type").and_then(Value::as_str)) {
        (_, Some("text")) => {
            only_keys(block, &["type", "text"], at)?;
            if string(block, "text", at)?.is_empty() {
                return Err(format!("{at}: text content blocks must be non-empty"));
            }
        }
        ("user", Some("image")) => {
            only_keys(block, &["type", "source"], at)?;
            let source = &block["source"];
            match source.get("type").and_then(Value::as_str) {
                Some("base64") => {
                    only_keys(source, &["type", "media_type", "data"], at)?;
                    string(source, "media_type", at)?;
                    string(source, "data", at)?;
                }
                Some("url") => {
                    only_keys(source, &["type", "url"], at)?;
                    string(source, "url", at)?;
                }
                _ => return Err(format!("{at}: bad image source")),
            }
        }
        ("user", Some("tool_result")) => {
            only_keys(block, &["type", "tool_use_id", "content", "is_error"], at)?;
            string(block, "tool_use_id", at)?;
            match block.get("content") {
                None | Some(Value::String(_)) => {}
                Some(Value::Array(inner)) => {
                    for b in inner {
                        check_block(b, "user", at)?;
                    }
                }
                Some(_) => return Err(format!("{at}: bad tool_result content")),
            }
        }
        ("assistant", Some("tool_use")) => {
            only_keys(block, &["type", "id", "name", "input"], at)?;
            string(block, "id", at)?;
            string(block, "name", at)?;
            if !block.get("input").is_some_and(Value::is_object) {
                return Err(format!("{at}: tool_use input must be an object"));
            }
        }
        ("assistant", Some("thinking")) => {
            only_keys(block, &["type", "thinking", "signature"], at)?;
            string(block, "thinking", at)?;
            string(block, "signature", at)?;
        }
        ("assistant", Some("redacted_thinking")) => {
            only_keys(block, &["type", "data"], at)?;
            string(block, "data", at)?;
        }
        _ => return Err(format!("{at}: block {block} not allowed in a {role} turn")),
    }
    Ok(())
}

/// The Messages API's request rules.
fn check_request(headers: &HeaderMap, body: &Value) -> Result<(), String> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    };
    if header("x-api-key") != KEY {
        return Err("x-api-key missing or wrong".into());
    }
    if header("anthropic-version") != "2023-06-01" {
        return Err("anthropic-version header missing".into());
    }
    if headers.get("authorization").is_some() {
        return Err("Anthropic takes x-api-key, not Authorization".into());
    }
    only_keys(
        body,
        &[
            "model",
            "max_tokens",
            "system",
            "messages",
            "tools",
            "temperature",
            "thinking",
            "stream",
        ],
        "body",
    )?;
    string(body, "model", "body")?;
    let max_tokens = body
        .get("max_tokens")
        .and_then(Value::as_u64)
        .filter(|n| *n > 0)
        .ok_or("max_tokens: Field required")?;
    if body.get("stream") != Some(&json!(true)) {
        return Err("stream must be true".into());
    }
    match body.get("system") {
        None | Some(Value::String(_)) => {}
        Some(Value::Array(blocks)) => {
            for b in blocks {
                if b.get("type") != Some(&json!("text")) {
                    return Err("system blocks must be text".into());
                }
                check_block(b, "system", "system")?;
            }
        }
        Some(_) => return Err("system must be a string or text blocks".into()),
    }
    let thinking_on = match body.get("thinking") {
        None => false,
        Some(t) if t == &json!({"type": "disabled"}) => false,
        Some(t) => {
            only_keys(t, &["type", "budget_tokens"], "thinking")?;
            if t.get("type") != Some(&json!("enabled")) {
                return Err("thinking.type must be enabled or disabled".into());
            }
            let budget = t
                .get("budget_tokens")
                .and_then(Value::as_u64)
                .ok_or("budget_tokens")?;
            if budget < 1024 {
                return Err("thinking.budget_tokens: must be >= 1024".into());
            }
            if budget >= max_tokens {
                return Err("max_tokens must be greater than thinking.budget_tokens".into());
            }
            true
        }
    };
    if let Some(t) = body.get("temperature") {
        if thinking_on {
            return Err("temperature may not be set with thinking enabled".into());
        }
        let t = t.as_f64().ok_or("temperature must be a number")?;
        if !(0.0..=1.0).contains(&t) {
            return Err("temperature: must be between 0 and 1".into());
        }
    }
    if let Some(tools) = body.get("tools") {
        for (i, tool) in tools
            .as_array()
            .ok_or("tools must be an array")?
            .iter()
            .enumerate()
        {
            let at = format!("tools[{i}]");
            only_keys(tool, &["name", "description", "input_schema"], &at)?;
            string(tool, "name", &at)?;
            if !tool.get("input_schema").is_some_and(Value::is_object) {
                return Err(format!("{at}.input_schema must be an object"));
            }
        }
    }
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("messages")?;
    if messages.is_empty() {
        return Err("messages: at least one message is required".into());
    }
    let mut previous_tool_uses: Vec<String> = Vec::new();
    let mut last_assistant_starts_with_thinking = true;
    let mut last_assistant_has_tool_use = false;
    for (i, message) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        only_keys(message, &["role", "content"], &at)?;
        let role = string(message, "role", &at)?;
        let expected = if i % 2 == 0 { "user" } else { "assistant" };
        if role != expected {
            return Err(format!("{at}: roles must alternate, starting with user"));
        }
        let blocks = message["content"]
            .as_array()
            .filter(|b| !b.is_empty())
            .ok_or(format!("{at}: content must be a non-empty array"))?;
        for (j, block) in blocks.iter().enumerate() {
            check_block(block, role, &format!("{at}.content[{j}]"))?;
        }
        if role == "user" {
            let mut seen_other = false;
            let mut answered = Vec::new();
            for block in blocks {
                if block["type"] == "tool_result" {
                    if seen_other {
                        return Err(format!("{at}: tool_result blocks must come first"));
                    }
                    let id = block["tool_use_id"].as_str().unwrap_or_default().to_owned();
                    if !previous_tool_uses.contains(&id) {
                        return Err(format!("{at}: unexpected tool_use_id `{id}`"));
                    }
                    answered.push(id);
                } else {
                    seen_other = true;
                }
            }
            for id in &previous_tool_uses {
                if !answered.contains(id) {
                    return Err(format!("{at}: tool_use `{id}` has no tool_result"));
                }
            }
            previous_tool_uses.clear();
        } else {
            previous_tool_uses = blocks
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| b["id"].as_str().unwrap_or_default().to_owned())
                .collect();
            last_assistant_has_tool_use = !previous_tool_uses.is_empty();
            last_assistant_starts_with_thinking = matches!(
                blocks[0]["type"].as_str(),
                Some("thinking" | "redacted_thinking")
            );
        }
    }
    if !previous_tool_uses.is_empty() {
        return Err("the conversation ends with unanswered tool_use blocks".into());
    }
    if thinking_on && last_assistant_has_tool_use && !last_assistant_starts_with_thinking {
        return Err("Expected `thinking` or `redacted_thinking`, but found `tool_use`. When `thinking` is enabled, a final `assistant` message must start with a thinking block".into());
    }
    Ok(())
}

fn validator() -> Validator {
    Arc::new(|headers, body, _| check_request(headers, body))
}

async fn start(steps: Vec<Step>) -> FakeServer {
    FakeServer::start(PATH, validator(), steps).await
}

fn provider_with(
    server: &FakeServer,
    options: AnthropicOptions,
    limits: ModelLimits,
) -> AnthropicProvider {
    AnthropicProvider::new(&server.origin, Some(KEY.to_owned()), options, limits).unwrap()
}

fn provider(server: &FakeServer) -> AnthropicProvider {
    provider_with(
        server,
        AnthropicOptions::default(),
        ModelLimits {
            retries: 0,
            ..ModelLimits::default()
        },
    )
}

fn ev(value: Value) -> String {
    let name = value["type"].as_str().unwrap().to_owned();
    event(&name, &value)
}

fn message_start(input: u64) -> String {
    ev(json!({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [],
        "model": "claude-test", "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": input, "output_tokens": 1}}}))
}

fn text_block(index: u64, fragments: &[&str]) -> Vec<String> {
    let mut events = vec![ev(json!({"type": "content_block_start", "index": index,
        "content_block": {"type": "text", "text": ""}}))];
    for f in fragments {
        events.push(ev(json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "text_delta", "text": f}})));
    }
    events.push(ev(json!({"type": "content_block_stop", "index": index})));
    events
}

fn tool_block(index: u64, id: &str, name: &str, fragments: &[&str]) -> Vec<String> {
    let mut events = vec![ev(json!({"type": "content_block_start", "index": index,
        "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}))];
    for f in fragments {
        events.push(ev(json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "input_json_delta", "partial_json": f}})));
    }
    events.push(ev(json!({"type": "content_block_stop", "index": index})));
    events
}

fn finish(stop_reason: &str, output: u64) -> Vec<String> {
    vec![
        ev(json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": null},
            "usage": {"output_tokens": output}})),
        ev(json!({"type": "message_stop"})),
    ]
}

fn reply(parts: Vec<Vec<String>>) -> Step {
    sse(parts.into_iter().flatten().collect())
}

fn hello() -> ChatRequest {
    ChatRequest::new("claude-test", vec![Message::user("Say hello.")])
}

#[derive(Default)]
struct Collect {
    text: Mutex<Vec<String>>,
    reasoning: Mutex<Vec<String>>,
}

impl ReplyObserver for Collect {
    fn text(&self, fragment: &str) {
        self.text.lock().unwrap().push(fragment.to_owned());
    }
    fn reasoning(&self, fragment: &str) {
        self.reasoning.lock().unwrap().push(fragment.to_owned());
    }
}

#[tokio::test]
async fn plain_reply_with_usage() {
    let server = start(vec![reply(vec![
        vec![message_start(25), ev(json!({"type": "ping"}))],
        text_block(0, &["Hel", "lo!"]),
        finish("end_turn", 15),
    ])])
    .await;
    let observer = Collect::default();
    let mut request = hello();
    request.messages = std::sync::Arc::new(
        std::iter::once(std::sync::Arc::new(Message::system("Be friendly.")))
            .chain(request.messages.iter().cloned())
            .collect(),
    );
    let reply = provider(&server).stream(&request, &observer).await.unwrap();
    assert_eq!(server.violations(), Vec::<String>::new());
    assert_eq!(reply.text, "Hello!");
    assert_eq!(reply.finish_reason, Some(FinishReason::Stop));
    assert_eq!(*observer.text.lock().unwrap(), vec!["Hel", "lo!"]);
    let usage = reply.usage.unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (25, 15));
    let sent = &server.requests()[0];
    assert_eq!(sent["system"], "Be friendly.");
    assert_eq!(sent["max_tokens"], 8192);
    assert_eq!(
        sent["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}])
    );
}

#[tokio::test]
async fn cached_input_counts_toward_prompt_tokens() {
    let start_event = ev(json!({"type": "message_start", "message": {
        "id": "m", "type": "message", "role": "assistant", "content": [], "model": "c",
        "usage": {"input_tokens": 10, "cache_creation_input_tokens": 100,
                  "cache_read_input_tokens": 1000, "output_tokens": 1}}}));
    let server = start(vec![reply(vec![
        vec![start_event],
        text_block(0, &["ok"]),
        finish("end_turn", 3),
    ])])
    .await;
    let usage = provider(&server)
        .complete(&hello())
        .await
        .unwrap()
        .usage
        .unwrap();
    assert_eq!(usage.prompt_tokens, 1110);
}

#[tokio::test]
async fn streamed_tool_calls_accumulate_across_chunks() {
    let server = start(vec![reply(vec![
        vec![message_start(40)],
        text_block(0, &["Let me check."]),
        tool_block(1, "toolu_1", "weather", &["{\"ci", "ty\": \"Pa", "ris\"}"]),
        tool_block(2, "toolu_2", "clock", &[]),
        finish("tool_use", 30),
    ])])
    .await;
    let mut request = hello();
    request.tools = [ToolSpec {
        name: "weather".into(),
        description: "Weather by city".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    }]
    .into();
    let reply = provider(&server).complete(&request).await.unwrap();
    assert_eq!(server.violations(), Vec::<String>::new());
    assert_eq!(reply.text, "Let me check.");
    assert_eq!(reply.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(
        reply.tool_calls,
        vec![
            ToolCall {
                id: "toolu_1".into(),
                name: "weather".into(),
                arguments: json!({"city": "Paris"}),
            },
            ToolCall {
                id: "toolu_2".into(),
                name: "clock".into(),
                arguments: json!({}),
            },
        ]
    );
    assert_eq!(
        server.requests()[0]["tools"],
        json!([{"name": "weather", "description": "Weather by city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}])
    );
}

#[tokio::test]
async fn events_split_mid_line_still_decode() {
    let all: String = [
        vec![message_start(5)],
        text_block(0, &["one ", "two"]),
        finish("end_turn", 2),
    ]
    .concat()
    .concat();
    let pieces = all
        .as_bytes()
        .chunks(7)
        .map(|c| Piece::Raw(String::from_utf8(c.to_vec()).unwrap()))
        .collect();
    let server = start(vec![Step::Sse(pieces)]).await;
    assert_eq!(
        provider(&server).complete(&hello()).await.unwrap().text,
        "one two"
    );
}

#[tokio::test]
async fn two_round_tool_conversation_is_validated_by_the_server() {
    let check: Validator = Arc::new(|headers, body, round| {
        check_request(headers, body)?;
        if round == 2 {
            let expected = json!([
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and the time?"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking both."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "clock", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 24 C"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "14:05"},
                ]},
            ]);
            if body["messages"] != expected {
                return Err(format!("round 2 messages differ: {}", body["messages"]));
            }
            if body["system"] != "Use tools." {
                return Err("system must stay top-level".into());
            }
        }
        Ok(())
    });
    let server = FakeServer::start(
        PATH,
        check,
        vec![
            reply(vec![
                vec![message_start(50)],
                text_block(0, &["Checking both."]),
                tool_block(1, "toolu_1", "weather", &["{\"city\":", " \"Paris\"}"]),
                tool_block(2, "toolu_2", "clock", &[""]),
                finish("tool_use", 40),
            ]),
            reply(vec![
                vec![message_start(120)],
                text_block(0, &["Sunny in Paris; it is 14:05."]),
                finish("end_turn", 12),
            ]),
        ],
    )
    .await;
    let provider = provider(&server);
    let mut messages = vec![
        Message::system("Use tools."),
        Message::user("Weather in Paris and the time?"),
    ];
    let first = provider
        .complete(&ChatRequest::new("claude-test", messages.clone()))
        .await
        .unwrap();
    messages.push(Message::assistant_tool_calls(
        first.text.clone(),
        first.tool_calls.clone(),
    ));
    messages.push(Message::tool("toolu_1", "Sunny, 24 C"));
    messages.push(Message::tool("toolu_2", "14:05"));
    let second = provider
        .complete(&ChatRequest::new("claude-test", messages))
        .await
        .unwrap();
    assert_eq!(server.violations(), Vec::<String>::new());
    assert_eq!(second.text, "Sunny in Paris; it is 14:05.");
}

#[tokio::test]
async fn a_malformed_history_is_rejected_by_the_server() {
    // A tool result whose call is not in the previous assistant turn.
    let server = start(vec![]).await;
    let request = ChatRequest::new(
        "claude-test",
        vec![
            Message::user("hi"),
            Message::assistant("hello"),
            Message::tool("toolu_9", "x"),
        ],
    );
    let err = provider(&server).complete(&request).await.unwrap_err();
    assert_eq!(err, ModelError::Rejected { status: 400 });
    assert_eq!(server.violations().len(), 1);
}

#[tokio::test]
async fn thinking_is_enabled_with_a_budget_streamed_apart_and_replayed() {
    let thinking_block = vec![
        ev(json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "thinking", "thinking": ""}})),
        ev(json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "Paris first"}})),
        ev(json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "thinking_delta", "thinking": ", then reply."}})),
        ev(json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}})),
        ev(json!({"type": "content_block_stop", "index": 0})),
    ];
    let server = start(vec![
        reply(vec![
            vec![message_start(60)],
            thinking_block,
            tool_block(1, "toolu_1", "weather", &["{\"city\": \"Paris\"}"]),
            finish("tool_use", 80),
        ]),
        reply(vec![
            vec![message_start(90)],
            text_block(0, &["Sunny."]),
            finish("end_turn", 5),
        ]),
        reply(vec![
            vec![message_start(90)],
            text_block(0, &["Sunny."]),
            finish("end_turn", 5),
        ]),
    ])
    .await;
    let provider = provider(&server);
    let mut request = hello();
    request.thinking = ThinkingSwitch::On;
    request.temperature = Some(0.4);
    let observer = Collect::default();
    let first = provider.stream(&request, &observer).await.unwrap();
    assert_eq!(server.violations(), Vec::<String>::new());
    let sent = &server.requests()[0];
    assert_eq!(
        sent["thinking"],
        json!({"type": "enabled", "budget_tokens": 4096})
    );
    assert!(sent.get("temperature").is_none());
    assert_eq!(first.text, "");
    assert_eq!(
        first.reasoning,
        vec![ReasoningBlock {
            text: "Paris first, then reply.".into(),
            signature: Some("EqQBCgIYAhIM".into()),
            redacted: None,
        }]
    );
    assert_eq!(
        *observer.reasoning.lock().unwrap(),
        vec!["Paris first", ", then reply."]
    );
    assert!(observer.text.lock().unwrap().is_empty());

    // Round two with the signed block replayed: thinking stays on.
    let mut messages: Vec<Message> = request.messages.iter().map(|m| (**m).clone()).collect();
    messages.push(Message::Assistant {
        content: first.text.clone().into(),
        tool_calls: first.tool_calls.clone(),
        reasoning: first.reasoning.clone(),
    });
    messages.push(Message::tool("toolu_1", "Sunny"));
    let mut second = ChatRequest::new("claude-test", messages.clone());
    second.thinking = ThinkingSwitch::On;
    provider.complete(&second).await.unwrap();
    assert_eq!(server.violations(), Vec::<String>::new());
    let sent = &server.requests()[1];
    assert_eq!(sent["thinking"]["type"], "enabled");
    assert_eq!(sent["messages"][1]["content"][0]["type"], "thinking");

    // Without the block, the request goes out with thinking disabled rather than refused.
    if let Some(Message::Assistant { reasoning, .. }) = messages.get_mut(1) {
        reasoning.clear();
    }
    let mut third = ChatRequest::new("claude-test", messages);
    third.thinking = ThinkingSwitch::On;
    provider.complete(&third).await.unwrap();
    assert_eq!(server.violations(), Vec::<String>::new());
    assert_eq!(
        server.requests()[2]["thinking"],
        json!({"type": "disabled"})
    );
}

#[tokio::test]
async fn thinking_off_and_small_caps_follow_the_api_rules() {
    let ok = || {
        reply(vec![
            vec![message_start(5)],
            text_block(0, &["ok"]),
            finish("end_turn", 1),
        ])
    };
    let server = start(vec![ok(), ok()]).await;
    let provider = provider_with(
        &server,
        AnthropicOptions {
            thinking_budget: 2048,
            ..AnthropicOptions::default()
        },
        ModelLimits::default(),
    );
    let mut off = hello();
    off.thinking = ThinkingSwitch::Off;
    off.temperature = Some(0.2);
    provider.complete(&off).await.unwrap();
    let mut on = hello();
    on.thinking = ThinkingSwitch::On;
    on.max_tokens = Some(256);
    provider.complete(&on).await.unwrap();
    assert_eq!(server.violations(), Vec::<String>::new());
    let sent = server.requests();
    assert_eq!(sent[0]["thinking"], json!({"type": "disabled"}));
    assert_eq!(sent[0]["temperature"], json!(0.2));
    assert_eq!(
        sent[1]["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    assert_eq!(sent[1]["max_tokens"], 256 + 2048);
}

#[tokio::test]
async fn max_tokens_stop_is_length() {
    let server = start(vec![reply(vec![
        vec![message_start(5)],
        text_block(0, &["cut sh"]),
        finish("max_tokens", 4),
    ])])
    .await;
    let reply = provider(&server).complete(&hello()).await.unwrap();
    assert_eq!(reply.finish_reason, Some(FinishReason::Length));
    assert_eq!(reply.text, "cut sh");
}

#[tokio::test]
async fn a_stalled_stream_times_out() {
    let server = start(vec![Step::Sse(vec![
        Piece::Raw(message_start(5)),
        Piece::Pause(Duration::from_secs(30)),
        Piece::Raw(ev(json!({"type": "message_stop"}))),
    ])])
    .await;
    let limits = ModelLimits {
        receive_timeout: Duration::from_millis(300),
        ..ModelLimits::default()
    };
    let err = provider_with(&server, AnthropicOptions::default(), limits)
        .complete(&hello())
        .await
        .unwrap_err();
    assert_eq!(err, ModelError::Timeout);
}

#[tokio::test]
async fn an_oversized_reply_is_refused() {
    let big = "y".repeat(1_000);
    let fragments: Vec<&str> = (0..8).map(|_| big.as_str()).collect();
    let server = start(vec![reply(vec![
        vec![message_start(5)],
        text_block(0, &fragments),
        finish("end_turn", 9),
    ])])
    .await;
    let limits = ModelLimits {
        response_cap: 4_096,
        ..ModelLimits::default()
    };
    let err = provider_with(&server, AnthropicOptions::default(), limits)
        .complete(&hello())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ModelError::ResponseTooLarge {
            limit: 4_096,
            kind: OversizeKind::Stream
        }
    );
}

#[tokio::test]
async fn http_statuses_are_classified() {
    let error = |kind: &str, message: &str| {
        json!({"type": "error", "error": {"type": kind, "message": message}}).to_string()
    };
    let cases = vec![
        (
            429,
            error(
                "rate_limit_error",
                "Number of request tokens has exceeded your per-minute rate limit",
            ),
            ModelError::RateLimited,
        ),
        (
            529,
            error("overloaded_error", "Overloaded"),
            ModelError::Overloaded { status: 529 },
        ),
        (503, String::new(), ModelError::Overloaded { status: 503 }),
        (
            400,
            error(
                "invalid_request_error",
                "prompt is too long: 208310 tokens > 200000 maximum",
            ),
            ModelError::ContextOverflow { status: 400 },
        ),
        (
            413,
            error("request_too_large", "Request exceeds the maximum size"),
            ModelError::Rejected { status: 413 },
        ),
        (
            401,
            error("authentication_error", "invalid x-api-key"),
            ModelError::Credentials { status: 401 },
        ),
        (
            400,
            error("invalid_request_error", "messages: roles must alternate"),
            ModelError::Rejected { status: 400 },
        ),
    ];
    let server = start(cases.iter().map(|(s, b, _)| status(*s, b)).collect()).await;
    let provider = provider(&server);
    for (code, _, expected) in cases {
        assert_eq!(
            provider.complete(&hello()).await.unwrap_err(),
            expected,
            "status {code}"
        );
    }
}

#[tokio::test]
async fn error_events_inside_the_stream_are_classified() {
    let server = start(vec![
        reply(vec![
            vec![message_start(5)],
            text_block(0, &["par"]),
            vec![ev(json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))],
        ]),
        reply(vec![vec![ev(json!({"type": "error",
            "error": {"type": "invalid_request_error", "message": "prompt is too long"}}))]]),
    ])
    .await;
    let provider = provider(&server);
    let err = provider.complete(&hello()).await.unwrap_err();
    assert_eq!(err, ModelError::Overloaded { status: 529 });
    assert!(err.retryable());
    let err = provider.complete(&hello()).await.unwrap_err();
    assert!(err.is_context_overflow());
}

#[tokio::test]
async fn a_truncated_stream_is_malformed() {
    let server = start(vec![reply(vec![
        vec![message_start(5)],
        text_block(0, &["Hel"]),
    ])])
    .await;
    let err = provider(&server).complete(&hello()).await.unwrap_err();
    assert_eq!(
        err,
        ModelError::malformed("the reply stream ended before the reply was complete")
    );
}

#[tokio::test]
async fn malformed_json_is_malformed() {
    let server = start(vec![sse(vec![
        message_start(5),
        "event: content_block_start\ndata: {\"type\": \"content_block_start\", \"index\": 0,\n\n"
            .into(),
    ])])
    .await;
    let err = provider(&server).complete(&hello()).await.unwrap_err();
    assert_eq!(
        err,
        ModelError::malformed("a reply event is not valid JSON")
    );
}

#[tokio::test]
async fn base_urls_with_or_without_v1_reach_the_same_endpoint() {
    let ok = || {
        reply(vec![
            vec![message_start(1)],
            text_block(0, &["ok"]),
            finish("end_turn", 1),
        ])
    };
    let server = start(vec![ok(), ok()]).await;
    for base in [
        format!("{}/", server.origin),
        format!("{}/v1", server.origin),
    ] {
        let provider = AnthropicProvider::new(
            &base,
            Some(KEY.into()),
            AnthropicOptions::default(),
            ModelLimits::default(),
        )
        .unwrap();
        assert_eq!(provider.complete(&hello()).await.unwrap().text, "ok");
    }
}

#[tokio::test]
async fn a_whole_json_message_to_a_streaming_request_is_accepted() {
    let server = start(vec![Step::Json(json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "fetch", "input": {"url": "https://e.com"}}
        ],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 11, "output_tokens": 7}
    }))])
    .await;
    let provider = provider_with(&server, AnthropicOptions::default(), ModelLimits::default());
    let reply = provider.complete(&hello()).await.unwrap();
    assert_eq!(reply.text, "Let me look.");
    assert_eq!(reply.tool_calls.len(), 1);
    assert_eq!(reply.tool_calls[0].id, "toolu_1");
    assert_eq!(
        reply.tool_calls[0].arguments,
        json!({"url": "https://e.com"})
    );
    assert_eq!(reply.finish_reason, Some(FinishReason::ToolCalls));
}

#[tokio::test]
async fn a_redirect_from_the_messages_endpoint_is_never_followed() {
    let server = start(vec![Step::Redirect(
        307,
        "https://elsewhere.example/v1/messages".into(),
    )])
    .await;
    let provider = provider_with(&server, AnthropicOptions::default(), ModelLimits::default());
    let err = provider.complete(&hello()).await.unwrap_err();
    assert!(
        err.detail()
            .unwrap()
            .contains("answered 307 redirecting to https://elsewhere.example/v1/messages"),
        "{err:?}"
    );
}

#[tokio::test]
async fn rounds_reuse_one_connection() {
    let body = [
        vec![message_start(5)],
        text_block(0, &["Hi."]),
        finish("end_turn", 2),
    ]
    .concat()
    .concat();
    let server = fake::KeepAliveServer::start(body).await;
    let provider = AnthropicProvider::new(
        &server.origin,
        Some(KEY.to_owned()),
        AnthropicOptions::default(),
        ModelLimits {
            retries: 0,
            ..ModelLimits::default()
        },
    )
    .unwrap();
    fake::assert_rounds_share_a_connection(&server, &provider, &hello(), "Hi.").await;
}

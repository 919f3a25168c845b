//! The OpenAI-compatible provider against a fake chat-completions server on 127.0.0.1 that
//! validates every request body against the wire schema.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "model_fake.rs"]
mod fake;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use fake::{FakeServer, Piece, Step, Validator, data, only_keys, sse, status, string};
use promptforge_harness::model::{
    ChatRequest, Content, ContentPart, FinishReason, ImageUrl, MaxTokensField, Message, ModelError,
    ModelLimits, ModelProvider, OpenAiOptions, OpenAiProvider, OpenAiThinking, OversizeKind,
    ReplyObserver, ThinkingSwitch, ToolCall, ToolSpec,
};
use serde_json::{Value, json};

const PATH: &str = "/v1/chat/completions";
const KEY: &str = "sk-test-123";

/// The chat-completions request schema, strictly: known keys only, the exact shapes of
/// content parts, assistant tool calls (arguments as a JSON string holding an object) and
/// tool records, every tool call answered by a tool record before anything else follows.
fn check_request(headers: &HeaderMap, body: &Value) -> Result<(), String> {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if auth != format!("Bearer {KEY}") {
        return Err(format!("bad authorization header `{auth}`"));
    }
    only_keys(
        body,
        &[
            "model",
            "messages",
            "tools",
            "temperature",
            "max_tokens",
            "max_completion_tokens",
            "stream",
            "stream_options",
            "reasoning_effort",
            "chat_template_kwargs",
        ],
        "body",
    )?;
    if string(body, "model", "body")?.is_empty() {
        return Err("model must not be empty".into());
    }
    if body.get("stream") != Some(&json!(true)) {
        return Err("stream must be true".into());
    }
    if let Some(options) = body.get("stream_options")
        && options != &json!({"include_usage": true})
    {
        return Err("stream_options must be {include_usage: true}".into());
    }
    if let Some(t) = body.get("temperature") {
        let t = t.as_f64().ok_or("temperature must be a number")?;
        if !(0.0..=2.0).contains(&t) {
            return Err("temperature out of range".into());
        }
    }
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(v) = body.get(key)
            && v.as_u64().is_none_or(|n| n == 0)
        {
            return Err(format!("{key} must be a positive integer"));
        }
    }
    if let Some(effort) = body.get("reasoning_effort") {
        let effort = effort.as_str().ok_or("reasoning_effort must be a string")?;
        if !["none", "minimal", "low", "medium", "high"].contains(&effort) {
            return Err(format!("unknown reasoning_effort `{effort}`"));
        }
    }
    if let Some(kwargs) = body.get("chat_template_kwargs") {
        let ok = kwargs
            .as_object()
            .is_some_and(|o| o.values().all(Value::is_boolean));
        if !ok {
            return Err("chat_template_kwargs must map names to booleans".into());
        }
    }
    if let Some(tools) = body.get("tools") {
        let tools = tools.as_array().ok_or("tools must be an array")?;
        for (i, tool) in tools.iter().enumerate() {
            let at = format!("tools[{i}]");
            only_keys(tool, &["type", "function"], &at)?;
            if tool.get("type") != Some(&json!("function")) {
                return Err(format!("{at}.type must be \"function\""));
            }
            let function = &tool["function"];
            only_keys(function, &["name", "description", "parameters"], &at)?;
            string(function, "name", &at)?;
            if !function.get("parameters").is_some_and(Value::is_object) {
                return Err(format!("{at}.function.parameters must be an object"));
            }
        }
    }
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("messages must be an array")?;
    if messages.is_empty() {
        return Err("messages must not be empty".into());
    }
    let mut pending: Vec<String> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = string(message, "role", &at)?;
        if role != "tool" && !pending.is_empty() {
            return Err(format!("{at}: tool calls {pending:?} have no tool result"));
        }
        match role {
            "system" | "user" => {
                only_keys(message, &["role", "content"], &at)?;
                check_content(&message["content"], role == "user", &at)?;
            }
            "assistant" => {
                only_keys(message, &["role", "content", "tool_calls"], &at)?;
                let content = message
                    .get("content")
                    .ok_or(format!("{at} needs content"))?;
                if !content.is_null() {
                    check_content(content, false, &at)?;
                }
                if let Some(calls) = message.get("tool_calls") {
                    let calls = calls.as_array().ok_or(format!("{at}.tool_calls"))?;
                    if calls.is_empty() {
                        return Err(format!("{at}.tool_calls must not be empty"));
                    }
                    for (j, call) in calls.iter().enumerate() {
                        let at = format!("{at}.tool_calls[{j}]");
                        only_keys(call, &["id", "type", "function"], &at)?;
                        if call.get("type") != Some(&json!("function")) {
                            return Err(format!("{at}.type must be \"function\""));
                        }
                        let id = string(call, "id", &at)?;
                        let function = &call["function"];
                        only_keys(function, &["name", "arguments"], &at)?;
                        string(function, "name", &at)?;
                        let arguments = string(function, "arguments", &at)?;
                        let parsed: Value = serde_json::from_str(arguments)
                            .map_err(|_| format!("{at}.function.arguments is not JSON text"))?;
                        if !parsed.is_object() {
                            return Err(format!("{at}.function.arguments must hold an object"));
                        }
                        pending.push(id.to_owned());
                    }
                } else if content.is_null() {
                    return Err(format!("{at}: null content needs tool_calls"));
                }
            }
            "tool" => {
                only_keys(message, &["role", "tool_call_id", "content"], &at)?;
                let id = string(message, "tool_call_id", &at)?;
                let Some(pos) = pending.iter().position(|p| p == id) else {
                    return Err(format!("{at}: tool_call_id `{id}` answers no pending call"));
                };
                pending.remove(pos);
                check_content(&message["content"], false, &at)?;
            }
            other => return Err(format!("{at}: unknown role `{other}`")),
        }
    }
    Ok(())
}

fn check_content(content: &Value, images: bool, at: &str) -> Result<(), String> {
    match content {
        Value::String(_) => Ok(()),
        Value::Array(parts) if !parts.is_empty() => {
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        only_keys(part, &["type", "text"], at)?;
                        string(part, "text", at)?;
                    }
                    Some("image_url") if images => {
                        only_keys(part, &["type", "image_url"], at)?;
                        only_keys(&part["image_url"], &["url"], at)?;
                        string(&part["image_url"], "url", at)?;
                    }
                    _ => return Err(format!("{at}: bad content part {part}")),
                }
            }
            Ok(())
        }
        _ => Err(format!("{at}.content must be a string or parts")),
    }
}

fn validator() -> Validator {
    Arc::new(|headers, body, _round| check_request(headers, body))
}

/// The limits most tests use: no retries, so each scripted failure is the round's own.
fn limits() -> ModelLimits {
    ModelLimits {
        retries: 0,
        ..ModelLimits::default()
    }
}

async fn start(steps: Vec<Step>) -> FakeServer {
    FakeServer::start(PATH, validator(), steps).await
}

fn provider_with(
    server: &FakeServer,
    options: OpenAiOptions,
    limits: ModelLimits,
) -> OpenAiProvider {
    OpenAiProvider::new(
        &format!("{}/v1", server.origin),
        Some(KEY.to_owned()),
        options,
        limits,
    )
    .unwrap()
}

fn provider(server: &FakeServer) -> OpenAiProvider {
    provider_with(server, OpenAiOptions::default(), limits())
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    data(&json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }))
}

/// A reply trickling in: `count` content chunks of one `.`, each after a pause of `every`.
fn dots(count: usize, every: Duration) -> Vec<Piece> {
    (0..count)
        .flat_map(|_| {
            [
                Piece::Pause(every),
                Piece::Raw(chunk(json!({"content": "."}), None)),
            ]
        })
        .collect()
}

fn done() -> String {
    "data: [DONE]\n\n".to_owned()
}

fn hello() -> ChatRequest {
    ChatRequest::new("gpt-test", vec![Message::user("Say hello.")])
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
async fn plain_reply_streams_fragments_in_order() {
    let server = start(vec![sse(vec![
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"content": "Hel"}), None),
        chunk(json!({"content": "lo!"}), None),
        chunk(json!({}), Some("stop")),
        done(),
    ])])
    .await;
    let observer = Collect::default();
    let reply = provider(&server).stream(&hello(), &observer).await.unwrap();
    assert_eq!(reply.text, "Hello!");
    assert_eq!(reply.finish_reason, Some(FinishReason::Stop));
    assert!(reply.tool_calls.is_empty());
    assert_eq!(*observer.text.lock().unwrap(), vec!["Hel", "lo!"]);
    assert_eq!(server.violations(), Vec::<String>::new());
    let sent = &server.requests()[0];
    assert_eq!(
        sent["messages"],
        json!([{"role": "user", "content": "Say hello."}])
    );
    assert!(sent.get("temperature").is_none() && sent.get("max_tokens").is_none());
}

#[tokio::test]
async fn events_split_across_chunks_and_crlf_lines_decode() {
    let first = chunk(json!({"content": "split "}), None);
    let (a, b) = first.split_at(17);
    let server = start(vec![Step::Sse(vec![
        Piece::Raw(": keep-alive comment\n\n".into()),
        Piece::Raw(a.to_owned()),
        Piece::Pause(Duration::from_millis(20)),
        Piece::Raw(b.to_owned()),
        Piece::Raw(chunk(json!({"content": "event"}), Some("stop")).replace('\n', "\r\n")),
        Piece::Raw(done()),
    ])])
    .await;
    let reply = provider(&server).complete(&hello()).await.unwrap();
    assert_eq!(reply.text, "split event");
}

#[tokio::test]
async fn streamed_tool_calls_accumulate_across_chunks() {
    let server = start(vec![sse(vec![
        chunk(
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"index": 0, "id": "call_a", "type": "function",
                 "function": {"name": "weather", "arguments": ""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"ci"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "ty\": \"Par"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [
                {"index": 0, "function": {"arguments": "is\"}"}},
                {"index": 1, "id": "call_b", "type": "function",
                 "function": {"name": "clock", "arguments": ""}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        done(),
    ])])
    .await;
    let mut request = hello();
    request.tools = [
        ToolSpec {
            name: "weather".into(),
            description: "Weather by city".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        },
        ToolSpec {
            name: "clock".into(),
            description: "The time".into(),
            parameters: json!({"type": "object", "properties": {}}),
        },
    ]
    .into();
    let reply = provider(&server).complete(&request).await.unwrap();
    assert_eq!(server.violations(), Vec::<String>::new());
    assert_eq!(reply.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(
        reply.tool_calls,
        vec![
            ToolCall {
                id: "call_a".into(),
                name: "weather".into(),
                arguments: json!({"city": "Paris"}),
            },
            ToolCall {
                id: "call_b".into(),
                name: "clock".into(),
                arguments: Value::Null,
            },
        ]
    );
    assert_eq!(reply.text, "");
    assert_eq!(
        server.requests()[0]["tools"][0],
        json!({"type": "function", "function": {
            "name": "weather", "description": "Weather by city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    );
}

#[tokio::test]
async fn malformed_arguments_reach_the_engine_as_raw_text() {
    let server = start(vec![sse(vec![
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                   "function": {"name": "f", "arguments": "{not json"}}]}),
            Some("tool_calls"),
        ),
        done(),
    ])])
    .await;
    let reply = provider(&server).complete(&hello()).await.unwrap();
    assert_eq!(reply.tool_calls[0].arguments, json!("{not json"));
}

#[tokio::test]
async fn two_round_tool_conversation_is_validated_by_the_server() {
    let round_two_check: Validator = Arc::new(|headers, body, round| {
        check_request(headers, body)?;
        if round == 2 {
            let messages = body["messages"].as_array().ok_or("messages")?;
            let expected = json!([
                {"role": "system", "content": "Use tools."},
                {"role": "user", "content": "Weather in Paris and the time?"},
                {"role": "assistant", "content": "Checking both.", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_2", "type": "function",
                     "function": {"name": "clock", "arguments": "{}"}},
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 C"},
                {"role": "tool", "tool_call_id": "call_2", "content": "14:05"},
            ]);
            if Value::Array(messages.clone()) != expected {
                return Err(format!("round 2 messages differ: {}", body["messages"]));
            }
        }
        Ok(())
    });
    let server = FakeServer::start(
        PATH,
        round_two_check,
        vec![
            sse(vec![
                chunk(json!({"content": "Checking both."}), None),
                chunk(
                    json!({"tool_calls": [
                        {"index": 0, "id": "call_1", "type": "function",
                         "function": {"name": "weather", "arguments": "{\"city\":"}}]}),
                    None,
                ),
                chunk(
                    json!({"tool_calls": [
                        {"index": 0, "function": {"arguments": "\"Paris\"}"}},
                        {"index": 1, "id": "call_2", "type": "function",
                         "function": {"name": "clock", "arguments": "{}"}}]}),
                    None,
                ),
                chunk(json!({}), Some("tool_calls")),
                done(),
            ]),
            sse(vec![
                chunk(
                    json!({"content": "Sunny in Paris; it is 14:05."}),
                    Some("stop"),
                ),
                done(),
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
        .complete(&ChatRequest::new("gpt-test", messages.clone()))
        .await
        .unwrap();
    assert_eq!(first.text, "Checking both.");
    assert_eq!(first.tool_calls.len(), 2);
    // The engine records the calls with decoded arguments (an absent object is `{}`).
    let calls: Vec<ToolCall> = first
        .tool_calls
        .iter()
        .map(|c| ToolCall {
            arguments: if c.arguments.is_null() {
                json!({})
            } else {
                c.arguments.clone()
            },
            ..c.clone()
        })
        .collect();
    messages.push(Message::assistant_tool_calls(first.text.clone(), calls));
    messages.push(Message::tool("call_1", "Sunny, 24 C"));
    messages.push(Message::tool("call_2", "14:05"));
    let second = provider
        .complete(&ChatRequest::new("gpt-test", messages))
        .await
        .unwrap();
    assert_eq!(server.violations(), Vec::<String>::new());
    assert_eq!(second.text, "Sunny in Paris; it is 14:05.");
}

#[tokio::test]
async fn the_server_rejects_a_malformed_second_round() {
    // A tool record that answers no call: the schema check refuses it with 400, which the
    // provider reports as a rejected request.
    let server = start(vec![]).await;
    let request = ChatRequest::new(
        "gpt-test",
        vec![Message::user("hi"), Message::tool("call_9", "orphan")],
    );
    let err = provider(&server).complete(&request).await.unwrap_err();
    assert_eq!(err, ModelError::Rejected { status: 400 });
    assert_eq!(server.violations().len(), 1);
}

#[tokio::test]
async fn images_and_sampling_options_reach_the_wire() {
    let server = start(vec![sse(vec![
        chunk(json!({"content": "A bar chart."}), Some("stop")),
        done(),
    ])])
    .await;
    let mut request = ChatRequest::new(
        "gpt-test",
        vec![Message::User {
            content: Content::Parts(vec![
                ContentPart::Text {
                    text: "What does this chart show?".into(),
                },
                ContentPart::ImageUrl {
                    image_url: ImageUrl {
                        url: "data:image/png;base64,iVBORw0KGgo=".into(),
                    },
                },
            ]),
        }],
    );
    request.temperature = Some(0.3);
    request.max_tokens = Some(256);
    provider(&server).complete(&request).await.unwrap();
    assert_eq!(server.violations(), Vec::<String>::new());
    let sent = &server.requests()[0];
    assert_eq!(sent["temperature"], json!(0.3));
    assert_eq!(sent["max_tokens"], json!(256));
    assert_eq!(
        sent["messages"][0]["content"][1]["image_url"]["url"],
        "data:image/png;base64,iVBORw0KGgo="
    );
}

#[tokio::test]
async fn usage_and_reasoning_are_reported_apart_from_the_text() {
    let server = start(vec![sse(vec![
        chunk(json!({"reasoning_content": "Think"}), None),
        chunk(json!({"reasoning_content": "ing."}), None),
        chunk(json!({"content": "42"}), None),
        chunk(json!({}), Some("stop")),
        data(&json!({"id": "x", "choices": [], "usage": {
            "prompt_tokens": 31, "completion_tokens": 12, "total_tokens": 43,
            "completion_tokens_details": {"reasoning_tokens": 9}}})),
        done(),
    ])])
    .await;
    let observer = Collect::default();
    let reply = provider(&server).stream(&hello(), &observer).await.unwrap();
    assert_eq!(reply.text, "42");
    assert_eq!(reply.reasoning.len(), 1);
    assert_eq!(reply.reasoning[0].text, "Thinking.");
    assert_eq!(*observer.reasoning.lock().unwrap(), vec!["Think", "ing."]);
    let usage = reply.usage.unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (31, 12));
    assert_eq!(usage.reasoning_tokens, Some(9));
    assert_eq!(usage.conversation_tokens(), 34);
    assert_eq!(
        server.requests()[0]["stream_options"],
        json!({"include_usage": true})
    );
}

#[tokio::test]
async fn thinking_switch_maps_to_each_servers_parameter() {
    let reply = || sse(vec![chunk(json!({"content": "ok"}), Some("stop")), done()]);
    let server = start((0..6).map(|_| reply()).collect()).await;
    let effort = OpenAiOptions {
        max_tokens_field: MaxTokensField::MaxCompletionTokens,
        thinking: OpenAiThinking::ReasoningEffort {
            on: "medium".into(),
            off: "none".into(),
        },
        include_usage: true,
    };
    let kwargs = OpenAiOptions {
        max_tokens_field: MaxTokensField::MaxTokens,
        thinking: OpenAiThinking::ChatTemplateKwargs {
            key: "enable_thinking".into(),
        },
        include_usage: false,
    };
    let mut sent = HashMap::new();
    for (name, options) in [("effort", effort), ("kwargs", kwargs)] {
        let provider = provider_with(&server, options, limits());
        for switch in [
            ThinkingSwitch::On,
            ThinkingSwitch::Off,
            ThinkingSwitch::ModelDefault,
        ] {
            let mut request = hello();
            request.thinking = switch;
            request.max_tokens = Some(64);
            provider.complete(&request).await.unwrap();
            sent.insert((name, switch), server.requests().last().cloned().unwrap());
        }
    }
    assert_eq!(server.violations(), Vec::<String>::new());
    assert_eq!(
        sent[&("effort", ThinkingSwitch::On)]["reasoning_effort"],
        "medium"
    );
    assert_eq!(
        sent[&("effort", ThinkingSwitch::Off)]["reasoning_effort"],
        "none"
    );
    assert!(
        sent[&("effort", ThinkingSwitch::ModelDefault)]
            .get("reasoning_effort")
            .is_none()
    );
    assert_eq!(
        sent[&("effort", ThinkingSwitch::On)]["max_completion_tokens"],
        64
    );
    assert_eq!(
        sent[&("kwargs", ThinkingSwitch::On)]["chat_template_kwargs"],
        json!({"enable_thinking": true})
    );
    assert_eq!(
        sent[&("kwargs", ThinkingSwitch::Off)]["chat_template_kwargs"],
        json!({"enable_thinking": false})
    );
    assert!(
        sent[&("kwargs", ThinkingSwitch::ModelDefault)]
            .get("chat_template_kwargs")
            .is_none()
    );
    assert_eq!(sent[&("kwargs", ThinkingSwitch::On)]["max_tokens"], 64);
    assert!(
        sent[&("kwargs", ThinkingSwitch::On)]
            .get("stream_options")
            .is_none()
    );
}

fn short_timeout() -> ModelLimits {
    ModelLimits {
        receive_timeout: Duration::from_millis(300),
        ..limits()
    }
}

#[tokio::test]
async fn a_stalled_stream_times_out_per_chunk() {
    let server = start(vec![Step::Sse(vec![
        Piece::Raw(chunk(json!({"content": "Hel"}), None)),
        Piece::Pause(Duration::from_secs(30)),
        Piece::Raw(done()),
    ])])
    .await;
    let provider = provider_with(&server, OpenAiOptions::default(), short_timeout());
    let err = provider.complete(&hello()).await.unwrap_err();
    assert_eq!(err, ModelError::Timeout);
    assert_eq!(err.to_string(), "the model backend did not answer in time");
    assert!(err.retryable());
}

#[tokio::test]
async fn slow_headers_time_out() {
    let server = start(vec![Step::Delay(
        Duration::from_secs(30),
        Box::new(sse(vec![done()])),
    )])
    .await;
    let provider = provider_with(&server, OpenAiOptions::default(), short_timeout());
    assert_eq!(
        provider.complete(&hello()).await.unwrap_err(),
        ModelError::Timeout
    );
}

#[tokio::test]
async fn a_reply_that_keeps_streaming_is_never_cut_off() {
    // Eight chunks 150 ms apart: 1.2 s in all, far past the 300 ms receive timeout, but no
    // single wait reaches it.
    let mut pieces = dots(8, Duration::from_millis(150));
    pieces.push(Piece::Raw(chunk(json!({}), Some("stop"))));
    pieces.push(Piece::Raw(done()));
    let server = start(vec![Step::Sse(pieces)]).await;
    let provider = provider_with(&server, OpenAiOptions::default(), short_timeout());
    assert_eq!(provider.complete(&hello()).await.unwrap().text, "........");
}

#[tokio::test]
async fn an_oversized_reply_is_refused_as_it_arrives() {
    let big = "x".repeat(400);
    let mut events: Vec<String> = (0..10)
        .map(|_| chunk(json!({"content": big}), None))
        .collect();
    events.push(chunk(json!({}), Some("stop")));
    events.push(done());
    let server = start(vec![sse(events)]).await;
    let limits = ModelLimits {
        response_cap: 2_000,
        ..ModelLimits::default()
    };
    let provider = provider_with(&server, OpenAiOptions::default(), limits);
    let err = provider.complete(&hello()).await.unwrap_err();
    assert_eq!(
        err,
        ModelError::ResponseTooLarge {
            limit: 2_000,
            kind: OversizeKind::Stream
        }
    );
    assert_eq!(
        err.to_string(),
        "the model backend sent a reply that could not be understood: response stream exceeds the 2000-byte limit"
    );
    assert!(err.retryable());
}

#[tokio::test]
async fn oversized_error_bodies_name_the_cap() {
    let body = "e".repeat(5_000);
    let server = start(vec![
        status(500, &body),
        Step::Status {
            status: 500,
            body: body.clone(),
            chunked: true,
        },
    ])
    .await;
    let limits = ModelLimits {
        response_cap: 1_000,
        ..ModelLimits::default()
    };
    let provider = provider_with(&server, OpenAiOptions::default(), limits);
    let announced = provider.complete(&hello()).await.unwrap_err();
    assert_eq!(
        announced.to_string(),
        "the model backend sent a reply that could not be understood: response body of 5000 bytes exceeds the 1000-byte limit"
    );
    let chunked = provider.complete(&hello()).await.unwrap_err();
    assert_eq!(
        chunked.to_string(),
        "the model backend sent a reply that could not be understood: response body exceeds the 1000-byte limit"
    );
}

#[tokio::test]
async fn http_statuses_are_classified() {
    let context_body = json!({"error": {
        "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9001 tokens.",
        "type": "invalid_request_error", "code": "context_length_exceeded"}})
    .to_string();
    let cases: Vec<(u16, String, ModelError, bool)> = vec![
        (429, r#"{"error":{"message":"Rate limit reached"}}"#.into(), ModelError::RateLimited, true),
        (
            429,
            r#"{"error":{"type":"insufficient_quota","message":"You exceeded your current quota"}}"#.into(),
            ModelError::QuotaSpent,
            false,
        ),
        (529, String::new(), ModelError::Overloaded { status: 529 }, true),
        (503, "busy".into(), ModelError::Overloaded { status: 503 }, true),
        (500, "boom".into(), ModelError::ServerFault { status: 500 }, true),
        (502, "[INFO] forged log line".into(), ModelError::ServerFault { status: 502 }, true),
        (400, context_body, ModelError::ContextOverflow { status: 400 }, false),
        (413, "Request too large for model".into(), ModelError::ContextOverflow { status: 413 }, false),
        (400, "bad field".into(), ModelError::Rejected { status: 400 }, false),
        (401, "no".into(), ModelError::Credentials { status: 401 }, false),
        (404, "no such model".into(), ModelError::Rejected { status: 404 }, false),
    ];
    let server = start(cases.iter().map(|(s, b, _, _)| status(*s, b)).collect()).await;
    let provider = provider(&server);
    for (code, _, expected, retryable) in cases {
        let err = provider.complete(&hello()).await.unwrap_err();
        assert_eq!(err, expected, "status {code}");
        assert_eq!(err.retryable(), retryable, "status {code}");
        assert!(!err.to_string().contains("forged"));
    }
    assert!(
        ModelError::ContextOverflow { status: 400 }.is_context_overflow(),
        "overflow feeds the compactor"
    );
}

#[tokio::test]
async fn an_error_inside_the_stream_is_classified_by_its_text() {
    let server = start(vec![
        sse(vec![
            chunk(json!({"content": "par"}), None),
            data(
                &json!({"error": {"message": "the request exceeds the available context size",
                                   "type": "exceed_context_size_error", "code": 400}}),
            ),
        ]),
        sse(vec![data(
            &json!({"error": {"message": "server busy", "code": 503}}),
        )]),
    ])
    .await;
    let provider = provider(&server);
    assert_eq!(
        provider.complete(&hello()).await.unwrap_err(),
        ModelError::ContextOverflow { status: 400 }
    );
    assert_eq!(
        provider.complete(&hello()).await.unwrap_err(),
        ModelError::Overloaded { status: 503 }
    );
}

#[tokio::test]
async fn a_truncated_stream_is_malformed() {
    let server = start(vec![sse(vec![
        chunk(json!({"content": "Hel"}), None),
        chunk(json!({"content": "lo"}), None),
    ])])
    .await;
    let err = provider(&server).complete(&hello()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "the model backend sent a reply that could not be understood: the reply stream ended before the reply was complete"
    );
    assert!(err.retryable());
}

#[tokio::test]
async fn malformed_json_is_malformed() {
    let server = start(vec![sse(vec![
        chunk(json!({"content": "ok"}), None),
        "data: {\"choices\": [\n\n".to_owned(),
        done(),
    ])])
    .await;
    let err = provider(&server).complete(&hello()).await.unwrap_err();
    assert_eq!(
        err,
        ModelError::malformed("a reply chunk is not valid JSON")
    );
}

#[tokio::test]
async fn a_json_document_instead_of_a_stream_is_read_whole() {
    // A server that ignores `stream: true` answers with one document; it is read as the
    // stream it stands for (issue 10: a LiteLLM proxy does this).
    let server = start(vec![status(
        200,
        r#"{"choices":[{"message":{"content":"hi"}}]}"#,
    )])
    .await;
    let reply = provider(&server).complete(&hello()).await.unwrap();
    assert_eq!(reply.text, "hi");
    let server = start(vec![status(200, r#"{"no": "choices"}"#)]).await;
    assert_eq!(
        provider(&server).complete(&hello()).await.unwrap_err(),
        ModelError::malformed("the reply has no choices")
    );
}

#[tokio::test]
async fn a_server_with_nothing_to_say_is_a_server_fault() {
    // No step left: the fake answers 500 with a plain body.
    let server = start(vec![]).await;
    let err = provider(&server).complete(&hello()).await.unwrap_err();
    assert_eq!(err, ModelError::ServerFault { status: 500 });
}

#[tokio::test]
async fn an_unreachable_endpoint_is_a_transport_failure_with_a_hint() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let provider = OpenAiProvider::new(
        &format!("http://127.0.0.1:{port}/v1"),
        None,
        OpenAiOptions::default(),
        limits(),
    )
    .unwrap()
    .with_hint("is the server running? set OPENAI_BASE_URL");
    let err = provider.complete(&hello()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "the connection to the model backend failed"
    );
    let detail = err.detail().unwrap();
    assert!(detail.contains(&format!("127.0.0.1:{port}")), "{detail}");
    assert!(detail.contains("OPENAI_BASE_URL"), "{detail}");
    assert!(err.retryable());
}

#[tokio::test]
async fn providers_are_object_safe_and_shareable() {
    let server = start(vec![sse(vec![
        chunk(json!({"content": "hi"}), Some("stop")),
        done(),
    ])])
    .await;
    let shared: Arc<dyn ModelProvider> = Arc::new(provider(&server));
    let task = tokio::spawn({
        let shared = Arc::clone(&shared);
        async move { shared.complete(&hello()).await }
    });
    assert_eq!(task.await.unwrap().unwrap().text, "hi");
}

#[tokio::test]
async fn a_redirect_is_never_followed_and_names_both_urls() {
    for status in [302, 307, 308] {
        let server = start(vec![Step::Redirect(
            status,
            "https://elsewhere.example/v1/chat/completions".into(),
        )])
        .await;
        let provider = provider_with(&server, OpenAiOptions::default(), ModelLimits::default());
        let err = provider.complete(&hello()).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "the connection to the model backend failed"
        );
        let detail = err.detail().unwrap();
        assert!(
            detail.contains(&format!(
                "answered {status} redirecting to https://elsewhere.example/v1/chat/completions"
            )) && detail.contains("/chat/completions answered"),
            "{detail}"
        );
        assert_eq!(server.requests().len(), 1, "the redirect was followed");
    }
}

#[tokio::test]
async fn a_trickling_reply_runs_into_the_round_deadline() {
    // A token every 100 ms never trips the 300 ms receive timeout, but the round has 500 ms.
    let pieces = dots(100, Duration::from_millis(100));
    let server = start(vec![Step::Sse(pieces)]).await;
    let limits = ModelLimits {
        receive_timeout: Duration::from_millis(300),
        round_timeout: Duration::from_millis(500),
        ..ModelLimits::default()
    };
    let provider = provider_with(&server, OpenAiOptions::default(), limits);
    let started = std::time::Instant::now();
    assert_eq!(
        provider.complete(&hello()).await.unwrap_err(),
        ModelError::Timeout
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn a_whole_json_reply_to_a_streaming_request_is_accepted() {
    let server = start(vec![Step::Json(json!({
        "id": "c", "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Let me look.",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "fetch", "arguments": "{\"url\":\"https://e.com\"}"}}]}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7}
    }))])
    .await;
    let provider = provider_with(&server, OpenAiOptions::default(), ModelLimits::default());
    let reply = provider.complete(&hello()).await.unwrap();
    assert_eq!(reply.text, "Let me look.");
    assert_eq!(reply.tool_calls.len(), 1);
    assert_eq!(reply.tool_calls[0].id, "call_1");
    assert_eq!(
        reply.tool_calls[0].arguments,
        json!({"url": "https://e.com"})
    );
    assert_eq!(reply.finish_reason, Some(FinishReason::ToolCalls));
}

/// Records the retries a provider reports.
#[derive(Default)]
struct Retries(Mutex<Vec<(u32, Duration, ModelError)>>);

impl ReplyObserver for Retries {
    fn retry(&self, attempt: u32, wait: Duration, error: &ModelError) {
        self.0.lock().unwrap().push((attempt, wait, error.clone()));
    }
}

#[tokio::test]
async fn rate_limits_and_server_errors_are_retried_with_backoff_and_retry_after() {
    let server = start(vec![
        Step::RetryAfter(429, "0".into()),
        Step::RetryAfter(503, "0.2".into()),
        sse(vec![
            chunk(json!({"content": "late but fine"}), Some("stop")),
            done(),
        ]),
    ])
    .await;
    let provider = provider_with(&server, OpenAiOptions::default(), ModelLimits::default());
    let seen = Retries::default();
    let reply = provider.stream(&hello(), &seen).await.unwrap();
    assert_eq!(reply.text, "late but fine");
    let retries = seen.0.lock().unwrap().clone();
    assert_eq!(
        retries,
        vec![
            (1, Duration::ZERO, ModelError::RateLimited),
            (
                2,
                Duration::from_millis(200),
                ModelError::Overloaded { status: 503 }
            ),
        ]
    );
    assert_eq!(server.requests().len(), 3);

    // Past the retries, the last failure is the round's; a quota is never retried.
    let server = start(vec![
        Step::RetryAfter(500, "0".into()),
        Step::RetryAfter(500, "0".into()),
    ])
    .await;
    let limits = ModelLimits {
        retries: 1,
        ..ModelLimits::default()
    };
    let provider = provider_with(&server, OpenAiOptions::default(), limits);
    assert_eq!(
        provider.complete(&hello()).await.unwrap_err(),
        ModelError::ServerFault { status: 500 }
    );
    assert_eq!(server.requests().len(), 2);
    let server = start(vec![status(
        429,
        r#"{"error": {"message": "You exceeded your current quota"}}"#,
    )])
    .await;
    let provider = provider_with(&server, OpenAiOptions::default(), ModelLimits::default());
    assert_eq!(
        provider.complete(&hello()).await.unwrap_err(),
        ModelError::QuotaSpent
    );
    assert_eq!(server.requests().len(), 1);
}

/// Records what servers say when they refuse a round.
#[derive(Default)]
struct Said(Mutex<Vec<(u16, String)>>);

impl ReplyObserver for Said {
    fn server_message(&self, status: u16, message: &str) {
        self.0.lock().unwrap().push((status, message.to_owned()));
    }
}

#[tokio::test]
async fn a_rejected_request_shows_the_providers_own_message() {
    let server = start(vec![status(
        400,
        r#"{"error": {"message": "Unknown parameter: 'foo'.\nSee the docs.", "type": "invalid_request_error"}}"#,
    )])
    .await;
    let said = Said::default();
    let err = provider(&server).stream(&hello(), &said).await.unwrap_err();
    assert_eq!(err, ModelError::Rejected { status: 400 });
    assert_eq!(
        said.0.lock().unwrap().clone(),
        vec![(400, "Unknown parameter: 'foo'. See the docs.".to_owned())]
    );
}

#[tokio::test]
async fn rounds_reuse_one_connection() {
    let body = [
        chunk(json!({"role": "assistant", "content": "Hi."}), None),
        chunk(json!({}), Some("stop")),
        done(),
    ]
    .concat();
    let server = fake::KeepAliveServer::start(body).await;
    let provider = OpenAiProvider::new(
        &format!("{}/v1", server.origin),
        Some(KEY.to_owned()),
        OpenAiOptions::default(),
        limits(),
    )
    .unwrap();
    fake::assert_rounds_share_a_connection(&server, &provider, &hello(), "Hi.").await;
}

//! The Anthropic Messages API, natively (`POST {base}/v1/messages`, `stream: true`).
//!
//! Request side:
//! - the system records become the top-level `system` field (a string, or text blocks when
//!   there are several or they use parts);
//! - user content becomes `text` and `image` blocks (`data:` URLs as `base64` sources, other
//!   URLs as `url` sources); empty text blocks are left out, since the API refuses them;
//! - an assistant record becomes its replayable thinking blocks, a `text` block and one
//!   `tool_use` block per call (`input` is the arguments object);
//! - each tool record becomes a `tool_result` block in a user turn; consecutive turns of one
//!   role are merged, so a batch of results and a following user record share one turn, results
//!   first, as the API requires;
//! - tools are `{name, description, input_schema}`;
//! - `max_tokens` is required: the request's cap, or the model's configured default;
//! - the thinking switch is `thinking: {type: "enabled", budget_tokens}` or
//!   `{type: "disabled"}` (see [`AnthropicOptions`]);
//! - headers `x-api-key` and `anthropic-version: 2023-06-01`.
//!
//! Reply side: the SSE events `message_start` (input usage), `content_block_start` /
//! `content_block_delta` (`text_delta`, `input_json_delta`, `thinking_delta`,
//! `signature_delta`) / `content_block_stop`, `message_delta` (stop reason, output usage),
//! `message_stop`, `ping` and `error`. Stop reasons map onto chapter 11's finish reasons:
//! `end_turn` and `stop_sequence` are `stop`, `max_tokens` and
//! `model_context_window_exceeded` are `length`, `tool_use` is `tool_calls`, `refusal` is
//! `content_filter`; others pass through.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

use super::error::{ModelError, classify_stream_error};
use super::http::{
    EventStream, HttpProvider, WholeReply, Wire, finish_stream, key_header, unencodable,
};
use super::openai::decode_arguments;
use super::provider::ReplyObserver;
use super::sse::Event;
use super::types::{
    ChatRequest, Content, ContentPart, FinishReason, Message, ReasoningBlock, Reply,
    ThinkingCapability, ThinkingSwitch, ToolCall, Usage,
};

/// The `anthropic-version` header value.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Per-model settings of an [`AnthropicProvider`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnthropicOptions {
    /// `max_tokens` when the request sets none (the API requires the field). Default 8192.
    pub default_max_tokens: u32,
    /// `budget_tokens` when thinking is on. Default 4096; the API needs at least 1024 and less
    /// than `max_tokens`, so when the cap leaves no room the budget is added on top of it.
    pub thinking_budget: u32,
    /// The model's thinking capability: `Never` sends no switch, `Always` always enables
    /// thinking, `Switchable` follows the request's switch (on: enabled; off: disabled;
    /// model default: nothing sent, which is off).
    pub thinking: ThinkingCapability,
}

impl Default for AnthropicOptions {
    fn default() -> Self {
        Self {
            default_max_tokens: 8192,
            thinking_budget: 4096,
            thinking: ThinkingCapability::Switchable,
        }
    }
}

/// A provider speaking the Anthropic Messages API.
///
/// With thinking on, the API requires the final assistant tool-use turn to start with its
/// signed thinking block. The provider replays the [`ReasoningBlock`]s the engine keeps on
/// that assistant record; when that turn carries none, the request goes out with thinking
/// disabled instead of being refused by the API.
///
/// `new` takes the API's base URL (such as `https://api.anthropic.com`; the provider appends
/// `/v1/messages`, and a base that already ends in `/v1` is accepted).
pub type AnthropicProvider = HttpProvider<Anthropic>;

/// The Anthropic Messages wire: the settings.
#[derive(Debug)]
pub struct Anthropic {
    options: AnthropicOptions,
}

impl Wire for Anthropic {
    const NAME: &'static str = "AnthropicProvider";
    const WHOLE: WholeReply = whole_reply;
    type Options = AnthropicOptions;

    fn new(options: AnthropicOptions) -> Self {
        Anthropic { options }
    }

    fn options(&self) -> &AnthropicOptions {
        &self.options
    }

    fn url(base_url: &str) -> String {
        let base = base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        format!("{base}/v1/messages")
    }

    fn headers(&self, api_key: Option<&str>) -> Result<HeaderMap, ModelError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        if let Some(key) = api_key {
            headers.insert(HeaderName::from_static("x-api-key"), key_header(key)?);
        }
        Ok(headers)
    }

    fn body(&self, request: &ChatRequest) -> Result<bytes::Bytes, ModelError> {
        let body = serde_json::to_vec(&self.request_body(request)).map_err(unencodable)?;
        Ok(body.into())
    }

    fn request_body(&self, request: &ChatRequest) -> Value {
        request_body(request, &self.options)
    }

    fn read<'a>(
        events: EventStream,
        observer: &'a dyn ReplyObserver,
    ) -> impl Future<Output = Result<Reply, ModelError>> + Send + 'a {
        read_stream(events, observer)
    }
}

fn image_block(url: &str) -> Value {
    if let Some(rest) = url.strip_prefix("data:")
        && let Some((meta, data)) = rest.split_once(',')
        && let Some(media_type) = meta.strip_suffix(";base64")
    {
        return json!({
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        });
    }
    json!({"type": "image", "source": {"type": "url", "url": url}})
}

fn content_blocks(content: &Content) -> Vec<Value> {
    match content {
        Content::Text(text) if text.is_empty() => Vec::new(),
        Content::Text(text) => vec![json!({"type": "text", "text": text})],
        Content::Parts(parts) => parts
            .iter()
            .filter_map(|part| match part {
                ContentPart::Text { text } if text.is_empty() => None,
                ContentPart::Text { text } => Some(json!({"type": "text", "text": text})),
                ContentPart::ImageUrl { image_url } => Some(image_block(&image_url.url)),
            })
            .collect(),
    }
}

/// Whether thinking goes out enabled (`Some(true)`), disabled (`Some(false)`), or unsent.
fn thinking_wanted(request: &ChatRequest, capability: ThinkingCapability) -> Option<bool> {
    match capability {
        ThinkingCapability::Never => None,
        ThinkingCapability::Always => Some(true),
        ThinkingCapability::Switchable => match request.thinking {
            ThinkingSwitch::ModelDefault => None,
            ThinkingSwitch::On => Some(true),
            ThinkingSwitch::Off => Some(false),
        },
    }
}

fn replayable(block: &ReasoningBlock) -> bool {
    block.signature.is_some() || block.redacted.is_some()
}

/// Whether the conversation ends in a tool-use turn (an assistant record with calls that no
/// user record follows) whose signed thinking is missing.
fn open_tool_turn_lacks_thinking(messages: &[Arc<Message>]) -> bool {
    for message in messages.iter().rev() {
        match &**message {
            Message::Tool { .. } => {}
            Message::Assistant {
                tool_calls,
                reasoning,
                ..
            } => return !tool_calls.is_empty() && !reasoning.iter().any(replayable),
            Message::User { .. } | Message::System { .. } => return false,
        }
    }
    false
}

/// The Messages API body for `request`.
fn request_body(request: &ChatRequest, options: &AnthropicOptions) -> Value {
    let mut thinking = thinking_wanted(request, options.thinking);
    if thinking == Some(true) && open_tool_turn_lacks_thinking(&request.messages) {
        thinking = Some(false);
    }
    let replay = thinking == Some(true);

    let mut system: Vec<&Content> = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut push = |role: &'static str, blocks: Vec<Value>| {
        if blocks.is_empty() {
            return;
        }
        match turns.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    };
    for message in request.messages.iter() {
        match &**message {
            Message::System { content } => system.push(content),
            Message::User { content } => push("user", content_blocks(content)),
            Message::Assistant {
                content,
                tool_calls,
                reasoning,
            } => {
                let mut blocks = Vec::new();
                if replay {
                    for block in reasoning {
                        if let Some(data) = &block.redacted {
                            blocks.push(json!({"type": "redacted_thinking", "data": data}));
                        } else if let Some(signature) = &block.signature {
                            blocks.push(json!({
                                "type": "thinking",
                                "thinking": block.text,
                                "signature": signature,
                            }));
                        }
                    }
                }
                blocks.extend(content_blocks(content));
                for call in tool_calls {
                    let input = match &call.arguments {
                        Value::Object(_) => call.arguments.clone(),
                        _ => json!({}),
                    };
                    blocks.push(json!({
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.name,
                        "input": input,
                    }));
                }
                push("assistant", blocks);
            }
            Message::Tool {
                tool_call_id,
                content,
            } => {
                let mut block = Map::new();
                block.insert("type".into(), "tool_result".into());
                block.insert("tool_use_id".into(), tool_call_id.clone().into());
                match content {
                    Content::Text(text) if text.is_empty() => {}
                    Content::Text(text) => {
                        block.insert("content".into(), text.clone().into());
                    }
                    Content::Parts(_) => {
                        block.insert("content".into(), Value::Array(content_blocks(content)));
                    }
                }
                push("user", vec![Value::Object(block)]);
            }
        }
    }

    let mut body = Map::new();
    body.insert("model".into(), request.model.clone().into());
    let mut max_tokens = request.max_tokens.unwrap_or(options.default_max_tokens);
    if thinking == Some(true) {
        let budget = options.thinking_budget.max(1024);
        if max_tokens <= budget {
            max_tokens = max_tokens.saturating_add(budget);
        }
        body.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
    } else if thinking == Some(false) {
        body.insert("thinking".into(), json!({"type": "disabled"}));
    }
    body.insert("max_tokens".into(), max_tokens.into());
    match system.as_slice() {
        [] => {}
        [Content::Text(text)] => {
            body.insert("system".into(), text.clone().into());
        }
        many => {
            let blocks: Vec<Value> = many.iter().flat_map(|c| content_blocks(c)).collect();
            body.insert("system".into(), Value::Array(blocks));
        }
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, blocks)| json!({"role": role, "content": blocks}))
        .collect();
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.parameters,
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    // The API takes 0.0 to 1.0, and no temperature at all with thinking on.
    if let Some(temperature) = request.temperature
        && thinking != Some(true)
    {
        body.insert("temperature".into(), json!(temperature.clamp(0.0, 1.0)));
    }
    body.insert("stream".into(), true.into());
    Value::Object(body)
}

/// One content block as it streams.
#[derive(Debug)]
enum Block {
    Text,
    ToolUse {
        id: String,
        name: String,
        json: String,
        start_input: Value,
    },
    Thinking {
        text: String,
        signature: Option<String>,
    },
    Redacted(String),
    Other,
}

/// The status an `error` event's type names.
fn error_type_status(kind: &str) -> u16 {
    match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "billing_error" => 402,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "timeout_error" => 504,
        "overloaded_error" => 529,
        _ => 500,
    }
}

fn stop_reason(reason: &str) -> FinishReason {
    match reason {
        "end_turn" | "stop_sequence" => FinishReason::Stop,
        "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
        "tool_use" => FinishReason::ToolCalls,
        "refusal" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

fn u64_at(value: &Value, key: &str) -> Option<u64> {
    value.get(key).and_then(Value::as_u64)
}

fn str_at<'v>(value: &'v Value, key: &str) -> Option<&'v str> {
    value.get(key).and_then(Value::as_str)
}

fn missing(what: &str) -> ModelError {
    ModelError::malformed(format!("a reply event lacks {what}"))
}

/// A whole message (a server that ignored `stream: true`, as some gateways do) as the events
/// its stream would have sent: the start with the input usage, each content block whole,
/// then the stop reason and output usage.
fn whole_reply(reply: &Value) -> Result<Vec<Event>, ModelError> {
    if reply.get("type").and_then(Value::as_str) == Some("error") {
        return Ok(vec![Event::new("error", reply.to_string())]);
    }
    let blocks = reply
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| ModelError::malformed("the reply has no content"))?;
    let usage = reply.get("usage").cloned().unwrap_or_else(|| json!({}));
    let mut events = vec![Event::new(
        "message_start",
        json!({"type": "message_start", "message": {"usage": usage}}).to_string(),
    )];
    for (index, block) in blocks.iter().enumerate() {
        events.push(Event::new(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block})
                .to_string(),
        ));
        events.push(Event::new(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}).to_string(),
        ));
    }
    events.push(Event::new(
        "message_delta",
        json!({"type": "message_delta",
               "delta": {"stop_reason": reply.get("stop_reason").cloned().unwrap_or(Value::Null)},
               "usage": {"output_tokens": usage.get("output_tokens").cloned().unwrap_or(json!(0))}})
        .to_string(),
    ));
    events.push(Event::new(
        "message_stop",
        json!({"type": "message_stop"}).to_string(),
    ));
    Ok(events)
}

async fn read_stream(
    mut events: EventStream,
    observer: &dyn ReplyObserver,
) -> Result<Reply, ModelError> {
    let mut blocks: BTreeMap<u64, Block> = BTreeMap::new();
    let mut text = String::new();
    let mut stop: Option<FinishReason> = None;
    let mut input_tokens: Option<u64> = None;
    let mut output_tokens: Option<u64> = None;
    let mut started = false;
    let mut stopped = false;
    while let Some(event) = events.next().await {
        let event = event?;
        if event.data.trim().is_empty() {
            continue;
        }
        let data: Value = serde_json::from_str(&event.data)
            .map_err(|_| ModelError::malformed("a reply event is not valid JSON"))?;
        let kind = str_at(&data, "type").unwrap_or(event.event.as_str());
        match kind {
            "message_start" => {
                started = true;
                if let Some(usage) = data.get("message").and_then(|m| m.get("usage")) {
                    input_tokens = Some(prompt_tokens(usage));
                    output_tokens = u64_at(usage, "output_tokens").or(output_tokens);
                }
            }
            "content_block_start" => {
                let index = u64_at(&data, "index").ok_or_else(|| missing("an index"))?;
                let block = data
                    .get("content_block")
                    .ok_or_else(|| missing("its content block"))?;
                let block = match str_at(block, "type") {
                    Some("text") => {
                        if let Some(initial) = str_at(block, "text").filter(|t| !t.is_empty()) {
                            observer.text(initial);
                            text.push_str(initial);
                        }
                        Block::Text
                    }
                    Some("tool_use") => Block::ToolUse {
                        id: str_at(block, "id").unwrap_or_default().to_owned(),
                        name: str_at(block, "name").unwrap_or_default().to_owned(),
                        json: String::new(),
                        start_input: block.get("input").cloned().unwrap_or(Value::Null),
                    },
                    Some("thinking") => Block::Thinking {
                        text: str_at(block, "thinking").unwrap_or_default().to_owned(),
                        signature: str_at(block, "signature")
                            .filter(|s| !s.is_empty())
                            .map(str::to_owned),
                    },
                    Some("redacted_thinking") => {
                        Block::Redacted(str_at(block, "data").unwrap_or_default().to_owned())
                    }
                    _ => Block::Other,
                };
                blocks.insert(index, block);
            }
            "content_block_delta" => {
                let index = u64_at(&data, "index").ok_or_else(|| missing("an index"))?;
                let delta = data.get("delta").ok_or_else(|| missing("its delta"))?;
                let block = blocks.get_mut(&index).ok_or_else(|| {
                    ModelError::malformed("a delta names a block that never started")
                })?;
                match (str_at(delta, "type"), block) {
                    (Some("text_delta"), Block::Text) => {
                        let fragment = str_at(delta, "text").unwrap_or_default();
                        if !fragment.is_empty() {
                            observer.text(fragment);
                            text.push_str(fragment);
                        }
                    }
                    (Some("input_json_delta"), Block::ToolUse { json, .. }) => {
                        json.push_str(str_at(delta, "partial_json").unwrap_or_default());
                    }
                    (Some("thinking_delta"), Block::Thinking { text, .. }) => {
                        let fragment = str_at(delta, "thinking").unwrap_or_default();
                        if !fragment.is_empty() {
                            observer.reasoning(fragment);
                            text.push_str(fragment);
                        }
                    }
                    (Some("signature_delta"), Block::Thinking { signature, .. }) => {
                        let fragment = str_at(delta, "signature").unwrap_or_default();
                        signature.get_or_insert_with(String::new).push_str(fragment);
                    }
                    (_, Block::Other) => {}
                    // Deltas of kinds this client does not know (citations and the like).
                    (Some(other), _)
                        if !matches!(
                            other,
                            "text_delta"
                                | "input_json_delta"
                                | "thinking_delta"
                                | "signature_delta"
                        ) => {}
                    _ => {
                        return Err(ModelError::malformed(
                            "a delta does not match the kind of its block",
                        ));
                    }
                }
            }
            "content_block_stop" => {}
            "message_delta" => {
                if let Some(reason) = data.get("delta").and_then(|d| str_at(d, "stop_reason")) {
                    stop = Some(stop_reason(reason));
                }
                if let Some(usage) = data.get("usage") {
                    output_tokens = u64_at(usage, "output_tokens").or(output_tokens);
                    if usage.get("input_tokens").is_some_and(|v| !v.is_null()) {
                        input_tokens = Some(prompt_tokens(usage));
                    }
                }
            }
            "message_stop" => {
                stopped = true;
                finish_stream(events).await;
                break;
            }
            "ping" => {}
            "error" => {
                let error = data.get("error").cloned().unwrap_or(Value::Null);
                let status = error_type_status(str_at(&error, "type").unwrap_or_default());
                return Err(classify_stream_error(status, &error.to_string()));
            }
            // Event kinds added to the API later.
            _ => {}
        }
    }
    if !started {
        return Err(ModelError::malformed(
            "the reply stream ended before the reply was complete",
        ));
    }
    if !stopped && stop.is_none() {
        return Err(ModelError::malformed(
            "the reply stream ended before the reply was complete",
        ));
    }

    let mut tool_calls = Vec::new();
    let mut reasoning = Vec::new();
    for block in blocks.into_values() {
        match block {
            Block::ToolUse {
                id,
                name,
                json,
                start_input,
            } => {
                let arguments = if json.trim().is_empty() {
                    start_input
                } else {
                    decode_arguments(&json)
                };
                tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments,
                });
            }
            Block::Thinking { text, signature } => reasoning.push(ReasoningBlock {
                text,
                signature,
                redacted: None,
            }),
            Block::Redacted(data) => reasoning.push(ReasoningBlock {
                text: String::new(),
                signature: None,
                redacted: Some(data),
            }),
            Block::Text | Block::Other => {}
        }
    }
    let usage = match (input_tokens, output_tokens) {
        (None, None) => None,
        (input, output) => Some(Usage {
            prompt_tokens: input.unwrap_or(0),
            completion_tokens: output.unwrap_or(0),
            reasoning_tokens: None,
        }),
    };
    Ok(Reply {
        text,
        tool_calls,
        finish_reason: stop,
        usage,
        reasoning,
    })
}

/// Input tokens including cache writes and reads (all of them occupy the context window).
fn prompt_tokens(usage: &Value) -> u64 {
    [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]
    .iter()
    .filter_map(|key| u64_at(usage, key))
    .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::types::{ImageUrl, ToolSpec};

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "weather".into(),
            arguments: json!({"city": "Paris"}),
        }
    }

    #[test]
    fn body_has_the_wire_shape() {
        let mut request = ChatRequest::new(
            "claude",
            vec![
                Message::system("be brief"),
                Message::user("weather?"),
                Message::assistant_tool_calls("Checking.", vec![call("t1"), call("t2")]),
                Message::tool("t1", "sunny"),
                Message::tool("t2", ""),
                Message::user("thanks"),
            ],
        );
        request.tools = [ToolSpec {
            name: "weather".into(),
            description: "d".into(),
            parameters: json!({"type": "object"}),
        }]
        .into();
        request.temperature = Some(1.5);
        let body = request_body(&request, &AnthropicOptions::default());
        assert_eq!(
            body,
            json!({
                "model": "claude",
                "max_tokens": 8192,
                "system": "be brief",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "t2", "name": "weather", "input": {"city": "Paris"}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                        {"type": "tool_result", "tool_use_id": "t2"},
                        {"type": "text", "text": "thanks"},
                    ]},
                ],
                "tools": [{"name": "weather", "description": "d", "input_schema": {"type": "object"}}],
                "temperature": 1.0,
                "stream": true,
            })
        );
    }

    #[test]
    fn thinking_switch_and_budget() {
        let mut request = ChatRequest::new("c", vec![Message::user("hi")]);
        request.temperature = Some(0.2);
        let options = AnthropicOptions::default();
        assert!(request_body(&request, &options).get("thinking").is_none());
        request.thinking = ThinkingSwitch::Off;
        assert_eq!(
            request_body(&request, &options)["thinking"],
            json!({"type": "disabled"})
        );
        request.thinking = ThinkingSwitch::On;
        let body = request_body(&request, &options);
        assert_eq!(
            body["thinking"],
            json!({"type": "enabled", "budget_tokens": 4096})
        );
        assert_eq!(body["max_tokens"], 8192);
        assert!(body.get("temperature").is_none());
        request.max_tokens = Some(256);
        assert_eq!(request_body(&request, &options)["max_tokens"], 256 + 4096);
        let never = AnthropicOptions {
            thinking: ThinkingCapability::Never,
            ..AnthropicOptions::default()
        };
        assert!(request_body(&request, &never).get("thinking").is_none());
        let always = AnthropicOptions {
            thinking: ThinkingCapability::Always,
            ..AnthropicOptions::default()
        };
        request.thinking = ThinkingSwitch::ModelDefault;
        assert_eq!(
            request_body(&request, &always)["thinking"]["type"],
            "enabled"
        );
    }

    #[test]
    fn thinking_replays_signed_blocks_or_turns_off() {
        let mut assistant = Message::assistant_tool_calls("", vec![call("t1")]);
        let mut request = ChatRequest::new(
            "c",
            vec![
                Message::user("go"),
                assistant.clone(),
                Message::tool("t1", "ok"),
            ],
        );
        request.thinking = ThinkingSwitch::On;
        let options = AnthropicOptions::default();
        assert_eq!(
            request_body(&request, &options)["thinking"],
            json!({"type": "disabled"})
        );
        if let Message::Assistant { reasoning, .. } = &mut assistant {
            reasoning.push(ReasoningBlock {
                text: "hmm".into(),
                signature: Some("sig".into()),
                redacted: None,
            });
        }
        request.messages = Arc::new(vec![
            request.messages[0].clone(),
            Arc::new(assistant),
            request.messages[2].clone(),
        ]);
        let body = request_body(&request, &options);
        assert_eq!(body["thinking"]["type"], "enabled");
        assert_eq!(
            body["messages"][1]["content"][0],
            json!({"type": "thinking", "thinking": "hmm", "signature": "sig"})
        );
    }

    #[test]
    fn images_become_image_blocks() {
        let request = ChatRequest::new(
            "c",
            vec![Message::User {
                content: Content::Parts(vec![
                    ContentPart::Text { text: "see".into() },
                    ContentPart::ImageUrl {
                        image_url: ImageUrl {
                            url: "data:image/png;base64,AAAA".into(),
                        },
                    },
                    ContentPart::ImageUrl {
                        image_url: ImageUrl {
                            url: "https://example.invalid/a.png".into(),
                        },
                    },
                ]),
            }],
        );
        let body = request_body(&request, &AnthropicOptions::default());
        assert_eq!(
            body["messages"][0]["content"],
            json!([
                {"type": "text", "text": "see"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                {"type": "image", "source": {"type": "url", "url": "https://example.invalid/a.png"}},
            ])
        );
    }

    #[test]
    fn stop_reasons_map_to_finish_reasons() {
        assert_eq!(stop_reason("end_turn"), FinishReason::Stop);
        assert_eq!(stop_reason("max_tokens"), FinishReason::Length);
        assert_eq!(stop_reason("tool_use"), FinishReason::ToolCalls);
        assert_eq!(stop_reason("refusal"), FinishReason::ContentFilter);
        assert_eq!(stop_reason("pause_turn").as_str(), "pause_turn");
    }
}

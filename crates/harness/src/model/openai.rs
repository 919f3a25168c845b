//! OpenAI-compatible chat completions (`POST {base}/chat/completions`, `stream: true`).
//!
//! One wire format serves OpenAI, Ollama's `/v1` endpoint, vLLM, llama.cpp's `llama-server`
//! and OpenAI-compatible gateways; [`OpenAiOptions`] holds the few places where they differ
//! (the name of the token cap, and how the thinking switch is spelled).
//!
//! Wire shape, request side:
//! - records keep their roles; content is a string or an array of `{type: "text", text}` /
//!   `{type: "image_url", image_url: {url}}` parts;
//! - an assistant record's calls are `tool_calls: [{id, type: "function", function: {name,
//!   arguments}}]` with `arguments` as a JSON *string*, and its `content` is `null` when it
//!   has calls and no text;
//! - a tool record is `{role: "tool", tool_call_id, content}`;
//! - tools are `[{type: "function", function: {name, description, parameters}}]`;
//! - `stream_options: {include_usage: true}` asks for the usage chunk.
//!
//! Reply side: `choices[0].delta` fragments (`content`, `reasoning_content` or `reasoning`,
//! and `tool_calls` fragments keyed by `index`) are accumulated until `data: [DONE]`; the
//! finish reason comes from `choices[0].finish_reason` and usage from the chunk that carries
//! `usage`. A stream that ends with neither `[DONE]` nor a finish reason is truncated.

use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::error::{ModelError, classify_stream_error};
use super::http::{
    EventStream, HttpProvider, WholeReply, Wire, finish_stream, key_header, unencodable,
};
use super::provider::ReplyObserver;
use super::sse::Event;
use super::types::{
    ChatRequest, FinishReason, Message, ReasoningBlock, Reply, ThinkingSwitch, ToolCall, ToolSpec,
    Usage,
};

/// Which request field carries the token cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MaxTokensField {
    /// `max_tokens`: Ollama, vLLM, llama.cpp and most compatible servers.
    #[default]
    MaxTokens,
    /// `max_completion_tokens`: OpenAI's own API, whose reasoning models refuse `max_tokens`.
    MaxCompletionTokens,
}

/// How the thinking switch is spelled on the wire. Only [`ThinkingSwitch::On`] and
/// [`ThinkingSwitch::Off`] send anything; the model's default sends nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum OpenAiThinking {
    /// Never send a switch (models that cannot switch, servers that know no switch).
    #[default]
    Unsupported,
    /// `"reasoning_effort": on | off`: OpenAI (`medium` / `none` for gpt-5.1 and later,
    /// `minimal` for gpt-5) and Ollama's `/v1` (`medium` / `none`).
    ReasoningEffort {
        /// The effort sent for thinking on.
        on: String,
        /// The effort sent for thinking off.
        off: String,
    },
    /// `"chat_template_kwargs": {KEY: true | false}`: vLLM, SGLang and llama.cpp, whose chat
    /// templates read the flag (`enable_thinking` for Qwen3 and most others, `thinking` for
    /// DeepSeek V3.1).
    ChatTemplateKwargs {
        /// The template variable.
        key: String,
    },
}

/// The per-server details of an [`OpenAiProvider`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAiOptions {
    /// The token-cap field.
    pub max_tokens_field: MaxTokensField,
    /// The thinking-switch mapping.
    pub thinking: OpenAiThinking,
    /// Send `stream_options: {include_usage: true}` (default on; turn it off for a server that
    /// refuses the field).
    pub include_usage: bool,
}

impl Default for OpenAiOptions {
    fn default() -> Self {
        Self {
            max_tokens_field: MaxTokensField::MaxTokens,
            thinking: OpenAiThinking::Unsupported,
            include_usage: true,
        }
    }
}

/// A provider speaking OpenAI-compatible chat completions: `new` takes the server's base URL
/// (the part before `/chat/completions`, such as `https://api.openai.com/v1`) and sends the
/// API key as a bearer token when given.
pub type OpenAiProvider = HttpProvider<OpenAi>;

/// The OpenAI chat-completions wire: the settings, and the records' wire forms shared by
/// every round the provider sends.
#[derive(Debug)]
pub struct OpenAi {
    options: OpenAiOptions,
    cache: Mutex<WireCache>,
}

impl Wire for OpenAi {
    const NAME: &'static str = "OpenAiProvider";
    const WHOLE: WholeReply = whole_reply;
    type Options = OpenAiOptions;

    fn new(options: OpenAiOptions) -> Self {
        OpenAi {
            options,
            cache: Mutex::new(WireCache::default()),
        }
    }

    fn options(&self) -> &OpenAiOptions {
        &self.options
    }

    fn url(base_url: &str) -> String {
        format!("{}/chat/completions", base_url.trim_end_matches('/'))
    }

    fn headers(&self, api_key: Option<&str>) -> Result<HeaderMap, ModelError> {
        let mut headers = HeaderMap::new();
        if let Some(key) = api_key {
            headers.insert(AUTHORIZATION, key_header(&format!("Bearer {key}"))?);
        }
        Ok(headers)
    }

    fn body(&self, request: &ChatRequest) -> Result<bytes::Bytes, ModelError> {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .body(request, &self.options)
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

/// Arguments as the JSON text OpenAI expects (an absent object is `{}`).
fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::Null => "{}".to_owned(),
        other => other.to_string(),
    }
}

/// One record in OpenAI's chat-completions shape, written straight from the typed record:
/// the body of a round is built once, with no JSON tree in between.
struct WireMessage<'a>(&'a Message);

impl Serialize for WireMessage<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Message::System { content } | Message::User { content } => {
                let mut map = serializer.serialize_map(Some(2))?;
                map.serialize_entry("role", self.0.role())?;
                map.serialize_entry("content", content)?;
                map.end()
            }
            Message::Assistant {
                content,
                tool_calls,
                reasoning: _,
            } => {
                let mut map = serializer.serialize_map(None)?;
                map.serialize_entry("role", "assistant")?;
                if tool_calls.is_empty() || !content.is_empty() {
                    map.serialize_entry("content", content)?;
                } else {
                    map.serialize_entry("content", &())?;
                }
                if !tool_calls.is_empty() {
                    map.serialize_entry("tool_calls", &WireCalls(tool_calls))?;
                }
                map.end()
            }
            Message::Tool {
                tool_call_id,
                content,
            } => {
                let mut map = serializer.serialize_map(Some(3))?;
                map.serialize_entry("role", "tool")?;
                map.serialize_entry("tool_call_id", tool_call_id)?;
                map.serialize_entry("content", content)?;
                map.end()
            }
        }
    }
}

/// An assistant record's tool calls, in order.
struct WireCalls<'a>(&'a [ToolCall]);

impl Serialize for WireCalls<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(WireCall))
    }
}

/// One tool call of an assistant record: `{id, type: "function", function: {name, arguments}}`
/// with the arguments as JSON text.
struct WireCall<'a>(&'a ToolCall);

impl Serialize for WireCall<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("id", &self.0.id)?;
        map.serialize_entry("type", "function")?;
        map.serialize_entry("function", &WireFunction(self.0))?;
        map.end()
    }
}

/// A tool call's `function` object: `{name, arguments}`, the arguments as JSON text.
struct WireFunction<'a>(&'a ToolCall);

impl Serialize for WireFunction<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("name", &self.0.name)?;
        map.serialize_entry("arguments", &arguments_text(&self.0.arguments))?;
        map.end()
    }
}

/// What the last round sent, kept to write the next round's body: a conversation reaches the
/// provider round after round as the same shared records (`Arc`) with new ones at the end, so
/// the records it shares with the last round (compared by address, while this cache holds
/// them alive) are sent as the bytes already written, and only the rest is written. It holds
/// the records themselves, not the round's list, so the loop stays that list's only holder and
/// can extend it in place. The body itself is kept too: once the last round's request has let
/// go of it, the next body is written into the same buffer (the shared records' bytes stay
/// where they are), so a long conversation is not copied again each round. The tools are
/// written once while a round offers the same list.
#[derive(Debug, Default)]
struct WireCache {
    /// The records last sent.
    sent: Vec<Arc<Message>>,
    /// The last body: the settings, the tools and `"messages":[` (its first `start` bytes),
    /// the records' wire forms (comma separated), then `]}`.
    last: Option<bytes::Bytes>,
    start: usize,
    /// Where each sent record's wire form ends, counted from `start`.
    ends: Vec<usize>,
    /// The tools last offered and their wire form.
    tools: Option<(Arc<[ToolSpec]>, Vec<u8>)>,
}

impl WireCache {
    /// The wire form of `tools` (an array of function tools).
    fn tools(&mut self, tools: &Arc<[ToolSpec]>) -> Result<&[u8], ModelError> {
        let fresh = match &self.tools {
            Some((held, _)) => !Arc::ptr_eq(held, tools),
            None => true,
        };
        if fresh {
            let items: Vec<Value> = tools
                .iter()
                .map(|tool| {
                    json!({
                        "type": "function",
                        "function": {
                            "name": tool.name,
                            "description": tool.description,
                            "parameters": tool.parameters,
                        },
                    })
                })
                .collect();
            let text = serde_json::to_vec(&items).map_err(unencodable)?;
            self.tools = Some((Arc::clone(tools), text));
        }
        Ok(self
            .tools
            .as_ref()
            .map_or(&[][..], |(_, text)| text.as_slice()))
    }

    /// A round's chat-completions body: the request's settings as a small JSON object (keys
    /// in order), then `tools` (which orders after every other setting), then `messages`.
    fn body(
        &mut self,
        request: &ChatRequest,
        options: &OpenAiOptions,
    ) -> Result<bytes::Bytes, ModelError> {
        use bytes::BufMut;
        let mut prefix = serde_json::to_vec(&head(request, options)).map_err(unencodable)?;
        // `head` is `{...}` with at least the model in it: its closing brace goes last.
        if prefix.last() == Some(&b'}') {
            prefix.pop();
        }
        if !request.tools.is_empty() {
            prefix.extend_from_slice(b",\"tools\":");
            prefix.extend_from_slice(self.tools(&request.tools)?);
        }
        prefix.extend_from_slice(b",\"messages\":[");
        let shared = self
            .sent
            .iter()
            .zip(request.messages.iter())
            .take_while(|(a, b)| Arc::ptr_eq(a, b))
            .count()
            .min(self.ends.len());
        let kept = shared
            .checked_sub(1)
            .and_then(|i| self.ends.get(i))
            .copied()
            .unwrap_or_default();
        // The last body's buffer, when the last request has let go of it (else a copy).
        let mut buf = match self.last.take() {
            Some(last) => last
                .try_into_mut()
                .unwrap_or_else(|last| bytes::BytesMut::from(&last[..])),
            None => bytes::BytesMut::new(),
        };
        let same_prefix =
            buf.get(..self.start) == Some(prefix.as_slice()) && buf.len() >= self.start + kept;
        if !same_prefix {
            // Other settings or tools: the shared records' bytes move behind the new prefix.
            let text = buf
                .get(self.start..self.start + kept)
                .map(<[u8]>::to_vec)
                .unwrap_or_default();
            buf.clear();
            buf.extend_from_slice(&prefix);
            buf.extend_from_slice(&text);
            self.start = prefix.len();
        }
        buf.truncate(self.start + kept);
        self.sent.truncate(shared);
        self.ends.truncate(shared);
        let mut writer = buf.writer();
        for message in request.messages.get(shared..).unwrap_or_default() {
            if writer.get_ref().len() > self.start {
                writer.get_mut().put_u8(b',');
            }
            if let Err(e) = serde_json::to_writer(&mut writer, &WireMessage(message)) {
                self.sent.clear();
                self.ends.clear();
                return Err(unencodable(e));
            }
            self.sent.push(Arc::clone(message));
            self.ends.push(writer.get_ref().len() - self.start);
        }
        let mut buf = writer.into_inner();
        buf.extend_from_slice(b"]}");
        let body = buf.freeze();
        self.last = Some(body.clone());
        Ok(body)
    }
}

/// The chat-completions body for `request`, as JSON (for inspection and tests; a round sends
/// the same bytes).
fn request_body(request: &ChatRequest, options: &OpenAiOptions) -> Value {
    WireCache::default()
        .body(request, options)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or(Value::Null)
}

/// The request's settings: every field of the body but `tools` and `messages`.
fn head(request: &ChatRequest, options: &OpenAiOptions) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("model".into(), request.model.clone().into());
    if let Some(temperature) = request.temperature {
        body.insert("temperature".into(), json!(temperature));
    }
    if let Some(max) = request.max_tokens {
        let field = match options.max_tokens_field {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
        };
        body.insert(field.into(), json!(max));
    }
    let on = match request.thinking {
        ThinkingSwitch::ModelDefault => None,
        ThinkingSwitch::On => Some(true),
        ThinkingSwitch::Off => Some(false),
    };
    if let Some(on) = on {
        match &options.thinking {
            OpenAiThinking::Unsupported => {}
            OpenAiThinking::ReasoningEffort { on: yes, off: no } => {
                let effort = if on { yes } else { no };
                body.insert("reasoning_effort".into(), effort.clone().into());
            }
            OpenAiThinking::ChatTemplateKwargs { key } => {
                body.insert("chat_template_kwargs".into(), json!({ key.as_str(): on }));
            }
        }
    }
    body.insert("stream".into(), true.into());
    if options.include_usage {
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    body
}

#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<CallFragment>>,
}

#[derive(Debug, Deserialize)]
struct CallFragment {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionFragment>,
}

#[derive(Debug, Deserialize)]
struct FunctionFragment {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Debug, Deserialize)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

#[derive(Debug, Default)]
struct PartialCall {
    index: Option<u64>,
    id: String,
    name: String,
    arguments: String,
}

/// Accumulates the chunks of one streamed reply.
#[derive(Debug, Default)]
struct Accumulator {
    text: String,
    reasoning: String,
    calls: Vec<PartialCall>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
}

impl Accumulator {
    fn call_fragment(&mut self, fragment: CallFragment) {
        let id = fragment.id.filter(|id| !id.is_empty());
        let slot = match fragment.index {
            Some(index) => match self.calls.iter().position(|c| c.index == Some(index)) {
                Some(pos) => pos,
                None => {
                    self.calls.push(PartialCall {
                        index: Some(index),
                        ..PartialCall::default()
                    });
                    self.calls.len() - 1
                }
            },
            // No index (some servers): a new id starts a new call, anything else continues
            // the last one.
            None => match self.calls.last() {
                Some(last)
                    if id
                        .as_ref()
                        .is_none_or(|id| *id == last.id || last.id.is_empty()) =>
                {
                    self.calls.len() - 1
                }
                _ => {
                    self.calls.push(PartialCall::default());
                    self.calls.len() - 1
                }
            },
        };
        let Some(call) = self.calls.get_mut(slot) else {
            return;
        };
        // Ids and names arrive whole (servers that repeat them in later chunks repeat them
        // whole), so the first non-empty one wins; argument text arrives in fragments.
        if let Some(id) = id
            && call.id.is_empty()
        {
            call.id = id;
        }
        if let Some(function) = fragment.function {
            if let Some(name) = function.name.filter(|n| !n.is_empty())
                && call.name.is_empty()
            {
                call.name = name;
            }
            if let Some(arguments) = function.arguments {
                call.arguments.push_str(&arguments);
            }
        }
    }

    fn finish(self) -> Reply {
        let tool_calls = self
            .calls
            .into_iter()
            .map(|call| ToolCall {
                id: call.id,
                name: call.name,
                arguments: decode_arguments(&call.arguments),
            })
            .collect();
        let reasoning = if self.reasoning.is_empty() {
            Vec::new()
        } else {
            vec![ReasoningBlock {
                text: self.reasoning,
                signature: None,
                redacted: None,
            }]
        };
        Reply {
            text: self.text,
            tool_calls,
            finish_reason: self.finish_reason.map(FinishReason::from),
            usage: self.usage,
            reasoning,
        }
    }
}

/// Decode streamed argument text: no text is `Null`, undecodable text stays a `String`.
pub(crate) fn decode_arguments(text: &str) -> Value {
    if text.trim().is_empty() {
        return Value::Null;
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// The status an in-stream error object names: a numeric `code`/`status`, or one mapped from
/// its `type`; a server fault otherwise.
fn stream_error_status(error: &Value) -> u16 {
    let numeric = ["code", "status"]
        .iter()
        .filter_map(|key| error.get(key))
        .find_map(|v| {
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse::<u64>().ok()))
        })
        .and_then(|n| u16::try_from(n).ok())
        .filter(|n| (400..600).contains(n));
    if let Some(status) = numeric {
        return status;
    }
    let kind = error
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_ascii_lowercase();
    if kind.contains("rate_limit") {
        429
    } else if kind.contains("overload") {
        529
    } else if kind.contains("invalid_request") || kind.contains("badrequest") {
        400
    } else {
        500
    }
}

/// A whole chat completion (a server that ignored `stream: true`) as the chunks its stream
/// would have sent: one delta holding the message, then the usage, then `[DONE]`.
fn whole_reply(reply: &Value) -> Result<Vec<Event>, ModelError> {
    if let Some(error) = reply.get("error") {
        let chunk = json!({ "error": error });
        return Ok(vec![Event::new("", chunk.to_string())]);
    }
    let choice = reply
        .get("choices")
        .and_then(|c| c.get(0))
        .ok_or_else(|| ModelError::malformed("the reply has no choices"))?;
    let message = choice.get("message").cloned().unwrap_or(Value::Null);
    let mut delta = json!({"role": "assistant"});
    for field in ["content", "reasoning_content", "reasoning"] {
        if let Some(value) = message.get(field).filter(|v| v.is_string()) {
            delta[field] = value.clone();
        }
    }
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                let mut call = call.clone();
                call["index"] = json!(i);
                call
            })
            .collect();
        delta["tool_calls"] = Value::Array(calls);
    }
    let finish = choice.get("finish_reason").cloned().unwrap_or(Value::Null);
    let mut events = vec![Event::new(
        "",
        json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).to_string(),
    )];
    if let Some(usage) = reply.get("usage") {
        events.push(Event::new(
            "",
            json!({"choices": [], "usage": usage}).to_string(),
        ));
    }
    events.push(Event::new("", "[DONE]".to_owned()));
    Ok(events)
}

async fn read_stream(
    mut events: EventStream,
    observer: &dyn ReplyObserver,
) -> Result<Reply, ModelError> {
    let mut acc = Accumulator::default();
    let mut done = false;
    while let Some(event) = events.next().await {
        let event = event?;
        let data = event.data.trim();
        if data.is_empty() {
            continue;
        }
        if data == "[DONE]" {
            done = true;
            finish_stream(events).await;
            break;
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|_| ModelError::malformed("a reply chunk is not valid JSON"))?;
        if let Some(error) = chunk.error {
            let inner = error.get("error").cloned().unwrap_or(error);
            return Err(classify_stream_error(
                stream_error_status(&inner),
                &inner.to_string(),
            ));
        }
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = choice.delta {
                if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                    observer.text(&text);
                    acc.text.push_str(&text);
                }
                if let Some(text) = delta
                    .reasoning_content
                    .or(delta.reasoning)
                    .filter(|t| !t.is_empty())
                {
                    observer.reasoning(&text);
                    acc.reasoning.push_str(&text);
                }
                for fragment in delta.tool_calls.unwrap_or_default() {
                    acc.call_fragment(fragment);
                }
            }
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                acc.finish_reason = Some(reason);
            }
        }
        if let Some(usage) = chunk.usage {
            acc.usage = Some(Usage {
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
                reasoning_tokens: usage
                    .completion_tokens_details
                    .and_then(|d| d.reasoning_tokens),
            });
        }
    }
    if !done && acc.finish_reason.is_none() {
        return Err(ModelError::malformed(
            "the reply stream ended before the reply was complete",
        ));
    }
    Ok(acc.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::types::{Content, ContentPart, ToolSpec};

    fn options(thinking: OpenAiThinking, field: MaxTokensField) -> OpenAiOptions {
        OpenAiOptions {
            max_tokens_field: field,
            thinking,
            include_usage: true,
        }
    }

    /// A round's body is what a fresh encoding of its request gives, whatever the last round
    /// sent: the records it shares with the last round (by address), another first record,
    /// a shorter list, other settings, and with the last body still held elsewhere.
    #[test]
    fn a_round_writes_only_the_records_the_last_round_did_not_send() {
        let options = options(OpenAiThinking::Unsupported, MaxTokensField::MaxTokens);
        let first = Arc::new(Message::user("first"));
        let reply = Arc::new(Message::tool("c1", "result"));
        let request = |messages: Vec<Arc<Message>>, tools: bool, temperature: Option<f64>| {
            let mut request = ChatRequest::new("m", Vec::<Message>::new());
            request.messages = Arc::new(messages);
            if tools {
                request.tools = [ToolSpec {
                    name: "look".into(),
                    description: "Look".into(),
                    parameters: json!({"type": "object"}),
                }]
                .into();
            }
            request.temperature = temperature;
            request
        };
        let mut cache = WireCache::default();
        let mut held = Vec::new();
        for (i, round) in [
            request(vec![first.clone()], true, None),
            request(vec![first.clone(), reply.clone()], true, None),
            request(
                vec![first.clone(), reply.clone(), first.clone()],
                true,
                None,
            ),
            request(
                vec![Arc::new(Message::user("first")), reply.clone()],
                true,
                None,
            ),
            request(vec![first.clone()], true, None),
            request(vec![first.clone(), reply.clone()], false, Some(0.5)),
            request(vec![first.clone(), reply.clone()], true, None),
            request(vec![], true, None),
        ]
        .iter()
        .enumerate()
        {
            let body = cache.body(round, &options).unwrap();
            let fresh = WireCache::default().body(round, &options).unwrap();
            assert_eq!(body, fresh, "round {i}");
            let parsed: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(
                parsed["messages"].as_array().unwrap().len(),
                round.messages.len()
            );
            if i % 2 == 1 {
                // The request still holds its body when the next round is written.
                held.push(body);
            }
        }
        assert_eq!(cache.sent.len(), 0);
    }

    #[test]
    fn body_has_the_wire_shape() {
        let mut request = ChatRequest::new(
            "m",
            vec![
                Message::system("be brief"),
                Message::user("weather?"),
                Message::assistant_tool_calls(
                    "",
                    vec![ToolCall {
                        id: "call_1".into(),
                        name: "weather".into(),
                        arguments: json!({"city": "Paris"}),
                    }],
                ),
                Message::tool("call_1", "sunny"),
            ],
        );
        request.tools = [ToolSpec {
            name: "weather".into(),
            description: "d".into(),
            parameters: json!({"type": "object"}),
        }]
        .into();
        request.temperature = Some(0.5);
        request.max_tokens = Some(10);
        let body = request_body(&request, &OpenAiOptions::default());
        assert_eq!(
            body,
            json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                ],
                "tools": [{"type": "function", "function": {
                    "name": "weather", "description": "d", "parameters": {"type": "object"}}}],
                "temperature": 0.5,
                "max_tokens": 10,
                "stream": true,
                "stream_options": {"include_usage": true},
            })
        );
    }

    #[test]
    fn thinking_mappings() {
        let mut request = ChatRequest::new("m", vec![Message::user("hi")]);
        let effort = options(
            OpenAiThinking::ReasoningEffort {
                on: "medium".into(),
                off: "none".into(),
            },
            MaxTokensField::MaxCompletionTokens,
        );
        let kwargs = options(
            OpenAiThinking::ChatTemplateKwargs {
                key: "enable_thinking".into(),
            },
            MaxTokensField::MaxTokens,
        );
        assert!(
            request_body(&request, &effort)
                .get("reasoning_effort")
                .is_none()
        );
        request.thinking = ThinkingSwitch::On;
        assert_eq!(
            request_body(&request, &effort)["reasoning_effort"],
            "medium"
        );
        assert_eq!(
            request_body(&request, &kwargs)["chat_template_kwargs"],
            json!({"enable_thinking": true})
        );
        request.thinking = ThinkingSwitch::Off;
        assert_eq!(request_body(&request, &effort)["reasoning_effort"], "none");
        assert_eq!(
            request_body(&request, &kwargs)["chat_template_kwargs"],
            json!({"enable_thinking": false})
        );
        let plain = request_body(&request, &OpenAiOptions::default());
        assert!(plain.get("reasoning_effort").is_none());
        assert!(plain.get("chat_template_kwargs").is_none());
        request.max_tokens = Some(5);
        assert_eq!(request_body(&request, &effort)["max_completion_tokens"], 5);
        assert!(request_body(&request, &effort).get("max_tokens").is_none());
    }

    #[test]
    fn image_parts_pass_through() {
        let request = ChatRequest::new(
            "m",
            vec![Message::User {
                content: Content::Parts(vec![
                    ContentPart::Text {
                        text: "what?".into(),
                    },
                    ContentPart::ImageUrl {
                        image_url: crate::model::types::ImageUrl {
                            url: "data:image/png;base64,AAAA".into(),
                        },
                    },
                ]),
            }],
        );
        let body = request_body(&request, &OpenAiOptions::default());
        assert_eq!(
            body["messages"][0]["content"],
            json!([
                {"type": "text", "text": "what?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
            ])
        );
    }

    #[test]
    fn fragments_without_index_split_on_new_ids() {
        let mut acc = Accumulator::default();
        let frag = |id: Option<&str>, name: Option<&str>, args: &str| CallFragment {
            index: None,
            id: id.map(str::to_owned),
            function: Some(FunctionFragment {
                name: name.map(str::to_owned),
                arguments: Some(args.to_owned()),
            }),
        };
        acc.call_fragment(frag(Some("a"), Some("f"), "{\"x\":"));
        acc.call_fragment(frag(None, None, "1}"));
        acc.call_fragment(frag(Some("b"), Some("g"), "{}"));
        let reply = acc.finish();
        assert_eq!(reply.tool_calls.len(), 2);
        assert_eq!(reply.tool_calls[0].arguments, json!({"x": 1}));
        assert_eq!(reply.tool_calls[1].name, "g");
    }

    #[test]
    fn argument_decoding() {
        assert_eq!(decode_arguments(""), Value::Null);
        assert_eq!(decode_arguments("{\"a\":1}"), json!({"a": 1}));
        assert_eq!(decode_arguments("{bad"), Value::String("{bad".into()));
    }

    #[test]
    fn stream_error_statuses() {
        assert_eq!(stream_error_status(&json!({"code": 429})), 429);
        assert_eq!(stream_error_status(&json!({"code": "503"})), 503);
        assert_eq!(
            stream_error_status(&json!({"type": "invalid_request_error"})),
            400
        );
        assert_eq!(stream_error_status(&json!({"message": "boom"})), 500);
    }
}

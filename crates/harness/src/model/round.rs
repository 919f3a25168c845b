//! The engine's model rounds in provider terms: a [`ModelRound`] effect becomes the
//! [`ChatRequest`] a provider sends, and a provider's [`Reply`] becomes the JSON answer the
//! section VM reads. Every Host that performs rounds (the CLI, benches, tests) translates with
//! these two functions, so they all send and read the same thing.

use promptforge_protocol::effect::{ModelRound, ModelTarget};
use serde_json::{Value as Json, json};

use super::types::{ChatRequest, FinishReason, Message, Reply, ThinkingSwitch, ToolSpec};

/// The engine's round as the request sent to `model` (the provider's wire model name). Fails
/// when the engine composed a message or tool the provider types cannot hold.
pub fn round_request(model: &str, round: &ModelRound) -> Result<ChatRequest, String> {
    let messages = round
        .messages
        .iter()
        .map(|m| serde_json::from_value::<Message>(m.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the engine composed a message the provider cannot send: {e}"))?;
    let tools = round
        .tools
        .iter()
        .map(|t| serde_json::from_value::<ToolSpec>(t.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the engine offered a tool the provider cannot send: {e}"))?;
    let ModelTarget {
        thinking,
        temperature,
        max_tokens,
        ..
    } = &round.model;
    let mut request = ChatRequest::new(model.to_owned(), messages);
    request.tools = tools;
    request.temperature = *temperature;
    request.max_tokens = max_tokens.and_then(|n| u32::try_from(n).ok());
    request.thinking = ThinkingSwitch::from(*thinking);
    Ok(request)
}

/// A provider reply as the JSON answer the section VM reads.
pub fn reply_answer(reply: &Reply) -> Json {
    let calls: Vec<Json> = reply
        .tool_calls
        .iter()
        .map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
        .collect();
    json!({
        "text": reply.text,
        "tool_calls": calls,
        "finish_reason": reply.finish_reason.as_ref().map(FinishReason::as_str),
        "usage": reply.usage.as_ref().map(|u| json!({
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "reasoning_tokens": u.reasoning_tokens,
        })),
    })
}

//! The engine's model rounds in provider terms: a [`ModelRound`] effect becomes the
//! [`ChatRequest`] a provider sends, and a provider's [`Reply`] becomes the JSON answer the
//! section VM reads. Every Host that performs rounds (the CLI, benches, tests) translates with
//! these two functions, so they all send and read the same thing.

use promptforge_protocol::effect::{ModelRound, ModelTarget};
use serde_json::{Value as Json, json};

use super::types::{ChatRequest, FinishReason, Reply, ThinkingSwitch};

/// The engine's round as the request sent to `model` (the provider's wire model name). The
/// messages are shared with the round, not copied.
pub fn round_request(model: &str, round: &ModelRound) -> ChatRequest {
    let ModelTarget {
        thinking,
        temperature,
        max_tokens,
        ..
    } = &round.model;
    ChatRequest {
        model: model.to_owned(),
        messages: round.messages.clone(),
        tools: round.tools.clone(),
        temperature: *temperature,
        max_tokens: max_tokens.and_then(|n| u32::try_from(n).ok()),
        thinking: ThinkingSwitch::from(*thinking),
    }
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

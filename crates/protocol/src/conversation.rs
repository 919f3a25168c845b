//! The conversation model: one message record, its content and tool calls, the tools on
//! offer, and a model's reply with its usage. The section VM builds these from a prompt's
//! message lists (chapter 11), the engine carries them in a model round, and the Harness's
//! providers write them on the wire: one definition for every layer.
//!
//! Message records use the same field names and role strings as the prompt's own message
//! lists, so a record the VM checked maps onto these types one to one.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A role's thinking switch (chapter 10, "Keywords and the thinking switch").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThinkingSwitch {
    /// Neither hard keyword: leave the model's own default (send nothing).
    #[default]
    ModelDefault,
    /// `thinking`: ask for thinking on.
    On,
    /// `no-thinking`: ask for thinking off.
    Off,
}

impl From<Option<bool>> for ThinkingSwitch {
    /// `Some(true)` is on, `Some(false)` off, `None` the model's default, matching a
    /// handle's `thinking` field.
    fn from(value: Option<bool>) -> Self {
        match value {
            Some(true) => Self::On,
            Some(false) => Self::Off,
            None => Self::ModelDefault,
        }
    }
}

/// A composed message list as a round carries it: one shared list (the loop's state, the
/// round, the Harness's request hold the same one, so a round never copies it), of shared
/// records. A `Vec` inside rather than a slice, so the loop can extend the list in place once
/// it is the only holder left (a round's request is gone by the next round), instead of
/// copying every record handle each round.
pub type SharedMessages = Arc<Vec<Arc<Message>>>;

/// One record of the conversation, tagged by its `role`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    /// Instructions for the model; only in the leading block.
    System {
        /// The record's content.
        content: Content,
    },
    /// A user turn: text, or text and image parts.
    User {
        /// The record's content.
        content: Content,
    },
    /// The model's own earlier turn: reply text, and the tool calls it made.
    Assistant {
        /// The visible reply text (often empty on a tool-call turn).
        content: Content,
        /// The tool calls the turn made, in call order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        /// Reasoning blocks to replay with this turn. Only the Anthropic provider sends them,
        /// and only blocks that carry a signature (or redacted data): Anthropic requires the
        /// signed thinking of a tool-use turn when thinking is on. The engine may leave this
        /// empty; the Harness's Anthropic provider documents what happens then.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        reasoning: Vec<ReasoningBlock>,
    },
    /// The result of one tool call.
    Tool {
        /// The result text the model receives.
        content: Content,
        /// The `id` of the call this record answers.
        tool_call_id: String,
    },
}

impl Message {
    /// A plain-text system record.
    pub fn system(text: impl Into<String>) -> Self {
        Self::System {
            content: Content::Text(text.into()),
        }
    }

    /// A plain-text user record.
    pub fn user(text: impl Into<String>) -> Self {
        Self::User {
            content: Content::Text(text.into()),
        }
    }

    /// A plain-text assistant record without tool calls.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::Assistant {
            content: Content::Text(text.into()),
            tool_calls: Vec::new(),
            reasoning: Vec::new(),
        }
    }

    /// An assistant record carrying tool calls.
    pub fn assistant_tool_calls(text: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self::Assistant {
            content: Content::Text(text.into()),
            tool_calls,
            reasoning: Vec::new(),
        }
    }

    /// A tool record answering the call `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, text: impl Into<String>) -> Self {
        Self::Tool {
            tool_call_id: tool_call_id.into(),
            content: Content::Text(text.into()),
        }
    }

    /// The record's content.
    pub fn content(&self) -> &Content {
        match self {
            Self::System { content }
            | Self::User { content }
            | Self::Assistant { content, .. }
            | Self::Tool { content, .. } => content,
        }
    }

    /// The role string: `system`, `user`, `assistant` or `tool`.
    pub fn role(&self) -> &'static str {
        match self {
            Self::System { .. } => "system",
            Self::User { .. } => "user",
            Self::Assistant { .. } => "assistant",
            Self::Tool { .. } => "tool",
        }
    }
}

/// A record's content: a string, or a non-empty array of content parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text; the empty string is allowed.
    Text(String),
    /// Text and image parts in order.
    Parts(Vec<ContentPart>),
}

impl Content {
    /// The text of the content: the string itself, or the text parts joined with nothing
    /// between them (image parts contribute nothing).
    pub fn text(&self) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::Parts(parts) => parts
                .iter()
                .filter_map(|p| match p {
                    ContentPart::Text { text } => Some(text.as_str()),
                    ContentPart::ImageUrl { .. } => None,
                })
                .collect(),
        }
    }

    /// Whether the content holds no text and no image.
    pub fn is_empty(&self) -> bool {
        match self {
            Self::Text(text) => text.is_empty(),
            Self::Parts(parts) => parts.iter().all(|p| match p {
                ContentPart::Text { text } => text.is_empty(),
                ContentPart::ImageUrl { .. } => false,
            }),
        }
    }
}

impl From<&str> for Content {
    fn from(value: &str) -> Self {
        Self::Text(value.to_owned())
    }
}

impl From<String> for Content {
    fn from(value: String) -> Self {
        Self::Text(value)
    }
}

/// One part of multimodal content, in the chapter-11 shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// `{ type = "text", text = "..." }`
    Text {
        /// The text.
        text: String,
    },
    /// `{ type = "image_url", image_url = { url = "..." } }`
    ImageUrl {
        /// Where the image is: an `https:` URL or a `data:` URL.
        image_url: ImageUrl,
    },
}

/// The `image_url` table of an image part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageUrl {
    /// An `https:`/`http:` URL, or a `data:{media type};base64,{data}` URL.
    pub url: String,
}

/// A tool call, in a request's assistant record or in a [`Reply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id, unique within the conversation.
    pub id: String,
    /// The tool name the model called (an alias from `tools:`).
    pub name: String,
    /// The arguments. In a request, the JSON object the engine recorded. In a reply, the
    /// provider's arguments decoded: an object normally; `Null` when the provider sent no
    /// arguments text at all; and, when the text the provider sent is not valid JSON, a
    /// `String` holding that raw text. The engine accepts only objects and fails the round
    /// as a malformed reply otherwise (chapter 11), so providers pass what they got along
    /// instead of deciding for it.
    pub arguments: Value,
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// A JSON Schema (an object schema) for the arguments.
    pub parameters: Value,
}

/// Reasoning the model produced while it replied. Never part of the reply text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasoningBlock {
    /// The reasoning text as streamed (may be a summary, or empty when redacted).
    #[serde(default)]
    pub text: String,
    /// The provider's signature over the block (Anthropic), needed to replay it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// Encrypted reasoning the provider withheld (Anthropic `redacted_thinking`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redacted: Option<String>,
}

/// Why the model stopped.
///
/// Providers normalize their own vocabulary onto the chapter-11 strings: `stop` for a natural
/// end, `length` for a reply cut at the generation cap, `tool_calls` for a turn that asks for
/// tools, `content_filter` for a refusal; anything else passes through as sent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum FinishReason {
    /// `stop`: the model finished its turn.
    Stop,
    /// `length`: the reply hit the generation cap.
    Length,
    /// `tool_calls`: the turn asks for tools.
    ToolCalls,
    /// `content_filter`: the provider withheld or cut the reply.
    ContentFilter,
    /// Any other reason, as the provider sent it.
    Other(String),
}

impl FinishReason {
    /// The reason as the string `err.finish_reason` shows.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::ToolCalls => "tool_calls",
            Self::ContentFilter => "content_filter",
            Self::Other(other) => other,
        }
    }
}

impl From<String> for FinishReason {
    fn from(value: String) -> Self {
        match value.as_str() {
            "stop" => Self::Stop,
            "length" => Self::Length,
            "tool_calls" => Self::ToolCalls,
            "content_filter" => Self::ContentFilter,
            _ => Self::Other(value),
        }
    }
}

impl From<&str> for FinishReason {
    fn from(value: &str) -> Self {
        Self::from(value.to_owned())
    }
}

impl From<FinishReason> for String {
    fn from(value: FinishReason) -> Self {
        match value {
            FinishReason::Other(other) => other,
            known => known.as_str().to_owned(),
        }
    }
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Token usage the provider reported for one round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the request, cached prompt tokens included.
    pub prompt_tokens: u64,
    /// Tokens the model generated, reasoning tokens included.
    pub completion_tokens: u64,
    /// The part of `completion_tokens` spent on reasoning, when the provider says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
}

impl Usage {
    /// The precheck's token total after this round (chapter 11, "The precheck"): prompt plus
    /// completion tokens, less the reasoning tokens, which are never sent back.
    pub fn conversation_tokens(&self) -> u64 {
        (self.prompt_tokens + self.completion_tokens)
            .saturating_sub(self.reasoning_tokens.unwrap_or(0))
    }
}

/// A model's reply to one round.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// The visible reply text, whole (may be empty).
    pub text: String,
    /// The tool calls the model asked for, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Why the model stopped, when the provider said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// Token usage, when the provider reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The model's reasoning, kept apart from `text`; never the reply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasoning: Vec<ReasoningBlock>,
}

impl Reply {
    /// A plain text reply with finish reason `stop`.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            finish_reason: Some(FinishReason::Stop),
            ..Self::default()
        }
    }
}

//! The data that crosses the model boundary: requests, replies, and model descriptions.
//!
//! Every type here is plain data, `serde`-serializable, so a Host can log a round, replay it,
//! or ship it across a process boundary. Message records use the same field names and role
//! strings as the prompt's own message lists (chapter 11), so a record the engine checked
//! maps onto these types one to one.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One model round: the request the engine hands to a [`ModelProvider`](super::ModelProvider).
///
/// The engine composes `messages` (merging runs of records as chapter 11 describes) before it
/// builds the request; providers send them in order and never merge or reorder them, except
/// where a provider's wire format demands it (the Anthropic provider moves the leading system
/// records into its top-level `system` field and groups tool results into user turns).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The model name the provider sends on the wire, such as `gpt-4.1` or
    /// `claude-sonnet-4-6`: [`ModelDescription::model`], not the catalog id.
    pub model: String,
    /// The conversation, in order. Shared with the engine's round, never copied.
    pub messages: SharedMessages,
    /// The tools on offer this round; empty offers none.
    #[serde(default, skip_serializing_if = "<[ToolSpec]>::is_empty")]
    pub tools: Arc<[ToolSpec]>,
    /// Sampling temperature, 0.0 to 2.0, when the selection set one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Cap on generated tokens, when the selection set one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The role's thinking switch.
    #[serde(default)]
    pub thinking: ThinkingSwitch,
}

impl ChatRequest {
    /// A request for `model` with these messages, no tools, no sampling options and the
    /// model's own thinking default.
    pub fn new(
        model: impl Into<String>,
        messages: impl IntoIterator<Item = impl Into<Arc<Message>>>,
    ) -> Self {
        Self {
            model: model.into(),
            messages: Arc::new(messages.into_iter().map(Into::into).collect()),
            tools: Arc::from([]),
            temperature: None,
            max_tokens: None,
            thinking: ThinkingSwitch::ModelDefault,
        }
    }

    /// The text of the last user record, text parts joined in order with nothing between
    /// them (the engine inserts separators as text parts of their own when it merges), or
    /// `None` when the request holds no user record.
    pub fn last_user_text(&self) -> Option<String> {
        self.messages.iter().rev().find_map(|m| match &**m {
            Message::User { content } => Some(content.text()),
            _ => None,
        })
    }

    /// The text of the last `tool` record, if any.
    pub fn last_tool_text(&self) -> Option<String> {
        self.messages.iter().rev().find_map(|m| match &**m {
            Message::Tool { content, .. } => Some(content.text()),
            _ => None,
        })
    }
}

pub use promptforge_protocol::conversation::{
    Content, ContentPart, FinishReason, ImageUrl, Message, ReasoningBlock, Reply, SharedMessages,
    ThinkingSwitch, ToolCall, ToolSpec, Usage,
};
pub use promptforge_protocol::host::ThinkingCapability;

/// Which wire protocol and defaults a catalog entry uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// OpenAI's API (chat completions), or any server configured like it.
    #[serde(rename = "openai")]
    OpenAi,
    /// The Anthropic Messages API.
    Anthropic,
    /// Ollama's OpenAI-compatible endpoint (`/v1`).
    Ollama,
    /// vLLM's OpenAI-compatible server.
    Vllm,
    /// llama.cpp's `llama-server` (OpenAI-compatible).
    #[serde(rename = "llamacpp", alias = "llama.cpp", alias = "llama-cpp")]
    LlamaCpp,
    /// The Host's gateway from `PROMPTFORGE_GATEWAY_URL` (OpenAI-compatible).
    Gateway,
    /// The scripted model of `--script` (no network).
    Scripted,
}

impl ProviderKind {
    /// The name used in config files and quick ids.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
            Self::Ollama => "ollama",
            Self::Vllm => "vllm",
            Self::LlamaCpp => "llamacpp",
            Self::Gateway => "gateway",
            Self::Scripted => "scripted",
        }
    }

    /// Every kind a config entry or quick id may name (all but `scripted`).
    pub const NETWORKED: [ProviderKind; 6] = [
        Self::OpenAi,
        Self::Anthropic,
        Self::Ollama,
        Self::Vllm,
        Self::LlamaCpp,
        Self::Gateway,
    ];

    /// The kind a quick-id prefix or config `provider` value names.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "openai" => Some(Self::OpenAi),
            "anthropic" => Some(Self::Anthropic),
            "ollama" => Some(Self::Ollama),
            "vllm" => Some(Self::Vllm),
            "llamacpp" | "llama.cpp" | "llama-cpp" => Some(Self::LlamaCpp),
            "gateway" => Some(Self::Gateway),
            _ => None,
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the catalog knows about one model: everything a model handle and prepare read
/// (chapter 10, "Model handles" and "Requirements at prepare").
///
/// | Handle field / prepare check | Source |
/// |---|---|
/// | `model_id`, `sys.model` | [`id`](Self::id) |
/// | `context`, `min_context` check | [`context`](Self::context) |
/// | `description` (a role without its own) | [`description`](Self::description) |
/// | hard keyword checks | [`thinking`](Self::thinking) |
///
/// `name`, `label`, `capabilities`, `thinking`, `temperature` and `max_tokens` of a handle come
/// from the prompt's role and selection, not from the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelDescription {
    /// The catalog id: what `--model` takes and what `model_id` reads, such as
    /// `claude-sonnet-4-6` or the quick id `ollama:qwen3:8b`.
    pub id: String,
    /// The provider protocol.
    pub provider: ProviderKind,
    /// The model name sent on the wire ([`ChatRequest::model`]).
    pub model: String,
    /// The endpoint's base URL; `None` for the scripted model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The name of the environment variable holding the API key, if the model uses one.
    /// Keys themselves never appear in files, flags or this description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// The context window in tokens, at least 1.
    pub context: u64,
    /// The thinking capability.
    pub thinking: ThinkingCapability,
    /// The catalog description (may be empty).
    #[serde(default)]
    pub description: String,
    /// What the model's tokens cost, when the catalog says (`input_price` / `output_price`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
}

/// A model's token prices in US dollars per million tokens, from the catalog. A Host shows a
/// run's cost only from these; a model without them has an unknown cost, never a zero one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Price {
    /// Dollars per million prompt (input) tokens.
    pub input: f64,
    /// Dollars per million completion (output) tokens.
    pub output: f64,
}

// The catalog accepts only finite, non-negative prices (`Price::new`), so equality is
// reflexive and `Eq` holds.
impl Eq for Price {}

impl Price {
    /// Prices from the two catalog fields; `None` unless both are finite and non-negative.
    pub fn new(input: f64, output: f64) -> Option<Price> {
        let ok = |p: f64| p.is_finite() && p >= 0.0;
        (ok(input) && ok(output)).then_some(Price { input, output })
    }

    /// The cost in dollars of this usage.
    pub fn cost(&self, usage: &Usage) -> f64 {
        (usage.prompt_tokens as f64 * self.input + usage.completion_tokens as f64 * self.output)
            / 1_000_000.0
    }
}

impl ModelDescription {
    /// The engine's view of this model, for [`promptforge_protocol::host::HostState::model`].
    pub fn engine_info(&self) -> promptforge_protocol::host::ModelInfo {
        promptforge_protocol::host::ModelInfo {
            id: self.id.clone(),
            context: self.context,
            thinking: self.thinking,
            description: self.description.clone(),
        }
    }
}

//! Models: the boundary between the engine's model rounds and real model providers.
//!
//! The engine composes a round ([`ChatRequest`]: the merged message list, the tools on offer,
//! the sampling options and the thinking switch) and hands it to a [`ModelProvider`]; the
//! provider answers with a [`Reply`] or a classified [`ModelError`]. Three providers ship:
//!
//! - [`OpenAiProvider`]: OpenAI-compatible chat completions (OpenAI, Ollama's `/v1`, vLLM,
//!   llama.cpp's `llama-server`, any gateway speaking that protocol), streamed over SSE;
//! - [`AnthropicProvider`]: the Anthropic Messages API, natively, streamed over SSE;
//! - [`ScriptedModel`]: answers rounds from a `--script` file (conformance and tests).
//!
//! The Host picks its current model from the [`Catalog`] (TOML files plus quick ids such as
//! `openai:gpt-4.1`), which resolves an id to a ready provider and its
//! [`ModelDescription`]. The HTTP providers send a round again after a 429 or a 5xx that came
//! before any of the reply ([`ModelLimits::retries`], reported to
//! [`ReplyObserver::retry`]); every other failure fails the round once.
//!
//! Every model call observes the two Harness limits of chapter 16 ([`ModelLimits`]): a
//! receive timeout (120 s by default) on the reply headers and on each next body chunk, and a
//! response cap (16 MiB by default) on the bytes of the reply, error replies included.

mod anthropic;
mod catalog;
mod error;
pub(crate) mod http;
mod openai;
mod provider;
mod round;
mod scripted;
mod sse;
mod types;

pub use anthropic::{ANTHROPIC_VERSION, AnthropicOptions, AnthropicProvider};
pub use catalog::{
    Catalog, CatalogError, ConfigSources, Environment, KeyStatus, ListedModel, ModelEntry,
    QuickKind, ResolvedModel, ThinkingParam,
};
pub use error::{ModelError, OversizeKind, classify_http_failure, is_context_overflow_text};
pub use http::is_loopback;
pub use openai::{MaxTokensField, OpenAiOptions, OpenAiProvider, OpenAiThinking};
pub use provider::{IgnoreFragments, ModelFuture, ModelLimits, ModelProvider, ReplyObserver};
pub use round::{reply_answer, round_request};
pub use scripted::{Condition, Script, ScriptEntry, ScriptError, ScriptedModel, ScriptedReply};
pub use types::{
    ChatRequest, Content, ContentPart, FinishReason, ImageUrl, Message, ModelDescription, Price,
    ProviderKind, ReasoningBlock, Reply, ThinkingCapability, ThinkingSwitch, ToolCall, ToolSpec,
    Usage,
};

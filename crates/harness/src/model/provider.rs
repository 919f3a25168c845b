//! The provider trait the Host calls, and the limits every model call observes.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::error::ModelError;
use super::types::{ChatRequest, Reply};

/// The future a provider returns: one round's reply or its failure.
pub type ModelFuture<'a> = Pin<Box<dyn Future<Output = Result<Reply, ModelError>> + Send + 'a>>;

/// Something that answers model rounds: an HTTP provider or the scripted model.
///
/// The trait is object-safe (`Arc<dyn ModelProvider>` is the usual handle) and its futures are
/// `Send`, so the Host can drive rounds from any tokio task. To cancel a round (a Host cancel
/// or stop), drop its future: the request is abandoned and nothing of the reply lands.
/// HTTP providers retry only as [`ModelLimits::retries`] says.
pub trait ModelProvider: Send + Sync + Debug {
    /// Run one round, reporting text and reasoning fragments to `observer` as they arrive, in
    /// the order the model streams them. The returned [`Reply`] holds the whole text those
    /// fragments carried.
    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
        observer: &'a dyn ReplyObserver,
    ) -> ModelFuture<'a>;

    /// Run one round without watching its fragments.
    fn complete<'a>(&'a self, request: &'a ChatRequest) -> ModelFuture<'a> {
        self.stream(request, &IgnoreFragments)
    }

    /// The round's reply right now, for a provider that needs no I/O to give it (the scripted
    /// model). A Host calls this when it issues the round, in the engine's issue order, so a
    /// provider that answers from state shared across rounds binds each reply to the round it
    /// was issued for, however many rounds are in flight. `None` (the default): run the round
    /// with [`ModelProvider::stream`] or [`ModelProvider::complete`].
    fn answer_at_once(&self, request: &ChatRequest) -> Option<Result<Reply, ModelError>> {
        let _ = request;
        None
    }

    /// Whether the provider's replies depend on the order rounds reach it (a script played
    /// in order): the Host then issues rounds in the run's committed order only.
    fn binds_in_order(&self) -> bool {
        false
    }
}

/// Watches a round's reply as it streams (the Host's live output). Observers must be quick:
/// they run inline with the stream.
pub trait ReplyObserver: Send + Sync {
    /// A fragment of the visible reply text.
    fn text(&self, fragment: &str) {
        let _ = fragment;
    }

    /// A fragment of the model's reasoning (never part of the reply).
    fn reasoning(&self, fragment: &str) {
        let _ = fragment;
    }

    /// The server refused the round with `status` and said `message` (its own words, one
    /// line); the round's failure keeps the spec's fixed text, so a Host can show these.
    fn server_message(&self, status: u16, message: &str) {
        let _ = (status, message);
    }

    /// The round is about to be sent again (`attempt` counts from 1) after `wait`, because
    /// of `error`, so a Host can show that a waiting round is not hung.
    fn retry(&self, attempt: u32, wait: Duration, error: &ModelError) {
        let _ = (attempt, wait, error);
    }
}

/// A [`ReplyObserver`] that ignores every fragment.
#[derive(Debug, Clone, Copy, Default)]
pub struct IgnoreFragments;

impl ReplyObserver for IgnoreFragments {}

/// The two limits that guard every model call (chapter 16, "Model reply size and wait time").
/// Only the Harness changes them; tests shrink them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLimits {
    /// The longest wait for the reply headers, and then for each next chunk of the body.
    /// Every arriving chunk restarts the wait; nothing limits the whole request.
    pub receive_timeout: Duration,
    /// The most bytes a reply may have, counted as they arrive and before any decoding,
    /// error replies included.
    pub response_cap: u64,
    /// The longest a whole round may take, however steadily the server trickles bytes (a
    /// keep-alive comment or a token a second would otherwise keep a round alive for ever).
    /// Retries count toward it.
    pub round_timeout: Duration,
    /// How many times a round is sent again after a rate limit (429) or a server error (5xx)
    /// that came before any of the reply; each wait follows the server's `Retry-After` when
    /// it sends one (at most 60 s), else doubles from 1 s.
    pub retries: u32,
}

impl ModelLimits {
    /// 120 seconds.
    pub const DEFAULT_RECEIVE_TIMEOUT: Duration = Duration::from_secs(120);
    /// 16 MiB (16,777,216 bytes).
    pub const DEFAULT_RESPONSE_CAP: u64 = 16 * 1024 * 1024;
    /// 10 minutes.
    pub const DEFAULT_ROUND_TIMEOUT: Duration = Duration::from_secs(600);
    /// Two retries.
    pub const DEFAULT_RETRIES: u32 = 2;
}

impl Default for ModelLimits {
    fn default() -> Self {
        Self {
            receive_timeout: Self::DEFAULT_RECEIVE_TIMEOUT,
            response_cap: Self::DEFAULT_RESPONSE_CAP,
            round_timeout: Self::DEFAULT_ROUND_TIMEOUT,
            retries: Self::DEFAULT_RETRIES,
        }
    }
}

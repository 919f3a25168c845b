//! Model call failures and how an HTTP failure is classified (chapter 16, "Model call and
//! environment failures"; chapter 11, "Provider rejections").

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Why a model round failed on the Harness's side.
///
/// `Display` is exactly the spec's fixed phrase for the failure, with the status where the
/// phrase has one, and never any of the reply body, so a hostile payload cannot leak into a
/// message. The engine raises it as an error value of kind `internal`, except
/// [`ContextOverflow`](Self::ContextOverflow), which a `models.loop` round hands to its
/// compactor with reason `provider` (check [`is_context_overflow`](Self::is_context_overflow)).
///
/// Nothing retries automatically; [`retryable`](Self::retryable) says whether the failure is
/// transient ("Failures worth running again").
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
#[serde(tag = "failure", rename_all = "snake_case")]
pub enum ModelError {
    /// The connection failed, or an error reply's body could not be read. `detail` says what
    /// happened and what to check, for the Host's logs; it is not part of the message.
    #[error("the connection to the model backend failed")]
    Transport {
        /// The underlying cause and endpoint, for logs (never shown to the prompt).
        detail: String,
    },
    /// The reply headers, or the next chunk of the body, did not arrive within the receive
    /// timeout.
    #[error("the model backend did not answer in time")]
    Timeout,
    /// Status 400 or 413 whose body names a context limit (or such an error inside a started
    /// stream): the request is too long for the model's context window.
    #[error("the request is larger than the model's context window (status {status})")]
    ContextOverflow {
        /// The HTTP status.
        status: u16,
    },
    /// Status 429 without a spent quota.
    #[error("the model backend is limiting the request rate (status 429)")]
    RateLimited,
    /// Status 429 whose body names a spent usage quota.
    #[error("the model backend says the usage quota is spent (status 429)")]
    QuotaSpent,
    /// Status 503 or 529, or a 5xx body naming an overload.
    #[error("the model backend is overloaded (status {status})")]
    Overloaded {
        /// The HTTP status.
        status: u16,
    },
    /// Any other status of 500 or higher.
    #[error("the model backend reported a fault of its own (status {status})")]
    ServerFault {
        /// The HTTP status.
        status: u16,
    },
    /// Status 401 or 403.
    #[error("the model backend did not accept the credentials (status {status})")]
    Credentials {
        /// The HTTP status.
        status: u16,
    },
    /// Status 400 whose body names a content policy.
    #[error("the model backend refused the request on content policy grounds (status 400)")]
    ContentPolicy,
    /// Any other non-success status.
    #[error("the model backend rejected the request (status {status})")]
    Rejected {
        /// The HTTP status.
        status: u16,
    },
    /// The reply could not be understood: bad JSON, a truncated stream, an unexpected shape.
    #[error("the model backend sent a reply that could not be understood: {what}")]
    Malformed {
        /// What was wrong (never reply content).
        what: String,
    },
    /// The reply passed the response cap.
    #[error(
        "the model backend sent a reply that could not be understood: {}",
        oversize_text(*.kind, *.limit)
    )]
    ResponseTooLarge {
        /// The cap in bytes.
        limit: u64,
        /// Which reply passed it.
        kind: OversizeKind,
    },
    /// The Host turned model access off.
    #[error("model access is turned off or not configured")]
    Disabled,
}

/// Which reply passed the response cap, for [`ModelError::ResponseTooLarge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum OversizeKind {
    /// The streamed (successful) reply: `response stream exceeds the {limit}-byte limit`.
    Stream,
    /// An error reply of unknown length: `response body exceeds the {limit}-byte limit`.
    Body,
    /// An error reply that announced its length:
    /// `response body of {len} bytes exceeds the {limit}-byte limit`.
    BodyOfLength {
        /// The announced length in bytes.
        len: u64,
    },
}

fn oversize_text(kind: OversizeKind, limit: u64) -> String {
    match kind {
        OversizeKind::Stream => format!("response stream exceeds the {limit}-byte limit"),
        OversizeKind::Body => format!("response body exceeds the {limit}-byte limit"),
        OversizeKind::BodyOfLength { len } => {
            format!("response body of {len} bytes exceeds the {limit}-byte limit")
        }
    }
}

impl ModelError {
    /// Whether running again may succeed: connection failures and timeouts, malformed or
    /// oversized replies, rate limits (not a spent quota), overloads, and statuses of 500 or
    /// higher. A context overflow, a spent quota, a refused or rejected request, bad
    /// credentials and a disabled gateway are not.
    pub fn retryable(&self) -> bool {
        match self {
            Self::Transport { .. }
            | Self::Timeout
            | Self::RateLimited
            | Self::Overloaded { .. }
            | Self::ServerFault { .. }
            | Self::Malformed { .. }
            | Self::ResponseTooLarge { .. } => true,
            Self::ContextOverflow { .. }
            | Self::QuotaSpent
            | Self::Credentials { .. }
            | Self::ContentPolicy
            | Self::Rejected { .. }
            | Self::Disabled => false,
        }
    }

    /// Whether the provider rejected the request as too long for the context window: the
    /// engine then calls the compactor with reason `provider`.
    pub fn is_context_overflow(&self) -> bool {
        matches!(self, Self::ContextOverflow { .. })
    }

    /// The HTTP status the failure came with, when there was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::ContextOverflow { status }
            | Self::Overloaded { status }
            | Self::ServerFault { status }
            | Self::Credentials { status }
            | Self::Rejected { status } => Some(*status),
            Self::RateLimited | Self::QuotaSpent => Some(429),
            Self::ContentPolicy => Some(400),
            Self::Transport { .. }
            | Self::Timeout
            | Self::Malformed { .. }
            | Self::ResponseTooLarge { .. }
            | Self::Disabled => None,
        }
    }

    /// Log detail beyond the message: the transport cause, when there is one.
    pub fn detail(&self) -> Option<&str> {
        match self {
            Self::Transport { detail } => Some(detail),
            _ => None,
        }
    }

    /// A malformed-reply failure.
    pub fn malformed(what: impl Into<String>) -> Self {
        Self::Malformed { what: what.into() }
    }
}

/// The phrases that mark a 400/413 body (or an in-stream error) as a context overflow,
/// matched ignoring case (chapter 11, "Provider rejections").
const CONTEXT_PHRASES: [&str; 12] = [
    "context length",
    "context window",
    "context size",
    "context_length_exceeded",
    "maximum context length",
    "prompt is too long",
    "too many tokens",
    "exceeds the available context size",
    "exceed_context_size",
    "input is too long",
    "exceeds the maximum number of tokens",
    "too large for model",
];

/// Phrases that mark a 429 as a spent usage quota rather than a rate limit (OpenAI's
/// `insufficient_quota`, and the wording providers use for spent credit or billing limits).
const QUOTA_PHRASES: [&str; 6] = [
    "insufficient_quota",
    "exceeded your current quota",
    "quota exceeded",
    "usage quota",
    "billing",
    "credit balance",
];

/// Phrases that mark a 5xx body as an overload.
const OVERLOAD_PHRASES: [&str; 3] = ["overload", "over capacity", "at capacity"];

/// Phrases that mark a 400 body as a content-policy refusal.
const POLICY_PHRASES: [&str; 5] = [
    "content_policy",
    "content policy",
    "content_filter",
    "content filter",
    "content management policy",
];

fn contains_any(haystack_lower: &str, phrases: &[&str]) -> bool {
    phrases.iter().any(|p| haystack_lower.contains(p))
}

/// Whether `text` names a context limit, by the spec's phrase list (ignoring case).
pub fn is_context_overflow_text(text: &str) -> bool {
    contains_any(&text.to_lowercase(), &CONTEXT_PHRASES)
}

/// Classify a non-success HTTP reply by its status and body (the body is only searched for
/// phrases; it never reaches the message).
pub fn classify_http_failure(status: u16, body: &str) -> ModelError {
    let lower = body.to_lowercase();
    match status {
        400 | 413 if contains_any(&lower, &CONTEXT_PHRASES) => {
            ModelError::ContextOverflow { status }
        }
        400 if contains_any(&lower, &POLICY_PHRASES) => ModelError::ContentPolicy,
        429 if contains_any(&lower, &QUOTA_PHRASES) => ModelError::QuotaSpent,
        429 => ModelError::RateLimited,
        401 | 403 => ModelError::Credentials { status },
        503 | 529 => ModelError::Overloaded { status },
        500.. if contains_any(&lower, &OVERLOAD_PHRASES) => ModelError::Overloaded { status },
        500.. => ModelError::ServerFault { status },
        _ => ModelError::Rejected { status },
    }
}

/// Classify an error a provider sent inside an already started stream. `status` is the best
/// status the event gives (a numeric code, or one mapped from the error type); the context
/// phrases decide an overflow whatever the status, as chapter 11 requires.
pub(crate) fn classify_stream_error(status: u16, text: &str) -> ModelError {
    if is_context_overflow_text(text) {
        let status = if status == 413 { 413 } else { 400 };
        return ModelError::ContextOverflow { status };
    }
    classify_http_failure(status, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_the_fixed_phrases() {
        let cases: Vec<(ModelError, &str)> = vec![
            (
                ModelError::Transport { detail: "x".into() },
                "the connection to the model backend failed",
            ),
            (
                ModelError::Timeout,
                "the model backend did not answer in time",
            ),
            (
                ModelError::ContextOverflow { status: 413 },
                "the request is larger than the model's context window (status 413)",
            ),
            (
                ModelError::RateLimited,
                "the model backend is limiting the request rate (status 429)",
            ),
            (
                ModelError::QuotaSpent,
                "the model backend says the usage quota is spent (status 429)",
            ),
            (
                ModelError::Overloaded { status: 503 },
                "the model backend is overloaded (status 503)",
            ),
            (
                ModelError::ServerFault { status: 500 },
                "the model backend reported a fault of its own (status 500)",
            ),
            (
                ModelError::Credentials { status: 401 },
                "the model backend did not accept the credentials (status 401)",
            ),
            (
                ModelError::ContentPolicy,
                "the model backend refused the request on content policy grounds (status 400)",
            ),
            (
                ModelError::Rejected { status: 404 },
                "the model backend rejected the request (status 404)",
            ),
            (
                ModelError::malformed("bad json"),
                "the model backend sent a reply that could not be understood: bad json",
            ),
            (
                ModelError::ResponseTooLarge {
                    limit: 16_777_216,
                    kind: OversizeKind::Stream,
                },
                "the model backend sent a reply that could not be understood: response stream exceeds the 16777216-byte limit",
            ),
            (
                ModelError::ResponseTooLarge {
                    limit: 10,
                    kind: OversizeKind::Body,
                },
                "the model backend sent a reply that could not be understood: response body exceeds the 10-byte limit",
            ),
            (
                ModelError::ResponseTooLarge {
                    limit: 10,
                    kind: OversizeKind::BodyOfLength { len: 99 },
                },
                "the model backend sent a reply that could not be understood: response body of 99 bytes exceeds the 10-byte limit",
            ),
            (
                ModelError::Disabled,
                "model access is turned off or not configured",
            ),
        ];
        for (err, text) in cases {
            assert_eq!(err.to_string(), text);
        }
    }

    #[test]
    fn classification_follows_the_table() {
        assert_eq!(
            classify_http_failure(400, r#"{"error":{"code":"context_length_exceeded"}}"#),
            ModelError::ContextOverflow { status: 400 }
        );
        assert_eq!(
            classify_http_failure(413, "Prompt Is Too Long"),
            ModelError::ContextOverflow { status: 413 }
        );
        assert_eq!(
            classify_http_failure(413, "payload too big"),
            ModelError::Rejected { status: 413 }
        );
        assert_eq!(
            classify_http_failure(500, "context length"),
            ModelError::ServerFault { status: 500 }
        );
        assert_eq!(
            classify_http_failure(400, "violates our content policy"),
            ModelError::ContentPolicy
        );
        assert_eq!(
            classify_http_failure(400, "bad"),
            ModelError::Rejected { status: 400 }
        );
        assert_eq!(
            classify_http_failure(429, "slow down"),
            ModelError::RateLimited
        );
        assert_eq!(
            classify_http_failure(429, r#"{"error":{"type":"insufficient_quota"}}"#),
            ModelError::QuotaSpent
        );
        assert_eq!(
            classify_http_failure(401, ""),
            ModelError::Credentials { status: 401 }
        );
        assert_eq!(
            classify_http_failure(403, ""),
            ModelError::Credentials { status: 403 }
        );
        assert_eq!(
            classify_http_failure(503, ""),
            ModelError::Overloaded { status: 503 }
        );
        assert_eq!(
            classify_http_failure(529, ""),
            ModelError::Overloaded { status: 529 }
        );
        assert_eq!(
            classify_http_failure(500, "server is Overloaded"),
            ModelError::Overloaded { status: 500 }
        );
        assert_eq!(
            classify_http_failure(502, "<forged log>"),
            ModelError::ServerFault { status: 502 }
        );
        assert_eq!(
            classify_http_failure(404, ""),
            ModelError::Rejected { status: 404 }
        );
        assert_eq!(
            classify_stream_error(500, "prompt is too long"),
            ModelError::ContextOverflow { status: 400 }
        );
    }

    #[test]
    fn retryable_matches_the_transient_list() {
        assert!(ModelError::Timeout.retryable());
        assert!(ModelError::RateLimited.retryable());
        assert!(!ModelError::QuotaSpent.retryable());
        assert!(ModelError::Overloaded { status: 529 }.retryable());
        assert!(ModelError::ServerFault { status: 500 }.retryable());
        assert!(!ModelError::ContextOverflow { status: 400 }.retryable());
        assert!(!ModelError::Credentials { status: 401 }.retryable());
        assert!(!ModelError::Rejected { status: 404 }.retryable());
        assert!(!ModelError::ContentPolicy.retryable());
        assert!(!ModelError::Disabled.retryable());
        assert!(ModelError::malformed("x").retryable());
        assert!(
            ModelError::ResponseTooLarge {
                limit: 1,
                kind: OversizeKind::Stream
            }
            .retryable()
        );
    }
}

//! HTTP plumbing shared by the providers: sending a request under the receive timeout,
//! reading a streamed reply under the per-chunk timeout and the response cap, reading and
//! classifying error replies, and decoding server-sent events.
//!
//! reqwest has no per-chunk timeout (its `timeout` bounds the whole request, which would cut
//! off long replies that keep streaming), so the wait for the headers and for each next chunk
//! is a `tokio::time::timeout` of our own. The cap counts raw body bytes as they arrive, before
//! any decoding. SSE framing is our own linear-time parser (`sse.rs`: CRLF and CR line ends,
//! events split across chunks, multi-line `data:`, comments, a leading BOM).

use std::future::Future;
use std::pin::Pin;

use super::sse::{self, Event};
use futures_util::stream::{self, Stream, StreamExt};
use reqwest::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderValue, USER_AGENT};
use tokio::time::timeout;

use super::error::{ModelError, OversizeKind, classify_http_failure};
use super::provider::{ModelLimits, ReplyObserver};
use super::types::Reply;

/// A boxed stream of decoded SSE events, failures already classified.
pub(crate) type EventStream = Pin<Box<dyn Stream<Item = Result<Event, ModelError>> + Send>>;

/// Build the HTTP client the providers share: rustls, no whole-request timeout (the receive
/// timeout is ours), and a PromptForge user agent.
pub(crate) fn build_client() -> Result<reqwest::Client, ModelError> {
    let mut headers = HeaderMap::new();
    headers.insert(
        USER_AGENT,
        HeaderValue::from_static(concat!("promptforge/", env!("CARGO_PKG_VERSION"))),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        // A model endpoint's redirect is never followed: a 307 would re-send the whole
        // conversation (and its key) to another origin, and a 302 would turn into a GET.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| ModelError::Transport {
            detail: format!("could not set up the HTTP client: {}", error_chain(&e)),
        })
}

/// An error and its sources, joined with `: `.
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

fn transport(err: &reqwest::Error, url: &str, hint: &str) -> ModelError {
    if err.is_timeout() {
        return ModelError::Timeout;
    }
    let mut detail = format!("POST {url}: {}", error_chain(err));
    if !hint.is_empty() {
        detail.push_str(" (");
        detail.push_str(hint);
        detail.push(')');
    }
    ModelError::Transport { detail }
}

/// An API key as a header value (`text` is the whole value, such as `Bearer KEY`).
pub(crate) fn key_header(text: &str) -> Result<HeaderValue, ModelError> {
    HeaderValue::from_str(text).map_err(|_| ModelError::Transport {
        detail: "the API key holds characters an HTTP header cannot carry".into(),
    })
}

/// Where a provider sends its rounds, and what every provider does with one: the HTTP client,
/// the URL, the limits, and the hint a transport failure ends with.
#[derive(Debug)]
pub(crate) struct Endpoint {
    pub(crate) client: reqwest::Client,
    pub(crate) url: String,
    /// `url` parsed once (a round would otherwise parse it again for every POST); `None`
    /// when it does not parse, which the POST then reports.
    parsed: Option<reqwest::Url>,
    pub(crate) limits: ModelLimits,
    pub(crate) hint: String,
}

impl Endpoint {
    /// An endpoint at `url` with a fresh client and no hint.
    pub(crate) fn new(url: String, limits: ModelLimits) -> Result<Endpoint, ModelError> {
        Ok(Endpoint {
            client: build_client()?,
            parsed: reqwest::Url::parse(&url).ok(),
            url,
            limits,
            hint: String::new(),
        })
    }

    /// One streamed round: the POST of `body` with `headers` (retries and the receive
    /// timeout in [`Endpoint::post`]), then the provider's `read` over its events, the
    /// whole under the round's deadline.
    pub(crate) async fn round<'a, F>(
        &self,
        headers: HeaderMap,
        body: bytes::Bytes,
        whole: WholeReply,
        observer: &'a dyn ReplyObserver,
        read: impl FnOnce(EventStream, &'a dyn ReplyObserver) -> F,
    ) -> Result<Reply, ModelError>
    where
        F: Future<Output = Result<Reply, ModelError>>,
    {
        let round = async {
            let events = self.post(headers, body, whole, observer).await?;
            read(events, observer).await
        };
        tokio::time::timeout(self.limits.round_timeout, round)
            .await
            .unwrap_or(Err(ModelError::Timeout))
    }
}

impl Endpoint {
    /// POST `body` (JSON, encoded by the provider) to the endpoint and return the reply as a stream of
    /// SSE events.
    ///
    /// Waits at most `limits.receive_timeout` for the headers. A non-success status is read
    /// (capped, under the same timeout) and classified; a success reply becomes an event
    /// stream whose every chunk is awaited under the timeout and counted against the cap. The
    /// hint is appended to transport failure details (what to check or set when the endpoint
    /// is down).
    async fn post(
        &self,
        headers: HeaderMap,
        body: bytes::Bytes,
        whole: WholeReply,
        observer: &dyn ReplyObserver,
    ) -> Result<EventStream, ModelError> {
        let (client, url, limits, hint) = (
            &self.client,
            self.url.as_str(),
            self.limits,
            self.hint.as_str(),
        );
        // A retry resends the same bytes without copying them.
        let mut attempt = 0;
        let response = loop {
            let request = match &self.parsed {
                Some(parsed) => client.post(parsed.clone()),
                None => client.post(url),
            };
            let request = request
                .headers(headers.clone())
                .header(CONTENT_TYPE, "application/json")
                .header(ACCEPT, "text/event-stream")
                .body(body.clone());
            // Logs name the URL, the status and the timing, never a header or the body: keys
            // and prompt text stay out of them.
            let sent = std::time::Instant::now();
            tracing::info!(target: "promptforge::model", url, attempt, bytes = body.len(), "POST");
            let response = match timeout(limits.receive_timeout, request.send()).await {
                Err(_elapsed) => {
                    tracing::warn!(target: "promptforge::model", url, elapsed_ms = sent.elapsed().as_millis() as u64, "no reply headers within the receive timeout");
                    return Err(ModelError::Timeout);
                }
                Ok(Err(err)) => {
                    let err = transport(&err, url, hint);
                    if let ModelError::Transport { detail } = &err {
                        tracing::warn!(target: "promptforge::model", url, detail, "connection failed");
                    }
                    return Err(err);
                }
                Ok(Ok(response)) => response,
            };
            let status = response.status().as_u16();
            tracing::info!(target: "promptforge::model", url, status, version = ?response.version(), headers_ms = sent.elapsed().as_millis() as u64, "reply headers");
            if (status == 429 || status >= 500) && attempt < limits.retries {
                let retry_after = retry_after(&response);
                let err = read_error_reply(response, limits, url, hint, observer).await;
                // Only a rate limit or a server's own fault is worth sending again; an error
                // reply too large to read is not.
                if !matches!(
                    err,
                    ModelError::RateLimited
                        | ModelError::Overloaded { .. }
                        | ModelError::ServerFault { .. }
                ) {
                    return Err(err);
                }
                attempt += 1;
                let wait = retry_after.unwrap_or(BACKOFF_START * 2u32.saturating_pow(attempt - 1));
                tracing::warn!(target: "promptforge::model", url, status, attempt, wait_ms = wait.as_millis() as u64, reason = %err, "retrying");
                observer.retry(attempt, wait, &err);
                tokio::time::sleep(wait).await;
                continue;
            }
            break response;
        };
        let status = response.status();
        if status.is_redirection() {
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("(no Location header)");
            return Err(ModelError::Transport {
                detail: format!(
                    "POST {url} answered {} redirecting to {location}; model requests never follow redirects: set the model's base_url to the address that answers",
                    status.as_u16()
                ),
            });
        }
        if !status.is_success() {
            return Err(read_error_reply(response, limits, url, hint, observer).await);
        }
        if let Some(kind) = response.headers().get(CONTENT_TYPE)
            && let Ok(kind) = kind.to_str()
            && kind
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        {
            // A server that ignores `stream: true` (some gateways do) answers with the whole
            // reply as one JSON document: read it under the same limits and replay it as the
            // events the provider's stream reader expects.
            let body = read_body(response, limits, url, hint).await?;
            let value: serde_json::Value = serde_json::from_slice(&body)
                .map_err(|_| ModelError::malformed("the reply is not valid JSON"))?;
            let events: Vec<Result<Event, ModelError>> =
                whole(&value)?.into_iter().map(Ok).collect();
            return Ok(Box::pin(stream::iter(events)));
        }
        let url = url.to_owned();
        let hint = hint.to_owned();
        let bytes = limited_chunks(
            Box::pin(response.bytes_stream()),
            limits,
            OversizeKind::Stream,
            move |e| transport(&e, &url, &hint),
        );
        Ok(Box::pin(sse::events(Box::pin(bytes))))
    }
}

/// How long a finished reply's stream is read inline for the end of its body.
const DRAIN_INLINE: std::time::Duration = std::time::Duration::from_millis(50);
/// How long the rest of a finished reply's body may take in the background.
const DRAIN_BACKGROUND: std::time::Duration = std::time::Duration::from_secs(5);
/// The most events read past a reply's last one.
const DRAIN_EVENTS: usize = 64;

/// Read what is left of a finished reply's stream (its last event already seen) so the
/// connection goes back to the pool. hyper reuses a connection only once its body has been
/// read to the end, and a server sends the end of a chunked body after its last event, often
/// in a later packet: dropping the stream at `[DONE]` or `message_stop` closed the connection
/// and the next round paid for a new one. The end usually arrives at once and is read
/// inline; a server that keeps the body open is given a short while in the background and
/// then dropped, so no round waits long for it. Anything read here is ignored.
pub(crate) async fn finish_stream(mut events: EventStream) {
    let drain = async move {
        let mut extra = 0;
        while events.next().await.is_some() {
            extra += 1;
            if extra >= DRAIN_EVENTS {
                break;
            }
        }
    };
    let mut drain = Box::pin(drain);
    if timeout(DRAIN_INLINE, &mut drain).await.is_err()
        && let Ok(runtime) = tokio::runtime::Handle::try_current()
    {
        runtime.spawn(async move {
            let _ = timeout(DRAIN_BACKGROUND, drain).await;
        });
    }
}

/// The first wait between retries; each next one doubles.
const BACKOFF_START: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest `Retry-After` honoured.
const RETRY_AFTER_CAP: std::time::Duration = std::time::Duration::from_secs(60);

/// A `Retry-After` header in seconds (the HTTP-date form is not used by model APIs), capped.
fn retry_after(response: &reqwest::Response) -> Option<std::time::Duration> {
    let seconds: f64 = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (seconds.is_finite() && seconds >= 0.0)
        .then(|| std::time::Duration::from_secs_f64(seconds).min(RETRY_AFTER_CAP))
}

/// Turns a whole (non-streamed) reply document into the events its stream would have held.
pub(crate) type WholeReply = fn(&serde_json::Value) -> Result<Vec<Event>, ModelError>;

/// Read a whole body under the receive timeout and the response cap.
async fn read_body(
    response: reqwest::Response,
    limits: ModelLimits,
    url: &str,
    hint: &str,
) -> Result<Vec<u8>, ModelError> {
    let url = url.to_owned();
    let hint = hint.to_owned();
    let mut chunks = Box::pin(limited_chunks(
        Box::pin(response.bytes_stream()),
        limits,
        OversizeKind::Body,
        move |e| transport(&e, &url, &hint),
    ));
    let mut body = Vec::new();
    while let Some(chunk) = chunks.next().await {
        body.extend_from_slice(&chunk?);
    }
    Ok(body)
}

/// A body stream with the per-chunk receive timeout and the response cap applied. The
/// stream ends after its first error.
fn limited_chunks<S, B, F>(
    body: Pin<Box<S>>,
    limits: ModelLimits,
    oversize: OversizeKind,
    on_error: F,
) -> impl Stream<Item = Result<B, ModelError>> + Send + use<S, B, F>
where
    S: Stream<Item = Result<B, reqwest::Error>> + Send,
    B: AsRef<[u8]> + Send,
    F: Fn(reqwest::Error) -> ModelError + Send + Sync,
{
    let on_error = std::sync::Arc::new(on_error);
    stream::unfold(Some((body, 0u64)), move |state| {
        let on_error = std::sync::Arc::clone(&on_error);
        async move {
            let (mut body, seen) = state?;
            match timeout(limits.receive_timeout, body.next()).await {
                Err(_elapsed) => Some((Err(ModelError::Timeout), None)),
                Ok(None) => None,
                Ok(Some(Err(err))) => Some((Err(on_error(err)), None)),
                Ok(Some(Ok(chunk))) => {
                    let seen = seen.saturating_add(chunk.as_ref().len() as u64);
                    if seen > limits.response_cap {
                        let err = ModelError::ResponseTooLarge {
                            limit: limits.response_cap,
                            kind: oversize,
                        };
                        Some((Err(err), None))
                    } else {
                        Some((Ok(chunk), Some((body, seen))))
                    }
                }
            }
        }
    })
}

/// Read an error reply (capped, under the receive timeout) and classify it by status and
/// body. An unreadable body is a transport failure; one over the cap is an oversized reply.
async fn read_error_reply(
    response: reqwest::Response,
    limits: ModelLimits,
    url: &str,
    hint: &str,
    observer: &dyn ReplyObserver,
) -> ModelError {
    let status = response.status().as_u16();
    let announced = response
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(len) = announced
        && len > limits.response_cap
    {
        return ModelError::ResponseTooLarge {
            limit: limits.response_cap,
            kind: OversizeKind::BodyOfLength { len },
        };
    }
    let body = match read_body(response, limits, url, hint).await {
        Ok(body) => body,
        Err(ModelError::Transport { mut detail }) => {
            detail.push_str("; the error reply's body could not be read");
            return ModelError::Transport { detail };
        }
        Err(err) => return err,
    };
    let text = String::from_utf8_lossy(&body);
    if let Some(message) = provider_message(&text) {
        observer.server_message(status, &message);
    }
    classify_http_failure(status, &text)
}

/// The provider's own words in an error reply: `error.message` (OpenAI and Anthropic shapes),
/// or a short plain-text body; one line, control characters dropped, at most 500 characters.
fn provider_message(body: &str) -> Option<String> {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let message = match &parsed {
        Some(value) => value
            .get("error")
            .and_then(|e| e.get("message").or(Some(e)))
            .and_then(|m| m.as_str())
            .or_else(|| value.get("message").and_then(|m| m.as_str()))?
            .to_owned(),
        None => body.trim().to_owned(),
    };
    let line: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(500)
        .collect();
    let line = line.trim().to_owned();
    (!line.is_empty()).then_some(line)
}

/// The error for a request body that cannot be encoded (every provider's).
pub(crate) fn unencodable(e: serde_json::Error) -> ModelError {
    ModelError::malformed(format!("could not encode the request: {e}"))
}

/// Whether a URL's host is this machine (`localhost` or a loopback address): a key may
/// travel to it in cleartext, and an OAuth server beside it may be private.
pub fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for url in [
            "http://127.0.0.1:1/v1",
            "http://localhost/v1",
            "http://[::1]:8/",
        ] {
            assert!(is_loopback(&url::Url::parse(url).unwrap()), "{url}");
        }
        assert!(!is_loopback(
            &url::Url::parse("https://api.openai.com/v1").unwrap()
        ));
    }
}

//! HTTP plumbing shared by the providers: sending a request under the receive timeout,
//! reading a streamed reply under the per-chunk timeout and the response cap, reading and
//! classifying error replies, and decoding server-sent events.
//!
//! A round goes out on hyper's pooled client directly, unless a proxy applies to its URL
//! (`HTTPS_PROXY` and its kin), when reqwest carries it, proxy and all. reqwest puts every
//! request through layers a model round has no use for (its redirect layer alone prints the
//! URL and parses it again, twice a request though redirects are off), about a tenth of a
//! round's instructions against a fast server; what it adds for proxies is kept where it is
//! needed. Both answer the same [`Received`], so everything after the headers is one path.
//!
//! Neither client has a per-chunk timeout (reqwest's `timeout` bounds the whole request, which
//! would cut off long replies that keep streaming), so the wait for the headers and for each
//! next chunk is a `tokio::time::timeout` of our own. The cap counts raw body bytes as they
//! arrive, before any decoding. SSE framing is our own linear-time parser (`sse.rs`: CRLF and CR line ends,
//! events split across chunks, multi-line `data:`, comments, a leading BOM).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use super::sse::{self, Event};
use bytes::Bytes;
use futures_util::stream::{self, Stream, StreamExt};
use http_body_util::{BodyDataStream, Full};
use hyper_util::client::legacy::Client as PooledClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use reqwest::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderValue, USER_AGENT};
use reqwest::{StatusCode, Version};
use tokio::time::timeout;

use super::error::{ModelError, OversizeKind, classify_http_failure};
use super::provider::{ModelFuture, ModelLimits, ModelProvider, ReplyObserver};
use super::types::{ChatRequest, Reply};

/// A boxed stream of decoded SSE events, failures already classified.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<Event, ModelError>> + Send>>;

/// The `User-Agent` every model request carries.
const AGENT: HeaderValue =
    HeaderValue::from_static(concat!("promptforge/", env!("CARGO_PKG_VERSION")));

/// Build the reqwest client a proxied endpoint uses: rustls, no whole-request timeout (the
/// receive timeout is ours), and a PromptForge user agent.
pub(crate) fn build_client() -> Result<reqwest::Client, ModelError> {
    let mut headers = HeaderMap::new();
    headers.insert(USER_AGENT, AGENT);
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

/// hyper's pooled client over rustls (HTTPS, HTTP/2 where the server offers it) or plain TCP.
type DirectClient = PooledClient<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The TLS settings of the direct client, as reqwest's `rustls-tls` has them: the webpki
/// root certificates and the ring provider; built once a process.
fn tls_config() -> Result<rustls::ClientConfig, ModelError> {
    static CONFIG: OnceLock<Result<rustls::ClientConfig, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            };
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map(|config| config.with_root_certificates(roots).with_no_client_auth())
            .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| ModelError::Transport {
            detail: format!("could not set up the HTTP client: {e}"),
        })
}

/// The direct client: TCP without Nagle's delay (a request is written whole), connections
/// pooled and dropped after 90 idle seconds, as reqwest's defaults have them; redirects are
/// never followed (hyper's client has no such layer).
fn direct_client() -> Result<DirectClient, ModelError> {
    let mut tcp = HttpConnector::new();
    tcp.set_nodelay(true);
    tcp.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls_config()?)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(tcp);
    Ok(PooledClient::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector))
}

/// What carries an endpoint's rounds.
#[derive(Debug)]
enum Transport {
    /// hyper's client (boxed: it is the larger by far), to the URL parsed once.
    Direct {
        client: Box<DirectClient>,
        uri: http::Uri,
    },
    /// reqwest (a proxy applies to the URL, or hyper cannot take it as it is); the URL
    /// parsed once, `None` when it does not parse, which the POST then reports.
    Reqwest {
        client: reqwest::Client,
        parsed: Option<reqwest::Url>,
    },
}

impl Transport {
    /// The direct client when the URL is a plain `http`/`https` one no proxy applies to
    /// (the proxy settings read as reqwest reads them), else reqwest.
    fn for_url(url: &str) -> Result<Transport, ModelError> {
        let direct = url.parse::<http::Uri>().ok().filter(|uri| {
            matches!(uri.scheme_str(), Some("http" | "https"))
                && uri.authority().is_some_and(|a| !a.as_str().contains('@'))
                && hyper_util::client::proxy::matcher::Matcher::from_system()
                    .intercept(uri)
                    .is_none()
        });
        Ok(match direct {
            Some(uri) => Transport::Direct {
                client: Box::new(direct_client()?),
                uri,
            },
            None => Transport::Reqwest {
                client: build_client()?,
                parsed: reqwest::Url::parse(url).ok(),
            },
        })
    }
}

/// What one model API adds to the shared HTTP round: its endpoint's URL, a round's headers
/// and body, and how its reply reads. One implementation per API (`openai.rs`,
/// `anthropic.rs`); [`HttpProvider`] is everything else, once.
pub trait Wire: Send + Sync + 'static {
    /// The provider's name in `Debug` output.
    const NAME: &'static str;
    /// A whole (non-streamed) reply as the events its stream would have held.
    const WHOLE: WholeReply;
    /// The API's settings.
    type Options: std::fmt::Debug + Send + Sync;

    /// The wire's state for these settings.
    fn new(options: Self::Options) -> Self;
    /// The settings it was made with.
    fn options(&self) -> &Self::Options;
    /// The endpoint's URL for the base URL a model entry names.
    fn url(base_url: &str) -> String;
    /// A round's headers, the API key (when given) as this API carries it.
    fn headers(&self, api_key: Option<&str>) -> Result<HeaderMap, ModelError>;
    /// A round's body.
    fn body(&self, request: &ChatRequest) -> Result<Bytes, ModelError>;
    /// The body as JSON (for logs and tests).
    fn request_body(&self, request: &ChatRequest) -> serde_json::Value;
    /// Reads a streamed reply's events into the reply.
    fn read<'a>(
        events: EventStream,
        observer: &'a dyn ReplyObserver,
    ) -> impl Future<Output = Result<Reply, ModelError>> + Send + 'a;
}

/// A model provider over HTTP: an [`Endpoint`], the API key, and the API's [`Wire`].
pub struct HttpProvider<W> {
    endpoint: Endpoint,
    api_key: Option<String>,
    wire: W,
}

impl<W: Wire> std::fmt::Debug for HttpProvider<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs.
        f.debug_struct(W::NAME)
            .field("url", &self.endpoint.url)
            .field("has_api_key", &self.api_key.is_some())
            .field("options", self.wire.options())
            .field("limits", &self.endpoint.limits)
            .finish_non_exhaustive()
    }
}

impl<W: Wire> HttpProvider<W> {
    /// A provider for the API at `base_url` (each API's alias says what part of the URL that
    /// is), sending `api_key` as the API expects when given.
    pub fn new(
        base_url: &str,
        api_key: Option<String>,
        options: W::Options,
        limits: ModelLimits,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            endpoint: Endpoint::new(W::url(base_url), limits)?,
            api_key,
            wire: W::new(options),
        })
    }

    /// What a transport failure's detail should suggest checking (the catalog names the
    /// setting the base URL came from).
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.endpoint.hint = hint.into();
        self
    }

    /// The request body this provider sends for `request` (for logs and tests).
    pub fn request_body(&self, request: &ChatRequest) -> serde_json::Value {
        self.wire.request_body(request)
    }

    /// One round: the API's headers and body, sent through the endpoint.
    async fn run(
        &self,
        request: &ChatRequest,
        observer: &dyn ReplyObserver,
    ) -> Result<Reply, ModelError> {
        let headers = self.wire.headers(self.api_key.as_deref())?;
        let body = self.wire.body(request)?;
        self.endpoint
            .round(headers, body, W::WHOLE, observer, W::read)
            .await
    }
}

impl<W: Wire> ModelProvider for HttpProvider<W> {
    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
        observer: &'a dyn ReplyObserver,
    ) -> ModelFuture<'a> {
        Box::pin(self.run(request, observer))
    }
}

/// A reply's head, and its body as chunks (a failure already described).
struct Received {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    body: ByteStream,
}

/// A reply body's chunks.
type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, ModelError>> + Send>>;

impl Received {
    /// A reply's head and body as either client gives them, a failure reading the body
    /// described as a transport failure of `url`.
    fn new<E: std::error::Error + 'static>(
        (status, version, headers): (StatusCode, Version, HeaderMap),
        body: impl Stream<Item = Result<Bytes, E>> + Send + 'static,
        url: &str,
        hint: &str,
    ) -> Received {
        let (url, hint) = (url.to_owned(), hint.to_owned());
        let body = body.map(move |chunk| chunk.map_err(|e| transport(&e, &url, &hint)));
        Received {
            status,
            version,
            headers,
            body: Box::pin(body),
        }
    }
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

/// A failure to send a request or to read its reply, with the URL and the endpoint's hint;
/// one the system timed out (a connect that got no answer) is a timeout, as reqwest counts
/// it (the clients set no timers of their own, so this is the only timeout in the chain).
fn transport(err: &(dyn std::error::Error + 'static), url: &str, hint: &str) -> ModelError {
    let timed_out = std::iter::successors(Some(err), |e| e.source()).any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
    });
    if timed_out {
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
    transport: Transport,
    pub(crate) url: String,
    pub(crate) limits: ModelLimits,
    pub(crate) hint: String,
}

impl Endpoint {
    /// An endpoint at `url` with a fresh client and no hint.
    pub(crate) fn new(url: String, limits: ModelLimits) -> Result<Endpoint, ModelError> {
        Ok(Endpoint {
            transport: Transport::for_url(&url)?,
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
        let (url, limits) = (self.url.as_str(), self.limits);
        // A retry resends the same bytes without copying them.
        let mut attempt = 0;
        let response = loop {
            // Logs name the URL, the status and the timing, never a header or the body: keys
            // and prompt text stay out of them.
            let sent = std::time::Instant::now();
            tracing::info!(target: "promptforge::model", url, attempt, bytes = body.len(), "POST");
            let response = match timeout(limits.receive_timeout, self.send(&headers, &body)).await {
                Err(_elapsed) => {
                    tracing::warn!(target: "promptforge::model", url, elapsed_ms = sent.elapsed().as_millis() as u64, "no reply headers within the receive timeout");
                    return Err(ModelError::Timeout);
                }
                Ok(Err(err)) => {
                    if let ModelError::Transport { detail } = &err {
                        tracing::warn!(target: "promptforge::model", url, detail, "connection failed");
                    }
                    return Err(err);
                }
                Ok(Ok(response)) => response,
            };
            let status = response.status.as_u16();
            tracing::info!(target: "promptforge::model", url, status, version = ?response.version, headers_ms = sent.elapsed().as_millis() as u64, "reply headers");
            if (status == 429 || status >= 500) && attempt < limits.retries {
                let retry_after = retry_after(&response.headers);
                let err = read_error_reply(response, limits, observer).await;
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
        let status = response.status;
        if status.is_redirection() {
            let location = response
                .headers
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
            return Err(read_error_reply(response, limits, observer).await);
        }
        if let Some(kind) = response.headers.get(CONTENT_TYPE)
            && let Ok(kind) = kind.to_str()
            && kind
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        {
            // A server that ignores `stream: true` (some gateways do) answers with the whole
            // reply as one JSON document: read it under the same limits and replay it as the
            // events the provider's stream reader expects.
            let body = read_body(response.body, limits).await?;
            let value: serde_json::Value = serde_json::from_slice(&body)
                .map_err(|_| ModelError::malformed("the reply is not valid JSON"))?;
            let events: Vec<Result<Event, ModelError>> =
                whole(&value)?.into_iter().map(Ok).collect();
            return Ok(Box::pin(stream::iter(events)));
        }
        let bytes = limited_chunks(response.body, limits, OversizeKind::Stream);
        Ok(Box::pin(sse::events(Box::pin(bytes))))
    }

    /// One POST of `body` with `headers`, to the reply's headers.
    async fn send(&self, headers: &HeaderMap, body: &Bytes) -> Result<Received, ModelError> {
        let (url, hint) = (self.url.as_str(), self.hint.as_str());
        match &self.transport {
            Transport::Direct { client, uri } => {
                let mut request = http::Request::new(Full::new(body.clone()));
                *request.method_mut() = http::Method::POST;
                *request.uri_mut() = uri.clone();
                let fields = request.headers_mut();
                fields.clone_from(headers);
                fields.insert(USER_AGENT, AGENT);
                fields.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                fields.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
                let response = client
                    .request(request)
                    .await
                    .map_err(|e| transport(&e, url, hint))?;
                let (head, incoming) = response.into_parts();
                Ok(Received::new(
                    (head.status, head.version, head.headers),
                    BodyDataStream::new(incoming),
                    url,
                    hint,
                ))
            }
            Transport::Reqwest { client, parsed } => {
                let request = match parsed {
                    Some(parsed) => client.post(parsed.clone()),
                    None => client.post(url),
                };
                let response = request
                    .headers(headers.clone())
                    .header(CONTENT_TYPE, "application/json")
                    .header(ACCEPT, "text/event-stream")
                    .body(body.clone())
                    .send()
                    .await
                    .map_err(|e| transport(&e, url, hint))?;
                let head = (
                    response.status(),
                    response.version(),
                    response.headers().clone(),
                );
                Ok(Received::new(head, response.bytes_stream(), url, hint))
            }
        }
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
fn retry_after(headers: &HeaderMap) -> Option<std::time::Duration> {
    let seconds: f64 = headers
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
pub type WholeReply = fn(&serde_json::Value) -> Result<Vec<Event>, ModelError>;

/// Read a whole body under the receive timeout and the response cap.
async fn read_body(body: ByteStream, limits: ModelLimits) -> Result<Vec<u8>, ModelError> {
    let mut chunks = Box::pin(limited_chunks(body, limits, OversizeKind::Body));
    let mut body = Vec::new();
    while let Some(chunk) = chunks.next().await {
        body.extend_from_slice(&chunk?);
    }
    Ok(body)
}

/// A body stream with the per-chunk receive timeout and the response cap applied. The
/// stream ends after its first error.
fn limited_chunks(
    body: ByteStream,
    limits: ModelLimits,
    oversize: OversizeKind,
) -> impl Stream<Item = Result<Bytes, ModelError>> + Send {
    stream::unfold(Some((body, 0u64)), move |state| async move {
        let (mut body, seen) = state?;
        match timeout(limits.receive_timeout, body.next()).await {
            Err(_elapsed) => Some((Err(ModelError::Timeout), None)),
            Ok(None) => None,
            Ok(Some(Err(err))) => Some((Err(err), None)),
            Ok(Some(Ok(chunk))) => {
                let seen = seen.saturating_add(chunk.len() as u64);
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
    })
}

/// Read an error reply (capped, under the receive timeout) and classify it by status and
/// body. An unreadable body is a transport failure; one over the cap is an oversized reply.
async fn read_error_reply(
    response: Received,
    limits: ModelLimits,
    observer: &dyn ReplyObserver,
) -> ModelError {
    let status = response.status.as_u16();
    let announced = response
        .headers
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
    let body = match read_body(response.body, limits).await {
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
    fn urls_hyper_cannot_take_as_they_are_go_to_reqwest() {
        // Credentials in the URL (reqwest turns them into a header), another scheme, a URL
        // that does not parse: each left to reqwest, which sends or reports as before.
        for url in [
            "http://user:secret@127.0.0.1:9/v1",
            "ftp://127.0.0.1/v1",
            "not a url",
        ] {
            let transport = Transport::for_url(url).unwrap();
            assert!(matches!(transport, Transport::Reqwest { .. }), "{url}");
        }
    }

    #[test]
    fn a_timed_out_connection_is_a_timeout() {
        // The system's own timeout somewhere down the chain, as a connect that got no answer
        // reports it; anything else is a transport failure.
        #[derive(Debug)]
        struct Wrapped(std::io::Error);
        impl std::fmt::Display for Wrapped {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("client error (Connect)")
            }
        }
        impl std::error::Error for Wrapped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let timed_out = Wrapped(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(matches!(
            transport(&timed_out, "http://h/v1", ""),
            ModelError::Timeout
        ));
        let refused = Wrapped(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(
            transport(&refused, "http://h/v1", ""),
            ModelError::Transport { .. }
        ));
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_url_and_the_cause() {
        // Port 1 on loopback: nothing listens (the direct client unless a proxy is set).
        let mut endpoint =
            Endpoint::new("http://127.0.0.1:1/v1".into(), ModelLimits::default()).unwrap();
        endpoint.hint = "is the server running?".into();
        let err = match endpoint.send(&HeaderMap::new(), &Bytes::new()).await {
            Err(err) => err,
            Ok(_) => panic!("port 1 answered"),
        };
        let ModelError::Transport { detail } = err else {
            panic!("{err:?}");
        };
        assert!(
            detail.starts_with("POST http://127.0.0.1:1/v1: "),
            "{detail}"
        );
        assert!(detail.ends_with(" (is the server running?)"), "{detail}");
        assert!(detail.to_lowercase().contains("connect"), "{detail}");
    }

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

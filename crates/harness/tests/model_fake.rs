//! A scripted HTTP model server on 127.0.0.1 for the provider tests (included by
//! `model_openai.rs`, `model_anthropic.rs` and `model_catalog.rs` as a module; compiled on its
//! own it holds no tests).
//!
//! Each request is checked by the test's validator (the provider's request schema); a request
//! that breaks it is answered with status 400 and recorded as a violation. A valid request is
//! answered by the next scripted step: a server-sent event stream (pieces of raw text, pauses
//! between them), or an error status with a body.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use futures_util::stream;
use serde_json::Value;

/// Checks one request: headers, body, and the 1-based round number.
pub type Validator = Arc<dyn Fn(&HeaderMap, &Value, usize) -> Result<(), String> + Send + Sync>;

/// One piece of a streamed reply.
#[derive(Debug, Clone)]
pub enum Piece {
    /// Raw bytes of the body, sent as one chunk.
    Raw(String),
    /// Wait before the next piece.
    Pause(Duration),
}

/// How the server answers one round.
#[derive(Debug, Clone)]
pub enum Step {
    /// `200 text/event-stream` with these pieces.
    Sse(Vec<Piece>),
    /// An error status. `chunked` leaves out the content length.
    Status {
        status: u16,
        body: String,
        chunked: bool,
    },
    /// Wait before sending the headers at all.
    Delay(Duration, Box<Step>),
    /// `200 application/json`: a server that ignores `stream: true`.
    Json(Value),
    /// A redirect with this status to this location.
    Redirect(u16, String),
    /// This error status with a `Retry-After` of this many seconds.
    RetryAfter(u16, String),
}

/// A server-sent event with only a data line.
pub fn data(value: &Value) -> String {
    format!("data: {value}\n\n")
}

/// A server-sent event with an event name.
pub fn event(name: &str, value: &Value) -> String {
    format!("event: {name}\ndata: {value}\n\n")
}

/// A stream of whole events, one chunk each.
pub fn sse(events: Vec<String>) -> Step {
    Step::Sse(events.into_iter().map(Piece::Raw).collect())
}

/// An error status with a known length.
pub fn status(status: u16, body: &str) -> Step {
    Step::Status {
        status,
        body: body.to_owned(),
        chunked: false,
    }
}

struct Inner {
    steps: Mutex<VecDeque<Step>>,
    requests: Mutex<Vec<(HeaderMap, Value)>>,
    violations: Mutex<Vec<String>>,
    validator: Validator,
}

/// A running fake server; stops when the test's runtime ends.
pub struct FakeServer {
    /// `http://127.0.0.1:PORT`
    pub origin: String,
    inner: Arc<Inner>,
}

impl std::fmt::Debug for FakeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeServer")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl FakeServer {
    /// Serve `path` on a free loopback port.
    pub async fn start(path: &str, validator: Validator, steps: Vec<Step>) -> Self {
        let inner = Arc::new(Inner {
            steps: Mutex::new(steps.into()),
            requests: Mutex::new(Vec::new()),
            violations: Mutex::new(Vec::new()),
            validator,
        });
        let app = Router::new()
            .route(path, post(handle))
            .with_state(Arc::clone(&inner));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { origin, inner }
    }

    /// Every request body received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.inner
            .requests
            .lock()
            .unwrap()
            .iter()
            .map(|(_, body)| body.clone())
            .collect()
    }

    /// The headers of every request, in order.
    pub fn headers(&self) -> Vec<HeaderMap> {
        self.inner
            .requests
            .lock()
            .unwrap()
            .iter()
            .map(|(headers, _)| headers.clone())
            .collect()
    }

    /// Every schema violation, in order.
    pub fn violations(&self) -> Vec<String> {
        self.inner.violations.lock().unwrap().clone()
    }
}

async fn handle(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: Bytes) -> Response {
    let round = {
        let mut requests = inner.requests.lock().unwrap();
        let parsed = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null);
        requests.push((headers.clone(), parsed));
        requests.len()
    };
    let verdict = match serde_json::from_slice::<Value>(&body) {
        Ok(json) => (inner.validator)(&headers, &json, round),
        Err(e) => Err(format!("body is not JSON: {e}")),
    };
    if let Err(violation) = verdict {
        inner
            .violations
            .lock()
            .unwrap()
            .push(format!("round {round}: {violation}"));
        let body =
            serde_json::json!({"error": {"message": violation, "type": "invalid_request_error"}});
        return Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
    }
    let step = inner.steps.lock().unwrap().pop_front();
    match step {
        Some(step) => respond(step).await,
        None => Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .body(Body::from("the fake server has no step left"))
            .unwrap(),
    }
}

async fn respond(mut step: Step) -> Response {
    while let Step::Delay(wait, inner) = step {
        tokio::time::sleep(wait).await;
        step = *inner;
    }
    match step {
        Step::Sse(pieces) => {
            let body = stream::unfold(pieces.into_iter(), |mut pieces| async move {
                loop {
                    match pieces.next()? {
                        Piece::Pause(wait) => tokio::time::sleep(wait).await,
                        Piece::Raw(text) => {
                            return Some((Ok::<_, Infallible>(Bytes::from(text)), pieces));
                        }
                    }
                }
            });
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(body))
                .unwrap()
        }
        Step::Status {
            status,
            body,
            chunked,
        } => {
            let builder = Response::builder()
                .status(StatusCode::from_u16(status).unwrap())
                .header("content-type", "application/json");
            if chunked {
                let chunks: Vec<Result<Bytes, Infallible>> = body
                    .as_bytes()
                    .chunks(100)
                    .map(|c| Ok(Bytes::copy_from_slice(c)))
                    .collect();
                builder
                    .body(Body::from_stream(stream::iter(chunks)))
                    .unwrap()
            } else {
                builder.body(Body::from(body)).unwrap()
            }
        }
        Step::Json(value) => Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(Body::from(value.to_string()))
            .unwrap(),
        Step::Redirect(status, location) => Response::builder()
            .status(StatusCode::from_u16(status).unwrap())
            .header("location", location)
            .body(Body::from("moved"))
            .unwrap(),
        Step::RetryAfter(status, seconds) => Response::builder()
            .status(StatusCode::from_u16(status).unwrap())
            .header("retry-after", seconds)
            .header("content-type", "application/json")
            .body(Body::from(r#"{"error": {"message": "slow down"}}"#))
            .unwrap(),
        Step::Delay(..) => unreachable!("delays are unwrapped above"),
    }
}

/// Keys of an object, checked against an allowed set.
pub fn only_keys(value: &Value, allowed: &[&str], at: &str) -> Result<(), String> {
    let Some(object) = value.as_object() else {
        return Err(format!("{at} must be an object"));
    };
    for key in object.keys() {
        if !allowed.contains(&key.as_str()) {
            return Err(format!("{at} has unexpected key `{key}`"));
        }
    }
    Ok(())
}

/// A required string field.
pub fn string<'v>(value: &'v Value, key: &str, at: &str) -> Result<&'v str, String> {
    value
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{at}.{key} must be a string"))
}

/// A bare HTTP/1.1 keep-alive server that answers every request on a connection with the
/// same chunked event stream, sending the end of the body a moment after the last event (as
/// servers often do, in a later packet), and counts the connections it accepts.
#[derive(Debug)]
pub struct KeepAliveServer {
    /// `http://127.0.0.1:PORT`
    pub origin: String,
    connections: Arc<std::sync::atomic::AtomicUsize>,
    requests: Arc<std::sync::atomic::AtomicUsize>,
}

impl KeepAliveServer {
    /// Serve `body` (the whole event stream) to every request.
    pub async fn start(body: String) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let (conns, reqs) = (Arc::clone(&connections), Arc::clone(&requests));
        let body: Arc<str> = body.into();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                conns.fetch_add(1, Ordering::SeqCst);
                let (reqs, body) = (Arc::clone(&reqs), Arc::clone(&body));
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    loop {
                        // Read one request: headers, then a body of Content-Length bytes.
                        let head_end = loop {
                            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                                break at + 4;
                            }
                            let mut chunk = [0u8; 4096];
                            match socket.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        while buffer.len() < head_end + length {
                            let mut chunk = [0u8; 4096];
                            match socket.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buffer.drain(..head_end + length);
                        reqs.fetch_add(1, Ordering::SeqCst);
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n",
                            body.len()
                        );
                        if socket.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        if socket.write_all(b"0\r\n\r\n").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        KeepAliveServer {
            origin,
            connections,
            requests,
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Requests answered so far.
    pub fn requests(&self) -> usize {
        self.requests.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Make `rounds` rounds of `request` with `provider` against `server`, each answered with
/// `text`, and check that they shared a connection: each round read its body to the end, so
/// the pool handed the next round the same connection (a provider that drops the body at its
/// last event opens one per round). One spare is allowed for a machine slow enough to miss
/// the inline read.
pub async fn assert_rounds_share_a_connection(
    server: &KeepAliveServer,
    provider: &dyn promptforge_harness::model::ModelProvider,
    request: &promptforge_harness::model::ChatRequest,
    text: &str,
) {
    let rounds = 6;
    for _ in 0..rounds {
        assert_eq!(provider.complete(request).await.unwrap().text, text);
    }
    assert_eq!(server.requests(), rounds);
    assert!(
        server.connections() <= 2,
        "{} connections",
        server.connections()
    );
}

//! Shared by the binary's integration tests: a local HTTP server on a thread of its own, and
//! the `promptforge` command set up to reach it with nothing in between.

// Each test file uses the part it needs.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

/// An axum app served on 127.0.0.1 by a runtime on its own thread, until dropped (dropping
/// the runtime ends every handler still waiting).
#[derive(Debug)]
pub struct LocalServer {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl LocalServer {
    /// Serve `app` on a free port of 127.0.0.1, its handlers able to read the client's
    /// address (`ConnectInfo<SocketAddr>`: one port per connection).
    pub fn start_with_peers(app: axum::Router) -> LocalServer {
        Self::serve(move |listener| {
            Box::pin(async move {
                let _ = axum::serve(
                    listener,
                    app.into_make_service_with_connect_info::<SocketAddr>(),
                )
                .await;
            })
        })
    }

    /// Serve one OpenAI-shaped chat endpoint (`POST /v1/chat/completions`), its handler
    /// reading `state` (what the test counts or scripts).
    pub fn chat<H, T, S>(handler: H, state: S) -> LocalServer
    where
        H: axum::handler::Handler<T, S>,
        T: 'static,
        S: Clone + Send + Sync + 'static,
    {
        Self::start(
            axum::Router::new()
                .route("/v1/chat/completions", axum::routing::post(handler))
                .with_state(state),
        )
    }

    /// Serve `app` on a free port of 127.0.0.1.
    pub fn start(app: axum::Router) -> LocalServer {
        Self::serve(move |listener| {
            Box::pin(async move {
                let _ = axum::serve(listener, app).await;
            })
        })
    }

    fn serve(
        run: impl FnOnce(
            tokio::net::TcpListener,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + 'static,
    ) -> LocalServer {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                tokio::spawn(run(listener));
                let _ = stop_rx.await;
            });
        });
        let addr = addr_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        LocalServer {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `promptforge` run in `dir`: only the project config there counts (the user config is
/// `dir/xdg`) and the run history `dir/history.sqlite3`, no proxy sits between it and 127.0.0.1, and stdin is closed.
pub fn promptforge(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_promptforge"));
    command
        .current_dir(dir)
        .env("XDG_CONFIG_HOME", dir.join("xdg"))
        .env("PROMPTFORGE_HISTORY", dir.join("history.sqlite3"))
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy")
        .stdin(Stdio::null());
    command
}

/// The content of the last message of an OpenAI chat request body ("" when there is none).
pub fn last_said(body: &[u8]) -> String {
    let request: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_owned()
}

/// An OpenAI streaming reply: one chunk of `text`, then the end (reporting `usage`, prompt
/// and completion tokens, when given).
pub fn sse_text(text: &str, usage: Option<(u64, u64)>) -> axum::response::Response {
    use serde_json::json;
    let content = json!({"choices": [{"index": 0, "delta": {"content": text}}]});
    let mut end = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
    if let Some((prompt, completion)) = usage {
        end["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion});
    }
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .body(axum::body::Body::from(format!(
            "data: {content}\n\ndata: {end}\n\ndata: [DONE]\n\n"
        )))
        .unwrap()
}

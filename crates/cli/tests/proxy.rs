//! Model rounds and proxies, through the real binary: an endpoint a proxy applies to
//! (`HTTP_PROXY`) is reached through the proxy, in the absolute form a proxy reads; one that
//! `NO_PROXY` names is reached directly, with the proxy never asked.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::Uri;
use axum::response::Response;
use serde_json::Value;
use support::{LocalServer, promptforge};

const PROMPT: &str = "---\nname: ask\ndescription: d\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Ask\n\n## Ask\n\n```lua\nmodels.default('w')\nreturn models.infer('where')\n```\n";

/// Answers as the model, `{name}: {last user message}`, and keeps each request's target as
/// it arrived.
async fn chat(
    State((name, seen)): State<(&'static str, Arc<Mutex<Vec<String>>>)>,
    uri: Uri,
    body: Bytes,
) -> Response {
    seen.lock().unwrap().push(uri.to_string());
    support::sse_text(&format!("{name}: {}", support::last_said(&body)), None)
}

fn server(name: &'static str) -> (LocalServer, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    (LocalServer::chat(chat, (name, seen.clone())), seen)
}

fn run(dir: &Path, base_url: &str, proxy: &str, no_proxy: &str) -> Value {
    std::fs::write(dir.join("p.md"), PROMPT).unwrap();
    let output = promptforge(dir)
        .args(["run", "p.md", "--model", "openai:m", "--json"])
        .env("OPENAI_BASE_URL", base_url)
        .env("OPENAI_API_KEY", "k")
        .env("HTTP_PROXY", proxy)
        .env("NO_PROXY", no_proxy)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|_| panic!("{stdout} {}", String::from_utf8_lossy(&output.stderr)))
}

#[test]
fn a_proxied_endpoint_is_reached_through_the_proxy() {
    let (proxy, seen) = server("proxy");
    let dir = tempfile::tempdir().unwrap();
    // The endpoint's own host cannot resolve (`.invalid`): only the proxy can answer.
    let report = run(dir.path(), "http://model.invalid/v1", &proxy.base(), "");
    assert_eq!(report["outcome"], "completed", "{report}");
    assert_eq!(report["result"], "proxy: where", "{report}");
    assert_eq!(
        *seen.lock().unwrap(),
        ["http://model.invalid/v1/chat/completions"]
    );
}

#[test]
fn an_endpoint_no_proxy_names_is_reached_directly() {
    let (proxy, proxied) = server("proxy");
    let (model, direct) = server("model");
    let dir = tempfile::tempdir().unwrap();
    let report = run(
        dir.path(),
        &format!("{}/v1", model.base()),
        &proxy.base(),
        "127.0.0.1",
    );
    assert_eq!(report["result"], "model: where", "{report}");
    assert_eq!(*direct.lock().unwrap(), ["/v1/chat/completions"]);
    assert!(proxied.lock().unwrap().is_empty());
}

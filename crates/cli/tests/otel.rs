//! OpenTelemetry export through the real binary, against a local OTLP/HTTP receiver: a run
//! span, a span per task and per section, and a GenAI inference span per model round with the
//! model, the usage and the finish reason; prompt and reply content only with the opt-in.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use serde_json::{Value, json};
use support::{LocalServer, promptforge};

type Seen = Arc<Mutex<Vec<Value>>>;

async fn traces(State(seen): State<Seen>, body: Bytes) -> &'static str {
    seen.lock()
        .unwrap()
        .push(serde_json::from_slice(&body).unwrap());
    "{}"
}

async fn chat(body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or_default();
    let said = request["messages"][0]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    let content = json!({"choices": [{"index": 0, "delta": {"content": format!("re: {said}")}}]});
    let end = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 11, "completion_tokens": 4}});
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from(format!(
            "data: {content}\n\ndata: {end}\n\ndata: [DONE]\n\n"
        )))
        .unwrap()
}

const PROMPT: &str = "---\nname: pair\ndescription: Two arms, a round each\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Pair\n\n```lua\nmodels.default('w')\n```\n\n## Both\n\n```lua\nlocal r = fanout('### Ask', {'tides', 'moons'})\nreturn r[1].text .. ' | ' .. r[2].text\n```\n\n### Ask\n\n```lua\nreturn models.infer('about ' .. item)\n```\n";

fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

fn run(content: bool) -> Vec<Value> {
    let seen: Seen = Arc::default();
    let collector = LocalServer::start(
        Router::new()
            .route("/v1/traces", post(traces))
            .with_state(seen.clone()),
    );
    let model = LocalServer::chat(chat, ());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pair.md"), PROMPT).unwrap();
    let mut cmd = promptforge(dir.path());
    cmd.args(["run", "pair.md", "--model", "openai:small-model"])
        .env("OPENAI_BASE_URL", format!("{}/v1", model.base()))
        .env("OPENAI_API_KEY", "k")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.base());
    if content {
        cmd.env("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true");
    }
    let output = cmd.output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "re: about tides | re: about moons\n",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let bodies = seen.lock().unwrap().clone();
    assert_eq!(bodies.len(), 1, "one export per run");
    let resource = &bodies[0]["resourceSpans"][0];
    assert_eq!(
        attr(&resource["resource"], "service.name").unwrap()["stringValue"],
        "promptforge"
    );
    resource["scopeSpans"][0]["spans"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn a_run_exports_genai_spans_to_an_otlp_receiver() {
    let spans = run(false);
    let named = |prefix: &str| -> Vec<&Value> {
        spans
            .iter()
            .filter(|s| s["name"].as_str().unwrap().starts_with(prefix))
            .collect()
    };
    let root = named("run ");
    assert_eq!(root.len(), 1);
    let root = root[0];
    assert_eq!(root["name"], "run pair");
    assert_eq!(root["parentSpanId"], "");
    assert_eq!(root["status"]["code"], 1);
    let trace = root["traceId"].as_str().unwrap();
    assert_eq!(trace.len(), 32);
    assert!(spans.iter().all(|s| s["traceId"] == trace));
    let tasks = named("task ");
    assert_eq!(tasks.len(), 2, "one span per fanout arm");
    let sections = named("section ");
    assert_eq!(sections.len(), 3, "Both, and Ask in each arm");
    let chats = named("chat ");
    assert_eq!(chats.len(), 2);
    let ids: Vec<&str> = spans
        .iter()
        .map(|s| s["spanId"].as_str().unwrap())
        .collect();
    for chat in &chats {
        assert_eq!(chat["name"], "chat small-model");
        assert_eq!(chat["kind"], 3, "client spans");
        assert_eq!(
            attr(chat, "gen_ai.operation.name").unwrap()["stringValue"],
            "chat"
        );
        assert_eq!(
            attr(chat, "gen_ai.provider.name").unwrap()["stringValue"],
            "openai"
        );
        assert_eq!(
            attr(chat, "gen_ai.request.model").unwrap()["stringValue"],
            "small-model"
        );
        assert_eq!(
            attr(chat, "gen_ai.usage.input_tokens").unwrap()["intValue"],
            "11"
        );
        assert_eq!(
            attr(chat, "gen_ai.usage.output_tokens").unwrap()["intValue"],
            "4"
        );
        assert_eq!(
            attr(chat, "gen_ai.response.finish_reasons").unwrap()["arrayValue"]["values"][0]["stringValue"],
            "stop"
        );
        assert!(
            attr(chat, "gen_ai.input.messages").is_none(),
            "no content without opt-in"
        );
        // A round's parent is the arm's section span, whose parent is the arm's task span.
        let parent = spans
            .iter()
            .find(|s| s["spanId"] == chat["parentSpanId"])
            .unwrap();
        assert_eq!(parent["name"], "section Ask");
        let task = spans
            .iter()
            .find(|s| s["spanId"] == parent["parentSpanId"])
            .unwrap();
        assert!(
            task["name"].as_str().unwrap().starts_with("task 0."),
            "{task}"
        );
        let start: u128 = chat["startTimeUnixNano"].as_str().unwrap().parse().unwrap();
        let end: u128 = chat["endTimeUnixNano"].as_str().unwrap().parse().unwrap();
        assert!(end >= start && start > 1_700_000_000_000_000_000);
    }
    assert!(spans.iter().all(|s| {
        let parent = s["parentSpanId"].as_str().unwrap();
        parent.is_empty() || ids.contains(&parent)
    }));
}

#[test]
fn content_is_exported_only_with_the_opt_in() {
    let spans = run(true);
    let chat = spans
        .iter()
        .find(|s| s["name"] == "chat small-model")
        .unwrap();
    let input = attr(chat, "gen_ai.input.messages").unwrap()["stringValue"]
        .as_str()
        .unwrap();
    assert!(input.contains("about "), "{input}");
    let output = attr(chat, "gen_ai.output.messages").unwrap()["stringValue"]
        .as_str()
        .unwrap();
    assert!(output.contains("re: about "), "{output}");
}

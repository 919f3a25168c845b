//! OpenTelemetry: with `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) set, each run
//! is exported as spans over OTLP/HTTP (JSON encoding) when it ends.
//!
//! The spans follow the GenAI semantic conventions: a run span; a span per task (fanout arm
//! or `tasks.spawn`) under it; a span per section entry under its task; and an inference span
//! per model round, named `chat {model}`, with `gen_ai.operation.name`, `gen_ai.provider.name`,
//! `gen_ai.request.model`, the usage (`gen_ai.usage.input_tokens` / `output_tokens`) and
//! `gen_ai.response.finish_reasons`. Prompt and reply content (`gen_ai.input.messages`,
//! `gen_ai.output.messages`) is only sent when `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`
//! is `true`. The spans are built from the run's record after it ends, so exporting never
//! slows a run down and a collector that is down costs one warning, never the run.
//!
//! OTLP's own HTTP exporter crates would pull in a second HTTP stack and a protobuf
//! toolchain for what is one JSON document per run, so the document is written here.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value as Json, json};

/// Where to send spans, from the standard variables; `None` when tracing is off.
pub(crate) fn endpoint() -> Option<String> {
    let get = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if let Some(url) = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return Some(url);
    }
    get("OTEL_EXPORTER_OTLP_ENDPOINT")
        .map(|base| format!("{}/v1/traces", base.trim_end_matches('/')))
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `key=value` pairs, comma-separated.
fn headers() -> Vec<(String, String)> {
    std::env::var("OTEL_EXPORTER_OTLP_HEADERS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((k.trim().to_owned(), v.trim().to_owned()))
        })
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

fn capture_content() -> bool {
    std::env::var("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
        .is_ok_and(|v| v.eq_ignore_ascii_case("true"))
}

/// What the exporter knows about the run beyond its record.
#[derive(Debug, Clone)]
pub(crate) struct RunInfo {
    /// The prompt's `name:`.
    pub name: String,
    /// The provider kind of the current model (`openai`, `anthropic`, ...), if any.
    pub provider: Option<String>,
    /// The model name sent on the wire, if any.
    pub model: Option<String>,
    /// When the run started, by the wall clock.
    pub started: SystemTime,
    /// The current model's catalog price, for the history's cost column.
    pub price: Option<promptforge_harness::model::Price>,
}

fn random_hex(bytes: usize) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    while out.len() < bytes * 2 {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_usize(out.len());
        out.push_str(&format!("{:016x}", hasher.finish()));
    }
    out.truncate(bytes * 2);
    out
}

fn string_attr(key: &str, value: &str) -> Json {
    json!({"key": key, "value": {"stringValue": value}})
}

fn int_attr(key: &str, value: u64) -> Json {
    json!({"key": key, "value": {"intValue": value.to_string()}})
}

#[derive(Debug)]
struct Span {
    id: String,
    parent: Option<String>,
    name: String,
    kind: u8,
    start_ms: u64,
    end_ms: Option<u64>,
    attributes: Vec<Json>,
    error: Option<String>,
}

/// The spans of a run, from its record.
pub(crate) fn spans(record: &[u8], info: &RunInfo, content: bool) -> Json {
    let mut spans: Vec<Span> = Vec::new();
    let run_id = random_hex(8);
    let mut last_t = 0u64;
    let mut task_span: BTreeMap<String, usize> = BTreeMap::new();
    let mut section_span: BTreeMap<String, usize> = BTreeMap::new();
    let mut rounds: BTreeMap<u64, usize> = BTreeMap::new();
    let mut outcome = Json::Null;
    spans.push(Span {
        id: run_id.clone(),
        parent: None,
        name: format!("run {}", info.name),
        kind: 1,
        start_ms: 0,
        end_ms: None,
        attributes: vec![string_attr("promptforge.prompt", &info.name)],
        error: None,
    });
    let parent_of = |spans: &Vec<Span>,
                     task: &str,
                     task_span: &BTreeMap<String, usize>,
                     section_span: &BTreeMap<String, usize>| {
        section_span
            .get(task)
            .or_else(|| task_span.get(task))
            .map(|&i| spans[i].id.clone())
            .unwrap_or_else(|| run_id.clone())
    };
    for line in record.split(|b| *b == b'\n').skip(1) {
        let Ok(value) = serde_json::from_slice::<Json>(line) else {
            continue;
        };
        let t = value["t"].as_u64().unwrap_or(last_t);
        last_t = last_t.max(t);
        if let Some(event) = value.get("event") {
            let task = event["task"].as_str().unwrap_or("0").to_owned();
            match event["event"].as_str().unwrap_or("") {
                "task_started" => {
                    let parent = parent_of(&spans, "0", &task_span, &section_span);
                    task_span.insert(task.clone(), spans.len());
                    spans.push(Span {
                        id: random_hex(8),
                        parent: Some(parent),
                        name: format!("task {task}"),
                        kind: 1,
                        start_ms: t,
                        end_ms: None,
                        attributes: vec![string_attr("promptforge.task", &task)],
                        error: None,
                    });
                }
                "task_ended" => {
                    if let Some(&at) = task_span.get(&task) {
                        spans[at].end_ms = Some(t);
                        let ending = event["ending"].as_str().unwrap_or("");
                        spans[at]
                            .attributes
                            .push(string_attr("promptforge.task.ending", ending));
                        if ending == "failed" {
                            spans[at].error = Some("the task failed".to_owned());
                        }
                    }
                }
                "section_started" => {
                    let section = event["section"].as_str().unwrap_or("").to_owned();
                    let parent = task_span
                        .get(&task)
                        .map(|&i| spans[i].id.clone())
                        .unwrap_or_else(|| run_id.clone());
                    section_span.insert(task.clone(), spans.len());
                    spans.push(Span {
                        id: random_hex(8),
                        parent: Some(parent),
                        name: format!("section {section}"),
                        kind: 1,
                        start_ms: t,
                        end_ms: None,
                        attributes: vec![
                            string_attr("promptforge.section", &section),
                            string_attr("promptforge.task", &task),
                        ],
                        error: None,
                    });
                }
                "section_finished" => {
                    if let Some(at) = section_span.remove(&task) {
                        spans[at].end_ms = Some(t);
                    }
                }
                _ => {}
            }
        } else if let Some(effect) = value["effect"].as_u64()
            && value["request"]["effect"] == "model_round"
        {
            let task = value["task"].as_str().unwrap_or("0");
            let round = &value["request"]["request"];
            let model = info.model.clone().unwrap_or_else(|| "unknown".to_owned());
            let mut attributes = vec![
                string_attr("gen_ai.operation.name", "chat"),
                string_attr("gen_ai.request.model", &model),
                string_attr("promptforge.task", task),
                int_attr("promptforge.effect", effect),
            ];
            if let Some(provider) = &info.provider {
                attributes.push(string_attr("gen_ai.provider.name", provider));
            }
            if let Some(temperature) = round["model"]["temperature"].as_f64() {
                attributes.push(json!({"key": "gen_ai.request.temperature",
                                        "value": {"doubleValue": temperature}}));
            }
            if let Some(max) = round["model"]["max_tokens"].as_u64() {
                attributes.push(int_attr("gen_ai.request.max_tokens", max));
            }
            if content {
                attributes.push(string_attr(
                    "gen_ai.input.messages",
                    &round["messages"].to_string(),
                ));
            }
            let parent = parent_of(&spans, task, &task_span, &section_span);
            rounds.insert(effect, spans.len());
            spans.push(Span {
                id: random_hex(8),
                parent: Some(parent),
                name: format!("chat {model}"),
                kind: 3,
                start_ms: t,
                end_ms: None,
                attributes,
                error: None,
            });
        } else if let Some(effect) = value["answer"].as_u64()
            && let Some(&at) = rounds.get(&effect)
        {
            let span = &mut spans[at];
            span.end_ms = Some(t);
            let answer = &value["value"];
            if let Some(reply) = answer.get("value") {
                if let Some(reason) = reply["finish_reason"].as_str() {
                    span.attributes
                        .push(json!({"key": "gen_ai.response.finish_reasons",
                        "value": {"arrayValue": {"values": [{"stringValue": reason}]}}}));
                }
                if let Some(n) = reply["usage"]["prompt_tokens"].as_u64() {
                    span.attributes
                        .push(int_attr("gen_ai.usage.input_tokens", n));
                }
                if let Some(n) = reply["usage"]["completion_tokens"].as_u64() {
                    span.attributes
                        .push(int_attr("gen_ai.usage.output_tokens", n));
                }
                if content {
                    let output = json!([{"role": "assistant", "content": reply["text"],
                                          "tool_calls": reply["tool_calls"]}]);
                    span.attributes
                        .push(string_attr("gen_ai.output.messages", &output.to_string()));
                }
            } else if let Some(error) = answer.get("error") {
                let message = error["message"].as_str().unwrap_or("the round failed");
                span.error = Some(message.to_owned());
                span.attributes.push(string_attr(
                    "error.type",
                    error["kind"].as_str().unwrap_or("error"),
                ));
            }
        } else if let Some(o) = value.get("outcome") {
            outcome = o.clone();
        }
    }
    spans[0].end_ms = Some(last_t);
    match outcome["outcome"].as_str() {
        Some("failed") => {
            let kind = outcome["error"]["kind"].as_str().unwrap_or("");
            spans[0].error = Some(
                outcome["error"]["message"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            );
            spans[0].attributes.push(string_attr("error.type", kind));
            spans[0]
                .attributes
                .push(string_attr("promptforge.outcome", "failed"));
        }
        Some(other) => spans[0]
            .attributes
            .push(string_attr("promptforge.outcome", other)),
        None => {}
    }
    let base = info
        .started
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos();
    let nanos = |ms: u64| (base + u128::from(ms) * 1_000_000).to_string();
    let trace = random_hex(16);
    let rendered: Vec<Json> = spans
        .iter()
        .map(|s| {
            let end = s.end_ms.unwrap_or(last_t).max(s.start_ms);
            let status = match &s.error {
                Some(message) => json!({"code": 2, "message": message}),
                None => json!({"code": 1}),
            };
            json!({
                "traceId": trace,
                "spanId": s.id,
                "parentSpanId": s.parent.clone().unwrap_or_default(),
                "name": s.name,
                "kind": s.kind,
                "startTimeUnixNano": nanos(s.start_ms),
                "endTimeUnixNano": nanos(end),
                "attributes": s.attributes,
                "status": status,
            })
        })
        .collect();
    json!({"resourceSpans": [{
        "resource": {"attributes": [
            string_attr("service.name", "promptforge"),
            string_attr("service.version", env!("CARGO_PKG_VERSION")),
        ]},
        "scopeSpans": [{
            "scope": {"name": "promptforge", "version": env!("CARGO_PKG_VERSION")},
            "spans": rendered,
        }],
    }]})
}

/// Send a run's spans to `url`; a failure is a warning for the person, never the run's.
pub(crate) fn export(url: &str, record: &[u8], info: &RunInfo) -> Result<(), String> {
    let body = spans(record, info, capture_content());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("OpenTelemetry export: {e}"))?;
    runtime.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("OpenTelemetry export: {e}"))?;
        let mut request = client.post(url).json(&body);
        for (key, value) in headers() {
            request = request.header(key, value);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("OpenTelemetry export to {url} failed: {e}"))?;
        if !response.status().is_success() {
            return Err(format!(
                "OpenTelemetry export to {url}: the collector answered {}",
                response.status()
            ));
        }
        Ok(())
    })
}

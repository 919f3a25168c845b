#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point
//! The Host runs effects concurrently, and runs stay reproducible whatever the completion
//! order.
//!
//! A local OpenAI-compatible server (127.0.0.1) answers every chat request after a random
//! delay, so requests complete in a different order on every run. The same prompt, run again
//! and again with the same `--seed` and `--when`, must print byte-identical `--json` and
//! `--events` output, while the server sees several requests in flight at once. A Ctrl-C with
//! rounds in flight ends the run cancelled at once.

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use serde_json::{Value, json};
use support::LocalServer;

/// How the fake server behaves.
#[derive(Debug)]
struct Behaviour {
    /// The longest random delay before an answer, in milliseconds (0: never answer).
    max_delay_ms: u64,
    /// The random generator's state (xorshift), shared by every request.
    random: Mutex<u64>,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    requests: AtomicU64,
}

type Shared = Arc<Behaviour>;

/// A fake OpenAI-compatible server on a background runtime, stopped when dropped.
struct Server {
    base: String,
    state: Shared,
    _server: LocalServer,
}

fn next_random(state: &Mutex<u64>) -> u64 {
    let mut x = state.lock().unwrap();
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Counts a request as in flight until its handler ends, however it ends (a client that drops
/// the request, as the Host does for a withdrawn round, drops the handler mid-wait).
struct InFlight(Shared);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The reply: the request's last message, echoed, as an SSE stream in OpenAI's shape.
async fn chat(State(state): State<Shared>, body: Bytes) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.peak.fetch_max(now, Ordering::SeqCst);
    let guard = InFlight(state.clone());
    if state.max_delay_ms == 0 {
        // Never answer: the run must be cancelled with this round in flight.
        std::future::pending::<()>().await;
    }
    let delay = next_random(&state.random) % (state.max_delay_ms + 1);
    tokio::time::sleep(Duration::from_millis(delay)).await;
    drop(guard);
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let last = request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    let chunks = [
        json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": "re: "}, "finish_reason": null}]}),
        json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
               "choices": [{"index": 0, "delta": {"content": last}, "finish_reason": null}]}),
        json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
               "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    ];
    let mut text = String::new();
    for chunk in chunks {
        text.push_str(&format!("data: {chunk}\n\n"));
    }
    text.push_str("data: [DONE]\n\n");
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .body(Body::from(text))
        .unwrap()
}

fn start(max_delay_ms: u64, seed: u64) -> Server {
    let state = Arc::new(Behaviour {
        max_delay_ms,
        random: Mutex::new(seed | 1),
        in_flight: AtomicUsize::new(0),
        peak: AtomicUsize::new(0),
        requests: AtomicU64::new(0),
    });
    let server = LocalServer::chat(chat, state.clone());
    Server {
        base: format!("{}/v1", server.base()),
        state,
        _server: server,
    }
}

fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_promptforge")
}

/// A prompt whose arms and tasks interleave: two rounds per arm with a store write and a log
/// between them, a task per arm, and a race decided by which task ends first.
const PROMPT: &str = r#"---
name: interleaved
description: arms and tasks that interleave over a model
promptforge: 0
models:
  writer: {}
---

# Interleaved

```lua
models.default('writer')
```

## Main

```lua
local members = {}
for i = 1, 12 do members[i] = 'm' .. i end
local r = fanout('### Arm', members)
local parts = {}
for i = 1, #r do parts[i] = r[i].text end
local a = tasks.spawn('### Quick')
local b = tasks.spawn('### Slow')
local first, ok, result = tasks.join_any({ a, b })
for _, t in ipairs(tasks.pending()) do tasks.cancel(t) end
return table.concat(parts, ';') .. '|' .. first.task .. '=' .. result .. '|' .. store.read('out/m7.txt')
```

### Arm

```lua
local one = models.infer('one ' .. item)
log('arm ' .. sys.index .. ' got ' .. one)
store.write('out/' .. item .. '.txt', one)
local t = tasks.spawn('### Helper', { item = item })
local two = models.infer('two ' .. item)
local _, _, helped = tasks.join_any({ t })
return two .. '+' .. helped
```

### Helper

```lua
return models.infer('help ' .. item)
```

### Quick

```lua
return models.infer('quick')
```

### Slow

```lua
local a = models.infer('slow a')
return models.infer('slow b ' .. a)
```
"#;

fn run(prompt: &Path, server: &Server, extra: &[&str]) -> Output {
    run_env(prompt, server, extra, &[])
}

fn run_env(prompt: &Path, server: &Server, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let store = tempfile_dir();
    let mut cmd = Command::new(binary());
    cmd.args(["run"])
        .arg(prompt)
        .args([
            "--json",
            "--events",
            "--seed",
            "11",
            "--when",
            "2026-02-03T04:05:06Z",
            "--model",
            "openai:test-model",
            "--store",
        ])
        .arg(&store)
        .args(extra)
        .env("OPENAI_BASE_URL", &server.base)
        .env("OPENAI_API_KEY", "test-key")
        .env_remove("ANTHROPIC_API_KEY")
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    let output = cmd.output().unwrap();
    let _ = std::fs::remove_dir_all(&store);
    output
}

fn tempfile_dir() -> std::path::PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "pf-concurrency-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_prompt(text: &str) -> std::path::PathBuf {
    let dir = tempfile_dir();
    let path = dir.join("prompt.md");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn twenty_runs_with_random_completion_order_are_byte_identical() {
    let server = start(25, 0x5eed_1234);
    let prompt = write_prompt(PROMPT);
    // The reference keeps every strand in the committed order; the twenty runs after it run
    // ahead on whichever replies come first, and must print the same bytes.
    let first = run_env(&prompt, &server, &[], &[("PROMPTFORGE_RUN_AHEAD", "off")]);
    let stdout = String::from_utf8_lossy(&first.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&first.stderr).into_owned();
    assert!(first.status.success(), "{stdout}\n{stderr}");
    // With --events, stdout is JSON lines: the events, then the outcome.
    let outcome: Value = serde_json::from_str(stdout.trim().lines().last().unwrap()).unwrap();
    let result = outcome["result"].as_str().unwrap();
    assert!(
        result.starts_with("re: two m1+re: help m1;re: two m2+re: help m2;"),
        "{result}"
    );
    assert!(result.ends_with("|0.12=re: quick|re: one m7"), "{result}");
    assert!(stdout.contains("\"event\":\"log\""), "{stdout}");
    for n in 2..=20 {
        let again = run(&prompt, &server, &[]);
        assert_eq!(
            String::from_utf8_lossy(&again.stdout),
            stdout,
            "run {n}: the outcome or the event stream differs"
        );
        assert_eq!(
            String::from_utf8_lossy(&again.stderr),
            stderr,
            "run {n}: stderr differs"
        );
    }
    let peak = server.state.peak.load(Ordering::SeqCst);
    assert!(peak > 1, "the rounds never overlapped: peak {peak}");
    assert!(peak <= 8, "more rounds in flight than the limit: {peak}");
}

/// A server whose replies wait as long as the request's last message says (`delay=MS`),
/// counting the connections it was reached on and the requests that began while one marked
/// `slow` was still being answered.
#[derive(Debug, Default)]
struct Uneven {
    peers: Mutex<std::collections::BTreeSet<std::net::SocketAddr>>,
    slow_in_flight: std::sync::atomic::AtomicBool,
    overlapping: AtomicUsize,
}

async fn uneven_chat(
    State(state): State<Arc<Uneven>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    body: Bytes,
) -> Response {
    state.peers.lock().unwrap().insert(peer);
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let last = request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    let slow = last.contains("slow");
    if slow {
        state.slow_in_flight.store(true, Ordering::SeqCst);
    } else if state.slow_in_flight.load(Ordering::SeqCst) {
        state.overlapping.fetch_add(1, Ordering::SeqCst);
    }
    let delay = last
        .split("delay=")
        .nth(1)
        .and_then(|d| d.split_whitespace().next())
        .and_then(|d| d.parse::<u64>().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(delay)).await;
    if slow {
        state.slow_in_flight.store(false, Ordering::SeqCst);
    }
    let chunk = json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": format!("re: {last}")}, "finish_reason": "stop"}]});
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .body(Body::from(format!("data: {chunk}\n\ndata: [DONE]\n\n")))
        .unwrap()
}

#[test]
fn a_slow_reply_holds_back_nothing_and_each_slot_keeps_one_connection() {
    let state = Arc::new(Uneven::default());
    let server = LocalServer::start_with_peers(
        Router::new()
            .route("/v1/chat/completions", post(uneven_chat))
            .with_state(state.clone()),
    );
    let server = Server {
        base: format!("{}/v1", server.base()),
        state: Arc::new(Behaviour {
            max_delay_ms: 1,
            random: Mutex::new(1),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
        }),
        _server: server,
    };
    // The first arm's reply takes 2 s; the other nineteen answer at once. Under a limit of 2,
    // a run that waited on the slow reply before admitting the next arm would start one other
    // request meanwhile; running ahead, every other arm is done before the slow one answers.
    let prompt = write_prompt(
        "---\nname: uneven\ndescription: one slow arm\npromptforge: 0\nmodels:\n  writer: {}\n---\n\n# Uneven\n\n## Main\n\n```lua\nlocal members = { 'slow delay=2000' }\nfor i = 2, 20 do members[i] = 'fast ' .. i end\nlocal r = fanout('### Ask', members)\nlocal out = {}\nfor i = 1, #r do out[i] = r[i].text end\nreturn table.concat(out, ';')\n```\n\n### Ask\n\n```lua\nmodels.use('writer')\nlocal a = models.infer(item)\nreturn models.infer('again ' .. a)\n```\n",
    );
    let ahead = run(&prompt, &server, &["--concurrency", "2"]);
    assert!(ahead.status.success(), "{ahead:?}");
    assert_eq!(
        state.overlapping.load(Ordering::SeqCst),
        19 * 2,
        "every fast arm's two rounds go out while the slow reply is awaited"
    );
    let connections = state.peers.lock().unwrap().len();
    assert!(
        connections <= 2,
        "{connections} connections for 40 rounds under a limit of 2"
    );
    state.overlapping.store(0, Ordering::SeqCst);
    let in_order = run_env(
        &prompt,
        &server,
        &["--concurrency", "2"],
        &[("PROMPTFORGE_RUN_AHEAD", "off")],
    );
    assert_eq!(
        String::from_utf8_lossy(&in_order.stdout),
        String::from_utf8_lossy(&ahead.stdout),
        "the same run either way"
    );
    assert!(
        state.overlapping.load(Ordering::SeqCst) < 19 * 2,
        "without running ahead, the slow reply holds the next arms back"
    );
}

#[test]
fn the_concurrency_flag_caps_rounds_in_flight() {
    let server = start(5, 7);
    let prompt = write_prompt(PROMPT);
    let output = run(&prompt, &server, &["--concurrency", "2"]);
    assert!(output.status.success(), "{:?}", output);
    let peak = server.state.peak.load(Ordering::SeqCst);
    // Two arms (or tasks) hold slots; a task parked on a wait gives its slot back, so the
    // limit counts running work, and the main walk never needs a slot.
    assert!(peak <= 2, "peak {peak} with --concurrency 2");
    let refused = Command::new(binary())
        .args(["run", "x.md", "--concurrency", "0"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
}

/// Once the server holds the run's first wave of rounds, send the run `signal`.
fn signal_with_a_wave_in_flight(server: &Server, child: &std::process::Child, signal: &str) {
    let began = Instant::now();
    while server.state.in_flight.load(Ordering::SeqCst) < 8 {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the rounds never went out"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn ctrl_c_with_rounds_in_flight_ends_the_run_cancelled_at_once() {
    let server = start(0, 1);
    let prompt = write_prompt(PROMPT);
    let store = tempfile_dir();
    let mut child = Command::new(binary())
        .args(["run"])
        .arg(&prompt)
        .args(["--json", "--model", "openai:test-model", "--store"])
        .arg(&store)
        .env("OPENAI_BASE_URL", &server.base)
        .env("OPENAI_API_KEY", "test-key")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    signal_with_a_wave_in_flight(&server, &child, "-INT");
    let sent = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(130));
            break;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(2),
            "the run did not end within 2 s of Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(stdout.trim(), r#"{"outcome":"cancelled"}"#);
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn a_race_losers_streamed_reply_still_counts_and_the_record_replays() {
    let state = Arc::new(Uneven::default());
    let server = LocalServer::start_with_peers(
        Router::new()
            .route("/v1/chat/completions", post(uneven_chat))
            .with_state(state.clone()),
    );
    let dir = tempfile_dir();
    // The slow task is spawned first, so the committed order takes its reply first and it
    // wins; the quick one's replies streamed before that, were never taken, and still cost.
    let prompt = dir.join("race.md");
    std::fs::write(
        &prompt,
        "---\nname: race\ndescription: a race\npromptforge: 0\nmodels:\n  writer: {}\n---\n\n# Race\n\n## Main\n\n```lua\nlocal slow = tasks.spawn('### Slow')\nlocal quick = tasks.spawn('### Quick')\nlocal first, ok, result = tasks.join_any({ slow, quick })\nfor _, t in ipairs(tasks.pending()) do tasks.cancel(t) end\nreturn result\n```\n\n### Slow\n\n```lua\nmodels.use('writer')\nreturn models.infer('slow delay=400')\n```\n\n### Quick\n\n```lua\nmodels.use('writer')\nlocal a = models.infer('quick')\nreturn models.infer('quick again ' .. a)\n```\n",
    )
    .unwrap();
    let record = dir.join("race.record");
    let ran = support::promptforge(&dir)
        .args(["run"])
        .arg(&prompt)
        .args(["--json", "--model", "openai:m", "--record"])
        .arg(&record)
        .env("OPENAI_BASE_URL", format!("{}/v1", server.base()))
        .env("OPENAI_API_KEY", "k")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&ran.stdout).into_owned();
    assert!(
        ran.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(
        stdout.contains(r#""result":"re: slow delay=400""#),
        "{stdout}"
    );
    let runs = support::promptforge(&dir)
        .args(["runs", "--json"])
        .output()
        .unwrap();
    let row: Value = serde_json::from_str(
        String::from_utf8_lossy(&runs.stdout)
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    // The slow round, and the quick task's two: its second went out ahead of the committed
    // order and was never committed, but its reply streamed and cost what it cost.
    assert_eq!(row["rounds"], 3, "{row}");
    let replayed = support::promptforge(&dir)
        .args(["replay"])
        .arg(&record)
        .arg("--json")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&replayed.stdout), stdout);
    assert!(
        String::from_utf8_lossy(&replayed.stderr).contains("identical to the record"),
        "{}",
        String::from_utf8_lossy(&replayed.stderr)
    );
}

#[test]
fn sigterm_and_sighup_end_the_run_cancelled_as_ctrl_c_does() {
    for signal in ["-TERM", "-HUP"] {
        let server = start(0, 1);
        let dir = tempfile_dir();
        let prompt = dir.join("prompt.md");
        std::fs::write(&prompt, PROMPT).unwrap();
        let child = support::promptforge(&dir)
            .args(["run"])
            .arg(&prompt)
            .args(["--json", "--model", "openai:test-model"])
            .env("OPENAI_BASE_URL", &server.base)
            .env("OPENAI_API_KEY", "test-key")
            .env("TMPDIR", &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        signal_with_a_wave_in_flight(&server, &child, signal);
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(130), "{signal}");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            r#"{"outcome":"cancelled"}"#,
            "{signal}"
        );
        // The run is kept in the history as cancelled, and its fresh store is gone.
        let runs = support::promptforge(&dir)
            .args(["runs", "--json"])
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&runs.stdout);
        assert!(
            listing.contains(r#""outcome":"cancelled""#),
            "{signal}: {listing}"
        );
        let stores: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("promptforge-store")
            })
            .collect();
        assert!(stores.is_empty(), "{signal}: a store was left behind");
    }
}

//! The terminal experience, tested in a real terminal: the binary runs inside tmux against a
//! slow local model server, and the test reads the pane as a person would see it: the live
//! progress line with the section and the reply streaming in while the model is still
//! answering, then the result and a summary line with the token counts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::routing::post;
use serde_json::json;
use support::LocalServer;

/// The reply, one word every 250 ms, then the usage chunk.
const WORDS: [&str; 8] = [
    "Slow ", "words ", "arrive ", "one ", "by ", "one ", "over ", "time.",
];

fn slow_server() -> LocalServer {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            let chunks = futures_util::stream::unfold(0usize, |n| async move {
                if n > WORDS.len() + 1 {
                    return None;
                }
                if n > 0 {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                let event = match n {
                    n if n < WORDS.len() => {
                        let chunk = json!({"choices": [{"index": 0, "delta": {"content": WORDS[n]}}]});
                        format!("data: {chunk}\n\n")
                    }
                    n if n == WORDS.len() => {
                        let chunk = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                                           "usage": {"prompt_tokens": 1234, "completion_tokens": 56}});
                        format!("data: {chunk}\n\n")
                    }
                    _ => "data: [DONE]\n\n".to_owned(),
                };
                Some((Ok::<_, std::convert::Infallible>(Bytes::from(event)), n + 1))
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(chunks))
                .unwrap()
        }),
    );
    LocalServer::start(app)
}

struct Tmux {
    socket: String,
}

impl Tmux {
    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-u", "-L", &self.socket]);
        c
    }

    fn start(dir: &Path, script: &str) -> Tmux {
        // One tmux server per test: the tests of this file run at the same time.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmux = Tmux {
            socket: format!("pf-terminal-test-{}-{n}", std::process::id()),
        };
        let status = tmux
            .cmd()
            .args([
                "new-session",
                "-d",
                "-x",
                "150",
                "-y",
                "20",
                "-s",
                "t",
                "-c",
            ])
            .arg(dir)
            .arg(script)
            .env("LANG", "C.UTF-8")
            .status()
            .expect("tmux must be installed for the terminal test (apt install tmux)");
        assert!(status.success(), "tmux new-session failed");
        tmux
    }

    fn pane(&self) -> String {
        let out = self
            .cmd()
            .args(["capture-pane", "-p", "-t", "t"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").status();
    }
}

#[test]
fn a_terminal_shows_progress_a_streaming_reply_and_a_summary() {
    let server = slow_server();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("story.md"),
        "---\nname: story\ndescription: Tells a story slowly\npromptforge: 0\nmodels:\n  teller: {}\n---\n\n# Story\n\n## Tell it\n\n```lua\nmodels.default('teller')\nreturn models.infer('Tell a story')\n```\n",
    )
    .unwrap();
    let script = format!(
        "env XDG_CONFIG_HOME={xdg} NO_PROXY=127.0.0.1 OPENAI_BASE_URL={base}/v1 OPENAI_API_KEY=k \
         {bin} run story.md --model openai:slow-model; echo EXIT=$?; sleep 60",
        xdg = dir.path().join("xdg").display(),
        base = server.base(),
        bin = env!("CARGO_BIN_EXE_promptforge"),
    );
    let tmux = Tmux::start(dir.path(), &script);

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut saw_progress = false;
    let mut saw_partial_reply = false;
    let mut last = String::new();
    while Instant::now() < deadline {
        let pane = tmux.pane();
        if pane.contains("EXIT=") {
            last = pane;
            break;
        }
        if pane.contains("§ Tell it") && pane.contains("round 1") {
            saw_progress = true;
        }
        // Part of the reply on the progress line while the model is still answering.
        if pane.contains("Slow words") && !pane.contains("over time.") {
            saw_partial_reply = true;
        }
        last = pane;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(last.contains("EXIT=0"), "the run did not end well:\n{last}");
    assert!(saw_progress, "no progress line with the section and round");
    assert!(
        saw_partial_reply,
        "the reply never showed while it streamed"
    );
    assert!(
        last.contains("Slow words arrive one by one over time."),
        "no result:\n{last}"
    );
    assert!(
        last.contains("✓ completed in")
            && last.contains("1 round · 1,234 in / 56 out tokens · cost unknown"),
        "no summary line:\n{last}"
    );
    // The display is gone once the run ends: no spinner line is left behind.
    assert!(!last.contains("waiting for the model"), "{last}");
}

/// A server that answers each round after `delay`, or first refuses it with a 429 when
/// `limited` (each request's first attempt only).
fn waiting_server(delay: Duration, limited: bool) -> LocalServer {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |body: Bytes| {
            let seen = seen.clone();
            async move {
                let text = String::from_utf8_lossy(&body).into_owned();
                if limited && seen.lock().unwrap().insert(text) {
                    return Response::builder()
                        .status(429)
                        .header("retry-after", "1")
                        .header("content-type", "application/json")
                        .body(Body::from(
                            json!({"error": {"message": "slow down"}}).to_string(),
                        ))
                        .unwrap();
                }
                tokio::time::sleep(delay).await;
                let content = json!({"choices": [{"index": 0, "delta": {"content": "fact"}}]});
                let end = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from(format!(
                        "data: {content}\n\ndata: {end}\n\ndata: [DONE]\n\n"
                    )))
                    .unwrap()
            }
        }),
    );
    LocalServer::start(app)
}

const FAN: &str = "---\nname: fan\ndescription: One round per item, all at once\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Fan\n\n```lua\nmodels.default('w')\n```\n\n## Collect\n\n```lua\nlocal items = {}\nfor i = 1, 12 do items[i] = 'topic ' .. i end\nfanout('### Fact', items)\nreturn 'all done'\n```\n\n### Fact\n\n```lua\nreturn models.infer('Tell me about ' .. item)\n```\n";

fn fan_script(dir: &Path, server: &LocalServer, trap: bool) -> String {
    format!(
        "{trap}env XDG_CONFIG_HOME={xdg} NO_PROXY=127.0.0.1 OPENAI_BASE_URL={base}/v1 \
         OPENAI_API_KEY=k {bin} run fan.md --model openai:m --concurrency 4; echo EXIT=$?; sleep 60",
        trap = if trap { "trap : INT; " } else { "" },
        xdg = dir.join("xdg").display(),
        base = server.base(),
        bin = env!("CARGO_BIN_EXE_promptforge"),
    )
}

impl Tmux {
    fn keys(&self, keys: &str) {
        let status = self
            .cmd()
            .args(["send-keys", "-t", "t", keys])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Polls the pane until `done` holds of it (or 30 s pass); the last pane seen.
    fn until(&self, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut pane = self.pane();
        while Instant::now() < deadline && !done(&pane) {
            std::thread::sleep(Duration::from_millis(50));
            pane = self.pane();
        }
        pane
    }
}

#[test]
fn a_fanout_shows_its_arms_by_section_and_item_with_counts_and_ctrl_c_leaves_no_spinner() {
    let server = waiting_server(Duration::from_secs(20), false);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fan.md"), FAN).unwrap();
    let tmux = Tmux::start(dir.path(), &fan_script(dir.path(), &server, true));
    // Four arms run (the concurrency limit), eight wait; each arm's line names its section
    // and item, and the head line counts them with the rounds in flight.
    let pane = tmux.until(|p| p.contains("tasks 4 running, 8 queued, 0 done"));
    assert!(
        pane.contains("tasks 4 running, 8 queued, 0 done"),
        "no task counts:\n{pane}"
    );
    assert!(pane.contains("4 in flight"), "{pane}");
    assert!(
        pane.contains("Fact 1/12 \"topic 1\"") && pane.contains("Fact 4/12 \"topic 4\""),
        "arms not labelled by section and item:\n{pane}"
    );
    assert!(pane.contains("waiting for the model"), "{pane}");
    tmux.keys("C-c");
    let pane = tmux.until(|p| p.contains("EXIT="));
    assert!(pane.contains("EXIT=130"), "{pane}");
    assert!(pane.contains("cancelled"), "{pane}");
    // Nothing of the live display is left on the screen.
    for left in [
        "waiting for the model",
        "Fact 1/12",
        "tasks 4 running",
        "in flight",
    ] {
        assert!(!pane.contains(left), "{left:?} left behind:\n{pane}");
    }
    assert!(
        !pane.chars().any(|c| ('⠋'..='⠿').contains(&c)),
        "a spinner was left behind:\n{pane}"
    );
}

#[test]
fn a_rate_limit_in_a_fanout_is_noted_once_not_per_arm_and_retry() {
    let server = waiting_server(Duration::from_millis(200), true);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fan.md"), FAN).unwrap();
    let tmux = Tmux::start(dir.path(), &fan_script(dir.path(), &server, false));
    let pane = tmux.until(|p| p.contains("EXIT="));
    assert!(pane.contains("EXIT=0"), "{pane}");
    assert!(pane.contains("all done"), "{pane}");
    // Twelve arms each refused once: the server's words and the retry are each said once.
    let notes: Vec<&str> = pane.lines().filter(|l| l.starts_with("note:")).collect();
    assert_eq!(notes.len(), 2, "{pane}");
    assert!(notes[0].contains("429: slow down"), "{pane}");
}

#[test]
fn stderr_is_coloured_on_a_terminal_unless_no_color_is_set() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("typo.md"),
        "---\nname: typo\ndescription: d\npromptforge: 0\n---\n\n# Typo\n\n## Main\n\n```lua\ncall('## Sumarize')\n```\n\n## Summarize\n\n```lua\nreturn 1\n```\n",
    )
    .unwrap();
    for (no_color, coloured) in [("", true), ("NO_COLOR=1 ", false)] {
        let script = format!(
            "env {no_color}XDG_CONFIG_HOME={xdg} {bin} run typo.md; echo EXIT=$?; sleep 60",
            xdg = dir.path().join("xdg").display(),
            bin = env!("CARGO_BIN_EXE_promptforge"),
        );
        let tmux = Tmux::start(dir.path(), &script);
        tmux.until(|p| p.contains("EXIT="));
        let out = tmux
            .cmd()
            .args(["capture-pane", "-p", "-e", "-t", "t"])
            .output()
            .unwrap();
        let pane = String::from_utf8_lossy(&out.stdout).into_owned();
        // The failure opens with FILE:LINE, its tag red where colour is on.
        assert!(pane.contains("typo.md:12: "), "{pane}");
        assert_eq!(pane.contains('\u{1b}'), coloured, "{no_color}:\n{pane:?}");
        assert!(pane.contains("EXIT=1"), "{pane}");
    }
}

#[test]
fn a_batch_shows_its_runs_before_the_first_one_ends() {
    // Longer than `until` waits: the batch must end on Ctrl-C without waiting the rounds out.
    let server = waiting_server(Duration::from_secs(90), false);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("one.md"),
        "---\nname: one\ndescription: d\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# One\n\n## Ask\n\n```lua\nmodels.default('w')\nreturn models.infer('say ' .. args)\n```\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("in.jsonl"),
        "{\"args\":\"a\"}\n{\"args\":\"b\"}\n{\"args\":\"c\"}\n",
    )
    .unwrap();
    let script = format!(
        "trap : INT; env XDG_CONFIG_HOME={xdg} NO_PROXY=127.0.0.1 OPENAI_BASE_URL={base}/v1 \
         OPENAI_API_KEY=k {bin} batch one.md --inputs in.jsonl --model openai:m > out.jsonl; \
         echo EXIT=$?; sleep 60",
        xdg = dir.path().join("xdg").display(),
        base = server.base(),
        bin = env!("CARGO_BIN_EXE_promptforge"),
    );
    let tmux = Tmux::start(dir.path(), &script);
    // Every run waits 20 s on the model; the display says what is going on meanwhile.
    let pane = tmux.until(|p| p.contains("running 3"));
    assert!(pane.contains("running 3") && pane.contains("0/3"), "{pane}");
    tmux.keys("C-c");
    let pane = tmux.until(|p| p.contains("EXIT="));
    assert!(
        pane.contains("EXIT="),
        "Ctrl-C did not end the batch:\n{pane}"
    );
    assert!(
        pane.contains("cancelled: the results so far are written"),
        "{pane}"
    );
}

#[test]
fn watch_reruns_on_save_shows_what_changed_survives_a_broken_file_and_ends_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = |result: &str| {
        format!(
            "---\nname: w\ndescription: d\npromptforge: 0\n---\n\n# W\n\n## Main\n\n```lua\nreturn '{result}'\n```\n"
        )
    };
    std::fs::write(dir.path().join("w.md"), prompt("alpha beta")).unwrap();
    let script = format!(
        "trap : INT; env XDG_CONFIG_HOME={xdg} PROMPTFORGE_HISTORY=off PROMPTFORGE_CACHE_FILE={cache} \
         {bin} run w.md --watch; echo EXIT=$?; sleep 60",
        xdg = dir.path().join("xdg").display(),
        cache = dir.path().join("cache.sqlite3").display(),
        bin = env!("CARGO_BIN_EXE_promptforge"),
    );
    let tmux = Tmux::start(dir.path(), &script);
    let pane = tmux.until(|p| p.contains("alpha beta") && p.contains("watching"));
    assert!(pane.contains("── run 1 ──"), "{pane}");
    // A save reruns it, with what changed.
    std::fs::write(dir.path().join("w.md"), prompt("alpha gamma")).unwrap();
    let pane = tmux.until(|p| p.contains("── run 2 ──") && p.contains("+ alpha gamma"));
    assert!(
        pane.contains("changed since the last run:") && pane.contains("- alpha beta"),
        "{pane}"
    );
    // A file that does not parse shows its problem, and the loop goes on.
    std::fs::write(
        dir.path().join("w.md"),
        "---\nname: w\ndescription: d\npromptforge: 0\n---\n\nno title\n",
    )
    .unwrap();
    let pane =
        tmux.until(|p| p.contains("── run 3 ──") && p.contains("prompt requires an H1 title"));
    assert!(pane.contains("error[Parse/Structure]"), "{pane}");
    std::fs::write(dir.path().join("w.md"), prompt("alpha gamma")).unwrap();
    let pane = tmux.until(|p| p.contains("── run 4 ──") && p.matches("watching").count() >= 4);
    assert!(pane.contains("── run 4 ──"), "{pane}");
    tmux.keys("C-c");
    let pane = tmux.until(|p| p.contains("EXIT="));
    assert!(pane.contains("EXIT=130"), "{pane}");
}

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
        let tmux = Tmux {
            socket: format!("pf-terminal-test-{}", std::process::id()),
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

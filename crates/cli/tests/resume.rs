//! `promptforge resume` through the real binary: a run killed with SIGKILL mid-way continues
//! from its journal in the history, sends only the rounds that were not answered, and ends with
//! the result an uninterrupted run gets; a run that ended is not resumed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use serde_json::Value;
use support::{LocalServer, promptforge};

#[derive(Default)]
struct Counts {
    /// Every request, as the last user message it carried.
    said: std::sync::Mutex<Vec<String>>,
    requests: AtomicUsize,
    /// While set, a request whose last message contains `slow` is held (never answered).
    hold: AtomicBool,
}

/// Replies `echo: {last user message}`, whatever the order, so a resumed run and an
/// uninterrupted one get the same answers.
async fn chat(State(counts): State<Arc<Counts>>, body: Bytes) -> Response {
    let said = support::last_said(&body);
    counts.said.lock().unwrap().push(said.clone());
    counts.requests.fetch_add(1, Ordering::SeqCst);
    while said.contains("slow") && counts.hold.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    support::sse_text(&format!("echo: {said}"), Some((10, 5)))
}

fn server() -> (LocalServer, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    (LocalServer::chat(chat, counts.clone()), counts)
}

/// Three rounds one after another, with a store file written and read between them, and an
/// operator answer from `--input` (so the scripted answers line up after a resume too).
const SEQUENTIAL: &str = "---\nname: three\ndescription: d\npromptforge: 0\nmodels:\n  w: {}\nplugins:\n  - promptforge/user-input\n---\n\n# Three\n\n## Ask\n\n```lua\nmodels.default('w')\nlocal a = models.infer('one')\nstore.write('a.txt', a)\nlocal who = input.ask()\nlocal b = models.infer('two ' .. who)\nlocal c = models.infer('slow three ' .. store.read('a.txt'))\nreturn a .. ' | ' .. b .. ' | ' .. c .. ' | ' .. input.ask()\n```\n";

/// Two tasks at once: one answered at once, one held.
const PARALLEL: &str = "---\nname: two\ndescription: d\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Two\n\n## Ask\n\n```lua\nlocal r = tasks.join({ tasks.spawn('### Slow'), tasks.spawn('### Fast') })\nreturn r[1].result .. ' | ' .. r[2].result\n```\n\n### Slow\n\n```lua\nmodels.default('w')\nreturn models.infer('slow one')\n```\n\n### Fast\n\n```lua\nmodels.default('w')\nreturn models.infer('fast two')\n```\n";

fn command(dir: &Path, server: &LocalServer) -> std::process::Command {
    let mut command = promptforge(dir);
    command
        .env("OPENAI_BASE_URL", format!("{}/v1", server.base()))
        .env("OPENAI_API_KEY", "k");
    command
}

const RUN: [&str; 10] = [
    "run",
    "p.md",
    "--model",
    "openai:m",
    "--json",
    "--seed",
    "7",
    "--when",
    "2026-01-02T03:04:05Z",
    "--input=ann",
];

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "waited for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn runs(dir: &Path) -> Vec<Value> {
    let listed = promptforge(dir).args(["runs", "--json"]).output().unwrap();
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Start the run, wait until `ready`, and kill it with SIGKILL.
fn kill_mid_way(dir: &Path, server: &LocalServer, extra: &[&str], ready: impl FnMut() -> bool) {
    let mut child = command(dir, server)
        .args(RUN)
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the run to reach its held round", ready);
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_killed_run_resumes_sending_only_what_was_not_answered() {
    let (server, counts) = server();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.md"), SEQUENTIAL).unwrap();
    // What an uninterrupted run ends with (in a history of its own).
    let whole = command(dir.path(), &server)
        .args(RUN)
        .args(["--input=bob"])
        .env("PROMPTFORGE_HISTORY", dir.path().join("other.sqlite3"))
        .output()
        .unwrap();
    assert_eq!(whole.status.code(), Some(0), "{}", text(&whole));
    let expected = String::from_utf8_lossy(&whole.stdout).into_owned();
    assert_eq!(
        expected.trim(),
        r#"{"outcome":"completed","result":"echo: one | echo: two ann | echo: slow three echo: one | bob"}"#
    );
    counts.said.lock().unwrap().clear();
    counts.requests.store(0, Ordering::SeqCst);

    // Killed while its third round is out: the first two were answered.
    counts.hold.store(true, Ordering::SeqCst);
    kill_mid_way(dir.path(), &server, &["--input=bob"], || {
        counts.requests.load(Ordering::SeqCst) == 3
    });
    let listed = runs(dir.path());
    assert_eq!(listed[0]["outcome"], "unfinished", "{listed:?}");
    let id = listed[0]["id"].as_i64().unwrap();
    let journal = dir
        .path()
        .join("journal")
        .join(format!("history-{id}.jsonl"));
    assert!(journal.is_file());
    // `runs export` has no record of it yet, and says what to do.
    let export = promptforge(dir.path())
        .args(["runs", "export", "last"])
        .output()
        .unwrap();
    assert!(
        text(&export).contains(&format!("promptforge resume {id}")),
        "{}",
        text(&export)
    );

    counts.hold.store(false, Ordering::SeqCst);
    let resumed = command(dir.path(), &server)
        .args(["resume", "last"])
        .output()
        .unwrap();
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed));
    assert_eq!(String::from_utf8_lossy(&resumed.stdout), expected);
    assert!(
        String::from_utf8_lossy(&resumed.stderr).contains("answers from its journal, then live")
            && String::from_utf8_lossy(&resumed.stderr).contains(&format!("resuming run {id}: ")),
        "{}",
        text(&resumed)
    );
    // Only the round that was never answered went out again.
    assert_eq!(
        *counts.said.lock().unwrap(),
        [
            "one",
            "two ann",
            "slow three echo: one",
            "slow three echo: one"
        ]
    );
    // The same run, now ended: its row says so, its journal is gone, and its record replays.
    let listed = runs(dir.path());
    assert_eq!(listed[0]["id"].as_i64(), Some(id));
    assert_eq!(listed[0]["outcome"], "completed", "{listed:?}");
    assert!(!journal.exists());
    let replay = promptforge(dir.path())
        .args(["replay", &id.to_string()])
        .output()
        .unwrap();
    assert_eq!(replay.status.code(), Some(0), "{}", text(&replay));

    // A run that ended keeps its outcome: not resumed, and the way to run it again is named.
    let again = command(dir.path(), &server)
        .args(["resume", &id.to_string()])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    let said = text(&again);
    assert!(
        said.contains(&format!("run {id} ended (completed)")),
        "{said}"
    );
    assert!(
        said.contains(&format!("promptforge replay {id} --then-live")),
        "{said}"
    );
    assert_eq!(counts.requests.load(Ordering::SeqCst), 4);
}

#[test]
fn an_answer_that_arrived_before_the_kill_is_not_asked_again() {
    let (server, counts) = server();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.md"), PARALLEL).unwrap();
    let whole = command(dir.path(), &server)
        .args(RUN)
        .env("PROMPTFORGE_HISTORY", dir.path().join("other.sqlite3"))
        .output()
        .unwrap();
    assert_eq!(whole.status.code(), Some(0), "{}", text(&whole));
    let expected = String::from_utf8_lossy(&whole.stdout).into_owned();
    counts.said.lock().unwrap().clear();
    counts.requests.store(0, Ordering::SeqCst);

    // Killed once the fast round's answer is in the journal, the slow one still out.
    counts.hold.store(true, Ordering::SeqCst);
    let journal = dir.path().join("journal").join("history-1.jsonl");
    kill_mid_way(dir.path(), &server, &[], || {
        counts.requests.load(Ordering::SeqCst) == 2
            && std::fs::read_to_string(&journal).is_ok_and(|j| j.contains("echo: fast two"))
    });
    // The run takes answers in an order of its own (the slow task's first), so the fast
    // answer had arrived, and was synced, but was not taken yet.
    let kept = std::fs::read_to_string(&journal).unwrap();
    assert!(kept.contains(r#"{"arrived":1,"#), "{kept}");
    assert!(!kept.contains(r#"{"answer":1,"#), "{kept}");
    counts.hold.store(false, Ordering::SeqCst);
    let resumed = command(dir.path(), &server)
        .args(["resume", "1"])
        .output()
        .unwrap();
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed));
    assert_eq!(String::from_utf8_lossy(&resumed.stdout), expected);
    let mut said = counts.said.lock().unwrap().clone();
    said.sort();
    assert_eq!(said, ["fast two", "slow one", "slow one"]);
}

#[test]
fn a_running_run_and_a_run_without_history_are_not_resumed() {
    let (server, counts) = server();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.md"), PARALLEL).unwrap();
    counts.hold.store(true, Ordering::SeqCst);
    let mut child = command(dir.path(), &server)
        .args(RUN)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until("both rounds", || {
        counts.requests.load(Ordering::SeqCst) == 2
    });
    let listed = runs(dir.path());
    assert_eq!(listed[0]["outcome"], "running", "{listed:?}");
    let resumed = command(dir.path(), &server)
        .args(["resume", "last"])
        .output()
        .unwrap();
    assert_eq!(resumed.status.code(), Some(2));
    assert!(
        text(&resumed).contains("run 1 is still running"),
        "{}",
        text(&resumed)
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let off = command(dir.path(), &server)
        .args(["resume", "last"])
        .env("PROMPTFORGE_HISTORY", "off")
        .output()
        .unwrap();
    assert_eq!(off.status.code(), Some(2));
    assert!(
        text(&off).contains("the run history is off"),
        "{}",
        text(&off)
    );
}

#[test]
fn a_run_with_a_store_directory_resumes_once_the_directory_is_put_back() {
    let (server, counts) = server();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.md"), SEQUENTIAL).unwrap();
    std::fs::create_dir(dir.path().join("s")).unwrap();
    counts.hold.store(true, Ordering::SeqCst);
    kill_mid_way(
        dir.path(),
        &server,
        &["--input=bob", "--store", "s"],
        || counts.requests.load(Ordering::SeqCst) == 3,
    );
    assert!(dir.path().join("s/a.txt").is_file());
    counts.hold.store(false, Ordering::SeqCst);
    let refused = command(dir.path(), &server)
        .args(["resume", "last"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        text(&refused).contains("promptforge resume 1 --store-ready"),
        "{}",
        text(&refused)
    );
    std::fs::remove_file(dir.path().join("s/a.txt")).unwrap();
    let resumed = command(dir.path(), &server)
        .args(["resume", "last", "--store-ready"])
        .output()
        .unwrap();
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed));
    assert!(
        String::from_utf8_lossy(&resumed.stdout).contains("echo: slow three echo: one | bob"),
        "{}",
        text(&resumed)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("s/a.txt")).unwrap(),
        "echo: one"
    );
    assert_eq!(counts.requests.load(Ordering::SeqCst), 4);
}

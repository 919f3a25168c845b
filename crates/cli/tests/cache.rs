//! The response cache through the real binary, against a local server that counts requests:
//! a second run sends nothing and ends the same; a changed round is the only one sent; two
//! identical requests of one run and the repeats of a batch stay independent; an error is
//! never kept; `cache clear` empties it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::Response;
use serde_json::{Value, json};
use support::{LocalServer, promptforge};

#[derive(Default)]
struct Counts {
    requests: AtomicUsize,
    /// Answer 401 while this is above zero (counting down).
    refuse: AtomicUsize,
}

/// Replies `n: {last user message}`, n counting requests, with usage.
async fn chat(State(counts): State<Arc<Counts>>, body: Bytes) -> Response {
    let n = counts.requests.fetch_add(1, Ordering::SeqCst) + 1;
    if counts
        .refuse
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| r.checked_sub(1))
        .is_ok()
    {
        return Response::builder()
            .status(401)
            .body(Body::from(json!({"error": {"message": "no"}}).to_string()))
            .unwrap();
    }
    let said = support::last_said(&body);
    support::sse_text(&format!("{n}: {said}"), Some((10, 5)))
}

fn server() -> (LocalServer, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    (LocalServer::chat(chat, counts.clone()), counts)
}

fn prompt(first: &str, second: &str) -> String {
    format!(
        "---\nname: two\ndescription: d\npromptforge: 0\nmodels:\n  w: {{}}\n---\n\n# Two\n\n## Ask\n\n```lua\nmodels.default('w')\nlocal a = models.infer('{first}')\nlocal b = models.infer('{second}')\nreturn a .. ' | ' .. b\n```\n"
    )
}

fn run(dir: &Path, server: &LocalServer, extra: &[&str]) -> (Option<i32>, String) {
    let output = promptforge(dir)
        .args(["run", "p.md", "--model", "openai:m", "--json", "--cache"])
        .args(extra)
        .env("OPENAI_BASE_URL", format!("{}/v1", server.base()))
        .env("OPENAI_API_KEY", "k")
        .env("PROMPTFORGE_CACHE_FILE", dir.join("cache.sqlite3"))
        .env("PROMPTFORGE_HISTORY", dir.join("history.sqlite3"))
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

#[test]
fn a_second_run_is_answered_from_the_cache_and_only_a_changed_round_is_sent() {
    let (server, counts) = server();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.md"), prompt("same", "same")).unwrap();
    // Two identical requests in one run are two answers.
    let (code, first) = run(dir.path(), &server, &["--seed", "1"]);
    assert_eq!(code, Some(0), "{first}");
    assert_eq!(
        first.trim(),
        r#"{"outcome":"completed","result":"1: same | 2: same"}"#
    );
    assert_eq!(counts.requests.load(Ordering::SeqCst), 2);
    // The same run again: nothing sent, the same outcome byte for byte.
    let (_, again) = run(dir.path(), &server, &["--seed", "1"]);
    assert_eq!(again, first);
    assert_eq!(counts.requests.load(Ordering::SeqCst), 2);
    // The history says which rounds came from the cache.
    let listed = promptforge(dir.path())
        .args(["runs", "--json"])
        .env("PROMPTFORGE_HISTORY", dir.path().join("history.sqlite3"))
        .output()
        .unwrap();
    let rows: Vec<Value> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let cached: Vec<&Value> = rows.iter().map(|r| &r["cached_rounds"]).collect();
    assert_eq!(cached, [&json!(0), &json!(2)], "{rows:?}");
    // Under --events each answer from the cache is a host event.
    let output = promptforge(dir.path())
        .args(["run", "p.md", "--model", "openai:m", "--events", "--cache"])
        .env("OPENAI_BASE_URL", format!("{}/v1", server.base()))
        .env("OPENAI_API_KEY", "k")
        .env("PROMPTFORGE_CACHE_FILE", dir.path().join("cache.sqlite3"))
        .output()
        .unwrap();
    let events = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        events.matches(r#""host_event":"model_cached""#).count(),
        2,
        "{events}"
    );
    // Change the second round's text: only that round goes out.
    std::fs::write(dir.path().join("p.md"), prompt("same", "other")).unwrap();
    let (_, changed) = run(dir.path(), &server, &[]);
    assert_eq!(
        changed.trim(),
        r#"{"outcome":"completed","result":"1: same | 3: other"}"#
    );
    assert_eq!(counts.requests.load(Ordering::SeqCst), 3);
    // Without --cache every round is sent.
    let output = promptforge(dir.path())
        .args(["run", "p.md", "--model", "openai:m", "--json"])
        .env("OPENAI_BASE_URL", format!("{}/v1", server.base()))
        .env("OPENAI_API_KEY", "k")
        .env("PROMPTFORGE_CACHE_FILE", dir.path().join("cache.sqlite3"))
        .output()
        .unwrap();
    assert!(output.status.success());
    assert_eq!(counts.requests.load(Ordering::SeqCst), 5);
    // `cache stats` counts what is kept; `cache clear` empties it, and the rounds go out again.
    let stats = promptforge(dir.path())
        .args(["cache", "stats"])
        .env("PROMPTFORGE_CACHE_FILE", dir.path().join("cache.sqlite3"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&stats.stdout).contains("3 cached replies"),
        "{}",
        String::from_utf8_lossy(&stats.stdout)
    );
    let cleared = promptforge(dir.path())
        .args(["cache", "clear"])
        .env("PROMPTFORGE_CACHE_FILE", dir.path().join("cache.sqlite3"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&cleared.stdout).contains("dropped 3 cached replies"));
    run(dir.path(), &server, &[]);
    assert_eq!(counts.requests.load(Ordering::SeqCst), 7);
}

#[test]
fn an_error_is_never_kept_and_batch_repeats_stay_distinct() {
    let (server, counts) = server();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.md"), prompt("x", "y")).unwrap();
    counts.refuse.store(1, Ordering::SeqCst);
    let (code, failed) = run(dir.path(), &server, &[]);
    assert_eq!(code, Some(1), "{failed}");
    let (code, ok) = run(dir.path(), &server, &[]);
    assert_eq!(code, Some(0), "{ok}");
    // The refused round was sent again (1 refused + 2 answered).
    assert_eq!(counts.requests.load(Ordering::SeqCst), 3);

    std::fs::write(dir.path().join("in.jsonl"), "{\"args\": \"a\"}\n").unwrap();
    let batch = || {
        promptforge(dir.path())
            .args([
                "batch", "p.md", "--inputs", "in.jsonl", "--repeat", "2", "--model", "openai:m",
                "--cache",
            ])
            .env("OPENAI_BASE_URL", format!("{}/v1", server.base()))
            .env("OPENAI_API_KEY", "k")
            .env("PROMPTFORGE_CACHE_FILE", dir.path().join("cache.sqlite3"))
            .output()
            .unwrap()
    };
    let before = counts.requests.load(Ordering::SeqCst);
    let first = batch();
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    // Repeat 0 asks exactly what the plain run asked (the prompt does not read its args), so
    // it is answered from the cache; repeat 1 is keyed apart and sends its two rounds.
    assert_eq!(counts.requests.load(Ordering::SeqCst) - before, 2);
    let results: Vec<Value> = String::from_utf8_lossy(&first.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_ne!(
        results[0]["outcome"], results[1]["outcome"],
        "repeats stay distinct"
    );
    let second = batch();
    assert!(second.status.success());
    assert_eq!(
        counts.requests.load(Ordering::SeqCst) - before,
        2,
        "all from the cache"
    );
    assert_eq!(
        String::from_utf8_lossy(&second.stdout)
            .lines()
            .map(|l| {
                let mut v: Value = serde_json::from_str(l).unwrap();
                v.as_object_mut().unwrap().remove("ms");
                v
            })
            .collect::<Vec<_>>(),
        results
            .into_iter()
            .map(|mut v| {
                v.as_object_mut().unwrap().remove("ms");
                v
            })
            .collect::<Vec<_>>()
    );
}

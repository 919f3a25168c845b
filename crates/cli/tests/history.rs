//! The run history through the real binary: every run lands in a real SQLite file, parallel
//! runs never fail on a lock, `runs` lists them, `runs show` tells one's story, `runs export`
//! gives back a record that `replay` (by file or by id) follows to the same outcome,
//! `--no-history` keeps a run out, and the size cap prunes the oldest runs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;

use serde_json::Value;
use support::promptforge;

fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn out(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let output = promptforge(dir)
        .args(args)
        .env("PROMPTFORGE_HISTORY", dir.join("h.sqlite3"))
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn every_run_is_kept_listed_shown_exported_and_replayable() {
    let dir = tempfile::tempdir().unwrap();
    let examples = root().join("examples");
    let facts = examples.join("facts.md").display().to_string();
    let script = examples.join("scripts/facts.json").display().to_string();
    let pipeline = examples.join("pipeline.md").display().to_string();

    // Eight runs at once: each waits its turn to write, none fails.
    let children: Vec<_> = (0..8)
        .map(|n| {
            promptforge(dir.path())
                .args(["run", &facts, "--script", &script, "--seed", &n.to_string()])
                .env("PROMPTFORGE_HISTORY", dir.path().join("h.sqlite3"))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        assert!(!stderr.contains("warning"), "{stderr}");
    }
    let (_, _, stderr) = out(dir.path(), &["run", &pipeline, "--args", "one two\nthree"]);
    assert!(!stderr.contains("warning"), "{stderr}");
    out(
        dir.path(),
        &["run", &pipeline, "--args", "x", "--no-history"],
    );

    // A real SQLite file, in WAL mode, that any SQLite client reads.
    let db = rusqlite::Connection::open(dir.path().join("h.sqlite3")).unwrap();
    let mode: String = db
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let count: i64 = db
        .query_row("SELECT COUNT(*) FROM runs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        count, 9,
        "eight parallel runs and one more; --no-history kept none"
    );
    let rounds: i64 = db
        .query_row(
            "SELECT SUM(rounds) FROM runs WHERE prompt LIKE '%facts.md'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(rounds, 24);

    let (code, listing, stderr) = out(dir.path(), &["runs", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let rows: Vec<Value> = listing
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 9);
    assert_eq!(rows[8]["id"], 9);
    assert_eq!(rows[8]["outcome"], "completed");
    assert!(rows[0]["prompt"].as_str().unwrap().ends_with("facts.md"));
    assert_eq!(rows[0]["rounds"], 3);
    let (_, text, _) = out(dir.path(), &["runs"]);
    assert!(
        text.lines().count() == 9 && text.contains("3 rounds"),
        "{text}"
    );

    let (code, shown, stderr) = out(dir.path(), &["runs", "show", "9"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        shown.contains("completed: \"report.md: 3 words\""),
        "{shown}"
    );
    assert!(
        shown.contains("[task 0] section_started `Gather`"),
        "{shown}"
    );
    assert!(shown.contains("store write notes/001.txt"), "{shown}");
    assert!(
        shown.contains("store files it left:\n  counts.md\n"),
        "{shown}"
    );
    let (_, shown, _) = out(dir.path(), &["runs", "show", "1"]);
    assert!(
        shown.contains("[task 0] task_spawned 0.1 → `Fact`"),
        "{shown}"
    );
    assert!(shown.contains("model round"), "{shown}");

    // The exported record replays like the file `run --record` writes; so does the id.
    let record = dir.path().join("one.record");
    let (code, _, stderr) = out(
        dir.path(),
        &["runs", "export", "1", "--out", record.to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{stderr}");
    for target in [record.to_str().unwrap(), "1", "9"] {
        let (code, _, stderr) = out(dir.path(), &["replay", target, "--json"]);
        assert_eq!(code, Some(0), "{target}: {stderr}");
        assert!(
            stderr.contains("replay: identical to the record"),
            "{target}: {stderr}"
        );
    }
    let (code, _, stderr) = out(dir.path(), &["runs", "show", "99"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("no run 99 in the history"), "{stderr}");
}

#[test]
fn the_size_cap_prunes_the_oldest_runs() {
    let dir = tempfile::tempdir().unwrap();
    let hello = root().join("examples/hello.md").display().to_string();
    let big = "x".repeat(150_000);
    for _ in 0..8 {
        use std::io::Write;
        let mut child = promptforge(dir.path())
            .args(["run", &hello, "--args", "-"])
            .env("PROMPTFORGE_HISTORY", dir.path().join("h.sqlite3"))
            .env("PROMPTFORGE_HISTORY_MAX_MB", "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(big.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success());
    }
    let db = rusqlite::Connection::open(dir.path().join("h.sqlite3")).unwrap();
    let ids: Vec<i64> = db
        .prepare("SELECT id FROM runs ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(!ids.is_empty() && ids.len() < 8, "{ids:?}");
    assert_eq!(*ids.last().unwrap(), 8, "the newest run stays: {ids:?}");
    let orphans: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM effects WHERE run_id NOT IN (SELECT id FROM runs)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(orphans, 0);
}

#[test]
fn a_long_run_is_exported_line_for_line_as_it_was_recorded() {
    // 1,500 sections write far more than one 64 KiB chunk of event lines.
    let dir = tempfile::tempdir().unwrap();
    let body: String = (0..1500)
        .map(|i| format!("## S{i}\n\n```lua\nlocal x = {i}\n```\n\n"))
        .collect();
    std::fs::write(
        dir.path().join("long.md"),
        format!(
            "---\nname: long\ndescription: many sections\npromptforge: 0\n---\n\n# Long\n\n{body}## Last\n\n```lua\nreturn 'ok'\n```\n"
        ),
    )
    .unwrap();
    let (code, stdout, stderr) = out(dir.path(), &["run", "long.md", "--record", "rec.jsonl"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.trim_end(), "ok");
    let (code, listed, _) = out(dir.path(), &["runs", "--json"]);
    assert_eq!(code, Some(0));
    let run: Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    let id = run["id"].as_i64().unwrap().to_string();
    let (code, exported, stderr) = out(dir.path(), &["runs", "export", &id]);
    assert_eq!(code, Some(0), "{stderr}");
    let recorded = std::fs::read_to_string(dir.path().join("rec.jsonl")).unwrap();
    let events = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(r#"{"event":"#))
            .map(str::to_owned)
            .collect()
    };
    let (want, got) = (events(&recorded), events(&exported));
    assert!(want.len() > 9000, "{} event lines", want.len());
    assert_eq!(got, want);
}

#[test]
fn the_size_cap_holds_on_disk_after_a_large_run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("big.md"),
        "---\nname: big\ndescription: a large result\npromptforge: 0\n---\n\n# Big\n\n## Make\n\n```lua\nreturn string.rep('x', tonumber(args) * 1024 * 1024)\n```\n",
    )
    .unwrap();
    let history = dir.path().join("h.sqlite3");
    let run = |mb: &str| {
        let status = promptforge(dir.path())
            .args(["run", "big.md", "--args", mb])
            .env("PROMPTFORGE_HISTORY", &history)
            .env("PROMPTFORGE_HISTORY_MAX_MB", "8")
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
    };
    // One 20 MB run (over the cap, kept while it is the only one), then five small ones.
    run("20");
    for _ in 0..5 {
        run("0");
    }
    let on_disk = |suffix: &str| {
        std::fs::metadata(format!("{}{suffix}", history.display()))
            .map(|m| m.len())
            .unwrap_or(0)
    };
    let total = on_disk("") + on_disk("-wal");
    assert!(
        total <= 9 * 1024 * 1024,
        "{total} bytes on disk under an 8 MB cap (db {}, wal {})",
        on_disk(""),
        on_disk("-wal")
    );
    // The large run was pruned; the small ones remain.
    let db = rusqlite::Connection::open(&history).unwrap();
    let count: i64 = db
        .query_row("SELECT COUNT(*) FROM runs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count, 5);
}

#[test]
fn a_history_that_cannot_be_written_is_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let hello = root().join("examples/hello.md").display().to_string();
    let (code, _, stderr) = out(dir.path(), &["run", &hello, "--args", "Ada"]);
    assert_eq!(code, Some(0), "{stderr}");
    // Whatever keeps SQLite from writing beside the file (a read-only folder; here, for a
    // test that may run as root, a directory where its index file would go), reading works.
    // The run sits in the write-ahead log (no checkpoint at exit): a reader must see it.
    let history = dir.path().join("h.sqlite3");
    assert!(
        std::fs::metadata(format!("{}-wal", history.display())).is_ok_and(|m| m.len() > 0),
        "the run is in the log"
    );
    let _ = std::fs::remove_file(format!("{}-shm", history.display()));
    std::fs::create_dir(format!("{}-shm", history.display())).unwrap();
    let (code, listing, stderr) = out(dir.path(), &["runs", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(listing.lines().count(), 1, "{listing}");
    let (code, record, stderr) = out(dir.path(), &["runs", "export", "1"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(record.contains("Ada"), "{record}");
}

const LOOP: &str = "---\nname: loop\ndescription: d\npromptforge: 0\nmodels:\n  agent: {}\n---\n\n# Loop\n\n## Main\n\n```lua\nmodels.use('agent')\ntools.add_local('lookup', 'Look up', { topic = 'string' }, function(a) return 'facts ' .. a.topic end)\nlocal msgs = messages.new():user('go')\nmodels.loop(msgs)\nreturn msgs[#msgs].content\n```\n";

const LOOP_SCRIPT: &str = r#"{"model":{"id":"scripted"},"replies":[{"tool_calls":[{"id":"c1","name":"lookup","arguments":{"topic":"x"}}]},"all done"]}"#;

#[test]
fn rounds_and_tool_calls_are_events_and_a_round_can_be_read_back() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loop.md"), LOOP).unwrap();
    std::fs::write(dir.path().join("loop.json"), LOOP_SCRIPT).unwrap();
    let run = ["run", "loop.md", "--script", "loop.json", "--events"];
    let (code, first, stderr) = out(dir.path(), &run);
    assert_eq!(code, Some(0), "{stderr}");
    let events: Vec<Value> = first
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    let at = |kind: &str| kinds.iter().position(|k| *k == kind).unwrap();
    // The round, then the tool call it asked for, then the final round.
    assert!(at("model_round") < at("tool_call"), "{first}");
    assert_eq!(kinds.iter().filter(|k| **k == "model_round").count(), 2);
    let round = &events[at("model_round")];
    assert_eq!(round["model"], "agent");
    assert_eq!(round["model_id"], "scripted");
    assert_eq!(round["finish_reason"], "tool_calls");
    assert_eq!(round["tool_calls"], 1);
    assert_eq!(round["section"], "Main");
    assert_eq!(round["task"], "0");
    let call = &events[at("tool_call")];
    assert_eq!(
        (&call["tool"], &call["via"], &call["ok"]),
        (
            &Value::from("lookup"),
            &Value::from("local"),
            &Value::from(true)
        )
    );
    // No wall-clock figure in any event: the same answers give the same stream.
    assert!(
        !first.contains("_ms") && !first.contains("\"t\""),
        "{first}"
    );
    let (_, again, _) = out(dir.path(), &run);
    assert_eq!(first, again);

    // `last` names the newest run; --round prints one round's conversation.
    let (code, text, stderr) = out(dir.path(), &["runs", "show", "last", "--round", "2"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(text.contains("model round 2 of 2"), "{text}");
    assert!(text.contains("tools offered: lookup"), "{text}");
    assert!(
        text.contains("→ call lookup {\"topic\":\"x\"} (id c1)"),
        "{text}"
    );
    assert!(text.contains("[tool c1]\n    facts x"), "{text}");
    assert!(
        text.contains("reply (finish stop):\n  [assistant]\n    all done"),
        "{text}"
    );
    let (_, json, _) = out(
        dir.path(),
        &["runs", "show", "last", "--round", "1", "--json"],
    );
    let round: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(round["messages"][0]["content"], "go");
    assert_eq!(round["reply"]["tool_calls"][0]["name"], "lookup");
    let (_, json, _) = out(dir.path(), &["runs", "show", "last", "--json"]);
    let shown: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(shown["outcome"]["result"], "all done");
    assert_eq!(shown["rounds"].as_array().unwrap().len(), 2);
    assert!(
        shown["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["text"]
                .as_str()
                .unwrap()
                .contains("tool call lookup (local)")),
        "{json}"
    );
    // The timeline numbers rounds as --round does, says "1 message", and keeps the
    // record's order where times tie (no round after the run's end).
    let texts: Vec<&str> = shown["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["text"].as_str().unwrap())
        .collect();
    let first_round = texts
        .iter()
        .position(|t| t.contains("model round 1 (effect "))
        .unwrap_or_else(|| panic!("{texts:?}"));
    assert!(texts[first_round].contains(", 1 message)"), "{texts:?}");
    let second_round = texts
        .iter()
        .position(|t| t.contains("model round 2 (effect "))
        .unwrap_or_else(|| panic!("{texts:?}"));
    let ended = texts
        .iter()
        .position(|t| t.contains("run_ended"))
        .unwrap_or_else(|| panic!("no run_ended in {texts:?}"));
    assert!(
        first_round < second_round && second_round < ended,
        "{texts:?}"
    );
    let (code, _, stderr) = out(dir.path(), &["runs", "show", "last", "--round", "3"]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("has 2 model rounds; --round takes 1 to 2"),
        "{stderr}"
    );
    let (code, _, stderr) = out(dir.path(), &["replay", "last"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("identical to the record"), "{stderr}");
}

/// A server answering every round with the same text and usage (1,000 in, 500 out).
fn metered_server() -> support::LocalServer {
    use axum::body::Body;
    use axum::response::Response;
    support::LocalServer::chat(
        || async {
            let content =
                serde_json::json!({"choices": [{"index": 0, "delta": {"content": "ok"}}]});
            let end = serde_json::json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 1000, "completion_tokens": 500}});
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from(format!(
                    "data: {content}\n\ndata: {end}\n\ndata: [DONE]\n\n"
                )))
                .unwrap()
        },
        (),
    )
}

#[test]
fn a_priced_model_gives_runs_and_batches_a_cost() {
    let server = metered_server();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("promptforge.toml"),
        format!(
            "[models.priced]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"{}/v1\"\napi_key_env = \"\"\ninput_price = 1.0\noutput_price = 2.0\n",
            server.base()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("one.md"),
        "---\nname: one\ndescription: d\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# One\n\n## Ask\n\n```lua\nmodels.default('w')\nreturn models.infer('say ' .. args)\n```\n",
    )
    .unwrap();
    let (code, _, stderr) = out(
        dir.path(),
        &["run", "one.md", "--model", "priced", "--args", "x"],
    );
    assert_eq!(code, Some(0), "{stderr}");
    // 1,000 × $1 + 500 × $2 per million tokens.
    let (_, listed, _) = out(dir.path(), &["runs"]);
    assert!(listed.contains("$0.0020"), "{listed}");
    let (_, listed, _) = out(dir.path(), &["runs", "--json"]);
    let row: Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    assert!(
        (row["cost"].as_f64().unwrap() - 0.002).abs() < 1e-12,
        "{row}"
    );

    std::fs::write(dir.path().join("in.jsonl"), "{\"args\":\"a\"}\n").unwrap();
    let (code, results, stderr) = out(
        dir.path(),
        &[
            "batch", "one.md", "--inputs", "in.jsonl", "--model", "priced",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let result: Value = serde_json::from_str(results.lines().next().unwrap()).unwrap();
    assert!(
        (result["cost"].as_f64().unwrap() - 0.002).abs() < 1e-12,
        "{result}"
    );
    assert!(
        stderr.contains("  runs      1 (1 input × 1 repeat)"),
        "{stderr}"
    );
    assert!(stderr.contains("  cost      $0.0020"), "{stderr}");
}

#[test]
fn a_run_without_model_rounds_says_so_when_a_round_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("plain.md"),
        "---\nname: plain\ndescription: d\npromptforge: 0\n---\n\n# Plain\n\n## Main\n\n```lua\nreturn 'hi'\n```\n",
    )
    .unwrap();
    let (code, _, stderr) = out(dir.path(), &["run", "plain.md"]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, _, stderr) = out(dir.path(), &["runs", "show", "last", "--round", "1"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("made no model round"), "{stderr}");
    assert!(!stderr.contains("takes 1 to 0"), "{stderr}");
}

#[test]
fn a_version_2_record_without_round_events_still_replays_identically() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loop.md"), LOOP).unwrap();
    std::fs::write(dir.path().join("loop.json"), LOOP_SCRIPT).unwrap();
    let (code, _, stderr) = out(
        dir.path(),
        &[
            "run",
            "loop.md",
            "--script",
            "loop.json",
            "--record",
            "new.record",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    // What a version-2 writer made of the same run: no model_round or tool_call events.
    let record = std::fs::read_to_string(dir.path().join("new.record")).unwrap();
    let mut lines = Vec::new();
    for (n, line) in record.lines().enumerate() {
        let mut value: Value = serde_json::from_str(line).unwrap();
        if n == 0 {
            assert_eq!(value["version"], 3);
            value["version"] = Value::from(2);
        } else if matches!(
            value["event"]["event"].as_str(),
            Some("model_round" | "tool_call")
        ) {
            continue;
        }
        lines.push(value.to_string());
    }
    assert!(
        lines.len() < record.lines().count(),
        "round events were dropped"
    );
    std::fs::write(dir.path().join("old.record"), lines.join("\n") + "\n").unwrap();
    let (code, stdout, stderr) = out(dir.path(), &["replay", "old.record"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.trim(), "all done");
    assert!(stderr.contains("identical to the record"), "{stderr}");
}

#[test]
fn a_run_not_ended_is_shown_from_its_journal_with_the_round_it_waits_on() {
    // A model server that never answers in time: the run waits on its first round.
    let server = support::LocalServer::chat(
        || async {
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            "late"
        },
        (),
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("wait.md"),
        "---\nname: wait\ndescription: d\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Wait\n\n## Main\n\n```lua\nmodels.use('w')\nreturn models.infer('hi')\n```\n",
    )
    .unwrap();
    let mut child = promptforge(dir.path())
        .args(["run", "wait.md", "--model", "openai:m"])
        .env("PROMPTFORGE_HISTORY", dir.path().join("h.sqlite3"))
        .env("OPENAI_BASE_URL", format!("{}/v1", server.base()))
        .env("OPENAI_API_KEY", "k")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let shown = loop {
        let (code, text, _) = out(dir.path(), &["runs", "show", "last"]);
        if code == Some(0) && text.contains("waiting for the model") {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never shown waiting: {text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        shown.contains("(not ended: what its journal holds so far)"),
        "{shown}"
    );
    assert!(shown.contains("  not ended\n"), "{shown}");
    assert!(
        shown.contains("[task 0] model round 1 (effect 0): waiting for the model"),
        "{shown}"
    );
    let (_, round, _) = out(dir.path(), &["runs", "show", "last", "--round", "1"]);
    assert!(
        round.contains("no answer yet (the run has not ended)"),
        "{round}"
    );
    let (_, json, _) = out(dir.path(), &["runs", "show", "last", "--json"]);
    let json: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["ended"], false);
    let _ = child.kill();
    let _ = child.wait();
}

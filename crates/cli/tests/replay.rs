//! Record and replay through the real binary: every conformance case, run with `--record`,
//! replays from its record to a byte-identical outcome and event stream; an edited prompt
//! reports the right divergence; `--then-live` asks the provider only after the divergence;
//! and no secret reaches a record.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use serde_json::Value;
use support::{LocalServer, promptforge};

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/conformance/cases")
}

/// The conformance runner's command for a case (see ../shared/conformance/run), in `work`.
fn case_command(case: &Value, work: &Path) -> Vec<String> {
    let prompt = work.join("prompt.md");
    std::fs::write(&prompt, case["prompt"].as_str().unwrap()).unwrap();
    let mut cmd: Vec<String> = vec!["run".into(), prompt.display().to_string(), "--json".into()];
    if let Some(args) = case["args"].as_str() {
        cmd.extend(["--args".into(), args.into()]);
    }
    cmd.extend([
        "--seed".into(),
        case["seed"].as_u64().unwrap_or(1).to_string(),
    ]);
    cmd.extend([
        "--when".into(),
        case["when"]
            .as_str()
            .unwrap_or("2026-01-01T00:00:00Z")
            .into(),
    ]);
    for (key, flag) in [
        ("script", "--script"),
        ("snapshot", "--snapshot"),
        ("web", "--web-script"),
    ] {
        if !case[key].is_null() {
            let file = work.join(format!("{key}.json"));
            std::fs::write(&file, case[key].to_string()).unwrap();
            cmd.extend([flag.into(), file.display().to_string()]);
        }
    }
    for answer in case["inputs"].as_array().into_iter().flatten() {
        cmd.extend(["--input".into(), answer.as_str().unwrap().into()]);
    }
    let store = work.join("store");
    std::fs::create_dir_all(&store).unwrap();
    for (rel, contents) in case["store_before"].as_object().into_iter().flatten() {
        let target = store.join(rel);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(target, contents.as_str().unwrap()).unwrap();
    }
    cmd.extend(["--store".into(), store.display().to_string()]);
    cmd
}

#[test]
fn every_conformance_case_replays_byte_identically_from_its_record() {
    let dir = cases_dir();
    assert!(
        dir.is_dir(),
        "the conformance cases must sit at {} (../shared beside the project)",
        dir.display()
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|chapter| chapter.unwrap().path())
        .filter(|chapter| chapter.is_dir())
        .flat_map(|chapter| std::fs::read_dir(chapter).unwrap())
        .map(|f| f.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut replayed = 0;
    let mut problems = Vec::new();
    for file in &files {
        let case: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        // A case the runner skips, and the one that sends a signal, are not replayable runs.
        if !case["skip"].is_null() || !case["signal_after_ms"].is_null() {
            continue;
        }
        let id = case["id"].as_str().unwrap().to_owned();
        let work = tempfile::tempdir().unwrap();
        let record = work.path().join("run.record");
        let mut cmd = case_command(&case, work.path());
        cmd.extend(["--record".into(), record.display().to_string()]);
        let ran = promptforge(work.path()).args(&cmd).output().unwrap();
        let again = promptforge(work.path())
            .args(["replay", record.to_str().unwrap(), "--json"])
            .output()
            .unwrap();
        let replay_err = String::from_utf8_lossy(&again.stderr);
        if !replay_err.contains("replay: identical to the record") {
            problems.push(format!("{id}: {replay_err}"));
        } else if again.stdout != ran.stdout {
            problems.push(format!(
                "{id}: outcomes differ: {} vs {}",
                String::from_utf8_lossy(&ran.stdout),
                String::from_utf8_lossy(&again.stdout)
            ));
        } else if again.status.code() != ran.status.code() {
            problems.push(format!("{id}: exit {:?} vs {:?}", ran.status, again.status));
        }
        replayed += 1;
    }
    assert!(replayed > 400, "only {replayed} cases replayed");
    assert!(
        problems.is_empty(),
        "{} of {replayed} cases did not replay identically:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[derive(Default)]
struct Calls(AtomicUsize);

async fn chat(State(calls): State<Arc<Calls>>, body: Bytes) -> Response {
    calls.0.fetch_add(1, Ordering::SeqCst);
    let said = support::last_said(&body);
    support::sse_text(&format!("re: {said}"), None)
}

const TWO_ROUNDS: &str = "---\nname: two\ndescription: Two rounds\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Two\n\n## First\n\n```lua\nmodels.default('w')\nvar.first = models.infer('one')\nstore.write('first.txt', var.first)\n```\n\n## Second\n\n```lua\nmodels.default('w')\nreturn var.first .. ' / ' .. models.infer('two') .. ' / ' .. store.read('first.txt')\n```\n";

#[test]
fn an_edited_prompt_diverges_where_it_changed_and_then_live_pays_only_after() {
    let calls = Arc::new(Calls::default());
    let server = LocalServer::chat(chat, calls.clone());
    let dir = tempfile::tempdir().unwrap();
    let prompt = dir.path().join("two.md");
    std::fs::write(&prompt, TWO_ROUNDS).unwrap();
    let ran = promptforge(dir.path())
        .args([
            "run",
            "two.md",
            "--model",
            "openai:m",
            "--record",
            "two.record",
        ])
        .env("OPENAI_BASE_URL", format!("{}/v1", server.base()))
        .env("OPENAI_API_KEY", "sk-very-secret-key-123")
        .env("PROMPTFORGE_SECRET_PROBE", "env-value-never-recorded")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&ran.stdout),
        "re: one / re: two / re: one\n"
    );
    assert_eq!(calls.0.load(Ordering::SeqCst), 2);
    let record = std::fs::read_to_string(dir.path().join("two.record")).unwrap();
    for secret in [
        "sk-very-secret-key-123",
        "env-value-never-recorded",
        "Authorization",
        "Bearer",
    ] {
        assert!(!record.contains(secret), "{secret} leaked into the record");
    }

    // Unchanged: identical, and no request reaches the server.
    let replayed = promptforge(dir.path())
        .args(["replay", "two.record"])
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    assert_eq!(replayed.status.code(), Some(0));
    assert_eq!(replayed.stdout, ran.stdout);
    assert_eq!(calls.0.load(Ordering::SeqCst), 2);

    // Edited in the second section: the divergence names its effect, section and line.
    let edited = dir.path().join("edited.md");
    std::fs::write(
        &edited,
        TWO_ROUNDS.replace("models.infer('two')", "models.infer('TWO')"),
    )
    .unwrap();
    let diverged = promptforge(dir.path())
        .args(["replay", "two.record", "--prompt", "edited.md"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&diverged.stderr);
    assert_eq!(diverged.status.code(), Some(3), "{report}");
    let line = TWO_ROUNDS
        .lines()
        .position(|l| l.contains("models.infer('two')"))
        .unwrap()
        + 1;
    assert!(
        report.contains("replay diverged at effect 2: the model round request differs"),
        "{report}"
    );
    assert!(
        report.contains(&format!("issued by section `Second` at edited.md:{line}")),
        "{report}"
    );
    assert!(
        report.contains("--- recorded request (two.record)"),
        "{report}"
    );
    assert!(
        report.contains("+++ this run's request (edited.md)"),
        "{report}"
    );
    assert!(report.contains("-        \"content\": \"two\""), "{report}");
    assert!(report.contains("+        \"content\": \"TWO\""), "{report}");
    assert_eq!(calls.0.load(Ordering::SeqCst), 2);

    // Then live: the first round and the store come from the record; only the changed round
    // reaches the server.
    let live = promptforge(dir.path())
        .args([
            "replay",
            "two.record",
            "--prompt",
            "edited.md",
            "--then-live",
        ])
        .env("OPENAI_BASE_URL", format!("{}/v1", server.base()))
        .env("OPENAI_API_KEY", "k")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&live.stderr);
    assert_eq!(live.status.code(), Some(0), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&live.stdout),
        "re: one / re: TWO / re: one\n"
    );
    assert_eq!(
        calls.0.load(Ordering::SeqCst),
        3,
        "one live round, after the divergence"
    );
    assert!(stderr.contains("live from there"), "{stderr}");
}

#[test]
fn a_record_keeps_the_prompt_path_absolute_and_replays_from_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("work")).unwrap();
    std::fs::create_dir(dir.path().join("elsewhere")).unwrap();
    std::fs::write(
        dir.path().join("work/hello.md"),
        "---\nname: hello\ndescription: Says hello\npromptforge: 0\n---\n\n# Hello\n\n## Say\n\n```lua\nreturn 'hello ' .. args\n```\n",
    )
    .unwrap();
    let ran = promptforge(&dir.path().join("work"))
        .args([
            "run",
            "hello.md",
            "--args",
            "Ada",
            "--record",
            "../run.record",
        ])
        .output()
        .unwrap();
    assert!(ran.status.success());
    let header: Value = serde_json::from_str(
        std::fs::read_to_string(dir.path().join("run.record"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let recorded = PathBuf::from(header["prompt"]["path"].as_str().unwrap());
    assert!(recorded.is_absolute(), "{recorded:?}");
    let again = promptforge(&dir.path().join("elsewhere"))
        .args(["replay", "../run.record"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("identical to the record"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    // When the prompt has moved, the replay says which path it tried.
    std::fs::rename(
        dir.path().join("work/hello.md"),
        dir.path().join("work/moved.md"),
    )
    .unwrap();
    let moved = promptforge(&dir.path().join("elsewhere"))
        .args(["replay", "../run.record"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&moved.stderr);
    assert_eq!(moved.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&recorded.display().to_string()) && stderr.contains("--prompt PATH"),
        "{stderr}"
    );
}

#[test]
fn a_record_missing_an_answer_diverges_at_that_effect() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("three.md"),
        "---\nname: three\ndescription: three rounds\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Three\n\n## Ask\n\n```lua\nmodels.use('w')\nlocal a = models.infer('one')\nlocal b = models.infer('two')\nreturn a .. b .. models.infer('three')\n```\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("script.json"),
        r#"{"model": {"id": "scripted", "context": 8000, "thinking": "Switchable", "description": "s"}, "replies": ["a", "b", "c"]}"#,
    )
    .unwrap();
    let ran = promptforge(dir.path())
        .args([
            "run",
            "three.md",
            "--script",
            "script.json",
            "--record",
            "r.record",
        ])
        .output()
        .unwrap();
    assert!(ran.status.success());
    // Take the answer to effect 1 (of 0, 1, 2) out of the record.
    let record = std::fs::read_to_string(dir.path().join("r.record")).unwrap();
    let kept: Vec<&str> = record
        .lines()
        .filter(|l| !l.starts_with(r#"{"answer":1,"#))
        .collect();
    assert_eq!(kept.len() + 1, record.lines().count());
    std::fs::write(dir.path().join("r.record"), kept.join("\n") + "\n").unwrap();
    let replayed = promptforge(dir.path())
        .args(["replay", "r.record"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&replayed.stderr);
    assert_eq!(replayed.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains(
            "replay diverged at effect 1: the run waits for an answer the record does not have"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("issued by section `Ask`"), "{stderr}");
}

#[test]
fn a_record_cut_short_goes_live_where_it_ends_with_then_live() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("loop.md"),
        "---\nname: loop\ndescription: d\npromptforge: 0\nmodels:\n  agent: {}\n---\n\n# Loop\n\n## Main\n\n```lua\nmodels.use('agent')\nstore.append('log.txt', 'x')\ntools.add_local('lookup', 'Look up', { topic = 'string' }, function(a) return 'facts ' .. a.topic end)\nlocal msgs = messages.new():user('go')\nmodels.loop(msgs)\nreturn msgs[#msgs].content .. ' ' .. store.read('log.txt')\n```\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("all.json"),
        r#"{"model":{"id":"scripted"},"replies":[{"tool_calls":[{"id":"c1","name":"lookup","arguments":{"topic":"x"}}]},"done"]}"#,
    )
    .unwrap();
    let ran = promptforge(dir.path())
        .args([
            "run",
            "loop.md",
            "--script",
            "all.json",
            "--record",
            "full.record",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&ran.stdout).trim(),
        r#"{"outcome":"completed","result":"done x"}"#
    );
    // A record cut after the first round's answer, as a killed run's would be.
    let full = std::fs::read_to_string(dir.path().join("full.record")).unwrap();
    let first_answer = full
        .lines()
        .position(|l| l.starts_with(r#"{"answer":"#) && l.contains("tool_calls"))
        .unwrap();
    let cut: Vec<&str> = full.lines().take(first_answer + 1).collect();
    std::fs::write(dir.path().join("cut.record"), cut.join("\n") + "\n").unwrap();
    // Only the second round is left for the model: a script with one reply finishes it, the
    // store write taken from the record is not made twice.
    std::fs::write(
        dir.path().join("rest.json"),
        r#"{"model":{"id":"scripted"},"replies":["done"]}"#,
    )
    .unwrap();
    let resumed = promptforge(dir.path())
        .args([
            "replay",
            "cut.record",
            "--then-live",
            "--script",
            "rest.json",
            "--json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert_eq!(resumed.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("live from there"), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&resumed.stdout).trim(),
        r#"{"outcome":"completed","result":"done x"}"#
    );
}

#[test]
fn a_replayed_failure_opens_with_file_and_line_as_a_run_does() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("fail.md"),
        "---\nname: fail\ndescription: d\npromptforge: 0\n---\n\n# Fail\n\n## Main\n\n```lua\nlocal x = 1\nerror('no luck')\n```\n",
    )
    .unwrap();
    let ran = promptforge(dir.path())
        .args(["run", "fail.md", "--record", "fail.record"])
        .output()
        .unwrap();
    let run_err = String::from_utf8_lossy(&ran.stderr).into_owned();
    assert!(
        run_err.starts_with("fail.md:13: error[Lua]: section `Main` prologue:13: "),
        "{run_err}"
    );
    let replayed = promptforge(dir.path())
        .args(["replay", "fail.record"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&replayed.stderr);
    // The same line, the path relative to here (the record keeps it absolute).
    assert!(
        stderr
            .lines()
            .any(|l| l == run_err.lines().next().unwrap_or_default()),
        "{stderr}"
    );
    assert!(stderr.contains("identical to the record"), "{stderr}");
}

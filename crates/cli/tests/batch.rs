//! `promptforge batch` and `promptforge merge` through the real binary, against a local
//! OpenAI-compatible server that answers every round after a short wait: the batch keeps the
//! concurrency limit's worth of rounds in flight, writes one result per run in input order,
//! tallies them right, and its shards merge back into exactly the unsharded results.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::Response;
use serde_json::{Value, json};
use support::{LocalServer, promptforge};

#[derive(Default)]
struct Counts {
    requests: AtomicUsize,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    /// Requests for the `flaky` input so far: the first is refused with 401.
    flaky: AtomicUsize,
}

async fn chat(State(counts): State<Arc<Counts>>, body: Bytes) -> Response {
    counts.requests.fetch_add(1, Ordering::SeqCst);
    let now = counts.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    counts.peak.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(60)).await;
    counts.in_flight.fetch_sub(1, Ordering::SeqCst);
    let said = support::last_said(&body);
    if said.contains("flaky") && counts.flaky.fetch_add(1, Ordering::SeqCst) == 0 {
        return Response::builder()
            .status(401)
            .header("content-type", "application/json")
            .body(Body::from(
                json!({"error": {"message": "bad key today"}}).to_string(),
            ))
            .unwrap();
    }
    support::sse_text(&format!("echo: {said}"), Some((10, 5)))
}

fn server() -> (LocalServer, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    (LocalServer::chat(chat, counts.clone()), counts)
}

const PROMPT: &str = "---\nname: echo\ndescription: Echoes its argument through the model\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Echo\n\n## Ask\n\n```lua\nmodels.default('w')\nreturn models.infer('say ' .. args)\n```\n";

fn setup(inputs: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("echo.md"), PROMPT).unwrap();
    std::fs::write(dir.path().join("inputs.jsonl"), inputs).unwrap();
    dir
}

fn batch(dir: &Path, server: &LocalServer, extra: &[&str]) -> (Option<i32>, String) {
    let output = promptforge(dir)
        .args([
            "batch",
            "echo.md",
            "--inputs",
            "inputs.jsonl",
            "--model",
            "openai:echo",
            "--when",
            "2026-12-01T00:00:00Z",
        ])
        .args(extra)
        .env("OPENAI_BASE_URL", format!("{}/v1", server.base()))
        .env("OPENAI_API_KEY", "k")
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The result lines of a file, `ms` (the wall time) left out.
fn results(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| {
            let mut v: Value = serde_json::from_str(line).unwrap();
            v.as_object_mut().unwrap().remove("ms");
            v
        })
        .collect()
}

fn hundred_inputs() -> String {
    (0..100)
        .map(|k| {
            if k == 5 {
                // Completes, but not as expected.
                format!(
                    "{}\n",
                    json!({"args": format!("n{k}"), "expect": "something else"})
                )
            } else {
                format!(
                    "{}\n",
                    json!({"args": format!("n{k}"), "contains": format!("say n{k}")})
                )
            }
        })
        .collect()
}

#[test]
fn a_batch_runs_at_the_limit_and_its_shards_merge_to_the_same_results() {
    let (server, counts) = server();
    let dir = setup(&hundred_inputs());
    let (code, stderr) = batch(dir.path(), &server, &["--out", "all.jsonl"]);
    assert_eq!(code, Some(1), "one expectation fails:\n{stderr}");
    assert_eq!(counts.requests.load(Ordering::SeqCst), 100);
    assert_eq!(
        counts.peak.load(Ordering::SeqCst),
        8,
        "the server should see the concurrency limit's worth of rounds in flight"
    );
    for want in [
        "runs      100 (100 inputs × 1 repeat)",
        "passed    99",
        "failed    1",
        "errored   0",
        "tokens    1,000 in / 500 out over 100 rounds",
        "cost      unknown (no catalog price, or tokens not reported)",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in:\n{stderr}");
    }
    let all = results(&dir.path().join("all.jsonl"));
    assert_eq!(all.len(), 100);
    for (k, result) in all.iter().enumerate() {
        assert_eq!(result["index"], k as u64);
        assert_eq!(result["line"], k as u64 + 1);
        let want = if k == 5 { "failed" } else { "passed" };
        assert_eq!(result["status"], want, "{result}");
        assert_eq!(
            result["outcome"]["result"],
            format!("echo: say n{k}"),
            "{result}"
        );
    }
    assert_eq!(
        all[5]["failures"],
        json!(["expect: wanted \"something else\", got \"echo: say n5\""])
    );

    // Three slices, merged, are the same results.
    for i in 0..3 {
        let shard = format!("{i}/3");
        let out = format!("part-{i}.jsonl");
        let (code, stderr) = batch(dir.path(), &server, &["--shard", &shard, "--out", &out]);
        assert!(code == Some(0) || code == Some(1), "{stderr}");
        let part = results(&dir.path().join(&out));
        assert!(
            part.iter().all(|r| r["index"].as_u64().unwrap() % 3 == i),
            "slice {i} ran another slice's input"
        );
    }
    let merged = promptforge(dir.path())
        .args([
            "merge",
            "part-2.jsonl",
            "part-0.jsonl",
            "part-1.jsonl",
            "--out",
            "merged.jsonl",
        ])
        .output()
        .unwrap();
    let merge_err = String::from_utf8_lossy(&merged.stderr);
    assert_eq!(merged.status.code(), Some(1), "{merge_err}");
    assert!(merge_err.contains("passed    99"), "{merge_err}");
    assert_eq!(results(&dir.path().join("merged.jsonl")), all);

    // A resumed batch with nothing left to do sends nothing and keeps the file.
    let before = counts.requests.load(Ordering::SeqCst);
    let (code, stderr) = batch(dir.path(), &server, &["--out", "all.jsonl", "--resume"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(counts.requests.load(Ordering::SeqCst), before);
    assert_eq!(results(&dir.path().join("all.jsonl")), all);
}

#[test]
fn retry_errors_reruns_only_infrastructure_failures_and_resume_finishes_the_rest() {
    let (server, counts) = server();
    let dir = setup(
        "{\"args\":\"fine\",\"contains\":\"fine\"}\n\n{\"args\":\"flaky\",\"contains\":\"flaky\"}\n{\"args\":\"wrong\",\"expect\":\"no\"}\n",
    );
    let (code, stderr) = batch(dir.path(), &server, &["--out", "r.jsonl"]);
    assert_eq!(code, Some(1), "{stderr}");
    let first = results(&dir.path().join("r.jsonl"));
    assert_eq!(first.len(), 3);
    assert_eq!(
        first[1]["line"], 3,
        "blank lines are skipped, lines still count"
    );
    assert_eq!(first[1]["status"], "errored");
    assert_eq!(first[1]["infrastructure"], true);
    assert_eq!(first[1]["outcome"]["error"]["kind"], "Completion");
    assert_eq!(first[2]["status"], "failed");
    assert!(first[2].get("infrastructure").is_none());

    let before = counts.requests.load(Ordering::SeqCst);
    let (code, stderr) = batch(dir.path(), &server, &["--out", "r.jsonl", "--retry-errors"]);
    assert_eq!(
        counts.requests.load(Ordering::SeqCst),
        before + 1,
        "only the infrastructure failure runs again"
    );
    assert_eq!(code, Some(1), "the expectation failure stays:\n{stderr}");
    let second = results(&dir.path().join("r.jsonl"));
    assert_eq!(second.len(), 3);
    assert_eq!(second[0], first[0]);
    assert_eq!(second[1]["status"], "passed");
    assert_eq!(second[2], first[2]);

    // Resume: a longer inputs file runs only its new line.
    std::fs::write(
        dir.path().join("inputs.jsonl"),
        "{\"args\":\"fine\",\"contains\":\"fine\"}\n\n{\"args\":\"flaky\",\"contains\":\"flaky\"}\n{\"args\":\"wrong\",\"expect\":\"no\"}\n{\"args\":\"new\"}\n",
    )
    .unwrap();
    let before = counts.requests.load(Ordering::SeqCst);
    let (_, stderr) = batch(dir.path(), &server, &["--out", "r.jsonl", "--resume"]);
    assert_eq!(
        counts.requests.load(Ordering::SeqCst),
        before + 1,
        "{stderr}"
    );
    let third = results(&dir.path().join("r.jsonl"));
    assert_eq!(third.len(), 4);
    assert_eq!(third[3]["index"], 3);
    assert_eq!(third[3]["status"], "passed");
}

#[test]
fn repeats_are_independent_samples_with_a_pass_rate() {
    let dir = tempfile::tempdir().unwrap();
    // The result depends on the seed: about half the samples pass.
    std::fs::write(
        dir.path().join("coin.md"),
        "---\nname: coin\ndescription: Flips a coin\npromptforge: 0\n---\n\n# Coin\n\n## Flip\n\n```lua\nreturn math.random(2) == 1 and 'heads' or 'tails'\n```\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("inputs.jsonl"),
        "{\"expect\":\"heads\"}\n{\"expect\":\"heads\",\"seed\":5}\n",
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let output = promptforge(dir.path())
            .args([
                "batch",
                "coin.md",
                "--inputs",
                "inputs.jsonl",
                "--repeat",
                "20",
            ])
            .args(extra)
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run(&[]);
    assert_eq!(code, Some(1), "not every sample lands heads:\n{stderr}");
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 40);
    let seeds: std::collections::BTreeSet<u64> =
        lines.iter().map(|l| l["seed"].as_u64().unwrap()).collect();
    assert_eq!(seeds.len(), 40, "every sample has its own seed");
    assert_eq!(lines[20]["seed"], 5, "a line's seed is its first sample's");
    let heads = lines.iter().filter(|l| l["status"] == "passed").count();
    assert!((5..=35).contains(&heads), "{heads} heads of 40");
    // Only the inputs that missed are listed, each with why.
    assert!(
        stderr.contains("input 0 (line 1): ")
            && stderr.contains("): expect: wanted \"heads\", got \"tails\""),
        "{stderr}"
    );
    assert!(stderr.contains("passed all their runs"), "{stderr}");
    assert!(
        stderr.contains("  cost      none (no model rounds)"),
        "{stderr}"
    );
    // -q: the results, no summary table.
    let (_, quiet_out, quiet_err) = run(&["--pass-rate", "0"]);
    assert!(quiet_err.contains("batch summary"), "{quiet_err}");
    let quiet = promptforge(dir.path())
        .args([
            "-q",
            "batch",
            "coin.md",
            "--inputs",
            "inputs.jsonl",
            "--repeat",
            "20",
        ])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("batch summary"));
    assert_eq!(
        String::from_utf8_lossy(&quiet.stdout).lines().count(),
        quiet_out.lines().count()
    );
    // The same batch again is the same samples.
    let (_, again, _) = run(&[]);
    let strip = |text: &str| -> Vec<Value> {
        text.lines()
            .map(|l| {
                let mut v: Value = serde_json::from_str(l).unwrap();
                v.as_object_mut().unwrap().remove("ms");
                v
            })
            .collect()
    };
    assert_eq!(strip(&again), strip(&stdout));
    // A threshold no input can miss passes.
    let (code, _, stderr) = run(&["--pass-rate", "0"]);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn runs_a_stopped_batch_cut_short_are_no_results_and_resume_runs_them() {
    let (server, _) = server();
    // Ten good inputs, then a line that is not an input: the inputs are read before any run,
    // so the batch stops with nothing run and nothing written as a result.
    let good: String = (0..10)
        .map(|k| format!("{{\"args\": \"n{k}\"}}\n"))
        .collect();
    let dir = setup(&format!("{good}this is not json\n"));
    let (code, stderr) = batch(
        dir.path(),
        &server,
        &["--out", "r.jsonl", "--concurrency", "4"],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("not an input line"), "{stderr}");
    let written = if dir.path().join("r.jsonl").exists() {
        results(&dir.path().join("r.jsonl"))
    } else {
        Vec::new()
    };
    assert!(
        written
            .iter()
            .all(|r| r["outcome"]["outcome"] == "completed"),
        "a run the stop cut short was written as a result: {written:?}"
    );
    // With the inputs mended, --resume runs every input that has no result yet.
    std::fs::write(dir.path().join("inputs.jsonl"), &good).unwrap();
    let (code, stderr) = batch(dir.path(), &server, &["--out", "r.jsonl", "--resume"]);
    assert_eq!(code, Some(0), "{stderr}");
    let all = results(&dir.path().join("r.jsonl"));
    assert_eq!(all.len(), 10, "{all:?}");
    assert!(all.iter().all(|r| r["status"] == "passed"), "{all:?}");
}

#[test]
fn a_torn_last_result_line_is_dropped_and_its_run_done_again() {
    let (server, counts) = server();
    let dir = setup("{\"args\": \"a\"}\n{\"args\": \"b\"}\n{\"args\": \"c\"}\n");
    let (code, stderr) = batch(dir.path(), &server, &["--out", "r.jsonl"]);
    assert_eq!(code, Some(0), "{stderr}");
    let whole = results(&dir.path().join("r.jsonl"));
    // A kill in the middle of writing the last line leaves it cut short.
    let path = dir.path().join("r.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let cut = text.trim_end().rfind('\n').unwrap() + 20;
    std::fs::write(&path, &text[..cut]).unwrap();
    let before = counts.requests.load(Ordering::SeqCst);
    let (code, stderr) = batch(dir.path(), &server, &["--out", "r.jsonl", "--resume"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("cut short"), "{stderr}");
    assert_eq!(
        counts.requests.load(Ordering::SeqCst),
        before + 1,
        "only the torn run is done again"
    );
    assert_eq!(results(&path), whole);
}

#[test]
fn merge_notices_a_missing_slice() {
    let (server, _) = server();
    let dir = setup("{\"args\": \"a\"}\n{\"args\": \"b\"}\n{\"args\": \"c\"}\n{\"args\": \"d\"}\n");
    for i in 0..2 {
        let (code, stderr) = batch(
            dir.path(),
            &server,
            &[
                "--shard",
                &format!("{i}/2"),
                "--out",
                &format!("s{i}.jsonl"),
            ],
        );
        assert_eq!(code, Some(0), "{stderr}");
    }
    let alone = promptforge(dir.path())
        .args(["merge", "s0.jsonl", "--out", "m.jsonl"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&alone.stderr);
    assert_eq!(alone.status.code(), Some(2), "{err}");
    assert!(
        err.contains("2 of the batch's runs are missing (input 1 repeat 0, input 3 repeat 0)")
            && err.contains("slices given: 0/2"),
        "{err}"
    );
    let both = promptforge(dir.path())
        .args(["merge", "s0.jsonl", "s1.jsonl", "--out", "m.jsonl"])
        .output()
        .unwrap();
    assert_eq!(
        both.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&both.stderr)
    );
    let merged = results(&dir.path().join("m.jsonl"));
    assert_eq!(merged.len(), 4);
    assert!(
        merged.iter().all(|r| r.get("shard").is_none()),
        "{merged:?}"
    );
}

#[test]
fn a_prompt_that_reads_an_input_file_runs_without_one_and_each_batch_input_brings_its_own() {
    let (server, _) = server();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("paper.md"),
        "---\nname: paper\ndescription: reads a paper\npromptforge: 0\ninput:\n  path: paper.md\n  description: The paper\n---\n\n# Paper\n\n## Read\n\n```lua\nif not store.exists('paper.md') then return 'no paper' end\nreturn 'paper: ' .. store.read('paper.md')\n```\n",
    )
    .unwrap();
    // `run` without --input-file: the run goes on, and stderr names the expected file.
    let output = promptforge(dir.path())
        .args(["run", "paper.md"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "no paper\n");
    assert!(stderr.contains("input file `paper.md`"), "{stderr}");
    // `batch`: each input names its own file, read from the inputs file's folder.
    std::fs::create_dir(dir.path().join("in")).unwrap();
    std::fs::write(dir.path().join("in/a.txt"), "A").unwrap();
    std::fs::write(dir.path().join("in/b.txt"), "B").unwrap();
    std::fs::write(
        dir.path().join("in/inputs.jsonl"),
        "{\"input_file\": \"a.txt\"}\n{\"input_file\": \"b.txt\"}\n{}\n",
    )
    .unwrap();
    let output = promptforge(dir.path())
        .args([
            "batch",
            "paper.md",
            "--inputs",
            "in/inputs.jsonl",
            "--out",
            "r.jsonl",
        ])
        .env("OPENAI_BASE_URL", format!("{}/v1", server.base()))
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let got: Vec<String> = results(&dir.path().join("r.jsonl"))
        .iter()
        .map(|r| r["outcome"]["result"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got, ["paper: A", "paper: B", "no paper"]);
}

#[test]
fn resume_never_cuts_a_file_that_is_not_results() {
    let (server, _) = server();
    let dir = setup("{\"args\": \"a\"}\n");
    // Notes with no final newline are not a torn result: --resume refuses them untouched.
    std::fs::write(dir.path().join("notes.txt"), "my notes, no newline").unwrap();
    let (code, stderr) = batch(dir.path(), &server, &["--out", "notes.txt", "--resume"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("not a batch result line"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "my notes, no newline"
    );
}

#[test]
fn every_bad_input_line_is_found_before_any_run_and_declared_defaults_are_filled() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("typed.md"),
        "---\nname: typed\ndescription: d\npromptforge: 0\nargs:\n  topic:\n    type: string\n  words:\n    type: integer\n    optional: true\n    default: 100\n---\n\n# Typed\n\n## Echo\n\n```lua\nreturn argv.topic .. '/' .. tostring(argv.words) .. '/' .. tostring(argv.extra)\n```\n",
    )
    .unwrap();
    let run = |inputs: &str| {
        std::fs::write(dir.path().join("inputs.jsonl"), inputs).unwrap();
        let output = promptforge(dir.path())
            .args(["batch", "typed.md", "--inputs", "inputs.jsonl"])
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run(concat!(
        "{\"arg\":{\"topic\":\"a\"}}\n",
        "{\"arg\":{\"topic\":\"b\"},\"matches\":\"(\"}\n",
        "{\"arg\":{\"words\":2}}\n",
        "{\"arg\":{\"topic\":\"d\",\"words\":\"many\"}}\n",
    ));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stdout.is_empty(), "nothing ran: {stdout}");
    for want in [
        "inputs.jsonl:2: matches \"(\" is not a regular expression",
        "inputs.jsonl:3: arg: argument `topic` (string) is required and was not given",
        "inputs.jsonl:4: arg: argument `words` is declared as integer, and \"many\" is not one",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in {stderr}");
    }
    assert!(!stderr.contains("inputs.jsonl:1:"), "{stderr}");
    // Defaults are filled; fields beyond the declaration pass; a raw `args` string is untouched.
    let (code, stdout, stderr) = run(concat!(
        "{\"arg\":{\"topic\":\"a\",\"extra\":1}}\n",
        "{\"args\":\"{\\\"topic\\\":\\\"b\\\"}\"}\n",
    ));
    assert_eq!(code, Some(0), "{stderr}");
    let results: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(results[0]["outcome"]["result"], "a/100/1");
    assert_eq!(results[1]["outcome"]["result"], "b/nil/nil");
}

#[test]
fn inputs_from_a_pipe_are_read_once_and_all_run() {
    // A pipe can be read only once; the batch checks every line before the first run and
    // then feeds the workers, so it must keep what it read (it once ran nothing, exit 0).
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("plain.md"),
        "---\nname: plain\ndescription: d\npromptforge: 0\n---\n\n# Plain\n\n## Echo\n\n```lua\nreturn 'got ' .. args\n```\n",
    )
    .unwrap();
    let mut child = promptforge(dir.path())
        .args(["batch", "plain.md", "--inputs", "/dev/stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"{\"args\":\"a\"}\n{\"args\":\"b\"}\n{\"args\":\"c\"}\n")
            .unwrap();
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let got: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["outcome"]["result"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(got, ["got a", "got b", "got c"], "{stderr}");
}

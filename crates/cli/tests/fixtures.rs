//! End-to-end prompt fixtures, run through the real `promptforge` binary.
//!
//! Every `tests/fixtures/check/**/NAME.md` is checked with `promptforge check --json`, and
//! every `tests/fixtures/run/**/NAME.md` is run with `promptforge run --json`; the output is
//! compared with `NAME.expect.json` beside it. Expectations match as subsets: every key an
//! expected object names must be present with an equal value (arrays match element-wise and
//! must have the same length), so a fixture states exactly what it cares about. A key
//! `FIELD_contains` (a string or a list of strings) instead requires the actual string `FIELD`
//! to contain each of them, and `FIELD_not_contains` requires it to contain none of them.
//! `tests/fixtures/README.md` documents the format.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The fixed seed every run fixture runs with.
const SEED: &str = "7";
/// The fixed start instant every run fixture runs with (`sys.when`); a fixture whose flags
/// hold their own `--when` (or `--seed`, or `--store`) runs with that one instead. Without a
/// `--store` flag each run gets a fresh empty store folder, removed afterwards.
const WHEN: &str = "2026-03-04T05:06:07.890Z";
/// How long one fixture may run before it counts as hung.
const FIXTURE_TIMEOUT: Duration = Duration::from_secs(120);

fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// The strings a `FIELD_contains` / `FIELD_not_contains` expectation lists.
fn needles(value: &Value) -> Vec<String> {
    match value {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => s.clone(),
                other => panic!("a *_contains list holds only strings, got {other}"),
            })
            .collect(),
        other => panic!("a *_contains value is a string or a list of strings, got {other}"),
    }
}

/// Check a `FIELD_contains` (`negate == false`) or `FIELD_not_contains` expectation.
fn substrings(
    want: &Value,
    got: Option<&Value>,
    negate: bool,
    at: &str,
    problems: &mut Vec<String>,
) {
    let Some(Value::String(text)) = got else {
        problems.push(format!(
            "{at}: expected a string to search, got {}",
            got.map_or_else(|| "nothing".to_owned(), Value::to_string)
        ));
        return;
    };
    for needle in needles(want) {
        if text.contains(&needle) == negate {
            let verb = if negate { "contains" } else { "lacks" };
            problems.push(format!("{at}: {text:?} {verb} {needle:?}"));
        }
    }
}

fn subset(expected: &Value, actual: &Value, at: &str, problems: &mut Vec<String>) {
    match (expected, actual) {
        (Value::Object(want), Value::Object(got)) => {
            for (key, value) in want {
                if let Some(field) = key.strip_suffix("_not_contains") {
                    substrings(
                        value,
                        got.get(field),
                        true,
                        &format!("{at}.{field}"),
                        problems,
                    );
                } else if let Some(field) = key.strip_suffix("_contains") {
                    substrings(
                        value,
                        got.get(field),
                        false,
                        &format!("{at}.{field}"),
                        problems,
                    );
                } else {
                    match got.get(key) {
                        Some(actual) => subset(value, actual, &format!("{at}.{key}"), problems),
                        None => problems.push(format!("{at}.{key}: missing")),
                    }
                }
            }
        }
        (Value::Array(want), Value::Array(got)) => {
            if want.len() != got.len() {
                problems.push(format!(
                    "{at}: {} elements, expected {}",
                    got.len(),
                    want.len()
                ));
                return;
            }
            for (i, (w, g)) in want.iter().zip(got).enumerate() {
                subset(w, g, &format!("{at}[{i}]"), problems);
            }
        }
        _ if expected == actual => {}
        _ => problems.push(format!("{at}: got {actual}, expected {expected}")),
    }
}

/// Send SIGINT to `pid`, as a Host's Ctrl-C would (through `kill`, so no libc binding is needed).
fn interrupt(pid: u32) -> Result<(), String> {
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .map_err(|e| format!("cannot run kill: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -INT {pid} failed: {status}"))
    }
}

/// Run `cmd` to its end, or kill it after [`FIXTURE_TIMEOUT`]. With `cancel_after`, the child
/// gets SIGINT once that much time has passed.
fn output_with_timeout(mut cmd: Command, cancel_after: Option<Duration>) -> Result<Output, String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("cannot start: {e}"))?;
    // Drain both pipes on their own threads so a chatty child never blocks on a full pipe.
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let started = Instant::now();
    let mut cancel_after = cancel_after;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("cannot wait: {e}"))? {
            break status;
        }
        if cancel_after.is_some_and(|after| started.elapsed() >= after) {
            cancel_after = None;
            interrupt(child.id())?;
        }
        if started.elapsed() > FIXTURE_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("still running after {FIXTURE_TIMEOUT:?}; killed"));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    })
}

/// One fixture's command, ready to run.
struct Prepared {
    cmd: Command,
    /// Send the run SIGINT this long after it starts.
    cancel_after: Option<Duration>,
    /// A scratch folder (the run's store) that must outlive the run.
    _scratch: Option<tempfile::TempDir>,
}

impl Prepared {
    fn new(cmd: Command) -> Self {
        Self {
            cmd,
            cancel_after: None,
            _scratch: None,
        }
    }
}

/// Run every fixture under `tests/fixtures/{kind}` through `command`, in parallel, and compare
/// `pick(stdout JSON)` with the fixture's expectation; `exit` adds kind-specific checks of the
/// exit status against the parsed output.
fn each_fixture(
    kind: &str,
    command: impl Fn(&Path) -> Prepared + Sync,
    pick: impl Fn(Value) -> Value + Sync,
    exit: impl Fn(&Output, &Value) -> Option<String> + Sync,
) {
    let mut files = Vec::new();
    collect(&fixtures_root().join(kind), &mut files);
    assert!(!files.is_empty(), "no fixtures under tests/fixtures/{kind}");
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let check_one = |file: &Path| -> Option<String> {
        let expect_path = file.with_extension("expect.json");
        let expected: Value = match std::fs::read_to_string(&expect_path) {
            Ok(text) => serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", expect_path.display())),
            Err(e) => panic!("{}: {e}", expect_path.display()),
        };
        let prepared = command(file);
        let output = match output_with_timeout(prepared.cmd, prepared.cancel_after) {
            Ok(output) => output,
            Err(why) => return Some(format!("{}: {why}", file.display())),
        };
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let raw: Value = match serde_json::from_str(&stdout) {
            Ok(v) => v,
            Err(e) => {
                return Some(format!(
                    "{}: bad JSON on stdout ({e}), status {}: {stdout}\nstderr: {stderr}",
                    file.display(),
                    output.status
                ));
            }
        };
        let mut problems = Vec::new();
        if let Some(problem) = exit(&output, &raw) {
            problems.push(problem);
        }
        let actual = pick(raw);
        subset(&expected, &actual, "$", &mut problems);
        if problems.is_empty() {
            None
        } else {
            Some(format!(
                "{}:\n    {}\n    actual: {actual}",
                file.display(),
                problems.join("\n    ")
            ))
        }
    };
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(1, 8));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(file) = files.get(i) else { break };
                    if let Some(failure) = check_one(file) {
                        failures.lock().unwrap().push(failure);
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort();
    assert!(
        failures.is_empty(),
        "{} of {} fixtures failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

#[test]
fn check_fixtures() {
    each_fixture(
        "check",
        |file| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_promptforge"));
            cmd.arg("check").arg("--json").arg(file);
            Prepared::new(cmd)
        },
        |value| match value {
            Value::Array(mut reports) if reports.len() == 1 => reports.remove(0),
            other => other,
        },
        |_, _| None,
    );
}

/// The extra CLI arguments of a run fixture: its `NAME.flags.json`, a JSON list of strings,
/// or none. A value starting with `./` names a file beside the fixture.
fn run_flags(file: &Path) -> Vec<String> {
    let flags_path = file.with_extension("flags.json");
    let Ok(text) = std::fs::read_to_string(&flags_path) else {
        return Vec::new();
    };
    let flags: Vec<String> = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{}: a JSON list of strings: {e}", flags_path.display()));
    let dir = file.parent().expect("a fixture has a folder");
    flags
        .into_iter()
        .map(|flag| match flag.strip_prefix("./") {
            Some(rest) => dir.join(rest).to_string_lossy().into_owned(),
            None => flag,
        })
        .collect()
}

/// When a run fixture has a `NAME.cancel.json` (a number of milliseconds), the Host cancels the
/// run that long after it starts.
fn cancel_after(file: &Path) -> Option<Duration> {
    let path = file.with_extension("cancel.json");
    let text = std::fs::read_to_string(&path).ok()?;
    let ms: u64 = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{}: a number of milliseconds: {e}", path.display()));
    Some(Duration::from_millis(ms))
}

/// The exit status a run's outcome requires: 0 completed, 1 failed, 130 cancelled.
fn run_exit(output: &Output, outcome: &Value) -> Option<String> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    if stdout.trim_end().lines().count() != 1 {
        return Some(format!("stdout is not exactly one line: {stdout:?}"));
    }
    let want = match outcome.get("outcome").and_then(Value::as_str) {
        Some("completed") => 0,
        Some("failed") => 1,
        Some("cancelled") => 130,
        _ => return Some(format!("no known `outcome` in {outcome}")),
    };
    match output.status.code() {
        Some(code) if code == want => None,
        code => Some(format!(
            "exit status {code:?} does not match the outcome (expected {want})"
        )),
    }
}

#[test]
fn run_fixtures() {
    each_fixture(
        "run",
        |file| {
            let flags = run_flags(file);
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_promptforge"));
            cmd.arg("run").arg(file).arg("--json");
            for (flag, value) in [("--seed", SEED), ("--when", WHEN)] {
                if !flags.iter().any(|f| f == flag) {
                    cmd.args([flag, value]);
                }
            }
            // Each run gets a fresh, empty store that is removed afterwards.
            let scratch = if flags.iter().any(|f| f == "--store") {
                None
            } else {
                let dir = tempfile::tempdir().expect("a scratch store");
                cmd.arg("--store").arg(dir.path());
                Some(dir)
            };
            cmd.args(flags);
            Prepared {
                cmd,
                cancel_after: cancel_after(file),
                _scratch: scratch,
            }
        },
        |value| value,
        run_exit,
    );
}

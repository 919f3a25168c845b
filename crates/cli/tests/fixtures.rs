//! End-to-end prompt fixtures, run through the real `promptforge` binary.
//!
//! Every `tests/fixtures/check/**/NAME.md` is checked with `promptforge check --json`, and
//! every `tests/fixtures/run/**/NAME.md` is run with `promptforge run --json`; the output is
//! compared with `NAME.expect.json` beside it. Expectations match as subsets: every key an
//! expected object names must be present with an equal value (arrays match element-wise and
//! must have the same length), so a fixture states exactly what it cares about.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

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

fn subset(expected: &Value, actual: &Value, at: &str, problems: &mut Vec<String>) {
    match (expected, actual) {
        (Value::Object(want), Value::Object(got)) => {
            for (key, value) in want {
                match got.get(key) {
                    Some(actual) => subset(value, actual, &format!("{at}.{key}"), problems),
                    None => problems.push(format!("{at}.{key}: missing")),
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

fn run_fixtures(kind: &str, command: impl Fn(&Path) -> Command, pick: impl Fn(Value) -> Value) {
    let mut files = Vec::new();
    collect(&fixtures_root().join(kind), &mut files);
    assert!(!files.is_empty(), "no fixtures under tests/fixtures/{kind}");
    let mut failures = Vec::new();
    for file in &files {
        let expect_path = file.with_extension("expect.json");
        let expected: Value = match std::fs::read_to_string(&expect_path) {
            Ok(text) => serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", expect_path.display())),
            Err(e) => panic!("{}: {e}", expect_path.display()),
        };
        let output = command(file).output().expect("run promptforge");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let actual: Value = match serde_json::from_str(&stdout) {
            Ok(v) => pick(v),
            Err(e) => {
                failures.push(format!(
                    "{}: bad JSON on stdout ({e}): {stdout}",
                    file.display()
                ));
                continue;
            }
        };
        let mut problems = Vec::new();
        subset(&expected, &actual, "$", &mut problems);
        if !problems.is_empty() {
            failures.push(format!(
                "{}:\n    {}",
                file.display(),
                problems.join("\n    ")
            ));
        }
    }
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
    run_fixtures(
        "check",
        |file| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_promptforge"));
            cmd.arg("check").arg("--json").arg(file);
            cmd
        },
        |value| match value {
            Value::Array(mut reports) if reports.len() == 1 => reports.remove(0),
            other => other,
        },
    );
}

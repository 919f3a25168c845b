//! The prompts in `examples/` run as the README says, each against its scripted model in
//! `examples/scripts/` (the pipeline needs no model), and give the results they promise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(args: &[&str]) -> Value {
    let dir = root();
    let output = support::promptforge(&dir)
        // The examples run in the repository: keep their runs out of it.
        .env("PROMPTFORGE_HISTORY", "off")
        .args([
            "run",
            "--json",
            "--seed",
            "1",
            "--when",
            "2026-12-01T00:00:00Z",
        ])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "{args:?}: {e}: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[test]
fn every_example_runs_as_documented() {
    let completed = |result: &str| json!({"outcome": "completed", "result": result});
    assert_eq!(
        run(&["examples/hello.md", "--args", "Ada Lovelace"])["outcome"],
        "completed"
    );
    assert_eq!(
        run(&[
            "examples/summarize.md",
            "--script",
            "examples/scripts/summarize.json",
            "--args",
            "The lighthouse opened in 1871 and Ada Brandt kept it for forty years.",
        ]),
        completed(
            "- The lighthouse opened in 1871.\n- Ada Brandt kept it for 40 years.\n- It became a museum in 1990."
        )
    );
    assert_eq!(
        run(&[
            "examples/facts.md",
            "--script",
            "examples/scripts/facts.json"
        ]),
        completed(
            "- octopuses: They have three hearts.\n- the Moon: It drifts about 3.8 cm further from Earth every year.\n- honey: Sealed honey keeps for thousands of years."
        )
    );
    assert_eq!(
        run(&[
            "examples/agent.md",
            "--script",
            "examples/scripts/agent.json",
            "--args",
            "Where does Ada sit?",
        ]),
        completed("Ada sits in room 4, the quiet room on the second floor.")
    );
    let out = tempfile::tempdir().unwrap();
    let report = out.path().join("report.md");
    assert_eq!(
        run(&[
            "examples/pipeline.md",
            "--args",
            "the first note\nsecond note here\nthree",
            "--output-file",
            report.to_str().unwrap(),
        ]),
        completed("report.md: 7 words")
    );
    let report = std::fs::read_to_string(report).unwrap();
    assert!(report.contains("| notes/002.txt | 3 |"), "{report}");
    assert!(report.ends_with("Total: 7 words\n"), "{report}");
}

#[test]
fn every_example_checks_clean() {
    let dir = root();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    let output = support::promptforge(&dir)
        // The examples run in the repository: keep their runs out of it.
        .env("PROMPTFORGE_HISTORY", "off")
        .arg("check")
        .args(&files)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
}

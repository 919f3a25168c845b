//! A closed or failing stdout never panics: a reader that went away (`| head -c 1`) ends the
//! output quietly and the command goes on (a run still reaches the history), as `cat` and
//! `grep` do; stdout that fails otherwise (`/dev/full`) is said once and fails the command.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::process::Stdio;

use support::promptforge;

const HELLO: &str = "---\nname: hello\ndescription: Says hello\npromptforge: 0\n---\n\n# Hello\n\n## Say\n\n```lua\nreturn string.rep('hello ' .. args .. '\\n', 20000)\n```\n";

/// Stdout whose reader is already gone: every write fails with a broken pipe.
fn closed_stdout() -> Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Stdio::from(writer)
}

#[test]
fn a_closed_stdout_ends_every_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.md"), HELLO).unwrap();
    let commands: [&[&str]; 10] = [
        &["run", "hello.md", "--args", "x"],
        &["run", "hello.md", "--args", "x", "--json"],
        &["run", "hello.md", "--args", "x", "--events"],
        &["check", "hello.md"],
        &["describe", "hello.md"],
        &["runs"],
        &["runs", "show", "1"],
        &["runs", "export", "1"],
        &["models"],
        &["completions", "bash"],
    ];
    for args in commands {
        let output = promptforge(dir.path())
            .args(args)
            .stdout(closed_stdout())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_ne!(output.status.code(), Some(101), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("standard output") && !stderr.contains("Broken pipe"),
            "{args:?} was not quiet: {stderr}"
        );
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
    }
    // Each of the three runs still reached the history.
    let listing = promptforge(dir.path())
        .args(["runs", "--json"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&listing.stdout).lines().count(),
        3,
        "{}",
        String::from_utf8_lossy(&listing.stdout)
    );
}

#[test]
fn a_full_stdout_is_said_once_and_fails_the_command() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.md"), HELLO).unwrap();
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        return; // no /dev/full here
    };
    let output = promptforge(dir.path())
        .args(["run", "hello.md", "--args", "x", "--json"])
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr
            .matches("error: cannot write to standard output")
            .count(),
        1,
        "{stderr}"
    );
}

#[test]
fn a_record_that_cannot_be_written_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.md"), HELLO).unwrap();
    if !std::path::Path::new("/dev/full").exists() {
        return;
    }
    let output = promptforge(dir.path())
        .args([
            "run",
            "hello.md",
            "--args",
            "x",
            "--json",
            "--record",
            "/dev/full",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: cannot write the record"),
        "{stderr}"
    );
}

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point
//! Hardening through the real binary: runs that must end, stay bounded, and keep their data
//! intact whatever the input (issue 10).

use std::path::Path;
use std::process::{Command, Stdio};

fn prompt(dir: &Path, body: &str) -> std::path::PathBuf {
    let path = dir.join("prompt.md");
    std::fs::write(
        &path,
        format!("---\nname: hardening\ndescription: d\npromptforge: 0\n---\n\n# Hardening\n\n## Main\n\n```lua\n{body}\n```\n"),
    )
    .unwrap();
    path
}

/// A `store.append` that fails half way (here: the file-size limit, as a full disk would)
/// leaves the file exactly as it was.
#[cfg(target_os = "linux")]
#[test]
fn a_failed_append_is_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    let path = prompt(
        dir.path(),
        "store.append('log.txt', string.rep('a', 600))\n\
         local ok = pcall(store.append, 'log.txt', string.rep('b', 600))\n\
         return tostring(ok) .. ' ' .. #store.read('log.txt')",
    );
    // `ulimit -f 1` caps files at 1024 bytes; SIGXFSZ ignored, so the write fails with EFBIG.
    let script = format!(
        "trap '' XFSZ; ulimit -f 1; exec '{}' run '{}' --json --seed 1 --store '{}'",
        env!("CARGO_BIN_EXE_promptforge"),
        path.display(),
        store.display()
    );
    let output = Command::new("bash")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(r#""result":"false 600""#),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        std::fs::read(store.join("log.txt")).unwrap(),
        vec![b'a'; 600]
    );
}

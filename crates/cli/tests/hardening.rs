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

/// Run `body`, send Ctrl-C (SIGINT) after `after`, and return (exit code, stdout, time from
/// the signal to the end).
#[cfg(unix)]
fn cancel_after(
    body: &str,
    after: std::time::Duration,
) -> (Option<i32>, String, std::time::Duration) {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let path = prompt(dir.path(), body);
    let mut child = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .args(["run"])
        .arg(&path)
        .args(["--json", "--seed", "1", "--store"])
        .arg(dir.path().join("store"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(after);
    let signalled = Instant::now();
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if signalled.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("the run did not end within 10 s of Ctrl-C: {body}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let elapsed = signalled.elapsed();
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        elapsed,
    )
}

/// Work inside C library functions, which the instruction-counting cancel hook never reaches:
/// each class ends cancelled within a second of Ctrl-C.
#[cfg(unix)]
#[test]
fn a_run_always_ends_on_ctrl_c() {
    let classes = [
        // A catastrophic pattern: one `string.find` call that would run for ages.
        "return string.find(string.rep('a', 100000), '.-.-.-.-.-.-.-b')",
        // `table.move` over a huge range.
        "table.move({1, 2, 3}, 1, math.maxinteger - 1, 2, {}) return 'x'",
        // Heavy calls in a short loop: few instructions between long C calls.
        "local s = string.rep('a', 10000000) for i = 1, 1000 do s:gsub('a', 'b') end return 'x'",
        "local s = string.rep('ab', 5000000) for i = 1, 1000000 do s:find('c', 1, true) end return 'x'",
        "for i = 1, 1000 do local s = string.rep('xyz', 5000000) end return 'x'",
        "local t = {} for i = 1, 100 do t[i] = string.rep('x', 100000) end for i = 1, 100000 do local s = table.concat(t) end return 'x'",
        "local s = string.rep('a', 8000000) for i = 1, 100000 do local u = string.format('%s%s', s, 'b') end return 'x'",
        "local s = string.rep('a b ', 5000000) for w in s:gmatch('%a+') do end for w in s:gmatch('%a+') do end return 'x'",
        "local t = {} for i = 1, 3000000 do t[i] = (i * 7919) % 1000003 end for i = 1, 100 do table.sort(t) end return 'x'",
        "local s = string.rep('a', 8000000) for i = 1, 100000 do local u = s:upper() local r = s:reverse() end return 'x'",
    ];
    for body in classes {
        let (code, stdout, elapsed) = cancel_after(body, std::time::Duration::from_millis(400));
        assert_eq!(code, Some(130), "{body}: {stdout}");
        assert_eq!(stdout.trim(), r#"{"outcome":"cancelled"}"#, "{body}");
        assert!(
            elapsed < std::time::Duration::from_secs(1),
            "{body}: ended {elapsed:?} after Ctrl-C"
        );
    }
}

/// A `__gc` finalizer never runs (Lua would run it with hooks off, out of a cancel's reach,
/// and at teardown): a looping one neither hangs the run's end nor stops a later cancel.
#[cfg(unix)]
#[test]
fn finalizers_never_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = prompt(
        dir.path(),
        "local mt = { __gc = function() while true do end end }\n\
         for i = 1, 1000 do setmetatable({}, mt) end\n\
         local t = setmetatable({}, mt)\n\
         assert(getmetatable(t) == mt and mt.__gc ~= nil)\n\
         local junk = {} for i = 1, 200000 do junk[i] = { i } end junk = nil\n\
         return 'done'",
    );
    let started = std::time::Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .args(["run"])
        .arg(&path)
        .args(["--json", "--seed", "1", "--store"])
        .arg(dir.path().join("store"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        r#"{"outcome":"completed","result":"done"}"#
    );
    let (code, stdout, elapsed) = cancel_after(
        "setmetatable({}, { __gc = function() while true do end end }) while true do end",
        std::time::Duration::from_millis(300),
    );
    assert_eq!(
        (code, stdout.trim()),
        (Some(130), r#"{"outcome":"cancelled"}"#)
    );
    assert!(elapsed < std::time::Duration::from_secs(1));
}

/// Every file the Host reads for a run is capped, and only a regular file is read: a FIFO or
/// a device is refused at once instead of being read for ever.
#[cfg(unix)]
#[test]
fn host_files_are_capped_and_never_read_from_a_pipe_or_device() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&std::ffi::OsStr]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_promptforge"));
        command.arg("run").args(args).stdin(Stdio::null());
        let started = std::time::Instant::now();
        let output = command.output().unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let big = dir.path().join("big.md");
    std::fs::write(&big, vec![b'\n'; 1024 * 1024 + 1]).unwrap();
    let (code, stderr) = run(&[big.as_os_str()]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("is larger than the 1048576-byte limit for this file"),
        "{stderr}"
    );
    let fifo = dir.path().join("fifo.md");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let (code, stderr) = run(&[fifo.as_os_str()]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("is not a regular file"), "{stderr}");
    let ok = prompt(dir.path(), "return 'ok'");
    for flag in ["--snapshot", "--script", "--web-script"] {
        let (code, stderr) = run(&[
            ok.as_os_str(),
            std::ffi::OsStr::new(flag),
            std::ffi::OsStr::new("/dev/zero"),
        ]);
        assert_eq!(code, Some(2), "{flag}: {stderr}");
        assert!(stderr.contains("is not a regular file"), "{flag}: {stderr}");
    }
}

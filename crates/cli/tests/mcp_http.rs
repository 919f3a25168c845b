//! `mcp serve --http` refuses requests a web page elsewhere sends (the MCP transport's guard
//! against DNS rebinding): a foreign or `null` `Origin` gets 403 before any session exists,
//! while clients that send no `Origin` and pages on this machine are served. Needs nothing
//! from npm: plain HTTP over 127.0.0.1.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;

use support::promptforge;

const PROMPT: &str = "---\nname: hello\ndescription: Says hello\npromptforge: 0\n---\n\n# Hello\n\n## Say\n\n```lua\nreturn 'hello ' .. args\n```\n";

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

/// POST an `initialize` request to `/mcp`, with `origin` when given; the status line.
fn initialize(addr: &str, origin: Option<&str>) -> String {
    post(addr, origin, INITIALIZE)
}

/// POST `body` as JSON to `/mcp`; the status line.
fn post(addr: &str, origin: Option<&str>, body: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    let origin = origin
        .map(|o| format!("Origin: {o}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\n{origin}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.lines().next().unwrap_or_default().to_owned()
}

/// The address `mcp serve --http` says it serves at (its first line on stderr).
fn served_address(child: &mut std::process::Child) -> String {
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    line.split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned()
}

#[test]
fn requests_from_foreign_origins_are_refused_and_malformed_json_is_a_bad_request() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.md"), PROMPT).unwrap();
    std::fs::write(
        dir.path().join("none.json"),
        r#"{"model": {"id": "scripted", "context": 8000, "thinking": "Switchable", "description": "s"}, "replies": []}"#,
    )
    .unwrap();
    let mut child = promptforge(dir.path())
        .args([
            "mcp",
            "serve",
            ".",
            // A host name, not only an address (`localhost:0`: a free port on the loopback).
            "--http",
            "localhost:0",
            "--script",
            "none.json",
        ])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let addr = served_address(&mut child);
    let refused = [
        initialize(&addr, Some("http://evil.example")),
        initialize(&addr, Some("null")),
    ];
    let served = [
        initialize(&addr, None),
        initialize(&addr, Some("http://localhost:5173")),
    ];
    let malformed = post(&addr, None, "{bad json");
    let _ = child.kill();
    let _ = child.wait();
    assert!(malformed.contains(" 400 "), "{malformed}");
    for status in refused {
        assert!(status.contains(" 403 "), "{status}");
    }
    for status in served {
        assert!(status.contains(" 200 "), "{status}");
    }
}

#[test]
fn a_token_of_only_white_space_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.md"), PROMPT).unwrap();
    let output = promptforge(dir.path())
        .args([
            "mcp",
            "serve",
            ".",
            "--http",
            "127.0.0.1:0",
            "--token-env",
            "PF_TOKEN",
        ])
        .env("PF_TOKEN", "   ")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("only white space"), "{stderr}");
}

/// POST `body` with the session header on a new connection, handed back unread.
fn post_in_session(addr: &str, session: Option<&str>, body: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    let session = session
        .map(|s| format!("Mcp-Session-Id: {s}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\n{session}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream
}

#[test]
fn a_client_that_vanishes_has_its_calls_stopped_after_the_idle_timeout() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    // A model server that never answers, counting the rounds that reach it.
    let rounds = Arc::new(AtomicUsize::new(0));
    let counted = rounds.clone();
    let hanging = support::LocalServer::chat(
        move || {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
                ""
            }
        },
        (),
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ask.md"),
        "---\nname: ask\ndescription: Asks the model\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Ask\n\n## Ask\n\n```lua\nmodels.use('w')\nreturn models.infer('hello')\n```\n",
    )
    .unwrap();
    let mut child = promptforge(dir.path())
        .args([
            "mcp",
            "serve",
            "ask.md",
            "--http",
            "127.0.0.1:0",
            "--model",
            "openai:m",
            "--idle-timeout",
            "1",
        ])
        .env("OPENAI_BASE_URL", format!("{}/v1", hanging.base()))
        .env("OPENAI_API_KEY", "k")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let addr = served_address(&mut child);
    let mut reply = String::new();
    let _ = post_in_session(&addr, None, INITIALIZE).read_to_string(&mut reply);
    let session = reply
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("mcp-session-id")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no session in {reply}"));
    let _ = post_in_session(
        &addr,
        Some(&session),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .read_to_string(&mut String::new());
    // Call the tool; once its round reaches the model, go away without reading the reply or
    // ending the session.
    let call = post_in_session(
        &addr,
        Some(&session),
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ask","arguments":{}}}"#,
    );
    let began = std::time::Instant::now();
    while rounds.load(Ordering::SeqCst) == 0 {
        assert!(
            began.elapsed() < std::time::Duration::from_secs(20),
            "the call never reached the model"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(call);
    // After the idle timeout (and rmcp's grace for handlers to finish), the run is stopped
    // and kept in the history as cancelled.
    let stopped = loop {
        let runs = promptforge(dir.path())
            .args(["runs", "--json"])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&runs.stdout).contains(r#""outcome":"cancelled""#) {
            break true;
        }
        if began.elapsed() > std::time::Duration::from_secs(30) {
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(stopped, "the vanished client's call was never stopped");
}

#[test]
fn sigterm_stops_the_server_as_ctrl_c_does() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.md"), PROMPT).unwrap();
    let mut child = promptforge(dir.path())
        .args(["mcp", "serve", ".", "--http", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let _ = served_address(&mut child);
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let began = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            began.elapsed() < std::time::Duration::from_secs(10),
            "the server did not stop on SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
}

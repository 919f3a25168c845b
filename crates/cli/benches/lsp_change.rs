//! A change to a 3,000-section prompt answered by `promptforge lsp` over its real stdio:
//! from the `didChange` written to the diagnostics read back, the whole path an editor waits
//! on (the edit applied, the document analysed again, positions converted, the answer
//! serialised and written). Issue 26's target: within 50 ms.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};

fn send(stdin: &mut ChildStdin, message: &Value) {
    let body = message.to_string();
    write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    stdin.flush().unwrap();
}

/// Read messages until the next diagnostics; their count.
fn diagnostics(stdout: &mut BufReader<ChildStdout>) -> usize {
    loop {
        let mut length = 0;
        loop {
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some(n) = line.strip_prefix("Content-Length: ") {
                length = n.parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        stdout.read_exact(&mut body).unwrap();
        let message: Value = serde_json::from_slice(&body).unwrap();
        if message["method"] == "textDocument/publishDiagnostics" {
            return message["params"]["diagnostics"]
                .as_array()
                .map_or(0, Vec::len);
        }
    }
}

fn lsp_change(c: &mut Criterion) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .arg("lsp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let uri = "file:///bench/big.md";
    send(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"processId": null, "rootUri": null, "capabilities": {}}}),
    );
    send(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}),
    );
    send(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
            "uri": uri, "languageId": "promptforge", "version": 1,
            "text": promptforge_ide::sample_prompt(3000)}}}),
    );
    assert_eq!(diagnostics(&mut stdout), 0);
    // Line 12 (0-based) is `Say something about part 0.`: type a letter, then take it back.
    let mut version = 1;
    let mut typed = false;
    c.bench_function("lsp: a change to a 3,000-section prompt, diagnostics back", |b| {
        b.iter(|| {
            version += 1;
            let change = if typed {
                json!({"range": {"start": {"line": 12, "character": 0}, "end": {"line": 12, "character": 1}}, "text": ""})
            } else {
                json!({"range": {"start": {"line": 12, "character": 0}, "end": {"line": 12, "character": 0}}, "text": "x"})
            };
            typed = !typed;
            send(
                &mut stdin,
                &json!({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {
                    "textDocument": {"uri": uri, "version": version}, "contentChanges": [change]}}),
            );
            diagnostics(&mut stdout)
        })
    });
    send(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "shutdown", "params": null}),
    );
    send(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "method": "exit", "params": null}),
    );
    let _ = child.wait();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = lsp_change
}
criterion_main!(benches);

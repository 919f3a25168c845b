//! A change to a 3,000-section prompt answered by `promptforge lsp` over its real stdio:
//! from the `didChange` written to the diagnostics read back, the whole path an editor waits
//! on (the edit applied, the document analysed again, positions converted, the answer
//! serialised and written). Issue 26's target: within 50 ms.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../tests/lsp_client/mod.rs"]
mod lsp_client;

use criterion::{Criterion, criterion_group, criterion_main};
use lsp_client::Client;
use serde_json::{Value, json};

fn lsp_change(c: &mut Criterion) {
    let mut client = Client::start();
    let uri = "file:///bench/big.md";
    client.request(
        "initialize",
        json!({"processId": null, "rootUri": null, "capabilities": {}}),
    );
    client.notify("initialized", json!({}));
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "promptforge", "version": 1,
               "text": promptforge_ide::sample_prompt(3000)}}),
    );
    assert_eq!(client.diagnostics(), Vec::<Value>::new());
    // Line 12 (0-based) is `Say something about part 0.`: type a letter, then take it back.
    let mut version = 1;
    let mut typed = false;
    c.bench_function("lsp: a change to a 3,000-section prompt, diagnostics back", |b| {
        b.iter(|| {
            version += 1;
            let end = u32::from(typed);
            let text = if typed { "" } else { "x" };
            typed = !typed;
            client.notify(
                "textDocument/didChange",
                json!({"textDocument": {"uri": uri, "version": version}, "contentChanges": [
                    {"range": {"start": {"line": 12, "character": 0}, "end": {"line": 12, "character": end}}, "text": text}
                ]}),
            );
            client.diagnostics().len()
        })
    });
    client.request("shutdown", Value::Null);
    client.notify("exit", Value::Null);
    let _ = client.child.wait();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = lsp_change
}
criterion_main!(benches);

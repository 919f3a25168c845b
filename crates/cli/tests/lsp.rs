//! `promptforge lsp` over its real stdio, speaking the protocol as an editor does: the
//! handshake, diagnostics on open and on an incremental change, definition, references,
//! completion, hover, symbols, folding, and a clean shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod lsp_client;

use lsp_client::Client;
use serde_json::{Value, json};

const URI: &str = "file:///tmp/p.md";

const TEXT: &str = "---\nname: p\ndescription: d\npromptforge: 0\nmodels:\n  writer: {}\n---\n\n# P\n\n## Main\n\n```lua\nmodels.use('writer')\nreturn call('## Sumarize')\n```\n\n## Summarize\n\nSay it short.\n\n```lua\nlocal x = = 1\n```\n";

fn at(line: u32, character: u32) -> Value {
    json!({"textDocument": {"uri": URI}, "position": {"line": line, "character": character}})
}

#[test]
fn an_editor_session_over_stdio() {
    let mut client = Client::start();
    let init = client.request(
        "initialize",
        json!({"processId": null, "rootUri": null, "capabilities": {}}),
    );
    let caps = &init["capabilities"];
    assert_eq!(caps["positionEncoding"], "utf-16");
    assert_eq!(caps["textDocumentSync"], 2, "incremental");
    for provider in [
        "definitionProvider",
        "referencesProvider",
        "hoverProvider",
        "documentSymbolProvider",
        "foldingRangeProvider",
        "completionProvider",
    ] {
        assert!(!caps[provider].is_null(), "{provider}");
    }
    client.notify("initialized", json!({}));
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": URI, "languageId": "promptforge", "version": 1, "text": TEXT}}),
    );
    // Two unrelated problems: the typo'd reference (a warning with a suggestion) and a Lua
    // syntax error (an error), each at its own line.
    let diagnostics = client.diagnostics();
    let seen: Vec<(u64, u64, String)> = diagnostics
        .iter()
        .map(|d| {
            (
                d["range"]["start"]["line"].as_u64().unwrap(),
                d["severity"].as_u64().unwrap(),
                d["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!((seen[0].0, seen[0].1), (14, 2));
    assert!(
        seen[0].2.contains("did you mean `## Summarize`?"),
        "{seen:?}"
    );
    assert_eq!((seen[1].0, seen[1].1), (22, 1));

    // Fix the typo with an incremental edit: `Sumarize` → `Summarize` (insert an `m`).
    client.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": URI, "version": 2}, "contentChanges": [
            {"range": {"start": {"line": 14, "character": 18}, "end": {"line": 14, "character": 18}}, "text": "m"}
        ]}),
    );
    let diagnostics = client.diagnostics();
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    assert_eq!(diagnostics[0]["severity"], 1);

    // From the reference to its heading, and back.
    let definition = client.request("textDocument/definition", at(14, 16));
    assert_eq!(definition["uri"], URI);
    assert_eq!(definition["range"]["start"]["line"], 17);
    let references = client.request("textDocument/references", at(17, 3));
    let lines: Vec<u64> = references
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["range"]["start"]["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, [17, 14]);

    // Completion inside the reference, and after `models.`.
    let items = client.request("textDocument/completion", at(14, 16));
    let labels: Vec<&str> = items
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["## Summarize"]);
    let items = client.request("textDocument/completion", at(13, 7));
    assert!(
        items
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["label"] == "loop"),
        "{items}"
    );

    // Hover on an Engine function, document symbols and folding ranges.
    let hover = client.request("textDocument/hover", at(13, 8));
    assert!(
        hover["contents"]["value"]
            .as_str()
            .unwrap()
            .contains("models.use(label, options?)"),
        "{hover}"
    );
    let symbols = client.request(
        "textDocument/documentSymbol",
        json!({"textDocument": {"uri": URI}}),
    );
    assert_eq!(symbols[0]["name"], "P");
    let children: Vec<&str> = symbols[0]["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(children, ["Main", "Summarize"]);
    let folds = client.request(
        "textDocument/foldingRange",
        json!({"textDocument": {"uri": URI}}),
    );
    assert!(
        folds
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["startLine"] == 0 && f["endLine"] == 6),
        "{folds}"
    );

    client.request("shutdown", Value::Null);
    client.notify("exit", Value::Null);
    let status = client.child.wait().unwrap();
    assert!(status.success());
}

/// A prompt with non-ASCII text before the positions asked about, the task target forms,
/// a frontmatter key, role and tool completions, and declared args.
const MORE: &str = "---\nname: more\ndescription: d\npromptforge: 0\nmodels:\n  writer: {}\ntools:\n  search: promptforge/web/search\nargs:\n  days:\n    type: integer\n---\n\n# Más\n\n## Main\n\nCall `task` with {\"target\": \"## Résumé\"}.\n\n```lua\nlocal s = 'é'; models.use('writer')\ntools.add('search')\nlocal d = argv.days\nlocal ok = pcall(call, '## Résumé')\n```\n\n## Résumé\n\nSummarise the week.\n";

#[test]
fn every_request_kind_in_utf8_and_a_closed_file_keeps_no_diagnostics() {
    let mut client = Client::start();
    let init = client.request(
        "initialize",
        json!({"processId": null, "rootUri": null,
               "capabilities": {"general": {"positionEncodings": ["utf-8", "utf-16"]}}}),
    );
    // A client that can count bytes gets byte columns.
    assert_eq!(init["capabilities"]["positionEncoding"], "utf-8");
    client.notify("initialized", json!({}));
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": URI, "languageId": "promptforge", "version": 1, "text": MORE}}),
    );
    assert_eq!(client.diagnostics(), Vec::<Value>::new());

    let labels = |items: Value| -> Vec<String> {
        items
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["label"].as_str().unwrap().to_owned())
            .collect()
    };
    // Line 20 (0-based) is `local s = 'é'; models.use('writer')`: `é` is two bytes, so the
    // role label's first letter is at byte 28.
    assert_eq!(
        labels(client.request("textDocument/completion", at(20, 28))),
        ["writer"]
    );
    // A tool alias, and the declared args after `argv.`.
    assert_eq!(
        labels(client.request("textDocument/completion", at(21, 11))),
        ["search"]
    );
    assert_eq!(
        labels(client.request("textDocument/completion", at(22, 15))),
        ["days"]
    );
    // A frontmatter key at the top level and one an arg takes.
    assert!(
        labels(client.request("textDocument/completion", at(1, 0)))
            .contains(&"max_tool_iterations".to_owned())
    );
    assert!(
        labels(client.request("textDocument/completion", at(10, 4)))
            .contains(&"optional".to_owned())
    );

    // `pcall(call, '## Résumé')` and the prose `"target"` both go to the heading (line 26).
    for position in [at(23, 25), at(17, 32)] {
        let definition = client.request("textDocument/definition", position);
        assert_eq!(definition["range"]["start"]["line"], 26, "{definition}");
    }
    // Hover on a section reference shows its first prose line; on a frontmatter key, the key.
    let hover = client.request("textDocument/hover", at(23, 25));
    assert!(
        hover["contents"]["value"]
            .as_str()
            .unwrap()
            .contains("Summarise the week."),
        "{hover}"
    );
    let hover = client.request("textDocument/hover", at(4, 2));
    assert!(
        hover["contents"]["value"]
            .as_str()
            .unwrap()
            .contains("models"),
        "{hover}"
    );

    // A typo'd target in prose is a warning; closing the file clears what was shown.
    client.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": URI, "version": 2}, "contentChanges": [{"text": MORE.replace("{\"target\": \"## Résumé\"}", "{\"target\": \"## Resume\"}")}]}),
    );
    let diagnostics = client.diagnostics();
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    assert_eq!(diagnostics[0]["severity"], 2);
    assert_eq!(diagnostics[0]["range"]["start"]["line"], 17);
    client.notify(
        "textDocument/didClose",
        json!({"textDocument": {"uri": URI}}),
    );
    assert_eq!(client.diagnostics(), Vec::<Value>::new());

    client.request("shutdown", Value::Null);
    client.notify("exit", Value::Null);
    assert!(client.child.wait().unwrap().success());
}

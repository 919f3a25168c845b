//! `promptforge lsp`: a language server over stdio for prompt files.
//!
//! The answers come from `promptforge-ide` (pure functions of the text); this module only
//! speaks the protocol: it keeps the open documents (incremental sync), analyses a document
//! again on every change, publishes its diagnostics, and turns the analysis's 1-based
//! line/byte positions into the client's encoding (UTF-16 unless the client offers UTF-8).
//! Built on rust-analyzer's `lsp-server` (see docs/decisions.md for why).

use std::collections::HashMap;
use std::process::ExitCode;

use clap::Args;
use lsp_server::{Connection, Message, Notification, Request, Response};
use lsp_types as lsp;
use promptforge_ide::{Analysis, CompletionKind, Pos, Severity, Span, Symbol};
use serde_json::{Value as Json, json};

#[derive(Debug, Args)]
pub struct LspArgs {
    /// Speak over stdio (the default, and the only transport).
    #[arg(long)]
    stdio: bool,
}

pub fn lsp(_args: &LspArgs) -> ExitCode {
    match serve() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            errln!("error: promptforge lsp: {message}");
            ExitCode::from(1)
        }
    }
}

/// One open document: its text, where its lines start, and its analysis.
struct Document {
    text: String,
    starts: Vec<usize>,
    analysis: Analysis,
    /// The client opened it as a prompt (language id `promptforge`). A file opened as plain
    /// Markdown is reported on only while its frontmatter has a `promptforge:` key, so a
    /// server attached to every Markdown file says nothing about READMEs and blog posts.
    claimed: bool,
}

impl Document {
    fn new(text: String, claimed: bool) -> Document {
        let analysis = Analysis::new(&text);
        let starts = line_starts(&text);
        Document {
            text,
            starts,
            analysis,
            claimed,
        }
    }

    /// Whether its diagnostics are shown.
    fn is_prompt(&self) -> bool {
        self.claimed || declares_promptforge(&self.text)
    }

    fn view(&self) -> Text<'_> {
        Text {
            text: &self.text,
            starts: &self.starts,
        }
    }
}

/// Whether a text's frontmatter (from a first `---` line to the next) has a top-level
/// `promptforge:` key: what marks a Markdown file as a prompt.
fn declares_promptforge(text: &str) -> bool {
    let mut lines = text.trim_start_matches('\u{feff}').lines();
    if lines.next().map(str::trim) != Some("---") {
        return false;
    }
    // A top-level key, written plain or quoted, with or without space before the colon.
    lines.take_while(|l| l.trim() != "---").any(|l| {
        !l.starts_with([' ', '\t'])
            && l.split_once(':').is_some_and(|(key, _)| {
                key.trim().trim_matches(|c| c == '"' || c == '\'') == "promptforge"
            })
    })
}

/// A document's text with its line starts, for converting positions without scanning it.
#[derive(Clone, Copy)]
struct Text<'a> {
    text: &'a str,
    starts: &'a [usize],
}

/// Where each line starts, as the analysis reads the text (a leading byte-order mark is not
/// part of the first line's columns).
fn line_starts(text: &str) -> Vec<usize> {
    let bom = if text.starts_with('\u{feff}') { 3 } else { 0 };
    std::iter::once(bom)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .collect()
}

/// The server's state: the open documents and the position encoding agreed with the client.
struct Server {
    documents: HashMap<String, Document>,
    utf8: bool,
}

fn serve() -> Result<(), String> {
    let (connection, io_threads) = Connection::stdio();
    let (id, params) = connection.initialize_start().map_err(|e| e.to_string())?;
    let params: lsp::InitializeParams =
        serde_json::from_value(params).map_err(|e| format!("initialize: {e}"))?;
    let utf8 = params
        .capabilities
        .general
        .as_ref()
        .and_then(|g| g.position_encodings.as_ref())
        .is_some_and(|encodings| encodings.contains(&lsp::PositionEncodingKind::UTF8));
    let capabilities = lsp::ServerCapabilities {
        position_encoding: Some(if utf8 {
            lsp::PositionEncodingKind::UTF8
        } else {
            lsp::PositionEncodingKind::UTF16
        }),
        text_document_sync: Some(lsp::TextDocumentSyncCapability::Kind(
            lsp::TextDocumentSyncKind::INCREMENTAL,
        )),
        definition_provider: Some(lsp::OneOf::Left(true)),
        references_provider: Some(lsp::OneOf::Left(true)),
        hover_provider: Some(lsp::HoverProviderCapability::Simple(true)),
        document_symbol_provider: Some(lsp::OneOf::Left(true)),
        folding_range_provider: Some(lsp::FoldingRangeProviderCapability::Simple(true)),
        completion_provider: Some(lsp::CompletionOptions {
            trigger_characters: Some(
                [".", "'", "\"", "#", " "]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect(),
            ),
            ..lsp::CompletionOptions::default()
        }),
        ..lsp::ServerCapabilities::default()
    };
    let result = json!({
        "capabilities": capabilities,
        "serverInfo": {"name": "promptforge", "version": env!("CARGO_PKG_VERSION")},
    });
    connection
        .initialize_finish(id, result)
        .map_err(|e| e.to_string())?;
    let mut server = Server {
        documents: HashMap::new(),
        utf8,
    };
    for message in &connection.receiver {
        match message {
            Message::Request(request) => {
                if connection
                    .handle_shutdown(&request)
                    .map_err(|e| e.to_string())?
                {
                    break;
                }
                let response = server.request(request);
                connection
                    .sender
                    .send(Message::Response(response))
                    .map_err(|e| e.to_string())?;
            }
            Message::Notification(notification) => {
                for out in server.notification(notification) {
                    connection
                        .sender
                        .send(Message::Notification(out))
                        .map_err(|e| e.to_string())?;
                }
            }
            Message::Response(_) => {}
        }
    }
    drop(connection);
    io_threads.join().map_err(|e| e.to_string())
}

impl Server {
    /// A notification; what to send back (diagnostics after a change).
    fn notification(&mut self, notification: Notification) -> Vec<Notification> {
        let uri = match notification.method.as_str() {
            "textDocument/didOpen" => {
                let Ok(p) =
                    serde_json::from_value::<lsp::DidOpenTextDocumentParams>(notification.params)
                else {
                    return Vec::new();
                };
                let uri = p.text_document.uri.to_string();
                let claimed = p.text_document.language_id == "promptforge";
                self.documents
                    .insert(uri.clone(), Document::new(p.text_document.text, claimed));
                uri
            }
            "textDocument/didChange" => {
                let Ok(p) =
                    serde_json::from_value::<lsp::DidChangeTextDocumentParams>(notification.params)
                else {
                    return Vec::new();
                };
                let uri = p.text_document.uri.to_string();
                let Some(document) = self.documents.get_mut(&uri) else {
                    return Vec::new();
                };
                let mut text = std::mem::take(&mut document.text);
                for change in p.content_changes {
                    match change.range {
                        Some(range) => {
                            let start = offset(&text, range.start, self.utf8);
                            let end = offset(&text, range.end, self.utf8).max(start);
                            text.replace_range(start..end, &change.text);
                        }
                        None => text = change.text,
                    }
                }
                *document = Document::new(text, document.claimed);
                uri
            }
            "textDocument/didClose" => {
                let Ok(p) =
                    serde_json::from_value::<lsp::DidCloseTextDocumentParams>(notification.params)
                else {
                    return Vec::new();
                };
                let uri = p.text_document.uri.to_string();
                self.documents.remove(&uri);
                // A closed file keeps no diagnostics.
                return vec![Notification::new(
                    "textDocument/publishDiagnostics".to_owned(),
                    json!({"uri": uri, "diagnostics": []}),
                )];
            }
            _ => return Vec::new(),
        };
        self.diagnostics(&uri).into_iter().collect()
    }

    /// The diagnostics notification for a document.
    fn diagnostics(&self, uri: &str) -> Option<Notification> {
        let document = self.documents.get(uri)?;
        let shown = if document.is_prompt() {
            document.analysis.diagnostics()
        } else {
            &[]
        };
        let diagnostics: Vec<lsp::Diagnostic> = shown
            .iter()
            .map(|d| lsp::Diagnostic {
                range: range(document.view(), d.span, self.utf8),
                severity: Some(match d.severity {
                    Severity::Error => lsp::DiagnosticSeverity::ERROR,
                    Severity::Warning => lsp::DiagnosticSeverity::WARNING,
                }),
                code: Some(lsp::NumberOrString::String(d.kind.clone())),
                source: Some("promptforge".to_owned()),
                message: d.message.clone(),
                ..lsp::Diagnostic::default()
            })
            .collect();
        Some(Notification::new(
            "textDocument/publishDiagnostics".to_owned(),
            json!({"uri": uri, "diagnostics": diagnostics}),
        ))
    }

    /// A request's response.
    fn request(&self, request: Request) -> Response {
        let id = request.id.clone();
        match self.answer(&request) {
            Ok(value) => Response::new_ok(id, value),
            Err(message) => {
                let code = if message.starts_with("unsupported request") {
                    lsp_server::ErrorCode::MethodNotFound
                } else {
                    lsp_server::ErrorCode::InvalidParams
                };
                Response::new_err(id, code as i32, message)
            }
        }
    }

    fn answer(&self, request: &Request) -> Result<Json, String> {
        let position = || -> Result<(&Document, String, Pos), String> {
            let p: lsp::TextDocumentPositionParams =
                serde_json::from_value(request.params.clone()).map_err(|e| e.to_string())?;
            let uri = p.text_document.uri.to_string();
            let document = self
                .documents
                .get(&uri)
                .ok_or_else(|| format!("{uri} is not open"))?;
            let pos = pos(document.view(), p.position, self.utf8);
            Ok((document, uri, pos))
        };
        let document_of = || -> Result<(&Document, String), String> {
            let uri = request.params["textDocument"]["uri"]
                .as_str()
                .ok_or("no textDocument.uri")?
                .to_owned();
            let document = self
                .documents
                .get(&uri)
                .ok_or_else(|| format!("{uri} is not open"))?;
            Ok((document, uri))
        };
        let location = |document: &Document, uri: &str, span: Span| json!({"uri": uri, "range": range(document.view(), span, self.utf8)});
        Ok(match request.method.as_str() {
            "textDocument/definition" => {
                let (document, uri, pos) = position()?;
                match document.analysis.definition(pos) {
                    Some(span) => location(document, &uri, span),
                    None => Json::Null,
                }
            }
            "textDocument/references" => {
                let (document, uri, pos) = position()?;
                Json::Array(
                    document
                        .analysis
                        .references(pos)
                        .into_iter()
                        .map(|span| location(document, &uri, span))
                        .collect(),
                )
            }
            "textDocument/hover" => {
                let (document, _, pos) = position()?;
                match document.analysis.hover(pos) {
                    Some(markdown) => json!({
                        "contents": {"kind": "markdown", "value": markdown}
                    }),
                    None => Json::Null,
                }
            }
            "textDocument/completion" => {
                let (document, _, pos) = position()?;
                let items: Vec<lsp::CompletionItem> = document
                    .analysis
                    .completion(pos)
                    .into_iter()
                    .map(|c| lsp::CompletionItem {
                        label: c.label,
                        kind: Some(match c.kind {
                            CompletionKind::Section => lsp::CompletionItemKind::REFERENCE,
                            CompletionKind::Function => lsp::CompletionItemKind::FUNCTION,
                            CompletionKind::Field => lsp::CompletionItemKind::FIELD,
                            CompletionKind::Role => lsp::CompletionItemKind::VARIABLE,
                            CompletionKind::Tool => lsp::CompletionItemKind::VARIABLE,
                            CompletionKind::Arg => lsp::CompletionItemKind::PROPERTY,
                            CompletionKind::Key => lsp::CompletionItemKind::PROPERTY,
                        }),
                        detail: Some(c.detail),
                        documentation: (!c.doc.is_empty()).then_some(
                            lsp::Documentation::MarkupContent(lsp::MarkupContent {
                                kind: lsp::MarkupKind::Markdown,
                                value: c.doc,
                            }),
                        ),
                        ..lsp::CompletionItem::default()
                    })
                    .collect();
                serde_json::to_value(items).map_err(|e| e.to_string())?
            }
            "textDocument/documentSymbol" => {
                let (document, _) = document_of()?;
                let symbols: Vec<Json> = document
                    .analysis
                    .symbols()
                    .iter()
                    .map(|s| symbol(document.view(), s, self.utf8))
                    .collect();
                Json::Array(symbols)
            }
            "textDocument/foldingRange" => {
                let (document, _) = document_of()?;
                Json::Array(
                    document
                        .analysis
                        .folding()
                        .into_iter()
                        .map(|(start, end)| {
                            json!({"startLine": start.saturating_sub(1), "endLine": end.saturating_sub(1)})
                        })
                        .collect(),
                )
            }
            other => return Err(format!("unsupported request {other}")),
        })
    }
}

/// A document symbol, nested.
fn symbol(text: Text<'_>, s: &Symbol, utf8: bool) -> Json {
    json!({
        "name": s.name,
        "detail": if s.level == 1 { "H1".to_owned() } else { format!("H{}", s.level) },
        "kind": if s.level == 1 { lsp::SymbolKind::FILE } else { lsp::SymbolKind::NAMESPACE },
        "range": range(text, s.span, utf8),
        "selectionRange": range(text, s.selection, utf8),
        "children": s.children.iter().map(|c| symbol(text, c, utf8)).collect::<Vec<_>>(),
    })
}

/// The text of 0-based line `line`.
fn line_text(text: Text<'_>, line: u32) -> &str {
    let Some(&start) = text.starts.get(line as usize) else {
        return "";
    };
    let end = text
        .starts
        .get(line as usize + 1)
        .map_or(text.text.len(), |next| next - 1);
    let content = text.text.get(start..end.max(start)).unwrap_or("");
    content.strip_suffix('\r').unwrap_or(content)
}

/// An analysis position in the client's terms.
/// The columns a leading byte-order mark takes on the first line in the client's buffer (a
/// client that sends it holds it as a character; the analysis reads the text without it).
fn bom_columns(text: Text<'_>, line: u32, utf8: bool) -> usize {
    match (line, text.text.starts_with('\u{feff}')) {
        (0, true) if utf8 => 3,
        (0, true) => 1,
        _ => 0,
    }
}

fn position(text: Text<'_>, pos: Pos, utf8: bool) -> lsp::Position {
    let line = pos.line.saturating_sub(1);
    let content = line_text(text, line);
    let byte = usize::try_from(pos.col.saturating_sub(1))
        .unwrap_or(0)
        .min(content.len());
    let byte = (0..=byte)
        .rev()
        .find(|i| content.is_char_boundary(*i))
        .unwrap_or(0);
    let character = bom_columns(text, line, utf8)
        + if utf8 {
            byte
        } else {
            content[..byte].encode_utf16().count()
        };
    lsp::Position {
        line,
        character: u32::try_from(character).unwrap_or(u32::MAX),
    }
}

fn range(text: Text<'_>, span: Span, utf8: bool) -> lsp::Range {
    lsp::Range {
        start: position(text, span.start, utf8),
        end: position(text, span.end, utf8),
    }
}

/// A client position as a byte offset on its line (a UTF-8 offset inside a character is
/// taken back to the character's start).
fn line_byte(content: &str, character: u32, utf8: bool) -> usize {
    if utf8 {
        let byte = usize::try_from(character)
            .unwrap_or(usize::MAX)
            .min(content.len());
        return (0..=byte)
            .rev()
            .find(|i| content.is_char_boundary(*i))
            .unwrap_or(0);
    }
    let mut units = 0u32;
    for (i, c) in content.char_indices() {
        if units >= character {
            return i;
        }
        units += u32::try_from(c.len_utf16()).unwrap_or(1);
    }
    content.len()
}

/// A client position as an analysis position.
fn pos(text: Text<'_>, p: lsp::Position, utf8: bool) -> Pos {
    let content = line_text(text, p.line);
    let bom = u32::try_from(bom_columns(text, p.line, utf8)).unwrap_or(0);
    let byte = line_byte(content, p.character.saturating_sub(bom), utf8);
    Pos {
        line: p.line + 1,
        col: u32::try_from(byte + 1).unwrap_or(u32::MAX),
    }
}

/// A client position as a byte offset in the whole text (past the end: the end).
fn offset(text: &str, p: lsp::Position, utf8: bool) -> usize {
    let mut start = 0;
    for _ in 0..p.line {
        match text[start..].find('\n') {
            Some(i) => start += i + 1,
            None => return text.len(),
        }
    }
    let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    start + line_byte(&text[start..end], p.character, utf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_markdown_file_is_a_prompt_when_its_frontmatter_declares_promptforge() {
        for text in [
            "---\npromptforge: 0\n---\n",
            "---\nname: x\n\"promptforge\": 1\n---\n",
            "\u{feff}---\n'promptforge' : 0\n---\n",
        ] {
            assert!(declares_promptforge(text), "{text:?}");
        }
        for text in [
            "# Notes\n\npromptforge: 0\n",
            "---\ntitle: post\n---\npromptforge: 0\n",
            "---\nmodels:\n  promptforge: {}\n---\n",
        ] {
            assert!(!declares_promptforge(text), "{text:?}");
        }
    }

    #[test]
    fn positions_convert_both_ways_in_either_encoding() {
        let raw = "a\nhé𝄞x\n";
        let starts = line_starts(raw);
        let text = Text {
            text: raw,
            starts: &starts,
        };
        let p = Pos { line: 2, col: 8 }; // after `𝄞` (h=1, é=2, 𝄞=4 bytes)
        let utf16 = position(text, p, false);
        assert_eq!((utf16.line, utf16.character), (1, 4));
        assert_eq!(pos(text, utf16, false), p);
        let utf8 = position(text, p, true);
        assert_eq!(utf8.character, 7);
        assert_eq!(pos(text, utf8, true), p);
        // A UTF-8 offset inside `é` is taken back to its start.
        assert_eq!(
            pos(
                text,
                lsp::Position {
                    line: 1,
                    character: 2
                },
                true
            ),
            Pos { line: 2, col: 2 }
        );
        // A byte-order mark is not a column of the analysis's first line, but it is a
        // character of the client's buffer: positions both ways count it there.
        let raw = "\u{feff}ab";
        let starts = line_starts(raw);
        let text = Text {
            text: raw,
            starts: &starts,
        };
        let b = position(text, Pos { line: 1, col: 2 }, false);
        assert_eq!(b.character, 2);
        assert_eq!(pos(text, b, false), Pos { line: 1, col: 2 });
        assert_eq!(position(text, Pos { line: 1, col: 2 }, true).character, 4);
        // An edit at that position lands on the same byte of the text the client sent.
        assert_eq!(&raw[offset(raw, b, false)..], "b");
        let raw = "a\nhé𝄞x\n";
        let at = |line, character| lsp::Position { line, character };
        assert_eq!(offset(raw, at(1, 4), false), 9);
        assert_eq!(offset(raw, at(9, 0), false), raw.len());
    }
}

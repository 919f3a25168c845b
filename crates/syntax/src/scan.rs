//! The line scanner: turns the Markdown body into a flat stream of [`Item`]s (headings, text
//! lines, thematic breaks, `lua` fences).
//!
//! Written by hand rather than with a CommonMark crate because the `lua` fence grammar is not
//! CommonMark's: a `lua` fence opens only on the exact line ```` ```lua ```` and closes only on
//! the exact line ```` ``` ````, and an opening `lua` line met before that close is an error
//! (CommonMark would close a three-backtick fence on four backticks). Everything else follows
//! the block rules of CommonMark that decide what is a heading: ATX headings (up to three spaces
//! of indent, one to six `#`, then whitespace or end of line), setext headings (a paragraph
//! underlined by `=` or `-`), fenced code blocks of other info strings (their lines are text,
//! never headings), HTML comment blocks, and thematic breaks. Block quotes and list items are
//! not containers here: a heading line must start at the top level to be a heading.

/// One scanned piece of the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Item {
    /// An ATX or setext heading. `text` is the raw inline text (markup not yet stripped);
    /// `column` the 1-based byte column where it starts (after its indentation).
    Heading {
        level: u8,
        text: String,
        line: u32,
        column: u32,
    },
    /// A line of Markdown text (prose, list markers, lines of other code fences, blank lines).
    Text { line: u32, text: String },
    /// A thematic break line (`---`, `***`, `___`, ...) that resets pending prose.
    Break { line: u32 },
    /// A `lua` or `lua shared` fence.
    Fence(Fence),
}

/// How a `lua` fence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FenceEnd {
    /// Closed by an exact ```` ``` ```` line.
    Closed,
    /// The file ended first.
    Unclosed,
    /// Another exact `lua` opening line came before any exact close.
    Inexact,
}

/// A `lua` fence as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fence {
    /// ```` ```lua shared ```` rather than ```` ```lua ````.
    pub shared: bool,
    /// The line of the opening fence.
    pub open_line: u32,
    /// The Lua source: the lines between the fences, joined with `\n`.
    pub source: String,
    /// How many lines lie between the fences (an empty fence has none; its `source` is
    /// empty, as is that of a fence holding one empty line).
    pub lines: u32,
    /// How the fence ended.
    pub end: FenceEnd,
}

const LUA_OPEN: &str = "```lua";
const LUA_SHARED_OPEN: &str = "```lua shared";
const LUA_CLOSE: &str = "```";

/// Leading spaces (at most three count as "not indented code").
fn indent_of(line: &str) -> usize {
    line.bytes().take_while(|b| *b == b' ').count()
}

/// A CommonMark thematic break: up to three spaces of indent, then three or more of one of
/// `*`, `-`, `_`, with only spaces or tabs between them.
pub(crate) fn is_thematic_break(line: &str) -> bool {
    if indent_of(line) > 3 {
        return false;
    }
    let rest = line.trim_start_matches(' ');
    let Some(marker) = rest.chars().next() else {
        return false;
    };
    if !matches!(marker, '*' | '-' | '_') {
        return false;
    }
    let mut count = 0;
    for c in rest.chars() {
        if c == marker {
            count += 1;
        } else if c != ' ' && c != '\t' {
            return false;
        }
    }
    count >= 3
}

/// A setext underline: up to three spaces of indent, a run of `=` (level 1) or `-` (level 2),
/// optional trailing whitespace.
fn setext_level(line: &str) -> Option<u8> {
    if indent_of(line) > 3 {
        return None;
    }
    let rest = line.trim();
    let first = rest.chars().next()?;
    if !matches!(first, '=' | '-') || !rest.chars().all(|c| c == first) {
        return None;
    }
    Some(if first == '=' { 1 } else { 2 })
}

/// An ATX heading: its level and raw text with the optional closing `#` run removed.
pub(crate) fn atx_heading(line: &str) -> Option<(u8, String)> {
    if indent_of(line) > 3 {
        return None;
    }
    let rest = line.trim_start_matches(' ');
    let hashes = rest.bytes().take_while(|b| *b == b'#').count();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    let after = &rest[hashes..];
    if !(after.is_empty() || after.starts_with(' ') || after.starts_with('\t')) {
        return None;
    }
    let mut text = after.trim();
    // A closing sequence of `#` counts only when preceded by whitespace (or is all there is).
    let trimmed = text.trim_end_matches('#');
    if trimmed.len() != text.len() && (trimmed.is_empty() || trimmed.ends_with([' ', '\t'])) {
        text = trimmed.trim_end();
    }
    Some((hashes as u8, text.to_owned()))
}

/// A CommonMark code fence opening (backticks or tildes, three or more): the fence character,
/// its length, and whether it qualifies (backtick fences may not have backticks in the info).
fn code_fence_open(line: &str) -> Option<(u8, usize)> {
    if indent_of(line) > 3 {
        return None;
    }
    let rest = line.trim_start_matches(' ');
    let ch = *rest.as_bytes().first()?;
    if ch != b'`' && ch != b'~' {
        return None;
    }
    let len = rest.bytes().take_while(|b| *b == ch).count();
    if len < 3 {
        return None;
    }
    if ch == b'`' && rest[len..].contains('`') {
        return None;
    }
    Some((ch, len))
}

/// Whether `line` closes a CommonMark fence opened with `len` copies of `ch`.
fn closes_code_fence(line: &str, ch: u8, len: usize) -> bool {
    if indent_of(line) > 3 {
        return false;
    }
    let rest = line.trim_start_matches(' ');
    let run = rest.bytes().take_while(|b| *b == ch).count();
    run >= len && rest[run..].trim().is_empty()
}

/// A list marker line as the list-section rule reads it (after trimming the line): `- `, `* `,
/// `N. ` or `N) `, or a bare marker with no text. Returns the item text.
pub(crate) fn list_item(line: &str) -> Option<&str> {
    let t = line.trim();
    let body = if let Some(rest) = t.strip_prefix('-').or_else(|| t.strip_prefix('*')) {
        rest
    } else {
        let digits = t.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let rest = &t[digits..];
        rest.strip_prefix('.').or_else(|| rest.strip_prefix(')'))?
    };
    if body.is_empty() {
        Some("")
    } else {
        body.strip_prefix(' ')
    }
}

/// Scan the body lines. `lines` holds `(file line, text without line ending)`.
pub(crate) fn scan(lines: &[(u32, &str)]) -> Vec<Item> {
    let mut items = Vec::new();
    // Index in `items` where the current paragraph's text lines start, if in a paragraph.
    let mut paragraph: Option<usize> = None;
    let mut i = 0;
    while i < lines.len() {
        let (line_no, line) = lines[i];
        i += 1;
        if line == LUA_OPEN || line == LUA_SHARED_OPEN {
            paragraph = None;
            let shared = line == LUA_SHARED_OPEN;
            let mut source_lines: Vec<&str> = Vec::new();
            let mut end = FenceEnd::Unclosed;
            while i < lines.len() {
                let (_, inner) = lines[i];
                if inner == LUA_CLOSE {
                    i += 1;
                    end = FenceEnd::Closed;
                    break;
                }
                if inner == LUA_OPEN || inner == LUA_SHARED_OPEN {
                    end = FenceEnd::Inexact;
                    break;
                }
                source_lines.push(inner);
                i += 1;
            }
            if end == FenceEnd::Unclosed {
                i = lines.len();
            }
            items.push(Item::Fence(Fence {
                shared,
                open_line: line_no,
                source: source_lines.join("\n"),
                lines: u32::try_from(source_lines.len()).unwrap_or(u32::MAX),
                end,
            }));
            if end == FenceEnd::Inexact {
                // The source ran on into the next fence: scanning stops here, the error is
                // reported when the structure is checked.
                break;
            }
            continue;
        }
        if line.trim().is_empty() {
            paragraph = None;
            items.push(Item::Text {
                line: line_no,
                text: line.to_owned(),
            });
            continue;
        }
        if let Some(start) = paragraph
            && let Some(level) = setext_level(line)
        {
            let mut column = 1;
            let text_lines: Vec<String> = items
                .drain(start..)
                .filter_map(|item| match item {
                    Item::Text { text, .. } => Some(text),
                    _ => None,
                })
                .enumerate()
                .map(|(n, text)| {
                    if n == 0 {
                        column = column_of(&text);
                    }
                    text.trim().to_owned()
                })
                .collect();
            let first_line = lines
                .get(i.saturating_sub(text_lines.len() + 1))
                .map_or(line_no, |(n, _)| *n);
            items.push(Item::Heading {
                level,
                text: text_lines.join(" "),
                line: first_line,
                column,
            });
            paragraph = None;
            continue;
        }
        if is_thematic_break(line) {
            paragraph = None;
            items.push(Item::Break { line: line_no });
            continue;
        }
        if let Some((level, text)) = atx_heading(line) {
            paragraph = None;
            items.push(Item::Heading {
                level,
                text,
                line: line_no,
                column: column_of(line),
            });
            continue;
        }
        if let Some((ch, len)) = code_fence_open(line) {
            // Another code block: all of it is text, up to its closing fence or the end.
            paragraph = None;
            items.push(Item::Text {
                line: line_no,
                text: line.to_owned(),
            });
            while i < lines.len() {
                let (n, inner) = lines[i];
                i += 1;
                items.push(Item::Text {
                    line: n,
                    text: inner.to_owned(),
                });
                if closes_code_fence(inner, ch, len) {
                    break;
                }
            }
            continue;
        }
        if indent_of(line) <= 3 && line.trim_start().starts_with("<!--") {
            // An HTML comment block: text up to the line that holds `-->`.
            paragraph = None;
            let mut current = line;
            let mut current_no = line_no;
            loop {
                items.push(Item::Text {
                    line: current_no,
                    text: current.to_owned(),
                });
                if current.contains("-->") || i >= lines.len() {
                    break;
                }
                (current_no, current) = lines[i];
                i += 1;
            }
            continue;
        }
        let is_list_line = list_item(line).is_some();
        if paragraph.is_none() && !is_list_line {
            paragraph = Some(items.len());
        } else if is_list_line && paragraph.is_some() {
            paragraph = None;
        }
        items.push(Item::Text {
            line: line_no,
            text: line.to_owned(),
        });
    }
    items
}

/// The 1-based byte column of a line's first non-blank character.
fn column_of(line: &str) -> u32 {
    let indent = line.len() - line.trim_start().len();
    u32::try_from(indent + 1).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(src: &str) -> Vec<(u32, &str)> {
        src.lines()
            .enumerate()
            .map(|(i, l)| (i as u32 + 1, l))
            .collect()
    }

    fn headings(src: &str) -> Vec<(u8, String, u32)> {
        scan(&lines(src))
            .into_iter()
            .filter_map(|item| match item {
                Item::Heading {
                    level, text, line, ..
                } => Some((level, text, line)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn atx_headings_follow_commonmark() {
        assert_eq!(atx_heading("## Main"), Some((2, "Main".into())));
        assert_eq!(atx_heading("   ### Deep ###"), Some((3, "Deep".into())));
        assert_eq!(atx_heading("#"), Some((1, String::new())));
        assert_eq!(atx_heading("## C#"), Some((2, "C#".into())));
        assert_eq!(atx_heading("#nospace"), None);
        assert_eq!(atx_heading("    # indented"), None);
        assert_eq!(atx_heading("####### seven"), None);
    }

    #[test]
    fn breaks_and_setext() {
        assert!(is_thematic_break("---"));
        assert!(is_thematic_break(" * * *"));
        assert!(is_thematic_break("___"));
        assert!(!is_thematic_break("--"));
        assert!(!is_thematic_break("--- x"));
        assert_eq!(
            headings("# T\n\n## S\n\nSome prose\n---\n\nMore"),
            vec![
                (1, "T".into(), 1),
                (2, "S".into(), 3),
                (2, "Some prose".into(), 5)
            ]
        );
        // A blank line before `---` makes it a break.
        assert_eq!(headings("Some prose\n\n---\n").len(), 0);
        // `===` under a paragraph is an H1.
        assert_eq!(headings("Title\n===\n"), vec![(1, "Title".into(), 1)]);
        // A list line is not a paragraph: `---` after it is a break.
        assert_eq!(headings("- alpha\n---\n").len(), 0);
    }

    #[test]
    fn headings_inside_code_are_text() {
        let src = "```python\n# comment\n```\n\n~~~~\n## no\n~~~~\n\n<!--\n## hidden\n-->\n## yes";
        assert_eq!(headings(src), vec![(2, "yes".into(), 12)]);
    }

    #[test]
    fn lua_fences() {
        let items = scan(&lines("```lua\n# not a heading\n````\n```\n"));
        assert_eq!(
            items,
            vec![Item::Fence(Fence {
                shared: false,
                open_line: 1,
                source: "# not a heading\n````".into(),
                lines: 2,
                end: FenceEnd::Closed,
            })]
        );
        let items = scan(&lines("```lua\nx = 1\n````\n\n```lua\nreturn x\n```"));
        assert!(matches!(&items[0], Item::Fence(f) if f.end == FenceEnd::Inexact));
        let items = scan(&lines("```lua shared\nx = 1"));
        assert!(matches!(&items[0], Item::Fence(f) if f.shared && f.end == FenceEnd::Unclosed));
        // Not exact: two spaces, trailing text, indentation.
        for open in ["```lua  shared", "```lua x", " ```lua", "```Lua"] {
            let items = scan(&lines(&format!("{open}\nx\n```")));
            assert!(items.iter().all(|i| !matches!(i, Item::Fence(_))), "{open}");
        }
    }

    #[test]
    fn nested_lua_fence_stays_text() {
        let items = scan(&lines("````markdown\n```lua\nreturn 1\n```\n````\n"));
        assert_eq!(items.len(), 5);
        assert!(items.iter().all(|i| matches!(i, Item::Text { .. })));
    }

    #[test]
    fn list_markers() {
        assert_eq!(list_item("- alpha"), Some("alpha"));
        assert_eq!(list_item("  * beta  "), Some("beta"));
        assert_eq!(list_item("12. twelve"), Some("twelve"));
        assert_eq!(list_item("3) third"), Some("third"));
        assert_eq!(list_item("-   spaced"), Some("  spaced"));
        assert_eq!(list_item("-"), Some(""));
        assert_eq!(list_item("1."), Some(""));
        assert_eq!(list_item("-x"), None);
        assert_eq!(list_item("+ plus"), None);
        assert_eq!(list_item("text"), None);
        assert_eq!(list_item("1.5 apples"), None);
    }
}

//! A prompt file's outline as written, for editors: where the frontmatter, every heading and
//! every `lua` fence are, found by the same scanner the parser uses. Unlike [`Prompt`], an
//! outline exists for any text, however broken, so an editor can still fold, list symbols and
//! find references while the file does not parse.
//!
//! [`Prompt`]: crate::Prompt

use crate::scan::{self, FenceEnd, Item};

/// A heading as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutlineHeading {
    /// 1 for the H1, 2 to 6 for sections.
    pub level: u8,
    /// The heading text with markup stripped (what `## X` names).
    pub name: String,
    /// The 1-based file line.
    pub line: u32,
    /// The 1-based byte column where the heading starts.
    pub column: u32,
}

/// A `lua` fence as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutlineFence {
    /// ```` ```lua shared ````.
    pub shared: bool,
    /// The 1-based line of the opening fence.
    pub open_line: u32,
    /// The 1-based line of the closing fence, or the file's last line when it is not closed.
    pub close_line: u32,
    /// The Lua source between the fences (lines joined with `\n`); its first line is
    /// `open_line + 1`.
    pub source: String,
    /// Whether it is closed by an exact ```` ``` ```` line.
    pub closed: bool,
}

/// A prompt file's outline.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outline {
    /// The frontmatter's lines, opening and closing delimiters included, when it has both.
    pub frontmatter: Option<(u32, u32)>,
    /// Every heading of the body, in file order.
    pub headings: Vec<OutlineHeading>,
    /// Every `lua` fence of the body, in file order.
    pub fences: Vec<OutlineFence>,
    /// The file's number of lines.
    pub lines: u32,
}

impl Outline {
    /// The outline of `source`.
    pub fn of(source: &str) -> Outline {
        let source = source.strip_prefix('\u{feff}').unwrap_or(source);
        let mut lines: Vec<(u32, &str)> = source
            .split('\n')
            .enumerate()
            .map(|(i, l)| {
                let number = u32::try_from(i + 1).unwrap_or(u32::MAX);
                (number, l.strip_suffix('\r').unwrap_or(l))
            })
            .collect();
        if lines.last().is_some_and(|(_, l)| l.is_empty()) {
            lines.pop();
        }
        let count = u32::try_from(lines.len()).unwrap_or(u32::MAX);
        let mut outline = Outline {
            lines: count,
            ..Outline::default()
        };
        let body_start = match lines.first() {
            Some((_, first)) if first.trim() == "---" => {
                match lines.iter().skip(1).position(|(_, l)| l.trim() == "---") {
                    Some(p) => {
                        let close = p + 1;
                        outline.frontmatter = Some((1, lines[close].0));
                        close + 1
                    }
                    // An unclosed frontmatter swallows the file: nothing of the body is known.
                    None => return outline,
                }
            }
            _ => 0,
        };
        let body = &lines[body_start.min(lines.len())..];
        for item in scan::scan(body) {
            match item {
                Item::Heading {
                    level,
                    text,
                    line,
                    column,
                } => outline.headings.push(OutlineHeading {
                    level,
                    name: crate::prompt::heading_text(&text),
                    line,
                    column,
                }),
                Item::Fence(fence) => {
                    let closed = fence.end == FenceEnd::Closed;
                    let close_line = if closed {
                        fence
                            .open_line
                            .saturating_add(fence.lines)
                            .saturating_add(1)
                    } else {
                        count
                    };
                    outline.fences.push(OutlineFence {
                        shared: fence.shared,
                        open_line: fence.open_line,
                        close_line: close_line.min(count.max(1)),
                        source: fence.source,
                        closed,
                    });
                }
                Item::Text { .. } | Item::Break { .. } => {}
            }
        }
        outline
    }

    /// The heading a line belongs under: the last heading at or before it.
    pub fn heading_at(&self, line: u32) -> Option<&OutlineHeading> {
        // Headings are in file order: a binary search, so asking for every fence's heading
        // stays O(n log n) on a 3,000-section prompt.
        let after = self.headings.partition_point(|h| h.line <= line);
        after.checked_sub(1).and_then(|i| self.headings.get(i))
    }

    /// The fence whose Lua source holds `line` (a line strictly between its fences).
    pub fn fence_at(&self, line: u32) -> Option<&OutlineFence> {
        self.fences.iter().find(|f| {
            line > f.open_line && (line < f.close_line || (!f.closed && line <= f.close_line))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outline_exists_for_any_text() {
        let text = "---\nname: x\n---\n\n# Title\n\n## A\n\n```lua\nreturn 1\n```\n\n  ### B\n\n```lua\nbroken(\n";
        let outline = Outline::of(text);
        assert_eq!(outline.frontmatter, Some((1, 3)));
        let names: Vec<(u8, &str, u32, u32)> = outline
            .headings
            .iter()
            .map(|h| (h.level, h.name.as_str(), h.line, h.column))
            .collect();
        assert_eq!(names, [(1, "Title", 5, 1), (2, "A", 7, 1), (3, "B", 13, 3)]);
        assert_eq!(outline.fences.len(), 2);
        assert_eq!(
            (outline.fences[0].open_line, outline.fences[0].close_line),
            (9, 11)
        );
        assert!(!outline.fences[1].closed);
        assert_eq!(outline.fence_at(10).map(|f| f.open_line), Some(9));
        assert_eq!(outline.fence_at(16).map(|f| f.open_line), Some(15));
        assert_eq!(outline.fence_at(11), None);
        assert_eq!(outline.heading_at(10).map(|h| h.name.as_str()), Some("A"));
        assert_eq!(Outline::of("no frontmatter\n# T\n").headings.len(), 1);
        // An empty fence closes on the line after it opens.
        let empty = Outline::of("# T\n```lua\n```\n## A\n");
        assert_eq!(
            (empty.fences[0].open_line, empty.fences[0].close_line),
            (2, 3)
        );
        assert_eq!(empty.fence_at(3), None);
        assert_eq!(
            Outline::of("---\nunclosed\n# T\n"),
            Outline {
                lines: 3,
                ..Outline::default()
            }
        );
    }
}

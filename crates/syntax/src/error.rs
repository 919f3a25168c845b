//! Parse errors: the five parse error kinds of the spec, each with its exact message and, when
//! the parser can point at the problem, a 1-based file line and byte column.

use std::fmt;

/// The five parse error kinds (chapter 16, "Parse error kinds").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParseErrorKind {
    /// The frontmatter block is missing, unclosed, not valid YAML, or the contract rejects a value.
    Frontmatter,
    /// The H1 title or the heading tree is invalid.
    Structure,
    /// A `lua shared` fence is repeated or misplaced, or a fence is left unclosed.
    Fence,
    /// A list section holds an empty item.
    List,
    /// A Lua region does not compile.
    Lua,
}

impl ParseErrorKind {
    /// The kind's name exactly as the spec writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ParseErrorKind::Frontmatter => "Frontmatter",
            ParseErrorKind::Structure => "Structure",
            ParseErrorKind::Fence => "Fence",
            ParseErrorKind::List => "List",
            ParseErrorKind::Lua => "Lua",
        }
    }
}

impl fmt::Display for ParseErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A parse failure: the kind, the plain message (no prefix beyond what the spec fixes), and the
/// location details the spec puts beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// Which part of the file failed.
    pub kind: ParseErrorKind,
    /// The message, exactly as the spec words it.
    pub message: String,
    /// The prompt's frontmatter `name`, for body failures (never for frontmatter failures).
    pub prompt_name: Option<String>,
    /// 1-based file line (the opening `---` is line 1), when the parser can point at it.
    pub line: Option<u32>,
    /// 1-based column counted in bytes, when the parser can point at it.
    pub column: Option<u32>,
}

impl ParseError {
    /// An error with no location.
    pub fn new(kind: ParseErrorKind, message: impl Into<String>) -> Self {
        ParseError {
            kind,
            message: message.into(),
            prompt_name: None,
            line: None,
            column: None,
        }
    }

    /// An error at a 1-based line and byte column.
    pub fn at(kind: ParseErrorKind, message: impl Into<String>, line: u32, column: u32) -> Self {
        ParseError {
            line: Some(line),
            column: Some(column),
            ..ParseError::new(kind, message)
        }
    }

    /// The file line the failure is at: its own line, or for a Lua compile failure (which the
    /// spec gives no separate location) the fault line its diagnostic names
    /// (`[string "..."]:N:`, a file line: the region was compiled behind its file lines).
    pub fn fault_line(&self) -> Option<u32> {
        if self.line.is_some() || self.kind != ParseErrorKind::Lua {
            return self.line;
        }
        let after = self.message.split("\"]:").nth(1)?;
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    }

    /// Where the problem is in `text`: its line, and the byte columns (1-based, end
    /// exclusive) of what it points at when that is known. A problem with a column of its own
    /// points at its column (one character wide). A Lua compile failure is at the fault line
    /// its diagnostic names and, when the token it names (`near 'x'`) occurs once on that
    /// line, that token (`near <eof>`: just past the line). Lua names no column itself, so
    /// none is given rather than a made-up one.
    pub fn span_in(&self, text: &str) -> Option<(u32, Option<(u32, u32)>)> {
        if let Some(line) = self.line {
            return Some((line, self.column.map(|c| (c, c.saturating_add(1)))));
        }
        let line = self.fault_line()?;
        let source_line = text
            .strip_prefix('\u{feff}')
            .unwrap_or(text)
            .split('\n')
            .nth(usize::try_from(line).ok()?.checked_sub(1)?)
            .map(|l| l.strip_suffix('\r').unwrap_or(l))?;
        let columns = near_token(&self.message).and_then(|token| {
            if token == "<eof>" {
                let past = u32::try_from(source_line.len() + 1).ok()?;
                return Some((past, past));
            }
            let mut found = source_line.match_indices(token);
            let (at, _) = found.next()?;
            if found.next().is_some() {
                return None;
            }
            let start = u32::try_from(at + 1).ok()?;
            Some((
                start,
                start.saturating_add(u32::try_from(token.len()).ok()?),
            ))
        });
        Some((line, columns))
    }

    /// Attach the prompt's name (body failures carry it).
    #[must_use]
    pub fn with_prompt_name(mut self, name: &str) -> Self {
        self.prompt_name = Some(name.to_owned());
        self
    }
}

/// The token a Lua syntax diagnostic names: `near 'x'` (quotes taken off) or `near <eof>`.
fn near_token(message: &str) -> Option<&str> {
    let (_, after) = message.rsplit_once(" near ")?;
    if after.starts_with("<eof>") {
        return Some("<eof>");
    }
    let quoted = after.strip_prefix('\'')?;
    let end = quoted.rfind('\'')?;
    Some(&quoted[..end]).filter(|token| !token.is_empty())
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ParseError {}

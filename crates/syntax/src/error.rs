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

    /// Attach the prompt's name (body failures carry it).
    #[must_use]
    pub fn with_prompt_name(mut self, name: &str) -> Self {
        self.prompt_name = Some(name.to_owned());
        self
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ParseError {}

//! Run outcomes and run error kinds (chapter 16, "How a failed run is classified").

use std::fmt;

use promptforge_syntax::{ParseError, ParseErrorKind, Prompt};

pub use promptforge_protocol::errors::RunErrorKind;
use promptforge_protocol::store::StoreError;

/// A failed run's error: its kind, message, and for parse failures the parse details.
/// Two errors are equal when everything but [`RunError::display_line`] is.
#[derive(Debug, Clone)]
pub struct RunError {
    /// The run error kind.
    pub kind: RunErrorKind,
    /// The message, exactly as the spec words it.
    pub message: String,
    /// For `Parse`: which part of the file failed.
    pub parse_kind: Option<ParseErrorKind>,
    /// For `Parse` (and `Version`): the 1-based file line, when known.
    pub line: Option<u32>,
    /// For `Parse` (and `Version`): the 1-based byte column, when known.
    pub column: Option<u32>,
    /// For a Lua failure: the traceback taken where the error was raised.
    pub traceback: Option<String>,
    /// For a failure after the parse: the prompt file's line it points at, when known. Display
    /// only, for a Host's `FILE:LINE:` (chapter 16 gives an outcome a location only for parse
    /// failures), so it is never serialised and outcomes compare without it.
    pub display_line: Option<u32>,
}

impl PartialEq for RunError {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.message == other.message
            && self.parse_kind == other.parse_kind
            && self.line == other.line
            && self.column == other.column
            && self.traceback == other.traceback
    }
}

impl Eq for RunError {}

impl RunError {
    /// A run error with no location.
    pub fn new(kind: RunErrorKind, message: impl Into<String>) -> Self {
        RunError {
            kind,
            message: message.into(),
            parse_kind: None,
            line: None,
            column: None,
            traceback: None,
            display_line: None,
        }
    }
}

impl From<ParseError> for RunError {
    fn from(err: ParseError) -> Self {
        RunError {
            kind: RunErrorKind::Parse,
            message: err.message,
            parse_kind: Some(err.kind),
            line: err.line,
            column: err.column,
            traceback: None,
            display_line: None,
        }
    }
}

/// The run error an uncaught store failure ends the run with: `Vfs` and the message.
pub fn store_run_error(err: &StoreError) -> RunError {
    RunError::new(RunErrorKind::Vfs, err.message.clone())
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RunError {}

/// How a run ended: exactly one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The run completed with this result.
    Completed(String),
    /// The Host cancelled the run.
    Cancelled,
    /// The run failed.
    Failed(RunError),
}

/// The major version this build runs.
pub use promptforge_syntax::frontmatter::SUPPORTED_MAJOR;
use promptforge_syntax::frontmatter::VersionProblem;

/// The run's first step, before anything executes: a file that failed to parse fails the run
/// with `Parse`; a file without `promptforge:` fails with `Parse` (parse error kind
/// `Structure`); any major other than 0 fails with `Version`. `Ok` means the run may go on.
pub fn first_step(parsed: Result<&Prompt, &ParseError>) -> Result<(), RunError> {
    let prompt = parsed.map_err(|e| RunError::from(e.clone()))?;
    match prompt.frontmatter.version_check() {
        Ok(()) => Ok(()),
        Err(problem @ VersionProblem::Missing) => Err(RunError {
            parse_kind: Some(ParseErrorKind::Structure),
            ..RunError::new(RunErrorKind::Parse, problem.message())
        }),
        Err(VersionProblem::Unsupported(version)) => Err(RunError {
            line: Some(version.line),
            column: Some(version.column),
            ..RunError::new(
                RunErrorKind::Version,
                VersionProblem::Unsupported(version).message(),
            )
        }),
    }
}

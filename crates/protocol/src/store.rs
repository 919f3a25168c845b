//! Store paths, glob patterns, line ranges, and the store protocol (chapter 09, "The Store").
//!
//! Everything here is pure. The path rules ("Store paths", "Path errors"), the pattern rules
//! ("Pattern syntax", "Pattern errors"), and the line-bound values ("Bound values") are checked
//! by the functions in this module, and the request a `store.*` call becomes ([`StoreOp`]),
//! its answer ([`StoreAnswer`]), and its failure ([`StoreError`], with the chapter's exact
//! `reason` tags and messages from "Store messages") live here too, so the engine can issue
//! store effects and turn failures into error values without depending on the Harness that
//! performs them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The longest store path, and separately the longest glob pattern, in UTF-8 bytes.
pub const MAX_PATH_BYTES: usize = 1024;

/// The Windows device names no segment's base name may be, compared without letter case.
const DEVICE_NAMES: [&str; 22] = [
    "CON", "PRN", "AUX", "NUL", "COM1", "COM2", "COM3", "COM4", "COM5", "COM6", "COM7", "COM8",
    "COM9", "LPT1", "LPT2", "LPT3", "LPT4", "LPT5", "LPT6", "LPT7", "LPT8", "LPT9",
];

/// The rule a store path or glob pattern broke (`err.rule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathRule {
    /// The path is the empty string.
    Empty,
    /// The path is longer than 1024 bytes.
    TooLong,
    /// The path starts with `/`.
    Absolute,
    /// The path holds a byte below 0x20, or 0x7f.
    Control,
    /// The path holds a `\`.
    Backslash,
    /// A segment is empty, from a trailing `/` or a doubled `//`.
    EmptySegment,
    /// A segment is `.` or `..`.
    Traversal,
    /// A segment ends in `.` or a space.
    UnsafeSuffix,
    /// A segment's base name is a device name.
    ReservedName,
    /// A glob pattern's `**` does not fill a whole segment, or it has three or more `*` in a row.
    Wildcard,
}

impl PathRule {
    /// The rule's tag, as `err.rule` carries it.
    pub fn rule(self) -> &'static str {
        match self {
            PathRule::Empty => "empty",
            PathRule::TooLong => "too_long",
            PathRule::Absolute => "absolute",
            PathRule::Control => "control",
            PathRule::Backslash => "backslash",
            PathRule::EmptySegment => "empty_segment",
            PathRule::Traversal => "traversal",
            PathRule::UnsafeSuffix => "unsafe_suffix",
            PathRule::ReservedName => "reserved_name",
            PathRule::Wildcard => "wildcard",
        }
    }

    /// The rule in a sentence, as the message's `{reason}` shows it.
    pub fn reason(self) -> &'static str {
        match self {
            PathRule::Empty => "path is empty",
            PathRule::TooLong => "path is too long",
            PathRule::Absolute => "path is absolute",
            PathRule::Control => "path contains a control character",
            PathRule::Backslash => "path contains a backslash",
            PathRule::EmptySegment => "path contains an empty segment",
            PathRule::Traversal => "path contains a traversal segment",
            PathRule::UnsafeSuffix => "path segment ends in an unsafe character",
            PathRule::ReservedName => "path contains a reserved device name",
            PathRule::Wildcard => "pattern contains invalid wildcard grammar",
        }
    }
}

impl fmt::Display for PathRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

fn is_control(byte: u8) -> bool {
    byte < 0x20 || byte == 0x7f
}

/// The whole-path checks shared by paths and patterns: empty, too long, (absolute), control,
/// backslash, in that order.
fn check_whole(raw: &str, absolute_rule: bool) -> Result<(), PathRule> {
    if raw.is_empty() {
        return Err(PathRule::Empty);
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(PathRule::TooLong);
    }
    if absolute_rule && raw.starts_with('/') {
        return Err(PathRule::Absolute);
    }
    if raw.bytes().any(is_control) {
        return Err(PathRule::Control);
    }
    if raw.contains('\\') {
        return Err(PathRule::Backslash);
    }
    Ok(())
}

/// The per-segment checks of rules 6 to 9 for one segment.
pub fn check_segment(segment: &str) -> Result<(), PathRule> {
    if segment.is_empty() {
        return Err(PathRule::EmptySegment);
    }
    if segment == "." || segment == ".." {
        return Err(PathRule::Traversal);
    }
    if segment.ends_with('.') || segment.ends_with(' ') {
        return Err(PathRule::UnsafeSuffix);
    }
    let base = segment.split('.').next().unwrap_or(segment);
    if DEVICE_NAMES
        .iter()
        .any(|name| name.eq_ignore_ascii_case(base))
    {
        return Err(PathRule::ReservedName);
    }
    Ok(())
}

/// Checks a store path against the nine path rules, reporting the first rule it breaks in the
/// chapter's order: the five whole-path rules, then each segment from left to right.
pub fn validate_path(raw: &str) -> Result<(), PathRule> {
    check_whole(raw, true)?;
    raw.split('/').try_for_each(check_segment)
}

/// The logical path a store call uses as its key: a valid path exactly as written (the store
/// refuses anything that would need rewriting), or the rule the path broke.
pub fn normalize_path(raw: &str) -> Result<String, PathRule> {
    validate_path(raw).map(|()| raw.to_owned())
}

/// Checks a glob pattern against the pattern rules: empty, too long, control, backslash, then
/// the wildcard grammar (`**` only as a whole segment, never three `*` in a row).
pub fn validate_pattern(raw: &str) -> Result<(), PathRule> {
    check_whole(raw, false)?;
    for segment in raw.split('/') {
        if segment.contains("***") || (segment.contains("**") && segment != "**") {
            return Err(PathRule::Wildcard);
        }
    }
    Ok(())
}

/// A checked and compiled glob pattern.
///
/// `*` matches any run of characters within one segment, `**` as a whole segment matches any
/// number of directory levels (zero included), and every other character matches itself. A
/// pattern ending in `/` selects directories instead of files; the `/` is not matched.
#[derive(Debug, Clone)]
pub struct GlobPattern {
    raw: String,
    dirs_only: bool,
    base: String,
    matcher: globset::GlobMatcher,
}

impl GlobPattern {
    /// Checks and compiles `raw`, or names the pattern rule it broke.
    pub fn new(raw: &str) -> Result<Self, PathRule> {
        validate_pattern(raw)?;
        let (body, dirs_only) = match raw.strip_suffix('/') {
            Some(body) => (body, true),
            None => (raw, false),
        };
        let translated = body
            .split('/')
            .map(|segment| {
                if segment == "**" {
                    segment.to_owned()
                } else {
                    segment
                        .split('*')
                        .map(globset::escape)
                        .collect::<Vec<_>>()
                        .join("*")
                }
            })
            .collect::<Vec<_>>()
            .join("/");
        let matcher = globset::GlobBuilder::new(&translated)
            .literal_separator(true)
            .backslash_escape(false)
            .build()
            .map_err(|_| PathRule::Wildcard)?
            .compile_matcher();
        let mut literal = Vec::new();
        let segments: Vec<&str> = body.split('/').collect();
        // Every segment before the last one that holds no `*` is a fixed directory name.
        for segment in segments.iter().take(segments.len().saturating_sub(1)) {
            if segment.contains('*') {
                break;
            }
            literal.push(*segment);
        }
        Ok(GlobPattern {
            raw: raw.to_owned(),
            dirs_only,
            base: literal.join("/"),
            matcher,
        })
    }

    /// The pattern exactly as supplied.
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// Whether the pattern ends in `/` and so lists directories rather than files.
    pub fn dirs_only(&self) -> bool {
        self.dirs_only
    }

    /// The fixed leading directories of the pattern (`src/deep` for `src/deep/*.rs`, empty for
    /// `*.md`): every match lies beneath this directory, so a lister can start there.
    pub fn base_dir(&self) -> &str {
        &self.base
    }

    /// Whether a logical path (never ending in `/`) matches the pattern's body.
    pub fn is_match(&self, path: &str) -> bool {
        self.matcher.is_match(path)
    }
}

impl PartialEq for GlobPattern {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl Eq for GlobPattern {}

/// The line bounds of a ranged `store.read` or `store.read_numbered`, as the Lua values gave
/// them (already checked to be integers, not yet checked against the file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineRange {
    /// The first line, 1-based; `None` only when the call gave `end` without `start`.
    pub start: Option<i64>,
    /// The last line, inclusive; `None` means the last line of the file.
    pub end: Option<i64>,
}

/// A raw line-bound value as Lua passed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BoundArg<'a> {
    /// The bound was left out or passed as nil.
    Nil,
    /// A Lua integer.
    Integer(i64),
    /// A Lua float.
    Number(f64),
    /// Any other value; the payload is its Lua type name (`string`, `table`, ...).
    Other(&'a str),
}

impl BoundArg<'_> {
    fn to_integer(self, name: &str) -> Result<Option<i64>, String> {
        match self {
            BoundArg::Nil => Ok(None),
            BoundArg::Integer(value) => Ok(Some(value)),
            BoundArg::Number(value) => whole_float(value)
                .map(Some)
                .ok_or_else(|| bound_type_error(name, "number")),
            BoundArg::Other(type_name) => Err(bound_type_error(name, type_name)),
        }
    }
}

/// The `i64` a float stands for, when it has a whole value inside the 64-bit signed range.
fn whole_float(value: f64) -> Option<i64> {
    // 2^63 is exactly representable; every whole float in [-2^63, 2^63) fits in an i64.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if value.is_finite() && value.fract() == 0.0 && (-LIMIT..LIMIT).contains(&value) {
        Some(value as i64)
    } else {
        None
    }
}

fn bound_type_error(name: &str, type_name: &str) -> String {
    format!("{name} must be an integer, got {type_name}")
}

/// Turns the Lua values of `start` and `end` into the range of a store read.
///
/// `Ok(None)` means both bounds are open (a whole-file read). A value that is not an integer
/// (or a float with a whole value in the 64-bit range) fails with the message of an error value
/// of kind `lua`, such as `start must be an integer, got number`; `start` is checked first.
/// Every check against the file, and `start is required when end is given`, belongs to the
/// store ([`StoreError::invalid_range`]).
pub fn line_range(start: BoundArg<'_>, end: BoundArg<'_>) -> Result<Option<LineRange>, String> {
    let start = start.to_integer("start")?;
    let end = end.to_integer("end")?;
    Ok(match (start, end) {
        (None, None) => None,
        (start, end) => Some(LineRange { start, end }),
    })
}

/// The message of the error value for a store call argument of the wrong type, such as
/// `path must be a string, got integer`.
pub fn string_argument_error(name: &str, type_name: &str) -> String {
    format!("{name} must be a string, got {type_name}")
}

/// The message of the error value for a string argument that is not valid UTF-8, such as
/// `contents must be a valid UTF-8 string`.
pub fn utf8_argument_error(name: &str) -> String {
    format!("{name} must be a valid UTF-8 string")
}

/// One request a `store.*` call becomes, with the arguments exactly as the prompt gave them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum StoreOp {
    /// `store.read(path[, start[, end]])`.
    Read {
        /// The path as written.
        path: String,
        /// The line bounds; `None` reads the whole file verbatim.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        range: Option<LineRange>,
    },
    /// `store.read_numbered(path[, start[, end]])`.
    ReadNumbered {
        /// The path as written.
        path: String,
        /// The line bounds; `None` numbers the whole file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        range: Option<LineRange>,
    },
    /// `store.write(path, contents)`.
    Write {
        /// The path as written.
        path: String,
        /// The new text.
        contents: String,
    },
    /// `store.append(path, contents)`.
    Append {
        /// The path as written.
        path: String,
        /// The text to add.
        contents: String,
    },
    /// `store.str_replace(path, old, new)`.
    StrReplace {
        /// The path as written.
        path: String,
        /// The anchor text.
        old: String,
        /// Its replacement.
        new: String,
    },
    /// `store.delete(path)`.
    Delete {
        /// The path as written.
        path: String,
    },
    /// `store.exists(path)`.
    Exists {
        /// The path as written.
        path: String,
    },
    /// `store.glob(pattern)`.
    Glob {
        /// The pattern as written.
        pattern: String,
    },
}

impl StoreOp {
    /// The path, or for a glob the pattern, exactly as the prompt wrote it.
    pub fn target(&self) -> &str {
        match self {
            StoreOp::Read { path, .. }
            | StoreOp::ReadNumbered { path, .. }
            | StoreOp::Write { path, .. }
            | StoreOp::Append { path, .. }
            | StoreOp::StrReplace { path, .. }
            | StoreOp::Delete { path }
            | StoreOp::Exists { path } => path,
            StoreOp::Glob { pattern } => pattern,
        }
    }

    /// Whether the call changes the store (and so claims its path for writing).
    pub fn is_mutation(&self) -> bool {
        matches!(
            self,
            StoreOp::Write { .. }
                | StoreOp::Append { .. }
                | StoreOp::StrReplace { .. }
                | StoreOp::Delete { .. }
        )
    }
}

/// What a successful store call returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum StoreAnswer {
    /// `store.read` and `store.read_numbered`: the text.
    Text(String),
    /// `store.exists`.
    Bool(bool),
    /// `store.glob`: sorted logical paths.
    List(Vec<String>),
    /// `store.write`, `store.append`, `store.str_replace`, `store.delete`: nil.
    Unit,
}

/// A failure's `err.reason` tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreReason {
    /// `file not found in store: {path}`.
    NotFound,
    /// `invalid path "{path}": {reason}` or `invalid glob pattern "{pattern}": {reason}`.
    InvalidPath,
    /// `invalid line range for {path}: {reason}`.
    InvalidRange,
    /// The three `str_replace` anchor messages.
    Anchor,
    /// `directory not empty in store: {path}`.
    DirectoryNotEmpty,
    /// `is a directory in store: {path}`.
    IsADirectory,
    /// `not a directory in store: {path}`.
    NotADirectory,
    /// `file in store is not UTF-8: {path}`.
    NotUtf8,
    /// `file already exists in store: {path}`.
    AlreadyExists,
    /// `permission denied for store path {path}: {reason}`.
    PermissionDenied,
    /// `unsupported store operation on {path}: {detail}`.
    Unsupported,
    /// `store backend failure: {message}` (and `store operation failed`).
    Backend,
}

impl StoreReason {
    /// The tag exactly as `err.reason` carries it.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreReason::NotFound => "not_found",
            StoreReason::InvalidPath => "invalid_path",
            StoreReason::InvalidRange => "invalid_range",
            StoreReason::Anchor => "anchor",
            StoreReason::DirectoryNotEmpty => "directory_not_empty",
            StoreReason::IsADirectory => "is_a_directory",
            StoreReason::NotADirectory => "not_a_directory",
            StoreReason::NotUtf8 => "not_utf8",
            StoreReason::AlreadyExists => "already_exists",
            StoreReason::PermissionDenied => "permission_denied",
            StoreReason::Unsupported => "unsupported",
            StoreReason::Backend => "backend",
        }
    }
}

impl fmt::Display for StoreReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a line range is unusable (the `{reason}` of `invalid line range for {path}: {reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RangeProblem {
    /// `start` is below 1 (a negative bound counts as 0).
    StartBelowOne,
    /// `end` is before `start` once clamped, including an `end` of zero or below.
    EndBeforeStart,
    /// `end` is given with a nil `start`.
    StartRequired,
}

impl RangeProblem {
    /// The reason in words.
    pub fn reason(self) -> &'static str {
        match self {
            RangeProblem::StartBelowOne => "start must be at least 1",
            RangeProblem::EndBeforeStart => "end must not be before start",
            RangeProblem::StartRequired => "start is required when end is given",
        }
    }
}

/// A failed store call: the fields of the error value of kind `store` it raises.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreError {
    /// `err.reason`.
    pub reason: StoreReason,
    /// `err.message`, exactly as the chapter words it.
    pub message: String,
    /// `err.path`: the path (or pattern) exactly as supplied; absent for a backend failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `err.anchor`, for an anchor error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<String>,
    /// `err.count`, for an anchor error: how many times the anchor occurs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// `err.rule`, for an invalid path or pattern.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<PathRule>,
}

impl StoreError {
    fn with_path(reason: StoreReason, path: &str, message: String) -> Self {
        StoreError {
            reason,
            message,
            path: Some(path.to_owned()),
            anchor: None,
            count: None,
            rule: None,
        }
    }

    /// `file not found in store: {path}`.
    pub fn not_found(path: &str) -> Self {
        Self::with_path(
            StoreReason::NotFound,
            path,
            format!("file not found in store: {path}"),
        )
    }

    /// `invalid path "{path}": {reason}`, the path quoted and escaped.
    pub fn invalid_path(path: &str, rule: PathRule) -> Self {
        StoreError {
            rule: Some(rule),
            ..Self::with_path(
                StoreReason::InvalidPath,
                path,
                format!("invalid path {path:?}: {}", rule.reason()),
            )
        }
    }

    /// `invalid glob pattern "{pattern}": {reason}`; `err.path` names the pattern.
    pub fn invalid_pattern(pattern: &str, rule: PathRule) -> Self {
        StoreError {
            rule: Some(rule),
            ..Self::with_path(
                StoreReason::InvalidPath,
                pattern,
                format!("invalid glob pattern {pattern:?}: {}", rule.reason()),
            )
        }
    }

    /// `invalid line range for {path}: {reason}`.
    pub fn invalid_range(path: &str, problem: RangeProblem) -> Self {
        Self::with_path(
            StoreReason::InvalidRange,
            path,
            format!("invalid line range for {path}: {}", problem.reason()),
        )
    }

    fn anchor_error(path: &str, anchor: &str, count: u64, message: String) -> Self {
        StoreError {
            anchor: Some(anchor.to_owned()),
            count: Some(count),
            ..Self::with_path(StoreReason::Anchor, path, message)
        }
    }

    /// `str_replace requires a non-empty anchor: {path}` (count 0).
    pub fn empty_anchor(path: &str) -> Self {
        Self::anchor_error(
            path,
            "",
            0,
            format!("str_replace requires a non-empty anchor: {path}"),
        )
    }

    /// `anchor "{anchor}" was not found in {path}, expected exactly one` (count 0).
    pub fn anchor_not_found(path: &str, anchor: &str) -> Self {
        Self::anchor_error(
            path,
            anchor,
            0,
            format!("anchor {anchor:?} was not found in {path}, expected exactly one"),
        )
    }

    /// `anchor "{anchor}" occurs {count} times in {path}, expected exactly one; include more
    /// surrounding text so it matches once`.
    pub fn anchor_ambiguous(path: &str, anchor: &str, count: u64) -> Self {
        Self::anchor_error(
            path,
            anchor,
            count,
            format!(
                "anchor {anchor:?} occurs {count} times in {path}, expected exactly one; \
                 include more surrounding text so it matches once"
            ),
        )
    }

    /// `directory not empty in store: {path}`.
    pub fn directory_not_empty(path: &str) -> Self {
        Self::with_path(
            StoreReason::DirectoryNotEmpty,
            path,
            format!("directory not empty in store: {path}"),
        )
    }

    /// `is a directory in store: {path}`.
    pub fn is_a_directory(path: &str) -> Self {
        Self::with_path(
            StoreReason::IsADirectory,
            path,
            format!("is a directory in store: {path}"),
        )
    }

    /// `not a directory in store: {path}`.
    pub fn not_a_directory(path: &str) -> Self {
        Self::with_path(
            StoreReason::NotADirectory,
            path,
            format!("not a directory in store: {path}"),
        )
    }

    /// `file in store is not UTF-8: {path}`.
    pub fn not_utf8(path: &str) -> Self {
        Self::with_path(
            StoreReason::NotUtf8,
            path,
            format!("file in store is not UTF-8: {path}"),
        )
    }

    /// `file already exists in store: {path}`.
    pub fn already_exists(path: &str) -> Self {
        Self::with_path(
            StoreReason::AlreadyExists,
            path,
            format!("file already exists in store: {path}"),
        )
    }

    /// `permission denied for store path {path}: {reason}`.
    pub fn permission_denied(path: &str, reason: &str) -> Self {
        Self::with_path(
            StoreReason::PermissionDenied,
            path,
            format!("permission denied for store path {path}: {reason}"),
        )
    }

    /// `unsupported store operation on {path}: {detail}`.
    pub fn unsupported(path: &str, detail: &str) -> Self {
        Self::with_path(
            StoreReason::Unsupported,
            path,
            format!("unsupported store operation on {path}: {detail}"),
        )
    }

    /// `store backend failure: {message}`; names no path.
    pub fn backend(message: &str) -> Self {
        StoreError {
            reason: StoreReason::Backend,
            message: format!("store backend failure: {message}"),
            path: None,
            anchor: None,
            count: None,
            rule: None,
        }
    }

    /// `store operation failed`: the store failing outside any `store.*` call (as the run
    /// starts, or a Host store refusing to open store access for a new task).
    pub fn operation_failed() -> Self {
        StoreError {
            reason: StoreReason::Backend,
            message: "store operation failed".to_owned(),
            path: None,
            anchor: None,
            count: None,
            rule: None,
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StoreError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_pass() {
        for path in [
            "a.txt",
            "src/a.rs",
            "secret/path.txt",
            "console.txt",
            "com10.txt",
            "notes/plan.md",
            "drafts/plan.md",
            ".config",
            "a b/c d.txt",
            "café/résumé.md",
            "Notes.md",
            "a..b",
            "COM0.txt",
            "LPT10",
            "conx",
        ] {
            assert_eq!(normalize_path(path), Ok(path.to_owned()), "{path}");
        }
    }

    #[test]
    fn every_rule_in_order() {
        let cases: &[(&str, PathRule)] = &[
            ("", PathRule::Empty),
            ("/notes.md", PathRule::Absolute),
            ("/x", PathRule::Absolute),
            ("a\tb.txt", PathRule::Control),
            ("a\nb", PathRule::Control),
            ("a\rb", PathRule::Control),
            ("a\0b", PathRule::Control),
            ("a\x7fb", PathRule::Control),
            ("a\\b.txt", PathRule::Backslash),
            ("a//b.txt", PathRule::EmptySegment),
            ("e.txt/", PathRule::EmptySegment),
            ("a/../b.txt", PathRule::Traversal),
            ("c/./d.txt", PathRule::Traversal),
            ("..", PathRule::Traversal),
            ("../x", PathRule::Traversal),
            ("notes./a.txt", PathRule::UnsafeSuffix),
            ("a.txt ", PathRule::UnsafeSuffix),
            ("dir /a", PathRule::UnsafeSuffix),
            ("CON.txt", PathRule::ReservedName),
            ("con", PathRule::ReservedName),
            ("a/nul.tar.gz", PathRule::ReservedName),
            ("Lpt9/x", PathRule::ReservedName),
            ("com1", PathRule::ReservedName),
            ("aux.md", PathRule::ReservedName),
            ("prn", PathRule::ReservedName),
            // Ordering: whole-path rules first, then segments left to right.
            ("/a\\b", PathRule::Absolute),
            ("/", PathRule::Absolute),
            ("a\\b/../c", PathRule::Backslash),
            ("a\t/..", PathRule::Control),
            ("nul/../x", PathRule::ReservedName),
            ("../nul", PathRule::Traversal),
            ("a./..", PathRule::UnsafeSuffix),
            ("a//..", PathRule::EmptySegment),
        ];
        for (path, rule) in cases {
            assert_eq!(validate_path(path), Err(*rule), "{path:?}");
        }
    }

    #[test]
    fn length_counts_bytes() {
        let exact = format!("{}/{}", "a".repeat(1000), "b".repeat(23));
        assert_eq!(exact.len(), 1024);
        assert!(validate_path(&exact).is_ok());
        let long = format!("{}b", exact);
        assert_eq!(validate_path(&long), Err(PathRule::TooLong));
        // Too long wins over everything else.
        let bad = format!("/{}\\", "é".repeat(600));
        assert_eq!(validate_path(&bad), Err(PathRule::TooLong));
        // A multibyte character counts every byte.
        let multi = "é".repeat(512);
        assert_eq!(multi.len(), 1024);
        assert!(validate_path(&multi).is_ok());
        assert_eq!(validate_path(&format!("{multi}a")), Err(PathRule::TooLong));
        let conformance = format!("{}/{}", vec!["a".repeat(200); 5].join("/"), "b".repeat(20));
        assert_eq!(conformance.len(), 1025);
        assert_eq!(validate_path(&conformance), Err(PathRule::TooLong));
    }

    #[test]
    fn rule_tags_and_reasons() {
        let table = [
            (PathRule::Empty, "empty", "path is empty"),
            (PathRule::TooLong, "too_long", "path is too long"),
            (PathRule::Absolute, "absolute", "path is absolute"),
            (
                PathRule::Control,
                "control",
                "path contains a control character",
            ),
            (
                PathRule::Backslash,
                "backslash",
                "path contains a backslash",
            ),
            (
                PathRule::EmptySegment,
                "empty_segment",
                "path contains an empty segment",
            ),
            (
                PathRule::Traversal,
                "traversal",
                "path contains a traversal segment",
            ),
            (
                PathRule::UnsafeSuffix,
                "unsafe_suffix",
                "path segment ends in an unsafe character",
            ),
            (
                PathRule::ReservedName,
                "reserved_name",
                "path contains a reserved device name",
            ),
            (
                PathRule::Wildcard,
                "wildcard",
                "pattern contains invalid wildcard grammar",
            ),
        ];
        for (rule, tag, reason) in table {
            assert_eq!(rule.rule(), tag);
            assert_eq!(rule.reason(), reason);
            assert_eq!(
                serde_json::to_value(rule).ok(),
                Some(serde_json::json!(tag))
            );
        }
    }

    #[test]
    fn invalid_path_messages_quote_and_escape() {
        let cases = [
            ("", PathRule::Empty, r#"invalid path "": path is empty"#),
            (
                "/notes.md",
                PathRule::Absolute,
                r#"invalid path "/notes.md": path is absolute"#,
            ),
            (
                "a\\b.txt",
                PathRule::Backslash,
                r#"invalid path "a\\b.txt": path contains a backslash"#,
            ),
            (
                "a\tb.txt",
                PathRule::Control,
                r#"invalid path "a\tb.txt": path contains a control character"#,
            ),
            (
                "a//b.txt",
                PathRule::EmptySegment,
                r#"invalid path "a//b.txt": path contains an empty segment"#,
            ),
            (
                "a/../b.txt",
                PathRule::Traversal,
                r#"invalid path "a/../b.txt": path contains a traversal segment"#,
            ),
            (
                "notes./a.txt",
                PathRule::UnsafeSuffix,
                r#"invalid path "notes./a.txt": path segment ends in an unsafe character"#,
            ),
            (
                "CON.txt",
                PathRule::ReservedName,
                r#"invalid path "CON.txt": path contains a reserved device name"#,
            ),
            (
                "nul/../x",
                PathRule::ReservedName,
                r#"invalid path "nul/../x": path contains a reserved device name"#,
            ),
            (
                "/a\\b",
                PathRule::Absolute,
                r#"invalid path "/a\\b": path is absolute"#,
            ),
        ];
        for (path, rule, message) in cases {
            assert_eq!(validate_path(path), Err(rule));
            let err = StoreError::invalid_path(path, rule);
            assert_eq!(err.message, message);
            assert_eq!(err.reason.as_str(), "invalid_path");
            assert_eq!(err.path.as_deref(), Some(path));
            assert_eq!(err.rule, Some(rule));
            assert_eq!(err.to_string(), message);
        }
    }

    #[test]
    fn pattern_rules() {
        let bad: &[(&str, PathRule)] = &[
            ("", PathRule::Empty),
            ("a\\*", PathRule::Backslash),
            ("a\t*", PathRule::Control),
            ("src/**.rs", PathRule::Wildcard),
            ("***", PathRule::Wildcard),
            ("a/***/b", PathRule::Wildcard),
            ("**a", PathRule::Wildcard),
            ("a**/b", PathRule::Wildcard),
            ("x/**b/", PathRule::Wildcard),
        ];
        for (pattern, rule) in bad {
            assert_eq!(validate_pattern(pattern), Err(*rule), "{pattern:?}");
            assert!(GlobPattern::new(pattern).is_err());
        }
        let long = format!("*{}", "a".repeat(1024));
        assert_eq!(validate_pattern(&long), Err(PathRule::TooLong));
        assert!(validate_pattern(&"a".repeat(1024)).is_ok());
        for good in [
            "*",
            "**",
            "**/x",
            "a/**",
            "a/**/b",
            "src/*.rs",
            "src/**/*.rs",
            "*.md",
            "notes/*/",
            "*/",
            "/abs",
            "a//b",
            "../x",
            "CON",
            "a*b*c",
            "[x]{y}?",
        ] {
            assert!(GlobPattern::new(good).is_ok(), "{good}");
        }
        let err = StoreError::invalid_pattern("src/**.rs", PathRule::Wildcard);
        assert_eq!(
            err.message,
            r#"invalid glob pattern "src/**.rs": pattern contains invalid wildcard grammar"#
        );
        assert_eq!(err.path.as_deref(), Some("src/**.rs"));
        assert_eq!(err.reason, StoreReason::InvalidPath);
        assert_eq!(
            StoreError::invalid_pattern("", PathRule::Empty).message,
            r#"invalid glob pattern "": path is empty"#
        );
        assert_eq!(
            StoreError::invalid_pattern("a\\*", PathRule::Backslash).message,
            r#"invalid glob pattern "a\\*": path contains a backslash"#
        );
    }

    fn matches(pattern: &str, paths: &[&str]) -> Vec<String> {
        let glob = GlobPattern::new(pattern).unwrap();
        paths
            .iter()
            .filter(|p| glob.is_match(p))
            .map(|p| (*p).to_owned())
            .collect()
    }

    #[test]
    fn pattern_syntax_examples() {
        let files = ["src/a.rs", "src/b.rs", "src/deep/c.rs", "notes.md"];
        assert_eq!(matches("src/*.rs", &files), ["src/a.rs", "src/b.rs"]);
        assert_eq!(
            matches("src/**/*.rs", &files),
            ["src/a.rs", "src/b.rs", "src/deep/c.rs"]
        );
        assert_eq!(matches("*.md", &files), ["notes.md"]);
        assert_eq!(matches("**", &files), files);
        assert!(matches("*.txt", &["a/b.txt"]).is_empty());
        assert_eq!(matches("a/*.txt", &["a/b.txt"]), ["a/b.txt"]);
        assert_eq!(matches("a/**/b.rs", &["a/b.rs"]), ["a/b.rs"]);
        assert_eq!(matches("a/**/b.rs", &["a/x/y/b.rs"]), ["a/x/y/b.rs"]);
        assert_eq!(
            matches("**/z2.rs", &["z2.rs", "q/z2.rs"]),
            ["z2.rs", "q/z2.rs"]
        );
        assert_eq!(matches("a/**", &["a/x", "a/x/y", "b/x"]), ["a/x", "a/x/y"]);
        assert!(matches("*", &["notes/a.txt"]).is_empty());
        assert_eq!(matches("notes/*", &["notes/a.txt"]), ["notes/a.txt"]);
        // Every other character is literal: no classes, alternation, or `?`.
        assert_eq!(matches("[x]{y}?", &["[x]{y}?", "x", "y"]), ["[x]{y}?"]);
        assert_eq!(matches("a?c", &["abc", "a?c"]), ["a?c"]);
        assert_eq!(matches("*", &[".config"]), [".config"]);
        // Case-sensitive.
        assert!(matches("Notes.md", &["notes.md"]).is_empty());
    }

    #[test]
    fn pattern_parts() {
        let glob = GlobPattern::new("notes/*/").unwrap();
        assert!(glob.dirs_only());
        assert_eq!(glob.as_str(), "notes/*/");
        assert_eq!(glob.base_dir(), "notes");
        assert!(glob.is_match("notes/sub"));
        assert!(!glob.is_match("notes/sub/deeper"));
        assert_eq!(
            GlobPattern::new("src/deep/*.rs").unwrap().base_dir(),
            "src/deep"
        );
        assert_eq!(GlobPattern::new("src/*/x.rs").unwrap().base_dir(), "src");
        assert_eq!(GlobPattern::new("*.md").unwrap().base_dir(), "");
        assert_eq!(GlobPattern::new("a/b").unwrap().base_dir(), "a");
        assert_eq!(GlobPattern::new("**/x").unwrap().base_dir(), "");
    }

    #[test]
    fn pathological_pattern_is_prompt() {
        let pattern = format!("{}b", "a*".repeat(200));
        let glob = GlobPattern::new(&pattern).unwrap();
        let text = "a".repeat(1000);
        let started = std::time::Instant::now();
        assert!(!glob.is_match(&text));
        assert!(started.elapsed().as_secs() < 5);
    }

    #[test]
    fn bound_values() {
        assert_eq!(line_range(BoundArg::Nil, BoundArg::Nil), Ok(None));
        assert_eq!(
            line_range(BoundArg::Integer(2), BoundArg::Nil),
            Ok(Some(LineRange {
                start: Some(2),
                end: None
            }))
        );
        assert_eq!(
            line_range(BoundArg::Number(2.0), BoundArg::Number(-3.0)),
            Ok(Some(LineRange {
                start: Some(2),
                end: Some(-3)
            }))
        );
        assert_eq!(
            line_range(BoundArg::Nil, BoundArg::Integer(2)),
            Ok(Some(LineRange {
                start: None,
                end: Some(2)
            }))
        );
        assert_eq!(
            line_range(BoundArg::Integer(i64::MIN), BoundArg::Integer(i64::MAX)),
            Ok(Some(LineRange {
                start: Some(i64::MIN),
                end: Some(i64::MAX)
            }))
        );
        assert_eq!(
            line_range(
                BoundArg::Number(-9_223_372_036_854_775_808.0),
                BoundArg::Nil
            ),
            Ok(Some(LineRange {
                start: Some(i64::MIN),
                end: None
            }))
        );
        let cases = [
            (
                BoundArg::Number(1.5),
                BoundArg::Nil,
                "start must be an integer, got number",
            ),
            (
                BoundArg::Integer(1),
                BoundArg::Other("string"),
                "end must be an integer, got string",
            ),
            (
                BoundArg::Other("table"),
                BoundArg::Other("string"),
                "start must be an integer, got table",
            ),
            (
                BoundArg::Number(f64::NAN),
                BoundArg::Nil,
                "start must be an integer, got number",
            ),
            (
                BoundArg::Number(f64::INFINITY),
                BoundArg::Nil,
                "start must be an integer, got number",
            ),
            (
                BoundArg::Number(9_223_372_036_854_775_808.0),
                BoundArg::Nil,
                "start must be an integer, got number",
            ),
            (
                BoundArg::Nil,
                BoundArg::Other("boolean"),
                "end must be an integer, got boolean",
            ),
        ];
        for (start, end, message) in cases {
            assert_eq!(line_range(start, end), Err(message.to_owned()));
        }
    }

    #[test]
    fn messages_table() {
        let table = [
            (
                StoreError::not_found("missing.md"),
                "not_found",
                "file not found in store: missing.md",
            ),
            (
                StoreError::invalid_range("list.txt", RangeProblem::StartBelowOne),
                "invalid_range",
                "invalid line range for list.txt: start must be at least 1",
            ),
            (
                StoreError::invalid_range("list.txt", RangeProblem::EndBeforeStart),
                "invalid_range",
                "invalid line range for list.txt: end must not be before start",
            ),
            (
                StoreError::invalid_range("missing.txt", RangeProblem::StartRequired),
                "invalid_range",
                "invalid line range for missing.txt: start is required when end is given",
            ),
            (
                StoreError::empty_anchor("missing.txt"),
                "anchor",
                "str_replace requires a non-empty anchor: missing.txt",
            ),
            (
                StoreError::anchor_not_found("f.txt", "gamma"),
                "anchor",
                "anchor \"gamma\" was not found in f.txt, expected exactly one",
            ),
            (
                StoreError::anchor_ambiguous("f.txt", "na", 3),
                "anchor",
                "anchor \"na\" occurs 3 times in f.txt, expected exactly one; include more \
                 surrounding text so it matches once",
            ),
            (
                StoreError::directory_not_empty("notes"),
                "directory_not_empty",
                "directory not empty in store: notes",
            ),
            (
                StoreError::is_a_directory("notes"),
                "is_a_directory",
                "is a directory in store: notes",
            ),
            (
                StoreError::not_a_directory("a.txt/b.txt"),
                "not_a_directory",
                "not a directory in store: a.txt/b.txt",
            ),
            (
                StoreError::not_utf8("bin.dat"),
                "not_utf8",
                "file in store is not UTF-8: bin.dat",
            ),
            (
                StoreError::already_exists("a.txt"),
                "already_exists",
                "file already exists in store: a.txt",
            ),
            (
                StoreError::permission_denied("a.txt", "the store is read-only"),
                "permission_denied",
                "permission denied for store path a.txt: the store is read-only",
            ),
            (
                StoreError::unsupported("a.txt", "not a regular file"),
                "unsupported",
                "unsupported store operation on a.txt: not a regular file",
            ),
            (
                StoreError::backend("disk full"),
                "backend",
                "store backend failure: disk full",
            ),
            (
                StoreError::operation_failed(),
                "backend",
                "store operation failed",
            ),
        ];
        for (err, reason, message) in table {
            assert_eq!(err.reason.as_str(), reason);
            assert_eq!(err.message, message);
        }
        assert_eq!(StoreError::backend("x").path, None);
        let amb = StoreError::anchor_ambiguous("f.txt", "na", 3);
        assert_eq!(amb.count, Some(3));
        assert_eq!(amb.anchor.as_deref(), Some("na"));
        let json = serde_json::to_value(&amb).unwrap();
        assert_eq!(json["reason"], "anchor");
        assert_eq!(json["count"], 3);
    }

    #[test]
    fn argument_messages() {
        assert_eq!(
            string_argument_error("path", "integer"),
            "path must be a string, got integer"
        );
        assert_eq!(
            string_argument_error("contents", "number"),
            "contents must be a string, got number"
        );
        assert_eq!(
            utf8_argument_error("contents"),
            "contents must be a valid UTF-8 string"
        );
    }

    #[test]
    fn op_serde() {
        let op = StoreOp::Read {
            path: "a.txt".into(),
            range: Some(LineRange {
                start: Some(2),
                end: None,
            }),
        };
        let json = serde_json::to_string(&op).unwrap();
        assert_eq!(
            json,
            r#"{"op":"read","path":"a.txt","range":{"start":2,"end":null}}"#
        );
        assert_eq!(serde_json::from_str::<StoreOp>(&json).unwrap(), op);
        let whole: StoreOp = serde_json::from_str(r#"{"op":"read","path":"a"}"#).unwrap();
        assert_eq!(
            whole,
            StoreOp::Read {
                path: "a".into(),
                range: None
            }
        );
        let write = StoreOp::Append {
            path: "j.txt".into(),
            contents: "x".into(),
        };
        assert!(write.is_mutation());
        let glob = StoreOp::Glob {
            pattern: "src/*.rs".into(),
        };
        assert_eq!(glob.target(), "src/*.rs");
        let answer = serde_json::to_string(&StoreAnswer::List(vec!["a".into()])).unwrap();
        assert_eq!(answer, r#"{"kind":"list","value":["a"]}"#);
        assert_eq!(
            serde_json::to_string(&StoreAnswer::Unit).unwrap(),
            r#"{"kind":"unit"}"#
        );
    }
}

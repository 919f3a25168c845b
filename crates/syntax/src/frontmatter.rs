//! The frontmatter contract: decoding the YAML header of a prompt file into [`Frontmatter`].
//!
//! The YAML is read with `saphyr-parser` into a small positioned tree, scalars are resolved with
//! the YAML 1.2 core schema, and the tree is then decoded key by key the way a serde derive with
//! unknown fields denied would decode it: keys are visited in document order, an unknown or
//! repeated key fails where it is met, a bad value fails where it is read, and a missing required
//! key is reported once every present key has been read. The checks that span entries (a Plugin
//! declared twice, a tool slot backed by an optional Plugin, a name that is both a tool alias and
//! a model role label) run last and carry no location.
//!
//! Every failure is a [`ParseErrorKind::Frontmatter`] error whose message reads
//! `invalid frontmatter: {detail}`.

use std::collections::{HashMap, HashSet};
use std::fmt;

use saphyr_parser::{Event, Parser, ScalarStyle, ScanError, Span, Tag};

use crate::error::{ParseError, ParseErrorKind};
use crate::names::{NAME_PATTERN, is_valid_name, reserved_category};

/// The ten top-level keys, in the order the spec lists them.
pub const TOP_LEVEL_KEYS: &[&str] = &[
    "name",
    "description",
    "promptforge",
    "max_tool_iterations",
    "input",
    "output",
    "plugins",
    "tools",
    "args",
    "models",
];

/// The keys of an `input:` or `output:` file declaration.
pub const FILE_DECL_KEYS: &[&str] = &["path", "description"];

/// The keys of a Plugin entry written as a map.
pub const PLUGIN_ENTRY_KEYS: &[&str] = &["ref", "optional", "config"];

/// The keys of an arg declaration.
pub const ARG_DECL_KEYS: &[&str] = &["type", "optional", "default", "description"];

/// The keys of a model role declaration.
pub const ROLE_DECL_KEYS: &[&str] = &["keywords", "min_context", "description"];

/// The name of the one arg of the implicit default declaration.
pub const IMPLICIT_ARG_NAME: &str = "prose";

/// The description of the one arg of the implicit default declaration.
pub const IMPLICIT_ARG_DESCRIPTION: &str = "Freeform input for this prompt";

/// The smallest accepted `max_tool_iterations`.
pub const MIN_TOOL_ITERATIONS: u32 = 1;

/// The largest accepted `max_tool_iterations`.
pub const MAX_TOOL_ITERATIONS: u32 = 1000;

/// How deeply YAML collections may nest inside the frontmatter before the parse is refused.
pub const MAX_NESTING_DEPTH: usize = 64;

/// The decoded frontmatter of a prompt file.
#[derive(Debug, Clone, PartialEq)]
pub struct Frontmatter {
    /// The prompt's `name:`, kept exactly as written.
    pub name: String,
    /// The prompt's one-line `description:`, kept exactly as written.
    pub description: String,
    /// The `promptforge:` major version, when the key is present (the run checks it).
    pub promptforge: Option<VersionDecl>,
    /// The `max_tool_iterations:` round cap, from 1 to 1000, when the key is present.
    pub max_tool_iterations: Option<u32>,
    /// The `input:` file declaration, when present.
    pub input: Option<FileDecl>,
    /// The `output:` file declaration, when present.
    pub output: Option<FileDecl>,
    /// The `plugins:` entries, in written order (empty when the key is absent).
    pub plugins: Vec<PluginDecl>,
    /// The `tools:` slots, in written order (empty when the key is absent).
    pub tools: Vec<ToolSlot>,
    /// The argument declaration: the `args:` map, or the implicit default when absent.
    pub args: ArgsDecl,
    /// The `models:` roles, in written order (empty when the key is absent).
    pub models: Vec<RoleDecl>,
}

impl Frontmatter {
    /// What a file whose frontmatter failed to decode is checked with: nothing declared
    /// (no name, roles, tools or Plugins; the implicit argument), so the body can still be
    /// parsed and navigated while the frontmatter is being typed.
    pub fn undecoded() -> Frontmatter {
        Frontmatter {
            name: String::new(),
            description: String::new(),
            promptforge: None,
            max_tool_iterations: None,
            input: None,
            output: None,
            plugins: Vec::new(),
            tools: Vec::new(),
            args: ArgsDecl::implicit_default(),
            models: Vec::new(),
        }
    }

    /// The tool slot bound under `alias`, if any.
    pub fn tool(&self, alias: &str) -> Option<&ToolSlot> {
        self.tools.iter().find(|slot| slot.alias == alias)
    }

    /// The model role labeled `label`, if any.
    pub fn role(&self, label: &str) -> Option<&RoleDecl> {
        self.models.iter().find(|role| role.label == label)
    }

    /// The Plugin declared under `id`, if any.
    pub fn plugin(&self, id: &str) -> Option<&PluginDecl> {
        self.plugins.iter().find(|plugin| plugin.id == id)
    }
}

/// The `promptforge:` declaration: the targeted major version and where its value is written.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionDecl {
    /// The declared major version.
    pub major: u64,
    /// 1-based file line of the value.
    pub line: u32,
    /// 1-based byte column of the value.
    pub column: u32,
}

/// The one major version of the language this build runs.
pub const SUPPORTED_MAJOR: u64 = 0;

/// Why a parsed prompt would be refused before it runs (chapter 16's first step).
#[derive(Debug, Clone, PartialEq)]
pub enum VersionProblem {
    /// No `promptforge:` key: not a promptforge prompt.
    Missing,
    /// A major version this build does not run, where it is written.
    Unsupported(VersionDecl),
}

impl VersionProblem {
    /// The spec's message for it.
    pub fn message(&self) -> String {
        match self {
            VersionProblem::Missing => {
                "not a promptforge prompt: no promptforge version".to_owned()
            }
            VersionProblem::Unsupported(version) => format!(
                "unsupported promptforge version: {} (this build supports major {SUPPORTED_MAJOR})",
                version.major
            ),
        }
    }
}

impl Frontmatter {
    /// The first step's version rule: `Err` when the file declares no version or a major
    /// other than [`SUPPORTED_MAJOR`].
    pub fn version_check(&self) -> Result<(), VersionProblem> {
        match &self.promptforge {
            None => Err(VersionProblem::Missing),
            Some(version) if version.major != SUPPORTED_MAJOR => {
                Err(VersionProblem::Unsupported(version.clone()))
            }
            Some(_) => Ok(()),
        }
    }
}

/// An `input:` or `output:` file declaration.
#[derive(Debug, Clone, PartialEq)]
pub struct FileDecl {
    /// The filename in the store, such as `paper.md`.
    pub path: String,
    /// A readable purpose.
    pub description: String,
}

/// One `plugins:` entry, written either as a plain Plugin id or as a map with `ref`.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginDecl {
    /// The Plugin id, `namespace/plugin`, exactly as written.
    pub id: String,
    /// `optional: true` in the map form; always `false` for a plain id.
    pub optional: bool,
    /// The map form's `config` value, unchecked; `None` when absent or null.
    pub config: Option<YamlValue>,
    /// 1-based file line of the entry.
    pub line: u32,
    /// 1-based byte column of the entry (after the `- ` list marker).
    pub column: u32,
}

/// One `tools:` entry: an alias bound to an exact tool path.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSlot {
    /// The prompt-local alias (the map key).
    pub alias: String,
    /// The tool path, `namespace/plugin/name`, exactly as written.
    pub path: String,
    /// 1-based file line of the alias.
    pub line: u32,
    /// 1-based byte column of the alias.
    pub column: u32,
}

impl ToolSlot {
    /// The id of the Plugin that supplies the tool: the path without its last segment.
    pub fn plugin_id(&self) -> &str {
        self.path
            .rsplit_once('/')
            .map_or(self.path.as_str(), |(id, _)| id)
    }

    /// The tool's short name: the last segment of the path.
    pub fn short_name(&self) -> &str {
        self.path
            .rsplit_once('/')
            .map_or(self.path.as_str(), |(_, name)| name)
    }
}

/// The prompt's argument declaration.
///
/// Without an `args:` key a prompt gets the implicit default: one optional `string` arg named
/// `prose`, described as "Freeform input for this prompt", with no default, and the argument
/// string is wrapped into `argv.prose` instead of being parsed as JSON. Any explicit `args:` key,
/// even `args: {}` or one that copies the default shape, makes the input structured (JSON).
#[derive(Debug, Clone, PartialEq)]
pub struct ArgsDecl {
    /// True when the frontmatter has an `args:` key (structured JSON input).
    pub explicit: bool,
    /// The declared args in written order; the single implicit `prose` arg when not explicit.
    pub args: Vec<ArgDecl>,
}

impl ArgsDecl {
    /// The implicit default declaration used when `args:` is absent.
    pub fn implicit_default() -> Self {
        ArgsDecl {
            explicit: false,
            args: vec![ArgDecl {
                name: IMPLICIT_ARG_NAME.to_owned(),
                ty: ArgType::String,
                optional: true,
                default: None,
                description: Some(IMPLICIT_ARG_DESCRIPTION.to_owned()),
            }],
        }
    }

    /// True when the argument string is parsed as JSON (an explicit `args:` key).
    pub fn is_structured(&self) -> bool {
        self.explicit
    }

    /// The arg declared under `name`, if any.
    pub fn get(&self, name: &str) -> Option<&ArgDecl> {
        self.args.iter().find(|arg| arg.name == name)
    }
}

impl Default for ArgsDecl {
    fn default() -> Self {
        ArgsDecl::implicit_default()
    }
}

/// One arg declaration under `args:`.
#[derive(Debug, Clone, PartialEq)]
pub struct ArgDecl {
    /// The arg name (the map key).
    pub name: String,
    /// The declared `type:`.
    pub ty: ArgType,
    /// `optional:`; `false` (required) when left out.
    pub optional: bool,
    /// `default:`, already checked against `ty`; `None` when absent or null.
    pub default: Option<ArgValue>,
    /// `description:`, kept as written; `None` when absent or null.
    pub description: Option<String>,
}

impl ArgDecl {
    /// Whether a caller must give it: neither optional nor defaulted (chapter 06).
    pub fn is_required(&self) -> bool {
        !self.optional && self.default.is_none()
    }
}

/// The four arg types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArgType {
    /// A JSON string.
    String,
    /// A JSON `true` or `false`.
    Boolean,
    /// A whole JSON number.
    Integer,
    /// Any JSON number.
    Number,
}

impl ArgType {
    /// Every arg type, in the order the spec lists them.
    pub const ALL: [ArgType; 4] = [
        ArgType::String,
        ArgType::Boolean,
        ArgType::Integer,
        ArgType::Number,
    ];

    /// The type word as written in `type:`.
    pub fn as_str(self) -> &'static str {
        match self {
            ArgType::String => "string",
            ArgType::Boolean => "boolean",
            ArgType::Integer => "integer",
            ArgType::Number => "number",
        }
    }

    /// The type named by a `type:` word, if it is one of the four.
    pub fn from_word(word: &str) -> Option<ArgType> {
        ArgType::ALL.into_iter().find(|ty| ty.as_str() == word)
    }
}

impl fmt::Display for ArgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A checked `default:` value.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgValue {
    /// The default of a `string` arg.
    String(String),
    /// The default of a `boolean` arg.
    Boolean(bool),
    /// The default of an `integer` arg, or a whole default of a `number` arg that fits `i64`.
    Integer(i64),
    /// A fractional (or out-of-`i64`-range whole) default of a `number` arg; always finite.
    Number(f64),
}

/// One model role under `models:`.
#[derive(Debug, Clone, PartialEq)]
pub struct RoleDecl {
    /// The role label (the map key).
    pub label: String,
    /// `keywords:`, in written order; empty when left out.
    pub keywords: Vec<Keyword>,
    /// `min_context:`, from 1 to 4294967295 tokens; `None` when left out.
    pub min_context: Option<u32>,
    /// The role's own `description:`; `None` when left out.
    pub description: Option<String>,
    /// 1-based file line of the label.
    pub line: u32,
    /// 1-based byte column of the label.
    pub column: u32,
}

impl RoleDecl {
    /// The thinking switch the role's hard keywords set: `Some(true)` for `thinking`,
    /// `Some(false)` for `no-thinking` (the later one wins), `None` for neither.
    pub fn thinking(&self) -> Option<bool> {
        self.keywords
            .iter()
            .rev()
            .find_map(|keyword| match keyword {
                Keyword::Thinking => Some(true),
                Keyword::NoThinking => Some(false),
                _ => None,
            })
    }
}

/// The seven role keywords.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Keyword {
    /// Hard: thinking on.
    Thinking,
    /// Hard: thinking off.
    NoThinking,
    /// Soft.
    Frontier,
    /// Soft.
    Fast,
    /// Soft.
    Small,
    /// Soft.
    Creative,
    /// Soft.
    Chat,
}

impl Keyword {
    /// Every keyword: the two hard ones, then the five soft ones, in the spec's order.
    pub const ALL: [Keyword; 7] = [
        Keyword::Thinking,
        Keyword::NoThinking,
        Keyword::Frontier,
        Keyword::Fast,
        Keyword::Small,
        Keyword::Creative,
        Keyword::Chat,
    ];

    /// The keyword in kebab-case, as written in `keywords:`.
    pub fn as_str(self) -> &'static str {
        match self {
            Keyword::Thinking => "thinking",
            Keyword::NoThinking => "no-thinking",
            Keyword::Frontier => "frontier",
            Keyword::Fast => "fast",
            Keyword::Small => "small",
            Keyword::Creative => "creative",
            Keyword::Chat => "chat",
        }
    }

    /// The keyword written as `word`, if it is one of the seven.
    pub fn from_word(word: &str) -> Option<Keyword> {
        Keyword::ALL.into_iter().find(|k| k.as_str() == word)
    }

    /// True for the hard keywords `thinking` and `no-thinking`.
    pub fn is_hard(self) -> bool {
        matches!(self, Keyword::Thinking | Keyword::NoThinking)
    }
}

impl fmt::Display for Keyword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unchecked YAML value (a Plugin's `config`), resolved with the YAML 1.2 core schema.
#[derive(Debug, Clone, PartialEq)]
pub enum YamlValue {
    /// `null`, `~`, or an empty value.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A whole number that fits `i64`.
    Integer(i64),
    /// Any other number (a whole number outside `i64` included).
    Float(f64),
    /// A string.
    String(String),
    /// A sequence, in written order.
    Sequence(Vec<YamlValue>),
    /// A mapping, with its entries in written order.
    Mapping(Vec<(YamlValue, YamlValue)>),
}

// ---------------------------------------------------------------------------------------------
// Entry point
// ---------------------------------------------------------------------------------------------

/// Decode the frontmatter.
///
/// `yaml` is the text strictly between the two `---` delimiter lines (CRLF line endings are
/// fine); `first_line` is the 1-based file line of the first YAML line, so YAML line 1 is file
/// line `first_line`. Columns are 1-based and count bytes.
///
/// # Errors
///
/// A [`ParseErrorKind::Frontmatter`] error reading `invalid frontmatter: {detail}`, located at
/// the offending key or value except for the checks that span entries.
pub fn parse_frontmatter(yaml: &str, first_line: u32) -> Result<Frontmatter, ParseError> {
    let positions = Positions::new(yaml, first_line);
    let root = load(yaml, &positions)?;
    let start = positions.start();
    decode_frontmatter(root, start)
}

// ---------------------------------------------------------------------------------------------
// Positions
// ---------------------------------------------------------------------------------------------

/// A 1-based file line and byte column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pos {
    line: u32,
    column: u32,
}

/// Maps saphyr markers (character indices) to file lines and byte columns.
#[derive(Debug)]
struct Positions {
    first_line: u32,
    len: usize,
    /// Byte offset of each character, present only when the text is not pure ASCII.
    char_offsets: Option<Vec<usize>>,
    /// Byte offset at which each `\n`-separated line starts.
    line_starts: Vec<usize>,
}

impl Positions {
    fn new(text: &str, first_line: u32) -> Self {
        let char_offsets = if text.is_ascii() {
            None
        } else {
            Some(text.char_indices().map(|(offset, _)| offset).collect())
        };
        let mut line_starts = vec![0];
        line_starts.extend(
            text.bytes()
                .enumerate()
                .filter(|(_, b)| *b == b'\n')
                .map(|(i, _)| i + 1),
        );
        Positions {
            first_line,
            len: text.len(),
            char_offsets,
            line_starts,
        }
    }

    fn start(&self) -> Pos {
        Pos {
            line: self.first_line,
            column: 1,
        }
    }

    fn at_char(&self, char_index: usize) -> Pos {
        let byte = match &self.char_offsets {
            None => char_index.min(self.len),
            Some(offsets) => offsets.get(char_index).copied().unwrap_or(self.len),
        };
        let line_index = self
            .line_starts
            .partition_point(|start| *start <= byte)
            .saturating_sub(1);
        let line_start = self.line_starts.get(line_index).copied().unwrap_or(0);
        Pos {
            line: to_u32(line_index).saturating_add(self.first_line),
            column: to_u32(byte - line_start.min(byte)).saturating_add(1),
        }
    }

    fn of_span(&self, span: &Span) -> Pos {
        self.at_char(span.start.index())
    }
}

fn to_u32(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

fn fail(pos: Pos, detail: impl fmt::Display) -> ParseError {
    ParseError::at(
        ParseErrorKind::Frontmatter,
        format!("invalid frontmatter: {detail}"),
        pos.line,
        pos.column,
    )
}

fn fail_unlocated(detail: impl fmt::Display) -> ParseError {
    ParseError::new(
        ParseErrorKind::Frontmatter,
        format!("invalid frontmatter: {detail}"),
    )
}

// ---------------------------------------------------------------------------------------------
// Loading YAML into a positioned tree
// ---------------------------------------------------------------------------------------------

/// A YAML node with the position where it starts (its anchor or tag included).
#[derive(Debug)]
struct Node {
    pos: Pos,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Scalar(Scalar),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

#[derive(Debug)]
struct Scalar {
    /// The scalar's content, after quoting, escapes and folding are undone.
    text: String,
    /// The scalar as written: `text` with its quotes put back.
    raw: String,
    /// The core-schema resolution.
    value: Resolved,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Resolved {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str,
}

enum Frame {
    Seq {
        pos: Pos,
        items: Vec<Node>,
    },
    Map {
        pos: Pos,
        entries: Vec<(Node, Node)>,
        key: Option<Node>,
    },
}

const CORE_TAG_HANDLE: &str = "tag:yaml.org,2002:";

fn load(yaml: &str, positions: &Positions) -> Result<Option<Node>, ParseError> {
    let mut parser = Parser::new_from_str(yaml);
    let mut stack: Vec<Frame> = Vec::new();
    let mut root: Option<Node> = None;
    let mut documents = 0usize;
    while let Some(next) = parser.next_event() {
        let (event, span) = next.map_err(|error| scan_error(&error, positions))?;
        let pos = positions.of_span(&span);
        match event {
            Event::StreamEnd => break,
            Event::Nothing | Event::StreamStart | Event::DocumentEnd => {}
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(fail(
                        pos,
                        "the frontmatter must hold a single YAML document",
                    ));
                }
            }
            Event::Alias(_) => {
                return Err(fail(pos, "YAML aliases (`*name`) are not supported"));
            }
            Event::Scalar(text, style, _anchor, tag) => {
                let scalar = make_scalar(text.into_owned(), style, tag.as_deref(), pos)?;
                let node = Node {
                    pos,
                    kind: Kind::Scalar(scalar),
                };
                attach(node, &mut stack, &mut root);
            }
            Event::SequenceStart(_anchor, tag) => {
                check_collection_tag(tag.as_deref(), "seq", pos)?;
                if stack.len() >= MAX_NESTING_DEPTH {
                    return Err(too_deep(pos));
                }
                stack.push(Frame::Seq {
                    pos,
                    items: Vec::new(),
                });
            }
            Event::MappingStart(_anchor, tag) => {
                check_collection_tag(tag.as_deref(), "map", pos)?;
                if stack.len() >= MAX_NESTING_DEPTH {
                    return Err(too_deep(pos));
                }
                stack.push(Frame::Map {
                    pos,
                    entries: Vec::new(),
                    key: None,
                });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let node = match stack.pop() {
                    Some(Frame::Seq { pos, items }) => Node {
                        pos,
                        kind: Kind::Seq(items),
                    },
                    Some(Frame::Map { pos, entries, .. }) => Node {
                        pos,
                        kind: Kind::Map(entries),
                    },
                    None => return Err(fail(pos, "unbalanced YAML collection end")),
                };
                attach(node, &mut stack, &mut root);
            }
        }
    }
    if !stack.is_empty() {
        return Err(fail(
            positions.at_char(yaml.chars().count()),
            "unexpected end of YAML",
        ));
    }
    Ok(root)
}

fn attach(node: Node, stack: &mut [Frame], root: &mut Option<Node>) {
    match stack.last_mut() {
        None => *root = Some(node),
        Some(Frame::Seq { items, .. }) => items.push(node),
        Some(Frame::Map { entries, key, .. }) => match key.take() {
            None => *key = Some(node),
            Some(k) => entries.push((k, node)),
        },
    }
}

fn too_deep(pos: Pos) -> ParseError {
    fail(
        pos,
        format_args!("YAML nesting is deeper than {MAX_NESTING_DEPTH} levels"),
    )
}

fn scan_error(error: &ScanError, positions: &Positions) -> ParseError {
    fail(positions.at_char(error.marker().index()), error.info())
}

fn tag_text(tag: &Tag) -> String {
    if tag.handle == CORE_TAG_HANDLE {
        format!("!!{}", tag.suffix)
    } else if tag.handle.is_empty() {
        if tag.suffix == "!" {
            "!".to_owned()
        } else {
            format!("!<{}>", tag.suffix)
        }
    } else if tag.handle == "!" || tag.handle == "!!" {
        format!("{}{}", tag.handle, tag.suffix)
    } else {
        format!("!<{}{}>", tag.handle, tag.suffix)
    }
}

fn is_non_specific(tag: &Tag) -> bool {
    tag.handle.is_empty() && tag.suffix == "!"
}

fn unsupported_tag(tag: &Tag, pos: Pos) -> ParseError {
    fail(
        pos,
        format_args!("unsupported YAML tag `{}`", tag_text(tag)),
    )
}

fn check_collection_tag(tag: Option<&Tag>, core: &str, pos: Pos) -> Result<(), ParseError> {
    match tag {
        None => Ok(()),
        Some(tag) if is_non_specific(tag) => Ok(()),
        Some(tag) if tag.handle == CORE_TAG_HANDLE && tag.suffix == core => Ok(()),
        Some(tag) => Err(unsupported_tag(tag, pos)),
    }
}

fn make_scalar(
    text: String,
    style: ScalarStyle,
    tag: Option<&Tag>,
    pos: Pos,
) -> Result<Scalar, ParseError> {
    let raw = match style {
        ScalarStyle::SingleQuoted => format!("'{text}'"),
        ScalarStyle::DoubleQuoted => format!("\"{text}\""),
        _ => text.clone(),
    };
    let value = match tag {
        None if style == ScalarStyle::Plain => resolve_plain(&text),
        None => Resolved::Str,
        Some(tag) if is_non_specific(tag) => Resolved::Str,
        Some(tag) if tag.handle == CORE_TAG_HANDLE => {
            let resolved = match tag.suffix.as_str() {
                "str" => Some(Resolved::Str),
                "null" => resolve_null(&text),
                "bool" => resolve_bool(&text),
                "int" => resolve_int(&text),
                "float" => resolve_float(&text).or_else(|| {
                    resolve_int(&text).map(|value| match value {
                        Resolved::Int(i) => Resolved::Float(i as f64),
                        other => other,
                    })
                }),
                _ => return Err(unsupported_tag(tag, pos)),
            };
            match resolved {
                Some(value) => value,
                None => {
                    return Err(fail(
                        pos,
                        format_args!("the scalar does not match its tag `{}`", tag_text(tag)),
                    ));
                }
            }
        }
        Some(tag) => return Err(unsupported_tag(tag, pos)),
    };
    Ok(Scalar { text, raw, value })
}

/// YAML 1.2 core schema resolution of a plain scalar.
fn resolve_plain(text: &str) -> Resolved {
    resolve_null(text)
        .or_else(|| resolve_bool(text))
        .or_else(|| resolve_int(text))
        .or_else(|| resolve_float(text))
        .unwrap_or(Resolved::Str)
}

fn resolve_null(text: &str) -> Option<Resolved> {
    matches!(text, "" | "~" | "null" | "Null" | "NULL").then_some(Resolved::Null)
}

fn resolve_bool(text: &str) -> Option<Resolved> {
    match text {
        "true" | "True" | "TRUE" => Some(Resolved::Bool(true)),
        "false" | "False" | "FALSE" => Some(Resolved::Bool(false)),
        _ => None,
    }
}

/// `[-+]?[0-9]+`, `0o[0-7]+`, `0x[0-9a-fA-F]+`; a value beyond `i128` resolves as a float.
fn resolve_int(text: &str) -> Option<Resolved> {
    let (radix, digits, negative) = if let Some(octal) = text.strip_prefix("0o") {
        (8, octal, false)
    } else if let Some(hex) = text.strip_prefix("0x") {
        (16, hex, false)
    } else if let Some(rest) = text.strip_prefix('-') {
        (10, rest, true)
    } else {
        (10, text.strip_prefix('+').unwrap_or(text), false)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    match i128::from_str_radix(digits, radix) {
        Ok(value) => Some(Resolved::Int(if negative { -value } else { value })),
        Err(_) => {
            // Too large even for i128: keep the magnitude as a float.
            let magnitude = digits.chars().fold(0f64, |acc, c| {
                acc * f64::from(radix) + f64::from(c.to_digit(radix).unwrap_or(0))
            });
            Some(Resolved::Float(if negative {
                -magnitude
            } else {
                magnitude
            }))
        }
    }
}

/// `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`, `[-+]?\.inf` and `\.nan` forms.
fn resolve_float(text: &str) -> Option<Resolved> {
    let unsigned = text
        .strip_prefix('-')
        .or_else(|| text.strip_prefix('+'))
        .unwrap_or(text);
    let negative = text.starts_with('-');
    if matches!(unsigned, ".inf" | ".Inf" | ".INF") {
        return Some(Resolved::Float(if negative {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        }));
    }
    if matches!(text, ".nan" | ".NaN" | ".NAN") {
        return Some(Resolved::Float(f64::NAN));
    }
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (unsigned.get(..at)?, Some(unsigned.get(at + 1..)?)),
        None => (unsigned, None),
    };
    let (whole, fraction) = match mantissa.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (mantissa, None),
    };
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match fraction {
        None => !whole.is_empty() && all_digits(whole),
        Some(fraction) if whole.is_empty() => !fraction.is_empty() && all_digits(fraction),
        Some(fraction) => all_digits(whole) && all_digits(fraction),
    };
    let exponent_ok = exponent.is_none_or(|exp| {
        let digits = exp
            .strip_prefix('-')
            .or_else(|| exp.strip_prefix('+'))
            .unwrap_or(exp);
        !digits.is_empty() && all_digits(digits)
    });
    if !(mantissa_ok && exponent_ok) {
        return None;
    }
    text.parse::<f64>().ok().map(Resolved::Float)
}

// ---------------------------------------------------------------------------------------------
// serde-style descriptions
// ---------------------------------------------------------------------------------------------

/// serde's `Unexpected` wording for a node.
fn unexpected(node: &Node) -> String {
    match &node.kind {
        Kind::Seq(_) => "sequence".to_owned(),
        Kind::Map(_) => "map".to_owned(),
        Kind::Scalar(scalar) => match scalar.value {
            Resolved::Null => "unit value".to_owned(),
            Resolved::Bool(b) => format!("boolean `{b}`"),
            Resolved::Int(i) => format!("integer `{i}`"),
            Resolved::Float(f) => format!("floating point `{}`", float_text(f)),
            Resolved::Str => format!("string {:?}", scalar.text),
        },
    }
}

/// A float the way serde shows it: Rust's `Display`, with `.0` added to a finite whole value.
fn float_text(value: f64) -> String {
    let text = value.to_string();
    if value.is_finite() && !text.contains('.') {
        format!("{text}.0")
    } else {
        text
    }
}

fn invalid_type(node: &Node, expected: &str) -> ParseError {
    fail(
        node.pos,
        format_args!("invalid type: {}, expected {expected}", unexpected(node)),
    )
}

fn invalid_value(node: &Node, expected: &str) -> ParseError {
    fail(
        node.pos,
        format_args!("invalid value: {}, expected {expected}", unexpected(node)),
    )
}

fn one_of(names: &[&str]) -> String {
    names
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn unknown_field(pos: Pos, key: &str, expected: &[&str]) -> ParseError {
    fail(
        pos,
        format_args!(
            "unknown field `{key}`, expected one of {}",
            one_of(expected)
        ),
    )
}

fn duplicate_field(pos: Pos, key: &str) -> ParseError {
    fail(pos, format_args!("duplicate field `{key}`"))
}

fn missing_field(pos: Pos, key: &str) -> ParseError {
    fail(pos, format_args!("missing field `{key}`"))
}

// ---------------------------------------------------------------------------------------------
// Small value readers
// ---------------------------------------------------------------------------------------------

fn as_map<'n>(node: &'n Node, expected: &str) -> Result<&'n [(Node, Node)], ParseError> {
    match &node.kind {
        Kind::Map(entries) => Ok(entries),
        _ => Err(invalid_type(node, expected)),
    }
}

fn is_null(node: &Node) -> bool {
    matches!(&node.kind, Kind::Scalar(s) if s.value == Resolved::Null)
}

/// The text of a key; struct field keys and contract map keys are compared as written.
fn key_text<'n>(node: &'n Node, expected: &str) -> Result<&'n str, ParseError> {
    match &node.kind {
        Kind::Scalar(scalar) => Ok(&scalar.text),
        _ => Err(invalid_type(node, expected)),
    }
}

/// A string field: any non-null scalar, kept as written (as YAML deserializers do for string
/// targets). Null, sequences and maps are refused.
fn read_string(node: &Node) -> Result<String, ParseError> {
    match &node.kind {
        Kind::Scalar(scalar) if scalar.value != Resolved::Null => Ok(scalar.text.clone()),
        _ => Err(invalid_type(node, "a string")),
    }
}

/// An optional string field: null means absent.
fn read_opt_string(node: &Node) -> Result<Option<String>, ParseError> {
    if is_null(node) {
        Ok(None)
    } else {
        read_string(node).map(Some)
    }
}

/// A value that must resolve to a YAML string (a number or boolean is refused).
fn read_strict_string<'n>(node: &'n Node, expected: &str) -> Result<&'n str, ParseError> {
    match &node.kind {
        Kind::Scalar(scalar) if scalar.value == Resolved::Str => Ok(&scalar.text),
        _ => Err(invalid_type(node, expected)),
    }
}

/// A boolean field; null means the default, `false`.
fn read_bool(node: &Node) -> Result<bool, ParseError> {
    match &node.kind {
        Kind::Scalar(Scalar {
            value: Resolved::Bool(b),
            ..
        }) => Ok(*b),
        Kind::Scalar(Scalar {
            value: Resolved::Null,
            ..
        }) => Ok(false),
        _ => Err(invalid_type(node, "a boolean")),
    }
}

/// Tracks which fields of a struct-like map were seen, reporting unknown and repeated keys.
struct FieldSet<'a> {
    fields: &'a [&'a str],
    seen: Vec<bool>,
}

impl<'a> FieldSet<'a> {
    fn new(fields: &'a [&'a str]) -> Self {
        FieldSet {
            fields,
            seen: vec![false; fields.len()],
        }
    }

    /// Accept `key` (at `pos`): its field name, or the unknown/duplicate error.
    fn accept(&mut self, key: &str, pos: Pos) -> Result<&'a str, ParseError> {
        let Some(index) = self.fields.iter().position(|field| *field == key) else {
            return Err(unknown_field(pos, key, self.fields));
        };
        match self.seen.get_mut(index) {
            Some(seen) if *seen => Err(duplicate_field(pos, key)),
            Some(seen) => {
                *seen = true;
                Ok(self.fields.get(index).copied().unwrap_or(""))
            }
            None => Err(unknown_field(pos, key, self.fields)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Top level
// ---------------------------------------------------------------------------------------------

fn decode_frontmatter(root: Option<Node>, start: Pos) -> Result<Frontmatter, ParseError> {
    let empty = Vec::new();
    let (entries, root_pos) = match &root {
        None => (empty.as_slice(), start),
        Some(node) => (as_map(node, "a map of frontmatter keys")?, node.pos),
    };

    let mut fields = FieldSet::new(TOP_LEVEL_KEYS);
    let mut name = None;
    let mut description = None;
    let mut promptforge = None;
    let mut max_tool_iterations = None;
    let mut input = None;
    let mut output = None;
    let mut plugins = Vec::new();
    let mut tools = Vec::new();
    let mut args = ArgsDecl::implicit_default();
    let mut models = Vec::new();

    for (key, value) in entries {
        let key_name = key_text(key, "a frontmatter key")?;
        match fields.accept(key_name, key.pos)? {
            "name" => name = Some(read_string(value)?),
            "description" => description = Some(read_string(value)?),
            "promptforge" => promptforge = read_version(value)?,
            "max_tool_iterations" => max_tool_iterations = read_max_tool_iterations(value)?,
            "input" => input = read_file_decl(value)?,
            "output" => output = read_file_decl(value)?,
            "plugins" => plugins = read_plugins(value)?,
            "tools" => tools = read_tools(value)?,
            "args" => args = read_args(value)?,
            _ => models = read_models(value)?,
        }
    }

    let Some(name) = name else {
        return Err(missing_field(root_pos, "name"));
    };
    let Some(description) = description else {
        return Err(missing_field(root_pos, "description"));
    };

    check_plugins_once(&plugins)?;
    check_slots_not_optional(&plugins, &tools)?;
    check_alias_label_clash(&tools, &models)?;

    Ok(Frontmatter {
        name,
        description,
        promptforge,
        max_tool_iterations,
        input,
        output,
        plugins,
        tools,
        args,
        models,
    })
}

const VERSION_EXPECTED: &str = "a non-negative integer";

fn read_version(node: &Node) -> Result<Option<VersionDecl>, ParseError> {
    match &node.kind {
        Kind::Scalar(Scalar {
            value: Resolved::Null,
            ..
        }) => Ok(None),
        Kind::Scalar(Scalar {
            value: Resolved::Int(value),
            ..
        }) => match u64::try_from(*value) {
            Ok(major) => Ok(Some(VersionDecl {
                major,
                line: node.pos.line,
                column: node.pos.column,
            })),
            Err(_) => Err(invalid_value(node, VERSION_EXPECTED)),
        },
        _ => Err(invalid_type(node, VERSION_EXPECTED)),
    }
}

fn read_max_tool_iterations(node: &Node) -> Result<Option<u32>, ParseError> {
    let scalar = match &node.kind {
        Kind::Scalar(scalar) => scalar,
        _ => {
            return Err(invalid_type(
                node,
                "a whole number from 1 to 1000 (max_tool_iterations)",
            ));
        }
    };
    let raw = &scalar.raw;
    let too_small = || {
        fail(
            node.pos,
            format_args!("max_tool_iterations must be a positive integer (>= 1), got {raw}"),
        )
    };
    let too_large = || {
        fail(
            node.pos,
            format_args!("max_tool_iterations must be <= 1000, got {raw}"),
        )
    };
    match scalar.value {
        Resolved::Null => Ok(None),
        Resolved::Int(value) if value < i128::from(MIN_TOOL_ITERATIONS) => Err(too_small()),
        Resolved::Int(value) if value > i128::from(MAX_TOOL_ITERATIONS) => Err(too_large()),
        Resolved::Int(value) => u32::try_from(value).map(Some).map_err(|_| too_large()),
        // A whole number too large even for i128 resolves as a float; it is still too large.
        Resolved::Float(f) if f.is_finite() && f >= 1.0 && f.fract() == 0.0 && is_int_text(raw) => {
            Err(too_large())
        }
        _ => Err(too_small()),
    }
}

fn is_int_text(text: &str) -> bool {
    resolve_int(text).is_some()
}

fn read_file_decl(node: &Node) -> Result<Option<FileDecl>, ParseError> {
    if is_null(node) {
        return Ok(None);
    }
    let entries = as_map(node, "a map with `path` and `description`")?;
    let mut fields = FieldSet::new(FILE_DECL_KEYS);
    let mut path = None;
    let mut description = None;
    for (key, value) in entries {
        match fields.accept(key_text(key, "a file declaration key")?, key.pos)? {
            "path" => path = Some(read_string(value)?),
            _ => description = Some(read_string(value)?),
        }
    }
    let Some(path) = path else {
        return Err(missing_field(node.pos, "path"));
    };
    let Some(description) = description else {
        return Err(missing_field(node.pos, "description"));
    };
    Ok(Some(FileDecl { path, description }))
}

// ---------------------------------------------------------------------------------------------
// Plugins
// ---------------------------------------------------------------------------------------------

const PLUGIN_ENTRY_EXPECTED: &str =
    "a Plugin id string or a map with `ref`, `optional`, and `config`";

fn read_plugins(node: &Node) -> Result<Vec<PluginDecl>, ParseError> {
    let Kind::Seq(items) = &node.kind else {
        return Err(invalid_type(node, "a list of Plugin entries"));
    };
    items.iter().map(read_plugin_entry).collect()
}

/// One `plugins:` entry. Every error in an entry is located at the entry itself.
fn read_plugin_entry(node: &Node) -> Result<PluginDecl, ParseError> {
    let at_entry = |error: ParseError| ParseError {
        line: Some(node.pos.line),
        column: Some(node.pos.column),
        ..error
    };
    let (id, optional, config) = match &node.kind {
        Kind::Scalar(Scalar {
            value: Resolved::Str,
            text,
            ..
        }) => {
            check_plugin_id(text).map_err(|detail| fail(node.pos, detail))?;
            (text.clone(), false, None)
        }
        Kind::Map(entries) => {
            let mut fields = FieldSet::new(PLUGIN_ENTRY_KEYS);
            let mut id = None;
            let mut optional = false;
            let mut config = None;
            for (key, value) in entries {
                let field = fields
                    .accept(
                        key_text(key, "a Plugin entry key").map_err(at_entry)?,
                        key.pos,
                    )
                    .map_err(at_entry)?;
                match field {
                    "ref" => {
                        let text =
                            read_strict_string(value, "a Plugin id string").map_err(at_entry)?;
                        check_plugin_id(text).map_err(|detail| fail(node.pos, detail))?;
                        id = Some(text.to_owned());
                    }
                    "optional" => optional = read_bool(value).map_err(at_entry)?,
                    _ => {
                        config = if is_null(value) {
                            None
                        } else {
                            Some(to_yaml_value(value)?)
                        };
                    }
                }
            }
            let Some(id) = id else {
                return Err(missing_field(node.pos, "ref"));
            };
            (id, optional, config)
        }
        _ => return Err(invalid_type(node, PLUGIN_ENTRY_EXPECTED)),
    };
    Ok(PluginDecl {
        id,
        optional,
        config,
        line: node.pos.line,
        column: node.pos.column,
    })
}

const SEGMENT_CHARSET_REASON: &str =
    "segments may contain only lowercase ASCII letters, digits, '-', '_', '.'";

fn is_segment_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')
}

fn is_control(c: char) -> bool {
    c < ' ' || c == '\u{7f}'
}

/// Check a Plugin id (`namespace/plugin`); the error is the full detail.
pub fn check_plugin_id(text: &str) -> Result<(), String> {
    let reason =
        |reason: &str| format!("invalid Plugin id `{text}`: invalid global name: {reason}");
    let segments: Vec<&str> = text.split('/').collect();
    if !(2..=3).contains(&segments.len()) {
        return Err(reason(
            "must have exactly 2 segments (namespace/plugin) or 3 (namespace/plugin/name)",
        ));
    }
    for segment in &segments {
        if segment.is_empty() {
            return Err(reason("segments must not be empty"));
        }
        if let Some(bad) = segment.chars().find(|c| !is_segment_char(*c)) {
            return Err(reason(if is_control(bad) {
                "segments must not contain a control character"
            } else {
                SEGMENT_CHARSET_REASON
            }));
        }
    }
    if segments.len() != 2 {
        return Err(format!(
            "invalid Plugin id `{text}`: a Plugin id has exactly 2 segments (namespace/plugin)"
        ));
    }
    Ok(())
}

/// Check an exact tool path (`namespace/plugin/name`); the error is the full detail.
pub fn check_tool_path(text: &str) -> Result<(), String> {
    let reason =
        |reason: &str| format!("invalid exact tool path `{text}`: invalid tool id: {reason}");
    let count_reason = "a tool id must have exactly 3 segments (namespace/plugin/name)";
    let segments: Vec<&str> = text.split('/').collect();
    if !(2..=3).contains(&segments.len()) {
        return Err(reason(count_reason));
    }
    for segment in &segments {
        if segment.is_empty() {
            return Err(reason("segments must not be empty"));
        }
        if !segment.chars().all(is_segment_char) {
            return Err(reason(SEGMENT_CHARSET_REASON));
        }
    }
    if segments.len() != 3 {
        return Err(reason(count_reason));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Contract maps: tools, models, args
// ---------------------------------------------------------------------------------------------

/// Which contract map a name belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MapKind {
    Tools,
    Models,
    Args,
}

impl MapKind {
    fn kind(self) -> &'static str {
        match self {
            MapKind::Tools => "tool alias",
            MapKind::Models => "model role label",
            MapKind::Args => "arg name",
        }
    }

    fn map(self) -> &'static str {
        match self {
            MapKind::Tools => "tools",
            MapKind::Models => "models",
            MapKind::Args => "args",
        }
    }
}

/// The entries of a contract map, each key checked in document order: the grammar, then (for
/// aliases and labels) the reserved names, then uniqueness.
fn contract_entries(node: &Node, map: MapKind) -> Result<Vec<(&str, &Node, &Node)>, ParseError> {
    let kind = map.kind();
    let entries = as_map(node, &format!("a map of {kind} keys to declarations"))?;
    let mut seen: HashSet<&str> = HashSet::new();
    let mut out = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        let name = key_text(key, &format!("a {kind}"))?;
        if !is_valid_name(name) {
            return Err(fail(
                key.pos,
                format_args!("invalid {kind} `{name}`: expected {NAME_PATTERN}"),
            ));
        }
        if map != MapKind::Args
            && let Some(category) = reserved_category(name)
        {
            return Err(fail(
                key.pos,
                format_args!(
                    "{kind} `{name}` in `{}` is reserved ({}): tool aliases and model role \
                     labels install as section VM globals, so none may take a reserved name",
                    map.map(),
                    category.describe()
                ),
            ));
        }
        if !seen.insert(name) {
            return Err(fail(
                key.pos,
                format_args!("duplicate {kind} `{name}`: contract map keys must be unique"),
            ));
        }
        out.push((name, key, value));
    }
    Ok(out)
}

fn read_tools(node: &Node) -> Result<Vec<ToolSlot>, ParseError> {
    let mut slots = Vec::new();
    for (alias, key, value) in contract_entries(node, MapKind::Tools)? {
        let path = read_strict_string(value, "an exact tool path string")?;
        check_tool_path(path).map_err(|detail| fail(value.pos, detail))?;
        slots.push(ToolSlot {
            alias: alias.to_owned(),
            path: path.to_owned(),
            line: key.pos.line,
            column: key.pos.column,
        });
    }
    Ok(slots)
}

fn read_models(node: &Node) -> Result<Vec<RoleDecl>, ParseError> {
    let mut roles = Vec::new();
    for (label, key, value) in contract_entries(node, MapKind::Models)? {
        let entries = as_map(value, "a model role declaration map")?;
        let mut fields = FieldSet::new(ROLE_DECL_KEYS);
        let mut role = RoleDecl {
            label: label.to_owned(),
            keywords: Vec::new(),
            min_context: None,
            description: None,
            line: key.pos.line,
            column: key.pos.column,
        };
        for (field_key, field_value) in entries {
            match fields.accept(
                key_text(field_key, "a role declaration key")?,
                field_key.pos,
            )? {
                "keywords" => role.keywords = read_keywords(field_value)?,
                "min_context" => role.min_context = read_min_context(field_value)?,
                _ => role.description = read_opt_string(field_value)?,
            }
        }
        roles.push(role);
    }
    Ok(roles)
}

fn read_keywords(node: &Node) -> Result<Vec<Keyword>, ParseError> {
    let items = match &node.kind {
        Kind::Scalar(Scalar {
            value: Resolved::Null,
            ..
        }) => return Ok(Vec::new()),
        Kind::Seq(items) => items,
        _ => return Err(invalid_type(node, "a sequence")),
    };
    let words: Vec<&str> = Keyword::ALL.iter().map(|k| k.as_str()).collect();
    items
        .iter()
        .map(|item| match &item.kind {
            Kind::Scalar(scalar) if scalar.value != Resolved::Null => {
                Keyword::from_word(&scalar.text).ok_or_else(|| {
                    fail(
                        item.pos,
                        format_args!(
                            "unknown variant `{}`, expected one of {}",
                            scalar.text,
                            one_of(&words)
                        ),
                    )
                })
            }
            _ => Err(invalid_type(item, &format!("one of {}", one_of(&words)))),
        })
        .collect()
}

const MIN_CONTEXT_EXPECTED: &str = "a whole number of tokens from 1 to 4294967295";

fn read_min_context(node: &Node) -> Result<Option<u32>, ParseError> {
    match &node.kind {
        Kind::Scalar(Scalar {
            value: Resolved::Null,
            ..
        }) => Ok(None),
        Kind::Scalar(Scalar {
            value: Resolved::Int(value),
            ..
        }) => match u32::try_from(*value) {
            Ok(tokens) if tokens >= 1 => Ok(Some(tokens)),
            _ => Err(invalid_value(node, MIN_CONTEXT_EXPECTED)),
        },
        _ => Err(invalid_type(node, MIN_CONTEXT_EXPECTED)),
    }
}

fn read_args(node: &Node) -> Result<ArgsDecl, ParseError> {
    let mut args = Vec::new();
    for (name, _key, value) in contract_entries(node, MapKind::Args)? {
        args.push(read_arg_decl(name, value)?);
    }
    Ok(ArgsDecl {
        explicit: true,
        args,
    })
}

fn read_arg_decl(name: &str, node: &Node) -> Result<ArgDecl, ParseError> {
    let entries = as_map(node, "an arg declaration map")?;
    let mut fields = FieldSet::new(ARG_DECL_KEYS);
    let mut ty = None;
    let mut optional = false;
    let mut default: Option<&Node> = None;
    let mut description = None;
    for (key, value) in entries {
        match fields.accept(key_text(key, "an arg declaration key")?, key.pos)? {
            "type" => ty = Some(read_arg_type(value)?),
            "optional" => optional = read_bool(value)?,
            "default" => default = Some(value),
            _ => description = read_opt_string(value)?,
        }
    }
    let Some(ty) = ty else {
        return Err(missing_field(node.pos, "type"));
    };
    let default = match default {
        Some(value) if !is_null(value) => Some(check_default(ty, value)?),
        _ => None,
    };
    Ok(ArgDecl {
        name: name.to_owned(),
        ty,
        optional,
        default,
        description,
    })
}

fn read_arg_type(node: &Node) -> Result<ArgType, ParseError> {
    let words: Vec<&str> = ArgType::ALL.iter().map(|t| t.as_str()).collect();
    match &node.kind {
        Kind::Scalar(scalar) if scalar.value != Resolved::Null => ArgType::from_word(&scalar.text)
            .ok_or_else(|| {
                fail(
                    node.pos,
                    format_args!(
                        "unknown variant `{}`, expected one of {}",
                        scalar.text,
                        one_of(&words)
                    ),
                )
            }),
        _ => Err(invalid_type(node, &format!("one of {}", one_of(&words)))),
    }
}

fn check_default(ty: ArgType, node: &Node) -> Result<ArgValue, ParseError> {
    let value = match (&node.kind, ty) {
        (Kind::Scalar(scalar), ArgType::String) if scalar.value == Resolved::Str => {
            Some(ArgValue::String(scalar.text.clone()))
        }
        (
            Kind::Scalar(Scalar {
                value: Resolved::Bool(b),
                ..
            }),
            ArgType::Boolean,
        ) => Some(ArgValue::Boolean(*b)),
        (
            Kind::Scalar(Scalar {
                value: Resolved::Int(i),
                ..
            }),
            ArgType::Integer,
        ) => i64::try_from(*i).ok().map(ArgValue::Integer),
        (
            Kind::Scalar(Scalar {
                value: Resolved::Int(i),
                ..
            }),
            ArgType::Number,
        ) => Some(
            i64::try_from(*i)
                .map(ArgValue::Integer)
                .unwrap_or(ArgValue::Number(*i as f64)),
        ),
        (
            Kind::Scalar(Scalar {
                value: Resolved::Float(f),
                ..
            }),
            ArgType::Number,
        ) if f.is_finite() => Some(ArgValue::Number(*f)),
        _ => None,
    };
    value.ok_or_else(|| {
        fail(
            node.pos,
            format_args!("the default does not match the declared type `{ty}`"),
        )
    })
}

// ---------------------------------------------------------------------------------------------
// Checks that span entries (no location)
// ---------------------------------------------------------------------------------------------

fn check_plugins_once(plugins: &[PluginDecl]) -> Result<(), ParseError> {
    let mut seen = HashSet::new();
    for plugin in plugins {
        if !seen.insert(plugin.id.as_str()) {
            return Err(fail_unlocated(format_args!(
                "Plugin {} is declared more than once under plugins",
                plugin.id
            )));
        }
    }
    Ok(())
}

fn check_slots_not_optional(plugins: &[PluginDecl], tools: &[ToolSlot]) -> Result<(), ParseError> {
    let optional: HashMap<&str, &PluginDecl> = plugins
        .iter()
        .filter(|plugin| plugin.optional)
        .map(|plugin| (plugin.id.as_str(), plugin))
        .collect();
    if optional.is_empty() {
        return Ok(());
    }
    let offending = tools
        .iter()
        .filter(|slot| optional.contains_key(slot.plugin_id()))
        .min_by(|a, b| a.alias.cmp(&b.alias));
    match offending {
        None => Ok(()),
        Some(slot) => Err(fail_unlocated(format_args!(
            "tool alias '{}' names {}, whose Plugin {} is declared optional; a tool slot \
             requires its Plugin",
            slot.alias,
            slot.path,
            slot.plugin_id()
        ))),
    }
}

fn check_alias_label_clash(tools: &[ToolSlot], models: &[RoleDecl]) -> Result<(), ParseError> {
    let labels: HashSet<&str> = models.iter().map(|role| role.label.as_str()).collect();
    let shared = tools
        .iter()
        .map(|slot| slot.alias.as_str())
        .filter(|alias| labels.contains(alias))
        .min();
    match shared {
        None => Ok(()),
        Some(name) => Err(fail_unlocated(format_args!(
            "`{name}` is both a tool alias in `tools` and a model role label in `models`; each \
             installs as a section VM global of its own name, so the two must differ"
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// Unchecked values (Plugin config)
// ---------------------------------------------------------------------------------------------

/// Convert a node into a [`YamlValue`]; mapping keys must be unique. Depth is bounded by
/// [`MAX_NESTING_DEPTH`], enforced while loading.
fn to_yaml_value(node: &Node) -> Result<YamlValue, ParseError> {
    Ok(match &node.kind {
        Kind::Scalar(scalar) => match scalar.value {
            Resolved::Null => YamlValue::Null,
            Resolved::Bool(b) => YamlValue::Bool(b),
            Resolved::Int(i) => i64::try_from(i)
                .map(YamlValue::Integer)
                .unwrap_or(YamlValue::Float(i as f64)),
            Resolved::Float(f) => YamlValue::Float(f),
            Resolved::Str => YamlValue::String(scalar.text.clone()),
        },
        Kind::Seq(items) => {
            YamlValue::Sequence(items.iter().map(to_yaml_value).collect::<Result<_, _>>()?)
        }
        Kind::Map(entries) => {
            let mut seen = HashSet::new();
            let mut out = Vec::with_capacity(entries.len());
            for (key, value) in entries {
                if let Kind::Scalar(scalar) = &key.kind {
                    let identity = match scalar.value {
                        Resolved::Null => "null".to_owned(),
                        Resolved::Bool(b) => format!("bool:{b}"),
                        Resolved::Int(i) => format!("int:{i}"),
                        Resolved::Float(f) => format!("float:{}", f.to_bits()),
                        Resolved::Str => format!("str:{}", scalar.text),
                    };
                    if !seen.insert(identity) {
                        return Err(fail(
                            key.pos,
                            format_args!("duplicate mapping key `{}`", scalar.text),
                        ));
                    }
                }
                out.push((to_yaml_value(key)?, to_yaml_value(value)?));
            }
            YamlValue::Mapping(out)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The usual three-key header; it fills file lines 2 to 4, so the next line is file line 5.
    const HEAD: &str = "name: x\ndescription: d\npromptforge: 0\n";

    fn ok(yaml: &str) -> Frontmatter {
        match parse_frontmatter(yaml, 2) {
            Ok(frontmatter) => frontmatter,
            Err(error) => panic!("unexpected error for {yaml:?}: {error:?}"),
        }
    }

    fn err(yaml: &str) -> ParseError {
        match parse_frontmatter(yaml, 2) {
            Ok(frontmatter) => panic!("expected an error for {yaml:?}, got {frontmatter:?}"),
            Err(error) => {
                assert_eq!(error.kind, ParseErrorKind::Frontmatter);
                assert_eq!(error.prompt_name, None);
                error
            }
        }
    }

    #[track_caller]
    fn err_at(yaml: &str, detail: &str, line: u32, column: u32) {
        let error = err(yaml);
        assert_eq!(error.message, format!("invalid frontmatter: {detail}"));
        assert_eq!(
            (error.line, error.column),
            (Some(line), Some(column)),
            "location of {detail}"
        );
    }

    #[track_caller]
    fn err_unlocated(yaml: &str, detail: &str) {
        let error = err(yaml);
        assert_eq!(error.message, format!("invalid frontmatter: {detail}"));
        assert_eq!((error.line, error.column), (None, None));
    }

    fn with_head(rest: &str) -> String {
        format!("{HEAD}{rest}")
    }

    // --- the header ------------------------------------------------------------------------

    #[test]
    fn usual_three_key_header() {
        let fm = ok(HEAD);
        assert_eq!(fm.name, "x");
        assert_eq!(fm.description, "d");
        assert_eq!(
            fm.promptforge,
            Some(VersionDecl {
                major: 0,
                line: 4,
                column: 14
            })
        );
        assert_eq!(fm.max_tool_iterations, None);
        assert_eq!(fm.input, None);
        assert_eq!(fm.output, None);
        assert!(fm.plugins.is_empty());
        assert!(fm.tools.is_empty());
        assert!(fm.models.is_empty());
        assert_eq!(fm.args, ArgsDecl::implicit_default());
    }

    #[test]
    fn name_and_description_alone_parse_with_defaults() {
        let fm = ok("name: x\ndescription: d\n");
        assert_eq!(fm.promptforge, None);
        assert!(!fm.args.is_structured());
        assert_eq!(fm.args.args.len(), 1);
        let prose = fm.args.get("prose").cloned();
        assert_eq!(
            prose,
            Some(ArgDecl {
                name: "prose".into(),
                ty: ArgType::String,
                optional: true,
                default: None,
                description: Some("Freeform input for this prompt".into()),
            })
        );
    }

    #[test]
    fn strings_are_kept_as_written() {
        let fm = ok(
            "name: shared_library\ndescription: Research a person from the open web \
                     and return a concise, factual summary.\n",
        );
        assert_eq!(fm.name, "shared_library");
        assert_eq!(
            fm.description,
            "Research a person from the open web and return a concise, factual summary."
        );
    }

    #[test]
    fn yaml_1_2_scalars_stay_strings() {
        let fm = ok("name: no\ndescription: yes\n");
        assert_eq!(fm.name, "no");
        assert_eq!(fm.description, "yes");
        let fm = ok("name: 'true'\ndescription: \"42\"\n");
        assert_eq!(fm.name, "true");
        assert_eq!(fm.description, "42");
    }

    #[test]
    fn crlf_line_endings_parse_and_locate() {
        let fm = ok("name: x\r\ndescription: d\r\npromptforge: 0\r\n");
        assert_eq!(fm.description, "d");
        assert_eq!(fm.promptforge.map(|v| (v.line, v.column)), Some((4, 14)));
        err_at(
            "name: x\r\ndescription: d\r\nmax_tool_iterations: 0\r\n",
            "max_tool_iterations must be a positive integer (>= 1), got 0",
            4,
            22,
        );
    }

    #[test]
    fn first_line_offsets_every_location() {
        let error = parse_frontmatter("name: x\nauthor: y\n", 10).err();
        assert_eq!(error.and_then(|e| e.line), Some(11));
    }

    #[test]
    fn missing_name_and_description() {
        err_at(
            "description: Has no name\npromptforge: 0\n",
            "missing field `name`",
            2,
            1,
        );
        err_at(
            "name: nameless-description\npromptforge: 0\n",
            "missing field `description`",
            2,
            1,
        );
        // Both missing: `name` is reported first.
        err_at("promptforge: 0\n", "missing field `name`", 2, 1);
        err_at("", "missing field `name`", 2, 1);
        err_at("# only a comment\n", "missing field `name`", 2, 1);
    }

    #[test]
    fn null_name_is_an_invalid_type() {
        err_at(
            "name:\ndescription: d\n",
            "invalid type: unit value, expected a string",
            2,
            5,
        );
        err_at(
            "name: [a]\ndescription: d\n",
            "invalid type: sequence, expected a string",
            2,
            7,
        );
    }

    #[test]
    fn unknown_top_level_key_lists_all_ten() {
        err_at(
            &with_head("author: someone\n"),
            "unknown field `author`, expected one of `name`, `description`, `promptforge`, \
             `max_tool_iterations`, `input`, `output`, `plugins`, `tools`, `args`, `models`",
            5,
            1,
        );
        // Keys are case-sensitive.
        assert!(
            err(&with_head("Name: y\n"))
                .message
                .contains("unknown field `Name`")
        );
    }

    #[test]
    fn unknown_key_is_reported_before_a_missing_one() {
        err_at(
            "name: x\nauthor: y\n",
            &format!(
                "unknown field `author`, expected one of {}",
                one_of(TOP_LEVEL_KEYS)
            ),
            3,
            1,
        );
    }

    #[test]
    fn duplicate_top_level_key() {
        err_at(
            "name: x\ndescription: d\nname: y\n",
            "duplicate field `name`",
            4,
            1,
        );
    }

    #[test]
    fn root_must_be_a_map() {
        err_at(
            "hello\n",
            "invalid type: string \"hello\", expected a map of frontmatter keys",
            2,
            1,
        );
        err_at(
            "- a\n",
            "invalid type: sequence, expected a map of frontmatter keys",
            2,
            1,
        );
    }

    // --- YAML syntax -----------------------------------------------------------------------

    #[test]
    fn yaml_slip_reports_its_file_line() {
        let error = err("name: yaml-slip\npromptforge: 0\ndescription: bad: value\n");
        assert!(error.message.starts_with("invalid frontmatter: "));
        assert_eq!(error.line, Some(4));
        assert_eq!(error.column, Some(17));
        assert!(!error.message.contains("bad"), "{}", error.message);
        assert!(!error.message.contains(" at line "), "{}", error.message);
    }

    #[test]
    fn columns_count_bytes() {
        let error = err("name: x\ndescription: é bad: value\n");
        assert_eq!((error.line, error.column), (Some(3), Some(20)));
        let error = err("name: é\ndescription: d\nauthor: x\n");
        assert_eq!((error.line, error.column), (Some(4), Some(1)));
    }

    #[test]
    fn tabs_and_unclosed_flow_are_yaml_errors() {
        let error = err("name: x\ndescription: d\nmodels:\n\twriter: {}\n");
        assert_eq!(error.line, Some(5));
        let error = err("name: x\ndescription: d\nplugins: [a/b\n");
        assert!(error.message.starts_with("invalid frontmatter: "));
        assert!(error.line.is_some());
    }

    #[test]
    fn aliases_are_refused_and_anchors_allowed() {
        err_at(
            "name: &n x\ndescription: *n\n",
            "YAML aliases (`*name`) are not supported",
            3,
            14,
        );
        assert_eq!(ok("name: &n x\ndescription: d\n").name, "x");
    }

    #[test]
    fn tags() {
        let fm = ok("name: !!str 42\ndescription: ! 7\n");
        assert_eq!((fm.name.as_str(), fm.description.as_str()), ("42", "7"));
        err_at(
            "name: !custom x\ndescription: d\n",
            "unsupported YAML tag `!custom`",
            2,
            7,
        );
        err_at(
            "name: x\ndescription: d\npromptforge: !!int zero\n",
            "the scalar does not match its tag `!!int`",
            4,
            14,
        );
        assert_eq!(
            ok("name: x\ndescription: d\npromptforge: !!int 0x1\n")
                .promptforge
                .map(|v| v.major),
            Some(1)
        );
        err_at(
            "name: x\ndescription: d\nmodels: !!seq {}\n",
            "unsupported YAML tag `!!seq`",
            4,
            9,
        );
    }

    #[test]
    fn a_second_document_is_refused() {
        err_at(
            "name: x\ndescription: d\n...\nname: y\n",
            "the frontmatter must hold a single YAML document",
            5,
            1,
        );
    }

    #[test]
    fn deep_nesting_is_refused_without_overflow() {
        let deep = format!(
            "name: x\ndescription: d\nplugins:\n  - ref: a/b\n    config: {}1{}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let error = err(&deep);
        // saphyr's own flow-level limit may fire first while it scans ahead; either way the
        // parse fails cleanly on the line of the nesting.
        assert!(
            error.message.contains("nesting is deeper than 64")
                || error.message.contains("recursion limit exceeded"),
            "{}",
            error.message
        );
        assert_eq!(error.line, Some(6));

        let deep_maps = format!("name: x\ndescription: d\nx: {}", "{a: ".repeat(10_000));
        let _ = err(&deep_maps);
    }

    #[test]
    fn deep_block_nesting_hits_the_depth_limit() {
        let yaml = format!(
            "name: x\ndescription: d\nplugins:\n  - ref: a/b\n    config:\n      {}1\n",
            "- ".repeat(200)
        );
        let error = err(&yaml);
        assert_eq!(
            error.message,
            "invalid frontmatter: YAML nesting is deeper than 64 levels"
        );
        assert_eq!(error.line, Some(7));
    }

    #[test]
    fn nesting_within_the_limit_is_kept() {
        let fm = ok(&format!(
            "name: x\ndescription: d\nplugins:\n  - ref: a/b\n    config: {}1{}\n",
            "[".repeat(40),
            "]".repeat(40)
        ));
        let mut value = fm.plugins.first().and_then(|p| p.config.clone());
        for _ in 0..40 {
            value = match value {
                Some(YamlValue::Sequence(items)) => items.into_iter().next(),
                other => panic!("{other:?}"),
            };
        }
        assert_eq!(value, Some(YamlValue::Integer(1)));
    }

    #[test]
    fn big_flat_input_is_fine() {
        let mut yaml = String::from("name: x\ndescription: d\nmodels:\n");
        for i in 0..5000 {
            yaml.push_str(&format!(
                "  r{i}: {{ keywords: [fast], min_context: {} }}\n",
                i + 1
            ));
        }
        assert_eq!(ok(&yaml).models.len(), 5000);
    }

    // --- promptforge -----------------------------------------------------------------------

    #[test]
    fn promptforge_any_major_parses() {
        let fm = ok("name: x\ndescription: d\npromptforge: 1\n");
        assert_eq!(fm.promptforge.map(|v| v.major), Some(1));
        let fm = ok("name: x\ndescription: d\npromptforge:    7 # comment\n");
        assert_eq!(
            fm.promptforge,
            Some(VersionDecl {
                major: 7,
                line: 4,
                column: 17
            })
        );
        assert_eq!(
            ok("name: x\ndescription: d\npromptforge: ~\n").promptforge,
            None
        );
    }

    #[test]
    fn promptforge_must_be_a_non_negative_integer() {
        err_at(
            "name: x\ndescription: d\npromptforge: -1\n",
            "invalid value: integer `-1`, expected a non-negative integer",
            4,
            14,
        );
        err_at(
            "name: x\ndescription: d\npromptforge: '0'\n",
            "invalid type: string \"0\", expected a non-negative integer",
            4,
            14,
        );
        err_at(
            "name: x\ndescription: d\npromptforge: 0.5\n",
            "invalid type: floating point `0.5`, expected a non-negative integer",
            4,
            14,
        );
        err_at(
            "name: x\ndescription: d\npromptforge: 1e3\n",
            "invalid type: floating point `1000.0`, expected a non-negative integer",
            4,
            14,
        );
        err_at(
            "name: x\ndescription: d\npromptforge: true\n",
            "invalid type: boolean `true`, expected a non-negative integer",
            4,
            14,
        );
    }

    // --- max_tool_iterations ---------------------------------------------------------------

    #[test]
    fn max_tool_iterations_range() {
        assert_eq!(
            ok(&with_head("max_tool_iterations: 1\n")).max_tool_iterations,
            Some(1)
        );
        assert_eq!(
            ok(&with_head("max_tool_iterations: 50\n")).max_tool_iterations,
            Some(50)
        );
        assert_eq!(
            ok(&with_head("max_tool_iterations: 1000\n")).max_tool_iterations,
            Some(1000)
        );
        assert_eq!(
            ok(&with_head("max_tool_iterations:\n")).max_tool_iterations,
            None
        );
        err_at(
            &with_head("max_tool_iterations: 0\n"),
            "max_tool_iterations must be a positive integer (>= 1), got 0",
            5,
            22,
        );
        err_at(
            &with_head("max_tool_iterations: 1001\n"),
            "max_tool_iterations must be <= 1000, got 1001",
            5,
            22,
        );
        err_at(
            &with_head("max_tool_iterations: -5\n"),
            "max_tool_iterations must be a positive integer (>= 1), got -5",
            5,
            22,
        );
        err_at(
            &with_head("max_tool_iterations: 0x3E9\n"),
            "max_tool_iterations must be <= 1000, got 0x3E9",
            5,
            22,
        );
        err_at(
            &with_head("max_tool_iterations: 99999999999999999999999999999999999999999\n"),
            "max_tool_iterations must be <= 1000, got 99999999999999999999999999999999999999999",
            5,
            22,
        );
        err_at(
            &with_head("max_tool_iterations: 1.5\n"),
            "max_tool_iterations must be a positive integer (>= 1), got 1.5",
            5,
            22,
        );
        err_at(
            &with_head("max_tool_iterations: '5'\n"),
            "max_tool_iterations must be a positive integer (>= 1), got '5'",
            5,
            22,
        );
        err_at(
            &with_head("max_tool_iterations: [5]\n"),
            "invalid type: sequence, expected a whole number from 1 to 1000 \
             (max_tool_iterations)",
            5,
            22,
        );
    }

    #[test]
    fn a_bad_value_is_reported_before_a_missing_key() {
        err_at(
            "name: x\nmax_tool_iterations: 0\n",
            "max_tool_iterations must be a positive integer (>= 1), got 0",
            3,
            22,
        );
    }

    // --- input and output ------------------------------------------------------------------

    #[test]
    fn input_and_output_files() {
        let fm = ok(&with_head(
            "input:\n  path: paper.md\n  description: The input paper\noutput:\n  path: \
             report.md\n  description: The output report\n",
        ));
        assert_eq!(
            fm.input,
            Some(FileDecl {
                path: "paper.md".into(),
                description: "The input paper".into()
            })
        );
        assert_eq!(
            fm.output,
            Some(FileDecl {
                path: "report.md".into(),
                description: "The output report".into()
            })
        );
        assert_eq!(ok(&with_head("input: ~\n")).input, None);
    }

    #[test]
    fn file_declaration_errors() {
        err_at(
            &with_head("input:\n  description: The input paper\n"),
            "missing field `path`",
            6,
            3,
        );
        err_at(
            &with_head("output:\n  path: report.md\n"),
            "missing field `description`",
            6,
            3,
        );
        err_at(
            &with_head("input:\n  path: paper.md\n  description: The input paper\n  format: md\n"),
            "unknown field `format`, expected one of `path`, `description`",
            8,
            3,
        );
        err_at(
            &with_head("input:\n  path: a\n  path: b\n  description: d\n"),
            "duplicate field `path`",
            7,
            3,
        );
        err_at(
            &with_head("input: paper.md\n"),
            "invalid type: string \"paper.md\", expected a map with `path` and `description`",
            5,
            8,
        );
    }

    // --- plugins ---------------------------------------------------------------------------

    #[test]
    fn plugins_in_both_forms() {
        let fm = ok(&with_head(
            "plugins:\n  - promptforge/web\n  - ref: io.github.corp/mcp\n    optional: true\n  \
             - ref: acme/web-search\n    config: {depth: 2, tags: [a, no], on: ~}\n",
        ));
        assert_eq!(
            fm.plugins,
            vec![
                PluginDecl {
                    id: "promptforge/web".into(),
                    optional: false,
                    config: None,
                    line: 6,
                    column: 5
                },
                PluginDecl {
                    id: "io.github.corp/mcp".into(),
                    optional: true,
                    config: None,
                    line: 7,
                    column: 5
                },
                PluginDecl {
                    id: "acme/web-search".into(),
                    optional: false,
                    config: Some(YamlValue::Mapping(vec![
                        (YamlValue::String("depth".into()), YamlValue::Integer(2)),
                        (
                            YamlValue::String("tags".into()),
                            YamlValue::Sequence(vec![
                                YamlValue::String("a".into()),
                                YamlValue::String("no".into())
                            ])
                        ),
                        (YamlValue::String("on".into()), YamlValue::Null),
                    ])),
                    line: 9,
                    column: 5
                },
            ]
        );
        assert_eq!(
            fm.plugin("io.github.corp/mcp").map(|p| p.optional),
            Some(true)
        );
    }

    #[test]
    fn plugins_flow_form() {
        let fm = ok(&with_head(
            "plugins: [promptforge/web, promptforge/user-input]\n",
        ));
        let ids: Vec<&str> = fm.plugins.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["promptforge/web", "promptforge/user-input"]);
        let fm = ok(&with_head(
            "plugins: [{ref: a/b, optional: false, config: 3}]\n",
        ));
        assert_eq!(
            fm.plugins.first().and_then(|p| p.config.clone()),
            Some(YamlValue::Integer(3))
        );
    }

    #[test]
    fn plugin_entry_errors_are_located_at_the_entry() {
        err_at(
            &with_head("plugins:\n  - optional: true\n"),
            "missing field `ref`",
            6,
            5,
        );
        err_at(
            &with_head("plugins:\n  - ref: a/b\n    ref: a/c\n"),
            "duplicate field `ref`",
            6,
            5,
        );
        err_at(
            &with_head("plugins:\n  - ref: a/b\n    optional: true\n    optional: false\n"),
            "duplicate field `optional`",
            6,
            5,
        );
        err_at(
            &with_head("plugins:\n  - ref: a/b\n    version: 2\n"),
            "unknown field `version`, expected one of `ref`, `optional`, `config`",
            6,
            5,
        );
        err_at(
            &with_head("plugins:\n  - 5\n"),
            "invalid type: integer `5`, expected a Plugin id string or a map with `ref`, \
             `optional`, and `config`",
            6,
            5,
        );
        err_at(
            &with_head("plugins:\n  - [a/b]\n"),
            "invalid type: sequence, expected a Plugin id string or a map with `ref`, \
             `optional`, and `config`",
            6,
            5,
        );
        err_at(
            &with_head("plugins:\n  - ref: a/b\n    optional: yes\n"),
            "invalid type: string \"yes\", expected a boolean",
            6,
            5,
        );
        err_at(
            &with_head("plugins: promptforge/web\n"),
            "invalid type: string \"promptforge/web\", expected a list of Plugin entries",
            5,
            10,
        );
    }

    #[test]
    fn plugin_id_errors_point_after_the_list_marker() {
        // Chapter 16: a Plugin entry on line 5 whose value is not a Plugin id, column 5.
        err_at(
            "name: x\ndescription: d\nplugins:\n  - Promptforge/web\n",
            "invalid Plugin id `Promptforge/web`: invalid global name: segments may contain \
             only lowercase ASCII letters, digits, '-', '_', '.'",
            5,
            5,
        );
        err_at(
            &with_head("plugins:\n  - ref: promptforge\n"),
            "invalid Plugin id `promptforge`: invalid global name: must have exactly 2 \
             segments (namespace/plugin) or 3 (namespace/plugin/name)",
            6,
            5,
        );
    }

    #[test]
    fn plugin_id_grammar() {
        let reason = |text: &str| check_plugin_id(text).err();
        assert_eq!(reason("promptforge/web"), None);
        assert_eq!(reason("io.github.corp/mcp"), None);
        assert_eq!(reason("-_./9"), None);
        let count = "must have exactly 2 segments (namespace/plugin) or 3 (namespace/plugin/name)";
        for text in ["", "web", "a/b/c/d", "a//b/c"] {
            assert_eq!(
                reason(text),
                Some(format!(
                    "invalid Plugin id `{text}`: invalid global name: {count}"
                ))
            );
        }
        assert_eq!(
            reason("promptforge/web/fetch"),
            Some(
                "invalid Plugin id `promptforge/web/fetch`: a Plugin id has exactly 2 segments \
                 (namespace/plugin)"
                    .into()
            )
        );
        for text in ["a/", "/b", "a//"] {
            assert_eq!(
                reason(text),
                Some(format!(
                    "invalid Plugin id `{text}`: invalid global name: segments must not be empty"
                ))
            );
        }
        assert_eq!(
            reason("a/b\tc"),
            Some(
                "invalid Plugin id `a/b\tc`: invalid global name: segments must not contain a \
                 control character"
                    .into()
            )
        );
        assert_eq!(
            reason("a/b\u{7f}"),
            Some(
                "invalid Plugin id `a/b\u{7f}`: invalid global name: segments must not contain \
                 a control character"
                    .into()
            )
        );
        let charset = "segments may contain only lowercase ASCII letters, digits, '-', '_', '.'";
        for text in ["A/b", "a/b c", "a/é", "a/b+c", "a b/\t"] {
            assert_eq!(
                reason(text),
                Some(format!(
                    "invalid Plugin id `{text}`: invalid global name: {charset}"
                ))
            );
        }
        // An empty segment is reported before a bad character in a later segment...
        assert!(reason("/B").is_some_and(|r| r.ends_with("segments must not be empty")));
        // ...and the first bad character decides the reason.
        assert!(reason("a/B\t").is_some_and(|r| r.ends_with(charset)));
        assert!(reason("a/\tB").is_some_and(|r| r.ends_with("control character")));
        // Bad characters in three segments beat the exact-count message.
        assert!(reason("a/b/C").is_some_and(|r| r.ends_with(charset)));
    }

    #[test]
    fn tool_path_grammar() {
        let reason = |text: &str| check_tool_path(text).err();
        assert_eq!(reason("promptforge/web/fetch"), None);
        assert_eq!(reason("org.rustalliance/my-pack/v1_2.tool"), None);
        let count = "a tool id must have exactly 3 segments (namespace/plugin/name)";
        for text in ["", "fetch", "a/b/c/d", "promptforge/web"] {
            assert_eq!(
                reason(text),
                Some(format!(
                    "invalid exact tool path `{text}`: invalid tool id: {count}"
                ))
            );
        }
        assert_eq!(
            reason("a//c"),
            Some(
                "invalid exact tool path `a//c`: invalid tool id: segments must not be empty"
                    .into()
            )
        );
        let charset = "segments may contain only lowercase ASCII letters, digits, '-', '_', '.'";
        for text in ["a/b/C", "a/b/c\td", "a/b\u{7f}/c", "a/ b/c"] {
            assert_eq!(
                reason(text),
                Some(format!(
                    "invalid exact tool path `{text}`: invalid tool id: {charset}"
                ))
            );
        }
        assert!(reason("a/B").is_some_and(|r| r.ends_with(charset)));
    }

    #[test]
    fn plugin_declared_twice() {
        let detail = "Plugin promptforge/user-input is declared more than once under plugins";
        err_unlocated(
            &with_head(
                "plugins:\n  - promptforge/user-input\n  - ref: promptforge/user-input\n    optional: true\n",
            ),
            detail,
        );
        err_unlocated(
            &with_head(
                "plugins:\n  - ref: promptforge/user-input\n    config: 1\n  - ref: promptforge/user-input\n    config: 2\n",
            ),
            detail,
        );
    }

    #[test]
    fn duplicate_plugin_is_checked_before_the_optional_slot() {
        err_unlocated(
            &with_head(
                "plugins:\n  - ref: promptforge/user-input\n    optional: true\n  - \
                 promptforge/user-input\ntools:\n  ask: promptforge/user-input/ask\n",
            ),
            "Plugin promptforge/user-input is declared more than once under plugins",
        );
    }

    #[test]
    fn optional_plugin_cannot_back_a_slot() {
        err_unlocated(
            &with_head(
                "plugins:\n  - ref: promptforge/user-input\n    optional: true\ntools:\n  ask: \
                 promptforge/user-input/ask\n",
            ),
            "tool alias 'ask' names promptforge/user-input/ask, whose Plugin \
             promptforge/user-input is declared optional; a tool slot requires its Plugin",
        );
        // Several offending slots: the alias that sorts first is named.
        err_unlocated(
            &with_head(
                "plugins:\n  - promptforge/web\n  - ref: acme/tools\n    optional: true\ntools:\n  \
                 zed: acme/tools/z\n  fetch: promptforge/web/fetch\n  beta: acme/tools/b\n",
            ),
            "tool alias 'beta' names acme/tools/b, whose Plugin acme/tools is declared optional; \
             a tool slot requires its Plugin",
        );
        // An optional Plugin that backs no slot is fine, and so is a slot with no Plugin.
        ok(&with_head(
            "plugins:\n  - ref: acme/absent\n    optional: true\ntools:\n  fetch: \
             promptforge/web/fetch\n",
        ));
    }

    // --- tools -----------------------------------------------------------------------------

    #[test]
    fn tool_slots_in_written_order() {
        let fm = ok(&with_head(
            "plugins:\n  - promptforge/web\ntools:\n  search: promptforge/web/search\n  fetch: \
             promptforge/web/fetch\n  getter: promptforge/web/fetch\n",
        ));
        assert_eq!(
            fm.tools,
            vec![
                ToolSlot {
                    alias: "search".into(),
                    path: "promptforge/web/search".into(),
                    line: 8,
                    column: 3
                },
                ToolSlot {
                    alias: "fetch".into(),
                    path: "promptforge/web/fetch".into(),
                    line: 9,
                    column: 3
                },
                ToolSlot {
                    alias: "getter".into(),
                    path: "promptforge/web/fetch".into(),
                    line: 10,
                    column: 3
                },
            ]
        );
        let slot = fm.tool("fetch");
        assert_eq!(slot.map(ToolSlot::plugin_id), Some("promptforge/web"));
        assert_eq!(slot.map(ToolSlot::short_name), Some("fetch"));
    }

    #[test]
    fn alias_grammar_and_spellings() {
        let long = "a".repeat(64);
        let fm = ok(&with_head(&format!(
            "tools:\n  a: p/w/x\n  A: p/w/x\n  web_fetch: p/w/x\n  web-fetch2: p/w/x\n  {long}: \
             p/w/x\n"
        )));
        assert_eq!(fm.tools.len(), 5);
        assert!(fm.tool(&long).is_some());
        let too_long = "a".repeat(65);
        err_at(
            &with_head(&format!("tools:\n  {too_long}: p/w/x\n")),
            &format!("invalid tool alias `{too_long}`: expected [A-Za-z][A-Za-z0-9_-]{{0,63}}"),
            6,
            3,
        );
        err_at(
            &with_head(
                "plugins:\n  - promptforge/user-input\ntools:\n  1ask: promptforge/user-input/ask\n",
            ),
            "invalid tool alias `1ask`: expected [A-Za-z][A-Za-z0-9_-]{0,63}",
            8,
            3,
        );
        // The grammar is checked before the reserved names.
        err_at(
            &with_head("tools:\n  _G: p/w/x\n"),
            "invalid tool alias `_G`: expected [A-Za-z][A-Za-z0-9_-]{0,63}",
            6,
            3,
        );
    }

    #[test]
    fn reserved_aliases() {
        err_at(
            &with_head(
                "plugins:\n  - promptforge/user-input\ntools:\n  store: promptforge/user-input/ask\n",
            ),
            "tool alias `store` in `tools` is reserved (an Engine global): tool aliases and model \
             role labels install as section VM globals, so none may take a reserved name",
            8,
            3,
        );
        err_at(
            &with_head("tools:\n  global: promptforge/user-input/ask\n"),
            "tool alias `global` in `tools` is reserved (a Lua keyword): tool aliases and model \
             role labels install as section VM globals, so none may take a reserved name",
            6,
            3,
        );
        err_at(
            &with_head("tools:\n  pairs: p/w/x\n"),
            "tool alias `pairs` in `tools` is reserved (a Lua standard-library global): tool \
             aliases and model role labels install as section VM globals, so none may take a \
             reserved name",
            6,
            3,
        );
        // Reserved is checked before uniqueness.
        err_at(
            &with_head("tools:\n  ui: p/w/x\n  ui: p/w/x\n"),
            "tool alias `ui` in `tools` is reserved (an Engine global): tool aliases and model \
             role labels install as section VM globals, so none may take a reserved name",
            6,
            3,
        );
    }

    #[test]
    fn duplicate_alias() {
        err_at(
            &with_head("tools:\n  fetch: p/w/x\n  fetch: p/w/y\n"),
            "duplicate tool alias `fetch`: contract map keys must be unique",
            7,
            3,
        );
        err_at(
            &with_head("tools:\n  fetch: p/w/x\n  'fetch': p/w/y\n"),
            "duplicate tool alias `fetch`: contract map keys must be unique",
            7,
            3,
        );
    }

    #[test]
    fn tool_values() {
        err_at(
            &with_head("tools: [fetch]\n"),
            "invalid type: sequence, expected a map of tool alias keys to declarations",
            5,
            8,
        );
        err_at(
            &with_head("tools:\n"),
            "invalid type: unit value, expected a map of tool alias keys to declarations",
            5,
            6,
        );
        err_at(
            &with_head("tools:\n  fetch: 5\n"),
            "invalid type: integer `5`, expected an exact tool path string",
            6,
            10,
        );
        err_at(
            &with_head("tools:\n  fetch: {path: a/b/c}\n"),
            "invalid type: map, expected an exact tool path string",
            6,
            10,
        );
        err_at(
            &with_head("tools:\n  fetch: promptforge/web\n"),
            "invalid exact tool path `promptforge/web`: invalid tool id: a tool id must have \
             exactly 3 segments (namespace/plugin/name)",
            6,
            10,
        );
        assert!(ok(&with_head("tools: {}\n")).tools.is_empty());
    }

    // --- models ----------------------------------------------------------------------------

    #[test]
    fn roles_block_and_flow() {
        let fm = ok(&with_head(
            "models:\n  analyst:\n    keywords: [frontier, thinking]\n    min_context: 200000\n    \
             description: Deep analysis of the quarterly figures\n  scout:\n    keywords: \
             [fast]\n  writer: {}\n  deep: { keywords: [no-thinking, creative, chat], \
             min_context: 32000, description: deep reasoning }\n",
        ));
        assert_eq!(
            fm.models,
            vec![
                RoleDecl {
                    label: "analyst".into(),
                    keywords: vec![Keyword::Frontier, Keyword::Thinking],
                    min_context: Some(200_000),
                    description: Some("Deep analysis of the quarterly figures".into()),
                    line: 6,
                    column: 3
                },
                RoleDecl {
                    label: "scout".into(),
                    keywords: vec![Keyword::Fast],
                    min_context: None,
                    description: None,
                    line: 10,
                    column: 3
                },
                RoleDecl {
                    label: "writer".into(),
                    keywords: vec![],
                    min_context: None,
                    description: None,
                    line: 12,
                    column: 3
                },
                RoleDecl {
                    label: "deep".into(),
                    keywords: vec![Keyword::NoThinking, Keyword::Creative, Keyword::Chat],
                    min_context: Some(32000),
                    description: Some("deep reasoning".into()),
                    line: 13,
                    column: 3
                },
            ]
        );
        assert_eq!(fm.role("analyst").and_then(RoleDecl::thinking), Some(true));
        assert_eq!(fm.role("deep").and_then(RoleDecl::thinking), Some(false));
        assert_eq!(fm.role("writer").and_then(RoleDecl::thinking), None);
    }

    #[test]
    fn keywords_all_seven_and_later_hard_keyword_wins() {
        let fm = ok(&with_head(
            "models:\n  r:\n    keywords: [thinking, no-thinking, frontier, fast, small, \
             creative, chat, thinking]\n",
        ));
        let role = fm.role("r").cloned();
        let words: Vec<&str> = role
            .iter()
            .flat_map(|r| r.keywords.iter().map(|k| k.as_str()))
            .collect();
        assert_eq!(
            words,
            [
                "thinking",
                "no-thinking",
                "frontier",
                "fast",
                "small",
                "creative",
                "chat",
                "thinking"
            ]
        );
        assert_eq!(role.and_then(|r| r.thinking()), Some(true));
        assert!(Keyword::Thinking.is_hard() && !Keyword::Chat.is_hard());
    }

    #[test]
    fn min_context_bounds() {
        let fm = ok(&with_head(
            "models:\n  r: {min_context: 4294967295}\n  s: {min_context: 1}\n",
        ));
        assert_eq!(fm.role("r").and_then(|r| r.min_context), Some(u32::MAX));
        err_at(
            &with_head("models:\n  r:\n    min_context: 0\n"),
            "invalid value: integer `0`, expected a whole number of tokens from 1 to 4294967295",
            7,
            18,
        );
        err_at(
            &with_head("models:\n  r:\n    min_context: 4294967296\n"),
            "invalid value: integer `4294967296`, expected a whole number of tokens from 1 to \
             4294967295",
            7,
            18,
        );
        err_at(
            &with_head("models:\n  r:\n    min_context: 2.5\n"),
            "invalid type: floating point `2.5`, expected a whole number of tokens from 1 to \
             4294967295",
            7,
            18,
        );
    }

    #[test]
    fn role_errors() {
        err_at(
            &with_head("models:\n  r:\n    keywords: [fast, turbo]\n"),
            "unknown variant `turbo`, expected one of `thinking`, `no-thinking`, `frontier`, \
             `fast`, `small`, `creative`, `chat`",
            7,
            22,
        );
        err_at(
            &with_head("models:\n  r:\n    keywords: fast\n"),
            "invalid type: string \"fast\", expected a sequence",
            7,
            15,
        );
        err_at(
            &with_head("models:\n  r:\n    temperature: 1\n"),
            "unknown field `temperature`, expected one of `keywords`, `min_context`, \
             `description`",
            7,
            5,
        );
        err_at(
            &with_head("models:\n  r:\n    description: a\n    description: b\n"),
            "duplicate field `description`",
            8,
            5,
        );
        err_at(
            &with_head("models:\n  writer: fast\n"),
            "invalid type: string \"fast\", expected a model role declaration map",
            6,
            11,
        );
        err_at(
            &with_head("models:\n  - writer\n"),
            "invalid type: sequence, expected a map of model role label keys to declarations",
            6,
            3,
        );
    }

    #[test]
    fn role_label_names() {
        err_at(
            &with_head("models:\n  my.role: {}\n"),
            "invalid model role label `my.role`: expected [A-Za-z][A-Za-z0-9_-]{0,63}",
            6,
            3,
        );
        err_at(
            &with_head("models:\n  end: {}\n"),
            "model role label `end` in `models` is reserved (a Lua keyword): tool aliases and \
             model role labels install as section VM globals, so none may take a reserved name",
            6,
            3,
        );
        err_at(
            &with_head("models:\n  pairs: {}\n"),
            "model role label `pairs` in `models` is reserved (a Lua standard-library global): \
             tool aliases and model role labels install as section VM globals, so none may take \
             a reserved name",
            6,
            3,
        );
        err_at(
            &with_head("models:\n  writer: {}\n  writer: {}\n"),
            "duplicate model role label `writer`: contract map keys must be unique",
            7,
            3,
        );
        let fm = ok(&with_head(
            "models:\n  Store: {}\n  stores: {}\n  my_argv: {}\n",
        ));
        assert_eq!(fm.models.len(), 3);
    }

    #[test]
    fn alias_and_label_clash() {
        err_unlocated(
            &with_head(
                "plugins:\n  - promptforge/user-input\ntools:\n  zeta: \
                 promptforge/user-input/ask\n  alpha: promptforge/user-input/ask\nmodels:\n  \
                 zeta: {}\n  alpha: {}\n",
            ),
            "`alpha` is both a tool alias in `tools` and a model role label in `models`; each \
             installs as a section VM global of its own name, so the two must differ",
        );
    }

    // --- args ------------------------------------------------------------------------------

    #[test]
    fn arg_declaration_with_every_key() {
        let fm = ok(&with_head(
            "args:\n  query:\n    type: string\n    description: What to search for\n  limit:\n    \
             type: integer\n    optional: true\n    default: 3\n  use_mcp:\n    type: boolean\n    \
             default: true\n    description: Search MCP-connected private sources\n",
        ));
        assert!(fm.args.is_structured());
        assert_eq!(
            fm.args.args,
            vec![
                ArgDecl {
                    name: "query".into(),
                    ty: ArgType::String,
                    optional: false,
                    default: None,
                    description: Some("What to search for".into()),
                },
                ArgDecl {
                    name: "limit".into(),
                    ty: ArgType::Integer,
                    optional: true,
                    default: Some(ArgValue::Integer(3)),
                    description: None,
                },
                ArgDecl {
                    name: "use_mcp".into(),
                    ty: ArgType::Boolean,
                    optional: false,
                    default: Some(ArgValue::Boolean(true)),
                    description: Some("Search MCP-connected private sources".into()),
                },
            ]
        );
    }

    #[test]
    fn explicit_args_are_structured() {
        let fm = ok(&with_head("args: {}\n"));
        assert_eq!(
            fm.args,
            ArgsDecl {
                explicit: true,
                args: vec![]
            }
        );
        let fm = ok(&with_head(
            "args:\n  prose:\n    type: string\n    optional: true\n    description: Freeform \
             input for this prompt\n",
        ));
        assert!(fm.args.is_structured());
        assert_eq!(fm.args.args, ArgsDecl::implicit_default().args);
        // Arg names are not checked against the reserved names.
        let fm = ok(&with_head(
            "args:\n  store:\n    type: string\n  prose:\n    type: string\n",
        ));
        assert_eq!(fm.args.args.len(), 2);
    }

    #[test]
    fn arg_types_and_defaults() {
        let default_of = |ty: &str, value: &str| {
            let fm = ok(&with_head(&format!(
                "args:\n  a:\n    type: {ty}\n    default: {value}\n"
            )));
            fm.args.get("a").and_then(|a| a.default.clone())
        };
        assert_eq!(
            default_of("string", "hello"),
            Some(ArgValue::String("hello".into()))
        );
        assert_eq!(
            default_of("string", "'42'"),
            Some(ArgValue::String("42".into()))
        );
        assert_eq!(
            default_of("string", "no"),
            Some(ArgValue::String("no".into()))
        );
        assert_eq!(
            default_of("string", "!!str 42"),
            Some(ArgValue::String("42".into()))
        );
        assert_eq!(
            default_of("boolean", "false"),
            Some(ArgValue::Boolean(false))
        );
        assert_eq!(default_of("integer", "-7"), Some(ArgValue::Integer(-7)));
        assert_eq!(
            default_of("integer", "9223372036854775807"),
            Some(ArgValue::Integer(i64::MAX))
        );
        assert_eq!(default_of("number", "1.5"), Some(ArgValue::Number(1.5)));
        assert_eq!(default_of("number", "3"), Some(ArgValue::Integer(3)));
        assert_eq!(default_of("integer", "null"), None);
        assert_eq!(default_of("integer", "~"), None);
        assert_eq!(default_of("boolean", ""), None);
    }

    #[test]
    fn default_mismatches() {
        let mismatch = |ty: &str, value: &str| {
            err_at(
                &with_head(&format!(
                    "args:\n  limit:\n    type: {ty}\n    optional: true\n    default: {value}\n"
                )),
                &format!("the default does not match the declared type `{ty}`"),
                9,
                14,
            );
        };
        mismatch("integer", "1.5");
        mismatch("integer", "9223372036854775808");
        mismatch("integer", "3.0");
        mismatch("integer", "'3'");
        mismatch("string", "42");
        mismatch("string", "true");
        mismatch("string", "[a]");
        mismatch("boolean", "'true'");
        mismatch("boolean", "no");
        mismatch("boolean", "1");
        mismatch("number", "'1.5'");
        mismatch("number", ".inf");
        mismatch("number", ".nan");
        mismatch("number", "{a: 1}");
    }

    #[test]
    fn default_before_type_is_checked_after_the_map() {
        err_at(
            &with_head("args:\n  a:\n    default: 1.5\n    type: integer\n"),
            "the default does not match the declared type `integer`",
            7,
            14,
        );
        err_at(
            &with_head("args:\n  a:\n    default: 1.5\n"),
            "missing field `type`",
            7,
            5,
        );
    }

    #[test]
    fn arg_declaration_errors() {
        err_at(
            &with_head("args:\n  query:\n    optional: true\n"),
            "missing field `type`",
            7,
            5,
        );
        err_at(
            &with_head("args:\n  query:\n    type: text\n"),
            "unknown variant `text`, expected one of `string`, `boolean`, `integer`, `number`",
            7,
            11,
        );
        err_at(
            &with_head("args:\n  query:\n    type: String\n"),
            "unknown variant `String`, expected one of `string`, `boolean`, `integer`, `number`",
            7,
            11,
        );
        err_at(
            &with_head("args:\n  query:\n    type: string\n    descripton: What to search for\n"),
            "unknown field `descripton`, expected one of `type`, `optional`, `default`, \
             `description`",
            8,
            5,
        );
        err_at(
            &with_head("args:\n  query:\n    type: string\n  query:\n    type: integer\n"),
            "duplicate arg name `query`: contract map keys must be unique",
            8,
            3,
        );
        err_at(
            &with_head("args:\n  - query\n"),
            "invalid type: sequence, expected a map of arg name keys to declarations",
            6,
            3,
        );
        err_at(
            &with_head("args: query\n"),
            "invalid type: string \"query\", expected a map of arg name keys to declarations",
            5,
            7,
        );
        err_at(
            &with_head("args:\n  query: string\n"),
            "invalid type: string \"string\", expected an arg declaration map",
            6,
            10,
        );
        err_at(
            &with_head("args:\n  _query:\n    type: string\n"),
            "invalid arg name `_query`: expected [A-Za-z][A-Za-z0-9_-]{0,63}",
            6,
            3,
        );
        err_at(
            &with_head("args:\n  q:\n    type: string\n    optional: 1\n"),
            "invalid type: integer `1`, expected a boolean",
            8,
            15,
        );
        err_at(
            &with_head("args:\n  q:\n    type: string\n    type: integer\n"),
            "duplicate field `type`",
            8,
            5,
        );
    }

    // --- serde wording helpers ---------------------------------------------------------------

    #[test]
    fn floats_print_like_serde() {
        assert_eq!(float_text(1.5), "1.5");
        assert_eq!(float_text(3.0), "3.0");
        assert_eq!(float_text(-0.0), "-0.0");
        assert_eq!(float_text(f64::INFINITY), "inf");
        assert_eq!(float_text(f64::NAN), "NaN");
    }

    #[test]
    fn core_schema_resolution() {
        assert_eq!(resolve_plain("~"), Resolved::Null);
        assert_eq!(resolve_plain(""), Resolved::Null);
        assert_eq!(resolve_plain("NULL"), Resolved::Null);
        assert_eq!(resolve_plain("True"), Resolved::Bool(true));
        assert_eq!(resolve_plain("yes"), Resolved::Str);
        assert_eq!(resolve_plain("off"), Resolved::Str);
        assert_eq!(resolve_plain("+12"), Resolved::Int(12));
        assert_eq!(resolve_plain("0o17"), Resolved::Int(15));
        assert_eq!(resolve_plain("0x1F"), Resolved::Int(31));
        assert_eq!(resolve_plain("0b1"), Resolved::Str);
        assert_eq!(resolve_plain("1_000"), Resolved::Str);
        assert_eq!(resolve_plain("1e3"), Resolved::Float(1000.0));
        assert_eq!(resolve_plain(".5"), Resolved::Float(0.5));
        assert_eq!(resolve_plain("5."), Resolved::Float(5.0));
        assert_eq!(resolve_plain("-.inf"), Resolved::Float(f64::NEG_INFINITY));
        assert_eq!(resolve_plain("."), Resolved::Str);
        assert_eq!(resolve_plain("1e"), Resolved::Str);
        assert_eq!(resolve_plain("inf"), Resolved::Str);
        assert_eq!(resolve_plain("nan"), Resolved::Str);
        assert!(matches!(resolve_plain(".NaN"), Resolved::Float(f) if f.is_nan()));
    }

    #[test]
    fn config_duplicate_keys_are_refused() {
        err_at(
            &with_head("plugins:\n  - ref: a/b\n    config:\n      k: 1\n      k: 2\n"),
            "duplicate mapping key `k`",
            9,
            7,
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        #[test]
        fn never_panics_on_yaml_like_text(text in "[a-z:{}\\[\\],&*!'\"|>#\\- \n\t\r0-9.~é]{0,80}") {
            let _ = parse_frontmatter(&text, 2);
            let _ = parse_frontmatter(&format!("{HEAD}{text}"), 2);
            let _ = parse_frontmatter(&format!("{HEAD}plugins:\n  - {text}"), 2);
        }

        #[test]
        fn never_panics_on_arbitrary_text(text in "\\PC{0,60}") {
            let _ = parse_frontmatter(&text, 1);
        }

        #[test]
        fn error_lines_stay_inside_the_frontmatter(text in "[a-z: \n\\[\\]{}\"-]{0,60}") {
            let yaml = format!("{HEAD}{text}");
            if let Err(error) = parse_frontmatter(&yaml, 2) {
                let last = 2 + u32::try_from(yaml.matches('\n').count()).unwrap_or(0);
                if let Some(line) = error.line {
                    proptest::prop_assert!((2..=last).contains(&line), "{line} for {yaml:?}");
                }
            }
        }
    }
}

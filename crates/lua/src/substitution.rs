//! `{{ path }}` substitution (chapter 07): filling a block's pending prose at its first `prose`
//! read.
//!
//! [`render`] makes one left-to-right pass over the pending prose:
//!
//! - `\{{`, `\}}` and `\\` write `{{`, `}}` and `\`; a backslash before anything else, or at the
//!   very end, stays literal;
//! - `{{` opens a placeholder that ends at the first later `}}`; its text is trimmed (so it may
//!   span lines) and is the path, one or more nonempty segments joined by dots with no space next
//!   to a dot;
//! - a lone `}}` or a single `{` is ordinary text;
//! - inserted values are emitted verbatim and never scanned again.
//!
//! The first segment picks the source: `args`, `argv`, `item`, `var`, `sys`, or else a Lua global
//! read through `_G` with ordinary indexing (so a metatable's `__index` on `_G` applies). Further
//! segments are keys of tables only. A resolved value renders as its text (strings as is,
//! numbers by [`json::format_number`] / [`json::format_integer`], booleans) or, for a table, as
//! compact JSON with sorted keys ([`json::to_compact_json`]).
//!
//! Placeholders are resolved as the pass reaches them, so the leftmost failing placeholder is the
//! one reported. The module is engine-agnostic: the engine hands in the sources and turns a
//! [`RenderError`] into the Lua error raised at the `prose` read.

use std::fmt;

use mlua::{Table, Value};
use serde_json::Value as Json;

use crate::json;

/// Data behind a source: either JSON data the engine keeps (such as the frozen `argv`, which
/// keeps JSON nulls apart from absent keys) or a Lua value.
#[derive(Debug, Clone)]
pub enum Data<'a> {
    /// JSON data. A `null` anywhere is a JSON null (`NullValue`, or `null` for `{{ item }}`).
    Json(&'a Json),
    /// A Lua value, read raw (no metamethods). nil and mlua's `Value::NULL` count as null.
    Lua(Value),
}

/// The answer of the `sys` source for one field name.
#[derive(Debug, Clone)]
pub enum SysLookup {
    /// The field exists. nil stands for a field present with a JSON null value.
    Value(Value),
    /// `sys` has no such field here.
    Unknown,
}

/// Everything a placeholder can read, as it stands at the `prose` read.
pub struct Sources<'a> {
    /// The chain's argument string, exactly as passed (the empty string when none was given).
    pub args: &'a str,
    /// The chain's parsed input; `None` when `argv` is nil. In the H1 body this is the parse of
    /// the argument string, not the global the H1 body may be repairing.
    pub argv: Option<Data<'a>>,
    /// The seeded item: `Some` only in the first section a fanout arm (or a task started with an
    /// `item`) enters. `Some(Data::Json(&Json::Null))` is a JSON-null member and renders `null`.
    pub item: Option<Data<'a>>,
    /// The plain data behind the `var` guard.
    pub var: Data<'a>,
    /// Reads one `sys` field by name.
    pub sys: &'a dyn Fn(&str) -> SysLookup,
    /// The section's `_G`. Bare names are read with ordinary indexing, so a user metatable's
    /// `__index` runs; nested keys under a global are read the same way.
    pub globals: Table,
}

impl fmt::Debug for Sources<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sources")
            .field("args", &self.args)
            .field("argv", &self.argv)
            .field("item", &self.item)
            .field("var", &self.var)
            .field("sys", &"<fn>")
            .field("globals", &self.globals)
            .finish()
    }
}

/// The stable substitution kinds of chapter 07 ("Substitution kinds").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubstitutionKind {
    /// `unclosed '{{' in prose`: a `{{` has no later `}}`.
    Unclosed,
    /// `empty or padded path segment in {{ {path} }}`.
    EmptySegment,
    /// `bad path: {{ var }}` or `bad path: {{ sys }}`: `var` or `sys` has no key.
    BadPath,
    /// `unknown namespace or global '{name}' in {{ {path} }}`.
    UnknownNamespace,
    /// `args is a string, not a table` or `item is a string, not a table`.
    NotATable,
    /// `missing {{ {path} }}`: a key is absent, or the path continues past a scalar.
    MissingKey,
    /// `missing {{ {path} }}`: the path lands on JSON null (any root but `item`).
    NullValue,
    /// `{{ item }} is nil (not inside a fanout arm)`.
    NilItem,
    /// `{{ {path} }} is nil (the args string is not JSON)`.
    NilArgv,
    /// `global '{name}' in {{ {path} }} is not JSON data`.
    Serialize,
}

impl SubstitutionKind {
    #[cfg(test)]
    /// Every kind, in the chapter's table order.
    pub const ALL: [SubstitutionKind; 10] = [
        Self::Unclosed,
        Self::EmptySegment,
        Self::BadPath,
        Self::UnknownNamespace,
        Self::NotATable,
        Self::MissingKey,
        Self::NullValue,
        Self::NilItem,
        Self::NilArgv,
        Self::Serialize,
    ];

    /// The kind's name as it appears in the error text.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unclosed => "Unclosed",
            Self::EmptySegment => "EmptySegment",
            Self::BadPath => "BadPath",
            Self::UnknownNamespace => "UnknownNamespace",
            Self::NotATable => "NotATable",
            Self::MissingKey => "MissingKey",
            Self::NullValue => "NullValue",
            Self::NilItem => "NilItem",
            Self::NilArgv => "NilArgv",
            Self::Serialize => "Serialize",
        }
    }
}

impl fmt::Display for SubstitutionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubstitutionError {
    /// The substitution kind.
    pub kind: SubstitutionKind,
    /// The spec's message, such as `missing {{ var.missing }}`.
    pub message: String,
    /// Byte offset of the offending `{{` from the start of the pending prose.
    pub offset: usize,
}

impl SubstitutionError {
    /// The error's text, `{message} [{Kind} at byte {offset}]`: what `tostring(err)` returns
    /// under `pcall` and what an uncaught failure's run message contains. No `runtime error: `
    /// prefix belongs in front of it.
    pub fn text(&self) -> String {
        format!(
            "{} [{} at byte {}]",
            self.message,
            self.kind.name(),
            self.offset
        )
    }
}

impl fmt::Display for SubstitutionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

impl std::error::Error for SubstitutionError {}

/// Why [`render`] failed.
#[derive(Debug)]
pub enum RenderError {
    /// A placeholder failed with one of the substitution kinds.
    Substitution(SubstitutionError),
    /// The text would not fit in the VM that receives it (`not enough memory`, as Lua says).
    OutOfMemory,
    /// `{{ sys.{name} }}` named a field `sys` does not have here. The seed of chapter 05 makes
    /// this the same runtime error a Lua read raises, `unknown sys field '{name}'` (caught, it
    /// reads `runtime error: unknown sys field '{name}'`, ruling 3), not a substitution kind.
    UnknownSysField {
        /// The field name, as written.
        name: String,
    },
    /// Lua code run by a lookup failed: a `__index` metamethod on `_G` or on a table a global
    /// holds raised this error (a strict `_G` metatable, say). Raise it unchanged.
    Lua(mlua::Error),
}

impl RenderError {
    /// The message the engine raises: a substitution error's full text, the unknown sys field
    /// message, or the Lua error's own text.
    pub fn message(&self) -> String {
        match self {
            Self::Substitution(e) => e.text(),
            Self::UnknownSysField { name, .. } => unknown_sys_field_message(name),
            Self::Lua(e) => e.to_string(),
            Self::OutOfMemory => "not enough memory".to_owned(),
        }
    }
}

/// The `sys` guard's message for a field it does not have: `unknown sys field '{name}'`.
pub fn unknown_sys_field_message(name: &str) -> String {
    format!("unknown sys field '{name}'")
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for RenderError {}

impl From<SubstitutionError> for RenderError {
    fn from(e: SubstitutionError) -> Self {
        Self::Substitution(e)
    }
}

/// Longest path (in characters) a message quotes before cutting it with `...`.
pub const PATH_PREVIEW_CHARS: usize = 80;

/// A path as messages show it: cut to its first 80 characters plus `...` when longer, then
/// newline, carriage return and tab written `\n`, `\r`, `\t`, and any other control character
/// as `\u{XXXX}` in lowercase hex.
pub fn display_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for (n, c) in path.chars().enumerate() {
        if n == PATH_PREVIEW_CHARS {
            out.push_str("...");
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:04x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
/// Fills every placeholder in `template` (a block's pending prose) in one left-to-right pass.
pub fn render(template: &str, sources: &Sources<'_>) -> Result<String, RenderError> {
    render_within(template, sources, usize::MAX)
}

/// [`render`], failing with [`RenderError::OutOfMemory`] as soon as the text would pass
/// `budget` bytes (the room left in the VM that receives it), so a placeholder repeated many
/// times never builds more than the VM could hold.
pub fn render_within(
    template: &str,
    sources: &Sources<'_>,
    budget: usize,
) -> Result<String, RenderError> {
    let out = render_unchecked(template, sources, budget)?;
    if out.len() > budget {
        return Err(RenderError::OutOfMemory);
    }
    Ok(out)
}

fn render_unchecked(
    template: &str,
    sources: &Sources<'_>,
    budget: usize,
) -> Result<String, RenderError> {
    let bytes = template.as_bytes();
    let mut out = String::with_capacity(template.len());
    let mut literal_start = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => {
                let after = &bytes[i + 1..];
                if after.starts_with(b"{{") || after.starts_with(b"}}") {
                    out.push_str(&template[literal_start..i]);
                    out.push_str(&template[i + 1..i + 3]);
                    i += 3;
                    literal_start = i;
                } else if after.starts_with(b"\\") {
                    out.push_str(&template[literal_start..i]);
                    out.push('\\');
                    i += 2;
                    literal_start = i;
                } else {
                    i += 1;
                }
            }
            b'{' if bytes.get(i + 1) == Some(&b'{') => {
                out.push_str(&template[literal_start..i]);
                let open = i;
                let body_start = i + 2;
                let Some(len) = template[body_start..].find("}}") else {
                    return Err(fail(
                        SubstitutionKind::Unclosed,
                        "unclosed '{{' in prose".to_owned(),
                        open,
                    ));
                };
                let body = &template[body_start..body_start + len];
                let value = resolve(body, open, sources)?;
                if out.len().saturating_add(value.len()) > budget {
                    return Err(RenderError::OutOfMemory);
                }
                out.push_str(&value);
                i = body_start + len + 2;
                literal_start = i;
            }
            _ => i += 1,
        }
    }
    out.push_str(&template[literal_start..]);
    Ok(out)
}

fn fail(kind: SubstitutionKind, message: String, offset: usize) -> RenderError {
    RenderError::Substitution(SubstitutionError {
        kind,
        message,
        offset,
    })
}

/// A value met while walking a path.
enum Node<'a> {
    Json(&'a Json),
    Lua(Value),
}

impl<'a> Node<'a> {
    fn from_data(data: &Data<'a>) -> Self {
        match data {
            Data::Json(j) => Node::Json(j),
            Data::Lua(v) => Node::Lua(v.clone()),
        }
    }

    fn is_null(&self) -> bool {
        match self {
            Node::Json(j) => j.is_null(),
            Node::Lua(v) => v.is_nil() || json::is_null_sentinel(v),
        }
    }

    /// The value under `key`, or `None` when absent or when this is no table. `meta` reads Lua
    /// tables with ordinary indexing (metamethods apply) instead of raw.
    fn child(&self, key: &str, meta: bool) -> mlua::Result<Option<Node<'a>>> {
        Ok(match self {
            Node::Json(Json::Object(map)) => map.get(key).map(Node::Json),
            Node::Json(_) => None,
            Node::Lua(Value::Table(t)) => {
                let v: Value = if meta { t.get(key)? } else { t.raw_get(key)? };
                if v.is_nil() { None } else { Some(Node::Lua(v)) }
            }
            Node::Lua(_) => None,
        })
    }

    /// The rendered text, or `None` when the value is not JSON data.
    fn render(&self) -> Option<String> {
        match self {
            Node::Json(j) => Some(json::display_value(j)),
            Node::Lua(v) => match v {
                Value::String(s) => Some(s.to_string_lossy()),
                Value::Integer(i) => Some(json::format_integer(*i)),
                Value::Number(n) => Some(json::format_number(*n)),
                Value::Boolean(b) => Some(b.to_string()),
                Value::Table(_) => json::to_json(v, "")
                    .ok()
                    .map(|data| json::to_compact_json(&data)),
                v if json::is_null_sentinel(v) || v.is_nil() => Some("null".to_owned()),
                _ => None,
            },
        }
    }
}

/// Resolves one placeholder whose text between the braces is `body`.
fn resolve(body: &str, offset: usize, sources: &Sources<'_>) -> Result<String, RenderError> {
    let path = body.trim();
    let shown = || display_path(path);
    let segments: Vec<&str> = path.split('.').collect();
    let padded = |s: &str| s.starts_with(char::is_whitespace) || s.ends_with(char::is_whitespace);
    if segments.iter().any(|s| s.is_empty() || padded(s)) {
        return Err(fail(
            SubstitutionKind::EmptySegment,
            format!("empty or padded path segment in {{{{ {} }}}}", shown()),
            offset,
        ));
    }
    let (root, keys) = match segments.split_first() {
        Some((root, keys)) => (*root, keys),
        None => ("", &[][..]),
    };
    let missing =
        |kind: SubstitutionKind| fail(kind, format!("missing {{{{ {} }}}}", shown()), offset);
    let serialize = || {
        fail(
            SubstitutionKind::Serialize,
            format!(
                "global '{}' in {{{{ {} }}}} is not JSON data",
                display_path(root),
                shown()
            ),
            offset,
        )
    };
    // Walks `keys` from `start` and renders what it lands on.
    let walk = |start: Node<'_>, keys: &[&str], meta: bool| -> Result<String, RenderError> {
        let mut node = start;
        for key in keys {
            match node.child(key, meta).map_err(RenderError::Lua)? {
                Some(next) => node = next,
                None => return Err(missing(SubstitutionKind::MissingKey)),
            }
        }
        if node.is_null() {
            return Err(missing(SubstitutionKind::NullValue));
        }
        node.render().ok_or_else(serialize)
    };

    match root {
        "args" => {
            if keys.is_empty() {
                Ok(sources.args.to_owned())
            } else {
                Err(fail(
                    SubstitutionKind::NotATable,
                    "args is a string, not a table".to_owned(),
                    offset,
                ))
            }
        }
        "item" => {
            if !keys.is_empty() {
                return Err(fail(
                    SubstitutionKind::NotATable,
                    "item is a string, not a table".to_owned(),
                    offset,
                ));
            }
            match &sources.item {
                None => Err(fail(
                    SubstitutionKind::NilItem,
                    "{{ item }} is nil (not inside a fanout arm)".to_owned(),
                    offset,
                )),
                Some(data) => Node::from_data(data).render().ok_or_else(serialize),
            }
        }
        "argv" => {
            let node = sources.argv.as_ref().map(Node::from_data);
            match node {
                Some(node) if !node.is_null() => walk(node, keys, false),
                _ => Err(fail(
                    SubstitutionKind::NilArgv,
                    format!("{{{{ {} }}}} is nil (the args string is not JSON)", shown()),
                    offset,
                )),
            }
        }
        "var" | "sys" if keys.is_empty() => Err(fail(
            SubstitutionKind::BadPath,
            format!("bad path: {{{{ {root} }}}}"),
            offset,
        )),
        "var" => walk(Node::from_data(&sources.var), keys, false),
        "sys" => {
            let (field, rest) = match keys.split_first() {
                Some((field, rest)) => (*field, rest),
                None => ("", &[][..]),
            };
            match (sources.sys)(field) {
                SysLookup::Unknown => Err(RenderError::UnknownSysField {
                    name: field.to_owned(),
                }),
                SysLookup::Value(v) => {
                    let node = Node::Lua(v);
                    if node.is_null() && !rest.is_empty() {
                        return Err(missing(SubstitutionKind::MissingKey));
                    }
                    walk(node, rest, false)
                }
            }
        }
        // `prose` is not a source, and reading it here would render the prose being rendered.
        "prose" => Err(serialize()),
        name => {
            let value: Value = sources.globals.get(name).map_err(RenderError::Lua)?;
            if value.is_nil() {
                return Err(fail(
                    SubstitutionKind::UnknownNamespace,
                    format!(
                        "unknown namespace or global '{}' in {{{{ {} }}}}",
                        display_path(name),
                        shown()
                    ),
                    offset,
                ));
            }
            walk(Node::Lua(value), keys, true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlua::Lua;
    use serde_json::json;

    fn no_sys(_: &str) -> SysLookup {
        SysLookup::Unknown
    }

    fn test_sys(name: &str) -> SysLookup {
        match name {
            "id" => SysLookup::Value(Value::Integer(0)),
            "section_count" => SysLookup::Value(Value::Integer(1)),
            "nothing" => SysLookup::Value(Value::Nil),
            _ => SysLookup::Unknown,
        }
    }

    /// A test fixture: a Lua state whose globals the test sets with Lua code, plus sources.
    struct Fx {
        lua: Lua,
        args: String,
        argv: Option<Json>,
        item: Option<Json>,
    }

    impl Fx {
        fn new() -> Self {
            let lua = Lua::new();
            lua.load("var = {}").exec().unwrap();
            Fx {
                lua,
                args: String::new(),
                argv: None,
                item: None,
            }
        }

        fn args(mut self, args: &str) -> Self {
            self.args = args.to_owned();
            self
        }

        fn argv(mut self, argv: Json) -> Self {
            self.argv = Some(argv);
            self
        }

        fn item(mut self, item: Json) -> Self {
            self.item = Some(item);
            self
        }

        /// Runs Lua code in the fixture's state (`var` is a plain table global here).
        fn lua(self, code: &str) -> Self {
            self.lua.load(code).exec().unwrap();
            self
        }

        fn render(&self, template: &str) -> Result<String, RenderError> {
            let var: Table = self.lua.globals().raw_get("var").unwrap();
            let sys = test_sys;
            let sources = Sources {
                args: &self.args,
                argv: self.argv.as_ref().map(Data::Json),
                item: self.item.as_ref().map(Data::Json),
                var: Data::Lua(Value::Table(var)),
                sys: &sys,
                globals: self.lua.globals(),
            };
            render(template, &sources)
        }

        fn ok(&self, template: &str) -> String {
            match self.render(template) {
                Ok(s) => s,
                Err(e) => panic!("{template:?} failed: {e}"),
            }
        }

        fn err(&self, template: &str) -> String {
            match self.render(template) {
                Ok(s) => panic!("{template:?} rendered {s:?}"),
                Err(e) => e.message(),
            }
        }

        fn kind(&self, template: &str) -> SubstitutionKind {
            match self.render(template) {
                Err(RenderError::Substitution(e)) => e.kind,
                other => panic!("{template:?}: {other:?}"),
            }
        }
    }

    // ---- What substitution does -------------------------------------------------------------

    #[test]
    fn hello_args() {
        assert_eq!(
            Fx::new().args("Acme Corp").ok("hi {{ args }}!"),
            "hi Acme Corp!"
        );
    }

    #[test]
    fn answer_globals() {
        let fx = Fx::new().lua("answer = 42\ndata = { score = 9 }");
        assert_eq!(
            fx.ok("The answer is {{ answer }}; score {{ data.score }}; raw {{ data }}."),
            r#"The answer is 42; score 9; raw {"score":9}."#
        );
    }

    #[test]
    fn subject_var() {
        let fx = Fx::new().args("rivers").lua("var.subject = 'rivers'");
        assert_eq!(
            fx.ok("Write about {{ var.subject }}."),
            "Write about rivers."
        );
    }

    #[test]
    fn no_placeholders_unchanged() {
        let fx = Fx::new();
        for text in [
            "",
            "plain text",
            "Set {x} and close }} here.",
            "a { b } c",
            "é ü 😀",
        ] {
            assert_eq!(fx.ok(text), text);
        }
    }

    // ---- Writing a placeholder --------------------------------------------------------------

    #[test]
    fn trimming_and_multiline() {
        let fx = Fx::new().args("A");
        assert_eq!(
            fx.ok("{{args}} and {{ args }} and {{\nargs\n}}"),
            "A and A and A"
        );
        assert_eq!(fx.ok("{{ \t args \r\n }}"), "A");
    }

    #[test]
    fn first_close_ends_placeholder() {
        let fx = Fx::new().args("A");
        assert_eq!(fx.ok("{{ args }}}"), "A}");
        assert_eq!(fx.ok("{{ args }}}}"), "A}}");
        let fx = Fx::new().lua("x = 1");
        assert_eq!(
            fx.err("{{ x }y }}"),
            "unknown namespace or global 'x }y' in {{ x }y }} [UnknownNamespace at byte 0]"
        );
    }

    #[test]
    fn empty_segments() {
        let fx = Fx::new().lua("var.x = 'set'");
        assert_eq!(
            fx.err("Value {{ var..x }}"),
            "empty or padded path segment in {{ var..x }} [EmptySegment at byte 6]"
        );
        assert_eq!(
            fx.err("A {{ var. x }}"),
            "empty or padded path segment in {{ var. x }} [EmptySegment at byte 2]"
        );
        assert_eq!(
            fx.err("{{ var.x. }}"),
            "empty or padded path segment in {{ var.x. }} [EmptySegment at byte 0]"
        );
        assert_eq!(
            fx.err("{{ var .x }}"),
            "empty or padded path segment in {{ var .x }} [EmptySegment at byte 0]"
        );
        assert_eq!(
            fx.err("{{ .var }}"),
            "empty or padded path segment in {{ .var }} [EmptySegment at byte 0]"
        );
        let e = fx.err("{{ }} here");
        assert!(e.starts_with("empty or padded path segment in {{"), "{e}");
        assert!(e.ends_with("[EmptySegment at byte 0]"), "{e}");
        assert_eq!(
            e,
            "empty or padded path segment in {{  }} [EmptySegment at byte 0]"
        );
        assert_eq!(fx.kind("{{}}"), SubstitutionKind::EmptySegment);
        assert_eq!(fx.kind("{{\n}}"), SubstitutionKind::EmptySegment);
        assert_eq!(fx.kind("{{ . }}"), SubstitutionKind::EmptySegment);
        // The check runs before any lookup: unknown roots still report EmptySegment.
        assert_eq!(fx.kind("{{ ghost..x }}"), SubstitutionKind::EmptySegment);
        assert_eq!(fx.kind("{{ args. }}"), SubstitutionKind::EmptySegment);
    }

    #[test]
    fn unclosed() {
        let fx = Fx::new().args("x");
        assert_eq!(
            fx.err("Hello {{ args"),
            "unclosed '{{' in prose [Unclosed at byte 6]"
        );
        assert_eq!(fx.err("{{"), "unclosed '{{' in prose [Unclosed at byte 0]");
        assert_eq!(
            fx.err("end {{"),
            "unclosed '{{' in prose [Unclosed at byte 4]"
        );
        assert_eq!(
            fx.err("{{ args }"),
            "unclosed '{{' in prose [Unclosed at byte 0]"
        );
        assert_eq!(
            fx.err("{{ args }} then {{ args"),
            "unclosed '{{' in prose [Unclosed at byte 16]"
        );
        // A single `{` at the end is text.
        assert_eq!(fx.ok("end {"), "end {");
        assert_eq!(fx.ok("end }}"), "end }}");
    }

    #[test]
    fn leftmost_failure_wins() {
        let fx = Fx::new();
        assert_eq!(
            fx.err("{{ ghost }} {{ var.missing }} {{ oops"),
            "unknown namespace or global 'ghost' in {{ ghost }} [UnknownNamespace at byte 0]"
        );
        assert_eq!(
            fx.err("{{ var.missing }} {{ ghost }}"),
            "missing {{ var.missing }} [MissingKey at byte 0]"
        );
    }

    // ---- args and argv ------------------------------------------------------------------------

    #[test]
    fn args_verbatim() {
        let fx = Fx::new().args("  spaced { not json ");
        assert_eq!(fx.ok("Args: {{ args }}"), "Args:   spaced { not json ");
        let fx = Fx::new().args("{{ args }} \\{{ {\"a\":1}");
        assert_eq!(fx.ok("[{{ args }}]"), "[{{ args }} \\{{ {\"a\":1}]");
        // No argument string renders empty.
        assert_eq!(Fx::new().ok("[{{ args }}]"), "[]");
    }

    #[test]
    fn args_global_is_not_read() {
        let fx = Fx::new().args("original").lua("args = 'changed'");
        assert_eq!(fx.ok("Input: {{ args }}"), "Input: original");
    }

    #[test]
    fn show_argv() {
        let fx = Fx::new().argv(json!({"query": "papers", "row": {"a": 1}}));
        assert_eq!(
            fx.ok("got {{ argv }}\nq={{ argv.query }} cell={{ argv.row.a }}"),
            "got {\"query\":\"papers\",\"row\":{\"a\":1}}\nq=papers cell=1"
        );
        let fx = Fx::new().argv(json!({"query": "papers", "n": 2}));
        assert_eq!(
            fx.ok("Whole: {{ argv }}; Field: {{ argv.query }}"),
            r#"Whole: {"n":2,"query":"papers"}; Field: papers"#
        );
        assert_eq!(Fx::new().argv(json!(42)).ok("{{ argv }}"), "42");
        assert_eq!(Fx::new().argv(json!(true)).ok("{{ argv }}"), "true");
        assert_eq!(Fx::new().argv(json!("s")).ok("{{ argv }}"), "s");
        assert_eq!(Fx::new().argv(json!([1, 2])).ok("{{ argv }}"), "[1,2]");
        assert_eq!(
            Fx::new()
                .argv(json!({"prose": ""}))
                .ok("[{{ argv.prose }}]"),
            "[]"
        );
    }

    #[test]
    fn nil_argv() {
        let fx = Fx::new().args("not json");
        assert_eq!(
            fx.err("{{ argv }}"),
            "{{ argv }} is nil (the args string is not JSON) [NilArgv at byte 0]"
        );
        assert_eq!(
            fx.err("{{ argv.query }}"),
            "{{ argv.query }} is nil (the args string is not JSON) [NilArgv at byte 0]"
        );
        // JSON null is nil too.
        assert_eq!(
            Fx::new().argv(Json::Null).err("{{ argv }}"),
            "{{ argv }} is nil (the args string is not JSON) [NilArgv at byte 0]"
        );
    }

    #[test]
    fn argv_missing_and_null() {
        let fx = Fx::new().argv(json!({"query": "papers", "note": null, "items": [1, 2]}));
        assert_eq!(
            fx.err("{{ argv.query.x }}"),
            "missing {{ argv.query.x }} [MissingKey at byte 0]"
        );
        assert_eq!(
            fx.err("{{ argv.absent }}"),
            "missing {{ argv.absent }} [MissingKey at byte 0]"
        );
        assert_eq!(
            fx.err("{{ argv.note }}"),
            "missing {{ argv.note }} [NullValue at byte 0]"
        );
        // Past a null: the path continues past a scalar.
        assert_eq!(fx.kind("{{ argv.note.x }}"), SubstitutionKind::MissingKey);
        // Arrays are not indexed by paths.
        assert_eq!(fx.kind("{{ argv.items.1 }}"), SubstitutionKind::MissingKey);
        assert_eq!(fx.ok("{{ argv.items }}"), "[1,2]");
    }

    #[test]
    fn argv_as_lua_value() {
        let lua = Lua::new();
        let t: Table = lua.load("return { query = 'repaired' }").eval().unwrap();
        let sys = no_sys;
        let sources = Sources {
            args: "broken input",
            argv: Some(Data::Lua(Value::Table(t))),
            item: None,
            var: Data::Json(&json!({})),
            sys: &sys,
            globals: lua.globals(),
        };
        assert_eq!(
            render("Query: {{ argv.query }}", &sources).unwrap(),
            "Query: repaired"
        );
        let sources = Sources {
            argv: Some(Data::Lua(Value::Nil)),
            ..sources
        };
        assert!(matches!(
            render("{{ argv }}", &sources),
            Err(RenderError::Substitution(SubstitutionError {
                kind: SubstitutionKind::NilArgv,
                ..
            }))
        ));
    }

    #[test]
    fn not_a_table() {
        let fx = Fx::new().args("plain");
        assert_eq!(
            fx.err("{{ args.x }}"),
            "args is a string, not a table [NotATable at byte 0]"
        );
        assert_eq!(
            fx.err("{{ item.x }}"),
            "item is a string, not a table [NotATable at byte 0]"
        );
        let fx = Fx::new().item(json!({"title": "x"}));
        assert_eq!(
            fx.err("Title: {{ item.title }}"),
            "item is a string, not a table [NotATable at byte 7]"
        );
    }

    // ---- var, sys, globals --------------------------------------------------------------------

    #[test]
    fn catalog_var() {
        let fx = Fx::new().lua("var.kind = 'library'\nvar.count = 3\nvar.row = { a = 1 }");
        assert_eq!(
            fx.ok("a {{ var.kind }} paper, {{ var.count }} copies, cell {{ var.row.a }}"),
            "a library paper, 3 copies, cell 1"
        );
    }

    #[test]
    fn var_rendering() {
        let fx = Fx::new().lua(
            "var.row = { a = 1 }; var.arr = { 1, 2, 3 }; var.tags = { 'red', 'green' }; \
             var.first_tag = var.tags[1]; var.f = 2.5; var.w = 3.0; var.big = 1e20; \
             var.tiny = 1e-7; var.yes = true; var.no = false; var.empty = {}; \
             var.nested = { b = { 1, { c = 'd' } }, a = 'x' }",
        );
        assert_eq!(fx.ok("{{ var.row }}"), r#"{"a":1}"#);
        assert_eq!(fx.ok("{{ var.arr }}"), "[1,2,3]");
        assert_eq!(
            fx.ok("First tag: {{ var.first_tag }}; all: {{ var.tags }}"),
            r#"First tag: red; all: ["red","green"]"#
        );
        assert_eq!(fx.ok("{{ var.f }} {{ var.w }}"), "2.5 3");
        assert_eq!(
            fx.ok("{{ var.big }} {{ var.tiny }}"),
            "100000000000000000000 0.0000001"
        );
        assert_eq!(fx.ok("{{ var.yes }} {{ var.no }}"), "true false");
        assert_eq!(fx.ok("{{ var.empty }}"), "{}");
        assert_eq!(fx.ok("{{ var.nested }}"), r#"{"a":"x","b":[1,{"c":"d"}]}"#);
        assert_eq!(fx.ok("{{ var.nested.b }}"), r#"[1,{"c":"d"}]"#);
    }

    #[test]
    fn var_as_json() {
        let lua = Lua::new();
        let data = json!({"word": "mutated", "n": null, "row": {"a": 1}});
        let sys = no_sys;
        let sources = Sources {
            args: "",
            argv: None,
            item: None,
            var: Data::Json(&data),
            sys: &sys,
            globals: lua.globals(),
        };
        assert_eq!(
            render("The word is {{ var.word }}. {{ var.row }}", &sources).unwrap(),
            r#"The word is mutated. {"a":1}"#
        );
        assert_eq!(
            render("{{ var.n }}", &sources).unwrap_err().message(),
            "missing {{ var.n }} [NullValue at byte 0]"
        );
    }

    #[test]
    fn var_missing_and_bad_path() {
        let fx = Fx::new().lua("var.s = 'x'");
        assert_eq!(
            fx.err("Missing: {{ var.missing }}."),
            "missing {{ var.missing }} [MissingKey at byte 9]"
        );
        assert_eq!(
            fx.err("{{ var.s.y }}"),
            "missing {{ var.s.y }} [MissingKey at byte 0]"
        );
        assert_eq!(
            fx.err("Show {{ var }}"),
            "bad path: {{ var }} [BadPath at byte 5]"
        );
        assert_eq!(
            fx.err("{{ sys }}"),
            "bad path: {{ sys }} [BadPath at byte 0]"
        );
        assert_eq!(
            fx.err("{{\nsys\n}}"),
            "bad path: {{ sys }} [BadPath at byte 0]"
        );
    }

    #[test]
    fn var_is_read_raw() {
        // The plain data table is read raw: a metatable on it never runs.
        let fx = Fx::new().lua("setmetatable(var, { __index = function() error('guard') end })");
        assert_eq!(fx.kind("{{ var.x }}"), SubstitutionKind::MissingKey);
    }

    #[test]
    fn sys_fields() {
        let fx = Fx::new();
        assert_eq!(
            fx.ok("id {{ sys.id }} of {{ sys.section_count }}"),
            "id 0 of 1"
        );
        match fx.render("x {{ sys.bogus }}") {
            Err(RenderError::UnknownSysField { name }) => assert_eq!(name, "bogus"),
            other => panic!("{other:?}"),
        }
        assert_eq!(fx.err("{{ sys.bogus }}"), "unknown sys field 'bogus'");
        assert_eq!(fx.err("{{ sys.bogus.x }}"), "unknown sys field 'bogus'");
        assert_eq!(
            fx.err("{{ sys.id.x }}"),
            "missing {{ sys.id.x }} [MissingKey at byte 0]"
        );
        assert_eq!(
            fx.err("{{ sys.nothing }}"),
            "missing {{ sys.nothing }} [NullValue at byte 0]"
        );
        assert_eq!(fx.kind("{{ sys.nothing.x }}"), SubstitutionKind::MissingKey);
    }

    #[test]
    fn globals_by_bare_name() {
        let fx = Fx::new().lua("greeting = 'hello'\nname = 'Ada'\nrow = { a = { b = 2 } }");
        assert_eq!(fx.ok("{{ greeting }}, {{ name }}."), "hello, Ada.");
        assert_eq!(fx.ok("cell {{ row.a.b }}"), "cell 2");
        assert_eq!(fx.ok("{{ row }}"), r#"{"a":{"b":2}}"#);
        assert_eq!(
            fx.err("{{ row.b }}"),
            "missing {{ row.b }} [MissingKey at byte 0]"
        );
        assert_eq!(
            fx.err("{{ name.x }}"),
            "missing {{ name.x }} [MissingKey at byte 0]"
        );
    }

    #[test]
    fn global_scalars() {
        let fx = Fx::new().lua(
            "i = 42; f = 3.0; h = 1.5; big = 1e20; inf = math.huge; nan = 0/0; t = true; \
             s = 'a\\xffb'; e = ''",
        );
        assert_eq!(
            fx.ok("{{ i }} {{ f }} {{ h }} {{ big }}"),
            "42 3 1.5 100000000000000000000"
        );
        assert_eq!(fx.ok("{{ inf }}"), "inf");
        assert!(fx.ok("{{ nan }}").ends_with("NaN"));
        assert_eq!(fx.ok("{{ t }}"), "true");
        assert_eq!(fx.ok("{{ s }}"), "a\u{fffd}b");
        assert_eq!(fx.ok("[{{ e }}]"), "[]");
    }

    #[test]
    fn unknown_namespace() {
        let fx = Fx::new().lua("var.topic = 'tides'");
        assert_eq!(
            fx.err("{{ ghost }} here."),
            "unknown namespace or global 'ghost' in {{ ghost }} [UnknownNamespace at byte 0]"
        );
        assert_eq!(
            fx.err("prefix {{ ghost.x }}"),
            "unknown namespace or global 'ghost' in {{ ghost.x }} [UnknownNamespace at byte 7]"
        );
        assert_eq!(
            fx.err("{{ vars.topic }}"),
            "unknown namespace or global 'vars' in {{ vars.topic }} [UnknownNamespace at byte 0]"
        );
        assert_eq!(
            fx.err("Name: {{ name }}"),
            "unknown namespace or global 'name' in {{ name }} [UnknownNamespace at byte 6]"
        );
        let fx = Fx::new().lua("gone = 1; gone = nil");
        assert_eq!(fx.kind("{{ gone }}"), SubstitutionKind::UnknownNamespace);
    }

    #[test]
    fn offsets_count_bytes() {
        let fx = Fx::new();
        assert_eq!(
            fx.err("é {{ ghost }}"),
            "unknown namespace or global 'ghost' in {{ ghost }} [UnknownNamespace at byte 3]"
        );
        assert_eq!(
            fx.err("X {{ ghost }}"),
            "unknown namespace or global 'ghost' in {{ ghost }} [UnknownNamespace at byte 2]"
        );
        // Escapes before the placeholder count as written.
        assert_eq!(
            fx.err("\\{{x}} {{ ghost }}"),
            "unknown namespace or global 'ghost' in {{ ghost }} [UnknownNamespace at byte 7]"
        );
    }

    #[test]
    fn builtin_roots_win() {
        let fx = Fx::new()
            .args("real")
            .lua("item = 'mine'; args = 'g'; argv = { q = 1 }; var.k = 'v'; sys = 's'");
        assert_eq!(
            fx.err("{{ item }}"),
            "{{ item }} is nil (not inside a fanout arm) [NilItem at byte 0]"
        );
        assert_eq!(fx.ok("{{ args }}"), "real");
        assert_eq!(fx.kind("{{ argv }}"), SubstitutionKind::NilArgv);
        assert_eq!(fx.ok("{{ var.k }}"), "v");
    }

    #[test]
    fn globals_through_metatable() {
        let fx = Fx::new().lua(
            "local defaults = { tone = 'friendly' }\nsetmetatable(_G, { __index = defaults })",
        );
        assert_eq!(fx.ok("{{ tone }}"), "friendly");
        assert_eq!(fx.kind("{{ other }}"), SubstitutionKind::UnknownNamespace);
        // A strict metatable's error is raised unchanged.
        let fx = Fx::new().lua(
            "setmetatable(_G, { __index = function(_, name) error('undefined global ' .. name, 2) end })",
        );
        match fx.render("{{ ghost }}") {
            Err(RenderError::Lua(e)) => assert!(e.to_string().contains("undefined global ghost")),
            other => panic!("{other:?}"),
        }
        // Nested keys under a global use ordinary indexing too.
        let fx = Fx::new().lua("obj = setmetatable({}, { __index = { field = 'inherited' } })");
        assert_eq!(fx.ok("{{ obj.field }}"), "inherited");
        assert_eq!(fx.ok("{{ obj }}"), "{}");
    }

    #[test]
    fn serialize() {
        let fx = Fx::new().lua(
            "t = {}\nt.self = t\nf = function() end\nco = coroutine.create(f)\n\
             holder = { inner = { fn = print } }",
        );
        assert_eq!(
            fx.err("{{ t }}"),
            "global 't' in {{ t }} is not JSON data [Serialize at byte 0]"
        );
        assert_eq!(
            fx.err("{{ f }}"),
            "global 'f' in {{ f }} is not JSON data [Serialize at byte 0]"
        );
        assert_eq!(
            fx.err("{{ co }}"),
            "global 'co' in {{ co }} is not JSON data [Serialize at byte 0]"
        );
        assert_eq!(
            fx.err("{{ holder }}"),
            "global 'holder' in {{ holder }} is not JSON data [Serialize at byte 0]"
        );
        assert_eq!(
            fx.err("{{ holder.inner.fn }}"),
            "global 'holder' in {{ holder.inner.fn }} is not JSON data [Serialize at byte 0]"
        );
        assert_eq!(
            fx.kind("{{ t.self.self.self }}"),
            SubstitutionKind::Serialize
        );
    }

    #[test]
    fn serialize_prose() {
        let fx = Fx::new().lua("prose = 'a global named prose'");
        assert_eq!(
            fx.err("{{ prose }}"),
            "global 'prose' in {{ prose }} is not JSON data [Serialize at byte 0]"
        );
        assert_eq!(fx.kind("{{ prose.x }}"), SubstitutionKind::Serialize);
    }

    #[test]
    fn userdata_global() {
        let fx = Fx::new();
        let ud = fx.lua.create_any_userdata(1_u8).unwrap();
        fx.lua.globals().set("handle", ud).unwrap();
        assert_eq!(
            fx.err("{{ handle }}"),
            "global 'handle' in {{ handle }} is not JSON data [Serialize at byte 0]"
        );
    }

    // ---- Fanout items -------------------------------------------------------------------------

    #[test]
    fn items() {
        assert_eq!(
            Fx::new().item(json!("the angle")).ok("topic: {{ item }}"),
            "topic: the angle"
        );
        assert_eq!(Fx::new().item(json!("plain")).ok("{{ item }}"), "plain");
        assert_eq!(Fx::new().item(json!(7)).ok("{{ item }}"), "7");
        assert_eq!(Fx::new().item(json!(2.5)).ok("{{ item }}"), "2.5");
        assert_eq!(Fx::new().item(json!(true)).ok("{{ item }}"), "true");
        assert_eq!(
            Fx::new().item(json!([7, "x"])).ok("Item: {{ item }}."),
            r#"Item: [7,"x"]."#
        );
        assert_eq!(
            Fx::new().item(json!({"k": 1})).ok("{{ item }}"),
            r#"{"k":1}"#
        );
        assert_eq!(Fx::new().item(Json::Null).ok("{{ item }}"), "null");
        assert_eq!(
            Fx::new()
                .item(json!({"value": 1, "key": "alpha"}))
                .ok("{{ item }}"),
            r#"{"key":"alpha","value":1}"#
        );
        assert_eq!(
            Fx::new().err("topic: {{ item }}"),
            "{{ item }} is nil (not inside a fanout arm) [NilItem at byte 7]"
        );
    }

    #[test]
    fn item_as_lua_value() {
        let lua = Lua::new();
        let t: Value = lua.load("return { 7, 'x' }").eval().unwrap();
        let sys = no_sys;
        let var = json!({});
        let mk = |item: Option<Data<'static>>| Sources {
            args: "",
            argv: None,
            item,
            var: Data::Json(&var),
            sys: &sys,
            globals: lua.globals(),
        };
        assert_eq!(
            render("{{ item }}", &mk(Some(Data::Lua(t)))).unwrap(),
            r#"[7,"x"]"#
        );
        assert_eq!(
            render("{{ item }}", &mk(Some(Data::Lua(Value::NULL)))).unwrap(),
            "null"
        );
        assert_eq!(
            render("{{ item }}", &mk(Some(Data::Lua(Value::Integer(3))))).unwrap(),
            "3"
        );
        let f: Value = lua.load("return print").eval().unwrap();
        assert_eq!(
            render("{{ item }}", &mk(Some(Data::Lua(f))))
                .unwrap_err()
                .message(),
            "global 'item' in {{ item }} is not JSON data [Serialize at byte 0]"
        );
    }

    // ---- Literal braces and one-pass output ---------------------------------------------------

    #[test]
    fn escapes() {
        let fx = Fx::new().args("Acme Corp");
        assert_eq!(fx.ok("\\{{x}}{{ args }}"), "{{x}}Acme Corp");
        assert_eq!(fx.ok("\\{{ and \\}} and \\\\"), "{{ and }} and \\");
        let fx = Fx::new().args("docs");
        assert_eq!(
            fx.ok("Insert a value with `\\{{ var.name }}`. <!-- written for {{ args }} -->"),
            "Insert a value with `{{ var.name }}`. <!-- written for docs -->"
        );
        assert_eq!(
            fx.ok("Set {x} and close }} here."),
            "Set {x} and close }} here."
        );
        // Other backslashes stay.
        assert_eq!(fx.ok("C:\\temp\\new \\n \\d+"), "C:\\temp\\new \\n \\d+");
        assert_eq!(fx.ok("end\\"), "end\\");
        assert_eq!(fx.ok("\\{ \\} \\x"), "\\{ \\} \\x");
        assert_eq!(fx.ok("\\\\\\\\"), "\\\\");
        // `\\` then a live placeholder.
        assert_eq!(fx.ok("\\\\{{ args }}"), "\\docs");
        // `\{{` then a single `{`: the rest is text.
        assert_eq!(fx.ok("\\{{{ args }}"), "{{{ args }}");
        // `\\\{{` is a backslash and an escaped opening.
        assert_eq!(fx.ok("\\\\\\{{ args }}"), "\\{{ args }}");
        // Escapes inside a placeholder are part of its text.
        assert_eq!(
            fx.err("{{ a\\}} b }}"),
            "unknown namespace or global 'a\\' in {{ a\\ }} [UnknownNamespace at byte 0]"
        );
        // A backslash before the first `}}` is part of the path.
        assert_eq!(fx.kind("{{ args \\}}"), SubstitutionKind::UnknownNamespace);
    }

    #[test]
    fn one_pass() {
        let fx = Fx::new()
            .args("SECRET")
            .lua("var.payload = '{{ args }}'; var.esc = '\\\\{{'");
        assert_eq!(fx.ok("value: {{ var.payload }}"), "value: {{ args }}");
        assert_eq!(fx.ok("{{ var.esc }}"), "\\{{");
        let fx = Fx::new().args("{{ args }}");
        assert_eq!(fx.ok("{{ args }}{{ args }}"), "{{ args }}{{ args }}");
    }

    #[test]
    fn unicode() {
        let fx = Fx::new().lua("name = 'Zoë 😀'; _G['名前'] = '値'");
        assert_eq!(fx.ok("« {{ name }} » — {{ 名前 }}"), "« Zoë 😀 » — 値");
        assert_eq!(
            fx.err("😀{{ 幽霊 }}"),
            "unknown namespace or global '幽霊' in {{ 幽霊 }} [UnknownNamespace at byte 4]"
        );
    }

    // ---- Reading the error text ---------------------------------------------------------------

    #[test]
    fn path_display() {
        let fx = Fx::new();
        assert_eq!(
            fx.err("{{ var.a\u{1b}b }}"),
            "missing {{ var.a\\u{001b}b }} [MissingKey at byte 0]"
        );
        let long = format!("var.{}", "a".repeat(90));
        assert_eq!(
            fx.err(&format!("{{{{ {long} }}}}")),
            format!(
                "missing {{{{ var.{}... }}}} [MissingKey at byte 0]",
                "a".repeat(76)
            )
        );
        assert_eq!(
            display_path("a\nb\rc\td\u{7f}\u{0}"),
            "a\\nb\\rc\\td\\u{007f}\\u{0000}"
        );
        assert_eq!(display_path(&"x".repeat(80)), "x".repeat(80));
        assert_eq!(
            display_path(&"é".repeat(81)),
            format!("{}...", "é".repeat(80))
        );
        // The cut comes before escaping.
        let p = format!("{}\n\n", "x".repeat(79));
        assert_eq!(display_path(&p), format!("{}\\n...", "x".repeat(79)));
        // Names are shown the same way.
        assert_eq!(
            fx.err("{{ gh\tost }}"),
            "unknown namespace or global 'gh\\tost' in {{ gh\\tost }} [UnknownNamespace at byte 0]"
        );
    }

    #[test]
    fn kinds_and_texts() {
        let names: Vec<&str> = SubstitutionKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            [
                "Unclosed",
                "EmptySegment",
                "BadPath",
                "UnknownNamespace",
                "NotATable",
                "MissingKey",
                "NullValue",
                "NilItem",
                "NilArgv",
                "Serialize"
            ]
        );
        let e = SubstitutionError {
            kind: SubstitutionKind::MissingKey,
            message: "missing {{ var.missing }}".to_owned(),
            offset: 9,
        };
        assert_eq!(
            e.to_string(),
            "missing {{ var.missing }} [MissingKey at byte 9]"
        );
        assert_eq!(
            RenderError::from(e).message(),
            "missing {{ var.missing }} [MissingKey at byte 9]"
        );
    }
}

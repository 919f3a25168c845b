//! The name grammar for tool aliases, model role labels and arg names, and the reserved-name
//! list. The list is the single source of truth: the Lua layer installs exactly these globals.

/// The grammar every alias, role label and arg name follows, as the spec writes it in messages.
pub const NAME_PATTERN: &str = "[A-Za-z][A-Za-z0-9_-]{0,63}";

/// True when `name` matches `[A-Za-z][A-Za-z0-9_-]{0,63}`.
pub fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    match bytes.first() {
        Some(first) if first.is_ascii_alphabetic() => {}
        _ => return false,
    }
    bytes.len() <= 64
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-')
}

/// The Engine globals of a section VM (`ui` and `item` are reserved even where absent).
pub const ENGINE_GLOBALS: &[&str] = &[
    "args",
    "argv",
    "call",
    "compactors",
    "fanout",
    "item",
    "jump",
    "list_from_section",
    "log",
    "messages",
    "models",
    "prose",
    "store",
    "sys",
    "tasks",
    "tools",
    "ui",
    "untrusted",
    "var",
];

/// The Lua standard-library globals the sandbox keeps.
pub const STDLIB_GLOBALS: &[&str] = &[
    "assert",
    "error",
    "getmetatable",
    "ipairs",
    "math",
    "next",
    "pairs",
    "pcall",
    "select",
    "setmetatable",
    "string",
    "table",
    "tonumber",
    "tostring",
    "type",
    "xpcall",
    "_G",
    "_VERSION",
];

/// The Lua 5.5 keywords (`global` is new in 5.5).
pub const LUA_KEYWORDS: &[&str] = &[
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "global", "goto",
    "if", "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
];

/// Why a name is reserved; the text is the spec's `{category}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservedCategory {
    /// One of [`ENGINE_GLOBALS`].
    EngineGlobal,
    /// One of [`STDLIB_GLOBALS`].
    StdlibGlobal,
    /// One of [`LUA_KEYWORDS`].
    Keyword,
}

impl ReservedCategory {
    /// The category as the reserved-name message words it.
    pub fn describe(self) -> &'static str {
        match self {
            ReservedCategory::EngineGlobal => "an Engine global",
            ReservedCategory::StdlibGlobal => "a Lua standard-library global",
            ReservedCategory::Keyword => "a Lua keyword",
        }
    }
}

/// The category of a reserved name (exact, case-sensitive match), or `None`.
pub fn reserved_category(name: &str) -> Option<ReservedCategory> {
    if ENGINE_GLOBALS.contains(&name) {
        Some(ReservedCategory::EngineGlobal)
    } else if STDLIB_GLOBALS.contains(&name) {
        Some(ReservedCategory::StdlibGlobal)
    } else if LUA_KEYWORDS.contains(&name) {
        Some(ReservedCategory::Keyword)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar_accepts_spec_examples() {
        for name in ["a", "A", "search", "web_fetch", "web-fetch2", "use_mcp"] {
            assert!(is_valid_name(name), "{name}");
        }
        assert!(is_valid_name(&"a".repeat(64)));
    }

    #[test]
    fn grammar_rejects_bad_names() {
        for name in ["", "1ask", "_query", "my.role", "é", "a b", "-x"] {
            assert!(!is_valid_name(name), "{name}");
        }
        assert!(!is_valid_name(&"a".repeat(65)));
    }

    #[test]
    fn reserved_names_are_exact_and_case_sensitive() {
        assert_eq!(
            reserved_category("store"),
            Some(ReservedCategory::EngineGlobal)
        );
        assert_eq!(
            reserved_category("pairs"),
            Some(ReservedCategory::StdlibGlobal)
        );
        assert_eq!(reserved_category("global"), Some(ReservedCategory::Keyword));
        assert_eq!(reserved_category("end"), Some(ReservedCategory::Keyword));
        for ordinary in ["Store", "stores", "my_argv", "writer"] {
            assert_eq!(reserved_category(ordinary), None, "{ordinary}");
        }
    }
}

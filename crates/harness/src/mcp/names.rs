//! The rule that turns an MCP server's tool names into tool-path segments.
//!
//! A tool path segment allows only `a-z 0-9 - _ .` (chapter 12), while MCP tool names are
//! free text (`getTinyImage`, `read file`, `list-tools`). The rule, documented in
//! `docs/mcp.md` and shown by `promptforge mcp tools NAME`:
//!
//! 1. An ASCII uppercase letter becomes lowercase, with a `_` before it when it follows a
//!    lowercase letter or a digit (`getTinyImage` becomes `get_tiny_image`).
//! 2. Every other character outside `a-z 0-9 - _ .` becomes `_`.
//! 3. A name left empty becomes `_`.
//! 4. When two tools of one server map to the same segment, the later one (in the server's
//!    order) takes the first free `NAME.2`, `NAME.3`, ...
//!
//! A name that already is a valid segment is kept as it is.

use std::collections::BTreeSet;

/// The segment one MCP tool name maps to (rules 1 to 3).
pub fn segment_for(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    let mut previous: Option<char> = None;
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            if previous.is_some_and(|p| p.is_ascii_lowercase() || p.is_ascii_digit()) {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else if c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.') {
            out.push(c);
        } else {
            out.push('_');
        }
        previous = Some(c);
    }
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// Whether `text` is a valid tool-path segment.
pub fn is_segment(text: &str) -> bool {
    !text.is_empty()
        && text.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
        })
}

/// The segments for a server's tool names, in the server's order (rule 4 included).
pub fn segments_for<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut taken: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    for name in names {
        let base = segment_for(name);
        let mut candidate = base.clone();
        let mut n = 2u32;
        while taken.contains(&candidate) {
            candidate = format!("{base}.{n}");
            n += 1;
        }
        taken.insert(candidate.clone());
        out.push(candidate);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_segments_are_kept() {
        for name in ["echo", "read_file", "list-directory", "v1.2", "add"] {
            assert_eq!(segment_for(name), name);
        }
    }

    #[test]
    fn camel_case_becomes_snake_case() {
        assert_eq!(segment_for("getTinyImage"), "get_tiny_image");
        assert_eq!(segment_for("printEnv"), "print_env");
        assert_eq!(segment_for("v2Tool"), "v2_tool");
        assert_eq!(segment_for("HTTPGet"), "httpget");
        assert_eq!(segment_for("Echo"), "echo");
    }

    #[test]
    fn other_characters_become_underscores() {
        assert_eq!(segment_for("read file"), "read_file");
        assert_eq!(segment_for("a/b:c"), "a_b_c");
        assert_eq!(segment_for("café"), "caf_");
        assert_eq!(segment_for(""), "_");
    }

    #[test]
    fn collisions_take_numbered_names_in_server_order() {
        assert_eq!(
            segments_for(["getSum", "get_sum", "get-sum", "get_sum.2"]),
            ["get_sum", "get_sum.2", "get-sum", "get_sum.2.2"]
        );
    }

    #[test]
    fn every_mapped_name_is_a_segment() {
        for name in ["getTinyImage", "a b", "ÄÖ", "", "x.Y-z", "tool\n"] {
            assert!(is_segment(&segment_for(name)), "{name:?}");
        }
    }
}

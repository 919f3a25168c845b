//! Deriving `argv` from the argument string under the prompt's declaration (chapter 06).

use promptforge_syntax::frontmatter::ArgsDecl;
use serde_json::{Map, Value as Json};

/// The chain's input for an argument string. Under the default declaration (no `args:` key)
/// the whole string is wrapped, unparsed, as `argv.prose`; under any explicit declaration it
/// is parsed as JSON, and a string that is not JSON (or is `null`) gives nil (`Json::Null`).
/// Declarations are advertised, never enforced.
pub fn derive_argv(decl: &ArgsDecl, args: &str) -> Json {
    if !decl.explicit {
        let mut wrapped = Map::new();
        wrapped.insert("prose".to_owned(), Json::String(args.to_owned()));
        return Json::Object(wrapped);
    }
    serde_json::from_str(args).unwrap_or(Json::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn default_declaration_wraps_the_whole_string() {
        let decl = ArgsDecl::implicit_default();
        assert_eq!(
            derive_argv(&decl, "hello there"),
            json!({"prose": "hello there"})
        );
        assert_eq!(derive_argv(&decl, ""), json!({"prose": ""}));
        assert_eq!(
            derive_argv(&decl, "{\"a\":1}"),
            json!({"prose": "{\"a\":1}"})
        );
    }

    #[test]
    fn explicit_declaration_parses_json() {
        let decl = ArgsDecl {
            explicit: true,
            args: Vec::new(),
        };
        assert_eq!(
            derive_argv(&decl, "{\"query\":\"papers\"}"),
            json!({"query": "papers"})
        );
        assert_eq!(derive_argv(&decl, "42"), json!(42));
        assert_eq!(derive_argv(&decl, "true"), json!(true));
        assert_eq!(derive_argv(&decl, "not json"), Json::Null);
        assert_eq!(derive_argv(&decl, "null"), Json::Null);
        assert_eq!(derive_argv(&decl, ""), Json::Null);
    }
}

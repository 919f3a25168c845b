//! Parsing never panics, whatever the input: arbitrary text, and prompt-shaped text built from
//! the grammar's own pieces so the interesting paths are reached.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use promptforge_syntax::Prompt;
use proptest::prelude::*;

fn piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "---\n",
        "# T\n",
        "## A\n",
        "### B\n",
        "#### C\n",
        "```lua\n",
        "```lua shared\n",
        "```\n",
        "````\n",
        "```text\n",
        "- item\n",
        "-\n",
        "1. one\n",
        "prose line\n",
        "\n",
        "===\n",
        "<!--\n",
        "-->\n",
        "return 1\n",
        "return (\n",
        "name: x\n",
        "description: y\n",
        "promptforge: 0\n",
        "tools:\n",
        "  a: b/c/d\n",
        "models:\n",
        "  writer: {}\n",
        "args:\n",
        "  n:\n",
        "    type: integer\n",
        "\r\n",
        "\u{feff}",
        "  ",
        "#",
        "`",
        "{{ var.x }}",
        "é",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_text_never_panics(text in ".{0,400}") {
        agree(&text);
    }

    #[test]
    fn prompt_shaped_text_never_panics(pieces in prop::collection::vec(piece(), 0..60)) {
        let text: String = pieces.concat();
        agree(&text);
        let with_header = format!("---\nname: p\ndescription: d\npromptforge: 0\n---\n{text}");
        agree(&with_header);
    }
}

/// `check` never panics and agrees with `parse`: the same prompt when clean, and otherwise
/// among its problems the one `parse` reports.
fn agree(text: &str) {
    match (Prompt::parse(text), Prompt::check(text)) {
        (Ok(parsed), Ok(checked)) => assert_eq!(parsed, checked),
        (Err(first), Err(problems)) => assert!(problems.contains(&first), "{first:?} {problems:?}"),
        (parsed, checked) => panic!("parse {parsed:?} but check {checked:?}"),
    }
}

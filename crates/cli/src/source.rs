//! Reading prompt files and locating parse failures for display.

use std::path::Path;

use promptforge_syntax::{ParseError, ParseErrorKind};

/// Read a prompt file as UTF-8 text, with an error message fit to show the user.
pub fn read_prompt(path: &Path) -> Result<String, String> {
    promptforge_harness::limits::read_capped_text(
        path,
        promptforge_harness::limits::PROMPT_FILE_CAP,
    )
}

/// The line and column to show beside a parse failure. Lua compile failures carry no separate
/// location (their position is inside the compiler's diagnostic), so for display the fault line
/// is read back out of the `[string "..."]:N:` marker.
pub fn display_location(err: &ParseError) -> Option<(u32, u32)> {
    if let Some(line) = err.line {
        return Some((line, err.column.unwrap_or(1)));
    }
    if err.kind == ParseErrorKind::Lua {
        let after = err.message.split("\"]:").nth(1)?;
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        return digits.parse().ok().map(|line| (line, 1));
    }
    None
}

/// A parse failure as one line for people: `FILE:LINE:COL: error[KIND]: message` (the location
/// left out when there is none).
pub fn parse_failure_line(path: &Path, err: &ParseError) -> String {
    let at = display_location(err)
        .map(|(line, col)| format!(":{line}:{col}"))
        .unwrap_or_default();
    format!(
        "{}{at}: error[{}]: {}",
        path.display(),
        err.kind,
        err.message
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lua_fault_line_is_read_from_the_diagnostic() {
        let err = ParseError::new(
            ParseErrorKind::Lua,
            "lua compilation error at section `Check` epilog (line 13): [string \"section `Check` epilog\"]:14: ')' expected near <eof>",
        );
        assert_eq!(display_location(&err), Some((14, 1)));
        let err = ParseError::new(ParseErrorKind::Structure, "prompt requires an H1 title");
        assert_eq!(display_location(&err), None);
    }
}

//! Reading prompt files and locating parse failures for display.

use std::path::Path;

use promptforge_engine::RunError;
use promptforge_syntax::{Block, ParseError, ParseErrorKind, Prompt};

/// Read a prompt file as UTF-8 text, with an error message fit to show the user. `-` is
/// stdin, and a pipe the shell hands over as a path (`<(...)`, which is `/dev/fd/N`) is read
/// too; anything else must be a regular file (a named FIFO or a device elsewhere is refused,
/// so a path can never make the Host block on it).
pub fn read_prompt(path: &Path) -> Result<String, String> {
    if path == Path::new("-") {
        return read_stream(std::io::stdin().lock(), "the prompt on stdin");
    }
    if is_handed_over(path) {
        let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        return read_stream(file, &path.display().to_string());
    }
    promptforge_harness::limits::read_capped_text(
        path,
        promptforge_harness::limits::PROMPT_FILE_CAP,
    )
}

/// The prompt files under `dirs`, sorted: `.md` files, hidden entries, `node_modules` and
/// `target` skipped. (A plain recursive walk: no ignore rules to honour, and it keeps the
/// scan's order and cost obvious.)
pub(crate) fn prompt_files(dirs: &[std::path::PathBuf]) -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>, depth: u32) {
        let Ok(read) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in read.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || name == "node_modules" || name == "target" {
                continue;
            }
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() && depth < 16 => walk(&path, out, depth + 1),
                Ok(t) if t.is_file() && name.ends_with(".md") => out.push(path),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    for dir in dirs {
        if dir.is_file() {
            out.push(dir.clone());
        } else {
            walk(dir, &mut out, 0);
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Whether a Markdown file opens with a frontmatter delimiter: a prompt program, as opposed to
/// a README beside the prompts in a folder.
pub(crate) fn looks_like_a_prompt(text: &str) -> bool {
    text.trim_start_matches('\u{feff}').starts_with("---")
}

/// Whether `path` names one of this process's own open files (`/dev/fd/N`,
/// `/proc/self/fd/N`): what a shell's process substitution passes.
fn is_handed_over(path: &Path) -> bool {
    ["/dev/fd/", "/proc/self/fd/"].iter().any(|prefix| {
        path.to_str()
            .and_then(|p| p.strip_prefix(prefix))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// A prompt read from a stream, capped like a prompt file.
fn read_stream(stream: impl std::io::Read, what: &str) -> Result<String, String> {
    use std::io::Read;
    let cap = promptforge_harness::limits::PROMPT_FILE_CAP;
    let mut bytes = Vec::new();
    stream
        .take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {what}: {e}"))?;
    if bytes.len() as u64 > cap {
        return Err(format!("{what} is larger than {cap} bytes"));
    }
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{what} is not valid UTF-8 (first bad byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })
}

/// The line and column to show beside a parse failure. Lua compile failures carry no separate
/// location (their position is inside the compiler's diagnostic), so for display the fault line
/// is read back out of the `[string "..."]:N:` marker.
pub fn display_location(err: &ParseError) -> Option<(u32, u32)> {
    err.fault_line().map(|line| (line, err.column.unwrap_or(1)))
}

/// Where a problem `check` found is: its line and, when known, the column it starts at
/// (see [`ParseError::span_in`]).
pub fn problem_location(err: &ParseError, text: &str) -> Option<(u32, Option<u32>)> {
    err.span_in(text)
        .map(|(line, columns)| (line, columns.map(|(start, _)| start)))
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

/// The prompt file line (and column, when known) a failed run points at: a parse failure's
/// own location, else the line its location tag or its raise site names.
pub fn run_failure_location(err: &RunError) -> Option<(u32, Option<u32>)> {
    if let Some(line) = err.line {
        return Some((line, err.column));
    }
    if err.parse_kind == Some(ParseErrorKind::Lua) {
        let parse = ParseError::new(ParseErrorKind::Lua, err.message.clone());
        return display_location(&parse).map(|(line, _)| (line, None));
    }
    err.display_line.map(|line| (line, None))
}

/// A failed run's first line for people: `FILE:LINE[:COL]: error[KIND]: message`, FILE as the
/// user typed it, the location left out when there is none. The message is the outcome's.
pub fn run_failure_line(path: &Path, err: &RunError, message: &str) -> String {
    let kind = match err.parse_kind {
        Some(parse_kind) => format!("{}/{parse_kind}", err.kind),
        None => err.kind.to_string(),
    };
    let at = match run_failure_location(err) {
        Some((line, Some(column))) => format!("{}:{line}:{column}: ", path.display()),
        Some((line, None)) => format!("{}:{line}: ", path.display()),
        None => String::new(),
    };
    let tag = crate::ui::paint(&format!("error[{kind}]:"), crate::ui::Tone::Bad);
    format!("{at}{tag} {message}")
}

/// For a placeholder failure (chapter 07's `... [Kind at byte N]`, raised where the block
/// reads `prose`), where the placeholder itself is: `(line, column, placeholder)`. The prose
/// read by the failing block is preferred; otherwise the one prose block holding that
/// placeholder at that byte.
pub fn placeholder_site(
    prompt: &Prompt,
    message: &str,
    failing_line: Option<u32>,
) -> Option<(u32, u32, String)> {
    let tail = message.strip_suffix(']')?;
    let (_, offset) = tail.rsplit_once(" at byte ")?;
    let offset: usize = offset.parse().ok()?;
    let open = message.find("{{")?;
    let shown = &message[open..open + message[open..].find("}}")? + 2];
    let placeholder_at = |text: &str| {
        let rest = text.get(offset..)?;
        let end = rest.find("}}")? + 2;
        rest.starts_with("{{").then(|| rest[..end].to_owned())
    };
    let locate = |prose: &promptforge_syntax::ProseBlock| {
        let placeholder = placeholder_at(&prose.text)?;
        let before = &prose.text[..offset];
        let line = prose.line + u32::try_from(before.matches('\n').count()).ok()?;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = u32::try_from(offset - line_start + 1).ok()?;
        Some((line, column, placeholder))
    };
    let block_lists = std::iter::once(&prompt.h1_blocks)
        .chain(prompt.sections.iter().map(|section| &section.blocks));
    // The prose right before the Lua block the failure points into.
    if let Some(line) = failing_line {
        for blocks in block_lists.clone() {
            for pair in blocks.windows(2) {
                if let [Block::Prose(prose), Block::Lua(region)] = pair {
                    let lines = u32::try_from(region.source.lines().count()).unwrap_or(u32::MAX);
                    let inside = line >= region.first_line
                        && line < region.first_line.saturating_add(lines.max(1));
                    if let (true, Some(site)) = (inside, locate(prose)) {
                        return Some(site);
                    }
                }
            }
        }
    }
    let mut found = block_lists
        .flatten()
        .filter_map(|block| match block {
            Block::Prose(prose) => locate(prose),
            Block::Lua(_) => None,
        })
        .filter(|(_, _, placeholder)| squeeze(placeholder) == squeeze(shown));
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

/// A placeholder without its spaces, to compare the one a message shows with the source's.
fn squeeze(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect()
}

/// The role label an unbound-role failure names (`models.use label "x" is not a bound model
/// role`, and the same for `models.default` and `models.get`).
pub fn unbound_role(message: &str) -> Option<&str> {
    let (before, _) = message.split_once("\" is not a bound model role")?;
    let (_, label) = before.rsplit_once(" label \"")?;
    Some(label)
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
        let text = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\nm\n  print(1\n";
        assert_eq!(problem_location(&err, text), Some((14, Some(10))));
        let err = ParseError::new(
            ParseErrorKind::Lua,
            "lua compilation error at section `A` prologue (line 2): [string \"section `A` prologue\"]:3: syntax error near 'end'",
        );
        assert_eq!(
            problem_location(&err, "x\ny\nlocal x = = end\n"),
            Some((3, Some(13)))
        );
        // A token that occurs twice on the line gives no column.
        assert_eq!(problem_location(&err, "x\ny\nend end\n"), Some((3, None)));
        let err = ParseError::new(ParseErrorKind::Structure, "prompt requires an H1 title");
        assert_eq!(display_location(&err), None);
    }
}

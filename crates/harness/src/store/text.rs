//! Line ranges and numbered reads ("Line ranges and numbered reads", "How bounds apply").

use promptforge_protocol::store::RangeProblem;

/// The lines a ranged read selects: the first line's 1-based number and the lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection<'a> {
    /// The number of the first selected line.
    pub first: u64,
    /// The selected lines, without their line endings.
    pub lines: Vec<&'a str>,
}

/// The file's lines: split at `\n` or `\r\n`, with no empty last line for a final newline.
pub fn split_lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

/// Applies the bound rules in the chapter's fixed order: `start` must be at least 1; a
/// `start` past the last line selects nothing (and `end` is not looked at); an omitted `end`
/// means the last line; an `end` past the last line clamps; only then must `end` not be
/// before `start`.
pub fn select(text: &str, start: i64, end: Option<i64>) -> Result<Selection<'_>, RangeProblem> {
    if start < 1 {
        return Err(RangeProblem::StartBelowOne);
    }
    let lines = split_lines(text);
    let count = u64::try_from(lines.len()).unwrap_or(u64::MAX);
    let first = start.unsigned_abs();
    if first > count {
        return Ok(Selection {
            first,
            lines: Vec::new(),
        });
    }
    let last = match end {
        None => count,
        Some(end) if end < 1 => return Err(RangeProblem::EndBeforeStart),
        Some(end) => end.unsigned_abs().min(count),
    };
    if last < first {
        return Err(RangeProblem::EndBeforeStart);
    }
    let skip = usize::try_from(first - 1).unwrap_or(usize::MAX);
    let take = usize::try_from(last - first + 1).unwrap_or(usize::MAX);
    Ok(Selection {
        first,
        lines: lines.into_iter().skip(skip).take(take).collect(),
    })
}

/// The selected lines joined with `"\n"`, with no trailing newline.
pub fn plain(selection: &Selection<'_>) -> String {
    selection.lines.join("\n")
}

/// The selected lines as `N| text`, the numbers right-aligned to the widest number shown.
pub fn numbered(selection: &Selection<'_>) -> String {
    let Some(count) = u64::try_from(selection.lines.len()).ok().filter(|n| *n > 0) else {
        return String::new();
    };
    let width = (selection.first + count - 1).to_string().len();
    let mut out = String::new();
    for (offset, line) in (0u64..).zip(&selection.lines) {
        if offset > 0 {
            out.push('\n');
        }
        let number = selection.first + offset;
        out.push_str(&format!("{number:>width$}| {line}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "one\ntwo\nthree\n";

    fn read(text: &str, start: i64, end: Option<i64>) -> Result<String, RangeProblem> {
        select(text, start, end).map(|s| plain(&s))
    }

    fn read_numbered(text: &str, start: i64, end: Option<i64>) -> Result<String, RangeProblem> {
        select(text, start, end).map(|s| numbered(&s))
    }

    #[test]
    fn chapter_table() {
        assert_eq!(read(P, 2, None).unwrap(), "two\nthree");
        assert_eq!(read(P, 2, Some(2)).unwrap(), "two");
        assert_eq!(read(P, 1, Some(2)).unwrap(), "one\ntwo");
        assert_eq!(read(P, 2, Some(99)).unwrap(), "two\nthree");
        assert_eq!(read(P, 3, Some(99)).unwrap(), "three");
        assert_eq!(read(P, 99, None).unwrap(), "");
        assert_eq!(read(P, 5, Some(2)).unwrap(), "");
        assert_eq!(read(P, 99, Some(-5)).unwrap(), "");
    }

    #[test]
    fn bound_errors() {
        assert_eq!(read(P, 0, None), Err(RangeProblem::StartBelowOne));
        assert_eq!(read(P, -7, Some(2)), Err(RangeProblem::StartBelowOne));
        assert_eq!(read(P, i64::MIN, None), Err(RangeProblem::StartBelowOne));
        assert_eq!(read(P, 3, Some(2)), Err(RangeProblem::EndBeforeStart));
        assert_eq!(read(P, 1, Some(0)), Err(RangeProblem::EndBeforeStart));
        assert_eq!(
            read(P, 1, Some(i64::MIN)),
            Err(RangeProblem::EndBeforeStart)
        );
        assert_eq!(read(P, 1, Some(i64::MAX)).unwrap(), "one\ntwo\nthree");
        assert_eq!(read(P, i64::MAX, None).unwrap(), "");
        // An empty file reads empty for any valid start, but start is still checked first.
        assert_eq!(read("", 1, None).unwrap(), "");
        assert_eq!(read("", 1, Some(0)).unwrap(), "");
        assert_eq!(read("", 0, None), Err(RangeProblem::StartBelowOne));
        assert_eq!(read_numbered("", 1, None).unwrap(), "");
    }

    #[test]
    fn line_endings() {
        assert_eq!(split_lines("a\r\nb\r\n"), ["a", "b"]);
        assert_eq!(split_lines("a\nb"), ["a", "b"]);
        assert_eq!(split_lines("a\n\nb\n"), ["a", "", "b"]);
        assert_eq!(split_lines("\n"), [""]);
        assert!(split_lines("").is_empty());
        assert_eq!(read("a\r\nb\r\nc", 2, None).unwrap(), "b\nc");
    }

    #[test]
    fn numbering() {
        assert_eq!(read_numbered(P, 2, Some(3)).unwrap(), "2| two\n3| three");
        assert_eq!(read_numbered(P, 2, Some(99)).unwrap(), "2| two\n3| three");
        assert_eq!(read_numbered(P, 99, None).unwrap(), "");
        assert_eq!(
            read_numbered("first\nsecond", 1, None).unwrap(),
            "1| first\n2| second"
        );
        assert_eq!(
            read_numbered("first\nsecond\n", 1, None).unwrap(),
            "1| first\n2| second"
        );
        let hundred: String = (1..=100).map(|i| format!("line{i}\n")).collect();
        assert_eq!(
            read_numbered(&hundred, 99, Some(100)).unwrap(),
            " 99| line99\n100| line100"
        );
        let eighty_five: String = (1..=85).map(|i| format!("line{i}\n")).collect();
        assert_eq!(
            read_numbered(&eighty_five, 84, Some(85)).unwrap(),
            "84| line84\n85| line85"
        );
        let ten: String = (1..=10).map(|i| format!("line{i}\n")).collect();
        let whole = read_numbered(&ten, 1, None).unwrap();
        assert!(whole.starts_with(" 1| line1\n 2| line2"));
        assert!(whole.ends_with("\n10| line10"));
        // Only the widest number shown counts.
        assert_eq!(
            read_numbered(&hundred, 1, Some(2)).unwrap(),
            "1| line1\n2| line2"
        );
        assert_eq!(read_numbered("\n", 1, None).unwrap(), "1| ");
    }
}

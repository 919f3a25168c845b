//! Heading references: the `'## Main'` strings that `list_from_section`, `jump`, `call`,
//! `fanout`, `tasks.spawn` and `tools.allow_tasks` use to name a target section.

use std::fmt;

/// A parsed heading reference: its level (the number of `#` markers) and trimmed name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadingRef {
    /// The number of `#` markers.
    pub level: usize,
    /// The section name after the markers, trimmed.
    pub name: String,
}

impl fmt::Display for HeadingRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", "#".repeat(self.level), self.name)
    }
}

/// Why a heading reference is malformed; `Display` is the spec's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadingRefError {
    /// No `#` markers at all.
    BareName(String),
    /// Markers directly followed by text.
    NoWhitespace {
        /// The run of `#` marks.
        markers: String,
        /// The trimmed reference.
        text: String,
    },
    /// Markers with nothing after them.
    NoName(String),
}

impl fmt::Display for HeadingRefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeadingRefError::BareName(text) => write!(
                f,
                "section heading must include ### markers, got bare name: {text}"
            ),
            HeadingRefError::NoWhitespace { markers, text } => write!(
                f,
                "section heading must have whitespace after the {markers} markers: {text}"
            ),
            HeadingRefError::NoName(text) => write!(f, "section heading has no name: {text}"),
        }
    }
}

impl std::error::Error for HeadingRefError {}

/// Parse a heading reference: `#` markers, whitespace, a non-empty name; surrounding
/// whitespace and whitespace around the name are trimmed. Never reinterpreted.
pub fn parse_heading_ref(text: &str) -> Result<HeadingRef, HeadingRefError> {
    let trimmed = text.trim();
    let markers = trimmed.bytes().take_while(|b| *b == b'#').count();
    if markers == 0 {
        return Err(HeadingRefError::BareName(trimmed.to_owned()));
    }
    let rest = &trimmed[markers..];
    if rest.is_empty() {
        return Err(HeadingRefError::NoName(trimmed.to_owned()));
    }
    if !rest.starts_with(char::is_whitespace) {
        return Err(HeadingRefError::NoWhitespace {
            markers: trimmed[..markers].to_owned(),
            text: trimmed.to_owned(),
        });
    }
    let name = rest.trim();
    if name.is_empty() {
        return Err(HeadingRefError::NoName(trimmed.to_owned()));
    }
    Ok(HeadingRef {
        level: markers,
        name: name.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_trims() {
        let h = parse_heading_ref(" ##  Main ").unwrap();
        assert_eq!((h.level, h.name.as_str()), (2, "Main"));
        assert_eq!(h.to_string(), "## Main");
        assert_eq!(parse_heading_ref("### Worker").unwrap().level, 3);
    }

    #[test]
    fn rejects_with_spec_messages() {
        assert_eq!(
            parse_heading_ref("Main").unwrap_err().to_string(),
            "section heading must include ### markers, got bare name: Main"
        );
        assert_eq!(
            parse_heading_ref("##Main").unwrap_err().to_string(),
            "section heading must have whitespace after the ## markers: ##Main"
        );
        assert_eq!(
            parse_heading_ref("##").unwrap_err().to_string(),
            "section heading has no name: ##"
        );
        assert_eq!(
            parse_heading_ref("  ###   ").unwrap_err().to_string(),
            "section heading has no name: ###"
        );
    }
}

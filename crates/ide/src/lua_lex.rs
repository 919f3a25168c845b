//! Just enough of a Lua lexer to find the literal arguments an editor cares about: names,
//! dots, parentheses, braces, commas and string literals, each with its byte range; comments
//! and everything else are skipped. Written by hand because no maintained Lua crate knows
//! Lua 5.5 and none is needed to read `call('## X')`: a lexer that never fails (unknown bytes
//! are skipped, an unclosed string runs to the end) is what an editor wants on half-typed code.

/// One token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Token {
    /// A name (identifier or keyword).
    Name(String),
    /// A string literal's value (escapes of short strings taken as written, except `\'` and
    /// `\"`), `closed` when its closing quote was found.
    Str { value: String, closed: bool },
    /// One of `.` `:` `(` `)` `{` `}` `,` `[` `]` `=`.
    Punct(char),
    /// Anything else that matters for argument positions (an operator, a number).
    Other,
}

/// A token with the byte range it covers in the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spanned {
    pub token: Token,
    pub start: usize,
    pub end: usize,
}

/// The tokens of `source`, in order.
pub(crate) fn tokens(source: &str) -> Vec<Spanned> {
    let bytes = source.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let start = i;
        match b {
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                i += 2;
                if let Some(level) = long_bracket(bytes, i) {
                    i = skip_long(bytes, i + level + 2, level).1;
                } else {
                    while i < bytes.len() && bytes[i] != b'\n' {
                        i += 1;
                    }
                }
            }
            b'\'' | b'"' => {
                let (value, closed, end) = short_string(source, i);
                out.push(Spanned {
                    token: Token::Str { value, closed },
                    start,
                    end,
                });
                i = end;
            }
            b'[' if long_bracket(bytes, i).is_some() => {
                let level = long_bracket(bytes, i).unwrap_or(0);
                let open_end = i + level + 2;
                let (content_end, end) = skip_long(bytes, open_end, level);
                let mut body = &source[open_end.min(content_end)..content_end];
                // A newline right after the opening bracket is not part of the string.
                body = body.strip_prefix('\n').unwrap_or(body);
                out.push(Spanned {
                    token: Token::Str {
                        value: body.to_owned(),
                        closed: end > content_end,
                    },
                    start,
                    end,
                });
                i = end;
            }
            b if b.is_ascii_alphabetic() || b == b'_' || b >= 0x80 => {
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] >= 0x80)
                {
                    i += 1;
                }
                out.push(Spanned {
                    token: Token::Name(source[start..i].to_owned()),
                    start,
                    end: i,
                });
            }
            b'.' | b':' | b'(' | b')' | b'{' | b'}' | b',' | b'[' | b']' | b'=' => {
                i += 1;
                // `..` and `...` and `::` and `==` are operators, not the punctuation above.
                let doubled = matches!(b, b'.' | b':' | b'=') && bytes.get(i) == Some(&b);
                if doubled {
                    while i < bytes.len() && bytes[i] == b {
                        i += 1;
                    }
                    out.push(Spanned {
                        token: Token::Other,
                        start,
                        end: i,
                    });
                } else {
                    out.push(Spanned {
                        token: Token::Punct(char::from(b)),
                        start,
                        end: i,
                    });
                }
            }
            b if b.is_ascii_whitespace() => i += 1,
            _ => {
                i += 1;
                out.push(Spanned {
                    token: Token::Other,
                    start,
                    end: i,
                });
            }
        }
    }
    out
}

/// The level of a long bracket opening at `i` (`[[` is 0, `[==[` is 2), if one does.
fn long_bracket(bytes: &[u8], i: usize) -> Option<usize> {
    if bytes.get(i) != Some(&b'[') {
        return None;
    }
    let level = bytes[i + 1..].iter().take_while(|b| **b == b'=').count();
    (bytes.get(i + 1 + level) == Some(&b'[')).then_some(level)
}

/// From `from`, the end of a long bracket's content and the end past its closing bracket
/// (both the source's end when it never closes).
fn skip_long(bytes: &[u8], from: usize, level: usize) -> (usize, usize) {
    let mut i = from;
    while i < bytes.len() {
        if bytes[i] == b']'
            && bytes[i + 1..].iter().take(level).all(|b| *b == b'=')
            && bytes.get(i + 1 + level) == Some(&b']')
        {
            return (i, i + level + 2);
        }
        i += 1;
    }
    (bytes.len(), bytes.len())
}

/// A short string opening at `i`: its value, whether it closed, and the end past it. It ends
/// at its quote or at the end of its line.
fn short_string(source: &str, i: usize) -> (String, bool, usize) {
    let bytes = source.as_bytes();
    let quote = bytes[i];
    let mut value = Vec::new();
    let mut j = i + 1;
    while j < bytes.len() {
        match bytes[j] {
            b if b == quote => return (String::from_utf8_lossy(&value).into_owned(), true, j + 1),
            b'\n' => break,
            b'\\' if matches!(bytes.get(j + 1), Some(b'\'' | b'"' | b'\\')) => {
                value.push(bytes[j + 1]);
                j += 2;
            }
            b => {
                value.push(b);
                j += 1;
            }
        }
    }
    (String::from_utf8_lossy(&value).into_owned(), false, j)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(source: &str) -> Vec<Token> {
        tokens(source).into_iter().map(|t| t.token).collect()
    }

    #[test]
    fn strings_names_and_punctuation_with_their_ranges() {
        let t = tokens("call('## A') -- call('## B')\nx = [[## C]]");
        assert_eq!(
            t.iter().map(|t| t.token.clone()).collect::<Vec<_>>(),
            [
                Token::Name("call".into()),
                Token::Punct('('),
                Token::Str {
                    value: "## A".into(),
                    closed: true
                },
                Token::Punct(')'),
                Token::Name("x".into()),
                Token::Punct('='),
                Token::Str {
                    value: "## C".into(),
                    closed: true
                },
            ]
        );
        assert_eq!((t[2].start, t[2].end), (5, 11));
    }

    #[test]
    fn comments_operators_and_unclosed_strings() {
        assert_eq!(
            kinds("--[==[ call('x') ]==] a..b 'open"),
            [
                Token::Name("a".into()),
                Token::Other,
                Token::Name("b".into()),
                Token::Str {
                    value: "open".into(),
                    closed: false
                },
            ]
        );
        assert_eq!(
            kinds(r#""a\"b""#),
            [Token::Str {
                value: "a\"b".into(),
                closed: true
            }]
        );
        assert!(tokens("").is_empty());
        assert_eq!(
            kinds("[=[x"),
            [Token::Str {
                value: "x".into(),
                closed: false
            }]
        );
    }
}

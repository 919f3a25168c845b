//! Server-sent events framing (the WHATWG `text/event-stream` format), in linear time.
//!
//! Written by hand because the parser we used before rescanned its whole buffer for every
//! chunk, so one long `data:` line (a big reply in one event) cost quadratic time: 85 s for a
//! 15 MiB line. Here every byte is looked at a bounded number of times: a chunk is scanned
//! only from where the previous scan stopped, and a finished line is cut off the buffer.

use futures_util::stream::{self, Stream, StreamExt};

use super::error::ModelError;

/// One dispatched event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field (empty when the event named none).
    pub(crate) event: String,
    /// The `data:` lines, joined with `\n`.
    pub(crate) data: String,
}

impl Event {
    /// An event with this name (possibly empty) and data.
    pub(crate) fn new(event: &str, data: String) -> Self {
        Event {
            event: event.to_owned(),
            data,
        }
    }
}

/// The line-and-field state of a stream.
#[derive(Debug, Default)]
pub(crate) struct Parser {
    /// Bytes not yet ending in a line break.
    pending: Vec<u8>,
    /// How far `pending` has been scanned for a line break.
    scanned: usize,
    /// A `\r` ended the last line; a `\n` right after it belongs to that break.
    after_cr: bool,
    event: String,
    data: String,
    has_data: bool,
    /// Bytes seen so far (a byte-order mark is dropped only at the very start).
    seen: usize,
}

impl Parser {
    /// Feed a chunk; finished events are pushed to `out`.
    pub(crate) fn feed(&mut self, chunk: &[u8], out: &mut Vec<Event>) -> Result<(), ModelError> {
        let mut chunk = chunk;
        // A leading UTF-8 byte-order mark is not part of the stream (it may arrive split).
        while self.seen < 3 && !chunk.is_empty() {
            let bom = [0xEF, 0xBB, 0xBF];
            if chunk[0] != bom[self.seen] {
                if self.seen > 0 {
                    // Not a mark after all: put back what was held.
                    let held = bom[..self.seen].to_vec();
                    self.seen = 3;
                    self.feed(&held, out)?;
                }
                self.seen = 3;
                break;
            }
            self.seen += 1;
            chunk = &chunk[1..];
        }
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = chunk.strip_prefix(b"\n") {
                chunk = rest;
            }
        }
        self.pending.extend_from_slice(chunk);
        let mut start = 0;
        let mut i = self.scanned;
        while i < self.pending.len() {
            let byte = self.pending[i];
            if byte == b'\n' || byte == b'\r' {
                let line = std::str::from_utf8(&self.pending[start..i])
                    .map_err(|_| ModelError::malformed("the reply stream is not valid UTF-8"))?
                    .to_owned();
                self.line(&line, out);
                if byte == b'\r' {
                    if i + 1 < self.pending.len() {
                        if self.pending[i + 1] == b'\n' {
                            i += 1;
                        }
                    } else {
                        self.after_cr = true;
                    }
                }
                start = i + 1;
            }
            i += 1;
        }
        self.pending.drain(..start);
        self.scanned = self.pending.len();
        Ok(())
    }

    /// The end of the stream: a last event without its blank line is dispatched too.
    pub(crate) fn finish(&mut self, out: &mut Vec<Event>) -> Result<(), ModelError> {
        if !self.pending.is_empty() {
            let line = std::str::from_utf8(&self.pending)
                .map_err(|_| ModelError::malformed("the reply stream is not valid UTF-8"))?
                .to_owned();
            self.pending.clear();
            self.line(&line, out);
        }
        self.dispatch(out);
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<Event>) {
        if self.has_data {
            out.push(Event {
                event: std::mem::take(&mut self.event),
                data: std::mem::take(&mut self.data),
            });
        }
        self.event.clear();
        self.data.clear();
        self.has_data = false;
    }

    fn line(&mut self, line: &str, out: &mut Vec<Event>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = value.to_owned(),
            _ => {}
        }
    }
}

/// The events of a byte stream whose failures are already classified; ends after an error.
pub(crate) fn events<S, B>(bytes: S) -> impl Stream<Item = Result<Event, ModelError>> + Send
where
    S: Stream<Item = Result<B, ModelError>> + Send + Unpin + 'static,
    B: AsRef<[u8]> + Send,
{
    let state = (
        bytes,
        Parser::default(),
        std::collections::VecDeque::new(),
        false,
    );
    stream::unfold(Some(state), |state| async move {
        let (mut bytes, mut parser, mut ready, mut ended) = state?;
        loop {
            if let Some(event) = ready.pop_front() {
                return Some((Ok(event), Some((bytes, parser, ready, ended))));
            }
            if ended {
                return None;
            }
            let mut out = Vec::new();
            let fed = match bytes.next().await {
                Some(Ok(chunk)) => parser.feed(chunk.as_ref(), &mut out),
                Some(Err(err)) => return Some((Err(err), None)),
                None => {
                    ended = true;
                    parser.finish(&mut out)
                }
            };
            if let Err(err) = fed {
                return Some((Err(err), None));
            }
            ready.extend(out);
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    fn parse(chunks: &[&[u8]]) -> Vec<Event> {
        let mut parser = Parser::default();
        let mut out = Vec::new();
        for chunk in chunks {
            parser.feed(chunk, &mut out).unwrap();
        }
        parser.finish(&mut out).unwrap();
        out
    }

    fn event(event: &str, data: &str) -> Event {
        Event {
            event: event.into(),
            data: data.into(),
        }
    }

    #[test]
    fn fields_lines_and_breaks() {
        assert_eq!(
            parse(&[b"event: a\ndata: 1\ndata:2\n\n: comment\ndata: x\r\n\r\ndata: y\r\rdata: z"]),
            vec![
                event("a", "1\n2"),
                event("", "x"),
                event("", "y"),
                event("", "z")
            ]
        );
        // The same stream split at every byte.
        let whole = b"event: a\ndata: 1\ndata:2\n\n: c\ndata: x\r\n\r\ndata: y\r\r";
        let bytes: Vec<&[u8]> = whole.chunks(1).collect();
        assert_eq!(
            parse(&bytes),
            vec![event("a", "1\n2"), event("", "x"), event("", "y")]
        );
        assert_eq!(parse(&[b"id: 1\nretry: 5\n\n"]), vec![]);
        assert_eq!(
            parse(&[b"\xEF\xBB", b"\xBFdata: b\n\n"]),
            vec![event("", "b")]
        );
        assert_eq!(
            parse(&[b"data: \xEF\xBB\xBF\n\n"]),
            vec![event("", "\u{feff}")]
        );
        assert_eq!(parse(&[b"data\n\n"]), vec![event("", "")]);
        let mut parser = Parser::default();
        assert!(parser.feed(b"data: \xff\n", &mut Vec::new()).is_err());
    }

    #[test]
    fn a_long_line_in_many_chunks_is_linear() {
        let line = vec![b'x'; 16 << 20];
        let mut parser = Parser::default();
        let mut out = Vec::new();
        parser.feed(b"data: ", &mut out).unwrap();
        let started = std::time::Instant::now();
        for chunk in line.chunks(8192) {
            parser.feed(chunk, &mut out).unwrap();
        }
        parser.feed(b"\n\n", &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].data.len(), 16 << 20);
        // Quadratic rescanning would take minutes; linear work takes milliseconds.
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }
}

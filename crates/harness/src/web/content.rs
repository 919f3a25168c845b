//! What a fetch does with a response's bytes: the content-type classes, charset decoding,
//! decompression under the byte cap, and HTML extraction to Markdown (chapter 13, "What a
//! fetch returns", "Length and size limits").

use std::io::Write;

use encoding_rs::Encoding;

/// How a response's content type is processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// `text/html`, `application/xhtml+xml`: extracted to Markdown.
    Html,
    /// JSON and XML: returned whole, refused whole over the cap.
    Structured,
    /// Any other `text/*`: returned as is, cut at the cap.
    Flat,
}

/// Why a content type cannot be returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No `Content-Type` header.
    Missing,
    /// A type outside the accepted set, or one that does not parse (quoted verbatim).
    Unsupported(String),
}

/// A response's content type: its class and its declared charset label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContentType {
    pub(crate) class: Class,
    pub(crate) charset: Option<String>,
}

fn is_json_or_xml(name: &str) -> bool {
    name.eq_ignore_ascii_case("json") || name.eq_ignore_ascii_case("xml")
}

/// Classify a `Content-Type` header value.
pub(crate) fn classify(header: Option<&str>) -> Result<ContentType, Refused> {
    let Some(raw) = header else {
        return Err(Refused::Missing);
    };
    let unsupported = || Refused::Unsupported(raw.trim().to_owned());
    let parsed: mime::Mime = raw.trim().parse().map_err(|_| unsupported())?;
    let (kind, sub) = (parsed.type_(), parsed.subtype());
    let suffix = parsed.suffix().map(|s| s.as_str());
    let structured = is_json_or_xml(sub.as_str()) || suffix.is_some_and(is_json_or_xml);
    let class = if (kind == mime::TEXT && sub == mime::HTML)
        || (kind == mime::APPLICATION && sub == "xhtml" && suffix == Some("xml"))
    {
        Class::Html
    } else if (kind == mime::APPLICATION || kind == mime::TEXT) && structured {
        Class::Structured
    } else if kind == mime::TEXT {
        Class::Flat
    } else {
        return Err(unsupported());
    };
    Ok(ContentType {
        class,
        charset: charset_label(raw),
    })
}

/// The `charset` parameter of a `Content-Type` value as written (quotes removed), since the
/// unknown-charset message quotes it verbatim.
fn charset_label(raw: &str) -> Option<String> {
    raw.split(';').skip(1).find_map(|param| {
        let (name, value) = param.split_once('=')?;
        name.trim().eq_ignore_ascii_case("charset").then(|| {
            let value = value.trim();
            value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value)
                .to_owned()
        })
    })
}

/// The encoding for a declared charset: `Ok(None)` for UTF-8 (or none declared), `Err` with
/// the label for one no encoding answers to.
pub(crate) fn encoding(charset: Option<&str>) -> Result<Option<&'static Encoding>, String> {
    let Some(label) = charset else {
        return Ok(None);
    };
    match Encoding::for_label(label.trim().as_bytes()) {
        Some(enc) if enc == encoding_rs::UTF_8 => Ok(None),
        // Labels of encodings that cannot be decoded safely (ISO-2022-KR, HZ, ...) map to
        // the replacement encoding, which would turn the body into one U+FFFD.
        Some(enc) if enc == encoding_rs::REPLACEMENT => Err(label.to_owned()),
        Some(enc) => Ok(Some(enc)),
        None => Err(label.to_owned()),
    }
}

/// Decode a body: UTF-8 with invalid sequences replaced, or the declared encoding. The header
/// is the only charset source, so a byte-order mark is not consulted.
pub(crate) fn decode(bytes: &[u8], encoding: Option<&'static Encoding>) -> String {
    match encoding {
        None => String::from_utf8_lossy(bytes).into_owned(),
        Some(enc) => enc.decode_without_bom_handling(bytes).0.into_owned(),
    }
}

/// A sink that keeps at most `cap` bytes and notes whether more came.
#[derive(Debug)]
struct CappedSink {
    bytes: Vec<u8>,
    cap: usize,
    over: bool,
}

impl CappedSink {
    fn empty() -> Self {
        CappedSink {
            bytes: Vec::new(),
            cap: 0,
            over: false,
        }
    }
}

impl Write for CappedSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = self.cap - self.bytes.len();
        if buf.len() > room {
            self.bytes.extend_from_slice(&buf[..room]);
            self.over = true;
            // Stop the decoder: nothing past the cap is kept.
            return Err(std::io::Error::other("over the byte cap"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The body's content coding.
enum Decoder {
    Identity(CappedSink),
    Gzip(Box<flate2::write::MultiGzDecoder<CappedSink>>),
    Deflate(Box<flate2::write::ZlibDecoder<CappedSink>>),
    Brotli(Box<brotli::DecompressorWriter<CappedSink>>),
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Decoder::Identity(_) => "Identity",
            Decoder::Gzip(_) => "Gzip",
            Decoder::Deflate(_) => "Deflate",
            Decoder::Brotli(_) => "Brotli",
        })
    }
}

/// Why a body could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// A `Content-Encoding` this tool does not read.
    UnknownCoding,
    /// The compressed stream is corrupt.
    Corrupt,
}

/// Decompresses a body as it arrives and counts the expanded bytes against the cap.
#[derive(Debug)]
pub(crate) struct BodyReader {
    decoder: Decoder,
}

impl BodyReader {
    /// A reader for a body with this `Content-Encoding` and byte cap.
    pub(crate) fn new(coding: Option<&str>, cap: usize) -> Result<Self, DecodeError> {
        let sink = CappedSink {
            bytes: Vec::new(),
            cap,
            over: false,
        };
        let coding = coding.map(|c| c.trim().to_ascii_lowercase());
        let decoder = match coding.as_deref() {
            None | Some("") | Some("identity") => Decoder::Identity(sink),
            Some("gzip") | Some("x-gzip") => {
                Decoder::Gzip(Box::new(flate2::write::MultiGzDecoder::new(sink)))
            }
            Some("deflate") => Decoder::Deflate(Box::new(flate2::write::ZlibDecoder::new(sink))),
            Some("br") => Decoder::Brotli(Box::new(brotli::DecompressorWriter::new(sink, 16384))),
            Some(_) => return Err(DecodeError::UnknownCoding),
        };
        Ok(BodyReader { decoder })
    }

    fn sink(&self) -> &CappedSink {
        match &self.decoder {
            Decoder::Identity(sink) => sink,
            Decoder::Gzip(d) => d.get_ref(),
            Decoder::Deflate(d) => d.get_ref(),
            Decoder::Brotli(d) => d.get_ref(),
        }
    }

    /// Whether the expanded body has passed the cap (read no more).
    pub(crate) fn over_cap(&self) -> bool {
        self.sink().over
    }

    /// Feed one chunk of the body as it came off the wire.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Result<(), DecodeError> {
        let result = match &mut self.decoder {
            Decoder::Identity(sink) => sink.write_all(chunk),
            Decoder::Gzip(d) => d.write_all(chunk),
            Decoder::Deflate(d) => d.write_all(chunk),
            Decoder::Brotli(d) => d.write_all(chunk),
        };
        match result {
            Ok(()) => Ok(()),
            Err(_) if self.over_cap() => Ok(()),
            Err(_) => Err(DecodeError::Corrupt),
        }
    }

    /// The expanded body (at most the cap) and whether more would have come.
    pub(crate) fn finish(self) -> Result<(Vec<u8>, bool), DecodeError> {
        // Flush what the decoder still holds; past the cap its refusal to take more is the
        // expected end, not corruption.
        let (sink, flushed) = match self.decoder {
            Decoder::Identity(sink) => (sink, true),
            Decoder::Gzip(mut d) => {
                let ok = d.try_finish().is_ok();
                (std::mem::replace(d.get_mut(), CappedSink::empty()), ok)
            }
            Decoder::Deflate(mut d) => {
                let ok = d.try_finish().is_ok();
                (std::mem::replace(d.get_mut(), CappedSink::empty()), ok)
            }
            Decoder::Brotli(d) => match d.into_inner() {
                Ok(sink) => (sink, true),
                Err(sink) => (sink, false),
            },
        };
        if !flushed && !sink.over {
            return Err(DecodeError::Corrupt);
        }
        Ok((sink.bytes, sink.over))
    }
}

/// The shortest extracted article kept as `readability` (bytes, after trimming).
const MIN_ARTICLE_BYTES: usize = 100;

/// Tags whose content is never page text.
const SKIPPED_TAGS: [&str; 6] = ["head", "script", "style", "noscript", "template", "svg"];

fn to_markdown(html: &str) -> String {
    let converter = htmd::HtmlToMarkdown::builder()
        .skip_tags(SKIPPED_TAGS.to_vec())
        .build();
    converter
        .convert(html)
        .map(|md| md.trim().to_owned())
        .unwrap_or_default()
}

/// The deepest element nesting handed to the HTML libraries, whose tree walks recurse.
const MAX_NESTING: usize = 2000;
/// The stack of the thread extraction runs on (address space, committed only as used).
const EXTRACT_STACK: usize = 64 * 1024 * 1024;

/// Elements that never hold content, so never nest.
const VOID: [&str; 14] = [
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
    "track", "wbr",
];

/// An upper estimate of a page's element nesting: start tags minus end tags, with void
/// elements, self-closing tags, comments and the insides of `script` and `style` skipped.
/// Hand-written because it must be a cheap linear pre-check that cannot itself recurse; it only
/// decides whether the page is handed to the tree-building libraries at all.
fn nesting_estimate(html: &str) -> usize {
    let bytes = html.as_bytes();
    let (mut depth, mut deepest, mut i) = (0usize, 0usize, 0usize);
    while let Some(offset) = bytes[i..].iter().position(|&b| b == b'<') {
        i += offset + 1;
        if bytes[i..].starts_with(b"!--") {
            i = html[i..].find("-->").map_or(bytes.len(), |e| i + e + 3);
            continue;
        }
        let closing = bytes.get(i) == Some(&b'/');
        let start = if closing { i + 1 } else { i };
        let name_len = bytes[start..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric())
            .count();
        if name_len == 0 || !bytes[start].is_ascii_alphabetic() {
            continue;
        }
        let name = html[start..start + name_len].to_ascii_lowercase();
        let end = html[start..].find('>').map_or(bytes.len(), |e| start + e);
        let self_closing = end > 0 && bytes.get(end - 1) == Some(&b'/');
        i = end.min(bytes.len());
        if closing {
            depth = depth.saturating_sub(1);
        } else if !self_closing && !VOID.contains(&name.as_str()) {
            depth += 1;
            deepest = deepest.max(depth);
            if name == "script" || name == "style" {
                let close = format!("</{name}");
                i = bytes[i..]
                    .windows(close.len())
                    .position(|w| w.eq_ignore_ascii_case(close.as_bytes()))
                    .map_or(bytes.len(), |e| i + e);
            }
        }
    }
    deepest
}

/// The text of a page too deeply nested for the tree walks: its tags dropped.
fn strip_tags(html: &str) -> String {
    let mut text = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                if !text.ends_with(char::is_whitespace) {
                    text.push(' ');
                }
            }
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// [`html_to_text`] on a thread of its own with a large stack, so no page can exhaust the
/// stack of the thread the Host runs on.
pub(crate) async fn html_to_text_isolated(
    html: String,
    url: String,
    raw: bool,
) -> (String, Extraction) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("web-extract".to_owned())
        .stack_size(EXTRACT_STACK)
        .spawn(move || {
            let _ = tx.send(html_to_text(&html, &url, raw));
        });
    if spawned.is_err() {
        return (String::new(), Extraction::RawHtml);
    }
    rx.await.unwrap_or((String::new(), Extraction::RawHtml))
}

/// How an HTML page became text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extraction {
    Readability,
    RawHtml,
    Plain,
}

impl Extraction {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Extraction::Readability => "readability",
            Extraction::RawHtml => "raw-html",
            Extraction::Plain => "plain",
        }
    }
}

/// An HTML page as Markdown: the main article (readability), or the whole document when `raw`
/// is set or the article is under 100 bytes. Never fails; the worst case is empty text.
pub(crate) fn html_to_text(html: &str, url: &str, raw: bool) -> (String, Extraction) {
    if nesting_estimate(html) > MAX_NESTING {
        return (strip_tags(html), Extraction::RawHtml);
    }
    if !raw {
        let article = dom_smoothie::Readability::new(html, Some(url), None)
            .ok()
            .and_then(|mut r| r.parse().ok());
        if let Some(article) = article {
            let text = to_markdown(&article.content);
            if text.len() >= MIN_ARTICLE_BYTES {
                return (text, Extraction::Readability);
            }
        }
    }
    (to_markdown(html), Extraction::RawHtml)
}

/// Cut `text` to at most `max` characters; whether it was cut.
pub(crate) fn cut_chars(text: &mut String, max: usize) -> bool {
    match text.char_indices().nth(max) {
        Some((at, _)) => {
            text.truncate(at);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    fn class(header: &str) -> Result<Class, Refused> {
        classify(Some(header)).map(|c| c.class)
    }

    #[test]
    fn content_types_fall_into_the_chapters_classes() {
        for html in [
            "text/html",
            "text/html; charset=utf-8",
            "application/xhtml+xml",
        ] {
            assert_eq!(class(html), Ok(Class::Html), "{html}");
        }
        for structured in [
            "application/json",
            "application/xml",
            "text/xml",
            "application/ld+json",
            "application/atom+xml",
            "text/json",
            "text/vnd.foo+xml",
        ] {
            assert_eq!(class(structured), Ok(Class::Structured), "{structured}");
        }
        for flat in ["text/plain", "text/markdown", "text/csv", "TEXT/PLAIN"] {
            assert_eq!(class(flat), Ok(Class::Flat), "{flat}");
        }
        for refused in [
            "application/pdf",
            "application/octet-stream",
            "image/svg+xml",
            "image/png",
            "audio/mpeg",
            "video/mp4",
            "application/zip",
            "application/javascript",
        ] {
            assert_eq!(
                class(refused),
                Err(Refused::Unsupported(refused.to_owned())),
                "{refused}"
            );
        }
        assert_eq!(
            class("not a type"),
            Err(Refused::Unsupported("not a type".into()))
        );
        assert_eq!(classify(None), Err(Refused::Missing));
    }

    #[test]
    fn charsets_decode_through_their_encoding() {
        assert_eq!(encoding(None), Ok(None));
        assert_eq!(encoding(Some("UTF-8")), Ok(None));
        let latin1 = encoding(Some("ISO-8859-1")).unwrap();
        assert_eq!(decode(b"caf\xe9", latin1), "café");
        assert_eq!(decode(b"caf\xe9", None), "caf\u{fffd}");
        assert_eq!(
            encoding(Some("not-a-charset")),
            Err("not-a-charset".to_owned())
        );
        assert_eq!(encoding(Some("ISO-2022-KR")), Err("ISO-2022-KR".to_owned()));
        assert_eq!(
            classify(Some("text/plain; Charset=\"X-Odd\""))
                .unwrap()
                .charset,
            Some("X-Odd".to_owned())
        );
        let sjis = encoding(Some("shift_jis")).unwrap();
        assert_eq!(decode(b"\x82\xa0", sjis), "あ");
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn the_cap_counts_expanded_bytes() {
        let big = vec![b'a'; 10_000];
        let mut reader = BodyReader::new(Some("gzip"), 4096).unwrap();
        let packed = gzip(&big);
        assert!(packed.len() < 4096);
        reader.feed(&packed).unwrap();
        let (bytes, over) = reader.finish().unwrap();
        assert_eq!((bytes.len(), over), (4096, true));

        // A bomb: 20 MiB of zeros in a few KiB. Reading stops at the cap, long before the
        // whole stream is inflated, and only the cap's worth is ever kept.
        let bomb = gzip(&vec![0u8; 20 << 20]);
        let mut reader = BodyReader::new(Some("gzip"), 1 << 20).unwrap();
        let mut fed = 0;
        for chunk in bomb.chunks(256) {
            reader.feed(chunk).unwrap();
            fed += chunk.len();
            if reader.over_cap() {
                break;
            }
        }
        assert!(
            reader.over_cap() && fed < bomb.len() / 2,
            "fed {fed} of {}",
            bomb.len()
        );
        assert_eq!(reader.finish().unwrap().0.len(), 1 << 20);

        let mut exact = BodyReader::new(Some("gzip"), 10_000).unwrap();
        exact.feed(&gzip(&big)).unwrap();
        assert_eq!(exact.finish().unwrap(), (big.clone(), false));

        let mut br = Vec::new();
        {
            let mut w = brotli::CompressorWriter::new(&mut br, 4096, 9, 22);
            w.write_all(&big).unwrap();
        }
        let mut reader = BodyReader::new(Some("br"), 100).unwrap();
        reader.feed(&br).unwrap();
        let (bytes, over) = reader.finish().unwrap();
        assert_eq!((bytes.len(), over), (100, true));

        assert_eq!(
            BodyReader::new(Some("zstd"), 10).err(),
            Some(DecodeError::UnknownCoding)
        );
        let mut corrupt = BodyReader::new(Some("gzip"), 100).unwrap();
        let result = corrupt
            .feed(b"not gzip at all")
            .and_then(|()| corrupt.finish().map(|_| ()));
        assert_eq!(result, Err(DecodeError::Corrupt));
    }

    #[test]
    fn nesting_is_estimated_without_recursion() {
        assert_eq!(nesting_estimate("<p>a<br>b<img src=x/></p>"), 1);
        assert_eq!(
            nesting_estimate("<div><script>if (a<b && c<d) {}</script><!-- <x><y> --></div>"),
            2
        );
        let deep = "<div>".repeat(100_000);
        assert_eq!(nesting_estimate(&deep), 100_000);
        let (text, how) = html_to_text(&format!("{deep}deep text"), "https://e.com/", false);
        assert_eq!((text.as_str(), how), ("deep text", Extraction::RawHtml));
        assert_eq!(nesting_estimate("<"), 0);
        assert_eq!(nesting_estimate("<1 <é"), 0);
    }

    #[test]
    fn max_chars_cuts_on_character_boundaries() {
        let mut text = "héllo wörld".to_owned();
        assert!(!cut_chars(&mut text, 11));
        assert!(cut_chars(&mut text, 2));
        assert_eq!(text, "hé");
    }

    #[test]
    fn short_articles_fall_back_to_the_whole_page() {
        let (text, how) = html_to_text(
            "<html><body><nav>Home</nav><p>Hi</p></body></html>",
            "https://e.com/",
            false,
        );
        assert_eq!(how, Extraction::RawHtml);
        assert!(text.contains("Home") && text.contains("Hi"), "{text}");
        let (_, how) = html_to_text("<p>x</p>", "https://e.com/", true);
        assert_eq!(how, Extraction::RawHtml);
        let (text, _) = html_to_text("", "https://e.com/", false);
        assert_eq!(text, "");
    }
}

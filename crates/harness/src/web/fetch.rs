//! The fetch tool's pipeline (chapter 13): arguments, URL admission, the address check on every
//! lookup, pinned requests, manual redirects, status, content type, charset, the byte cap
//! after decompression, extraction, `max_chars`, and the provenance header. Every failure text
//! of the chapter is built here, over whatever [`Network`] is underneath.

use serde_json::Value as Json;
use tokio::time::{Instant, timeout_at};
use url::Url;

use super::content::{self, BodyReader, Class, Extraction, Refused};
use super::network::{BodyError, Lookup, Network, PinnedGet, RequestError, Response};
use super::policy::{FetchPolicy, display_url};
use super::{ToolErrorKind, ToolFailure};

/// A fetch call's arguments, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FetchArgs {
    url: String,
    max_chars: Option<u64>,
    raw: bool,
}

fn invalid(message: impl Into<String>) -> ToolFailure {
    ToolFailure::new(ToolErrorKind::InvalidArguments, message)
}

/// A positive integer, written as an integer or as a float with no fractional part.
fn positive_integer(value: &Json) -> Option<u64> {
    if let Some(n) = value.as_u64() {
        return (n >= 1).then_some(n);
    }
    let f = value.as_f64()?;
    // Saturating: anything past u64 is lowered to the policy limit anyway.
    let n = if f >= u64::MAX as f64 {
        u64::MAX
    } else {
        f as u64
    };
    (f >= 1.0 && f.fract() == 0.0 && f.is_finite()).then_some(n)
}

fn parse_args(args: &Json) -> Result<FetchArgs, ToolFailure> {
    let field = |name: &str| args.get(name).filter(|v| !v.is_null());
    let Some(url) = field("url").and_then(Json::as_str) else {
        return Err(invalid("web_fetch: missing url argument"));
    };
    let max_chars = match field("max_chars") {
        None => None,
        Some(value) => Some(
            positive_integer(value)
                .ok_or_else(|| invalid("web_fetch: max_chars must be a positive integer"))?,
        ),
    };
    let raw = match field("raw") {
        None => false,
        Some(Json::Bool(raw)) => *raw,
        Some(_) => return Err(invalid("web_fetch: raw must be a boolean")),
    };
    Ok(FetchArgs {
        url: url.to_owned(),
        max_chars,
        raw,
    })
}

/// The soft texts a fetch can end with (named failures show the URL without its query).
fn timed_out(url: &Url) -> String {
    format!(
        "request to {} timed out; try again or use a different URL",
        display_url(url)
    )
}

fn body_unreadable(url: &Url) -> String {
    format!(
        "the response body from {} could not be read; try again or use a different URL",
        display_url(url)
    )
}

fn network_error(url: &Url) -> String {
    format!("fetch failed for {url}: network error; try a different URL")
}

fn size_cap(url: &Url, cap: usize) -> String {
    format!(
        "response from {} exceeds the {cap}-byte size cap",
        display_url(url)
    )
}

const REDIRECTS: [u16; 5] = [301, 302, 303, 307, 308];

/// Run one fetch call: `Ok` is the result text (a page under its header, or a soft failure
/// message), `Err` a hard failure.
pub(crate) async fn fetch(
    network: &dyn Network,
    policy: &FetchPolicy,
    args: &Json,
) -> Result<String, ToolFailure> {
    let args = parse_args(args)?;
    let mut url = match policy.admit(&args.url) {
        Ok(url) => url,
        Err(refusal) if refusal.is_hard() => return Err(invalid(refusal.message())),
        Err(refusal) => return Ok(refusal.message()),
    };
    let deadline = Instant::now() + policy.total_timeout;
    let mut hop = 0;
    loop {
        let response = match request(network, policy, &url, deadline).await? {
            Ok(response) => response,
            Err(text) => return Ok(text),
        };
        if REDIRECTS.contains(&response.status)
            && let Some(location) = response.header("location")
        {
            hop += 1;
            match policy.check_redirect(&url, location, hop) {
                Ok(next) => {
                    url = next;
                    continue;
                }
                Err(refusal) => return Ok(refusal),
            }
        }
        return Ok(read_page(response, policy, &url, &args, deadline).await);
    }
}

/// One request of a fetch: resolve, judge every address, then connect only to an allowed one.
/// `Err` is a hard failure; `Ok(Err(text))` a soft one.
async fn request(
    network: &dyn Network,
    policy: &FetchPolicy,
    url: &Url,
    deadline: Instant,
) -> Result<Result<Response, String>, ToolFailure> {
    let host = url.host_str().unwrap_or_default();
    let lookup = match timeout_at(deadline, network.resolve(host)).await {
        Ok(lookup) => lookup,
        Err(_) => return Ok(Err(timed_out(url))),
    };
    let addresses = match lookup {
        Lookup::Failed => return Ok(Err(format!("dns resolution failed for {host}"))),
        Lookup::Addresses(addresses) => addresses,
    };
    let Some(allowed) = policy.allowed_addresses(&addresses) else {
        return Err(invalid(format!("host {host} has no allowed address")));
    };
    // Each allowed address in lookup order, until one answers; a connect limit that ran out
    // on any of them is what the call reports.
    let mut timed = false;
    for address in allowed {
        let get = network.get(PinnedGet {
            url,
            address,
            connect_timeout: policy.connect_timeout,
            user_agent: &policy.user_agent,
        });
        match timeout_at(deadline, get).await {
            Err(_) => return Ok(Err(timed_out(url))),
            Ok(Ok(response)) => return Ok(Ok(response)),
            Ok(Err(RequestError::TimedOut)) => return Ok(Err(timed_out(url))),
            Ok(Err(RequestError::ConnectTimeout)) => timed = true,
            Ok(Err(RequestError::Failed)) => {}
        }
    }
    Ok(Err(if timed {
        timed_out(url)
    } else {
        network_error(url)
    }))
}

/// The final response of a fetch: status, content type, charset, cap, body, text, header.
async fn read_page(
    mut response: Response,
    policy: &FetchPolicy,
    url: &Url,
    args: &FetchArgs,
    deadline: Instant,
) -> String {
    if !(200..300).contains(&response.status) {
        return format!(
            "{} answered HTTP {}; try a different URL",
            display_url(url),
            response.status
        );
    }
    let kind = match content::classify(response.header("content-type")) {
        Ok(kind) => kind,
        Err(Refused::Missing) => {
            return format!(
                "response from {} declared no content type; refusing to guess its format; try a different URL",
                display_url(url)
            );
        }
        Err(Refused::Unsupported(content_type)) => {
            return format!(
                "content type {content_type} from {} cannot be returned as text; try an HTML version of the page or a different URL",
                display_url(url)
            );
        }
    };
    let encoding = match content::encoding(kind.charset.as_deref()) {
        Ok(encoding) => encoding,
        Err(label) => {
            return format!(
                "response from {} declared unknown charset {label}; cannot decode its text",
                display_url(url)
            );
        }
    };
    let whole = kind.class != Class::Flat;
    let declared = response
        .header("content-length")
        .and_then(|v| v.trim().parse::<u64>().ok());
    if whole && declared.is_some_and(|n| n > policy.body_cap as u64) {
        return size_cap(url, policy.body_cap);
    }
    let mut reader = match BodyReader::new(response.header("content-encoding"), policy.body_cap) {
        Ok(reader) => reader,
        Err(_) => return network_error(url),
    };
    loop {
        let chunk = match timeout_at(deadline, response.body.chunk()).await {
            Err(_) | Ok(Err(BodyError::TimedOut | BodyError::Broken)) => {
                return body_unreadable(url);
            }
            Ok(Ok(chunk)) => chunk,
        };
        let Some(chunk) = chunk else { break };
        if reader.feed(&chunk).is_err() {
            return body_unreadable(url);
        }
        if reader.over_cap() {
            break;
        }
    }
    let (bytes, over) = match reader.finish() {
        Ok(done) => done,
        Err(_) => return body_unreadable(url),
    };
    if over && whole {
        return size_cap(url, policy.body_cap);
    }
    let decoded = content::decode(&bytes, encoding);
    let (mut text, extraction) = match kind.class {
        Class::Html => content::html_to_text_isolated(decoded, url.to_string(), args.raw).await,
        Class::Structured | Class::Flat => (decoded, Extraction::Plain),
    };
    let limit = args
        .max_chars
        .map_or(policy.max_chars, |n| {
            usize::try_from(n).unwrap_or(usize::MAX)
        })
        .min(policy.max_chars);
    let cut = content::cut_chars(&mut text, limit);
    format!(
        "url: {url}\ntruncated: {}\nextraction: {}\n\n{text}",
        over || cut,
        extraction.label()
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_are_checked_in_order_with_the_chapters_messages() {
        let message = |args: Json| parse_args(&args).err().map(|f| f.message);
        assert_eq!(
            message(json!({})),
            Some("web_fetch: missing url argument".into())
        );
        assert_eq!(
            message(json!({"url": 3})),
            Some("web_fetch: missing url argument".into())
        );
        for bad in [json!(0), json!(-1), json!(1.5), json!("10"), json!(true)] {
            assert_eq!(
                message(json!({"url": "https://e.com", "max_chars": bad})),
                Some("web_fetch: max_chars must be a positive integer".into())
            );
        }
        assert_eq!(
            message(json!({"url": "https://e.com", "raw": "yes"})),
            Some("web_fetch: raw must be a boolean".into())
        );
        let ok = parse_args(&json!({"url": "u", "max_chars": 5.0, "raw": null})).unwrap();
        assert_eq!((ok.max_chars, ok.raw), (Some(5), false));
        let ok = parse_args(&json!({"url": "u", "max_chars": null, "raw": true})).unwrap();
        assert_eq!((ok.max_chars, ok.raw), (None, true));
    }
}

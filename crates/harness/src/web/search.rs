//! The search tool (chapter 13, "Searching the web" to "Every search failure message"):
//! argument validation, the search backends the Host can be configured with, the response
//! checks, and the result shape the prompt sees.
//!
//! Every backend is a request builder and a mapping of its response to result rows; the
//! request, the 30-second deadline, the size, UTF-8, status and shape checks, and the shaping
//! are shared, so every backend fails with the same messages.

use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value as Json, json};
use tokio::time::{Instant, timeout_at};
use url::Url;

use super::network::{ApiRequest, BodyError, Method, Network};
use super::{ToolErrorKind, ToolFailure};

/// The largest successful response body a search accepts.
pub const RESPONSE_CAP: usize = 262_144;
/// How much of an error body a failure message quotes.
const ERROR_BODY_QUOTE: usize = 2000;
/// Every search's deadline.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A search backend, as `promptforge.toml` configures it (see `docs/web.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchBackend {
    /// A PromptForge gateway: POST `{base}/search` with the arguments as given; the reply is
    /// `{"results": [...]}` in the chapter's row shape.
    Gateway {
        /// The search endpoint.
        url: Url,
        /// The bearer key, if any.
        key: Option<String>,
    },
    /// Brave Search's web search API.
    Brave {
        /// The endpoint (`https://api.search.brave.com/res/v1/web/search`).
        url: Url,
        /// The subscription token.
        key: String,
    },
    /// A SearXNG instance's JSON API (`format=json` must be enabled on the instance).
    Searxng {
        /// The instance's `/search` endpoint.
        url: Url,
        /// A bearer key, for an instance behind one.
        key: Option<String>,
    },
    /// Tavily's search API.
    Tavily {
        /// The endpoint (`https://api.tavily.com/search`).
        url: Url,
        /// The API key.
        key: String,
    },
}

/// A search call's arguments, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SearchArgs {
    /// The arguments object as given (the gateway receives it unchanged).
    given: Map<String, Json>,
    query: String,
    count: Option<u64>,
    freshness: Option<String>,
    country: Option<String>,
    search_lang: Option<String>,
    safesearch: Option<String>,
    include_domains: Vec<String>,
    exclude_domains: Vec<String>,
}

fn invalid(message: impl Into<String>) -> ToolFailure {
    ToolFailure::new(ToolErrorKind::InvalidArguments, message)
}

fn invalid_arguments() -> ToolFailure {
    invalid("web_search: invalid arguments")
}

fn optional_str(args: &Map<String, Json>, name: &str) -> Result<Option<String>, ToolFailure> {
    match args.get(name) {
        None => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid_arguments()),
    }
}

fn optional_list(args: &Map<String, Json>, name: &str) -> Result<Vec<String>, ToolFailure> {
    match args.get(name) {
        None => Ok(Vec::new()),
        Some(Json::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned).ok_or_else(invalid_arguments))
            .collect(),
        Some(_) => Err(invalid_arguments()),
    }
}

fn check_code(value: &Option<String>, name: &str) -> Result<(), ToolFailure> {
    if let Some(code) = value
        && (code.trim().is_empty() || code.chars().count() > 128)
    {
        return Err(invalid(format!(
            "web_search: {name} must be 1..=128 characters"
        )));
    }
    Ok(())
}

fn check_hostnames(list: &[String], name: &str) -> Result<(), ToolFailure> {
    if list.len() > 20 {
        return Err(invalid(format!(
            "web_search: {name} may list at most 20 hostnames"
        )));
    }
    let bad = |h: &String| {
        h.trim().is_empty()
            || h.chars().count() > 128
            || h.chars()
                .any(|c| c == '/' || c.is_whitespace() || c.is_control())
    };
    if list.iter().any(bad) {
        return Err(invalid(format!(
            "web_search: {name} contains an invalid hostname"
        )));
    }
    Ok(())
}

const FIELDS: [&str; 8] = [
    "query",
    "count",
    "freshness",
    "country",
    "search_lang",
    "safesearch",
    "include_domains",
    "exclude_domains",
];

/// Check a search call's arguments: the schema first (field names, JSON types, the enumerated
/// values: `web_search: invalid arguments`), then each field's rule in table order.
pub(crate) fn parse_args(args: &Json) -> Result<SearchArgs, ToolFailure> {
    let Some(given) = args.as_object() else {
        return Err(invalid_arguments());
    };
    if given.keys().any(|k| !FIELDS.contains(&k.as_str())) {
        return Err(invalid_arguments());
    }
    let Some(Json::String(query)) = given.get("query") else {
        return Err(invalid_arguments());
    };
    // An integer, or an integral float (a Lua float such as 5.0); negative and fractional
    // values break the schema, and the range is checked with the other rules below.
    let count = match given.get("count") {
        None => None,
        Some(value) => {
            let n = value.as_f64().ok_or_else(invalid_arguments)?;
            if value.as_i64().is_none() && value.as_u64().is_none() && n.fract() != 0.0 {
                return Err(invalid_arguments());
            }
            if value.as_i64().is_some_and(|i| i < 0) || n < 0.0 {
                return Err(invalid_arguments());
            }
            // Saturating: anything past u64 is over the range anyway.
            Some(value.as_u64().unwrap_or(if n >= u64::MAX as f64 {
                u64::MAX
            } else {
                n as u64
            }))
        }
    };
    let freshness = optional_str(given, "freshness")?;
    if freshness
        .as_deref()
        .is_some_and(|f| !["pd", "pw", "pm", "py"].contains(&f))
    {
        return Err(invalid_arguments());
    }
    let safesearch = optional_str(given, "safesearch")?;
    if safesearch
        .as_deref()
        .is_some_and(|s| !["off", "moderate", "strict"].contains(&s))
    {
        return Err(invalid_arguments());
    }
    let country = optional_str(given, "country")?;
    let search_lang = optional_str(given, "search_lang")?;
    let include_domains = optional_list(given, "include_domains")?;
    let exclude_domains = optional_list(given, "exclude_domains")?;
    if query.trim().is_empty() {
        return Err(invalid("web_search: query must not be empty"));
    }
    if query.chars().count() > 400 {
        return Err(invalid("web_search: query exceeds 400 characters"));
    }
    if count.is_some_and(|c| !(1..=20).contains(&c)) {
        return Err(invalid("web_search: count must be between 1 and 20"));
    }
    check_code(&country, "country")?;
    check_code(&search_lang, "search_lang")?;
    check_hostnames(&include_domains, "include_domains")?;
    check_hostnames(&exclude_domains, "exclude_domains")?;
    Ok(SearchArgs {
        given: given.clone(),
        query: query.clone(),
        count,
        freshness,
        country,
        search_lang,
        safesearch,
        include_domains,
        exclude_domains,
    })
}

fn transport(message: &str) -> ToolFailure {
    ToolFailure::new(ToolErrorKind::Transport, format!("web_search: {message}"))
}

fn backend(message: impl AsRef<str>) -> ToolFailure {
    ToolFailure::new(
        ToolErrorKind::Backend,
        format!("web_search: {}", message.as_ref()),
    )
}

fn malformed() -> ToolFailure {
    backend("malformed search response")
}

/// An error body as a failure message quotes it: control characters escaped so the message
/// stays on one line, and cut to at most 2000 bytes of the escaped text (never inside a
/// character or an escape).
fn quote_error_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut quoted = String::new();
    for c in text.chars() {
        let piece = match c {
            '\n' => "\\n".to_owned(),
            '\r' => "\\r".to_owned(),
            '\t' => "\\t".to_owned(),
            c if c.is_control() => format!("\\u{{{:04x}}}", c as u32),
            c => c.to_string(),
        };
        if quoted.len() + piece.len() > ERROR_BODY_QUOTE {
            break;
        }
        quoted.push_str(&piece);
    }
    if quoted.is_empty() {
        "(empty body)".to_owned()
    } else {
        quoted
    }
}

fn freshness_word(code: &str) -> &'static str {
    match code {
        "pd" => "day",
        "pw" => "week",
        "pm" => "month",
        _ => "year",
    }
}

/// The query with `site:` operators for backends that take domain filters in the query.
fn query_with_sites(args: &SearchArgs) -> String {
    let mut q = args.query.clone();
    if !args.include_domains.is_empty() {
        let sites: Vec<String> = args
            .include_domains
            .iter()
            .map(|d| format!("site:{d}"))
            .collect();
        q.push_str(&format!(" ({})", sites.join(" OR ")));
    }
    for d in &args.exclude_domains {
        q.push_str(&format!(" -site:{d}"));
    }
    q
}

impl SearchBackend {
    fn request(&self, args: &SearchArgs) -> Result<ApiRequest, ToolFailure> {
        let mut headers = vec![("accept".to_owned(), "application/json".to_owned())];
        let request = match self {
            SearchBackend::Gateway { url, key } => {
                if let Some(key) = key {
                    headers.push(("authorization".to_owned(), format!("Bearer {key}")));
                }
                ApiRequest {
                    method: Method::Post,
                    url: url.clone(),
                    headers,
                    body: Some(
                        serde_json::to_vec(&args.given).map_err(|_| transport("request failed"))?,
                    ),
                }
            }
            SearchBackend::Brave { url, key } => {
                headers.push(("x-subscription-token".to_owned(), key.clone()));
                let mut url = url.clone();
                {
                    let mut q = url.query_pairs_mut();
                    q.append_pair("q", &query_with_sites(args));
                    if let Some(count) = args.count {
                        q.append_pair("count", &count.to_string());
                    }
                    for (name, value) in [
                        ("freshness", &args.freshness),
                        ("country", &args.country),
                        ("search_lang", &args.search_lang),
                        ("safesearch", &args.safesearch),
                    ] {
                        if let Some(value) = value {
                            q.append_pair(name, value);
                        }
                    }
                    q.append_pair("extra_snippets", "true");
                }
                ApiRequest {
                    method: Method::Get,
                    url,
                    headers,
                    body: None,
                }
            }
            SearchBackend::Searxng { url, key } => {
                if let Some(key) = key {
                    headers.push(("authorization".to_owned(), format!("Bearer {key}")));
                }
                let mut url = url.clone();
                {
                    let mut q = url.query_pairs_mut();
                    q.append_pair("q", &query_with_sites(args));
                    q.append_pair("format", "json");
                    if let Some(f) = &args.freshness {
                        q.append_pair("time_range", freshness_word(f));
                    }
                    if let Some(lang) = &args.search_lang {
                        q.append_pair("language", lang);
                    }
                    if let Some(s) = &args.safesearch {
                        let level = match s.as_str() {
                            "off" => "0",
                            "moderate" => "1",
                            _ => "2",
                        };
                        q.append_pair("safesearch", level);
                    }
                }
                ApiRequest {
                    method: Method::Get,
                    url,
                    headers,
                    body: None,
                }
            }
            SearchBackend::Tavily { url, key } => {
                headers.push(("authorization".to_owned(), format!("Bearer {key}")));
                let mut body = json!({"query": args.query});
                if let Some(count) = args.count {
                    body["max_results"] = json!(count);
                }
                if let Some(f) = &args.freshness {
                    body["time_range"] = json!(freshness_word(f));
                }
                if let Some(country) = &args.country {
                    body["country"] = json!(country);
                }
                if !args.include_domains.is_empty() {
                    body["include_domains"] = json!(args.include_domains);
                }
                if !args.exclude_domains.is_empty() {
                    body["exclude_domains"] = json!(args.exclude_domains);
                }
                ApiRequest {
                    method: Method::Post,
                    url: url.clone(),
                    headers,
                    body: Some(serde_json::to_vec(&body).map_err(|_| transport("request failed"))?),
                }
            }
        };
        Ok(request)
    }

    /// The result rows of a successful response, mapped to the chapter's field names.
    fn rows(&self, reply: &Json) -> Option<Vec<Json>> {
        match self {
            SearchBackend::Gateway { .. } => reply.get("results")?.as_array().cloned(),
            SearchBackend::Brave { .. } => {
                let results = reply.get("web")?.get("results")?.as_array()?;
                Some(
                    results
                        .iter()
                        .map(|r| {
                            let mut row = r.clone();
                            if let (Some(obj), Some(name)) = (
                                row.as_object_mut(),
                                r.get("profile").and_then(|p| p.get("name")).cloned(),
                            ) {
                                obj.insert("site_name".to_owned(), name);
                            }
                            row
                        })
                        .collect(),
                )
            }
            SearchBackend::Searxng { .. } | SearchBackend::Tavily { .. } => {
                let results = reply.get("results")?.as_array()?;
                Some(
                    results
                        .iter()
                        .map(|r| {
                            let mut row = r.clone();
                            if let Some(obj) = row.as_object_mut()
                                && let Some(content) = obj.remove("content")
                            {
                                obj.entry("description").or_insert(content);
                            }
                            row
                        })
                        .collect(),
                )
            }
        }
    }

    /// The rows a backend reports, at most `count` (backends that take no count).
    fn limit(&self, rows: &mut Vec<Json>, count: Option<u64>) {
        if let (SearchBackend::Searxng { .. }, Some(count)) = (self, count) {
            rows.truncate(usize::try_from(count).unwrap_or(usize::MAX));
        }
    }
}

/// One result row as the prompt sees it, fields in this order.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct Row {
    title: String,
    url: String,
    description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    age: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    site_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    extra_snippets: Option<Vec<String>>,
}

/// A successful search's result text.
#[derive(Debug, Serialize)]
struct Results<'a> {
    query: &'a str,
    results: Vec<Row>,
}

/// Shape one row: `title`, `url`, `description`, then `age`, `site_name`, `extra_snippets`
/// when reported; nothing else.
fn shape(row: &Json, index: usize) -> Result<Row, ToolFailure> {
    let Some(url) = row.get("url").and_then(Json::as_str) else {
        return Err(malformed());
    };
    if url.trim().is_empty() {
        return Err(backend(format!(
            "malformed search response: result {index} has an empty url"
        )));
    }
    let text = |name: &str| {
        row.get(name)
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let reported = |name: &str| row.get(name).and_then(Json::as_str).map(str::to_owned);
    Ok(Row {
        title: text("title"),
        url: url.to_owned(),
        description: text("description"),
        age: reported("age"),
        site_name: reported("site_name"),
        extra_snippets: row.get("extra_snippets").and_then(Json::as_array).map(|s| {
            s.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        }),
    })
}

/// Run one search call through `backend`: `Ok` is the compact JSON result text.
pub(crate) async fn search(
    network: &dyn Network,
    backend_config: &SearchBackend,
    args: &Json,
) -> Result<String, ToolFailure> {
    let args = parse_args(args)?;
    let request = backend_config.request(&args)?;
    let deadline = Instant::now() + DEADLINE;
    let mut response = match timeout_at(deadline, network.api(&request)).await {
        Ok(Ok(response)) => response,
        Ok(Err(_)) | Err(_) => return Err(transport("request failed")),
    };
    let status = response.status;
    let success = (200..300).contains(&status);
    // Read up to one byte past the cap, so an oversized body is known without keeping it.
    let mut body = Vec::new();
    let read = loop {
        match timeout_at(deadline, response.body.chunk()).await {
            Err(_) => break Err(BodyError::TimedOut),
            Ok(Err(err)) => break Err(err),
            Ok(Ok(None)) => break Ok(()),
            Ok(Ok(Some(chunk))) => {
                let room = RESPONSE_CAP + 1 - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if body.len() > RESPONSE_CAP {
                    break Ok(());
                }
            }
        }
    };
    if !success {
        return Err(match read {
            Err(_) => backend(format!(
                "backend returned {status}, and its error body could not be read"
            )),
            Ok(()) => backend(format!(
                "backend returned {status}: {}",
                quote_error_body(&body)
            )),
        });
    }
    if read.is_err() {
        return Err(transport("reading response failed"));
    }
    if body.len() > RESPONSE_CAP {
        return Err(backend(format!(
            "response body exceeded {RESPONSE_CAP} bytes"
        )));
    }
    let text = String::from_utf8(body).map_err(|_| backend("response body was not valid UTF-8"))?;
    let reply: Json = serde_json::from_str(&text).map_err(|_| malformed())?;
    let mut rows = backend_config.rows(&reply).ok_or_else(malformed)?;
    backend_config.limit(&mut rows, args.count);
    let results = rows
        .iter()
        .enumerate()
        .map(|(i, row)| shape(row, i))
        .collect::<Result<Vec<_>, _>>()?;
    serde_json::to_string(&Results {
        query: &args.query,
        results,
    })
    .map_err(|_| malformed())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    fn message(args: Json) -> Option<String> {
        parse_args(&args).err().map(|f| f.message)
    }

    #[test]
    fn every_argument_rule_has_its_message() {
        let q = |extra: Json| {
            let mut base = json!({"query": "rust"});
            for (k, v) in extra.as_object().unwrap() {
                base[k] = v.clone();
            }
            message(base)
        };
        let inv = Some("web_search: invalid arguments".to_owned());
        assert_eq!(message(json!({})), inv);
        assert_eq!(message(json!({"query": 3})), inv);
        assert_eq!(message(json!("rust")), inv);
        assert_eq!(q(json!({"other": 1})), inv);
        assert_eq!(q(json!({"count": -1})), inv);
        assert_eq!(q(json!({"count": 1.5})), inv);
        assert_eq!(q(json!({"count": "5"})), inv);
        assert_eq!(q(json!({"freshness": "pq"})), inv);
        assert_eq!(q(json!({"safesearch": "high"})), inv);
        assert_eq!(q(json!({"country": 1})), inv);
        assert_eq!(q(json!({"include_domains": "a.com"})), inv);
        assert_eq!(q(json!({"include_domains": [1]})), inv);
        assert_eq!(
            message(json!({"query": "  \t"})),
            Some("web_search: query must not be empty".into())
        );
        assert_eq!(
            message(json!({"query": "é".repeat(401)})),
            Some("web_search: query exceeds 400 characters".into())
        );
        assert_eq!(message(json!({"query": "é".repeat(400)})), None);
        for count in [json!(0), json!(21), json!(1e300), json!(u64::MAX)] {
            assert_eq!(
                q(json!({"count": count.clone()})),
                Some("web_search: count must be between 1 and 20".into())
            );
        }
        assert_eq!(q(json!({"count": 20.0})), None);
        for field in ["country", "search_lang"] {
            for bad in [json!(" "), json!("x".repeat(129))] {
                assert_eq!(
                    q(json!({ field: bad })),
                    Some(format!("web_search: {field} must be 1..=128 characters"))
                );
            }
            assert_eq!(q(json!({ field: "ü".repeat(128) })), None);
        }
        for field in ["include_domains", "exclude_domains"] {
            let many: Vec<String> = (0..21).map(|i| format!("h{i}.com")).collect();
            assert_eq!(
                q(json!({ field: many })),
                Some(format!("web_search: {field} may list at most 20 hostnames"))
            );
            for bad in ["", "a.com/path", "a b.com", "a\u{7}.com", &"x".repeat(129)] {
                assert_eq!(
                    q(json!({ field: [bad] })),
                    Some(format!("web_search: {field} contains an invalid hostname")),
                    "{bad:?}"
                );
            }
        }
        assert_eq!(
            q(
                json!({"count": 5, "freshness": "pw", "safesearch": "strict", "include_domains": ["example.com"]})
            ),
            None
        );
    }

    #[test]
    fn rows_keep_only_the_chapters_fields_in_order() {
        let row = json!({"url": "https://e.com", "extra": 1, "site_name": "E",
                         "description": "D", "title": "T", "age": "1d",
                         "extra_snippets": ["a"]});
        assert_eq!(
            serde_json::to_string(&shape(&row, 0).unwrap()).unwrap(),
            r#"{"title":"T","url":"https://e.com","description":"D","age":"1d","site_name":"E","extra_snippets":["a"]}"#
        );
        assert_eq!(
            shape(&json!({"url": " "}), 3).err().unwrap().message,
            "web_search: malformed search response: result 3 has an empty url"
        );
        assert_eq!(
            shape(&json!({"url": 1}), 0).err().unwrap().message,
            "web_search: malformed search response"
        );
    }

    #[test]
    fn error_bodies_are_cut_and_escaped() {
        assert_eq!(quote_error_body(b""), "(empty body)");
        assert_eq!(quote_error_body(b"a\nb\r\tc\x1b"), "a\\nb\\r\\tc\\u{001b}");
        let long = "é".repeat(1500);
        let quoted = quote_error_body(long.as_bytes());
        assert_eq!(quoted.len(), 2000);
        let controls = "\u{1}".repeat(1000);
        let quoted = quote_error_body(controls.as_bytes());
        assert_eq!(quoted.len(), 8 * 250);
    }
}

//! The scripted network of `promptforge run --web-script FILE` (conformance README, "Scripted
//! web file"): DNS answers, a response per URL, timeouts and broken bodies, and a search
//! backend's answers in call order. Only the network is scripted; every fetch and search runs
//! the same pipeline as over the real network.

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Mutex;

use base64::Engine as _;
use serde_json::{Map, Value as Json};
use url::Url;

use super::network::{
    ApiRequest, Body, BodyError, Lookup, NetFuture, Network, PinnedGet, RequestError, Response,
};

/// When a scripted page runs out of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timeout {
    Connect,
    Total,
    Body,
}

/// One scripted response.
#[derive(Debug, Clone, PartialEq)]
struct Page {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    timeout: Option<Timeout>,
    break_after: Option<usize>,
}

/// One scripted search answer.
#[derive(Debug, Clone, PartialEq)]
enum SearchAnswer {
    Respond(Page),
    FailConnect,
    FailRead { status: u16 },
}

/// The scripted network.
#[derive(Debug)]
pub struct ScriptedNetwork {
    dns: BTreeMap<String, Option<Vec<IpAddr>>>,
    pages: BTreeMap<String, Page>,
    search: Option<Mutex<VecDeque<SearchAnswer>>>,
}

fn error(message: impl Into<String>) -> String {
    message.into()
}

fn object<'a>(value: &'a Json, at: &str) -> Result<&'a Map<String, Json>, String> {
    value
        .as_object()
        .ok_or_else(|| error(format!("{at} must be an object")))
}

fn check_keys(fields: &Map<String, Json>, allowed: &[&str], at: &str) -> Result<(), String> {
    match fields.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(key) => Err(error(format!(
            "{at}: unknown key `{key}` (expected one of: {})",
            allowed.join(", ")
        ))),
        None => Ok(()),
    }
}

fn parse_page(value: &Json, at: &str) -> Result<Page, String> {
    let fields = object(value, at)?;
    check_keys(
        fields,
        &[
            "status",
            "headers",
            "body",
            "body_base64",
            "timeout",
            "break_after",
        ],
        at,
    )?;
    let status = match fields.get("status") {
        None => 200,
        Some(s) => s
            .as_u64()
            .and_then(|s| u16::try_from(s).ok())
            .filter(|s| (100..=599).contains(s))
            .ok_or_else(|| error(format!("{at}.status must be an HTTP status (100 to 599)")))?,
    };
    let mut headers = Vec::new();
    if let Some(h) = fields.get("headers") {
        for (name, value) in object(h, &format!("{at}.headers"))? {
            let value = value
                .as_str()
                .ok_or_else(|| error(format!("{at}.headers.{name} must be a string")))?;
            headers.push((name.to_ascii_lowercase(), value.to_owned()));
        }
    }
    let body = match (fields.get("body"), fields.get("body_base64")) {
        (Some(_), Some(_)) => {
            return Err(error(format!(
                "{at}: give `body` or `body_base64`, not both"
            )));
        }
        (Some(Json::String(text)), None) => text.clone().into_bytes(),
        (Some(other), None) => serde_json::to_vec(other).map_err(|e| e.to_string())?,
        (None, Some(encoded)) => {
            let encoded = encoded
                .as_str()
                .ok_or_else(|| error(format!("{at}.body_base64 must be a string")))?;
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|e| error(format!("{at}.body_base64 is not base64: {e}")))?
        }
        (None, None) => Vec::new(),
    };
    let timeout = match fields.get("timeout").map(|t| t.as_str()) {
        None => None,
        Some(Some("connect")) => Some(Timeout::Connect),
        Some(Some("total")) => Some(Timeout::Total),
        Some(Some("body")) => Some(Timeout::Body),
        Some(_) => {
            return Err(error(format!(
                "{at}.timeout must be \"connect\", \"total\" or \"body\""
            )));
        }
    };
    let break_after = match fields.get("break_after") {
        None => None,
        Some(n) => Some(
            n.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| error(format!("{at}.break_after must be a byte count")))?,
        ),
    };
    Ok(Page {
        status,
        headers,
        body,
        timeout,
        break_after,
    })
}

/// A URL key as the fetch will request it: WHATWG-serialised, fragment dropped.
fn url_key(url: &str) -> Option<String> {
    let mut parsed = Url::parse(url).ok()?;
    parsed.set_fragment(None);
    Some(parsed.to_string())
}

impl ScriptedNetwork {
    /// Parse a web script.
    pub fn parse(text: &str) -> Result<Self, String> {
        let value: Json = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let fields = object(&value, "the web script")?;
        check_keys(fields, &["dns", "pages", "search"], "the web script")?;
        let mut dns = BTreeMap::new();
        if let Some(d) = fields.get("dns") {
            for (host, answer) in object(d, "dns")? {
                let at = format!("dns.{host}");
                let entry = match answer {
                    Json::String(s) if s == "fail" => None,
                    Json::Array(items) => {
                        let mut addresses = Vec::new();
                        for item in items {
                            let address = item
                                .as_str()
                                .and_then(|s| s.parse::<IpAddr>().ok())
                                .ok_or_else(|| {
                                    error(format!("{at}: {item} is not an IP address"))
                                })?;
                            addresses.push(address);
                        }
                        Some(addresses)
                    }
                    _ => {
                        return Err(error(format!(
                            "{at} must be a list of addresses or \"fail\""
                        )));
                    }
                };
                // Keyed as a URL's host serialises (lowercase, IDNA), as lookups ask for it.
                let key = url::Host::parse(host)
                    .map(|h| h.to_string())
                    .unwrap_or_else(|_| host.to_ascii_lowercase());
                dns.insert(key, entry);
            }
        }
        let mut pages = BTreeMap::new();
        if let Some(p) = fields.get("pages") {
            for (url, page) in object(p, "pages")? {
                let key =
                    url_key(url).ok_or_else(|| error(format!("pages: `{url}` is not a URL")))?;
                pages.insert(key, parse_page(page, &format!("pages[{url}]"))?);
            }
        }
        let search = match fields.get("search") {
            None => None,
            Some(Json::Array(answers)) => {
                let mut queue = VecDeque::new();
                for (i, answer) in answers.iter().enumerate() {
                    let at = format!("search[{i}]");
                    let fields = object(answer, &at)?;
                    queue.push_back(match fields.get("fail") {
                        None => SearchAnswer::Respond(parse_page(answer, &at)?),
                        Some(fail) => {
                            check_keys(fields, &["fail", "status"], &at)?;
                            let status = fields
                                .get("status")
                                .and_then(Json::as_u64)
                                .and_then(|s| u16::try_from(s).ok())
                                .unwrap_or(200);
                            match fail.as_str() {
                                Some("connect") => SearchAnswer::FailConnect,
                                Some("read") => SearchAnswer::FailRead { status },
                                _ => {
                                    return Err(error(format!(
                                        "{at}.fail must be \"connect\" or \"read\""
                                    )));
                                }
                            }
                        }
                    });
                }
                Some(Mutex::new(queue))
            }
            Some(_) => return Err(error("search must be a list of answers")),
        };
        Ok(ScriptedNetwork { dns, pages, search })
    }

    /// A network where every name resolves to nothing and nothing answers.
    pub fn empty() -> Self {
        ScriptedNetwork {
            dns: BTreeMap::new(),
            pages: BTreeMap::new(),
            search: None,
        }
    }

    /// Read and parse a web script file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = crate::limits::read_capped_text(path, crate::limits::SCRIPT_FILE_CAP)?;
        Self::parse(&text)
    }

    /// The Gateway-shaped search backend the script's `search` answers stand for, if the
    /// script has the `search` key (its URL is never contacted: the answers come from the
    /// script).
    pub fn search_backend(&self) -> Option<super::SearchBackend> {
        let url = Url::parse("https://gateway.invalid/search").ok()?;
        self.search
            .as_ref()
            .map(|_| super::SearchBackend::Gateway { url, key: None })
    }
}

/// A scripted body: its bytes, then the end, a break, or a timeout.
#[derive(Debug)]
struct ScriptedBody {
    bytes: Option<Vec<u8>>,
    then: Option<BodyError>,
}

impl Body for ScriptedBody {
    fn chunk(&mut self) -> NetFuture<'_, Result<Option<Vec<u8>>, BodyError>> {
        let next = match self.bytes.take() {
            Some(bytes) if !bytes.is_empty() => Ok(Some(bytes)),
            _ => match self.then.take() {
                Some(err) => Err(err),
                None => Ok(None),
            },
        };
        Box::pin(async move { next })
    }
}

fn respond(page: &Page) -> Response {
    let (bytes, then) = match (page.timeout, page.break_after) {
        (Some(Timeout::Body), _) => (Vec::new(), Some(BodyError::TimedOut)),
        (_, Some(n)) => (
            page.body[..n.min(page.body.len())].to_vec(),
            Some(BodyError::Broken),
        ),
        _ => (page.body.clone(), None),
    };
    Response {
        status: page.status,
        headers: page.headers.clone(),
        body: Box::new(ScriptedBody {
            bytes: Some(bytes),
            then,
        }),
    }
}

impl Network for ScriptedNetwork {
    fn resolve<'a>(&'a self, host: &'a str) -> NetFuture<'a, Lookup> {
        let answer = match self.dns.get(&host.to_ascii_lowercase()) {
            None => Lookup::Addresses(Vec::new()),
            Some(None) => Lookup::Failed,
            Some(Some(addresses)) => Lookup::Addresses(addresses.clone()),
        };
        Box::pin(async move { answer })
    }

    fn get<'a>(&'a self, request: PinnedGet<'a>) -> NetFuture<'a, Result<Response, RequestError>> {
        let answer = match self.pages.get(request.url.as_str()) {
            None => Err(RequestError::Failed),
            Some(page) => match page.timeout {
                Some(Timeout::Connect) => Err(RequestError::ConnectTimeout),
                Some(Timeout::Total) => Err(RequestError::TimedOut),
                _ => Ok(respond(page)),
            },
        };
        Box::pin(async move { answer })
    }

    fn api<'a>(
        &'a self,
        _request: &'a ApiRequest,
    ) -> NetFuture<'a, Result<Response, RequestError>> {
        let next = self.search.as_ref().and_then(|queue| {
            queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .pop_front()
        });
        let answer = match next {
            None | Some(SearchAnswer::FailConnect) => Err(RequestError::Failed),
            Some(SearchAnswer::FailRead { status }) => Ok(Response {
                status,
                headers: Vec::new(),
                body: Box::new(ScriptedBody {
                    bytes: None,
                    then: Some(BodyError::Broken),
                }),
            }),
            Some(SearchAnswer::Respond(page)) => Ok(respond(&page)),
        };
        Box::pin(async move { answer })
    }

    fn is_immediate(&self) -> bool {
        true
    }
}

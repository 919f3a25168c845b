//! The seam under the web tools: one [`Network`] trait with the three things a fetch or a
//! search needs from the outside world (a name lookup, a GET to one pinned address, a search
//! backend's API request), and the real implementation over `tokio` and `reqwest`.
//!
//! Everything above this trait (admission, the address check, redirects, content types,
//! charsets, the byte cap, decompression, extraction, search validation and response checks)
//! is the same code whichever network is underneath; the scripted network of `--web-script`
//! ([`super::scripted`]) is the other implementation.

use std::fmt::Debug;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::time::Duration;

use futures_util::StreamExt;
use url::Url;

/// The future a network call returns.
pub type NetFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A name lookup's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The lookup succeeded with these addresses, in order (possibly none).
    Addresses(Vec<IpAddr>),
    /// The lookup itself failed (no such name, resolver error).
    Failed,
}

/// Why a request got no response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestError {
    /// The connect limit ran out.
    ConnectTimeout,
    /// The whole-request limit ran out before the response arrived.
    TimedOut,
    /// Any other failure: refused or reset connection, TLS failure, protocol error.
    Failed,
}

/// Why a body stopped before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// The connection broke off.
    Broken,
    /// The time limit ran out while the body arrived.
    TimedOut,
}

/// A response's body, read chunk by chunk (so a reader can stop at its cap).
pub trait Body: Send + Debug {
    /// The next chunk; `Ok(None)` at the end.
    fn chunk(&mut self) -> NetFuture<'_, Result<Option<Vec<u8>>, BodyError>>;
}

/// A response: status, headers (names lowercased, in order) and the body still to read.
#[derive(Debug)]
pub struct Response {
    /// The HTTP status code.
    pub status: u16,
    /// The headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Box<dyn Body>,
}

impl Response {
    /// The first value of a header (`name` lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// An HTTP method a search backend uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET.
    Get,
    /// POST.
    Post,
}

/// A search backend's request to its API.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiRequest {
    /// GET or POST.
    pub method: Method,
    /// The full URL, query included.
    pub url: Url,
    /// Headers to send (credentials included: never logged or recorded).
    pub headers: Vec<(String, String)>,
    /// A JSON body (POST).
    pub body: Option<Vec<u8>>,
}

/// One fetch request to a pinned address: the URL to ask for and the address, checked by the
/// policy, that the connection must go to.
#[derive(Debug, Clone, Copy)]
pub struct PinnedGet<'a> {
    /// The URL (its host names the virtual host and the TLS server name).
    pub url: &'a Url,
    /// The checked address to connect to; no second lookup happens.
    pub address: IpAddr,
    /// The connect limit.
    pub connect_timeout: Duration,
    /// The `User-Agent` header.
    pub user_agent: &'a str,
}

/// The outside world, as the web tools see it.
pub trait Network: Send + Sync + Debug {
    /// Look a host name up.
    fn resolve<'a>(&'a self, host: &'a str) -> NetFuture<'a, Lookup>;

    /// Send a GET for `request.url` over a connection to `request.address`, with no proxy,
    /// cookies, credentials, `Referer` or redirect following, and return the response with
    /// its body unread and undecoded (the caller decompresses).
    fn get<'a>(&'a self, request: PinnedGet<'a>) -> NetFuture<'a, Result<Response, RequestError>>;

    /// Send a search backend's API request.
    fn api<'a>(&'a self, request: &'a ApiRequest) -> NetFuture<'a, Result<Response, RequestError>>;

    /// Whether every call completes without waiting on anything outside the process (the
    /// scripted network): a Host may then run a tool call to its end on the spot, in the
    /// engine's issue order.
    fn is_immediate(&self) -> bool {
        false
    }
}

/// The real network: the system resolver and `reqwest` over rustls.
#[derive(Debug, Clone)]
pub struct RealNetwork {
    /// One client for search backends (their hosts come from the Host's own configuration,
    /// not from a model, so they need no address pinning); connections are pooled. Built on
    /// first use: a run that never searches never pays for a TLS client.
    api_client: std::sync::OnceLock<Option<reqwest::Client>>,
}

impl RealNetwork {
    /// The real network.
    pub fn new() -> Result<Self, String> {
        Ok(RealNetwork {
            api_client: std::sync::OnceLock::new(),
        })
    }

    fn api_client(&self) -> Option<&reqwest::Client> {
        self.api_client
            .get_or_init(|| {
                reqwest::Client::builder()
                    .no_proxy()
                    .connect_timeout(Duration::from_secs(10))
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .ok()
            })
            .as_ref()
    }
}

/// The resolver of one fetch request: the policy's checked address for its host, and a
/// failure for every other name (fail-closed: there is no fallback to the system resolver).
struct PinnedResolver {
    host: String,
    address: SocketAddr,
}

impl reqwest::dns::Resolve for PinnedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let answer: Result<reqwest::dns::Addrs, Box<dyn std::error::Error + Send + Sync>> =
            if name.as_str().eq_ignore_ascii_case(&self.host) {
                Ok(Box::new(std::iter::once(self.address)))
            } else {
                Err(format!("{} is not the checked host", name.as_str()).into())
            };
        Box::pin(async move { answer })
    }
}

/// A `reqwest` body, chunk by chunk.
struct ReqwestBody {
    stream: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
}

impl Debug for ReqwestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReqwestBody")
    }
}

impl Body for ReqwestBody {
    fn chunk(&mut self) -> NetFuture<'_, Result<Option<Vec<u8>>, BodyError>> {
        Box::pin(async move {
            match self.stream.next().await {
                None => Ok(None),
                Some(Ok(bytes)) => Ok(Some(bytes.to_vec())),
                Some(Err(err)) if err.is_timeout() => Err(BodyError::TimedOut),
                Some(Err(_)) => Err(BodyError::Broken),
            }
        })
    }
}

/// A `reqwest` response as the web tools read it.
fn response(reply: reqwest::Response) -> Response {
    let status = reply.status().as_u16();
    let headers = reply
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    Response {
        status,
        headers,
        body: Box::new(ReqwestBody {
            stream: reply.bytes_stream().boxed(),
        }),
    }
}

fn request_error(err: &reqwest::Error) -> RequestError {
    if err.is_connect() && err.is_timeout() {
        RequestError::ConnectTimeout
    } else if err.is_timeout() {
        RequestError::TimedOut
    } else {
        RequestError::Failed
    }
}

impl Network for RealNetwork {
    fn resolve<'a>(&'a self, host: &'a str) -> NetFuture<'a, Lookup> {
        Box::pin(async move {
            // Port 443 only fills the socket address the resolver wants; it is not used.
            match tokio::net::lookup_host((host, 443)).await {
                Ok(addresses) => {
                    let mut seen = Vec::new();
                    for address in addresses {
                        if !seen.contains(&address.ip()) {
                            seen.push(address.ip());
                        }
                    }
                    Lookup::Addresses(seen)
                }
                Err(_) => Lookup::Failed,
            }
        })
    }

    fn get<'a>(&'a self, request: PinnedGet<'a>) -> NetFuture<'a, Result<Response, RequestError>> {
        Box::pin(async move {
            let Some(host) = request.url.host_str() else {
                return Err(RequestError::Failed);
            };
            let port = request.url.port_or_known_default().unwrap_or(443);
            // A client per request whose only resolver answers the checked address for this
            // host and fails for any other name: nothing between the check and the connect
            // can look the name up again, and no approval outlives the request.
            let client = reqwest::Client::builder()
                .no_proxy()
                .dns_resolver(std::sync::Arc::new(PinnedResolver {
                    host: host.to_owned(),
                    address: SocketAddr::new(request.address, port),
                }))
                .connect_timeout(request.connect_timeout)
                .redirect(reqwest::redirect::Policy::none())
                .referer(false)
                .user_agent(request.user_agent)
                .pool_max_idle_per_host(0)
                .build()
                .map_err(|_| RequestError::Failed)?;
            let reply = client
                .get(request.url.clone())
                .header("accept-encoding", "gzip, br")
                .send()
                .await
                .map_err(|e| request_error(&e))?;
            Ok(response(reply))
        })
    }

    fn api<'a>(&'a self, request: &'a ApiRequest) -> NetFuture<'a, Result<Response, RequestError>> {
        Box::pin(async move {
            let client = self.api_client().ok_or(RequestError::Failed)?;
            let mut builder = match request.method {
                Method::Get => client.get(request.url.clone()),
                Method::Post => client.post(request.url.clone()),
            };
            for (name, value) in &request.headers {
                builder = builder.header(name.as_str(), value.as_str());
            }
            if let Some(body) = &request.body {
                builder = builder
                    .header("content-type", "application/json")
                    .body(body.clone());
            }
            let reply = builder.send().await.map_err(|e| request_error(&e))?;
            Ok(response(reply))
        })
    }
}

//! The web tools over the real network, against servers on the loopback interface.
//!
//! The servers here are raw TCP listeners writing canned HTTP by hand, so a test controls
//! every byte: lying `Content-Length`s, bodies that stop halfway, slow answers, and gzip bombs.
//! Each counts the connections it accepted, which is how the SSRF tests show that a refused
//! destination was never contacted. Only test builds can reach loopback at all, through the
//! policy's [`LoopbackPermission`]; name lookups go through a fixed table (the [`TestNet`]) so
//! a test decides what every name resolves to, while connections are the real ones.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::network::{ApiRequest, Lookup, NetFuture, Network, PinnedGet, RequestError, Response};
use super::policy::{FetchPolicy, LoopbackPermission};
use super::{RealNetwork, SearchBackend, ToolErrorKind, WebPlugin};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// What a test server sends on one connection.
#[derive(Debug, Clone)]
struct Canned {
    /// The status line and headers, without the blank line.
    head: String,
    /// Body bytes.
    body: Vec<u8>,
    /// Wait this long before sending anything.
    delay_head: Duration,
    /// Send this many body bytes, then wait `stall` before the rest (or close, when `close`).
    split: Option<(usize, Duration, bool)>,
}

impl Canned {
    fn new(status: &str, headers: &[(&str, &str)], body: impl Into<Vec<u8>>) -> Self {
        let body = body.into();
        let mut head = format!("HTTP/1.1 {status}\r\nconnection: close\r\n");
        let mut has_length = false;
        for (name, value) in headers {
            has_length |= name.eq_ignore_ascii_case("content-length");
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if !has_length {
            head.push_str(&format!("content-length: {}\r\n", body.len()));
        }
        Canned {
            head,
            body,
            delay_head: Duration::ZERO,
            split: None,
        }
    }

    fn page(content_type: &str, body: &str) -> Self {
        Canned::new("200 OK", &[("content-type", content_type)], body)
    }
}

/// A raw HTTP server on one loopback address: answers each request by its path.
struct Server {
    port: u16,
    accepted: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Server {
    async fn start(ip: IpAddr, routes: Vec<(&'static str, Canned)>) -> Server {
        Self::start_on(ip, 0, routes).await
    }

    async fn start_on(ip: IpAddr, port: u16, routes: Vec<(&'static str, Canned)>) -> Server {
        let listener = TcpListener::bind(SocketAddr::new(ip, port)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let routes: Arc<BTreeMap<&str, Canned>> = Arc::new(routes.into_iter().collect());
        let (count, seen) = (accepted.clone(), requests.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let (routes, seen) = (routes.clone(), seen.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match socket.read(&mut byte).await {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    // Read the request body too: closing a socket with unread data resets
                    // the connection, which the client would see as a broken body.
                    let length = head
                        .lines()
                        .find_map(|l| {
                            let (name, value) = l.split_once(':')?;
                            name.eq_ignore_ascii_case("content-length")
                                .then(|| value.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    let mut body = vec![0u8; length];
                    if socket.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                    seen.lock().unwrap().push(head);
                    let path_only = path.split('?').next().unwrap_or("/").to_owned();
                    let canned = routes
                        .get(path.as_str())
                        .or_else(|| routes.get(path_only.as_str()))
                        .cloned()
                        .unwrap_or_else(|| Canned::new("404 Not Found", &[], "no route"));
                    tokio::time::sleep(canned.delay_head).await;
                    let _ = socket.write_all(canned.head.as_bytes()).await;
                    let _ = socket.write_all(b"\r\n").await;
                    match canned.split {
                        None => {
                            let _ = socket.write_all(&canned.body).await;
                        }
                        Some((n, stall, close)) => {
                            let _ = socket.write_all(&canned.body[..n]).await;
                            let _ = socket.flush().await;
                            if close {
                                return;
                            }
                            tokio::time::sleep(stall).await;
                            let _ = socket.write_all(&canned.body[n..]).await;
                        }
                    }
                    let _ = socket.shutdown().await;
                });
            }
        });
        Server {
            port,
            accepted,
            requests,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// The real network with name lookups from a fixed table (so a test decides what each name
/// resolves to, including answers that change between lookups).
#[derive(Debug)]
struct TestNet {
    real: RealNetwork,
    dns: Mutex<BTreeMap<String, Vec<Vec<IpAddr>>>>,
    lookups: AtomicUsize,
}

impl TestNet {
    fn new(dns: &[(&str, &[IpAddr])]) -> Arc<TestNet> {
        Arc::new(TestNet {
            real: RealNetwork::new().unwrap(),
            dns: Mutex::new(
                dns.iter()
                    .map(|(host, addrs)| ((*host).to_owned(), vec![addrs.to_vec()]))
                    .collect(),
            ),
            lookups: AtomicUsize::new(0),
        })
    }

    /// Answer `host` with these address lists in turn (the last one repeats).
    fn answers(&self, host: &str, answers: Vec<Vec<IpAddr>>) {
        self.dns.lock().unwrap().insert(host.to_owned(), answers);
    }
}

impl Network for TestNet {
    fn resolve<'a>(&'a self, host: &'a str) -> NetFuture<'a, Lookup> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let mut dns = self.dns.lock().unwrap();
        let answer = match dns.get_mut(host) {
            None => Lookup::Failed,
            Some(list) if list.len() > 1 => Lookup::Addresses(list.remove(0)),
            Some(list) => Lookup::Addresses(list[0].clone()),
        };
        Box::pin(async move { answer })
    }

    fn get<'a>(&'a self, request: PinnedGet<'a>) -> NetFuture<'a, Result<Response, RequestError>> {
        self.real.get(request)
    }

    fn api<'a>(&'a self, request: &'a ApiRequest) -> NetFuture<'a, Result<Response, RequestError>> {
        self.real.api(request)
    }
}

/// A policy that lets fetches reach test servers on `port` at exactly these addresses.
fn loopback(port: u16, addresses: &[IpAddr]) -> FetchPolicy {
    FetchPolicy {
        loopback: Some(LoopbackPermission {
            port,
            addresses: addresses.to_vec(),
        }),
        ..FetchPolicy::default()
    }
}

fn plugin(net: Arc<TestNet>, policy: FetchPolicy) -> WebPlugin {
    WebPlugin::new(net, None).with_policy(policy)
}

async fn fetch(web: &WebPlugin, url: &str) -> Result<String, super::ToolFailure> {
    web.call("promptforge/web/fetch", &json!({ "url": url }))
        .await
}

const ARTICLE: &str = "<html><head><title>T</title></head><body><nav>Home | About</nav>\
    <article><h1>Heading</h1><p>A paragraph long enough to be the main content of the page, \
    with several clauses, commas, and words, so that readability keeps it as the article.</p>\
    <p>A second paragraph, also long enough to count, about the same subject as the first.</p>\
    </article><footer>Footer links</footer></body></html>";

#[tokio::test]
async fn a_page_is_fetched_over_a_pinned_connection_with_anonymous_headers() {
    let server = Server::start(
        LOCALHOST,
        vec![(
            "/article",
            Canned::page("text/html; charset=utf-8", ARTICLE),
        )],
    )
    .await;
    // `pinned.test` exists only in the test's table: the connection can only have gone to
    // the address the policy checked.
    let net = TestNet::new(&[("pinned.test", &[LOCALHOST])]);
    let web = plugin(net.clone(), loopback(server.port, &[LOCALHOST]));
    let url = format!("http://pinned.test:{}/article?q=1#frag", server.port);
    let text = fetch(&web, &url).await.unwrap();
    assert!(
        text.starts_with(&format!(
            "url: http://pinned.test:{}/article?q=1\ntruncated: false\nextraction: readability\n\n",
            server.port
        )),
        "{text}"
    );
    assert!(text.contains("A second paragraph") && !text.contains("Footer links"));
    let requests = server.requests.lock().unwrap().clone();
    let head = requests[0].to_ascii_lowercase();
    assert!(head.starts_with("get /article?q=1 http/1.1\r\n"), "{head}");
    assert!(
        head.contains("user-agent: harness-webfetch/0.0\r\n"),
        "{head}"
    );
    for absent in ["cookie", "authorization", "referer", "proxy-"] {
        assert!(!head.contains(absent), "{absent} in {head}");
    }
    assert_eq!(net.lookups.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn redirects_are_followed_relative_and_every_hop_is_looked_up_again() {
    let server = Server::start(
        LOCALHOST,
        vec![
            (
                "/start",
                Canned::new("302 Found", &[("location", "/next#x")], ""),
            ),
            (
                "/next",
                Canned::new("301 Moved", &[("location", "../final?z=2")], ""),
            ),
            ("/final", Canned::page("text/plain", "the end")),
        ],
    )
    .await;
    let net = TestNet::new(&[("hop.test", &[LOCALHOST])]);
    let web = plugin(net.clone(), loopback(server.port, &[LOCALHOST]));
    let text = fetch(&web, &format!("http://hop.test:{}/start", server.port))
        .await
        .unwrap();
    assert_eq!(
        text,
        format!(
            "url: http://hop.test:{}/final?z=2\ntruncated: false\nextraction: plain\n\nthe end",
            server.port
        )
    );
    assert_eq!(net.lookups.load(Ordering::SeqCst), 3, "one lookup per hop");
    assert_eq!(server.accepted(), 3);
}

#[tokio::test]
async fn ssrf_destinations_are_refused_before_any_connection() {
    let server = Server::start(LOCALHOST, vec![("/", Canned::page("text/plain", "secret"))]).await;
    let port = server.port;
    let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
    let compatible: IpAddr = "::127.0.0.1".parse().unwrap();
    let nat64: IpAddr = "64:ff9b::7f00:1".parse().unwrap();
    let metadata: IpAddr = "169.254.169.254".parse().unwrap();
    let private: IpAddr = "10.0.0.5".parse().unwrap();
    let net = TestNet::new(&[
        ("loop.test", &[LOCALHOST]),
        ("mapped.test", &[mapped]),
        ("compat.test", &[compatible]),
        ("nat64.test", &[nat64]),
        ("metadata.test", &[metadata]),
        ("private.test", &[private, LOCALHOST]),
    ]);
    // Loopback permission off: every one of these is refused, and nothing is contacted.
    let policy = loopback(port, &[]);
    let web = plugin(net, policy);
    for host in [
        "loop.test",
        "mapped.test",
        "compat.test",
        "nat64.test",
        "metadata.test",
        "private.test",
    ] {
        let failure = fetch(&web, &format!("http://{host}:{port}/"))
            .await
            .unwrap_err();
        assert_eq!(failure.kind, ToolErrorKind::InvalidArguments);
        assert_eq!(
            failure.message,
            format!("host {host} has no allowed address")
        );
    }
    // IP literals never get as far as a lookup.
    for literal in ["127.0.0.1", "[::1]", "[::ffff:127.0.0.1]", "2130706433"] {
        let failure = fetch(&web, &format!("http://{literal}:{port}/"))
            .await
            .unwrap_err();
        assert!(
            failure.message.starts_with("ip literal host not allowed: "),
            "{literal}: {}",
            failure.message
        );
    }
    assert_eq!(server.accepted(), 0, "a refused destination was contacted");
}

#[tokio::test]
async fn a_redirect_to_an_internal_address_never_reaches_it() {
    // The inside server listens on 127.0.0.2, which the permission does not allow; the
    // outside one on 127.0.0.1 at the same port (the permission covers one port).
    let inside_ip: IpAddr = "127.0.0.2".parse().unwrap();
    let inside = Server::start(inside_ip, vec![("/", Canned::page("text/plain", "secret"))]).await;
    let port = inside.port;
    let to_name = format!("http://inside.test:{port}/");
    let to_literal = format!("http://127.0.0.2:{port}/");
    let _outside = Server::start_on(
        LOCALHOST,
        port,
        vec![
            (
                "/to-name",
                Canned::new("302 Found", &[("location", &to_name)], ""),
            ),
            (
                "/to-literal",
                Canned::new("307 Temporary Redirect", &[("location", &to_literal)], ""),
            ),
        ],
    )
    .await;
    let net = TestNet::new(&[
        ("outside.test", &[LOCALHOST]),
        ("inside.test", &[inside_ip]),
    ]);
    let web = plugin(net, loopback(port, &[LOCALHOST]));
    let failure = fetch(&web, &format!("http://outside.test:{port}/to-name?k=v"))
        .await
        .unwrap_err();
    assert_eq!(failure.message, "host inside.test has no allowed address");
    let text = fetch(&web, &format!("http://outside.test:{port}/to-literal?k=v"))
        .await
        .unwrap();
    assert_eq!(
        text,
        format!(
            "redirect from http://outside.test:{port}/to-literal to http://127.0.0.2:{port}/ refused: ip literal host not allowed: 127.0.0.2"
        )
    );
    assert_eq!(inside.accepted(), 0, "the internal server was contacted");
}

#[tokio::test]
async fn a_name_that_rebinds_to_an_internal_address_is_refused_the_second_time() {
    let server = Server::start(LOCALHOST, vec![("/", Canned::page("text/plain", "hello"))]).await;
    let net = TestNet::new(&[]);
    let inside: IpAddr = "127.0.0.2".parse().unwrap();
    net.answers("rebind.test", vec![vec![LOCALHOST], vec![inside]]);
    let web = plugin(net, loopback(server.port, &[LOCALHOST]));
    let url = format!("http://rebind.test:{}/", server.port);
    assert!(fetch(&web, &url).await.unwrap().ends_with("\n\nhello"));
    let failure = fetch(&web, &url).await.unwrap_err();
    assert_eq!(failure.message, "host rebind.test has no allowed address");
    assert_eq!(server.accepted(), 1);
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

#[tokio::test]
async fn bodies_are_capped_after_decompression_and_by_their_declared_length() {
    let cap = 64 * 1024;
    let bomb = gzip(&vec![b' '; 8 * 1024 * 1024]);
    let mut lying = Canned::new(
        "200 OK",
        &[("content-type", "text/html"), ("content-length", "9999999")],
        "",
    );
    // The server would send 9,999,999 bytes; the fetch must refuse before reading them.
    lying.split = Some((0, Duration::from_secs(30), false));
    let server = Server::start(
        LOCALHOST,
        vec![
            (
                "/bomb.json",
                Canned::new(
                    "200 OK",
                    &[
                        ("content-type", "application/json"),
                        ("content-encoding", "gzip"),
                    ],
                    bomb.clone(),
                ),
            ),
            (
                "/bomb.txt",
                Canned::new(
                    "200 OK",
                    &[("content-type", "text/plain"), ("content-encoding", "gzip")],
                    bomb,
                ),
            ),
            ("/lying.html", lying),
            (
                "/br.json",
                Canned::new(
                    "200 OK",
                    &[
                        ("content-type", "application/json"),
                        ("content-encoding", "br"),
                    ],
                    {
                        let mut out = Vec::new();
                        {
                            let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                            w.write_all(&vec![b'1'; 1 << 20]).unwrap();
                        }
                        out
                    },
                ),
            ),
        ],
    )
    .await;
    let net = TestNet::new(&[("big.test", &[LOCALHOST])]);
    let policy = FetchPolicy {
        body_cap: cap,
        ..loopback(server.port, &[LOCALHOST])
    };
    let web = plugin(net, policy);
    let base = format!("http://big.test:{}", server.port);
    for path in ["/bomb.json", "/lying.html", "/br.json"] {
        assert_eq!(
            fetch(&web, &format!("{base}{path}")).await.unwrap(),
            format!("response from {base}{path} exceeds the {cap}-byte size cap")
        );
    }
    let text = fetch(&web, &format!("{base}/bomb.txt")).await.unwrap();
    assert!(
        text.contains("truncated: true\nextraction: plain"),
        "{}",
        &text[..80]
    );
}

#[tokio::test]
async fn slow_answers_run_into_the_limits() {
    let mut slow_head = Canned::page("text/plain", "late");
    slow_head.delay_head = Duration::from_secs(5);
    let mut slow_body = Canned::page("text/plain", "early and late");
    slow_body.split = Some((5, Duration::from_secs(5), false));
    let mut cut = Canned::page("text/plain", "early and never");
    cut.split = Some((5, Duration::ZERO, true));
    let server = Server::start(
        LOCALHOST,
        vec![("/head", slow_head), ("/body", slow_body), ("/cut", cut)],
    )
    .await;
    let net = TestNet::new(&[("slow.test", &[LOCALHOST])]);
    let policy = FetchPolicy {
        total_timeout: Duration::from_millis(400),
        ..loopback(server.port, &[LOCALHOST])
    };
    let web = plugin(net, policy);
    let base = format!("http://slow.test:{}", server.port);
    assert_eq!(
        fetch(&web, &format!("{base}/head")).await.unwrap(),
        format!("request to {base}/head timed out; try again or use a different URL")
    );
    for path in ["/body", "/cut"] {
        assert_eq!(
            fetch(&web, &format!("{base}{path}")).await.unwrap(),
            format!(
                "the response body from {base}{path} could not be read; try again or use a different URL"
            )
        );
    }
    // Nothing listens here: a refused connection is the catch-all, with the URL as requested.
    let closed = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let net = TestNet::new(&[("gone.test", &[LOCALHOST])]);
    let web = plugin(net, loopback(closed_port, &[LOCALHOST]));
    let url = format!("http://gone.test:{closed_port}/x?keep=1");
    assert_eq!(
        fetch(&web, &url).await.unwrap(),
        format!("fetch failed for {url}: network error; try a different URL")
    );
}

/// A search backend's fake API: answers every request with `canned`, records the heads.
async fn search_with(
    backend: impl Fn(u16) -> SearchBackend,
    canned: Canned,
) -> (Result<String, super::ToolFailure>, String) {
    let server = Server::start(
        LOCALHOST,
        vec![("/search", canned.clone()), ("/res/v1/web/search", canned)],
    )
    .await;
    let net = TestNet::new(&[]);
    let web = WebPlugin::new(net, Some(backend(server.port)));
    let result = web
        .call(
            "promptforge/web/search",
            &json!({"query": "rust async", "count": 2, "freshness": "pw"}),
        )
        .await;
    let head = server
        .requests
        .lock()
        .unwrap()
        .first()
        .cloned()
        .unwrap_or_default();
    (result, head)
}

fn url(port: u16, path: &str) -> url::Url {
    url::Url::parse(&format!("http://127.0.0.1:{port}{path}")).unwrap()
}

#[tokio::test]
async fn every_search_backend_maps_its_reply_to_the_chapters_rows() {
    let want = r#"{"query":"rust async","results":[{"title":"T","url":"https://e.com","description":"D"}]}"#;
    let gateway = json!({"results": [{"title": "T", "url": "https://e.com", "description": "D", "score": 3}]});
    let (got, head) = search_with(
        |port| SearchBackend::Gateway {
            url: url(port, "/search"),
            key: Some("gk".into()),
        },
        Canned::page("application/json", &gateway.to_string()),
    )
    .await;
    assert_eq!(got.unwrap(), want);
    assert!(
        head.starts_with("POST /search ")
            && head
                .to_ascii_lowercase()
                .contains("authorization: bearer gk"),
        "{head}"
    );

    let brave = json!({"web": {"results": [{"title": "T", "url": "https://e.com", "description": "D",
        "age": "2 days ago", "profile": {"name": "E"}, "extra_snippets": ["x"]}]}});
    let (got, head) = search_with(
        |port| SearchBackend::Brave {
            url: url(port, "/res/v1/web/search"),
            key: "bk".into(),
        },
        Canned::page("application/json", &brave.to_string()),
    )
    .await;
    assert_eq!(
        got.unwrap(),
        r#"{"query":"rust async","results":[{"title":"T","url":"https://e.com","description":"D","age":"2 days ago","site_name":"E","extra_snippets":["x"]}]}"#
    );
    assert!(
        head.starts_with("GET /res/v1/web/search?q=rust+async&count=2&freshness=pw"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("x-subscription-token: bk"),
        "{head}"
    );

    let searx = json!({"results": [{"title": "T", "url": "https://e.com", "content": "D"},
                                   {"title": "T2", "url": "https://f.com", "content": "D2"},
                                   {"title": "T3", "url": "https://g.com", "content": "D3"}]});
    let (got, head) = search_with(
        |port| SearchBackend::Searxng {
            url: url(port, "/search"),
            key: None,
        },
        Canned::page("application/json", &searx.to_string()),
    )
    .await;
    assert_eq!(
        got.unwrap(),
        r#"{"query":"rust async","results":[{"title":"T","url":"https://e.com","description":"D"},{"title":"T2","url":"https://f.com","description":"D2"}]}"#
    );
    assert!(
        head.contains("format=json") && head.contains("time_range=week"),
        "{head}"
    );

    let tavily =
        json!({"results": [{"title": "T", "url": "https://e.com", "content": "D", "score": 0.9}]});
    let (got, head) = search_with(
        |port| SearchBackend::Tavily {
            url: url(port, "/search"),
            key: "tk".into(),
        },
        Canned::page("application/json", &tavily.to_string()),
    )
    .await;
    assert_eq!(got.unwrap(), want);
    assert!(
        head.to_ascii_lowercase()
            .contains("authorization: bearer tk"),
        "{head}"
    );
}

#[tokio::test]
async fn search_failures_over_the_network_have_the_chapters_messages() {
    let gateway = |port| SearchBackend::Gateway {
        url: url(port, "/search"),
        key: None,
    };
    let message = |r: Result<String, super::ToolFailure>| r.unwrap_err();
    let f = message(
        search_with(
            gateway,
            Canned::new(
                "500 Internal Server Error",
                &[],
                "line one
line	two",
            ),
        )
        .await
        .0,
    );
    assert_eq!(
        (f.kind, f.message.as_str()),
        (
            ToolErrorKind::Backend,
            "web_search: backend returned 500: line one\\nline\\ttwo"
        )
    );
    let f = message(
        search_with(gateway, Canned::new("503 Service Unavailable", &[], ""))
            .await
            .0,
    );
    assert_eq!(f.message, "web_search: backend returned 503: (empty body)");
    let mut broken = Canned::new(
        "500 Internal Server Error",
        &[("content-length", "100")],
        "partial",
    );
    broken.split = Some((7, Duration::ZERO, true));
    let f = message(search_with(gateway, broken).await.0);
    assert_eq!(
        f.message,
        "web_search: backend returned 500, and its error body could not be read"
    );
    let mut broken = Canned::new("200 OK", &[("content-length", "100")], "{\"results\"");
    broken.split = Some((3, Duration::ZERO, true));
    let f = message(search_with(gateway, broken).await.0);
    assert_eq!(
        (f.kind, f.message.as_str()),
        (
            ToolErrorKind::Transport,
            "web_search: reading response failed"
        )
    );
    let big = format!("{{\"results\":[],\"pad\":\"{}\"}}", "x".repeat(262_144));
    let f = message(
        search_with(gateway, Canned::page("application/json", &big))
            .await
            .0,
    );
    assert_eq!(f.message, "web_search: response body exceeded 262144 bytes");
    let f = message(
        search_with(gateway, Canned::new("200 OK", &[], vec![0xff, 0xfe]))
            .await
            .0,
    );
    assert_eq!(f.message, "web_search: response body was not valid UTF-8");
    for bad in ["not json", "{}", "{\"results\":[{\"title\":\"T\"}]}"] {
        let f = message(
            search_with(gateway, Canned::page("application/json", bad))
                .await
                .0,
        );
        assert_eq!(f.message, "web_search: malformed search response", "{bad}");
    }
    let f = message(
        search_with(
            gateway,
            Canned::page(
                "application/json",
                "{\"results\":[{\"url\":\"u\"},{\"url\":\"\"}]}",
            ),
        )
        .await
        .0,
    );
    assert_eq!(
        f.message,
        "web_search: malformed search response: result 1 has an empty url"
    );
    // Nothing listening: the request fails.
    let closed = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let web = WebPlugin::new(TestNet::new(&[]), Some(gateway(port)));
    let f = web
        .call("promptforge/web/search", &json!({"query": "q"}))
        .await
        .unwrap_err();
    assert_eq!(
        (f.kind, f.message.as_str()),
        (ToolErrorKind::Transport, "web_search: request failed")
    );
}

// ---------------------------------------------------------------------------------------------
// The whole fetch pipeline over the scripted network: every rule and message of chapter 13.
// ---------------------------------------------------------------------------------------------

fn scripted() -> super::ScriptedNetwork {
    let page = |ct: &str, body: &str| json!({"status": 200, "headers": {"content-type": ct}, "body": body});
    let redirect = |to: &str| json!({"status": 302, "headers": {"location": to}});
    let article = format!(
        "<html><body><nav>Menu</nav><article><p>{}</p></article></body></html>",
        "Words of the article, long enough to count as its main content. ".repeat(4)
    );
    let mut pages = serde_json::Map::new();
    for (url, value) in [
        ("https://e.com/", page("text/html; charset=utf-8", &article)),
        ("https://e.com/q?x=1", page("text/plain", "query kept")),
        (
            "https://e.com/short",
            page(
                "text/html",
                "<p>tiny</p><table><tr><td>row</td></tr></table>",
            ),
        ),
        (
            "https://e.com/data",
            page("application/ld+json", r#"{"a":1}"#),
        ),
        ("https://e.com/xml", page("text/xml", "<a/>")),
        ("https://e.com/csv", page("text/csv", "a,b")),
        ("https://e.com/pdf?k=v", page("application/pdf", "%PDF")),
        ("https://e.com/svg", page("image/svg+xml", "<svg/>")),
        ("https://e.com/bad-type", page("not a type", "x")),
        ("https://e.com/none", json!({"status": 200, "body": "x"})),
        (
            "https://e.com/odd",
            page("text/plain; charset=Not-A-Charset", "x"),
        ),
        (
            "https://e.com/latin",
            json!({"status": 200, "headers": {"content-type": "text/plain; charset=ISO-8859-1"}, "body_base64": "Y2Fm6Q=="}),
        ),
        (
            "https://e.com/missing?k=v",
            json!({"status": 404, "headers": {"content-type": "text/html"}, "body": "gone"}),
        ),
        (
            "https://e.com/big",
            json!({"status": 200, "headers": {"content-type": "application/json", "content-length": "8388609"}, "body": "{}"}),
        ),
        ("https://e.com/slow", json!({"timeout": "total"})),
        ("https://e.com/slow-connect", json!({"timeout": "connect"})),
        (
            "https://e.com/slow-body",
            json!({"status": 200, "headers": {"content-type": "text/plain"}, "body": "abc", "timeout": "body"}),
        ),
        (
            "https://e.com/cut",
            json!({"status": 200, "headers": {"content-type": "text/plain"}, "body": "abcdef", "break_after": 3}),
        ),
        (
            "https://e.com/long",
            page("text/plain", &"é".repeat(50_000)),
        ),
        ("https://e.com/r1", redirect("/r2")),
        ("https://e.com/r2", redirect("https://e.com/csv#frag")),
        ("https://e.com/to-http", redirect("http://127.0.0.1/")),
        (
            "https://e.com/to-port",
            redirect("https://e.com:8080/next?secret=1"),
        ),
        ("https://e.com/to-creds", redirect("https://u:p@e.com/")),
        (
            "https://e.com/to-literal",
            redirect("https://[::ffff:127.0.0.1]/x"),
        ),
        (
            "https://e.com/to-private",
            redirect("https://inside.e.com/"),
        ),
        ("https://e.com/loop", redirect("/loop")),
    ] {
        pages.insert(url.to_owned(), value);
    }
    let script = json!({
        "dns": {"e.com": ["10.0.0.1", "93.184.215.14"], "inside.e.com": ["10.0.0.5", "127.0.0.1"],
                "mapped.e.com": ["::ffff:1.1.1.1"], "fail.e.com": "fail"},
        "pages": pages,
    });
    super::ScriptedNetwork::parse(&script.to_string()).unwrap()
}

fn scripted_call(args: serde_json::Value) -> Result<String, String> {
    let network = scripted();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime
        .block_on(super::fetch::fetch(
            &network,
            &FetchPolicy::default(),
            &args,
        ))
        .map_err(|f| {
            assert_eq!(f.kind, ToolErrorKind::InvalidArguments);
            f.message
        })
}

fn soft(url: &str) -> String {
    scripted_call(json!({ "url": url })).unwrap()
}

fn hard(url: &str) -> String {
    scripted_call(json!({ "url": url })).unwrap_err()
}

#[test]
fn admission_and_lookups_over_the_scripted_network() {
    assert_eq!(hard("not a url"), "invalid url");
    assert_eq!(soft("http://e.com/"), "scheme not allowed: http");
    assert_eq!(soft("ftp://u:p@e.com:21/"), "scheme not allowed: ftp");
    assert_eq!(
        hard("https://u:p@e.com:8080/"),
        "url must not contain userinfo"
    );
    assert_eq!(hard("https://e.com:8080/"), "port not allowed: 8080");
    assert_eq!(
        hard("https://0177.0.0.1/"),
        "ip literal host not allowed: 127.0.0.1"
    );
    assert_eq!(
        soft("https://fail.e.com/"),
        "dns resolution failed for fail.e.com"
    );
    for host in ["unknown.e.com", "inside.e.com", "mapped.e.com"] {
        assert_eq!(
            hard(&format!("https://{host}/")),
            format!("host {host} has no allowed address")
        );
    }
    // A mixed answer keeps its public address.
    assert!(
        soft("https://e.com/")
            .starts_with("url: https://e.com/\ntruncated: false\nextraction: readability\n\n")
    );
    // As requested: the default port and the fragment dropped, the query kept.
    assert_eq!(
        soft("https://e.com:443/q?x=1#top"),
        "url: https://e.com/q?x=1\ntruncated: false\nextraction: plain\n\nquery kept"
    );
}

#[test]
fn content_types_charsets_and_limits_over_the_scripted_network() {
    let short = soft("https://e.com/short");
    assert!(
        short.contains("extraction: raw-html") && short.contains("row"),
        "{short}"
    );
    let raw = scripted_call(json!({"url": "https://e.com/", "raw": true})).unwrap();
    assert!(
        raw.contains("extraction: raw-html") && raw.contains("Menu"),
        "{raw}"
    );
    assert!(soft("https://e.com/data").ends_with("extraction: plain\n\n{\"a\":1}"));
    assert!(soft("https://e.com/xml").ends_with("\n\n<a/>"));
    assert!(soft("https://e.com/csv").ends_with("\n\na,b"));
    assert!(soft("https://e.com/latin").ends_with("\n\ncafé"));
    assert_eq!(
        soft("https://e.com/pdf?k=v"),
        "content type application/pdf from https://e.com/pdf cannot be returned as text; try an HTML version of the page or a different URL"
    );
    assert!(soft("https://e.com/svg").starts_with("content type image/svg+xml from"));
    assert!(soft("https://e.com/bad-type").starts_with("content type not a type from"));
    assert_eq!(
        soft("https://e.com/none"),
        "response from https://e.com/none declared no content type; refusing to guess its format; try a different URL"
    );
    assert_eq!(
        soft("https://e.com/odd"),
        "response from https://e.com/odd declared unknown charset Not-A-Charset; cannot decode its text"
    );
    assert_eq!(
        soft("https://e.com/missing?k=v"),
        "https://e.com/missing answered HTTP 404; try a different URL"
    );
    assert_eq!(
        soft("https://e.com/big"),
        "response from https://e.com/big exceeds the 8388608-byte size cap"
    );
    for slow in ["slow", "slow-connect"] {
        assert_eq!(
            soft(&format!("https://e.com/{slow}")),
            format!("request to https://e.com/{slow} timed out; try again or use a different URL")
        );
    }
    for broken in ["slow-body", "cut"] {
        assert_eq!(
            soft(&format!("https://e.com/{broken}")),
            format!(
                "the response body from https://e.com/{broken} could not be read; try again or use a different URL"
            )
        );
    }
    assert_eq!(
        soft("https://e.com/nowhere?k=v#f"),
        "fetch failed for https://e.com/nowhere?k=v: network error; try a different URL"
    );
    // max_chars counts characters and is lowered to the policy's limit.
    let long = soft("https://e.com/long");
    assert!(long.contains("truncated: true"));
    assert_eq!(long.rsplit("\n\n").next().unwrap().chars().count(), 40_000);
    let five = scripted_call(json!({"url": "https://e.com/long", "max_chars": 5})).unwrap();
    assert!(
        five.ends_with("\n\néé\u{e9}éé") && five.contains("truncated: true"),
        "{five}"
    );
    let big = scripted_call(json!({"url": "https://e.com/long", "max_chars": 1_000_000})).unwrap();
    assert_eq!(big.rsplit("\n\n").next().unwrap().chars().count(), 40_000);
    let exact = scripted_call(json!({"url": "https://e.com/csv", "max_chars": 3})).unwrap();
    assert!(exact.contains("truncated: false"), "{exact}");
}

#[test]
fn redirects_over_the_scripted_network() {
    assert!(soft("https://e.com/r1").starts_with("url: https://e.com/csv\n"));
    assert_eq!(
        soft("https://e.com/to-http"),
        "redirect from https://e.com/to-http to http://127.0.0.1/ refused: refusing https to http downgrade"
    );
    assert_eq!(
        soft("https://e.com/to-port"),
        "redirect from https://e.com/to-port to https://e.com:8080/next refused: port not allowed: 8080"
    );
    assert_eq!(
        soft("https://e.com/to-creds"),
        "redirect from https://e.com/to-creds to https://e.com/ refused: url must not contain userinfo"
    );
    assert_eq!(
        soft("https://e.com/to-literal"),
        "redirect from https://e.com/to-literal to https://[::ffff:127.0.0.1]/x refused: ip literal host not allowed: ::ffff:127.0.0.1"
    );
    assert_eq!(
        hard("https://e.com/to-private"),
        "host inside.e.com has no allowed address"
    );
    assert_eq!(
        soft("https://e.com/loop"),
        "redirect from https://e.com/loop to https://e.com/loop refused: exceeded max redirects (5)"
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Arbitrary redirect chains and targets never panic, never pass the hop cap, and
        /// every fetch ends in a page, a soft text or a hard failure.
        #[test]
        fn arbitrary_redirect_chains_end_cleanly(
            hops in proptest::collection::vec(
                prop_oneof![
                    Just("/next".to_owned()),
                    Just("http://e.com/".to_owned()),
                    Just("https://[::1]/".to_owned()),
                    Just("https://u@e.com/".to_owned()),
                    Just("https://e.com:0/".to_owned()),
                    Just("//other.test/x".to_owned()),
                    "[ -~]{0,20}",
                ],
                0..8,
            ),
        ) {
            let mut pages = serde_json::Map::new();
            for (i, to) in hops.iter().enumerate() {
                let location = if to == "/next" { format!("/h{}", i + 1) } else { to.clone() };
                pages.insert(
                    format!("https://e.com/h{i}"),
                    json!({"status": 301, "headers": {"location": location}}),
                );
            }
            pages.insert(
                format!("https://e.com/h{}", hops.len()),
                json!({"status": 200, "headers": {"content-type": "text/plain"}, "body": "end"}),
            );
            let script = json!({"dns": {"e.com": ["93.184.215.14"], "other.test": ["10.1.1.1"]},
                                "pages": pages});
            let network = super::super::ScriptedNetwork::parse(&script.to_string()).unwrap();
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let result = runtime.block_on(super::super::fetch::fetch(
                &network,
                &FetchPolicy::default(),
                &json!({"url": "https://e.com/h0"}),
            ));
            match result {
                Ok(text) => prop_assert!(!text.is_empty()),
                Err(failure) => prop_assert_eq!(failure.kind, ToolErrorKind::InvalidArguments),
            }
        }
    }
}

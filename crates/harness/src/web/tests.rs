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
    let mut policy = FetchPolicy::default();
    policy.loopback = Some(LoopbackPermission {
        port,
        addresses: Vec::new(),
    });
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

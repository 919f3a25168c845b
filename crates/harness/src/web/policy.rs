//! The fetch policy's rules that run before any network access (chapter 13, "The fetch
//! policy", "Staying off the internal network", "Redirects"): URL admission in its fixed order,
//! the built-in table of blocked address ranges, and the check every redirect hop passes.
//!
//! URLs are parsed and serialised as the WHATWG URL Standard does (the `url` crate), which
//! also reads every IPv4 notation (dotted, octal, hexadecimal, a single integer, shortened)
//! as the address it names, so an IP-literal host is recognised however it is written and
//! printed in canonical form (rulings 6 and 8). Only the policy itself is written here.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;
use std::time::Duration;

use ipnet::{Ipv4Net, Ipv6Net};
use url::{Host, Url};

/// The most redirect hops one fetch follows.
pub const MAX_REDIRECTS: usize = 5;

/// The fetch policy's limits (chapter 13, "The fetch policy"). The Harness sets them and a
/// prompt cannot change them; per-call arguments can only ask for less. The address and URL
/// rules are fixed and live in the functions of this module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchPolicy {
    /// The body byte cap, counted after decompression.
    pub body_cap: usize,
    /// The most characters one fetch returns (the `max_chars` maximum).
    pub max_chars: usize,
    /// The connect limit, for each request (redirects included).
    pub connect_timeout: Duration,
    /// The whole-request limit: one fetch, its redirects included.
    pub total_timeout: Duration,
    /// The `User-Agent` header.
    pub user_agent: String,
    /// Test builds only: let the tool reach test servers on the loopback interface.
    #[cfg(test)]
    pub(crate) loopback: Option<LoopbackPermission>,
}

impl Default for FetchPolicy {
    fn default() -> Self {
        FetchPolicy {
            body_cap: 8 * 1024 * 1024,
            max_chars: 40_000,
            connect_timeout: Duration::from_secs(5),
            total_timeout: Duration::from_secs(20),
            user_agent: "harness-webfetch/0.0".to_owned(),
            #[cfg(test)]
            loopback: None,
        }
    }
}

/// A permission that exists only in test builds: admission takes `http` on `port` in place of
/// `https` on 80 and 443 (every other rule unchanged), and the listed loopback addresses pass
/// the address check, so tests can run real servers on 127.0.0.1. No release build has it.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoopbackPermission {
    pub(crate) port: u16,
    pub(crate) addresses: Vec<IpAddr>,
}

impl FetchPolicy {
    /// Run the URL admission rules under this policy (see [`admit`]).
    pub fn admit(&self, url: &str) -> Result<Url, Refusal> {
        admit_with(url, &self.rules())
    }

    #[cfg(not(test))]
    fn rules(&self) -> Rules<'static> {
        Rules::DEFAULT
    }

    #[cfg(test)]
    fn rules(&self) -> Rules<'_> {
        match &self.loopback {
            Some(permission) => Rules {
                scheme: "http",
                ports: std::slice::from_ref(&permission.port),
            },
            None => Rules::DEFAULT,
        }
    }

    /// Check one redirect hop under this policy (see [`check_redirect`]).
    pub fn check_redirect(&self, from: &Url, location: &str, hop: usize) -> Result<Url, String> {
        check_redirect_with(from, location, hop, &self.rules())
    }

    /// The addresses of a lookup a fetch may connect to (see [`allowed_addresses`]).
    pub fn allowed_addresses(&self, addresses: &[IpAddr]) -> Option<Vec<IpAddr>> {
        #[cfg(test)]
        if let Some(permission) = &self.loopback {
            let allowed: Vec<IpAddr> = addresses
                .iter()
                .copied()
                .filter(|a| !is_blocked(*a) || permission.addresses.contains(a))
                .collect();
            return (!allowed.is_empty()).then_some(allowed);
        }
        allowed_addresses(addresses)
    }
}

/// Why the URL admission rules refuse a URL, in the order they are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The URL does not parse.
    Invalid,
    /// Its scheme is not `https` (soft: the model may retry).
    Scheme(String),
    /// It has a `user:pass@` part.
    Userinfo,
    /// Its effective port is neither 80 nor 443.
    Port(u16),
    /// Its host is an IP literal (shown in canonical form).
    IpLiteral(IpAddr),
}

impl Refusal {
    /// The spec's text for the refusal.
    pub fn message(&self) -> String {
        match self {
            Refusal::Invalid => "invalid url".to_owned(),
            Refusal::Scheme(scheme) => format!("scheme not allowed: {scheme}"),
            Refusal::Userinfo => "url must not contain userinfo".to_owned(),
            Refusal::Port(port) => format!("port not allowed: {port}"),
            Refusal::IpLiteral(address) => format!("ip literal host not allowed: {address}"),
        }
    }

    /// Whether a `url` argument that breaks this rule fails the call (hard) rather than
    /// coming back as text the model reads (soft). Only the scheme rule is soft.
    pub fn is_hard(&self) -> bool {
        !matches!(self, Refusal::Scheme(_))
    }
}

/// Run the URL admission rules on `url`: parse, scheme, credentials, port, host. The admitted
/// URL is returned with its fragment dropped (a fragment never goes to the server).
pub fn admit(url: &str) -> Result<Url, Refusal> {
    admit_with(url, &Rules::DEFAULT)
}

/// The scheme and ports admission accepts: `https` on 80 and 443, except under the test-only
/// loopback permission.
#[derive(Debug, Clone, Copy)]
struct Rules<'a> {
    scheme: &'a str,
    ports: &'a [u16],
}

impl Rules<'_> {
    const DEFAULT: Rules<'static> = Rules {
        scheme: "https",
        ports: &[80, 443],
    };
}

fn admit_with(url: &str, rules: &Rules<'_>) -> Result<Url, Refusal> {
    let parsed = Url::parse(url).map_err(|_| Refusal::Invalid)?;
    admit_parsed(parsed, rules)
}

fn admit_parsed(mut url: Url, rules: &Rules<'_>) -> Result<Url, Refusal> {
    if url.scheme() != rules.scheme {
        return Err(Refusal::Scheme(url.scheme().to_owned()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Refusal::Userinfo);
    }
    let port = url.port_or_known_default().unwrap_or(443);
    if !rules.ports.contains(&port) {
        return Err(Refusal::Port(port));
    }
    match url.host() {
        Some(Host::Domain(_)) => {}
        Some(Host::Ipv4(v4)) => return Err(Refusal::IpLiteral(IpAddr::V4(v4))),
        Some(Host::Ipv6(v6)) => return Err(Refusal::IpLiteral(IpAddr::V6(v6))),
        None => return Err(Refusal::Invalid),
    }
    url.set_fragment(None);
    Ok(url)
}

/// A URL as the named fetch failures show it: scheme, host, port and path only (no
/// credentials, query string or fragment).
pub fn display_url(url: &Url) -> String {
    let mut shown = format!("{}://", url.scheme());
    match url.host() {
        Some(Host::Ipv6(v6)) => shown.push_str(&format!("[{v6}]")),
        Some(host) => shown.push_str(&host.to_string()),
        None => {}
    }
    if let Some(port) = url.port() {
        shown.push_str(&format!(":{port}"));
    }
    shown.push_str(url.path());
    shown
}

/// A `Location` that does not parse, shown like a parsed one: no credentials, query string or
/// fragment.
fn shown_raw(location: &str) -> String {
    let end = location.find(['?', '#']).unwrap_or(location.len());
    let text = &location[..end];
    let (scheme, rest) = match text.find("//") {
        Some(at) => text.split_at(at + 2),
        None => ("", text),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}{}", &rest[at + 1..]),
        None => text.to_owned(),
    }
}

/// Check one redirect hop from `from` (the URL that answered) to its `Location`, on hop
/// number `hop` (1 for the first redirect). A relative `Location` is resolved against `from`.
/// `Ok` is the URL to request next (admitted, fragment dropped); `Err` is the soft refusal
/// text `redirect from {from} to {to} refused: {reason}`.
pub fn check_redirect(from: &Url, location: &str, hop: usize) -> Result<Url, String> {
    check_redirect_with(from, location, hop, &Rules::DEFAULT)
}

fn check_redirect_with(
    from: &Url,
    location: &str,
    hop: usize,
    rules: &Rules<'_>,
) -> Result<Url, String> {
    let refuse = |to: &str, reason: &str| {
        format!(
            "redirect from {} to {to} refused: {reason}",
            display_url(from)
        )
    };
    let target = match from.join(location) {
        Ok(target) => target,
        Err(_) => return Err(refuse(&shown_raw(location), &Refusal::Invalid.message())),
    };
    let to = display_url(&target);
    if hop > MAX_REDIRECTS {
        return Err(refuse(
            &to,
            &format!("exceeded max redirects ({MAX_REDIRECTS})"),
        ));
    }
    if target.scheme() == "http" && rules.scheme == "https" {
        return Err(refuse(&to, "refusing https to http downgrade"));
    }
    admit_parsed(target, rules).map_err(|refusal| refuse(&to, &refusal.message()))
}

/// The 16 blocked IPv4 ranges.
const BLOCKED_V4: [&str; 16] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "255.255.255.255/32",
];

/// The 14 blocked IPv6 ranges.
const BLOCKED_V6: [&str; 14] = [
    "::/128",
    "::1/128",
    "::/96",
    "::ffff:0:0/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "2001:db8::/32",
    "2002::/16",
    "3fff::/20",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
];

fn tables() -> &'static (Vec<Ipv4Net>, Vec<Ipv6Net>) {
    static TABLES: OnceLock<(Vec<Ipv4Net>, Vec<Ipv6Net>)> = OnceLock::new();
    TABLES.get_or_init(|| {
        (
            BLOCKED_V4.iter().filter_map(|r| r.parse().ok()).collect(),
            BLOCKED_V6.iter().filter_map(|r| r.parse().ok()).collect(),
        )
    })
}

/// Whether a resolved address is blocked: inside a range of the built-in table. An IPv4
/// address written in IPv6 form (IPv4-mapped or IPv4-compatible) is judged by its embedded
/// value too, and both whole forms are blocked anyway.
pub fn is_blocked(address: IpAddr) -> bool {
    let (v4, v6) = tables();
    match address {
        IpAddr::V4(a) => v4.iter().any(|net| net.contains(&a)),
        IpAddr::V6(a) => {
            v6.iter().any(|net| net.contains(&a))
                || embedded_v4(a).is_some_and(|e| v4.iter().any(|net| net.contains(&e)))
        }
    }
}

/// The IPv4 value inside an IPv4-mapped (`::ffff:a.b.c.d`) or IPv4-compatible (`::a.b.c.d`)
/// address.
fn embedded_v4(address: Ipv6Addr) -> Option<Ipv4Addr> {
    address.to_ipv4_mapped().or_else(|| {
        let s = address.segments();
        (s[..6] == [0; 6]).then(|| {
            let [a, b] = s[6].to_be_bytes();
            let [c, d] = s[7].to_be_bytes();
            Ipv4Addr::new(a, b, c, d)
        })
    })
}

/// The addresses a fetch may connect to, from a name's lookup, in lookup order; `None` when
/// every one is blocked or there were none (`host {host} has no allowed address`).
pub fn allowed_addresses(addresses: &[IpAddr]) -> Option<Vec<IpAddr>> {
    let allowed: Vec<IpAddr> = addresses
        .iter()
        .copied()
        .filter(|a| !is_blocked(*a))
        .collect();
    (!allowed.is_empty()).then_some(allowed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    fn refusal(url: &str) -> String {
        admit(url).unwrap_err().message()
    }

    #[test]
    fn admission_checks_run_in_order_and_report_the_first() {
        assert_eq!(refusal("not a url"), "invalid url");
        assert_eq!(refusal("http://example.com/"), "scheme not allowed: http");
        assert!(!admit("ftp://u:p@1.2.3.4:21/").unwrap_err().is_hard());
        assert_eq!(
            refusal("https://user:pass@example.com/"),
            "url must not contain userinfo"
        );
        assert_eq!(
            refusal("https://user@127.0.0.1:8080/"),
            "url must not contain userinfo"
        );
        assert_eq!(
            refusal("https://example.com:8080/"),
            "port not allowed: 8080"
        );
        assert_eq!(refusal("https://127.0.0.1:8080/"), "port not allowed: 8080");
        assert!(admit("https://example.com:80/").is_ok());
        assert!(Refusal::Userinfo.is_hard() && Refusal::Port(1).is_hard());
    }

    #[test]
    fn ip_literals_are_refused_in_every_notation_in_canonical_form() {
        for (url, shown) in [
            ("https://1.2.3.4/", "1.2.3.4"),
            ("https://0177.0.0.1/", "127.0.0.1"),
            ("https://2130706433/", "127.0.0.1"),
            ("https://127.1/", "127.0.0.1"),
            ("https://0x7f.0.0.1/", "127.0.0.1"),
            ("https://[::1]/", "::1"),
            ("https://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1"),
            ("https://[::127.0.0.1]/", "::7f00:1"),
            ("https://[2001:DB8:0:0:0:0:0:1]/", "2001:db8::1"),
        ] {
            assert_eq!(
                refusal(url),
                format!("ip literal host not allowed: {shown}"),
                "{url}"
            );
        }
    }

    #[test]
    fn fragments_are_dropped_and_queries_kept() {
        let url = admit("https://example.com:443/path?q=1#frag").unwrap();
        assert_eq!(url.as_str(), "https://example.com/path?q=1");
        let url = Url::parse("https://user:pass@host.example:8443/a/b?x=secret#frag").unwrap();
        assert_eq!(display_url(&url), "https://host.example:8443/a/b");
    }

    #[test]
    fn the_blocked_tables_cover_whole_ranges_and_nothing_next_to_them() {
        for blocked in [
            "0.0.0.0",
            "10.1.2.3",
            "100.64.0.0",
            "100.127.255.255",
            "127.0.0.1",
            "127.255.255.255",
            "169.254.169.254",
            "172.16.0.0",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:1.1.1.1",
            "::ffff:169.254.169.254",
            "::169.254.169.254",
            "64:ff9b::7f00:1",
            "64:ff9b:1::1",
            "100::1",
            "2001:db8::1",
            "2002::1",
            "3fff::1",
            "fc00::",
            "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "fe80::1",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(is_blocked(blocked.parse().unwrap()), "{blocked}");
        }
        for allowed in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.216.34",
            "11.0.0.0",
            "172.32.0.0",
            "223.255.255.255",
            "100.128.0.0",
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "2001:db9::1",
            "3fff:1000::1",
        ] {
            assert!(!is_blocked(allowed.parse().unwrap()), "{allowed}");
        }
    }

    #[test]
    fn a_mixed_lookup_keeps_only_public_addresses() {
        let public: IpAddr = "93.184.216.34".parse().unwrap();
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(allowed_addresses(&[public, loopback]), Some(vec![public]));
        assert_eq!(
            allowed_addresses(&["10.0.0.5".parse().unwrap(), loopback]),
            None
        );
        assert_eq!(allowed_addresses(&[]), None);
    }

    #[test]
    fn redirect_hops_are_checked_in_order() {
        let from = Url::parse("https://example.com/start?secret=1").unwrap();
        assert_eq!(
            check_redirect(&from, "https://example.com:8080/next", 1).unwrap_err(),
            "redirect from https://example.com/start to https://example.com:8080/next refused: port not allowed: 8080"
        );
        assert_eq!(
            check_redirect(&from, "http://127.0.0.1/", 1).unwrap_err(),
            "redirect from https://example.com/start to http://127.0.0.1/ refused: refusing https to http downgrade"
        );
        assert_eq!(
            check_redirect(&from, "http://example.com/", 6).unwrap_err(),
            "redirect from https://example.com/start to http://example.com/ refused: exceeded max redirects (5)"
        );
        assert_eq!(
            check_redirect(&from, "https://[::ffff:127.0.0.1]/x", 2).unwrap_err(),
            "redirect from https://example.com/start to https://[::ffff:127.0.0.1]/x refused: ip literal host not allowed: ::ffff:127.0.0.1"
        );
        assert_eq!(
            check_redirect(&from, "ftp://example.com/f", 1).unwrap_err(),
            "redirect from https://example.com/start to ftp://example.com/f refused: scheme not allowed: ftp"
        );
        let next = check_redirect(&from, "/next?q=2#frag", 5).unwrap();
        assert_eq!(next.as_str(), "https://example.com/next?q=2");
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;

        /// Arbitrary text, or something shaped like an absolute or relative URL with hosts in
        /// every IP notation, ports, userinfo and fragments.
        fn url_like() -> impl Strategy<Value = String> {
            prop_oneof![
                "\\PC{0,60}",
                "(https?|ftp|HTTPS)://([a-z]{1,5}(:[a-z]{0,3})?@)?([a-z0-9-]{1,10}(\\.[a-z]{2,4})?|0x[0-9a-f]{1,8}|0[0-7]{1,4}(\\.[0-9]{1,3}){0,3}|[0-9]{1,10}|\\[[0-9a-f:.]{2,30}\\])(:[0-9]{1,5})?(/[a-z0-9%?#=&./]{0,20})?",
                "(/|\\.\\./|//)[a-z0-9.:@%?#=&/\\[\\]]{0,30}",
            ]
        }

        proptest! {
            /// Any text goes through admission and any chain of redirects without a panic,
            /// and whatever is admitted is an https URL on a DNS name.
            #[test]
            fn admission_and_redirects_never_panic(
                first in url_like(),
                hops in proptest::collection::vec(url_like(), 0..8),
            ) {
                let mut current = admit(&first).ok();
                if let Some(url) = &current {
                    prop_assert_eq!(url.scheme(), "https");
                    prop_assert!(matches!(url.host(), Some(Host::Domain(_))));
                }
                for (i, location) in hops.iter().enumerate() {
                    let Some(from) = current.take() else { break };
                    current = check_redirect(&from, location, i + 1).ok();
                    if let Some(url) = &current {
                        prop_assert!(i < MAX_REDIRECTS);
                        prop_assert_eq!(url.scheme(), "https");
                        prop_assert!(matches!(url.host(), Some(Host::Domain(_))));
                        prop_assert!(url.fragment().is_none());
                    }
                }
            }
        }
    }
}

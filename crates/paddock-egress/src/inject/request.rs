//! One request on an intercepted connection, decided by a pure function: may it be sent (its target
//! must be exactly the host the connection was opened to, so a shared front end cannot be asked for
//! another host with the secret attached), and where do secret values go (the header fields each
//! secret is bound to, the query string only when its binding says so, never the body or the path).
//!
//! What this module does not do: talk to anyone. The caller answers a refusal with a 403 of the
//! proxy's own and sends nothing upstream.

use hyper::header::{HeaderValue, HOST};
use hyper::http::request::Parts;
use hyper::http::uri::{Authority, PathAndQuery, Uri};
use hyper::Method;
use paddock_types::DomainName;

use super::secret::{Field, SecretName, SecretSet};

/// The host and port an intercepted connection was opened to (its SNI name, and the CONNECT port or
/// the original destination's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) host: &'a DomainName,
    pub(crate) port: u16,
}

/// Why a request is answered by the proxy with 403 instead of being forwarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// A tunnel inside the tunnel.
    #[error("CONNECT inside a connection intercepted for {host}")]
    Connect { host: DomainName },
    /// No `Host` header (HTTP/1.1 requires one).
    #[error("no Host header; requests on this connection must name {host}")]
    NoHost { host: DomainName },
    /// More than one `Host` header.
    #[error("{count} Host headers; requests on this connection must name {host} once")]
    ManyHosts { count: usize, host: DomainName },
    /// A `Host` naming another host (or port) than the connection's.
    #[error("Host {found:?} is not {host}:{port}, the host this connection was opened to")]
    HostMismatch {
        found: String,
        host: DomainName,
        port: u16,
    },
    /// An absolute-form URI naming another host (or port) than the connection's.
    #[error("the request URI names {found:?}, not {host}:{port}, the host this connection was opened to")]
    UriMismatch {
        found: String,
        host: DomainName,
        port: u16,
    },
    /// Substitution produced something that is not a valid header value or URI (not expected: values
    /// are checked when a secret is made).
    #[error("the request cannot carry the substituted value")]
    Invalid,
}

/// Checks that the request targets `target`, then replaces placeholders where their secrets'
/// bindings allow; returns the names of the secrets put in. On refusal, `parts` carries no value.
pub(crate) fn prepare_request(
    secrets: &SecretSet,
    target: Target<'_>,
    parts: &mut Parts,
) -> Result<Vec<SecretName>, Refusal> {
    check_target(target, parts)?;
    let mut used: Vec<SecretName> = Vec::new();
    let mut note = |names: Vec<SecretName>| {
        for n in names {
            if !used.contains(&n) {
                used.push(n);
            }
        }
    };
    let mut failed = false;
    for (name, value) in parts.headers.iter_mut() {
        let Some((real, names)) =
            secrets.substitute(target.host, Field::Header(name.as_str()), value.as_bytes())
        else {
            continue;
        };
        match HeaderValue::from_bytes(&real) {
            Ok(mut v) => {
                v.set_sensitive(true);
                *value = v;
                note(names);
            }
            Err(_) => failed = true,
        }
    }
    if !failed && secrets.any_query_bound_to(target.host) {
        if let Some(query) = parts.uri.query() {
            if let Some((real, names)) = secrets.substitute(target.host, Field::Query, query.as_bytes()) {
                match with_query(&parts.uri, &real) {
                    Some(uri) => {
                        parts.uri = uri;
                        note(names);
                    }
                    None => failed = true,
                }
            }
        }
    }
    if failed {
        // Nothing half-substituted is kept.
        parts.headers.clear();
        parts.uri = Uri::default();
        return Err(Refusal::Invalid);
    }
    Ok(used)
}

fn check_target(target: Target<'_>, parts: &Parts) -> Result<(), Refusal> {
    let host = target.host.clone();
    if parts.method == Method::CONNECT {
        return Err(Refusal::Connect { host });
    }
    let mut hosts = parts.headers.get_all(HOST).iter();
    let (Some(value), None) = (hosts.next(), hosts.next()) else {
        let count = parts.headers.get_all(HOST).iter().count();
        return Err(if count == 0 {
            Refusal::NoHost { host }
        } else {
            Refusal::ManyHosts { count, host }
        });
    };
    if !value.to_str().is_ok_and(|v| names_target(v, target)) {
        return Err(Refusal::HostMismatch {
            found: shown(value.as_bytes()),
            host,
            port: target.port,
        });
    }
    if let Some(authority) = parts.uri.authority() {
        if !names_target(authority.as_str(), target) {
            return Err(Refusal::UriMismatch {
                found: shown(authority.as_str().as_bytes()),
                host,
                port: target.port,
            });
        }
    }
    Ok(())
}

/// Whether `text` (`name` or `name:port`) is exactly the target: the same name (case and one
/// trailing dot aside), no user information, and the target's port if it names one.
fn names_target(text: &str, target: Target<'_>) -> bool {
    let Ok(authority) = text.parse::<Authority>() else {
        return false;
    };
    if authority.as_str().contains('@') {
        return false;
    }
    let same_name = authority
        .host()
        .parse::<DomainName>()
        .is_ok_and(|n| n == *target.host);
    let port_ok = match authority.port() {
        None => true,
        Some(p) => p.as_u16() == target.port,
    };
    same_name && port_ok
}

/// Sandbox-supplied text for a message: at most 100 characters, control characters replaced.
fn shown(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .take(100)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// `uri` with its query string replaced by `query`.
fn with_query(uri: &Uri, query: &[u8]) -> Option<Uri> {
    let mut pq = Vec::with_capacity(uri.path().len() + 1 + query.len());
    pq.extend_from_slice(uri.path().as_bytes());
    pq.push(b'?');
    pq.extend_from_slice(query);
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(PathAndQuery::from_maybe_shared(pq).ok()?);
    Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use hyper::Request;
    use proptest::prelude::*;

    use super::*;
    use crate::inject::secret::tests::set;

    const GH: &str = "ghp_real";
    const KEY_ENCODED: &str = "k%26y%3D1%202";
    const KEY: &str = "k&y=1 2";

    fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = Request::builder().method(method).uri(uri);
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        b.body(()).expect("request").into_parts().0
    }

    fn target(host: &DomainName) -> Target<'_> {
        Target { host, port: 443 }
    }

    #[test]
    fn values_go_only_into_bound_fields_of_requests_to_the_intercepted_host() {
        let s = set();
        let gh: DomainName = "api.github.com".parse().expect("host");
        let mut p = parts(
            "GET",
            "/user?k=paddock-secret:KEY&g=paddock-secret:GH",
            &[
                ("host", "API.github.com.:443"),
                ("authorization", "Bearer paddock-secret:GH"),
                ("x-echo", "paddock-secret:GH"),
                ("x-api-key", "paddock-secret:KEY"),
            ],
        );
        let used = prepare_request(&s, target(&gh), &mut p).expect("allowed");
        assert_eq!(used.len(), 2);
        assert_eq!(p.headers["authorization"], format!("Bearer {GH}").as_str());
        assert!(p.headers["authorization"].is_sensitive());
        assert_eq!(p.headers["x-echo"], "paddock-secret:GH");
        assert_eq!(p.headers["x-api-key"], KEY);
        assert_eq!(
            p.uri.to_string(),
            format!("/user?k={KEY_ENCODED}&g=paddock-secret:GH")
        );
    }

    #[test]
    fn requests_for_another_host_are_refused() {
        let s = set();
        let gh: DomainName = "api.github.com".parse().expect("host");
        type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);
        let cases: [Case<'_>; 8] = [
            ("GET", "/", &[("host", "evil.test")]),
            ("GET", "/", &[("host", "api.github.com:8443")]),
            ("GET", "/", &[("host", "user@api.github.com")]),
            ("GET", "/", &[("host", "140.82.112.5")]),
            ("GET", "/", &[]),
            ("GET", "/", &[("host", "api.github.com"), ("host", "evil.test")]),
            ("GET", "https://evil.test/x", &[("host", "api.github.com")]),
            ("CONNECT", "evil.test:443", &[("host", "api.github.com")]),
        ];
        for (method, uri, headers) in cases {
            let mut all = headers.to_vec();
            all.push(("authorization", "Bearer paddock-secret:GH"));
            let mut p = parts(method, uri, &all);
            assert!(
                prepare_request(&s, target(&gh), &mut p).is_err(),
                "{method} {uri} {headers:?}"
            );
            assert_eq!(p.headers["authorization"], "Bearer paddock-secret:GH");
        }
        let mut p = parts("GET", "https://api.github.com/x", &[("host", "api.github.com")]);
        assert_eq!(prepare_request(&s, target(&gh), &mut p), Ok(vec![]));
        let refusal = prepare_request(&s, target(&gh), &mut parts("GET", "/", &[("host", "evil.test")]))
            .expect_err("refused");
        assert_eq!(
            refusal.to_string(),
            "Host \"evil.test\" is not api.github.com:443, the host this connection was opened to"
        );
    }

    /// A Host header value, and whether it names api.github.com:443.
    fn host_values() -> impl Strategy<Value = (&'static str, bool)> {
        prop::sample::select(vec![
            ("api.github.com", true),
            ("API.GITHUB.COM", true),
            ("api.github.com.", true),
            ("api.github.com:443", true),
            ("api.github.com:8443", false),
            ("evil.test", false),
            ("github.com", false),
            ("x.api.github.com", false),
            ("api.github.com.evil.test", false),
            ("user@api.github.com", false),
            ("127.0.0.1", false),
            ("[::1]:443", false),
        ])
    }

    /// A request URI, and whether it names api.github.com:443 (or nothing).
    fn uris() -> impl Strategy<Value = (&'static str, bool)> {
        prop::sample::select(vec![
            ("/", true),
            ("/a?q=paddock-secret:GH", true),
            ("/a?q=paddock-secret:KEY&r=paddock-secret%3AKEY", true),
            ("/paddock-secret:KEY?x=1", true),
            ("https://api.github.com/a?k=paddock-secret:KEY", true),
            ("https://evil.test/a?k=paddock-secret:KEY", false),
            ("http://api.github.com:80/", false),
            ("*", true),
        ])
    }

    fn header_names() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "authorization",
            "Authorization",
            "x-api-key",
            "x-echo",
            "cookie",
            "x-forwarded-host",
        ])
    }

    fn header_values() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "Bearer paddock-secret:GH",
            "paddock-secret:KEY",
            "paddock-secret:GH paddock-secret:KEY",
            "paddock-secret:NOPE",
            "plain",
        ])
    }

    proptest! {
        /// Whatever the sandbox sends: a request is forwarded only when its Host (exactly one) and
        /// URI name the intercepted host, and then each value is only in a field its secret is bound
        /// to: GH in Authorization, KEY in X-Api-Key and (percent-encoded) the query string.
        #[test]
        fn a_secret_goes_only_where_bound_and_only_to_its_host(
            hosts in prop::collection::vec(host_values(), 0..3),
            (uri, uri_ok) in uris(),
            headers in prop::collection::vec((header_names(), header_values()), 0..5),
        ) {
            let s = set();
            let gh: DomainName = "api.github.com".parse().expect("host");
            let mut list: Vec<(&str, &str)> = hosts.iter().map(|(h, _)| ("host", *h)).collect();
            list.extend(headers.iter().copied());
            let mut p = parts("GET", uri, &list);
            let expect_ok = hosts.len() == 1 && hosts[0].1 && uri_ok;
            let result = prepare_request(&s, target(&gh), &mut p);
            prop_assert_eq!(result.is_ok(), expect_ok, "{:?} {:?}", result, list);
            for (name, value) in &p.headers {
                let v = value.to_str().unwrap_or_default();
                let n = name.as_str();
                prop_assert!(n == "authorization" || !v.contains(GH), "{n}: {v}");
                prop_assert!(n == "x-api-key" || !v.contains(KEY), "{n}: {v}");
            }
            let shown = p.uri.to_string();
            prop_assert!(!shown.contains(GH) && !shown.contains(KEY));
            let (path, query) = shown.split_once('?').unwrap_or((&shown, ""));
            prop_assert!(!path.contains(KEY_ENCODED));
            if !expect_ok {
                prop_assert!(!query.contains(KEY_ENCODED));
            }
        }
    }
}

//! The `Host` of an HTTP/1 request head, parsed by `httparse`.

use paddock_types::DomainName;

use super::Progress;

const MAX_HEADERS: usize = 100;

const METHODS: [&[u8]; 9] = [
    b"GET ",
    b"POST ",
    b"PUT ",
    b"HEAD ",
    b"DELETE ",
    b"OPTIONS ",
    b"PATCH ",
    b"CONNECT ",
    b"TRACE ",
];

/// Whether `buf` starts an HTTP/1 request (a standard method and a space): `NeedMore` while it is a
/// prefix of one, `Done(false)` for anything else (another protocol, such as SSH's `SSH-2.0-`).
pub(super) fn looks_like_http(buf: &[u8]) -> Progress<bool> {
    if METHODS.iter().any(|m| buf.starts_with(m)) {
        Progress::Done(true)
    } else if METHODS.iter().any(|m| m.starts_with(buf)) {
        Progress::NeedMore
    } else {
        Progress::Done(false)
    }
}

/// The host named by the request at the start of `buf` (`Done(None)` when it names an address or no
/// host: such a request is decided on its address alone).
pub(super) fn request_host(buf: &[u8]) -> Progress<Option<DomainName>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) => Progress::NeedMore,
        Err(_) => Progress::Malformed("not an HTTP/1 request"),
        Ok(httparse::Status::Complete(_)) => {
            let mut hosts = req.headers.iter().filter(|h| h.name.eq_ignore_ascii_case("host"));
            match (hosts.next(), hosts.next()) {
                (None, _) => Progress::Done(None),
                (Some(_), Some(_)) => Progress::Malformed("two Host headers"),
                (Some(h), None) => match std::str::from_utf8(h.value) {
                    Ok(v) => host_name(v.trim()),
                    Err(_) => Progress::Malformed("Host is not text"),
                },
            }
        }
    }
}

/// The name in `host[:port]` (or `None` for an address, `[v6]` included).
fn host_name(authority: &str) -> Progress<Option<DomainName>> {
    if authority.starts_with('[') {
        return match authority.split_once(']') {
            Some((v6, _)) if v6[1..].parse::<std::net::Ipv6Addr>().is_ok() => Progress::Done(None),
            _ => Progress::Malformed("bad IPv6 literal in Host"),
        };
    }
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    if host.parse::<std::net::Ipv4Addr>().is_ok() {
        return Progress::Done(None);
    }
    match host.parse() {
        Ok(name) => Progress::Done(Some(name)),
        Err(_) => Progress::Malformed("Host is not a valid domain name"),
    }
}

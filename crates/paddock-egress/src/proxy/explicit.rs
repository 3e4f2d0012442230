//! The explicit door: the sandbox's `HTTP_PROXY`/`HTTPS_PROXY`. `CONNECT host:port` opens a tunnel;
//! an absolute-form request (`GET http://host/path`) is forwarded once, in origin form, with
//! `Connection: close`. The proxy resolves names itself (host map or system resolver), and only names
//! a domain rule allows are resolved at all, so the proxy is no DNS tunnel.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use paddock_types::DomainName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::stream::Counted;
use super::{connect, forward, ConnError, Report};
use crate::egress::{Sandbox, Shared};
use crate::policy::{decide, decide_name, Decision, Destination, Rule};
use crate::sniff::{sniff, Sniffed};

const MAX_HEADERS: usize = 100;
/// Headers meant for the proxy (or for this hop), not forwarded.
const HOP_HEADERS: [&str; 4] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
];

/// A destination as the sandbox named it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Name(DomainName),
    Ip(IpAddr),
}

pub(super) async fn serve(
    shared: &Shared,
    sandbox: &Sandbox,
    mut client: Counted<TcpStream>,
    report: &mut Report,
) -> Result<(), ConnError> {
    let (buf, head_len) = read_head(&mut client, shared).await?;
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    if !matches!(req.parse(&buf[..head_len]), Ok(httparse::Status::Complete(_))) {
        return refuse(
            &mut client,
            report,
            "400 Bad Request",
            Rule::Unreadable {
                reason: "malformed proxy request".into(),
            },
        )
        .await;
    }
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return refuse(
            &mut client,
            report,
            "400 Bad Request",
            Rule::Unreadable {
                reason: "malformed proxy request".into(),
            },
        )
        .await;
    };
    let leftover = buf[head_len..].to_vec();
    if method == "CONNECT" {
        let authority = parse_authority(target, None);
        drop(buf); // not kept for the tunnel's lifetime
        let Some((dest, port)) = authority else {
            return refuse(
                &mut client,
                report,
                "400 Bad Request",
                Rule::Unreadable {
                    reason: "bad CONNECT authority".into(),
                },
            )
            .await;
        };
        let Some(ip) = choose(shared, sandbox, &dest, port, report).await else {
            return deny(&mut client, report).await;
        };
        let upstream = match connect(shared, SocketAddr::new(ip, port)).await {
            Ok(u) => u,
            Err(e) => {
                respond(
                    &mut client,
                    "502 Bad Gateway",
                    "paddock egress: upstream connection failed\n",
                )
                .await?;
                return Err(e);
            }
        };
        client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
            .map_err(ConnError::Respond)?;
        // Only a TLS tunnel to a host a secret is bound to, whose SNI is that host, is intercepted.
        let bound = match &dest {
            Target::Name(n) if sandbox.secrets().any_bound_to(n) => Some(n.clone()),
            _ => None,
        };
        match bound {
            Some(name) => {
                let (sniffed, prefix) = sniff(&mut client, leftover, shared.sniff)
                    .await
                    .map_err(ConnError::Sniff)?;
                let tls_name = match &sniffed {
                    Sniffed::Tls(Some(sni)) if *sni == name => Some(&name),
                    _ => None,
                };
                forward(shared, sandbox, client, prefix, tls_name, upstream, report).await
            }
            None => forward(shared, sandbox, client, leftover, None, upstream, report).await,
        }
    } else if let Some(rest) = target.strip_prefix("http://") {
        let (authority, path) = rest.find('/').map_or((rest, "/"), |i| (&rest[..i], &rest[i..]));
        let Some((dest, port)) = parse_authority(authority, Some(80)) else {
            return refuse(
                &mut client,
                report,
                "400 Bad Request",
                Rule::Unreadable {
                    reason: "bad request URI".into(),
                },
            )
            .await;
        };
        let Some(ip) = choose(shared, sandbox, &dest, port, report).await else {
            return deny(&mut client, report).await;
        };
        let upstream = match connect(shared, SocketAddr::new(ip, port)).await {
            Ok(u) => u,
            Err(e) => {
                respond(
                    &mut client,
                    "502 Bad Gateway",
                    "paddock egress: upstream connection failed\n",
                )
                .await?;
                return Err(e);
            }
        };
        let mut head = format!("{method} {path} HTTP/1.{}\r\n", req.version.unwrap_or(1)).into_bytes();
        for h in req.headers.iter() {
            if !HOP_HEADERS.iter().any(|hop| h.name.eq_ignore_ascii_case(hop)) {
                head.extend_from_slice(h.name.as_bytes());
                head.extend_from_slice(b": ");
                head.extend_from_slice(h.value);
                head.extend_from_slice(b"\r\n");
            }
        }
        head.extend_from_slice(b"Connection: close\r\n\r\n");
        head.extend_from_slice(&leftover);
        forward(shared, sandbox, client, head, None, upstream, report).await
    } else {
        refuse(
            &mut client,
            report,
            "400 Bad Request",
            Rule::Unreadable {
                reason: "not CONNECT or an absolute http:// URI".into(),
            },
        )
        .await
    }
}

/// Read until the end of the request head; returns the bytes read and the head's length.
async fn read_head(client: &mut Counted<TcpStream>, shared: &Shared) -> Result<(Vec<u8>, usize), ConnError> {
    let max = shared.sniff.max_bytes;
    let read = async {
        let mut buf = Vec::with_capacity(1024);
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                return Ok((buf, end + 4));
            }
            if buf.len() >= max {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "request head too long",
                ));
            }
            let start = buf.len();
            buf.resize((start + 4096).min(max), 0);
            let n = client.read(&mut buf[start..]).await?;
            buf.truncate(start + n);
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
    };
    tokio::time::timeout(shared.sniff.total, read)
        .await
        .map_err(|_| ConnError::ReadRequest(std::io::ErrorKind::TimedOut.into()))?
        .map_err(ConnError::ReadRequest)
}

/// `host:port` (`[v6]:port`), with `default_port` when the port is absent.
fn parse_authority(s: &str, default_port: Option<u16>) -> Option<(Target, u16)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let ip: Ipv6Addr = v6.parse().ok()?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default_port?,
            None => return None,
        };
        return (port != 0).then_some((Target::Ip(IpAddr::V6(ip)), port));
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().ok()?),
            None => (s, default_port?),
        }
    };
    if port == 0 {
        return None;
    }
    let target = match host.parse::<IpAddr>() {
        Ok(ip) => Target::Ip(ip),
        Err(_) => Target::Name(host.parse().ok()?),
    };
    Some((target, port))
}

/// The address to connect to, or `None` (with the refusal in `report`).
async fn choose(
    shared: &Shared,
    sandbox: &Sandbox,
    dest: &Target,
    port: u16,
    report: &mut Report,
) -> Option<IpAddr> {
    report.port = port;
    let policy = sandbox.policy();
    let name = match dest {
        Target::Ip(ip) => {
            let ip = ip.to_canonical();
            report.ip = Some(ip);
            let d = decide(&policy, &shared.operator, &Destination { name: None, ip, port });
            let allowed = d.allowed;
            report.decision = Some(d);
            return allowed.then_some(ip);
        }
        Target::Name(n) => n,
    };
    report.name = Some(name.clone());
    let by_name = decide_name(&policy, name);
    let mut approved = None;
    if !by_name.allowed {
        // Not covered: held for a person when the sandbox's approval policy says so; approved,
        // this connection goes on as if one more allow rule named exactly this host and port.
        let asked = match (by_name.rule == Rule::NoAllowRule, shared.asker.get()) {
            (true, Some(asker)) => asker.ask(&sandbox.id, name, port).await,
            _ => false,
        };
        match asked
            .then(|| crate::ask::with_approved(&policy, name, port))
            .flatten()
        {
            Some(extended) => approved = Some(std::sync::Arc::new(extended)),
            None => {
                report.decision = Some(by_name);
                return None;
            }
        }
    }
    let approved_index = approved.as_ref().map(|_| policy.allow().len());
    let policy = approved.unwrap_or(policy);
    let Some(ips) = sandbox.resolve(shared, name).await else {
        report.decision = Some(Decision::deny(Rule::Unresolvable));
        return None;
    };
    let mut first_refusal = None;
    for ip in ips {
        let d = decide(
            &policy,
            &shared.operator,
            &Destination {
                name: Some(name),
                ip,
                port,
            },
        );
        if d.allowed {
            report.ip = Some(ip);
            report.decision = Some(match d.rule {
                Rule::TenantAllow { index } if Some(index) == approved_index => Decision {
                    allowed: true,
                    rule: Rule::Approved,
                },
                _ => d,
            });
            return Some(ip);
        }
        first_refusal.get_or_insert((ip, d));
    }
    match first_refusal {
        Some((ip, d)) => {
            report.ip = Some(ip);
            report.decision = Some(d);
        }
        None => report.decision = Some(Decision::deny(Rule::Unresolvable)),
    }
    None
}

async fn deny(client: &mut Counted<TcpStream>, report: &Report) -> Result<(), ConnError> {
    let rule = report
        .decision
        .as_ref()
        .map_or(String::new(), |d| d.rule.to_string());
    respond(
        client,
        "403 Forbidden",
        &format!("paddock egress: denied ({rule})\n"),
    )
    .await
}

async fn refuse(
    client: &mut Counted<TcpStream>,
    report: &mut Report,
    status: &str,
    rule: Rule,
) -> Result<(), ConnError> {
    report.decision = Some(Decision::deny(rule));
    respond(client, status, "paddock egress: bad proxy request\n").await
}

async fn respond(client: &mut Counted<TcpStream>, status: &str, body: &str) -> Result<(), ConnError> {
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client
        .write_all(msg.as_bytes())
        .await
        .map_err(ConnError::Respond)?;
    client.shutdown().await.map_err(ConnError::Respond)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_parse() {
        let name = |s: &str| Target::Name(s.parse().expect("name"));
        assert_eq!(
            parse_authority("example.com:443", None),
            Some((name("example.com"), 443))
        );
        assert_eq!(
            parse_authority("example.com", Some(80)),
            Some((name("example.com"), 80))
        );
        assert_eq!(parse_authority("example.com", None), None);
        assert_eq!(
            parse_authority("1.2.3.4:22", None),
            Some((Target::Ip("1.2.3.4".parse().expect("ip")), 22))
        );
        assert_eq!(
            parse_authority("[::1]:8443", None),
            Some((Target::Ip("::1".parse().expect("ip")), 8443))
        );
        assert_eq!(
            parse_authority("[::1]", Some(80)),
            Some((Target::Ip("::1".parse().expect("ip")), 80))
        );
        for bad in [
            "",
            ":443",
            "a.com:0",
            "a.com:x",
            "[::1",
            "[zz]:1",
            "bad host:1",
            "a.com:70000",
        ] {
            assert_eq!(parse_authority(bad, Some(80)), None, "{bad:?}");
        }
    }
}

//! Which sandbox and port a request is for: the `E2b-Sandbox-Id` / `E2b-Sandbox-Port` headers (the
//! SDKs always send both), else a `Host` of the form `<port>-<sandbox id>.<domain>` under the
//! configured domain. Pure: no lookup of the sandbox itself.

use axum::http::HeaderMap;
use paddock_types::SandboxId;

/// The header naming the sandbox.
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
/// The header naming the port inside it.
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";
/// envd's port: requests to it are answered by paddock itself.
pub const ENVD_PORT: u16 = 49983;

/// A request's destination inside a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxTarget {
    /// The sandbox, as the request spelled it (parsed; a malformed id is [`TargetError::BadId`]).
    pub id: SandboxId,
    /// The port.
    pub port: u16,
}

/// A request that names a sandbox in a way that cannot be followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetError {
    /// The id is not a sandbox id: answered as a sandbox that does not exist.
    BadId(String),
    /// The port header is missing or not a port.
    BadPort(String),
}

/// The sandbox a request is for, if it names one: `None` for control-plane and `/v1` requests.
pub fn sandbox_target(
    headers: &HeaderMap,
    domain: Option<&str>,
) -> Option<Result<SandboxTarget, TargetError>> {
    if let Some(id) = headers.get(SANDBOX_ID_HEADER) {
        let id = String::from_utf8_lossy(id.as_bytes()).trim().to_owned();
        let port = match headers.get(SANDBOX_PORT_HEADER) {
            // E2B's proxy routes a request without a port header to envd; so does paddock.
            None => Ok(ENVD_PORT),
            Some(p) => {
                let text = String::from_utf8_lossy(p.as_bytes()).trim().to_owned();
                text.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or(TargetError::BadPort(text))
            }
        };
        return Some(port.and_then(|port| parse_id(&id).map(|id| SandboxTarget { id, port })));
    }
    let domain = domain?;
    let host = headers.get(axum::http::header::HOST)?.to_str().ok()?;
    host_target(host, domain)
}

/// `<port>-<id>.<domain>[:port]` → the target; `None` when the host is not under `domain` or has no
/// `<port>-` label (then it is the control plane's host, such as `api.<domain>`).
pub fn host_target(host: &str, domain: &str) -> Option<Result<SandboxTarget, TargetError>> {
    let host = strip_port(host).to_ascii_lowercase();
    let domain = domain.trim_end_matches('.').to_ascii_lowercase();
    let label = host
        .trim_end_matches('.')
        .strip_suffix(&domain)?
        .strip_suffix('.')?;
    if label.contains('.') {
        return None;
    }
    let (port, id) = label.split_once('-')?;
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    Some(parse_id(id).map(|id| SandboxTarget { id, port }))
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host;
    }
    match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

fn parse_id(text: &str) -> Result<SandboxId, TargetError> {
    text.parse::<SandboxId>()
        .map_err(|_| TargetError::BadId(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("a value"));
        }
        h
    }

    #[test]
    fn headers_name_the_sandbox_and_port() {
        let h = headers(&[
            ("e2b-sandbox-id", "sb-1"),
            ("e2b-sandbox-port", "49983"),
            ("host", "127.0.0.1:3000"),
        ]);
        let t = sandbox_target(&h, Some("example.test"))
            .expect("a target")
            .expect("a target");
        assert_eq!(t.id.as_str(), "sb-1");
        assert_eq!(t.port, 49983);
        let h = headers(&[("e2b-sandbox-id", "sb-1"), ("e2b-sandbox-port", "http")]);
        assert_eq!(
            sandbox_target(&h, None),
            Some(Err(TargetError::BadPort("http".into())))
        );
        let h = headers(&[("e2b-sandbox-id", "../etc"), ("e2b-sandbox-port", "80")]);
        assert_eq!(
            sandbox_target(&h, None),
            Some(Err(TargetError::BadId("../etc".into())))
        );
    }

    #[test]
    fn hosts_under_the_domain_name_the_sandbox_and_port() {
        let t = host_target("8080-sb-00ff.sandbox.example.test:443", "sandbox.example.test")
            .expect("a target")
            .expect("a target");
        assert_eq!((t.id.as_str(), t.port), ("sb-00ff", 8080));
        let t = host_target("49983-SB-1.Example.Test.", "example.test")
            .expect("a target")
            .expect("a target");
        assert_eq!((t.id.as_str(), t.port), ("sb-1", 49983));
        assert_eq!(host_target("api.example.test", "example.test"), None);
        assert_eq!(host_target("8080-sb-1.other.test", "example.test"), None);
        assert_eq!(host_target("8080-sb-1.x.example.test", "example.test"), None);
        assert_eq!(host_target("example.test", "example.test"), None);
        assert_eq!(host_target("0-sb-1.example.test", "example.test"), None);
        assert!(sandbox_target(&headers(&[("host", "8080-sb-1.example.test")]), None).is_none());
    }
}

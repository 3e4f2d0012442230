//! The options of a pull, the oci-client they build (verified TLS, plain HTTP to loopback only),
//! and oci-client's errors in this crate's kinds.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::Client;

use crate::credentials::CredentialSources;
use crate::error::RegistryError;
use crate::platform::Platform;

/// The largest extra CA file read.
const MAX_CA_FILE: u64 = 1 << 20;

/// How a pull talks to the registry and what it accepts.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// Where credentials come from (explicit, environment, docker config).
    pub credentials: CredentialSources,
    /// A PEM file of CA certificates trusted besides the system's roots.
    pub extra_ca_file: Option<PathBuf>,
    /// Registries (`host:port` as written in references) spoken to over plain HTTP. Only loopback
    /// hosts (`localhost`, `127.0.0.0/8`, `::1`) may be listed; anything else is refused, so TLS
    /// is never turned off for a registry across a network.
    pub insecure_registries: Vec<String>,
    /// The most bytes the image's config and layers may add up to (as announced and as received).
    pub max_total_bytes: u64,
    /// The platform picked from an index (default: the host's).
    pub platform: Platform,
    /// Bound on the whole pull (a registry that drips bytes is cut off by it).
    pub timeout: Duration,
    /// Bound on connecting to the registry.
    pub connect_timeout: Duration,
    /// Bound on waiting for any read from the registry.
    pub read_timeout: Duration,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            credentials: CredentialSources::default(),
            extra_ca_file: None,
            insecure_registries: Vec::new(),
            max_total_bytes: 16 << 30,
            platform: Platform::host(),
            timeout: Duration::from_secs(3600),
            connect_timeout: Duration::from_secs(15),
            read_timeout: Duration::from_secs(60),
        }
    }
}

/// Whether a registry's host (`host`, `host:port`, `[::1]:port`) is a loopback name or address.
pub(crate) fn is_loopback_registry(registry: &str) -> bool {
    if registry.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()) {
        return true;
    }
    let host = if let Some(rest) = registry.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        registry.rsplit_once(':').map_or(registry, |(h, _)| h)
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

pub(crate) fn build_client(options: &PullOptions) -> Result<Client, RegistryError> {
    // reqwest is built without a provider: use ring, as the rest of paddock does. Installing twice
    // is refused harmlessly.
    let _ = rustls::crypto::ring::default_provider().install_default();
    for r in &options.insecure_registries {
        if !is_loopback_registry(r) {
            return Err(RegistryError::InvalidOptions(format!(
                "plain HTTP is only allowed to a loopback registry, not {r:?}"
            )));
        }
    }
    let mut extra_root_certificates = Vec::new();
    if let Some(path) = &options.extra_ca_file {
        use std::io::Read as _;
        let mut data = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_CA_FILE + 1).read_to_end(&mut data))
            .map_err(|e| RegistryError::io("read CA file", path, e))?;
        if data.len() as u64 > MAX_CA_FILE || !data.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
            return Err(RegistryError::InvalidOptions(format!(
                "CA file {} holds no PEM certificate",
                path.display()
            )));
        }
        extra_root_certificates.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data,
        });
    }
    let config = ClientConfig {
        protocol: if options.insecure_registries.is_empty() {
            ClientProtocol::Https
        } else {
            ClientProtocol::HttpsExcept(options.insecure_registries.clone())
        },
        extra_root_certificates,
        platform_resolver: None,
        connect_timeout: Some(options.connect_timeout),
        read_timeout: Some(options.read_timeout),
        user_agent: concat!("paddock/", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::default()
    };
    Client::try_from(config)
        .map_err(|e| RegistryError::InvalidOptions(format!("cannot build the registry client: {e}")))
}

/// The TLS error somewhere in an error's chain, if any. rustls' errors travel inside io::Errors
/// (sometimes io::Errors inside io::Errors), whose `source` skips the error they wrap, so each
/// io::Error's inner error is looked into too.
fn has_tls_error(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(t) = e.downcast_ref::<rustls::Error>() {
            return Some(t.to_string());
        }
        if let Some(inner) = e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            if let Some(t) = has_tls_error(inner) {
                return Some(t);
            }
        }
        cur = e.source();
    }
    None
}

/// The innermost message of an error chain, for one-line details.
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = err;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// oci-client's error in this crate's kinds; `what` names what was being fetched.
pub(crate) fn map_oci_error(err: OciDistributionError, registry: &str, what: &str) -> RegistryError {
    let registry_s = registry.to_owned();
    let not_found = || RegistryError::NotFound {
        registry: registry_s.clone(),
        what: what.into(),
    };
    let unauthorized = |detail: String| RegistryError::Unauthorized {
        registry: registry_s.clone(),
        anonymous: false,
        detail,
    };
    match err {
        OciDistributionError::RequestError(e) => {
            if let Some(tls) = has_tls_error(&e) {
                RegistryError::Tls {
                    registry: registry_s,
                    detail: tls,
                }
            } else if e.is_connect() || e.is_timeout() {
                RegistryError::Unreachable {
                    registry: registry_s,
                    detail: root_cause(&e),
                }
            } else {
                RegistryError::Protocol {
                    registry: registry_s,
                    detail: root_cause(&e),
                }
            }
        }
        OciDistributionError::UnauthorizedError { .. } => unauthorized(String::new()),
        OciDistributionError::AuthenticationFailure(reason) => {
            unauthorized(format!(": {}", one_line(&reason)))
        }
        OciDistributionError::ImageManifestNotFoundError(_) => not_found(),
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NotFound
                )
            }) {
                not_found()
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                unauthorized(String::new())
            } else {
                RegistryError::Protocol {
                    registry: registry_s,
                    detail: one_line(&format!("{what}: {envelope}")),
                }
            }
        }
        OciDistributionError::ServerError { code: 404, .. } => not_found(),
        OciDistributionError::ServerError { code: 401 | 403, .. } => unauthorized(String::new()),
        OciDistributionError::DigestError(e) => RegistryError::DigestMismatch {
            what: what.into(),
            expected: "its digest".into(),
            actual: one_line(&e.to_string()),
        },
        OciDistributionError::UnsupportedMediaTypeError(m) => RegistryError::UnsupportedMediaType {
            what: what.into(),
            media_type: m,
        },
        other => RegistryError::Protocol {
            registry: registry_s,
            detail: one_line(&format!("{what}: {other}")),
        },
    }
}

/// Text from a remote made one bounded line.
pub(crate) fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(300)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn only_loopback_registries_may_be_plain_http() {
        for ok in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "127.1.2.3",
            "[::1]:5000",
            "::1",
        ] {
            assert!(is_loopback_registry(ok), "{ok}");
        }
        for bad in [
            "registry.example",
            "10.0.0.1:5000",
            "localhost.example",
            "[::2]:80",
            "docker.io",
        ] {
            assert!(!is_loopback_registry(bad), "{bad}");
            let options = PullOptions {
                insecure_registries: vec![bad.into()],
                ..PullOptions::default()
            };
            let Err(err) = build_client(&options) else {
                panic!("{bad} accepted")
            };
            assert_eq!(err.kind(), ErrorKind::InvalidOptions);
            assert!(err.to_string().contains("loopback"), "{err}");
        }
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate").expect("write");
        let options = PullOptions {
            extra_ca_file: Some(path),
            ..PullOptions::default()
        };
        let Err(err) = build_client(&options) else {
            panic!("accepted")
        };
        assert_eq!(err.kind(), ErrorKind::InvalidOptions);
    }
}

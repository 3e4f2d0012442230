//! The per-sandbox certificate authority: the sandbox trusts it, and the proxy uses it to present a
//! certificate for each host it intercepts (only hosts a secret is bound to). Leaf configurations are
//! cached per host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use paddock_types::{DomainName, SandboxId};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use zeroize::Zeroizing;

use crate::error::EgressError;

/// A sandbox's CA certificate and private key, as PEM: generated once per sandbox and kept by the
/// owner (the control plane stores it so a restarted server keeps the CA the sandbox trusts). The key
/// never enters the sandbox.
#[derive(Clone)]
pub struct SandboxCaKey {
    cert_pem: String,
    key_pem: Zeroizing<String>,
}

impl std::fmt::Debug for SandboxCaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCaKey").finish_non_exhaustive()
    }
}

fn ca_params(id: &SandboxId) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("paddock egress CA for {id}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(params)
}

impl SandboxCaKey {
    /// A fresh CA (ECDSA P-256) for sandbox `id`.
    pub fn generate(id: &SandboxId) -> Result<Self, EgressError> {
        let ca_err = |source| EgressError::Certificate {
            what: "sandbox CA",
            source,
        };
        let key = KeyPair::generate().map_err(ca_err)?;
        let issuer = CertifiedIssuer::self_signed(ca_params(id).map_err(ca_err)?, key).map_err(ca_err)?;
        Ok(Self {
            cert_pem: issuer.pem(),
            key_pem: Zeroizing::new(issuer.key().serialize_pem()),
        })
    }

    /// A CA kept from an earlier [`SandboxCaKey::generate`].
    pub fn from_pem(cert_pem: String, key_pem: Zeroizing<String>) -> Self {
        Self { cert_pem, key_pem }
    }

    /// The certificate (what the sandbox trusts).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The private key (for the owner's storage only).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }
}

/// Most leaf configurations kept per sandbox.
const MAX_CACHED_LEAVES: usize = 256;

/// A sandbox's CA and the server configurations it issued.
pub(crate) struct SandboxCa {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
    leaves: Mutex<HashMap<DomainName, Arc<rustls::ServerConfig>>>,
}

impl std::fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCa").finish_non_exhaustive()
    }
}

impl SandboxCa {
    /// The issuing side of `key`, the CA of sandbox `id`. The issuer is rebuilt from the same
    /// parameters the certificate was made with (name, key usages, key identifier), so leaves chain to
    /// the stored certificate.
    pub(crate) fn new(
        id: &SandboxId,
        key: &SandboxCaKey,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Self, EgressError> {
        let ca_err = |source| EgressError::Certificate {
            what: "sandbox CA",
            source,
        };
        let signing = KeyPair::from_pem(&key.key_pem).map_err(ca_err)?;
        let cert_der = CertificateDer::from_pem_slice(key.cert_pem.as_bytes())
            .map_err(|_| ca_err(rcgen::Error::CouldNotParseCertificate))?;
        Ok(Self {
            issuer: Issuer::new(ca_params(id).map_err(ca_err)?, signing),
            cert_der,
            cert_pem: key.cert_pem.clone(),
            provider,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM, for the sandbox's trust store.
    pub(crate) fn pem(&self) -> String {
        self.cert_pem.clone()
    }

    /// A TLS server configuration presenting a certificate for `host`, issued once and cached.
    pub(crate) fn server_config(&self, host: &DomainName) -> Result<Arc<rustls::ServerConfig>, EgressError> {
        if let Some(c) = self.leaves.lock().unwrap_or_else(|e| e.into_inner()).get(host) {
            return Ok(c.clone());
        }
        let leaf_err = |source| EgressError::Certificate {
            what: "leaf certificate",
            source,
        };
        let key = KeyPair::generate().map_err(leaf_err)?;
        let mut params = CertificateParams::new(vec![host.as_str().to_owned()]).map_err(leaf_err)?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.issuer).map_err(leaf_err)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|source| EgressError::Tls {
                what: "leaf server configuration",
                source,
            })?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone(), self.cert_der.clone()], key_der)
            .map_err(|source| EgressError::Tls {
                what: "leaf server configuration",
                source,
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: a secret bound to `*.suffix` would otherwise let a sandbox grow the cache by one
        // leaf per name it makes up. An evicted leaf is issued again when needed.
        if leaves.len() >= MAX_CACHED_LEAVES {
            if let Some(old) = leaves.keys().next().cloned() {
                leaves.remove(&old);
            }
        }
        leaves.insert(host.clone(), config.clone());
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leaf_cache_is_bounded() {
        let id: SandboxId = "sb-ca".parse().expect("id");
        let key = SandboxCaKey::generate(&id).expect("ca");
        let ca = SandboxCa::new(&id, &key, Arc::new(rustls::crypto::ring::default_provider())).expect("ca");
        for i in 0..MAX_CACHED_LEAVES + 10 {
            let host: DomainName = format!("h{i}.example.test").parse().expect("host");
            ca.server_config(&host).expect("leaf");
        }
        assert_eq!(ca.leaves.lock().expect("leaves").len(), MAX_CACHED_LEAVES);
    }
}

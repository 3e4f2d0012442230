//! The per-sandbox certificate authority: the sandbox trusts it, and the proxy uses it to present a
//! certificate for each host it intercepts (only hosts a secret is bound to). Leaf configurations are
//! cached per host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use paddock_types::{DomainName, SandboxId};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::error::EgressError;

/// A sandbox's CA and the server configurations it issued.
pub(crate) struct SandboxCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    provider: Arc<rustls::crypto::CryptoProvider>,
    leaves: Mutex<HashMap<DomainName, Arc<rustls::ServerConfig>>>,
}

impl std::fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCa").finish_non_exhaustive()
    }
}

impl SandboxCa {
    /// A fresh CA (ECDSA P-256) for `id`; its key never leaves this process.
    pub(crate) fn new(
        id: &SandboxId,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Self, EgressError> {
        let ca_err = |source| EgressError::Certificate {
            what: "sandbox CA",
            source,
        };
        let key = KeyPair::generate().map_err(ca_err)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(ca_err)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("paddock egress CA for {id}"));
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, key).map_err(ca_err)?;
        Ok(Self {
            issuer,
            provider,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM, for the sandbox's trust store.
    pub(crate) fn pem(&self) -> String {
        self.issuer.pem()
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
            .with_single_cert(vec![cert.der().clone(), self.issuer.der().clone()], key_der)
            .map_err(|source| EgressError::Tls {
                what: "leaf server configuration",
                source,
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        self.leaves
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(host.clone(), config.clone());
        Ok(config)
    }
}

//! A sandbox's access tokens and the signatures of `/files` URLs.
//!
//! Tokens are derived, not stored: HMAC-SHA256 under the server's E2B key (`<state>/e2b.key`, made on
//! the first start) of the token's purpose and the sandbox id. So they survive a restart, need no
//! database column, and are revoked all at once by replacing the key. The envd token
//! (`envdAccessToken`) authorises every envd request for the sandbox; the traffic token
//! (`trafficAccessToken`) authorises requests to its other ports when the sandbox asked for private
//! traffic. A signature (`v1_` + base64 of SHA-256 over `path:operation:user:token[:expiry]`, as E2B
//! computes it) lets a plain HTTP client download or upload one file without the token.
//!
//! Comparisons are in constant time.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use paddock_types::SandboxId;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Bytes of the server's token key.
pub const KEY_BYTES: usize = 32;

/// What a token is for (part of what is signed, so one never serves as the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// envd's requests (`X-Access-Token`).
    Envd,
    /// Requests to the sandbox's other ports (`E2B-Traffic-Access-Token`).
    Traffic,
}

impl TokenKind {
    fn label(self) -> &'static [u8] {
        match self {
            TokenKind::Envd => b"paddock-e2b envd v1\0",
            TokenKind::Traffic => b"paddock-e2b traffic v1\0",
        }
    }
}

/// The server's key its tokens are derived from.
#[derive(Clone)]
pub struct TokenKey([u8; KEY_BYTES]);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    /// A key from its bytes.
    pub fn new(bytes: [u8; KEY_BYTES]) -> Self {
        Self(bytes)
    }

    /// The sandbox's token of this kind: 64 lowercase hex digits.
    pub fn token(&self, kind: TokenKind, id: &SandboxId) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(kind.label());
        mac.update(id.as_str().as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// Whether `presented` is the sandbox's token of this kind.
    pub fn verify(&self, kind: TokenKind, id: &SandboxId, presented: &str) -> bool {
        let expected = self.token(kind, id);
        bool::from(expected.as_bytes().ct_eq(presented.trim().as_bytes()))
    }
}

/// The operation a `/files` signature allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOperation {
    /// `GET /files`.
    Read,
    /// `POST /files`.
    Write,
}

impl FileOperation {
    fn as_str(self) -> &'static str {
        match self {
            FileOperation::Read => "read",
            FileOperation::Write => "write",
        }
    }
}

/// E2B's signature of a `/files` URL: `v1_` + unpadded standard base64 of
/// SHA-256(`path:operation:user:token`, then `:expiry` when the URL expires). `path` is the path as the
/// caller wrote it, not resolved.
pub fn file_signature(
    path: &str,
    op: FileOperation,
    user: &str,
    envd_token: &str,
    expires: Option<i64>,
) -> String {
    let mut text = format!("{path}:{}:{user}:{envd_token}", op.as_str());
    if let Some(e) = expires {
        text.push(':');
        text.push_str(&e.to_string());
    }
    let digest = Sha256::digest(text.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// Why a signed `/files` request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureError {
    /// No signature, or not the right one.
    Invalid,
    /// Right, but past its expiry (E2B's text, asserted by its tests: "signature is already expired").
    Expired,
}

/// Checks a presented signature against the expected one at `now_secs`.
pub fn check_signature(
    presented: &str,
    path: &str,
    op: FileOperation,
    user: &str,
    envd_token: &str,
    expires: Option<i64>,
    now_secs: i64,
) -> Result<(), SignatureError> {
    let expected = file_signature(path, op, user, envd_token, expires);
    if !bool::from(expected.as_bytes().ct_eq(presented.as_bytes())) {
        return Err(SignatureError::Invalid);
    }
    match expires {
        Some(e) if e < now_secs => Err(SignatureError::Expired),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> SandboxId {
        s.parse().expect("an id")
    }

    #[test]
    fn tokens_differ_by_kind_sandbox_and_key() {
        let k = TokenKey::new([7; KEY_BYTES]);
        let a = k.token(TokenKind::Envd, &id("sb-a"));
        assert_eq!(a.len(), 64);
        assert_ne!(a, k.token(TokenKind::Traffic, &id("sb-a")));
        assert_ne!(a, k.token(TokenKind::Envd, &id("sb-b")));
        assert_ne!(
            a,
            TokenKey::new([8; KEY_BYTES]).token(TokenKind::Envd, &id("sb-a"))
        );
        assert!(k.verify(TokenKind::Envd, &id("sb-a"), &a));
        assert!(!k.verify(TokenKind::Envd, &id("sb-b"), &a));
        assert!(!k.verify(TokenKind::Traffic, &id("sb-a"), &a));
        assert!(!k.verify(TokenKind::Envd, &id("sb-a"), ""));
    }

    #[test]
    fn signatures_match_e2bs_formula() {
        // sha256("/home/user/a.txt:read:user:tok") in unpadded base64, computed independently with
        // Python's hashlib and base64 (the SDK's own formula).
        let sig = file_signature("/home/user/a.txt", FileOperation::Read, "user", "tok", None);
        assert_eq!(sig, "v1_p0WqJQYCLtO6YX+e4h7VbpybRsdJbMbIw7clYpulIJk");
        let with_expiry = file_signature("a", FileOperation::Write, "", "tok", Some(100));
        assert!(check_signature(&with_expiry, "a", FileOperation::Write, "", "tok", Some(100), 99).is_ok());
        assert_eq!(
            check_signature(&with_expiry, "a", FileOperation::Write, "", "tok", Some(100), 101),
            Err(SignatureError::Expired)
        );
        assert_eq!(
            check_signature(&with_expiry, "a", FileOperation::Read, "", "tok", Some(100), 99),
            Err(SignatureError::Invalid)
        );
    }
}

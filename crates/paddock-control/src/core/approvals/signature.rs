//! The webhook's signature, both ways: `Paddock-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256
//! of "<t>.<body>">` on what paddock sends, and the same checked on a signed callback (a decision
//! an approval system sends back), refusing a time more than five minutes off.
//!
//! What it does not do: remember signatures (a replayed decision finds its approval decided).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// How far a signature's time may be from now.
const MAX_SKEW_SECS: u64 = 300;

fn mac(key: &[u8], t: u64, body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The `Paddock-Signature` value of `body` at `t` (unix seconds) under `key`.
pub fn sign_webhook(key: &[u8], t: u64, body: &[u8]) -> String {
    format!(
        "t={t},v1={}",
        hex::encode(mac(key, t, body).finalize().into_bytes())
    )
}

/// Checks a `Paddock-Signature` value of `body` under `key` at `now` (unix seconds); why not, in
/// words, when it does not verify.
pub fn verify_webhook(key: &[u8], header: &str, body: &[u8], now: u64) -> Result<(), &'static str> {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => t = value.parse::<u64>().ok(),
            Some(("v1", value)) => v1 = hex::decode(value).ok(),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return Err("the signature is not t=<unix time>,v1=<hex>");
    };
    if t.abs_diff(now) > MAX_SKEW_SECS {
        return Err("the signature's time is more than five minutes off");
    }
    mac(key, t, body)
        .verify_slice(&v1)
        .map_err(|_| "the signature does not match the body")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_is_hmac_sha256_of_time_dot_body_and_verifies_only_unchanged_and_in_time() {
        // A fixed key and body, checked against Python's hmac module
        // (`hmac.new(b"Jefe", b"1700000000.{}", "sha256").hexdigest()`).
        let signed = sign_webhook(b"Jefe", 1_700_000_000, b"{}");
        assert_eq!(
            signed,
            "t=1700000000,v1=d3793e2b4103edfbd98cc19591832f5fad701d413db9fcae0ae7dab8184ed207"
        );
        assert_eq!(verify_webhook(b"Jefe", &signed, b"{}", 1_700_000_100), Ok(()));
        assert!(verify_webhook(b"Jefe", &signed, b"{ }", 1_700_000_100).is_err());
        assert!(verify_webhook(b"Jeff", &signed, b"{}", 1_700_000_100).is_err());
        assert!(verify_webhook(b"Jefe", &signed, b"{}", 1_700_000_301).is_err());
        assert!(verify_webhook(b"Jefe", "v1=00", b"{}", 1_700_000_000).is_err());
        assert!(verify_webhook(b"Jefe", "garbage", b"{}", 1_700_000_000).is_err());
    }
}

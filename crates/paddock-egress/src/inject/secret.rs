//! Secrets and their placeholders. The sandbox only ever sees `paddock-secret:NAME`; the proxy puts
//! the value in request headers sent to a host the secret is bound to, and nowhere else.

use std::fmt;
use std::str::FromStr;

use paddock_types::{DomainName, DomainPattern};
use zeroize::Zeroizing;

/// What the sandbox holds instead of a secret: `paddock-secret:` followed by the secret's name.
pub const PLACEHOLDER_PREFIX: &str = "paddock-secret:";

/// A secret's name: 1 to 64 of `[A-Za-z0-9_]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretName(String);

/// Why a secret is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The name has other characters or a bad length.
    #[error("invalid secret name {0:?}: use 1 to 64 of A-Z, a-z, 0-9 and _")]
    Name(String),
    /// The value cannot go into an HTTP header (the value itself is not repeated).
    #[error("the value of secret {0} cannot go into an HTTP header (control characters or non-ASCII)")]
    Value(String),
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

impl SecretName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The placeholder the sandbox sees.
    pub fn placeholder(&self) -> String {
        format!("{PLACEHOLDER_PREFIX}{}", self.0)
    }
    /// The environment variable a sandbox's processes get for the secret: `NAME=paddock-secret:NAME`.
    pub fn env_var(&self) -> (String, String) {
        (self.0.clone(), self.placeholder())
    }
}

impl FromStr for SecretName {
    type Err = SecretError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if (1..=64).contains(&s.len()) && s.bytes().all(is_name_byte) {
            Ok(Self(s.to_owned()))
        } else {
            Err(SecretError::Name(s.chars().take(80).collect()))
        }
    }
}

impl fmt::Display for SecretName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A secret's value: wiped from memory when dropped, never printed.
pub struct SecretValue(Zeroizing<Vec<u8>>);

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

/// A secret bound to the hosts it may be sent to.
#[derive(Debug)]
pub struct Secret {
    name: SecretName,
    value: SecretValue,
    hosts: Vec<DomainPattern>,
}

impl Secret {
    /// A secret named `name` whose value may be sent to hosts matching `hosts`. The value must be
    /// visible ASCII or spaces (it goes into HTTP header values).
    pub fn new(
        name: SecretName,
        value: Zeroizing<String>,
        hosts: Vec<DomainPattern>,
    ) -> Result<Self, SecretError> {
        if value.is_empty()
            || !value
                .bytes()
                .all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic())
        {
            return Err(SecretError::Value(name.0));
        }
        let bytes = Zeroizing::new(value.as_bytes().to_vec());
        Ok(Self {
            name,
            value: SecretValue(bytes),
            hosts,
        })
    }
    /// The name.
    pub fn name(&self) -> &SecretName {
        &self.name
    }
    /// Whether the value may be sent to `host`.
    pub fn is_bound_to(&self, host: &DomainName) -> bool {
        self.hosts.iter().any(|p| p.matches(host))
    }
}

/// A sandbox's secrets.
#[derive(Debug, Default)]
pub(crate) struct SecretSet {
    secrets: Vec<Secret>,
}

impl SecretSet {
    pub(crate) fn new(secrets: Vec<Secret>) -> Self {
        Self { secrets }
    }

    /// Whether any secret is bound to `host` (its TLS is then intercepted).
    pub(crate) fn any_bound_to(&self, host: &DomainName) -> bool {
        self.secrets.iter().any(|s| s.is_bound_to(host))
    }

    /// `value` with every placeholder of a secret bound to `host` replaced by its value, and the names
    /// replaced; `None` when nothing was replaced. Placeholders of unknown secrets, or of secrets
    /// bound elsewhere, stay as they are.
    pub(crate) fn substitute(
        &self,
        host: &DomainName,
        value: &[u8],
    ) -> Option<(Zeroizing<Vec<u8>>, Vec<SecretName>)> {
        let prefix = PLACEHOLDER_PREFIX.as_bytes();
        let mut out = Zeroizing::new(Vec::with_capacity(value.len()));
        let mut used = Vec::new();
        let mut rest = value;
        while let Some(at) = find(rest, prefix) {
            out.extend_from_slice(&rest[..at]);
            let after = &rest[at + prefix.len()..];
            let len = after.iter().take_while(|b| is_name_byte(**b)).count();
            let secret = std::str::from_utf8(&after[..len])
                .ok()
                .and_then(|n| self.secrets.iter().find(|s| s.name.0 == n))
                .filter(|s| s.is_bound_to(host));
            match secret {
                Some(s) => {
                    out.extend_from_slice(&s.value.0);
                    if !used.contains(&s.name) {
                        used.push(s.name.clone());
                    }
                }
                None => out.extend_from_slice(&rest[at..at + prefix.len() + len]),
            }
            rest = &after[len..];
        }
        if used.is_empty() {
            return None;
        }
        out.extend_from_slice(rest);
        Some((out, used))
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn set() -> SecretSet {
        let s = |n: &str, v: &str, h: &str| {
            Secret::new(
                n.parse().expect("name"),
                Zeroizing::new(v.into()),
                vec![h.parse().expect("pattern")],
            )
            .expect("secret")
        };
        SecretSet::new(vec![
            s("GH", "ghp_real", "api.github.com"),
            s("OAI", "sk-real", "*.openai.com"),
        ])
    }
    fn host(h: &str) -> DomainName {
        h.parse().expect("host")
    }

    #[test]
    fn substitutes_only_for_bound_hosts() {
        let s = set();
        let (v, used) = s
            .substitute(&host("api.github.com"), b"Bearer paddock-secret:GH")
            .expect("replaced");
        assert_eq!(&v[..], b"Bearer ghp_real");
        assert_eq!(used, vec!["GH".parse::<SecretName>().expect("name")]);
        assert_eq!(s.substitute(&host("evil.com"), b"Bearer paddock-secret:GH"), None);
        assert_eq!(s.substitute(&host("api.github.com"), b"paddock-secret:OAI"), None);
        let (v, _) = s
            .substitute(
                &host("api.github.com"),
                b"a paddock-secret:GHX paddock-secret:GH,paddock-secret:",
            )
            .expect("replaced");
        assert_eq!(&v[..], b"a paddock-secret:GHX ghp_real,paddock-secret:");
        assert!(s.any_bound_to(&host("x.openai.com")) && !s.any_bound_to(&host("openai.com")));
    }

    #[test]
    fn values_must_fit_in_a_header_and_are_never_printed() {
        let bad = Secret::new(
            "A".parse().expect("name"),
            Zeroizing::new("x\r\ny".into()),
            vec![],
        );
        assert!(matches!(bad, Err(SecretError::Value(ref n)) if n == "A"));
        let ok = Secret::new(
            "A".parse().expect("name"),
            Zeroizing::new("hunter2".into()),
            vec![],
        )
        .expect("ok");
        assert!(!format!("{ok:?}").contains("hunter2"));
        assert!("bad-name".parse::<SecretName>().is_err());
    }

    proptest! {
        #[test]
        fn substitution_never_panics_and_leaves_unbound_values_alone(v in prop::collection::vec(any::<u8>(), 0..200)) {
            let s = set();
            if let Some((out, _)) = s.substitute(&host("api.github.com"), &v) {
                prop_assert!(find(&out, b"ghp_real").is_some());
            }
            prop_assert!(s.substitute(&host("other.example"), &v).is_none());
        }
    }
}

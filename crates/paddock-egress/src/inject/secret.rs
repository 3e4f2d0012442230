//! Secrets, their placeholders and their bindings. The sandbox only ever sees `paddock-secret:NAME`;
//! the proxy puts the value where the secret's binding says (named request header fields, and the
//! query string when the binding allows it) in requests to a host it is bound to, and nowhere else.
//!
//! What this module does not do: decide whether a request may be sent at all (the request's target
//! must be the intercepted host: `request.rs`), or look inside bodies (never substituted).

use std::fmt;
use std::str::FromStr;

use paddock_types::{DomainName, DomainPattern};
use zeroize::Zeroizing;

/// What the sandbox holds instead of a secret: `paddock-secret:` followed by the secret's name.
pub const PLACEHOLDER_PREFIX: &str = "paddock-secret:";
/// The header field a secret is bound to when its binding names none.
pub const DEFAULT_HEADER: &str = "authorization";
/// Most header fields one secret may be bound to.
pub const MAX_BOUND_HEADERS: usize = 16;

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
    /// A header field name a secret may not be bound to.
    #[error("invalid header {name:?} for a secret: {reason}")]
    Header {
        /// The name as given (truncated).
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// The binding names no place for the value.
    #[error("a secret must be bound to at least one host and at most {MAX_BOUND_HEADERS} distinct headers")]
    Binding,
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

/// A request header field a secret's value may be put in: an HTTP field name (RFC 9110 token),
/// lowercase, 1 to 64 bytes. Fields that route or frame a request (`host`, `content-length`,
/// `transfer-encoding`, `connection`, ...) are refused: a value there would change where or how the
/// request goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BoundHeader(String);

/// Fields no secret is bound to, and why not.
const UNBINDABLE: [&str; 10] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
];

impl BoundHeader {
    /// The field name, lowercase.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// `authorization`.
    pub fn authorization() -> Self {
        Self(DEFAULT_HEADER.to_owned())
    }
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

impl FromStr for BoundHeader {
    type Err = SecretError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| SecretError::Header {
            name: s.chars().take(80).collect(),
            reason,
        };
        if !(1..=64).contains(&s.len()) || !s.bytes().all(is_token_byte) {
            return Err(err("use 1 to 64 letters, digits and -"));
        }
        let name = s.to_ascii_lowercase();
        if UNBINDABLE.contains(&name.as_str()) {
            return Err(err("it routes or frames the request"));
        }
        Ok(Self(name))
    }
}

impl fmt::Display for BoundHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a secret's value may go: requests to these hosts, in these header fields, and in the query
/// string only when `query` is set. The same fields apply to every host of the binding (a credential
/// used differently on two hosts is two secrets). Bodies are never substituted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretBinding {
    hosts: Vec<DomainPattern>,
    headers: Vec<BoundHeader>,
    query: bool,
}

impl SecretBinding {
    /// A binding to `hosts` in `headers` (`None`: [`DEFAULT_HEADER`] only; the list given replaces
    /// the default), and in the query string when `query`. At least one host and at most
    /// [`MAX_BOUND_HEADERS`] headers; duplicates are dropped.
    pub fn new(
        hosts: Vec<DomainPattern>,
        headers: Option<Vec<BoundHeader>>,
        query: bool,
    ) -> Result<Self, SecretError> {
        let mut headers = headers.unwrap_or_else(|| vec![BoundHeader::authorization()]);
        headers.sort();
        headers.dedup();
        if hosts.is_empty() || headers.len() > MAX_BOUND_HEADERS || (headers.is_empty() && !query) {
            return Err(SecretError::Binding);
        }
        Ok(Self {
            hosts,
            headers,
            query,
        })
    }
    /// The hosts.
    pub fn hosts(&self) -> &[DomainPattern] {
        &self.hosts
    }
    /// The header fields, lowercase, sorted.
    pub fn headers(&self) -> &[BoundHeader] {
        &self.headers
    }
    /// Whether the value may go into the query string.
    pub fn query(&self) -> bool {
        self.query
    }
}

/// A secret's value: wiped from memory when dropped, never printed.
pub struct SecretValue(Zeroizing<Vec<u8>>);

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

/// A secret and where it may be sent.
#[derive(Debug)]
pub struct Secret {
    name: SecretName,
    value: SecretValue,
    binding: SecretBinding,
}

impl Secret {
    /// A secret named `name` whose value may be sent where `binding` says. The value must be visible
    /// ASCII or spaces (it goes into HTTP header values).
    pub fn new(
        name: SecretName,
        value: Zeroizing<String>,
        binding: SecretBinding,
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
            binding,
        })
    }
    /// The name.
    pub fn name(&self) -> &SecretName {
        &self.name
    }
    /// Where it may be sent.
    pub fn binding(&self) -> &SecretBinding {
        &self.binding
    }
    /// Whether the value may be sent to `host` at all.
    pub fn is_bound_to(&self, host: &DomainName) -> bool {
        self.binding.hosts.iter().any(|p| p.matches(host))
    }
    fn allows(&self, host: &DomainName, field: Field<'_>) -> bool {
        self.is_bound_to(host)
            && match field {
                Field::Header(name) => self
                    .binding
                    .headers
                    .iter()
                    .any(|h| h.0.eq_ignore_ascii_case(name)),
                Field::Query => self.binding.query,
            }
    }
}

/// A place in a request where a placeholder may be found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field<'a> {
    /// A header field's value (the field name, any case).
    Header(&'a str),
    /// The URI's query string (placeholders raw or with `%3A`; values percent-encoded).
    Query,
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

    /// Whether any secret bound to `host` may go into its requests' query strings.
    pub(crate) fn any_query_bound_to(&self, host: &DomainName) -> bool {
        self.secrets
            .iter()
            .any(|s| s.binding.query && s.is_bound_to(host))
    }

    /// `value` (found in `field` of a request to `host`) with every placeholder of a secret bound to
    /// `host` and `field` replaced by its value, and the names replaced; `None` when nothing was
    /// replaced. Placeholders of unknown secrets, of secrets bound elsewhere or to other fields stay
    /// as they are (the sandbox knows them already; forwarding them gives nothing away).
    pub(crate) fn substitute(
        &self,
        host: &DomainName,
        field: Field<'_>,
        value: &[u8],
    ) -> Option<(Zeroizing<Vec<u8>>, Vec<SecretName>)> {
        let mut out = Zeroizing::new(Vec::with_capacity(value.len()));
        let mut used = Vec::new();
        let mut rest = value;
        while let Some((at, prefix_len)) = find_placeholder(rest, field) {
            out.extend_from_slice(&rest[..at]);
            let after = &rest[at + prefix_len..];
            let len = after.iter().take_while(|b| is_name_byte(**b)).count();
            let secret = std::str::from_utf8(&after[..len])
                .ok()
                .and_then(|n| self.secrets.iter().find(|s| s.name.0 == n))
                .filter(|s| s.allows(host, field));
            match secret {
                Some(s) => {
                    match field {
                        Field::Header(_) => out.extend_from_slice(&s.value.0),
                        Field::Query => percent_encode(&s.value.0, &mut out),
                    }
                    if !used.contains(&s.name) {
                        used.push(s.name.clone());
                    }
                }
                None => out.extend_from_slice(&rest[at..at + prefix_len + len]),
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

/// Where the next placeholder starts in `hay`, and the length of its prefix (`paddock-secret:`, or
/// in a query string also `paddock-secret%3A`).
fn find_placeholder(hay: &[u8], field: Field<'_>) -> Option<(usize, usize)> {
    // The prefix without its `:`, which a query string may carry percent-encoded.
    let stem = PLACEHOLDER_PREFIX.trim_end_matches(':').as_bytes();
    let mut from = 0;
    while let Some(i) = find(&hay[from..], stem) {
        let at = from + i;
        let tail = &hay[at + stem.len()..];
        if tail.starts_with(b":") {
            return Some((at, stem.len() + 1));
        }
        if field == Field::Query && tail.len() >= 3 && tail[..3].eq_ignore_ascii_case(b"%3a") {
            return Some((at, stem.len() + 3));
        }
        from = at + 1;
    }
    None
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// RFC 3986 percent-encoding of everything but unreserved characters.
fn percent_encode(value: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in value {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;

    fn secret(n: &str, v: &str, h: &str, headers: Option<&[&str]>, query: bool) -> Secret {
        let headers = headers.map(|hs| hs.iter().map(|h| h.parse().expect("header")).collect());
        let binding = SecretBinding::new(vec![h.parse().expect("pattern")], headers, query).expect("binding");
        Secret::new(n.parse().expect("name"), Zeroizing::new(v.into()), binding).expect("secret")
    }

    pub(crate) fn set() -> SecretSet {
        SecretSet::new(vec![
            secret("GH", "ghp_real", "api.github.com", None, false),
            secret("OAI", "sk-real", "*.openai.com", None, false),
            secret("KEY", "k&y=1 2", "api.github.com", Some(&["X-Api-Key"]), true),
        ])
    }
    fn host(h: &str) -> DomainName {
        h.parse().expect("host")
    }
    const AUTH: Field<'static> = Field::Header("Authorization");

    #[test]
    fn substitutes_only_for_bound_hosts_and_fields() {
        let s = set();
        let gh = host("api.github.com");
        let (v, used) = s
            .substitute(&gh, AUTH, b"Bearer paddock-secret:GH")
            .expect("replaced");
        assert_eq!(&v[..], b"Bearer ghp_real");
        assert_eq!(used, vec!["GH".parse::<SecretName>().expect("name")]);
        assert_eq!(
            s.substitute(&host("evil.com"), AUTH, b"Bearer paddock-secret:GH"),
            None
        );
        assert_eq!(s.substitute(&gh, AUTH, b"paddock-secret:OAI"), None);
        // A field the secret is not bound to: left alone (an echoing endpoint gets the placeholder).
        assert_eq!(
            s.substitute(&gh, Field::Header("x-echo"), b"paddock-secret:GH"),
            None
        );
        assert_eq!(s.substitute(&gh, Field::Query, b"a=paddock-secret:GH"), None);
        // KEY: its own header (any case) and the query string, percent-encoded there.
        let (v, _) = s
            .substitute(&gh, Field::Header("x-api-key"), b"paddock-secret:KEY")
            .expect("replaced");
        assert_eq!(&v[..], b"k&y=1 2");
        assert_eq!(s.substitute(&gh, AUTH, b"paddock-secret:KEY"), None);
        let (v, _) = s
            .substitute(&gh, Field::Query, b"a=paddock-secret:KEY&b=paddock-secret%3aKEY")
            .expect("replaced");
        assert_eq!(&v[..], b"a=k%26y%3D1%202&b=k%26y%3D1%202");
        // `%3A` is a query-string spelling only.
        assert_eq!(
            s.substitute(&gh, Field::Header("x-api-key"), b"paddock-secret%3AKEY"),
            None
        );
        let (v, _) = s
            .substitute(
                &gh,
                AUTH,
                b"a paddock-secret:GHX paddock-secret:GH,paddock-secret:",
            )
            .expect("replaced");
        assert_eq!(&v[..], b"a paddock-secret:GHX ghp_real,paddock-secret:");
        assert!(s.any_bound_to(&host("x.openai.com")) && !s.any_bound_to(&host("openai.com")));
        assert!(s.any_query_bound_to(&gh) && !s.any_query_bound_to(&host("x.openai.com")));
    }

    #[test]
    fn values_must_fit_in_a_header_and_are_never_printed() {
        let binding = || SecretBinding::new(vec!["a.test".parse().expect("p")], None, false).expect("b");
        let bad = Secret::new(
            "A".parse().expect("name"),
            Zeroizing::new("x\r\ny".into()),
            binding(),
        );
        assert!(matches!(bad, Err(SecretError::Value(ref n)) if n == "A"));
        let ok = Secret::new(
            "A".parse().expect("name"),
            Zeroizing::new("hunter2".into()),
            binding(),
        )
        .expect("ok");
        assert!(!format!("{ok:?}").contains("hunter2"));
        assert!("bad-name".parse::<SecretName>().is_err());
    }

    #[test]
    fn bindings_name_real_fields_and_some_place() {
        assert_eq!(
            "X-Api-Key".parse::<BoundHeader>().expect("ok").as_str(),
            "x-api-key"
        );
        for bad in [
            "",
            "Host",
            "content-length",
            "Transfer-Encoding",
            "a b",
            "a:b",
            "é",
            &"x".repeat(65),
        ] {
            assert!(bad.parse::<BoundHeader>().is_err(), "{bad:?}");
        }
        let hosts = || vec!["a.test".parse().expect("p")];
        let b = SecretBinding::new(hosts(), None, false).expect("default");
        assert_eq!(b.headers(), &[BoundHeader::authorization()]);
        assert!(SecretBinding::new(vec![], None, false).is_err());
        assert!(SecretBinding::new(hosts(), Some(vec![]), false).is_err());
        assert!(SecretBinding::new(hosts(), Some(vec![]), true).is_ok());
        let many = (0..=MAX_BOUND_HEADERS)
            .map(|i| format!("x-{i}").parse().expect("h"))
            .collect();
        assert!(SecretBinding::new(hosts(), Some(many), false).is_err());
    }

    proptest! {
        #[test]
        fn substitution_never_panics_and_leaves_unbound_values_alone(v in prop::collection::vec(any::<u8>(), 0..200)) {
            let s = set();
            if let Some((out, _)) = s.substitute(&host("api.github.com"), AUTH, &v) {
                prop_assert!(find(&out, b"ghp_real").is_some());
            }
            prop_assert!(s.substitute(&host("other.example"), AUTH, &v).is_none());
            prop_assert!(s.substitute(&host("api.github.com"), Field::Header("x-echo"), &v).is_none());
        }
    }
}

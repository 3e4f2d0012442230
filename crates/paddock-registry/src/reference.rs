//! Image references, parsed as docker does: `busybox` is `docker.io/library/busybox:latest`.

use std::fmt;
use std::str::FromStr;

use oci_client::Reference;

use crate::error::RegistryError;

/// A parsed image reference: registry, repository, and a tag, a digest or both.
///
/// Docker Hub short names resolve as docker does (`busybox` → `docker.io/library/busybox:latest`,
/// `user/img` → `docker.io/user/img:latest`); a reference with a digest and no tag has no tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageReference {
    inner: Reference,
}

impl ImageReference {
    /// The registry as written (`docker.io` for Docker Hub).
    pub fn registry(&self) -> &str {
        self.inner.registry()
    }

    /// The host the requests go to (`index.docker.io` for Docker Hub).
    pub fn resolved_registry(&self) -> &str {
        self.inner.resolve_registry()
    }

    /// The repository (`library/busybox`).
    pub fn repository(&self) -> &str {
        self.inner.repository()
    }

    /// The tag, if any (`latest` when neither a tag nor a digest was written).
    pub fn tag(&self) -> Option<&str> {
        self.inner.tag()
    }

    /// The digest (`sha256:<hex>`), if any.
    pub fn digest(&self) -> Option<&str> {
        self.inner.digest()
    }

    pub(crate) fn oci(&self) -> &Reference {
        &self.inner
    }
}

impl FromStr for ImageReference {
    type Err = RegistryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: String| RegistryError::InvalidReference {
            reference: s.chars().take(300).collect(),
            reason,
        };
        if s.trim() != s || s.chars().any(char::is_control) {
            return Err(invalid("whitespace or control characters".into()));
        }
        let inner = Reference::try_from(s).map_err(|e| invalid(e.to_string()))?;
        // Docker's grammar: repository components are lowercase (oci-spec lets some through).
        if inner.repository().bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(invalid("repository names must be lowercase".into()));
        }
        if let Some(digest) = inner.digest() {
            let hex = digest
                .strip_prefix("sha256:")
                .ok_or_else(|| invalid("only sha256 digests are supported".into()))?;
            if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return Err(invalid("a sha256 digest is 64 lowercase hex digits".into()));
            }
        }
        Ok(Self { inner })
    }
}

impl fmt::Display for ImageReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.whole())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn parse(s: &str) -> ImageReference {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn docker_hub_short_names_resolve_as_docker_does() {
        let r = parse("busybox");
        assert_eq!(r.to_string(), "docker.io/library/busybox:latest");
        assert_eq!(r.registry(), "docker.io");
        assert_eq!(r.resolved_registry(), "index.docker.io");
        assert_eq!(r.repository(), "library/busybox");
        assert_eq!(r.tag(), Some("latest"));
        assert_eq!(parse("user/img").to_string(), "docker.io/user/img:latest");
        assert_eq!(
            parse("index.docker.io/user/img:1").to_string(),
            "docker.io/user/img:1"
        );
        assert_eq!(
            parse("docker.io/busybox:1.36").to_string(),
            "docker.io/library/busybox:1.36"
        );
    }

    #[test]
    fn hosts_with_ports_tags_and_digests() {
        let r = parse("host:5000/ns/img:tag");
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("host:5000", "ns/img", Some("tag"))
        );
        assert_eq!(r.digest(), None);
        let r = parse(&format!("127.0.0.1:5000/ns/img@sha256:{HEX}"));
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.tag(), None);
        assert_eq!(r.digest(), Some(format!("sha256:{HEX}").as_str()));
        let r = parse(&format!("registry.example/ns/img:v1@sha256:{HEX}"));
        assert_eq!(r.tag(), Some("v1"));
        assert_eq!(r.digest(), Some(format!("sha256:{HEX}").as_str()));
        assert_eq!(parse("localhost/img").registry(), "localhost");
    }

    #[test]
    fn invalid_references_are_refused_with_a_reason() {
        for bad in [
            "",
            " busybox",
            "busybox\n",
            ":tag",
            "Upper/case:tag",
            "img@sha256:abc",
            &format!("img@sha512:{HEX}{HEX}"),
            &format!("img@sha256:{}", HEX.to_uppercase()),
            "img:bad tag",
            "a/$$/b",
        ] {
            let err = bad.parse::<ImageReference>().expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::InvalidReference, "{bad}");
            let line = err.to_string();
            assert!(!line.contains('\n'), "{line}");
            assert!(line.starts_with("invalid image reference"), "{line}");
        }
    }

    proptest::proptest! {
        /// Any string: no panic; an accepted reference prints as one that parses to itself.
        #[test]
        fn parsing_never_panics_and_round_trips(s in "[a-zA-Z0-9./:@_-]{0,80}|\\PC{0,40}") {
            if let Ok(r) = s.parse::<ImageReference>() {
                let again: ImageReference = r.to_string().parse().expect("the printed form parses");
                proptest::prop_assert_eq!(again, r);
            }
        }
    }
}

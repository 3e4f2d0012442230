//! The host's platform in OCI's names, and the pick of one manifest from an index.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An OCI platform: `linux/amd64`, `linux/arm/v7`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    /// The host's platform: `linux` and `std::env::consts::ARCH` in OCI's names.
    pub fn host() -> Self {
        let (architecture, variant) = oci_arch(std::env::consts::ARCH);
        Self {
            os: "linux".into(),
            architecture: architecture.into(),
            variant: variant.map(Into::into),
        }
    }

    /// Whether an index entry for `other` runs here. A missing variant matches any, and
    /// `arm64`'s `v8` is its only variant.
    pub fn accepts(&self, other: &Platform) -> bool {
        if self.os != other.os || self.architecture != other.architecture {
            return false;
        }
        match (&self.variant, &other.variant) {
            (Some(a), Some(b)) => a == b,
            (None, Some(b)) => self.architecture == "arm64" && b == "v8",
            (_, None) => true,
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// Rust's architecture names in OCI's (GOARCH) names, with the variant where one is implied.
fn oci_arch(rust_arch: &str) -> (&str, Option<&str>) {
    match rust_arch {
        "x86_64" => ("amd64", None),
        "x86" => ("386", None),
        "aarch64" => ("arm64", None),
        "arm" => ("arm", Some("v7")),
        "powerpc64" if cfg!(target_endian = "little") => ("ppc64le", None),
        "powerpc64" => ("ppc64", None),
        "loongarch64" => ("loong64", None),
        "mips64" if cfg!(target_endian = "little") => ("mips64le", None),
        other => (other, None), // riscv64, s390x, mips64 are spelled alike
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(os: &str, arch: &str, variant: Option<&str>) -> Platform {
        Platform {
            os: os.into(),
            architecture: arch.into(),
            variant: variant.map(Into::into),
        }
    }

    #[test]
    fn rust_arches_map_to_oci_names() {
        assert_eq!(oci_arch("x86_64"), ("amd64", None));
        assert_eq!(oci_arch("aarch64"), ("arm64", None));
        assert_eq!(oci_arch("riscv64"), ("riscv64", None));
        assert_eq!(oci_arch("s390x"), ("s390x", None));
        assert_eq!(Platform::host().os, "linux");
    }

    #[test]
    fn platform_matching() {
        let amd64 = p("linux", "amd64", None);
        assert!(amd64.accepts(&p("linux", "amd64", None)));
        assert!(!amd64.accepts(&p("linux", "amd64", Some("v3"))));
        assert!(!amd64.accepts(&p("linux", "arm64", None)));
        assert!(!amd64.accepts(&p("windows", "amd64", None)));
        assert!(!amd64.accepts(&p("unknown", "unknown", None)));
        let arm64 = p("linux", "arm64", None);
        assert!(arm64.accepts(&p("linux", "arm64", Some("v8"))));
        let armv7 = p("linux", "arm", Some("v7"));
        assert!(armv7.accepts(&p("linux", "arm", None)));
        assert!(!armv7.accepts(&p("linux", "arm", Some("v6"))));
        assert_eq!(armv7.to_string(), "linux/arm/v7");
    }
}

//! Byte sizes as users write them: `512M`, `1G`, `1.5GiB`, `4096`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A size in bytes, parsed from a number with an optional binary suffix (K, M, G, T; with or without
/// `i`/`iB`/`B`; case-insensitive). Suffixes are powers of 1024, as in `docker run --memory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "SizeRepr", into = "u64")]
pub struct ByteSize(u64);

/// Why a string is not a size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size {value:?}: use a number with an optional K, M, G or T suffix, e.g. 512M")]
pub struct SizeError {
    value: String,
}

impl ByteSize {
    /// A size of exactly `n` bytes.
    pub const fn bytes(n: u64) -> Self {
        Self(n)
    }
    /// `n` mebibytes.
    pub const fn mib(n: u64) -> Self {
        Self(n << 20)
    }
    /// `n` gibibytes.
    pub const fn gib(n: u64) -> Self {
        Self(n << 30)
    }
    /// The size in bytes.
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || SizeError { value: s.to_owned() };
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.is_empty() {
            return Err(err());
        }
        let shift = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kb" | "ki" | "kib" => 10,
            "m" | "mb" | "mi" | "mib" => 20,
            "g" | "gb" | "gi" | "gib" => 30,
            "t" | "tb" | "ti" | "tib" => 40,
            _ => return Err(err()),
        };
        let bytes = if let Some((int, frac)) = num.split_once('.') {
            if frac.is_empty() || frac.len() > 6 || frac.contains('.') || int.is_empty() {
                return Err(err());
            }
            let int: u64 = int.parse().map_err(|_| err())?;
            let frac_digits = frac.len() as u32;
            let frac: u64 = frac.parse().map_err(|_| err())?;
            let whole = int.checked_mul(1u64 << shift).ok_or_else(err)?;
            let part = (u128::from(frac) << shift) / 10u128.pow(frac_digits);
            whole
                .checked_add(u64::try_from(part).map_err(|_| err())?)
                .ok_or_else(err)?
        } else {
            let n: u64 = num.parse().map_err(|_| err())?;
            n.checked_mul(1u64 << shift).ok_or_else(err)?
        };
        Ok(Self(bytes))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u32, &str); 4] = [(40, "T"), (30, "G"), (20, "M"), (10, "K")];
        for (shift, unit) in UNITS {
            if self.0 >= 1 << shift && self.0.is_multiple_of(1 << shift) {
                return write!(f, "{}{unit}", self.0 >> shift);
            }
        }
        write!(f, "{}", self.0)
    }
}

/// Sizes arrive as JSON numbers (bytes) or as strings in the CLI syntax.
#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Bytes(u64),
    Text(String),
}

impl TryFrom<SizeRepr> for ByteSize {
    type Error = SizeError;
    fn try_from(r: SizeRepr) -> Result<Self, Self::Error> {
        match r {
            SizeRepr::Bytes(n) => Ok(Self(n)),
            SizeRepr::Text(s) => s.parse(),
        }
    }
}

impl From<ByteSize> for u64 {
    fn from(s: ByteSize) -> Self {
        s.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!("512M".parse::<ByteSize>(), Ok(ByteSize::mib(512)));
        assert_eq!("1G".parse::<ByteSize>(), Ok(ByteSize::gib(1)));
        assert_eq!("1GiB".parse::<ByteSize>(), Ok(ByteSize::gib(1)));
        assert_eq!("1.5g".parse::<ByteSize>(), Ok(ByteSize::mib(1536)));
        assert_eq!("4096".parse::<ByteSize>(), Ok(ByteSize::bytes(4096)));
        for bad in [
            "",
            "M",
            "12X",
            "1..5G",
            "-1G",
            "1.G",
            "99999999999999999999",
            "20000000000T",
        ] {
            assert!(bad.parse::<ByteSize>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn displays_round_trip() {
        for s in ["512M", "1G", "3K", "1000"] {
            assert_eq!(s.parse::<ByteSize>().expect("valid").to_string(), s);
        }
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC*") {
            let _ = s.parse::<ByteSize>();
        }

        #[test]
        fn display_parses_back(n in any::<u64>()) {
            let size = ByteSize::bytes(n);
            prop_assert_eq!(size.to_string().parse::<ByteSize>(), Ok(size));
        }
    }
}

//! Resource limits of a sandbox.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ByteSize;

/// A CPU quota in thousandths of a CPU (`1.5` CPUs = 1500 millicpus). At least 0.01 CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct CpuQuota(u32);

/// Why a string is not a CPU quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cpu quota {value:?}: use a number of CPUs between 0.01 and 1024, e.g. 1.5")]
pub struct CpuQuotaError {
    value: String,
}

impl CpuQuota {
    /// The quota in millicpus.
    pub const fn millicpus(self) -> u32 {
        self.0
    }

    /// The quota as a CFS quota for `period_us` (as cgroup `cpu.max` / `cpu.cfs_quota_us` expect).
    pub fn quota_us(self, period_us: u64) -> u64 {
        period_us * u64::from(self.0) / 1000
    }
}

impl TryFrom<f64> for CpuQuota {
    type Error = CpuQuotaError;
    fn try_from(v: f64) -> Result<Self, Self::Error> {
        if v.is_finite() && (0.01..=1024.0).contains(&v) {
            Ok(Self((v * 1000.0).round() as u32))
        } else {
            Err(CpuQuotaError { value: v.to_string() })
        }
    }
}

impl FromStr for CpuQuota {
    type Err = CpuQuotaError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| CpuQuotaError { value: s.to_owned() })?;
        Self::try_from(v).map_err(|_| CpuQuotaError { value: s.to_owned() })
    }
}

impl From<CpuQuota> for f64 {
    fn from(q: CpuQuota) -> Self {
        f64::from(q.0) / 1000.0
    }
}

impl fmt::Display for CpuQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", f64::from(*self))
    }
}

/// Resource limits. `None` means "no limit of this kind"; [`Limits::default`] gives the defaults
/// `paddock run` applies when a flag is absent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Memory (RSS + page cache + tmpfs) the sandbox may use before the kernel OOM-kills inside it.
    pub memory: Option<ByteSize>,
    /// CPU time per wall-clock time.
    pub cpus: Option<CpuQuota>,
    /// Processes and threads alive at once.
    pub pids: Option<u32>,
    /// Bytes the sandbox may write to its storage.
    pub disk: Option<ByteSize>,
}

impl Limits {
    /// No limit of any kind.
    pub const fn unbounded() -> Self {
        Self {
            memory: None,
            cpus: None,
            pids: None,
            disk: None,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory: Some(ByteSize::gib(1)),
            cpus: None,
            pids: Some(1024),
            disk: Some(ByteSize::gib(10)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_quota() {
        let q: CpuQuota = "1.5".parse().expect("valid");
        assert_eq!(q.millicpus(), 1500);
        assert_eq!(q.quota_us(100_000), 150_000);
        for bad in ["0", "-1", "nan", "inf", "x", "2000"] {
            assert!(bad.parse::<CpuQuota>().is_err(), "{bad:?} accepted");
        }
    }
}

//! What a sandbox may ask for. Every limit has absolute bounds (below them a sandbox's agent cannot
//! start or run a command; above them the kernel refuses the value, which used to surface as an
//! internal error), and a maximum: the operator's (`[max_limits]`), or one derived from the host when
//! the operator sets none ([`HostFacts::max_limits`]).
//!
//! Pure functions of their inputs: the runtime reads the host's figures, the binary resolves the
//! configuration, and [`check_limits`] is applied at every door a limit comes through (`paddock run`
//! flags, the server's default limits at startup, create, warm claims, forks and resumes).
//!
//! What it does not do: read the host, or decide anything about tenants (their quotas are the
//! control plane's).

use serde::{Deserialize, Serialize};

use crate::{ByteSize, CpuQuota, Limits};

/// The least memory a sandbox may have: its agent holds about 5 MiB and its cgroup is charged about
/// 10 MiB at boot; below this a shell and a small command are OOM-killed.
pub const MIN_MEMORY: ByteSize = ByteSize::mib(32);
/// The fewest processes and threads a sandbox may have: its agent, a shell and a small pipeline.
pub const MIN_PIDS: u32 = 8;
/// The least disk a sandbox may have: a fresh sandbox writes its identity files at boot.
pub const MIN_DISK: ByteSize = ByteSize::mib(16);
/// The kernel's highest `pid_max` (`PID_MAX_LIMIT` on 64-bit): `pids.max` refuses anything above.
pub const PID_MAX_LIMIT: u32 = 4 * 1024 * 1024;

/// Figures of the host that bound what one sandbox may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostFacts {
    /// Physical memory (`MemTotal`), bytes.
    pub memory_bytes: u64,
    /// CPUs the server may run on.
    pub cpus: u32,
    /// `kernel.pid_max`: pids (and thread ids) the whole host has.
    pub pid_max: u32,
    /// `kernel.threads-max`: threads the whole host may have.
    pub threads_max: u32,
    /// Size of the storage pool, bytes.
    pub pool_bytes: u64,
}

impl HostFacts {
    /// The most one sandbox may ask for on this host when the operator configures no maximum:
    /// - memory: three quarters of the host's memory, so one sandbox at its limit is OOM-killed inside
    ///   its cgroup while the host, the server and the other sandboxes keep a quarter;
    /// - cpus: the host's CPUs (a quota above them limits nothing);
    /// - pids: a quarter of the host's pid and thread budget (the lower of `pid_max` and
    ///   `threads-max`), so no sandbox can take the host's pids from everyone else;
    /// - disk: the pool's size (nothing can write more).
    ///
    /// Each is at least the absolute minimum, so a small host still admits the smallest sandbox.
    pub fn max_limits(&self) -> Limits {
        let memory = (self.memory_bytes / 4 * 3) & !((1 << 20) - 1);
        let pids = self.pid_max.min(self.threads_max) / 4;
        Limits {
            memory: Some(ByteSize::bytes(memory.max(MIN_MEMORY.as_u64()))),
            cpus: CpuQuota::try_from(f64::from(self.cpus.max(1)).min(1024.0)).ok(),
            pids: Some(pids.clamp(MIN_PIDS, PID_MAX_LIMIT)),
            disk: Some(ByteSize::bytes(self.pool_bytes.max(MIN_DISK.as_u64()))),
        }
    }

    /// The host's CPUs in millicpus: what a sandbox without a CPU limit may use.
    pub fn millicpus(&self) -> u32 {
        self.cpus.max(1).saturating_mul(1000)
    }
}

/// A limit outside what this server allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct LimitError {
    /// `memory`, `cpus`, `pids` or `disk`.
    pub field: &'static str,
    /// Why, with the bound.
    pub reason: String,
}

fn refuse(field: &'static str, reason: String) -> LimitError {
    LimitError { field, reason }
}

/// Checks every limit against its absolute bounds and against `max` (a `None` field: no maximum
/// beyond the absolute ones). A limit that is `None` (none of this kind) is refused where a maximum
/// is set, except CPUs: a sandbox without a CPU quota uses at most the host's CPUs
/// (`host_millicpus`), which is within any maximum at least that large.
pub fn check_limits(limits: &Limits, max: &Limits, host_millicpus: u32) -> Result<(), LimitError> {
    check_size(
        "memory",
        limits.memory,
        MIN_MEMORY,
        max.memory,
        "what a sandbox's agent and a command need",
    )?;
    check_size(
        "disk",
        limits.disk,
        MIN_DISK,
        max.disk,
        "what a sandbox writes when it boots",
    )?;
    match (limits.pids, max.pids) {
        (Some(p), _) if p < MIN_PIDS => {
            return Err(refuse(
                "pids",
                format!("{p} is below the minimum of {MIN_PIDS} (a sandbox's agent, a shell and a command)"),
            ))
        }
        (Some(p), _) if p > PID_MAX_LIMIT => {
            return Err(refuse(
                "pids",
                format!("{p} is above the kernel's limit of {PID_MAX_LIMIT}"),
            ))
        }
        (Some(p), Some(m)) if p > m => {
            return Err(refuse(
                "pids",
                format!("{p} is above this server's maximum of {m}"),
            ))
        }
        (None, Some(m)) => {
            return Err(refuse(
                "pids",
                format!("this server requires a limit of at most {m}"),
            ))
        }
        _ => {}
    }
    if let Some(m) = max.cpus {
        let asked = limits.cpus.map_or(host_millicpus, CpuQuota::millicpus);
        if asked > m.millicpus() {
            return Err(refuse(
                "cpus",
                match limits.cpus {
                    Some(c) => format!("{c} is above this server's maximum of {m}"),
                    None => format!("this server requires a limit of at most {m}"),
                },
            ));
        }
    }
    Ok(())
}

fn check_size(
    field: &'static str,
    value: Option<ByteSize>,
    min: ByteSize,
    max: Option<ByteSize>,
    why_min: &str,
) -> Result<(), LimitError> {
    match (value, max) {
        (Some(v), _) if v < min => Err(refuse(
            field,
            format!("{v} is below the minimum of {min} ({why_min})"),
        )),
        (Some(v), Some(m)) if v > m => Err(refuse(
            field,
            format!("{v} is above this server's maximum of {m}"),
        )),
        (None, Some(m)) => Err(refuse(
            field,
            format!("this server requires a limit of at most {m}"),
        )),
        _ => Ok(()),
    }
}

/// `defaults` with every field above `max` lowered to it: built-in defaults on a host smaller than
/// they assume (a 1 GiB sandbox on a 1 GiB host, a 10 GiB disk in an 8 GiB pool).
pub fn clamp_limits(defaults: &Limits, max: &Limits) -> Limits {
    fn low<T: Ord + Copy>(v: Option<T>, m: Option<T>) -> Option<T> {
        match (v, m) {
            (Some(v), Some(m)) => Some(v.min(m)),
            (v, _) => v,
        }
    }
    Limits {
        memory: low(defaults.memory, max.memory),
        cpus: low(defaults.cpus, max.cpus),
        pids: low(defaults.pids, max.pids),
        disk: low(defaults.disk, max.disk),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// This machine as the issue describes it: 23 GiB, 2 CPUs, pid_max 32768.
    fn host() -> HostFacts {
        HostFacts {
            memory_bytes: 23 << 30,
            cpus: 2,
            pid_max: 32_768,
            threads_max: 192_724,
            pool_bytes: 8 << 30,
        }
    }

    fn unbounded() -> Limits {
        Limits {
            memory: None,
            cpus: None,
            pids: None,
            disk: None,
        }
    }

    #[test]
    fn maxima_follow_the_host() {
        let max = host().max_limits();
        assert_eq!(max.memory, Some(ByteSize::bytes((23 << 30) / 4 * 3)));
        assert_eq!(max.cpus, CpuQuota::try_from(2.0).ok());
        assert_eq!(max.pids, Some(8192), "a quarter of pid_max, the lower budget");
        assert_eq!(max.disk, Some(ByteSize::gib(8)));
        let threads_bound = HostFacts {
            threads_max: 4000,
            ..host()
        };
        assert_eq!(threads_bound.max_limits().pids, Some(1000));
        let huge = HostFacts {
            pid_max: u32::MAX,
            threads_max: u32::MAX,
            cpus: 5000,
            ..host()
        };
        assert_eq!(huge.max_limits().pids, Some(PID_MAX_LIMIT));
        assert_eq!(huge.max_limits().cpus, CpuQuota::try_from(1024.0).ok());
        let tiny = HostFacts {
            memory_bytes: 1 << 20,
            cpus: 0,
            pid_max: 8,
            threads_max: 8,
            pool_bytes: 0,
        };
        let max = tiny.max_limits();
        assert_eq!(
            (max.memory, max.pids, max.disk),
            (Some(MIN_MEMORY), Some(MIN_PIDS), Some(MIN_DISK)),
            "never below the minimum"
        );
        assert_eq!(max.cpus, CpuQuota::try_from(1.0).ok());
    }

    #[test]
    fn the_issue_probes_are_refused_naming_the_field() {
        let max = host().max_limits();
        let ask = |f: &dyn Fn(&mut Limits)| {
            let mut l = clamp_limits(&Limits::default(), &max);
            f(&mut l);
            check_limits(&l, &max, host().millicpus()).map_err(|e| e.field)
        };
        assert_eq!(ask(&|_| {}), Ok(()), "the (clamped) defaults fit");
        assert_eq!(ask(&|l| l.pids = Some(4_000_000)), Err("pids"));
        assert_eq!(ask(&|l| l.pids = Some(10_000_000)), Err("pids"));
        assert_eq!(ask(&|l| l.memory = Some(ByteSize::bytes(1))), Err("memory"));
        assert_eq!(ask(&|l| l.memory = Some(ByteSize::gib(1024))), Err("memory"));
        assert_eq!(ask(&|l| l.cpus = CpuQuota::try_from(1000.0).ok()), Err("cpus"));
        assert_eq!(ask(&|l| l.cpus = CpuQuota::try_from(2.0).ok()), Ok(()));
        assert_eq!(ask(&|l| l.pids = Some(1)), Err("pids"));
        assert_eq!(ask(&|l| l.disk = Some(ByteSize::bytes(1))), Err("disk"));
        assert_eq!(ask(&|l| l.disk = Some(ByteSize::gib(9))), Err("disk"));
        assert_eq!(
            ask(&|l| l.disk = Some(ByteSize::gib(1))),
            Ok(()),
            "within the pool"
        );
    }

    #[test]
    fn absolute_bounds_hold_without_any_maximum() {
        let ok = |l: Limits| check_limits(&l, &unbounded(), 2000).map_err(|e| e.field);
        assert_eq!(ok(unbounded()), Ok(()), "nothing asked, nothing capped");
        for (limits, field) in [
            (
                Limits {
                    pids: Some(PID_MAX_LIMIT + 1),
                    ..unbounded()
                },
                "pids",
            ),
            (
                Limits {
                    pids: Some(MIN_PIDS - 1),
                    ..unbounded()
                },
                "pids",
            ),
            (
                Limits {
                    memory: Some(ByteSize::mib(31)),
                    ..unbounded()
                },
                "memory",
            ),
            (
                Limits {
                    disk: Some(ByteSize::mib(15)),
                    ..unbounded()
                },
                "disk",
            ),
        ] {
            assert_eq!(ok(limits.clone()), Err(field), "{limits:?}");
        }
    }

    #[test]
    fn no_cpu_limit_is_the_hosts_cpus() {
        let max = |cpus: f64| Limits {
            cpus: CpuQuota::try_from(cpus).ok(),
            ..unbounded()
        };
        let none = unbounded();
        assert_eq!(check_limits(&none, &max(2.0), 2000), Ok(()));
        assert_eq!(
            check_limits(&none, &max(1.0), 2000).map_err(|e| e.field),
            Err("cpus"),
            "an operator's cap below the host needs an explicit limit"
        );
    }

    #[test]
    fn clamping_lowers_only_what_is_above() {
        let max = host().max_limits();
        let clamped = clamp_limits(&Limits::default(), &max);
        assert_eq!(clamped.disk, Some(ByteSize::gib(8)), "10G default, 8G pool");
        assert_eq!(clamped.memory, Limits::default().memory);
        assert_eq!(clamped.pids, Limits::default().pids);
        assert_eq!(check_limits(&clamped, &max, host().millicpus()), Ok(()));
    }

    fn limits() -> impl Strategy<Value = Limits> {
        (
            proptest::option::of(any::<u64>()),
            proptest::option::of(1..=1_024_000u32),
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u64>()),
        )
            .prop_map(|(memory, millicpus, pids, disk)| Limits {
                memory: memory.map(ByteSize::bytes),
                cpus: millicpus.and_then(|m| CpuQuota::try_from(f64::from(m.max(10)) / 1000.0).ok()),
                pids,
                disk: disk.map(ByteSize::bytes),
            })
    }

    proptest! {
        /// Whatever is asked, an accepted limit is within the absolute bounds and the host's maxima,
        /// and a refusal names one of the four fields.
        #[test]
        fn accepted_limits_are_within_every_bound(l in limits()) {
            let max = host().max_limits();
            match check_limits(&l, &max, host().millicpus()) {
                Ok(()) => {
                    for (v, m) in [(l.memory, max.memory), (l.disk, max.disk)] {
                        let v = v.expect("required under a maximum");
                        prop_assert!(v <= m.expect("derived"));
                    }
                    prop_assert!(l.memory.expect("set") >= MIN_MEMORY);
                    prop_assert!(l.disk.expect("set") >= MIN_DISK);
                    let pids = l.pids.expect("required under a maximum");
                    prop_assert!((MIN_PIDS..=8192).contains(&pids));
                    prop_assert!(l.cpus.map_or(2000, CpuQuota::millicpus) <= 2000);
                }
                Err(e) => prop_assert!(["memory", "cpus", "pids", "disk"].contains(&e.field)),
            }
        }
    }
}

//! Writing a sandbox's cgroup limits: once at creation and again whenever they change (a warm sandbox
//! claimed with other limits). One code path for both, so a limit set at creation and the same limit
//! set later are the same files with the same values. A limit that is `None` is removed (`max`, or
//! `-1` on v1), which at creation is the kernel's default anyway. On v1 the memory limit also bounds
//! socket buffers (`memory.kmem.tcp.limit_in_bytes`), which that hierarchy counts apart.
//!
//! Besides the limits, every sandbox gets weights, so that under contention no sandbox starves the
//! others even when it has no quota: a CPU weight (`cpu.shares` on v1, `cpu.weight` on v2)
//! proportional to its CPU limit (1 CPU = the kernel's default weight; no limit counts as 1 CPU),
//! and the default block I/O weight in a cgroup of its own (`blkio.bfq.weight` or `blkio.weight` on
//! v1, `io.bfq.weight` or `io.weight` on v2), where the hierarchy offers one. An I/O weight only acts
//! where the device's scheduler honours it (BFQ; `io.cost` on v2), and on v1 buffered writes are
//! written back outside the sandbox's cgroup; the backend reports which weight file it writes.

use std::fs;
use std::io;
use std::path::Path;

use paddock_types::{ByteSize, CpuQuota, Limits};

use super::{io_err, write_file, SandboxCgroup};
use crate::RuntimeError;

/// The CFS period every cpu quota is expressed in.
const CPU_PERIOD_US: u64 = 100_000;
/// The block I/O weight every sandbox gets: the kernel's default for BFQ and `io.weight`.
pub(crate) const DEFAULT_IO_WEIGHT: u32 = 100;

/// The CPU weight file and value for a sandbox limited to `cpus` (`None`: unlimited, weighted as one
/// CPU): `cpu.shares` (1024 per CPU, 2..=262144) on v1, `cpu.weight` (100 per CPU, 1..=10000) on v2.
pub(super) fn cpu_weight(v2: bool, cpus: Option<CpuQuota>) -> (&'static str, u64) {
    let millicpus = u64::from(cpus.map_or(1000, CpuQuota::millicpus));
    if v2 {
        ("cpu.weight", (millicpus * 100 / 1000).clamp(1, 10_000))
    } else {
        ("cpu.shares", (millicpus * 1024 / 1000).clamp(2, 262_144))
    }
}

/// The I/O weight file a (non-root) cgroup directory offers, best first: BFQ's, then the generic one.
pub(super) fn io_weight_file(dir: &Path) -> Option<&'static str> {
    ["blkio.bfq.weight", "blkio.weight", "io.bfq.weight", "io.weight"]
        .into_iter()
        .find(|f| dir.join(f).exists())
}

impl SandboxCgroup {
    /// Writes `limits` (memory, pids, cpu) into the sandbox's cgroups. Lowering the memory limit below
    /// what the sandbox uses fails on cgroup v1 when the kernel cannot reclaim enough
    /// ([`RuntimeError::InvalidSpec`]); on v2 the kernel reclaims and, failing that, OOM-kills inside
    /// the sandbox.
    pub fn set_limits(&self, limits: &Limits) -> Result<(), RuntimeError> {
        self.set_memory(limits.memory)?;
        let pids = self.pids.join("pids.max");
        write_file(&pids, &limits.pids.map_or("max".to_owned(), |p| p.to_string()))?;
        self.set_cpu(limits.cpus)?;
        self.set_cpu_weight(limits.cpus)?;
        self.set_io_weight()
    }

    /// The sandbox's CPU weight: proportional to its CPU limit, as Kubernetes maps CPU requests.
    fn set_cpu_weight(&self, cpus: Option<CpuQuota>) -> Result<(), RuntimeError> {
        let (file, value) = cpu_weight(self.v2, cpus);
        write_file(&self.cpu.join(file), &value.to_string())
    }

    /// The sandbox's block I/O weight: the default, in its own cgroup (equal shares among sandboxes).
    fn set_io_weight(&self) -> Result<(), RuntimeError> {
        let Some(dir) = &self.io else { return Ok(()) };
        match io_weight_file(dir) {
            Some(file) => write_file(&dir.join(file), &DEFAULT_IO_WEIGHT.to_string()),
            None => Ok(()),
        }
    }

    fn set_memory(&self, memory: Option<ByteSize>) -> Result<(), RuntimeError> {
        let bytes = memory.map(ByteSize::as_u64);
        if self.v2 {
            let max = self.memory.join("memory.max");
            write_file(&max, &bytes.map_or("max".to_owned(), |b| b.to_string()))
                .map_err(|e| memory_error(e, bytes))?;
            // No swap: a sandbox's memory limit is its whole footprint.
            let swap = self.memory.join("memory.swap.max");
            if swap.exists() {
                write_file(&swap, "0")?;
            }
            return Ok(());
        }
        let value = bytes.map_or("-1".to_owned(), |b| b.to_string());
        self.set_socket_memory(&value, bytes)?;
        let limit = self.memory.join("memory.limit_in_bytes");
        let memsw = self.memory.join("memory.memsw.limit_in_bytes");
        if !memsw.exists() {
            return write_file(&limit, &value).map_err(|e| memory_error(e, bytes));
        }
        // memory+swap must stay at or above memory alone at every step: raise memsw first, lower it
        // last.
        let current = read_u64(&limit)?;
        let order = if bytes.unwrap_or(u64::MAX) >= current {
            [&memsw, &limit]
        } else {
            [&limit, &memsw]
        };
        for file in order {
            write_file(file, &value).map_err(|e| memory_error(e, bytes))?;
        }
        Ok(())
    }

    /// On cgroup v1, socket buffers (TCP, and UDP, which the kernel charges to the same counter) are
    /// not part of `memory.limit_in_bytes`: without a limit of their own a sandbox could park
    /// gigabytes of host memory in loopback connections. `memory.kmem.tcp.limit_in_bytes` gets the
    /// memory limit (`-1`, no limit, when it has none: writing it also turns the accounting on).
    /// A host whose v1 memory controller lacks the file cannot bound them: refused. (On v2 socket
    /// memory is part of `memory.max`.)
    fn set_socket_memory(&self, value: &str, bytes: Option<u64>) -> Result<(), RuntimeError> {
        let tcp = self.memory.join("memory.kmem.tcp.limit_in_bytes");
        if !tcp.exists() {
            return Err(RuntimeError::Unsupported(format!(
                "{} is missing: this cgroup v1 memory controller cannot bound a sandbox's socket buffers,                  and paddock refuses to run sandboxes without that bound",
                tcp.display()
            )));
        }
        write_file(&tcp, value).map_err(|e| memory_error(e, bytes))
    }

    fn set_cpu(&self, cpus: Option<CpuQuota>) -> Result<(), RuntimeError> {
        let quota = cpus.map(|c| c.quota_us(CPU_PERIOD_US));
        if self.v2 {
            let value = match quota {
                Some(q) => format!("{q} {CPU_PERIOD_US}"),
                None => format!("max {CPU_PERIOD_US}"),
            };
            return write_file(&self.cpu.join("cpu.max"), &value);
        }
        write_file(&self.cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
        write_file(
            &self.cpu.join("cpu.cfs_quota_us"),
            &quota.map_or("-1".to_owned(), |q| q.to_string()),
        )
    }
}

fn read_u64(path: &Path) -> Result<u64, RuntimeError> {
    let text = fs::read_to_string(path).map_err(io_err(path, "read"))?;
    text.trim().parse().map_err(|_| {
        io_err(path, "parse")(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a number: {:?}", text.trim()),
        ))
    })
}

/// `EBUSY` from a memory limit write means the kernel could not reclaim enough to fit under it.
fn memory_error(err: RuntimeError, bytes: Option<u64>) -> RuntimeError {
    match (&err, bytes) {
        (RuntimeError::Cgroup { source, .. }, Some(bytes)) if source.raw_os_error() == Some(libc::EBUSY) => {
            RuntimeError::InvalidSpec(format!(
                "cannot lower the memory limit to {bytes} bytes: the sandbox uses more than that and the \
                 kernel could not reclaim enough"
            ))
        }
        _ => err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_weights_are_proportional_to_the_cpu_limit() {
        let cpus = |c: f64| CpuQuota::try_from(c).ok();
        assert_eq!(
            cpu_weight(false, None),
            ("cpu.shares", 1024),
            "no limit: one CPU's weight"
        );
        assert_eq!(cpu_weight(false, cpus(2.0)), ("cpu.shares", 2048));
        assert_eq!(cpu_weight(false, cpus(0.01)), ("cpu.shares", 10));
        assert_eq!(cpu_weight(false, cpus(1024.0)), ("cpu.shares", 262_144));
        assert_eq!(cpu_weight(true, None), ("cpu.weight", 100));
        assert_eq!(cpu_weight(true, cpus(0.5)), ("cpu.weight", 50));
        assert_eq!(cpu_weight(true, cpus(0.01)), ("cpu.weight", 1));
        assert_eq!(cpu_weight(true, cpus(1024.0)), ("cpu.weight", 10_000));
    }
}

//! Writing a sandbox's cgroup limits: once at creation and again whenever they change (a warm sandbox
//! claimed with other limits). One code path for both, so a limit set at creation and the same limit
//! set later are the same files with the same values. A limit that is `None` is removed (`max`, or
//! `-1` on v1), which at creation is the kernel's default anyway. On v1 the memory limit also bounds
//! socket buffers (`memory.kmem.tcp.limit_in_bytes`), which that hierarchy counts apart.

use std::fs;
use std::io;
use std::path::Path;

use paddock_types::{ByteSize, CpuQuota, Limits};

use super::{io_err, write_file, SandboxCgroup};
use crate::RuntimeError;

/// The CFS period every cpu quota is expressed in.
const CPU_PERIOD_US: u64 = 100_000;

impl SandboxCgroup {
    /// Writes `limits` (memory, pids, cpu) into the sandbox's cgroups. Lowering the memory limit below
    /// what the sandbox uses fails on cgroup v1 when the kernel cannot reclaim enough
    /// ([`RuntimeError::InvalidSpec`]); on v2 the kernel reclaims and, failing that, OOM-kills inside
    /// the sandbox.
    pub fn set_limits(&self, limits: &Limits) -> Result<(), RuntimeError> {
        self.set_memory(limits.memory)?;
        let pids = self.pids.join("pids.max");
        write_file(&pids, &limits.pids.map_or("max".to_owned(), |p| p.to_string()))?;
        self.set_cpu(limits.cpus)
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

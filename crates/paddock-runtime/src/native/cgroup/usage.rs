//! Reading a sandbox's resource counters from its cgroups.
//!
//! CPU time comes from a cgroup2 `cpu.stat` (`usage_usec`), which every cgroup2 directory has even
//! without the cpu controller: the sandbox's own cgroup on pure v2, its controller-less one on a hybrid
//! v1 host. A v1 host without a cgroup2 mount falls back to `cpuacct.usage` when cpuacct is co-mounted
//! with cpu (the usual `cpu,cpuacct`), and reports 0 otherwise.

use std::fs;
use std::io;
use std::path::Path;

use super::{io_err, SandboxCgroup};
use crate::RuntimeError;

/// What a sandbox's cgroups have counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    /// CPU time of every process the sandbox ever ran, microseconds.
    pub cpu_time_us: u64,
    /// Memory charged now (processes, page cache, tmpfs), bytes.
    pub memory_bytes: u64,
    /// Highest memory charge so far, bytes.
    pub memory_peak_bytes: u64,
    /// Processes and threads alive now.
    pub pids: u64,
}

impl SandboxCgroup {
    /// Reads the sandbox's counters.
    pub fn usage(&self) -> Result<CgroupUsage, RuntimeError> {
        let (memory_bytes, memory_peak_bytes) = if self.v2 {
            let current = read_number(&self.memory.join("memory.current"))?;
            // memory.peak exists from Linux 5.19.
            let peak = read_optional(&self.memory.join("memory.peak"))?.unwrap_or(current);
            (current, peak)
        } else {
            (
                read_number(&self.memory.join("memory.usage_in_bytes"))?,
                read_number(&self.memory.join("memory.max_usage_in_bytes"))?,
            )
        };
        Ok(CgroupUsage {
            cpu_time_us: self.cpu_time_us()?,
            memory_bytes,
            memory_peak_bytes: memory_peak_bytes.max(memory_bytes),
            pids: read_number(&self.pids.join("pids.current"))?,
        })
    }

    fn cpu_time_us(&self) -> Result<u64, RuntimeError> {
        if let Some(unified) = &self.unified {
            let path = unified.join("cpu.stat");
            let text = fs::read_to_string(&path).map_err(io_err(&path, "read"))?;
            return parse_usage_usec(&text).ok_or_else(|| {
                io_err(&path, "parse")(io::Error::new(io::ErrorKind::InvalidData, "no usage_usec line"))
            });
        }
        Ok(read_optional(&self.cpu.join("cpuacct.usage"))?.map_or(0, |ns| ns / 1000))
    }
}

/// The `usage_usec` of a cgroup2 `cpu.stat`.
fn parse_usage_usec(cpu_stat: &str) -> Option<u64> {
    cpu_stat
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
}

fn read_number(path: &Path) -> Result<u64, RuntimeError> {
    read_optional(path)?.ok_or_else(|| io_err(path, "read")(io::Error::from(io::ErrorKind::NotFound)))
}

/// A file holding one number; `None` when the file does not exist.
fn read_optional(path: &Path) -> Result<Option<u64>, RuntimeError> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path, "read")(e)),
    };
    let text = text.trim();
    // A limit-style file reads "max" when unlimited; counters never do.
    if text == "max" {
        return Ok(Some(u64::MAX));
    }
    text.parse().map(Some).map_err(|_| {
        io_err(path, "parse")(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a number: {text:?}"),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_stat_usage() {
        let stat = "usage_usec 225320\nuser_usec 225000\nsystem_usec 320\nnice_usec 0\n";
        assert_eq!(parse_usage_usec(stat), Some(225_320));
        assert_eq!(parse_usage_usec("user_usec 1\n"), None);
    }

    #[test]
    fn numbers_and_missing_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("memory.current");
        fs::write(&file, "4096\n").expect("write");
        assert_eq!(read_number(&file).expect("number"), 4096);
        assert_eq!(read_optional(&dir.path().join("absent")).expect("absent"), None);
        assert!(read_number(&dir.path().join("absent")).is_err());
        fs::write(&file, "lots\n").expect("write");
        assert!(read_number(&file).is_err());
    }
}

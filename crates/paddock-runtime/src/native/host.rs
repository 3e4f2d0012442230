//! The host's figures that bound what one sandbox may ask for ([`HostFacts`]): memory, CPUs, the
//! pid and thread budgets, and the size of the storage pool. Read once, at startup; what they imply
//! is decided by the pure functions in `paddock_types::limit_bounds`.
//!
//! What it does not do: decide any limit, or read anything a sandbox can write.

use std::fs;
use std::path::{Path, PathBuf};

use paddock_sys::btrfs;
use paddock_types::{ByteSize, HostFacts};

use crate::RuntimeError;

const MEMINFO: &str = "/proc/meminfo";
const PID_MAX: &str = "/proc/sys/kernel/pid_max";
const THREADS_MAX: &str = "/proc/sys/kernel/threads-max";

fn host_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> RuntimeError + 'a {
    move |source| RuntimeError::State {
        what,
        path: path.to_owned(),
        source,
    }
}

fn unreadable(path: &str, text: &str) -> RuntimeError {
    RuntimeError::State {
        what: "parse",
        path: PathBuf::from(path),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "unexpected contents {:?}",
                text.chars().take(80).collect::<String>()
            ),
        ),
    }
}

/// Reads the host's figures. The pool is `<state_dir>/pool` when that is (or lies on) btrfs, as the
/// backend opens it; otherwise it will be an image of `image_size`.
pub fn host_facts(state_dir: &Path, image_size: ByteSize) -> Result<HostFacts, RuntimeError> {
    let meminfo = fs::read_to_string(MEMINFO).map_err(host_err("read", Path::new(MEMINFO)))?;
    let memory_bytes = mem_total(&meminfo).ok_or_else(|| unreadable(MEMINFO, &meminfo))?;
    let read_u32 = |path: &'static str| -> Result<u32, RuntimeError> {
        let text = fs::read_to_string(path).map_err(host_err("read", Path::new(path)))?;
        text.trim().parse().map_err(|_| unreadable(path, &text))
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    Ok(HostFacts {
        memory_bytes,
        cpus,
        pid_max: read_u32(PID_MAX)?,
        threads_max: read_u32(THREADS_MAX)?,
        pool_bytes: pool_bytes(state_dir, image_size)?,
    })
}

/// The size of the file system the pool is (or will be) on.
fn pool_bytes(state_dir: &Path, image_size: ByteSize) -> Result<u64, RuntimeError> {
    for dir in [state_dir.join("pool"), state_dir.to_owned()] {
        if btrfs::is_btrfs(&dir).unwrap_or(false) {
            let fs = rustix::fs::statvfs(&dir).map_err(|e| host_err("inspect", &dir)(e.into()))?;
            return Ok(fs.f_blocks.saturating_mul(fs.f_frsize));
        }
    }
    Ok(image_size.as_u64())
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let kib: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => kib.checked_mul(1024),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_bytes() {
        let text = "MemTotal:       24522080 kB\nMemFree:          123 kB\n";
        assert_eq!(mem_total(text), Some(24_522_080 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total("MemTotal: lots kB\n"), None);
        assert_eq!(mem_total("MemTotal: 12 MB\n"), None);
    }

    #[test]
    fn this_host_has_figures() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let facts = host_facts(dir.path(), ByteSize::gib(3)).expect("read");
        assert!(facts.memory_bytes > 0 && facts.cpus > 0 && facts.pid_max > 0 && facts.threads_max > 0);
        if !btrfs::is_btrfs(dir.path()).unwrap_or(false) {
            assert_eq!(facts.pool_bytes, 3 << 30, "not on btrfs: the image's size");
        }
    }
}

//! A live native sandbox as the backend keeps it: its handle state (`NativeSandbox`), how its init
//! starts again (`BootSpec`, in `<run>/boot.json`), its init's record (`InitRecord`, in
//! `<run>/init.pid`), a rollback prepared for it (`Prepared`), and the process-level steps on its
//! init (kill, reap, wait).
//!
//! Data and small steps only: creating, adopting and rolling back sandboxes are `lifecycle.rs`,
//! `adopt.rs` and `rollback.rs`, which all build on this module and not on each other's records.

/// Backend-private state of a live native sandbox.
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use paddock_types::{MountSpec, RootfsSpec, SandboxSpec, SnapshotId, UserSpec, VolumeMount};
use serde::{Deserialize, Serialize};

use super::cgroup::SandboxCgroup;
use super::lock::StateLock;
use super::network::BootNetwork;
use crate::RuntimeError;

#[derive(Debug)]
pub(crate) struct NativeSandbox {
    pub(super) run_dir: PathBuf,
    pub(super) cgroup: SandboxCgroup,
    pub(super) init_pid: i32,
    pub(super) pidfd: Option<OwnedFd>,
    /// The init is this process's child (it created the sandbox) and can be waited for; an adopted
    /// sandbox's init is not, and its exit is seen on its pidfd instead.
    pub(super) child: bool,
    pub(super) reaped: bool,
    /// How to start its init again (a rollback); `None` for a sandbox adopted from a paddock that did
    /// not record it.
    pub(super) boot: Option<Box<BootSpec>>,
    /// Held while the freeze state changes (pause, resume, snapshot), so a snapshot never thaws a
    /// sandbox paused in the meantime.
    pub(super) freezer: Mutex<()>,
    /// A sandbox booted ahead of a rollback (rollback.rs).
    pub(super) next: Mutex<Option<Prepared>>,
    pub(super) _lock: StateLock,
}

/// What starting a sandbox's init needs besides its id, run directory and cgroups: kept in
/// `<run>/boot.json` so that a rollback can restart an adopted sandbox too. Limits are not in it: they
/// live in the cgroups and the qgroup, which a rollback keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BootSpec {
    pub(super) rootfs: RootfsSpec,
    pub(super) mounts: Vec<MountSpec>,
    pub(super) user: UserSpec,
    /// Named volumes (absent from records written before volumes existed).
    #[serde(default)]
    pub(super) volumes: Vec<VolumeMount>,
    /// A networked sandbox's link (absent from records written before networking existed): every
    /// init of the sandbox joins its namespace, pinned in the run directory.
    #[serde(default)]
    pub(super) network: Option<BootNetwork>,
}

pub(super) fn state_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> RuntimeError + 'a {
    move |source| RuntimeError::State {
        what,
        path: path.to_owned(),
        source,
    }
}

/// Sends SIGKILL to the sandbox's init (through its pidfd when there is one), which kills its whole PID
/// namespace.
pub(super) fn kill_init(sb: &NativeSandbox) {
    kill_pid(sb.pidfd.as_ref(), sb.init_pid);
}

/// SIGKILL to process `pid`, through its pidfd when there is one.
pub(super) fn kill_pid(pidfd: Option<&OwnedFd>, pid: i32) {
    match pidfd {
        Some(fd) => {
            let _ = rustix::process::pidfd_send_signal(fd, rustix::process::Signal::KILL);
        }
        None => {
            if let Some(p) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
    }
}

/// Waits until the init has exited: our child (through `CLONE_PARENT`) is reaped with `waitpid`; an
/// adopted init, someone else's child, is watched through its pidfd (for at most [`KILL_DEADLINE`];
/// teardown then still waits for the cgroups to empty).
pub(super) fn reap(sb: &mut NativeSandbox) {
    if sb.child {
        if let Some(pid) = rustix::process::Pid::from_raw(sb.init_pid) {
            // Blocks until the init has exited; an error (ECHILD) means it was reaped already.
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
        }
    } else if let Some(fd) = &sb.pidfd {
        if wait_exit(fd, Some(KILL_DEADLINE)) {
            reap_if_child(fd);
        }
    }
    sb.reaped = true;
}

/// Waits (at most `timeout`, or forever) until the process of `pidfd` has exited; returns whether it
/// has.
pub(super) fn wait_exit(pidfd: &OwnedFd, timeout: Option<Duration>) -> bool {
    let timeout = timeout.map(|t| rustix::event::Timespec {
        tv_sec: t.as_secs() as i64,
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    let mut fds = [rustix::event::PollFd::new(pidfd, rustix::event::PollFlags::IN)];
    // A pidfd polls readable once its process has exited.
    matches!(rustix::event::poll(&mut fds, timeout.as_ref()), Ok(n) if n > 0)
}

/// How long teardown waits for killed processes to disappear.
pub(super) const KILL_DEADLINE: Duration = Duration::from_secs(10);

impl NativeSandbox {
    pub(crate) fn init_pid(&self) -> i32 {
        self.init_pid
    }

    /// The handle of live sandbox `id` whose init (`init_pid`, of `pidfd`) is not this process's
    /// child (adopted, or made ahead and claimed), held through `lock`; how it boots (and its
    /// network) from its run directory's record.
    pub(super) fn not_a_child(
        id: paddock_types::SandboxId,
        run_dir: PathBuf,
        cgroup: SandboxCgroup,
        init_pid: i32,
        pidfd: OwnedFd,
        lock: StateLock,
    ) -> crate::SandboxHandle {
        let boot = BootSpec::read(&run_dir);
        crate::SandboxHandle {
            id,
            agent_socket: run_dir.join("agent.sock"),
            network: boot.as_ref().and_then(|b| b.network.as_ref()).map(|n| n.link()),
            inner: crate::AnyHandle::Native(Self {
                run_dir,
                cgroup,
                init_pid,
                pidfd: Some(pidfd),
                child: false,
                reaped: false,
                boot,
                freezer: Mutex::new(()),
                next: Mutex::new(None),
                _lock: lock,
            }),
        }
    }
}

impl BootSpec {
    const FILE: &'static str = "boot.json";

    pub(super) fn of(spec: &SandboxSpec, network: Option<BootNetwork>) -> Self {
        Self {
            rootfs: spec.rootfs.clone(),
            mounts: spec.mounts.clone(),
            user: spec.user.clone(),
            volumes: spec.volumes.clone(),
            network,
        }
    }

    pub(super) fn write(&self, run_dir: &Path) -> Result<(), RuntimeError> {
        let path = run_dir.join(Self::FILE);
        let json =
            serde_json::to_vec(self).map_err(|e| state_err("encode", &path)(std::io::Error::other(e)))?;
        fs::write(&path, json).map_err(state_err("write", &path))
    }

    /// The record in `run_dir`, if there is a readable one.
    pub(super) fn read(run_dir: &Path) -> Option<Box<Self>> {
        serde_json::from_slice(&fs::read(run_dir.join(Self::FILE)).ok()?).ok()
    }
}

/// `<run>/init.pid`: the init's host pid and start time (clock ticks after boot, field 22 of
/// `/proc/<pid>/stat`), as `"<pid> <start time>\n"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct InitRecord {
    pub(super) pid: i32,
    pub(super) start_time: u64,
}

/// Field 22 (`starttime`) of `/proc/<pid>/stat`. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted after its last `)`.
pub(super) fn process_start_time(pid: i32) -> io::Result<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_start_time(&stat).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat"))
}

fn parse_start_time(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts at field 3 (state), so field 22 is the 20th.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Reaps the exited process of `pidfd` if it is this process's child (a sandbox this process created
/// and then lost its handle of); does nothing for anyone else's (`ECHILD`).
pub(super) fn reap_if_child(pidfd: &OwnedFd) {
    let _ = rustix::process::waitid(
        rustix::process::WaitId::PidFd(pidfd.as_fd()),
        rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOHANG,
    );
}

impl InitRecord {
    const FILE: &'static str = "init.pid";

    /// The record of the live (or not yet reaped) process `pid`.
    pub(super) fn of(pid: i32) -> Result<Self, RuntimeError> {
        let start_time = process_start_time(pid).map_err(|e| {
            RuntimeError::Setup(format!(
                "cannot read the start time of the sandbox init {pid}: {e}"
            ))
        })?;
        Ok(Self { pid, start_time })
    }

    /// Writes the record into `run_dir`, atomically (a temporary file renamed into place).
    pub(super) fn write(&self, run_dir: &Path) -> Result<(), RuntimeError> {
        let staging = run_dir.join(format!(".{}.new", Self::FILE));
        let path = run_dir.join(Self::FILE);
        fs::write(&staging, format!("{} {}\n", self.pid, self.start_time))
            .map_err(state_err("write", &staging))?;
        fs::rename(&staging, &path).map_err(state_err("rename", &staging))
    }

    pub(super) fn read(run_dir: &Path) -> Option<Self> {
        Self::parse(&fs::read_to_string(run_dir.join(Self::FILE)).ok()?)
    }

    /// Kills the init recorded in `run_dir` if that very process (same pid and start time) still
    /// runs, which ends its PID namespace; for an init that shares its cgroups with another sandbox's
    /// (one prepared for a rollback) and so cannot be killed through them.
    pub(super) fn kill_recorded(run_dir: &Path) {
        let Some(record) = Self::read(run_dir) else { return };
        if process_start_time(record.pid).ok() == Some(record.start_time) {
            if let Some(pid) = rustix::process::Pid::from_raw(record.pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }

    pub(super) fn parse(text: &str) -> Option<Self> {
        let mut fields = text.split_whitespace();
        let pid = fields.next()?.parse().ok().filter(|p| *p > 0)?;
        let start_time = fields.next()?.parse().ok()?;
        fields.next().is_none().then_some(Self { pid, start_time })
    }
}

/// A sandbox booted ahead of a rollback, on a writable copy of `snapshot` (see the module docs).
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(super) snapshot: SnapshotId,
    /// `<id>.next`: its run directory and volume go by this name.
    pub(super) name: String,
    pub(super) run_dir: PathBuf,
    pub(super) init_pid: i32,
    pub(super) pidfd: Option<OwnedFd>,
    pub(super) _lock: StateLock,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_record_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let record = InitRecord::of(std::process::id() as i32).expect("own record");
        record.write(dir.path()).expect("write");
        assert_eq!(InitRecord::read(dir.path()), Some(record));
        assert!(!dir.path().join(".init.pid.new").exists(), "renamed into place");
        for bad in ["", "12", "x 5", "0 5", "-3 5", "12 5 7", "12 five"] {
            assert_eq!(InitRecord::parse(bad), None, "{bad:?}");
        }
        assert_eq!(
            InitRecord::parse("12 345\n"),
            Some(InitRecord {
                pid: 12,
                start_time: 345
            })
        );
    }

    #[test]
    fn start_time_survives_odd_command_names() {
        let stat = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 \
                    100 18446744073709551615";
        assert_eq!(parse_start_time(stat), Some(987_654));
        assert_eq!(parse_start_time("4242 (truncated"), None);
        let own = process_start_time(std::process::id() as i32).expect("own start time");
        assert!(own > 0);
    }
}

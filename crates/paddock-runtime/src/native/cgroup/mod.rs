//! Cgroup limits for sandboxes, on cgroup v1 hierarchies (memory, pids, cpu, and blkio when mounted)
//! and on pure cgroup v2.
//!
//! Every sandbox gets one cgroup per hierarchy, named after its id under a `paddock` parent. Its
//! init is born in them (see [`SandboxCgroup::placement`]), so every process of the sandbox, however
//! it daemonizes, stays inside and is killed with it. Limits are written at creation and may change
//! while the sandbox runs (`limits.rs`); usage counters are read from the same cgroups (`usage.rs`);
//! the cgroup2 freezer stops all of a sandbox's processes at once (`freeze.rs`). The parents are made
//! on first use and removed by gc once empty, if paddock made them (`parents.rs`).

mod freeze;
mod limits;
mod parents;
mod usage;

pub(crate) use limits::DEFAULT_IO_WEIGHT;
pub(crate) use parents::CREATED_PARENTS;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use paddock_types::{Limits, SandboxId};

use crate::RuntimeError;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The cgroups paddock manages: the host's cgroup interface and the name of the parent cgroup its
/// sandboxes live under (`paddock` by default; separate instances or test runs use their own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLayout {
    kind: CgroupKind,
    parent: String,
    /// The record of the parents made here (`parents.rs`).
    created: PathBuf,
}

/// Which cgroup interface the host offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupKind {
    /// Pure cgroup v2 mounted at the root.
    V2 {
        /// The cgroup2 mount.
        root: PathBuf,
        /// The `io` controller is available (`cgroup.controllers`): sandboxes get an I/O weight.
        io: bool,
    },
    /// Cgroup v1 controller hierarchies, and optionally a controller-less cgroup2 mount (hybrid) that
    /// still offers `cgroup.kill`.
    V1 {
        /// The memory hierarchy.
        memory: PathBuf,
        /// The pids hierarchy.
        pids: PathBuf,
        /// The cpu hierarchy.
        cpu: PathBuf,
        /// The blkio hierarchy, if mounted: each sandbox gets its own I/O weight there.
        blkio: Option<PathBuf>,
        /// A cgroup2 mount without controllers, if any.
        unified: Option<PathBuf>,
    },
}

/// How the setup shim puts a sandbox's init in its cgroups ([`SandboxCgroup::placement`]), in this
/// order.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// `tasks` files the shim writes `0` into (itself, its only thread); the init inherits them.
    pub tasks: Vec<PathBuf>,
    /// `cgroup.procs` files the shim migrates itself through; the init inherits them.
    pub procs: Vec<PathBuf>,
    /// The cgroup2 directory the init is cloned into (`CLONE_INTO_CGROUP`).
    pub clone_into: Option<PathBuf>,
}

/// The cgroups of one sandbox. On pure v2 the memory, pids and cpu directories are one and the same.
#[derive(Debug, Clone)]
pub struct SandboxCgroup {
    /// Pure cgroup v2.
    v2: bool,
    memory: PathBuf,
    pids: PathBuf,
    cpu: PathBuf,
    /// Where its I/O weight is written: its blkio cgroup on v1 (if that hierarchy is mounted), its
    /// cgroup on v2 (if the `io` controller is available).
    io: Option<PathBuf>,
    /// A cgroup2 directory (the sandbox's cgroup on v2, its controller-less one on hybrid v1): it has
    /// `cgroup.kill` and the `cpu.stat` CPU time counters.
    unified: Option<PathBuf>,
}

fn io_err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> RuntimeError + 'a {
    move |source| RuntimeError::Cgroup {
        what,
        path: path.to_owned(),
        source,
    }
}

fn write_file(path: &Path, value: &str) -> Result<(), RuntimeError> {
    fs::write(path, value).map_err(io_err(path, "write"))
}

impl CgroupKind {
    fn detect() -> Result<Self, RuntimeError> {
        let root = Path::new(CGROUP_ROOT);
        let magic = paddock_sys::mount::fs_magic(root).map_err(io_err(root, "inspect"))?;
        if magic == paddock_sys::mount::CGROUP2_SUPER_MAGIC {
            let controllers = root.join("cgroup.controllers");
            let io = fs::read_to_string(&controllers)
                .map_err(io_err(&controllers, "read"))?
                .split_whitespace()
                .any(|c| c == "io");
            return Ok(Self::V2 {
                root: root.to_owned(),
                io,
            });
        }
        let need = |name: &str| -> Result<PathBuf, RuntimeError> {
            let p = root.join(name);
            if p.join("tasks").exists() {
                Ok(p)
            } else {
                Err(RuntimeError::Unsupported(format!(
                    "cgroup v1 controller '{name}' is not mounted at {} and cgroup v2 is not the root hierarchy; \
                     paddock refuses to run without memory, pids and cpu limits",
                    p.display()
                )))
            }
        };
        let unified = root.join("unified");
        let unified = match paddock_sys::mount::fs_magic(&unified) {
            Ok(m) if m == paddock_sys::mount::CGROUP2_SUPER_MAGIC => Some(unified),
            _ => None,
        };
        let blkio = Some(root.join("blkio")).filter(|p| p.join("tasks").exists());
        Ok(Self::V1 {
            memory: need("memory")?,
            pids: need("pids")?,
            cpu: need("cpu")?,
            blkio,
            unified,
        })
    }
}

impl CgroupLayout {
    /// Detects the layout of this host; sandboxes go under `parent` in every hierarchy. The parents
    /// this layout makes are recorded in `created` (a file in the state directory).
    pub fn detect(parent: &str, created: PathBuf) -> Result<Self, RuntimeError> {
        let valid = !parent.is_empty()
            && parent.len() <= 64
            && parent
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && !parent.starts_with('.');
        if !valid {
            return Err(RuntimeError::InvalidConfig(format!(
                "invalid cgroup parent name {parent:?}"
            )));
        }
        Ok(Self {
            kind: CgroupKind::detect()?,
            parent: parent.to_owned(),
            created,
        })
    }

    /// The cgroups of sandbox `id` (whether or not they exist).
    pub fn sandbox(&self, id: &str) -> SandboxCgroup {
        let p = &self.parent;
        match &self.kind {
            CgroupKind::V2 { root, io } => {
                let dir = root.join(p).join(id);
                SandboxCgroup {
                    v2: true,
                    memory: dir.clone(),
                    pids: dir.clone(),
                    cpu: dir.clone(),
                    io: io.then(|| dir.clone()),
                    unified: Some(dir),
                }
            }
            CgroupKind::V1 {
                memory,
                pids,
                cpu,
                blkio,
                unified,
            } => SandboxCgroup {
                v2: false,
                memory: memory.join(p).join(id),
                pids: pids.join(p).join(id),
                cpu: cpu.join(p).join(id),
                io: blkio.as_ref().map(|b| b.join(p).join(id)),
                unified: unified.as_ref().map(|u| u.join(p).join(id)),
            },
        }
    }

    /// Ids of every sandbox cgroup that exists (for garbage collection).
    pub fn list_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = Vec::new();
        for parent in self.parents() {
            let Ok(rd) = fs::read_dir(&parent) else { continue };
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    if let Some(name) = e.file_name().to_str() {
                        if is_sandbox_name(name) && !ids.iter().any(|i| i == name) {
                            ids.push(name.to_owned());
                        }
                    }
                }
            }
        }
        ids
    }

    /// How sandboxes' block I/O is weighted on this host, for the backend's capabilities and its
    /// startup report: the weight file each sandbox gets (`blkio.bfq.weight`, `blkio.weight`,
    /// `io.bfq.weight` or `io.weight`), or `None` when the hierarchy offers none. Creates the parent
    /// cgroups (weight files exist below the root only).
    pub fn io_weight_file(&self) -> Result<Option<&'static str>, RuntimeError> {
        let parent = match &self.kind {
            CgroupKind::V2 { root, io: true } => root.join(&self.parent),
            CgroupKind::V1 {
                blkio: Some(blkio), ..
            } => blkio.join(&self.parent),
            _ => return Ok(None),
        };
        self.ensure_parents()?;
        Ok(limits::io_weight_file(&parent))
    }

    /// Creates the cgroups of sandbox `id` with `limits` applied.
    pub fn create(&self, id: &SandboxId, limits: &Limits) -> Result<SandboxCgroup, RuntimeError> {
        self.create_named(id.as_str(), limits)
    }

    /// [`Self::create`] under another name than a sandbox id (a sandbox prepared for a rollback).
    pub fn create_named(&self, name: &str, limits: &Limits) -> Result<SandboxCgroup, RuntimeError> {
        self.ensure_parents()?;
        let cg = self.sandbox(name);
        for dir in cg.dirs() {
            let made = match fs::create_dir(dir) {
                // A gc in another process removed the parent, empty until now: make it again, once.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.ensure_parents()?;
                    fs::create_dir(dir)
                }
                other => other,
            };
            made.map_err(io_err(dir, "create"))?;
        }
        let applied = cg.set_limits(limits);
        if applied.is_err() {
            let _ = cg.remove();
        }
        applied.map(|()| cg)
    }
}

impl SandboxCgroup {
    /// Every directory of the sandbox's cgroups, once each.
    fn dirs(&self) -> Vec<&Path> {
        if self.v2 {
            return vec![&self.memory];
        }
        let mut dirs = self.v1_dirs();
        dirs.extend(self.unified.as_deref());
        dirs
    }

    /// The directories in the v1 hierarchies (none on pure v2).
    fn v1_dirs(&self) -> Vec<&Path> {
        if self.v2 {
            return Vec::new();
        }
        let mut dirs = vec![self.memory.as_path(), &self.pids, &self.cpu];
        dirs.extend(self.io.as_deref());
        dirs
    }

    /// Whether any of the sandbox's cgroup directories exists.
    pub fn exists(&self) -> bool {
        self.dirs().iter().any(|d| d.exists())
    }

    /// The `cgroup.procs` files that list the sandbox's processes in every hierarchy.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs().iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// How a sandbox's init is put in these cgroups. A migration through a `cgroup.procs` file takes
    /// the kernel's global cgroup lock for writing, which waits for an RCU grace period (6.5–7 ms on
    /// this host); this avoids it:
    /// - the v1 hierarchies' `tasks` files, which the single-threaded setup shim writes `0` into: a
    ///   thread moving itself is migrated without that lock, and the init it clones inherits them;
    /// - the cgroup2 directory (the sandbox's cgroup on v2, its controller-less one on hybrid v1),
    ///   which the init is cloned straight into (`CLONE_INTO_CGROUP`), without a migration.
    ///
    /// The clone needs `fresh` cgroups, made for this start: a kernel with `cgroup.kill`'s kill
    /// sequence (6.14 and later, 6.18 here) compares the target cgroup's kill count with the one
    /// read from the caller's cgroup and kills the child when they differ, so an init cloned into a
    /// cgroup that `cgroup.kill` emptied before (a rollback's) would die at birth. Reused cgroups get
    /// the migration.
    pub fn placement(&self, fresh: bool) -> Placement {
        let cgroup2 = if self.v2 {
            Some(&self.memory)
        } else {
            self.unified.as_ref()
        };
        let tasks: Vec<PathBuf> = self.v1_dirs().iter().map(|d| d.join("tasks")).collect();
        match cgroup2 {
            Some(dir) if fresh => Placement {
                tasks,
                procs: Vec::new(),
                clone_into: Some(dir.clone()),
            },
            other => Placement {
                tasks,
                procs: other.map(|d| d.join("cgroup.procs")).into_iter().collect(),
                clone_into: None,
            },
        }
    }

    /// Whether process `pid` is in the sandbox's (memory) cgroup.
    pub fn contains(&self, pid: i32) -> bool {
        fs::read_to_string(self.memory.join("cgroup.procs"))
            .is_ok_and(|s| s.lines().any(|l| l.trim().parse() == Ok(pid)))
    }

    /// Pids of every process in the sandbox's cgroups.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        for f in self.procs_files() {
            if let Ok(s) = fs::read_to_string(&f) {
                pids.extend(s.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Kills every process in the sandbox and waits (up to `deadline`) until none is left.
    pub fn kill_all(&self, deadline: Duration) -> Result<(), RuntimeError> {
        if let Some(k) = &self.unified {
            let kill = k.join("cgroup.kill");
            if kill.exists() {
                let _ = fs::write(&kill, "1");
            }
        }
        self.kill_all_but(None, deadline)
    }

    /// Kills every process in the sandbox but `spared` (and what it holds: it must be the init of its
    /// own PID namespace) and waits (up to `deadline`) until no other is left.
    pub fn kill_all_but(&self, spared: Option<i32>, deadline: Duration) -> Result<(), RuntimeError> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            let mut pids = self.pids();
            if let Some(spared) = spared {
                pids.retain(|&p| p != spared && !in_pid_namespace_of(p, spared));
            }
            if pids.is_empty() {
                return Ok(());
            }
            for pid in &pids {
                if let Some(p) = rustix::process::Pid::from_raw(*pid) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
            }
            if start.elapsed() > deadline {
                return Err(RuntimeError::Teardown(format!(
                    "processes {pids:?} survived SIGKILL for {deadline:?}"
                )));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Removes the cgroup directories (they must be empty of processes). Missing ones are fine.
    pub fn remove(&self) -> Result<(), RuntimeError> {
        let mut first_err = None;
        for dir in self.dirs() {
            // A cgroup whose last process just exited can report EBUSY for a moment.
            let mut tries = 0;
            loop {
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 100 => {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => {
                        first_err.get_or_insert(io_err(dir, "remove")(e));
                        break;
                    }
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// Whether `name` names a sandbox's cgroups: a sandbox id, or one with `.next` (a sandbox prepared for
/// its rollback).
pub(crate) fn is_sandbox_name(name: &str) -> bool {
    name.strip_suffix(".next")
        .unwrap_or(name)
        .parse::<SandboxId>()
        .is_ok()
}

/// Whether process `pid` lives in the PID namespace whose init is `init` (so dies with it).
fn in_pid_namespace_of(pid: i32, init: i32) -> bool {
    let ns = |p: i32| fs::read_link(format!("/proc/{p}/ns/pid")).ok();
    match (ns(pid), ns(init)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(kind: CgroupKind) -> CgroupLayout {
        CgroupLayout {
            kind,
            parent: "paddock".into(),
            created: "/state/cgroup-parents".into(),
        }
    }

    /// A sandbox's init is placed through no `cgroup.procs` file in fresh cgroups: the v1
    /// hierarchies' `tasks` (the shim's own thread), the cgroup2 directory by `CLONE_INTO_CGROUP`;
    /// a reused cgroup2 cgroup gets the migration.
    #[test]
    fn placement_avoids_cgroup_procs_in_fresh_cgroups() {
        let hybrid = layout(CgroupKind::V1 {
            memory: "/cg/memory".into(),
            pids: "/cg/pids".into(),
            cpu: "/cg/cpu".into(),
            blkio: Some("/cg/blkio".into()),
            unified: Some("/cg/unified".into()),
        });
        let fresh = hybrid.sandbox("sb-1").placement(true);
        let tasks: Vec<PathBuf> = ["memory", "pids", "cpu", "blkio"]
            .iter()
            .map(|h| format!("/cg/{h}/paddock/sb-1/tasks").into())
            .collect();
        assert_eq!(
            fresh,
            Placement {
                tasks: tasks.clone(),
                procs: vec![],
                clone_into: Some("/cg/unified/paddock/sb-1".into()),
            }
        );
        assert_eq!(
            hybrid.sandbox("sb-1").placement(false),
            Placement {
                tasks,
                procs: vec!["/cg/unified/paddock/sb-1/cgroup.procs".into()],
                clone_into: None,
            }
        );

        let v1 = layout(CgroupKind::V1 {
            memory: "/cg/memory".into(),
            pids: "/cg/pids".into(),
            cpu: "/cg/cpu".into(),
            blkio: None,
            unified: None,
        });
        for fresh in [true, false] {
            let p = v1.sandbox("sb-1").placement(fresh);
            assert_eq!((p.tasks.len(), p.procs.len(), p.clone_into), (3, 0, None));
        }

        let v2 = layout(CgroupKind::V2 {
            root: "/cg".into(),
            io: true,
        });
        assert_eq!(
            v2.sandbox("sb-1").placement(true),
            Placement {
                tasks: vec![],
                procs: vec![],
                clone_into: Some("/cg/paddock/sb-1".into()),
            }
        );
        assert_eq!(
            v2.sandbox("sb-1").placement(false).procs,
            vec![PathBuf::from("/cg/paddock/sb-1/cgroup.procs")]
        );
    }
}

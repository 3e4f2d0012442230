//! Creating, waiting for and destroying native sandboxes.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use paddock_sys::fs_in_root::{Owner, Root, Symlinks};
use paddock_types::{MountSpec, RootfsSpec, SandboxId, SandboxSpec};

use super::cgroup::SandboxCgroup;
use super::early_volume::VolumeJob;
use super::network::{netns_pin, BootNetwork, PendingLink};
use super::sandbox::{kill_init, reap, state_err, BootSpec, InitRecord, NativeSandbox, KILL_DEADLINE};
use super::setup::owner::OwnerPool;
use super::setup::{Rootfs, SetupOutcome, SetupSpec};
use super::NativeBackend;
use crate::{AnyHandle, RuntimeError, SandboxHandle};

/// Where a sandbox's init starts: its run directory, cgroups and volume (the sandbox's own, or those of
/// a copy prepared for its rollback).
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot<'a> {
    pub(super) run_dir: &'a Path,
    pub(super) cgroup: &'a SandboxCgroup,
    /// The cgroups were made for this start (see [`SandboxCgroup::placement`]).
    pub(super) fresh_cgroups: bool,
    pub(super) volume: &'a Path,
}

impl NativeBackend {
    fn check_spec(&self, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        match &spec.rootfs {
            RootfsSpec::Dir { path } => {
                if !path.is_absolute() || !path.is_dir() {
                    return Err(RuntimeError::InvalidSpec(format!(
                        "rootfs {} is not a directory",
                        path.display()
                    )));
                }
                check_searchable(path, "rootfs")?;
            }
            RootfsSpec::Image { template } => {
                self.pool.existing_image(template)?;
            }
            RootfsSpec::Host => {}
        }
        match &spec.volume {
            paddock_types::VolumeSource::Snapshot(snapshot) => {
                self.pool.existing_snapshot(snapshot)?;
            }
            paddock_types::VolumeSource::Sandbox(source) => {
                self.pool.existing_sandbox_volume(source)?;
            }
            paddock_types::VolumeSource::Stopped if !self.pool.stopped_path(spec.id.as_str()).is_dir() => {
                return Err(RuntimeError::InvalidSpec(format!(
                    "sandbox {} has no stopped file system to resume",
                    spec.id
                )));
            }
            _ => {}
        }
        if spec.network.is_some() {
            self.check_network()?;
        }
        paddock_types::check_volume_mounts(&spec.volumes)
            .map_err(|e| RuntimeError::InvalidSpec(format!("volume mount {}: {e}", e.index)))?;
        for v in &spec.volumes {
            self.pool.existing_named_volume(&v.volume)?;
        }
        for m in &spec.mounts {
            if fs::metadata(&m.host).is_err() {
                return Err(RuntimeError::InvalidSpec(format!(
                    "mount source {} does not exist",
                    m.host.display()
                )));
            }
            check_searchable(&m.host, "mount source")?;
        }
        Ok(())
    }

    /// Writes the per-sandbox files of the volume's `/etc` (`hostname`, `hosts`, and for a `--rootfs`
    /// directory `passwd` and `group`). The volume is the sandbox's (or a snapshot's) to fill: `etc`
    /// is opened without following a symlink and each file is replaced, never written through
    /// ([`Root::replace_file`]).
    pub(super) fn write_identity(
        &self,
        id: &SandboxId,
        rootfs: &Rootfs,
        volume: &Path,
    ) -> Result<(), RuntimeError> {
        let etc_path = volume.join("etc");
        let etc = volume_etc(volume)?;
        let id = id.as_str();
        let mut files = vec![
            ("hostname", format!("{id}\n")),
            (
                "hosts",
                format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{id}\n"),
            ),
        ];
        if let Rootfs::Dir { path } = rootfs {
            files.push((
                "passwd",
                with_user_line(path, "etc/passwd", "user:x:1000:1000:user:/home/user:/bin/sh"),
            ));
            files.push(("group", with_user_line(path, "etc/group", "user:x:1000:")));
        }
        let owner = Owner {
            uid: self.config.ids.host_uid(0),
            gid: self.config.ids.host_gid(0),
        };
        for (name, content) in files {
            etc.replace_file(Path::new(name), content.as_bytes(), 0o644, Some(owner))
                .map_err(state_err("write", &etc_path.join(name)))?;
        }
        Ok(())
    }

    /// Runs the setup shim for sandbox `id`, whose run directory and cgroups exist, while
    /// `make_volume` creates its volume; returns the init's pid.
    pub(super) fn start(
        &self,
        id: &SandboxId,
        boot: &BootSpec,
        slot: Slot<'_>,
        mut shim: Shim,
        make_volume: impl FnOnce() -> Result<(), RuntimeError>,
    ) -> Result<i32, RuntimeError> {
        let Slot {
            run_dir,
            cgroup,
            fresh_cgroups,
            volume,
        } = slot;
        let root_mount = run_dir.join("root");
        fs::create_dir(&root_mount).map_err(state_err("create", &root_mount))?;
        super::lock::searchable(&root_mount)?;
        let setup = SetupSpec {
            hostname: id.to_string(),
            ids: self.config.ids,
            cgroups: cgroup.placement(fresh_cgroups),
            root_mount,
            volume: volume.to_owned(),
            rootfs: self.pool.rootfs(&boot.rootfs),
            mounts: boot.mounts.clone(),
            volumes: boot
                .volumes
                .iter()
                .map(|v| MountSpec {
                    host: self.pool.named_volume_path(&v.volume),
                    sandbox: v.path.clone(),
                    read_only: v.read_only,
                })
                .collect(),
            agent_binary: self.config.agent_binary.clone(),
            agent_socket: run_dir.join("agent.sock"),
            agent_log: run_dir.join("agent.log"),
            default_user: boot.user.to_string(),
            die_with_parent: self.config.die_with_parent,
            parent_pid: std::process::id() as i32,
            // The sandbox's own run directory's (a prepared rollback boots in another).
            netns: boot
                .network
                .as_ref()
                .map(|_| netns_pin(&self.run_dir(id.as_str()))),
            owners: OwnerPool::default_pool(),
        };
        let t = std::time::Instant::now();
        // The shim starts, joins the cgroups, clones and maps ids while the volume is snapshotted here
        // (a btrfs snapshot commits a transaction: about as long as the shim's own start).
        shim.send_spec(&setup)?;
        let volume = make_volume();
        tracing::debug!(step = "create volume", us = t.elapsed().as_micros() as u64);
        let pid = shim.finish(volume.is_ok());
        tracing::debug!(step = "setup shim", us = t.elapsed().as_micros() as u64);
        volume.and(pid)
    }

    pub(super) fn cleanup(
        &self,
        id: &str,
        cgroup: &SandboxCgroup,
        run_dir: &Path,
    ) -> Result<(), RuntimeError> {
        let mut errors = self.remove_cgroups_and_volume(id, cgroup);
        let network = BootSpec::read(run_dir).and_then(|b| b.network);
        errors.extend(self.remove_link_and_run_dir(run_dir, network.as_ref()));
        teardown_result(errors)
    }

    /// The first steps of a teardown, which must be done when a destroy returns: the sandbox's
    /// processes killed and its cgroups removed, then its volume deleted. Returns the errors.
    pub(super) fn remove_cgroups_and_volume(&self, id: &str, cgroup: &SandboxCgroup) -> Vec<String> {
        let mut errors = Vec::new();
        let t = std::time::Instant::now();
        if let Err(e) = cgroup.kill_all(KILL_DEADLINE).and_then(|()| cgroup.remove()) {
            errors.push(e.to_string());
        }
        tracing::debug!(step = "remove cgroups", us = t.elapsed().as_micros() as u64);
        let t = std::time::Instant::now();
        if let Err(e) = self.pool.delete_volume(id) {
            errors.push(e.to_string());
        }
        tracing::debug!(step = "delete volume", us = t.elapsed().as_micros() as u64);
        errors
    }

    /// The last steps of a teardown, after the processes (none may be left in the namespace): the
    /// link `network` (the run directory's record of it), then the run directory, which holds the
    /// namespace's pin. Returns the errors.
    pub(super) fn remove_link_and_run_dir(
        &self,
        run_dir: &Path,
        network: Option<&BootNetwork>,
    ) -> Vec<String> {
        let mut errors = Vec::new();
        let t = std::time::Instant::now();
        if let Err(e) = self.unlink_sandbox(run_dir, network) {
            errors.push(format!("{e}: {}", error_chain(&e)));
        }
        tracing::debug!(step = "remove link", us = t.elapsed().as_micros() as u64);
        if let Err(e) = fs::remove_dir_all(run_dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                errors.push(format!("failed to remove {}: {e}", run_dir.display()));
            }
        }
        errors
    }

    /// Reclaims sandbox `id` whose owner is gone (the caller holds its lock, if it has a run dir).
    pub(super) fn reclaim(&self, id: &str) -> Result<(), RuntimeError> {
        if id.ends_with(".next") {
            // A sandbox prepared for a rollback runs in its sandbox's cgroups: killed by its record.
            InitRecord::kill_recorded(&self.run_dir(id));
            return self.remove_prepared(id, &self.run_dir(id));
        }
        let cgroup = self.cgroups.sandbox(id);
        self.cleanup(id, &cgroup, &self.run_dir(id))
    }
}

/// A teardown's collected errors as its result.
pub(super) fn teardown_result(errors: Vec<String>) -> Result<(), RuntimeError> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(RuntimeError::Teardown(errors.join("; ")))
    }
}

/// `e`'s sources, `: `-separated (teardown errors are collected as text).
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut source = e.source();
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    parts.join(": ")
}

/// The sandbox's init mounts host paths as an unprivileged host uid, so every directory above them must
/// be searchable by others (mode o+x). Says so up front instead of failing inside the setup.
fn check_searchable(path: &Path, what: &str) -> Result<(), RuntimeError> {
    match super::unsearchable_ancestor(path) {
        None => Ok(()),
        Some(dir) => Err(RuntimeError::InvalidSpec(format!(
            "{what} {} is not reachable by sandboxes: {} is not searchable by other users (chmod o+x)",
            path.display(),
            dir.display()
        ))),
    }
}

/// The volume's `etc`, opened without following a symlink.
pub(super) fn volume_etc(volume: &Path) -> Result<Root, RuntimeError> {
    Root::open(volume)
        .and_then(|v| v.open_dir(Path::new("etc")))
        .map_err(state_err("open", &volume.join("etc")))
}

/// Most bytes of a `--rootfs` directory's `passwd` or `group` read to generate the sandbox's.
const MAX_ACCOUNTS_BYTES: u64 = 4 << 20;

/// The `--rootfs` directory's `file` (read inside it: its symlinks resolve inside it, a fifo or
/// device is not read, at most [`MAX_ACCOUNTS_BYTES`]; anything else counts as empty) with `line`
/// added unless it has a `user` entry already.
fn with_user_line(rootfs: &Path, file: &str, line: &str) -> String {
    let content = Root::open(rootfs)
        .and_then(|r| r.read_regular(Path::new(file), MAX_ACCOUNTS_BYTES, Symlinks::FollowInRoot))
        .unwrap_or_default();
    let mut content = String::from_utf8_lossy(&content).into_owned();
    if !content.lines().any(|l| l.starts_with("user:")) {
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        content.push_str(line);
        content.push('\n');
    }
    content
}

/// A running setup shim (`paddock-setup`): the spec goes to its stdin as one JSON line, then
/// [`setup::VOLUME_READY`](super::setup::VOLUME_READY) once the volume exists; it answers with one JSON
/// line on stdout.
pub(super) struct Shim {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    finished: bool,
}

impl Drop for Shim {
    /// A shim abandoned before [`Shim::finish`] (an error in between) is killed and reaped.
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Shim {
    /// Starts the setup shim's `binary`, which waits for its spec on stdin.
    pub(super) fn start(binary: &Path) -> Result<Self, RuntimeError> {
        let mut child = Command::new(binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .env_clear()
            .spawn()
            .map_err(|e| {
                RuntimeError::Setup(format!("cannot start the setup shim {}: {e}", binary.display()))
            })?;
        let stdin = child.stdin.take();
        Ok(Self {
            child,
            stdin,
            finished: false,
        })
    }

    /// Sends the setup spec (one JSON line).
    fn send_spec(&mut self, spec: &SetupSpec) -> Result<(), RuntimeError> {
        let mut json =
            serde_json::to_vec(spec).map_err(|e| RuntimeError::Setup(format!("encode setup spec: {e}")))?;
        json.push(b'\n');
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| RuntimeError::Setup("setup stdin is closed".into()))?;
        stdin
            .write_all(&json)
            .map_err(|e| RuntimeError::Setup(format!("send setup spec: {e}")))
    }

    /// Tells the shim whether the volume is ready (if not, it aborts) and waits for its answer.
    fn finish(mut self, volume_ready: bool) -> Result<i32, RuntimeError> {
        let result = self.answer(volume_ready);
        self.finished = true;
        result
    }

    fn answer(&mut self, volume_ready: bool) -> Result<i32, RuntimeError> {
        if let Some(mut stdin) = self.stdin.take() {
            if volume_ready {
                let _ = stdin.write_all(format!("{}\n", super::setup::VOLUME_READY).as_bytes());
            }
        }
        let mut line = String::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            std::io::Read::read_to_string(&mut stdout, &mut line)
                .map_err(|e| RuntimeError::Setup(format!("read the setup answer: {e}")))?;
        }
        let status = self
            .child
            .wait()
            .map_err(|e| RuntimeError::Setup(format!("wait for setup: {e}")))?;
        match serde_json::from_str::<SetupOutcome>(line.trim()) {
            Ok(SetupOutcome::Pid(pid)) => Ok(pid),
            Ok(SetupOutcome::Error(e)) => Err(RuntimeError::Setup(e)),
            Ok(SetupOutcome::InitFailed { error, pid }) => {
                // Killed by the shim; this process is its parent and must reap it.
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
                }
                Err(RuntimeError::Setup(error))
            }
            Err(_) => Err(RuntimeError::Setup(format!(
                "setup exited with {status} and no answer"
            ))),
        }
    }
}

impl NativeBackend {
    /// [`SandboxBackend::create_sandbox`](crate::SandboxBackend::create_sandbox).
    pub(super) fn create(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError> {
        self.check_spec(spec)?;
        // The shim's process (about 1 ms of CPU) starts first, its exec overlapping the run directory
        // and the cgroups (`paddock run`: measured 3-5 % slower the other way round), except for a
        // fork's copy: its volume starts first, so that ten copies on two cores issue their
        // snapshots together rather than a process start apart (they share commits: about 3 ms off
        // a fork of ten).
        let early_shim = match spec.volume {
            paddock_types::VolumeSource::Sandbox(_) => None,
            _ => Some(Shim::start(&self.config.setup_binary)?),
        };
        let id = spec.id.as_str();
        let run_dir = self.run_dir(id);
        // The run directory appears under its real name only with its lock already held, so a
        // concurrent `gc` never mistakes a sandbox being born for an abandoned one.
        let staging = run_dir.with_file_name(format!(".new-{id}"));
        let lock = super::lock::stage_run_dir(&staging, &run_dir, || {
            if run_dir.exists() {
                return Err(RuntimeError::InvalidSpec(format!("sandbox {id} already exists")));
            }
            Ok(())
        })?;
        // Made from now on, while the rest is set up (`early_volume.rs`).
        let volume_job = VolumeJob::start(&self.pool, spec);
        let shim = match early_shim.map_or_else(|| Shim::start(&self.config.setup_binary), Ok) {
            Ok(shim) => shim,
            Err(e) => {
                self.abandon_early(volume_job, spec, &run_dir);
                return Err(e);
            }
        };
        let t = std::time::Instant::now();
        let cgroup = match self.cgroups.create(&spec.id, &spec.limits) {
            Ok(c) => c,
            Err(e) => {
                self.abandon_early(volume_job, spec, &run_dir);
                return Err(e);
            }
        };
        tracing::debug!(step = "create cgroups", us = t.elapsed().as_micros() as u64);
        // The link's host end and firewall are configured (`pending`) while the shim and the
        // volume are made.
        let mut pending: Option<PendingLink> = None;
        let linked = match &spec.network {
            None => Ok(None),
            Some(network) => self.link_sandbox(&run_dir, network).map(|p| {
                let made = p.record();
                pending = Some(p);
                Some(BootNetwork {
                    spec: network.clone(),
                    made,
                })
            }),
        };
        let boot = match linked {
            Ok(network) => BootSpec::of(spec, network),
            Err(e) => {
                // Nothing of the link is left (create_link cleans up after itself).
                self.settle_failed_volume(volume_job, spec);
                if let Err(cleanup) = self.cleanup(id, &cgroup, &run_dir) {
                    tracing::warn!(sandbox_id = %id, error = %cleanup, "cleanup after failed create");
                }
                return Err(e);
            }
        };
        let link = boot.network.as_ref().map(BootNetwork::link);
        let written = boot.write(&run_dir);
        if written.is_err() {
            // Without its record, cleanup would find only the pin: the link goes now.
            drop(pending.take());
            if let Err(e) = self.unlink_sandbox(&run_dir, boot.network.as_ref()) {
                tracing::warn!(sandbox_id = %id, error = %e, "cannot remove the link of a failed create");
            }
        }
        let started = written
            .and_then(|()| {
                let volume = self.pool.fresh_volume_path(id);
                let slot = Slot {
                    run_dir: &run_dir,
                    cgroup: &cgroup,
                    fresh_cgroups: true,
                    volume: &volume,
                };
                self.start(&spec.id, &boot, slot, shim, || {
                    let volume = volume_job.wait()?;
                    let rootfs = self.pool.rootfs(&spec.rootfs);
                    self.write_identity(&spec.id, &rootfs, &volume)?;
                    if let Some(network) = &boot.network {
                        self.write_sandbox_network_files(&volume, &rootfs, network)?;
                    }
                    Ok(())
                })
            })
            .and_then(|pid| InitRecord::of(pid).and_then(|r| r.write(&run_dir)).map(|()| pid))
            .and_then(|pid| match pending.take() {
                None => Ok(pid),
                Some(p) => {
                    let t = std::time::Instant::now();
                    let finished = p.finish().map_err(RuntimeError::Network);
                    tracing::debug!(step = "finish link", us = t.elapsed().as_micros() as u64);
                    finished.map(|()| pid)
                }
            });
        // Killed and reaped if unfinished, before anything of the link is removed. (The volume's
        // job went with the closures above: its thread is done.)
        drop(pending);
        let init_pid = match started {
            Ok(pid) => pid,
            Err(e) => {
                if spec.volume == paddock_types::VolumeSource::Stopped {
                    // A failed resume must not lose the files it was resuming.
                    let _ = cgroup.kill_all(KILL_DEADLINE);
                    if let Err(keep) = self.pool.return_stopped(id) {
                        tracing::warn!(sandbox_id = %id, error = %keep, "cannot keep a stopped volume after a failed resume");
                    }
                }
                if let Err(cleanup) = self.cleanup(id, &cgroup, &run_dir) {
                    tracing::warn!(sandbox_id = %id, error = %cleanup, "cleanup after failed create");
                }
                return Err(e);
            }
        };
        let pidfd = paddock_sys::namespace::pidfd_open(init_pid).ok();
        Ok(SandboxHandle {
            id: spec.id.clone(),
            agent_socket: run_dir.join("agent.sock"),
            network: link,
            inner: AnyHandle::Native(NativeSandbox {
                run_dir,
                cgroup,
                init_pid,
                pidfd,
                child: true,
                reaped: false,
                boot: Some(Box::new(boot)),
                freezer: Mutex::new(()),
                next: Mutex::new(None),
                _lock: lock,
            }),
        })
    }

    /// Undoes a create that failed before its cgroups were made: its volume (once its job is done)
    /// and its run directory. The caller still holds the run directory's lock.
    fn abandon_early(&self, job: VolumeJob, spec: &SandboxSpec, run_dir: &Path) {
        self.settle_failed_volume(job, spec);
        if let Err(cleanup) = self.pool.delete_volume(spec.id.as_str()) {
            tracing::warn!(sandbox_id = %spec.id, error = %cleanup, "cleanup after failed create");
        }
        let _ = fs::remove_dir_all(run_dir);
    }

    /// Waits for the volume of a create that failed before it was needed; a resumed one goes back to
    /// `stopped/`, since the cleanup that follows deletes what is in `sandboxes/`.
    fn settle_failed_volume(&self, job: VolumeJob, spec: &SandboxSpec) {
        drop(job);
        if spec.volume == paddock_types::VolumeSource::Stopped {
            if let Err(keep) = self.pool.return_stopped(spec.id.as_str()) {
                tracing::warn!(sandbox_id = %spec.id, error = %keep, "cannot keep a stopped volume after a failed resume");
            }
        }
    }

    /// [`SandboxBackend::destroy_sandbox`](crate::SandboxBackend::destroy_sandbox).
    pub(super) fn destroy(&self, handle: SandboxHandle) -> Result<(), RuntimeError> {
        let mut sb = super::into_native(handle.inner)?;
        self.discard_prepared(&sb);
        if !sb.reaped {
            kill_init(&sb);
            let t = std::time::Instant::now();
            reap(&mut sb);
            tracing::debug!(step = "kill init", us = t.elapsed().as_micros() as u64);
        }
        self.finish_teardown(handle.id.as_str(), sb)
    }

    /// [`SandboxBackend::stop_sandbox`](crate::SandboxBackend::stop_sandbox).
    pub(super) fn stop(&self, handle: SandboxHandle) -> Result<(), RuntimeError> {
        let mut sb = super::into_native(handle.inner)?;
        self.discard_prepared(&sb);
        self.kill_old(&mut sb, None)?;
        crate::fault::point("stop.killed");
        let id = handle.id.as_str();
        // Its files go aside first: a failure after this point loses processes, never files.
        self.pool.keep_stopped(id)?;
        crate::fault::point("stop.kept");
        self.finish_teardown(id, sb)
    }
}

//! The fake's sandbox lifecycles ([`SandboxBackend`]): create (on the template, a snapshot or a
//! stopped sandbox's tree), destroy, stop, park, adopt, reclaim, garbage collection, usage, limits,
//! pause and resume, and rollbacks.
//!
//! Ownership models server processes: every sandbox is owned by the [`FakeBackend`] instance that
//! created or adopted it; [`FakeBackend::restart`] makes every earlier instance "dead", so what they
//! own survives unowned until adopted, reclaimed or collected.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use paddock_types::{Limits, RootfsSpec, SandboxId, SandboxSpec, SnapshotId, VolumeSource};

use super::agent::{lock, AgentHandle, AgentSetup};
use super::fs::{MountPoint, Namespace};
use super::state::{Disk, Live, State};
use super::tree::{components, template, Node, ROOT_ID};
use super::{FakeBackend, FakeSandbox};
use crate::backend::AnyHandle;
use crate::{Adoption, Capabilities, RuntimeError, SandboxBackend, SandboxHandle, SandboxUsage};

/// The error for a handle that names no live sandbox (destroyed, or rolled back since).
pub(crate) fn not_running(id: &SandboxId) -> RuntimeError {
    RuntimeError::State {
        what: "find the live sandbox",
        path: PathBuf::from(format!("fake:{id}")),
        source: io::Error::from(io::ErrorKind::NotFound),
    }
}

/// The fake part of a handle; a handle of another backend is refused.
pub(crate) fn fake_part(handle: &SandboxHandle) -> Result<&FakeSandbox, RuntimeError> {
    match &handle.inner {
        AnyHandle::Fake(sb) => Ok(sb),
        AnyHandle::Native(_) => Err(RuntimeError::Unsupported(
            "a sandbox of another backend was handed to the fake backend".into(),
        )),
    }
}

/// The live sandbox a handle names.
pub(crate) fn live_mut<'s>(
    state: &'s mut State,
    handle: &SandboxHandle,
) -> Result<&'s mut Live, RuntimeError> {
    let generation = fake_part(handle)?.generation;
    state
        .sandboxes
        .get_mut(&handle.id)
        .filter(|live| live.generation == generation)
        .ok_or_else(|| not_running(&handle.id))
}

impl FakeBackend {
    fn fault(&self, operation: &'static str) -> Result<(), RuntimeError> {
        self.shared.faults.take(operation)
    }

    /// Starts an agent double for sandbox `id` on a fresh socket.
    fn start_agent(
        &self,
        id: &SandboxId,
        mounts: Vec<MountPoint>,
        user: String,
    ) -> Result<AgentHandle, RuntimeError> {
        let n = self.shared.next_socket.fetch_add(1, Ordering::Relaxed);
        let setup = AgentSetup {
            state: Arc::downgrade(&self.shared.state),
            ns: Namespace {
                sandbox: id.clone(),
                mounts,
            },
            user,
        };
        AgentHandle::start(
            self.shared.runtime.handle(),
            self.shared.dir.join(format!("{n}.sock")),
            setup,
        )
    }

    fn handle(id: &SandboxId, agent: &AgentHandle, generation: u64) -> SandboxHandle {
        SandboxHandle {
            id: id.clone(),
            agent_socket: agent.socket().to_path_buf(),
            network: None,
            inner: AnyHandle::Fake(FakeSandbox { generation }),
        }
    }

    /// Removes live sandbox `id` from the state and stops its agent (outside the lock); its disk.
    fn take_live(&self, id: &SandboxId, generation: Option<u64>) -> Result<Disk, RuntimeError> {
        let live = {
            let mut state = lock(&self.shared.state);
            match state.sandboxes.get(id) {
                Some(live) if generation.is_none_or(|g| g == live.generation) => {}
                _ => return Err(not_running(id)),
            }
            state.ended += 1;
            state.sandboxes.remove(id).ok_or_else(|| not_running(id))?
        };
        if let Some(agent) = live.agent {
            agent.stop();
        }
        Ok(live.disk)
    }

    /// Whether `live` belongs to a backend instance that is still running (not this one's past).
    fn owned_elsewhere(&self, state: &State, live: &Live) -> bool {
        live.owner >= state.first_live_owner && live.owner != self.owner
    }
}

impl SandboxBackend for FakeBackend {
    fn capabilities(&self) -> Capabilities {
        Self::fake_capabilities()
    }

    fn create_sandbox(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError> {
        self.fault("create_sandbox")?;
        match &spec.rootfs {
            RootfsSpec::Host => {}
            RootfsSpec::Image { template } => {
                if !lock(&self.shared.state).templates.contains_key(template) {
                    return Err(RuntimeError::InvalidSpec(format!(
                        "template {template} does not exist"
                    )));
                }
            }
            RootfsSpec::Dir { .. } => {
                return Err(RuntimeError::Unsupported(
                    "the fake backend has no custom root file systems".into(),
                ))
            }
        }
        if !spec.mounts.is_empty() {
            return Err(RuntimeError::Unsupported(
                "the fake backend has no host mounts".into(),
            ));
        }
        if spec.network.is_some() {
            return Err(RuntimeError::Unsupported(
                "the fake backend gives sandboxes no network".into(),
            ));
        }
        let id = &spec.id;
        let mut state = lock(&self.shared.state);
        if state.sandboxes.contains_key(id) {
            return Err(RuntimeError::InvalidSpec(format!("sandbox {id} exists already")));
        }
        let mut tree = match &spec.volume {
            VolumeSource::Template => template(),
            VolumeSource::Snapshot(snapshot) => state
                .snapshots
                .get(snapshot)
                .cloned()
                .ok_or_else(|| RuntimeError::InvalidSpec(format!("snapshot {snapshot} does not exist")))?,
            VolumeSource::Sandbox(source) => state
                .sandboxes
                .get(source)
                .map(|live| live.disk.tree.clone())
                .ok_or_else(|| {
                RuntimeError::InvalidSpec(format!("sandbox {source} has no file system to copy"))
            })?,
            VolumeSource::Stopped => state
                .stopped
                .get(id)
                .ok_or_else(|| RuntimeError::InvalidSpec(format!("sandbox {id} has no stopped file system")))?
                .tree
                .clone(),
        };
        let mut mounts = Vec::new();
        for mount in &spec.volumes {
            if !state.volumes.contains_key(&mount.volume) {
                return Err(RuntimeError::InvalidSpec(format!(
                    "volume {} does not exist",
                    mount.volume
                )));
            }
            let at = components(mount.path.as_str());
            make_dirs(&mut tree, &at);
            mounts.push(MountPoint {
                at,
                volume: mount.volume.clone(),
                read_only: mount.read_only,
            });
        }
        let agent = self.start_agent(id, mounts.clone(), spec.user.to_string())?;
        if spec.volume == VolumeSource::Stopped {
            state.stopped.remove(id);
        }
        let handle = Self::handle(id, &agent, 1);
        state.created += 1;
        state.sandboxes.insert(
            id.clone(),
            Live {
                disk: Disk {
                    tree,
                    limit: spec.limits.disk.map(u64::from),
                },
                generation: 1,
                owner: self.owner,
                agent: Some(agent),
                paused: false,
                limits: spec.limits.clone(),
                mounts,
                user: spec.user.to_string(),
                prepared: None,
            },
        );
        Ok(handle)
    }

    fn destroy_sandbox(&self, handle: SandboxHandle) -> Result<(), RuntimeError> {
        self.fault("destroy_sandbox")?;
        let generation = fake_part(&handle)?.generation;
        match self.take_live(&handle.id, Some(generation)) {
            Ok(_) => Ok(()),
            // Gone already (a stale handle): nothing is left to remove.
            Err(_) => Ok(()),
        }
    }

    fn collect_garbage(&self) -> Result<Vec<String>, RuntimeError> {
        self.fault("collect_garbage")?;
        let unowned: Vec<SandboxId> = {
            let state = lock(&self.shared.state);
            state
                .sandboxes
                .iter()
                .filter(|(_, live)| live.owner < state.first_live_owner)
                .map(|(id, _)| id.clone())
                .collect()
        };
        let mut reclaimed = Vec::new();
        for id in unowned {
            if self.take_live(&id, None).is_ok() {
                reclaimed.push(id.to_string());
            }
        }
        Ok(reclaimed)
    }

    fn stop_sandbox(&self, handle: SandboxHandle) -> Result<(), RuntimeError> {
        self.fault("stop_sandbox")?;
        let generation = fake_part(&handle)?.generation;
        let disk = self.take_live(&handle.id, Some(generation))?;
        lock(&self.shared.state).stopped.insert(handle.id, disk);
        Ok(())
    }

    fn delete_stopped(&self, id: &SandboxId) -> Result<bool, RuntimeError> {
        self.fault("delete_stopped")?;
        Ok(lock(&self.shared.state).stopped.remove(id).is_some())
    }

    fn park_sandbox(&self, id: &SandboxId) -> Result<bool, RuntimeError> {
        self.fault("park_sandbox")?;
        if let Ok(disk) = self.take_live(id, None) {
            lock(&self.shared.state).stopped.insert(id.clone(), disk);
            return Ok(true);
        }
        Ok(lock(&self.shared.state).stopped.contains_key(id))
    }

    fn list_stopped(&self) -> Vec<SandboxId> {
        lock(&self.shared.state).stopped.keys().cloned().collect()
    }

    fn adopt_sandbox(&self, id: &SandboxId) -> Result<Adoption, RuntimeError> {
        self.fault("adopt_sandbox")?;
        {
            let mut state = lock(&self.shared.state);
            let elsewhere = match state.sandboxes.get(id) {
                None => return Ok(Adoption::Missing),
                Some(live) => self.owned_elsewhere(&state, live),
            };
            if elsewhere {
                return Ok(Adoption::Busy);
            }
            let owner = self.owner;
            let live = state.sandboxes.get_mut(id).ok_or_else(|| not_running(id))?;
            if let Some(agent) = &live.agent {
                live.owner = owner;
                return Ok(Adoption::Alive(Self::handle(id, agent, live.generation)));
            }
        }
        // Its agent died: what is left of it goes.
        let _ = self.take_live(id, None);
        Ok(Adoption::Dead)
    }

    fn sandbox_usage(&self, handle: &SandboxHandle) -> Result<SandboxUsage, RuntimeError> {
        self.fault("sandbox_usage")?;
        let mut state = lock(&self.shared.state);
        let live = live_mut(&mut state, handle)?;
        let processes = live.agent.as_ref().map_or(0, AgentHandle::running_processes);
        Ok(SandboxUsage {
            cpu_time_us: 0,
            memory_bytes: 0,
            memory_peak_bytes: 0,
            pids: processes + u64::from(live.agent.is_some()),
            disk_bytes: live.disk.tree.data_bytes(),
            disk_limit_bytes: live.disk.limit,
        })
    }

    fn open_port(&self, handle: &SandboxHandle, port: u16) -> Result<crate::PortSocket, RuntimeError> {
        self.fault("open_port")?;
        let mut state = lock(&self.shared.state);
        live_mut(&mut state, handle)?;
        let addr = *state.ports.get(&(handle.id.clone(), port)).ok_or_else(|| {
            RuntimeError::Unsupported(format!(
                "the fake backend serves no port {port} of sandbox {} (FakeBackend::expose_port)",
                handle.id
            ))
        })?;
        let family = if addr.is_ipv4() {
            rustix::net::AddressFamily::INET
        } else {
            rustix::net::AddressFamily::INET6
        };
        let socket = rustix::net::socket_with(
            family,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::NONBLOCK | rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| RuntimeError::State {
            what: "make a socket for",
            path: PathBuf::from(format!("fake:{}:{port}", handle.id)),
            source: e.into(),
        })?;
        Ok(crate::PortSocket::new(socket, addr))
    }

    fn update_limits(&self, handle: &SandboxHandle, limits: &Limits) -> Result<(), RuntimeError> {
        self.fault("update_limits")?;
        let mut state = lock(&self.shared.state);
        let live = live_mut(&mut state, handle)?;
        live.limits = limits.clone();
        live.disk.limit = limits.disk.map(u64::from);
        Ok(())
    }

    fn reclaim_sandbox(&self, id: &SandboxId) -> Result<bool, RuntimeError> {
        self.fault("reclaim_sandbox")?;
        {
            let state = lock(&self.shared.state);
            match state.sandboxes.get(id) {
                None => return Ok(false),
                Some(live) if live.owner >= state.first_live_owner => return Ok(false),
                Some(_) => {}
            }
        }
        Ok(self.take_live(id, None).is_ok())
    }

    fn pause_sandbox(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        self.fault("pause_sandbox")?;
        set_paused(&mut lock(&self.shared.state), handle, true)
    }

    fn resume_sandbox(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        self.fault("resume_sandbox")?;
        set_paused(&mut lock(&self.shared.state), handle, false)
    }

    fn freeze_sandbox(&self, handle: &SandboxHandle) -> Result<bool, RuntimeError> {
        self.fault("freeze_sandbox")?;
        let mut state = lock(&self.shared.state);
        let was = live_mut(&mut state, handle)?.paused;
        set_paused(&mut state, handle, true)?;
        Ok(was)
    }

    fn prepare_rollback(&self, handle: &SandboxHandle, snapshot: &SnapshotId) -> Result<(), RuntimeError> {
        self.fault("prepare_rollback")?;
        let mut state = lock(&self.shared.state);
        if !state.snapshots.contains_key(snapshot) {
            return Err(RuntimeError::InvalidSpec(format!(
                "snapshot {snapshot} does not exist"
            )));
        }
        live_mut(&mut state, handle)?.prepared = Some(snapshot.clone());
        Ok(())
    }

    fn discard_rollback(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        self.fault("discard_rollback")?;
        live_mut(&mut lock(&self.shared.state), handle)?.prepared = None;
        Ok(())
    }

    fn rollback_sandbox(
        &self,
        handle: SandboxHandle,
        snapshot: &SnapshotId,
    ) -> Result<SandboxHandle, RuntimeError> {
        let generation = fake_part(&handle)?.generation;
        let id = handle.id.clone();
        // On any error the sandbox is destroyed, as the native rollback's contract says.
        let fail = |e: RuntimeError| {
            let _ = self.take_live(&id, Some(generation));
            Err(e)
        };
        if let Err(e) = self.fault("rollback_sandbox") {
            return fail(e);
        }
        let (old_agent, copy) = {
            let mut state = lock(&self.shared.state);
            let Some(copy) = state.snapshots.get(snapshot).cloned() else {
                drop(state);
                return fail(RuntimeError::InvalidSpec(format!(
                    "snapshot {snapshot} does not exist"
                )));
            };
            match live_mut(&mut state, &handle) {
                Ok(live) => (live.agent.take(), copy),
                Err(e) => return Err(e),
            }
        };
        // Every process dies and every connection to the old agent ends.
        if let Some(agent) = old_agent {
            agent.stop();
        }
        let mut state = lock(&self.shared.state);
        let Some(live) = state
            .sandboxes
            .get_mut(&id)
            .filter(|l| l.generation == generation)
        else {
            return Err(not_running(&id));
        };
        let (mounts, user) = (live.mounts.clone(), live.user.clone());
        let mut tree = copy;
        for mount in &mounts {
            make_dirs(&mut tree, &mount.at);
        }
        live.disk.tree = tree;
        live.generation += 1;
        live.paused = false;
        live.prepared = None;
        let new_generation = live.generation;
        drop(state);
        let agent = match self.start_agent(&id, mounts, user) {
            Ok(agent) => agent,
            Err(e) => {
                let _ = self.take_live(&id, None);
                return Err(e);
            }
        };
        let new_handle = Self::handle(&id, &agent, new_generation);
        let mut state = lock(&self.shared.state);
        match state.sandboxes.get_mut(&id) {
            Some(live) if live.generation == new_generation => {
                live.agent = Some(agent);
                Ok(new_handle)
            }
            _ => {
                drop(state);
                agent.stop();
                Err(not_running(&id))
            }
        }
    }
}

fn set_paused(state: &mut State, handle: &SandboxHandle, paused: bool) -> Result<(), RuntimeError> {
    let live = live_mut(state, handle)?;
    live.paused = paused;
    if let Some(agent) = &live.agent {
        agent.set_paused(paused);
    }
    Ok(())
}

/// Creates the directories of `path` in `tree` that are missing (a mount point), owned by root.
fn make_dirs(tree: &mut Node, path: &[String]) {
    let mut node = tree;
    for name in path {
        let Some(children) = node.children_mut() else {
            return;
        };
        node = children
            .entry(name.clone())
            .or_insert_with(|| Node::dir(0o755, ROOT_ID, ROOT_ID));
    }
}

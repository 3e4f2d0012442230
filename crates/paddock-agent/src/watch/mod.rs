//! Directory watches: the inotify events of a directory (or a directory tree) inside the sandbox,
//! streamed to the connection that asked.
//!
//! One inotify instance serves the whole agent, created at the first watch: the kernel limits
//! instances per host user, and every sandbox's agent runs as the same host uid. One task reads it
//! (`events.rs`) and hands each event to the watches of its watch descriptor (two watches of one
//! directory share the descriptor).
//!
//! Confinement: the watched directory is opened inside the root (`openat2(RESOLVE_IN_ROOT)`, like
//! every file operation), subdirectories relative to their parent's descriptor with `O_NOFOLLOW`,
//! and the kernel watch is added through `/proc/self/fd/N` of that descriptor (`tree.rs`): a symlink
//! swapped in mid-way can never point a watch outside the root. Reported paths are absolute paths
//! inside the sandbox, the watched directory's taken from its descriptor (so `..` and symlinks in the
//! request are resolved).
//!
//! Bounded memory: each watch queues at most [`QUEUE_MAX`] events; beyond that one `overflow` event
//! stands for what was dropped, until the queue drains. A forwarding task per watch sends batches
//! (every [`FLUSH_INTERVAL`], or at [`BATCH_MAX`] events) through the connection's bounded queue
//! (`queue.rs`). A recursive watch adds subdirectories as they appear, reporting what a new
//! directory already holds as `create` events (files made before its watch existed are not missed;
//! one made in between may be reported twice), up to [`MAX_DIRS_PER_CONNECTION`] watched directories
//! per connection. Watches end with `unwatch`, with their connection, or when the watched directory
//! is deleted, moved or unmounted (after a last event, with `watch_ended`).

mod events;
mod queue;
mod tree;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use paddock_protocol::{AgentError, ErrorCode, Reply, WatchEndReason};
use rustix::fs::inotify;
use rustix::fs::OFlags;
use tokio::io::unix::AsyncFd;
use tokio::task::JoinHandle;

use crate::agent::Agent;
use crate::error_code::{agent_error, fs_error};
use crate::files::path::sandbox_path;
use crate::outbound::{Answer, ConnectionClosed, Outbound};
use queue::EventQueue;

/// Directories one connection may watch at once, over all its watches.
pub(crate) const MAX_DIRS_PER_CONNECTION: usize = 8192;
/// Events queued per watch while its connection is not taking them.
pub(crate) const QUEUE_MAX: usize = 4096;
/// Most events per `fs_events` message.
pub(crate) const BATCH_MAX: usize = 256;
/// How long events are collected before they are sent.
pub(crate) const FLUSH_INTERVAL: Duration = Duration::from_millis(50);

/// What every kernel watch reports.
fn watch_flags() -> inotify::WatchFlags {
    use inotify::WatchFlags as W;
    W::CREATE
        | W::MODIFY
        | W::ATTRIB
        | W::DELETE
        | W::MOVED_FROM
        | W::MOVED_TO
        | W::DELETE_SELF
        | W::MOVE_SELF
        | W::ONLYDIR
        | W::EXCL_UNLINK
}

/// The agent's watches.
#[derive(Debug, Default)]
pub(crate) struct Watcher {
    state: RefCell<State>,
}

#[derive(Debug, Default)]
struct State {
    inotify: Option<Rc<AsyncFd<OwnedFd>>>,
    next_id: u32,
    watches: HashMap<u32, Rc<Watch>>,
    /// The watches using each kernel watch descriptor.
    wds: HashMap<i32, Vec<u32>>,
}

/// One watch of one connection.
#[derive(Debug)]
pub(crate) struct Watch {
    id: u32,
    conn: u64,
    recursive: bool,
    /// Kernel watch descriptor of the watched directory.
    root_wd: Cell<i32>,
    /// Every watched directory: watch descriptor → path inside the sandbox.
    dirs: RefCell<HashMap<i32, String>>,
    queue: EventQueue,
    forwarder: RefCell<Option<JoinHandle<()>>>,
}

/// Answers `Watch { path, recursive }`: starts the watch, answers, then starts forwarding (so its
/// events follow the reply).
pub(crate) async fn start_watch(
    agent: &Rc<Agent>,
    out: &Outbound,
    id: u64,
    path: &str,
    recursive: bool,
) -> Result<(), ConnectionClosed> {
    let watch = match agent.watcher.start(agent, out.conn_id(), path, recursive) {
        Ok(watch) => watch,
        Err(err) => return out.answer(id, Err(err)).await,
    };
    let reply = Reply::Watching { watch_id: watch.id };
    if let Err(closed) = out.answer(id, Ok((reply, Vec::new()))).await {
        agent.watcher.stop(watch.id);
        return Err(closed);
    }
    let task = tokio::task::spawn_local(queue::forward(watch.clone(), out.clone()));
    *watch.forwarder.borrow_mut() = Some(task);
    Ok(())
}

/// Answers `Unwatch { watch_id }`: no event of the watch is sent after the reply.
pub(crate) fn unwatch(agent: &Agent, conn: u64, watch_id: u32) -> Answer {
    let known = agent
        .watcher
        .state
        .borrow()
        .watches
        .get(&watch_id)
        .is_some_and(|w| w.conn == conn);
    if !known {
        return Err(agent_error(
            ErrorCode::BadRequest,
            format!("no watch {watch_id} on this connection"),
        ));
    }
    agent.watcher.stop(watch_id);
    Ok((Reply::Done, Vec::new()))
}

impl Watcher {
    fn start(
        &self,
        agent: &Rc<Agent>,
        conn: u64,
        path: &str,
        recursive: bool,
    ) -> Result<Rc<Watch>, AgentError> {
        let resolved = sandbox_path(agent, path)?;
        let dir = agent
            .root
            .open_with(&resolved, OFlags::RDONLY | OFlags::DIRECTORY, 0)
            .map_err(|err| fs_error("watch", path, &err))?;
        let root_path = in_sandbox_path(agent, &dir).ok_or_else(|| {
            agent_error(
                ErrorCode::InvalidPath,
                format!("watch {path:?}: cannot name the directory inside the sandbox"),
            )
        })?;
        self.ensure_inotify(agent)
            .map_err(|err| agent_error(ErrorCode::Io, format!("watch {path:?}: inotify: {err}")))?;
        let watch = {
            let mut state = self.state.borrow_mut();
            state.next_id = state.next_id.wrapping_add(1).max(1);
            let id = state.next_id;
            let watch = Rc::new(Watch {
                id,
                conn,
                recursive,
                root_wd: Cell::new(-1),
                dirs: RefCell::new(HashMap::new()),
                queue: EventQueue::new(root_path.clone()),
                forwarder: RefCell::new(None),
            });
            state.watches.insert(id, watch.clone());
            watch
        };
        if let Err(err) = tree::add_tree(agent, &watch, dir, root_path, tree::Origin::Requested) {
            self.stop(watch.id);
            return Err(err);
        }
        tracing::debug!(
            watch_id = watch.id,
            conn,
            recursive,
            dirs = watch.dirs.borrow().len(),
            "watch started"
        );
        Ok(watch)
    }

    /// Creates the agent's inotify instance and its reader task, once.
    fn ensure_inotify(&self, agent: &Rc<Agent>) -> std::io::Result<()> {
        if self.state.borrow().inotify.is_some() {
            return Ok(());
        }
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
        let fd = Rc::new(register(fd)?);
        self.state.borrow_mut().inotify = Some(fd.clone());
        tokio::task::spawn_local(events::read_events(agent.clone(), fd));
        Ok(())
    }

    fn inotify(&self) -> Option<Rc<AsyncFd<OwnedFd>>> {
        self.state.borrow().inotify.clone()
    }

    /// Directories watched by connection `conn`.
    fn connection_dirs(&self, conn: u64) -> usize {
        let state = self.state.borrow();
        state
            .watches
            .values()
            .filter(|w| w.conn == conn)
            .map(|w| w.dirs.borrow().len())
            .sum()
    }

    /// Ends a watch without a `watch_ended` (unwatch, or its connection closed): no more events.
    pub(crate) fn stop(&self, watch_id: u32) {
        if let Some(watch) = self.remove(watch_id) {
            if let Some(task) = watch.forwarder.borrow_mut().take() {
                task.abort();
            }
        }
    }

    /// Ends a watch whose directory went away: its queued events, then `watch_ended`.
    fn end(&self, watch_id: u32, reason: WatchEndReason) {
        if let Some(watch) = self.remove(watch_id) {
            tracing::debug!(watch_id, ?reason, "watch ended");
            watch.queue.end(reason);
        }
    }

    /// Forgets a watch and releases its kernel watches.
    fn remove(&self, watch_id: u32) -> Option<Rc<Watch>> {
        let watch = self.state.borrow_mut().watches.remove(&watch_id)?;
        let wds: Vec<i32> = watch.dirs.borrow_mut().drain().map(|(wd, _)| wd).collect();
        for wd in wds {
            self.release(wd, watch_id);
        }
        Some(watch)
    }

    /// Drops `watch_id`'s use of `wd`, and the kernel watch once nothing uses it.
    fn release(&self, wd: i32, watch_id: u32) {
        let mut state = self.state.borrow_mut();
        let Some(users) = state.wds.get_mut(&wd) else {
            return;
        };
        users.retain(|u| *u != watch_id);
        if users.is_empty() {
            state.wds.remove(&wd);
            if let Some(fd) = &state.inotify {
                // EINVAL: the kernel dropped it already (its directory is gone).
                let _ = inotify::remove_watch(fd.get_ref(), wd);
            }
        }
    }

    /// Ends every watch of connection `conn`.
    pub(crate) fn disconnect(&self, conn: u64) {
        let ids: Vec<u32> = self
            .state
            .borrow()
            .watches
            .values()
            .filter(|w| w.conn == conn)
            .map(|w| w.id)
            .collect();
        for id in ids {
            self.stop(id);
        }
    }
}

/// Registers the inotify descriptor with the runtime's reactor.
#[expect(
    deprecated,
    reason = "AsyncFd::new is deprecated for descriptors whose owner could swap or close them under the               reactor (tokio#8587); an OwnedFd moved into the AsyncFd stays open and unchanged until it               is dropped (get_mut is never used), which is what the unsafe replacement would require,               and this crate forbids unsafe"
)]
fn register(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    AsyncFd::new(fd)
}

/// The path inside the sandbox of the open directory `dir`: its `/proc/self/fd` link, which names it
/// from the agent's root directory, relative to the confining root.
fn in_sandbox_path(agent: &Agent, dir: &OwnedFd) -> Option<String> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())).ok()?;
    let inside = link.strip_prefix(&agent.root_path).ok()?;
    Some(Path::new("/").join(inside).to_string_lossy().into_owned())
}

/// `dir/name` for an in-sandbox directory path.
fn child_path(dir: &str, name: &std::ffi::OsStr) -> String {
    let name = name.to_string_lossy();
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    #[test]
    fn child_paths() {
        assert_eq!(child_path("/", OsStr::new("tmp")), "/tmp");
        assert_eq!(child_path("/home/user", OsStr::new("a b")), "/home/user/a b");
    }
}

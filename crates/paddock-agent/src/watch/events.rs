//! The task reading the agent's inotify instance, and what each kernel event means for the watches
//! using its watch descriptor.

use std::ffi::OsString;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::rc::Rc;

use paddock_protocol::{FsEvent, FsEventKind, WatchEndReason};
use rustix::fs::inotify::{ReadFlags, Reader};
use rustix::fs::OFlags;
use tokio::io::unix::AsyncFd;

use super::tree::{add_tree, remove_subtree, Origin};
use super::{child_path, Watch, Watcher};
use crate::agent::Agent;

/// Bytes read from the inotify instance at once (hundreds of events).
const READ_BUFFER: usize = 64 * 1024;

/// One kernel event, owned.
#[derive(Debug)]
struct RawEvent {
    wd: i32,
    mask: ReadFlags,
    name: Option<OsString>,
}

/// Reads the inotify instance for the agent's lifetime and dispatches every event.
pub(super) async fn read_events(agent: Rc<Agent>, fd: Rc<AsyncFd<OwnedFd>>) {
    let mut buf = vec![MaybeUninit::<u8>::uninit(); READ_BUFFER];
    loop {
        let mut guard = match fd.readable().await {
            Ok(guard) => guard,
            Err(err) => {
                tracing::error!(error = %err, "inotify: waiting for events failed; watches stop");
                return;
            }
        };
        let (events, drained) = read_available(fd.get_ref(), &mut buf);
        if drained {
            guard.clear_ready();
        }
        drop(guard);
        for event in events {
            agent.watcher.dispatch(&agent, event);
        }
    }
}

/// The events of one read (at most a buffer full); `true` when the instance has no more for now.
fn read_available(fd: &OwnedFd, buf: &mut [MaybeUninit<u8>]) -> (Vec<RawEvent>, bool) {
    let mut reader = Reader::new(fd, buf);
    let mut events = Vec::new();
    loop {
        match reader.next() {
            Ok(event) => {
                events.push(RawEvent {
                    wd: event.wd(),
                    mask: event.events(),
                    name: event
                        .file_name()
                        .map(|n| OsString::from_vec(n.to_bytes().to_vec())),
                });
                if reader.is_buffer_empty() {
                    return (events, false);
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => return (events, true),
            Err(err) => {
                tracing::warn!(error = %err, "inotify: read failed");
                return (events, true);
            }
        }
    }
}

impl Watcher {
    fn dispatch(&self, agent: &Agent, event: RawEvent) {
        if event.mask.contains(ReadFlags::QUEUE_OVERFLOW) {
            // The kernel's queue overflowed: every watch may have lost events.
            let watches: Vec<Rc<Watch>> = self.state.borrow().watches.values().cloned().collect();
            for watch in watches {
                watch.queue.overflow();
            }
            return;
        }
        let users: Vec<Rc<Watch>> = {
            let state = self.state.borrow();
            let ids = state.wds.get(&event.wd).map(Vec::as_slice).unwrap_or_default();
            ids.iter()
                .filter_map(|id| state.watches.get(id).cloned())
                .collect()
        };
        if event.mask.contains(ReadFlags::IGNORED) {
            // The kernel dropped the watch descriptor: its directory is gone, or it was removed.
            self.state.borrow_mut().wds.remove(&event.wd);
            for watch in users {
                watch.dirs.borrow_mut().remove(&event.wd);
                if event.wd == watch.root_wd.get() {
                    self.end(watch.id, WatchEndReason::Deleted);
                }
            }
            return;
        }
        for watch in users {
            self.watch_event(agent, &watch, &event);
        }
    }

    fn watch_event(&self, agent: &Agent, watch: &Rc<Watch>, event: &RawEvent) {
        let Some(dir) = watch.dirs.borrow().get(&event.wd).cloned() else {
            return;
        };
        let mask = event.mask;
        let is_root = event.wd == watch.root_wd.get();
        let root_event = |kind, reason| {
            if is_root {
                watch.queue.push(FsEvent {
                    path: dir.clone(),
                    kind,
                    is_dir: true,
                });
                self.end(watch.id, reason);
            }
        };
        // A subdirectory's own removal or move is reported by its parent's event (with its name).
        if mask.contains(ReadFlags::UNMOUNT) {
            return root_event(FsEventKind::Remove, WatchEndReason::Unmounted);
        }
        if mask.contains(ReadFlags::DELETE_SELF) {
            return root_event(FsEventKind::Remove, WatchEndReason::Deleted);
        }
        if mask.contains(ReadFlags::MOVE_SELF) {
            return root_event(FsEventKind::RenameFrom, WatchEndReason::Moved);
        }
        let Some(name) = &event.name else {
            if mask.contains(ReadFlags::ATTRIB) && is_root {
                watch.queue.push(FsEvent {
                    path: dir,
                    kind: FsEventKind::Attrib,
                    is_dir: true,
                });
            }
            return;
        };
        let Some(kind) = kind_of(mask) else {
            return;
        };
        let path = child_path(&dir, name);
        let is_dir = mask.contains(ReadFlags::ISDIR);
        watch.queue.push(FsEvent {
            path: path.clone(),
            kind,
            is_dir,
        });
        if !(watch.recursive && is_dir) {
            return;
        }
        match kind {
            FsEventKind::Create | FsEventKind::RenameTo => {
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW;
                // Gone again already, or replaced by a non-directory: its own events say so.
                if let Ok(fd) = agent.root.open_with(Path::new(&path), flags, 0) {
                    let _ = add_tree(agent, watch, fd, path, Origin::Appeared);
                }
            }
            FsEventKind::RenameFrom => remove_subtree(agent, watch, &path),
            _ => {}
        }
    }
}

/// The protocol kind of a kernel event about a named entry.
fn kind_of(mask: ReadFlags) -> Option<FsEventKind> {
    [
        (ReadFlags::CREATE, FsEventKind::Create),
        (ReadFlags::MODIFY, FsEventKind::Modify),
        (ReadFlags::ATTRIB, FsEventKind::Attrib),
        (ReadFlags::DELETE, FsEventKind::Remove),
        (ReadFlags::MOVED_FROM, FsEventKind::RenameFrom),
        (ReadFlags::MOVED_TO, FsEventKind::RenameTo),
    ]
    .into_iter()
    .find_map(|(flag, kind)| mask.contains(flag).then_some(kind))
}

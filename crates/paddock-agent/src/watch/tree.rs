//! Adding a directory (and, for a recursive watch, the tree below it) to a watch, and removing a
//! subtree that moved away.
//!
//! Directories are walked with an explicit stack of open descriptors: the first is opened confined to
//! the root by the caller, every other one relative to its parent with
//! `paddock_sys::fs_in_root::open_dir_at` (`O_NOFOLLOW | O_DIRECTORY`, the host side's directory open
//! too), so a symlink is never followed, and each kernel watch is added through `/proc/self/fd/N`.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::rc::Rc;

use paddock_protocol::{AgentError, ErrorCode, FsEvent, FsEventKind};
use paddock_sys::fs_in_root::open_dir_at;
use rustix::fs::FileType;

use super::{child_path, watch_flags, Watch, MAX_DIRS_PER_CONNECTION};
use crate::agent::Agent;
use crate::error_code::{agent_error, io_error_code};

/// Why a directory is being added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// The watch request itself: failures are the request's errors.
    Requested,
    /// It appeared in a recursive watch: its entries are reported as created, and failures (it
    /// vanished, a limit) become at most an `overflow` event.
    Appeared,
}

/// Adds directory `dir` (open, at `path` inside the sandbox) to `watch`, and with a recursive watch
/// every directory below it.
pub(super) fn add_tree(
    agent: &Agent,
    watch: &Rc<Watch>,
    dir: OwnedFd,
    path: String,
    origin: Origin,
) -> Result<(), AgentError> {
    let mut stack = vec![(dir, path, true)];
    while let Some((dir, path, top)) = stack.pop() {
        let wd = match add_dir(agent, watch, dir.as_fd(), &path) {
            Ok(Some(wd)) => wd,
            // Part of this watch already: a bind mount loop, or seen twice.
            Ok(None) => continue,
            Err(err) => {
                let error = add_error(&path, &err);
                let limit = error.code == ErrorCode::LimitExceeded;
                if origin == Origin::Requested && (top || limit) {
                    return Err(error);
                }
                if limit {
                    tracing::warn!(watch_id = watch.id, path, "watch limit reached");
                    watch.queue.overflow();
                    return Ok(());
                }
                // A subdirectory that vanished meanwhile.
                continue;
            }
        };
        if watch.root_wd.get() < 0 {
            watch.root_wd.set(wd);
        }
        let report = origin == Origin::Appeared;
        if !watch.recursive && !report {
            continue;
        }
        let entries = match list(dir.as_fd()) {
            Ok(entries) => entries,
            Err(err) if origin == Origin::Requested && top => return Err(add_error(&path, &err)),
            Err(_) => continue,
        };
        for (name, is_dir) in entries {
            let child = child_path(&path, &name);
            if report {
                watch.queue.push(FsEvent {
                    path: child.clone(),
                    kind: FsEventKind::Create,
                    is_dir,
                });
            }
            if watch.recursive && is_dir {
                // A directory that vanished or was swapped for something else meanwhile is skipped.
                if let Ok(fd) = open_dir_at(dir.as_fd(), name.as_os_str()) {
                    if !is_pseudo_fs(fd.as_fd()) {
                        stack.push((fd, child, false));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Adds one kernel watch for the open directory `dir`; `None` when this watch has it already.
fn add_dir(agent: &Agent, watch: &Rc<Watch>, dir: BorrowedFd<'_>, path: &str) -> io::Result<Option<i32>> {
    if agent.watcher.connection_dirs(watch.conn) >= MAX_DIRS_PER_CONNECTION {
        return Err(io::Error::from_raw_os_error(libc::ENOSPC));
    }
    let inotify = agent
        .watcher
        .inotify()
        .ok_or_else(|| io::Error::other("no inotify instance"))?;
    // Through the descriptor: the directory that was opened confined is the one watched.
    let proc_path = format!("/proc/self/fd/{}", dir.as_raw_fd());
    let wd = rustix::fs::inotify::add_watch(inotify.get_ref(), proc_path.as_str(), watch_flags())?;
    if watch.dirs.borrow().contains_key(&wd) {
        return Ok(None);
    }
    watch.dirs.borrow_mut().insert(wd, path.to_owned());
    let mut state = agent.watcher.state.borrow_mut();
    let users = state.wds.entry(wd).or_default();
    if !users.contains(&watch.id) {
        users.push(watch.id);
    }
    Ok(Some(wd))
}

/// Whether `dir` is on a kernel pseudo file system (`/proc`, `/sys`, `/dev/pts`): inotify reports
/// nothing there, and `/proc` alone has thousands of directories, so a recursive watch of `/` does
/// not descend into them. Watching one of them directly is still possible.
fn is_pseudo_fs(dir: BorrowedFd<'_>) -> bool {
    const PSEUDO: [i64; 3] = [
        libc::PROC_SUPER_MAGIC,
        libc::SYSFS_MAGIC,
        libc::DEVPTS_SUPER_MAGIC,
    ];
    rustix::fs::fstatfs(dir).is_ok_and(|st| PSEUDO.contains(&st.f_type))
}

/// The error of a watch request that could not add `path`.
fn add_error(path: &str, err: &io::Error) -> AgentError {
    if err.raw_os_error() == Some(libc::ENOSPC) {
        return agent_error(
            ErrorCode::LimitExceeded,
            format!(
                "watch {path:?}: too many watched directories (at most {MAX_DIRS_PER_CONNECTION} per \
                 connection, and the kernel's inotify watch limit)"
            ),
        );
    }
    agent_error(io_error_code(err), format!("watch {path:?}: {err}"))
}

/// The entries of an open directory with whether each is a directory (never following symlinks).
fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<(OsString, bool)>> {
    let mut entries = Vec::new();
    let mut reader = rustix::fs::Dir::read_from(dir)?;
    while let Some(entry) = reader.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let name = OsString::from_vec(name.to_vec());
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            FileType::Unknown => {
                rustix::fs::statat(dir, name.as_os_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
            }
            _ => false,
        };
        entries.push((name, is_dir));
    }
    Ok(entries)
}

/// Removes from `watch` the directory at `path` and every directory below it (it moved away: the
/// kernel watches would go on reporting under the old paths).
pub(super) fn remove_subtree(agent: &Agent, watch: &Watch, path: &str) {
    let prefix = format!("{}/", path.trim_end_matches('/'));
    let gone: Vec<i32> = watch
        .dirs
        .borrow()
        .iter()
        .filter(|(wd, p)| (p.as_str() == path || p.starts_with(&prefix)) && **wd != watch.root_wd.get())
        .map(|(wd, _)| *wd)
        .collect();
    for wd in gone {
        watch.dirs.borrow_mut().remove(&wd);
        agent.watcher.release(wd, watch.id);
    }
}

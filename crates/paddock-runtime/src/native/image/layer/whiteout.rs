//! Whiteouts and opaque markers: what a layer removes of what earlier layers made.
//!
//! Both act only on the tree as earlier layers left it: a name this layer made (remembered in
//! `Layer::made`), or a directory above one, is never removed by a whiteout of the same layer.
//! Neither follows
//! a symlink: the directory is reached as any member's (`untar/dirs.rs`), a removed entry is unlinked
//! or removed with `remove_tree_at`, and the descent of an opaque directory goes only into
//! directories this layer made, opened `O_NOFOLLOW`. This module does not create anything.

use std::os::fd::{AsFd, BorrowedFd};

use paddock_sys::fs_in_root::list_names;

use super::{invalid, Failure, Layer, WHITEOUT};
use crate::native::untar::dirs::DirError;
use crate::native::untar::member_path::MemberPath;

impl Layer {
    /// `.wh.NAME`: removes `NAME`, unless this layer made it; if this layer made something below it
    /// (listed before the whiteout), only what earlier layers put there goes, as for an opaque
    /// directory.
    pub(super) fn whiteout(&mut self, path: &MemberPath, hidden: &[u8]) -> Result<(), Failure> {
        if hidden.is_empty() || hidden == b"." || hidden == b".." || hidden.starts_with(WHITEOUT) {
            return Err(invalid(format!(
                "whiteout {} names nothing it may remove",
                path.display()
            )));
        }
        let mut key = path.parents().join(&b'/');
        if !key.is_empty() {
            key.push(b'/');
        }
        key.extend_from_slice(hidden);
        if self.made.contains(&key) {
            return Ok(());
        }
        let Some(dir) = self.parent(path, false)? else {
            return Ok(());
        };
        if !self.made_here(&key) {
            self.clear(dir.as_fd(), hidden, path)?;
            return Ok(());
        }
        match self.dirs.open_dir(dir.as_fd(), hidden) {
            Ok(sub) => self.clean(sub.as_fd(), &key, path),
            Err(DirError::Missing | DirError::NotADir(_)) => Ok(()),
            Err(DirError::Leaves) => Err(invalid(format!("whiteout {} leaves the tree", path.display()))),
            Err(DirError::Io(step, source)) => Err(self.error(step, path, source)),
        }
    }

    /// `.wh..wh..opq`: removes from its directory everything this layer did not make.
    pub(super) fn opaque(&mut self, path: &MemberPath) -> Result<(), Failure> {
        let Some(dir) = self.parent(path, false)? else {
            return Ok(());
        };
        let key = path.parents().join(&b'/');
        self.clean(dir.as_fd(), &key, path)
    }

    /// Removes from `dir` (whose key is `key`) what this layer did not make, descending into the
    /// directories it did (no deeper than member names go: `made` holds only their keys).
    fn clean(&self, dir: BorrowedFd<'_>, key: &[u8], path: &MemberPath) -> Result<(), Failure> {
        let names =
            list_names(dir, u64::MAX).map_err(|e| self.error("list the directory of", path, e.into()))?;
        for child in names.names {
            let child = child.as_bytes();
            let mut child_key = key.to_vec();
            if !child_key.is_empty() {
                child_key.push(b'/');
            }
            child_key.extend_from_slice(child);
            if !self.made_here(&child_key) {
                self.clear(dir, child, path)?;
                continue;
            }
            match self.dirs.open_dir(dir, child) {
                Ok(sub) => self.clean(sub.as_fd(), &child_key, path)?,
                Err(DirError::Missing | DirError::NotADir(_)) => {}
                Err(DirError::Leaves) => {
                    return Err(invalid(format!(
                        "opaque directory {} leaves the tree",
                        path.display()
                    )))
                }
                Err(DirError::Io(step, source)) => return Err(self.error(step, path, source)),
            }
        }
        Ok(())
    }
}

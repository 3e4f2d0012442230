//! The parent cgroups sandboxes live under (`<hierarchy>/<parent>`): made when missing, and removed
//! by gc once empty, but only those paddock made.
//!
//! Each parent this code creates is recorded, one path a line, in the state directory's
//! `cgroup-parents` file. [`CgroupLayout::remove_created_parents`] (run by gc, and so by `paddock
//! pool destroy`) removes the recorded parents that hold no cgroup any more and forgets them. A parent
//! that existed already (an operator's, perhaps with limits for all sandboxes) is never recorded, so
//! never removed. The kernel refuses to remove a cgroup with children or processes, which is what
//! keeps a parent still in use (by a running server's sandboxes) in place.
//!
//! It does not remove parents made before this record existed, nor recorded ones of another parent
//! name (a changed configuration): those stay, as every parent did before. Two processes updating
//! the record at once may lose a line; the parent it named is then left behind, never removed in use.

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use super::{io_err, write_file, CgroupKind, CgroupLayout};
use crate::RuntimeError;

/// The record's name in the state directory.
pub(crate) const CREATED_PARENTS: &str = "cgroup-parents";

impl CgroupLayout {
    /// The parent directories paddock creates its cgroups in.
    pub(super) fn parents(&self) -> Vec<PathBuf> {
        let p = &self.parent;
        match &self.kind {
            CgroupKind::V2 { root, .. } => vec![root.join(p)],
            CgroupKind::V1 {
                memory,
                pids,
                cpu,
                blkio,
                unified,
            } => {
                let mut v = vec![memory.join(p), pids.join(p), cpu.join(p)];
                v.extend(blkio.iter().map(|b| b.join(p)));
                if let Some(u) = unified {
                    v.push(u.join(p));
                }
                v
            }
        }
    }

    /// Makes the parents that are missing (recording each), and on v2 enables the controllers
    /// sandboxes need in their ancestors.
    pub(super) fn ensure_parents(&self) -> Result<(), RuntimeError> {
        for parent in self.parents() {
            if !parent.exists() {
                match fs::create_dir(&parent) {
                    Ok(()) => self.record_created(&parent),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io_err(&parent, "create")(e)),
                }
            }
        }
        if let CgroupKind::V2 { root, io } = &self.kind {
            let wanted: &[&str] = if *io {
                &["memory", "pids", "cpu", "io"]
            } else {
                &["memory", "pids", "cpu"]
            };
            // Controllers must be enabled in every ancestor's subtree_control for the child to get them.
            for dir in [root.clone(), root.join(&self.parent)] {
                let ctl = dir.join("cgroup.subtree_control");
                let current = fs::read_to_string(&ctl).map_err(io_err(&ctl, "read"))?;
                for &c in wanted {
                    if !current.split_whitespace().any(|x| x == c) {
                        write_file(&ctl, &format!("+{c}"))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Adds `parent` to the record. A failure only means gc will not remove it: logged, not returned.
    fn record_created(&self, parent: &Path) {
        let appended = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.created)
            .and_then(|mut f| f.write_all(format!("{}\n", parent.display()).as_bytes()));
        if let Err(e) = appended {
            tracing::warn!(
                record = %self.created.display(),
                parent = %parent.display(),
                error = %e,
                "cannot record a parent cgroup made; gc will leave it"
            );
        }
    }

    /// Removes the recorded parents of this layout that are empty and forgets them; keeps the others
    /// (see the module docs). Never fails: what cannot be removed now is tried by the next gc.
    pub fn remove_created_parents(&self) {
        let recorded = match fs::read_to_string(&self.created) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) => {
                tracing::warn!(record = %self.created.display(), error = %e, "cannot read the parent cgroups made");
                return;
            }
        };
        let ours = self.parents();
        let mut kept: Vec<&str> = Vec::new();
        for line in recorded.lines().filter(|l| !l.is_empty()) {
            if kept.contains(&line) {
                continue;
            }
            let path = Path::new(line);
            if !ours.iter().any(|p| p == path) {
                kept.push(line);
                continue;
            }
            match fs::remove_dir(path) {
                Ok(()) => tracing::debug!(parent = line, "removed an empty parent cgroup"),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                // Sandboxes (or processes) are still in it: the kernel keeps it, and so do we.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::ENOTEMPTY)) => kept.push(line),
                Err(e) => {
                    tracing::warn!(parent = line, error = %e, "cannot remove a parent cgroup; gc will retry");
                    kept.push(line);
                }
            }
        }
        if let Err(e) = rewrite_record(&self.created, &kept) {
            tracing::warn!(record = %self.created.display(), error = %e, "cannot update the parent cgroups made");
        }
    }
}

/// Replaces the record with `lines` (atomically), or removes it when there are none.
fn rewrite_record(record: &Path, lines: &[&str]) -> io::Result<()> {
    if lines.is_empty() {
        return match fs::remove_file(record) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let mut text = lines.join("\n");
    text.push('\n');
    let tmp = record.with_extension("new");
    fs::write(&tmp, text)?;
    fs::rename(&tmp, record)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v1 layout over plain directories standing in for the hierarchies (`rmdir` of a non-empty
    /// one fails there too, with `ENOTEMPTY` where cgroupfs says `EBUSY`).
    fn layout(root: &Path) -> CgroupLayout {
        for h in ["memory", "pids", "cpu"] {
            fs::create_dir(root.join(h)).expect("hierarchy");
        }
        CgroupLayout {
            kind: CgroupKind::V1 {
                memory: root.join("memory"),
                pids: root.join("pids"),
                cpu: root.join("cpu"),
                blkio: None,
                unified: None,
            },
            parent: "px".into(),
            created: root.join(CREATED_PARENTS),
        }
    }

    #[test]
    fn only_the_parents_made_here_are_removed_and_only_once_empty() {
        let root = tempfile::tempdir().expect("tempdir");
        let root = root.path();
        let cg = layout(root);
        // An operator's parent, made before paddock ran.
        fs::create_dir(root.join("cpu/px")).expect("operator's parent");
        cg.ensure_parents().expect("parents");
        cg.ensure_parents().expect("again: nothing more to make");
        let record = fs::read_to_string(root.join(CREATED_PARENTS)).expect("record");
        assert_eq!(
            record,
            format!(
                "{}\n{}\n",
                root.join("memory/px").display(),
                root.join("pids/px").display()
            )
        );

        // A sandbox is still under one of them.
        fs::create_dir(root.join("memory/px/sb-1")).expect("a sandbox cgroup");
        cg.remove_created_parents();
        assert!(root.join("memory/px/sb-1").exists());
        assert!(
            !root.join("pids/px").exists(),
            "an empty parent made here is removed"
        );
        assert!(root.join("cpu/px").exists(), "the operator's parent stays");
        assert_eq!(
            fs::read_to_string(root.join(CREATED_PARENTS)).expect("record"),
            format!("{}\n", root.join("memory/px").display()),
            "the record keeps what it still holds"
        );

        fs::remove_dir(root.join("memory/px/sb-1")).expect("sandbox gone");
        cg.remove_created_parents();
        assert!(!root.join("memory/px").exists());
        assert!(root.join("cpu/px").exists());
        assert!(!root.join(CREATED_PARENTS).exists(), "an empty record is removed");
        // Nothing recorded: nothing to do.
        cg.remove_created_parents();
    }

    #[test]
    fn another_parent_name_s_lines_are_kept_untouched() {
        let root = tempfile::tempdir().expect("tempdir");
        let root = root.path();
        let cg = layout(root);
        fs::create_dir(root.join("memory/other")).expect("another configuration's parent");
        let other = root.join("memory/other");
        fs::write(root.join(CREATED_PARENTS), format!("{}\n", other.display())).expect("record");
        cg.ensure_parents().expect("parents");
        cg.remove_created_parents();
        assert!(other.exists());
        assert!(!root.join("memory/px").exists());
        assert_eq!(
            fs::read_to_string(root.join(CREATED_PARENTS)).expect("record"),
            format!("{}\n", other.display())
        );
    }
}

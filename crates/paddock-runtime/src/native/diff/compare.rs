//! Comparing one path's two sides: metadata, symlink targets, file contents (bounded), and unified
//! diffs of text.

use std::ffi::CStr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use paddock_types::diff::{Change, DiffEntry, EntryKind};
use rustix::fs::FileType;
use rustix::io::Errno;
use similar::TextDiff;

use super::tree::Meta;
use super::{display_path, DiffError, Found, Walker};

/// Chunk size of streamed content comparison.
const CHUNK: usize = 64 * 1024;
/// Longest a single text diff may run before `similar` settles for a coarser (still correct) diff:
/// line diffs are quadratic in the worst case, and the content is untrusted.
const TEXT_DIFF_TIMEOUT: Duration = Duration::from_millis(250);

impl Walker<'_> {
    /// Compares one path's two sides; `None` if unchanged (or absent on both).
    pub(super) fn compare(
        &mut self,
        old_dir: Option<BorrowedFd<'_>>,
        new_dir: Option<BorrowedFd<'_>>,
        name: &CStr,
        rel: &[u8],
        old: Option<Meta>,
        new: Option<Meta>,
    ) -> Result<Option<Found>, DiffError> {
        let file_bytes = |m: Option<Meta>| m.filter(Meta::is_file).map_or(0, |m| m.size);
        let (change, mode_changed, owner_changed, unified) = match (old, new) {
            (None, None) => return Ok(None),
            (None, Some(n)) => {
                let text = self.side_text(false, new_dir, name, rel, &n)?;
                (
                    Change::Added,
                    false,
                    false,
                    text.and_then(|t| self.unified(rel, None, Some(&t))),
                )
            }
            (Some(o), None) => {
                let text = self.side_text(true, old_dir, name, rel, &o)?;
                (
                    Change::Deleted,
                    false,
                    false,
                    text.and_then(|t| self.unified(rel, Some(&t), None)),
                )
            }
            (Some(o), Some(n)) => {
                let mode_changed = o.perm != n.perm;
                let owner_changed = o.uid != n.uid || o.gid != n.gid;
                if o.file_type != n.file_type {
                    let old_text = self.side_text(true, old_dir, name, rel, &o)?;
                    let new_text = self.side_text(false, new_dir, name, rel, &n)?;
                    let unified = match (old_text, new_text) {
                        (Some(t), None) => self.unified(rel, Some(&t), None),
                        (None, Some(t)) => self.unified(rel, None, Some(&t)),
                        _ => None,
                    };
                    (Change::TypeChanged, mode_changed, owner_changed, unified)
                } else {
                    let (Some(od), Some(nd)) = (old_dir, new_dir) else {
                        return Ok(None); // both sides were found in their directories
                    };
                    let (differs, unified) = match n.file_type {
                        FileType::RegularFile => self.compare_files(od, nd, name, rel, &o, &n)?,
                        FileType::Symlink => {
                            let differs = !n.unchanged_since(&o)
                                && self.old.read_link(od, name, rel)? != self.new.read_link(nd, name, rel)?;
                            (differs, None)
                        }
                        FileType::Directory => (false, None),
                        _ => (o.rdev != n.rdev, None),
                    };
                    if !(differs || mode_changed || owner_changed) {
                        return Ok(None);
                    }
                    (Change::Modified, mode_changed, owner_changed, unified)
                }
            }
        };
        let (bytes_added, bytes_deleted) = match change {
            Change::Modified => (0, 0),
            _ => (file_bytes(new), file_bytes(old)),
        };
        let kind = new.or(old).map_or(EntryKind::Other, |m| m.kind());
        Ok(Some(Found {
            entry: DiffEntry {
                path: display_path(rel),
                change,
                kind,
                old_size: old.and_then(|m| m.reported_size()),
                new_size: new.and_then(|m| m.reported_size()),
                mode_changed,
                owner_changed,
                unified,
            },
            bytes_added,
            bytes_deleted,
        }))
    }

    /// Whether two regular files' contents differ (`true` when that cannot be known within the
    /// bounds), and their unified diff when asked for and possible.
    fn compare_files(
        &mut self,
        old_dir: BorrowedFd<'_>,
        new_dir: BorrowedFd<'_>,
        name: &CStr,
        rel: &[u8],
        o: &Meta,
        n: &Meta,
    ) -> Result<(bool, Option<String>), DiffError> {
        if n.unchanged_since(o) {
            return Ok((false, None));
        }
        if self.wants_text(o) && self.wants_text(n) && o.size.saturating_add(n.size) <= self.compare_left {
            let a = self.read_small(true, old_dir, name, rel, o)?;
            let b = self.read_small(false, new_dir, name, rel, n)?;
            if let (Some(a), Some(b)) = (a, b) {
                if a == b {
                    // Equal now; a size that differed was a write racing with the read.
                    return Ok((o.size != n.size, None));
                }
                let unified = match (text(&a), text(&b)) {
                    (Some(a), Some(b)) => self.unified(rel, Some(a), Some(b)),
                    _ => None,
                };
                return Ok((true, unified));
            }
            return Ok((true, None));
        }
        if o.size != n.size {
            return Ok((true, None));
        }
        let limit = self.options.max_compare_bytes;
        if o.size > limit || o.size.saturating_mul(2) > self.compare_left {
            return Ok((true, None));
        }
        let (Some(a), Some(b)) = (
            self.old.open_file(old_dir, name, rel, o)?,
            self.new.open_file(new_dir, name, rel, n)?,
        ) else {
            return Ok((true, None));
        };
        let mut buf_a = vec![0; CHUNK];
        let mut buf_b = vec![0; CHUNK];
        let mut total = 0u64;
        loop {
            let got_a = self.read_chunk(true, &a, &mut buf_a, rel)?;
            let got_b = self.read_chunk(false, &b, &mut buf_b, rel)?;
            if got_a != got_b || buf_a[..got_a] != buf_b[..got_b] {
                return Ok((true, None));
            }
            if got_a == 0 {
                return Ok((false, None));
            }
            total += got_a as u64;
            if total > limit {
                return Ok((true, None)); // grew past the bound while being read
            }
        }
    }

    fn wants_text(&self, m: &Meta) -> bool {
        self.options.text_diff && self.text_left > 0 && m.is_file() && m.size <= self.options.max_text_bytes
    }

    /// The content of one side for a text diff of an added, deleted or retyped file, if it is text.
    fn side_text(
        &mut self,
        old: bool,
        dir: Option<BorrowedFd<'_>>,
        name: &CStr,
        rel: &[u8],
        m: &Meta,
    ) -> Result<Option<String>, DiffError> {
        let Some(dir) = dir else { return Ok(None) };
        if !self.wants_text(m) || m.size > self.compare_left || m.size == 0 {
            return Ok(None);
        }
        let bytes = self.read_small(old, dir, name, rel, m)?;
        Ok(bytes.and_then(|b| text(&b).map(str::to_owned)))
    }

    /// A whole file of at most `max_text_bytes`; `None` if it changed into something else or grew
    /// past the bound.
    fn read_small(
        &mut self,
        old: bool,
        dir: BorrowedFd<'_>,
        name: &CStr,
        rel: &[u8],
        m: &Meta,
    ) -> Result<Option<Vec<u8>>, DiffError> {
        let Some(fd) = self.tree(old).open_file(dir, name, rel, m)? else {
            return Ok(None);
        };
        let limit = self.options.max_text_bytes;
        let mut bytes = Vec::with_capacity(usize::try_from(m.size.min(limit)).unwrap_or(0));
        let mut buf = vec![0; CHUNK];
        loop {
            let got = self.read_chunk(old, &fd, &mut buf, rel)?;
            if got == 0 {
                return Ok(Some(bytes));
            }
            bytes.extend_from_slice(&buf[..got]);
            if bytes.len() as u64 > limit {
                return Ok(None);
            }
        }
    }

    /// Fills `buf` as far as the file goes; charges the bytes to `max_total_compare_bytes`.
    fn read_chunk(
        &mut self,
        old: bool,
        fd: &OwnedFd,
        buf: &mut [u8],
        rel: &[u8],
    ) -> Result<usize, DiffError> {
        let mut filled = 0;
        while filled < buf.len() {
            match rustix::io::read(fd, &mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(Errno::INTR) => {}
                Err(e) => return Err(self.tree(old).err("read the file", rel, e)),
            }
        }
        self.compare_left = self.compare_left.saturating_sub(filled as u64);
        Ok(filled)
    }

    /// A unified diff between two texts (`None` for an absent side), within `max_total_text_bytes`.
    fn unified(&mut self, rel: &[u8], old: Option<&str>, new: Option<&str>) -> Option<String> {
        let (a, b) = (old.unwrap_or(""), new.unwrap_or(""));
        if a == b || self.text_left == 0 {
            return None;
        }
        let a_name = if old.is_some() {
            header_path("a/", rel)
        } else {
            "/dev/null".to_owned()
        };
        let b_name = if new.is_some() {
            header_path("b/", rel)
        } else {
            "/dev/null".to_owned()
        };
        let diff = TextDiff::configure().timeout(TEXT_DIFF_TIMEOUT).diff_lines(a, b);
        let unified = diff
            .unified_diff()
            .context_radius(3)
            .header(&a_name, &b_name)
            .to_string();
        if unified.len() as u64 > self.text_left {
            self.text_left = 0; // no further diffs: the budget is spent
            return None;
        }
        self.text_left -= unified.len() as u64;
        Some(unified)
    }
}

/// Text for a diff: UTF-8 without NUL bytes.
fn text(bytes: &[u8]) -> Option<&str> {
    if bytes.contains(&0) {
        return None;
    }
    std::str::from_utf8(bytes).ok()
}

/// A unified diff header's file name: `prefix` + path, C-quoted as git does when the path holds
/// control characters, quotes, backslashes or bytes that are not UTF-8 (a newline in a file name must
/// not be able to forge diff lines).
pub(super) fn header_path(prefix: &str, rel: &[u8]) -> String {
    let plain = std::str::from_utf8(rel)
        .ok()
        .filter(|s| !s.chars().any(|c| c.is_control() || c == '"' || c == '\\'));
    if let Some(s) = plain {
        return format!("{prefix}{s}");
    }
    let mut quoted = format!("\"{prefix}");
    for &byte in rel {
        match byte {
            b'"' => quoted.push_str("\\\""),
            b'\\' => quoted.push_str("\\\\"),
            b'\n' => quoted.push_str("\\n"),
            b'\t' => quoted.push_str("\\t"),
            0x20..=0x7e => quoted.push(char::from(byte)),
            _ => quoted.push_str(&format!("\\{byte:03o}")),
        }
    }
    quoted.push('"');
    quoted
}

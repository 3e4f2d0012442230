//! Applying one OCI image layer (an uncompressed tar stream, untrusted) on top of the tree earlier
//! layers made, as the OCI image spec's "Applying changesets" says.
//!
//! Where a byte lands is decided as in a snapshot import (`untar/`): member names are relative plain
//! names (`..`, absolute names and NUL refused), each directory on the way is opened from the root
//! with `openat(O_DIRECTORY | O_NOFOLLOW)` (a symlink on the way refuses the layer, even one an
//! earlier layer made: the spec would resolve it inside the image root, we do not resolve it at
//! all), and each name is created with a call that never follows it. Unlike an import, a member may
//! replace what is there: a file, symlink or hard link replaces a non-directory (unlinked) or a
//! directory (removed with its tree, `remove_tree_at`: no symlink followed); a directory over a
//! directory updates its owner and mode, over anything else replaces it.
//!
//! Whiteouts: `.wh.NAME` removes `NAME` (and its tree) from the directory, as left by earlier layers
//! (a name this layer made is kept: whiteouts only apply to lower layers); `.wh..wh..opq` empties
//! the directory of everything earlier layers put there, keeping what this layer made in it before
//! or after the marker (the names this layer made are remembered for this). Neither is created.
//!
//! Members: directories, regular files, symlinks (the target stored verbatim, only ever resolved
//! inside a sandbox), hard links (to a regular file already in the tree, reached without following a
//! symlink), pax and GNU long-name headers. Device nodes and fifos are skipped and counted (a
//! sandbox gets its own `/dev`; a fifo is harmless but never needed by a template). Sparse files and
//! other types refuse the layer. Owners are image ids; `0..count` become host ids `base + id`
//! ([`IdRange`]), any other id becomes the sandbox's overflow id (65534, `nobody`, when the range
//! holds it, else the range's last id) and is counted. Permission bits are kept whole, setuid and
//! setgid included: sandboxes mount their trees `nosuid` and run with `no_new_privs`. Parent
//! directories a layer does not list are made as the sandbox's root, mode 0755.
//!
//! Bounds: the layer's bytes (headers included) by [`LayerLimits::max_bytes`], its members by
//! `max_entries`, the headers read for one member by the shared metadata bound. A stream that ends
//! without the end-of-archive marker is truncated and refused.
//!
//! This module does not: decompress or check digests (the caller hands it a reader from
//! `layout.rs`), apply extended attributes (file capabilities are dropped) or directories' mtimes
//! (files' and symlinks' are kept), or clean up after a refused layer (the caller builds the tree in
//! a staging directory it discards).

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::rc::Rc;

use paddock_sys::fs_in_root::remove_tree_at;
use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid};
use rustix::io::Errno;
use tar::EntryType;

use super::digest::image_error;
use super::ImageError;
use crate::native::untar::dirs::{DirError, TreeDirs};
use crate::native::untar::input::{check_end, pax_mtime, Input, InputState, MAX_METADATA_BYTES};
use crate::native::untar::member_path::MemberPath;
use crate::native::untar::CHUNK;
use crate::native::IdRange;

mod whiteout;

type Failure = crate::native::untar::input::Failure<ImageError>;

/// The sandbox id that image ids outside the range become, when the range holds it.
const OVERFLOW_ID: u32 = 65534;
/// The prefix of a whiteout's name.
pub(super) const WHITEOUT: &[u8] = b".wh.";
/// The name, after [`WHITEOUT`], of an opaque directory's marker.
const OPAQUE: &[u8] = b".wh..opq";

/// Bounds of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerLimits {
    /// Most bytes of the uncompressed tar stream (headers and padding included).
    pub max_bytes: u64,
    /// Most members.
    pub max_entries: u64,
}

impl Default for LayerLimits {
    fn default() -> Self {
        Self {
            max_bytes: 10 << 30,
            max_entries: 1_000_000,
        }
    }
}

/// What applying one layer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerSummary {
    /// Bytes of the tar stream.
    pub bytes: u64,
    /// Members read (whiteouts and skipped ones included).
    pub entries: u64,
    /// Bytes of regular files' contents written.
    pub data_bytes: u64,
    /// Whiteouts and opaque markers read (applied, or left alone for naming what this layer made or
    /// what is absent).
    pub whiteouts: u64,
    /// Character and block devices skipped.
    pub devices_skipped: u64,
    /// Fifos skipped.
    pub fifos_skipped: u64,
    /// Members whose owner or group lay outside the sandbox id range (given the overflow id).
    pub ids_overflowed: u64,
}

/// Applies the uncompressed tar stream `input` on top of the directory `root`. On an error the tree
/// is left half-applied: the caller discards it.
pub fn apply_layer(
    root: BorrowedFd<'_>,
    mut input: impl Read,
    ids: &IdRange,
    limits: LayerLimits,
) -> Result<LayerSummary, ImageError> {
    let root = root.try_clone_to_owned().map_err(|e| tree("open", ".", e))?;
    let dirs = TreeDirs::new(root, *ids).map_err(|e| tree("stat", ".", e.into()))?;
    let state = Rc::new(InputState::new(limits.max_bytes));
    let reader = Input {
        inner: &mut input,
        state: state.clone(),
    };
    let mut layer = Layer {
        dirs,
        ids: *ids,
        limits,
        state: state.clone(),
        made: BTreeSet::new(),
        summary: LayerSummary::default(),
        buf: vec![0; CHUNK],
    };
    let mut archive = tar::Archive::new(reader);
    let outcome = layer.unpack(&mut archive).and_then(|()| {
        let mut reader = archive.into_inner();
        check_end(&mut reader, &state)
    });
    match outcome {
        Ok(()) => Ok(LayerSummary {
            bytes: state.read.get(),
            ..layer.summary
        }),
        Err(e) => Err(classify(&state, e, &limits)),
    }
}

struct Layer {
    dirs: TreeDirs,
    ids: IdRange,
    limits: LayerLimits,
    state: Rc<InputState>,
    /// Keys of the members this layer made: what an opaque marker and a whiteout leave alone (with
    /// the directories above them). Full keys only, no entry per parent, so memory stays in
    /// proportion to the names the layer holds however deep they are.
    made: BTreeSet<Vec<u8>>,
    summary: LayerSummary,
    buf: Vec<u8>,
}

/// A member's metadata, checked and mapped to host ids.
struct Meta {
    mode: u32,
    uid: Uid,
    gid: Gid,
    mtime: (i64, u32),
}

fn invalid(reason: String) -> Failure {
    Failure::Invalid(reason)
}

fn tree(step: &'static str, path: &str, source: io::Error) -> ImageError {
    ImageError::Tree {
        step,
        path: path.to_owned(),
        source,
    }
}

impl Layer {
    fn unpack<R: Read>(&mut self, archive: &mut tar::Archive<R>) -> Result<(), Failure> {
        let mut entries = archive.entries()?;
        loop {
            self.state.window.set(Some(MAX_METADATA_BYTES));
            let next = entries.next();
            self.state.window.set(None);
            let mut entry = match next {
                None => return Ok(()),
                Some(entry) => entry?,
            };
            self.summary.entries += 1;
            if self.summary.entries > self.limits.max_entries {
                return Err(Failure::Tree(ImageError::LayerTooLarge {
                    reason: format!("the layer has more than {} members", self.limits.max_entries),
                }));
            }
            self.member(&mut entry)?;
            io::copy(&mut entry, &mut io::sink())?;
        }
    }

    fn member<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), Failure> {
        let kind = entry.header().entry_type();
        if kind == EntryType::XGlobalHeader {
            return Ok(());
        }
        let path = MemberPath::parse(&entry.path_bytes()).map_err(invalid)?;
        if let Some(hidden) = path.name().and_then(|n| n.strip_prefix(WHITEOUT)) {
            let hidden = hidden.to_vec();
            self.summary.whiteouts += 1;
            return if hidden == OPAQUE {
                self.opaque(&path)
            } else {
                self.whiteout(&path, &hidden)
            };
        }
        match kind {
            EntryType::Char | EntryType::Block => {
                self.summary.devices_skipped += 1;
                return Ok(());
            }
            EntryType::Fifo => {
                self.summary.fifos_skipped += 1;
                return Ok(());
            }
            _ => {}
        }
        let meta = self.meta(entry, &path)?;
        match kind {
            EntryType::Directory => self.directory(&path, &meta)?,
            EntryType::Regular | EntryType::Continuous => self.file(entry, &path, &meta)?,
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| invalid(format!("symlink {} has no target", path.display())))?
                    .into_owned();
                self.symlink(&path, &target, &meta)?;
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| invalid(format!("hard link {} has no target", path.display())))?;
                let target = MemberPath::parse(&target).map_err(invalid)?;
                self.hard_link(&path, &target)?;
            }
            other => {
                return Err(invalid(format!(
                    "member {} has an unsupported type ({:?})",
                    path.display(),
                    other.as_byte() as char
                )))
            }
        }
        self.remember(&path);
        Ok(())
    }

    /// Notes `path` as made by this layer.
    fn remember(&mut self, path: &MemberPath) {
        self.made.insert(path.key());
    }

    /// Whether this layer made `key`, or something below it.
    fn made_here(&self, key: &[u8]) -> bool {
        if self.made.contains(key) {
            return true;
        }
        let mut below = key.to_vec();
        below.push(b'/');
        // Keys sharing a prefix are contiguous in byte order.
        self.made
            .range(below.clone()..)
            .next()
            .is_some_and(|k| k.starts_with(&below))
    }

    fn meta<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>, path: &MemberPath) -> Result<Meta, Failure> {
        let header = entry.header();
        let field = |what: &str, e: io::Error| invalid(format!("member {}: bad {what}: {e}", path.display()));
        let mode = header.mode().map_err(|e| field("mode", e))? & 0o7777;
        let uid = header.uid().map_err(|e| field("uid", e))?;
        let gid = header.gid().map_err(|e| field("gid", e))?;
        let header_mtime = (
            i64::try_from(header.mtime().map_err(|e| field("mtime", e))?).unwrap_or(i64::MAX),
            0,
        );
        let mtime = pax_mtime(entry, path, header_mtime, "which layers may not hold")?;
        let (uid, uid_over) = self.sandbox_id(uid);
        let (gid, gid_over) = self.sandbox_id(gid);
        if uid_over || gid_over {
            self.summary.ids_overflowed += 1;
        }
        Ok(Meta {
            mode,
            uid: Uid::from_raw(self.ids.host_uid(uid)),
            gid: Gid::from_raw(self.ids.host_gid(gid)),
            mtime,
        })
    }

    /// The sandbox id of image id `id`, and whether it lay outside the range.
    fn sandbox_id(&self, id: u64) -> (u32, bool) {
        let count = self.ids.count;
        match u32::try_from(id) {
            Ok(id) if id < count => (id, false),
            _ if OVERFLOW_ID < count => (OVERFLOW_ID, true),
            _ => (count.saturating_sub(1), true),
        }
    }

    /// The directory holding `path`, opened (its own descriptor, so `self` stays free), missing
    /// directories made on the way when `create`; `None` if one is missing and not to be made.
    fn parent(&mut self, path: &MemberPath, create: bool) -> Result<Option<OwnedFd>, Failure> {
        match self.dirs.parent(path, create) {
            Ok(fd) => fd
                .try_clone_to_owned()
                .map(Some)
                .map_err(|e| Failure::Tree(tree("open", &path.display(), e))),
            Err(DirError::Missing) => Ok(None),
            Err(DirError::NotADir(name)) => Err(invalid(format!(
                "member {} goes through {:?}, which is not a directory (a symlink or a file)",
                path.display(),
                String::from_utf8_lossy(&name)
            ))),
            Err(DirError::Leaves) => Err(invalid(format!("member {} leaves the tree", path.display()))),
            Err(DirError::Io(step, source)) => Err(Failure::Tree(tree(step, &path.display(), source))),
        }
    }

    /// The directory holding `path`, made if missing.
    fn made_parent(&mut self, path: &MemberPath) -> Result<OwnedFd, Failure> {
        self.parent(path, true)?
            .ok_or_else(|| invalid(format!("member {}: its directory vanished", path.display())))
    }

    fn error(&self, step: &'static str, path: &MemberPath, source: io::Error) -> Failure {
        Failure::Tree(tree(step, &path.display(), source))
    }

    /// Removes whatever is at `name` in `dir` (a directory with its tree); nothing if absent.
    /// Returns the type that was there.
    fn clear(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        path: &MemberPath,
    ) -> Result<Option<FileType>, Failure> {
        let name = OsStr::from_bytes(name);
        let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(self.error("stat", path, e.into())),
        };
        let kind = FileType::from_raw_mode(st.st_mode);
        let removed = if kind == FileType::Directory {
            remove_tree_at(dir, name)
        } else {
            rustix::fs::unlinkat(dir, name, AtFlags::empty()).map_err(io::Error::from)
        };
        match removed {
            Ok(()) => Ok(Some(kind)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Some(kind)),
            Err(e) => Err(self.error("remove what was at", path, e)),
        }
    }

    fn set_meta(&self, fd: BorrowedFd<'_>, meta: &Meta, path: &MemberPath) -> Result<(), Failure> {
        // chown first: it clears setuid and setgid bits, which the chmod then sets.
        rustix::fs::fchown(fd, Some(meta.uid), Some(meta.gid))
            .and_then(|()| rustix::fs::fchmod(fd, Mode::from_raw_mode(meta.mode)))
            .map_err(|e| self.error("set the owner and mode of", path, e.into()))
    }

    fn directory(&mut self, path: &MemberPath, meta: &Meta) -> Result<(), Failure> {
        let Some(name) = path.name().map(<[u8]>::to_vec) else {
            let root = self
                .dirs
                .root()
                .try_clone_to_owned()
                .map_err(|e| self.error("open", path, e))?;
            return self.set_meta(root.as_fd(), meta, path);
        };
        let parent = self.made_parent(path)?;
        let fd = match self.dirs.open_dir(parent.as_fd(), &name) {
            Ok(fd) => fd,
            Err(DirError::Missing | DirError::NotADir(_)) => {
                self.clear(parent.as_fd(), &name, path)?;
                rustix::fs::mkdirat(&parent, OsStr::from_bytes(&name), Mode::from_raw_mode(0o700))
                    .map_err(|e| self.error("create the directory", path, e.into()))?;
                self.dirs
                    .open_dir(parent.as_fd(), &name)
                    .map_err(|_| invalid(format!("directory {} vanished", path.display())))?
            }
            Err(DirError::Leaves) => {
                return Err(invalid(format!("member {} leaves the tree", path.display())))
            }
            Err(DirError::Io(step, source)) => return Err(self.error(step, path, source)),
        };
        self.set_meta(fd.as_fd(), meta, path)
    }

    /// The final component of a member that is not a directory (the root cannot be one).
    fn leaf(path: &MemberPath) -> Result<Vec<u8>, Failure> {
        path.name()
            .map(<[u8]>::to_vec)
            .ok_or_else(|| invalid("the layer's root member `.` must be a directory".into()))
    }

    fn file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        path: &MemberPath,
        meta: &Meta,
    ) -> Result<(), Failure> {
        let name = Self::leaf(path)?;
        let size = entry.size();
        if size > self.limits.max_bytes.saturating_sub(self.state.read.get()) {
            return Err(Failure::Tree(ImageError::LayerTooLarge {
                reason: format!(
                    "member {} ({size} bytes) does not fit the layer limit of {} bytes",
                    path.display(),
                    self.limits.max_bytes
                ),
            }));
        }
        let parent = self.made_parent(path)?;
        self.clear(parent.as_fd(), &name, path)?;
        let fd = rustix::fs::openat(
            &parent,
            OsStr::from_bytes(&name),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| self.error("create the file", path, e.into()))?;
        let mut file = std::fs::File::from(fd);
        let mut copied = 0u64;
        let mut buf = std::mem::take(&mut self.buf);
        let result = loop {
            let n = match entry.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(Failure::Io(e)),
            };
            if let Err(e) = file.write_all(&buf[..n]) {
                break Err(self.error("write", path, e));
            }
            copied += n as u64;
        };
        self.buf = buf;
        result?;
        if copied != size {
            return Err(invalid(format!(
                "the layer is truncated: member {} has {copied} of its {size} bytes",
                path.display()
            )));
        }
        self.set_meta(file.as_fd(), meta, path)?;
        rustix::fs::futimens(&file, &times(meta.mtime))
            .map_err(|e| self.error("set the mtime of", path, e.into()))?;
        self.summary.data_bytes += size;
        Ok(())
    }

    fn symlink(&mut self, path: &MemberPath, target: &[u8], meta: &Meta) -> Result<(), Failure> {
        let name = Self::leaf(path)?;
        let parent = self.made_parent(path)?;
        self.clear(parent.as_fd(), &name, path)?;
        let name = OsStr::from_bytes(&name);
        rustix::fs::symlinkat(OsStr::from_bytes(target), &parent, name)
            .map_err(|e| self.error("create the symlink", path, e.into()))?;
        rustix::fs::chownat(
            &parent,
            name,
            Some(meta.uid),
            Some(meta.gid),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .and_then(|()| rustix::fs::utimensat(&parent, name, &times(meta.mtime), AtFlags::SYMLINK_NOFOLLOW))
        .map_err(|e| self.error("set the owner of", path, e.into()))
    }

    fn hard_link(&mut self, path: &MemberPath, target: &MemberPath) -> Result<(), Failure> {
        let name = Self::leaf(path)?;
        let not_a_file = || {
            invalid(format!(
                "hard link {} points to {}, which is not a regular file in the tree",
                path.display(),
                target.display()
            ))
        };
        let target_name = target.name().ok_or_else(not_a_file)?.to_vec();
        if target.key() == path.key() {
            return Err(invalid(format!("hard link {} points to itself", path.display())));
        }
        let target_dir = self.parent(target, false)?.ok_or_else(not_a_file)?;
        match rustix::fs::statat(
            &target_dir,
            OsStr::from_bytes(&target_name),
            AtFlags::SYMLINK_NOFOLLOW,
        ) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {}
            Ok(_) | Err(Errno::NOENT) => return Err(not_a_file()),
            Err(e) => return Err(self.error("stat the link target of", path, e.into())),
        }
        let parent = self.made_parent(path)?;
        self.clear(parent.as_fd(), &name, path)?;
        match rustix::fs::linkat(
            &target_dir,
            OsStr::from_bytes(&target_name),
            &parent,
            OsStr::from_bytes(&name),
            AtFlags::empty(),
        ) {
            Ok(()) => Ok(()),
            // Replacing the member removed the target (a directory holding it).
            Err(Errno::NOENT) => Err(not_a_file()),
            Err(e) => Err(self.error("create the hard link", path, e.into())),
        }
    }
}

/// Turns a failure into the error the caller gets: what the reader saw first (the input failed, a
/// limit was hit, the input ended early), then the failure itself.
fn classify(state: &InputState, failure: Failure, limits: &LayerLimits) -> ImageError {
    if state.source_failed.get() {
        return match failure {
            Failure::Io(e) => image_error(e).unwrap_or_else(|e| ImageError::Read {
                what: "read",
                path: "the layer stream".into(),
                source: e,
            }),
            Failure::Tree(e) => e,
            Failure::Invalid(reason) => ImageError::InvalidLayer { reason },
        };
    }
    if state.too_large.get() {
        return ImageError::LayerTooLarge {
            reason: format!("the layer is larger than the limit of {} bytes", limits.max_bytes),
        };
    }
    if state.metadata_too_large.get() {
        return ImageError::InvalidLayer {
            reason: format!("a member's headers are larger than {MAX_METADATA_BYTES} bytes"),
        };
    }
    match failure {
        Failure::Invalid(reason) => ImageError::InvalidLayer { reason },
        Failure::Tree(e) => e,
        Failure::Io(e) if state.eof.get() || e.kind() == io::ErrorKind::UnexpectedEof => {
            ImageError::InvalidLayer {
                reason: format!("the layer is truncated ({e})"),
            }
        }
        Failure::Io(e) => ImageError::InvalidLayer {
            reason: e.to_string(),
        },
    }
}

fn times((secs, nanos): (i64, u32)) -> Timestamps {
    let t = Timespec {
        tv_sec: secs,
        tv_nsec: i64::from(nanos),
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

//! Unpacking an untrusted tar stream into a fresh, empty staging subvolume.
//!
//! The archive decides nothing about where a byte lands. Member names are parsed first
//! (`untar/member_path.rs`: relative plain names only, `..` and absolute paths refused), then every
//! directory on the way is opened one component at a time from the tree's root with
//! `openat(O_DIRECTORY | O_NOFOLLOW)`, so a symlink member followed by a member "through" it is
//! refused instead of followed, and each new name is created with a call that never follows or
//! replaces anything (`openat(O_CREAT | O_EXCL | O_NOFOLLOW)`, `mkdirat`, `symlinkat`, `linkat`
//! without `AT_SYMLINK_FOLLOW`). A name that exists already is refused (duplicate members), except a
//! directory listed again (its metadata is updated), so nothing the import made is replaced behind its
//! back. Every directory opened is checked to be on the tree's own file system and mount
//! (`native/walk/`'s `Fs`). Directories get their times last, in one pass of the host side's walker
//! over the unpacked tree (creating entries changes a directory's mtime).
//!
//! Members: directories, regular files, symlinks (the target is stored verbatim: it is only ever
//! resolved inside a sandbox), hard links (only to a regular file an earlier member of the same
//! archive created), pax and GNU long-name headers (read by the tar crate) and pax global headers
//! (ignored). Device nodes, fifos, sparse files and anything else refuse the archive. Owners are
//! sandbox ids and must lie in the sandbox range (`0..count`); they become host ids `base + id`.
//! Permission bits are kept whole, setuid and setgid included: the volume is mounted `nosuid` in every
//! sandbox, sandboxes run with `no_new_privs`, and the ids are the sandbox range's, never host ones, so
//! the bits carry no privilege, while setgid directories keep their group-inheritance meaning.
//! Parent directories an archive does not list are created as the sandbox's root, mode 0755.
//!
//! Bounds: the archive's own bytes (headers included) are capped by [`ImportLimits::max_bytes`], its
//! member count by `max_entries`, and the bytes read to find one member (extension headers the tar
//! crate holds in memory) by [`MAX_METADATA_BYTES`]. A stream that ends without the end-of-archive
//! marker is truncated and refused; so is data after the marker that is not zero padding.
//!
//! Any refusal is an error; the caller removes the staging subvolume, so a refused archive leaves
//! nothing behind.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use paddock_sys::fs_in_root::open_dir_at;
use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid};
use rustix::io::Errno;
use tar::EntryType;

use super::{ImportLimits, TransferSummary};
use crate::native::untar::dirs::{DirError, TreeDirs};
use crate::native::untar::input::{check_end, pax_mtime, Input, InputState, MAX_METADATA_BYTES};
use crate::native::untar::member_path::{MemberPath, MAX_DEPTH};
use crate::native::untar::CHUNK;
use crate::native::walk::{walk_tree, WalkOptions, WalkStep};
use crate::native::IdRange;
use crate::RuntimeError;

type Failure = crate::native::untar::input::Failure<RuntimeError>;
/// The top-level directories a sandbox mounts from its volume (`/etc`, `/home`, `/root`, `/tmp`).
/// They must be real directories: the sandbox's setup binds them by path.
const VOLUME_DIRS: [(&str, u32); 4] = [("etc", 0o755), ("home", 0o755), ("root", 0o700), ("tmp", 0o1777)];

/// Unpacks the tar stream `input` into the empty directory `root` (the staging subvolume).
pub(crate) fn import_tree(
    root: &Path,
    ids: IdRange,
    input: &mut dyn Read,
    limits: &ImportLimits,
) -> Result<TransferSummary, RuntimeError> {
    let state = Rc::new(InputState::new(limits.max_bytes));
    let reader = Input {
        inner: input,
        state: state.clone(),
    };
    let mut importer = Importer::open(root, ids, limits, state.clone())?;
    let mut archive = tar::Archive::new(reader);
    let outcome = importer.unpack(&mut archive);
    let outcome = outcome.and_then(|()| {
        let mut reader = archive.into_inner();
        check_end(&mut reader, &state)
    });
    let summary = match outcome {
        Ok(()) => importer
            .finish()
            .map_err(|e| over_import_limit(e, limits.max_bytes))?,
        Err(e) => return Err(classify(&state, e, root)),
    };
    Ok(TransferSummary {
        bytes: state.read.get(),
        ..summary
    })
}

struct Importer<'a> {
    root_path: PathBuf,
    /// The root, and the open directories along the path of the last member's parent.
    dirs: TreeDirs,
    ids: IdRange,
    limits: &'a ImportLimits,
    state: Rc<InputState>,
    /// Keys of the regular files this import created: the only valid hard-link targets.
    files: HashSet<Vec<u8>>,
    /// Directories (by [`MemberPath::key`]) and their mtimes, set at the end (creating entries
    /// changes a directory's mtime). A directory listed again gets its last time.
    dir_times: HashMap<Vec<u8>, (i64, u32)>,
    summary: TransferSummary,
    buf: Vec<u8>,
}

/// A member's metadata, checked.
struct Meta {
    mode: u32,
    uid: Uid,
    gid: Gid,
    mtime: (i64, u32),
}

fn invalid(message: String) -> Failure {
    Failure::Invalid(message)
}

impl<'a> Importer<'a> {
    fn open(
        root: &Path,
        ids: IdRange,
        limits: &'a ImportLimits,
        state: Rc<InputState>,
    ) -> Result<Self, RuntimeError> {
        let fd = open_dir_at(rustix::fs::CWD, root).map_err(|e| tree_error(root, "open", e.into()))?;
        // Until the archive says otherwise, the root is the sandbox root's, like a template's.
        rustix::fs::fchown(&fd, Some(host_uid(ids, 0)), Some(host_gid(ids, 0)))
            .and_then(|()| rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o755)))
            .map_err(|e| tree_error(root, "chown", e.into()))?;
        Ok(Self {
            root_path: root.to_owned(),
            dirs: TreeDirs::new(fd, ids).map_err(|e| tree_error(root, "stat", e.into()))?,
            ids,
            limits,
            state,
            files: HashSet::new(),
            dir_times: HashMap::new(),
            summary: TransferSummary::default(),
            buf: vec![0; CHUNK],
        })
    }

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
                return Err(Failure::Tree(RuntimeError::ArchiveTooLarge(format!(
                    "the archive has more than {} members",
                    self.limits.max_entries
                ))));
            }
            self.member(&mut entry)?;
            // Whatever the member's data was not used for (a directory or link with a size) is
            // read past here, under the archive's byte cap.
            io::copy(&mut entry, &mut io::sink())?;
        }
    }

    fn member<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), Failure> {
        let kind = entry.header().entry_type();
        if kind == EntryType::XGlobalHeader {
            return Ok(());
        }
        let path = MemberPath::parse(&entry.path_bytes()).map_err(invalid)?;
        let meta = self.meta(entry, &path)?;
        match kind {
            EntryType::Directory => self.directory(&path, &meta),
            EntryType::Regular | EntryType::Continuous => self.file(entry, &path, &meta),
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| invalid(format!("symlink {} has no target", path.display())))?
                    .into_owned();
                self.symlink(&path, &target, &meta)
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| invalid(format!("hard link {} has no target", path.display())))?;
                let target = MemberPath::parse(&target).map_err(invalid)?;
                self.hard_link(&path, &target)
            }
            EntryType::Char | EntryType::Block => Err(invalid(format!(
                "member {} is a device node; snapshots cannot hold devices",
                path.display()
            ))),
            EntryType::Fifo => Err(invalid(format!(
                "member {} is a fifo; snapshots cannot hold fifos",
                path.display()
            ))),
            other => Err(invalid(format!(
                "member {} has an unsupported type ({:?})",
                path.display(),
                other.as_byte() as char
            ))),
        }
    }

    fn meta<R: Read>(&self, entry: &mut tar::Entry<'_, R>, path: &MemberPath) -> Result<Meta, Failure> {
        let header = entry.header();
        let field = |what: &str, e: io::Error| invalid(format!("member {}: bad {what}: {e}", path.display()));
        let mode = header.mode().map_err(|e| field("mode", e))? & 0o7777;
        // The tar crate has already applied pax `uid` / `gid` records to the header.
        let uid = header.uid().map_err(|e| field("uid", e))?;
        let gid = header.gid().map_err(|e| field("gid", e))?;
        let header_mtime = (
            i64::try_from(header.mtime().map_err(|e| field("mtime", e))?).unwrap_or(i64::MAX),
            0,
        );
        for id in [uid, gid] {
            if id >= u64::from(self.ids.count) {
                return Err(invalid(format!(
                    "member {} is owned by id {id}, outside the sandbox id range 0..{}",
                    path.display(),
                    self.ids.count
                )));
            }
        }
        let mtime = pax_mtime(entry, path, header_mtime, "which imports do not support")?;
        Ok(Meta {
            mode,
            uid: host_uid(self.ids, uid as u32),
            gid: host_gid(self.ids, gid as u32),
            mtime,
        })
    }

    fn error(&self, step: &str, path: &MemberPath, source: io::Error) -> Failure {
        Failure::Tree(tree_error(&self.root_path.join(path.display()), step, source))
    }

    /// The open directory that holds `path`, creating missing directories on the way; a component
    /// that is not a directory (a symlink, a file) refuses the member.
    fn parent(&mut self, path: &MemberPath) -> Result<BorrowedFd<'_>, Failure> {
        let root_path = &self.root_path;
        self.dirs
            .parent(path, true)
            .map_err(|e| dir_failure(root_path, e, path))
    }

    fn set_meta(&self, fd: BorrowedFd<'_>, meta: &Meta, path: &MemberPath) -> Result<(), Failure> {
        // chown first: it clears setuid and setgid bits, which the chmod then sets.
        rustix::fs::fchown(fd, Some(meta.uid), Some(meta.gid))
            .and_then(|()| rustix::fs::fchmod(fd, Mode::from_raw_mode(meta.mode)))
            .map_err(|e| self.error("set the owner and mode of", path, e.into()))
    }

    fn directory(&mut self, path: &MemberPath, meta: &Meta) -> Result<(), Failure> {
        if path.is_root() {
            let root = self
                .dirs
                .root()
                .try_clone_to_owned()
                .map_err(|e| self.error("open", path, e))?;
            self.set_meta(root.as_fd(), meta, path)?;
        } else {
            let name = path.name().unwrap_or_default().to_vec();
            let parent = self.parent(path)?;
            let parent = parent
                .try_clone_to_owned()
                .map_err(|e| self.error("open", path, e))?;
            let fd = match rustix::fs::mkdirat(&parent, OsStr::from_bytes(&name), Mode::from_raw_mode(0o700))
            {
                Ok(()) | Err(Errno::EXIST) => {
                    self.dirs.open_dir(parent.as_fd(), &name).map_err(|e| match e {
                        DirError::NotADir(_) | DirError::Leaves => invalid(format!(
                            "member {} is a directory, but an earlier member of that name is not",
                            path.display()
                        )),
                        other => dir_failure(&self.root_path, other, path),
                    })?
                }
                Err(e) => return Err(self.error("create the directory", path, e.into())),
            };
            self.set_meta(fd.as_fd(), meta, path)?;
        }
        self.dir_times.insert(path.key(), meta.mtime);
        Ok(())
    }

    fn file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        path: &MemberPath,
        meta: &Meta,
    ) -> Result<(), Failure> {
        let name = self.leaf(path)?;
        let size = entry.size();
        // Refused before anything is written when the member alone cannot fit.
        if size > self.limits.max_bytes.saturating_sub(self.state.read.get()) {
            return Err(Failure::Tree(RuntimeError::ArchiveTooLarge(format!(
                "member {} ({size} bytes) does not fit the import limit of {} bytes",
                path.display(),
                self.limits.max_bytes
            ))));
        }
        let parent = self.parent(path)?;
        let fd = match rustix::fs::openat(
            parent,
            OsStr::from_bytes(&name),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => fd,
            Err(Errno::EXIST) => return Err(duplicate(path)),
            Err(e) => return Err(self.error("create the file", path, e.into())),
        };
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
                "the archive is truncated: member {} has {copied} of its {size} bytes",
                path.display()
            )));
        }
        self.set_meta(file.as_fd(), meta, path)?;
        rustix::fs::futimens(&file, &times(meta.mtime))
            .map_err(|e| self.error("set the mtime of", path, e.into()))?;
        self.files.insert(path.key());
        self.summary.data_bytes += size;
        Ok(())
    }

    fn symlink(&mut self, path: &MemberPath, target: &[u8], meta: &Meta) -> Result<(), Failure> {
        let name = self.leaf(path)?;
        let parent = self
            .parent(path)?
            .try_clone_to_owned()
            .map_err(|e| self.error("open", path, e))?;
        let name = OsStr::from_bytes(&name);
        match rustix::fs::symlinkat(OsStr::from_bytes(target), &parent, name) {
            Ok(()) => {}
            Err(Errno::EXIST) => return Err(duplicate(path)),
            Err(e) => return Err(self.error("create the symlink", path, e.into())),
        }
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
        if !self.files.contains(&target.key()) {
            return Err(invalid(format!(
                "hard link {} points to {}, which is not a regular file earlier in the archive",
                path.display(),
                target.display()
            )));
        }
        let name = self.leaf(path)?;
        let target_name = target.name().unwrap_or_default().to_vec();
        let target_dir = self
            .parent(target)?
            .try_clone_to_owned()
            .map_err(|e| self.error("open", path, e))?;
        let st = rustix::fs::statat(
            &target_dir,
            OsStr::from_bytes(&target_name),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| self.error("stat the link target of", path, e.into()))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(invalid(format!(
                "hard link {} does not point to a file",
                path.display()
            )));
        }
        let parent = self.parent(path)?;
        match rustix::fs::linkat(
            &target_dir,
            OsStr::from_bytes(&target_name),
            parent,
            OsStr::from_bytes(&name),
            AtFlags::empty(),
        ) {
            Ok(()) => Ok(()),
            Err(Errno::EXIST) => Err(duplicate(path)),
            Err(e) => Err(self.error("create the hard link", path, e.into())),
        }
    }

    /// The final component of a member that is not a directory (the root cannot be one).
    fn leaf(&self, path: &MemberPath) -> Result<Vec<u8>, Failure> {
        path.name()
            .map(<[u8]>::to_vec)
            .ok_or_else(|| invalid("the archive's root member `.` must be a directory".into()))
    }

    /// The top-level directories a sandbox needs, then the directories' mtimes: one walk of the
    /// unpacked tree (which nothing but this import writes), setting each listed directory's time.
    fn finish(mut self) -> Result<TransferSummary, RuntimeError> {
        self.dirs.forget();
        let root = self.dirs.root();
        for (name, mode) in VOLUME_DIRS {
            match rustix::fs::statat(root, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {}
                Ok(_) => {
                    return Err(RuntimeError::InvalidArchive(format!(
                        "member {name} must be a directory: a sandbox's /{name} is mounted from it"
                    )))
                }
                Err(Errno::NOENT) => {
                    let fail = |e: Errno| tree_error(&self.root_path.join(name), "create", e.into());
                    rustix::fs::mkdirat(root, name, Mode::from_raw_mode(0o700)).map_err(fail)?;
                    let fd = open_dir_at(root, name).map_err(fail)?;
                    rustix::fs::fchown(&fd, Some(host_uid(self.ids, 0)), Some(host_gid(self.ids, 0)))
                        .and_then(|()| rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)))
                        .map_err(fail)?;
                }
                Err(e) => return Err(tree_error(&self.root_path.join(name), "stat", e.into())),
            }
        }
        let dir_times = std::mem::take(&mut self.dir_times);
        let root_path = &self.root_path;
        let set_time_failed = |rel: &[u8], e: Errno| {
            let path = root_path.join(OsStr::from_bytes(rel));
            tree_error(&path, "set the mtime of", e.into())
        };
        if let Some(&mtime) = dir_times.get(&b""[..]) {
            rustix::fs::futimens(root, &times(mtime)).map_err(|e| set_time_failed(b"", e))?;
        }
        let options = WalkOptions { max_depth: MAX_DEPTH };
        walk_tree(root, &options, |e| {
            if e.file_type() != FileType::Directory {
                return Ok(WalkStep::Continue);
            }
            if let Some(&mtime) = dir_times.get(e.path) {
                rustix::fs::utimensat(e.dir, e.name, &times(mtime), AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|err| set_time_failed(e.path, err))?;
            }
            Ok(WalkStep::Descend)
        })
        .map_err(|stopped| {
            stopped.into_error(|e| tree_error(&root_path.join(OsStr::from_bytes(&e.path)), e.step, e.source))
        })?;
        Ok(self.summary)
    }
}

/// Turns a failure into the error the caller answers with: what the reader saw first (the input
/// failed, a limit was hit, the input ended early), then the failure itself. A write into `root`
/// that found the pool full is the pool's failure, not the archive's; one over the staging
/// subvolume's own disk limit is the import's (see [`over_import_limit`]).
fn classify(state: &InputState, failure: Failure, root: &Path) -> RuntimeError {
    if state.source_failed.get() {
        let source = match failure {
            Failure::Io(e) => e,
            other => io::Error::other(format!("{other:?}")),
        };
        return RuntimeError::Stream { what: "read", source };
    }
    if state.too_large.get() {
        return RuntimeError::ArchiveTooLarge(format!(
            "the archive is larger than the import limit of {} bytes",
            state.max_bytes
        ));
    }
    if state.metadata_too_large.get() {
        return RuntimeError::InvalidArchive(format!(
            "a member's headers are larger than {MAX_METADATA_BYTES} bytes"
        ));
    }
    match failure {
        Failure::Io(e) if e.kind() == io::ErrorKind::QuotaExceeded => over_import_limit(
            RuntimeError::Pool {
                what: "write the imported files into",
                path: root.to_owned(),
                source: e,
            },
            state.max_bytes,
        ),
        Failure::Io(e) if e.kind() == io::ErrorKind::StorageFull => RuntimeError::Pool {
            what: "write the imported files into",
            path: root.to_owned(),
            source: e,
        },
        Failure::Invalid(message) => RuntimeError::InvalidArchive(message),
        Failure::Tree(e) => over_import_limit(e, state.max_bytes),
        Failure::Io(e) if state.eof.get() || e.kind() == io::ErrorKind::UnexpectedEof => {
            RuntimeError::InvalidArchive(format!("the archive is truncated ({e})"))
        }
        // Everything else the tar crate reports is about the archive's structure (checksums,
        // numeric fields, sizes).
        Failure::Io(e) => RuntimeError::InvalidArchive(e.to_string()),
    }
}

/// `EDQUOT` from the staging subvolume is its qgroup's limit, which is the import's byte limit (no
/// other qgroup holds it): the import is too large, whichever step met it. btrfs reserves room for
/// a step's metadata before the step, so a file's creation or a directory's times can meet the limit
/// while the archive reader is still a little below it; the answer must not then depend on which
/// of the two came first (a tenant's import over its storage quota is that, not a full pool).
pub(super) fn over_import_limit(e: RuntimeError, max_bytes: u64) -> RuntimeError {
    match e {
        RuntimeError::Pool { what, path, source } if source.kind() == io::ErrorKind::QuotaExceeded => {
            RuntimeError::ArchiveTooLarge(format!(
                "the unpacked files exceed the import limit of {max_bytes} bytes ({what} {}: {source})",
                path.display()
            ))
        }
        other => other,
    }
}

/// A member's directory that could not be reached, as the import answers it.
fn dir_failure(root_path: &Path, e: DirError, path: &MemberPath) -> Failure {
    match e {
        DirError::Missing => Failure::Io(io::ErrorKind::NotFound.into()),
        DirError::NotADir(name) => invalid(format!(
            "member {} goes through {:?}, which is not a directory (a symlink or a file)",
            path.display(),
            String::from_utf8_lossy(&name)
        )),
        DirError::Leaves => invalid(format!("member {} leaves the snapshot", path.display())),
        DirError::Io(step, source) => {
            Failure::Tree(tree_error(&root_path.join(path.display()), step, source))
        }
    }
}

fn duplicate(path: &MemberPath) -> Failure {
    Failure::Invalid(format!(
        "member {} appears twice (or over a directory of that name)",
        path.display()
    ))
}

fn tree_error(path: &Path, step: &str, source: io::Error) -> RuntimeError {
    RuntimeError::Pool {
        what: "import into",
        path: path.to_owned(),
        source: io::Error::new(source.kind(), format!("{step}: {source}")),
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

fn host_uid(ids: IdRange, id: u32) -> Uid {
    Uid::from_raw(ids.host_uid(id))
}

fn host_gid(ids: IdRange, id: u32) -> Gid {
    Gid::from_raw(ids.host_gid(id))
}

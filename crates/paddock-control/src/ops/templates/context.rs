//! A recipe's build context: the files `COPY` and `ADD` take, uploaded as one tar (plain or gzip)
//! and kept, decompressed, beside the build's pulled image until the build ends.
//!
//! The upload is hostile input. It is stored as bytes (bounded) and indexed by reading it as a
//! tar: member names are normalised (`./` dropped) and one with `..`, an absolute name or a NUL is
//! refused; hard links, devices and fifos are refused; every regular file's data is hashed, so a
//! step's cache key covers what it copies. Nothing is ever created on the host under a member's
//! name: the files are written into the step's sandbox by its agent, which resolves paths inside
//! the sandbox.
//!
//! Selection follows docker's `COPY`: a source is a path in the context (wildcards `*`, `?` and
//! `[...]` within a name), `.` the whole context; a directory's contents are copied into the
//! destination; a file goes to the destination itself, or into it when the destination ends with
//! `/` (required for several sources). Symbolic links are copied as links (never followed here).
//! An archive `ADD` names is unpacked as a context of its own (`unpack`, the same checks).
//! What this module does not do: read bzip2, xz or zstd archives, or fetch URLs.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

/// Most members of a build context.
const MAX_MEMBERS: u64 = 200_000;

/// What a context member is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A regular file: where its data starts in the stored tar, its size and its SHA-256.
    File {
        offset: u64,
        size: u64,
        sha256: String,
    },
    Dir,
    /// A symbolic link and what it points at (as stored: it resolves in the sandbox, when used).
    Symlink {
        target: String,
    },
}

/// One member of the context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) kind: Kind,
    /// Permission bits (`0o777`: set-id and sticky bits are not copied).
    pub(crate) mode: u32,
}

/// One thing a `COPY` makes: a directory, a file (a member's data) or a link at an absolute path.
#[derive(Debug, Clone)]
pub(crate) struct Placed {
    /// Absolute, normalised.
    pub(crate) dest: String,
    /// The member it comes from.
    pub(crate) name: String,
    pub(crate) member: Member,
    /// The archive its data is in, when not the context selected from (an archive `ADD` unpacks).
    pub(crate) from: Option<std::sync::Arc<Context>>,
}

/// What a file's first bytes say it is, for `ADD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArchiveKind {
    /// Not an archive: copied as it is.
    None,
    /// A tar archive, plain or gzip-compressed: unpacked.
    Tar,
    /// An archive in a compression this server does not read (bzip2, xz, zstd).
    Unsupported(&'static str),
}

/// A stored, indexed build context.
#[derive(Debug)]
pub(crate) struct Context {
    path: PathBuf,
    members: BTreeMap<String, Member>,
    /// Every member's name and every directory implied by one (computed once: selections scan
    /// it, whatever the recipe's patterns).
    names: BTreeSet<String>,
}

/// Why a context is refused (its message names the member).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ContextError {
    #[error("the build context is larger than {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("the build context is not a readable tar archive: {0}")]
    Invalid(String),
    #[error("could not store the build context: {0}")]
    Io(#[source] io::Error),
}

/// A reader that fails once more than `left` bytes were read through it.
struct Bounded<R> {
    inner: R,
    left: u64,
    limit: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self.left.checked_sub(n as u64).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("more than {} bytes", self.limit),
            )
        })?;
        Ok(n)
    }
}

fn too_large(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::FileTooLarge
}

/// `name` as a relative path without `.` components, or why not.
fn normalise(name: &str) -> Result<String, String> {
    if name.contains('\0') || name.starts_with('/') {
        return Err(format!("member {name:?}: absolute names are refused"));
    }
    let mut parts = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(format!("member {name:?}: `..` is refused")),
            other => parts.push(other),
        }
    }
    Ok(parts.join("/"))
}

impl Context {
    /// Stores `input` (a tar, plain or gzip-compressed) decompressed at `path` (created; at most
    /// `max_bytes`), then indexes it.
    pub(crate) fn receive(input: &mut dyn Read, path: &Path, max_bytes: u64) -> Result<Self, ContextError> {
        let mut head = [0u8; 2];
        let mut got = 0;
        while got < 2 {
            match input.read(&mut head[got..]).map_err(ContextError::Io)? {
                0 => break,
                n => got += n,
            }
        }
        let rest = io::Cursor::new(head[..got].to_vec()).chain(input);
        let source: Box<dyn Read + '_> = if got == 2 && head == [0x1f, 0x8b] {
            Box::new(flate2::read::MultiGzDecoder::new(rest))
        } else {
            Box::new(rest)
        };
        let mut bounded = Bounded {
            inner: source,
            left: max_bytes,
            limit: max_bytes,
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(ContextError::Io)?;
        io::copy(&mut bounded, &mut file).map_err(|e| {
            if too_large(&e) {
                ContextError::TooLarge { limit: max_bytes }
            } else {
                ContextError::Invalid(e.to_string())
            }
        })?;
        file.flush().map_err(ContextError::Io)?;
        let members = index(path)?;
        let mut names = BTreeSet::new();
        for name in members.keys() {
            let mut prefix = String::new();
            for part in name.split('/') {
                if !prefix.is_empty() {
                    prefix.push('/');
                }
                prefix.push_str(part);
                names.insert(prefix.clone());
            }
        }
        Ok(Self {
            path: path.to_owned(),
            members,
            names,
        })
    }

    /// The bytes of the regular file `name` (at most `max` bytes), if the context has one.
    pub(crate) fn read_file(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>, String> {
        let name = normalise(name)?;
        let Some(Member {
            kind: Kind::File { offset, size, .. },
            ..
        }) = self.members.get(&name)
        else {
            return Ok(None);
        };
        if *size > max {
            return Err(format!("{name} is larger than {max} bytes"));
        }
        let mut data = vec![0u8; *size as usize];
        let mut file = self.open_at(*offset).map_err(|e| e.to_string())?;
        file.read_exact(&mut data).map_err(|e| e.to_string())?;
        Ok(Some(data))
    }

    /// What the regular file `member` is, by its first bytes (as docker's `ADD` tells archives).
    pub(crate) fn archive_kind(&self, member: &Member) -> io::Result<ArchiveKind> {
        let Kind::File { offset, size, .. } = member.kind else {
            return Ok(ArchiveKind::None);
        };
        let mut head = vec![0u8; size.min(512) as usize];
        self.open_at(offset)?.read_exact(&mut head)?;
        let gzip = head.starts_with(&[0x1f, 0x8b]);
        let tar = head.len() >= 262 && &head[257..262] == b"ustar";
        Ok(if gzip || tar {
            ArchiveKind::Tar
        } else if head.starts_with(b"BZh") {
            ArchiveKind::Unsupported("bzip2")
        } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
            ArchiveKind::Unsupported("xz")
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            ArchiveKind::Unsupported("zstd")
        } else {
            ArchiveKind::None
        })
    }

    /// Unpacks the archive `member` (a regular file of this context: plain or gzip tar) as a
    /// context of its own, stored beside this one as `<name>` (at most `max_bytes`), read as
    /// hostilely as an upload.
    pub(crate) fn unpack(&self, member: &Member, name: &str, max_bytes: u64) -> Result<Self, ContextError> {
        let Kind::File { offset, size, .. } = member.kind else {
            return Err(ContextError::Invalid("not a file".into()));
        };
        let mut data = self.open_at(offset).map_err(ContextError::Io)?.take(size);
        Self::receive(&mut data, &self.path.with_file_name(name), max_bytes)
    }

    /// Everything in this context, placed under the directory `dest` (what `ADD` of an archive
    /// makes), reading from this context.
    pub(crate) fn place_all(self: &std::sync::Arc<Self>, dest: &str) -> Result<Vec<Placed>, String> {
        let mut placed = BTreeMap::new();
        self.place_tree("", dest.trim_end_matches('/'), &mut placed)?;
        Ok(placed
            .into_values()
            .map(|p| Placed {
                from: Some(self.clone()),
                ..p
            })
            .collect())
    }

    /// The stored tar, positioned at `offset` (a member's data).
    pub(crate) fn open_at(&self, offset: u64) -> io::Result<File> {
        let mut file = File::open(&self.path)?;
        file.seek(SeekFrom::Start(offset))?;
        Ok(file)
    }

    /// What `COPY sources dest` makes, in order (parents before children), or why it cannot.
    pub(crate) fn select(&self, sources: &[String], dest: &str) -> Result<Vec<Placed>, String> {
        let into_dir = dest.ends_with('/') || sources.len() > 1;
        let dest_root = dest.trim_end_matches('/');
        let mut placed: BTreeMap<String, Placed> = BTreeMap::new();
        for source in sources {
            let matches = self.matching(source);
            if matches.is_empty() {
                return Err(format!("{source}: not found in the build context"));
            }
            let several = matches.len() > 1;
            for name in matches {
                let dir = name.is_empty() || self.is_dir(&name);
                if dir {
                    // Its contents go into the destination.
                    self.place_tree(&name, dest_root, &mut placed)?;
                    continue;
                }
                let member = &self.members[&name];
                let base = name.rsplit('/').next().unwrap_or(&name);
                let target = if into_dir || several {
                    join(dest_root, base)
                } else {
                    dest_root.to_owned()
                };
                self.place(&name, member, target, &mut placed)?;
            }
        }
        Ok(placed.into_values().collect())
    }

    /// A cache key part for `placed`: every destination with its kind, mode and content digest.
    pub(crate) fn digest(placed: &[Placed]) -> String {
        let mut h = Sha256::new();
        for p in placed {
            h.update(p.dest.as_bytes());
            h.update([0]);
            match &p.member.kind {
                Kind::File { sha256, .. } => {
                    h.update(b"f");
                    h.update(sha256.as_bytes());
                }
                Kind::Dir => h.update(b"d"),
                Kind::Symlink { target } => {
                    h.update(b"l");
                    h.update(target.as_bytes());
                }
            }
            h.update(p.member.mode.to_le_bytes());
        }
        hex::encode(h.finalize())
    }

    fn is_dir(&self, name: &str) -> bool {
        match self.members.get(name) {
            Some(m) => m.kind == Kind::Dir,
            // A directory the tar names only through its members.
            None => {
                let prefix = format!("{name}/");
                self.members
                    .range(prefix.clone()..)
                    .next()
                    .is_some_and(|(k, _)| k.starts_with(&prefix))
            }
        }
    }

    /// Names matching the source pattern (`""` for the whole context).
    fn matching(&self, source: &str) -> Vec<String> {
        let Ok(pattern) = normalise(source) else {
            return Vec::new();
        };
        if pattern.is_empty() {
            return vec![String::new()];
        }
        let parts: Vec<&str> = pattern.split('/').collect();
        let mut found: Vec<String> = Vec::new();
        for name in &self.names {
            let components: Vec<&str> = name.split('/').collect();
            if components.len() == parts.len() && parts.iter().zip(&components).all(|(p, c)| glob(p, c)) {
                found.push(name.clone());
            }
        }
        found
    }

    fn place_tree(&self, dir: &str, dest: &str, placed: &mut BTreeMap<String, Placed>) -> Result<(), String> {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        // (Names under a prefix are contiguous in byte order.)
        for name in self
            .names
            .range(prefix.clone()..)
            .take_while(|n| n.starts_with(&prefix))
        {
            let Some(rest) = name.strip_prefix(&prefix).filter(|r| !r.is_empty()) else {
                continue;
            };
            let member = self.members.get(name).cloned().unwrap_or(Member {
                kind: Kind::Dir,
                mode: 0o755,
            });
            self.place(name, &member, join(dest, rest), placed)?;
        }
        Ok(())
    }

    fn place(
        &self,
        name: &str,
        member: &Member,
        dest: String,
        placed: &mut BTreeMap<String, Placed>,
    ) -> Result<(), String> {
        let dest = if dest.is_empty() { "/".to_owned() } else { dest };
        placed.insert(
            dest.clone(),
            Placed {
                dest,
                name: name.to_owned(),
                member: member.clone(),
                from: None,
            },
        );
        Ok(())
    }
}

fn join(dir: &str, rest: &str) -> String {
    format!("{}/{rest}", dir.trim_end_matches('/'))
}

/// Whether `name` matches the shell pattern `pattern` (`*`, `?`, `[...]`, `\x`; no `/` in
/// either). In time proportional to their lengths' product, whatever the pattern (it is the
/// tenant's): a `*` is backtracked to, never recursed into.
fn glob(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    // The last `*` seen and where in the name its match would end next.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if p.get(pi) == Some(&'*') {
            star = Some((pi, ni));
            pi += 1;
            continue;
        }
        if let Some(next) = one(&p, pi, n[ni]) {
            pi = next;
            ni += 1;
            continue;
        }
        match star {
            Some((sp, sn)) => {
                pi = sp + 1;
                ni = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Whether the pattern item at `p[i]` (not `*`) matches `c`; where the next item starts if so.
fn one(p: &[char], i: usize, c: char) -> Option<usize> {
    match *p.get(i)? {
        '?' => Some(i + 1),
        '\\' if i + 1 < p.len() => (p[i + 1] == c).then_some(i + 2),
        '[' => {
            let Some(end) = p[i + 1..].iter().position(|&x| x == ']').map(|e| i + 1 + e) else {
                return (c == '[').then_some(i + 1);
            };
            let class = &p[i + 1..end];
            let (negate, class) = match class.first() {
                Some('!') | Some('^') => (true, &class[1..]),
                _ => (false, class),
            };
            let mut hit = false;
            let mut k = 0;
            while k < class.len() {
                if k + 2 < class.len() && class[k + 1] == '-' {
                    hit |= class[k] <= c && c <= class[k + 2];
                    k += 3;
                } else {
                    hit |= class[k] == c;
                    k += 1;
                }
            }
            (hit != negate).then_some(end + 1)
        }
        x => (x == c).then_some(i + 1),
    }
}

/// Reads the stored tar's members.
fn index(path: &Path) -> Result<BTreeMap<String, Member>, ContextError> {
    let file = File::open(path).map_err(ContextError::Io)?;
    let mut archive = tar::Archive::new(BufReader::new(file));
    let mut members = BTreeMap::new();
    let entries = archive
        .entries()
        .map_err(|e| ContextError::Invalid(e.to_string()))?;
    for (count, entry) in entries.enumerate() {
        if count as u64 >= MAX_MEMBERS {
            return Err(ContextError::Invalid(format!("more than {MAX_MEMBERS} members")));
        }
        let mut entry = entry.map_err(|e| ContextError::Invalid(e.to_string()))?;
        let raw = entry.path_bytes().into_owned();
        let raw = String::from_utf8(raw)
            .map_err(|_| ContextError::Invalid("a member's name is not UTF-8".into()))?;
        let name = normalise(&raw).map_err(ContextError::Invalid)?;
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        let kind = match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let offset = entry.raw_file_position();
                let size = entry.size();
                let mut h = Sha256::new();
                let copied = io::copy(&mut entry, &mut HashWriter(&mut h))
                    .map_err(|e| ContextError::Invalid(format!("{raw}: {e}")))?;
                if copied != size {
                    return Err(ContextError::Invalid(format!("{raw}: truncated")));
                }
                Kind::File {
                    offset,
                    size,
                    sha256: hex::encode(h.finalize()),
                }
            }
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let target = String::from_utf8(target)
                    .map_err(|_| ContextError::Invalid(format!("{raw}: a link target that is not UTF-8")))?;
                if target.is_empty() || target.contains('\0') {
                    return Err(ContextError::Invalid(format!("{raw}: a link to nothing")));
                }
                Kind::Symlink { target }
            }
            // PAX and GNU long-name records are read by the tar crate itself.
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => continue,
            other => {
                return Err(ContextError::Invalid(format!(
                "{raw}: {other:?} members are refused (regular files, directories and symbolic links only)"
            )))
            }
        };
        if name.is_empty() {
            continue;
        }
        members.insert(name, Member { kind, mode });
    }
    Ok(members)
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;

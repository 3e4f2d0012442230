//! Export and import of plain directories (no pool, no btrfs): a round trip keeps everything the
//! format promises, and hostile archives are refused without touching anything outside the target.
//! Owners need root (chown); without it the tests skip, loudly.

use std::collections::BTreeMap;
use std::fs;
use std::io::Cursor;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use super::export::export_tree;
use super::import::{import_tree, over_import_limit};
use super::{staging_disk_limit, ExportOptions, ImportLimits, TransferSummary};
use crate::native::IdRange;
use crate::RuntimeError;

const IDS: IdRange = IdRange {
    base: 1_000_000_000,
    count: 65_536,
};

fn root_or_skip() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    eprintln!("SKIPPED: transfer tests need root (files owned by sandbox ids)");
    false
}

fn own(path: &Path, id: u32) {
    rustix::fs::chownat(
        rustix::fs::CWD,
        path,
        Some(rustix::fs::Uid::from_raw(IDS.base + id)),
        Some(rustix::fs::Gid::from_raw(IDS.base + id)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .expect("chown");
}

/// Everything the archive carries about a tree: per path, its kind, mode, owner, mtime, content or
/// target, and which paths share an inode.
fn describe(root: &Path) -> BTreeMap<Vec<u8>, String> {
    describe_with_base(root, IDS.base)
}

/// [`describe`] with owners shown relative to `base` (0 for a tree unpacked with sandbox ids).
fn describe_with_base(root: &Path, base: u32) -> BTreeMap<Vec<u8>, String> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            let rel = path
                .strip_prefix(root)
                .expect("inside")
                .as_os_str()
                .as_bytes()
                .to_vec();
            let m = fs::symlink_metadata(&path).expect("lstat");
            let what = if m.file_type().is_symlink() {
                format!("link {:?}", fs::read_link(&path).expect("readlink"))
            } else if m.is_dir() {
                stack.push(path.clone());
                "dir".to_owned()
            } else {
                let first = inodes.entry(m.ino()).or_insert_with(|| rel.clone()).clone();
                let data = fs::read(&path).expect("read");
                let sum = data
                    .iter()
                    .fold(0u64, |h, &b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
                format!(
                    "file len={} sum={sum:x} first={:?}",
                    data.len(),
                    String::from_utf8_lossy(&first)
                )
            };
            let mode = if m.file_type().is_symlink() {
                0
            } else {
                m.mode() & 0o7777
            };
            out.insert(
                rel,
                format!(
                    "{what} mode={mode:o} uid={} gid={} mtime={}.{}",
                    m.uid().wrapping_sub(base),
                    m.gid().wrapping_sub(base),
                    m.mtime(),
                    m.mtime_nsec()
                ),
            );
        }
    }
    out
}

fn sample_tree(dir: &Path) {
    for d in ["etc", "home/user/empty", "home/user/shared", "root", "tmp"] {
        fs::create_dir_all(dir.join(d)).expect("mkdir");
    }
    fs::write(dir.join("etc/passwd"), "root:x:0:0::/root:/bin/sh\n").expect("write");
    fs::write(dir.join("home/user/run.sh"), "#!/bin/sh\necho hi\n").expect("write");
    fs::write(dir.join("home/user/big"), vec![7u8; 300_000]).expect("write");
    fs::write(dir.join("home/user/ünïcödé"), "u").expect("write");
    fs::write(dir.join(OsStr::from_bytes(b"home/user/not-utf8-\xff")), "x").expect("write");
    let long = "d".repeat(120);
    fs::create_dir_all(dir.join("home/user").join(&long)).expect("long dir");
    fs::write(dir.join("home/user").join(&long).join("f".repeat(120)), "long").expect("write");
    fs::hard_link(
        dir.join("home/user/run.sh"),
        dir.join("home/user/shared/run-again.sh"),
    )
    .expect("link");
    symlink("/etc/passwd", dir.join("home/user/abs")).expect("symlink");
    symlink("../user/run.sh", dir.join("home/user/shared/rel")).expect("symlink");
    symlink("x".repeat(150), dir.join("home/user/long-target")).expect("symlink");
    let modes = [
        ("home/user/run.sh", 0o4755),
        ("home/user/shared", 0o2775),
        ("tmp", 0o1777),
        ("root", 0o700),
        ("home/user/big", 0o600),
    ];
    for (p, mode) in modes {
        fs::set_permissions(dir.join(p), fs::Permissions::from_mode(mode)).expect("chmod");
    }
    for (path, _) in describe(dir) {
        own(&dir.join(OsStr::from_bytes(&path)), 0);
    }
    own(dir, 0);
    for entry in [
        "home/user",
        "home/user/big",
        "home/user/abs",
        "home/user/shared/rel",
    ] {
        own(&dir.join(entry), 1000);
    }
    // chown clears setuid: set the modes again.
    for (p, mode) in modes {
        fs::set_permissions(dir.join(p), fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let t = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: 1_600_000_000,
            tv_nsec: 123_456_789,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: 1_600_000_000,
            tv_nsec: 123_456_789,
        },
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        dir.join("home/user/big"),
        &t,
        rustix::fs::AtFlags::empty(),
    )
    .expect("utimensat");
    rustix::fs::utimensat(
        rustix::fs::CWD,
        dir.join("home/user/empty"),
        &t,
        rustix::fs::AtFlags::empty(),
    )
    .expect("utimensat");
}

use std::ffi::OsStr;

fn import(
    archive: &[u8],
    limits: &ImportLimits,
) -> (tempfile::TempDir, Result<TransferSummary, RuntimeError>) {
    let target = tempfile::tempdir().expect("tempdir");
    let result = import_tree(target.path(), IDS, &mut Cursor::new(archive), limits);
    (target, result)
}

#[test]
fn round_trip_keeps_the_tree() {
    if !root_or_skip() {
        return;
    }
    let src = tempfile::tempdir().expect("tempdir");
    sample_tree(src.path());
    let mut archive = Vec::new();
    let keep = ExportOptions { keep_setid: true };
    let exported = export_tree(src.path(), IDS, &keep, &mut archive).expect("export");
    assert_eq!(exported.bytes, archive.len() as u64);
    assert_eq!(exported.setid_cleared, 0);
    assert_eq!(archive.len() % 512, 0);
    gnu_tar_reads(&archive, src.path());
    let (dst, imported) = import(&archive, &ImportLimits::default());
    let imported = imported.expect("import");
    assert_eq!(imported.bytes, archive.len() as u64);
    assert_eq!(imported.entries, exported.entries);
    let (got, want) = (describe(dst.path()), describe(src.path()));
    for (path, w) in &want {
        assert_eq!(got.get(path), Some(w), "{}", String::from_utf8_lossy(path));
    }
    assert_eq!(got.len(), want.len());
}

/// By default an export clears setuid and setgid bits (a setuid file owned by the sandbox's root
/// would unpack as a setuid-root program for a host root extracting with `tar -p`), says how many it
/// cleared, and keeps everything else of the mode (the sticky bit included) and the owners.
#[test]
fn an_export_clears_set_id_bits_unless_asked() {
    if !root_or_skip() {
        return;
    }
    let src = tempfile::tempdir().expect("tempdir");
    sample_tree(src.path());
    let mut archive = Vec::new();
    let exported = export_tree(src.path(), IDS, &ExportOptions::default(), &mut archive).expect("export");
    // run.sh (setuid, root's) and its hard link, and the setgid directory.
    assert_eq!(exported.setid_cleared, 3);
    let mut modes = BTreeMap::new();
    for entry in tar::Archive::new(archive.as_slice()).entries().expect("entries") {
        let entry = entry.expect("entry");
        let header = entry.header();
        let path = entry.path_bytes().into_owned();
        modes.insert(path, (header.mode().expect("mode"), header.uid().expect("uid")));
    }
    assert_eq!(
        modes[&b"home/user/run.sh"[..]],
        (0o755, 0),
        "setuid cleared, owner kept"
    );
    assert_eq!(modes[&b"home/user/shared/"[..]], (0o775, 0), "setgid cleared");
    assert_eq!(modes[&b"tmp/"[..]], (0o1777, 0), "sticky kept");
    assert!(modes.values().all(|(mode, _)| mode & 0o6000 == 0));
}

/// A tar archive built member by member with the tar crate (GNU headers, so long names work).
struct Craft(tar::Builder<Vec<u8>>);

impl Craft {
    fn new() -> Self {
        Self(tar::Builder::new(Vec::new()))
    }

    fn header(kind: tar::EntryType, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h.set_uid(1000);
        h.set_gid(1000);
        h
    }

    /// A member with a raw name (no normalisation by the tar crate).
    fn raw(mut self, kind: tar::EntryType, name: &[u8], link: Option<&[u8]>, data: &[u8]) -> Self {
        let mut h = Self::header(kind, data.len() as u64);
        let gnu = h.as_gnu_mut().expect("gnu");
        gnu.name[..name.len()].copy_from_slice(name);
        if let Some(link) = link {
            gnu.linkname[..link.len()].copy_from_slice(link);
        }
        h.set_cksum();
        self.0.append(&h, data).expect("append");
        self
    }

    fn file(self, name: &str, data: &[u8]) -> Self {
        self.raw(tar::EntryType::Regular, name.as_bytes(), None, data)
    }

    fn dir(self, name: &str) -> Self {
        self.raw(tar::EntryType::Directory, name.as_bytes(), None, b"")
    }

    fn symlink(self, name: &str, target: &str) -> Self {
        self.raw(
            tar::EntryType::Symlink,
            name.as_bytes(),
            Some(target.as_bytes()),
            b"",
        )
    }

    fn done(self) -> Vec<u8> {
        self.0.into_inner().expect("finish")
    }
}

#[test]
fn hostile_archives_are_refused_and_touch_nothing_outside() {
    if !root_or_skip() {
        return;
    }
    let outside = tempfile::tempdir().expect("outside");
    let sentinel = outside.path().join("sentinel");
    fs::write(&sentinel, "untouched").expect("sentinel");
    let out = outside.path().to_str().expect("utf-8").to_owned();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("dotdot", Craft::new().file("../escape", b"x").done()),
        (
            "dotdot deep",
            Craft::new().dir("a").file("a/../../escape", b"x").done(),
        ),
        (
            "absolute",
            Craft::new().file(&format!("{out}/sentinel"), b"pwned").done(),
        ),
        (
            "symlink then through it",
            Craft::new()
                .symlink("tmp", &out)
                .file("tmp/sentinel", b"pwned")
                .done(),
        ),
        (
            "symlink to / then a directory through it",
            Craft::new()
                .symlink("up", "/")
                .dir("up/etc")
                .file("up/etc/evil", b"x")
                .done(),
        ),
        (
            "hard link outside",
            Craft::new()
                .raw(
                    tar::EntryType::Link,
                    b"stolen",
                    Some(sentinel.as_os_str().as_bytes()),
                    b"",
                )
                .done(),
        ),
        (
            "hard link to a later member",
            Craft::new()
                .raw(tar::EntryType::Link, b"early", Some(b"late"), b"")
                .file("late", b"x")
                .done(),
        ),
        (
            "hard link through a symlink",
            Craft::new()
                .symlink("s", &out)
                .raw(tar::EntryType::Link, b"l", Some(b"s/sentinel"), b"")
                .done(),
        ),
        (
            "device",
            Craft::new().raw(tar::EntryType::Char, b"null", None, b"").done(),
        ),
        (
            "fifo",
            Craft::new().raw(tar::EntryType::Fifo, b"fifo", None, b"").done(),
        ),
        ("duplicate", Craft::new().file("f", b"1").file("f", b"2").done()),
        (
            "file over symlink",
            Craft::new()
                .symlink("f", &format!("{out}/sentinel"))
                .file("f", b"x")
                .done(),
        ),
        ("root as a file", Craft::new().file("./", b"x").done()),
        ("volume dir as symlink", Craft::new().symlink("tmp", "/").done()),
    ];
    for (what, archive) in cases {
        let (dst, result) = import(&archive, &ImportLimits::default());
        match result {
            Err(RuntimeError::InvalidArchive(m)) => eprintln!("{what}: refused: {m}"),
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(
            fs::read_to_string(&sentinel).expect("sentinel"),
            "untouched",
            "{what}"
        );
        assert_eq!(fs::read_dir(outside.path()).expect("ls").count(), 1, "{what}");
        drop(dst);
    }

    // An owner outside the sandbox range.
    let mut h = Craft::header(tar::EntryType::Regular, 1);
    h.set_path("f").expect("path");
    h.set_uid(70_000);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, &b"x"[..]).expect("append");
    let (_dst, result) = import(&b.into_inner().expect("finish"), &ImportLimits::default());
    assert!(
        matches!(result, Err(RuntimeError::InvalidArchive(ref m)) if m.contains("70000")),
        "{result:?}"
    );
}

#[test]
fn size_limits_and_truncation() {
    if !root_or_skip() {
        return;
    }
    let big = Craft::new()
        .file("a", &[1; 100_000])
        .file("b", &[2; 100_000])
        .done();
    let small = ImportLimits {
        max_bytes: 150_000,
        max_entries: 100,
    };
    let (_d, result) = import(&big, &small);
    assert!(
        matches!(result, Err(RuntimeError::ArchiveTooLarge(_))),
        "{result:?}"
    );
    let exact = ImportLimits {
        max_bytes: big.len() as u64,
        max_entries: 100,
    };
    let (_d, result) = import(&big, &exact);
    result.expect("an archive of exactly the limit");
    let few = ImportLimits {
        max_bytes: 1 << 30,
        max_entries: 1,
    };
    let (_d, result) = import(&big, &few);
    assert!(
        matches!(result, Err(RuntimeError::ArchiveTooLarge(_))),
        "{result:?}"
    );

    // Cut inside a file, inside a header, and exactly between members (no end marker).
    for cut in [700, 512 + 100_000 + 300, 512 + 100_352] {
        let (_d, result) = import(&big[..cut], &ImportLimits::default());
        assert!(
            matches!(result, Err(RuntimeError::InvalidArchive(ref m)) if m.contains("truncated")),
            "cut at {cut}: {result:?}"
        );
    }
    let mut trailing = big.clone();
    trailing.extend_from_slice(b"garbage");
    let (_d, result) = import(&trailing, &ImportLimits::default());
    assert!(
        matches!(result, Err(RuntimeError::InvalidArchive(_))),
        "{result:?}"
    );
}

/// GNU tar, when installed, unpacks the export to the same tree (names, modes, links, long and
/// non-UTF-8 names from pax records).
fn gnu_tar_reads(archive: &[u8], src: &Path) {
    use std::io::Write as _;
    let out = tempfile::tempdir().expect("tempdir");
    let child = std::process::Command::new("tar")
        .args(["--numeric-owner", "-xpf", "-", "-C"])
        .arg(out.path())
        .stdin(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        eprintln!("SKIPPED: no GNU tar to cross-check the export with");
        return;
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(archive)
        .expect("feed tar");
    assert!(child.wait().expect("tar").success(), "GNU tar refused the export");
    let (got, want) = (describe_with_base(out.path(), 0), describe(src));
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    for (path, w) in &want {
        assert_eq!(
            got.get(path),
            Some(w),
            "GNU tar: {}",
            String::from_utf8_lossy(path)
        );
    }
}

/// A tree nesting deeper than an import accepts is refused, and the stream it was written to does
/// not end as an archive (no end-of-archive marker after the members written so far); one whose
/// deepest directory is exactly at the bound, and empty, exports.
#[test]
fn a_failed_export_does_not_end_the_archive() {
    let src = tempfile::tempdir().expect("tempdir");
    let at_bound = "d/".repeat(crate::native::untar::member_path::MAX_DEPTH);
    fs::create_dir_all(src.path().join(&at_bound)).expect("mkdir");
    let mut archive = Vec::new();
    let exported = export_tree(src.path(), IDS, &ExportOptions::default(), &mut archive).expect("export");
    assert_eq!(
        exported.entries,
        1 + crate::native::untar::member_path::MAX_DEPTH as u64
    );
    assert!(archive.ends_with(&[0; 1024]));

    fs::create_dir(src.path().join(&at_bound).join("deeper")).expect("mkdir");
    let mut archive = Vec::new();
    let err = export_tree(src.path(), IDS, &ExportOptions::default(), &mut archive).expect_err("too deep");
    assert!(err.to_string().contains("export"), "{err}");
    assert!(format!("{err:?}").contains("deeper than 512 levels"), "{err:?}");
    assert!(!archive.is_empty() && archive.len() % 512 == 0);
    assert!(
        !archive.ends_with(&[0; 1024]),
        "a failed export must not end with an end-of-archive marker"
    );
    if root_or_skip() {
        let (_dst, result) = import(&archive, &ImportLimits::default());
        assert!(
            matches!(&result, Err(RuntimeError::InvalidArchive(m)) if m.contains("truncated")),
            "an import sees it cut short: {result:?}"
        );
    }
}

/// The staging subvolume's qgroup is the import's own limit: meeting it (at any step: a write, a
/// file's creation whose metadata btrfs reserves first) is an archive too large, while a full
/// pool stays the pool's failure. (It decides whether a tenant over its storage quota is told so.)
#[test]
fn the_staging_limit_is_the_archives_failure_and_a_full_pool_is_not() {
    let at = |kind: std::io::ErrorKind| RuntimeError::Pool {
        what: "import into",
        path: "/pool/imports/sn-1/etc/x".into(),
        source: std::io::Error::new(kind, "create the file"),
    };
    let over = over_import_limit(at(std::io::ErrorKind::QuotaExceeded), 1 << 20);
    assert!(
        matches!(&over, RuntimeError::ArchiveTooLarge(m) if m.contains("1048576") && m.contains("etc/x")),
        "{over:?}"
    );
    let full = over_import_limit(at(std::io::ErrorKind::StorageFull), 1 << 20);
    assert!(matches!(full, RuntimeError::Pool { .. }), "{full:?}");
    let other = over_import_limit(RuntimeError::InvalidArchive("x".into()), 1 << 20);
    assert!(matches!(other, RuntimeError::InvalidArchive(_)), "{other:?}");
}

/// The staging limit leaves room for what btrfs spends beyond tar's count, so an archive of exactly
/// the limit unpacks (the e2e quota test imports one), and it still bounds an import's disk.
#[test]
fn the_staging_disk_limit_leaves_room_for_btrfs_and_stays_bounded() {
    for max in [0u64, 512, 1 << 20, 10 << 30] {
        let limit = staging_disk_limit(max);
        // A file of 2049 bytes: 3072 bytes of archive, a 4096-byte block on disk.
        assert!(limit >= max / 3072 * 4096 + (16 << 20), "{max}: {limit}");
        assert!(limit <= max * 2 + (16 << 20), "{max}: {limit}");
    }
    assert_eq!(staging_disk_limit(u64::MAX), u64::MAX);
}

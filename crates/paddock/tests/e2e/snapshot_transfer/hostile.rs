//! Hostile archives are refused with a stable code, write nothing outside their staging subvolume
//! and leave no subvolume behind.

use super::*;

/// A tar archive built member by member with the tar crate, names and link names written raw.
struct Craft(tar::Builder<Vec<u8>>);

impl Craft {
    fn new() -> Self {
        Self(tar::Builder::new(Vec::new()))
    }

    fn raw(mut self, kind: tar::EntryType, name: &[u8], link: Option<&[u8]>, data: &[u8], uid: u64) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(uid);
        h.set_gid(uid);
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
        self.raw(tar::EntryType::Regular, name.as_bytes(), None, data, 1000)
    }

    fn dir(self, name: &str) -> Self {
        self.raw(tar::EntryType::Directory, name.as_bytes(), None, b"", 1000)
    }

    fn symlink(self, name: &str, target: &str) -> Self {
        self.raw(
            tar::EntryType::Symlink,
            name.as_bytes(),
            Some(target.as_bytes()),
            b"",
            1000,
        )
    }

    fn done(self) -> Vec<u8> {
        self.0.into_inner().expect("finish")
    }
}

/// Every file and directory under `dir` (host side), for "nothing changed here".
fn host_tree(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p.clone());
            }
            out.insert(p);
        }
    }
    out
}

#[test]
fn hostile_archives_are_refused_and_leave_nothing() {
    let h = Harness::with(Options {
        max_import_bytes: 16 << 20,
        ..Options::default()
    });
    // A directory on the host the archives aim at: a sentinel file to overwrite or link to, and a
    // place to drop new files.
    let target = tempfile::tempdir().expect("tempdir");
    let sentinel = target.path().join("sentinel");
    std::fs::write(&sentinel, "untouched").expect("sentinel");
    let t = target.path().to_str().expect("utf-8").to_owned();
    let stray = format!("paddock-import-escape-{}", std::process::id());
    h.block_on(async {
        let a = h.admin.new_tenant("attacker").await;
        let snapshots_before = pool_entries(&h, "snapshots");
        let target_before = host_tree(target.path());
        let big = vec![0x5a; 17 << 20];
        let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
            (
                "../ traversal",
                Craft::new().file("../../escape", b"x").done(),
                400,
                "invalid_archive",
            ),
            (
                "../ inside a path",
                Craft::new().dir("home").file("home/../../escape", b"x").done(),
                400,
                "invalid_archive",
            ),
            (
                "absolute path",
                Craft::new().file(&format!("{t}/sentinel"), b"pwned").done(),
                400,
                "invalid_archive",
            ),
            (
                "symlink, then a file through it",
                Craft::new()
                    .symlink("tmp", &t)
                    .file("tmp/sentinel", b"pwned")
                    .done(),
                400,
                "invalid_archive",
            ),
            (
                "symlink to /, then a directory through it",
                Craft::new()
                    .symlink("up", "/")
                    .dir("up/tmp")
                    .file(&format!("up/tmp/{stray}"), b"pwned")
                    .done(),
                400,
                "invalid_archive",
            ),
            (
                "hard link to a host path",
                Craft::new()
                    .raw(
                        tar::EntryType::Link,
                        b"stolen",
                        Some(sentinel.as_os_str().as_bytes()),
                        b"",
                        1000,
                    )
                    .done(),
                400,
                "invalid_archive",
            ),
            (
                "hard link through a symlink",
                Craft::new()
                    .symlink("s", &t)
                    .raw(tar::EntryType::Link, b"l", Some(b"s/sentinel"), b"", 1000)
                    .done(),
                400,
                "invalid_archive",
            ),
            (
                "device node",
                Craft::new()
                    .raw(tar::EntryType::Char, b"home/null", None, b"", 0)
                    .done(),
                400,
                "invalid_archive",
            ),
            (
                "owner outside the sandbox range",
                Craft::new()
                    .raw(tar::EntryType::Regular, b"home/rootish", None, b"x", 70_000)
                    .done(),
                400,
                "invalid_archive",
            ),
            (
                "a volume directory as a symlink to /",
                Craft::new().symlink("tmp", "/").done(),
                400,
                "invalid_archive",
            ),
            (
                "larger than the limit",
                Craft::new().file("home/big", &big).done(),
                413,
                "payload_too_large",
            ),
            (
                "not a tar archive",
                b"this is not a tar archive at all".repeat(40),
                400,
                "invalid_archive",
            ),
        ];
        for (what, archive, status, code) in cases {
            let r = import(&a, archive, &[]).await;
            assert_eq!((r.status, r.code().as_str()), (status, code), "{what}: {r:?}");
            assert_eq!(
                std::fs::read_to_string(&sentinel).expect("sentinel"),
                "untouched",
                "{what}"
            );
            assert_eq!(host_tree(target.path()), target_before, "{what}");
            assert!(!Path::new("/tmp").join(&stray).exists(), "{what}");
            assert_eq!(
                pool_entries(&h, "snapshots"),
                snapshots_before,
                "{what}: a snapshot appeared"
            );
            assert_eq!(
                pool_entries(&h, "imports"),
                BTreeSet::new(),
                "{what}: staging left behind"
            );
        }

        // A truncated export: cut inside a file, and exactly at a member boundary.
        let id = a.create_sandbox(json!({})).await;
        a.sh(&id, "head -c 200000 /dev/urandom > /home/user/blob").await;
        let sid = a
            .post(&format!("/v1/sandboxes/{id}/snapshots"), json!(null))
            .await
            .ok(201)["id"]
            .as_str()
            .expect("id")
            .to_owned();
        let archive = export(&a, &sid).await.body.to_vec();
        for cut in [archive.len() / 2, archive.len() - 1024, 4096] {
            let r = import(&a, archive[..cut].to_vec(), &[]).await;
            r.err(400, "invalid_archive");
            assert!(r.text().contains("truncated"), "cut at {cut}: {r:?}");
            assert_eq!(pool_entries(&h, "imports"), BTreeSet::new(), "cut at {cut}");
        }
        // The whole archive (under the 16 MiB limit) imports fine.
        assert!(archive.len() < 16 << 20, "{}", archive.len());
        let ok = import(&a, archive, &[]).await.ok(201);
        assert_eq!(ok["sandbox_id"], Value::Null);

        let listed = a.get("/v1/snapshots").await.ok(200);
        assert_eq!(listed["snapshots"].as_array().expect("list").len(), 2, "{listed}");
        let refused = a
            .audit_rows(&[("action", "snapshot.import")])
            .await
            .into_iter()
            .filter(|r| r["outcome"] == "invalid_archive")
            .count();
        assert!(refused >= 11, "each refusal has an audit row ({refused})");
    });
}

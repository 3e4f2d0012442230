//! What the host does with files a sandbox wrote, tried the way a hostile workload would: every
//! host-side read or write of a sandbox's volume, snapshot, stopped copy or import meets symlinks to
//! host fifos, `/dev/zero` and host files, fifos, directories and huge files where it expects small
//! regular files, and must answer promptly, read nothing of the host and write nothing outside. A
//! kill (or stop) racing a rollback never leaves an init the service does not hold; walks of huge
//! trees hold a bounded number of descriptors; exports clear set-id bits unless asked; and nothing
//! inside a sandbox names a host path of paddock's.
//!
//! Each test drives a real service through its HTTP API (`support/harness.rs`).
//! Below: files a sandbox planted where the host reads or writes; the rest in the modules.

mod host_paths;
mod rollback_race;
mod trees;

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{
    agent_bin,
    harness::{poll, Client, Harness, Options, Reply},
    skip, ID_BASE,
};

/// A generous bound for one request that must not hang (it normally takes well under a second): a
/// request blocked on a fifo would never answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(90);

/// Host files a sandbox must never reach: a readable secret, a fifo nobody writes, a directory.
struct HostFiles {
    dir: tempfile::TempDir,
    marker: String,
}

impl HostFiles {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("paddock-host-")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        // Reachable by anyone, like most host files: only the host's own code could read it for the
        // sandbox.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let marker = format!(
            "host-only-{}",
            dir.path().file_name().expect("name").to_string_lossy()
        );
        std::fs::write(dir.path().join("secret"), format!("{marker}\n")).expect("secret");
        std::fs::set_permissions(dir.path().join("secret"), std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.path().join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o666),
            0,
        )
        .expect("mkfifo");
        std::fs::create_dir(dir.path().join("dir")).expect("mkdir");
        std::fs::set_permissions(dir.path().join("dir"), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        Self { dir, marker }
    }

    fn secret(&self) -> PathBuf {
        self.dir.path().join("secret")
    }

    fn fifo(&self) -> PathBuf {
        self.dir.path().join("fifo")
    }

    fn subdir(&self) -> PathBuf {
        self.dir.path().join("dir")
    }

    /// The host files are as the test made them: the secret unchanged, the fifo a fifo, the
    /// directory empty.
    #[track_caller]
    fn assert_untouched(&self) {
        assert_eq!(
            std::fs::read_to_string(self.secret()).expect("secret"),
            format!("{}\n", self.marker)
        );
        assert!(std::fs::symlink_metadata(self.fifo())
            .expect("fifo")
            .file_type()
            .is_fifo());
        let written: Vec<_> = std::fs::read_dir(self.subdir()).expect("dir").flatten().collect();
        assert!(written.is_empty(), "written into a host directory: {written:?}");
    }

    /// Unblocks anything stuck opening the fifo for reading (so a failing test can tear down).
    fn release_fifo(&self) {
        let _ = rustix::fs::open(
            self.fifo(),
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::NONBLOCK,
            rustix::fs::Mode::empty(),
        );
    }
}

/// Runs a script as the sandbox's root; asserts it exits 0.
async fn sh_root(c: &Client, id: &str, script: &str) -> String {
    let r = c.exec_json(id, json!({"shell": script, "user": "root"})).await;
    assert_eq!(r["exit"]["exit_code"], 0, "{script}\n{r:#}");
    r["stdout"].as_str().unwrap_or_default().to_owned()
}

/// `request`, which must answer within [`ANSWER_WITHIN`]; `host`'s fifo is opened for writing if it
/// does not, so that the server can be torn down.
async fn answers(host: &HostFiles, what: &str, request: impl std::future::Future<Output = Reply>) -> Reply {
    match tokio::time::timeout(ANSWER_WITHIN, request).await {
        Ok(reply) => reply,
        Err(_) => {
            host.release_fifo();
            panic!("{what} did not answer within {ANSWER_WITHIN:?}: the server is blocked");
        }
    }
}

async fn snapshot_of(c: &Client, id: &str) -> String {
    let r = c
        .post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}))
        .await
        .ok(201);
    r["id"].as_str().expect("snapshot id").to_owned()
}

/// The sandbox's identity files are its own again, regular, and hold nothing of the host.
async fn assert_own_identity(c: &Client, id: &str, host: &HostFiles) {
    let out = sh_root(
        c,
        id,
        "stat -c %F /etc/hostname /etc/hosts; cat /etc/hostname /etc/hosts",
    )
    .await;
    assert!(
        out.starts_with("regular file\nregular file\n"),
        "identity files are not plain files: {out}"
    );
    assert!(out.contains(&format!("\n{id}\n")), "{out}");
    assert!(
        !out.contains(&host.marker),
        "host data read into the sandbox: {out}"
    );
}

/// A rollback to a snapshot whose `/etc/hostname` the sandbox replaced (by a symlink to a host fifo,
/// to `/dev/zero`, to a host file, by a fifo, a directory or a 1 GiB sparse file) answers promptly,
/// reads nothing of the host, and brings the sandbox back with its own identity files; the same
/// through a prepared rollback (a checkpoint's).
#[test]
fn a_rollback_reads_nothing_a_snapshot_planted_in_etc() {
    let h = Harness::start();
    let host = HostFiles::new();
    h.block_on(async {
        let a = h.admin.new_tenant("planter").await;
        let plants = [
            (
                "a symlink to a host fifo",
                format!("ln -sfn {} /etc/hostname", host.fifo().display()),
            ),
            (
                "a symlink to /dev/zero",
                "ln -sfn /dev/zero /etc/hostname".to_owned(),
            ),
            (
                "a symlink to a host file",
                format!("ln -sfn {} /etc/hostname", host.secret().display()),
            ),
            ("a fifo", "rm -f /etc/hostname && mkfifo /etc/hostname".to_owned()),
            (
                "a directory",
                format!(
                    "rm -f /etc/hostname && mkdir -p /etc/hostname/sub && ln -s {} /etc/hostname/sub/x",
                    host.secret().display()
                ),
            ),
            ("a 1 GiB file", "truncate -s 1G /etc/hostname".to_owned()),
            (
                "symlinks on hosts too",
                format!(
                    "ln -sfn {} /etc/hosts && ln -sfn {} /etc/hostname",
                    host.secret().display(),
                    host.fifo().display()
                ),
            ),
        ];
        for (what, plant) in &plants {
            let id = a.create_sandbox(json!({})).await;
            sh_root(&a, &id, plant).await;
            let snap = snapshot_of(&a, &id).await;
            let rolled = answers(
                &host,
                what,
                a.post(&format!("/v1/sandboxes/{id}/rollback"), json!({"snapshot": snap})),
            )
            .await;
            rolled.ok(200);
            assert_own_identity(&a, &id, &host).await;
            host.assert_untouched();
            a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
            a.delete(&format!("/v1/snapshots/{snap}")).await.ok(204);
        }
        // The prepared path: the copy booted ahead on the checkpoint reads nothing either.
        let id = a.create_sandbox(json!({})).await;
        sh_root(
            &a,
            &id,
            &format!("ln -sfn {} /etc/hostname", host.fifo().display()),
        )
        .await;
        a.post(&format!("/v1/sandboxes/{id}/checkpoint"), Value::Null)
            .await
            .ok(201);
        let rolled = answers(
            &host,
            "a prepared rollback",
            a.post(&format!("/v1/sandboxes/{id}/rollback"), Value::Null),
        )
        .await;
        rolled.ok(200);
        let out = sh_root(&a, &id, "readlink /etc/hostname").await;
        assert_eq!(
            out.trim(),
            host.fifo().display().to_string(),
            "restored as it was"
        );
        host.assert_untouched();
    });
}

/// The other host-side reads and writes of sandbox-written files: a stopped sandbox's resume
/// (identity files), an import's first boot, and a snapshot's details, export and diff, all with
/// symlinks to host fifos, `/dev/zero` and host files, and fifos, where plain files are expected.
#[test]
fn other_host_side_reads_never_follow_what_a_sandbox_planted() {
    let h = Harness::start();
    let host = HostFiles::new();
    h.block_on(async {
        let a = h.admin.new_tenant("planter").await;
        // A stopped copy's resume rewrites the identity files.
        let id = a.create_sandbox(json!({})).await;
        sh_root(
            &a,
            &id,
            &format!(
                "ln -sfn {} /etc/hostname && ln -sfn {} /etc/hosts",
                host.fifo().display(),
                host.secret().display()
            ),
        )
        .await;
        a.post(&format!("/v1/sandboxes/{id}/stop"), Value::Null)
            .await
            .ok(200);
        let resumed = answers(
            &host,
            "resume",
            a.post(&format!("/v1/sandboxes/{id}/resume"), Value::Null),
        )
        .await;
        resumed.ok(200);
        assert_own_identity(&a, &id, &host).await;
        host.assert_untouched();

        // A snapshot full of traps: details, export and diff answer and read nothing of the host.
        a.sh(
            &id,
            &format!(
                "cd /home/user && ln -s {fifo} to-fifo && ln -s /dev/zero to-zero && ln -s {secret} to-secret \
                 && ln -s {dir} to-dir && mkfifo fifo && echo plain > plain",
                fifo = host.fifo().display(),
                secret = host.secret().display(),
                dir = host.subdir().display(),
            ),
        )
        .await;
        let snap = snapshot_of(&a, &id).await;
        let details = answers(&host, "snapshot details", a.get(&format!("/v1/snapshots/{snap}"))).await;
        let details = details.ok(200);
        assert!(details["referenced_bytes"].is_u64(), "{details}");
        let export = answers(
            &host,
            "export",
            a.get(&format!("/v1/snapshots/{snap}/export")),
        )
        .await;
        assert_eq!(export.status, 200, "{export:?}");
        let members = tar_members(&export.body);
        assert_eq!(
            members.get("home/user/to-secret").map(|m| m.link.as_str()),
            Some(host.secret().to_str().expect("utf-8")),
            "a symlink is archived as one"
        );
        assert!(!members.contains_key("home/user/fifo"), "a fifo is skipped");
        assert_eq!(members["home/user/plain"].data, b"plain\n");
        assert!(
            !String::from_utf8_lossy(&export.body).contains(&host.marker),
            "host data in the export"
        );
        // Changed since the snapshot, the traps moved around: the diff compares, follows nothing.
        a.sh(
            &id,
            &format!(
                "cd /home/user && rm to-secret plain && ln -s {secret} plain && mkfifo to-secret && \
                 ln -sfn {fifo} to-zero",
                secret = host.secret().display(),
                fifo = host.fifo().display(),
            ),
        )
        .await;
        let diff = answers(
            &host,
            "diff",
            a.get_q(
                &format!("/v1/sandboxes/{id}/diff"),
                &[("snapshot", snap.as_str()), ("text", "true")],
            ),
        )
        .await;
        let diff = diff.ok(200);
        assert!(!diff.to_string().contains(&host.marker), "host data in the diff: {diff}");
        assert!(diff["modified"].as_u64().is_some_and(|n| n >= 3), "{diff}");
        host.assert_untouched();

        // An import whose etc/hostname and etc/hosts lead to host files boots with its own.
        let archive = hostile_etc_archive(&host);
        let imported = answers(
            &host,
            "import",
            Client::send(
                a.request(reqwest::Method::POST, "/v1/snapshots/import")
                    .header("content-type", "application/x-tar")
                    .body(archive),
            ),
        )
        .await;
        let imported = imported.ok(201);
        let isnap = imported["id"].as_str().expect("id").to_owned();
        let created = answers(
            &host,
            "create from an import",
            a.post("/v1/sandboxes", json!({"snapshot": isnap})),
        )
        .await;
        let from_import = created.ok(201)["id"].as_str().expect("id").to_owned();
        assert_own_identity(&a, &from_import, &host).await;
        host.assert_untouched();
    });
}

/// The same for a networked sandbox's files (`resolv.conf`, the egress CA, the bundles, the
/// `paddock` directory): rewritten at each boot (resume, rollback) in place of whatever the
/// sandbox left, never through it.
#[test]
fn network_files_replace_what_a_sandbox_planted() {
    if !has_network_tools() {
        return skip("no ip/nft: sandboxes cannot have networks here");
    }
    let h = Harness::with(Options {
        network: Some(crate::support::harness::unreachable_network()),
        ..Options::default()
    });
    let host = HostFiles::new();
    h.block_on(async {
        let a = h.admin.new_tenant("netplanter").await;
        let id = a
            .create_sandbox(json!({"network": {"allow": [{"domain": "a.test"}]}}))
            .await;
        let plant = format!(
            "ln -sfn {secret} /etc/resolv.conf && rm -rf /etc/paddock && ln -sfn {dir} /etc/paddock && \
             ln -sfn {fifo} /etc/ssl/certs/ca-certificates.crt && ln -sfn {fifo} /etc/hostname",
            secret = host.secret().display(),
            dir = host.subdir().display(),
            fifo = host.fifo().display(),
        );
        sh_root(&a, &id, &plant).await;
        let snap = snapshot_of(&a, &id).await;
        a.post(&format!("/v1/sandboxes/{id}/stop"), Value::Null)
            .await
            .ok(200);
        answers(
            &host,
            "resume",
            a.post(&format!("/v1/sandboxes/{id}/resume"), Value::Null),
        )
        .await
        .ok(200);
        let check = "stat -c '%n %F' /etc/resolv.conf /etc/paddock /etc/paddock/egress-ca.pem \
                     /etc/ssl/certs/ca-certificates.crt; cat /etc/resolv.conf";
        let out = sh_root(&a, &id, check).await;
        assert!(out.contains("/etc/resolv.conf regular file"), "{out}");
        assert!(out.contains("/etc/paddock directory"), "{out}");
        // The system bundle is replaced only where the template has a file: the sandbox's own
        // symlink stays (never written through, never read).
        assert!(
            out.contains("/etc/ssl/certs/ca-certificates.crt symbolic link"),
            "{out}"
        );
        assert!(out.contains("nameserver "), "{out}");
        assert!(!out.contains(&host.marker), "{out}");
        host.assert_untouched();
        // A cold rollback to the snapshot with the traps rewrites them the same way.
        answers(
            &host,
            "rollback",
            a.post(&format!("/v1/sandboxes/{id}/rollback"), json!({"snapshot": snap})),
        )
        .await
        .ok(200);
        let out = sh_root(&a, &id, check).await;
        assert!(out.contains("/etc/resolv.conf regular file"), "{out}");
        assert!(!out.contains(&host.marker), "{out}");
        assert_own_identity(&a, &id, &host).await;
        host.assert_untouched();
    });
}

/// One member of an archive.
#[derive(Debug)]
struct Member {
    mode: u32,
    uid: u64,
    link: String,
    data: Vec<u8>,
}

/// The members of a tar archive by name (directories end in `/`).
fn tar_members(archive: &[u8]) -> BTreeMap<String, Member> {
    let mut out = BTreeMap::new();
    let mut reader = tar::Archive::new(archive);
    for entry in reader.entries().expect("entries") {
        let mut entry = entry.expect("entry");
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let header = entry.header().clone();
        let link = entry
            .link_name_bytes()
            .map(|l| String::from_utf8_lossy(&l).into_owned())
            .unwrap_or_default();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).expect("data");
        out.insert(
            name,
            Member {
                mode: header.mode().expect("mode"),
                uid: header.uid().expect("uid"),
                link,
                data,
            },
        );
    }
    out
}

/// An archive of a volume whose `etc/hostname` leads to a host fifo and `etc/hosts` to a host file.
fn hostile_etc_archive(host: &HostFiles) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for dir in ["etc", "home", "root", "tmp"] {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        b.append_data(&mut h, dir, std::io::empty()).expect("dir");
    }
    for (name, content) in [
        (
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n",
        ),
        ("etc/group", "root:x:0:\nuser:x:1000:\n"),
    ] {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(content.len() as u64);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        b.append_data(&mut h, name, content.as_bytes()).expect("file");
    }
    for (name, target) in [("etc/hostname", host.fifo()), ("etc/hosts", host.secret())] {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        b.append_link(&mut h, name, &target).expect("symlink");
    }
    b.into_inner().expect("archive")
}

fn has_network_tools() -> bool {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip"]
        .iter()
        .any(|p| Path::new(p).exists())
        && ["/usr/sbin/nft", "/sbin/nft"]
            .iter()
            .any(|p| Path::new(p).exists())
}

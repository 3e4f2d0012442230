//! What the host does with files a sandbox wrote, tried the way a hostile workload would: every
//! host-side read or write of a sandbox's volume, snapshot, stopped copy or import meets symlinks to
//! host fifos, `/dev/zero` and host files, fifos, directories and huge files where it expects small
//! regular files, and must answer promptly, read nothing of the host and write nothing outside. A
//! kill (or stop) racing a rollback never leaves an init the service does not hold; walks of huge
//! trees hold a bounded number of descriptors; exports clear set-id bits unless asked; and nothing
//! inside a sandbox names a host path of paddock's.
//!
//! Each test drives a real service through its HTTP API (`support/harness.rs`).

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
        network: Some(network_config()),
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

/// A kill, or a stop, arriving while a rollback (cold or prepared) runs: whichever finishes second
/// sees the other's result, so afterwards the sandbox is ended (or stopped) with no process left in
/// its cgroups, and never running unrecorded. The kill is sent at staggered moments after the
/// rollback (the delays only spread the interleavings; every one must end clean).
#[test]
fn a_kill_racing_a_rollback_leaves_no_untracked_init() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("racer").await;
        for round in 0..12u64 {
            let id = a.create_sandbox(json!({})).await;
            a.exec_background(&id, json!({"argv": ["sleep", "1000"]})).await;
            let prepared = round % 3 == 2;
            let body = if prepared {
                a.post(&format!("/v1/sandboxes/{id}/checkpoint"), Value::Null)
                    .await
                    .ok(201);
                Value::Null
            } else {
                json!({"snapshot": snapshot_of(&a, &id).await})
            };
            let stop = round % 4 == 3;
            let delay = Duration::from_millis(round * 9 % 70);
            let rollback_path = format!("/v1/sandboxes/{id}/rollback");
            let rollback = a.post(&rollback_path, body);
            let end = async {
                tokio::time::sleep(delay).await;
                if stop {
                    a.post(&format!("/v1/sandboxes/{id}/stop"), Value::Null).await
                } else {
                    a.delete(&format!("/v1/sandboxes/{id}")).await
                }
            };
            let (rolled, ended) = tokio::join!(rollback, end);
            let info = a.get(&format!("/v1/sandboxes/{id}")).await.ok(200);
            let state = info["state"].as_str().expect("state").to_owned();
            let context = format!(
                "round {round} (prepared {prepared}, stop {stop}, delay {delay:?}): rollback {} {}, \
                 end {} {}, state {state}",
                rolled.status,
                rolled.text(),
                ended.status,
                ended.text()
            );
            eprintln!("{context}");
            if state == "running" {
                // Only if the end lost cleanly (a stop refused because the sandbox was restarting
                // is an answer too); then it must still be fully served.
                assert!(stop, "{context}");
                assert_eq!(a.sh(&id, "echo alive").await, "alive\n", "{context}");
                a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
            } else {
                assert!(
                    matches!(state.as_str(), "killed" | "stopped" | "failed"),
                    "{context}"
                );
            }
            // Nothing of it runs any more (and nothing is left in its cgroups).
            let left = poll(Duration::from_secs(30), "its processes to go", || async {
                let procs = h.env().processes();
                procs.is_empty().then_some(())
            });
            tokio::time::timeout(Duration::from_secs(60), left)
                .await
                .unwrap_or_else(|_| panic!("{context}: processes left: {:?}", h.env().processes()));
            if state == "stopped" {
                a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
            }
            assert!(
                h.env().cgroup_ids().is_empty(),
                "{context}: {:?}",
                h.env().cgroup_ids()
            );
        }
    });
}

/// A snapshot with 25,000 nested directories and 25,000 sibling directories: its details (which map
/// every file's extents), its export and a diff against it succeed while the server holds a bounded
/// number of descriptors (it runs in this process: its descriptors are this process's).
#[test]
fn huge_trees_are_walked_with_bounded_descriptors() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("deep").await;
        let id = a.create_sandbox(json!({})).await;
        a.sh(
            &id,
            "cd /home/user && perl -e 'mkdir \"wide\"; mkdir \"wide/$_\" for 1..25000'",
        )
        .await;
        let wide = snapshot_of(&a, &id).await;
        // The nesting is made from the host, straight into the sandbox's volume: the sandbox can make
        // it too, but each of its calls is checked by Landlock up the whole path, so 25,000 levels
        // take it minutes.
        nest_in_volume(h.env().state(), &id, 25_000);
        let snap = snapshot_of(&a, &id).await;
        let baseline = open_fds();
        let watch = FdWatch::start();
        let details = a.get(&format!("/v1/snapshots/{snap}")).await.ok(200);
        assert!(
            details["referenced_bytes"].is_u64(),
            "no usage measured: {details}"
        );
        let diff = a
            .get_q(
                &format!("/v1/sandboxes/{id}/diff"),
                &[("snapshot", snap.as_str())],
            )
            .await
            .ok(200);
        assert_eq!(diff["entries"].as_array().map(Vec::len), Some(0), "{diff}");
        // The export refuses what no import could take back (deeper than 512 levels): the download
        // breaks off rather than end as an archive ...
        let export = a
            .request(reqwest::Method::GET, &format!("/v1/snapshots/{snap}/export"))
            .send()
            .await
            .expect("the export is answered");
        assert!(
            export.status() != 200 || export.bytes().await.is_err(),
            "an archive nobody can import"
        );
        // ... and exports the wide tree, however wide.
        let export = a.get(&format!("/v1/snapshots/{wide}/export")).await;
        assert_eq!(export.status, 200, "{export:?}");
        assert!(tar_members(&export.body).contains_key("home/user/wide/25000/"));
        let most = watch.stop();
        assert!(
            most < baseline + 64,
            "the server held up to {most} descriptors (baseline {baseline}) walking the trees"
        );
    });
}

/// An export clears setuid and setgid bits of what the sandbox's root made, keeps them when asked,
/// and says so in its audit row; owners stay the sandbox's ids.
#[test]
fn an_export_clears_set_id_bits_unless_asked() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("suid").await;
        let id = a.create_sandbox(json!({})).await;
        sh_root(
            &a,
            &id,
            "cp /bin/sh /root/rootshell && chmod 4755 /root/rootshell && mkdir /root/shared && \
             chmod 2775 /root/shared && chmod 1777 /tmp",
        )
        .await;
        let snap = snapshot_of(&a, &id).await;
        let plain = a.get(&format!("/v1/snapshots/{snap}/export")).await;
        assert_eq!(plain.status, 200, "{plain:?}");
        let members = tar_members(&plain.body);
        assert_eq!(
            (members["root/rootshell"].mode, members["root/rootshell"].uid),
            (0o755, 0),
            "setuid cleared, the owner is the sandbox's root"
        );
        assert_eq!(members["root/shared/"].mode, 0o775);
        assert_eq!(members["tmp/"].mode, 0o1777, "the sticky bit stays");
        assert!(members.values().all(|m| m.mode & 0o6000 == 0));
        let kept = a
            .get_q(&format!("/v1/snapshots/{snap}/export"), &[("keep_setid", "true")])
            .await;
        assert_eq!(kept.status, 200, "{kept:?}");
        let members = tar_members(&kept.body);
        assert_eq!(members["root/rootshell"].mode, 0o4755);
        assert_eq!(members["root/shared/"].mode, 0o2775);
        let rows = h
            .admin
            .audit_rows(&[("action", "snapshot.export"), ("sandbox", id.as_str())])
            .await;
        let details: Vec<(Value, Value)> = rows
            .iter()
            .map(|r| {
                (
                    r["detail"]["keep_setid"].clone(),
                    r["detail"]["setid_cleared"].clone(),
                )
            })
            .collect();
        assert!(
            details
                .iter()
                .any(|(keep, cleared)| *keep == json!(false) && cleared.as_u64() >= Some(2)),
            "{rows:#?}"
        );
        assert!(details.contains(&(json!(true), json!(0))), "{rows:#?}");
    });
}

/// Nothing inside a sandbox names a host path of paddock's (the state directory, the agent binary
/// or its directory): not the agent's `/proc/1/exe`, `fd/`, `cwd`, `maps` or `mountinfo` as the file
/// API (the agent itself) shows them, nor anything a workload can read under `/proc`, as the
/// sandbox's user or root.
#[test]
fn nothing_host_side_is_named_inside_a_sandbox() {
    let h = Harness::start();
    let state = h.env().state().to_string_lossy().into_owned();
    let agent = agent_bin();
    let needles = [
        state.clone(),
        agent.to_string_lossy().into_owned(),
        agent.parent().expect("dir").to_string_lossy().into_owned(),
        // The user-namespace owner locks the agent keeps (setup/owner.rs).
        "/run/paddock".to_owned(),
    ];
    let check = |what: &str, text: &str| {
        for needle in &needles {
            assert!(!text.contains(needle.as_str()), "{what} names {needle}:\n{text}");
        }
    };
    h.block_on(async {
        let a = h.admin.new_tenant("looker").await;
        let id = a.create_sandbox(json!({})).await;
        // The agent's view, through the file API.
        for path in ["/proc/1/exe", "/proc/1/cwd", "/proc/self/exe"] {
            let r = a
                .get_q(&format!("/v1/sandboxes/{id}/files/stat"), &[("path", path)])
                .await;
            check(path, &r.text());
        }
        let fds = a
            .get_q(
                &format!("/v1/sandboxes/{id}/files/list"),
                &[("path", "/proc/1/fd")],
            )
            .await
            .ok(200);
        assert!(
            fds.to_string().contains("socket:["),
            "the listing shows link targets: {fds}"
        );
        check("/proc/1/fd", &fds.to_string());
        for path in [
            "/proc/1/maps",
            "/proc/1/mountinfo",
            "/proc/1/environ",
            "/proc/1/cmdline",
        ] {
            let r = a.read_file(&id, path).await;
            assert_eq!(r.status, 200, "{path}: {r:?}");
            check(path, &r.text());
        }
        // A workload's view, as the sandbox's user and root.
        let script = "for f in /proc/[0-9]*/exe /proc/[0-9]*/cwd /proc/[0-9]*/root /proc/[0-9]*/fd/*; do \
                      printf '%s -> %s\\n' \"$f\" \"$(readlink \"$f\" 2>&1)\"; done; \
                      cat /proc/[0-9]*/maps /proc/self/mountinfo /proc/[0-9]*/mountinfo 2>&1";
        for user in ["user", "root"] {
            let r = a.exec_json(&id, json!({"shell": script, "user": user})).await;
            let out = format!(
                "{}{}",
                r["stdout"].as_str().unwrap_or(""),
                r["stderr"].as_str().unwrap_or("")
            );
            assert!(
                out.contains("/proc/self/mountinfo") || out.contains(" / / "),
                "{out}"
            );
            check(&format!("/proc as {user}"), &out);
        }
    });
}

// ---- helpers ----

/// Makes `levels` nested directories `d/d/...` (and a file at the bottom) in the sandbox's
/// `/home/user`, owned by its user, descriptor-relative (the path is far beyond `PATH_MAX`).
fn nest_in_volume(state: &Path, id: &str, levels: usize) {
    use rustix::fs::{Mode, OFlags};
    let home = state.join("pool/sandboxes").join(id).join("home/user");
    let owner = (
        Some(rustix::fs::Uid::from_raw(ID_BASE + 1000)),
        Some(rustix::fs::Gid::from_raw(ID_BASE + 1000)),
    );
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW;
    let mut dir = rustix::fs::open(&home, flags, Mode::empty()).expect("home");
    for _ in 0..levels {
        rustix::fs::mkdirat(&dir, c"d", Mode::from_raw_mode(0o755)).expect("mkdir");
        dir = rustix::fs::openat(&dir, c"d", flags, Mode::empty()).expect("open");
        rustix::fs::fchown(&dir, owner.0, owner.1).expect("chown");
    }
    let leaf = rustix::fs::openat(
        &dir,
        c"leaf",
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
        Mode::from_raw_mode(0o644),
    )
    .expect("leaf");
    rustix::io::write(&leaf, b"x").expect("write");
}

/// This process's open descriptors now.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// Samples this process's descriptor count on a thread until stopped; returns the most seen.
struct FdWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl FdWatch {
    fn start() -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut most = 0;
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                most = most.max(open_fds());
                std::thread::yield_now();
            }
            most
        });
        Self { stop, thread }
    }

    fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().expect("watch thread")
    }
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

/// Egress with nothing reachable: the sandbox only needs a link, not an outside world.
fn network_config() -> paddock_control::NetworkConfig {
    paddock_control::NetworkConfig {
        ports: paddock_types::EgressPorts::default(),
        egress: paddock_egress::EgressConfig {
            operator: paddock_egress::policy::OperatorPolicy {
                host_addresses: paddock_egress::host_addresses().expect("host addresses"),
                ..Default::default()
            },
            system_resolver: false,
            public_roots: false,
            ..Default::default()
        },
        conntrack: Default::default(),
    }
}

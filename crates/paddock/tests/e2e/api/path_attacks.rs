//! Path attacks on the file API: reads, listings, archives, writes, renames and removals through
//! every kind of link a sandbox can plant (and through `..`) stay inside the sandbox's root, also
//! while a path component is swapped between a directory and links to the host in a loop.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::harness::{Client, Harness, Reply};

use super::{tar_of, unique, JSON};

/// A host file with a marker only the host has; removed on drop.
struct HostMarker {
    path: PathBuf,
}

impl Drop for HostMarker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Names and contents of the files directly in `dir`.
pub(super) fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("read the host dir")
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (
                name,
                std::fs::read(e.path()).unwrap_or_else(|_| b"<not a file>".to_vec()),
            )
        })
        .collect()
}

/// Entry names of a `files/list` answer.
fn entry_names(list: &Value) -> BTreeSet<String> {
    list["entries"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .filter_map(|e| e["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// What must never show up in an answer.
struct Secrets {
    marker: String,
    host_only_names: Vec<String>,
    shadow_root: Option<String>,
}

impl Secrets {
    /// A description of the leak in `r`, if any.
    fn leak(&self, what: &str, r: &Reply) -> Option<String> {
        let text = String::from_utf8_lossy(&r.body);
        if text.contains(&self.marker) {
            return Some(format!("{what}: host marker content in {r:?}"));
        }
        if let Some(root) = &self.shadow_root {
            if text.contains(root.as_str()) {
                return Some(format!("{what}: the host's /etc/shadow in {r:?}"));
            }
        }
        if r.body.starts_with(b"SQLite format 3") {
            return Some(format!("{what}: a host database in {r:?}"));
        }
        if r.status == 200 && r.content_type.starts_with(JSON) {
            let names = entry_names(&serde_json::from_slice(&r.body).unwrap_or(Value::Null));
            for n in &self.host_only_names {
                if names.contains(n) {
                    return Some(format!("{what}: host-only entry {n} listed in {r:?}"));
                }
            }
        }
        None
    }
}

#[test]
fn file_api_path_attacks_stay_inside_the_sandbox() {
    let h = Harness::start();
    let (host_dir, marker) = host_marker_dir();
    let hd = host_dir.path().to_string_lossy().into_owned();
    let root_marker = HostMarker {
        path: PathBuf::from(format!("/root/.{}", unique("paddock-api-marker"))),
    };
    std::fs::write(&root_marker.path, &marker).expect("/root marker");
    let rm = root_marker.path.to_string_lossy().into_owned();
    let host_before = snapshot(host_dir.path());
    let state = h.env().state().to_string_lossy().into_owned();
    let mut secrets = secrets_for(host_dir.path(), &marker);
    secrets.host_only_names.push("paddock.db".into());
    h.block_on(async {
        let a = h.admin.new_tenant("attacker").await;
        let id = a.create_sandbox(json!({})).await;
        let vol = format!("{state}/pool/sandboxes/{id}/volume");
        let files = format!("/v1/sandboxes/{id}/files");
        a.sh(
            &id,
            &format!(
                "set -e; cd /home/user; echo sandbox-own > own.txt; echo keep > keep.txt
                 ln -s /proc/1/root procroot; ln -s /proc/self/root selfroot; ln -s /proc/1/cwd proccwd
                 ln -s ../../../.. updots; ln -s / rootlink; ln -s {hd} hostdir; ln -s {hd}/marker.txt hostfile
                 ln -s {rm} hostroot; ln -s {state} statedir; ln -s {vol} ownvol"
            ),
        )
        .await;
        let mut leaks = Vec::new();
        let mut check = |what: String, r: &Reply| {
            if let Some(leak) = secrets.leak(&what, r) {
                leaks.push(leak);
            }
            // A symlink or `..` never reaches a host path, so nothing confined makes the server fail.
            if r.status >= 500 {
                leaks.push(format!("{what}: server error {r:?}"));
            }
        };

        // Reads through every kind of link, and host paths as they are.
        let through = [
            "/home/user/hostfile".to_owned(),
            "/home/user/hostdir/marker.txt".to_owned(),
            format!("/home/user/procroot{hd}/marker.txt"),
            format!("/home/user/selfroot{hd}/marker.txt"),
            format!("/home/user/proccwd{hd}/marker.txt"),
            format!("/home/user/updots{hd}/marker.txt"),
            format!("/home/user/rootlink{hd}/marker.txt"),
            format!("{hd}/marker.txt"),
            format!("/home/user/../../..{hd}/marker.txt"),
            format!("/../../../..{hd}/marker.txt"),
            format!("/proc/1/root{hd}/marker.txt"),
            format!("/proc/self/root{hd}/marker.txt"),
            format!("/proc/1/cwd{hd}/marker.txt"),
            "/home/user/hostroot".to_owned(),
            rm.clone(),
            format!("{state}/paddock.db"),
            "/home/user/statedir/paddock.db".to_owned(),
            "/home/user/ownvol/home/user/own.txt".to_owned(),
            "/etc/shadow".to_owned(),
            "/home/user/../../../etc/shadow".to_owned(),
            "/home/user/updots/etc/shadow".to_owned(),
            "/home/user/procroot/etc/shadow".to_owned(),
        ];
        for path in &through {
            let r = a.read_file(&id, path).await;
            check(format!("read {path}"), &r);
            assert_ne!(r.status, 200, "read {path} found a file: {r:?}");
            let r = a.get_q(&format!("{files}/stat"), &[("path", path)]).await;
            check(format!("stat {path}"), &r);
            if path != "/home/user/hostfile" && path != "/home/user/hostroot" {
                assert_ne!(r.status, 200, "stat {path} found something: {r:?}");
            }
        }
        // `..` resolves inside the sandbox's root: its own /etc, not the host's.
        let own_passwd = a.read_file(&id, "/etc/passwd").await;
        assert_eq!(own_passwd.status, 200);
        assert_ne!(
            own_passwd.body.as_ref(),
            std::fs::read("/etc/passwd").expect("host passwd").as_slice(),
            "the sandbox's /etc/passwd is the host's"
        );
        for path in [
            "/home/user/../../../etc/passwd",
            "/../../../../etc/passwd",
            "/home/user/updots/etc/passwd",
            "/home/user/rootlink/etc/passwd",
            "/tmp/../etc/./passwd",
        ] {
            let r = a.read_file(&id, path).await;
            assert_eq!(r.status, 200, "{path}: {r:?}");
            assert_eq!(r.body, own_passwd.body, "{path} is not the sandbox's /etc/passwd");
        }
        // Directory listings and archives through links.
        let sandbox_root = entry_names(&a.get_q(&format!("{files}/list"), &[("path", "/")]).await.ok(200));
        let host_root: BTreeSet<String> = std::fs::read_dir("/")
            .expect("host /")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_ne!(sandbox_root, host_root, "the sandbox's / lists like the host's");
        for path in [
            "/home/user/updots",
            "/home/user/rootlink",
            "/home/user/../../..",
            "/home/user/rootlink/..",
        ] {
            let r = a.get_q(&format!("{files}/list"), &[("path", path)]).await;
            check(format!("list {path}"), &r);
            assert_eq!(entry_names(&r.ok(200)), sandbox_root, "list {path}");
        }
        for path in [
            "/home/user/hostdir".to_owned(),
            hd.clone(),
            format!("/home/user/procroot{hd}"),
            format!("/home/user/updots{hd}"),
            "/home/user/procroot/var/tmp".to_owned(),
            "/home/user/updots/var/tmp".to_owned(),
            "/var/tmp".to_owned(),
            "/proc/1/root".to_owned(),
            "/proc/1/root/var/tmp".to_owned(),
            "/home/user/statedir".to_owned(),
            state.clone(),
            "/home/user/ownvol".to_owned(),
        ] {
            let r = a.get_q(&format!("{files}/list"), &[("path", &path)]).await;
            check(format!("list {path}"), &r);
            let r = a.get_q(&format!("{files}/tar"), &[("path", &path)]).await;
            check(format!("tar {path}"), &r);
            let r = Client::send(
                a.request(Method::GET, &format!("{files}/watch"))
                    .query(&[("path", &path)])
                    .timeout(Duration::from_secs(2)),
            )
            .await;
            check(format!("watch {path}"), &r);
            assert_ne!(r.status, 200, "watch {path} was accepted");
        }
        let r = a.get_q(&format!("{files}/tar"), &[("path", "/home/user")]).await;
        check("tar /home/user".into(), &r);
        assert_eq!(r.status, 200);

        // Writes, renames, removals and uploads through the same links.
        let pwned = b"PWNED-THROUGH-A-LINK".to_vec();
        for path in [
            "/home/user/hostfile".to_owned(),
            "/home/user/hostdir/new.txt".to_owned(),
            "/home/user/hostdir/marker.txt".to_owned(),
            format!("/home/user/procroot{hd}/marker.txt"),
            format!("/home/user/procroot{hd}/new.txt"),
            format!("/home/user/updots{hd}/new.txt"),
            format!("/home/user/selfroot{hd}/new.txt"),
            format!("{hd}/marker.txt"),
            format!("{hd}/new.txt"),
            format!("/proc/1/root{hd}/new.txt"),
            "/home/user/hostroot".to_owned(),
            "/home/user/statedir/new.txt".to_owned(),
            format!("{state}/new.txt"),
        ] {
            let r = a.write_file(&id, &path, pwned.clone()).await;
            check(format!("write {path}"), &r);
            let r = a
                .post(&format!("{files}/mkdir"), json!({"path": format!("{path}.d"), "parents": true}))
                .await;
            check(format!("mkdir {path}.d"), &r);
        }
        for (from, to) in [
            ("/home/user/own.txt".to_owned(), "/home/user/hostdir/stolen.txt".to_owned()),
            ("/home/user/own.txt".to_owned(), format!("/home/user/procroot{hd}/stolen.txt")),
            (format!("{hd}/marker.txt"), "/home/user/got.txt".to_owned()),
            (format!("/home/user/updots{hd}/marker.txt"), "/home/user/got.txt".to_owned()),
            (format!("/proc/1/root{hd}/marker.txt"), "/home/user/got.txt".to_owned()),
        ] {
            let r = a.post(&format!("{files}/rename"), json!({"from": from, "to": to})).await;
            check(format!("rename {from} -> {to}"), &r);
        }
        for path in [
            "/home/user/hostdir/marker.txt".to_owned(),
            format!("{hd}/marker.txt"),
            hd.clone(),
            format!("/home/user/procroot{hd}"),
            format!("/home/user/updots{hd}"),
            format!("/proc/1/root{hd}"),
            "/home/user/updots/var".to_owned(),
        ] {
            let r = a.delete_q(&files, &[("path", &path), ("recursive", "true")]).await;
            check(format!("delete {path}"), &r);
        }
        for dir in ["/home/user/hostdir".to_owned(), hd.clone(), format!("/home/user/procroot{hd}")] {
            let r = Client::send(
                a.request(Method::PUT, &format!("{files}/tar"))
                    .query(&[("path", &dir)])
                    .body(tar_of(&[("marker.txt", &pwned), ("new.txt", &pwned)])),
            )
            .await;
            check(format!("tar upload into {dir}"), &r);
        }
        assert_eq!(
            a.read_file(&id, "/home/user/got.txt").await.status,
            404,
            "a host file was renamed into the sandbox"
        );

        // Relative paths and NUL bytes are refused up front.
        for bad in ["home/user/own.txt", "own.txt", "", "./own.txt", "/home/user/own.txt\0.x", "/\0"] {
            for (method, suffix) in [
                (Method::GET, ""),
                (Method::PUT, ""),
                (Method::DELETE, ""),
                (Method::GET, "/list"),
                (Method::GET, "/stat"),
                (Method::GET, "/tar"),
                (Method::PUT, "/tar"),
                (Method::GET, "/watch"),
            ] {
                let r = Client::send(
                    a.request(method.clone(), &format!("{files}{suffix}"))
                        .query(&[("path", bad)])
                        .body(Vec::new()),
                )
                .await;
                assert_eq!(
                    (r.status, r.code().as_str()),
                    (400, "invalid_path"),
                    "{method} files{suffix} path={bad:?}: {r:?}"
                );
            }
            a.post(&format!("{files}/mkdir"), json!({"path": bad}))
                .await
                .err(400, "invalid_path");
            a.post(&format!("{files}/rename"), json!({"from": bad, "to": "/home/user/x"}))
                .await
                .err(400, "invalid_path");
            a.post(&format!("{files}/rename"), json!({"from": "/home/user/own.txt", "to": bad}))
                .await
                .err(400, "invalid_path");
        }

        assert!(leaks.is_empty(), "leaks:\n{}", leaks.join("\n"));
        assert_eq!(a.read_file(&id, "/home/user/keep.txt").await.text(), "keep\n");
    });
    assert_eq!(
        snapshot(host_dir.path()),
        host_before,
        "the host directory changed"
    );
    assert_eq!(
        std::fs::read_to_string(&root_marker.path).expect("marker"),
        marker
    );
}

/// A host directory with a marker file no sandbox may see.
pub(super) fn host_marker_dir() -> (tempfile::TempDir, String) {
    let marker = unique("HOST-ONLY-MARKER");
    let dir = tempfile::Builder::new()
        .prefix("paddock-api-host-")
        .tempdir_in("/var/tmp")
        .expect("host dir");
    std::fs::write(dir.path().join("marker.txt"), &marker).expect("host marker");
    (dir, marker)
}

fn secrets_for(dir: &Path, marker: &str) -> Secrets {
    Secrets {
        marker: marker.to_owned(),
        host_only_names: vec![
            "marker.txt".into(),
            dir.file_name().expect("name").to_string_lossy().into_owned(),
        ],
        shadow_root: std::fs::read_to_string("/etc/shadow")
            .ok()
            .and_then(|s| s.lines().next().map(str::to_owned))
            .filter(|l| l.len() > 8),
    }
}

#[test]
fn file_api_under_a_symlink_swap_race() {
    let h = Harness::start();
    let (host_dir, marker) = host_marker_dir();
    let hd = host_dir.path().to_string_lossy().into_owned();
    let host_before = snapshot(host_dir.path());
    let secrets = secrets_for(host_dir.path(), &marker);
    h.block_on(async {
        let a = h.admin.new_tenant("racer").await;
        let id = a.create_sandbox(json!({})).await;
        a.sh(
            &id,
            &format!(
                "set -e; cd /home/user; mkdir rdir; echo inside-sandbox > rdir/f.txt
                 ln -s / l_root; ln -s {hd} l_host; ln -s /proc/1/root l_proc; ln -s ../../../.. l_up"
            ),
        )
        .await;
        // `race` is, in turn, a directory and symlinks to /, to the host directory's path, to the
        // agent's root through /proc and up through `..`; absent in between.
        let racer = a
            .exec_background(
                &id,
                json!({"shell": "cd /home/user; while :; do for x in rdir l_root rdir l_host rdir l_proc rdir l_up; do \
                                 mv -T $x race && mv -T race $x; done; done"}),
            )
            .await;
        let files = format!("/v1/sandboxes/{id}/files");
        let race = "/home/user/race";
        let mut tasks = Vec::new();
        for worker in 0..4 {
            let (a, id, files, hd) = (a.clone(), id.clone(), files.clone(), hd.clone());
            tasks.push(tokio::spawn(async move {
                let mut answers: Vec<(String, Reply)> = Vec::new();
                for i in 0..60 {
                    let reads = [
                        format!("{race}/f.txt"),
                        format!("{race}{hd}/marker.txt"),
                        format!("{race}/marker.txt"),
                        format!("{race}/../../../..{hd}/marker.txt"),
                        format!("{race}/../race/f.txt"),
                    ];
                    for path in &reads {
                        answers.push((format!("read {path}"), a.read_file(&id, path).await));
                        answers.push((
                            format!("stat {path}"),
                            a.get_q(&format!("{files}/stat"), &[("path", path)]).await,
                        ));
                    }
                    for dir in [race.to_owned(), format!("{race}{hd}"), format!("{race}/var/tmp")] {
                        answers.push((
                            format!("list {dir}"),
                            a.get_q(&format!("{files}/list"), &[("path", &dir)]).await,
                        ));
                    }
                    let target = format!("{race}/w-{worker}-{i}.txt");
                    answers.push((format!("write {target}"), a.write_file(&id, &target, "race-write").await));
                    let target = format!("{race}{hd}/w-{worker}-{i}.txt");
                    answers.push((format!("write {target}"), a.write_file(&id, &target, "race-write").await));
                    let dir = format!("{race}/d-{worker}-{i}");
                    answers.push((
                        format!("mkdir {dir}"),
                        a.post(&format!("{files}/mkdir"), json!({"path": dir})).await,
                    ));
                    answers.push((
                        format!("delete {dir}"),
                        a.delete_q(&files, &[("path", &dir), ("recursive", "true")]).await,
                    ));
                    answers.push((
                        format!("delete {race}/marker.txt"),
                        a.delete_q(&files, &[("path", &format!("{race}/marker.txt"))]).await,
                    ));
                }
                answers
            }));
        }
        let mut failures = Vec::new();
        let (mut inside, mut refused) = (0, 0);
        for task in tasks {
            for (what, r) in task.await.expect("worker") {
                if let Some(leak) = secrets.leak(&what, &r) {
                    failures.push(leak);
                }
                if r.status >= 500 {
                    failures.push(format!("{what}: server error {r:?}"));
                }
                if what.starts_with("read ") && what.ends_with("/race/f.txt") {
                    match r.status {
                        200 => {
                            inside += 1;
                            if r.text() != "inside-sandbox\n" {
                                failures.push(format!("{what}: unexpected content {r:?}"));
                            }
                        }
                        _ => refused += 1,
                    }
                }
            }
        }
        eprintln!("race: {inside} reads saw the directory, {refused} did not");
        a.post(&format!("/v1/sandboxes/{id}/processes/{racer}/kill"), json!(null))
            .await
            .ok(204);
        assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
        assert!(inside > 0 && refused > 0, "the race did not interleave ({inside} / {refused})");
        // Whatever was written landed in the sandbox's own directory.
        let listed = a.sh(&id, "cd /home/user && ls -A rdir | sort | tr '\\n' ' '; ls -A / | tr '\\n' ' '").await;
        assert!(!listed.contains("marker.txt"), "{listed}");
    });
    assert_eq!(
        snapshot(host_dir.path()),
        host_before,
        "the host directory changed"
    );
}

//! Export and import of snapshots as tar streams, through the REST API of an in-process service on
//! the real native backend (and the CLI against it): a round trip keeps every file, mode, owner,
//! mtime, symlink and hard link as two sandboxes see them; hostile archives are refused with a
//! stable code, write nothing outside their staging subvolume and leave no subvolume behind; another
//! tenant's snapshot cannot be exported.
//! Hostile archives in `hostile.rs`.

mod hostile;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::{
    harness::{Client, Harness, Options, Reply},
    paddock_bin,
};

/// What a sandbox reports about its whole volume: every path with its type, mode, owner, size,
/// mtime (ns), link count and symlink target, then every regular file's checksum. Workloads have no
/// capabilities, so root describes `/etc`, `/root` and `/tmp`, and `user` its own `/home`.
const DESCRIBE_ROOT: &str = r#"
find /etc /root /tmp -xdev -printf '%p %y %m %U %G %s %T@ %n %l\n' | LC_ALL=C sort
find /etc /root /tmp -xdev -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
"#;
const DESCRIBE_USER: &str = r#"
find /home -xdev -printf '%p %y %m %U %G %s %T@ %n %l\n' | LC_ALL=C sort
find /home -xdev -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
"#;

/// The tree the round trip carries, written by `user` (uid 1000): modes (setuid, a setgid
/// directory, sticky, private), absolute and relative symlinks, a hard link, an empty directory, a
/// unicode name, a name that is not UTF-8, a long path and a file large enough for many chunks.
const WRITE_USER_TREE: &str = r#"
set -e
cd /home/user
long=$(printf 'd%.0s' $(seq 1 120))
mkdir -p t/empty t/shared t/deep/$long
printf 'hello\n' > t/plain
printf '#!/bin/sh\necho run\n' > t/run.sh
printf 'secret\n' > t/private
echo unicode > 't/ünïcödé файл'
echo odd > "t/$(printf 'bad\377name')"
echo deep > t/deep/$long/$(printf 'f%.0s' $(seq 1 120))
head -c 3000000 /dev/urandom > t/big
ln -s /etc/passwd t/abs
ln -s ../plain t/shared/rel
ln t/run.sh t/shared/hard
chmod 2775 t/shared
chmod 4755 t/run.sh
chmod 600 t/private
chmod 1777 t/empty
touch -h -d '2001-02-03 04:05:06.789' t/abs
touch -d '1999-12-31 23:59:59.5' t/plain t/empty
"#;

/// Files of the sandbox's root (uid 0), where root may write.
const WRITE_ROOT_FILES: &str = r#"
set -e
echo for-root > /root/only-root
chmod 640 /root/only-root
mkdir /tmp/root-dir
echo x > /tmp/root-dir/file
ln -s ../../etc/hostname /tmp/root-dir/link
chmod 2750 /tmp/root-dir
"#;

fn as_root(script: &str) -> Value {
    json!({"shell": script, "user": "root"})
}

async fn describe(c: &Client, id: &str) -> String {
    let mut out = String::new();
    for req in [as_root(DESCRIBE_ROOT), json!({"shell": DESCRIBE_USER})] {
        let result = c.exec_json(id, req).await;
        assert_eq!(result["exit"]["exit_code"], 0, "{result:#}");
        out.push_str(result["stdout"].as_str().expect("stdout"));
    }
    out
}

/// Whether a description line is about what every sandbox writes for itself when it is created:
/// `/etc/hostname` and `/etc/hosts` (its id), and so the mtime of `/etc`.
fn per_sandbox(line: &str) -> bool {
    line.starts_with("/etc d ")
        || line.ends_with("/etc/hostname")
        || line.ends_with("/etc/hosts")
        || line.starts_with("/etc/hostname ")
        || line.starts_with("/etc/hosts ")
}

/// Asserts two descriptions are equal but for [`per_sandbox`] lines, showing only what differs.
#[track_caller]
fn assert_same(before: &str, after: &str) {
    let keep = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !per_sandbox(l))
            .map(str::to_owned)
            .collect()
    };
    let (before, after) = (keep(before), keep(after));
    assert!(before.len() > 100, "too little described: {before:?}");
    let (b, a): (BTreeSet<&String>, BTreeSet<&String>) = (before.iter().collect(), after.iter().collect());
    let lost: Vec<_> = b.difference(&a).take(20).collect();
    let gained: Vec<_> = a.difference(&b).take(20).collect();
    assert!(
        lost.is_empty() && gained.is_empty() && before == after,
        "only in the source:\n{lost:#?}\nonly in the copy:\n{gained:#?}"
    );
}

async fn export(c: &Client, snapshot: &str) -> Reply {
    Client::send(c.request(Method::GET, &format!("/v1/snapshots/{snapshot}/export"))).await
}

/// An export that keeps setuid and setgid bits (a default export clears them).
async fn export_keeping_setid(c: &Client, snapshot: &str) -> Reply {
    Client::send(
        c.request(Method::GET, &format!("/v1/snapshots/{snapshot}/export"))
            .query(&[("keep_setid", "true")]),
    )
    .await
}

async fn import(c: &Client, archive: Vec<u8>, query: &[(&str, &str)]) -> Reply {
    Client::send(
        c.request(Method::POST, "/v1/snapshots/import")
            .query(query)
            .header("content-type", "application/x-tar")
            .body(archive),
    )
    .await
}

/// Names of the subvolumes (and files) under `<pool>/<dir>`.
fn pool_entries(h: &Harness, dir: &str) -> BTreeSet<String> {
    std::fs::read_dir(h.env().state().join("pool").join(dir))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_snapshot_round_trips_through_export_and_import() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("exporter").await;
        let b = h.admin.new_tenant("other").await;
        let id = a.create_sandbox(json!({})).await;
        a.sh(&id, WRITE_USER_TREE).await;
        let wrote = a.exec_json(&id, as_root(WRITE_ROOT_FILES)).await;
        assert_eq!(wrote["exit"]["exit_code"], 0, "{wrote:#}");
        let before = describe(&a, &id).await;
        for expected in [
            "/home/user/t/shared d 2775 1000 1000",
            "/home/user/t/run.sh f 4755 1000 1000 19 ",
            "/home/user/t/empty d 1777 1000 1000 ",
            "/root/only-root f 640 0 0",
            "/tmp/root-dir d 2750 0 0",
            "/home/user/t/abs l 777 1000 1000 11 981173106.7890000000 1 /etc/passwd",
        ] {
            assert!(before.contains(expected), "{expected} in {before}");
        }
        let snap = a
            .post(&format!("/v1/sandboxes/{id}/snapshots"), json!({"name": "source"}))
            .await
            .ok(201);
        let sid = snap["id"].as_str().expect("id").to_owned();

        // The round trip is exact when set-id bits are asked for ...
        let exported = export_keeping_setid(&a, &sid).await;
        assert_eq!(exported.status, 200, "{exported:?}");
        assert_eq!(exported.content_type, "application/x-tar");
        let archive = exported.body.to_vec();
        assert!(archive.len() > 3_000_000 && archive.len().is_multiple_of(512), "{}", archive.len());

        // ... and by default the same members come without them.
        let plain = export(&a, &sid).await;
        assert_eq!(plain.status, 200, "{plain:?}");
        let modes: BTreeMap<String, u32> = tar::Archive::new(&plain.body[..])
            .entries()
            .expect("entries")
            .map(|e| {
                let e = e.expect("entry");
                (
                    String::from_utf8_lossy(&e.path_bytes()).into_owned(),
                    e.header().mode().expect("mode"),
                )
            })
            .collect();
        assert_eq!(modes["home/user/t/run.sh"], 0o755, "setuid cleared");
        assert_eq!(modes["home/user/t/shared/"], 0o775, "setgid cleared");
        assert_eq!(modes["home/user/t/empty/"], 0o1777, "sticky kept");
        assert_eq!(plain.body.len(), archive.len());

        // Another tenant cannot export it (nor tell it exists).
        let foreign = export(&b, &sid).await;
        foreign.err(404, "snapshot_not_found");
        let missing = export(&b, "sn-0000000000000000").await;
        assert_eq!(foreign.json(), {
            let mut m = missing.json();
            m["message"] = json!(format!("snapshot {sid} not found"));
            m
        });

        let imported = import(
            &a,
            archive.clone(),
            &[("name", "moved"), ("labels", r#"{"from":"host-a"}"#)],
        )
        .await
        .ok(201);
        let iid = imported["id"].as_str().expect("id").to_owned();
        assert_ne!(iid, sid);
        assert_eq!(imported["sandbox_id"], Value::Null);
        assert_eq!(imported["name"], "moved");
        assert_eq!(imported["labels"]["from"], "host-a");
        let got = a.get(&format!("/v1/snapshots/{iid}")).await.ok(200);
        assert_eq!(got["kind"], "snapshot");
        assert!(got["referenced_bytes"].as_u64().is_some_and(|b| b >= 3_000_000), "{got}");

        // A sandbox made from the imported snapshot sees exactly what the source sandbox saw.
        let copy = a.create_sandbox(json!({"snapshot": iid})).await;
        let after = describe(&a, &copy).await;
        assert_same(&before, &after);
        assert_eq!(
            a.sh(
                &copy,
                "cat /home/user/t/shared/rel; readlink /home/user/t/abs; stat -c '%h %i' /home/user/t/run.sh \
                 | cut -d' ' -f1; [ $(stat -c %i /home/user/t/run.sh) = $(stat -c %i /home/user/t/shared/hard) ] && echo same"
            )
            .await,
            "hello\n/etc/passwd\n2\nsame\n"
        );
        // It is writable like any sandbox, and the snapshot itself stays as imported.
        a.sh(&copy, "echo changed > /home/user/t/plain").await;
        let again = a.create_sandbox(json!({"snapshot": iid})).await;
        assert_eq!(a.sh(&again, "cat /home/user/t/plain").await, "hello\n");

        // Export of the imported snapshot gives an equivalent archive (same size: same members).
        let re = export_keeping_setid(&a, &iid).await;
        assert_eq!(re.status, 200);
        assert_eq!(re.body.len(), archive.len());

        // Tenant B sees none of it.
        b.get(&format!("/v1/snapshots/{iid}")).await.err(404, "snapshot_not_found");
        b.post("/v1/sandboxes", json!({"snapshot": iid}))
            .await
            .err(404, "snapshot_not_found");
        export(&b, &iid).await.err(404, "snapshot_not_found");

        // Audit rows with byte counts.
        let rows = a.audit_rows(&[("action", "snapshot.")]).await;
        let row = |action: &str| {
            rows.iter()
                .find(|r| r["action"] == action && r["outcome"] == "ok")
                .unwrap_or_else(|| panic!("no {action} row in {rows:#?}"))
                .clone()
        };
        let exp = row("snapshot.export");
        assert_eq!(exp["detail"]["bytes_out"], archive.len() as u64, "{exp}");
        assert_eq!(exp["detail"]["snapshot"], sid.as_str());
        let imp = row("snapshot.import");
        assert_eq!(imp["detail"]["bytes_in"], archive.len() as u64, "{imp}");
        assert_eq!(imp["detail"]["snapshot"], iid.as_str());

        a.delete(&format!("/v1/snapshots/{iid}")).await.ok(204);
        a.delete(&format!("/v1/snapshots/{sid}")).await.ok(204);
    });
}

fn cli(h: &Harness, key: &str, args: &[&str], stdin: Option<&Path>) -> Output {
    let mut c = Command::new(paddock_bin());
    c.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("PADDOCK_URL", &h.base)
        .env("PADDOCK_API_KEY", key)
        .args(args);
    match stdin {
        Some(path) => c.stdin(std::fs::File::open(path).expect("stdin file")),
        None => c.stdin(Stdio::null()),
    };
    c.output().expect("paddock runs")
}

#[test]
fn cli_export_and_import() {
    let h = Harness::start();
    let a = h.block_on(h.admin.new_tenant("cli"));
    let key = a.key.clone().expect("key");
    let (id, sid) = h.block_on(async {
        let id = a.create_sandbox(json!({})).await;
        a.sh(
            &id,
            "echo carried > /home/user/note && ln -s note /home/user/link",
        )
        .await;
        let snap = a
            .post(&format!("/v1/sandboxes/{id}/snapshots"), json!(null))
            .await
            .ok(201);
        (id, snap["id"].as_str().expect("id").to_owned())
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("snap.tar");

    let out = cli(
        &h,
        &key,
        &["snapshot", "export", &sid, "-o", file.to_str().expect("utf-8")],
        None,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let size = std::fs::metadata(&file).expect("written").len();
    assert!(size > 0 && size.is_multiple_of(512), "{size}");
    // To stdout (not a terminal here) it is the same archive, with set-id bits kept or not.
    let out = cli(&h, &key, &["snapshot", "export", &sid], None);
    assert!(out.status.success());
    assert_eq!(out.stdout.len() as u64, size);
    let out = cli(&h, &key, &["snapshot", "export", "--keep-setid", &sid], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout.len() as u64, size);

    let out = cli(
        &h,
        &key,
        &[
            "snapshot",
            "import",
            file.to_str().expect("utf-8"),
            "--name",
            "from-cli",
            "--label",
            "k=v",
            "--json",
        ],
        None,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let info: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(info["name"], "from-cli");
    assert_eq!(info["labels"]["k"], "v");
    let out = cli(&h, &key, &["snapshot", "import", "-"], Some(&file));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let iid = String::from_utf8(out.stdout).expect("utf-8").trim().to_owned();
    assert!(iid.starts_with("sn-"), "{iid}");
    let out = cli(&h, &key, &["snapshot", "ls"], None);
    assert!(String::from_utf8_lossy(&out.stdout).contains("(imported)"));

    h.block_on(async {
        let copy = a.create_sandbox(json!({"snapshot": iid})).await;
        assert_eq!(a.sh(&copy, "cat /home/user/link").await, "carried\n");
        let _ = id;
    });

    // Bad input: one line with the code, exit status 1; a missing snapshot likewise.
    let bad = dir.path().join("bad.tar");
    std::fs::write(&bad, vec![b'x'; 2048]).expect("write");
    let out = cli(
        &h,
        &key,
        &["snapshot", "import", bad.to_str().expect("utf-8")],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("(invalid_archive)") && err.lines().count() == 1,
        "{err}"
    );
    let out = cli(
        &h,
        &key,
        &[
            "snapshot",
            "export",
            "sn-0000000000000000",
            "-o",
            bad.to_str().expect("utf-8"),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("(snapshot_not_found)"));
}

#[test]
fn gc_removes_the_staging_subvolume_of_an_interrupted_import() {
    let h = Harness::start();
    let imports = h.env().state().join("pool/imports");
    std::fs::create_dir_all(&imports).expect("imports dir");
    // What a server killed in the middle of two imports leaves: staging subvolumes with files. One
    // import's lock is still held (its process lives): that one must stay.
    for name in ["sn-00000000000000aa", "sn-00000000000000bb"] {
        paddock_sys::btrfs::create_subvolume(&imports, name).expect("staging subvolume");
        std::fs::write(imports.join(name).join("partial"), "half an archive").expect("write");
    }
    let held = std::fs::File::create(imports.join("sn-00000000000000bb.lock")).expect("lock file");
    rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive).expect("flock");
    let gc = |h: &Harness| {
        let out = h.env().cmd().arg("gc").output().expect("paddock gc");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    gc(&h);
    assert_eq!(
        pool_entries(&h, "imports"),
        BTreeSet::from([
            "sn-00000000000000bb".to_owned(),
            "sn-00000000000000bb.lock".to_owned()
        ]),
        "the abandoned import is gone, the live one kept"
    );
    drop(held);
    gc(&h);
    assert_eq!(pool_entries(&h, "imports"), BTreeSet::new());
}

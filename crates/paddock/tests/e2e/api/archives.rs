//! Tar archives through the file API: a tree round-trips (download, upload elsewhere, same files),
//! and hand-made hostile archives (`..`, absolute names, links out) write nothing outside their
//! target directory, on the host or in the sandbox.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use reqwest::Method;
use serde_json::json;

use crate::support::harness::{Client, Harness};

use super::path_attacks::{host_marker_dir, snapshot};
use super::unique;

/// One member of a hand-made tar archive (names written raw: `..` and absolute paths included).
enum Member<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
}

/// A tar archive written byte by byte, so nothing sanitizes the names.
fn raw_tar(members: &[Member<'_>]) -> Vec<u8> {
    fn put(field: &mut [u8], text: &str) {
        assert!(
            text.len() < field.len(),
            "name too long for the test's tar: {text}"
        );
        field.fill(0);
        field[..text.len()].copy_from_slice(text.as_bytes());
    }
    let mut out = Vec::new();
    for m in members {
        let mut h = tar::Header::new_old();
        let (name, data, kind, link): (&str, &[u8], tar::EntryType, &str) = match m {
            Member::File(n, d) => (n, d, tar::EntryType::Regular, ""),
            Member::Dir(n) => (n, b"", tar::EntryType::Directory, ""),
            Member::Symlink(n, l) => (n, b"", tar::EntryType::Symlink, l),
            Member::Hardlink(n, l) => (n, b"", tar::EntryType::Link, l),
        };
        put(&mut h.as_old_mut().name, name);
        put(&mut h.as_old_mut().linkname, link);
        h.set_size(data.len() as u64);
        h.set_mode(if matches!(m, Member::Dir(_)) { 0o755 } else { 0o644 });
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        h.set_entry_type(kind);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// Paths under `root` (recursively, not following symlinks) whose name contains `needle`.
fn host_paths_containing(root: &Path, needle: &str, depth: usize) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(rd) = std::fs::read_dir(root) else {
        return found;
    };
    for e in rd.flatten() {
        let path = e.path();
        if e.file_name().to_string_lossy().contains(needle) {
            found.push(path.clone());
        }
        if depth > 0 && e.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(host_paths_containing(&path, needle, depth - 1));
        }
    }
    found
}

#[test]
fn tar_uploads_cannot_escape_the_target_directory() {
    let h = Harness::start();
    let (host_dir, _) = host_marker_dir();
    let hd = host_dir.path().to_string_lossy().into_owned();
    let host_before = snapshot(host_dir.path());
    let r = unique("tarx").replace('-', "");
    h.block_on(async {
        let a = h.admin.new_tenant("uploader").await;
        let id = a.create_sandbox(json!({})).await;
        a.sh(&id, "echo keep > /home/user/keep.txt; mkdir /home/user/sub; echo keep > /home/user/sub/keep.txt")
            .await;
        let pwned: &[u8] = b"PWNED";
        let names: Vec<String> = (0..40).map(|i| format!("{r}{i}")).collect();
        let n = |i: usize| names[i].as_str();
        let (f0, f1, f2, f3, f4) = (
            format!("../../{}", n(0)),
            format!("../../../../../../../tmp/{}", n(1)),
            format!("/{}", n(2)),
            format!("/tmp/{}", n(3)),
            format!("/home/user/{}", n(4)),
        );
        let (l5, l5f) = (n(5).to_owned(), format!("{}/keep.txt", n(5)));
        let (l6, l6f) = (n(6).to_owned(), format!("{}/keep.txt", n(6)));
        let (l7, l7f) = (n(7).to_owned(), format!("{}/marker.txt", n(7)));
        let (l8, l8f) = (n(8).to_owned(), format!("{}/keep.txt", n(8)));
        let (d12, d12s, d12f) = (n(12).to_owned(), format!("{}/s", n(12)), format!("{}/s/keep.txt", n(12)));
        let host_target = "/proc/1/root/home/user";
        let archives: Vec<(&str, Vec<u8>)> = vec![
            (
                "dot-dot and absolute members",
                raw_tar(&[
                    Member::File(&f0, pwned),
                    Member::File(&f1, pwned),
                    Member::File(&f2, pwned),
                    Member::File(&f3, pwned),
                    Member::File(&f4, pwned),
                    Member::File(n(13), b"ok"),
                ]),
            ),
            (
                "a symlink member, then a file through it",
                raw_tar(&[
                    Member::Symlink(&l5, "/home/user"),
                    Member::File(&l5f, pwned),
                    Member::Symlink(&l6, ".."),
                    Member::File(&l6f, pwned),
                    Member::Symlink(&l7, &hd),
                    Member::File(&l7f, pwned),
                    Member::Symlink(&l8, host_target),
                    Member::File(&l8f, pwned),
                ]),
            ),
            (
                "a symlink member, then a file of the same name",
                raw_tar(&[
                    Member::Symlink(n(9), "/home/user/keep.txt"),
                    Member::File(n(9), pwned),
                    Member::Symlink(n(10), "../keep.txt"),
                    Member::File(n(10), pwned),
                ]),
            ),
            (
                "hard links out of the target",
                raw_tar(&[
                    Member::Hardlink(n(11), "/home/user/keep.txt"),
                    Member::File(n(11), pwned),
                    Member::Hardlink(n(14), "../keep.txt"),
                    Member::File(n(14), pwned),
                ]),
            ),
            (
                "a symlink inside a directory member",
                raw_tar(&[
                    Member::Dir(&d12),
                    Member::Symlink(&d12s, "/home/user/sub"),
                    Member::File(&d12f, pwned),
                ]),
            ),
        ];
        for (i, (what, archive)) in archives.iter().enumerate() {
            let target = format!("/home/user/up{i}");
            let resp = Client::send(
                a.request(Method::PUT, &format!("/v1/sandboxes/{id}/files/tar"))
                    .query(&[("path", &target)])
                    .body(archive.clone()),
            )
            .await;
            eprintln!("{what}: {resp:?}");
            assert!(
                resp.status == 204 || (resp.status == 400 && resp.code() == "invalid_request"),
                "{what}: the upload neither succeeded nor failed cleanly: {resp:?}"
            );
            for keep in ["/home/user/keep.txt", "/home/user/sub/keep.txt"] {
                let r = a.read_file(&id, keep).await;
                assert_eq!(r.text(), "keep\n", "{what} changed {keep}");
            }
            // Inside the sandbox nothing of the archive lives outside the target directory.
            let stray = a
                .sh(
                    &id,
                    &format!("find / -xdev -name '*{r}*' 2>/dev/null; find /home /tmp /root /etc -name '*{r}*' | grep -v '^/home/user/up[0-9]*/' || true"),
                )
                .await;
            assert_eq!(stray.trim(), "", "{what}: members outside the target: {stray}");
        }
        // The plain member of the first archive did land.
        assert_eq!(a.read_file(&id, &format!("/home/user/up0/{}", n(13))).await.text(), "ok");
        // Nothing on the host: not in the usual places, not in the sandbox's own volume outside the
        // target directories.
        let vol = crate::support::volume_of(h.env(), &id);
        for root in ["/", "/tmp", "/var/tmp", "/root", "/home", "/etc", hd.as_str()] {
            let hits = host_paths_containing(Path::new(root), &r, 0);
            assert!(hits.is_empty(), "archive members on the host: {hits:?}");
        }
        let hits: Vec<PathBuf> = host_paths_containing(h.env().state(), &r, 3)
            .into_iter()
            .filter(|p| !p.starts_with(vol.join("home/user")))
            .collect();
        assert!(hits.is_empty(), "archive members in the state directory: {hits:?}");
        let hits: Vec<PathBuf> = host_paths_containing(&vol, &r, 6)
            .into_iter()
            .filter(|p| {
                !p.strip_prefix(vol.join("home/user"))
                    .ok()
                    .and_then(|rest| rest.components().next())
                    .is_some_and(|c| c.as_os_str().to_string_lossy().starts_with("up"))
            })
            .collect();
        assert!(hits.is_empty(), "archive members outside the target in the volume: {hits:?}");
    });
    assert_eq!(
        snapshot(host_dir.path()),
        host_before,
        "the host directory changed"
    );
}

#[test]
fn tar_round_trip_of_a_tree() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("tarball").await;
        let id = a.create_sandbox(json!({})).await;
        a.sh(
            &id,
            "set -e; mkdir -p /home/user/tree/sub/deeper /home/user/tree/empty
             echo alpha > /home/user/tree/a.txt; chmod 640 /home/user/tree/a.txt
             printf 'beta' > /home/user/tree/sub/b.txt
             head -c 300000 /dev/urandom > /home/user/tree/sub/deeper/c.bin
             printf '#!/bin/sh\\necho run\\n' > /home/user/tree/run.sh; chmod 755 /home/user/tree/run.sh
             ln -s sub/b.txt /home/user/tree/link",
        )
        .await;
        let resp = a
            .request(Method::GET, &format!("/v1/sandboxes/{id}/files/tar"))
            .query(&[("path", "/home/user/tree")])
            .send()
            .await
            .expect("download");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "application/x-tar");
        let archive = resp.bytes().await.expect("archive");
        // What the archive holds, read with the tar crate.
        let mut members = BTreeMap::new();
        let mut reader = tar::Archive::new(archive.as_ref());
        for entry in reader.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            let path = entry.path().expect("path").to_string_lossy().trim_start_matches("./").to_owned();
            let kind = entry.header().entry_type();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).expect("data");
            let link = entry
                .link_name()
                .ok()
                .flatten()
                .map(|l| l.to_string_lossy().into_owned());
            members.insert(path, (kind, data, link, entry.header().mode().unwrap_or(0)));
        }
        let names: BTreeSet<&str> = members.keys().map(String::as_str).filter(|n| !n.is_empty()).collect();
        for expected in ["a.txt", "sub/b.txt", "sub/deeper/c.bin", "empty/", "run.sh", "link"] {
            let found = names.contains(expected) || names.contains(expected.trim_end_matches('/'));
            assert!(found, "{expected} missing from {names:?}");
        }
        assert_eq!(members["a.txt"].1, b"alpha\n");
        assert_eq!(members["a.txt"].3 & 0o777, 0o640);
        assert_eq!(members["sub/deeper/c.bin"].1.len(), 300_000);
        assert_eq!(members["link"].0, tar::EntryType::Symlink);
        assert_eq!(members["link"].2.as_deref(), Some("sub/b.txt"));

        // Upload it elsewhere (the target is created) and compare the trees inside the sandbox.
        Client::send(
            a.request(Method::PUT, &format!("/v1/sandboxes/{id}/files/tar"))
                .query(&[("path", "/home/user/copy/of/tree")])
                .body(archive.to_vec()),
        )
        .await
        .ok(204);
        let digest = "cd \"$1\" && find . | sort && find . -type f -exec sha256sum {} + | sort && find . -printf '%p %m %y %l\\n' | sort";
        let original = a
            .exec_json(&id, json!({"argv": ["sh", "-c", digest, "sh", "/home/user/tree"]}))
            .await;
        let copy = a
            .exec_json(&id, json!({"argv": ["sh", "-c", digest, "sh", "/home/user/copy/of/tree"]}))
            .await;
        assert_eq!(original["exit"]["exit_code"], 0, "{original}");
        assert_eq!(original["stdout"], copy["stdout"], "the copy differs");
        let run = a.exec_json(&id, json!({"argv": ["/home/user/copy/of/tree/run.sh"]})).await;
        assert_eq!(run["stdout"], "run\n");
        // Uploaded files belong to the sandbox's user.
        let s = a
            .get_q(&format!("/v1/sandboxes/{id}/files/stat"), &[("path", "/home/user/copy/of/tree/a.txt")])
            .await
            .ok(200);
        assert_eq!(s["uid"], 1000);
        // A body that is not a tar fails cleanly and leaves the sandbox usable.
        let r = Client::send(
            a.request(Method::PUT, &format!("/v1/sandboxes/{id}/files/tar"))
                .query(&[("path", "/home/user/garbage")])
                .body(vec![b'x'; 10_000]),
        )
        .await;
        r.err(400, "invalid_request");
        assert_eq!(a.sh(&id, "echo still-here").await, "still-here\n");
    });
}

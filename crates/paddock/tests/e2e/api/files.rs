//! The file API: a 64 MiB file streamed both ways without being buffered, every file operation and
//! its error codes, watches, and files whose size is unknown or that are not regular (a fifo).

use std::time::Instant;

use futures_util::StreamExt as _;
use reqwest::Method;
use serde_json::{json, Value};

use crate::support::{
    harness::{Client, Harness, Lines, Reply},
    skip,
};

use super::{NDJSON, SOON};

/// A kB figure from /proc/self/status.
fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Deterministic, incompressible-looking bytes: chunk `i` of `CHUNK`.
fn pseudo_random_chunk(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// SHA-256 (hex) of the test's 64 MiB file, computed by the host's `sha256sum` from a pipe.
fn host_sha256(chunks: u64, chunk: usize) -> String {
    use std::io::Write as _;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum runs");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        for i in 0..chunks {
            stdin
                .write_all(&pseudo_random_chunk(i, chunk))
                .expect("feed sha256sum");
        }
    }
    let out = child.wait_with_output().expect("sha256sum");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("a digest")
        .to_owned()
}

#[test]
fn a_64_mib_file_streams_both_ways() {
    const CHUNK: usize = 1 << 20;
    const CHUNKS: u64 = 64;
    let h = Harness::start();
    let expected_sha = host_sha256(CHUNKS, CHUNK);
    h.block_on(async {
        let a = h.admin.new_tenant("bulk").await;
        let id = a.create_sandbox(json!({"limits": {"disk": "1G"}})).await;

        // Peak RSS of this process (server and client both live here) is reset, then measured.
        let rss_before = proc_status_kib("VmRSS:");
        let hwm_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        let body = futures_util::stream::iter(0..CHUNKS).then(|i| async move {
            Ok::<_, std::io::Error>(bytes::Bytes::from(pseudo_random_chunk(i, CHUNK)))
        });
        let written = a
            .write_file(&id, "/home/user/big.bin", reqwest::Body::wrap_stream(body))
            .await
            .ok(200);
        assert_eq!(written["bytes"], CHUNKS * CHUNK as u64);
        // Read back as a stream and compared byte for byte with what was sent.
        let mut resp = a
            .request(Method::GET, &format!("/v1/sandboxes/{id}/files"))
            .query(&[("path", "/home/user/big.bin")])
            .send()
            .await
            .expect("download");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.content_length(), Some(CHUNKS * CHUNK as u64));
        let mut offset = 0usize;
        let mut current: (u64, Vec<u8>) = (0, pseudo_random_chunk(0, CHUNK));
        while let Some(chunk) = tokio::time::timeout(SOON, resp.chunk())
            .await
            .expect("download progresses")
            .expect("download chunk")
        {
            for &byte in chunk.iter() {
                let (index, within) = ((offset / CHUNK) as u64, offset % CHUNK);
                assert!(index < CHUNKS, "the download is longer than the file");
                if current.0 != index {
                    current = (index, pseudo_random_chunk(index, CHUNK));
                }
                assert_eq!(byte, current.1[within], "the download differs at byte {offset}");
                offset += 1;
            }
        }
        assert_eq!(offset as u64, CHUNKS * CHUNK as u64, "the download is short");
        let peak = proc_status_kib("VmHWM:");
        eprintln!(
            "RSS before {rss_before} KiB, peak during the transfer {peak} KiB (peak reset: {hwm_reset})"
        );
        // Only meaningful when this test has the process to itself (nextest's process per test);
        // under `cargo test` other tests' sandboxes and streams share the figure.
        let alone = std::env::var("NEXTEST_EXECUTION_MODE").is_ok_and(|m| m == "process-per-test");
        if hwm_reset && alone {
            let grown = peak.saturating_sub(rss_before);
            assert!(
                grown < 32 * 1024,
                "the 64 MiB round trip grew the process by {grown} KiB: the file was buffered"
            );
        } else {
            skip("the memory check: it needs nextest's process per test and /proc/self/clear_refs");
        }
        // The sandbox holds the same bytes.
        let sum = a.sh(&id, "sha256sum /home/user/big.bin | cut -d' ' -f1").await;
        assert_eq!(sum.trim(), expected_sha);
        // The audit row counts the bytes.
        let rows = a.audit_rows(&[("action", "file.write")]).await;
        assert_eq!(
            rows.last().expect("file.write row")["detail"]["bytes_in"],
            CHUNKS * CHUNK as u64
        );
    });
}

async fn fstat(a: &Client, id: &str, path: &str) -> Reply {
    a.get_q(&format!("/v1/sandboxes/{id}/files/stat"), &[("path", path)])
        .await
}

async fn flist(a: &Client, id: &str, path: &str) -> Reply {
    a.get_q(&format!("/v1/sandboxes/{id}/files/list"), &[("path", path)])
        .await
}

async fn fmkdir(a: &Client, id: &str, body: Value) -> Reply {
    a.post(&format!("/v1/sandboxes/{id}/files/mkdir"), body).await
}

async fn frename(a: &Client, id: &str, from: &str, to: &str) -> Reply {
    a.post(
        &format!("/v1/sandboxes/{id}/files/rename"),
        json!({"from": from, "to": to}),
    )
    .await
}

#[test]
fn file_operations_and_their_errors() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("files").await;
        let id = a.create_sandbox(json!({})).await;
        let files = format!("/v1/sandboxes/{id}/files");

        // mkdir
        let made = fmkdir(&a, &id, json!({"path": "/home/user/t"})).await.ok(201);
        assert_eq!(
            (made["kind"].as_str(), made["path"].as_str()),
            (Some("dir"), Some("/home/user/t"))
        );
        assert_eq!(made["mode"].as_u64().map(|m| m & 0o7777), Some(0o755));
        assert_eq!(made["uid"], 1000, "owned by the sandbox's user: {made}");
        fmkdir(&a, &id, json!({"path": "/home/user/t"}))
            .await
            .err(409, "already_exists");
        fmkdir(&a, &id, json!({"path": "/home/user/t", "parents": true}))
            .await
            .ok(201);
        fmkdir(&a, &id, json!({"path": "/home/user/nope/deeper"}))
            .await
            .err(404, "file_not_found");
        let deep = fmkdir(
            &a,
            &id,
            json!({"path": "/home/user/t/a/b/c", "parents": true, "mode": 0o700}),
        )
        .await
        .ok(201);
        assert_eq!(deep["mode"].as_u64().map(|m| m & 0o7777), Some(0o700));
        let owned = fmkdir(&a, &id, json!({"path": "/home/user/t/rootdir", "user": "root"}))
            .await
            .ok(201);
        assert_eq!(owned["uid"], 0);

        // write / read / stat / list
        let w = Client::send(
            a.request(Method::PUT, &files)
                .query(&[("path", "/home/user/t/a.txt"), ("mode", "600")])
                .body("hello"),
        )
        .await
        .ok(200);
        assert_eq!(w, json!({"path": "/home/user/t/a.txt", "bytes": 5}));
        assert_eq!(a.read_file(&id, "/home/user/t/a.txt").await.text(), "hello");
        let s = fstat(&a, &id, "/home/user/t/a.txt").await.ok(200);
        assert_eq!(s["kind"], "file");
        assert_eq!(s["size"], 5);
        assert_eq!(s["name"], "a.txt");
        assert_eq!(s["mode"].as_u64().map(|m| m & 0o7777), Some(0o600));
        assert_eq!(s["uid"], 1000);
        assert!(s["modified_at"].as_str().is_some_and(|t| t.ends_with('Z')), "{s}");
        // Replacing truncates; an empty body makes an empty file.
        a.write_file(&id, "/home/user/t/a.txt", "hi").await.ok(200);
        assert_eq!(a.read_file(&id, "/home/user/t/a.txt").await.text(), "hi");
        a.write_file(&id, "/home/user/t/empty", Vec::new()).await.ok(200);
        let empty = a.read_file(&id, "/home/user/t/empty").await;
        assert_eq!((empty.status, empty.body.len()), (200, 0));
        Client::send(
            a.request(Method::PUT, &files)
                .query(&[("path", "/home/user/t/x"), ("mode", "rw-r--r--")])
                .body("x"),
        )
        .await
        .err(400, "invalid_request");
        a.sh(&id, "ln -s /etc/passwd /home/user/t/link").await;
        let l = fstat(&a, &id, "/home/user/t/link").await.ok(200);
        assert_eq!(
            (l["kind"].as_str(), l["symlink_target"].as_str()),
            (Some("symlink"), Some("/etc/passwd"))
        );
        let listing = flist(&a, &id, "/home/user/t").await.ok(200);
        let entries = listing["entries"].as_array().expect("entries");
        let names: Vec<&str> = entries.iter().filter_map(|e| e["name"].as_str()).collect();
        assert_eq!(
            names,
            ["a", "a.txt", "empty", "link", "rootdir"],
            "sorted by name"
        );
        for e in entries {
            assert_eq!(
                e["path"].as_str(),
                Some(format!("/home/user/t/{}", e["name"].as_str().expect("name")).as_str())
            );
        }
        assert_eq!(
            entries
                .iter()
                .map(|e| e["kind"].as_str().unwrap_or(""))
                .collect::<Vec<_>>(),
            ["dir", "file", "file", "symlink", "dir"]
        );
        assert_eq!(
            flist(&a, &id, "/home/user/t/").await.ok(200)["entries"]
                .as_array()
                .map(Vec::len),
            Some(5)
        );

        // error codes
        a.read_file(&id, "/home/user/t/missing")
            .await
            .err(404, "file_not_found");
        fstat(&a, &id, "/home/user/t/missing")
            .await
            .err(404, "file_not_found");
        flist(&a, &id, "/home/user/t/missing")
            .await
            .err(404, "file_not_found");
        a.read_file(&id, "/home/user/t").await.err(400, "is_a_directory");
        flist(&a, &id, "/home/user/t/a.txt")
            .await
            .err(400, "not_a_directory");
        a.write_file(&id, "/home/user/t/a.txt/sub", "x")
            .await
            .err(400, "not_a_directory");
        a.write_file(&id, "/home/user/t", "x")
            .await
            .err(400, "is_a_directory");
        a.write_file(&id, "/home/user/t/missing/x", "x")
            .await
            .err(404, "file_not_found");
        fmkdir(&a, &id, json!({"path": "/home/user/t/a.txt"}))
            .await
            .err(409, "already_exists");
        fmkdir(
            &a,
            &id,
            json!({"path": "/home/user/t/a.txt/sub", "parents": true}),
        )
        .await
        .err(400, "not_a_directory");
        a.delete_q(&files, &[("path", "/home/user/t")])
            .await
            .err(409, "directory_not_empty");
        a.delete_q(&files, &[("path", "/home/user/t/missing")])
            .await
            .err(404, "file_not_found");
        a.delete_q(&files, &[("path", "/")])
            .await
            .err(400, "invalid_path");
        a.delete_q(&files, &[("path", "/"), ("recursive", "true")])
            .await
            .err(400, "invalid_path");
        a.get_q(&format!("{files}/tar"), &[("path", "/home/user/t/a.txt")])
            .await
            .err(400, "not_a_directory");
        a.get_q(&format!("{files}/tar"), &[("path", "/home/user/t/missing")])
            .await
            .err(404, "file_not_found");
        // The sandbox's own permissions: its user cannot write a root-only directory... but the
        // file API acts as the sandbox's root, so only read-only places refuse.
        let r = a.write_file(&id, "/usr/bin/paddock-was-here", "x").await;
        assert_eq!((r.status, r.code().as_str()), (403, "permission_denied"), "{r:?}");

        // rename
        let moved = frename(&a, &id, "/home/user/t/a.txt", "/home/user/t/b.txt")
            .await
            .ok(200);
        assert_eq!(
            (moved["path"].as_str(), moved["name"].as_str()),
            (Some("/home/user/t/b.txt"), Some("b.txt"))
        );
        fstat(&a, &id, "/home/user/t/a.txt")
            .await
            .err(404, "file_not_found");
        assert_eq!(a.read_file(&id, "/home/user/t/b.txt").await.text(), "hi");
        frename(&a, &id, "/home/user/t/missing", "/home/user/t/c")
            .await
            .err(404, "file_not_found");
        frename(&a, &id, "/home/user/t/b.txt", "/home/user/t/a")
            .await
            .err(400, "is_a_directory");
        frename(&a, &id, "/home/user/t/a", "/home/user/t/b.txt")
            .await
            .err(400, "not_a_directory");
        a.write_file(&id, "/home/user/t/a/inner", "x").await.ok(200);
        frename(&a, &id, "/home/user/t/rootdir", "/home/user/t/a")
            .await
            .err(409, "directory_not_empty");
        // Over an existing file: replaced.
        a.write_file(&id, "/home/user/t/c.txt", "c").await.ok(200);
        frename(&a, &id, "/home/user/t/c.txt", "/home/user/t/b.txt")
            .await
            .ok(200);
        assert_eq!(a.read_file(&id, "/home/user/t/b.txt").await.text(), "c");

        // delete
        a.delete_q(&files, &[("path", "/home/user/t/b.txt")])
            .await
            .ok(204);
        a.delete_q(&files, &[("path", "/home/user/t/rootdir")])
            .await
            .ok(204);
        a.delete_q(&files, &[("path", "/home/user/t/link")]).await.ok(204);
        assert_eq!(
            a.read_file(&id, "/etc/passwd").await.status,
            200,
            "removing a link spares its target"
        );
        a.delete_q(&files, &[("path", "/home/user/t"), ("recursive", "true")])
            .await
            .ok(204);
        fstat(&a, &id, "/home/user/t").await.err(404, "file_not_found");
    });
}

#[test]
fn watch_reports_changes_made_through_the_api() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("watcher").await;
        let id = a.create_sandbox(json!({})).await;
        let files = format!("/v1/sandboxes/{id}/files");
        a.post(&format!("{files}/mkdir"), json!({"path": "/home/user/w"}))
            .await
            .ok(201);
        let resp = a
            .request(Method::GET, &format!("{files}/watch"))
            .query(&[("path", "/home/user/w"), ("recursive", "true")])
            .send()
            .await
            .expect("watch");
        assert_eq!(resp.status(), 200);
        assert!(resp.headers()["content-type"]
            .to_str()
            .expect("ct")
            .starts_with(NDJSON));
        let mut events = Lines::new(resp);
        let mut seen: Vec<(String, String, bool)> = Vec::new();
        async fn wait_for(
            events: &mut Lines,
            seen: &mut Vec<(String, String, bool)>,
            path: &str,
            kind: &str,
        ) -> bool {
            let deadline = Instant::now() + SOON;
            loop {
                if let Some(found) = seen.iter().find(|(p, k, _)| p == path && k == kind) {
                    return found.2;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                let Some(e) = events.next_within(left).await else {
                    panic!("the watch ended before {kind} {path}; saw {seen:?}");
                };
                seen.push((
                    e["path"].as_str().expect("path").to_owned(),
                    e["kind"].as_str().expect("kind").to_owned(),
                    e["is_dir"].as_bool().expect("is_dir"),
                ));
            }
        }
        a.write_file(&id, "/home/user/w/new.txt", "one").await.ok(200);
        assert!(!wait_for(&mut events, &mut seen, "/home/user/w/new.txt", "create").await);
        a.write_file(&id, "/home/user/w/new.txt", "two").await.ok(200);
        wait_for(&mut events, &mut seen, "/home/user/w/new.txt", "modify").await;
        a.post(&format!("{files}/mkdir"), json!({"path": "/home/user/w/sub"}))
            .await
            .ok(201);
        assert!(wait_for(&mut events, &mut seen, "/home/user/w/sub", "create").await);
        a.write_file(&id, "/home/user/w/sub/inner.txt", "in")
            .await
            .ok(200);
        wait_for(&mut events, &mut seen, "/home/user/w/sub/inner.txt", "create").await;
        a.post(
            &format!("{files}/rename"),
            json!({"from": "/home/user/w/new.txt", "to": "/home/user/w/renamed.txt"}),
        )
        .await
        .ok(200);
        wait_for(&mut events, &mut seen, "/home/user/w/new.txt", "rename_from").await;
        wait_for(&mut events, &mut seen, "/home/user/w/renamed.txt", "rename_to").await;
        a.delete_q(&files, &[("path", "/home/user/w/renamed.txt")])
            .await
            .ok(204);
        wait_for(&mut events, &mut seen, "/home/user/w/renamed.txt", "remove").await;
        // Changes made by a process are seen too.
        a.sh(&id, "touch /home/user/w/sub/by-process").await;
        wait_for(&mut events, &mut seen, "/home/user/w/sub/by-process", "create").await;
        // Removing the watched directory ends the stream with `ended`.
        a.delete_q(&files, &[("path", "/home/user/w"), ("recursive", "true")])
            .await
            .ok(204);
        let rest = events.rest(SOON).await;
        let last = rest.last().expect("ended");
        assert_eq!(
            (last["kind"].as_str(), last["path"].as_str()),
            (Some("ended"), Some("/home/user/w")),
            "{rest:?}"
        );
        // Watching a file or a missing directory is refused.
        a.write_file(&id, "/home/user/f", "x").await.ok(200);
        a.get_q(&format!("{files}/watch"), &[("path", "/home/user/f")])
            .await
            .err(400, "not_a_directory");
        a.get_q(&format!("{files}/watch"), &[("path", "/home/user/none")])
            .await
            .err(404, "file_not_found");
    });
}

#[test]
fn a_file_whose_size_is_unknown_downloads_whole() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("procfs").await;
        let id = a.create_sandbox(json!({})).await;
        // procfs files report size 0 but have content. The download must carry the content (or be
        // refused); a 200 with an empty body is a wrong answer that looks complete.
        for path in ["/proc/1/status", "/proc/meminfo"] {
            let expected = a.sh(&id, &format!("cat {path}")).await;
            assert!(!expected.is_empty());
            let r = a.read_file(&id, path).await;
            assert!(r.status < 500, "{path}: {r:?}");
            if r.status == 200 {
                assert!(
                    !r.body.is_empty(),
                    "GET files?path={path} answered 200 with an empty body (Content-Length: 0 from \
                     its stat size), but the file has {} bytes",
                    expected.len()
                );
            }
        }
    });
}

#[test]
fn a_fifo_is_a_client_error_not_a_server_error() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("fifo").await;
        let id = a.create_sandbox(json!({})).await;
        a.sh(&id, "mkfifo /home/user/fifo").await;
        // Reading or writing a FIFO (nobody on the other end) is the caller's mistake: a 4xx with a
        // stable code, not `500 internal` (which means "something failed inside paddock").
        let read = a.read_file(&id, "/home/user/fifo").await;
        let write = a.write_file(&id, "/home/user/fifo", "x").await;
        assert_eq!(
            a.sh(&id, "echo alive").await,
            "alive\n",
            "the agent still answers"
        );
        assert!(
            (400..500).contains(&read.status) && (400..500).contains(&write.status),
            "read: {read:?}\nwrite: {write:?}"
        );
    });
}

//! End to end: a real `paddock serve` whose state directory is a small loop-mounted btrfs file system
//! (so the storage pool is that file system too), filled to the last block by a file next to
//! `paddock.db`. The server must stay up, refuse writes with `507 no_space`, keep serving reads, show
//! the condition in `/metrics`, and accept writes again once the filler is gone, without a restart.
//!
//! A second test fills the storage pool alone (its loop-mounted image; the database's file system
//! has room): every route that writes to the pool (create, checkpoint, fork, file write, import)
//! answers `507 no_space`, the failed create is audited as an error, and all of them work again
//! once the space is freed.
//!
//! Before the wal-index moved to tmpfs, the first write on the full file system killed the server with
//! SIGBUS (SQLite's memory-mapped `-shm` on a copy-on-write file system).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{
    server::{Api, Reply, Server},
    TestEnv,
};

/// The state file system's size: room for the database and the pool's template, little more.
const STATE_FS_BYTES: u64 = 256 << 20;
/// How long freed space may take to be usable again.
const RECOVER_DEADLINE: Duration = Duration::from_secs(30);

/// A [`TestEnv`] whose state directory is a fresh btrfs image mounted over it. On drop (also when the
/// test panics) the pool is destroyed, the file system unmounted (its loop device goes with it) and
/// the image removed, before the environment's own cleanup.
struct SmallStateFs {
    env: Option<TestEnv>,
    image: PathBuf,
}

impl SmallStateFs {
    fn new() -> Self {
        let env = TestEnv::new();
        let image = env.state().with_extension("img");
        let file = std::fs::File::create(&image).expect("create image");
        file.set_len(STATE_FS_BYTES).expect("size image");
        drop(file);
        let fs = SmallStateFs {
            env: Some(env),
            image,
        };
        run(Command::new("mkfs.btrfs").arg("-q").arg(&fs.image));
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&fs.image)
            .arg(fs.env().state()));
        std::fs::set_permissions(
            fs.env().state(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .expect("chmod state");
        fs
    }

    fn env(&self) -> &TestEnv {
        self.env.as_ref().expect("env")
    }
}

impl Drop for SmallStateFs {
    fn drop(&mut self) {
        let env = self.env.take().expect("env");
        let _ = env.cmd().args(["pool", "destroy"]).output();
        let state = env.state().to_owned();
        // The wal-index SQLite keeps on tmpfs for this database (left there when the last process to
        // close it could not checkpoint, such as the read-only `audit verify`).
        if let Ok(meta) = std::fs::metadata(state.join("paddock.db")) {
            use std::os::unix::fs::MetadataExt as _;
            let index = format!("sqlite-shm-{:x}-{:x}", meta.ino() as u32, meta.dev() as u32);
            let _ = std::fs::remove_file(Path::new(paddock_store::SHM_DIRECTORY).join(index));
        }
        if !Command::new("umount")
            .arg(&state)
            .status()
            .is_ok_and(|s| s.success())
        {
            let _ = Command::new("umount").arg("-l").arg(&state).status();
        }
        let _ = std::fs::remove_file(&self.image);
        drop(env);
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("command runs");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes `path` until the file system refuses another byte, and makes that durable.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).expect("create filler");
    for chunk in [1 << 20, 4096, 512] {
        let block = vec![0x5a_u8; chunk];
        while file.write_all(&block).is_ok() {}
    }
    let _ = file.sync_all();
    rustix::fs::sync();
}

async fn metric(api: &Api, admin: &str, name: &str) -> Option<f64> {
    let text = api
        .request(admin, Method::GET, "/metrics", None, None)
        .await
        .text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn assert_no_space(reply: &Reply, what: &str) {
    assert_eq!(
        reply.status,
        StatusCode::INSUFFICIENT_STORAGE,
        "{what}: {}",
        reply.text()
    );
    let body: Value = serde_json::from_slice(&reply.body).expect("JSON error body");
    assert_eq!(body["code"], "no_space", "{what}: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_state_directory_refuses_writes_serves_reads_and_recovers() {
    let fs = SmallStateFs::new();
    let env = fs.env();
    let server = Server::start(env, &[], "info");
    let api = server.api();
    let admin = server.admin_key.clone();
    let key = api.create_key(&admin, "full").await;
    let sandbox = api.create_sandbox(&key, &json!({})).await;
    let id = sandbox["id"].as_str().expect("id").to_owned();
    assert_eq!(api.sh(&key, &id, "echo up").await, "up\n");
    assert_eq!(metric(&api, &admin, "paddock_store_no_space").await, Some(0.0));

    let filler = env.state().join("filler");
    fill(&filler);

    // Writes are refused with a clear code, and the server stays up.
    let create = api
        .request(&key, Method::POST, "/v1/sandboxes", Some(&json!({})), None)
        .await;
    assert_no_space(&create, "create on a full state directory");
    let exec = api
        .exec_json(&key, &id, &json!({ "shell": "echo refused" }))
        .await;
    assert_no_space(&exec, "exec on a full state directory");

    // Reads are served.
    let listed = api.get(&key, "/v1/sandboxes").await;
    let ids: Vec<&str> = listed["sandboxes"]
        .as_array()
        .or(listed.as_array())
        .expect("sandbox list")
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert!(ids.contains(&id.as_str()), "{listed}");
    let health = api.request(&key, Method::GET, "/healthz", None, None).await;
    assert_eq!(health.status, StatusCode::OK, "{}", health.text());
    assert_eq!(metric(&api, &admin, "paddock_store_no_space").await, Some(1.0));
    let refused = metric(&api, &admin, "paddock_store_writes_refused_no_space_total")
        .await
        .expect("refused-writes counter");
    assert!(refused >= 2.0, "refused writes counted: {refused}");
    assert_eq!(
        server
            .log_lines_with("refusing writes (reads are still served)")
            .len(),
        1,
        "one log line when the condition starts"
    );

    // Space returns: writes succeed again, without a restart.
    std::fs::remove_file(&filler).expect("remove filler");
    rustix::fs::sync();
    let deadline = std::time::Instant::now() + RECOVER_DEADLINE;
    let second = loop {
        let reply = api
            .request(&key, Method::POST, "/v1/sandboxes", Some(&json!({})), None)
            .await;
        if reply.status == StatusCode::CREATED {
            break reply.json()["id"].as_str().expect("id").to_owned();
        }
        assert_no_space(&reply, "create while space returns");
        assert!(
            std::time::Instant::now() < deadline,
            "writes still refused {RECOVER_DEADLINE:?} after the filler was removed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(api.sh(&key, &id, "echo back").await, "back\n");
    assert_eq!(metric(&api, &admin, "paddock_store_no_space").await, Some(0.0));
    assert_eq!(
        server.log_lines_with("file system has space again").len(),
        1,
        "one log line when the condition ends"
    );

    for id in [&id, &second] {
        api.delete_sandbox(&key, id).await;
    }
    server.stop();
    let out = env.cmd().args(["audit", "verify"]).output().expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The pool image's size for the pool-full test: the template and a few sandboxes, little more.
const SMALL_POOL: &str = "512M";

/// Every route that writes to the pool, tried once on `sandbox`, with `archive` (an exported
/// snapshot) for the import. Returns each route's reply, named.
async fn pool_writes(api: &Api, key: &str, sandbox: &str, archive: &[u8]) -> Vec<(&'static str, Reply)> {
    let path = |op: &str| format!("/v1/sandboxes/{sandbox}/{op}");
    vec![
        (
            "create",
            api.request(key, Method::POST, "/v1/sandboxes", Some(&json!({})), None)
                .await,
        ),
        (
            "checkpoint",
            api.request(key, Method::POST, &path("checkpoint"), Some(&json!({})), None)
                .await,
        ),
        (
            "fork",
            api.request(
                key,
                Method::POST,
                &path("fork"),
                Some(&json!({ "count": 1 })),
                None,
            )
            .await,
        ),
        (
            "file write",
            api.send_bytes(
                key,
                Method::PUT,
                &format!("{}?path=/home/user/upload", path("files")),
                "application/octet-stream",
                vec![0x42; 8 << 20],
            )
            .await,
        ),
        (
            "import",
            api.send_bytes(
                key,
                Method::POST,
                "/v1/snapshots/import",
                "application/x-tar",
                archive.to_vec(),
            )
            .await,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_answers_no_space_on_every_route_that_writes_to_it_and_recovers() {
    let env = TestEnv::new();
    let server = Server::start(&env, &["--pool-size", SMALL_POOL], "info");
    let api = server.api();
    let admin = server.admin_key.clone();
    let key = api.create_key(&admin, "poolfull").await;
    api.unlimited_quota(&admin, "poolfull").await;
    let sandbox = api.create_sandbox(&key, &json!({})).await;
    let id = sandbox["id"].as_str().expect("id").to_owned();
    api.sh(&key, &id, "echo kept > /home/user/kept").await;
    let snapshot = api
        .post(&key, &format!("/v1/sandboxes/{id}/snapshots"), &json!({}))
        .await;
    let snapshot_id = snapshot["id"].as_str().expect("snapshot id").to_owned();
    let export = api
        .request(
            &key,
            Method::GET,
            &format!("/v1/snapshots/{snapshot_id}/export"),
            None,
            None,
        )
        .await;
    assert_eq!(export.status, StatusCode::OK, "{}", export.text());
    let archive = export.body;

    let pool = env.state().join("pool");
    let filler = pool.join("filler");
    fill(&filler);

    for (what, reply) in pool_writes(&api, &key, &id, &archive).await {
        assert_no_space(&reply, &format!("{what} on a full pool"));
    }
    // The failed create is audited as what it was, not `ok`.
    let creates = api.audit_rows(&admin, "action=sandbox.create").await;
    let last = creates.last().expect("create rows");
    assert_ne!(last["outcome"], "ok", "the refused create's audit row: {last}");
    // The sandbox that was there is untouched and still answers.
    assert_eq!(api.sh(&key, &id, "cat /home/user/kept").await, "kept\n");

    std::fs::remove_file(&filler).expect("remove filler");
    rustix::fs::sync();
    let deadline = std::time::Instant::now() + RECOVER_DEADLINE;
    let mut created = Vec::new();
    loop {
        let replies = pool_writes(&api, &key, &id, &archive).await;
        for (_, reply) in &replies {
            if reply.status == StatusCode::CREATED || reply.status == StatusCode::OK {
                if let Some(new) = reply.json()["id"].as_str() {
                    created.push(new.to_owned());
                }
            }
        }
        let refused: Vec<&str> = replies
            .iter()
            .filter(|(_, r)| !r.status.is_success())
            .map(|(what, r)| {
                assert_no_space(r, &format!("{what} while space returns"));
                *what
            })
            .collect();
        if refused.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{refused:?} still refused {RECOVER_DEADLINE:?} after the filler was removed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(api.sh(&key, &id, "cat /home/user/kept").await, "kept\n");
    let verify = api.verify_audit(&admin).await;
    assert!(verify["first_broken"].is_null(), "{verify}");
    server.stop();
}

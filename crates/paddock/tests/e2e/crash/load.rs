//! End to end: `paddock serve` under concurrent load, killed with `SIGKILL` at a point the seed
//! picks, restarted on the same state directory; six rounds on one state directory, each with its
//! own fixed seed.
//!
//! Each client loops create → write (exec) → save (a checkpoint, or a named snapshot: the two
//! rollback paths) → write (file API) → rollback → read → delete, keeping a model of what every
//! acknowledged answer promised. The kill comes after the seed's number of acknowledged operations
//! (counted as answers arrive: no timing), so whatever each client had in flight is cut at a
//! different step each round. After the restart every sandbox a client was told exists is running
//! with the files of its last acknowledged operation, or of the one in flight finished (the only
//! operation whose outcome the client cannot know); every one it was told is deleted stays deleted;
//! and the whole state passes `support/crash.rs`'s checks (storage owned by records, no intents left,
//! the audit chain verifies, every process that ran has its start row).

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::support::{
    crash::assert_consistent,
    server::{Api, Reply, Server},
    TestEnv,
};

const TENANT: &str = "load";
/// Concurrent clients: enough to keep every kind of operation in flight at once on two cores.
const CLIENTS: u64 = 8;
/// One round per seed; each seed picks when the kill comes and which rollback path each cycle takes.
const SEEDS: [u64; 6] = [
    0x5eed_0001,
    0x5eed_0002,
    0x5eed_0003,
    0x5eed_0004,
    0x5eed_0005,
    0x5eed_0006,
];
const FILE: &str = "/home/user/f";

/// A small deterministic generator (splitmix64): the same seed gives the same choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The operation a client had sent and not seen answered when the server died.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pending {
    Nothing,
    Create,
    /// A write of this content.
    Write(String),
    Save,
    Rollback,
    Read,
    Delete,
    DeleteSnapshot,
}

/// What the acknowledged answers promised about one sandbox.
#[derive(Debug, Clone)]
struct Tracked {
    id: String,
    /// The file's content (empty: no file yet).
    file: String,
    /// The content the last acknowledged save captured.
    saved: Option<String>,
    deleted: bool,
}

/// One client's record of a round.
#[derive(Debug)]
struct ClientLog {
    sandboxes: Vec<Tracked>,
    /// In flight at the crash, on the last sandbox of `sandboxes` (or a sandbox never acknowledged).
    pending: Pending,
    /// Named snapshots it made (deleted or not).
    snapshots: Vec<String>,
    acked: u64,
}

/// Sends one request; `None` when no answer came (the server died). Any answer but success fails
/// the test: under this load nothing may be refused.
async fn call(api: &Api, key: &str, method: Method, path: &str, body: Option<&Value>) -> Option<Reply> {
    let reply = api
        .try_request(key, method, path, body, Some("application/json"))
        .await
        .ok()?;
    assert!(
        reply.status.is_success(),
        "{path}: {} {}",
        reply.status,
        reply.text()
    );
    if path.ends_with("/exec") {
        let result = reply.json();
        assert_eq!(result["exit"]["exit_code"], 0, "{path}: {result}");
    }
    Some(reply)
}

async fn write_file(api: &Api, key: &str, id: &str, content: &str) -> Option<Reply> {
    let path = format!("/v1/sandboxes/{id}/files?path={FILE}");
    let http = reqwest::Client::new();
    let resp = http
        .put(format!("{}{path}", api.base()))
        .bearer_auth(key)
        .body(content.to_owned())
        .send()
        .await
        .ok()?;
    let status = resp.status();
    let body = resp.bytes().await.ok()?.to_vec();
    let reply = Reply { status, body };
    assert!(status.is_success(), "{path}: {status} {}", reply.text());
    Some(reply)
}

fn read_script() -> String {
    format!("cat {FILE} 2>/dev/null; true")
}

/// Runs cycles until the server stops answering; every acknowledged operation is reported on `acks`.
async fn client(api: Api, key: String, n: u64, seed: u64, acks: mpsc::UnboundedSender<()>) -> ClientLog {
    let mut rng = Rng(seed ^ (n << 32));
    let mut log = ClientLog {
        sandboxes: Vec::new(),
        pending: Pending::Nothing,
        snapshots: Vec::new(),
        acked: 0,
    };
    let ack = |log: &mut ClientLog| {
        log.pending = Pending::Nothing;
        log.acked += 1;
        let _ = acks.send(());
    };
    // Out of step with each other from the start: each client first lists its sandboxes a number
    // of times its seed picks, so the kill finds them at different steps.
    for _ in 0..rng.next() % 6 {
        log.pending = Pending::Read;
        if call(&api, &key, Method::GET, "/v1/sandboxes", None)
            .await
            .is_none()
        {
            return log;
        }
        ack(&mut log);
    }
    for cycle in 0.. {
        log.pending = Pending::Create;
        let Some(created) = call(&api, &key, Method::POST, "/v1/sandboxes", Some(&json!({}))).await else {
            return log;
        };
        let id = created.json()["id"].as_str().expect("id").to_owned();
        log.sandboxes.push(Tracked {
            id: id.clone(),
            file: String::new(),
            saved: None,
            deleted: false,
        });
        ack(&mut log);
        let path = |op: &str| format!("/v1/sandboxes/{id}/{op}");

        let first = format!("c{n}-{cycle}-a\n");
        log.pending = Pending::Write(first.clone());
        let script = format!("echo {} > {FILE}", first.trim_end());
        if call(
            &api,
            &key,
            Method::POST,
            &path("exec"),
            Some(&json!({ "shell": script })),
        )
        .await
        .is_none()
        {
            return log;
        }
        log.sandboxes.last_mut().expect("tracked").file = first.clone();
        ack(&mut log);

        // A named snapshot rolls back cold; a checkpoint usually takes the prepared path.
        let named = rng.next().is_multiple_of(2);
        log.pending = Pending::Save;
        let save = if named {
            path("snapshots")
        } else {
            path("checkpoint")
        };
        let Some(saved) = call(&api, &key, Method::POST, &save, Some(&json!({}))).await else {
            return log;
        };
        let snapshot = named.then(|| saved.json()["id"].as_str().expect("snapshot id").to_owned());
        log.snapshots.extend(snapshot.clone());
        log.sandboxes.last_mut().expect("tracked").saved = Some(first.clone());
        ack(&mut log);

        let second = format!("c{n}-{cycle}-b\n");
        log.pending = Pending::Write(second.clone());
        if write_file(&api, &key, &id, &second).await.is_none() {
            return log;
        }
        log.sandboxes.last_mut().expect("tracked").file = second;
        ack(&mut log);

        log.pending = Pending::Rollback;
        let body = snapshot.as_ref().map_or(json!({}), |s| json!({ "snapshot": s }));
        if call(&api, &key, Method::POST, &path("rollback"), Some(&body))
            .await
            .is_none()
        {
            return log;
        }
        log.sandboxes.last_mut().expect("tracked").file = first.clone();
        ack(&mut log);

        log.pending = Pending::Read;
        let Some(read) = call(
            &api,
            &key,
            Method::POST,
            &path("exec"),
            Some(&json!({ "shell": read_script() })),
        )
        .await
        else {
            return log;
        };
        assert_eq!(read.json()["stdout"], first.as_str(), "{id} after its rollback");
        ack(&mut log);

        log.pending = Pending::Delete;
        if call(&api, &key, Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await
            .is_none()
        {
            return log;
        }
        log.sandboxes.last_mut().expect("tracked").deleted = true;
        ack(&mut log);

        if let Some(snapshot) = snapshot {
            log.pending = Pending::DeleteSnapshot;
            let target = format!("/v1/snapshots/{snapshot}");
            if call(&api, &key, Method::DELETE, &target, None).await.is_none() {
                return log;
            }
            ack(&mut log);
        }
    }
    unreachable!("the loop ends when the server dies")
}

/// Checks one client's sandboxes against its log on the restarted server.
async fn check_client(api: &Api, key: &str, log: &ClientLog) {
    let last = log.sandboxes.len().saturating_sub(1);
    for (i, t) in log.sandboxes.iter().enumerate() {
        let pending = if i == last {
            &log.pending
        } else {
            &Pending::Nothing
        };
        let info = api.sandbox(key, &t.id).await;
        if t.deleted {
            assert_eq!(info["state"], "killed", "{} was deleted: {info}", t.id);
            continue;
        }
        if *pending == Pending::Delete && info["state"] == "killed" {
            continue;
        }
        assert_eq!(
            info["state"], "running",
            "{} (in flight: {pending:?}): {info}",
            t.id
        );
        assert_eq!(info["paused"], false, "{info}");
        let mut allowed = vec![t.file.clone()];
        match pending {
            Pending::Write(content) => allowed.push(content.clone()),
            Pending::Rollback => allowed.extend(t.saved.clone()),
            _ => {}
        }
        let found = api.sh(key, &t.id, &read_script()).await;
        assert!(
            allowed.contains(&found),
            "{}: file {found:?}, expected one of {allowed:?} (in flight: {pending:?})",
            t.id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_concurrent_load_loses_nothing_acknowledged() {
    let env = TestEnv::new();
    let mut server = Server::start(&env, &[], "info");
    let key = server.api().create_key(&server.admin_key, TENANT).await;
    server.api().unlimited_quota(&server.admin_key, TENANT).await;
    for seed in SEEDS {
        let api = server.api();
        let kill_after = 16 + Rng(seed).next() % 96;
        let (acks, mut acked) = mpsc::unbounded_channel();
        let clients: Vec<_> = (0..CLIENTS)
            .map(|n| tokio::spawn(client(api.clone(), key.clone(), n, seed, acks.clone())))
            .collect();
        drop(acks);
        for _ in 0..kill_after {
            acked.recv().await.expect("clients run until the kill");
        }
        server.kill9();
        let mut logs = Vec::new();
        for c in clients {
            logs.push(c.await.expect("client"));
        }
        let total: u64 = logs.iter().map(|l| l.acked).sum();
        let in_flight: Vec<&Pending> = logs.iter().map(|l| &l.pending).collect();
        eprintln!("seed {seed:#x}: killed after {total} acknowledged operations; in flight: {in_flight:?}");

        server = Server::restart(&env, &[], "info");
        let api = server.api();
        for log in &logs {
            check_client(&api, &key, log).await;
        }
        assert_consistent(&env, &api, &server.admin_key).await;

        // Clear the round: every sandbox still running (acknowledged or finished after the crash)
        // must answer and be deletable, and every named snapshot deletable.
        let listed = api.get(&key, "/v1/sandboxes?limit=100").await;
        for s in listed["sandboxes"].as_array().expect("sandboxes") {
            if s["state"] == "running" {
                let id = s["id"].as_str().expect("id");
                assert_eq!(api.sh(&key, id, "echo up").await, "up\n");
                api.delete_sandbox(&key, id).await;
            }
        }
        for snapshot in logs.iter().flat_map(|l| &l.snapshots) {
            let reply = api
                .request(
                    &key,
                    Method::DELETE,
                    &format!("/v1/snapshots/{snapshot}"),
                    None,
                    None,
                )
                .await;
            assert!(
                reply.status == StatusCode::NO_CONTENT || reply.status == StatusCode::NOT_FOUND,
                "{snapshot}: {}",
                reply.text()
            );
        }
    }
    assert_consistent(&env, &server.api(), &server.admin_key).await;
    server.stop();
}

//! End to end: `paddock serve` killed (`SIGKILL`, by a crash point: `PADDOCK_FAULT`, debug builds
//! only) at each step of create, checkpoint, rollback (prepared and cold), fork, stop, resume, pause
//! and delete, then restarted on the same state directory. Every acknowledged sandbox is usable with
//! the right files (an interrupted operation is finished or undone as `paddock-control`'s
//! `recovery.rs` says), nothing of an unacknowledged one is left, the audit chain verifies and
//! every process that ran has its start row (`support/crash.rs`).

use std::os::unix::process::ExitStatusExt as _;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{
    crash::assert_consistent,
    server::{wait_for, Api, Reply, Server},
    TestEnv,
};

const TENANT: &str = "crash";

/// What the test does before and at the crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    /// A second sandbox is created (the first one is the setup's).
    Create,
    Checkpoint,
    /// Checkpoint, change, roll back once the rollback is prepared (`<id>.next` booted).
    RollbackPrepared,
    /// Named snapshot, change, roll back to it (a cold restart).
    RollbackCold,
    Fork,
    Stop,
    Resume,
    /// Checkpoint, then delete: the checkpoint must go with the sandbox.
    Delete,
    Pause,
}

/// Sandbox `a` as it must be after the restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Running, not paused, `/home/user/f` holds this.
    Running(&'static str),
    /// Stopped; a resume brings it back with `/home/user/f` holding this.
    Stopped(&'static str),
    /// Deleted (state `killed`).
    Killed,
}

async fn request(api: &Api, key: &str, method: Method, path: &str, body: Option<&Value>) -> Reply {
    let reply = api.request(key, method, path, body, None).await;
    assert!(
        reply.status.is_success(),
        "{path}: {} {}",
        reply.status,
        reply.text()
    );
    reply
}

/// Sets up `scenario` on sandbox `a` and sends the request that must hit the crash point; returns
/// the request's path (for the failure message).
async fn set_up_and_crash(env: &TestEnv, api: &Api, key: &str, a: &str, scenario: Scenario) -> String {
    let path = |op: &str| format!("/v1/sandboxes/{a}/{op}");
    let (method, target, body) = match scenario {
        Scenario::Create => (Method::POST, "/v1/sandboxes".to_owned(), json!({})),
        Scenario::Checkpoint => (Method::POST, path("checkpoint"), json!({})),
        Scenario::RollbackPrepared => {
            request(api, key, Method::POST, &path("checkpoint"), Some(&json!({}))).await;
            api.sh(key, a, "echo v2 > /home/user/f").await;
            // The rollback is prepared in the background: it takes the prepared path once the copy
            // has booted and recorded its init.
            let prepared = env.state().join(format!("run/{a}.next/init.pid"));
            let ready = wait_for(Duration::from_secs(60), async || prepared.exists()).await;
            assert!(ready, "the rollback was not prepared");
            (Method::POST, path("rollback"), json!({}))
        }
        Scenario::RollbackCold => {
            let snapshot = request(api, key, Method::POST, &path("snapshots"), Some(&json!({})))
                .await
                .json();
            api.sh(key, a, "echo v2 > /home/user/f").await;
            let id = snapshot["id"].as_str().expect("snapshot id").to_owned();
            (Method::POST, path("rollback"), json!({ "snapshot": id }))
        }
        Scenario::Fork => (Method::POST, path("fork"), json!({ "count": 2 })),
        Scenario::Stop => (Method::POST, path("stop"), json!({})),
        Scenario::Resume => {
            request(api, key, Method::POST, &path("stop"), Some(&json!({}))).await;
            (Method::POST, path("resume"), json!({}))
        }
        Scenario::Delete => {
            request(api, key, Method::POST, &path("checkpoint"), Some(&json!({}))).await;
            (Method::DELETE, format!("/v1/sandboxes/{a}"), json!({}))
        }
        Scenario::Pause => (Method::POST, path("pause"), json!({})),
    };
    let body = (method != Method::DELETE).then_some(&body);
    let answer = api.try_request(key, method, &target, body, None).await;
    assert!(
        answer.is_err(),
        "{target} was answered although the server should have died: {answer:?}"
    );
    target
}

/// Runs one crash case: `point` (a crash point, `name` or `name@N`) armed, `scenario` played, then
/// a restart and the checks.
async fn crash_case(point: &str, scenario: Scenario, expect: Expect) {
    let env = TestEnv::new();
    let server = Server::start_with_env(&env, &[], "info", &[("PADDOCK_FAULT", point)]);
    let (api, admin) = (server.api(), server.admin_key.clone());
    let key = api.create_key(&admin, TENANT).await;
    api.unlimited_quota(&admin, TENANT).await;
    let a = api.create_sandbox(&key, &json!({})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    api.sh(&key, &a, "echo v1 > /home/user/f").await;
    let target = set_up_and_crash(&env, &api, &key, &a, scenario).await;
    let (status, lines) = server.wait_exit(Duration::from_secs(60));
    let name = point.split('@').next().expect("name");
    assert_eq!(
        status.signal(),
        Some(9),
        "{target}: the server was not killed: {status:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l == &format!("paddock: fault point {name} reached")),
        "{target}: the server died but not at {point}: {lines:#?}"
    );

    let server = Server::restart(&env, &[], "info");
    let api = server.api();
    let info = api.sandbox(&key, &a).await;
    match expect {
        Expect::Running(content) => {
            assert_eq!(info["state"], "running", "{info}");
            assert_eq!(info["paused"], false, "{info}");
            assert_eq!(api.sh(&key, &a, "cat /home/user/f").await, format!("{content}\n"));
        }
        Expect::Stopped(content) => {
            assert_eq!(info["state"], "stopped", "{info}");
            request(
                &api,
                &key,
                Method::POST,
                &format!("/v1/sandboxes/{a}/resume"),
                Some(&json!({})),
            )
            .await;
            assert_eq!(api.sh(&key, &a, "cat /home/user/f").await, format!("{content}\n"));
        }
        Expect::Killed => {
            assert_eq!(info["state"], "killed", "{info}");
        }
    }
    let sandboxes = api.get(&key, "/v1/sandboxes?limit=100").await;
    let others: Vec<&Value> = sandboxes["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .filter(|s| s["id"] != a.as_str() && s["state"] != "failed")
        .collect();
    // Nothing the crash interrupted was acknowledged: no second sandbox, no fork copy survives.
    assert!(others.is_empty(), "sandboxes nobody was told about: {others:#?}");
    if matches!(scenario, Scenario::Fork | Scenario::Delete) {
        let snapshots = api.get(&key, "/v1/snapshots").await;
        assert_eq!(
            snapshots["snapshots"].as_array().map(Vec::len),
            Some(0),
            "snapshots left: {snapshots}"
        );
    }
    assert_consistent(&env, &api, &admin).await;
    // The sandbox keeps working for what comes next: a checkpoint and a rollback.
    if let Expect::Running(_) | Expect::Stopped(_) = expect {
        request(
            &api,
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{a}/checkpoint"),
            Some(&json!({})),
        )
        .await;
        api.sh(&key, &a, "echo v3 > /home/user/f").await;
        request(
            &api,
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{a}/rollback"),
            Some(&json!({})),
        )
        .await;
        let after = api.sh(&key, &a, "cat /home/user/f").await;
        assert_ne!(
            after, "v3\n",
            "the rollback after recovery did not restore the files"
        );
    }
    let reply = api
        .request(&key, Method::DELETE, &format!("/v1/sandboxes/{a}"), None, None)
        .await;
    assert!(
        reply.status == StatusCode::NO_CONTENT || expect == Expect::Killed,
        "{}",
        reply.text()
    );
    server.stop();
}

macro_rules! crash_cases {
    ($($name:ident: $point:expr, $scenario:expr, $expect:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            crash_case($point, $scenario, $expect).await;
        }
    )*};
}

use Expect::*;
use Scenario::*;

crash_cases! {
    create_recorded: "create.recorded@2", Create, Running("v1");
    create_booted: "create.booted@2", Create, Running("v1");
    create_volume_dir_made: "volume.dir_made@2", Create, Running("v1");
    checkpoint_frozen: "snapshot.frozen", Checkpoint, Running("v1");
    checkpoint_captured: "snapshot.captured", Checkpoint, Running("v1");
    rollback_prepared_intent: "rollback.intent_recorded", RollbackPrepared, Running("v1");
    rollback_prepared_old_killed: "rollback.prepared.old_killed", RollbackPrepared, Running("v1");
    rollback_prepared_volume_moved: "rollback.prepared.volume_moved", RollbackPrepared, Running("v1");
    rollback_prepared_switched: "rollback.prepared.switched", RollbackPrepared, Running("v1");
    rollback_prepared_restarted: "rollback.restarted", RollbackPrepared, Running("v1");
    rollback_prepared_recorded: "rollback.recorded", RollbackPrepared, Running("v1");
    rollback_cold_old_killed: "rollback.cold.old_killed", RollbackCold, Running("v1");
    rollback_cold_volume_retired: "rollback.cold.volume_retired", RollbackCold, Running("v1");
    rollback_cold_started: "rollback.cold.started", RollbackCold, Running("v1");
    rollback_cold_restarted: "rollback.restarted", RollbackCold, Running("v1");
    fork_frozen: "fork.frozen", Fork, Running("v1");
    fork_copies_booted: "fork.copies_booted", Fork, Running("v1");
    fork_copy_booted: "create.booted@3", Fork, Running("v1");
    fork_copy_volume_dir_made: "volume.dir_made@3", Fork, Running("v1");
    stop_intent: "stop.intent_recorded", Stop, Stopped("v1");
    stop_killed: "stop.killed", Stop, Stopped("v1");
    stop_kept: "stop.kept", Stop, Stopped("v1");
    stop_done: "stop.done", Stop, Stopped("v1");
    resume_admitted: "resume.admitted", Resume, Stopped("v1");
    resume_booted: "resume.booted", Resume, Stopped("v1");
    delete_recorded: "end.recorded", Delete, Killed;
    pause_frozen: "pause.frozen", Pause, Running("v1");
}

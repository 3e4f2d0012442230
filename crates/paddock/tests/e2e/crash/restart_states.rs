//! End to end: paused and stopped sandboxes keep their state across a graceful restart (SIGTERM) and
//! a `kill -9` of `paddock serve`: a paused one comes back paused (frozen, its processes kept) and
//! resumes with its processes and files; a stopped one stays stopped and resumes on its files. The
//! API answers while sandboxes are still being recovered; the time from the restart to the first
//! `/healthz` answer with 20 paused sandboxes is printed (a figure, not asserted).

use std::time::Instant;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{
    crash::assert_consistent,
    server::{Api, Server},
    TestEnv,
};

const TENANT: &str = "states";
const PAUSED: usize = 20;

async fn post(api: &Api, key: &str, path: &str) -> Value {
    let reply = api.request(key, Method::POST, path, Some(&json!({})), None).await;
    assert!(
        reply.status.is_success(),
        "{path}: {} {}",
        reply.status,
        reply.text()
    );
    reply.json()
}

/// Whether sandbox `id`'s cgroup is frozen (the unified hierarchy's `cgroup.freeze`).
fn frozen(env: &TestEnv, id: &str) -> bool {
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"].iter().any(|root| {
        std::fs::read_to_string(format!("{root}/{}/{id}/cgroup.freeze", env.cgroup_parent))
            .is_ok_and(|v| v.trim() == "1")
    })
}

/// Restarts the server (`kill9` or SIGTERM first), times the first `/healthz` answer, waits for
/// recovery, and returns the new server.
async fn restart(env: &TestEnv, server: Server, kill9: bool) -> Server {
    if kill9 {
        server.kill9();
    } else {
        server.stop();
    }
    let started = Instant::now();
    let server = Server::restart_serving(env, &[], "info");
    let health = reqwest::get(format!("{}/healthz", server.url))
        .await
        .expect("healthz");
    assert_eq!(health.status(), StatusCode::OK);
    let answered = started.elapsed();
    server.wait_recovered();
    eprintln!(
        "FIGURE restart ({}) with {PAUSED} paused sandboxes: /healthz answered after {} ms, recovery done after {} ms",
        if kill9 { "kill -9" } else { "SIGTERM" },
        answered.as_millis(),
        started.elapsed().as_millis()
    );
    server
}

async fn assert_states(env: &TestEnv, api: &Api, key: &str, paused: &[String], stopped: &str, running: &str) {
    for id in paused {
        let info = api.sandbox(key, id).await;
        assert_eq!(info["state"], "running", "{info}");
        assert_eq!(
            info["paused"], true,
            "a paused sandbox came back unpaused: {info}"
        );
        assert!(frozen(env, id), "{id} is not frozen after the restart");
        let refused = api
            .request(
                key,
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some(&json!({ "shell": "true" })),
                None,
            )
            .await;
        assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.text());
    }
    assert_eq!(api.sandbox(key, stopped).await["state"], "stopped");
    assert_eq!(
        api.sh(key, running, "cat /home/user/f").await,
        format!("{running}\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_and_stopped_sandboxes_survive_restarts_in_their_state() {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let admin = server.admin_key.clone();
    let api = server.api();
    let key = api.create_key(&admin, TENANT).await;
    api.unlimited_quota(&admin, TENANT).await;
    let mut ids = Vec::new();
    for _ in 0..PAUSED + 2 {
        let id = api
            .create_sandbox(&key, &json!({ "limits": { "memory": "64M" } }))
            .await["id"]
            .as_str()
            .expect("id")
            .to_owned();
        api.sh(&key, &id, &format!("echo {id} > /home/user/f")).await;
        ids.push(id);
    }
    let running = ids.pop().expect("running");
    let stopped = ids.pop().expect("stopped");
    post(&api, &key, &format!("/v1/sandboxes/{stopped}/stop")).await;
    // The paused ones each hold a background process whose output shows it kept running.
    let mut pids = Vec::new();
    for id in &ids {
        let started = api
            .request(
                &key,
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some(&json!({ "shell": "sleep 1000", "background": true })),
                Some("application/json"),
            )
            .await
            .json();
        pids.push(started["pid"].as_u64().expect("pid"));
        post(&api, &key, &format!("/v1/sandboxes/{id}/pause")).await;
    }

    let server = restart(&env, server, false).await;
    let api = server.api();
    assert_states(&env, &api, &key, &ids, &stopped, &running).await;
    let server = restart(&env, server, true).await;
    let api = server.api();
    assert_states(&env, &api, &key, &ids, &stopped, &running).await;

    // Each resumes with its files and its process.
    for (id, pid) in ids.iter().zip(&pids) {
        post(&api, &key, &format!("/v1/sandboxes/{id}/resume")).await;
        assert_eq!(api.sh(&key, id, "cat /home/user/f").await, format!("{id}\n"));
        let processes = api.get(&key, &format!("/v1/sandboxes/{id}/processes")).await;
        let listed = processes["processes"].as_array().expect("processes");
        assert!(
            listed
                .iter()
                .any(|p| p["pid"].as_u64() == Some(*pid) && p["running"] == true),
            "the background process of {id} did not survive: {processes}"
        );
    }
    post(&api, &key, &format!("/v1/sandboxes/{stopped}/resume")).await;
    assert_eq!(
        api.sh(&key, &stopped, "cat /home/user/f").await,
        format!("{stopped}\n")
    );
    assert_consistent(&env, &api, &admin).await;
    for id in ids.iter().chain([&stopped, &running]) {
        api.delete_sandbox(&key, id).await;
    }
    server.stop();
}

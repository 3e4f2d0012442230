//! End to end: the server dies (a crash point, `PADDOCK_FAULT=exec.spawned`) right after the agent
//! spawned a process and before anything else was written. After a restart on the same state
//! directory the sandbox is usable, the audit chain verifies, and every `process.exit` row has its
//! `process.start` row with the command: no process ran unaudited.

use std::os::unix::process::ExitStatusExt as _;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::{
    cli_audit_verify, cli_gc,
    server::{wait_for, Server},
    TestEnv,
};

/// How long the server may take to reach the crash point and die.
const DIE_DEADLINE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_a_spawn_leaves_the_process_audited() {
    let env = TestEnv::new();
    let server = Server::start_wrapped(&env, &["env", "PADDOCK_FAULT=exec.spawned"], &[], "info");
    let api = server.api();
    let admin = server.admin_key.clone();
    let key = api.create_key(&admin, "crash-exec").await;
    let id = api.create_sandbox(&key, &json!({})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let argv = json!(["sh", "-c", "echo ran > /tmp/ran; exit 7"]);
    let answer = api
        .try_request(
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&json!({ "argv": argv })),
            Some("application/json"),
        )
        .await;
    assert!(answer.is_err(), "the exec was answered: {answer:?}");
    let (status, reached) = server.wait_died("paddock: fault point exec.spawned reached", DIE_DEADLINE);
    assert!(
        reached,
        "the server died ({status:?}) without reaching the crash point"
    );
    assert_eq!(status.signal(), Some(9), "killed as by kill -9: {status:?}");

    let server = Server::restart(&env, &[], "info");
    let api = server.api();
    // The process ran (the agent spawned it before the crash) and its exit is recorded once the
    // restarted server has adopted the sandbox.
    let mut crashed = Vec::new();
    let recorded = wait_for(Duration::from_secs(30), async || {
        crashed = api
            .audit_rows(&admin, &format!("sandbox={id}&action=process.exit"))
            .await;
        !crashed.is_empty()
    })
    .await;
    assert!(recorded, "no process.exit row after the restart");
    assert_eq!(crashed.len(), 1, "{crashed:#?}");
    let exit = &crashed[0]["detail"];
    assert_eq!(exit["recorded_after_restart"], true, "{exit}");
    assert_eq!(exit["argv"], argv, "the exit row names the command: {exit}");
    assert_eq!(api.sh(&key, &id, "cat /tmp/ran").await, "ran\n");
    // One more exit row, of a process started and ended by the restarted server.
    let both = wait_for(Duration::from_secs(30), async || {
        api.audit_rows(&admin, &format!("sandbox={id}&action=process.exit"))
            .await
            .len()
            == 2
    })
    .await;
    assert!(both, "the exit of `cat` was not recorded");
    let rows = api
        .audit_rows(&admin, &format!("sandbox={id}&action=process."))
        .await;
    let verified = api.verify_audit(&admin).await;
    assert_eq!(verified["ok"], true, "{verified}");
    api.delete_sandbox(&key, &id).await;
    server.stop();
    cli_audit_verify(&env);
    cli_gc(&env);
    env.assert_clean();

    assert!(
        rows.iter()
            .any(|r| r["action"] == "process.start" && r["detail"]["argv"] == argv),
        "the process that ran before the crash has no process.start row: {rows:#?}"
    );
    let exits: Vec<&Value> = rows.iter().filter(|r| r["action"] == "process.exit").collect();
    assert_eq!(exits.len(), 2, "{rows:#?}");
    for exit in exits {
        let exec_id = &exit["detail"]["exec_id"];
        assert!(exec_id.is_string(), "an exit row without exec id: {exit}");
        let start = rows
            .iter()
            .find(|r| r["action"] == "process.start" && &r["detail"]["exec_id"] == exec_id)
            .unwrap_or_else(|| panic!("no process.start row for {exit}: {rows:#?}"));
        assert!(start["seq"].as_u64() < exit["seq"].as_u64(), "{start} {exit}");
        assert!(
            start["detail"]["argv"].is_array() || start["detail"]["shell"].is_string(),
            "the start row has no command: {start}"
        );
        if exit["detail"]["recorded_after_restart"] == true {
            assert_eq!(start["detail"]["argv"], argv, "{start}");
        }
    }
}

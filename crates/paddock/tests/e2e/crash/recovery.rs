//! End to end: `kill -9` of a real `paddock serve`, twice. First with sandboxes in every situation
//! (a background process writing output, an idle one, one whose timeout passes while the server is
//! down, one whose init is killed while the server is down, a full warm pool); then in the middle of a
//! burst of creates. After each restart on the same state directory: every sandbox is in the state it
//! should be, nothing is orphaned (run directories, subvolumes, cgroups and processes correspond
//! exactly to the live sandboxes), no acknowledged action is lost and the audit chain continues intact.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt as _;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{
    assert_cgroups_are, cli_audit_verify, cli_gc, run_dirs, sandbox_processes,
    server::{wait_for, Api, Server},
    store_ids, store_sandboxes, subvolumes, StoredSandbox, TestEnv,
};

const WARM_POOL: &[&str] = &["--warm-pool", "2"];
/// The script of the long-running background process.
const TICKER: &str = "while true; do echo tick; sleep 0.1; done";
/// How long the warm pool may take to fill (each boot is a sandbox start on a loaded 2-core host).
const POOL_DEADLINE: Duration = Duration::from_secs(60);

fn ticks(text: &str) -> usize {
    text.lines().filter(|l| *l == "tick").count()
}

/// What a background process printed so far (`follow=false`).
async fn buffered_stdout(api: &Api, key: &str, id: &str, pid: u64) -> String {
    let result = api
        .request(
            key,
            Method::GET,
            &format!("/v1/sandboxes/{id}/processes/{pid}/output?follow=false"),
            None,
            Some("application/json"),
        )
        .await
        .json();
    result["stdout"].as_str().expect("stdout").to_owned()
}

/// Re-attaches to `pid` following it (NDJSON) until its stdout holds `want` ticks; returns how many
/// it saw. The connection is dropped then, which must not kill a re-attached process.
async fn follow_until_ticks(api: &Api, key: &str, id: &str, pid: u64, want: usize) -> usize {
    let url = format!("{}/v1/sandboxes/{id}/processes/{pid}/output", api.base());
    let resp = reqwest::Client::new()
        .get(url)
        .bearer_auth(key)
        .header(reqwest::header::ACCEPT, "application/x-ndjson")
        .send()
        .await
        .expect("attach");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.bytes_stream();
    let (mut pending, mut stdout) = (Vec::new(), String::new());
    let deadline = Instant::now() + Duration::from_secs(20);
    while ticks(&stdout) < want {
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, body.next())
            .await
            .unwrap_or_else(|_| panic!("no new ticks after re-attaching: {stdout:?}"))
            .expect("the stream ended early")
            .expect("read the stream");
        pending.extend_from_slice(&chunk);
        while let Some(nl) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            let event: Value = serde_json::from_slice(&line).expect("NDJSON event");
            match event["type"].as_str() {
                Some("stdout") => stdout.push_str(event["data"].as_str().expect("text")),
                Some("started" | "stderr") => {}
                other => panic!("unexpected event {other:?} from a running process: {event}"),
            }
        }
    }
    ticks(&stdout)
}

fn pid_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

fn expires_at(info: &Value) -> SystemTime {
    let text = info["expires_at"].as_str().expect("expires_at");
    humantime::parse_rfc3339_weak(text).expect("RFC 3339 time")
}

/// Asserts the host holds exactly the live sandboxes of the store (running and warm), once the warm
/// pool is full and no create is in flight: the same run directories, subvolumes and cgroups, and no
/// process outside them. Returns the live ids.
async fn assert_nothing_orphaned(env: &TestEnv, api: &Api, admin: &str) -> BTreeSet<String> {
    api.wait_warm_pool(admin, 2, POOL_DEADLINE).await;
    let settled = wait_for(Duration::from_secs(30), async || {
        store_ids(env, &["creating"]).is_empty()
    })
    .await;
    assert!(
        settled,
        "sandboxes stay `creating` in the store: {:?}",
        store_sandboxes(env)
            .into_iter()
            .filter(|s| s.state == "creating")
            .collect::<Vec<_>>()
    );
    let live = store_ids(env, &["running", "warm"]);
    assert_eq!(
        store_ids(env, &["warm"]).len(),
        2,
        "the store's warm sandboxes: {:?}",
        store_sandboxes(env)
    );
    assert_eq!(
        run_dirs(env),
        live,
        "run directories vs the store's live sandboxes"
    );
    assert_eq!(subvolumes(env), live, "subvolumes vs the store's live sandboxes");
    assert_cgroups_are(env, &live);
    // Killed sandboxes' processes may take the host's init a moment to reap.
    let mut strays = BTreeMap::new();
    let clean = wait_for(Duration::from_secs(10), async || {
        strays = sandbox_processes(env);
        strays.retain(|id, _| !live.contains(id));
        strays.is_empty()
    })
    .await;
    assert!(clean, "processes of sandboxes that are not live: {strays:?}");
    let with_processes: BTreeSet<String> = sandbox_processes(env).into_keys().collect();
    assert_eq!(with_processes, live, "sandboxes with processes vs live ones");
    live
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_restart_loses_nothing_and_orphans_nothing() {
    let started = Instant::now();
    let env = TestEnv::new();
    let server = Server::start(&env, WARM_POOL, "info");
    let api = server.api();
    let admin = server.admin_key.clone();
    let keys: BTreeMap<&str, String> = BTreeMap::from([
        ("rec-a", api.create_key(&admin, "rec-a").await),
        ("rec-b", api.create_key(&admin, "rec-b").await),
    ]);
    let (key_a, key_b) = (keys["rec-a"].clone(), keys["rec-b"].clone());
    api.wait_warm_pool(&admin, 2, POOL_DEADLINE).await;

    // (a) a background process that keeps printing, and a file.
    let a = api
        .create_sandbox(&key_a, &json!({ "labels": { "role": "ticker" } }))
        .await;
    let a = a["id"].as_str().expect("id").to_owned();
    api.sh(&key_a, &a, "echo precious > /home/user/kept.txt").await;
    let started_bg = api
        .request(
            &key_a,
            Method::POST,
            &format!("/v1/sandboxes/{a}/exec"),
            Some(&json!({ "shell": TICKER, "background": true, "tag": "ticker" })),
            None,
        )
        .await;
    assert_eq!(started_bg.status, StatusCode::ACCEPTED, "{}", started_bg.text());
    let ticker = started_bg.json()["pid"].as_u64().expect("pid");
    // (c) idle, (d) to be killed from outside while the server is down.
    let c = api.create_sandbox(&key_b, &json!({})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let d = api.create_sandbox(&key_a, &json!({})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let mut ticks_before = 0;
    let ticking = wait_for(Duration::from_secs(20), async || {
        ticks_before = ticks(&buffered_stdout(&api, &key_a, &a, ticker).await);
        ticks_before >= 5
    })
    .await;
    assert!(ticking, "the background process does not tick ({ticks_before})");
    // (b) expires while the server is down: created last, so it is still running at the kill.
    let b_info = api.create_sandbox(&key_b, &json!({ "timeout_secs": 3 })).await;
    let b = b_info["id"].as_str().expect("id").to_owned();
    let b_expiry = expires_at(&b_info);
    let audit_before = api.audit_all(&admin).await;
    assert_eq!(api.sandbox(&key_b, &b).await["state"], "running");
    let server_pid = server.pid();
    server.kill9();
    assert!(
        SystemTime::now() < b_expiry,
        "setup took too long: (b) expired before the kill"
    );
    eprintln!(
        "killed server {server_pid} with {} audit rows, the last hash {}; a={a} b={b} c={c} d={d}",
        audit_before.len(),
        audit_before.last().expect("rows")["hash"]
    );

    // While the server is down: (d)'s init dies, and (b)'s timeout passes.
    let init_record =
        std::fs::read_to_string(env.state().join("run").join(&d).join("init.pid")).expect("init.pid of (d)");
    let init: i32 = init_record
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("init pid");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(init).expect("pid"),
        rustix::process::Signal::KILL,
    )
    .expect("SIGKILL (d)'s init");
    let died = wait_for(Duration::from_secs(10), async || {
        matches!(pid_state(init), None | Some('Z'))
    })
    .await;
    assert!(died, "(d)'s init {init} survived SIGKILL");
    let wake = b_expiry + Duration::from_millis(500);
    while SystemTime::now() < wake {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let server = Server::restart(&env, WARM_POOL, "info");
    let api = server.api();

    // (a): running, its background process kept running and re-attaching replays old and new output.
    assert_eq!(api.sandbox(&key_a, &a).await["state"], "running");
    let processes = api.get(&key_a, &format!("/v1/sandboxes/{a}/processes")).await;
    let listed = processes["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"].as_u64() == Some(ticker))
        .unwrap_or_else(|| panic!("the ticker is not listed: {processes}"))
        .clone();
    assert_eq!(listed["running"], true, "{listed}");
    assert_eq!(listed["tag"], "ticker", "{listed}");
    let replayed = ticks(&buffered_stdout(&api, &key_a, &a, ticker).await);
    assert!(
        replayed >= ticks_before + 10,
        "re-attach replays the ticks printed while the server was down: {ticks_before} before, {replayed} now"
    );
    let followed = follow_until_ticks(&api, &key_a, &a, ticker, replayed + 3).await;
    assert!(followed >= replayed + 3);
    assert_eq!(
        api.sh(&key_a, &a, "cat /home/user/kept.txt").await,
        "precious\n",
        "(a)'s file"
    );
    let still = api.get(&key_a, &format!("/v1/sandboxes/{a}/processes")).await;
    assert!(
        still["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .any(|p| p["pid"].as_u64() == Some(ticker) && p["running"] == true),
        "dropping a re-attached stream killed the process: {still}"
    );

    // (d): failed, with a reason.
    let d_info = api.sandbox(&key_a, &d).await;
    assert_eq!(d_info["state"], "failed", "{d_info}");
    assert!(
        d_info["end_reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{d_info}"
    );
    let reply = api.exec_json(&key_a, &d, &json!({ "argv": ["true"] })).await;
    assert_eq!(
        reply.status,
        StatusCode::CONFLICT,
        "exec in (d): {}",
        reply.text()
    );

    // (b): reaped soon after the restart.
    let mut b_state = Value::Null;
    let reaped = wait_for(Duration::from_secs(15), async || {
        b_state = api.sandbox(&key_b, &b).await["state"].clone();
        b_state == "expired"
    })
    .await;
    assert!(reaped, "(b) past its expiry is {b_state}");

    // (c): running and answering.
    assert_eq!(api.sandbox(&key_b, &c).await["state"], "running");
    assert_eq!(api.sh(&key_b, &c, "echo alive").await, "alive\n");

    // The warm pool is back to 2, and the host holds exactly the live sandboxes.
    let live = assert_nothing_orphaned(&env, &api, &admin).await;
    for id in [&a, &c] {
        assert!(live.contains(id), "{id} is live: {live:?}");
    }
    for id in [&b, &d] {
        assert!(!live.contains(id), "{id} is not live: {live:?}");
    }

    // The audit log: every row from before the crash, unchanged; the chain continues and verifies.
    let audit_after = api.audit_all(&admin).await;
    assert_audit_kept(&audit_before, &audit_after);
    let new_rows = &audit_after[audit_before.len()..];
    let has = |action: &str, id: &str| {
        new_rows
            .iter()
            .any(|r| r["action"] == action && r["sandbox_id"] == id)
    };
    assert!(has("sandbox.lost", &d), "sandbox.lost of (d): {new_rows:#?}");
    assert!(has("sandbox.expire", &b), "sandbox.expire of (b): {new_rows:#?}");
    for id in [&a, &b, &c] {
        assert!(has("sandbox.adopt", id), "sandbox.adopt of {id}: {new_rows:#?}");
    }
    assert!(!has("sandbox.adopt", &d), "(d) was not adopted: {new_rows:#?}");
    let verdict = api.verify_audit(&admin).await;
    assert_eq!(verdict["ok"], true, "{verdict}");
    cli_audit_verify(&env);

    // Second crash: kill -9 in the middle of a burst of creates.
    let burst: Vec<_> = (0..10)
        .map(|i| {
            let (api, key) = (api.clone(), key_a.clone());
            tokio::spawn(async move {
                let body = json!({ "labels": { "burst": i.to_string() } });
                api.try_request(&key, Method::POST, "/v1/sandboxes", Some(&body), None)
                    .await
            })
        })
        .collect();
    let burst_start = Instant::now();
    while burst.iter().filter(|t| t.is_finished()).count() < 3
        && burst_start.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let audit_before = api.audit_all(&admin).await;
    server.kill9();
    let mut acknowledged = Vec::new();
    let mut refused = 0;
    for task in burst {
        match task.await.expect("create task") {
            Ok(reply) if reply.status == StatusCode::CREATED => {
                acknowledged.push(reply.json()["id"].as_str().expect("id").to_owned());
            }
            Ok(reply) => panic!(
                "a create failed before the kill: {} {}",
                reply.status,
                reply.text()
            ),
            Err(_) => refused += 1,
        }
    }
    eprintln!(
        "burst: {} creates acknowledged before the kill, {refused} cut off",
        acknowledged.len()
    );

    let server = Server::restart(&env, WARM_POOL, "info");
    let api = server.api();
    let live = assert_nothing_orphaned(&env, &api, &admin).await;
    // No acknowledged create is lost, and every sandbox the store calls running answers.
    for id in &acknowledged {
        assert!(live.contains(id), "acknowledged sandbox {id} is gone: {live:?}");
    }
    let running: Vec<StoredSandbox> = store_sandboxes(&env)
        .into_iter()
        .filter(|s| s.state == "running")
        .collect();
    for sb in &running {
        let tenant = sb.tenant.as_deref().expect("a running sandbox has a tenant");
        let key = &keys[tenant];
        assert_eq!(
            api.sh(key, &sb.id, "echo $((6 * 7))").await,
            "42\n",
            "exec in {}",
            sb.id
        );
    }
    assert_eq!(api.sandbox(&key_a, &a).await["state"], "running");
    let audit_after = api.audit_all(&admin).await;
    assert_audit_kept(&audit_before, &audit_after);
    let verdict = api.verify_audit(&admin).await;
    assert_eq!(verdict["ok"], true, "{verdict}");
    cli_audit_verify(&env);

    // Delete everything through the API; stop; reclaim the warm pool; nothing is left.
    for sb in &running {
        api.delete_sandbox(&keys[sb.tenant.as_deref().expect("tenant")], &sb.id)
            .await;
    }
    for (tenant, key) in &keys {
        let listed = api.get(key, "/v1/sandboxes").await;
        assert_eq!(listed["sandboxes"], json!([]), "{tenant}'s sandboxes");
    }
    let warm = store_ids(&env, &["warm"]);
    let verdict = api.verify_audit(&admin).await;
    assert_eq!(verdict["ok"], true, "{verdict}");
    server.stop();
    let reclaimed: BTreeSet<String> = cli_gc(&env)
        .lines()
        .filter_map(|l| l.strip_prefix("reclaimed "))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        reclaimed, warm,
        "gc reclaims the warm pool the stopped server left"
    );
    env.assert_clean();
    eprintln!("recovery test took {:?}", started.elapsed());
}

/// A background process that ends while the server is down: its `process.start` row was written, so
/// its `process.exit` must be too, once, after the restart (ARCHITECTURE.md: every process start and
/// exit is a row; the agent still remembers the exit status).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_ends_while_the_server_is_down_gets_its_exit_recorded() {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let api = server.api();
    let admin = server.admin_key.clone();
    let key = api.create_key(&admin, "rec-exit").await;
    let id = api.create_sandbox(&key, &json!({})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let started = api
        .request(
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&json!({ "argv": ["sleep", "1"], "background": true })),
            None,
        )
        .await;
    assert_eq!(started.status, StatusCode::ACCEPTED, "{}", started.text());
    let pid = started.json()["pid"].as_u64().expect("pid");
    server.kill9();
    let ended = wait_for(Duration::from_secs(20), async || {
        !sandbox_processes(&env)
            .get(&id)
            .is_some_and(|procs| procs.iter().any(|(_, cmd)| cmd.starts_with("sleep")))
    })
    .await;
    assert!(ended, "`sleep 1` did not end");

    let server = Server::restart(&env, &[], "info");
    let api = server.api();
    let exits_of = async |api: &Api| {
        api.audit_rows(&admin, &format!("sandbox={id}&action=process.exit"))
            .await
            .into_iter()
            .filter(|r| r["detail"]["pid"] == pid)
            .collect::<Vec<_>>()
    };
    let mut exits = Vec::new();
    wait_for(Duration::from_secs(10), async || {
        exits = exits_of(&api).await;
        !exits.is_empty()
    })
    .await;
    let listed = api.get(&key, &format!("/v1/sandboxes/{id}/processes")).await;
    let starts = api
        .audit_rows(&admin, &format!("sandbox={id}&action=process.start"))
        .await;
    api.delete_sandbox(&key, &id).await;
    server.stop();
    cli_gc(&env);
    env.assert_clean();
    assert_eq!(starts.len(), 1, "{starts:#?}");
    assert_eq!(
        exits.len(),
        1,
        "the exit of process {pid} (`sleep 1` in {id}), which ended while the server was down, is \
         recorded once in the audit log after the restart; the agent lists it as {listed}"
    );
}

/// Asserts every row of `before` is in `after` unchanged, and `after` continues the same chain.
#[track_caller]
fn assert_audit_kept(before: &[Value], after: &[Value]) {
    assert!(after.len() >= before.len(), "audit rows disappeared");
    for (old, new) in before.iter().zip(after) {
        assert_eq!(old, new, "audit row {} changed", old["seq"]);
    }
    for pair in after.windows(2) {
        assert_eq!(
            pair[1]["seq"].as_u64(),
            pair[0]["seq"].as_u64().map(|s| s + 1),
            "sequence gap"
        );
        assert_eq!(
            pair[1]["prev_hash"], pair[0]["hash"],
            "chain broken at {}",
            pair[1]["seq"]
        );
    }
}

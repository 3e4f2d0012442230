//! Background processes (`process_start`, `process_read`, `process_write`, `process_signal`,
//! `process_list`) and a sandbox's resources (`sandbox_create`'s limits and network allowlist,
//! `sandbox_info`): each tool's structured result, refusals as `isError` with the service's code,
//! and another tenant's calls answering as for a missing sandbox.
//!
//! A background process's output arrives when it arrives: reads are repeated until what is
//! expected shows, within a generous deadline (the pause between reads only paces them).

use std::time::{Duration, Instant};

use paddock_mcp::MAX_OUTPUT;
use rmcp::service::RunningService;
use rmcp::RoleClient;
use serde_json::{json, Value};

use crate::support::{call, connect, failed, service, structured};

/// Reads a process's output from `from` until `done` holds of a read; that read.
async fn read_until(
    client: &RunningService<RoleClient, ()>,
    (id, pid): (&str, u64),
    from: (u64, u64),
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let args = json!({"sandbox_id": id, "pid": pid, "stdout_from": from.0, "stderr_from": from.1});
        let read = structured(&call(client, "process_read", args).await);
        if done(&read) {
            return read;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not seen in time; last read {read}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The listing of `pid`.
async fn listed(client: &RunningService<RoleClient, ()>, id: &str, pid: u64) -> Value {
    let list = structured(&call(client, "process_list", json!({"sandbox_id": id})).await);
    list["processes"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["pid"] == pid))
        .cloned()
        .unwrap_or_else(|| panic!("{pid} is not listed: {list}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_process_is_read_written_signalled_and_seen_to_exit() {
    let (service, a, b) = service().await;
    let client = connect(&service, a).await;
    let created = structured(&call(&client, "sandbox_create", json!({})).await);
    let id = created["sandbox_id"].as_str().expect("an id").to_owned();

    let command = "echo started; echo warn >&2; cat";
    let started = structured(
        &call(
            &client,
            "process_start",
            json!({"sandbox_id": id, "command": command, "stdin_open": true}),
        )
        .await,
    );
    let pid = started["pid"].as_u64().expect("a pid");
    let process = (id.as_str(), pid);

    // From the start: what it wrote, the offsets after it, still running.
    let first = read_until(&client, process, (0, 0), "its first lines", |r| {
        r["stdout"] == "started\n" && r["stderr"] == "warn\n"
    })
    .await;
    assert_eq!(
        (
            first["next_stdout_from"].as_u64(),
            first["next_stderr_from"].as_u64(),
            first["running"].as_bool(),
            first["exit_code"].is_null(),
            first["truncated"].as_bool(),
            first["skipped_bytes"].as_u64()
        ),
        (Some(8), Some(5), Some(true), true, Some(false), Some(0)),
        "{first}"
    );
    let entry = listed(&client, &id, pid).await;
    assert_eq!(
        (
            entry["command"].as_str(),
            entry["running"].as_bool(),
            entry["exit_code"].is_null()
        ),
        (Some(command), Some(true), true),
        "{entry}"
    );

    // Written to; read on from the offsets returned: only what is new.
    let written = structured(
        &call(
            &client,
            "process_write",
            json!({"sandbox_id": id, "pid": pid, "data": "ping\n"}),
        )
        .await,
    );
    assert_eq!(written, json!({"pid": pid, "bytes": 5, "closed": false}));
    let second = read_until(&client, process, (8, 5), "the echo of its input", |r| {
        r["stdout"] == "ping\n"
    })
    .await;
    assert_eq!(
        (
            second["stderr"].as_str(),
            second["next_stdout_from"].as_u64(),
            second["next_stderr_from"].as_u64(),
            second["running"].as_bool()
        ),
        (Some(""), Some(13), Some(5), Some(true)),
        "{second}"
    );
    let again = structured(&call(&client, "process_read", json!({"sandbox_id": id, "pid": pid})).await);
    assert_eq!(
        again["stdout"], "started\nping\n",
        "a read from 0 replays: {again}"
    );

    // Signalled: its exit is seen, then listed.
    let bad = failed(
        &call(
            &client,
            "process_signal",
            json!({"sandbox_id": id, "pid": pid, "signal": "NOPE"}),
        )
        .await,
    );
    assert!(bad.starts_with("invalid_request:"), "{bad}");
    let signalled = structured(
        &call(
            &client,
            "process_signal",
            json!({"sandbox_id": id, "pid": pid, "signal": "TERM"}),
        )
        .await,
    );
    assert_eq!(signalled, json!({"pid": pid, "signal": "TERM"}));
    let ended = read_until(&client, process, (13, 5), "its exit", |r| r["running"] == false).await;
    assert_eq!(
        (
            ended["exit_code"].as_i64(),
            ended["stdout"].as_str(),
            ended["timed_out"].as_bool(),
            ended["next_stdout_from"].as_u64()
        ),
        (Some(143), Some(""), Some(false), Some(13)),
        "{ended}"
    );
    let entry = listed(&client, &id, pid).await;
    assert_eq!(
        (entry["running"].as_bool(), entry["exit_code"].as_i64()),
        (Some(false), Some(143)),
        "{entry}"
    );

    // An ended or unknown process: not found.
    let signal_gone = failed(
        &call(
            &client,
            "process_signal",
            json!({"sandbox_id": id, "pid": pid, "signal": "KILL"}),
        )
        .await,
    );
    assert!(signal_gone.starts_with("process_not_found:"), "{signal_gone}");
    let unknown = failed(&call(&client, "process_read", json!({"sandbox_id": id, "pid": 999_999})).await);
    assert!(unknown.starts_with("process_not_found:"), "{unknown}");

    // Another tenant: no such sandbox, whatever the tool.
    let other = connect(&service, b).await;
    let calls = [
        ("process_start", json!({"sandbox_id": id, "command": "true"})),
        ("process_read", json!({"sandbox_id": id, "pid": pid})),
        (
            "process_write",
            json!({"sandbox_id": id, "pid": pid, "data": "x"}),
        ),
        (
            "process_signal",
            json!({"sandbox_id": id, "pid": pid, "signal": "KILL"}),
        ),
        ("process_list", json!({"sandbox_id": id})),
    ];
    for (tool, args) in calls {
        let refused = failed(&call(&other, tool, args).await);
        assert!(refused.starts_with("sandbox_not_found:"), "{tool}: {refused}");
    }

    client.cancel().await.expect("closed");
    other.cancel().await.expect("closed");
    service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_closes_time_limits_end_and_long_output_is_read_in_pieces() {
    let (service, a, _) = service().await;
    let client = connect(&service, a).await;
    let created = structured(&call(&client, "sandbox_create", json!({})).await);
    let id = created["sandbox_id"].as_str().expect("an id").to_owned();
    let start = |args: Value| {
        let client = &client;
        async move {
            let started = structured(&call(client, "process_start", args).await);
            started["pid"].as_u64().expect("a pid")
        }
    };

    // Closing stdin ends `cat`'s input: it exits 0 with what it read.
    let cat = start(json!({"sandbox_id": id, "command": "cat", "stdin_open": true})).await;
    let closed = structured(
        &call(
            &client,
            "process_write",
            json!({"sandbox_id": id, "pid": cat, "data": "a\n", "close": true}),
        )
        .await,
    );
    assert_eq!(closed["closed"], true, "{closed}");
    let done = read_until(&client, (&id, cat), (0, 0), "cat's exit", |r| {
        r["running"] == false
    })
    .await;
    assert_eq!(
        (done["stdout"].as_str(), done["exit_code"].as_i64()),
        (Some("a\n"), Some(0)),
        "{done}"
    );

    // Without stdin_open there is no stdin to write to.
    let sleeper = start(json!({"sandbox_id": id, "command": "sleep 1000"})).await;
    let refused = failed(
        &call(
            &client,
            "process_write",
            json!({"sandbox_id": id, "pid": sleeper, "data": "x"}),
        )
        .await,
    );
    assert!(refused.contains("stdin"), "{refused}");
    structured(
        &call(
            &client,
            "process_signal",
            json!({"sandbox_id": id, "pid": sleeper, "signal": "KILL"}),
        )
        .await,
    );
    let killed = read_until(&client, (&id, sleeper), (0, 0), "the kill", |r| {
        r["running"] == false
    })
    .await;
    assert_eq!(killed["exit_code"], 137, "{killed}");

    // A signal to the whole tree: the shell and what it started.
    let shell = start(json!({"sandbox_id": id, "command": "sleep 1000; sleep 1000"})).await;
    let tree = structured(
        &call(
            &client,
            "process_signal",
            json!({"sandbox_id": id, "pid": shell, "signal": "TERM", "tree": true}),
        )
        .await,
    );
    assert_eq!(tree, json!({"pid": shell, "signal": "TERM"}));
    let ended = read_until(&client, (&id, shell), (0, 0), "the tree's end", |r| {
        r["running"] == false
    })
    .await;
    assert_eq!(ended["exit_code"], 143, "{ended}");

    // A time limit ends it; none of zero seconds.
    let zero = failed(
        &call(
            &client,
            "process_start",
            json!({"sandbox_id": id, "command": "sleep 1000", "timeout_secs": 0}),
        )
        .await,
    );
    assert!(zero.starts_with("invalid_request:"), "{zero}");
    let limited = start(json!({"sandbox_id": id, "command": "sleep 1000", "timeout_secs": 1})).await;
    let timed_out = read_until(&client, (&id, limited), (0, 0), "the time limit", |r| {
        r["running"] == false
    })
    .await;
    assert_eq!(timed_out["timed_out"], true, "{timed_out}");

    // Past 256 KiB a read stops (before a character it would cut) and the next goes on from there.
    let head = "x".repeat(MAX_OUTPUT - 1);
    let rest = format!("é{}\n", "y".repeat(40_000));
    // (A command line that long does not reach the sandbox: the output comes from a file.)
    let path = "/home/user/long.txt";
    let content = format!("{head}{rest}");
    structured(
        &call(
            &client,
            "file_write",
            json!({"sandbox_id": id, "path": path, "content": content}),
        )
        .await,
    );
    let long = start(json!({"sandbox_id": id, "command": format!("cat {path}")})).await;
    let first = read_until(&client, (&id, long), (0, 0), "a full read", |r| {
        r["truncated"] == true
    })
    .await;
    assert_eq!(
        (
            first["stdout"].as_str() == Some(head.as_str()),
            first["next_stdout_from"].as_u64()
        ),
        (true, Some((MAX_OUTPUT - 1) as u64)),
        "the first read ends before the cut character"
    );
    let from = (MAX_OUTPUT - 1) as u64;
    let second = read_until(&client, (&id, long), (from, 0), "the rest", |r| {
        r["running"] == false
    })
    .await;
    assert_eq!(
        (
            second["stdout"].as_str() == Some(rest.as_str()),
            second["truncated"].as_bool(),
            second["exit_code"].as_i64()
        ),
        (true, Some(false), Some(0)),
        "the second read has the rest"
    );

    client.cancel().await.expect("closed");
    service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_create_takes_limits_and_refuses_what_the_server_does_not_allow() {
    let (service, a, b) = service().await;
    let client = connect(&service, a).await;
    let created = structured(
        &call(
            &client,
            "sandbox_create",
            json!({"memory": "512M", "cpus": 0.5, "timeout_secs": 900}),
        )
        .await,
    );
    let id = created["sandbox_id"].as_str().expect("an id").to_owned();
    let info = structured(&call(&client, "sandbox_info", json!({"sandbox_id": id})).await);
    assert_eq!(
        info["limits"],
        json!({"memory": "512M", "cpus": 0.5, "pids": 1024, "disk": "10G"}),
        "{info}"
    );
    assert_eq!(
        (
            info["sandbox_id"].as_str(),
            info["state"].as_str(),
            info["template"].as_str(),
            info["paused"].as_bool(),
            info["expires_at"] == created["expires_at"],
            info["end_reason"].is_null()
        ),
        (
            Some(id.as_str()),
            Some("running"),
            Some("default"),
            Some(false),
            true,
            true
        ),
        "{info}"
    );
    assert!(info["created_at"].is_string(), "{info}");

    // Refused: bad values before the service, limits below its minimum, and a network on a
    // server that offers none.
    let refusals = [
        (json!({"memory": "lots"}), "invalid_request: memory:"),
        (json!({"cpus": 0}), "invalid_request: cpus:"),
        (json!({"memory": "1M"}), "invalid_request:"),
        (
            json!({"network_allow": ["*bad*"]}),
            "invalid_request: network_allow.0:",
        ),
        (
            json!({"network_allow": ["pypi.org", "203.0.113.0/24"]}),
            "unsupported:",
        ),
        (json!({"network_allow": []}), "unsupported:"),
    ];
    for (args, code) in refusals {
        let refused = failed(&call(&client, "sandbox_create", args.clone()).await);
        assert!(refused.starts_with(code), "{args}: {refused}");
    }
    let listed = structured(&call(&client, "sandbox_list", json!({})).await);
    assert_eq!(
        listed["sandboxes"].as_array().map(Vec::len),
        Some(1),
        "nothing refused was made: {listed}"
    );

    // Another tenant's sandbox is not there; an ended one still has its details.
    let other = connect(&service, b).await;
    let refused = failed(&call(&other, "sandbox_info", json!({"sandbox_id": id})).await);
    assert!(refused.starts_with("sandbox_not_found:"), "{refused}");
    structured(&call(&client, "sandbox_kill", json!({"sandbox_id": id})).await);
    let ended = structured(&call(&client, "sandbox_info", json!({"sandbox_id": id})).await);
    assert_eq!(
        (ended["state"].as_str(), ended["ended_at"].is_string()),
        (Some("killed"), true),
        "{ended}"
    );

    client.cancel().await.expect("closed");
    other.cancel().await.expect("closed");
    service.shutdown().await;
}

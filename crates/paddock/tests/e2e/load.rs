//! End to end: a bounded load test of a real `paddock serve` on loopback. 50 concurrent clients each
//! create a sandbox and run 200 execs in it (150 collected as JSON, 40 streamed as NDJSON, 10 fed on
//! stdin): 10,000 execs, every one must succeed with the right output. Afterwards, with every
//! sandbox deleted and the warm pool settled, the server holds no more file descriptors than before
//! (plus a small constant), and no process, mount or cgroup of a deleted sandbox is left; the audit
//! log holds a row for every process start and exit and its chain verifies. Throughput and latency
//! are printed, never asserted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{
    cgroups, cli_audit_verify, cli_gc, fd_kinds, open_fds, sandbox_processes,
    server::{wait_for, Api, Reply, Server},
    state_mounts, store_ids, store_sandboxes, threads, wait_until, TestEnv,
};

const CLIENTS: usize = 50;
const EXECS_PER_CLIENT: usize = 200;
/// Of every 20 execs: 15 collected as JSON, 4 streamed as NDJSON, 1 with stdin.
const MIX_PERIOD: usize = 20;
/// File descriptors the server may hold beyond its baseline once everything is deleted (connections
/// the runtime or SQLite keep, a warm sandbox booting): a constant, not a function of the load.
const FD_SLACK: usize = 8;
/// Threads the server may keep beyond its baseline once idle: tokio's blocking pool keeps a thread
/// for 10 s after its last task, and the reaper's store call every second keeps several of them warm
/// (measured: 7 before, 12 a minute after). A leak per sandbox or per exec would be 50 or thousands.
const THREAD_SLACK: usize = 16;
/// How long idle threads get to exit.
const THREAD_SETTLE: Duration = Duration::from_secs(40);
const WARM_POOL: &[&str] = &["--warm-pool", "2"];
/// How long the warm pool may take to (re)fill.
const POOL_DEADLINE: Duration = Duration::from_secs(60);
/// At most this many error messages are kept to print.
const ERRORS_SHOWN: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExecKind {
    Json,
    Ndjson,
    Stdin,
}

fn kind_of(i: usize) -> ExecKind {
    match i % MIX_PERIOD {
        0..=14 => ExecKind::Json,
        15..=18 => ExecKind::Ndjson,
        _ => ExecKind::Stdin,
    }
}

/// Runs exec number `i` of client `client` in sandbox `id` and checks its result.
async fn one_exec(api: &Api, key: &str, id: &str, client: usize, i: usize) -> Result<(), String> {
    let fail = |what: String| Err(format!("client {client} exec {i}: {what}"));
    match kind_of(i) {
        ExecKind::Json => {
            let reply = api
                .try_exec(key, id, &json!({ "argv": ["true"] }), "application/json")
                .await
                .map_err(|e| format!("client {client} exec {i}: {e}"))?;
            let Ok(v) = parse_ok(&reply) else {
                return fail(format!("HTTP {}: {}", reply.status, reply.text()));
            };
            if v["exit"]["exit_code"] != 0 || v["stdout"] != "" || v["stderr"] != "" {
                return fail(format!("`true` answered {v}"));
            }
        }
        ExecKind::Stdin => {
            let input = format!("client {client} line {i}\n");
            let req = json!({ "argv": ["cat"], "stdin": input });
            let reply = api
                .try_exec(key, id, &req, "application/json")
                .await
                .map_err(|e| format!("client {client} exec {i}: {e}"))?;
            let Ok(v) = parse_ok(&reply) else {
                return fail(format!("HTTP {}: {}", reply.status, reply.text()));
            };
            if v["exit"]["exit_code"] != 0 || v["stdout"] != input.as_str() {
                return fail(format!("`cat` of {input:?} answered {v}"));
            }
        }
        ExecKind::Ndjson => {
            let req = json!({ "argv": ["echo", i.to_string()] });
            let reply = api
                .try_exec(key, id, &req, "application/x-ndjson")
                .await
                .map_err(|e| format!("client {client} exec {i}: {e}"))?;
            if !reply.status.is_success() {
                return fail(format!("HTTP {}: {}", reply.status, reply.text()));
            }
            let text = reply.text();
            let events: Result<Vec<Value>, _> = text
                .lines()
                .filter(|l| !l.is_empty())
                .map(serde_json::from_str)
                .collect();
            let Ok(events) = events else {
                return fail(format!("bad NDJSON: {text}"));
            };
            let stdout: String = events
                .iter()
                .filter(|e| e["type"] == "stdout")
                .filter_map(|e| e["data"].as_str())
                .collect();
            let first = events.first().map(|e| e["type"].clone());
            let last = events.last().cloned().unwrap_or_default();
            if first != Some(json!("started"))
                || last["type"] != "exit"
                || last["exit_code"] != 0
                || stdout != format!("{i}\n")
                || events.iter().any(|e| e["type"] == "error")
            {
                return fail(format!("`echo {i}` streamed {text}"));
            }
        }
    }
    Ok(())
}

fn parse_ok(reply: &Reply) -> Result<Value, ()> {
    if !reply.status.is_success() {
        return Err(());
    }
    serde_json::from_slice(&reply.body).map_err(|_| ())
}

/// What the server and its sandboxes hold at one moment.
#[derive(Debug, Clone)]
struct Footprint {
    threads: usize,
    /// Sandbox id → its host processes.
    processes: BTreeMap<String, usize>,
    mounts: Vec<String>,
    cgroups: BTreeMap<String, BTreeSet<String>>,
}

fn footprint(env: &TestEnv, pid: i32) -> Footprint {
    Footprint {
        threads: threads(pid),
        processes: sandbox_processes(env)
            .into_iter()
            .map(|(id, procs)| (id, procs.len()))
            .collect(),
        mounts: state_mounts(env)
            .into_iter()
            .map(|l| l.split_whitespace().nth(4).unwrap_or_default().to_owned())
            .collect(),
        cgroups: cgroups(env),
    }
}

/// The server's fd count once it has not changed for a while (connections just closed by clients
/// take the server a moment to notice).
fn steady_fds(pid: i32) -> usize {
    let mut last = open_fds(pid);
    let mut same = 0;
    let start = Instant::now();
    while same < 10 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
        let now = open_fds(pid);
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Waits until the store holds only the warm pool: nothing running, nothing being created, `n` warm.
async fn wait_only_warm(env: &TestEnv, api: &Api, admin: &str, n: usize) -> BTreeSet<String> {
    api.wait_warm_pool(admin, n as u32, POOL_DEADLINE).await;
    let settled = wait_for(Duration::from_secs(30), async || {
        store_ids(env, &["creating", "running"]).is_empty() && store_ids(env, &["warm"]).len() == n
    })
    .await;
    let warm = store_ids(env, &["warm"]);
    assert!(
        settled,
        "the store does not settle to {n} warm sandboxes: {:?}",
        store_sandboxes(env)
            .into_iter()
            .filter(|s| matches!(s.state.as_str(), "creating" | "running" | "warm"))
            .collect::<Vec<_>>()
    );
    warm
}

#[test]
fn fifty_clients_ten_thousand_execs_leave_no_trace() {
    let test_start = Instant::now();
    let env = TestEnv::new();
    let server = Server::start(&env, WARM_POOL, "warn");
    let pid = server.pid();
    let admin = server.admin_key.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    // Setup, then the baseline: the warm pool full, no client connected.
    let (key, warm_before) = rt.block_on(async {
        let api = server.api();
        let key = api.create_key(&admin, "load").await;
        api.unlimited_quota(&admin, "load").await;
        let warm = wait_only_warm(&env, &api, &admin, 2).await;
        (key, warm)
    });
    let baseline_fds = steady_fds(pid);
    let before = footprint(&env, pid);
    eprintln!(
        "baseline: {baseline_fds} fds {:?}, {} threads, processes {:?}, mounts {:?}, cgroups {:?}",
        fd_kinds(pid),
        before.threads,
        before.processes,
        before.mounts,
        before.cgroups
    );
    assert_eq!(
        before.processes.keys().cloned().collect::<BTreeSet<_>>(),
        warm_before,
        "only the warm sandboxes have processes"
    );

    // The load: every client creates its sandbox, then all run their execs at once.
    let errors = Arc::new(Mutex::new((0usize, Vec::<String>::new())));
    let record_error = {
        let errors = errors.clone();
        move |e: String| {
            let mut guard = errors.lock().expect("errors");
            guard.0 += 1;
            if guard.1.len() < ERRORS_SHOWN {
                guard.1.push(e);
            }
        }
    };
    let peak = Arc::new(Mutex::new((0usize, 0usize)));
    let (create_latencies, exec_latencies, exec_elapsed, ids) = rt.block_on(async {
        let api = server.api();
        let sampling = tokio::spawn({
            let peak = peak.clone();
            async move {
                loop {
                    let (fds, th) = (open_fds(pid), threads(pid));
                    {
                        let mut p = peak.lock().expect("peak");
                        p.0 = p.0.max(fds);
                        p.1 = p.1.max(th);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
        let barrier = Arc::new(tokio::sync::Barrier::new(CLIENTS + 1));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|client| {
                let (api, key, barrier) = (api.clone(), key.clone(), barrier.clone());
                let record_error = record_error.clone();
                tokio::spawn(async move {
                    let t = Instant::now();
                    let body = json!({ "timeout_secs": 1800, "labels": { "client": client.to_string() } });
                    let created = api
                        .try_request(&key, reqwest::Method::POST, "/v1/sandboxes", Some(&body), None)
                        .await;
                    let create_latency = t.elapsed();
                    let id = match created {
                        Ok(reply) if reply.status == reqwest::StatusCode::CREATED => {
                            reply.json()["id"].as_str().map(str::to_owned)
                        }
                        Ok(reply) => {
                            record_error(format!(
                                "client {client} create: HTTP {}: {}",
                                reply.status,
                                reply.text()
                            ));
                            None
                        }
                        Err(e) => {
                            record_error(format!("client {client} create: {e}"));
                            None
                        }
                    };
                    barrier.wait().await;
                    let mut latencies = Vec::with_capacity(EXECS_PER_CLIENT);
                    if let Some(id) = &id {
                        for i in 0..EXECS_PER_CLIENT {
                            let t = Instant::now();
                            let result = one_exec(&api, &key, id, client, i).await;
                            latencies.push(t.elapsed());
                            if let Err(e) = result {
                                record_error(e);
                            }
                        }
                    }
                    (create_latency, latencies, id)
                })
            })
            .collect();
        barrier.wait().await;
        let exec_start = Instant::now();
        let mut create_latencies = Vec::new();
        let mut exec_latencies = Vec::new();
        let mut ids = Vec::new();
        for c in clients {
            let (create, execs, id) = c.await.expect("client task");
            create_latencies.push(create);
            exec_latencies.extend(execs);
            ids.extend(id);
        }
        let exec_elapsed = exec_start.elapsed();
        sampling.abort();
        (create_latencies, exec_latencies, exec_elapsed, ids)
    });

    let (error_count, shown) = errors.lock().expect("errors").clone();
    let mut sorted = exec_latencies.clone();
    sorted.sort();
    let mut creates = create_latencies.clone();
    creates.sort();
    let (peak_fds, peak_threads) = *peak.lock().expect("peak");
    eprintln!(
        "load: {} sandboxes, {} execs in {:.1?}: {:.0} execs/s; exec latency p50 {:.1?} p99 {:.1?} max {:.1?}; \
         create p50 {:.1?} p99 {:.1?}; server peak {peak_fds} fds, {peak_threads} threads; {error_count} errors",
        ids.len(),
        sorted.len(),
        exec_elapsed,
        sorted.len() as f64 / exec_elapsed.as_secs_f64(),
        percentile(&sorted, 0.50),
        percentile(&sorted, 0.99),
        sorted.last().copied().unwrap_or_default(),
        percentile(&creates, 0.50),
        percentile(&creates, 0.99),
    );
    assert_eq!(
        error_count, 0,
        "errors under load (first {ERRORS_SHOWN}): {shown:#?}"
    );
    assert_eq!(ids.len(), CLIENTS, "every client got a sandbox");
    assert_eq!(sorted.len(), CLIENTS * EXECS_PER_CLIENT);

    // Delete every sandbox; the warm pool refills; the audit log has every process.
    let warm_after = rt.block_on(async {
        let api = server.api();
        let deletes: Vec<_> = ids
            .iter()
            .map(|id| {
                let (api, key, id) = (api.clone(), key.clone(), id.clone());
                tokio::spawn(async move { api.delete_sandbox(&key, &id).await })
            })
            .collect();
        for d in deletes {
            d.await.expect("delete");
        }
        let listed = api.get(&key, "/v1/sandboxes").await;
        assert_eq!(listed["sandboxes"], json!([]), "every sandbox deleted");
        let warm = wait_only_warm(&env, &api, &admin, 2).await;
        let want = 2 * CLIENTS * EXECS_PER_CLIENT;
        let mut process_rows = 0;
        let recorded = wait_for(Duration::from_secs(30), async || {
            process_rows = api.audit_rows(&admin, "action=process.").await.len();
            process_rows >= want
        })
        .await;
        assert!(
            recorded,
            "{process_rows} process audit rows, want at least {want}"
        );
        let verdict = api.verify_audit(&admin).await;
        assert_eq!(verdict["ok"], true, "{verdict}");
        assert!(
            verdict["rows_checked"].as_u64().unwrap_or(0) >= want as u64,
            "{verdict}"
        );
        eprintln!("audit: {process_rows} process rows; {verdict}");
        warm
    });
    cli_audit_verify(&env);

    // Back to the baseline: the clients are gone (their runtime's connections closed with it).
    drop(rt);
    let after_fds = steady_fds(pid);
    let after = footprint(&env, pid);
    eprintln!(
        "after: {after_fds} fds {:?}, {} threads, processes {:?}, mounts {:?}, cgroups {:?}",
        fd_kinds(pid),
        after.threads,
        after.processes,
        after.mounts,
        after.cgroups
    );
    assert!(
        after_fds <= baseline_fds + FD_SLACK,
        "the server holds {after_fds} fds after {} execs, {baseline_fds} before: {:?}",
        CLIENTS * EXECS_PER_CLIENT,
        fd_kinds(pid)
    );
    // Idle blocking-pool threads exit after their keep-alive (10 s in tokio); more than a constant
    // staying is a leak.
    let mut now_threads = after.threads;
    let settled = wait_until(THREAD_SETTLE, || {
        now_threads = threads(pid);
        now_threads <= before.threads + THREAD_SLACK
    });
    eprintln!(
        "threads: {} before, {} right after, {now_threads} settled",
        before.threads, after.threads
    );
    assert!(
        settled,
        "the server keeps {now_threads} threads after the load, {} before",
        before.threads
    );
    let with_processes: BTreeSet<String> = after.processes.keys().cloned().collect();
    assert_eq!(
        with_processes, warm_after,
        "only the warm sandboxes have processes"
    );
    assert_eq!(
        after.processes.values().sum::<usize>(),
        before.processes.values().sum::<usize>(),
        "as many sandbox processes as before: {:?} vs {:?}",
        after.processes,
        before.processes
    );
    assert_eq!(after.mounts, before.mounts, "mounts under the state directory");
    for (hierarchy, have) in &after.cgroups {
        assert_eq!(have, &warm_after, "cgroups under {hierarchy}");
    }
    assert_eq!(
        after.cgroups.keys().collect::<Vec<_>>(),
        before.cgroups.keys().collect::<Vec<_>>(),
        "hierarchies with the parent cgroup"
    );

    server.stop();
    cli_gc(&env);
    env.assert_clean();
    eprintln!("load test took {:.1?}", test_start.elapsed());
}

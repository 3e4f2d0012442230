//! One tenant attacks a real `paddock serve` at full speed for 30 s while another tenant uses it
//! (issue 11, "must show"): the attacker keeps a thousand half-sent request heads open from its own
//! address, reopening each as soon as it is closed (class 4), runs execs answered as JSON that write
//! 17 MB of NULs to each stream, four at a time (class 5), and floods its sandbox's resolver with DNS
//! questions from two processes (class 6). Every request of the other tenant is answered, the
//! attacker's audit rows stay within its sandbox's row rate, the chain verifies and the server's
//! descriptors come back. (The egress proxy's connection caps of class 3 are tried in the egress
//! tests.)
//!
//! The latency of the other tenant's requests is printed (p50, p99), not asserted: on a shared
//! two-core test machine running a debug build, with the attacker's sandbox unthrottled in CPU, it
//! measures the neighbours as much as the server.

mod common;
#[path = "common/server.rs"]
mod server;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{require_root, TestEnv};
use serde_json::json;
use server::*;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpSocket;

const ATTACK: Duration = Duration::from_secs(30);
const HALF_HEAD: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: paddock\r\nX-Slow: ";

fn config_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("paddock.toml");
    std::fs::write(
        &path,
        "[http]\nheader_read_timeout = \"5s\"\nidle_timeout = \"5s\"\n\
         [egress]\nsystem_resolver = false\n[egress.hosts]\n\"allowed.test\" = [\"198.51.100.1\"]\n",
    )
    .expect("config");
    (dir, path)
}

/// Keeps up to `n` half-sent heads open from `source` until `stop`, reopening those the server closes.
async fn slow_heads(
    addr: SocketAddr,
    source: Ipv4Addr,
    n: usize,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicU64>,
) {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let stop = stop.clone();
        let opened = opened.clone();
        tasks.spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let Ok(socket) = TcpSocket::new_v4() else { return };
                if socket.bind(SocketAddr::from((source, 0))).is_err() {
                    return;
                }
                let Ok(mut conn) = socket.connect(addr).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                opened.fetch_add(1, Ordering::SeqCst);
                let _ = conn.write_all(HALF_HEAD).await;
                // Held until the server closes it (or the attack ends).
                let mut buf = [0u8; 256];
                let read = tokio::io::AsyncReadExt::read(&mut conn, &mut buf);
                let _ = tokio::time::timeout(ATTACK, read).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

const DNS_FLOOD: &str = r#"
import os, socket, struct, sys, time
ns = '10.0.0.1'
for line in open('/etc/resolv.conf'):
    if line.startswith('nameserver'):
        ns = line.split()[1]
        break
def flood():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    end = time.time() + float(sys.argv[1])
    n = 0
    while time.time() < end:
        name = 'x%d.evil.test' % (n % 1000)
        head = struct.pack('>HHHHHH', n & 0xffff, 0x0100, 1, 0, 0, 0)
        q = head + b''.join(bytes([len(p)]) + p.encode() for p in name.split('.')) + b'\0' + struct.pack('>HH', 1, 1)
        try:
            s.sendto(q, (ns, 53))
            n += 1
        except BlockingIOError:
            pass
        try:
            while True:
                s.recv(4096)
        except BlockingIOError:
            pass
for _ in range(2):
    if os.fork() == 0:
        flood()
        os._exit(0)
os.wait(); os.wait()
"#;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[test]
fn another_tenant_is_answered_while_one_attacks_at_full_speed() {
    if !require_root() {
        return;
    }
    let env = TestEnv::new();
    let (_dir, config) = config_file();
    let server = Server::start(&env, &["--config", config.to_str().expect("utf-8")], "warn");
    let pid = server.pid();
    let baseline = open_fds(pid);
    let addr: SocketAddr = server
        .url
        .strip_prefix("http://")
        .expect("url")
        .parse()
        .expect("addr");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let api = server.api();
        let mallory = api.create_key(&server.admin_key, "mallory").await;
        let alice = api.create_key(&server.admin_key, "alice").await;
        api.unlimited_quota(&server.admin_key, "mallory").await;
        let attacker_box = api
            .create_sandbox(
                &mallory,
                &json!({"network": {"allow": [{"domain": "allowed.test"}]}}),
            )
            .await;
        let attacker_id = attacker_box["id"].as_str().expect("id").to_owned();
        let alice_box = api.create_sandbox(&alice, &json!({})).await;
        let alice_id = alice_box["id"].as_str().expect("id").to_owned();

        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        // Class 4: a thousand slow heads from the attacker's own address.
        let heads = tokio::spawn(slow_heads(
            addr,
            Ipv4Addr::new(127, 0, 0, 2),
            1000,
            stop.clone(),
            opened.clone(),
        ));
        // Class 6: the DNS flood, in the background of the attacker's sandbox.
        let flood = format!("python3 - {} <<'EOF'\n{DNS_FLOOD}\nEOF", ATTACK.as_secs());
        let reply = api
            .request(
                &mallory,
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{attacker_id}/exec"),
                Some(&json!({"shell": flood, "background": true})),
                None,
            )
            .await;
        assert_eq!(reply.status, 202, "{}", reply.text());
        // Class 5: JSON execs of 2 x 17 MB of NULs, four at a time.
        let nuls = json!({"shell": "head -c 17000000 /dev/zero; head -c 17000000 /dev/zero >&2"});
        let execs = Arc::new(AtomicU64::new(0));
        let mut attackers = Vec::new();
        for _ in 0..4 {
            let (api, key, id, stop, execs, nuls) = (
                api.clone(),
                mallory.clone(),
                attacker_id.clone(),
                stop.clone(),
                execs.clone(),
                nuls.clone(),
            );
            attackers.push(tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    if api.try_exec(&key, &id, &nuls, "application/json").await.is_ok() {
                        execs.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }

        // Meanwhile Alice reads her sandbox every 50 ms.
        let mut latencies = Vec::new();
        let mut failures = Vec::new();
        while start.elapsed() < ATTACK {
            let t = Instant::now();
            match api
                .try_request(
                    &alice,
                    reqwest::Method::GET,
                    &format!("/v1/sandboxes/{alice_id}"),
                    None,
                    None,
                )
                .await
            {
                Ok(r) if r.status.is_success() => latencies.push(t.elapsed()),
                Ok(r) => failures.push(format!("HTTP {}", r.status)),
                Err(e) => failures.push(e.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.store(true, Ordering::SeqCst);
        heads.abort();
        for a in attackers {
            let _ = a.await;
        }
        latencies.sort();
        let p50 = percentile(&latencies, 0.50);
        let p99 = percentile(&latencies, 0.99);
        eprintln!(
            "{} requests answered (p50 {p50:?}, p99 {p99:?}, max {:?}) while the attacker opened {} slow \
             connections and ran {} 34 MB JSON execs",
            latencies.len(),
            latencies.last().copied().unwrap_or_default(),
            opened.load(Ordering::SeqCst),
            execs.load(Ordering::SeqCst)
        );
        assert!(failures.is_empty(), "requests failed: {failures:?}");
        assert!(latencies.len() >= 100, "{} requests", latencies.len());
        // The flood's rows: at most the sandbox's bucket (100, then 10/s) and a suppressed row per
        // window, whatever the number of questions.
        let rows = api
            .audit_rows(
                &server.admin_key,
                &format!("sandbox={attacker_id}&action=network."),
            )
            .await;
        let elapsed = start.elapsed().as_secs_f64();
        let bound = 100.0 + 10.0 * elapsed + elapsed / 10.0 + 2.0;
        eprintln!(
            "the attacker's sandbox has {} network audit rows (bound {bound:.0})",
            rows.len()
        );
        assert!((rows.len() as f64) <= bound, "{} network rows", rows.len());
        let verified = api.verify_audit(&server.admin_key).await;
        assert_eq!(verified["ok"], true, "{verified}");
        api.delete_sandbox(&mallory, &attacker_id).await;
        api.delete_sandbox(&alice, &alice_id).await;
    });
    drop(rt);
    // The attacker's connections are gone: the server holds about what it held before.
    let settled = common::wait_until(Duration::from_secs(30), || open_fds(pid) <= baseline + 8);
    assert!(
        settled,
        "{} descriptors, {baseline} before: {:?}",
        open_fds(pid),
        fd_kinds(pid)
    );
    server.stop();
}

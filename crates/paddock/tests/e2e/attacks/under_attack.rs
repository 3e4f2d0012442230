//! One tenant attacks a real `paddock serve` at full speed for 30 s while another tenant uses it
//! (issue 11, "must show"): the attacker keeps a thousand half-sent request heads open from its own
//! address, reopening each as soon as it is closed (class 4), holds as many connections as it can to
//! its sandbox's resolver (DNS over TCP) and proxy, asking a question on each every 2 s (class 3),
//! runs execs answered as JSON that write 17 MB of NULs to each stream, four at a time (class 5), and
//! floods its sandbox's resolver with UDP DNS questions from two processes (class 6). Every request
//! of the other tenant (reading its sandbox, running `true` in it) is answered, the attacker's audit
//! rows stay within its sandbox's row rate, the chain verifies and the server's descriptors come back.
//!
//! The latency of the other tenant's requests (its own client, thread and runtime) is printed (p50,
//! p99; quiet first, then under attack; all, reads, execs), not asserted: tests never assert
//! wall-clock times. `bench/under_attack.py` runs this test on a release build, each attack alone
//! (`UNDER_ATTACK_CLASSES`) and all at once, and reports the figures.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpSocket;

use crate::support::{
    fd_kinds, open_fds,
    server::{Api, Server},
    wait_until, TestEnv,
};

const ATTACK: Duration = Duration::from_secs(30);
/// How long the other tenant is measured alone first.
const QUIET: Duration = Duration::from_secs(5);
/// The egress proxy's caps a sandbox can run into (`paddock_egress::Limit`), each recorded on at most
/// one `network.refused` row per window.
const CAPS: f64 = 7.0;
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

/// Class 3, from inside the sandbox: as many TCP connections as it can open to its resolver (DNS over
/// TCP) and to its HTTP proxy, each held open and asking a question every 2 s, reopened as soon as
/// the server closes or refuses it, until the time is up.
const CONNECTION_FLOOD: &str = r#"
import os, selectors, socket, struct, sys, time
ns = '10.0.0.1'
for line in open('/etc/resolv.conf'):
    if line.startswith('nameserver'):
        ns = line.split()[1]
        break
proxy = os.environ['HTTP_PROXY'].split('//')[1].rstrip('/').rsplit(':', 1)
targets = [(ns, 53), (proxy[0], int(proxy[1]))]
end = time.time() + float(sys.argv[1])
q = struct.pack('>HHHHHH', 7, 0x0100, 1, 0, 0, 0) + b'\x04slow\x04evil\x04test\x00' + struct.pack('>HH', 1, 1)
ask = struct.pack('>H', len(q)) + q
sel = selectors.DefaultSelector()
held = {}
opened = refused = 0
next_ask = 0
while time.time() < end:
    for target in targets:
        for _ in range(50):
            if len(held) >= 3000:
                break
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(target)
            except BlockingIOError:
                pass
            except OSError:
                refused += 1
                s.close()
                continue
            held[s.fileno()] = s
            sel.register(s, selectors.EVENT_READ)
            opened += 1
    if time.time() >= next_ask:
        for s in list(held.values()):
            try:
                s.send(ask)
            except OSError:
                pass
        next_ask = time.time() + 2
    for key, _ in sel.select(timeout=0.05):
        s = key.fileobj
        try:
            data = s.recv(4096)
        except BlockingIOError:
            continue
        except OSError:
            data = b''
        if not data:
            sel.unregister(s)
            held.pop(s.fileno(), None)
            s.close()
            refused += 1
print('opened', opened, 'closed or refused', refused)
"#;

/// The other tenant's requests until `until`, one every 50 ms, alternately reading its sandbox and
/// running `true` in it (answered as JSON): the time each took, and the failures.
async fn victim(api: &Api, key: &str, id: &str, until: Instant) -> (Latencies, Vec<String>) {
    let mut latencies = Latencies::default();
    let mut failures = Vec::new();
    let mut n = 0u64;
    while Instant::now() < until {
        let t = Instant::now();
        let answer = if n.is_multiple_of(2) {
            api.try_request(
                key,
                reqwest::Method::GET,
                &format!("/v1/sandboxes/{id}"),
                None,
                None,
            )
            .await
            .map(|r| (r.status.is_success(), r.status.to_string()))
            .map_err(|e| e.to_string())
        } else {
            api.try_exec(key, id, &json!({"argv": ["true"]}), "application/json")
                .await
                .map(|r| (r.status.is_success(), r.status.to_string()))
        };
        match answer {
            Ok((true, _)) if n.is_multiple_of(2) => latencies.reads.push(t.elapsed()),
            Ok((true, _)) => latencies.execs.push(t.elapsed()),
            Ok((false, status)) => failures.push(format!("HTTP {status}")),
            Err(e) => failures.push(e.to_string()),
        }
        n += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    latencies.reads.sort();
    latencies.execs.sort();
    (latencies, failures)
}

/// [`victim`] on a thread and runtime of its own, with a client of its own: the other tenant's
/// client is not the attacker's, and its figures are the server's answers, not waits for a worker
/// thread of the attacker's runtime.
async fn victim_apart(api: Api, key: &str, id: &str, until: Instant) -> (Latencies, Vec<String>) {
    let (key, id) = (key.to_owned(), id.to_owned());
    let thread = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(victim(&api, &key, &id, until))
    });
    tokio::task::spawn_blocking(move || thread.join().expect("the other tenant's thread"))
        .await
        .expect("join")
}

/// The other tenant's answered requests: how long each took, by kind.
#[derive(Default)]
struct Latencies {
    reads: Vec<Duration>,
    execs: Vec<Duration>,
}

impl Latencies {
    fn all(&self) -> Vec<Duration> {
        let mut all: Vec<_> = self.reads.iter().chain(&self.execs).copied().collect();
        all.sort();
        all
    }

    fn len(&self) -> usize {
        self.reads.len() + self.execs.len()
    }

    /// Prints the figures `bench/under_attack.py` reads: all requests, then reads and execs apart.
    fn report(&self, phase: &str) {
        report(phase, &self.all());
        report(&format!("{phase} (reads)"), &self.reads);
        report(&format!("{phase} (execs)"), &self.execs);
    }
}

fn report(phase: &str, sorted: &[Duration]) {
    assert!(!sorted.is_empty(), "no request answered {phase}");
    eprintln!(
        "FIGURES {phase}: {} requests, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        sorted.len(),
        percentile(sorted, 0.50).as_secs_f64() * 1e3,
        percentile(sorted, 0.99).as_secs_f64() * 1e3,
        sorted.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
}

/// The attack classes to run: all of them (3, 4, 5, 6), unless `UNDER_ATTACK_CLASSES` names some
/// (`bench/under_attack.py` measures each alone too).
fn classes() -> Vec<u32> {
    match std::env::var("UNDER_ATTACK_CLASSES") {
        Ok(list) => list
            .split(',')
            .map(|c| {
                c.trim()
                    .parse()
                    .expect("UNDER_ATTACK_CLASSES: classes 3 to 6, comma-separated")
            })
            .collect(),
        Err(_) => vec![3, 4, 5, 6],
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[test]
fn another_tenant_is_answered_while_one_attacks_at_full_speed() {
    let env = TestEnv::new();
    let (_dir, config) = config_file();
    // `UNDER_ATTACK_LOG=warn,paddock_api=debug` shows how long the server took over each request.
    let log = std::env::var("UNDER_ATTACK_LOG").unwrap_or_else(|_| "warn".to_owned());
    let server = Server::start(&env, &["--config", config.to_str().expect("utf-8")], &log);
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

        // Alice alone first: the figures to compare with.
        let (quiet, failures) = victim_apart(server.api(), &alice, &alice_id, Instant::now() + QUIET).await;
        assert!(
            failures.is_empty(),
            "requests failed with no attack: {failures:?}"
        );

        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let classes = classes();
        // Class 4: a thousand slow heads from the attacker's own address.
        let heads = classes.contains(&4).then(|| {
            tokio::spawn(slow_heads(
                addr,
                Ipv4Addr::new(127, 0, 0, 2),
                1000,
                stop.clone(),
                opened.clone(),
            ))
        });
        // Classes 6 and 3, in the background of the attacker's sandbox: the UDP DNS flood, and
        // connections to its resolver and proxy, as many as it can hold.
        for (class, script) in [(6, DNS_FLOOD), (3, CONNECTION_FLOOD)] {
            if !classes.contains(&class) {
                continue;
            }
            let shell = format!("python3 - {} <<'EOF'\n{script}\nEOF", ATTACK.as_secs());
            let reply = api
                .request(
                    &mallory,
                    reqwest::Method::POST,
                    &format!("/v1/sandboxes/{attacker_id}/exec"),
                    Some(&json!({"shell": shell, "background": true})),
                    None,
                )
                .await;
            assert_eq!(reply.status, 202, "{}", reply.text());
        }
        // Class 5: JSON execs of 2 x 17 MB of NULs, four at a time.
        let nuls = json!({"shell": "head -c 17000000 /dev/zero; head -c 17000000 /dev/zero >&2"});
        let execs = Arc::new(AtomicU64::new(0));
        let mut attackers = Vec::new();
        for _ in 0..if classes.contains(&5) { 4 } else { 0 } {
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

        // Meanwhile Alice reads her sandbox and runs `true` in it, one request every 50 ms.
        let (attacked, failures) = victim_apart(server.api(), &alice, &alice_id, start + ATTACK).await;
        stop.store(true, Ordering::SeqCst);
        if let Some(heads) = heads {
            heads.abort();
        }
        for a in attackers {
            let _ = a.await;
        }
        quiet.report("quiet");
        attacked.report("under attack");
        eprintln!(
            "the attacker opened {} slow connections and ran {} 34 MB JSON execs",
            opened.load(Ordering::SeqCst),
            execs.load(Ordering::SeqCst)
        );
        assert!(failures.is_empty(), "requests failed: {failures:?}");
        assert!(attacked.len() >= 100, "{} requests", attacked.len());
        // The floods' rows: at most the sandbox's bucket (100, then 10/s) and a suppressed row per
        // window, whatever the number of questions and connections; besides, the proxy's refusals at
        // its caps, one row per cap and 10 s window (and one when the sandbox goes).
        let rows = api
            .audit_rows(
                &server.admin_key,
                &format!("sandbox={attacker_id}&action=network."),
            )
            .await;
        let elapsed = start.elapsed().as_secs_f64();
        let (refusals, events): (Vec<_>, Vec<_>) =
            rows.iter().partition(|r| r["action"] == "network.refused");
        let bound = 100.0 + 10.0 * elapsed + elapsed / 10.0 + 2.0;
        let refusal_bound = CAPS * (elapsed / 10.0 + 2.0);
        eprintln!(
            "the attacker's sandbox has {} network audit rows (bound {bound:.0}) and {} refusal rows \
             (bound {refusal_bound:.0})",
            events.len(),
            refusals.len()
        );
        assert!((events.len() as f64) <= bound, "{} network rows", events.len());
        assert!(
            (refusals.len() as f64) <= refusal_bound,
            "{} refusal rows",
            refusals.len()
        );
        if classes.contains(&3) {
            assert!(
                refusals
                    .iter()
                    .any(|r| r["detail"]["limit"] == "dns_tcp_connections"),
                "the resolver's connection cap was reached: {refusals:?}"
            );
        }
        let verified = api.verify_audit(&server.admin_key).await;
        assert_eq!(verified["ok"], true, "{verified}");
        api.delete_sandbox(&mallory, &attacker_id).await;
        api.delete_sandbox(&alice, &alice_id).await;
    });
    drop(rt);
    // The attacker's connections are gone: the server holds about what it held before.
    let settled = wait_until(Duration::from_secs(30), || open_fds(pid) <= baseline + 8);
    assert!(
        settled,
        "{} descriptors, {baseline} before: {:?}",
        open_fds(pid),
        fd_kinds(pid)
    );
    server.stop();
}

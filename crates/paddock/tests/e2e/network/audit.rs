//! The audit log against a sandbox that floods its egress proxy (issue 11, class 6): two processes
//! send UDP DNS questions as fast as they can for a few seconds. The rows they add are bounded by the
//! sandbox's row rate, the counts on those rows add up to the questions the proxy reported (its own
//! counter, `paddock_egress_total`), the chain verifies, and a retention run removes rows while the
//! chain still verifies. Nothing leaves the machine: every name asked for is refused or answered
//! from the operator's host map.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use paddock_control::NetworkAuditConfig;
use paddock_egress::policy::OperatorPolicy;
use serde_json::{json, Value};

use crate::support::{
    cli_audit_verify,
    harness::{Client, Harness, Options},
};

/// How long each flooding process sends.
const FLOOD_SECONDS: u64 = 4;
const AUDIT: NetworkAuditConfig = NetworkAuditConfig {
    window: Duration::from_secs(2),
    sandbox_rows_per_second: 10.0,
    sandbox_burst: 100,
    tenant_rows_per_second: 50.0,
    tenant_burst: 500,
    retention: Duration::from_secs(30 * 24 * 3600),
    max_rows_per_tenant: 20,
    // Retention runs when the test says (and once at start).
    retention_interval: Duration::from_secs(3600),
};

fn network_config() -> paddock_control::NetworkConfig {
    let mut operator = OperatorPolicy {
        host_addresses: paddock_egress::host_addresses().expect("host addresses"),
        ..OperatorPolicy::default()
    };
    operator.hosts.insert(
        "allowed.test".parse().expect("name"),
        vec![IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1))],
    );
    paddock_control::NetworkConfig {
        ports: paddock_types::EgressPorts::default(),
        egress: paddock_egress::EgressConfig {
            operator,
            system_resolver: false,
            public_roots: false,
            ..Default::default()
        },
        conntrack: Default::default(),
    }
}

/// Two processes sending A questions (a third for an allowed name, a third for a few hundred refused
/// names, a third for one refused name) to the sandbox's resolver, without waiting for answers.
const FLOOD: &str = r#"
import os, socket, struct, sys, time
ns = '10.0.0.1'
for line in open('/etc/resolv.conf'):
    if line.startswith('nameserver'):
        ns = line.split()[1]
        break
def question(name, i):
    head = struct.pack('>HHHHHH', i & 0xffff, 0x0100, 1, 0, 0, 0)
    qname = b''.join(bytes([len(p)]) + p.encode() for p in name.split('.')) + b'\0'
    return head + qname + struct.pack('>HH', 1, 1)
def flood():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    end = time.time() + float(sys.argv[1])
    n = 0
    while time.time() < end:
        k = n % 3
        name = 'allowed.test' if k == 0 else ('x%d.evil.test' % (n % 300) if k == 1 else 'evil.test')
        try:
            s.sendto(question(name, n), (ns, 53))
            n += 1
        except BlockingIOError:
            pass
        try:
            while True:
                s.recv(4096)
        except BlockingIOError:
            pass
    return n
children = []
for _ in range(2):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, str(flood()).encode())
        os._exit(0)
    os.close(w)
    children.append((pid, r))
total = 0
for pid, r in children:
    total += int(os.read(r, 64) or b'0')
    os.waitpid(pid, 0)
print('SENT', total)
"#;

/// The DNS questions the proxy reported, all decisions.
async fn proxy_questions(admin: &Client) -> u64 {
    let text = admin.get("/metrics").await.text();
    ["allowed", "denied"]
        .iter()
        .filter_map(|d| {
            let series = format!("paddock_egress_total{{kind=\"dns\",decision=\"{d}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(series.as_str())?.trim().parse::<f64>().ok())
        })
        .sum::<f64>() as u64
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

/// The DNS questions the sandbox's network rows account for: `count` of its `network.dns` rows and
/// the DNS entries of its `network.suppressed` rows. (Questions the proxy refused at its in-flight cap
/// never reached its resolver: they are counted on `network.refused` rows, not here.)
fn accounted(rows: &[Value]) -> u64 {
    let dns_entries = |counts: &Value| -> u64 {
        counts
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| k.starts_with("dns."))
                    .filter_map(|(_, n)| n.as_u64())
                    .sum()
            })
            .unwrap_or(0)
    };
    rows.iter()
        .map(|r| match r["action"].as_str() {
            Some("network.suppressed") => {
                dns_entries(&r["detail"]["rate_limited"]) + dns_entries(&r["detail"]["queue_full"])
            }
            Some("network.dns") => r["detail"]["count"].as_u64().expect("count"),
            _ => 0,
        })
        .sum()
}

#[test]
fn a_dns_flood_adds_a_bounded_number_of_rows_that_count_every_question() {
    let h = Harness::with(Options {
        network: Some(network_config()),
        network_audit: AUDIT,
        ..Options::default()
    });
    h.block_on(async {
        let c = h.admin.new_tenant("flood").await;
        let started = Instant::now();
        let id = c
            .create_sandbox(json!({"network": {"allow": [{"domain": "allowed.test"}]}}))
            .await;
        let out = c
            .sh(&id, &format!("python3 - {FLOOD_SECONDS} <<'EOF'\n{FLOOD}\nEOF"))
            .await;
        let sent: u64 = out
            .trim()
            .strip_prefix("SENT ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("flood output: {out}"));

        // Every question the proxy reported is accounted for once the last windows have ended.
        let deadline = Instant::now() + Duration::from_secs(60);
        let (rows, questions) = loop {
            let questions = proxy_questions(&h.admin).await;
            let rows = h
                .admin
                .audit_rows(&[("sandbox", id.as_str()), ("action", "network.")])
                .await;
            if accounted(&rows) == questions {
                break (rows, questions);
            }
            assert!(
                Instant::now() < deadline,
                "the rows account for {} of the {questions} questions the proxy reported",
                accounted(&rows)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let elapsed = started.elapsed().as_secs_f64();
        let suppressed: Vec<&Value> = rows
            .iter()
            .filter(|r| r["action"] == "network.suppressed")
            .collect();
        eprintln!(
            "{sent} questions sent, {questions} reported by the proxy, {} rows ({} suppressed rows) in {elapsed:.1} s",
            rows.len(),
            suppressed.len()
        );
        let db_bytes: u64 = ["paddock.db", "paddock.db-wal"]
            .iter()
            .filter_map(|f| std::fs::metadata(h.env().state().join(f)).ok())
            .map(|m| m.len())
            .sum();
        eprintln!("database and WAL: {} KiB", db_bytes / 1024);
        assert!(questions > 2_000, "the flood reached the proxy: {questions} of {sent}");
        // At most the sandbox's bucket, plus one suppressed row per window (and one more at each end).
        let bound = f64::from(AUDIT.sandbox_burst)
            + AUDIT.sandbox_rows_per_second * elapsed
            + elapsed / AUDIT.window.as_secs_f64()
            + 2.0;
        assert!(
            (rows.len() as f64) <= bound,
            "{} rows for {questions} questions (bound {bound:.0})",
            rows.len()
        );
        assert!(!suppressed.is_empty(), "the excess was counted");
        assert!(suppressed.iter().all(|r| r["outcome"] == "suppressed" && r["tenant"] == "flood"));
        // The first of each kind of question is there in full.
        let has = |outcome: &str, name: &str| {
            rows.iter().any(|r| {
                r["action"] == "network.dns"
                    && r["outcome"] == outcome
                    && r["detail"]["name"].as_str().map(|n| n.trim_end_matches('.')) == Some(name)
                    && r["detail"]["rule"].is_object()
            })
        };
        assert!(has("allowed", "allowed.test"), "{rows:?}");
        assert!(has("denied", "evil.test"), "{rows:?}");
        let metrics = h.admin.get("/metrics").await.text();
        for series in [
            "paddock_audit_network_events_suppressed_total{reason=\"rate\"}",
            "paddock_audit_network_rows_total{kind=\"first\"}",
            "paddock_audit_network_rows_total{kind=\"suppressed\"}",
        ] {
            assert!(metric(&metrics, series).is_some_and(|v| v > 0.0), "{series} in:\n{metrics}");
        }
        let verified = h.admin.get("/v1/audit/verify").await.ok(200);
        assert_eq!(verified["ok"], true, "{verified}");

        // Retention keeps 20 network rows of the tenant; the chain still verifies.
        let pruned = h
            .service
            .as_ref()
            .expect("the service")
            .prune_network_audit()
            .await
            .expect("retention");
        assert!(pruned > 0);
        let left = h
            .admin
            .audit_rows(&[("tenant", "flood"), ("action", "network.")])
            .await;
        assert_eq!(left.len(), 20, "the tenant's newest network rows are kept");
        let prunes = h.admin.audit_rows(&[("action", "audit.prune")]).await;
        assert!(
            prunes.iter().any(|r| r["detail"]["rows"] == pruned),
            "{prunes:?}"
        );
        let verified = h.admin.get("/v1/audit/verify").await.ok(200);
        assert_eq!(verified["ok"], true, "{verified}");
        assert_eq!(verified["rows_pruned"], pruned, "{verified}");
        let metrics = h.admin.get("/metrics").await.text();
        assert_eq!(
            metric(&metrics, "paddock_audit_rows_pruned_total"),
            Some(pruned as f64)
        );
        let cli = cli_audit_verify(h.env());
        assert!(cli.contains("removed by retention"), "{cli}");
        c.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
    });
    drop(h);
}

//! Sandbox networks end to end: a real service and backend, the egress proxy, and a stand-in for the
//! outside world on an address of a veth pair this test creates on the host (198.51.100.0/24, TEST-NET-2),
//! reached only through the operator's host map and an operator exception. Nothing leaves the
//! machine: every name resolves from the host map, the system resolver is off, and any other
//! destination the sandbox tries is refused by the proxy before it connects anywhere.
//!
//! Each property is tried from inside the sandbox the way a workload would try to get around it.
//! Below: the stand-in for the outside world and what a policy lets through; the command line and
//! attacks on the proxy in the modules.

mod approvals;
mod attacks;
mod cli;
mod mcp;

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use paddock_egress::policy::{OperatorAllow, OperatorPolicy};
use serde_json::json;

use crate::support::{
    harness::{poll, Harness, Options},
    require_root,
    server::Server,
    TestEnv,
};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/network/fixtures");
/// The secret's value: it must reach the bound HTTPS server and nothing inside the sandbox.
const SECRET_VALUE: &str = "ghp_paddock_test_value_8c1f";

/// The outside world: a host-side veth pair with one address, an HTTP and an HTTPS server on it (the
/// HTTPS one under a CA of its own), and a package index.
struct Outside {
    iface: String,
    ip: Ipv4Addr,
    http: u16,
    https: u16,
    ca_pem: String,
    server: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("ip").args(["link", "del", &self.iface]).status();
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn outside() -> Outside {
    // Root before the first veth: not root is a failure, as in `TestEnv::new`.
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    run(Command::new("python3")
        .arg(Path::new(FIXTURES).join("wheel.py"))
        .arg(d.join("www")));
    // A CA and a leaf for secret.test signed by it (the egress proxy trusts this CA upstream).
    let ssl = |args: &[&str]| run(Command::new("openssl").args(args).current_dir(d));
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    ssl(&[
        &["req", "-x509"][..],
        &ec,
        &[
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=paddock test CA",
        ],
    ]
    .concat());
    ssl(&[
        &["req"][..],
        &ec,
        &[
            "-keyout",
            "leaf.key",
            "-out",
            "leaf.csr",
            "-subj",
            "/CN=secret.test",
        ],
    ]
    .concat());
    std::fs::write(
        d.join("leaf.ext"),
        "subjectAltName=DNS:secret.test\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    ssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "leaf.pem",
        "-days",
        "2",
        "-extfile",
        "leaf.ext",
    ]);
    let n = std::process::id();
    let iface = format!("pdt{}", n % 1_000_000);
    let ip = Ipv4Addr::new(198, 51, 100, 20 + (n % 200) as u8);
    // A veth pair whose ends both stay on the host (this kernel has no dummy interfaces): one end
    // carries the address.
    let peer = format!("{iface}p");
    run(Command::new("ip").args(["link", "add", &iface, "type", "veth", "peer", "name", &peer]));
    let mut outside = Outside {
        iface: iface.clone(),
        ip,
        http: 0,
        https: 0,
        ca_pem: std::fs::read_to_string(d.join("ca.pem")).expect("ca"),
        server: Command::new("sleep").arg("0").spawn().expect("placeholder"),
        _dir: dir,
    };
    run(Command::new("ip").args(["addr", "add", &format!("{ip}/32"), "dev", &iface]));
    run(Command::new("ip").args(["link", "set", &iface, "up"]));
    run(Command::new("ip").args(["link", "set", &peer, "up"]));
    let _ = outside.server.wait();
    let d = outside._dir.path();
    outside.server = Command::new("python3")
        .arg(Path::new(FIXTURES).join("server.py"))
        .arg(ip.to_string())
        .arg(d.join("www"))
        .arg(d.join("leaf.pem"))
        .arg(d.join("leaf.key"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("server");
    let mut line = String::new();
    BufReader::new(outside.server.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("ready line");
    let ports: Vec<u16> = line
        .split_whitespace()
        .skip(1)
        .map(|p| p.parse().expect("port"))
        .collect();
    assert_eq!(ports.len(), 2, "server said {line:?}");
    (outside.http, outside.https) = (ports[0], ports[1]);
    outside
}

/// A test of one audit row's detail.
type Check = dyn Fn(&serde_json::Value) -> bool;

fn network_config(o: &Outside) -> paddock_control::NetworkConfig {
    let mut operator = OperatorPolicy {
        host_addresses: paddock_egress::host_addresses().expect("host addresses"),
        allow: vec![OperatorAllow {
            cidr: IpAddr::V4(o.ip).to_string().parse().expect("cidr"),
            ports: Vec::new(),
            reason: "the test's outside world".into(),
        }],
        ..OperatorPolicy::default()
    };
    for name in ["allowed.test", "other.test", "secret.test", "pypi.test"] {
        operator
            .hosts
            .insert(name.parse().expect("name"), vec![IpAddr::V4(o.ip)]);
    }
    paddock_control::NetworkConfig {
        ports: paddock_types::EgressPorts::default(),
        egress: paddock_egress::EgressConfig {
            operator,
            system_resolver: false,
            public_roots: false,
            upstream_ca_pems: vec![o.ca_pem.clone()],
            ..Default::default()
        },
        conntrack: Default::default(),
    }
}

/// A python snippet run in the sandbox; prints what it got, or `ERR <exception>`.
fn py(body: &str) -> String {
    format!("python3 - <<'EOF'\nimport os, socket, urllib.request\ntry:\n{}\nexcept Exception as e:\n    print('ERR', type(e).__name__, e)\nEOF\n",
        body.lines().map(|l| format!("    {l}\n")).collect::<String>())
}

/// Sends `request` on a raw TCP connection (no proxy) and prints what came back.
fn raw(host: &str, port: u16, request: &str) -> String {
    py(&format!(
        "s = socket.create_connection(({host:?}, {port}), timeout=10)\ns.sendall({request:?}.encode())\ndata = b''\nwhile True:\n    chunk = s.recv(65536)\n    if not chunk:\n        break\n    data += chunk\nprint('GOT', data.decode(errors='replace'))"
    ))
}

fn fetch(url: &str, auth: Option<&str>) -> String {
    let headers = match auth {
        Some(a) => format!("{{'Authorization': {a}}}"),
        None => "{}".into(),
    };
    py(&format!(
        "r = urllib.request.Request({url:?}, headers={headers})\nprint('GOT', urllib.request.urlopen(r, timeout=10).read().decode())"
    ))
}

#[test]
fn a_networked_sandbox_reaches_only_what_its_policy_allows() {
    let o = outside();
    let h = Harness::with(Options {
        network: Some(network_config(&o)),
        ..Options::default()
    });
    let (ip, http, https) = (o.ip, o.http, o.https);
    h.block_on(async {
        let c = &h.admin;
        let secret = c
            .post(
                "/v1/secrets",
                json!({"name": "GH", "value": SECRET_VALUE, "hosts": ["secret.test"]}),
            )
            .await
            .ok(201);
        assert!(!secret.to_string().contains(SECRET_VALUE));
        assert!(!c.get("/v1/secrets").await.ok(200).to_string().contains(SECRET_VALUE));
        let id = c
            .create_sandbox(json!({
                "network": {"allow": [
                    {"domain": "allowed.test"}, {"domain": "secret.test"}, {"domain": "pypi.test"},
                    // A tenant cannot open what the operator denies: rules wider than a denied
                    // network reach into it (one entirely inside is refused at create, as
                    // network::reachable shows), and the proxy still refuses it there.
                    {"cidr": "169.254.0.0/15"}, {"cidr": "10.0.0.0/7"}
                ]},
                "secrets": ["GH"],
            }))
            .await;

        // An allowed name, through the proxy variables and by a client that ignores them.
        let out = c.sh(&id, &fetch(&format!("http://allowed.test:{http}/hello.txt"), None)).await;
        assert!(out.contains("GOT hello from outside"), "{out}");
        let out = c
            .sh(&id, &raw("allowed.test", http, "GET /hello.txt HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"))
            .await;
        assert!(out.contains("hello from outside"), "proxy-ignoring client: {out}");

        // A name outside the policy: refused by the proxy, and DNS does not answer it.
        let out = c.sh(&id, &fetch(&format!("http://other.test:{http}/hello.txt"), None)).await;
        assert!(out.starts_with("ERR"), "other.test through the proxy: {out}");
        let out = c.sh(&id, &py("print('GOT', socket.gethostbyname('other.test'))")).await;
        assert!(out.starts_with("ERR"), "DNS for an unlisted name: {out}");

        // An IP literal with no allowed name, and a rebinding attempt (an allowed name sent to an
        // address DNS never gave for it) get nothing.
        let out = c
            .sh(&id, &raw(&ip.to_string(), http, &format!("GET /hello.txt HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n")))
            .await;
        assert!(!out.contains("hello from outside"), "IP literal: {out}");
        let out = c
            .sh(&id, &raw("192.0.2.77", http, "GET /hello.txt HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"))
            .await;
        assert!(!out.contains("hello from outside"), "rebinding: {out}");
        // Metadata and private ranges stay closed although the tenant's policy allows them.
        for target in ["169.254.169.254", "10.1.2.3"] {
            let out = c
                .sh(&id, &raw(target, 80, "GET /latest/meta-data/ HTTP/1.1\r\nHost: metadata\r\n\r\n"))
                .await;
            assert!(out.starts_with("ERR") || out.trim() == "GOT", "{target}: {out}");
        }
        // UDP other than DNS goes nowhere.
        let out = c
            .sh(&id, &py("s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.settimeout(3)\ns.connect(('192.0.2.53', 9999))\ns.send(b'x')\nprint('GOT', s.recv(10))"))
            .await;
        assert!(out.starts_with("ERR"), "UDP: {out}");

        // The credential: a placeholder inside, the value only on the wire to the bound host. (The
        // search pattern is a regex that matches the value but not its own text, or grep would find
        // itself in /proc/<pid>/cmdline.)
        let pattern = format!("{}[{}]", &SECRET_VALUE[..SECRET_VALUE.len() - 1], &SECRET_VALUE[SECRET_VALUE.len() - 1..]);
        let out = c.sh(&id, "echo \"$GH\"").await;
        assert_eq!(out.trim(), "paddock-secret:GH");
        let out = c
            .sh(&id, &fetch(&format!("https://secret.test:{https}/echo"), Some("'Bearer ' + os.environ['GH']")))
            .await;
        assert!(out.contains(&format!("auth=Bearer {SECRET_VALUE}")), "bound host: {out}");
        let out = c
            .sh(&id, &fetch(&format!("http://allowed.test:{http}/echo"), Some("'Bearer ' + os.environ['GH']")))
            .await;
        assert!(out.contains("auth=Bearer paddock-secret:GH"), "unbound host: {out}");
        let out = c
            .sh(&id, &format!("grep -rsla '{pattern}' /etc /home /tmp /root /var /run /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null; env | grep -c '{pattern}'; true"))
            .await;
        assert_eq!(out.trim(), "0", "the secret's value is inside the sandbox: {out}");
        // Nor in the memory of any process of the workload's (the scanner builds the
        // value from two halves, so its own memory holds it only once the scan has begun: the
        // scanner skips itself).
        let (half_a, half_b) = SECRET_VALUE.split_at(8);
        let scan = format!(
            "import os, re\nneedle = ({half_a:?} + {half_b:?}).encode()\nhits, scanned = [], 0\nfor pid in [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]:\n    try:\n        maps = open(f'/proc/{{pid}}/maps').read().splitlines()\n        mem = open(f'/proc/{{pid}}/mem', 'rb', 0)\n    except OSError:\n        continue\n    scanned += 1\n    for line in maps:\n        a, b = [int(x, 16) for x in line.split()[0].split('-')]\n        if 'r' not in line.split()[1] or b - a > 1 << 30:\n            continue\n        try:\n            mem.seek(a)\n            if needle in mem.read(b - a):\n                hits.append(pid)\n        except OSError:\n            pass\nprint('scanned', scanned, 'hits', hits)\n"
        );
        // As the workload's user, beside a process of its own (the one the scan can read).
        let result = c
            .exec_json(&id, json!({"argv": ["sh", "-c", "sleep 60 & python3 -c \"$0\"; kill $!", scan]}))
            .await;
        let out = result["stdout"].as_str().unwrap_or_default();
        assert!(out.contains("hits []"), "the secret's value is in a sandbox process's memory: {result}");
        assert!(!out.contains("scanned 0 "), "no process memory could be read: {result}");

        // pip installs from a package index through the proxy.
        let out = c
            .sh(&id, &format!("python3 -m pip install -q --no-cache-dir --disable-pip-version-check --index-url http://pypi.test:{http}/simple/ --trusted-host pypi.test --target /tmp/pkgs paddock-demo 2>&1 && PYTHONPATH=/tmp/pkgs python3 -c 'import paddock_demo; print(\"VALUE\", paddock_demo.VALUE)'"))
            .await;
        assert!(out.contains("VALUE 42"), "pip: {out}");

        // A live policy change applies to the next connection.
        c.put(
            &format!("/v1/sandboxes/{id}/network"),
            json!({"policy": {"allow": [{"domain": "other.test"}]}}),
        )
        .await
        .ok(200);
        let out = c.sh(&id, &fetch(&format!("http://other.test:{http}/hello.txt"), None)).await;
        assert!(out.contains("GOT hello from outside"), "after the change: {out}");
        let out = c.sh(&id, &fetch(&format!("http://allowed.test:{http}/hello.txt"), None)).await;
        assert!(out.starts_with("ERR"), "allowed.test after it left the policy: {out}");

        // Every attempt is recorded in the audit log, allowed and refused, with its destination,
        // decision and bytes (rows arrive a moment after a connection ends).
        let mut missing = Vec::new();
        for _ in 0..50 {
            let rows = c.audit_rows(&[("sandbox", id.as_str()), ("action", "network.")]).await;
            let has = |action: &str, outcome: &str, f: &dyn Fn(&serde_json::Value) -> bool| {
                rows.iter()
                    .any(|r| r["action"] == action && r["outcome"] == outcome && f(&r["detail"]))
            };
            missing.clear();
            let expected: [(&str, &str, &str, &Check); 6] = [
                ("allowed allowed.test with bytes", "network.connection", "allowed", &|d| {
                    d["name"] == "allowed.test" && d["bytes_down"].as_u64() > Some(0)
                }),
                ("metadata refused", "network.connection", "denied", &|d| d["ip"] == "169.254.169.254"),
                ("private refused", "network.connection", "denied", &|d| d["ip"] == "10.1.2.3"),
                ("rebinding refused", "network.connection", "denied", &|d| d["ip"] == "192.0.2.77"),
                ("secret injected by name", "network.connection", "allowed", &|d| {
                    d["name"] == "secret.test" && d["secrets_injected"] == json!(["GH"])
                }),
                ("DNS for other.test refused", "network.dns", "denied", &|d| {
                    d["name"].as_str().map(|n| n.trim_end_matches('.')) == Some("other.test")
                }),
            ];
            for (what, action, outcome, f) in expected {
                if !has(action, outcome, f) {
                    missing.push(what);
                }
            }
            if missing.is_empty() {
                assert!(!serde_json::to_string(&rows).expect("json").contains(SECRET_VALUE));
                // Each row is the tenant's (a tenant reads its own audit log by that column).
                assert!(rows.iter().all(|r| r["tenant"].is_string()), "{rows:?}");
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(missing.is_empty(), "the audit log lacks: {missing:?}");
        // And counted in the metrics.
        let metrics = c.get("/metrics").await.text();
        for series in [
            "paddock_egress_total{kind=\"connection\",decision=\"allowed\"}",
            "paddock_egress_total{kind=\"connection\",decision=\"denied\"}",
            "paddock_egress_total{kind=\"dns\",decision=\"denied\"}",
            "paddock_egress_bytes_total{direction=\"down\"}",
        ] {
            assert!(metrics.contains(series), "{series} missing from:\n{metrics}");
        }
        // `paddock sandbox network` shows the policy, the secrets by name and the newest attempts.
        let info = c.get(&format!("/v1/sandboxes/{id}/network")).await.ok(200);
        assert_eq!(info["secrets"], json!(["GH"]));
        assert_eq!(info["policy"]["allow"], json!([{"domain": "other.test"}]));
        let recent = info["recent"].as_array().expect("recent");
        assert!(!recent.is_empty() && recent.len() <= 50, "{info}");
        assert!(recent.iter().any(|e| e["allowed"] == true) && recent.iter().any(|e| e["allowed"] == false));
        assert!(!info.to_string().contains(SECRET_VALUE));
        c.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
    });
    drop(h);
}

#[test]
fn a_sandbox_without_a_network_is_refused_one_by_a_server_without_egress() {
    let h = Harness::start();
    h.block_on(async {
        let r = h
            .admin
            .post(
                "/v1/sandboxes",
                json!({"network": {"allow": [{"domain": "a.test"}]}}),
            )
            .await;
        r.err(501, "unsupported");
        let r = h.admin.post("/v1/sandboxes", json!({"secrets": ["NOPE"]})).await;
        r.err(501, "unsupported");
    });
}

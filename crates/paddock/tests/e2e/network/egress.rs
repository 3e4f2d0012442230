//! Sandbox networks end to end: a real service and backend, the egress proxy, and a stand-in for the
//! outside world on an address of a veth pair this test creates on the host (198.51.100.0/24, TEST-NET-2),
//! reached only through the operator's host map and an operator exception. Nothing leaves the
//! machine: every name resolves from the host map, the system resolver is off, and any other
//! destination the sandbox tries is refused by the proxy before it connects anywhere.
//!
//! Each property is tried from inside the sandbox the way a workload would try to get around it.

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
                    // A tenant cannot open what the operator denies.
                    {"cidr": "169.254.169.254/32"}, {"cidr": "10.0.0.0/8"}
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

/// A configuration file whose `[egress]` section maps the test names to the outside world.
fn egress_toml(o: &Outside, env: &TestEnv) -> std::path::PathBuf {
    let config = env.state().with_extension("toml");
    let ca = o._dir.path().join("ca.pem");
    std::fs::write(
        &config,
        format!(
            "[egress]\nsystem_resolver = false\nupstream_ca_files = [{ca:?}]\n[egress.hosts]\n\"allowed.test\" = [\"{ip}\"]\n\"other.test\" = [\"{ip}\"]\n\"secret.test\" = [\"{ip}\"]\n[[egress.allow]]\ncidr = \"{ip}/32\"\nreason = \"the test's outside world\"\n",
            ip = o.ip
        ),
    )
    .expect("config");
    config
}

/// `paddock run` serves its sandbox's network in its own process, with the operator settings of the
/// configuration file and the secret's value from its own environment.
#[test]
fn paddock_run_filters_and_injects_like_the_server() {
    let o = outside();
    let env = TestEnv::new();
    let config = egress_toml(&o, &env);
    let script = [
        fetch(&format!("http://allowed.test:{}/hello.txt", o.http), None),
        fetch(&format!("http://other.test:{}/hello.txt", o.http), None),
        "echo \"placeholder=$GH\"\n".to_owned(),
        fetch(
            &format!("https://secret.test:{}/echo", o.https),
            Some("'Bearer ' + os.environ['GH']"),
        ),
    ]
    .concat();
    let out = env
        .cmd()
        .env("GH", SECRET_VALUE)
        .arg("--config")
        .arg(&config)
        .args([
            "run",
            "--allow-domain",
            "allowed.test",
            "--allow-domain",
            "secret.test",
            "--secret",
            "GH:secret.test",
            "--",
            "/bin/sh",
            "-c",
        ])
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .expect("paddock run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].contains("GOT hello from outside"), "{stdout}");
    assert!(
        lines.iter().any(|l| l.starts_with("ERR")),
        "other.test was reached: {stdout}"
    );
    assert!(stdout.contains("placeholder=paddock-secret:GH"), "{stdout}");
    assert!(
        stdout.contains(&format!("auth=Bearer {SECRET_VALUE}")),
        "{stdout}"
    );
    // The refusal is reported on stderr (paddock run keeps no audit log).
    assert!(stderr.contains("refused"), "{stderr}");
    // Without an [egress] section the defaults apply: the operator's deny list has no exception for
    // the test's address, so nothing gets through, and a bad flag is one line and a failure.
    let out = env
        .cmd()
        .args(["run", "--allow-cidr", "10.0.0.1/8", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .expect("paddock run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("host bits"), "{stderr}");
    let _ = std::fs::remove_file(&config);
    env.assert_clean();
}

/// The CLI against a real `paddock serve` configured from a file: secrets, a networked sandbox, its
/// network view and a live change.
#[test]
fn the_cli_manages_secrets_and_sandbox_networks_on_a_server() {
    let o = outside();
    let env = TestEnv::new();
    let config = egress_toml(&o, &env);
    let serve_args = ["--config", config.to_str().expect("utf-8")];
    let server = Server::start(&env, &serve_args, "info");
    let url = std::cell::RefCell::new(server.url.clone());
    let cli = |args: &[&str]| {
        env.cmd()
            .env("PADDOCK_URL", url.borrow().as_str())
            .env("GH", SECRET_VALUE)
            .stdin(Stdio::null())
            .args(args)
            .output()
            .expect("paddock runs")
    };
    let ok = |args: &[&str]| {
        let out = cli(args);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{args:?}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!text.contains(SECRET_VALUE), "{args:?} printed the secret");
        text
    };
    let fails = |args: &[&str], needle: &str| {
        let out = cli(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    };
    assert_eq!(
        ok(&[
            "secret",
            "create",
            "GH",
            "--host",
            "secret.test",
            "--from-env",
            "GH"
        ])
        .trim(),
        "GH"
    );
    fails(
        &[
            "secret",
            "create",
            "GH",
            "--host",
            "secret.test",
            "--from-env",
            "GH",
        ],
        "exists",
    );
    let listed = ok(&["secret", "ls"]);
    assert!(
        listed.contains("GH") && listed.contains("secret.test"),
        "{listed}"
    );
    fails(&["sandbox", "create", "--secret", "NOPE"], "NOPE");
    let id = ok(&[
        "sandbox",
        "create",
        "--allow-domain",
        "allowed.test",
        "--allow-domain",
        "secret.test",
        "--secret",
        "GH",
    ])
    .trim()
    .to_owned();
    let fetch_allowed = fetch(&format!("http://allowed.test:{}/hello.txt", o.http), None);
    let out = ok(&["sandbox", "exec", &id, "--", "sh", "-c", &fetch_allowed]);
    assert!(out.contains("GOT hello from outside"), "{out}");
    // What the bound host received from the sandbox. (The server echoes the header, so this output
    // does hold the value: it is read directly, not through `ok`.)
    let fetch_secret = fetch(
        &format!("https://secret.test:{}/echo", o.https),
        Some("'Bearer ' + os.environ['GH']"),
    );
    let echo_of_secret = || {
        let out = cli(&["sandbox", "exec", &id, "--", "sh", "-c", &fetch_secret]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = echo_of_secret();
    assert!(
        out.contains(&format!("auth=Bearer {SECRET_VALUE}")),
        "{out}\n{}",
        ok(&["sandbox", "network", &id])
    );
    // The audit rows arrive a moment after the connection ends.
    let mut shown = String::new();
    for _ in 0..50 {
        shown = ok(&["sandbox", "network", &id]);
        if shown.contains("allowed.test (") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(shown.contains("allow:   allowed.test secret.test"), "{shown}");
    assert!(shown.contains("secrets: GH"), "{shown}");
    assert!(
        shown.contains("allowed.test (") && shown.contains("allowed"),
        "{shown}"
    );
    fails(
        &["sandbox", "network", &id, "--allow-domain", "other.test"],
        "--set",
    );
    let shown = ok(&[
        "sandbox",
        "network",
        &id,
        "--set",
        "--allow-domain",
        "other.test",
        "--allow-domain",
        "secret.test",
    ]);
    assert!(shown.contains("allow:   other.test secret.test"), "{shown}");
    let out = ok(&["sandbox", "exec", &id, "--", "sh", "-c", &fetch_allowed]);
    assert!(out.starts_with("ERR"), "after the change: {out}");
    // A restarted server serves the adopted sandbox again: the changed policy, the same CA (the
    // sandbox's trust store still holds it) and the secret.
    server.stop();
    let server = Server::restart(&env, &serve_args, "info");
    *url.borrow_mut() = server.url.clone();
    let fetch_other = fetch(&format!("http://other.test:{}/hello.txt", o.http), None);
    let out = ok(&["sandbox", "exec", &id, "--", "sh", "-c", &fetch_other]);
    assert!(out.contains("GOT hello from outside"), "after a restart: {out}");
    let out = ok(&["sandbox", "exec", &id, "--", "sh", "-c", &fetch_allowed]);
    assert!(out.starts_with("ERR"), "after a restart: {out}");
    let out = echo_of_secret();
    assert!(
        out.contains(&format!("auth=Bearer {SECRET_VALUE}")),
        "after a restart: {out}"
    );
    ok(&["secret", "rm", "GH"]);
    fails(&["secret", "rm", "GH"], "no secret");
    ok(&["sandbox", "rm", &id]);
    server.stop();
    let _ = std::fs::remove_file(&config);
    env.assert_clean();
}

/// Sends `request` over TLS to `host:port` straight from the sandbox (the transparent door
/// intercepts it: the sandbox trusts its egress CA) and prints the response.
fn tls_raw(host: &str, port: u16, request: &str) -> String {
    py(&format!(
        "import ssl\nctx = ssl.create_default_context(cafile=os.environ['SSL_CERT_FILE'])\ns = ctx.wrap_socket(socket.create_connection(({host:?}, {port}), timeout=10), server_hostname={host:?})\ns.sendall({request:?}.replace('PLACEHOLDER', os.environ['GH']).encode())\ndata = b''\nwhile True:\n    chunk = s.recv(65536)\n    if not chunk:\n        break\n    data += chunk\nprint('GOT', data.decode(errors='replace'))"
    ))
}

/// Issue 11, class 8, from inside a sandbox: an endpoint of the bound host that reflects the request
/// gets the placeholder in every field but the bound ones, and requests naming another host inside
/// the bound host's intercepted connection (a Host header, an absolute-form URI) are refused by the
/// proxy, never forwarded with the value.
#[test]
fn injection_gives_a_reflecting_or_fronted_host_nothing() {
    let o = outside();
    let h = Harness::with(Options {
        network: Some(network_config(&o)),
        ..Options::default()
    });
    let https = o.https;
    h.block_on(async {
        let c = &h.admin;
        // Bound to X-Api-Key only: not Authorization, not the query string.
        let info = c
            .post(
                "/v1/secrets",
                json!({"name": "GH", "value": SECRET_VALUE, "hosts": ["secret.test"], "headers": ["X-Api-Key"]}),
            )
            .await
            .ok(201);
        assert_eq!((info["headers"].clone(), info["query"].clone()), (json!(["x-api-key"]), json!(false)));
        let r = c
            .post(
                "/v1/secrets",
                json!({"name": "BAD", "value": "v", "hosts": ["secret.test"], "headers": ["Host"]}),
            )
            .await;
        assert_eq!(r.err(400, "invalid_request")["field"], "headers.0");
        let id = c
            .create_sandbox(json!({
                "network": {"allow": [{"domain": "secret.test"}, {"domain": "other.test"}]},
                "secrets": ["GH"],
            }))
            .await;

        // The reflecting endpoint: the value only where bound (X-Api-Key), so the echo carries it
        // there alone; the same placeholder in other headers and the query string comes back as is.
        let reflect = format!(
            "r = urllib.request.Request('https://secret.test:{https}/reflect?t=' + os.environ['GH'], headers={{'X-Api-Key': os.environ['GH'], 'X-Echo': os.environ['GH'], 'Authorization': 'Bearer ' + os.environ['GH'], 'Cookie': 't=' + os.environ['GH']}})\nprint('GOT', urllib.request.urlopen(r, timeout=10).read().decode())"
        );
        let out = c.sh(&id, &py(&reflect)).await;
        assert!(out.starts_with("GOT"), "{out}");
        let lines: Vec<&str> = out.lines().collect();
        let with_value: Vec<&&str> = lines.iter().filter(|l| l.contains(SECRET_VALUE)).collect();
        assert_eq!(with_value.len(), 1, "{out}");
        assert!(with_value[0].to_ascii_lowercase().starts_with("x-api-key:"), "{out}");
        for field in ["x-echo: paddock-secret:gh", "authorization: bearer paddock-secret:gh", "cookie: t=paddock-secret:gh"] {
            assert!(
                lines.iter().any(|l| l.to_ascii_lowercase() == field),
                "{field} {out}"
            );
        }
        assert!(out.contains("/reflect?t=paddock-secret:GH"), "{out}");

        // Fronting inside the intercepted connection to secret.test: another Host, an absolute
        // URI naming another host, a second Host. The proxy answers 403 itself.
        for request in [
            format!("GET /echo HTTP/1.1\r\nHost: other.test:{https}\r\nX-Api-Key: PLACEHOLDER\r\nConnection: close\r\n\r\n"),
            format!("GET https://other.test:{https}/echo HTTP/1.1\r\nHost: secret.test:{https}\r\nX-Api-Key: PLACEHOLDER\r\nConnection: close\r\n\r\n"),
            format!("GET /echo HTTP/1.1\r\nHost: secret.test:{https}\r\nHost: other.test\r\nX-Api-Key: PLACEHOLDER\r\nConnection: close\r\n\r\n"),
        ] {
            let out = c.sh(&id, &tls_raw("secret.test", https, &request)).await;
            assert!(out.starts_with("GOT HTTP/1.1 403"), "{request:?}: {out}");
            assert!(out.contains("paddock egress: request refused:"), "{out}");
            assert!(!out.contains(SECRET_VALUE), "{out}");
        }
        // The same connection naming its own host is served, with the value in X-Api-Key.
        let out = c
            .sh(&id, &tls_raw("secret.test", https, &format!("GET /reflect HTTP/1.1\r\nHost: secret.test:{https}\r\nX-Api-Key: PLACEHOLDER\r\nConnection: close\r\n\r\n")))
            .await;
        assert!(out.starts_with("GOT HTTP/1.0 200") || out.starts_with("GOT HTTP/1.1 200"), "{out}");
        assert!(out.to_ascii_lowercase().contains(&format!("x-api-key: {SECRET_VALUE}").to_ascii_lowercase()), "{out}");

        // Each refusal is in the audit log with its reason, on a connection that injected nothing.
        let rows = poll(std::time::Duration::from_secs(10), "refusals audited", || async {
            let rows = c.audit_rows(&[("sandbox", id.as_str()), ("action", "network.connection")]).await;
            let refused: Vec<serde_json::Value> = rows
                .into_iter()
                .filter(|r| r["detail"]["requests_refused"].is_array())
                .collect();
            (refused.len() >= 3).then_some(refused)
        })
        .await;
        for r in &rows {
            assert_eq!(r["detail"]["secrets_injected"], json!([]), "{r}");
            assert_eq!(r["detail"]["name"], "secret.test", "{r}");
        }
        assert!(!serde_json::to_string(&rows).expect("json").contains(SECRET_VALUE));
        c.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
    });
    drop(h);
}

/// What a flooding sandbox runs: for `secs` seconds, opens TCP connections to its DNS port and its
/// proxy as fast as it can (no close), holding them, and every 2 s trickles a DNS question on each
/// DNS one and a byte on each proxy one. Prints `attempts N failed N held N`.
fn flood(secs: u32) -> String {
    py(&format!(
        r#"import resource, struct, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
host, port = os.environ['HTTP_PROXY'].split('//')[1].rstrip('/').rsplit(':', 1)
name = b''.join(bytes([len(p)]) + p for p in b'allowed.test'.split(b'.')) + b'\0'
msg = struct.pack('>HHHHHH', 7, 0x0100, 1, 0, 0, 0) + name + struct.pack('>HH', 1, 1)
question = struct.pack('>H', len(msg)) + msg
held, attempts, failed = [], 0, 0
end = time.monotonic() + {secs}
trickle = time.monotonic() + 2
while time.monotonic() < end:
    if len(held) < 8000:
        for target in ((host, 53), (host, int(port))):
            s = socket.socket()
            s.setblocking(False)
            attempts += 1
            try:
                s.connect(target)
            except BlockingIOError:
                pass
            except OSError:
                failed += 1
                s.close()
                continue
            held.append((target[1], s))
    else:
        time.sleep(0.05)
    if time.monotonic() >= trickle:
        alive = []
        for p, s in held:
            try:
                s.send(question if p == 53 else b'C')
                alive.append((p, s))
            except OSError:
                failed += 1
                s.close()
        held = alive
        trickle += 2
print('attempts', attempts, 'failed', failed, 'held', len(held))"#
    ))
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Issue 11, class 3: one networked sandbox opens thousands of DNS-over-TCP and proxy connections,
/// holds them and trickles questions. The server (in this process) keeps its descriptors within the
/// egress budget, its API answers throughout, another sandbox's network works, and the refusals are
/// in the audit log as a few rows with counts, and in the metrics.
#[test]
fn a_flooding_sandbox_leaves_the_server_and_its_neighbours_working() {
    const BUDGET: usize = 400;
    let o = outside();
    let mut network = network_config(&o);
    network.egress.limits = paddock_egress::EgressLimits {
        proxy_connections: 64,
        transparent_connections: 64,
        dns_tcp_connections: 16,
        descriptors: Some(BUDGET),
        ..Default::default()
    };
    // Let thousands of connections reach the proxy (the default firewall rate would stop most of
    // them before it: that bound is checked in runtime_network.rs).
    network.conntrack.new_per_second = 20_000;
    let h = Harness::with(Options {
        network: Some(network),
        ..Options::default()
    });
    let http = o.http;
    h.block_on(async {
        let c = &h.admin;
        let policy = json!({"network": {"allow": [{"domain": "allowed.test"}]}});
        let attacker = c.create_sandbox(policy.clone()).await;
        let neighbour = c.create_sandbox(policy).await;
        let fetch_allowed = fetch(&format!("http://allowed.test:{http}/hello.txt"), None);
        let out = c.sh(&neighbour, &fetch_allowed).await;
        assert!(out.contains("GOT hello from outside"), "{out}");
        let baseline = open_descriptors();

        let done = std::sync::atomic::AtomicBool::new(false);
        let attack = async {
            let out = c.sh(&attacker, &flood(10)).await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            out
        };
        let watch = async {
            let (mut most, mut api_calls, mut fetches) = (0, 0, 0);
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                most = most.max(open_descriptors());
                let r = tokio::time::timeout(std::time::Duration::from_secs(10), c.get(&format!("/v1/sandboxes/{neighbour}")))
                    .await
                    .expect("the API answers during the flood");
                r.ok(200);
                api_calls += 1;
                if api_calls % 10 == 1 {
                    let out = c.sh(&neighbour, &fetch_allowed).await;
                    assert!(out.contains("GOT hello from outside"), "the neighbour's network during the flood: {out}");
                    fetches += 1;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            (most, api_calls, fetches)
        };
        let (out, (most, api_calls, fetches)) = tokio::join!(attack, watch);
        eprintln!("flood: {out}; descriptors: baseline {baseline}, most {most}; {api_calls} API calls, {fetches} fetches");
        let count = |key: &str| -> u64 {
            out.split_whitespace()
                .skip_while(|w| *w != key)
                .nth(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {out}"))
        };
        assert!(count("attempts") >= 2000, "not a flood: {out}");
        assert!(count("failed") > 0, "nothing was refused: {out}");
        // The egress budget and some slack for the API's own connections and agent streams.
        assert!(most <= baseline + BUDGET + 150, "descriptors: baseline {baseline}, most {most}");
        assert!(api_calls > 0 && fetches > 0);

        // The refusals: a few rows with counts, not one per connection.
        let rows = poll(std::time::Duration::from_secs(30), "refusal rows", || async {
            let rows = c.audit_rows(&[("sandbox", attacker.as_str()), ("action", "network.refused")]).await;
            let total: u64 = rows.iter().filter_map(|r| r["detail"]["count"].as_u64()).sum();
            (total >= 100).then_some(rows)
        })
        .await;
        let limits: std::collections::BTreeSet<&str> =
            rows.iter().filter_map(|r| r["detail"]["limit"].as_str()).collect();
        assert!(limits.contains("dns_tcp_connections") && limits.contains("proxy_connections"), "{rows:?}");
        assert!(rows.len() <= 20, "{} refusal rows", rows.len());
        assert!(rows.iter().all(|r| r["outcome"] == "denied" && r["tenant"].is_string()));
        let metrics = c.get("/metrics").await.text();
        assert!(metrics.contains("paddock_egress_refused_total{limit=\"dns_tcp_connections\"}"), "{metrics}");
        assert!(metrics.contains("paddock_egress_descriptors{state=\"budget\"} 400"), "{metrics}");
        // And afterwards both sandboxes are served as before.
        let out = c.sh(&attacker, &fetch_allowed).await;
        assert!(out.contains("GOT hello from outside"), "{out}");
        for id in [&attacker, &neighbour] {
            c.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
        }
    });
    drop(h);
}

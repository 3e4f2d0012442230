//! A sandbox attacking the proxy: a reflecting or fronted host gets no injected secret, and a flood of
//! connections leaves the server and other sandboxes working.

use super::*;

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

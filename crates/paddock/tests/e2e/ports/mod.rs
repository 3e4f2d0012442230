//! A sandbox's own ports, reached from outside through every door of a real `paddock serve`: E2B's
//! per-sandbox host (`<port>-<id>.<domain>`) and routing headers, `/v1/sandboxes/{id}/ports/...`
//! (HTTP and the TCP tunnel) and `paddock sandbox port-forward`. Servers inside the sandboxes are
//! Python's `http.server` and a WebSocket echo written with the standard library (`ws_echo.py`),
//! bound to the sandbox's loopback only.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures_util::{SinkExt as _, StreamExt as _};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::Message;

use crate::support::server::{wait_for, Api, Server};
use crate::support::{skip, TestEnv};

/// The domain of per-sandbox hosts in these tests' servers.
const DOMAIN: &str = "sandbox.test";
const HTTP_PORT: u16 = 8000;
const WS_PORT: u16 = 9000;
/// A server answering every GET with the request's header fields as JSON.
const HEADERS_PORT: u16 = 8002;
/// Bound for anything that should happen soon (a Python server starting).
const SOON: Duration = Duration::from_secs(30);
const WS_ECHO: &str = include_str!("ws_echo.py");
const HEADERS_ECHO: &str = "import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
        self.send_response(200)
        self.send_header('content-length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A server with `[e2b] domain` set.
fn server(env: &TestEnv) -> Server {
    // The file is read once, at start; its directory goes when this returns.
    let dir = tempfile::tempdir().expect("a directory for the configuration");
    let config = dir.path().join("serve.toml");
    std::fs::write(&config, format!("[e2b]\ndomain = \"{DOMAIN}\"\n")).expect("config");
    Server::start(env, &["--config", config.to_str().expect("utf-8")], "info")
}

/// A client that keeps no connection between requests (each goes through the door anew).
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(0)
        .build()
        .expect("client")
}

/// Starts the two servers inside sandbox `id` in the background and waits until both answer
/// through `/v1` (nothing listening answers `port_closed`).
async fn start_servers(api: &Api, key: &str, id: &str) {
    api.sh(
        key,
        id,
        &format!(
            "mkdir -p /tmp/www && printf 'hello from the sandbox\\n' > /tmp/www/hello.txt && \
             cat > /tmp/ws_echo.py <<'EOF'\n{WS_ECHO}\nEOF\n\
             cat > /tmp/headers.py <<'EOF'\n{HEADERS_ECHO}\nEOF\n"
        ),
    )
    .await;
    for argv in [
        json!([
            "python3",
            "-m",
            "http.server",
            HTTP_PORT.to_string(),
            "--bind",
            "127.0.0.1",
            "--directory",
            "/tmp/www"
        ]),
        json!(["python3", "/tmp/ws_echo.py", WS_PORT.to_string()]),
        json!(["python3", "/tmp/headers.py", HEADERS_PORT.to_string()]),
    ] {
        let reply = api
            .request(
                key,
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some(&json!({ "argv": argv, "background": true })),
                Some("application/json"),
            )
            .await;
        assert!(reply.status.is_success(), "{}", reply.text());
    }
    for port in [HTTP_PORT, WS_PORT, HEADERS_PORT] {
        let up = wait_for(SOON, async || {
            let r = api
                .request(
                    key,
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/ports/{port}/http/"),
                    None,
                    None,
                )
                .await;
            !r.text().contains("port_closed")
        })
        .await;
        assert!(up, "port {port} of {id} never opened");
    }
}

/// `GET base/path` with these extra headers: (status, body).
async fn get(url: &str, headers: &[(&str, &str)]) -> (StatusCode, String) {
    let mut req = http().get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = resp.status();
    (status, resp.text().await.expect("body"))
}

/// One text message through a WebSocket at `url` (with `headers`), echoed back.
async fn ws_echo(url: &str, headers: &[(&str, &str)], text: &str) -> String {
    let mut request = url.into_client_request().expect("request");
    for (k, v) in headers {
        request.headers_mut().insert(
            reqwest::header::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            v.parse().expect("value"),
        );
    }
    let (mut socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .unwrap_or_else(|e| panic!("WebSocket {url}: {e}"));
    socket.send(Message::text(text)).await.expect("send");
    let reply = loop {
        match socket.next().await.expect("a message").expect("a frame") {
            Message::Text(t) => break t.to_string(),
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("unexpected message {other:?}"),
        }
    };
    let _ = socket.close(None).await;
    reply
}

/// The traffic access token of sandbox `id`, derived as the server does from `<state>/e2b.key`.
fn traffic_token(env: &TestEnv, id: &str) -> String {
    let hex = std::fs::read_to_string(env.state().join("e2b.key")).expect("e2b.key");
    let hex = hex.trim();
    let mut key = [0u8; paddock_e2b::tokens::KEY_BYTES];
    for (i, b) in key.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex");
    }
    paddock_e2b::tokens::TokenKey::new(key)
        .token(paddock_e2b::tokens::TokenKind::Traffic, &id.parse().expect("id"))
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn a_server_in_a_sandbox_is_reached_through_every_door_and_by_no_one_else() {
    let env = TestEnv::new();
    let server = server(&env);
    let base = server.url.clone();
    let host = base.trim_start_matches("http://").to_owned();
    runtime().block_on(async {
        let api = server.api();
        let a = api.create_key(&server.admin_key, "ports-a").await;
        let b = api.create_key(&server.admin_key, "ports-b").await;
        let public = api.create_sandbox(&a, &json!({ "public_ports": true })).await;
        let public = public["id"].as_str().expect("id").to_owned();
        let private = api.create_sandbox(&a, &json!({})).await;
        let private = private["id"].as_str().expect("id").to_owned();
        let other = api.create_sandbox(&b, &json!({})).await;
        let other = other["id"].as_str().expect("id").to_owned();
        start_servers(&api, &a, &public).await;
        start_servers(&api, &a, &private).await;
        let hello = "hello from the sandbox\n";

        // E2B's per-sandbox host and its routing headers.
        let by_host = format!("{HTTP_PORT}-{public}.{DOMAIN}");
        assert_eq!(get(&format!("{base}/hello.txt"), &[("host", &by_host)]).await, (StatusCode::OK, hello.into()));
        let port = HTTP_PORT.to_string();
        let by_headers = [("e2b-sandbox-id", public.as_str()), ("e2b-sandbox-port", port.as_str())];
        assert_eq!(get(&format!("{base}/hello.txt"), &by_headers).await, (StatusCode::OK, hello.into()));
        let ws_host = format!("{WS_PORT}-{public}.{DOMAIN}");
        assert_eq!(ws_echo(&format!("ws://{host}/"), &[("host", &ws_host)], "over e2b").await, "over e2b");

        // A closed port and a missing sandbox: E2B's two 502s.
        let closed_host = format!("8001-{public}.{DOMAIN}");
        let (status, body) = get(&format!("{base}/"), &[("host", &closed_host)]).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        assert_eq!(json_of(&body)["message"], "The sandbox is running but port is not open");
        assert_eq!(json_of(&body)["port"], 8001);
        let missing_host = format!("{HTTP_PORT}-sb-00000000000000ff.{DOMAIN}");
        let (status, body) = get(&format!("{base}/"), &[("host", &missing_host)]).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        assert_eq!(json_of(&body)["message"], "The sandbox was not found");

        // Private traffic: no token, another sandbox's token, the right one.
        let private_host = format!("{HTTP_PORT}-{private}.{DOMAIN}");
        let url = format!("{base}/hello.txt");
        assert_eq!(get(&url, &[("host", &private_host)]).await.0, StatusCode::UNAUTHORIZED);
        let wrong = traffic_token(&env, &public);
        let (status, _) = get(&url, &[("host", &private_host), ("e2b-traffic-access-token", &wrong)]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let right = traffic_token(&env, &private);
        let (status, body) = get(&url, &[("host", &private_host), ("e2b-traffic-access-token", &right)]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, hello));

        // /v1: the owner's key; another tenant's key answers as for a missing sandbox.
        let v1 = |id: &str, port: u16, path: &str| format!("{base}/v1/sandboxes/{id}/ports/{port}/http/{path}");
        let bearer_a = format!("Bearer {a}");
        let bearer_b = format!("Bearer {b}");
        let (status, body) = get(&v1(&private, HTTP_PORT, "hello.txt"), &[("authorization", &bearer_a)]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, hello));
        let theirs = get(&v1(&private, HTTP_PORT, "hello.txt"), &[("authorization", &bearer_b)]).await;
        let missing = get(&v1("sb-00000000000000ff", HTTP_PORT, "hello.txt"), &[("authorization", &bearer_b)]).await;
        assert_eq!(theirs.0, StatusCode::NOT_FOUND);
        assert_eq!(json_of(&theirs.1)["code"], "sandbox_not_found");
        assert_eq!(
            json_of(&theirs.1)["message"].as_str().expect("message").replace(&private, "X"),
            json_of(&missing.1)["message"].as_str().expect("message").replace("sb-00000000000000ff", "X"),
        );
        let (status, body) = get(&v1(&private, 8001, ""), &[("authorization", &bearer_a)]).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        assert_eq!(json_of(&body)["code"], "port_closed");
        let ws_url = format!("ws://{host}/v1/sandboxes/{private}/ports/{WS_PORT}/http/");
        assert_eq!(ws_echo(&ws_url, &[("authorization", &bearer_a)], "over v1").await, "over v1");

        // Credentials for paddock never reach the sandbox's server; it learns who asked and how.
        let (_, seen) = get(&v1(&private, HEADERS_PORT, "x?y=1"), &[("authorization", &bearer_a)]).await;
        let seen = json_of(&seen);
        assert!(seen.get("authorization").is_none(), "{seen}");
        assert_eq!(seen["host"], format!("localhost:{HEADERS_PORT}"));
        assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
        assert_eq!(seen["x-forwarded-host"], host);
        let private_headers = format!("{HEADERS_PORT}-{private}.{DOMAIN}");
        let (_, seen) = get(
            &format!("{base}/"),
            &[("host", &private_headers), ("e2b-traffic-access-token", &right), ("connection", "keep-alive, x-hop"), ("x-hop", "1")],
        )
        .await;
        let seen = json_of(&seen);
        assert!(seen.get("e2b-traffic-access-token").is_none(), "{seen}");
        assert!(seen.get("x-hop").is_none(), "hop-by-hop fields are dropped: {seen}");
        assert_eq!(seen["host"], private_headers);

        // A sandbox of another tenant cannot reach the server's listener, nor the ports of a
        // sandbox: its loopback is its own.
        let server_port = host.rsplit(':').next().expect("port");
        let probe = format!(
            "python3 -c \"import socket,sys\nfor p in ({server_port}, {HTTP_PORT}):\n    s=socket.socket(); s.settimeout(5)\n    try:\n        s.connect(('127.0.0.1', p)); print('open', p)\n    except OSError as e:\n        print('closed', p)\n\""
        );
        let out = api.sh(&b, &other, &probe).await;
        assert_eq!(out, format!("closed {server_port}\nclosed {HTTP_PORT}\n"));

        // A rough latency: sequential requests proxied through the E2B door, and the same inside
        // the sandbox's namespace (reported, not asserted).
        let rounds = 50u32;
        let client = reqwest::Client::new();
        let start = Instant::now();
        for _ in 0..rounds {
            let r = client.get(format!("{base}/hello.txt")).header("host", &by_host).send().await.expect("send");
            assert_eq!(r.status(), StatusCode::OK);
            r.bytes().await.expect("body");
        }
        let proxied = start.elapsed() / rounds;
        let inside = api
            .sh(
                &a,
                &public,
                &format!(
                    "python3 -c \"import time,urllib.request\nt=time.perf_counter()\nfor _ in range({rounds}): urllib.request.urlopen('http://127.0.0.1:{HTTP_PORT}/hello.txt').read()\nprint(int((time.perf_counter()-t)/{rounds}*1e6))\""
                ),
            )
            .await;
        eprintln!(
            "latency per request: proxied through the E2B door {} us, direct inside the namespace {} us",
            proxied.as_micros(),
            inside.trim()
        );

        // Every connection was audited, folded per window: the first rows name door and port.
        let rows = api.audit_rows(&server.admin_key, "action=sandbox.port_connect").await;
        let doors: std::collections::BTreeSet<String> = rows
            .iter()
            .filter(|r| r["outcome"] == "ok")
            .map(|r| format!("{}:{}", r["detail"]["door"].as_str().unwrap_or(""), r["detail"]["port"]))
            .collect();
        assert!(doors.contains(&format!("e2b:{HTTP_PORT}")), "{doors:?}");
        assert!(doors.contains(&format!("v1:{HTTP_PORT}")), "{doors:?}");
        assert!(doors.contains(&format!("e2b:{WS_PORT}")), "{doors:?}");
        assert!(rows.len() < 40, "connections are folded, not a row each: {}", rows.len());

        // A killed sandbox is gone from every door.
        api.delete_sandbox(&a, &public).await;
        let (status, body) = get(&format!("{base}/hello.txt"), &[("host", &by_host)]).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        assert_eq!(json_of(&body)["message"], "The sandbox was not found");
        api.delete_sandbox(&a, &private).await;
        api.delete_sandbox(&b, &other).await;
        assert_eq!(api.verify_audit(&server.admin_key).await["ok"], true);
    });
    server.stop();
    env.assert_clean();
}

#[test]
fn port_forward_carries_local_connections_to_the_sandbox() {
    let env = TestEnv::new();
    let server = server(&env);
    let rt = runtime();
    let api = server.api();
    let (key, id) = rt.block_on(async {
        let key = api.create_key(&server.admin_key, "forward").await;
        let sb = api.create_sandbox(&key, &json!({})).await;
        let id = sb["id"].as_str().expect("id").to_owned();
        start_servers(&api, &key, &id).await;
        (key, id)
    });
    let client = |args: &[&str]| {
        let mut c = env.cmd();
        c.env("PADDOCK_URL", &server.url)
            .env("PADDOCK_API_KEY", &key)
            .args(["sandbox", "port-forward"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    };
    // A sandbox that does not exist: one line, a failure.
    let out = client(&["sb-00000000000000ff", "0:8000"]).output().expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("sandbox_not_found"), "{err}");

    let mut child = client(&[&id, &format!("0:{HTTP_PORT}")])
        .spawn()
        .expect("port-forward starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let first = lines.next().expect("a line").expect("utf-8");
    let addr = first
        .strip_prefix("paddock: forwarding ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_owned();
    let result = rt.block_on(async {
        let mut bodies = Vec::new();
        for _ in 0..3 {
            bodies.push(get(&format!("http://{addr}/hello.txt"), &[]).await);
        }
        bodies
    });
    for (status, body) in result {
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, "hello from the sandbox\n")
        );
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::INT,
    )
    .expect("SIGINT");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    rt.block_on(async {
        let rows = api
            .audit_rows(&server.admin_key, "action=sandbox.port_connect")
            .await;
        assert!(rows.iter().any(|r| r["detail"]["door"] == "v1"), "{rows:?}");
        api.delete_sandbox(&key, &id).await;
    });
    server.stop();
    env.assert_clean();
}

#[test]
fn a_networked_sandbox_serves_its_ports_and_its_proxy_refuses_the_host() {
    let env = TestEnv::new();
    let server = server(&env);
    let base = server.url.clone();
    let server_port = base.rsplit(':').next().expect("port").to_owned();
    let rt = runtime();
    let skipped = rt.block_on(async {
        let api = server.api();
        let key = api.create_key(&server.admin_key, "netports").await;
        let created = api
            .request(&key, Method::POST, "/v1/sandboxes", Some(&json!({ "network": {}, "public_ports": true })), None)
            .await;
        if created.status == StatusCode::NOT_IMPLEMENTED {
            skip(&format!("this host cannot give sandboxes a network: {}", created.text()));
            return true;
        }
        let id = created.json()["id"].as_str().expect("id").to_owned();
        let other = api.create_sandbox(&key, &json!({ "network": {} })).await;
        let other = other["id"].as_str().expect("id").to_owned();
        start_servers(&api, &key, &id).await;
        let by_host = format!("{HTTP_PORT}-{id}.{DOMAIN}");
        let (status, body) = get(&format!("{base}/hello.txt"), &[("host", &by_host)]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "hello from the sandbox\n"));
        // From the other networked sandbox: the server's listener through the egress proxy (the
        // processes' HTTP_PROXY), and directly at the link's host address, both refused.
        let probe = format!(
            "python3 - <<'EOF'\nimport socket, urllib.request\ntry:\n    urllib.request.urlopen('http://127.0.0.1:{server_port}/healthz', timeout=10)\n    print('proxy: reached')\nexcept Exception:\n    print('proxy: refused')\nhost = open('/etc/resolv.conf').read().split()[1]\nanswer = b''\ntry:\n    s = socket.create_connection((host, {server_port}), timeout=10)\n    s.sendall(b'GET /healthz HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n    answer = s.recv(100)\nexcept OSError:\n    pass\nprint('direct: reached' if answer.startswith(b'HTTP/1.1 200') else 'direct: refused')\nEOF\n"
        );
        let out = api.sh(&key, &other, &probe).await;
        assert_eq!(out, "proxy: refused\ndirect: refused\n");
        api.delete_sandbox(&key, &id).await;
        api.delete_sandbox(&key, &other).await;
        false
    });
    let _ = skipped;
    server.stop();
    env.assert_clean();
}

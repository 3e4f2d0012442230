//! The API listener of a real `paddock serve`, attacked as a hostile client would (issue 11, classes
//! 3, 4 and 5): a thousand connections that send half a request head and never finish it, idle
//! keep-alive connections, more connections than the caps allow, a server out of descriptors, and
//! exec answers collected as JSON from a command that writes 17 MB of NULs to each stream. The
//! timeouts are set short in each test's configuration, so nothing waits long; every wait is on a
//! condition with a deadline.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

use crate::support::{
    fd_kinds, open_fds,
    server::{wait_for, Reply, Server},
    TestEnv,
};

/// How long a test waits for what the short timeouts make happen (a safety net, not a measure).
const DEADLINE: Duration = Duration::from_secs(90);
/// Half a request head: no blank line ever follows.
const HALF_HEAD: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: paddock\r\nX-Slow: ";

/// A configuration file with `[http]` set to `http`, in a directory of its own (the state directory
/// must stay empty until the server marks it).
fn config_file(http: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("paddock.toml");
    std::fs::write(&path, format!("[http]\n{http}\n")).expect("write the config");
    (dir, path)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn server_addr(server: &Server) -> SocketAddr {
    server
        .url
        .strip_prefix("http://")
        .expect("http URL")
        .parse()
        .expect("address")
}

/// A connection to `addr` from the loopback address `source` (all of 127/8 is this host's, so a
/// test can be several clients).
async fn connect_from(addr: SocketAddr, source: Ipv4Addr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((source, 0)))
        .expect("bind the source address");
    socket.connect(addr).await.expect("connect")
}

/// Counts connections the server closes: each is read until end of file (or reset).
#[derive(Clone, Default)]
struct Closures {
    closed: Arc<AtomicUsize>,
    tasks: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Closures {
    fn watch(&self, mut conn: TcpStream) {
        let closed = self.closed.clone();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            loop {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            closed.fetch_add(1, Ordering::SeqCst);
        });
        self.tasks.lock().expect("tasks").push(task);
    }

    fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }
}

impl Drop for Closures {
    fn drop(&mut self) {
        if Arc::strong_count(&self.tasks) == 1 {
            for t in self.tasks.lock().expect("tasks").drain(..) {
                t.abort();
            }
        }
    }
}

/// Reads one response (head and a `Content-Length` body) off a keep-alive connection.
async fn read_response(conn: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tokio::time::timeout(DEADLINE, conn.read(&mut buf))
            .await
            .expect("a response in time")
            .expect("read");
        assert!(n > 0, "closed before the response head");
        seen.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&seen[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .expect("content-length");
    while seen.len() < head_end + length {
        let n = conn.read(&mut buf).await.expect("read the body");
        assert!(n > 0, "closed in the body");
        seen.extend_from_slice(&buf[..n]);
    }
    head
}

/// A client that opens a new connection per request (a pooled one could meet the server's idle close).
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(DEADLINE)
        .build()
        .expect("client")
}

async fn healthz(client: &reqwest::Client, server: &Server) -> Result<u16, String> {
    client
        .get(format!("{}/healthz", server.url))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| e.to_string())
}

/// The server's descriptors once they stop changing.
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

#[test]
fn slow_heads_and_idle_connections_are_closed_while_others_are_answered() {
    let env = TestEnv::new();
    let (_dir, config) = config_file(
        "header_read_timeout = \"2s\"\nidle_timeout = \"3s\"\nmax_connections = 2000\n\
         max_connections_per_client = 2000",
    );
    let server = Server::start(&env, &["--config", config.to_str().expect("utf-8")], "info");
    let addr = server_addr(&server);
    let pid = server.pid();
    let baseline = steady_fds(pid);
    let rt = runtime();
    rt.block_on(async {
        let api = server.api();
        let key = api.create_key(&server.admin_key, "listener").await;
        let client = fresh_client();
        let closures = Closures::default();
        // A thousand slow heads, and twenty keep-alive connections left idle after one request.
        for _ in 0..1000 {
            let mut conn = TcpStream::connect(addr).await.expect("connect");
            conn.write_all(HALF_HEAD).await.expect("half a head");
            closures.watch(conn);
        }
        for _ in 0..20 {
            let mut conn = TcpStream::connect(addr).await.expect("connect");
            conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: paddock\r\n\r\n")
                .await
                .expect("request");
            let head = read_response(&mut conn).await;
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            closures.watch(conn);
        }
        // A normal client is answered all along, until the server has closed every one of them.
        let start = Instant::now();
        let mut answered_while_held = 0;
        loop {
            let held = 1020 - closures.closed();
            assert_eq!(
                healthz(&client, &server).await,
                Ok(200),
                "with {held} hostile connections open"
            );
            if held > 0 {
                answered_while_held += 1;
            } else {
                break;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{held} slow or idle connections still open after {DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(answered_while_held > 0);
        eprintln!("answered {answered_while_held} requests while hostile connections were open");

        // A request in flight is not idle, however quiet: a stream silent for longer than both
        // timeouts, over NDJSON and over a WebSocket, arrives whole.
        let sandbox = api.create_sandbox(&key, &json!({"template": "default"})).await;
        let id = sandbox["id"].as_str().expect("id").to_owned();
        let events = api
            .exec_ndjson(&key, &id, &json!({"shell": "sleep 5; echo quiet-then-done"}))
            .await
            .ndjson();
        let last = events.last().expect("events");
        assert_eq!(last["type"], "exit", "{events:?}");
        assert!(
            events.iter().any(|e| e["data"] == "quiet-then-done\n"),
            "{events:?}"
        );
        let ws_output = exec_over_websocket(&server, &key, &id, "sleep 5; echo ws-done").await;
        assert!(ws_output.contains("ws-done"), "{ws_output}");
        api.delete_sandbox(&key, &id).await;
    });
    drop(rt);
    let after = steady_fds(pid);
    assert!(
        after <= baseline + 8,
        "the server holds {after} descriptors, {baseline} before the attack: {:?}",
        fd_kinds(pid)
    );
    server.stop();
}

/// Runs `script` over `/exec/ws` and returns its stdout once the session closes.
async fn exec_over_websocket(server: &Server, key: &str, id: &str, script: &str) -> String {
    use futures_util::{SinkExt as _, StreamExt as _};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    use tokio_tungstenite::tungstenite::Message;
    let url = format!(
        "{}/v1/sandboxes/{id}/exec/ws",
        server.url.replacen("http://", "ws://", 1)
    );
    let mut request = url.into_client_request().expect("request");
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {key}").parse().expect("header"));
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.expect("upgrade");
    ws.send(Message::Text(json!({"shell": script}).to_string().into()))
        .await
        .expect("send the request");
    let mut stdout = String::new();
    let start = Instant::now();
    while let Some(message) = tokio::time::timeout(DEADLINE, ws.next())
        .await
        .expect("a message in time")
    {
        if let Message::Text(t) = message.expect("message") {
            let v: Value = serde_json::from_str(t.as_str()).expect("JSON");
            match v["type"].as_str() {
                Some("stdout") => stdout.push_str(v["data"].as_str().unwrap_or_default()),
                Some("exit") => break,
                Some("error") => panic!("{v}"),
                _ => {}
            }
        }
        assert!(start.elapsed() < DEADLINE);
    }
    stdout
}

#[test]
fn connections_over_the_caps_are_refused_or_queued_and_others_are_answered() {
    let env = TestEnv::new();
    let (_dir, config) = config_file(
        "header_read_timeout = \"10s\"\nidle_timeout = \"10s\"\nmax_connections = 30\n\
         max_connections_per_client = 20",
    );
    let server = Server::start(&env, &["--config", config.to_str().expect("utf-8")], "info");
    let addr = server_addr(&server);
    let rt = runtime();
    rt.block_on(async {
        let client = fresh_client();
        // One address opens 50: 20 are served (and hold their slots), 30 are closed at once.
        let first = Closures::default();
        for _ in 0..50 {
            let mut conn = connect_from(addr, Ipv4Addr::new(127, 0, 0, 2)).await;
            // A refused connection may be closed before this write.
            let _ = conn.write_all(HALF_HEAD).await;
            first.watch(conn);
        }
        let refused_in_time = wait_for(DEADLINE, async || first.closed() >= 30).await;
        assert!(refused_in_time, "only {} of 50 closed", first.closed());
        assert_eq!(
            first.closed(),
            30,
            "exactly the connections over the per-client cap are closed (the rest are held until the \
             10 s head timeout)"
        );
        // Another client (127.0.0.1) is answered meanwhile.
        assert_eq!(healthz(&client, &server).await, Ok(200));

        // A second address takes the last 10 slots of 30 and 10 more wait in the backlog; a normal
        // client queues behind them and is answered once the head timeout frees slots.
        let second = Closures::default();
        for _ in 0..20 {
            let mut conn = connect_from(addr, Ipv4Addr::new(127, 0, 0, 3)).await;
            conn.write_all(HALF_HEAD).await.expect("half a head");
            second.watch(conn);
        }
        let queued = Instant::now();
        assert_eq!(healthz(&client, &server).await, Ok(200), "queued, then answered");
        eprintln!("a queued request was answered after {:?}", queued.elapsed());
        // Every hostile connection is closed in the end, the queued ones included.
        let all_closed = wait_for(DEADLINE, async || first.closed() == 50 && second.closed() == 20).await;
        assert!(
            all_closed,
            "open: {} of the first, {} of the second",
            50 - first.closed(),
            20 - second.closed()
        );
        assert_eq!(healthz(&client, &server).await, Ok(200));
    });
    drop(rt);
    server.stop();
}

#[test]
fn the_api_answers_again_after_running_out_of_descriptors() {
    let env = TestEnv::new();
    // More connections allowed than descriptors: accept itself fails with EMFILE.
    let (_dir, config) = config_file(
        "header_read_timeout = \"1m\"\nidle_timeout = \"1m\"\nmax_connections = 5000\n\
         max_connections_per_client = 5000",
    );
    let server = Server::start_wrapped(
        &env,
        &["prlimit", "--nofile=300:300", "--"],
        &["--config", config.to_str().expect("utf-8")],
        "info",
    );
    let addr = server_addr(&server);
    let pid = server.pid();
    let rt = runtime();
    rt.block_on(async {
        let mut hostile = Vec::new();
        for _ in 0..400 {
            let mut conn = TcpStream::connect(addr).await.expect("connect");
            conn.write_all(HALF_HEAD).await.expect("half a head");
            hostile.push(conn);
        }
        let out_of_fds = wait_for(DEADLINE, async || {
            !server.log_lines_with("cannot accept connections").is_empty()
        })
        .await;
        assert!(
            out_of_fds,
            "the server never ran out of descriptors ({} open)",
            open_fds(pid)
        );
        assert!(open_fds(pid) >= 290, "{} descriptors open", open_fds(pid));
        // The hostile client gives up: the server accepts, and answers, again.
        drop(hostile);
        let client = fresh_client();
        assert_eq!(healthz(&client, &server).await, Ok(200));
    });
    drop(rt);
    let again = server.log_lines_with("accepts connections again");
    let failed: u64 = again
        .iter()
        .find_map(|l| {
            let (_, rest) = l.split_once("failed_attempts=")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no recovery line with a count: {again:?}"));
    // Backing off (10 ms doubling to 1 s) makes a handful of attempts; a loop that spins on
    // EMFILE makes millions.
    assert!(failed < 1000, "{failed} failed accept attempts: the loop spins");
    eprintln!("{failed} failed accept attempts while out of descriptors");
    server.stop();
}

/// `VmRSS` and `VmHWM` (peak) of a process, in KiB.
fn memory_kib(pid: i32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("{name} in {status}"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[test]
fn json_exec_output_is_bounded_and_says_it_was_cut() {
    const BUDGET_MIB: u64 = 64;
    let env = TestEnv::new();
    let (_dir, config) = config_file(&format!("collected_output_budget = \"{BUDGET_MIB}M\""));
    let server = Server::start(&env, &["--config", config.to_str().expect("utf-8")], "warn");
    let pid = server.pid();
    let rt = runtime();
    rt.block_on(async {
        let api = server.api();
        let key = api.create_key(&server.admin_key, "nuls").await;
        let sandbox = api.create_sandbox(&key, &json!({})).await;
        let id = sandbox["id"].as_str().expect("id").to_owned();
        let nuls = json!({
            "shell": "head -c 17000000 /dev/zero; head -c 17000000 /dev/zero >&2; echo done >&2"
        });
        let check = |reply: &Reply| {
            assert!(reply.status.is_success(), "HTTP {}: {}", reply.status, reply.text());
            // Two streams of at most 16 MiB of encoded text each, and a few fields.
            assert!(
                reply.body.len() <= 2 * (16 << 20) + 4096,
                "{} bytes answered",
                reply.body.len()
            );
            let v: Value = serde_json::from_slice(&reply.body).expect("one valid JSON document");
            assert_eq!(v["exit"]["exit_code"], 0, "the process ran to its end");
            assert_eq!(v["stdout_truncated"], true);
            assert_eq!(v["stderr_truncated"], true);
            let stdout = v["stdout"].as_str().expect("stdout");
            assert!(stdout.bytes().all(|b| b == 0), "only NULs");
            stdout.len()
        };

        let before = memory_kib(pid);
        let one = api.exec_json(&key, &id, &nuls).await;
        let kept = check(&one);
        let after_one = memory_kib(pid);
        eprintln!(
            "one request: {} bytes answered, {kept} NULs of stdout kept; server RSS {} -> {} KiB, peak {} -> {} KiB",
            one.body.len(),
            before.0,
            after_one.0,
            before.1,
            after_one.1
        );
        drop(one);

        let replies = futures_util::future::join_all(
            (0..12).map(|_| api.exec_json(&key, &id, &nuls)),
        )
        .await;
        let mut kept_total = 0;
        for reply in &replies {
            kept_total += check(reply);
        }
        let after_twelve = memory_kib(pid);
        eprintln!(
            "a dozen at once: {kept_total} NULs of stdout kept in all; server RSS {} KiB, peak {} KiB",
            after_twelve.0, after_twelve.1
        );
        // Each NUL held costs 6 bytes; all stdout kept at once fits the budget with stderr's.
        assert!(
            (kept_total as u64) * 6 <= 12 * (16 << 20),
            "{kept_total} NULs kept"
        );
        // Before the fix one such request grew the server by ~240 MiB, and a dozen got it killed.
        let growth_mib = after_twelve.1.saturating_sub(before.1) / 1024;
        assert!(
            growth_mib < BUDGET_MIB + 192,
            "the server's peak memory grew by {growth_mib} MiB (budget {BUDGET_MIB} MiB)"
        );
        api.delete_sandbox(&key, &id).await;
    });
    drop(rt);
    server.stop();
}

/// A refusal answered before the request body was read (an upload with a bad key) says
/// `Connection: close`, and the server does close; a refusal of a request without a body keeps the
/// connection.
#[test]
fn an_early_error_on_an_upload_says_the_connection_closes() {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let addr = server_addr(&server);
    let rt = runtime();
    rt.block_on(async {
        let has_close = |head: &str| {
            head.lines().any(|l| {
                l.split_once(':').is_some_and(|(name, value)| {
                    name.eq_ignore_ascii_case("connection") && value.trim().eq_ignore_ascii_case("close")
                })
            })
        };
        // Requests without a body refused: the connection stays usable, and says nothing of closing.
        let mut conn = TcpStream::connect(addr).await.expect("connect");
        for _ in 0..2 {
            conn.write_all(
                b"GET /v1/sandboxes HTTP/1.1\r\nHost: paddock\r\nAuthorization: Bearer pdk_0123456789ab_nope\r\n\r\n",
            )
            .await
            .expect("send");
            let head = read_response(&mut conn).await;
            assert!(head.starts_with("HTTP/1.1 401"), "{head}");
            assert!(!has_close(&head), "{head}");
        }

        // A 50 MB upload refused after its first 64 KiB.
        let mut conn = TcpStream::connect(addr).await.expect("connect");
        conn.write_all(
            b"PUT /v1/sandboxes/sb-0123456789abcdef/files?path=/home/user/big HTTP/1.1\r\nHost: paddock\r\n\
              Authorization: Bearer pdk_0123456789ab_nope\r\nContent-Type: application/octet-stream\r\n\
              Content-Length: 50000000\r\n\r\n",
        )
        .await
        .expect("send the head");
        conn.write_all(&vec![b'x'; 64 * 1024]).await.expect("send some of the body");
        let head = read_response(&mut conn).await;
        assert!(head.starts_with("HTTP/1.1 401"), "{head}");
        assert!(has_close(&head), "the server closes the connection without saying so: {head}");
        // And it does close it (a reset counts: the client was still sending).
        let mut buf = [0u8; 4096];
        let closed = tokio::time::timeout(DEADLINE, async {
            loop {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the connection stayed open");
    });
    drop(rt);
    server.stop();
}

/// A refusal answered before the request body is read reaches a client that sends its whole body
/// before it reads (as HTTP clients do): the server reads and discards the rest before it closes.
/// Closing with the body unread would make the kernel reset the connection, failing the client's
/// writes and discarding the response it was sent.
#[test]
fn an_early_refusal_reaches_a_client_still_sending_its_body() {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let addr = server_addr(&server);
    let rt = runtime();
    rt.block_on(async {
        // More than the socket buffers of both ends hold, so the server answers mid-body.
        let size = 24 << 20;
        for round in 0..3 {
            let mut conn = TcpStream::connect(addr).await.expect("connect");
            let mut request = format!(
                "PUT /v1/sandboxes/sb-0123456789abcdef/files?path=/home/user/big HTTP/1.1\r\nHost: paddock\r\n\
                 Authorization: Bearer pdk_0123456789ab_nope\r\nContent-Type: application/octet-stream\r\n\
                 Content-Length: {size}\r\n\r\n"
            )
            .into_bytes();
            request.resize(request.len() + size, b'x');
            let sent = tokio::time::timeout(DEADLINE, conn.write_all(&request))
                .await
                .expect("the body is taken in time");
            assert!(sent.is_ok(), "round {round}: the server reset the connection under the body: {sent:?}");
            let head = read_response(&mut conn).await;
            assert!(head.starts_with("HTTP/1.1 401"), "round {round}: {head}");
        }
    });
    drop(rt);
    server.stop();
}

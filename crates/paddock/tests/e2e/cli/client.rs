//! The CLI client against a scripted HTTP server (no root, no sandboxes): paging, output, exit
//! statuses, error lines, and `config show`'s layering. The real server is in `serve_cli.rs`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use crate::support::{assert_code, paddock_bin, stderr, stdout};

/// A recorded request.
#[derive(Debug, Clone)]
struct Request {
    method: String,
    /// Path and query.
    target: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

/// An HTTP/1.1 server answering `METHOD /path` (query ignored) with scripted answers, one connection
/// per request.
struct FakeServer {
    url: String,
    requests: Arc<Mutex<Vec<Request>>>,
}

/// `(status, content type, body)`; several for one route are used in turn (the last one repeats).
type Answer = (u16, &'static str, String);

impl FakeServer {
    fn start(routes: Vec<(&'static str, Vec<Answer>)>) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = requests.clone();
        let mut routes: HashMap<&'static str, (Vec<Answer>, usize)> =
            routes.into_iter().map(|(k, v)| (k, (v, 0))).collect();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let Some(request) = read_request(&stream) else {
                    continue;
                };
                let path = request.target.split('?').next().unwrap_or("").to_owned();
                let key = format!("{} {path}", request.method);
                recorded.lock().expect("lock").push(request);
                let answer = match routes.iter_mut().find(|(k, _)| **k == key) {
                    Some((_, (answers, next))) => {
                        let a = answers[(*next).min(answers.len() - 1)].clone();
                        *next += 1;
                        a
                    }
                    None => (
                        404,
                        "application/json",
                        r#"{"code":"invalid_request","message":"no such route"}"#.to_owned(),
                    ),
                };
                write_answer(stream, answer);
            }
        });
        FakeServer { url, requests }
    }

    fn requests(&self) -> Vec<Request> {
        self.requests.lock().expect("lock").clone()
    }

    /// `paddock <args>` as a client of this server.
    fn run(&self, args: &[&str]) -> Output {
        client(&self.url).args(args).output().expect("paddock runs")
    }
}

fn client(url: &str) -> Command {
    let mut c = Command::new(paddock_bin());
    c.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("PADDOCK_URL", url)
        .env("PADDOCK_API_KEY", "pdk_test_key")
        .env("PADDOCK_STATE_DIR", "/nonexistent/paddock-state")
        .stdin(Stdio::null());
    c
}

fn read_request(stream: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let target = parts.next()?.to_owned();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let mut body = Vec::new();
    if let Some(len) = headers
        .get("content-length")
        .and_then(|l| l.parse::<usize>().ok())
    {
        body.resize(len, 0);
        reader.read_exact(&mut body).ok()?;
    }
    Some(Request {
        method,
        target,
        headers,
        body,
    })
}

fn write_answer(mut stream: TcpStream, (status, content_type, body): Answer) {
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body.as_bytes());
}

fn sandbox_json(id: &str) -> String {
    format!(
        r#"{{"id":"{id}","tenant":"t","state":"running","template":"default",
            "limits":{{"memory":1073741824,"cpus":null,"pids":1024,"disk":null}},"env_keys":[],
            "user":"user","labels":{{"k":"v"}},"created_at":"2025-01-01T00:00:00Z",
            "expires_at":"2025-01-01T00:05:00Z"}}"#
    )
    .replace(['\n', ' '], "")
}

#[test]
fn ls_follows_every_page() {
    let page1 = format!(
        r#"{{"sandboxes":[{}],"next_cursor":"c2"}}"#,
        sandbox_json("sb-one")
    );
    let page2 = format!(r#"{{"sandboxes":[{}]}}"#, sandbox_json("sb-two"));
    let server = FakeServer::start(vec![(
        "GET /v1/sandboxes",
        vec![
            (200, "application/json", page1.clone()),
            (200, "application/json", page2.clone()),
            (200, "application/json", page1),
            (200, "application/json", page2),
        ],
    )]);
    let o = server.run(&["sandbox", "ls", "--label", "k=v", "--state", "all"]);
    assert_code(&o, 0);
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].starts_with("ID") && lines[0].contains("LABELS"), "{out}");
    assert!(
        lines[1].starts_with("sb-one") && lines[1].contains("running") && lines[1].ends_with("k=v"),
        "{out}"
    );
    assert!(lines[2].starts_with("sb-two"), "{out}");
    let requests = server.requests();
    assert_eq!(
        requests[0].headers.get("authorization").map(String::as_str),
        Some("Bearer pdk_test_key")
    );
    assert!(
        requests[0].target.contains("state=all"),
        "{:?}",
        requests[0].target
    );
    assert!(
        requests[0].target.contains("label=k%3Dv"),
        "{:?}",
        requests[0].target
    );
    assert!(!requests[0].target.contains("cursor"), "{:?}", requests[0].target);
    assert!(
        requests[1].target.contains("cursor=c2"),
        "{:?}",
        requests[1].target
    );

    let o = server.run(&["sandbox", "ls", "--json"]);
    assert_code(&o, 0);
    let merged: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let ids: Vec<&str> = merged["sandboxes"]
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids, ["sb-one", "sb-two"]);
    assert!(merged.get("next_cursor").is_none());
}

#[test]
fn api_errors_are_one_line_with_their_code_and_exit_1() {
    let server = FakeServer::start(vec![(
        "GET /v1/sandboxes/sb-x",
        vec![(
            404,
            "application/json",
            r#"{"code":"sandbox_not_found","message":"sandbox sb-x not found"}"#.into(),
        )],
    )]);
    let o = server.run(&["sandbox", "get", "sb-x"]);
    assert_code(&o, 1);
    assert_eq!(
        stderr(&o),
        "paddock: sandbox sb-x not found (sandbox_not_found)\n"
    );
    assert_eq!(stdout(&o), "");
}

#[test]
fn create_sends_the_request_and_prints_the_id() {
    let server = FakeServer::start(vec![(
        "POST /v1/sandboxes",
        vec![(201, "application/json", sandbox_json("sb-new"))],
    )]);
    let o = server.run(&[
        "sandbox",
        "create",
        "--memory",
        "512M",
        "--cpus",
        "1.5",
        "-e",
        "A=1",
        "--label",
        "x=y",
        "--timeout",
        "10m",
    ]);
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "sb-new\n");
    let body: serde_json::Value = serde_json::from_slice(&server.requests()[0].body).expect("json body");
    assert_eq!(body["limits"]["memory"], 512u64 << 20);
    assert_eq!(body["limits"]["cpus"], 1.5);
    assert_eq!(body["env"]["A"], "1");
    assert_eq!(body["labels"]["x"], "y");
    assert_eq!(body["timeout_secs"], 600);
}

#[test]
fn exec_streams_output_and_exits_like_the_process() {
    let ndjson = |exit: &str| {
        [
            r#"{"type":"started","pid":4}"#,
            r#"{"type":"stdout","offset":0,"data":"out\n"}"#,
            r#"{"type":"stderr","offset":0,"data_b64":"/2Vycgo="}"#,
            exit,
        ]
        .join("\n")
            + "\n"
    };
    let server = FakeServer::start(vec![(
        "POST /v1/sandboxes/sb-1/exec",
        vec![
            (
                200,
                "application/x-ndjson",
                ndjson(
                    r#"{"type":"exit","exit_code":7,"signal":null,"timed_out":false,"duration_ms":1,"cpu_time_us":1,"max_rss_kib":1}"#,
                ),
            ),
            (
                200,
                "application/x-ndjson",
                ndjson(
                    r#"{"type":"exit","exit_code":137,"signal":9,"timed_out":true,"duration_ms":1,"cpu_time_us":1,"max_rss_kib":1}"#,
                ),
            ),
            (
                200,
                "application/x-ndjson",
                ndjson(r#"{"type":"error","code":"unavailable","message":"the server is shutting down"}"#),
            ),
            (200, "application/x-ndjson", ndjson("")),
        ],
    )]);
    let o = server.run(&[
        "sandbox",
        "exec",
        "sb-1",
        "--timeout",
        "30s",
        "--",
        "sh",
        "-c",
        "x",
    ]);
    assert_code(&o, 7);
    assert_eq!(stdout(&o), "out\n");
    assert_eq!(o.stderr, b"\xfferr\n");
    let request = &server.requests()[0];
    assert_eq!(
        request.headers.get("accept").map(String::as_str),
        Some("application/x-ndjson")
    );
    let body: serde_json::Value = serde_json::from_slice(&request.body).expect("json");
    assert_eq!(body["argv"], serde_json::json!(["sh", "-c", "x"]));
    assert_eq!(body["timeout_ms"], 30_000);

    let o = server.run(&["sandbox", "exec", "sb-1", "--shell", "x"]);
    assert_code(&o, 124);
    let o = server.run(&["sandbox", "exec", "sb-1", "--shell", "x"]);
    assert_code(&o, 1);
    assert!(
        stderr(&o).ends_with("paddock: the server is shutting down (unavailable)\n"),
        "{}",
        stderr(&o)
    );
    let o = server.run(&["sandbox", "exec", "sb-1", "--shell", "x"]);
    assert_code(&o, 1);
    assert!(
        stderr(&o).ends_with("before the process exited\n"),
        "{}",
        stderr(&o)
    );
}

/// Output that does not decode (invalid base64) is an error, not written as its base64 text.
#[test]
fn exec_refuses_output_it_cannot_decode() {
    let ndjson = [
        r#"{"type":"started","pid":4}"#,
        r#"{"type":"stdout","offset":0,"data":"ok\n"}"#,
        r#"{"type":"stdout","offset":3,"data_b64":"!!not base64"}"#,
        r#"{"type":"exit","exit_code":0,"signal":null,"timed_out":false,"duration_ms":1,"cpu_time_us":1,"max_rss_kib":1}"#,
    ]
    .join("\n")
        + "\n";
    let server = FakeServer::start(vec![(
        "POST /v1/sandboxes/sb-1/exec",
        vec![(200, "application/x-ndjson", ndjson)],
    )]);
    let o = server.run(&["sandbox", "exec", "sb-1", "--shell", "x"]);
    assert_code(&o, 1);
    assert_eq!(stdout(&o), "ok\n");
    assert!(stderr(&o).contains("cannot decode"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("not base64"), "{}", stderr(&o));
}

#[test]
fn background_exec_prints_the_pid() {
    let server = FakeServer::start(vec![(
        "POST /v1/sandboxes/sb-1/exec",
        vec![(202, "application/json", r#"{"pid":42}"#.into())],
    )]);
    let o = server.run(&[
        "sandbox", "exec", "-d", "sb-1", "--tag", "job", "--", "sleep", "1",
    ]);
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "42\n");
    let body: serde_json::Value = serde_json::from_slice(&server.requests()[0].body).expect("json");
    assert_eq!(body["background"], true);
    assert_eq!(body["tag"], "job");
}

#[test]
fn audit_follows_pages_up_to_the_limit() {
    let row = |seq: u64| {
        format!(
            r#"{{"seq":{seq},"time":"2025-01-01T00:00:00Z","tenant":"t","key_id":"k","action":"sandbox.create",
                "sandbox_id":"sb-1","outcome":"ok","detail":{{}},"prev_hash":"p","hash":"h"}}"#
        )
    };
    let page1 = format!(r#"{{"records":[{},{}],"next_after_seq":2}}"#, row(1), row(2));
    let page2 = format!(r#"{{"records":[{}],"next_after_seq":3}}"#, row(3));
    let server = FakeServer::start(vec![(
        "GET /v1/audit",
        vec![(200, "application/json", page1), (200, "application/json", page2)],
    )]);
    let o = server.run(&["audit", "--limit", "3", "--action", "sandbox.", "--json"]);
    assert_code(&o, 0);
    let page: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(page["records"].as_array().map(Vec::len), Some(3));
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "stops once the limit is reached");
    assert!(
        requests[0].target.contains("action=sandbox."),
        "{}",
        requests[0].target
    );
    assert!(requests[0].target.contains("limit=3"), "{}", requests[0].target);
    assert!(
        requests[1].target.contains("after_seq=2"),
        "{}",
        requests[1].target
    );
    assert!(requests[1].target.contains("limit=1"), "{}", requests[1].target);
}

#[test]
fn unreachable_server_and_missing_key() {
    // Nothing listens on a port we just bound and released.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let o = client(&format!("http://127.0.0.1:{port}"))
        .args(["sandbox", "ls"])
        .output()
        .expect("runs");
    assert_code(&o, 1);
    assert!(
        stderr(&o).starts_with("paddock: cannot reach the paddock server at http://127.0.0.1:"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stderr(&o).lines().count(), 1);

    let o = client("http://127.0.0.1:1")
        .env_remove("PADDOCK_API_KEY")
        .args(["sandbox", "ls"])
        .output()
        .expect("runs");
    assert_code(&o, 125);
    assert!(stderr(&o).starts_with("paddock: no API key"), "{}", stderr(&o));
}

#[test]
fn usage_errors_exit_125() {
    for args in [
        &["sandbox", "cp", "a", "b"][..],
        &["sandbox", "cp", "sb-1:/a", "sb-2:/b"],
        &["sandbox", "exec", "sb-1"],
        &["sandbox", "create", "--memory", "lots"],
        &["sandbox", "ls", "--label", "novalue"],
    ] {
        let o = client("http://127.0.0.1:1").args(args).output().expect("runs");
        assert_code(&o, 125);
        assert!(stderr(&o).starts_with("paddock: "), "{args:?}: {}", stderr(&o));
    }
    let o = client("not a url")
        .args(["sandbox", "ls"])
        .output()
        .expect("runs");
    assert_code(&o, 125);
}

#[test]
fn config_show_layers_file_environment_and_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("paddock.toml");
    std::fs::write(
        &file,
        "listen = \"0.0.0.0:8000\"\nmax_timeout = \"2h\"\n[default_limits]\nmemory = \"2G\"\npids = 64\n[templates.py]\nrootfs = \"/srv/py\"\nwarm_pool = 1\n",
    )
    .expect("write");
    let show = |env: &[(&str, &str)], flags: &[&str]| {
        let mut c = Command::new(paddock_bin());
        c.env_clear()
            .env("PADDOCK_CONFIG", &file)
            .env("PADDOCK_AGENT", "/x/paddock-agent");
        for (k, v) in env {
            c.env(k, v);
        }
        c.args(["config", "show"]).args(flags).output().expect("runs")
    };
    let o = show(&[], &[]);
    assert_code(&o, 0);
    let out = stdout(&o);
    for line in [
        "listen = \"0.0.0.0:8000\"",
        "memory = \"2G\"",
        "pids = 64",
        "max_timeout = \"2h\"",
        "rootfs = \"/srv/py\"",
        "[templates.default]",
    ] {
        assert!(out.contains(line), "{line:?} missing from\n{out}");
    }
    let o = show(
        &[
            ("PADDOCK_DEFAULT_MEMORY", "3G"),
            ("PADDOCK_LISTEN", "127.0.0.1:9"),
        ],
        &[],
    );
    let out = stdout(&o);
    assert!(
        out.contains("memory = \"3G\"") && out.contains("listen = \"127.0.0.1:9\""),
        "{out}"
    );
    let o = show(
        &[("PADDOCK_DEFAULT_MEMORY", "3G")],
        &["--default-memory", "4G", "--state-dir", "/srv/state"],
    );
    let out = stdout(&o);
    assert!(
        out.contains("memory = \"4G\"") && out.contains("state_dir = \"/srv/state\""),
        "{out}"
    );

    std::fs::write(&file, "[max_limits]\nmemroy = \"1G\"\n").expect("write");
    let o = show(&[], &[]);
    assert_code(&o, 125);
    let err = stderr(&o);
    assert!(
        err.contains("max_limits.memroy") && err.contains("line 2"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

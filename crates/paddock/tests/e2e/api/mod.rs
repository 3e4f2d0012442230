//! The REST API in-process against a real service (native backend, SQLite store, axum on a loopback
//! port): tenant isolation over every documented sandbox route, path attacks on the file API, exec
//! semantics (streams, stdin, re-attach, signals, PTYs, WebSockets), files (large streams, error codes,
//! tar, watches), and the lifecycle (quotas, validation, timeouts, usage, warm pools, lists, audit).
//! Each test has its own service, state directory and cgroup parent; teardown kills every sandbox and
//! checks nothing was left behind.

mod limits;
mod listener;
mod quotas;
mod stop;
mod volumes;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt as _, StreamExt as _};
use reqwest::Method;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::support::{
    harness::{poll, Client, Harness, Lines, Options, Reply, WsStream},
    skip,
};

/// An id no sandbox has.
const NO_SUCH_SANDBOX: &str = "sb-0000000000000000";
const NDJSON: &str = "application/x-ndjson";
const SSE: &str = "text/event-stream";
const JSON: &str = "application/json";
/// Generous bound for anything that should happen "soon".
const SOON: Duration = Duration::from_secs(20);

/// A string no other run of this test produces.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_nanos();
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

// ---------------------------------------------------------------------------------------------------
// 1. Tenant isolation
// ---------------------------------------------------------------------------------------------------

/// How a probe was answered, with the probed id replaced by `{id}` in messages.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// An HTTP error (or any non-upgrade answer).
    Http {
        status: u16,
        code: String,
        message: String,
    },
    /// A WebSocket that was upgraded and then answered with an `error` event.
    WsError {
        code: String,
        message: String,
        close: Option<u16>,
    },
    /// A WebSocket that was upgraded and did something else (a leak).
    WsOther(Vec<String>),
}

impl Outcome {
    fn is_not_found(&self) -> bool {
        match self {
            Outcome::Http { status, code, .. } => *status == 404 && code == "sandbox_not_found",
            Outcome::WsError { code, .. } => code == "sandbox_not_found",
            Outcome::WsOther(_) => false,
        }
    }
}

#[derive(Debug, Clone)]
enum ProbeBody {
    None,
    Json(Value),
    Bytes(Vec<u8>),
}

/// One request against a sandbox-scoped route.
#[derive(Debug, Clone)]
enum Probe {
    Http {
        method: Method,
        /// Path with `{id}` and `{pid}` still in it.
        path: &'static str,
        query: Vec<(&'static str, String)>,
        body: ProbeBody,
        accept: Option<&'static str>,
    },
    Ws {
        path: &'static str,
        query: &'static str,
        first: Option<Value>,
    },
}

fn http(method: Method, path: &'static str) -> Probe {
    Probe::Http {
        method,
        path,
        query: Vec::new(),
        body: ProbeBody::None,
        accept: None,
    }
}

impl Probe {
    fn query(mut self, k: &'static str, v: &str) -> Self {
        if let Probe::Http { query, .. } = &mut self {
            query.push((k, v.to_owned()));
        }
        self
    }

    fn json(mut self, v: Value) -> Self {
        if let Probe::Http { body, .. } = &mut self {
            *body = ProbeBody::Json(v);
        }
        self
    }

    fn bytes(mut self, b: Vec<u8>) -> Self {
        if let Probe::Http { body, .. } = &mut self {
            *body = ProbeBody::Bytes(b);
        }
        self
    }

    fn accept(mut self, a: &'static str) -> Self {
        if let Probe::Http { accept, .. } = &mut self {
            *accept = Some(a);
        }
        self
    }

    async fn run(&self, client: &Client, id: &str, pid: u32) -> Outcome {
        let fill = |p: &str| p.replace("{id}", id).replace("{pid}", &pid.to_string());
        let normalize = |m: &str| m.replace(id, "{id}");
        match self {
            Probe::Http {
                method,
                path,
                query,
                body,
                accept,
            } => {
                let mut rb = client.request(method.clone(), &fill(path)).query(query);
                if let Some(a) = accept {
                    rb = rb.header("accept", *a);
                }
                rb = match body {
                    ProbeBody::None => rb,
                    ProbeBody::Json(v) => rb.json(v),
                    ProbeBody::Bytes(b) => rb.body(b.clone()),
                };
                let r = Client::send(rb).await;
                let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                Outcome::Http {
                    status: r.status,
                    code: v["code"].as_str().unwrap_or("").to_owned(),
                    message: normalize(v["message"].as_str().unwrap_or(&r.text())),
                }
            }
            Probe::Ws { path, query, first } => {
                let url = format!("{}{}", fill(path), query);
                let mut ws = match client.ws(&url).await {
                    Ok(ws) => ws,
                    Err((status, body)) => {
                        return Outcome::Http {
                            status,
                            code: body["code"].as_str().unwrap_or("").to_owned(),
                            message: normalize(body["message"].as_str().unwrap_or("")),
                        }
                    }
                };
                if let Some(first) = first {
                    ws.send(Message::text(first.to_string()))
                        .await
                        .expect("send the first message");
                }
                let mut seen = Vec::new();
                let mut error = None;
                let mut close = None;
                let read = async {
                    while let Some(Ok(message)) = ws.next().await {
                        match message {
                            Message::Text(t) => {
                                let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                                if v["type"] == "error" && error.is_none() {
                                    error = Some((
                                        v["code"].as_str().unwrap_or("").to_owned(),
                                        normalize(v["message"].as_str().unwrap_or("")),
                                    ));
                                } else {
                                    seen.push(t.as_str().to_owned());
                                }
                            }
                            Message::Binary(b) => seen.push(String::from_utf8_lossy(&b).into_owned()),
                            Message::Close(frame) => {
                                close = frame.map(|f| u16::from(f.code));
                                break;
                            }
                            _ => {}
                        }
                    }
                };
                let _ = tokio::time::timeout(Duration::from_secs(10), read).await;
                match error {
                    Some((code, message)) if seen.is_empty() => Outcome::WsError { code, message, close },
                    _ => Outcome::WsOther(seen),
                }
            }
        }
    }
}

/// A tar archive of regular files.
fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, *data).expect("tar member");
    }
    b.into_inner().expect("tar")
}

/// The probes of one documented route (`None`: this test does not know the route).
fn probes_for(method: &str, template: &str) -> Option<Vec<Probe>> {
    const SECRET: &str = "/home/user/secret.txt";
    let p = match (method, template) {
        ("GET", "/v1/sandboxes/{id}") => vec![http(Method::GET, "/v1/sandboxes/{id}")],
        ("DELETE", "/v1/sandboxes/{id}") => vec![http(Method::DELETE, "/v1/sandboxes/{id}")],
        ("POST", "/v1/sandboxes/{id}/timeout") => {
            vec![http(Method::POST, "/v1/sandboxes/{id}/timeout").json(json!({"timeout_secs": 60}))]
        }
        ("GET", "/v1/sandboxes/{id}/usage") => vec![http(Method::GET, "/v1/sandboxes/{id}/usage")],
        ("POST", "/v1/sandboxes/{id}/exec") => {
            let exec = || http(Method::POST, "/v1/sandboxes/{id}/exec");
            let req = json!({"argv": ["sh", "-c", "echo leaked"]});
            vec![
                exec().json(req.clone()).accept(NDJSON),
                exec().json(req.clone()).accept(SSE),
                exec().json(req.clone()).accept(JSON),
                exec().json(req.clone()),
                exec().json(json!({"argv": ["sh", "-c", "echo leaked"], "background": true})),
            ]
        }
        ("GET", "/v1/sandboxes/{id}/exec/ws") => vec![Probe::Ws {
            path: "/v1/sandboxes/{id}/exec/ws",
            query: "",
            first: Some(json!({"argv": ["sh", "-c", "echo leaked"]})),
        }],
        ("GET", "/v1/sandboxes/{id}/processes") => {
            vec![http(Method::GET, "/v1/sandboxes/{id}/processes")]
        }
        ("GET", "/v1/sandboxes/{id}/processes/{pid}/output") => {
            let out = || http(Method::GET, "/v1/sandboxes/{id}/processes/{pid}/output");
            vec![
                out().query("follow", "false"),
                out().query("follow", "false").accept(JSON),
                out().query("stdout_from", "3"),
            ]
        }
        ("POST", "/v1/sandboxes/{id}/processes/{pid}/stdin") => vec![
            http(Method::POST, "/v1/sandboxes/{id}/processes/{pid}/stdin").bytes(b"from b\n".to_vec()),
            http(Method::POST, "/v1/sandboxes/{id}/processes/{pid}/stdin").query("close", "true"),
        ],
        ("POST", "/v1/sandboxes/{id}/processes/{pid}/signal") => {
            vec![http(Method::POST, "/v1/sandboxes/{id}/processes/{pid}/signal")
                .json(json!({"signal": "TERM"}))]
        }
        ("POST", "/v1/sandboxes/{id}/processes/{pid}/kill") => vec![
            http(Method::POST, "/v1/sandboxes/{id}/processes/{pid}/kill"),
            http(Method::POST, "/v1/sandboxes/{id}/processes/{pid}/kill").json(json!({"signal": "KILL"})),
        ],
        ("POST", "/v1/sandboxes/{id}/processes/{pid}/resize") => {
            vec![http(Method::POST, "/v1/sandboxes/{id}/processes/{pid}/resize")
                .json(json!({"rows": 10, "cols": 20}))]
        }
        ("GET", "/v1/sandboxes/{id}/pty") => vec![Probe::Ws {
            path: "/v1/sandboxes/{id}/pty",
            query: "?rows=10&cols=20",
            first: None,
        }],
        ("GET", "/v1/sandboxes/{id}/files") => {
            vec![http(Method::GET, "/v1/sandboxes/{id}/files").query("path", SECRET)]
        }
        ("PUT", "/v1/sandboxes/{id}/files") => vec![http(Method::PUT, "/v1/sandboxes/{id}/files")
            .query("path", SECRET)
            .bytes(b"overwritten by b".to_vec())],
        ("DELETE", "/v1/sandboxes/{id}/files") => vec![
            http(Method::DELETE, "/v1/sandboxes/{id}/files").query("path", SECRET),
            http(Method::DELETE, "/v1/sandboxes/{id}/files")
                .query("path", "/home/user")
                .query("recursive", "true"),
        ],
        ("GET", "/v1/sandboxes/{id}/files/list") => {
            vec![http(Method::GET, "/v1/sandboxes/{id}/files/list").query("path", "/home/user")]
        }
        ("GET", "/v1/sandboxes/{id}/files/stat") => {
            vec![http(Method::GET, "/v1/sandboxes/{id}/files/stat").query("path", SECRET)]
        }
        ("POST", "/v1/sandboxes/{id}/files/mkdir") => {
            vec![http(Method::POST, "/v1/sandboxes/{id}/files/mkdir")
                .json(json!({"path": "/home/user/b-dir", "parents": true}))]
        }
        ("POST", "/v1/sandboxes/{id}/files/rename") => {
            vec![http(Method::POST, "/v1/sandboxes/{id}/files/rename")
                .json(json!({"from": SECRET, "to": "/home/user/stolen.txt"}))]
        }
        ("GET", "/v1/sandboxes/{id}/files/tar") => {
            vec![http(Method::GET, "/v1/sandboxes/{id}/files/tar").query("path", "/home/user")]
        }
        ("PUT", "/v1/sandboxes/{id}/files/tar") => vec![http(Method::PUT, "/v1/sandboxes/{id}/files/tar")
            .query("path", "/home/user")
            .bytes(tar_of(&[("b-was-here", b"b")]))],
        ("GET", "/v1/sandboxes/{id}/files/watch") => {
            vec![http(Method::GET, "/v1/sandboxes/{id}/files/watch")
                .query("path", "/home/user")
                .query("recursive", "true")]
        }
        ("POST", "/v1/sandboxes/{id}/snapshots") => vec![
            http(Method::POST, "/v1/sandboxes/{id}/snapshots"),
            http(Method::POST, "/v1/sandboxes/{id}/snapshots").json(json!({"name": "b's"})),
        ],
        ("POST", "/v1/sandboxes/{id}/fork") => {
            vec![http(Method::POST, "/v1/sandboxes/{id}/fork").json(json!({"count": 1}))]
        }
        ("POST", "/v1/sandboxes/{id}/checkpoint") => {
            vec![http(Method::POST, "/v1/sandboxes/{id}/checkpoint")]
        }
        ("POST", "/v1/sandboxes/{id}/commit") => vec![http(Method::POST, "/v1/sandboxes/{id}/commit")],
        ("POST", "/v1/sandboxes/{id}/rollback") => vec![
            http(Method::POST, "/v1/sandboxes/{id}/rollback"),
            http(Method::POST, "/v1/sandboxes/{id}/rollback").json(json!({})),
        ],
        ("POST", "/v1/sandboxes/{id}/pause") => vec![http(Method::POST, "/v1/sandboxes/{id}/pause")],
        ("POST", "/v1/sandboxes/{id}/stop") => vec![http(Method::POST, "/v1/sandboxes/{id}/stop")],
        ("POST", "/v1/sandboxes/{id}/resume") => vec![http(Method::POST, "/v1/sandboxes/{id}/resume")],
        ("GET", "/v1/sandboxes/{id}/network") => vec![http(Method::GET, "/v1/sandboxes/{id}/network")],
        ("PUT", "/v1/sandboxes/{id}/network") => vec![
            http(Method::PUT, "/v1/sandboxes/{id}/network")
                .json(json!({"policy": {"allow": [{"domain": "evil.test"}]}})),
            http(Method::PUT, "/v1/sandboxes/{id}/network").json(json!({"secrets": ["GH"]})),
        ],
        ("GET", "/v1/sandboxes/{id}/diff") => vec![
            http(Method::GET, "/v1/sandboxes/{id}/diff"),
            http(Method::GET, "/v1/sandboxes/{id}/diff").query("text", "true"),
        ],
        _ => return None,
    };
    Some(p)
}

#[test]
fn tenant_isolation_over_every_endpoint() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("tenant-a").await;
        let b = h.admin.new_tenant("tenant-b").await;
        let id = a.create_sandbox(json!({"labels": {"owner": "a"}})).await;
        let pid = a
            .exec_background(
                &id,
                json!({"shell": "echo bg-ready; exec sleep 1000", "stdin_open": true, "tag": "a-bg"}),
            )
            .await;
        a.write_file(&id, "/home/user/secret.txt", "A's secret")
            .await
            .ok(200);

        // Every documented route with `{id}`, from the document the server serves.
        let doc = b.get("/openapi.json").await.ok(200);
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            if !path.contains("{id}") {
                continue;
            }
            for method in item.as_object().expect("path item").keys() {
                let method = method.to_ascii_uppercase();
                if ["GET", "POST", "PUT", "DELETE", "PATCH"].contains(&method.as_str()) {
                    documented.insert((method, path.clone()));
                }
            }
        }
        assert!(
            documented.len() >= 20,
            "too few sandbox routes documented: {documented:?}"
        );

        let mut failures = Vec::new();
        let mut exercised = BTreeSet::new();
        for (method, template) in &documented {
            let Some(probes) = probes_for(method, template) else {
                failures.push(format!(
                    "{method} {template}: documented but not exercised by this test"
                ));
                continue;
            };
            for probe in probes {
                let foreign = probe.run(&b, &id, pid).await;
                let missing = probe.run(&b, NO_SUCH_SANDBOX, pid).await;
                if !foreign.is_not_found() {
                    failures.push(format!(
                        "{method} {template} ({probe:?}) on another tenant's sandbox: {foreign:?}"
                    ));
                }
                if foreign != missing {
                    failures.push(format!(
                        "{method} {template} ({probe:?}): another tenant's sandbox answers {foreign:?}, a \
                         missing one {missing:?}"
                    ));
                }
            }
            exercised.insert((method.clone(), template.clone()));
        }
        assert!(
            failures.is_empty(),
            "isolation failures:\n{}",
            failures.join("\n")
        );
        assert_eq!(exercised, documented);

        // A's sandbox, file and process are intact.
        let info = a.get(&format!("/v1/sandboxes/{id}")).await.ok(200);
        assert_eq!(info["state"], "running");
        assert_eq!(info["tenant"], "tenant-a");
        assert_eq!(
            a.read_file(&id, "/home/user/secret.txt").await.text(),
            "A's secret"
        );
        let home = a
            .get_q(
                &format!("/v1/sandboxes/{id}/files/list"),
                &[("path", "/home/user")],
            )
            .await
            .ok(200);
        let names: BTreeSet<&str> = home["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        for planted in ["stolen.txt", "b-dir", "b-was-here"] {
            assert!(
                !names.contains(planted),
                "B's {planted} appeared in A's sandbox: {names:?}"
            );
        }
        let procs = a.get(&format!("/v1/sandboxes/{id}/processes")).await.ok(200);
        let bg = procs["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("A's process is gone: {procs}"));
        assert_eq!(bg["running"], true, "{bg}");
        assert_eq!(bg["tag"], "a-bg");
        let out = Client::send(
            a.request(Method::GET, &format!("/v1/sandboxes/{id}/processes/{pid}/output"))
                .query(&[("follow", "false")])
                .header("accept", JSON),
        )
        .await
        .ok(200);
        assert_eq!(out["stdout"], "bg-ready\n", "{out}");
        // B lists nothing, in any state.
        for state in ["running", "all"] {
            let list = b.get_q("/v1/sandboxes", &[("state", state)]).await.ok(200);
            assert_eq!(list["sandboxes"], json!([]), "B sees sandboxes ({state}): {list}");
        }
        let list = a.get("/v1/sandboxes").await.ok(200);
        assert_eq!(list["sandboxes"][0]["id"], id.as_str());

        // The audit log: B sees its own tenant only; A's rows exist and carry no action of B's key.
        let b_rows = b.audit_rows(&[]).await;
        for row in &b_rows {
            assert_eq!(row["tenant"], "tenant-b", "B sees a foreign row: {row}");
            assert_ne!(row["sandbox_id"], id.as_str(), "B sees A's sandbox in {row}");
        }
        assert!(b.audit_rows(&[("sandbox", &id)]).await.is_empty());
        b.get_q("/v1/audit", &[("tenant", "tenant-a")])
            .await
            .err(403, "forbidden");
        b.get_q("/v1/audit", &[("tenant", "tenant-b")]).await.ok(200);
        let a_rows = h.admin.audit_rows(&[("tenant", "tenant-a")]).await;
        assert!(
            a_rows
                .iter()
                .any(|r| r["action"] == "sandbox.create" && r["sandbox_id"] == id.as_str()),
            "A's rows: {a_rows:?}"
        );
        let b_key = b.key_id.clone().expect("B's key id");
        for row in &a_rows {
            assert_ne!(row["key_id"], b_key.as_str(), "B acted on A's tenant: {row}");
        }

        // Admin-only operations.
        b.post("/v1/keys", json!({"tenant": "tenant-b"}))
            .await
            .err(403, "forbidden");
        b.post("/v1/keys", json!({"tenant": "tenant-b", "admin": true}))
            .await
            .err(403, "forbidden");
        b.get("/metrics").await.err(403, "forbidden");
        b.get("/v1/audit/verify").await.err(403, "forbidden");
        b.get("/v1/tenants").await.err(403, "forbidden");
        b.get("/v1/tenants/tenant-a").await.err(403, "forbidden");
        b.put("/v1/tenants/tenant-b/quota", json!({"max_sandboxes": 100}))
            .await
            .err(403, "forbidden");
        let a_key = a.key_id.clone().expect("A's key id");
        b.delete(&format!("/v1/keys/{a_key}")).await.err(403, "forbidden");
        b.get("/v1/tenants/tenant-b").await.ok(200);
        let keys = b.get("/v1/keys").await.ok(200);
        for k in keys["keys"].as_array().expect("keys") {
            assert_eq!(k["tenant"], "tenant-b", "B lists a foreign key: {k}");
            assert!(k.get("key").is_none(), "a listed key shows its secret: {k}");
        }

        // The last active admin key cannot be revoked; once another exists, it can.
        let admin_key_id = h.admin.key_id.clone().expect("admin key id");
        h.admin
            .delete(&format!("/v1/keys/{admin_key_id}"))
            .await
            .err(403, "forbidden");
        let second = h
            .admin
            .post("/v1/keys", json!({"tenant": "ops", "admin": true}))
            .await
            .ok(201);
        let second_id = second["id"].as_str().expect("id").to_owned();
        h.admin.delete(&format!("/v1/keys/{second_id}")).await.ok(204);
        h.admin
            .delete(&format!("/v1/keys/{second_id}"))
            .await
            .err(404, "key_not_found");

        // Missing, invalid and revoked keys.
        let c = h.admin.new_tenant("tenant-c").await;
        let c_key = c.key_id.clone().expect("C's key id");
        h.admin.delete(&format!("/v1/keys/{c_key}")).await.ok(204);
        let bad_clients = [
            ("no key", h.anonymous()),
            ("garbage key", h.with_key("nonsense")),
            (
                "well-formed unknown key",
                h.with_key("pdk_0123456789ab_0000000000000000000000000000000000000000000"),
            ),
            ("revoked key", c),
        ];
        let sample: Vec<(Method, String, Option<Value>)> = vec![
            (Method::GET, "/v1/sandboxes".into(), None),
            (Method::POST, "/v1/sandboxes".into(), Some(json!({}))),
            (Method::GET, format!("/v1/sandboxes/{id}"), None),
            (Method::DELETE, format!("/v1/sandboxes/{id}"), None),
            (
                Method::POST,
                format!("/v1/sandboxes/{id}/exec"),
                Some(json!({"argv": ["true"]})),
            ),
            (
                Method::GET,
                format!("/v1/sandboxes/{id}/files?path=/home/user/secret.txt"),
                None,
            ),
            (Method::GET, format!("/v1/sandboxes/{id}/processes"), None),
            (Method::GET, "/openapi.json".into(), None),
            (Method::GET, "/v1/templates".into(), None),
            (Method::GET, "/v1/audit".into(), None),
            (Method::GET, "/metrics".into(), None),
            (Method::POST, "/v1/keys".into(), Some(json!({"tenant": "x"}))),
        ];
        for (what, client) in &bad_clients {
            for (method, path, body) in &sample {
                let mut rb = client.request(method.clone(), path);
                if let Some(body) = body {
                    rb = rb.json(body);
                }
                let r = Client::send(rb).await;
                assert_eq!(
                    (r.status, r.code().as_str()),
                    (401, "unauthorized"),
                    "{what}: {method} {path}: {r:?}"
                );
            }
        }
        // The X-API-Key header is checked the same way.
        let r = Client::send(
            h.anonymous()
                .request(Method::GET, "/v1/sandboxes")
                .header("x-api-key", "nonsense"),
        )
        .await;
        r.err(401, "unauthorized");
        let health = h.anonymous().get("/healthz").await.ok(200);
        assert_eq!(health, json!({"status": "ok"}));
        // An ended sandbox of A's is as invisible to B as one that never existed (A gets 409).
        let ended = a.create_sandbox(json!({})).await;
        a.delete(&format!("/v1/sandboxes/{ended}")).await.ok(204);
        a.post(&format!("/v1/sandboxes/{ended}/exec"), json!({"argv": ["true"]}))
            .await
            .err(409, "sandbox_not_running");
        a.get(&format!("/v1/sandboxes/{ended}")).await.ok(200);
        for probe in [
            http(Method::GET, "/v1/sandboxes/{id}"),
            http(Method::DELETE, "/v1/sandboxes/{id}"),
            http(Method::POST, "/v1/sandboxes/{id}/exec").json(json!({"argv": ["true"]})),
            http(Method::GET, "/v1/sandboxes/{id}/files/list").query("path", "/"),
        ] {
            let foreign = probe.run(&b, &ended, 1).await;
            assert!(foreign.is_not_found(), "{probe:?}: {foreign:?}");
            assert_eq!(foreign, probe.run(&b, NO_SUCH_SANDBOX, 1).await, "{probe:?}");
        }

        // None of that touched A's sandbox.
        let info = a.get(&format!("/v1/sandboxes/{id}")).await.ok(200);
        assert_eq!(info["state"], "running");
        let procs = a.get(&format!("/v1/sandboxes/{id}/processes")).await.ok(200);
        assert!(
            procs["processes"]
                .as_array()
                .expect("processes")
                .iter()
                .any(|p| p["pid"] == pid && p["running"] == true),
            "{procs}"
        );
    });
}

// ---------------------------------------------------------------------------------------------------
// 2. Path attacks on the file API
// ---------------------------------------------------------------------------------------------------

/// A host file with a marker only the host has; removed on drop.
struct HostMarker {
    path: PathBuf,
}

impl Drop for HostMarker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Names and contents of the files directly in `dir`.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("read the host dir")
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (
                name,
                std::fs::read(e.path()).unwrap_or_else(|_| b"<not a file>".to_vec()),
            )
        })
        .collect()
}

/// Entry names of a `files/list` answer.
fn entry_names(list: &Value) -> BTreeSet<String> {
    list["entries"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .filter_map(|e| e["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// What must never show up in an answer.
struct Secrets {
    marker: String,
    host_only_names: Vec<String>,
    shadow_root: Option<String>,
}

impl Secrets {
    /// A description of the leak in `r`, if any.
    fn leak(&self, what: &str, r: &Reply) -> Option<String> {
        let text = String::from_utf8_lossy(&r.body);
        if text.contains(&self.marker) {
            return Some(format!("{what}: host marker content in {r:?}"));
        }
        if let Some(root) = &self.shadow_root {
            if text.contains(root.as_str()) {
                return Some(format!("{what}: the host's /etc/shadow in {r:?}"));
            }
        }
        if r.body.starts_with(b"SQLite format 3") {
            return Some(format!("{what}: a host database in {r:?}"));
        }
        if r.status == 200 && r.content_type.starts_with(JSON) {
            let names = entry_names(&serde_json::from_slice(&r.body).unwrap_or(Value::Null));
            for n in &self.host_only_names {
                if names.contains(n) {
                    return Some(format!("{what}: host-only entry {n} listed in {r:?}"));
                }
            }
        }
        None
    }
}

#[test]
fn file_api_path_attacks_stay_inside_the_sandbox() {
    let h = Harness::start();
    let (host_dir, marker) = host_marker_dir();
    let hd = host_dir.path().to_string_lossy().into_owned();
    let root_marker = HostMarker {
        path: PathBuf::from(format!("/root/.{}", unique("paddock-api-marker"))),
    };
    std::fs::write(&root_marker.path, &marker).expect("/root marker");
    let rm = root_marker.path.to_string_lossy().into_owned();
    let host_before = snapshot(host_dir.path());
    let state = h.env().state().to_string_lossy().into_owned();
    let mut secrets = secrets_for(host_dir.path(), &marker);
    secrets.host_only_names.push("paddock.db".into());
    h.block_on(async {
        let a = h.admin.new_tenant("attacker").await;
        let id = a.create_sandbox(json!({})).await;
        let vol = format!("{state}/pool/sandboxes/{id}");
        let files = format!("/v1/sandboxes/{id}/files");
        a.sh(
            &id,
            &format!(
                "set -e; cd /home/user; echo sandbox-own > own.txt; echo keep > keep.txt
                 ln -s /proc/1/root procroot; ln -s /proc/self/root selfroot; ln -s /proc/1/cwd proccwd
                 ln -s ../../../.. updots; ln -s / rootlink; ln -s {hd} hostdir; ln -s {hd}/marker.txt hostfile
                 ln -s {rm} hostroot; ln -s {state} statedir; ln -s {vol} ownvol"
            ),
        )
        .await;
        let mut leaks = Vec::new();
        let mut check = |what: String, r: &Reply| {
            if let Some(leak) = secrets.leak(&what, r) {
                leaks.push(leak);
            }
            // A symlink or `..` never reaches a host path, so nothing confined makes the server fail.
            if r.status >= 500 {
                leaks.push(format!("{what}: server error {r:?}"));
            }
        };

        // Reads through every kind of link, and host paths as they are.
        let through = [
            "/home/user/hostfile".to_owned(),
            "/home/user/hostdir/marker.txt".to_owned(),
            format!("/home/user/procroot{hd}/marker.txt"),
            format!("/home/user/selfroot{hd}/marker.txt"),
            format!("/home/user/proccwd{hd}/marker.txt"),
            format!("/home/user/updots{hd}/marker.txt"),
            format!("/home/user/rootlink{hd}/marker.txt"),
            format!("{hd}/marker.txt"),
            format!("/home/user/../../..{hd}/marker.txt"),
            format!("/../../../..{hd}/marker.txt"),
            format!("/proc/1/root{hd}/marker.txt"),
            format!("/proc/self/root{hd}/marker.txt"),
            format!("/proc/1/cwd{hd}/marker.txt"),
            "/home/user/hostroot".to_owned(),
            rm.clone(),
            format!("{state}/paddock.db"),
            "/home/user/statedir/paddock.db".to_owned(),
            "/home/user/ownvol/home/user/own.txt".to_owned(),
            "/etc/shadow".to_owned(),
            "/home/user/../../../etc/shadow".to_owned(),
            "/home/user/updots/etc/shadow".to_owned(),
            "/home/user/procroot/etc/shadow".to_owned(),
        ];
        for path in &through {
            let r = a.read_file(&id, path).await;
            check(format!("read {path}"), &r);
            assert_ne!(r.status, 200, "read {path} found a file: {r:?}");
            let r = a.get_q(&format!("{files}/stat"), &[("path", path)]).await;
            check(format!("stat {path}"), &r);
            if path != "/home/user/hostfile" && path != "/home/user/hostroot" {
                assert_ne!(r.status, 200, "stat {path} found something: {r:?}");
            }
        }
        // `..` resolves inside the sandbox's root: its own /etc, not the host's.
        let own_passwd = a.read_file(&id, "/etc/passwd").await;
        assert_eq!(own_passwd.status, 200);
        assert_ne!(
            own_passwd.body.as_ref(),
            std::fs::read("/etc/passwd").expect("host passwd").as_slice(),
            "the sandbox's /etc/passwd is the host's"
        );
        for path in [
            "/home/user/../../../etc/passwd",
            "/../../../../etc/passwd",
            "/home/user/updots/etc/passwd",
            "/home/user/rootlink/etc/passwd",
            "/tmp/../etc/./passwd",
        ] {
            let r = a.read_file(&id, path).await;
            assert_eq!(r.status, 200, "{path}: {r:?}");
            assert_eq!(r.body, own_passwd.body, "{path} is not the sandbox's /etc/passwd");
        }
        // Directory listings and archives through links.
        let sandbox_root = entry_names(&a.get_q(&format!("{files}/list"), &[("path", "/")]).await.ok(200));
        let host_root: BTreeSet<String> = std::fs::read_dir("/")
            .expect("host /")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_ne!(sandbox_root, host_root, "the sandbox's / lists like the host's");
        for path in [
            "/home/user/updots",
            "/home/user/rootlink",
            "/home/user/../../..",
            "/home/user/rootlink/..",
        ] {
            let r = a.get_q(&format!("{files}/list"), &[("path", path)]).await;
            check(format!("list {path}"), &r);
            assert_eq!(entry_names(&r.ok(200)), sandbox_root, "list {path}");
        }
        for path in [
            "/home/user/hostdir".to_owned(),
            hd.clone(),
            format!("/home/user/procroot{hd}"),
            format!("/home/user/updots{hd}"),
            "/home/user/procroot/var/tmp".to_owned(),
            "/home/user/updots/var/tmp".to_owned(),
            "/var/tmp".to_owned(),
            "/proc/1/root".to_owned(),
            "/proc/1/root/var/tmp".to_owned(),
            "/home/user/statedir".to_owned(),
            state.clone(),
            "/home/user/ownvol".to_owned(),
        ] {
            let r = a.get_q(&format!("{files}/list"), &[("path", &path)]).await;
            check(format!("list {path}"), &r);
            let r = a.get_q(&format!("{files}/tar"), &[("path", &path)]).await;
            check(format!("tar {path}"), &r);
            let r = Client::send(
                a.request(Method::GET, &format!("{files}/watch"))
                    .query(&[("path", &path)])
                    .timeout(Duration::from_secs(2)),
            )
            .await;
            check(format!("watch {path}"), &r);
            assert_ne!(r.status, 200, "watch {path} was accepted");
        }
        let r = a.get_q(&format!("{files}/tar"), &[("path", "/home/user")]).await;
        check("tar /home/user".into(), &r);
        assert_eq!(r.status, 200);

        // Writes, renames, removals and uploads through the same links.
        let pwned = b"PWNED-THROUGH-A-LINK".to_vec();
        for path in [
            "/home/user/hostfile".to_owned(),
            "/home/user/hostdir/new.txt".to_owned(),
            "/home/user/hostdir/marker.txt".to_owned(),
            format!("/home/user/procroot{hd}/marker.txt"),
            format!("/home/user/procroot{hd}/new.txt"),
            format!("/home/user/updots{hd}/new.txt"),
            format!("/home/user/selfroot{hd}/new.txt"),
            format!("{hd}/marker.txt"),
            format!("{hd}/new.txt"),
            format!("/proc/1/root{hd}/new.txt"),
            "/home/user/hostroot".to_owned(),
            "/home/user/statedir/new.txt".to_owned(),
            format!("{state}/new.txt"),
        ] {
            let r = a.write_file(&id, &path, pwned.clone()).await;
            check(format!("write {path}"), &r);
            let r = a
                .post(&format!("{files}/mkdir"), json!({"path": format!("{path}.d"), "parents": true}))
                .await;
            check(format!("mkdir {path}.d"), &r);
        }
        for (from, to) in [
            ("/home/user/own.txt".to_owned(), "/home/user/hostdir/stolen.txt".to_owned()),
            ("/home/user/own.txt".to_owned(), format!("/home/user/procroot{hd}/stolen.txt")),
            (format!("{hd}/marker.txt"), "/home/user/got.txt".to_owned()),
            (format!("/home/user/updots{hd}/marker.txt"), "/home/user/got.txt".to_owned()),
            (format!("/proc/1/root{hd}/marker.txt"), "/home/user/got.txt".to_owned()),
        ] {
            let r = a.post(&format!("{files}/rename"), json!({"from": from, "to": to})).await;
            check(format!("rename {from} -> {to}"), &r);
        }
        for path in [
            "/home/user/hostdir/marker.txt".to_owned(),
            format!("{hd}/marker.txt"),
            hd.clone(),
            format!("/home/user/procroot{hd}"),
            format!("/home/user/updots{hd}"),
            format!("/proc/1/root{hd}"),
            "/home/user/updots/var".to_owned(),
        ] {
            let r = a.delete_q(&files, &[("path", &path), ("recursive", "true")]).await;
            check(format!("delete {path}"), &r);
        }
        for dir in ["/home/user/hostdir".to_owned(), hd.clone(), format!("/home/user/procroot{hd}")] {
            let r = Client::send(
                a.request(Method::PUT, &format!("{files}/tar"))
                    .query(&[("path", &dir)])
                    .body(tar_of(&[("marker.txt", &pwned), ("new.txt", &pwned)])),
            )
            .await;
            check(format!("tar upload into {dir}"), &r);
        }
        assert_eq!(
            a.read_file(&id, "/home/user/got.txt").await.status,
            404,
            "a host file was renamed into the sandbox"
        );

        // Relative paths and NUL bytes are refused up front.
        for bad in ["home/user/own.txt", "own.txt", "", "./own.txt", "/home/user/own.txt\0.x", "/\0"] {
            for (method, suffix) in [
                (Method::GET, ""),
                (Method::PUT, ""),
                (Method::DELETE, ""),
                (Method::GET, "/list"),
                (Method::GET, "/stat"),
                (Method::GET, "/tar"),
                (Method::PUT, "/tar"),
                (Method::GET, "/watch"),
            ] {
                let r = Client::send(
                    a.request(method.clone(), &format!("{files}{suffix}"))
                        .query(&[("path", bad)])
                        .body(Vec::new()),
                )
                .await;
                assert_eq!(
                    (r.status, r.code().as_str()),
                    (400, "invalid_path"),
                    "{method} files{suffix} path={bad:?}: {r:?}"
                );
            }
            a.post(&format!("{files}/mkdir"), json!({"path": bad}))
                .await
                .err(400, "invalid_path");
            a.post(&format!("{files}/rename"), json!({"from": bad, "to": "/home/user/x"}))
                .await
                .err(400, "invalid_path");
            a.post(&format!("{files}/rename"), json!({"from": "/home/user/own.txt", "to": bad}))
                .await
                .err(400, "invalid_path");
        }

        assert!(leaks.is_empty(), "leaks:\n{}", leaks.join("\n"));
        assert_eq!(a.read_file(&id, "/home/user/keep.txt").await.text(), "keep\n");
    });
    assert_eq!(
        snapshot(host_dir.path()),
        host_before,
        "the host directory changed"
    );
    assert_eq!(
        std::fs::read_to_string(&root_marker.path).expect("marker"),
        marker
    );
}

/// A host directory with a marker file no sandbox may see.
fn host_marker_dir() -> (tempfile::TempDir, String) {
    let marker = unique("HOST-ONLY-MARKER");
    let dir = tempfile::Builder::new()
        .prefix("paddock-api-host-")
        .tempdir_in("/var/tmp")
        .expect("host dir");
    std::fs::write(dir.path().join("marker.txt"), &marker).expect("host marker");
    (dir, marker)
}

fn secrets_for(dir: &Path, marker: &str) -> Secrets {
    Secrets {
        marker: marker.to_owned(),
        host_only_names: vec![
            "marker.txt".into(),
            dir.file_name().expect("name").to_string_lossy().into_owned(),
        ],
        shadow_root: std::fs::read_to_string("/etc/shadow")
            .ok()
            .and_then(|s| s.lines().next().map(str::to_owned))
            .filter(|l| l.len() > 8),
    }
}

#[test]
fn file_api_under_a_symlink_swap_race() {
    let h = Harness::start();
    let (host_dir, marker) = host_marker_dir();
    let hd = host_dir.path().to_string_lossy().into_owned();
    let host_before = snapshot(host_dir.path());
    let secrets = secrets_for(host_dir.path(), &marker);
    h.block_on(async {
        let a = h.admin.new_tenant("racer").await;
        let id = a.create_sandbox(json!({})).await;
        a.sh(
            &id,
            &format!(
                "set -e; cd /home/user; mkdir rdir; echo inside-sandbox > rdir/f.txt
                 ln -s / l_root; ln -s {hd} l_host; ln -s /proc/1/root l_proc; ln -s ../../../.. l_up"
            ),
        )
        .await;
        // `race` is, in turn, a directory and symlinks to /, to the host directory's path, to the
        // agent's root through /proc and up through `..`; absent in between.
        let racer = a
            .exec_background(
                &id,
                json!({"shell": "cd /home/user; while :; do for x in rdir l_root rdir l_host rdir l_proc rdir l_up; do \
                                 mv -T $x race && mv -T race $x; done; done"}),
            )
            .await;
        let files = format!("/v1/sandboxes/{id}/files");
        let race = "/home/user/race";
        let mut tasks = Vec::new();
        for worker in 0..4 {
            let (a, id, files, hd) = (a.clone(), id.clone(), files.clone(), hd.clone());
            tasks.push(tokio::spawn(async move {
                let mut answers: Vec<(String, Reply)> = Vec::new();
                for i in 0..60 {
                    let reads = [
                        format!("{race}/f.txt"),
                        format!("{race}{hd}/marker.txt"),
                        format!("{race}/marker.txt"),
                        format!("{race}/../../../..{hd}/marker.txt"),
                        format!("{race}/../race/f.txt"),
                    ];
                    for path in &reads {
                        answers.push((format!("read {path}"), a.read_file(&id, path).await));
                        answers.push((
                            format!("stat {path}"),
                            a.get_q(&format!("{files}/stat"), &[("path", path)]).await,
                        ));
                    }
                    for dir in [race.to_owned(), format!("{race}{hd}"), format!("{race}/var/tmp")] {
                        answers.push((
                            format!("list {dir}"),
                            a.get_q(&format!("{files}/list"), &[("path", &dir)]).await,
                        ));
                    }
                    let target = format!("{race}/w-{worker}-{i}.txt");
                    answers.push((format!("write {target}"), a.write_file(&id, &target, "race-write").await));
                    let target = format!("{race}{hd}/w-{worker}-{i}.txt");
                    answers.push((format!("write {target}"), a.write_file(&id, &target, "race-write").await));
                    let dir = format!("{race}/d-{worker}-{i}");
                    answers.push((
                        format!("mkdir {dir}"),
                        a.post(&format!("{files}/mkdir"), json!({"path": dir})).await,
                    ));
                    answers.push((
                        format!("delete {dir}"),
                        a.delete_q(&files, &[("path", &dir), ("recursive", "true")]).await,
                    ));
                    answers.push((
                        format!("delete {race}/marker.txt"),
                        a.delete_q(&files, &[("path", &format!("{race}/marker.txt"))]).await,
                    ));
                }
                answers
            }));
        }
        let mut failures = Vec::new();
        let (mut inside, mut refused) = (0, 0);
        for task in tasks {
            for (what, r) in task.await.expect("worker") {
                if let Some(leak) = secrets.leak(&what, &r) {
                    failures.push(leak);
                }
                if r.status >= 500 {
                    failures.push(format!("{what}: server error {r:?}"));
                }
                if what.starts_with("read ") && what.ends_with("/race/f.txt") {
                    match r.status {
                        200 => {
                            inside += 1;
                            if r.text() != "inside-sandbox\n" {
                                failures.push(format!("{what}: unexpected content {r:?}"));
                            }
                        }
                        _ => refused += 1,
                    }
                }
            }
        }
        eprintln!("race: {inside} reads saw the directory, {refused} did not");
        a.post(&format!("/v1/sandboxes/{id}/processes/{racer}/kill"), json!(null))
            .await
            .ok(204);
        assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
        assert!(inside > 0 && refused > 0, "the race did not interleave ({inside} / {refused})");
        // Whatever was written landed in the sandbox's own directory.
        let listed = a.sh(&id, "cd /home/user && ls -A rdir | sort | tr '\\n' ' '; ls -A / | tr '\\n' ' '").await;
        assert!(!listed.contains("marker.txt"), "{listed}");
    });
    assert_eq!(
        snapshot(host_dir.path()),
        host_before,
        "the host directory changed"
    );
}

/// One member of a hand-made tar archive (names written raw: `..` and absolute paths included).
enum Member<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
}

/// A tar archive written byte by byte, so nothing sanitizes the names.
fn raw_tar(members: &[Member<'_>]) -> Vec<u8> {
    fn put(field: &mut [u8], text: &str) {
        assert!(
            text.len() < field.len(),
            "name too long for the test's tar: {text}"
        );
        field.fill(0);
        field[..text.len()].copy_from_slice(text.as_bytes());
    }
    let mut out = Vec::new();
    for m in members {
        let mut h = tar::Header::new_old();
        let (name, data, kind, link): (&str, &[u8], tar::EntryType, &str) = match m {
            Member::File(n, d) => (n, d, tar::EntryType::Regular, ""),
            Member::Dir(n) => (n, b"", tar::EntryType::Directory, ""),
            Member::Symlink(n, l) => (n, b"", tar::EntryType::Symlink, l),
            Member::Hardlink(n, l) => (n, b"", tar::EntryType::Link, l),
        };
        put(&mut h.as_old_mut().name, name);
        put(&mut h.as_old_mut().linkname, link);
        h.set_size(data.len() as u64);
        h.set_mode(if matches!(m, Member::Dir(_)) { 0o755 } else { 0o644 });
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        h.set_entry_type(kind);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// Paths under `root` (recursively, not following symlinks) whose name contains `needle`.
fn host_paths_containing(root: &Path, needle: &str, depth: usize) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(rd) = std::fs::read_dir(root) else {
        return found;
    };
    for e in rd.flatten() {
        let path = e.path();
        if e.file_name().to_string_lossy().contains(needle) {
            found.push(path.clone());
        }
        if depth > 0 && e.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(host_paths_containing(&path, needle, depth - 1));
        }
    }
    found
}

#[test]
fn tar_uploads_cannot_escape_the_target_directory() {
    let h = Harness::start();
    let (host_dir, _) = host_marker_dir();
    let hd = host_dir.path().to_string_lossy().into_owned();
    let host_before = snapshot(host_dir.path());
    let r = unique("tarx").replace('-', "");
    h.block_on(async {
        let a = h.admin.new_tenant("uploader").await;
        let id = a.create_sandbox(json!({})).await;
        a.sh(&id, "echo keep > /home/user/keep.txt; mkdir /home/user/sub; echo keep > /home/user/sub/keep.txt")
            .await;
        let pwned: &[u8] = b"PWNED";
        let names: Vec<String> = (0..40).map(|i| format!("{r}{i}")).collect();
        let n = |i: usize| names[i].as_str();
        let (f0, f1, f2, f3, f4) = (
            format!("../../{}", n(0)),
            format!("../../../../../../../tmp/{}", n(1)),
            format!("/{}", n(2)),
            format!("/tmp/{}", n(3)),
            format!("/home/user/{}", n(4)),
        );
        let (l5, l5f) = (n(5).to_owned(), format!("{}/keep.txt", n(5)));
        let (l6, l6f) = (n(6).to_owned(), format!("{}/keep.txt", n(6)));
        let (l7, l7f) = (n(7).to_owned(), format!("{}/marker.txt", n(7)));
        let (l8, l8f) = (n(8).to_owned(), format!("{}/keep.txt", n(8)));
        let (d12, d12s, d12f) = (n(12).to_owned(), format!("{}/s", n(12)), format!("{}/s/keep.txt", n(12)));
        let host_target = "/proc/1/root/home/user";
        let archives: Vec<(&str, Vec<u8>)> = vec![
            (
                "dot-dot and absolute members",
                raw_tar(&[
                    Member::File(&f0, pwned),
                    Member::File(&f1, pwned),
                    Member::File(&f2, pwned),
                    Member::File(&f3, pwned),
                    Member::File(&f4, pwned),
                    Member::File(n(13), b"ok"),
                ]),
            ),
            (
                "a symlink member, then a file through it",
                raw_tar(&[
                    Member::Symlink(&l5, "/home/user"),
                    Member::File(&l5f, pwned),
                    Member::Symlink(&l6, ".."),
                    Member::File(&l6f, pwned),
                    Member::Symlink(&l7, &hd),
                    Member::File(&l7f, pwned),
                    Member::Symlink(&l8, host_target),
                    Member::File(&l8f, pwned),
                ]),
            ),
            (
                "a symlink member, then a file of the same name",
                raw_tar(&[
                    Member::Symlink(n(9), "/home/user/keep.txt"),
                    Member::File(n(9), pwned),
                    Member::Symlink(n(10), "../keep.txt"),
                    Member::File(n(10), pwned),
                ]),
            ),
            (
                "hard links out of the target",
                raw_tar(&[
                    Member::Hardlink(n(11), "/home/user/keep.txt"),
                    Member::File(n(11), pwned),
                    Member::Hardlink(n(14), "../keep.txt"),
                    Member::File(n(14), pwned),
                ]),
            ),
            (
                "a symlink inside a directory member",
                raw_tar(&[
                    Member::Dir(&d12),
                    Member::Symlink(&d12s, "/home/user/sub"),
                    Member::File(&d12f, pwned),
                ]),
            ),
        ];
        for (i, (what, archive)) in archives.iter().enumerate() {
            let target = format!("/home/user/up{i}");
            let resp = Client::send(
                a.request(Method::PUT, &format!("/v1/sandboxes/{id}/files/tar"))
                    .query(&[("path", &target)])
                    .body(archive.clone()),
            )
            .await;
            eprintln!("{what}: {resp:?}");
            assert!(
                resp.status == 204 || (resp.status == 400 && resp.code() == "invalid_request"),
                "{what}: the upload neither succeeded nor failed cleanly: {resp:?}"
            );
            for keep in ["/home/user/keep.txt", "/home/user/sub/keep.txt"] {
                let r = a.read_file(&id, keep).await;
                assert_eq!(r.text(), "keep\n", "{what} changed {keep}");
            }
            // Inside the sandbox nothing of the archive lives outside the target directory.
            let stray = a
                .sh(
                    &id,
                    &format!("find / -xdev -name '*{r}*' 2>/dev/null; find /home /tmp /root /etc -name '*{r}*' | grep -v '^/home/user/up[0-9]*/' || true"),
                )
                .await;
            assert_eq!(stray.trim(), "", "{what}: members outside the target: {stray}");
        }
        // The plain member of the first archive did land.
        assert_eq!(a.read_file(&id, &format!("/home/user/up0/{}", n(13))).await.text(), "ok");
        // Nothing on the host: not in the usual places, not in the sandbox's own volume outside the
        // target directories.
        let vol = h.env().state().join("pool/sandboxes").join(&id);
        for root in ["/", "/tmp", "/var/tmp", "/root", "/home", "/etc", hd.as_str()] {
            let hits = host_paths_containing(Path::new(root), &r, 0);
            assert!(hits.is_empty(), "archive members on the host: {hits:?}");
        }
        let hits: Vec<PathBuf> = host_paths_containing(h.env().state(), &r, 3)
            .into_iter()
            .filter(|p| !p.starts_with(vol.join("home/user")))
            .collect();
        assert!(hits.is_empty(), "archive members in the state directory: {hits:?}");
        let hits: Vec<PathBuf> = host_paths_containing(&vol, &r, 6)
            .into_iter()
            .filter(|p| {
                !p.strip_prefix(vol.join("home/user"))
                    .ok()
                    .and_then(|rest| rest.components().next())
                    .is_some_and(|c| c.as_os_str().to_string_lossy().starts_with("up"))
            })
            .collect();
        assert!(hits.is_empty(), "archive members outside the target in the volume: {hits:?}");
    });
    assert_eq!(
        snapshot(host_dir.path()),
        host_before,
        "the host directory changed"
    );
}

// ---------------------------------------------------------------------------------------------------
// 3. Exec semantics
// ---------------------------------------------------------------------------------------------------

/// The bytes of an output event (`data` or `data_b64`).
fn event_bytes(event: &Value) -> Vec<u8> {
    use base64::Engine as _;
    if let Some(text) = event["data"].as_str() {
        return text.as_bytes().to_vec();
    }
    let b64 = event["data_b64"]
        .as_str()
        .unwrap_or_else(|| panic!("no data in {event}"));
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("valid base64")
}

/// Checks the shape of a complete exec stream (started first, exit last, offsets contiguous per
/// stream) and returns (stdout or pty bytes, stderr bytes, the exit event).
#[track_caller]
fn check_stream(events: &[Value]) -> (Vec<u8>, Vec<u8>, Value) {
    assert!(events.len() >= 2, "too short: {events:?}");
    assert_eq!(events[0]["type"], "started", "{events:?}");
    assert!(events[0]["pid"].as_u64().is_some_and(|p| p > 0), "{events:?}");
    let last = events.last().expect("last");
    assert_eq!(last["type"], "exit", "{events:?}");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for e in &events[1..events.len() - 1] {
        let buf = match e["type"].as_str() {
            Some("stdout" | "pty") => &mut out,
            Some("stderr") => &mut err,
            other => panic!("unexpected {other:?} in the middle of {events:?}"),
        };
        assert_eq!(
            e["offset"].as_u64(),
            Some(buf.len() as u64),
            "offsets not contiguous: {events:?}"
        );
        buf.extend(event_bytes(e));
    }
    (out, err, last.clone())
}

/// Reads an exec stream until its output contains `needle`; returns everything seen.
async fn read_until(lines: &mut Lines, needle: &str) -> String {
    let mut seen = String::new();
    let deadline = Instant::now() + SOON;
    while !seen.contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(event) = lines.next_within(left).await else {
            panic!("the stream ended before {needle:?}; saw {seen:?}");
        };
        if matches!(event["type"].as_str(), Some("stdout" | "stderr" | "pty")) {
            seen.push_str(&String::from_utf8_lossy(&event_bytes(&event)));
        } else if event["type"] != "started" {
            panic!("{event} before {needle:?}; saw {seen:?}");
        }
    }
    seen
}

#[test]
fn exec_streams_ndjson_sse_and_json() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("exec").await;
        let id = a.create_sandbox(json!({})).await;

        // NDJSON: started, separated output in order, exit last.
        let resp = a
            .exec_stream(
                &id,
                json!({"shell": "echo out1; echo err1 >&2; echo out2; printf err2 >&2; exit 3"}),
                NDJSON,
            )
            .await;
        assert_eq!(resp.status(), 200);
        let ct = resp.headers()["content-type"].to_str().expect("ct").to_owned();
        assert!(ct.starts_with(NDJSON), "{ct}");
        let events = Lines::new(resp).rest(SOON).await;
        let (out, err, exit) = check_stream(&events);
        assert_eq!(String::from_utf8_lossy(&out), "out1\nout2\n");
        assert_eq!(String::from_utf8_lossy(&err), "err1\nerr2");
        assert_eq!(exit["exit_code"], 3);
        assert_eq!(exit["signal"], Value::Null);
        assert_eq!(exit["timed_out"], false);
        // No Accept header: NDJSON too.
        let resp = Client::send(
            a.request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                .json(&json!({"argv": ["echo", "plain"]})),
        )
        .await;
        assert!(resp.content_type.starts_with(NDJSON), "{resp:?}");
        assert_eq!(resp.text().lines().count(), 3, "{resp:?}");

        // Signals: 128+N.
        for (script, code, signal) in [("kill -TERM $$", 143, 15), ("kill -KILL $$", 137, 9), ("kill -INT $$", 130, 2)] {
            let events = Lines::new(a.exec_stream(&id, json!({"shell": script}), NDJSON).await)
                .rest(SOON)
                .await;
            let (_, _, exit) = check_stream(&events);
            assert_eq!(exit["exit_code"], code, "{script}: {exit}");
            assert_eq!(exit["signal"], signal, "{script}: {exit}");
        }
        // A timeout kills the process and says so.
        let started = Instant::now();
        let events = Lines::new(
            a.exec_stream(&id, json!({"argv": ["sleep", "1000"], "timeout_ms": 300}), NDJSON)
                .await,
        )
        .rest(SOON)
        .await;
        let (_, _, exit) = check_stream(&events);
        assert_eq!(exit["timed_out"], true, "{exit}");
        assert!(exit["exit_code"].as_i64().is_some_and(|c| c > 128), "{exit}");
        assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
        let exit = a
            .exec_json(&id, json!({"argv": ["true"], "timeout_ms": 60000}))
            .await;
        assert_eq!(exit["exit"]["timed_out"], false);
        // Bytes that are not UTF-8 arrive as base64.
        let events = Lines::new(a.exec_stream(&id, json!({"shell": "printf '\\377\\376'"}), NDJSON).await)
            .rest(SOON)
            .await;
        let (out, _, _) = check_stream(&events);
        assert_eq!(out, vec![0xff, 0xfe]);
        assert!(events[1]["data_b64"].is_string(), "{events:?}");

        // SSE framing: `event: <type>` and one `data:` line per event.
        let resp = a
            .exec_stream(&id, json!({"shell": "echo one; echo two >&2; exit 5"}), SSE)
            .await;
        assert_eq!(resp.status(), 200);
        let ct = resp.headers()["content-type"].to_str().expect("ct").to_owned();
        assert!(ct.starts_with(SSE), "{ct}");
        let text = tokio::time::timeout(SOON, resp.text())
            .await
            .expect("SSE ends")
            .expect("SSE body");
        let mut events = Vec::new();
        for frame in text.split("\n\n").filter(|f| !f.trim().is_empty()) {
            let lines: Vec<&str> = frame.lines().filter(|l| !l.starts_with(':')).collect();
            if lines.is_empty() {
                continue;
            }
            assert_eq!(lines.len(), 2, "one event and one data line: {frame:?}");
            let name = lines[0].strip_prefix("event: ").expect("event line");
            let data: Value = serde_json::from_str(lines[1].strip_prefix("data: ").expect("data line"))
                .expect("JSON data");
            assert_eq!(data["type"], name, "{frame:?}");
            events.push(data);
        }
        let (out, err, exit) = check_stream(&events);
        assert_eq!((out.as_slice(), err.as_slice()), (&b"one\n"[..], &b"two\n"[..]));
        assert_eq!(exit["exit_code"], 5);

        // One JSON document at the end.
        let r = a
            .exec_json(&id, json!({"shell": "echo hi; echo there >&2; exit 4", "env": {"X": "1"}}))
            .await;
        assert!(r["pid"].as_u64().is_some_and(|p| p > 0), "{r}");
        assert_eq!(r["stdout"], "hi\n");
        assert_eq!(r["stderr"], "there\n");
        assert_eq!(r["exit"]["exit_code"], 4);
        for key in ["duration_ms", "cpu_time_us", "max_rss_kib"] {
            assert!(r["exit"][key].is_u64(), "{key} in {r}");
        }
        // env, cwd and user apply per exec.
        let r = a
            .exec_json(
                &id,
                json!({"shell": "echo $GREETING; pwd; id -un", "env": {"GREETING": "hello"}, "cwd": "/tmp", "user": "root"}),
            )
            .await;
        assert_eq!(r["stdout"], "hello\n/tmp\nroot\n", "{r}");
    });
}

#[test]
fn exec_stdin() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("stdin").await;
        let id = a.create_sandbox(json!({})).await;

        let r = a
            .exec_json(&id, json!({"argv": ["cat"], "stdin": "hello stdin\n"}))
            .await;
        assert_eq!(r["stdout"], "hello stdin\n");
        assert_eq!(r["exit"]["exit_code"], 0);
        // Without `stdin` the process reads end-of-file at once.
        let r = a.exec_json(&id, json!({"argv": ["wc", "-c"]})).await;
        assert_eq!(r["stdout"].as_str().map(str::trim), Some("0"), "{r}");

        // Kept open: written through the stdin endpoint, closed with close=true.
        let mut lines = Lines::new(
            a.exec_stream(&id, json!({"argv": ["cat"], "stdin_open": true}), NDJSON)
                .await,
        );
        let started = lines.next_within(SOON).await.expect("started");
        let pid = started["pid"].as_u64().expect("pid");
        let stdin = format!("/v1/sandboxes/{id}/processes/{pid}/stdin");
        Client::send(a.request(Method::POST, &stdin).body("abc\n"))
            .await
            .ok(204);
        read_until(&mut lines, "abc\n").await;
        Client::send(
            a.request(Method::POST, &stdin)
                .query(&[("close", "true")])
                .body("def\n"),
        )
        .await
        .ok(204);
        read_until(&mut lines, "def\n").await;
        let rest = lines.rest(SOON).await;
        assert_eq!(
            rest.last().map(|e| e["type"].clone()),
            Some(json!("exit")),
            "{rest:?}"
        );
        assert_eq!(rest.last().expect("exit")["exit_code"], 0);
        // Its stdin is gone with it.
        let r = Client::send(a.request(Method::POST, &stdin).body("late")).await;
        r.err(404, "process_not_found");
        Client::send(
            a.request(Method::POST, &format!("/v1/sandboxes/{id}/processes/99999/stdin"))
                .body("x"),
        )
        .await
        .err(404, "process_not_found");

        // A large stdin is streamed through in pieces.
        let mut lines = Lines::new(
            a.exec_stream(&id, json!({"argv": ["wc", "-c"], "stdin_open": true}), NDJSON)
                .await,
        );
        let pid = lines.next_within(SOON).await.expect("started")["pid"]
            .as_u64()
            .expect("pid");
        let big = vec![b'x'; 3 << 20];
        Client::send(
            a.request(Method::POST, &format!("/v1/sandboxes/{id}/processes/{pid}/stdin"))
                .query(&[("close", "true")])
                .body(big),
        )
        .await
        .ok(204);
        let rest = lines.rest(SOON).await;
        let out: String = rest
            .iter()
            .filter(|e| e["type"] == "stdout")
            .map(|e| String::from_utf8_lossy(&event_bytes(e)).into_owned())
            .collect();
        assert_eq!(out.trim(), (3 << 20).to_string());
    });
}

/// The process `pid` as listed, once `cond` holds for it.
async fn process_when(a: &Client, id: &str, pid: u64, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    poll(SOON, what, || async {
        let list = a.get(&format!("/v1/sandboxes/{id}/processes")).await.ok(200);
        list["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["pid"] == pid)
            .filter(|p| cond(p))
            .cloned()
    })
    .await
}

/// The exit of `pid` once the process list says it ended.
async fn exit_of(a: &Client, id: &str, pid: u64) -> Value {
    process_when(a, id, pid, &format!("process {pid} to exit"), |p| {
        p["running"] == false
    })
    .await["exit"]
        .clone()
}

#[test]
fn background_reattach_signals_and_kill() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("background").await;
        let id = a.create_sandbox(json!({})).await;
        let output = |pid: u64| format!("/v1/sandboxes/{id}/processes/{pid}/output");

        let pid = u64::from(
            a.exec_background(
                &id,
                json!({"shell": "for i in $(seq 1 300); do echo line$i; done; echo err-line >&2; exec sleep 1000", "tag": "lines"}),
            )
            .await,
        );
        let expected: String = (1..=300).map(|i| format!("line{i}\n")).collect();
        // `follow=false` answers with what is buffered and ends while the process still runs.
        let full = poll(SOON, "all 300 lines", || async {
            let r = Client::send(
                a.request(Method::GET, &output(pid))
                    .query(&[("follow", "false")])
                    .header("accept", JSON),
            )
            .await
            .ok(200);
            (r["stdout"].as_str() == Some(expected.as_str()) && r["stderr"] == "err-line\n").then_some(r)
        })
        .await;
        assert_eq!(full["exit"], Value::Null, "{full}");
        let listed = process_when(&a, &id, pid, "the background process", |p| p["running"] == true).await;
        assert_eq!(listed["tag"], "lines");
        assert_eq!(listed["command"]["kind"], "shell");
        assert_eq!(listed["pty"], false);

        // Replay from 0 and from the middle (not on a line boundary): the suffix, offsets included.
        for from in [0usize, expected.len() / 2 + 3, expected.len()] {
            let resp = a
                .request(Method::GET, &output(pid))
                .query(&[("follow", "false"), ("stdout_from", from.to_string().as_str()), ("stderr_from", "4")])
                .send()
                .await
                .expect("attach");
            assert_eq!(resp.status(), 200);
            let events = Lines::new(resp).rest(SOON).await;
            assert!(events.iter().all(|e| e["type"] != "exit"), "{events:?}");
            let mut out = Vec::new();
            let mut err = Vec::new();
            for e in &events {
                match e["type"].as_str() {
                    Some("stdout") => {
                        assert_eq!(e["offset"].as_u64(), Some((from + out.len()) as u64), "{e}");
                        out.extend(event_bytes(e));
                    }
                    Some("stderr") => {
                        assert_eq!(e["offset"].as_u64(), Some((4 + err.len()) as u64), "{e}");
                        err.extend(event_bytes(e));
                    }
                    Some("started") => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
            assert_eq!(String::from_utf8_lossy(&out), expected[from..], "replay from {from}");
            assert_eq!(String::from_utf8_lossy(&err), "line\n");
        }
        // Following: the stream goes on until the process is killed, and ends with its exit.
        let mut follow = Lines::new(
            a.request(Method::GET, &output(pid))
                .query(&[("stdout_from", expected.len().to_string().as_str()), ("stderr_from", "9")])
                .send()
                .await
                .expect("attach"),
        );
        assert_eq!(follow.next_within(SOON).await.expect("started")["type"], "started");
        let waiting = tokio::time::timeout(Duration::from_millis(300), follow.next()).await;
        assert!(waiting.is_err(), "a followed stream of a running process ended: {waiting:?}");
        a.post(&format!("/v1/sandboxes/{id}/processes/{pid}/kill"), Value::Null)
            .await
            .ok(204);
        let rest = follow.rest(SOON).await;
        assert_eq!(rest.len(), 1, "{rest:?}");
        assert_eq!(rest[0]["type"], "exit");
        assert_eq!(rest[0]["signal"], 9);
        assert_eq!(rest[0]["exit_code"], 137);
        // Replaying a finished process gives its output and its exit.
        let done = Client::send(a.request(Method::GET, &output(pid)).header("accept", JSON))
            .await
            .ok(200);
        assert_eq!(done["stdout"].as_str(), Some(expected.as_str()));
        assert_eq!(done["exit"]["exit_code"], 137);
        assert_eq!(exit_of(&a, &id, pid).await["signal"], 9);

        // The signal endpoint, by name and by number.
        for (signal, number) in [(json!("TERM"), 15), (json!("SIGINT"), 2), (json!(1), 1), (json!("USR1"), 10)] {
            let pid = u64::from(a.exec_background(&id, json!({"argv": ["sleep", "1000"]})).await);
            process_when(&a, &id, pid, "sleep to run", |p| p["running"] == true).await;
            a.post(&format!("/v1/sandboxes/{id}/processes/{pid}/signal"), json!({"signal": signal}))
                .await
                .ok(204);
            let exit = exit_of(&a, &id, pid).await;
            assert_eq!(exit["signal"], number, "{signal}: {exit}");
            assert_eq!(exit["exit_code"], 128 + number, "{signal}: {exit}");
        }
        let pid = u64::from(a.exec_background(&id, json!({"argv": ["sleep", "1000"]})).await);
        let signal = format!("/v1/sandboxes/{id}/processes/{pid}/signal");
        a.post(&signal, json!({"signal": "BOGUS"})).await.err(400, "invalid_request");
        a.post(&signal, json!({"signal": 0})).await.err(400, "invalid_request");
        a.post(&signal, json!({"signal": 65})).await.err(400, "invalid_request");
        a.post(&format!("/v1/sandboxes/{id}/processes/99999/signal"), json!({"signal": "TERM"}))
            .await
            .err(404, "process_not_found");
        // kill takes the whole tree, default KILL; with a body, another signal.
        a.post(&format!("/v1/sandboxes/{id}/processes/{pid}/kill"), json!({"signal": "TERM"}))
            .await
            .ok(204);
        assert_eq!(exit_of(&a, &id, pid).await["exit_code"], 143);
        let tree = u64::from(
            a.exec_background(&id, json!({"shell": "sleep 1001 & sleep 1002 & sleep 1003; wait"}))
                .await,
        );
        let ps = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done";
        poll(SOON, "the tree's children", || async {
            let out = a.sh(&id, ps).await;
            (out.contains("sleep 1001") && out.contains("sleep 1002") && out.contains("sleep 1003")).then_some(())
        })
        .await;
        a.post(&format!("/v1/sandboxes/{id}/processes/{tree}/kill"), Value::Null)
            .await
            .ok(204);
        assert_eq!(exit_of(&a, &id, tree).await["signal"], 9);
        poll(SOON, "the tree's children to die", || async {
            let out = a.sh(&id, ps).await;
            (!out.contains("sleep 100")).then_some(())
        })
        .await;
        // Once the root has exited: signal and resize say so; kill still sweeps what it left behind.
        a.post(&format!("/v1/sandboxes/{id}/processes/{tree}/signal"), json!({"signal": "TERM"}))
            .await
            .err(404, "process_not_found");
        a.post(&format!("/v1/sandboxes/{id}/processes/{tree}/resize"), json!({"rows": 5, "cols": 5}))
            .await
            .err(404, "process_not_found");
        a.post(&format!("/v1/sandboxes/{id}/processes/99999/kill"), Value::Null)
            .await
            .err(404, "process_not_found");
        let parent = u64::from(a.exec_background(&id, json!({"shell": "sleep 1004 & exit 0"})).await);
        assert_eq!(exit_of(&a, &id, parent).await["exit_code"], 0);
        assert!(a.sh(&id, ps).await.contains("sleep 1004"), "the orphan runs");
        a.post(&format!("/v1/sandboxes/{id}/processes/{parent}/kill"), Value::Null)
            .await
            .ok(204);
        poll(SOON, "the orphan to die", || async {
            (!a.sh(&id, ps).await.contains("sleep 1004")).then_some(())
        })
        .await;
    });
}

/// Binary (terminal) messages until their text contains `needle`; returns them.
async fn ws_until(ws: &mut WsStream, needle: &str) -> String {
    let mut seen = String::new();
    let deadline = Instant::now() + SOON;
    while !seen.contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, ws.next())
            .await
            .unwrap_or_else(|_| panic!("no {needle:?} on the WebSocket; saw {seen:?}"))
            .unwrap_or_else(|| panic!("the WebSocket ended before {needle:?}; saw {seen:?}"))
            .expect("WebSocket message");
        match message {
            Message::Binary(b) => seen.push_str(&String::from_utf8_lossy(&b)),
            Message::Text(t) => {
                let v: Value = serde_json::from_str(t.as_str()).expect("JSON text");
                match v["type"].as_str() {
                    Some("stdout" | "stderr" | "pty") => {
                        seen.push_str(&String::from_utf8_lossy(&event_bytes(&v)))
                    }
                    Some("started") => {}
                    _ => panic!("{v} before {needle:?}; saw {seen:?}"),
                }
            }
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("{other:?} before {needle:?}; saw {seen:?}"),
        }
    }
    seen
}

/// The next text message as JSON (skipping pings); `None` on a close frame (returned).
async fn ws_text(ws: &mut WsStream) -> Result<Value, Option<u16>> {
    loop {
        let message = tokio::time::timeout(SOON, ws.next())
            .await
            .expect("a WebSocket message in time")
            .expect("the WebSocket is open")
            .expect("WebSocket message");
        match message {
            Message::Text(t) => return Ok(serde_json::from_str(t.as_str()).expect("JSON text")),
            Message::Close(frame) => return Err(frame.map(|f| u16::from(f.code))),
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn with_query(path: &str, query: &[(&str, &str)]) -> String {
    let url = reqwest::Url::parse_with_params(&format!("http://x{path}"), query).expect("url");
    format!("{path}?{}", url.query().unwrap_or(""))
}

#[test]
fn pty_resize_and_websockets() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("terminals").await;
        let id = a.create_sandbox(json!({})).await;

        // A PTY exec over NDJSON, resized while it runs.
        let mut lines = Lines::new(
            a.exec_stream(
                &id,
                json!({"shell": "stty size; read x; stty size", "pty": {"rows": 24, "cols": 80}, "stdin_open": true}),
                NDJSON,
            )
            .await,
        );
        let pid = lines.next_within(SOON).await.expect("started")["pid"]
            .as_u64()
            .expect("pid");
        read_until(&mut lines, "24 80").await;
        let listed = process_when(&a, &id, pid, "the pty process", |p| p["running"] == true).await;
        assert_eq!(listed["pty"], true);
        a.post(&format!("/v1/sandboxes/{id}/processes/{pid}/resize"), json!({"rows": 50, "cols": 132}))
            .await
            .ok(204);
        a.post(&format!("/v1/sandboxes/{id}/processes/{pid}/resize"), json!({"rows": 0, "cols": 132}))
            .await
            .err(400, "invalid_request");
        Client::send(a.request(Method::POST, &format!("/v1/sandboxes/{id}/processes/{pid}/stdin")).body("\n"))
            .await
            .ok(204);
        read_until(&mut lines, "50 132").await;
        let rest = lines.rest(SOON).await;
        assert_eq!(rest.last().expect("exit")["exit_code"], 0, "{rest:?}");
        assert!(rest.iter().all(|e| e["type"] != "stdout" && e["type"] != "stderr"), "{rest:?}");
        // Resizing a process without a terminal is refused (not a server error).
        let plain = a.exec_background(&id, json!({"argv": ["sleep", "1000"]})).await;
        let r = a
            .post(&format!("/v1/sandboxes/{id}/processes/{plain}/resize"), json!({"rows": 5, "cols": 5}))
            .await;
        assert!((400..500).contains(&r.status), "resize without a pty: {r:?}");

        // The exec WebSocket: the request first, then stdin as text, binary and base64; errors are
        // answered as events and the session goes on; close_stdin ends `cat`.
        let mut ws = a.ws(&format!("/v1/sandboxes/{id}/exec/ws")).await.expect("upgrade");
        ws.send(Message::text(json!({"argv": ["cat"], "stdin_open": true}).to_string()))
            .await
            .expect("send");
        let started = ws_text(&mut ws).await.expect("started");
        assert_eq!(started["type"], "started");
        ws.send(Message::text(json!({"type": "stdin", "data": "ping\n"}).to_string()))
            .await
            .expect("send");
        ws_until(&mut ws, "ping\n").await;
        ws.send(Message::binary(b"bin\n".to_vec())).await.expect("send");
        ws_until(&mut ws, "bin\n").await;
        ws.send(Message::text(json!({"type": "stdin_b64", "data": "YjY0Cg=="}).to_string()))
            .await
            .expect("send");
        ws_until(&mut ws, "b64\n").await;
        ws.send(Message::text("not json")).await.expect("send");
        let error = ws_text(&mut ws).await.expect("error event");
        assert_eq!((error["type"].as_str(), error["code"].as_str()), (Some("error"), Some("invalid_request")));
        ws.send(Message::text(json!({"type": "close_stdin"}).to_string()))
            .await
            .expect("send");
        let exit = ws_text(&mut ws).await.expect("exit");
        assert_eq!((exit["type"].as_str(), exit["exit_code"].as_i64()), (Some("exit"), Some(0)), "{exit}");
        assert_eq!(ws_text(&mut ws).await.expect_err("close"), Some(1000));
        let _ = ws.close(None).await;
        // A bad first message: an error event and a policy close.
        let mut ws = a.ws(&format!("/v1/sandboxes/{id}/exec/ws")).await.expect("upgrade");
        ws.send(Message::text(json!({"argv": []}).to_string())).await.expect("send");
        let error = ws_text(&mut ws).await.expect("error event");
        assert_eq!(error["code"], "invalid_request", "{error}");
        let close = ws_text(&mut ws).await.expect_err("close");
        assert!(close == Some(1008) || close == Some(1011), "{close:?}");

        // The terminal WebSocket: binary frames both ways, resize as text, exit as text, then close.
        let mut ws = a
            .ws(&with_query(
                &format!("/v1/sandboxes/{id}/pty"),
                &[("rows", "30"), ("cols", "100"), ("cmd", "stty size; read x; stty size; echo $TERM; exit 7")],
            ))
            .await
            .expect("upgrade");
        ws_until(&mut ws, "30 100").await;
        ws.send(Message::text(json!({"type": "resize", "rows": 40, "cols": 120}).to_string()))
            .await
            .expect("send");
        ws.send(Message::binary(b"\n".to_vec())).await.expect("send");
        ws_until(&mut ws, "xterm-256color").await;
        let exit = loop {
            match ws.next().await.expect("message").expect("ok") {
                Message::Text(t) => break serde_json::from_str::<Value>(t.as_str()).expect("JSON"),
                Message::Binary(b) => assert!(
                    !String::from_utf8_lossy(&b).contains("30 100"),
                    "the old size after the resize"
                ),
                _ => {}
            }
        };
        assert_eq!((exit["type"].as_str(), exit["exit_code"].as_i64()), (Some("exit"), Some(7)), "{exit}");
        assert_eq!(ws_text(&mut ws).await.expect_err("close"), Some(1000));
        let _ = ws.close(None).await;
        // The default terminal is a login shell.
        let mut ws = a.ws(&format!("/v1/sandboxes/{id}/pty")).await.expect("upgrade");
        ws.send(Message::binary(b"stty size; exit 3\n".to_vec())).await.expect("send");
        ws_until(&mut ws, "24 80").await;
        let exit = loop {
            if let Message::Text(t) = ws.next().await.expect("message").expect("ok") {
                break serde_json::from_str::<Value>(t.as_str()).expect("JSON");
            }
        };
        assert_eq!(exit["exit_code"], 3, "{exit}");
        // A missing sandbox is refused before the upgrade.
        let (status, body) = a
            .ws(&format!("/v1/sandboxes/{NO_SUCH_SANDBOX}/pty"))
            .await
            .expect_err("refused");
        assert_eq!((status, body["code"].as_str()), (404, Some("sandbox_not_found")));
    });
}

#[test]
fn a_foreground_client_that_disconnects_kills_its_process() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("leaver").await;
        let id = a.create_sandbox(json!({})).await;
        for accept in [NDJSON, SSE] {
            let resp = a
                .exec_stream(&id, json!({"argv": ["sleep", "1000"], "tag": "fg"}), accept)
                .await;
            let mut body = resp;
            let first = tokio::time::timeout(SOON, body.chunk())
                .await
                .expect("first event")
                .expect("chunk")
                .expect("not empty");
            let text = String::from_utf8_lossy(&first).into_owned();
            let json_text = text
                .lines()
                .find_map(|l| {
                    l.strip_prefix("data: ")
                        .or(Some(l).filter(|l| l.starts_with('{')))
                })
                .expect("an event");
            let pid = serde_json::from_str::<Value>(json_text).expect("started")["pid"]
                .as_u64()
                .expect("pid");
            process_when(&a, &id, pid, "the foreground process", |p| p["running"] == true).await;
            drop(body);
            let exit = exit_of(&a, &id, pid).await;
            assert_eq!(exit["signal"], 9, "{accept}: {exit}");
        }
        // Waiting for a collected JSON answer is a foreground client too.
        let waiting = {
            let a = a.clone();
            let id = id.clone();
            tokio::spawn(async move {
                a.exec_json(&id, json!({"argv": ["sleep", "1000"], "tag": "fg-json"}))
                    .await
            })
        };
        let pid = poll(SOON, "the JSON exec's process", || async {
            let list = a.get(&format!("/v1/sandboxes/{id}/processes")).await.ok(200);
            list["processes"]
                .as_array()
                .expect("processes")
                .iter()
                .find(|p| p["tag"] == "fg-json" && p["running"] == true)
                .and_then(|p| p["pid"].as_u64())
        })
        .await;
        waiting.abort();
        let _ = waiting.await;
        let exit = exit_of(&a, &id, pid).await;
        assert_eq!(exit["signal"], 9, "JSON: {exit}");
        // The same over the exec WebSocket and the terminal.
        let mut ws = a
            .ws(&format!("/v1/sandboxes/{id}/exec/ws"))
            .await
            .expect("upgrade");
        ws.send(Message::text(json!({"argv": ["sleep", "1000"]}).to_string()))
            .await
            .expect("send");
        let pid = ws_text(&mut ws).await.expect("started")["pid"]
            .as_u64()
            .expect("pid");
        drop(ws);
        assert_eq!(exit_of(&a, &id, pid).await["signal"], 9);
        let ws = a
            .ws(&with_query(
                &format!("/v1/sandboxes/{id}/pty"),
                &[("cmd", "exec sleep 1000")],
            ))
            .await
            .expect("upgrade");
        let running = poll(SOON, "the terminal's process", || async {
            let list = a.get(&format!("/v1/sandboxes/{id}/processes")).await.ok(200);
            list["processes"]
                .as_array()
                .expect("processes")
                .iter()
                .find(|p| p["pty"] == true && p["running"] == true)
                .and_then(|p| p["pid"].as_u64())
        })
        .await;
        drop(ws);
        assert_eq!(exit_of(&a, &id, running).await["signal"], 9);
        // A background process outlives its re-attached reader.
        let pid = u64::from(a.exec_background(&id, json!({"argv": ["sleep", "1000"]})).await);
        let mut follow = Lines::new(
            a.request(Method::GET, &format!("/v1/sandboxes/{id}/processes/{pid}/output"))
                .send()
                .await
                .expect("attach"),
        );
        follow.next_within(SOON).await.expect("started");
        drop(follow);
        // Give a wrongful kill time to happen, then check it did not: the listing must still say
        // running after the reaper and the monitor have had several chances.
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            let p = process_when(&a, &id, pid, "the background process", |_| true).await;
            assert_eq!(
                p["running"], true,
                "a background process died with its reader: {p}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

// ---------------------------------------------------------------------------------------------------
// 4. Files
// ---------------------------------------------------------------------------------------------------

/// A kB figure from /proc/self/status.
fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Deterministic, incompressible-looking bytes: chunk `i` of `CHUNK`.
fn pseudo_random_chunk(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// SHA-256 (hex) of the test's 64 MiB file, computed by the host's `sha256sum` from a pipe.
fn host_sha256(chunks: u64, chunk: usize) -> String {
    use std::io::Write as _;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum runs");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        for i in 0..chunks {
            stdin
                .write_all(&pseudo_random_chunk(i, chunk))
                .expect("feed sha256sum");
        }
    }
    let out = child.wait_with_output().expect("sha256sum");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("a digest")
        .to_owned()
}

#[test]
fn a_64_mib_file_streams_both_ways() {
    const CHUNK: usize = 1 << 20;
    const CHUNKS: u64 = 64;
    let h = Harness::start();
    let expected_sha = host_sha256(CHUNKS, CHUNK);
    h.block_on(async {
        let a = h.admin.new_tenant("bulk").await;
        let id = a.create_sandbox(json!({"limits": {"disk": "1G"}})).await;

        // Peak RSS of this process (server and client both live here) is reset, then measured.
        let rss_before = proc_status_kib("VmRSS:");
        let hwm_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        let body = futures_util::stream::iter(0..CHUNKS).then(|i| async move {
            Ok::<_, std::io::Error>(bytes::Bytes::from(pseudo_random_chunk(i, CHUNK)))
        });
        let written = a
            .write_file(&id, "/home/user/big.bin", reqwest::Body::wrap_stream(body))
            .await
            .ok(200);
        assert_eq!(written["bytes"], CHUNKS * CHUNK as u64);
        // Read back as a stream and compared byte for byte with what was sent.
        let mut resp = a
            .request(Method::GET, &format!("/v1/sandboxes/{id}/files"))
            .query(&[("path", "/home/user/big.bin")])
            .send()
            .await
            .expect("download");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.content_length(), Some(CHUNKS * CHUNK as u64));
        let mut offset = 0usize;
        let mut current: (u64, Vec<u8>) = (0, pseudo_random_chunk(0, CHUNK));
        while let Some(chunk) = tokio::time::timeout(SOON, resp.chunk())
            .await
            .expect("download progresses")
            .expect("download chunk")
        {
            for &byte in chunk.iter() {
                let (index, within) = ((offset / CHUNK) as u64, offset % CHUNK);
                assert!(index < CHUNKS, "the download is longer than the file");
                if current.0 != index {
                    current = (index, pseudo_random_chunk(index, CHUNK));
                }
                assert_eq!(byte, current.1[within], "the download differs at byte {offset}");
                offset += 1;
            }
        }
        assert_eq!(offset as u64, CHUNKS * CHUNK as u64, "the download is short");
        let peak = proc_status_kib("VmHWM:");
        eprintln!(
            "RSS before {rss_before} KiB, peak during the transfer {peak} KiB (peak reset: {hwm_reset})"
        );
        // Only meaningful when this test has the process to itself (nextest's process per test);
        // under `cargo test` other tests' sandboxes and streams share the figure.
        let alone = std::env::var("NEXTEST_EXECUTION_MODE").is_ok_and(|m| m == "process-per-test");
        if hwm_reset && alone {
            let grown = peak.saturating_sub(rss_before);
            assert!(
                grown < 32 * 1024,
                "the 64 MiB round trip grew the process by {grown} KiB: the file was buffered"
            );
        } else {
            skip("the memory check: it needs nextest's process per test and /proc/self/clear_refs");
        }
        // The sandbox holds the same bytes.
        let sum = a.sh(&id, "sha256sum /home/user/big.bin | cut -d' ' -f1").await;
        assert_eq!(sum.trim(), expected_sha);
        // The audit row counts the bytes.
        let rows = a.audit_rows(&[("action", "file.write")]).await;
        assert_eq!(
            rows.last().expect("file.write row")["detail"]["bytes_in"],
            CHUNKS * CHUNK as u64
        );
    });
}

async fn fstat(a: &Client, id: &str, path: &str) -> Reply {
    a.get_q(&format!("/v1/sandboxes/{id}/files/stat"), &[("path", path)])
        .await
}

async fn flist(a: &Client, id: &str, path: &str) -> Reply {
    a.get_q(&format!("/v1/sandboxes/{id}/files/list"), &[("path", path)])
        .await
}

async fn fmkdir(a: &Client, id: &str, body: Value) -> Reply {
    a.post(&format!("/v1/sandboxes/{id}/files/mkdir"), body).await
}

async fn frename(a: &Client, id: &str, from: &str, to: &str) -> Reply {
    a.post(
        &format!("/v1/sandboxes/{id}/files/rename"),
        json!({"from": from, "to": to}),
    )
    .await
}

#[test]
fn file_operations_and_their_errors() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("files").await;
        let id = a.create_sandbox(json!({})).await;
        let files = format!("/v1/sandboxes/{id}/files");

        // mkdir
        let made = fmkdir(&a, &id, json!({"path": "/home/user/t"})).await.ok(201);
        assert_eq!(
            (made["kind"].as_str(), made["path"].as_str()),
            (Some("dir"), Some("/home/user/t"))
        );
        assert_eq!(made["mode"].as_u64().map(|m| m & 0o7777), Some(0o755));
        assert_eq!(made["uid"], 1000, "owned by the sandbox's user: {made}");
        fmkdir(&a, &id, json!({"path": "/home/user/t"}))
            .await
            .err(409, "already_exists");
        fmkdir(&a, &id, json!({"path": "/home/user/t", "parents": true}))
            .await
            .ok(201);
        fmkdir(&a, &id, json!({"path": "/home/user/nope/deeper"}))
            .await
            .err(404, "file_not_found");
        let deep = fmkdir(
            &a,
            &id,
            json!({"path": "/home/user/t/a/b/c", "parents": true, "mode": 0o700}),
        )
        .await
        .ok(201);
        assert_eq!(deep["mode"].as_u64().map(|m| m & 0o7777), Some(0o700));
        let owned = fmkdir(&a, &id, json!({"path": "/home/user/t/rootdir", "user": "root"}))
            .await
            .ok(201);
        assert_eq!(owned["uid"], 0);

        // write / read / stat / list
        let w = Client::send(
            a.request(Method::PUT, &files)
                .query(&[("path", "/home/user/t/a.txt"), ("mode", "600")])
                .body("hello"),
        )
        .await
        .ok(200);
        assert_eq!(w, json!({"path": "/home/user/t/a.txt", "bytes": 5}));
        assert_eq!(a.read_file(&id, "/home/user/t/a.txt").await.text(), "hello");
        let s = fstat(&a, &id, "/home/user/t/a.txt").await.ok(200);
        assert_eq!(s["kind"], "file");
        assert_eq!(s["size"], 5);
        assert_eq!(s["name"], "a.txt");
        assert_eq!(s["mode"].as_u64().map(|m| m & 0o7777), Some(0o600));
        assert_eq!(s["uid"], 1000);
        assert!(s["modified_at"].as_str().is_some_and(|t| t.ends_with('Z')), "{s}");
        // Replacing truncates; an empty body makes an empty file.
        a.write_file(&id, "/home/user/t/a.txt", "hi").await.ok(200);
        assert_eq!(a.read_file(&id, "/home/user/t/a.txt").await.text(), "hi");
        a.write_file(&id, "/home/user/t/empty", Vec::new()).await.ok(200);
        let empty = a.read_file(&id, "/home/user/t/empty").await;
        assert_eq!((empty.status, empty.body.len()), (200, 0));
        Client::send(
            a.request(Method::PUT, &files)
                .query(&[("path", "/home/user/t/x"), ("mode", "rw-r--r--")])
                .body("x"),
        )
        .await
        .err(400, "invalid_request");
        a.sh(&id, "ln -s /etc/passwd /home/user/t/link").await;
        let l = fstat(&a, &id, "/home/user/t/link").await.ok(200);
        assert_eq!(
            (l["kind"].as_str(), l["symlink_target"].as_str()),
            (Some("symlink"), Some("/etc/passwd"))
        );
        let listing = flist(&a, &id, "/home/user/t").await.ok(200);
        let entries = listing["entries"].as_array().expect("entries");
        let names: Vec<&str> = entries.iter().filter_map(|e| e["name"].as_str()).collect();
        assert_eq!(
            names,
            ["a", "a.txt", "empty", "link", "rootdir"],
            "sorted by name"
        );
        for e in entries {
            assert_eq!(
                e["path"].as_str(),
                Some(format!("/home/user/t/{}", e["name"].as_str().expect("name")).as_str())
            );
        }
        assert_eq!(
            entries
                .iter()
                .map(|e| e["kind"].as_str().unwrap_or(""))
                .collect::<Vec<_>>(),
            ["dir", "file", "file", "symlink", "dir"]
        );
        assert_eq!(
            flist(&a, &id, "/home/user/t/").await.ok(200)["entries"]
                .as_array()
                .map(Vec::len),
            Some(5)
        );

        // error codes
        a.read_file(&id, "/home/user/t/missing")
            .await
            .err(404, "file_not_found");
        fstat(&a, &id, "/home/user/t/missing")
            .await
            .err(404, "file_not_found");
        flist(&a, &id, "/home/user/t/missing")
            .await
            .err(404, "file_not_found");
        a.read_file(&id, "/home/user/t").await.err(400, "is_a_directory");
        flist(&a, &id, "/home/user/t/a.txt")
            .await
            .err(400, "not_a_directory");
        a.write_file(&id, "/home/user/t/a.txt/sub", "x")
            .await
            .err(400, "not_a_directory");
        a.write_file(&id, "/home/user/t", "x")
            .await
            .err(400, "is_a_directory");
        a.write_file(&id, "/home/user/t/missing/x", "x")
            .await
            .err(404, "file_not_found");
        fmkdir(&a, &id, json!({"path": "/home/user/t/a.txt"}))
            .await
            .err(409, "already_exists");
        fmkdir(
            &a,
            &id,
            json!({"path": "/home/user/t/a.txt/sub", "parents": true}),
        )
        .await
        .err(400, "not_a_directory");
        a.delete_q(&files, &[("path", "/home/user/t")])
            .await
            .err(409, "directory_not_empty");
        a.delete_q(&files, &[("path", "/home/user/t/missing")])
            .await
            .err(404, "file_not_found");
        a.delete_q(&files, &[("path", "/")])
            .await
            .err(400, "invalid_path");
        a.delete_q(&files, &[("path", "/"), ("recursive", "true")])
            .await
            .err(400, "invalid_path");
        a.get_q(&format!("{files}/tar"), &[("path", "/home/user/t/a.txt")])
            .await
            .err(400, "not_a_directory");
        a.get_q(&format!("{files}/tar"), &[("path", "/home/user/t/missing")])
            .await
            .err(404, "file_not_found");
        // The sandbox's own permissions: its user cannot write a root-only directory... but the
        // file API acts as the sandbox's root, so only read-only places refuse.
        let r = a.write_file(&id, "/usr/bin/paddock-was-here", "x").await;
        assert_eq!((r.status, r.code().as_str()), (403, "permission_denied"), "{r:?}");

        // rename
        let moved = frename(&a, &id, "/home/user/t/a.txt", "/home/user/t/b.txt")
            .await
            .ok(200);
        assert_eq!(
            (moved["path"].as_str(), moved["name"].as_str()),
            (Some("/home/user/t/b.txt"), Some("b.txt"))
        );
        fstat(&a, &id, "/home/user/t/a.txt")
            .await
            .err(404, "file_not_found");
        assert_eq!(a.read_file(&id, "/home/user/t/b.txt").await.text(), "hi");
        frename(&a, &id, "/home/user/t/missing", "/home/user/t/c")
            .await
            .err(404, "file_not_found");
        frename(&a, &id, "/home/user/t/b.txt", "/home/user/t/a")
            .await
            .err(400, "is_a_directory");
        frename(&a, &id, "/home/user/t/a", "/home/user/t/b.txt")
            .await
            .err(400, "not_a_directory");
        a.write_file(&id, "/home/user/t/a/inner", "x").await.ok(200);
        frename(&a, &id, "/home/user/t/rootdir", "/home/user/t/a")
            .await
            .err(409, "directory_not_empty");
        // Over an existing file: replaced.
        a.write_file(&id, "/home/user/t/c.txt", "c").await.ok(200);
        frename(&a, &id, "/home/user/t/c.txt", "/home/user/t/b.txt")
            .await
            .ok(200);
        assert_eq!(a.read_file(&id, "/home/user/t/b.txt").await.text(), "c");

        // delete
        a.delete_q(&files, &[("path", "/home/user/t/b.txt")])
            .await
            .ok(204);
        a.delete_q(&files, &[("path", "/home/user/t/rootdir")])
            .await
            .ok(204);
        a.delete_q(&files, &[("path", "/home/user/t/link")]).await.ok(204);
        assert_eq!(
            a.read_file(&id, "/etc/passwd").await.status,
            200,
            "removing a link spares its target"
        );
        a.delete_q(&files, &[("path", "/home/user/t"), ("recursive", "true")])
            .await
            .ok(204);
        fstat(&a, &id, "/home/user/t").await.err(404, "file_not_found");
    });
}

#[test]
fn tar_round_trip_of_a_tree() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("tarball").await;
        let id = a.create_sandbox(json!({})).await;
        a.sh(
            &id,
            "set -e; mkdir -p /home/user/tree/sub/deeper /home/user/tree/empty
             echo alpha > /home/user/tree/a.txt; chmod 640 /home/user/tree/a.txt
             printf 'beta' > /home/user/tree/sub/b.txt
             head -c 300000 /dev/urandom > /home/user/tree/sub/deeper/c.bin
             printf '#!/bin/sh\\necho run\\n' > /home/user/tree/run.sh; chmod 755 /home/user/tree/run.sh
             ln -s sub/b.txt /home/user/tree/link",
        )
        .await;
        let resp = a
            .request(Method::GET, &format!("/v1/sandboxes/{id}/files/tar"))
            .query(&[("path", "/home/user/tree")])
            .send()
            .await
            .expect("download");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "application/x-tar");
        let archive = resp.bytes().await.expect("archive");
        // What the archive holds, read with the tar crate.
        let mut members = BTreeMap::new();
        let mut reader = tar::Archive::new(archive.as_ref());
        for entry in reader.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            let path = entry.path().expect("path").to_string_lossy().trim_start_matches("./").to_owned();
            let kind = entry.header().entry_type();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).expect("data");
            let link = entry
                .link_name()
                .ok()
                .flatten()
                .map(|l| l.to_string_lossy().into_owned());
            members.insert(path, (kind, data, link, entry.header().mode().unwrap_or(0)));
        }
        let names: BTreeSet<&str> = members.keys().map(String::as_str).filter(|n| !n.is_empty()).collect();
        for expected in ["a.txt", "sub/b.txt", "sub/deeper/c.bin", "empty/", "run.sh", "link"] {
            let found = names.contains(expected) || names.contains(expected.trim_end_matches('/'));
            assert!(found, "{expected} missing from {names:?}");
        }
        assert_eq!(members["a.txt"].1, b"alpha\n");
        assert_eq!(members["a.txt"].3 & 0o777, 0o640);
        assert_eq!(members["sub/deeper/c.bin"].1.len(), 300_000);
        assert_eq!(members["link"].0, tar::EntryType::Symlink);
        assert_eq!(members["link"].2.as_deref(), Some("sub/b.txt"));

        // Upload it elsewhere (the target is created) and compare the trees inside the sandbox.
        Client::send(
            a.request(Method::PUT, &format!("/v1/sandboxes/{id}/files/tar"))
                .query(&[("path", "/home/user/copy/of/tree")])
                .body(archive.to_vec()),
        )
        .await
        .ok(204);
        let digest = "cd \"$1\" && find . | sort && find . -type f -exec sha256sum {} + | sort && find . -printf '%p %m %y %l\\n' | sort";
        let original = a
            .exec_json(&id, json!({"argv": ["sh", "-c", digest, "sh", "/home/user/tree"]}))
            .await;
        let copy = a
            .exec_json(&id, json!({"argv": ["sh", "-c", digest, "sh", "/home/user/copy/of/tree"]}))
            .await;
        assert_eq!(original["exit"]["exit_code"], 0, "{original}");
        assert_eq!(original["stdout"], copy["stdout"], "the copy differs");
        let run = a.exec_json(&id, json!({"argv": ["/home/user/copy/of/tree/run.sh"]})).await;
        assert_eq!(run["stdout"], "run\n");
        // Uploaded files belong to the sandbox's user.
        let s = a
            .get_q(&format!("/v1/sandboxes/{id}/files/stat"), &[("path", "/home/user/copy/of/tree/a.txt")])
            .await
            .ok(200);
        assert_eq!(s["uid"], 1000);
        // A body that is not a tar fails cleanly and leaves the sandbox usable.
        let r = Client::send(
            a.request(Method::PUT, &format!("/v1/sandboxes/{id}/files/tar"))
                .query(&[("path", "/home/user/garbage")])
                .body(vec![b'x'; 10_000]),
        )
        .await;
        r.err(400, "invalid_request");
        assert_eq!(a.sh(&id, "echo still-here").await, "still-here\n");
    });
}

#[test]
fn watch_reports_changes_made_through_the_api() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("watcher").await;
        let id = a.create_sandbox(json!({})).await;
        let files = format!("/v1/sandboxes/{id}/files");
        a.post(&format!("{files}/mkdir"), json!({"path": "/home/user/w"}))
            .await
            .ok(201);
        let resp = a
            .request(Method::GET, &format!("{files}/watch"))
            .query(&[("path", "/home/user/w"), ("recursive", "true")])
            .send()
            .await
            .expect("watch");
        assert_eq!(resp.status(), 200);
        assert!(resp.headers()["content-type"]
            .to_str()
            .expect("ct")
            .starts_with(NDJSON));
        let mut events = Lines::new(resp);
        let mut seen: Vec<(String, String, bool)> = Vec::new();
        async fn wait_for(
            events: &mut Lines,
            seen: &mut Vec<(String, String, bool)>,
            path: &str,
            kind: &str,
        ) -> bool {
            let deadline = Instant::now() + SOON;
            loop {
                if let Some(found) = seen.iter().find(|(p, k, _)| p == path && k == kind) {
                    return found.2;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                let Some(e) = events.next_within(left).await else {
                    panic!("the watch ended before {kind} {path}; saw {seen:?}");
                };
                seen.push((
                    e["path"].as_str().expect("path").to_owned(),
                    e["kind"].as_str().expect("kind").to_owned(),
                    e["is_dir"].as_bool().expect("is_dir"),
                ));
            }
        }
        a.write_file(&id, "/home/user/w/new.txt", "one").await.ok(200);
        assert!(!wait_for(&mut events, &mut seen, "/home/user/w/new.txt", "create").await);
        a.write_file(&id, "/home/user/w/new.txt", "two").await.ok(200);
        wait_for(&mut events, &mut seen, "/home/user/w/new.txt", "modify").await;
        a.post(&format!("{files}/mkdir"), json!({"path": "/home/user/w/sub"}))
            .await
            .ok(201);
        assert!(wait_for(&mut events, &mut seen, "/home/user/w/sub", "create").await);
        a.write_file(&id, "/home/user/w/sub/inner.txt", "in")
            .await
            .ok(200);
        wait_for(&mut events, &mut seen, "/home/user/w/sub/inner.txt", "create").await;
        a.post(
            &format!("{files}/rename"),
            json!({"from": "/home/user/w/new.txt", "to": "/home/user/w/renamed.txt"}),
        )
        .await
        .ok(200);
        wait_for(&mut events, &mut seen, "/home/user/w/new.txt", "rename_from").await;
        wait_for(&mut events, &mut seen, "/home/user/w/renamed.txt", "rename_to").await;
        a.delete_q(&files, &[("path", "/home/user/w/renamed.txt")])
            .await
            .ok(204);
        wait_for(&mut events, &mut seen, "/home/user/w/renamed.txt", "remove").await;
        // Changes made by a process are seen too.
        a.sh(&id, "touch /home/user/w/sub/by-process").await;
        wait_for(&mut events, &mut seen, "/home/user/w/sub/by-process", "create").await;
        // Removing the watched directory ends the stream with `ended`.
        a.delete_q(&files, &[("path", "/home/user/w"), ("recursive", "true")])
            .await
            .ok(204);
        let rest = events.rest(SOON).await;
        let last = rest.last().expect("ended");
        assert_eq!(
            (last["kind"].as_str(), last["path"].as_str()),
            (Some("ended"), Some("/home/user/w")),
            "{rest:?}"
        );
        // Watching a file or a missing directory is refused.
        a.write_file(&id, "/home/user/f", "x").await.ok(200);
        a.get_q(&format!("{files}/watch"), &[("path", "/home/user/f")])
            .await
            .err(400, "not_a_directory");
        a.get_q(&format!("{files}/watch"), &[("path", "/home/user/none")])
            .await
            .err(404, "file_not_found");
    });
}

// ---------------------------------------------------------------------------------------------------
// 5. Lifecycle, quotas, validation, usage, warm pools, lists and the audit log
// ---------------------------------------------------------------------------------------------------

#[test]
fn quotas_per_tenant() {
    let h = Harness::start();
    h.block_on(async {
        let admin = &h.admin;
        let quota = admin
            .put("/v1/tenants/quota-t/quota", json!({"max_sandboxes": 2}))
            .await
            .ok(200);
        assert_eq!(
            (quota["name"].as_str(), quota["quota"]["max_sandboxes"].as_u64()),
            (Some("quota-t"), Some(2))
        );
        let q = admin.new_tenant("quota-t").await;
        let first = q.create_sandbox(json!({})).await;
        q.create_sandbox(json!({})).await;
        let e = q
            .post("/v1/sandboxes", json!({}))
            .await
            .err(429, "quota_exceeded");
        assert!(
            e["message"].as_str().is_some_and(|m| m.contains("sandboxes")),
            "{e}"
        );
        let usage = q.get("/v1/tenants/quota-t").await.ok(200);
        assert_eq!(usage["usage"]["sandboxes"], 2, "{usage}");
        // A refused create leaves nothing behind and no row claiming it happened.
        assert_eq!(
            q.get("/v1/sandboxes").await.ok(200)["sandboxes"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
        // Ending one frees its place.
        q.delete(&format!("/v1/sandboxes/{first}")).await.ok(204);
        q.create_sandbox(json!({})).await;
        q.post("/v1/sandboxes", json!({}))
            .await
            .err(429, "quota_exceeded");
        // Raising the quota takes effect at once; other tenants are not affected.
        admin
            .put("/v1/tenants/quota-t/quota", json!({"max_sandboxes": 3}))
            .await
            .ok(200);
        q.create_sandbox(json!({})).await;
        let other = admin.new_tenant("unlimited").await;
        for _ in 0..4 {
            other.create_sandbox(json!({})).await;
        }

        // Concurrent creates cannot overshoot the quota together.
        admin
            .put("/v1/tenants/burst-t/quota", json!({"max_sandboxes": 2}))
            .await
            .ok(200);
        let burst = admin.new_tenant("burst-t").await;
        let attempts: Vec<_> = (0..6)
            .map(|_| {
                let burst = burst.clone();
                tokio::spawn(async move { burst.post("/v1/sandboxes", json!({})).await })
            })
            .collect();
        let mut statuses = Vec::new();
        for attempt in attempts {
            let r = attempt.await.expect("create task");
            assert!(
                r.status == 201 || (r.status == 429 && r.code() == "quota_exceeded"),
                "{r:?}"
            );
            statuses.push(r.status);
        }
        assert_eq!(statuses.iter().filter(|&&s| s == 201).count(), 2, "{statuses:?}");
        let live = burst.get("/v1/sandboxes").await.ok(200);
        assert_eq!(live["sandboxes"].as_array().map(Vec::len), Some(2), "{live}");

        // Memory: the sum of the live sandboxes' limits.
        admin
            .put("/v1/tenants/mem-t/quota", json!({"max_memory": "1G"}))
            .await
            .ok(200);
        let m = admin.new_tenant("mem-t").await;
        m.create_sandbox(json!({"limits": {"memory": "768M"}})).await;
        m.post("/v1/sandboxes", json!({"limits": {"memory": "512M"}}))
            .await
            .err(429, "quota_exceeded");
        m.post("/v1/sandboxes", json!({}))
            .await
            .err(429, "quota_exceeded");
        m.create_sandbox(json!({"limits": {"memory": "256M"}})).await;
        m.post("/v1/sandboxes", json!({"limits": {"memory": "32M"}}))
            .await
            .err(429, "quota_exceeded");
        let usage = m.get("/v1/tenants/mem-t").await.ok(200);
        assert_eq!(usage["usage"]["memory_bytes"], 1u64 << 30, "{usage}");
        // CPUs likewise.
        admin
            .put("/v1/tenants/cpu-t/quota", json!({"max_cpus": 1.5}))
            .await
            .ok(200);
        let c = admin.new_tenant("cpu-t").await;
        c.create_sandbox(json!({"limits": {"cpus": 1}})).await;
        c.post("/v1/sandboxes", json!({"limits": {"cpus": 1}}))
            .await
            .err(429, "quota_exceeded");
        c.create_sandbox(json!({"limits": {"cpus": 0.5}})).await;
        // Quota bodies are validated.
        admin
            .put("/v1/tenants/Bad Name/quota", json!({"max_sandboxes": 1}))
            .await
            .err(400, "invalid_request");
        admin
            .put("/v1/tenants/x/quota", json!({"max_memory": "lots"}))
            .await
            .err(400, "invalid_request");
    });
}

#[test]
fn validation_errors_name_the_field() {
    let h = Harness::with(Options {
        max_limits: paddock_types::Limits {
            memory: Some(paddock_types::ByteSize::gib(2)),
            cpus: None,
            pids: None,
            disk: None,
        },
        ..Options::default()
    });
    h.block_on(async {
        let a = h.admin.new_tenant("validation").await;
        let field = |r: &Reply| r.json()["field"].as_str().unwrap_or("").to_owned();
        for (body, expected) in [
            (json!({"limits": {"memory": "lots"}}), "limits.memory"),
            (json!({"limits": {"memory": "4G"}}), "limits.memory"),
            (json!({"limits": {"memory": -1}}), "limits.memory"),
            (json!({"limits": {"pids": 0}}), "limits.pids"),
            (json!({"limits": {"cpus": -1}}), "limits.cpus"),
            (json!({"limits": {"disk": "1X"}}), "limits.disk"),
            (json!({"limits": {"swap": "1G"}}), "limits.swap"),
            (json!({"timeout_secs": 0}), "timeout_secs"),
            (json!({"timeout_secs": 1_000_000_000u64}), "timeout_secs"),
            (json!({"timeout_secs": "soon"}), "timeout_secs"),
            (json!({"template": "nope"}), "template"),
            (json!({"workdir": "relative/dir"}), "workdir"),
            (json!({"user": "no such user!"}), "user"),
            (json!({"labels": {"a=b": "x"}}), "labels.a=b"),
            (json!({"bogus": 1}), "bogus"),
        ] {
            let r = a.post("/v1/sandboxes", body.clone()).await;
            r.err(400, "invalid_request");
            assert_eq!(field(&r), expected, "{body}: {r:?}");
        }
        // A body must be a JSON object: serde alone would read `[]` as a request with every field
        // defaulted (and create a sandbox).
        for body in ["[]", "[{}]", "null", "3", "\"x\""] {
            let r = Client::send(
                a.request(Method::POST, "/v1/sandboxes")
                    .header("content-type", JSON)
                    .body(body),
            )
            .await;
            let refused = r.err(400, "invalid_request");
            let message = refused["message"].as_str().unwrap_or("");
            if body != "null" {
                assert!(message.contains("must be a JSON object"), "{body}: {refused}");
            }
        }
        assert!(a.get("/v1/sandboxes").await.ok(200)["sandboxes"]
            .as_array()
            .is_some_and(Vec::is_empty));
        let id = a.create_sandbox(json!({"limits": {"memory": "2G"}})).await;
        let exec = format!("/v1/sandboxes/{id}/exec");
        for (body, expected) in [
            (json!({}), "argv"),
            (json!({"argv": []}), "argv"),
            (json!({"argv": [""]}), "argv"),
            (json!({"argv": ["true"], "shell": "true"}), "argv"),
            (json!({"argv": "true"}), "argv"),
            (json!({"argv": ["/nonexistent/program"]}), "argv"),
            (json!({"argv": ["true"], "cwd": "relative"}), "cwd"),
            (json!({"argv": ["true"], "cwd": "/nonexistent"}), "cwd"),
            (json!({"argv": ["true"], "user": "ghost"}), "user"),
            (json!({"argv": ["true"], "pty": {"rows": 0, "cols": 80}}), "pty"),
            (json!({"argv": ["true"], "env": {"": "x"}}), "env."),
            (json!({"argv": ["true"], "timeout_ms": "x"}), "timeout_ms"),
            (json!({"argv": ["true"], "bogus": true}), "bogus"),
        ] {
            let r = a.post(&exec, body.clone()).await;
            r.err(400, "invalid_request");
            assert_eq!(field(&r), expected, "{body}: {r:?}");
        }
        let r = a
            .post(&format!("/v1/sandboxes/{id}/timeout"), json!({"timeout_secs": 0}))
            .await;
        r.err(400, "invalid_request");
        assert_eq!(field(&r), "timeout_secs");
        let r = a.post(&format!("/v1/sandboxes/{id}/timeout"), json!({})).await;
        assert_eq!(field(&r), "timeout_secs", "{r:?}");
        for (query, expected) in [
            ("limit=0", "limit"),
            ("limit=x", "limit"),
            ("state=bogus", "state"),
            ("label=nokv", "label"),
            ("bogus=1", "bogus"),
        ] {
            let r = a.get(&format!("/v1/sandboxes?{query}")).await;
            r.err(400, "invalid_request");
            assert_eq!(field(&r), expected, "{query}: {r:?}");
        }
        // A cursor no page could have returned is refused by every list, not answered with an
        // empty page.
        for list in ["/v1/sandboxes", "/v1/snapshots", "/v1/volumes"] {
            for cursor in ["%ff%00", "", "UPPER", "a%2Fb"] {
                let r = a.get(&format!("{list}?cursor={cursor}")).await;
                r.err(400, "invalid_request");
                assert_eq!(field(&r), "cursor", "{list}?cursor={cursor}: {r:?}");
            }
        }
        for (query, expected) in [
            ("limit=0", "limit"),
            ("since=yesterday", "since"),
            ("after_seq=-1", "after_seq"),
        ] {
            let r = a.get(&format!("/v1/audit?{query}")).await;
            r.err(400, "invalid_request");
            assert_eq!(field(&r), expected, "{query}: {r:?}");
        }
        let r = h.admin.post("/v1/keys", json!({"tenant": "Not A Tenant"})).await;
        r.err(400, "invalid_request");
        assert_eq!(field(&r), "tenant");
        // Malformed bodies, wrong content types, oversized JSON, unknown routes and methods.
        Client::send(
            a.request(Method::POST, "/v1/sandboxes")
                .header("content-type", JSON)
                .body("{"),
        )
        .await
        .err(400, "invalid_request");
        Client::send(
            a.request(Method::POST, "/v1/sandboxes")
                .header("content-type", "text/plain")
                .body("{}"),
        )
        .await
        .err(400, "invalid_request");
        let huge = json!({"labels": {"big": "x".repeat(2 << 20)}});
        a.post("/v1/sandboxes", huge).await.err(413, "payload_too_large");
        a.get("/v1/nothing").await.err(404, "invalid_request");
        Client::send(a.request(Method::PATCH, "/v1/sandboxes"))
            .await
            .err(405, "invalid_request");
    });
}

/// RFC 3339 (as the API writes it) to milliseconds since the epoch.
fn rfc3339_ms(text: &str) -> u128 {
    humantime::parse_rfc3339(text)
        .unwrap_or_else(|e| panic!("{text:?} is not RFC 3339: {e}"))
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis()
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_millis()
}

#[test]
fn timeouts_expiry_extension_and_usage() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("timer").await;
        // Expiry: the reaper ends it; it stays visible as `expired`.
        let short = a.create_sandbox(json!({"timeout_secs": 1})).await;
        let expired = poll(SOON, "the reaper to expire the sandbox", || async {
            let info = a.get(&format!("/v1/sandboxes/{short}")).await.ok(200);
            (info["state"] == "expired").then_some(info)
        })
        .await;
        assert_eq!(expired["end_reason"], "expired", "{expired}");
        assert!(expired["ended_at"].is_string(), "{expired}");
        assert!(
            rfc3339_ms(expired["ended_at"].as_str().expect("ended_at"))
                >= rfc3339_ms(expired["expires_at"].as_str().expect("expires_at")),
            "{expired}"
        );
        a.post(&format!("/v1/sandboxes/{short}/exec"), json!({"argv": ["true"]}))
            .await
            .err(409, "sandbox_not_running");
        a.delete(&format!("/v1/sandboxes/{short}")).await.err(409, "sandbox_not_running");
        a.post(&format!("/v1/sandboxes/{short}/timeout"), json!({"timeout_secs": 60}))
            .await
            .err(409, "sandbox_not_running");
        let running = a.get("/v1/sandboxes").await.ok(200);
        assert!(running["sandboxes"].as_array().is_some_and(Vec::is_empty), "{running}");
        let listed = a.get("/v1/sandboxes?state=expired").await.ok(200);
        assert_eq!(listed["sandboxes"][0]["id"], short.as_str());
        let rows = a.audit_rows(&[("sandbox", &short), ("action", "sandbox.expire")]).await;
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0]["tenant"], "timer");
        assert_eq!(rows[0]["key_id"], Value::Null, "the reaper acted, not a key: {}", rows[0]);
        // Its resources go (the run directory is the backend's record of a live sandbox): the end is
        // recorded first and the teardown follows, so the state can be read a moment before.
        let run_dir = h.env().state().join("run").join(&short);
        poll(SOON, "the expired sandbox's teardown", || async {
            (!run_dir.exists()).then_some(())
        })
        .await;

        // Extension: a 2-second sandbox given 600 seconds outlives its first deadline.
        let id = a.create_sandbox(json!({"timeout_secs": 2})).await;
        let first = a.get(&format!("/v1/sandboxes/{id}")).await.ok(200)["expires_at"]
            .as_str()
            .map(rfc3339_ms)
            .expect("expires_at");
        let extended = a
            .post(&format!("/v1/sandboxes/{id}/timeout"), json!({"timeout_secs": 600}))
            .await
            .ok(200);
        let later = rfc3339_ms(extended["expires_at"].as_str().expect("expires_at"));
        assert!(later >= first + 590_000, "{first} -> {later}");

        // Usage moves while the first deadline passes.
        let usage = format!("/v1/sandboxes/{id}/usage");
        let before = a.get(&usage).await.ok(200);
        assert_eq!(before["memory_limit_bytes"], 1u64 << 30, "{before}");
        // The 10G default disk, lowered to the tests' 8G pool (no sandbox can write more than the pool).
        assert_eq!(before["disk_limit_bytes"], 8u64 << 30, "{before}");
        assert!(before["pids"].as_u64().is_some_and(|p| p >= 1), "{before}");
        // A shell variable of 150 MB, held while the shell waits.
        let filler = a
            .exec_background(
                &id,
                json!({"shell": "x=$(head -c 150000000 /dev/zero | tr '\\0' a); echo ${#x}; sleep 1000; echo ${#x}"}),
            )
            .await;
        let grown = poll(SOON, "memory use to grow by 100 MiB", || async {
            let now = a.get(&usage).await.ok(200);
            (now["memory_bytes"].as_u64()? > before["memory_bytes"].as_u64()? + (100 << 20)).then_some(now)
        })
        .await;
        assert!(grown["memory_peak_bytes"].as_u64() >= grown["memory_bytes"].as_u64(), "{grown}");
        assert!(grown["pids"].as_u64() > before["pids"].as_u64(), "{grown}");
        a.sh(&id, "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done").await;
        a.sh(&id, "head -c 30M /dev/urandom > /home/user/disk.bin; sync").await;
        poll(SOON, "cpu and disk use to grow", || async {
            let now = a.get(&usage).await.ok(200);
            (now["cpu_time_us"].as_u64()? > before["cpu_time_us"].as_u64()? + 100_000
                && now["disk_bytes"].as_u64()? > before["disk_bytes"].as_u64()? + (20 << 20))
            .then_some(())
        })
        .await;
        a.post(&format!("/v1/sandboxes/{id}/processes/{filler}/kill"), Value::Null)
            .await
            .ok(204);
        poll(SOON, "memory use to drop again", || async {
            let now = a.get(&usage).await.ok(200);
            (now["memory_bytes"].as_u64()? < before["memory_bytes"].as_u64()? + (60 << 20)).then_some(())
        })
        .await;
        // Past the original deadline (plus several reaper rounds) it still runs.
        while now_ms() < first + 2_000 {
            let info = a.get(&format!("/v1/sandboxes/{id}")).await.ok(200);
            assert_eq!(info["state"], "running", "expired despite the extension: {info}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(a.get(&format!("/v1/sandboxes/{id}")).await.ok(200)["state"], "running");
        let rows = a.audit_rows(&[("sandbox", &id), ("action", "sandbox.timeout")]).await;
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["detail"]["timeout_secs"], 600);
    });
}

#[test]
fn lists_filter_by_label_and_page() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("lister").await;
        let mut batch = BTreeSet::new();
        for i in 0..5 {
            batch.insert(
                a.create_sandbox(json!({"labels": {"batch": "b1", "n": i.to_string()}}))
                    .await,
            );
        }
        let odd = a.create_sandbox(json!({"labels": {"batch": "b2"}})).await;
        let mut seen = Vec::new();
        let mut pages = 0;
        let mut cursor: Option<String> = None;
        loop {
            let mut q = vec![("label", "batch=b1".to_owned()), ("limit", "2".to_owned())];
            if let Some(c) = &cursor {
                q.push(("cursor", c.clone()));
            }
            let q: Vec<(&str, &str)> = q.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let page = a.get_q("/v1/sandboxes", &q).await.ok(200);
            pages += 1;
            let ids = page["sandboxes"].as_array().expect("sandboxes");
            assert!(ids.len() <= 2, "{page}");
            for sb in ids {
                assert_eq!(sb["labels"]["batch"], "b1", "{sb}");
                seen.push(sb["id"].as_str().expect("id").to_owned());
            }
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
            assert!(pages < 10, "paging does not end");
        }
        assert_eq!(pages, 3);
        assert_eq!(seen.len(), 5, "each exactly once: {seen:?}");
        assert_eq!(seen.iter().cloned().collect::<BTreeSet<_>>(), batch);
        let one = a
            .get_q("/v1/sandboxes", &[("label", "batch=b1,n=3")])
            .await
            .ok(200);
        assert_eq!(one["sandboxes"].as_array().map(Vec::len), Some(1), "{one}");
        assert_eq!(one["sandboxes"][0]["labels"]["n"], "3");
        let none = a.get_q("/v1/sandboxes", &[("label", "batch=b3")]).await.ok(200);
        assert_eq!(none["sandboxes"], json!([]));
        let all = a.get("/v1/sandboxes").await.ok(200);
        let all: BTreeSet<&str> = all["sandboxes"]
            .as_array()
            .expect("sandboxes")
            .iter()
            .filter_map(|s| s["id"].as_str())
            .collect();
        assert_eq!(all.len(), 6);
        assert!(all.contains(odd.as_str()));
        // Ended sandboxes leave the default list and appear under their state.
        let ended: Vec<String> = batch.iter().take(2).cloned().collect();
        for id in &ended {
            a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
        }
        let running = a.get_q("/v1/sandboxes", &[("label", "batch=b1")]).await.ok(200);
        assert_eq!(running["sandboxes"].as_array().map(Vec::len), Some(3));
        let stopped = a.get_q("/v1/sandboxes", &[("state", "killed")]).await.ok(200);
        let stopped: BTreeSet<&str> = stopped["sandboxes"]
            .as_array()
            .expect("sandboxes")
            .iter()
            .map(|s| {
                assert_eq!(s["end_reason"], "killed", "{s}");
                s["id"].as_str().expect("id")
            })
            .collect();
        assert_eq!(stopped, ended.iter().map(String::as_str).collect());
        let everything = a
            .get_q("/v1/sandboxes", &[("state", "all"), ("label", "batch=b1")])
            .await
            .ok(200);
        assert_eq!(everything["sandboxes"].as_array().map(Vec::len), Some(5));
        // A listed sandbox says what it is.
        let sb = a.get(&format!("/v1/sandboxes/{odd}")).await.ok(200);
        assert_eq!(sb["template"], "default");
        assert_eq!(sb["user"], "user");
        assert_eq!(sb["limits"]["memory"], 1u64 << 30);
    });
}

#[test]
fn environment_names_with_an_equals_sign_are_refused_up_front() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("envcheck").await;
        // A name such as `A=B` is not a variable name (`A=B=x` would set A to `B=x`), and the agent
        // refuses it at every exec. The service must refuse it when the sandbox is created, naming
        // the field, instead of creating a sandbox in which no process can ever start.
        let r = a.post("/v1/sandboxes", json!({"env": {"A=B": "x"}})).await;
        if r.status == 201 {
            let id = r.json()["id"].as_str().expect("id").to_owned();
            let exec = a
                .post(&format!("/v1/sandboxes/{id}/exec"), json!({"argv": ["true"]}))
                .await;
            panic!(
                "a sandbox env name with '=' was accepted ({r:?}); every exec in that sandbox then \
                 fails: {exec:?}"
            );
        }
        let body = r.err(400, "invalid_request");
        assert_eq!(body["field"], "env.A=B", "{body}");
        let id = a.create_sandbox(json!({})).await;
        let body = a
            .post(
                &format!("/v1/sandboxes/{id}/exec"),
                json!({"argv": ["true"], "env": {"A=B": "x"}}),
            )
            .await
            .err(400, "invalid_request");
        assert_eq!(body["field"], "env.A=B", "{body}");
    });
}

#[test]
fn the_audit_log_records_every_action_in_order() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("audited").await;
        let mut expected: Vec<(&str, Option<String>)> = Vec::new();
        let id = a.create_sandbox(json!({"labels": {"k": "v"}})).await;
        expected.push(("sandbox.create", Some(id.clone())));
        let sid = || Some(id.clone());
        let files = format!("/v1/sandboxes/{id}/files");

        let r = a
            .exec_json(&id, json!({"shell": "echo hello; cat", "stdin": "in"}))
            .await;
        assert_eq!(r["stdout"], "hello\nin");
        let p1 = r["pid"].as_u64().expect("pid");
        expected.push(("process.start", sid()));
        let r = a
            .exec_json(
                &id,
                json!({"argv": ["sh", "-c", "printf 12345 >&2; exit 3"], "cwd": "/tmp"}),
            )
            .await;
        let p2 = r["pid"].as_u64().expect("pid");
        expected.push(("process.start", sid()));
        a.write_file(&id, "/home/user/a.txt", "abcdef").await.ok(200);
        expected.push(("file.write", sid()));
        a.read_file(&id, "/home/user/a.txt").await;
        expected.push(("file.read", sid()));
        a.get_q(&format!("{files}/list"), &[("path", "/home/user")])
            .await
            .ok(200);
        expected.push(("file.list", sid()));
        a.post(&format!("{files}/mkdir"), json!({"path": "/home/user/d"}))
            .await
            .ok(201);
        expected.push(("file.mkdir", sid()));
        a.post(
            &format!("{files}/rename"),
            json!({"from": "/home/user/a.txt", "to": "/home/user/d/a.txt"}),
        )
        .await
        .ok(200);
        expected.push(("file.rename", sid()));
        a.delete_q(&files, &[("path", "/home/user/d/a.txt")])
            .await
            .ok(204);
        expected.push(("file.remove", sid()));
        a.post(
            &format!("/v1/sandboxes/{id}/timeout"),
            json!({"timeout_secs": 1200}),
        )
        .await
        .ok(200);
        expected.push(("sandbox.timeout", sid()));
        let p3 = u64::from(a.exec_background(&id, json!({"argv": ["sleep", "1000"]})).await);
        expected.push(("process.start", sid()));
        a.post(
            &format!("/v1/sandboxes/{id}/processes/{p3}/signal"),
            json!({"signal": "TERM"}),
        )
        .await
        .ok(204);
        expected.push(("process.signal", sid()));
        let p4 = u64::from(a.exec_background(&id, json!({"argv": ["sleep", "1001"]})).await);
        expected.push(("process.start", sid()));
        Client::send(
            a.request(Method::GET, &format!("/v1/sandboxes/{id}/processes/{p4}/output"))
                .query(&[("follow", "false")]),
        )
        .await
        .ok(200);
        expected.push(("process.attach", sid()));
        a.post(&format!("/v1/sandboxes/{id}/processes/{p4}/kill"), Value::Null)
            .await
            .ok(204);
        expected.push(("process.kill", sid()));
        let tarball = a.get_q(&format!("{files}/tar"), &[("path", "/home/user")]).await;
        assert_eq!(tarball.status, 200);
        expected.push(("file.tar_download", sid()));
        Client::send(
            a.request(Method::PUT, &format!("{files}/tar"))
                .query(&[("path", "/home/user/up")])
                .body(tar_of(&[("x.txt", b"x")])),
        )
        .await
        .ok(204);
        expected.push(("file.tar_upload", sid()));
        let watch = a
            .request(Method::GET, &format!("{files}/watch"))
            .query(&[("path", "/home/user")])
            .send()
            .await
            .expect("watch");
        assert_eq!(watch.status(), 200);
        drop(watch);
        expected.push(("file.watch", sid()));
        for pid in [p3, p4] {
            exit_of(&a, &id, pid).await;
        }
        a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
        expected.push(("sandbox.kill", sid()));
        // A failed authentication is recorded too (for the admin).
        h.with_key("pdk_0123456789ab_nope")
            .get("/v1/sandboxes")
            .await
            .err(401, "unauthorized");

        let rows = poll(SOON, "four process.exit rows", || async {
            let rows = a.audit_rows(&[]).await;
            (rows.iter().filter(|r| r["action"] == "process.exit").count() >= 4).then_some(rows)
        })
        .await;
        for r in &rows {
            assert_eq!(r["tenant"], "audited", "{r}");
        }
        // Every action, in order (exits are written by the process's monitor, so they may follow a
        // later action; they are checked against their start below).
        let actions: Vec<(&str, Option<String>)> = rows
            .iter()
            .filter(|r| r["action"] != "process.exit")
            .map(|r| {
                (
                    r["action"].as_str().expect("action"),
                    r["sandbox_id"].as_str().map(str::to_owned),
                )
            })
            .collect();
        assert_eq!(actions, expected, "the audited actions differ from what was done");
        for r in rows.iter().filter(|r| r["action"] != "process.exit") {
            assert_eq!(r["key_id"], a.key_id.as_deref().expect("key id"), "{r}");
            assert_eq!(r["outcome"], "ok", "{r}");
        }
        let seqs: Vec<u64> = rows.iter().map(|r| r["seq"].as_u64().expect("seq")).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        let times: Vec<u128> = rows
            .iter()
            .map(|r| rfc3339_ms(r["time"].as_str().expect("time")))
            .collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
        // The start row is written before the process exists: it is tied to its exit row (which
        // has the pid) by the exec id both carry.
        let find = |action: &str, pid: u64| {
            let exit = rows
                .iter()
                .position(|r| r["action"] == "process.exit" && r["detail"]["pid"] == pid)
                .unwrap_or_else(|| panic!("no process.exit row for pid {pid}: {rows:#?}"));
            if action == "process.exit" {
                return exit;
            }
            let exec_id = &rows[exit]["detail"]["exec_id"];
            assert!(exec_id.is_string(), "exit row without exec id: {}", rows[exit]);
            rows.iter()
                .position(|r| r["action"] == action && &r["detail"]["exec_id"] == exec_id)
                .unwrap_or_else(|| panic!("no {action} row for pid {pid}: {rows:#?}"))
        };
        for pid in [p1, p2, p3, p4] {
            assert!(
                find("process.start", pid) < find("process.exit", pid),
                "pid {pid}"
            );
            let exit = &rows[find("process.exit", pid)]["detail"];
            for key in ["exit_code", "duration_ms", "bytes_out", "bytes_in", "cpu_time_us"] {
                assert!(!exit[key].is_null(), "{key} missing from {exit}");
            }
        }
        let start = &rows[find("process.start", p1)]["detail"];
        assert_eq!(start["shell"], "echo hello; cat");
        assert_eq!(start["user"], "user");
        let exit = &rows[find("process.exit", p1)]["detail"];
        assert_eq!(
            (
                exit["exit_code"].as_i64(),
                exit["bytes_out"].as_u64(),
                exit["bytes_in"].as_u64()
            ),
            (Some(0), Some(8), Some(2)),
            "{exit}"
        );
        let start = &rows[find("process.start", p2)]["detail"];
        assert_eq!(start["argv"], json!(["sh", "-c", "printf 12345 >&2; exit 3"]));
        assert_eq!(start["cwd"], "/tmp");
        let exit = &rows[find("process.exit", p2)]["detail"];
        assert_eq!(
            (exit["exit_code"].as_i64(), exit["bytes_out"].as_u64()),
            (Some(3), Some(5)),
            "{exit}"
        );
        assert_eq!(rows[find("process.exit", p3)]["detail"]["signal"], 15);
        assert_eq!(rows[find("process.exit", p4)]["detail"]["signal"], 9);
        let signal = rows
            .iter()
            .find(|r| r["action"] == "process.signal" && r["detail"]["pid"] == p3)
            .expect("process.signal row");
        assert_eq!(signal["detail"]["signal"], 15);
        let create = rows
            .iter()
            .find(|r| r["action"] == "sandbox.create")
            .expect("create");
        assert_eq!(
            (
                create["detail"]["source"].as_str(),
                create["detail"]["template"].as_str()
            ),
            (Some("boot"), Some("default"))
        );
        let write = rows.iter().find(|r| r["action"] == "file.write").expect("write");
        assert_eq!(
            (
                write["detail"]["path"].as_str(),
                write["detail"]["bytes_in"].as_u64()
            ),
            (Some("/home/user/a.txt"), Some(6))
        );
        let kill = rows.iter().find(|r| r["action"] == "sandbox.kill").expect("kill");
        assert_eq!(kill["detail"]["reason"], "killed");

        // Filters and paging.
        let family = a.audit_rows(&[("action", "process.")]).await;
        assert_eq!(
            family.len(),
            rows.iter()
                .filter(|r| r["action"].as_str().is_some_and(|x| x.starts_with("process.")))
                .count()
        );
        let exits = a.audit_rows(&[("action", "process.exit")]).await;
        assert_eq!(exits.len(), 4);
        let for_sandbox = a.audit_rows(&[("sandbox", &id)]).await;
        assert_eq!(for_sandbox.len(), rows.len());
        let mut paged = Vec::new();
        let mut after: Option<u64> = None;
        loop {
            let mut q = vec![("limit".to_owned(), "3".to_owned())];
            if let Some(s) = after {
                q.push(("after_seq".to_owned(), s.to_string()));
            }
            let q: Vec<(&str, &str)> = q.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let page = a.get_q("/v1/audit", &q).await.ok(200);
            let records = page["records"].as_array().expect("records");
            assert!(records.len() <= 3);
            paged.extend(records.iter().cloned());
            match page["next_after_seq"].as_u64() {
                Some(s) => after = Some(s),
                None => break,
            }
        }
        assert_eq!(paged, rows, "paging gives every row exactly once");
        let since = rows[5]["time"].as_str().expect("time");
        let later = a.audit_rows(&[("since", since)]).await;
        assert!(later
            .iter()
            .all(|r| rfc3339_ms(r["time"].as_str().expect("t")) >= rfc3339_ms(since)));
        assert!(later.len() < rows.len() && later.len() >= rows.len() - 5);

        // The admin sees the whole chain: gapless, each row hashed onto the previous one, verified.
        let all = h.admin.audit_rows(&[]).await;
        for (i, r) in all.iter().enumerate() {
            assert_eq!(r["seq"].as_u64(), Some(i as u64 + 1), "gap at {r}");
            if i > 0 {
                assert_eq!(r["prev_hash"], all[i - 1]["hash"], "chain broken at {r}");
            }
        }
        let failed = all
            .iter()
            .find(|r| r["action"] == "auth.failed")
            .expect("auth.failed row");
        assert_eq!(
            (failed["outcome"].as_str(), failed["tenant"].as_str()),
            (Some("unauthorized"), None)
        );
        assert_eq!(failed["detail"]["key_id"], "0123456789ab");
        let verdict = h.admin.get("/v1/audit/verify").await.ok(200);
        assert_eq!(verdict["ok"], true, "{verdict}");
        assert_eq!(verdict["first_broken"], Value::Null);
        assert!(
            verdict["rows_checked"].as_u64() >= Some(all.len() as u64),
            "{verdict}"
        );
    });
}

/// Names of the sandboxes the backend runs for this environment (warm ones included).
fn run_dirs(h: &Harness) -> BTreeSet<String> {
    std::fs::read_dir(h.env().state().join("run"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("sb-"))
                .collect()
        })
        .unwrap_or_default()
}

fn pool_gauge(metrics: &str) -> Option<u64> {
    metrics
        .lines()
        .find(|l| l.starts_with("paddock_warm_pool_size{") && l.contains("template=\"default\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Waits until two sandboxes are warm and `total` run; returns the running ones.
async fn pool_ready(h: &Harness, total: usize) -> BTreeSet<String> {
    poll(SOON, &format!("2 warm sandboxes of {total}"), || async {
        let metrics = h.admin.get("/metrics").await;
        assert_eq!(metrics.status, 200, "{metrics:?}");
        let dirs = run_dirs(h);
        (pool_gauge(&metrics.text()) == Some(2) && dirs.len() == total).then_some(dirs)
    })
    .await
}

#[test]
fn warm_pool_serves_creates_and_refills() {
    let h = Harness::with(Options {
        warm_pool: 2,
        ..Options::default()
    });
    h.block_on(async {
        let warm = pool_ready(&h, 2).await;
        let templates = h.admin.get("/v1/templates").await.ok(200);
        assert_eq!(
            templates["templates"],
            json!([{"name": "default", "warm_pool_size": 2}])
        );
        let a = h.admin.new_tenant("warm").await;
        // A warm sandbox belongs to nobody: no tenant can reach it before it is claimed.
        for wid in &warm {
            a.get(&format!("/v1/sandboxes/{wid}"))
                .await
                .err(404, "sandbox_not_found");
            a.post(&format!("/v1/sandboxes/{wid}/exec"), json!({"argv": ["true"]}))
                .await
                .err(404, "sandbox_not_found");
            a.delete(&format!("/v1/sandboxes/{wid}"))
                .await
                .err(404, "sandbox_not_found");
            h.admin
                .get(&format!("/v1/sandboxes/{wid}"))
                .await
                .err(404, "sandbox_not_found");
        }

        // A create is a claim, with the request's limits and environment applied.
        let info = a
            .post(
                "/v1/sandboxes",
                json!({"limits": {"memory": "300M"}, "env": {"FOO": "bar"}, "labels": {"via": "pool"}}),
            )
            .await
            .ok(201);
        let id = info["id"].as_str().expect("id").to_owned();
        assert!(
            warm.contains(&id),
            "{id} was not one of the warm sandboxes {warm:?}"
        );
        assert_eq!(info["state"], "running");
        assert_eq!(info["limits"]["memory"], 300u64 << 20);
        assert_eq!(info["labels"]["via"], "pool");
        let rows = a.audit_rows(&[("action", "sandbox.create")]).await;
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (
                rows[0]["sandbox_id"].as_str(),
                rows[0]["detail"]["source"].as_str()
            ),
            (Some(id.as_str()), Some("pool"))
        );
        // The limit is live on the claimed sandbox's cgroup (v1 memory hierarchy, or v2).
        let v1 = Path::new("/sys/fs/cgroup/memory")
            .join(&h.env().cgroup_parent)
            .join(&id);
        let file = if v1.exists() {
            v1.join("memory.limit_in_bytes")
        } else {
            Path::new("/sys/fs/cgroup")
                .join(&h.env().cgroup_parent)
                .join(&id)
                .join("memory.max")
        };
        let limit = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert_eq!(
            limit.trim(),
            (300u64 << 20).to_string(),
            "the claimed sandbox's cgroup limit"
        );
        let usage = a.get(&format!("/v1/sandboxes/{id}/usage")).await.ok(200);
        assert_eq!(usage["memory_limit_bytes"], 300u64 << 20);
        let r = a
            .exec_json(&id, json!({"shell": "echo $FOO; id -un; hostname"}))
            .await;
        assert_eq!(r["stdout"], format!("bar\nuser\n{id}\n"));

        // The pool refills (the claimed one runs on, two are warm again).
        let refilled = pool_ready(&h, 3).await;
        let second = a.create_sandbox(json!({})).await;
        assert!(
            refilled.contains(&second) && second != id,
            "{second} not from the refilled pool"
        );
        // Concurrent creates never share a sandbox: some are claims, the rest boot.
        let attempts: Vec<_> = (0..4)
            .map(|_| {
                let a = a.clone();
                tokio::spawn(async move { a.post("/v1/sandboxes", json!({})).await.ok(201) })
            })
            .collect();
        let mut ids = BTreeSet::new();
        for attempt in attempts {
            let info = attempt.await.expect("create task");
            assert!(
                ids.insert(info["id"].as_str().expect("id").to_owned()),
                "a sandbox was handed out twice: {info}"
            );
        }
        let creates = a.audit_rows(&[("action", "sandbox.create")]).await;
        for created in &ids {
            let rows: Vec<&Value> = creates
                .iter()
                .filter(|r| r["sandbox_id"] == created.as_str())
                .collect();
            assert_eq!(rows.len(), 1, "{created}: {rows:?}");
        }
        // Two claimed before, these, and two warm.
        let claimed = 2 + ids.len();
        pool_ready(&h, claimed + 2).await;
        // A claim respects the tenant's quota and consumes nothing when refused.
        h.admin
            .put("/v1/tenants/warm-q/quota", json!({"max_sandboxes": 1}))
            .await
            .ok(200);
        let q = h.admin.new_tenant("warm-q").await;
        q.create_sandbox(json!({})).await;
        pool_ready(&h, claimed + 3).await;
        q.post("/v1/sandboxes", json!({}))
            .await
            .err(429, "quota_exceeded");
        assert_eq!(
            run_dirs(&h).len(),
            claimed + 3,
            "a refused claim changed the pool"
        );
        // Killing a claimed sandbox removes it; the warm ones stay.
        a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
        assert!(!run_dirs(&h).contains(&id));
        assert_eq!(
            a.get(&format!("/v1/sandboxes/{id}")).await.ok(200)["state"],
            "killed"
        );
    });
}

#[test]
fn killing_a_sandbox_ends_its_streams() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("ender").await;
        let id = a.create_sandbox(json!({})).await;
        let mut exec = Lines::new(
            a.exec_stream(&id, json!({"argv": ["sleep", "1000"]}), NDJSON)
                .await,
        );
        exec.next_within(SOON).await.expect("started");
        let watch = Lines::new(
            a.request(Method::GET, &format!("/v1/sandboxes/{id}/files/watch"))
                .query(&[("path", "/home/user")])
                .send()
                .await
                .expect("watch"),
        );
        let mut ws = a.ws(&format!("/v1/sandboxes/{id}/pty")).await.expect("upgrade");
        a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
        // Each stream ends promptly, with an event that says why rather than a hang or a cut.
        let rest = exec.rest(SOON).await;
        let last = rest.last().expect("a last exec event");
        assert!(
            last["type"] == "error" || last["type"] == "exit",
            "exec stream: {rest:?}"
        );
        if last["type"] == "error" {
            assert_eq!(last["code"], "sandbox_not_running", "{last}");
        }
        let rest = watch.rest(SOON).await;
        assert_eq!(
            rest.last().map(|e| e["kind"].clone()),
            Some(json!("ended")),
            "watch stream: {rest:?}"
        );
        let closed = tokio::time::timeout(SOON, async {
            while let Some(Ok(message)) = ws.next().await {
                if let Message::Close(frame) = message {
                    return frame.map(|f| u16::from(f.code));
                }
            }
            None
        })
        .await
        .expect("the terminal closes");
        assert!(closed.is_some(), "the terminal closed without a close frame");
        let info = a.get(&format!("/v1/sandboxes/{id}")).await.ok(200);
        assert_eq!(
            (info["state"].as_str(), info["end_reason"].as_str()),
            (Some("killed"), Some("killed"))
        );
        a.get(&format!("/v1/sandboxes/{id}/processes"))
            .await
            .err(409, "sandbox_not_running");
        a.read_file(&id, "/etc/passwd")
            .await
            .err(409, "sandbox_not_running");
    });
}

#[test]
fn a_reattached_stream_says_why_it_ends_when_the_sandbox_dies() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("reattacher").await;
        let id = a.create_sandbox(json!({})).await;
        let bg = a.exec_background(&id, json!({"argv": ["sleep", "1000"]})).await;
        let mut attached = Lines::new(
            a.request(Method::GET, &format!("/v1/sandboxes/{id}/processes/{bg}/output"))
                .send()
                .await
                .expect("attach"),
        );
        assert_eq!(
            attached.next_within(SOON).await.expect("started")["type"],
            "started"
        );
        a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
        // An exec stream ends with `exit` or, when it broke off, `error` (ExecEvent's contract); a
        // foreground exec does send `error: sandbox_not_running` here. A followed re-attach must
        // too: a clean end of the body without either looks like a stream cut by the network.
        let rest = attached.rest(SOON).await;
        let last = rest.last();
        assert!(
            last.is_some_and(
                |e| e["type"] == "exit" || (e["type"] == "error" && e["code"] == "sandbox_not_running")
            ),
            "the re-attached stream ended without exit or error: {rest:?}"
        );
    });
}

#[test]
fn a_file_whose_size_is_unknown_downloads_whole() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("procfs").await;
        let id = a.create_sandbox(json!({})).await;
        // procfs files report size 0 but have content. The download must carry the content (or be
        // refused); a 200 with an empty body is a wrong answer that looks complete.
        for path in ["/proc/1/status", "/proc/meminfo"] {
            let expected = a.sh(&id, &format!("cat {path}")).await;
            assert!(!expected.is_empty());
            let r = a.read_file(&id, path).await;
            assert!(r.status < 500, "{path}: {r:?}");
            if r.status == 200 {
                assert!(
                    !r.body.is_empty(),
                    "GET files?path={path} answered 200 with an empty body (Content-Length: 0 from \
                     its stat size), but the file has {} bytes",
                    expected.len()
                );
            }
        }
    });
}

#[test]
fn a_fifo_is_a_client_error_not_a_server_error() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("fifo").await;
        let id = a.create_sandbox(json!({})).await;
        a.sh(&id, "mkfifo /home/user/fifo").await;
        // Reading or writing a FIFO (nobody on the other end) is the caller's mistake: a 4xx with a
        // stable code, not `500 internal` (which means "something failed inside paddock").
        let read = a.read_file(&id, "/home/user/fifo").await;
        let write = a.write_file(&id, "/home/user/fifo", "x").await;
        assert_eq!(
            a.sh(&id, "echo alive").await,
            "alive\n",
            "the agent still answers"
        );
        assert!(
            (400..500).contains(&read.status) && (400..500).contains(&write.status),
            "read: {read:?}\nwrite: {write:?}"
        );
    });
}

/// Snapshots, step transactions, forks, creation from a snapshot, and pause / resume through the API.
#[test]
fn snapshots_checkpoints_forks_and_pause() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("snapper").await;
        let b = h.admin.new_tenant("snoop").await;
        let id = a.create_sandbox(json!({})).await;
        a.sh(
            &id,
            "cd /home/user && echo one > f && mkdir d && echo keep > d/k && chmod 600 f && ln -s f link",
        )
        .await;

        // Step transaction: checkpoint, a destructive step, rollback restores exactly.
        let cp = a
            .post(&format!("/v1/sandboxes/{id}/checkpoint"), json!(null))
            .await
            .ok(201);
        assert_eq!(cp["kind"], "checkpoint");
        let before = a
            .sh(
                &id,
                "cd /home/user && stat -c '%n %a %U %s' f d/k link && readlink link",
            )
            .await;
        a.exec_background(&id, json!({"argv": ["sleep", "1000"]})).await;
        a.sh(
            &id,
            "cd /home/user && echo two > f && rm -r d && chmod 644 f && echo new > g",
        )
        .await;
        let rolled = a
            .post(&format!("/v1/sandboxes/{id}/rollback"), json!(null))
            .await
            .ok(200);
        assert_eq!(rolled["id"], id.as_str(), "the id stays");
        let after = a
            .sh(
                &id,
                "cd /home/user && stat -c '%n %a %U %s' f d/k link && readlink link",
            )
            .await;
        assert_eq!(after, before, "content, modes, owners and symlinks restored");
        assert_eq!(a.sh(&id, "cat /home/user/f /home/user/d/k").await, "one\nkeep\n");
        assert_eq!(a.sh(&id, "test -e /home/user/g || echo gone").await, "gone\n");
        assert_eq!(
            a.sh(&id, "pgrep -x sleep || echo none").await,
            "none\n",
            "processes restart with a rollback"
        );
        // The rollback consumed the checkpoint.
        a.post(&format!("/v1/sandboxes/{id}/rollback"), json!(null))
            .await
            .err(404, "snapshot_not_found");
        // Commit drops a checkpoint and keeps the step.
        a.post(&format!("/v1/sandboxes/{id}/checkpoint"), json!(null))
            .await
            .ok(201);
        a.sh(&id, "echo kept > /home/user/step").await;
        a.post(&format!("/v1/sandboxes/{id}/commit"), json!(null))
            .await
            .ok(200);
        a.post(&format!("/v1/sandboxes/{id}/commit"), json!(null))
            .await
            .err(404, "snapshot_not_found");

        // Diff since a checkpoint: what was added, modified and deleted, with a text diff.
        a.post(&format!("/v1/sandboxes/{id}/checkpoint"), json!(null))
            .await
            .ok(201);
        a.sh(
            &id,
            "cd /home/user && echo changed > step && rm link && echo fresh > added",
        )
        .await;
        let diff = a
            .get_q(&format!("/v1/sandboxes/{id}/diff"), &[("text", "true")])
            .await
            .ok(200);
        let change = |path: &str| {
            diff["entries"]
                .as_array()
                .expect("entries")
                .iter()
                .find(|e| e["path"] == path)
                .map(|e| e["change"].as_str().unwrap_or_default().to_owned())
        };
        assert_eq!(change("/home/user/step").as_deref(), Some("modified"), "{diff:#}");
        assert_eq!(change("/home/user/link").as_deref(), Some("deleted"), "{diff:#}");
        assert_eq!(change("/home/user/added").as_deref(), Some("added"), "{diff:#}");
        assert_eq!(
            change("/home/user/f"),
            None,
            "an unchanged file is not listed: {diff:#}"
        );
        let step = diff["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .find(|e| e["path"] == "/home/user/step")
            .expect("step");
        let unified = step["unified"].as_str().expect("a text diff");
        assert!(
            unified.contains("-kept") && unified.contains("+changed"),
            "{unified}"
        );
        a.post(&format!("/v1/sandboxes/{id}/rollback"), json!(null))
            .await
            .ok(200);
        assert_eq!(
            a.sh(&id, "cat /home/user/step; readlink /home/user/link").await,
            "kept\nf\n"
        );
        assert_eq!(a.sh(&id, "cat /home/user/step").await, "kept\n");

        // A named snapshot, forks and a sandbox created from the snapshot never see each other's writes.
        let snap = a
            .post(
                &format!("/v1/sandboxes/{id}/snapshots"),
                json!({"name": "base", "labels": {"x": "1"}}),
            )
            .await
            .ok(201);
        let sid = snap["id"].as_str().expect("snapshot id").to_owned();
        let forks = a
            .post(&format!("/v1/sandboxes/{id}/fork"), json!({"count": 3}))
            .await
            .ok(201);
        let copies: Vec<String> = forks["sandboxes"]
            .as_array()
            .expect("sandboxes")
            .iter()
            .map(|s| s["id"].as_str().expect("id").to_owned())
            .collect();
        assert_eq!(copies.len(), 3);
        for (i, copy) in copies.iter().enumerate() {
            assert_ne!(copy, &id);
            assert_eq!(a.sh(copy, "cat /home/user/f").await, "one\n");
            a.sh(copy, &format!("echo {i} > /home/user/mine")).await;
        }
        for (i, copy) in copies.iter().enumerate() {
            assert_eq!(a.sh(copy, "cat /home/user/mine").await, format!("{i}\n"));
        }
        assert_eq!(
            a.sh(&id, "test -e /home/user/mine || echo absent").await,
            "absent\n"
        );
        a.sh(&id, "echo parent > /home/user/parent-only").await;
        let from_snap = a.create_sandbox(json!({"snapshot": sid})).await;
        assert_eq!(
            a.sh(
                &from_snap,
                "cat /home/user/step; test -e /home/user/parent-only || echo absent"
            )
            .await,
            "kept\nabsent\n"
        );
        for copy in &copies {
            assert_eq!(
                a.sh(copy, "test -e /home/user/parent-only || echo absent").await,
                "absent\n"
            );
        }

        // Another tenant sees none of it.
        b.get(&format!("/v1/snapshots/{sid}"))
            .await
            .err(404, "snapshot_not_found");
        b.delete(&format!("/v1/snapshots/{sid}"))
            .await
            .err(404, "snapshot_not_found");
        b.post("/v1/sandboxes", json!({"snapshot": sid}))
            .await
            .err(404, "snapshot_not_found");
        let listed = b.get("/v1/snapshots").await.ok(200);
        assert!(
            listed["snapshots"].as_array().expect("list").is_empty(),
            "{listed}"
        );
        let mine = a.get_q("/v1/snapshots", &[("sandbox", &id)]).await.ok(200);
        assert_eq!(mine["snapshots"].as_array().expect("list").len(), 1, "{mine}");
        let got = a.get(&format!("/v1/snapshots/{sid}")).await.ok(200);
        assert_eq!(got["name"], "base");
        assert!(got["referenced_bytes"].as_u64().is_some(), "{got}");

        // Pause freezes: no CPU is used, the agent is not asked; resume thaws.
        a.exec_background(&from_snap, json!({"argv": ["sh", "-c", "while :; do :; done"]}))
            .await;
        let paused = a
            .post(&format!("/v1/sandboxes/{from_snap}/pause"), json!(null))
            .await
            .ok(200);
        assert_eq!(paused["paused"], true);
        let cpu = |u: Value| u["cpu_time_us"].as_u64().expect("cpu");
        let t0 = cpu(a.get(&format!("/v1/sandboxes/{from_snap}/usage")).await.ok(200));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t1 = cpu(a.get(&format!("/v1/sandboxes/{from_snap}/usage")).await.ok(200));
        assert!(
            t1 - t0 < 20_000,
            "a paused sandbox used {} µs of CPU in 0.5 s",
            t1 - t0
        );
        a.post(
            &format!("/v1/sandboxes/{from_snap}/exec"),
            json!({"argv": ["true"]}),
        )
        .await
        .err(409, "sandbox_not_running");
        let resumed = a
            .post(&format!("/v1/sandboxes/{from_snap}/resume"), json!(null))
            .await
            .ok(200);
        assert_eq!(resumed["paused"], false);
        // On a loaded host the thawed loop may get little CPU at first: wait (with a deadline) for it
        // to use 50 ms.
        poll(SOON, "the resumed busy loop to use CPU again", || async {
            let t2 = cpu(a.get(&format!("/v1/sandboxes/{from_snap}/usage")).await.ok(200));
            (t2 - t1 > 50_000).then_some(())
        })
        .await;

        // Deleting the snapshot does not touch the sandboxes made from it.
        a.delete(&format!("/v1/snapshots/{sid}")).await.ok(204);
        a.get(&format!("/v1/snapshots/{sid}"))
            .await
            .err(404, "snapshot_not_found");
        assert_eq!(a.sh(&from_snap, "cat /home/user/f").await, "one\n");
        // Killing a paused-then-resumed sandbox and the forks leaves nothing (the harness checks).
        let actions: Vec<String> = a
            .audit_rows(&[("action", "sandbox.")])
            .await
            .iter()
            .map(|r| r["action"].as_str().unwrap_or_default().to_owned())
            .collect();
        for wanted in [
            "sandbox.checkpoint",
            "sandbox.rollback",
            "sandbox.commit",
            "sandbox.fork",
            "sandbox.pause",
            "sandbox.resume",
        ] {
            assert!(
                actions.iter().any(|a| a == wanted),
                "no {wanted} row in {actions:?}"
            );
        }
    });
}

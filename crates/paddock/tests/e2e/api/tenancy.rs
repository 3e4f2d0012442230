//! Tenant isolation: another tenant's sandbox answers every documented sandbox route (read from the
//! OpenAPI document the server serves) exactly as one that never existed, and is left untouched;
//! the audit log shows each tenant its own rows; admin-only operations, the last admin key, missing,
//! invalid and revoked keys (`Authorization` and `X-API-Key` alike).

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use reqwest::Method;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::support::harness::{Client, Harness};

use super::{tar_of, JSON, NDJSON, NO_SUCH_SANDBOX, SSE};

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
        ("POST", "/v1/sandboxes/{id}/code") => vec![
            http(Method::POST, "/v1/sandboxes/{id}/code")
                .json(json!({"code": "open('/etc/hostname').read()"})),
            http(Method::POST, "/v1/sandboxes/{id}/code")
                .json(json!({"code": "echo hi", "language": "bash"})),
            http(Method::POST, "/v1/sandboxes/{id}/code").json(json!({"code": "1", "context": "python"})),
        ],
        ("POST", "/v1/sandboxes/{id}/contexts") => vec![
            http(Method::POST, "/v1/sandboxes/{id}/contexts"),
            http(Method::POST, "/v1/sandboxes/{id}/contexts").json(json!({"language": "python"})),
        ],
        ("GET", "/v1/sandboxes/{id}/contexts") => vec![http(Method::GET, "/v1/sandboxes/{id}/contexts")],
        ("POST", "/v1/sandboxes/{id}/contexts/{context}/restart") => {
            vec![http(Method::POST, "/v1/sandboxes/{id}/contexts/python/restart")]
        }
        ("DELETE", "/v1/sandboxes/{id}/contexts/{context}") => {
            vec![http(Method::DELETE, "/v1/sandboxes/{id}/contexts/python")]
        }
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
        ("GET", "/v1/sandboxes/{id}/policy") => vec![http(Method::GET, "/v1/sandboxes/{id}/policy")],
        ("PUT", "/v1/sandboxes/{id}/policy") => {
            vec![http(Method::PUT, "/v1/sandboxes/{id}/policy").json(json!({"policy": {"default": "allow"}}))]
        }
        ("DELETE", "/v1/sandboxes/{id}/policy") => {
            vec![http(Method::DELETE, "/v1/sandboxes/{id}/policy")]
        }
        ("GET", "/v1/sandboxes/{id}/diff") => vec![
            http(Method::GET, "/v1/sandboxes/{id}/diff"),
            http(Method::GET, "/v1/sandboxes/{id}/diff").query("text", "true"),
        ],
        // A sandbox's ports (nothing listens on them: the answer must not say so to another tenant).
        (m, "/v1/sandboxes/{id}/ports/{port}/http/") => {
            vec![http(
                m.parse().expect("method"),
                "/v1/sandboxes/{id}/ports/8000/http/",
            )]
        }
        (m, "/v1/sandboxes/{id}/ports/{port}/http/{path}") => vec![
            http(
                m.parse().expect("method"),
                "/v1/sandboxes/{id}/ports/8000/http/index.html",
            ),
            http(m.parse().expect("method"), "/v1/sandboxes/{id}/ports/1/http/x").query("q", "1"),
        ],
        ("GET", "/v1/sandboxes/{id}/ports/{port}/tcp") => vec![Probe::Ws {
            path: "/v1/sandboxes/{id}/ports/8000/tcp",
            query: "",
            first: None,
        }],
        _ => return None,
    };
    Some(p)
}

#[test]
fn tenant_isolation_over_every_endpoint() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("tenant-a").await;
        // B may do everything a key can (approval policies too), so each route meets its lookup.
        let b = h
            .admin
            .new_tenant_with("tenant-b", json!({"approver": true}))
            .await;
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

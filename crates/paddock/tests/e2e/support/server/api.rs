//! A client of a real server's REST API, with one key per call.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::REQUEST_TIMEOUT;

/// An HTTP response: status and body.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON, asserting a 2xx status.
    #[track_caller]
    pub fn json(&self) -> Value {
        assert!(self.status.is_success(), "HTTP {}: {}", self.status, self.text());
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The body as JSON, whatever the status (an error's `{code, message}` too).
    #[track_caller]
    pub fn json_any(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("HTTP {}: not JSON ({e}): {}", self.status, self.text()))
    }

    /// The lines of an NDJSON body.
    #[track_caller]
    pub fn ndjson(&self) -> Vec<Value> {
        assert!(self.status.is_success(), "HTTP {}: {}", self.status, self.text());
        self.text()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad NDJSON line ({e}): {l}")))
            .collect()
    }
}

/// A client of a server's REST API (cheap to clone; clones share connections).
#[derive(Debug, Clone)]
pub struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    pub fn new(base: &str) -> Api {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .expect("HTTP client");
        Api {
            base: base.to_owned(),
            http,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A request whose body is `body` as `content_type` (an upload, an archive).
    pub async fn send_bytes(
        &self,
        key: &str,
        method: Method,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Reply {
        let resp = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path}: no answer: {e}"));
        let status = resp.status();
        let body = resp.bytes().await.expect("body").to_vec();
        Reply { status, body }
    }

    /// One request; `Err` only when no answer came (connection refused or broken, timeout).
    pub async fn try_request(
        &self,
        key: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
        accept: Option<&str>,
    ) -> Result<Reply, reqwest::Error> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key);
        if let Some(body) = body {
            req = req.json(body);
        }
        if let Some(accept) = accept {
            req = req.header(reqwest::header::ACCEPT, accept);
        }
        let resp = req.send().await?;
        let status = resp.status();
        let body = resp.bytes().await?.to_vec();
        Ok(Reply { status, body })
    }

    pub async fn request(
        &self,
        key: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
        accept: Option<&str>,
    ) -> Reply {
        let shown = format!("{method} {path}");
        self.try_request(key, method, path, body, accept)
            .await
            .unwrap_or_else(|e| panic!("{shown}: {e}"))
    }

    /// `GET path` answered with JSON (asserting 2xx).
    pub async fn get(&self, key: &str, path: &str) -> Value {
        self.request(key, Method::GET, path, None, None).await.json()
    }

    /// `POST path` with a JSON body, answered with JSON (asserting 2xx).
    pub async fn post(&self, key: &str, path: &str, body: &Value) -> Value {
        self.request(key, Method::POST, path, Some(body), None)
            .await
            .json()
    }

    /// Creates an API key for `tenant` with `admin_key`; returns the key.
    pub async fn create_key(&self, admin_key: &str, tenant: &str) -> String {
        let created = self
            .post(admin_key, "/v1/keys", &json!({ "tenant": tenant, "name": "e2e" }))
            .await;
        created["key"].as_str().expect("key").to_owned()
    }

    /// Makes `tenant`'s quota unlimited.
    pub async fn unlimited_quota(&self, admin_key: &str, tenant: &str) {
        self.request(
            admin_key,
            Method::PUT,
            &format!("/v1/tenants/{tenant}/quota"),
            Some(&json!({})),
            None,
        )
        .await
        .json();
    }

    /// Creates a sandbox; returns its info.
    pub async fn create_sandbox(&self, key: &str, body: &Value) -> Value {
        let reply = self
            .request(key, Method::POST, "/v1/sandboxes", Some(body), None)
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
        reply.json()
    }

    pub async fn sandbox(&self, key: &str, id: &str) -> Value {
        self.get(key, &format!("/v1/sandboxes/{id}")).await
    }

    /// Kills and removes a sandbox.
    pub async fn delete_sandbox(&self, key: &str, id: &str) {
        let reply = self
            .request(key, Method::DELETE, &format!("/v1/sandboxes/{id}"), None, None)
            .await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    }

    /// A foreground exec answered in the `accept` format; `Err` when no answer came.
    pub async fn try_exec(&self, key: &str, id: &str, req: &Value, accept: &str) -> Result<Reply, String> {
        self.try_request(
            key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(req),
            Some(accept),
        )
        .await
        .map_err(|e| e.to_string())
    }

    /// A foreground exec answered as one JSON document (`ExecResult`).
    pub async fn exec_json(&self, key: &str, id: &str, req: &Value) -> Reply {
        self.request(
            key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(req),
            Some("application/json"),
        )
        .await
    }

    /// A foreground exec streamed as NDJSON events.
    pub async fn exec_ndjson(&self, key: &str, id: &str, req: &Value) -> Reply {
        self.request(
            key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(req),
            Some("application/x-ndjson"),
        )
        .await
    }

    /// Runs `script` with `sh -c` and returns its stdout, asserting exit status 0.
    pub async fn sh(&self, key: &str, id: &str, script: &str) -> String {
        let result = self.exec_json(key, id, &json!({ "shell": script })).await.json();
        assert_eq!(result["exit"]["exit_code"], 0, "`{script}` in {id}: {result}");
        result["stdout"].as_str().expect("stdout").to_owned()
    }

    /// Every audit row (admin key), oldest first.
    pub async fn audit_all(&self, admin_key: &str) -> Vec<Value> {
        self.audit_rows(admin_key, "").await
    }

    /// Every audit row matching `filter` (a query string without `limit`/`after_seq`, e.g.
    /// `action=process.`), oldest first.
    pub async fn audit_rows(&self, admin_key: &str, filter: &str) -> Vec<Value> {
        let mut rows = Vec::new();
        let mut after = None::<u64>;
        loop {
            let mut path = String::from("/v1/audit?limit=1000");
            if !filter.is_empty() {
                path.push('&');
                path.push_str(filter);
            }
            if let Some(a) = after {
                path.push_str(&format!("&after_seq={a}"));
            }
            let page = self.get(admin_key, &path).await;
            rows.extend(page["records"].as_array().expect("records").iter().cloned());
            match page["next_after_seq"].as_u64() {
                Some(next) => after = Some(next),
                None => return rows,
            }
        }
    }

    /// `GET /v1/audit/verify`.
    pub async fn verify_audit(&self, admin_key: &str) -> Value {
        self.get(admin_key, "/v1/audit/verify").await
    }

    /// The value of one metric series, e.g. `paddock_warm_pool_size{template="default"}`.
    pub async fn metric(&self, key: &str, series: &str) -> Option<f64> {
        let text = self
            .request(key, Method::GET, "/metrics", None, None)
            .await
            .text();
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(series)?;
            rest.strip_prefix(' ')?.trim().parse().ok()
        })
    }

    /// Waits until the default template's warm pool holds `n` sandboxes.
    pub async fn wait_warm_pool(&self, key: &str, n: u32, deadline: Duration) {
        let series = "paddock_warm_pool_size{template=\"default\"}";
        let start = Instant::now();
        loop {
            let have = self.metric(key, series).await;
            if have == Some(f64::from(n)) {
                return;
            }
            assert!(
                start.elapsed() < deadline,
                "the warm pool did not reach {n} within {deadline:?} (it holds {have:?})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Waits for `cond` with a deadline (async).
pub async fn wait_for(deadline: Duration, mut cond: impl AsyncFnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cond().await
}

//! Interactive exec: a PTY resized while it runs, exec over WebSockets (text and binary frames,
//! errors on the handshake), and a foreground client that disconnects, which kills its process.

use std::time::{Duration, Instant};

use futures_util::{SinkExt as _, StreamExt as _};
use reqwest::Method;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::support::harness::{poll, Client, Harness, Lines, WsStream};

use super::exec::{event_bytes, exit_of, process_when, read_until};
use super::{NDJSON, NO_SUCH_SANDBOX, SOON, SSE};

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

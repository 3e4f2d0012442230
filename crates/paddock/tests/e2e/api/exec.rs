//! Exec semantics: output streamed as NDJSON or SSE or collected as JSON, stdin, background
//! processes re-attached from an offset, signals and kills, and how a stream ends when its sandbox
//! is killed or dies.

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use paddock_types::api::StreamData;
use reqwest::Method;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::support::harness::{poll, Client, Harness, Lines};

use super::{JSON, NDJSON, SOON, SSE};

/// The bytes of an output event (`data` or `data_b64`), read with the clients' one decoder.
pub(super) fn event_bytes(event: &Value) -> Vec<u8> {
    let data: StreamData =
        serde_json::from_value(event.clone()).unwrap_or_else(|e| panic!("no output in {event}: {e}"));
    data.bytes().unwrap_or_else(|e| panic!("{e}: {event}"))
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
pub(super) async fn read_until(lines: &mut Lines, needle: &str) -> String {
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
pub(super) async fn process_when(
    a: &Client,
    id: &str,
    pid: u64,
    what: &str,
    cond: impl Fn(&Value) -> bool,
) -> Value {
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
pub(super) async fn exit_of(a: &Client, id: &str, pid: u64) -> Value {
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

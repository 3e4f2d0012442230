//! process.Process: Start (output, exit codes, users, working directories, deadlines, keepalives),
//! a process outliving its stream, Connect, List, SendInput, StreamInput, CloseStdin, SendSignal,
//! Update, and a sandbox that ends under a stream.

use axum::body::Body;
use axum::http::StatusCode;
use base64::Engine as _;
use serde_json::json;

use crate::support::{end_error, envelope, start_body, stdout_of, Env, Frames};

const START: &str = "/process.Process/Start";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_streams_start_output_and_end() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    let frames = env
        .stream(&id, START, start_body("echo hello; pwd; whoami"), &[])
        .await
        .all()
        .await;
    assert_eq!(frames[0].kind(), "start", "{frames:?}");
    let pid = frames[0].event()["pid"].as_u64().expect("a pid");
    assert!(pid > 0);
    assert_eq!(stdout_of(&frames), "hello\n/home/user\nuser\n");
    let end = frames.iter().find(|f| f.kind() == "end").expect("an end event");
    assert_eq!(end.event()["exited"], true);
    assert_eq!(end.event()["status"], "exit status 0");
    assert!(end.event().get("exitCode").is_none(), "0 is left out");
    assert!(end_error(&frames).is_none(), "a clean end: {frames:?}");

    let frames = env
        .stream(&id, START, start_body("echo oops >&2; exit 3"), &[])
        .await
        .all()
        .await;
    let end = frames.iter().find(|f| f.kind() == "end").expect("an end event");
    assert_eq!(end.event()["exitCode"], 3);
    assert_eq!(end.event()["status"], "exit status 3");
    let stderr = frames
        .iter()
        .find_map(|f| f.event()["stderr"].as_str().map(str::to_owned));
    assert_eq!(stderr.as_deref(), Some("b29wcwo="), "stderr as base64");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_working_directories_and_environment() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    let root = [("authorization", "Basic cm9vdDo=")];
    let frames = env
        .stream(&id, START, start_body("whoami"), &root)
        .await
        .all()
        .await;
    assert_eq!(stdout_of(&frames), "root\n");
    // Without a working directory: the user's home.
    let frames = env.stream(&id, START, start_body("pwd"), &root).await.all().await;
    assert_eq!(stdout_of(&frames), "/root\n");
    let frames = env.stream(&id, START, start_body("pwd"), &[]).await.all().await;
    assert_eq!(stdout_of(&frames), "/home/user\n");
    // Relative and ~ working directories resolve against the user's home.
    let body = json!({"process": {"cmd": "pwd", "cwd": "~"}});
    let frames = env.stream(&id, START, body, &root).await.all().await;
    assert_eq!(stdout_of(&frames), "/root\n");
    let body = json!({"process": {"cmd": "pwd", "cwd": "../user/./"}});
    let frames = env.stream(&id, START, body, &[]).await.all().await;
    assert_eq!(stdout_of(&frames), "/home/user\n");
    let body = json!({"process": {"cmd": "/bin/bash", "args": ["-c", "echo $GREETING"], "envs": {"GREETING": "hi"}}});
    let frames = env.stream(&id, START, body, &[]).await.all().await;
    assert_eq!(stdout_of(&frames), "hi\n");
    // A missing working directory, before any event.
    let body = json!({"process": {"cmd": "pwd", "cwd": "/nope"}});
    let frames = env.stream(&id, START, body, &[]).await.all().await;
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(
        end_error(&frames),
        Some(("invalid_argument".into(), "cwd '/nope' does not exist".into()))
    );
    // An unknown user.
    let nobody = [("authorization", "Basic Z2hvc3Q6")];
    let frames = env
        .stream(&id, START, start_body("true"), &nobody)
        .await
        .all()
        .await;
    assert_eq!(
        end_error(&frames),
        Some(("unauthenticated".into(), "invalid username: 'ghost'".into()))
    );
    // ... also with an absolute or a relative working directory.
    for cwd in ["/tmp", "work"] {
        let body = json!({"process": {"cmd": "true", "cwd": cwd}});
        let frames = env.stream(&id, START, body, &nobody).await.all().await;
        assert_eq!(
            end_error(&frames),
            Some(("unauthenticated".into(), "invalid username: 'ghost'".into())),
            "{cwd}"
        );
    }
    // No command.
    let frames = env.stream(&id, START, json!({}), &[]).await.all().await;
    assert_eq!(
        end_error(&frames).map(|e| e.0).as_deref(),
        Some("invalid_argument")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_outlives_its_stream_and_is_found_again() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    let body = json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "sleep 1000"]}, "tag": "web", "stdin": false});
    let mut stream = env.stream(&id, START, body, &[]).await;
    let start = stream.until("start").await;
    let pid = start.event()["pid"].as_u64().expect("pid");
    drop(stream);

    // Still running: listed with its tag and command.
    let (status, list) = env.unary(&id, "/process.Process/List", json!({}), &[]).await;
    assert_eq!(status, StatusCode::OK);
    let listed = list["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == pid)
        .cloned()
        .expect("listed");
    assert_eq!(listed["tag"], "web");
    assert_eq!(listed["config"]["cmd"], "/bin/bash");
    assert_eq!(listed["config"]["args"], json!(["-l", "-c", "sleep 1000"]));

    // Connect by tag: start, then (after a kill) the end of a signalled process.
    let mut connected = env
        .stream(
            &id,
            "/process.Process/Connect",
            json!({"process": {"tag": "web"}}),
            &[],
        )
        .await;
    let first = connected.until("start").await;
    assert_eq!(first.event()["pid"].as_u64(), Some(pid));
    let (status, _) = env
        .unary(
            &id,
            "/process.Process/SendSignal",
            json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let end = connected.until("end").await;
    assert_eq!(end.event()["exitCode"], -1);
    assert_eq!(end.event()["status"], "signal: killed");
    let rest = connected.all().await;
    assert!(end_error(&rest).is_none(), "{rest:?}");

    // No longer listed, and no longer signalled.
    let (_, list) = env.unary(&id, "/process.Process/List", json!({}), &[]).await;
    assert!(!list.to_string().contains(&format!("\"pid\":{pid},")));
    let (status, body) = env
        .unary(
            &id,
            "/process.Process/SendSignal",
            json!({"process": {"pid": 999_999}, "signal": "SIGNAL_SIGTERM"}),
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        body,
        json!({"code": "not_found", "message": "process with pid 999999 not found"})
    );
    let (status, body) = env
        .unary(
            &id,
            "/process.Process/SendSignal",
            json!({"process": {"pid": pid}, "signal": "SIGNAL_UNSPECIFIED"}),
            &[],
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_IMPLEMENTED, Some("unimplemented"))
    );
    let frames = env
        .stream(
            &id,
            "/process.Process/Connect",
            json!({"process": {"tag": "nope"}}),
            &[],
        )
        .await
        .all()
        .await;
    assert_eq!(end_error(&frames).map(|e| e.0).as_deref(), Some("not_found"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_by_send_input_stream_input_and_close_stdin() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    let body = json!({"process": {"cmd": "cat"}, "stdin": true});
    let mut stream = env.stream(&id, START, body, &[]).await;
    let pid = stream.until("start").await.event()["pid"].as_u64().expect("pid");
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let (status, _) = env
        .unary(
            &id,
            "/process.Process/SendInput",
            json!({"process": {"pid": pid}, "input": {"stdin": b64("one\n")}}),
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let data = stream.until("data").await;
    assert_eq!(data.event()["stdout"], b64("one\n"));

    // StreamInput: start, then data, sent as one chunked body.
    let messages = [
        envelope(
            0,
            json!({"start": {"process": {"pid": pid}}}).to_string().as_bytes(),
        ),
        envelope(0, json!({"keepalive": {}}).to_string().as_bytes()),
        envelope(
            0,
            json!({"data": {"input": {"stdin": b64("two\n")}}})
                .to_string()
                .as_bytes(),
        ),
    ];
    let chunks = futures_util::stream::iter(messages.into_iter().map(Ok::<_, std::io::Error>));
    let req = env.request(
        id.as_str(),
        "/process.Process/StreamInput",
        "application/connect+json",
        Body::from_stream(chunks),
        &[],
    );
    let resp = env.send(req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let frames = Frames::from(resp).all().await;
    assert_eq!(frames.len(), 2, "one message, then the end: {frames:?}");
    assert_eq!(frames[0].json, json!({}));
    assert!(end_error(&frames).is_none());
    assert_eq!(stream.until("data").await.event()["stdout"], b64("two\n"));

    let (status, _) = env
        .unary(
            &id,
            "/process.Process/CloseStdin",
            json!({"process": {"pid": pid}}),
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let end = stream.until("end").await;
    assert_eq!(end.event()["status"], "exit status 0");

    // Input that does not start with a start event.
    let body = envelope(
        0,
        json!({"data": {"input": {"stdin": b64("x")}}})
            .to_string()
            .as_bytes(),
    );
    let req = env.request(
        id.as_str(),
        "/process.Process/StreamInput",
        "application/connect+json",
        Body::from(body),
        &[],
    );
    let frames = Frames::from(env.send(req).await).all().await;
    assert_eq!(
        end_error(&frames).map(|e| e.0).as_deref(),
        Some("failed_precondition")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_is_the_process_lifetime_and_quiet_streams_get_keepalives() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    let headers = [("connect-timeout-ms", "300"), ("keepalive-ping-interval", "1")];
    let frames = env
        .stream(&id, START, start_body("sleep 1000"), &headers)
        .await
        .all()
        .await;
    assert_eq!(frames[0].kind(), "start");
    assert!(
        !frames.iter().any(|f| f.kind() == "end"),
        "no end event: {frames:?}"
    );
    assert_eq!(
        end_error(&frames).map(|e| e.0).as_deref(),
        Some("deadline_exceeded")
    );

    let mut quiet = env
        .stream(
            &id,
            START,
            start_body("sleep 1000"),
            &[("keepalive-ping-interval", "1")],
        )
        .await;
    assert_eq!(quiet.next().await.expect("start").kind(), "start");
    let next = quiet.next().await.expect("a keepalive");
    assert_eq!(next.json, json!({"event": {"keepalive": {}}}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_processes_take_input_and_resizes() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    let body = json!({"process": {"cmd": "cat"}, "pty": {"size": {"cols": 80, "rows": 24}}});
    let mut stream = env.stream(&id, START, body, &[]).await;
    let pid = stream.until("start").await.event()["pid"].as_u64().expect("pid");
    let (status, _) = env
        .unary(
            &id,
            "/process.Process/SendInput",
            json!({"process": {"pid": pid}, "input": {"pty": "aGkK"}}),
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let data = stream.until("data").await;
    assert_eq!(data.event()["pty"], "aGkK");
    let (status, body) = env
        .unary(
            &id,
            "/process.Process/Update",
            json!({"process": {"pid": pid}, "pty": {"size": {"cols": 100, "rows": 30}}}),
            &[],
        )
        .await;
    assert_eq!((status, body), (StatusCode::OK, json!({})));
    let (status, _) = env
        .unary(
            &id,
            "/process.Process/SendSignal",
            json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stream.until("end").await.event()["status"], "signal: killed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_that_ends_under_a_stream_was_not_found() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    let mut stream = env.stream(&id, START, start_body("sleep 1000"), &[]).await;
    stream.until("start").await;
    env.service.kill_sandbox(&env.a, &id).await.expect("killed");
    let frames = stream.all().await;
    let (code, message) = end_error(&frames).expect("an error end");
    assert_eq!(code, "unavailable");
    assert!(message.contains("was not found"), "{message}");
}

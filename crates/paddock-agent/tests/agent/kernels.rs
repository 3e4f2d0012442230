//! Code kernels against a real ipykernel (`python3-ipykernel`, `python3-matplotlib`): state between
//! cells, errors, streaming order, results and displays, time limits, interrupts, huge output, a
//! kernel killed mid-cell, and shutdown. The kernels run as root: the test root lives in a
//! temporary directory only root may enter (the agent itself runs them as any user of the root's
//! passwd, with the same privilege drop as every spawn).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use paddock_protocol::kernel::{CellEvent, CellStatus, CellStream, KernelStart, MAX_CELL_EVENT_LEN};
use paddock_protocol::ErrorCode;
use paddock_runtime::agent_client::{AgentClient, AgentClientError, CellEvents};

use crate::harness::{exists, require_root, wait_gone, TestAgent};

/// How long one cell may take in these tests before the test fails.
const CELL_DEADLINE: Duration = Duration::from_secs(60);

/// Fails loudly when the host lacks ipykernel (never a silent skip).
fn require_ipykernel() {
    let ok = Command::new("/usr/bin/python3")
        .args(["-c", "import ipykernel, matplotlib"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "these tests need /usr/bin/python3 with ipykernel and matplotlib (apt-get install python3-ipykernel python3-matplotlib)"
    );
}

fn ipykernel(agent: &TestAgent, kernel_id: &str) -> KernelStart {
    let home = agent.host_path("/root").to_string_lossy().into_owned();
    KernelStart {
        kernel_id: kernel_id.to_owned(),
        argv: [
            "/usr/bin/python3",
            "-m",
            "ipykernel_launcher",
            "-f",
            "{connection_file}",
            // As paddock starts Python contexts (`plan/code.rs`).
            "--HistoryManager.enabled=False",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect(),
        cwd: None,
        env: BTreeMap::from([
            ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
            ("HOME".to_owned(), home),
            ("MPLBACKEND".to_owned(), "Agg".to_owned()),
        ]),
        user: Some("root".to_owned()),
        ready_timeout_ms: 60_000,
        interrupt: Default::default(),
        barrier: None,
    }
}

/// Every event of a cell up to its end.
async fn run(client: &AgentClient, kernel_id: &str, code: &str, timeout_ms: Option<u64>) -> Vec<CellEvent> {
    let events = client
        .kernel_execute(kernel_id, code, timeout_ms, false, None)
        .await
        .expect("execute");
    collect(events).await
}

async fn collect(mut events: CellEvents) -> Vec<CellEvent> {
    let mut all = Vec::new();
    loop {
        let event = tokio::time::timeout(CELL_DEADLINE, events.next())
            .await
            .unwrap_or_else(|_| panic!("cell did not end in time; so far {all:?}"))
            .unwrap_or_else(|| panic!("events ended without an end; so far {all:?}"));
        let end = matches!(event, CellEvent::End { .. });
        all.push(event);
        if end {
            return all;
        }
    }
}

fn status(events: &[CellEvent]) -> CellStatus {
    match events.last() {
        Some(CellEvent::End { status, .. }) => *status,
        other => panic!("no end: {other:?}"),
    }
}

fn stdout(events: &[CellEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            CellEvent::Stream {
                name: CellStream::Stdout,
                text,
            } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// Waits for the cell's `ExecutionCount` (the kernel started running it).
async fn wait_running(events: &mut CellEvents) {
    loop {
        match tokio::time::timeout(CELL_DEADLINE, events.next()).await {
            Ok(Some(CellEvent::ExecutionCount { .. })) => return,
            Ok(Some(_)) => {}
            other => panic!("the cell did not start: {other:?}"),
        }
    }
}

fn agent_code(err: AgentClientError) -> (ErrorCode, String) {
    match err {
        AgentClientError::Agent(err) => (err.code, err.message),
        other => panic!("not an agent error: {other:?}"),
    }
}

#[tokio::test]
async fn cells_keep_state_stream_in_order_and_show_results() {
    require_root!();
    require_ipykernel();
    let (agent, client) = TestAgent::start().await;
    let info = client.kernel_start(ipykernel(&agent, "k1")).await.expect("start");
    assert_eq!(info.language, "python");
    assert!(info.implementation.contains("python"), "{info:?}");
    assert!(info.pid > 0);
    let listed = client.list_processes().await.expect("list");
    assert!(
        listed
            .iter()
            .any(|p| p.pid == info.pid && p.tag.as_deref() == Some("kernel")),
        "the kernel is listed with tag kernel"
    );
    let err = client
        .kernel_start(ipykernel(&agent, "k1"))
        .await
        .expect_err("same id");
    assert_eq!(agent_code(err).0, ErrorCode::BadRequest);

    let events = run(&client, "k1", "x = 1", None).await;
    assert_eq!(status(&events), CellStatus::Ok, "{events:?}");
    let events = run(&client, "k1", "x + 1", None).await;
    assert!(
        matches!(events[0], CellEvent::ExecutionCount { count: 2 }),
        "{events:?}"
    );
    let result = events.iter().find_map(|e| match e {
        CellEvent::Result { main: true, data, .. } => Some(data),
        _ => None,
    });
    assert_eq!(
        result.and_then(|d| d.get("text/plain")).and_then(|v| v.as_str()),
        Some("2"),
        "{events:?}"
    );
    assert_eq!(status(&events), CellStatus::Ok);

    let events = run(&client, "k1", "1 / 0", None).await;
    assert_eq!(status(&events), CellStatus::Error, "{events:?}");
    let error = events.iter().find_map(|e| match e {
        CellEvent::Error {
            name,
            value,
            traceback,
        } => Some((name, value, traceback)),
        _ => None,
    });
    let (name, value, traceback) = error.expect("an error event");
    assert_eq!(name, "ZeroDivisionError");
    assert!(value.contains("division by zero"), "{value}");
    assert!(!traceback.is_empty());
    let events = run(&client, "k1", "print(x)", None).await;
    assert_eq!(
        (status(&events), stdout(&events).as_str()),
        (CellStatus::Ok, "1\n")
    );

    // `a` is relayed while the cell still sleeps: it comes in an event of its own, before `b`'s.
    let events = run(
        &client,
        "k1",
        "import time\nprint('a', flush=True)\ntime.sleep(1)\nprint('b')",
        None,
    )
    .await;
    let streams: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            CellEvent::Stream { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(streams, vec!["a\n", "b\n"], "{events:?}");

    let events = run(
        &client,
        "k1",
        "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
        None,
    )
    .await;
    assert_eq!(status(&events), CellStatus::Ok, "{events:?}");
    let png = events.iter().find_map(|e| match e {
        CellEvent::Result {
            main: false, data, ..
        } => data.get("image/png"),
        _ => None,
    });
    assert!(
        png.and_then(|v| v.as_str())
            .is_some_and(|s| s.starts_with("iVBOR")),
        "a display with a PNG: {events:?}"
    );

    let dir = agent.host_path("/tmp/.paddock-kernels-0");
    assert_eq!(std::fs::read_dir(&dir).expect("kernel dir").count(), 1);
    client.kernel_shutdown("k1").await.expect("shutdown");
    assert!(
        wait_gone(info.pid, Duration::from_secs(10)).await,
        "the kernel exited"
    );
    assert_eq!(
        std::fs::read_dir(&dir).expect("kernel dir").count(),
        0,
        "the connection file is removed"
    );
    let err = client
        .kernel_execute("k1", "1", None, false, None)
        .await
        .expect_err("forgotten");
    assert_eq!(agent_code(err).0, ErrorCode::NotFound);
}

#[tokio::test]
async fn time_limits_and_interrupts_keep_the_kernel() {
    require_root!();
    require_ipykernel();
    let (agent, client) = TestAgent::start().await;
    client.kernel_start(ipykernel(&agent, "k")).await.expect("start");

    let events = run(&client, "k", "while True:\n    pass", Some(1000)).await;
    assert_eq!(status(&events), CellStatus::TimedOut, "{events:?}");
    assert!(
        !events.iter().any(|e| matches!(e, CellEvent::Error { .. })),
        "the KeyboardInterrupt is not relayed: {events:?}"
    );
    let events = run(&client, "k", "print(40 + 2)", None).await;
    assert_eq!(
        (status(&events), stdout(&events).as_str()),
        (CellStatus::Ok, "42\n")
    );

    // A second cell queued behind a running one waits for it.
    let mut sleeping = client
        .kernel_execute("k", "import time\ntime.sleep(60)", None, false, None)
        .await
        .expect("execute");
    let queued = client
        .kernel_execute("k", "print('after')", None, false, None)
        .await
        .expect("queue");
    wait_running(&mut sleeping).await;
    client.kernel_interrupt("k").await.expect("interrupt");
    let rest = collect(sleeping).await;
    assert_eq!(status(&rest), CellStatus::Interrupted, "{rest:?}");
    let events = collect(queued).await;
    assert_eq!(
        (status(&events), stdout(&events).as_str()),
        (CellStatus::Ok, "after\n")
    );
    client.kernel_shutdown("k").await.expect("shutdown");
}

/// ipykernel arms its `SIGINT` handler a moment after it publishes `execute_input`; a signal that
/// lands before that is ignored. The cell here makes that moment long (it ignores `SIGINT` for half
/// a second, then sleeps a minute): an interrupt sent inside it must still stop the cell, because
/// the agent sends `SIGINT` again until the kernel answers.
#[tokio::test]
async fn an_interrupt_the_kernel_ignores_at_first_is_repeated() {
    require_root!();
    require_ipykernel();
    let (agent, client) = TestAgent::start().await;
    client
        .kernel_start(ipykernel(&agent, "deaf"))
        .await
        .expect("start");
    let code = "import signal, time\n\
                signal.signal(signal.SIGINT, signal.SIG_IGN)\n\
                print('ignoring', flush=True)\n\
                time.sleep(0.5)\n\
                signal.signal(signal.SIGINT, signal.default_int_handler)\n\
                time.sleep(60)";
    let mut events = client
        .kernel_execute("deaf", code, None, false, None)
        .await
        .expect("execute");
    // Interrupt while the cell ignores SIGINT.
    loop {
        match tokio::time::timeout(CELL_DEADLINE, events.next()).await {
            Ok(Some(CellEvent::Stream { text, .. })) if text.contains("ignoring") => break,
            Ok(Some(_)) => {}
            other => panic!("the cell did not start: {other:?}"),
        }
    }
    client.kernel_interrupt("deaf").await.expect("interrupt");
    let rest = collect(events).await;
    assert_eq!(status(&rest), CellStatus::Interrupted, "{rest:?}");
    let after = run(&client, "deaf", "print('alive')", None).await;
    assert_eq!(
        (status(&after), stdout(&after).as_str()),
        (CellStatus::Ok, "alive\n")
    );
    client.kernel_shutdown("deaf").await.expect("shutdown");
}

#[tokio::test]
async fn huge_output_is_split_under_the_event_bound() {
    require_root!();
    require_ipykernel();
    let (agent, client) = TestAgent::start().await;
    client
        .kernel_start(ipykernel(&agent, "big"))
        .await
        .expect("start");
    let events = run(&client, "big", "print('x' * 10_000_000)", None).await;
    assert_eq!(status(&events), CellStatus::Ok);
    let streams = events
        .iter()
        .filter(|e| matches!(e, CellEvent::Stream { .. }))
        .count();
    assert!(streams >= 10, "{streams} stream events");
    for event in &events {
        let len = serde_json::to_vec(event).expect("json").len();
        assert!(len <= MAX_CELL_EVENT_LEN, "an event of {len} bytes");
    }
    assert_eq!(stdout(&events).len(), 10_000_001);
    client.kernel_shutdown("big").await.expect("shutdown");
}

#[tokio::test]
async fn a_killed_kernel_ends_its_cell_and_start_failures_say_why() {
    require_root!();
    require_ipykernel();
    let (agent, client) = TestAgent::start().await;
    let info = client
        .kernel_start(ipykernel(&agent, "doomed"))
        .await
        .expect("start");
    let mut cell = client
        .kernel_execute("doomed", "import time\ntime.sleep(60)", None, false, None)
        .await
        .expect("execute");
    wait_running(&mut cell).await;
    paddock_sys::reap::send_signal(info.pid, libc::SIGKILL).expect("kill the kernel");
    let rest = collect(cell).await;
    assert_eq!(status(&rest), CellStatus::KernelDied, "{rest:?}");
    let (code, message) = agent_code(
        client
            .kernel_execute("doomed", "1", None, false, None)
            .await
            .expect_err("dead"),
    );
    assert_eq!(code, ErrorCode::ProcessExited);
    assert!(message.contains("dead"), "{message}");
    client.kernel_shutdown("doomed").await.expect("shutdown");
    // The id is free again.
    client
        .kernel_start(ipykernel(&agent, "doomed"))
        .await
        .expect("restart");
    client.kernel_shutdown("doomed").await.expect("shutdown");

    let mut failing = ipykernel(&agent, "failing");
    failing.argv = vec![
        "/usr/bin/python3".into(),
        "-c".into(),
        "import sys; sys.stderr.write('no kernel here'); sys.exit(3)".into(),
    ];
    let (code, message) = agent_code(client.kernel_start(failing).await.expect_err("exits"));
    assert_eq!(code, ErrorCode::ProcessExited);
    assert!(message.contains("no kernel here"), "{message}");
    assert!(
        !exists(&agent.host_path("/tmp/.paddock-kernels-0/failing.json")),
        "no connection file is left"
    );
    assert_eq!(
        std::fs::read_dir(agent.host_path("/tmp/.paddock-kernels-0"))
            .expect("kernel dir")
            .count(),
        0
    );
}

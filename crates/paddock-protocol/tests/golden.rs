//! Freezes the JSON shape of every protocol message. A change here is a wire-contract change: review the
//! diff of `tests/golden/messages.jsonl`, and regenerate with `UPDATE_GOLDEN=1 cargo test -p paddock-protocol`.

use std::collections::BTreeMap;

use paddock_protocol::*;

fn samples() -> Vec<serde_json::Value> {
    let spawn = SpawnRequest {
        command: CommandSpec::Argv {
            argv: vec!["python3".into(), "-c".into(), "print(1)".into()],
        },
        env: BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
        cwd: Some("/home/user".into()),
        user: Some("user".into()),
        stdin: true,
        pty: Some(PtySize { rows: 24, cols: 80 }),
        timeout_ms: Some(10_000),
        tag: Some("build".into()),
        detached: false,
    };
    let requests = vec![
        Request::Hello {
            version: PROTOCOL_VERSION,
        },
        Request::Spawn(spawn),
        Request::Spawn(SpawnRequest {
            command: CommandSpec::Shell {
                script: "echo hi".into(),
            },
            env: BTreeMap::new(),
            cwd: None,
            user: None,
            stdin: false,
            pty: None,
            timeout_ms: None,
            tag: None,
            detached: true,
        }),
        Request::WriteStdin { pid: 2, close: true },
        Request::Signal { pid: 2, signal: 15 },
        Request::KillTree { pid: 2, signal: None },
        Request::Resize {
            pid: 2,
            size: PtySize { rows: 50, cols: 120 },
        },
        Request::ListProcesses,
        Request::Attach {
            pid: 2,
            stdout_from: 10,
            stderr_from: 0,
        },
        Request::Detach { pid: 2 },
        Request::ReadFile {
            path: "/etc/hosts".into(),
            offset: 0,
            max_len: Some(4096),
        },
        Request::WriteFile {
            path: "/tmp/x".into(),
            offset: 0,
            truncate: true,
            mode: Some(0o600),
            user: None,
        },
        Request::ListDir {
            path: "/home/user".into(),
            after: None,
        },
        Request::Stat {
            path: "/home/user".into(),
        },
        Request::Mkdir {
            path: "/home/user/a/b".into(),
            parents: true,
            mode: None,
            user: None,
        },
        Request::Remove {
            path: "/tmp/x".into(),
            recursive: false,
        },
        Request::Rename {
            from: "/tmp/a".into(),
            to: "/tmp/b".into(),
        },
        Request::ListDir {
            path: "/home/user".into(),
            after: Some("b.txt".into()),
        },
        Request::Watch {
            path: "/home/user".into(),
            recursive: true,
        },
        Request::Unwatch { watch_id: 3 },
        Request::Symlink {
            path: "/tmp/link".into(),
            target: "../etc/hostname".into(),
            user: Some("root".into()),
        },
        Request::Prefetch {
            paths: vec!["/etc/ld.so.cache".into(), "/bin/sh".into()],
        },
        Request::KernelStart(kernel::KernelStart {
            kernel_id: "ctx-1".into(),
            argv: vec![
                "python3".into(),
                "-m".into(),
                "ipykernel_launcher".into(),
                "-f".into(),
                "{connection_file}".into(),
            ],
            cwd: Some("/home/user".into()),
            env: BTreeMap::from([("MPLBACKEND".to_owned(), "Agg".to_owned())]),
            user: None,
            ready_timeout_ms: 30_000,
            interrupt: kernel::InterruptMode::Signal,
            barrier: None,
        }),
        Request::KernelExecute {
            kernel_id: "ctx-1".into(),
            code: "x = 1\nx + 1".into(),
            timeout_ms: Some(5_000),
            silent: false,
            around: None,
        },
        Request::KernelInterrupt {
            kernel_id: "ctx-1".into(),
        },
        Request::KernelShutdown {
            kernel_id: "ctx-1".into(),
        },
        Request::KernelExecute {
            kernel_id: "ctx-1".into(),
            code: "import setup".into(),
            timeout_ms: None,
            silent: true,
            around: None,
        },
        Request::KernelStart(kernel::KernelStart {
            kernel_id: "javascript".into(),
            argv: vec![
                "deno".into(),
                "jupyter".into(),
                "--kernel".into(),
                "--conn".into(),
                "{connection_file}".into(),
            ],
            cwd: None,
            env: BTreeMap::from([("NO_COLOR".to_owned(), "1".to_owned())]),
            user: Some("user".into()),
            ready_timeout_ms: 30_000,
            interrupt: kernel::InterruptMode::Message,
            barrier: Some("await new Promise((r) => setTimeout(r, 0))".into()),
        }),
        Request::KernelExecute {
            kernel_id: "javascript".into(),
            code: "Deno.env.get('A')".into(),
            timeout_ms: None,
            silent: false,
            around: Some(kernel::CellAround {
                before: "set A".into(),
                after: "restore A".into(),
            }),
        },
    ];
    let status = ExitStatus {
        code: Some(0),
        signal: None,
        timed_out: false,
        cpu_time_us: 1200,
        max_rss_kib: 4096,
        duration_ms: 3,
    };
    let stat = FileStat {
        name: "x".into(),
        kind: FileKind::Symlink,
        size: 4,
        mode: 0o777,
        uid: 1000,
        gid: 1000,
        mtime_ms: 1_700_000_000_000,
        symlink_target: Some("/etc".into()),
    };
    let replies = vec![
        Reply::Hello {
            version: PROTOCOL_VERSION,
            agent_version: "0.1.0".into(),
        },
        Reply::Spawned { pid: 2 },
        Reply::Done,
        Reply::Processes {
            processes: vec![ProcessInfo {
                pid: 2,
                tag: None,
                command: CommandSpec::Shell {
                    script: "sleep 1".into(),
                },
                pty: false,
                started_at_ms: 1_700_000_000_000,
                exit: Some(status),
            }],
        },
        Reply::Attached {
            stdout_from: 0,
            stderr_from: 5,
        },
        Reply::FileData { eof: true, size: 12 },
        Reply::Written { bytes: 12 },
        Reply::Entries {
            entries: vec![stat.clone()],
            more: true,
        },
        Reply::Stat { stat },
        Reply::Watching { watch_id: 3 },
        Reply::Prefetched {
            files: 2,
            bytes: 1_234_567,
        },
        Reply::KernelStarted {
            kernel: kernel::KernelInfo {
                pid: 7,
                language: "python".into(),
                language_version: "3.11.2".into(),
                implementation: "ipython".into(),
            },
        },
        Reply::CellStarted { cell_id: 4 },
    ];
    let mut out: Vec<serde_json::Value> = Vec::new();
    for (i, request) in requests.into_iter().enumerate() {
        out.push(
            serde_json::to_value(ClientMessage {
                id: i as u64,
                request,
            })
            .expect("serializes"),
        );
    }
    for (i, body) in replies.into_iter().enumerate() {
        out.push(serde_json::to_value(AgentMessage::Reply { id: i as u64, body }).expect("serializes"));
    }
    let error = AgentError {
        code: ErrorCode::NotFound,
        message: "no such file: /x".into(),
    };
    for msg in [
        AgentMessage::Error { id: 9, error },
        AgentMessage::Output {
            pid: 2,
            stream: Stream::Stderr,
            offset: 42,
        },
        AgentMessage::Exited { pid: 2, status },
        AgentMessage::FsEvents {
            watch_id: 3,
            events: [
                FsEventKind::Create,
                FsEventKind::Modify,
                FsEventKind::Remove,
                FsEventKind::RenameFrom,
                FsEventKind::RenameTo,
                FsEventKind::Attrib,
                FsEventKind::Overflow,
            ]
            .into_iter()
            .map(|kind| FsEvent {
                path: "/home/user/src".into(),
                kind,
                is_dir: kind == FsEventKind::Overflow,
            })
            .collect(),
        },
        AgentMessage::WatchEnded {
            watch_id: 3,
            reason: WatchEndReason::Deleted,
        },
        AgentMessage::WatchEnded {
            watch_id: 4,
            reason: WatchEndReason::Moved,
        },
        AgentMessage::WatchEnded {
            watch_id: 5,
            reason: WatchEndReason::Unmounted,
        },
        AgentMessage::Error {
            id: 10,
            error: AgentError {
                code: ErrorCode::LimitExceeded,
                message: "too many watched directories".into(),
            },
        },
        AgentMessage::Cell { cell_id: 4 },
    ] {
        out.push(serde_json::to_value(msg).expect("serializes"));
    }
    out
}

#[test]
fn messages_match_golden_file() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/messages.jsonl");
    let rendered: String = samples().iter().map(|v| format!("{v}\n")).collect();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, &rendered).expect("writes golden file");
    }
    let golden = std::fs::read_to_string(path).expect("golden file exists (UPDATE_GOLDEN=1 creates it)");
    assert_eq!(
        rendered, golden,
        "wire format changed: review and regenerate with UPDATE_GOLDEN=1"
    );
}

#[test]
fn golden_lines_parse_back() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/messages.jsonl");
    let golden = std::fs::read_to_string(path).expect("golden file exists");
    for line in golden.lines() {
        let client = serde_json::from_str::<ClientMessage>(line).is_ok();
        let agent = serde_json::from_str::<AgentMessage>(line).is_ok();
        assert!(client ^ agent, "line parses as neither or both: {line}");
    }
}

/// The payloads of `AgentMessage::Cell`: one line per event shape.
fn cell_event_samples() -> Vec<serde_json::Value> {
    use kernel::{CellEvent, CellStatus, CellStream};
    let events = vec![
        CellEvent::ExecutionCount { count: 3 },
        CellEvent::Stream {
            name: CellStream::Stdout,
            text: "hello\n".into(),
        },
        CellEvent::Stream {
            name: CellStream::Stderr,
            text: "warning\n".into(),
        },
        CellEvent::Result {
            main: true,
            data: BTreeMap::from([("text/plain".to_owned(), serde_json::json!("2"))]),
            metadata: BTreeMap::new(),
            cut: Vec::new(),
        },
        CellEvent::Result {
            main: false,
            data: BTreeMap::from([
                (
                    "text/plain".to_owned(),
                    serde_json::json!("<Figure size 640x480 with 1 Axes>"),
                ),
                ("image/png".to_owned(), serde_json::json!("iVBORw0KGgo=")),
            ]),
            metadata: BTreeMap::from([("image/png".to_owned(), serde_json::json!({"width": 640}))]),
            cut: vec!["text/html".into()],
        },
        CellEvent::Error {
            name: "ZeroDivisionError".into(),
            value: "division by zero".into(),
            traceback: vec![
                "Traceback (most recent call last):".into(),
                "ZeroDivisionError: division by zero".into(),
            ],
        },
        CellEvent::End {
            status: CellStatus::Ok,
            dropped_bytes: 0,
            kernel_dead: false,
        },
        CellEvent::End {
            status: CellStatus::Error,
            dropped_bytes: 0,
            kernel_dead: false,
        },
        CellEvent::End {
            status: CellStatus::TimedOut,
            dropped_bytes: 12,
            kernel_dead: false,
        },
        CellEvent::End {
            status: CellStatus::Interrupted,
            dropped_bytes: 0,
            kernel_dead: false,
        },
        CellEvent::End {
            status: CellStatus::KernelDied,
            dropped_bytes: 0,
            kernel_dead: false,
        },
        CellEvent::End {
            status: CellStatus::TimedOut,
            dropped_bytes: 0,
            kernel_dead: true,
        },
    ];
    events
        .into_iter()
        .map(|e| serde_json::to_value(e).expect("serializes"))
        .collect()
}

#[test]
fn cell_events_match_golden_file() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/cell_events.jsonl");
    let rendered: String = cell_event_samples().iter().map(|v| format!("{v}\n")).collect();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, &rendered).expect("writes golden file");
    }
    let golden = std::fs::read_to_string(path).expect("golden file exists (UPDATE_GOLDEN=1 creates it)");
    assert_eq!(
        rendered, golden,
        "wire format changed: review and regenerate with UPDATE_GOLDEN=1"
    );
    for line in golden.lines() {
        serde_json::from_str::<kernel::CellEvent>(line).expect("a cell event parses back");
    }
}

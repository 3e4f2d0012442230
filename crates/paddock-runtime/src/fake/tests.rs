//! The fake backend and its agent double, driven through the real client (`agent_client`).

use std::time::Duration;

use paddock_protocol::{CommandSpec, ErrorCode, FsEventKind, SpawnRequest, Stream};
use paddock_types::diff::{Change, DiffOptions};
use paddock_types::{Limits, RootfsSpec, SandboxId, SandboxSpec, SnapshotId, UserSpec, VolumeSource};

use super::FakeBackend;
use crate::agent_client::{AgentClient, ProcessEvent, ProcessEvents, WatchUpdate, WriteOptions};
use crate::{Adoption, SandboxBackend, SandboxHandle, StorageBackend};

const DEADLINE: Duration = Duration::from_secs(10);

fn spec(id: &str) -> SandboxSpec {
    SandboxSpec {
        id: id.parse().expect("id"),
        limits: Limits::default(),
        rootfs: RootfsSpec::Host,
        mounts: Vec::new(),
        workdir: None,
        user: UserSpec::default_user(),
        env: Vec::new(),
        volume: VolumeSource::Template,
        volumes: Vec::new(),
        network: None,
    }
}

fn shell(script: &str) -> SpawnRequest {
    SpawnRequest {
        command: CommandSpec::Shell {
            script: script.into(),
        },
        env: [("NAME".to_owned(), "fake".to_owned())].into(),
        cwd: None,
        user: None,
        stdin: false,
        pty: None,
        timeout_ms: None,
        tag: None,
        detached: false,
    }
}

/// Output and exit of a followed process.
async fn finish(mut events: ProcessEvents) -> (String, String, paddock_protocol::ExitStatus) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        let event = tokio::time::timeout(DEADLINE, events.recv())
            .await
            .expect("an event in time")
            .expect("the process ends with its exit");
        match event {
            ProcessEvent::Output {
                stream: Stream::Stderr,
                data,
                ..
            } => err.extend(data),
            ProcessEvent::Output { data, .. } => out.extend(data),
            ProcessEvent::Exited(status) => {
                return (
                    String::from_utf8_lossy(&out).into_owned(),
                    String::from_utf8_lossy(&err).into_owned(),
                    status,
                )
            }
        }
    }
}

async fn run(client: &AgentClient, script: &str) -> (String, String, paddock_protocol::ExitStatus) {
    let (_, events) = client.spawn(shell(script)).await.expect("spawn");
    finish(events).await
}

async fn boot(backend: &FakeBackend, id: &str) -> (SandboxHandle, AgentClient) {
    let b = backend.clone();
    let s = spec(id);
    let handle = tokio::task::spawn_blocking(move || b.create_sandbox(&s))
        .await
        .expect("joined")
        .expect("created");
    let client = AgentClient::connect(&handle.agent_socket).await.expect("connect");
    (handle, client)
}

#[tokio::test]
async fn commands_files_and_errors_over_the_real_protocol() {
    let backend = FakeBackend::new().expect("fake");
    let (handle, client) = boot(&backend, "sb-one").await;
    let (out, err, status) = run(
        &client,
        "echo hello $NAME; printf 'x%sy' 1 >&2; cd /tmp && echo in > f; cat f; ls /tmp; exit 3",
    )
    .await;
    assert_eq!(
        (out.as_str(), err.as_str(), status.code),
        ("hello fake\nin\nf\n", "x1y", Some(3))
    );
    let (out, _, status) = run(&client, "nope; echo $?; false || echo fallback && true").await;
    assert_eq!((out.as_str(), status.code), ("127\nfallback\n", Some(0)));
    let argv = SpawnRequest {
        command: CommandSpec::Argv {
            argv: vec!["/nonexistent/program".into()],
        },
        ..shell("")
    };
    let e = client.spawn(argv).await.expect_err("exec fails");
    assert_eq!(e.code(), Some(ErrorCode::ExecFailed));
    let bad_cwd = SpawnRequest {
        cwd: Some("/nonexistent".into()),
        ..shell("true")
    };
    assert_eq!(
        client.spawn(bad_cwd).await.expect_err("cwd").code(),
        Some(ErrorCode::NotFound)
    );
    let ghost = SpawnRequest {
        user: Some("ghost".into()),
        ..shell("true")
    };
    assert_eq!(
        client.spawn(ghost).await.expect_err("user").code(),
        Some(ErrorCode::UnknownUser)
    );

    // Files: relative paths start at the home directory; errors carry the agent's codes.
    client
        .write_file("notes.txt", b"abcdef", &WriteOptions::default())
        .await
        .expect("write");
    let chunk = client
        .read_file("/home/user/notes.txt", 2, Some(3))
        .await
        .expect("read");
    assert_eq!(
        (chunk.data.as_slice(), chunk.size, chunk.eof),
        (&b"cde"[..], 6, false)
    );
    let stat = client.stat("/home/user/notes.txt").await.expect("stat");
    assert_eq!((stat.size, stat.uid, stat.mode), (6, 1000, 0o644));
    let code = |e: crate::agent_client::AgentClientError| e.code();
    assert_eq!(
        code(client.read_file("/home/user", 0, None).await.expect_err("dir")),
        Some(ErrorCode::IsADirectory)
    );
    assert_eq!(
        code(client.stat("/missing").await.expect_err("missing")),
        Some(ErrorCode::NotFound)
    );
    client
        .mkdir(
            "/tmp/a/b",
            &crate::agent_client::MkdirOptions {
                parents: true,
                ..Default::default()
            },
        )
        .await
        .expect("mkdir -p");
    assert_eq!(
        code(client.remove("/tmp/a", false).await.expect_err("not empty")),
        Some(ErrorCode::DirectoryNotEmpty)
    );
    client
        .rename("/home/user/notes.txt", "/tmp/a/b/n")
        .await
        .expect("rename");
    let names: Vec<String> = client
        .list_dir("/tmp/a/b")
        .await
        .expect("list")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["n"]);
    client.remove("/tmp/a", true).await.expect("rm -r");
    // A directory too large for one reply header is listed in pages.
    let long = "n".repeat(100);
    for i in 0..600 {
        client
            .write_file(
                &format!("/home/user/{long}-{i:04}"),
                b"",
                &WriteOptions::default(),
            )
            .await
            .expect("write");
    }
    let listed = client.list_dir("/home/user").await.expect("list");
    assert_eq!(listed.len(), 600);
    assert!(listed.windows(2).all(|w| w[0].name < w[1].name));
    let b = backend.clone();
    tokio::task::spawn_blocking(move || b.destroy_sandbox(handle))
        .await
        .expect("joined")
        .expect("destroyed");
    tokio::time::timeout(DEADLINE, async {
        while !client.is_closed() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the connection ends with the sandbox");
    assert_eq!(backend.stats().live, 0);
}

#[tokio::test]
async fn stdin_signals_timeouts_attach_and_watches() {
    let backend = FakeBackend::new().expect("fake");
    let (_handle, client) = boot(&backend, "sb-two").await;
    let (pid, events) = client
        .spawn(SpawnRequest {
            stdin: true,
            ..shell("cat; echo done")
        })
        .await
        .expect("spawn");
    client.write_stdin(pid, b"one ", false).await.expect("stdin");
    client
        .write_stdin(pid, b"two", true)
        .await
        .expect("stdin and close");
    let (out, _, status) = finish(events).await;
    assert_eq!((out.as_str(), status.code), ("one twodone\n", Some(0)));
    assert_eq!(
        client
            .write_stdin(pid, b"late", false)
            .await
            .expect_err("exited")
            .code(),
        Some(ErrorCode::ProcessExited)
    );

    let (pid, events) = client
        .spawn(shell("echo before; sleep 1000"))
        .await
        .expect("spawn");
    client.signal(pid, libc::SIGTERM).await.expect("signal");
    let (out, _, status) = finish(events).await;
    assert_eq!(
        (out.as_str(), status.signal, status.code),
        ("before\n", Some(15), None)
    );

    let (_, events) = client
        .spawn(SpawnRequest {
            timeout_ms: Some(50),
            ..shell("sleep 1000")
        })
        .await
        .expect("spawn");
    let (_, _, status) = finish(events).await;
    assert!(status.timed_out && status.signal == Some(9), "{status:?}");

    // A detached process is re-attached with a replay from an offset.
    let (pid, _) = client
        .spawn(SpawnRequest {
            detached: true,
            tag: Some("bg".into()),
            ..shell("echo 0123456789")
        })
        .await
        .expect("spawn");
    let other = AgentClient::connect(&backend_socket(&backend, "sb-two"))
        .await
        .expect("connect");
    let listed = tokio::time::timeout(DEADLINE, async {
        loop {
            let list = other.list_processes().await.expect("list");
            if let Some(p) = list.iter().find(|p| p.pid == pid && p.exit.is_some()) {
                return p.clone();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the detached process ends");
    assert_eq!(listed.tag.as_deref(), Some("bg"));
    let (start, events) = other.attach(pid, 5, 0).await.expect("attach");
    assert_eq!(start.stdout_from, 5);
    let (out, _, _) = finish(events).await;
    assert_eq!(out, "56789\n");

    // Watches see the double's own changes, and end when their directory goes.
    client
        .mkdir("/tmp/w", &crate::agent_client::MkdirOptions::default())
        .await
        .expect("mkdir");
    let (_, mut watch) = client.watch("/tmp/w", true).await.expect("watch");
    run(&client, "echo x > /tmp/w/f; mkdir /tmp/w/d; echo y > /tmp/w/d/g").await;
    let mut seen = Vec::new();
    while seen.len() < 5 {
        match tokio::time::timeout(DEADLINE, watch.recv())
            .await
            .expect("events in time")
        {
            Some(WatchUpdate::Events(batch)) => seen.extend(batch.into_iter().map(|e| (e.path, e.kind))),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen[0], ("/tmp/w/f".to_owned(), FsEventKind::Create));
    assert!(
        seen.contains(&("/tmp/w/d/g".to_owned(), FsEventKind::Create)),
        "{seen:?}"
    );
    client.remove("/tmp/w", true).await.expect("rm");
    let ended = tokio::time::timeout(DEADLINE, async {
        loop {
            match watch.recv().await {
                Some(WatchUpdate::Ended(reason)) => return reason,
                Some(WatchUpdate::Events(_)) => {}
                None => panic!("the watch ended without saying why"),
            }
        }
    })
    .await
    .expect("ended in time");
    assert_eq!(ended, paddock_protocol::WatchEndReason::Deleted);
}

fn backend_socket(backend: &FakeBackend, id: &str) -> std::path::PathBuf {
    let id: SandboxId = id.parse().expect("id");
    let state = super::agent::lock(&backend.shared.state);
    state.sandboxes[&id]
        .agent
        .as_ref()
        .expect("agent")
        .socket()
        .to_path_buf()
}

#[tokio::test]
async fn snapshots_diffs_rollbacks_restarts_and_faults() {
    let backend = FakeBackend::new().expect("fake");
    let (handle, client) = boot(&backend, "sb-three").await;
    run(&client, "echo one > /home/user/f").await;
    let snapshot: SnapshotId = "sn-0000000000000001".parse().expect("snapshot id");
    let (b, s) = (backend.clone(), snapshot.clone());
    let handle = tokio::task::spawn_blocking(move || {
        b.snapshot_sandbox(&handle, &s).expect("snapshot");
        handle
    })
    .await
    .expect("joined");
    run(&client, "echo two > /home/user/f; echo new > /home/user/g").await;
    let (b, s) = (backend.clone(), snapshot.clone());
    let (handle, diff) = tokio::task::spawn_blocking(move || {
        let diff = b
            .diff_sandbox(&handle, &s, &DiffOptions::default())
            .expect("diff");
        (handle, diff)
    })
    .await
    .expect("joined");
    let changes: Vec<(String, Change)> = diff.entries.into_iter().map(|e| (e.path, e.change)).collect();
    assert_eq!(
        changes,
        [
            ("/home/user/f".to_owned(), Change::Modified),
            ("/home/user/g".to_owned(), Change::Added)
        ]
    );
    let (b, s) = (backend.clone(), snapshot.clone());
    let rolled = tokio::task::spawn_blocking(move || b.rollback_sandbox(handle, &s))
        .await
        .expect("joined")
        .expect("rolled back");
    assert!(
        client.is_closed() || client.list_processes().await.is_err(),
        "the old connection ends"
    );
    let fresh = AgentClient::connect(&rolled.agent_socket).await.expect("connect");
    assert_eq!(
        fresh.read_file("/home/user/f", 0, None).await.expect("read").data,
        b"one\n"
    );
    assert!(fresh.stat("/home/user/g").await.is_err());

    // A restarted backend adopts what the dead one ran; what it does not adopt is collected.
    let (_other, _) = boot(&backend, "sb-four").await;
    drop(rolled);
    let restarted = backend.restart();
    let id: SandboxId = "sb-three".parse().expect("id");
    let r = restarted.clone();
    let adopted = tokio::task::spawn_blocking(move || {
        let adopted = r.adopt_sandbox(&id).expect("adopt");
        let collected = r.collect_garbage().expect("gc");
        (adopted, collected)
    })
    .await
    .expect("joined");
    assert!(matches!(adopted.0, Adoption::Alive(_)));
    assert_eq!(adopted.1, ["sb-four"]);
    assert_eq!(
        restarted.sandbox_ids(),
        ["sb-three".parse::<SandboxId>().expect("id")]
    );

    // An injected failure fails the next call only.
    restarted.fail_next(
        "create_sandbox",
        crate::RuntimeError::Pool {
            what: "create",
            path: "/pool".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        },
    );
    let r = restarted.clone();
    let results = tokio::task::spawn_blocking(move || {
        (
            r.create_sandbox(&spec("sb-five")).map(|h| h.id),
            r.create_sandbox(&spec("sb-five")).map(|h| h.id),
        )
    })
    .await
    .expect("joined");
    assert!(matches!(results.0, Err(crate::RuntimeError::Pool { .. })));
    assert!(results.1.is_ok());
}

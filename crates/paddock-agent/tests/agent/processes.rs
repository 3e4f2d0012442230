//! Spawning, exit statuses, stdin, PTYs, signals, timeouts and process-tree kills.

use std::collections::BTreeMap;
use std::time::Duration;

use paddock_protocol::{CommandSpec, ErrorCode, PtySize};

use crate::harness::{argv, collect, collect_until, require_root, shell, wait_gone, TestAgent};

#[tokio::test]
async fn exit_codes_and_signals() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    let (_, mut events) = client.spawn(shell("exit 3")).await.expect("spawn");
    let exit = collect(&mut events).await.exit.expect("exit");
    assert_eq!((exit.code, exit.signal, exit.timed_out), (Some(3), None, false));

    let (_, mut events) = client.spawn(shell("kill -TERM $$")).await.expect("spawn");
    let exit = collect(&mut events).await.exit.expect("exit");
    assert_eq!((exit.code, exit.signal), (None, Some(libc::SIGTERM)));
    assert_eq!(exit.shell_code(), 128 + libc::SIGTERM);

    let (_, mut events) = client
        .spawn(shell("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"))
        .await
        .expect("spawn");
    let exit = collect(&mut events).await.exit.expect("exit");
    assert_eq!(exit.code, Some(0));
    assert!(exit.cpu_time_us > 0, "cpu time is reported: {exit:?}");
    assert!(exit.max_rss_kib > 0, "peak memory is reported: {exit:?}");
    assert!(exit.duration_ms > 0, "duration is reported: {exit:?}");
}

#[tokio::test]
async fn stdout_and_stderr_are_separate_with_offsets() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    let (_, mut events) = client
        .spawn(shell(
            "printf out1; printf err1 >&2; sleep 0.05; printf out2; printf err2 >&2",
        ))
        .await
        .expect("spawn");
    let c = collect(&mut events).await;
    assert_eq!(c.stdout_str(), "out1out2");
    assert_eq!(c.stderr_str(), "err1err2");
    assert_eq!(c.first_offsets, (Some(0), Some(0)));
}

#[tokio::test]
async fn environment_and_working_directory_are_exactly_as_requested() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    let mut request = argv(&["env"]);
    request.env = BTreeMap::from([
        ("PATH".into(), "/usr/bin:/bin".into()),
        ("ONLY".into(), "this=1".into()),
    ]);
    let (_, mut events) = client.spawn(request).await.expect("spawn");
    assert_eq!(
        collect(&mut events).await.stdout_str(),
        "ONLY=this=1\nPATH=/usr/bin:/bin\n"
    );

    let mut request = argv(&["pwd"]);
    request.cwd = Some("/tmp".into());
    let (_, mut events) = client.spawn(request).await.expect("spawn");
    assert_eq!(collect(&mut events).await.stdout_str(), "/tmp\n");

    // Default: the user's home from the root's /etc/passwd (/root for root).
    let (_, mut events) = client.spawn(argv(&["pwd"])).await.expect("spawn");
    assert_eq!(collect(&mut events).await.stdout_str(), "/root\n");
}

#[tokio::test]
async fn user_switch_drops_every_capability() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    let mut request = shell("id -u; id -g; id -G; grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status");
    request.user = Some("user".into());
    let (_, mut events) = client.spawn(request).await.expect("spawn");
    let c = collect(&mut events).await;
    assert_eq!(c.exit.expect("exit").code, Some(0), "{}", c.stderr_str());
    let out = c.stdout_str();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[..3], &["1000", "1000", "1000 4242"]);
    for cap in &lines[3..] {
        assert!(
            cap.ends_with("0000000000000000"),
            "capability set not empty: {cap}"
        );
    }

    // Root inside the sandbox keeps uid 0 but no capabilities either.
    let (_, mut events) = client
        .spawn(shell("grep -E '^Cap(Eff|Bnd)' /proc/self/status"))
        .await
        .expect("spawn");
    let out = collect(&mut events).await.stdout_str();
    assert!(out.lines().all(|l| l.ends_with("0000000000000000")), "{out}");
}

#[tokio::test]
async fn stdin_is_piped_and_closed() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    let mut request = shell("wc -c");
    request.stdin = true;
    let (pid, mut events) = client.spawn(request).await.expect("spawn");
    let collector = tokio::spawn(async move { collect(&mut events).await });
    let data = vec![b'x'; 2_500_000];
    client.write_stdin(pid, &data, false).await.expect("write");
    client
        .write_stdin(pid, b"yz", true)
        .await
        .expect("write and close");
    let c = collector.await.expect("collector");
    assert_eq!(c.stdout_str().trim(), "2500002");
    let err = client.write_stdin(pid, b"late", false).await.expect_err("exited");
    assert!(
        matches!(err.code(), Some(ErrorCode::ProcessExited | ErrorCode::BadRequest)),
        "{err:?}"
    );

    let (pid, mut events) = client.spawn(shell("true")).await.expect("spawn");
    collect(&mut events).await;
    let err = client.write_stdin(pid, b"x", false).await.expect_err("no stdin");
    assert!(
        matches!(err.code(), Some(ErrorCode::ProcessExited | ErrorCode::BadRequest)),
        "{err:?}"
    );
}

#[tokio::test]
async fn pty_spawn_and_resize() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    let mut request = shell("stty size; read line; stty size; echo \"got:$line\"; test -t 0 && echo tty");
    request.pty = Some(PtySize { rows: 24, cols: 80 });
    let (pid, mut events) = client.spawn(request).await.expect("spawn");
    let first = collect_until(&mut events, Duration::from_secs(10), |c| {
        c.stdout_str().contains("24 80")
    })
    .await;
    assert!(first.exit.is_none());
    client
        .resize(pid, PtySize { rows: 50, cols: 120 })
        .await
        .expect("resize");
    client.write_stdin(pid, b"hello\n", false).await.expect("type");
    let rest = collect(&mut events).await;
    let out = rest.stdout_str();
    assert!(out.contains("50 120"), "{out:?}");
    assert!(out.contains("got:hello"), "{out:?}");
    assert!(out.contains("tty"), "{out:?}");
    assert_eq!(rest.exit.expect("exit").code, Some(0));
    let err = client
        .resize(pid, PtySize { rows: 1, cols: 1 })
        .await
        .expect_err("exited");
    assert_eq!(err.code(), Some(ErrorCode::ProcessExited));
}

#[tokio::test]
async fn timeout_kills_the_whole_tree() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    let mut request = shell("sleep 100 & echo $!; sleep 100");
    request.timeout_ms = Some(300);
    let (_, mut events) = client.spawn(request).await.expect("spawn");
    let c = collect(&mut events).await;
    let exit = c.exit.expect("exit");
    assert!(exit.timed_out, "{exit:?}");
    assert_eq!(exit.signal, Some(libc::SIGKILL));
    let background: u32 = c.stdout_str().trim().parse().expect("background pid");
    assert!(
        wait_gone(background, Duration::from_secs(5)).await,
        "background sleep survived the timeout"
    );
}

#[tokio::test]
async fn kill_tree_kills_children_and_signal_reaches_one_process() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    let (pid, mut events) = client
        .spawn(shell("sleep 100 & echo $!; (sleep 100 & echo $!; wait) ; wait"))
        .await
        .expect("spawn");
    let c = collect_until(&mut events, Duration::from_secs(10), |c| {
        c.stdout_str().lines().count() >= 2
    })
    .await;
    let children: Vec<u32> = c.stdout_str().lines().map(|l| l.parse().expect("pid")).collect();
    client.kill_tree(pid, None).await.expect("kill tree");
    let exit = collect(&mut events).await.exit.expect("exit");
    assert_eq!(exit.signal, Some(libc::SIGKILL));
    assert!(!exit.timed_out);
    for child in children {
        assert!(
            wait_gone(child, Duration::from_secs(5)).await,
            "child {child} survived kill_tree"
        );
    }

    let script = "trap 'echo got-usr1; exit 5' USR1; echo ready; while :; do sleep 0.02; done";
    let (pid, mut events) = client.spawn(shell(script)).await.expect("spawn");
    collect_until(&mut events, Duration::from_secs(10), |c| {
        c.stdout_str().contains("ready")
    })
    .await;
    client.signal(pid, libc::SIGUSR1).await.expect("signal");
    let c = collect(&mut events).await;
    assert!(c.stdout_str().contains("got-usr1"));
    assert_eq!(c.exit.expect("exit").code, Some(5));
    let err = client.signal(pid, libc::SIGUSR1).await.expect_err("exited");
    assert_eq!(err.code(), Some(ErrorCode::ProcessExited));
    let err = client.signal(999_999, libc::SIGUSR1).await.expect_err("unknown");
    assert_eq!(err.code(), Some(ErrorCode::ProcessNotFound));
}

#[tokio::test]
async fn exec_failures_are_errors_of_the_spawn() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    for args in [
        &["definitely-not-a-program-xyz"][..],
        &["/nonexistent/prog"],
        &["/etc/hostname"],
    ] {
        let err = client.spawn(argv(args)).await.expect_err("exec must fail");
        assert_eq!(err.code(), Some(ErrorCode::ExecFailed), "{args:?}: {err:?}");
    }
    let err = client.spawn(argv(&[])).await.expect_err("empty argv");
    assert_eq!(err.code(), Some(ErrorCode::BadRequest));
    let mut request = shell("true");
    request.user = Some("ghost".into());
    let err = client.spawn(request).await.expect_err("unknown user");
    assert_eq!(err.code(), Some(ErrorCode::UnknownUser));
    let mut request = shell("true");
    request.cwd = Some("/nonexistent-dir".into());
    let err = client.spawn(request).await.expect_err("bad cwd");
    assert_eq!(err.code(), Some(ErrorCode::NotFound));
    // PATH lookup uses the requested environment's PATH.
    let mut request = argv(&["sh", "-c", "true"]);
    request.env = BTreeMap::from([("PATH".into(), "/nonexistent".into())]);
    let err = client.spawn(request).await.expect_err("not in PATH");
    assert_eq!(err.code(), Some(ErrorCode::ExecFailed));
}

#[tokio::test]
async fn list_processes_shows_running_and_exited() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    let mut done = shell("echo done");
    done.tag = Some("finished-one".into());
    let (done_pid, mut events) = client.spawn(done).await.expect("spawn");
    collect(&mut events).await;
    let mut running = shell("sleep 100");
    running.tag = Some("running-one".into());
    running.detached = true;
    let (running_pid, _) = client.spawn(running).await.expect("spawn");

    let list = client.list_processes().await.expect("list");
    let done_info = list
        .iter()
        .find(|p| p.pid == done_pid)
        .expect("finished process listed");
    assert_eq!(done_info.tag.as_deref(), Some("finished-one"));
    assert_eq!(done_info.exit.expect("exit").code, Some(0));
    let running_info = list
        .iter()
        .find(|p| p.pid == running_pid)
        .expect("running process listed");
    assert!(running_info.exit.is_none());
    assert_eq!(
        running_info.command,
        CommandSpec::Shell {
            script: "sleep 100".into()
        }
    );
    assert!(!running_info.pty);
    client.kill_tree(running_pid, None).await.expect("kill");
}

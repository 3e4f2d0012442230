//! Output buffering, detach and re-attach with replay, and backpressure with bounded memory.

use std::time::Duration;

use paddock_runtime::agent_client::ProcessEvent;

use crate::harness::{collect, collect_until, require_root, shell, TestAgent};

/// `seq 1 N` output, as the process prints it.
fn seq_output(n: u32) -> String {
    (1..=n).map(|i| format!("{i}\n")).collect()
}

#[tokio::test]
async fn detach_and_reattach_replay_from_start_and_middle() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    let mut request = shell("seq 1 3000; read x; echo \"after:$x\"");
    request.stdin = true;
    let (pid, mut events) = client.spawn(request).await.expect("spawn");
    let expected = seq_output(3000);
    let seen = collect_until(&mut events, Duration::from_secs(10), |c| {
        c.stdout.len() >= expected.len()
    })
    .await;
    assert_eq!(seen.stdout_str(), expected);
    client.detach(pid).await.expect("detach");
    assert!(events.recv().await.is_none(), "events end after a detach");

    // Re-attach from 0: the whole buffer again.
    let (start, mut events) = client.attach(pid, 0, 0).await.expect("attach");
    assert_eq!((start.stdout_from, start.stderr_from), (0, 0));
    let again = collect_until(&mut events, Duration::from_secs(10), |c| {
        c.stdout.len() >= expected.len()
    })
    .await;
    assert_eq!(again.stdout_str(), expected);

    // A second connection attaches from the middle.
    let other = _agent.connect().await;
    let (start, mut middle) = other.attach(pid, 1000, 0).await.expect("attach from the middle");
    assert_eq!(start.stdout_from, 1000);
    let tail = collect_until(&mut middle, Duration::from_secs(10), |c| {
        c.stdout.len() >= expected.len() - 1000
    })
    .await;
    assert_eq!(tail.first_offsets.0, Some(1000));
    assert_eq!(tail.stdout_str(), expected[1000..]);

    // Both see the live end and the exit.
    client.write_stdin(pid, b"go\n", true).await.expect("stdin");
    let live = collect(&mut events).await;
    assert_eq!(live.stdout_str(), "after:go\n");
    assert_eq!(live.first_offsets.0, Some(expected.len() as u64));
    let live = collect(&mut middle).await;
    assert_eq!(live.stdout_str(), "after:go\n");
    assert_eq!(live.exit.expect("exit").code, Some(0));

    // Attaching to an exited process replays, then reports the exit.
    let (_, mut events) = client.attach(pid, 0, 0).await.expect("attach exited");
    let replay = collect(&mut events).await;
    assert_eq!(replay.stdout_str(), format!("{expected}after:go\n"));
    assert_eq!(replay.exit.expect("exit").code, Some(0));
}

#[tokio::test]
async fn detached_process_is_drained_into_its_buffer() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    // 3 MiB of output with nobody attached: the process must not block, and the last 1 MiB stays.
    let mut request = shell("head -c 3145728 /dev/zero | tr '\\0' 'a'; echo -n end >&2");
    request.detached = true;
    let (pid, mut none) = client.spawn(request).await.expect("spawn");
    assert!(none.recv().await.is_none(), "a detached spawn streams nothing");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let list = client.list_processes().await.expect("list");
        if list.iter().any(|p| p.pid == pid && p.exit.is_some()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "detached process did not finish (blocked on its pipe?)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (start, mut events) = client.attach(pid, 0, 0).await.expect("attach");
    assert_eq!(
        start.stdout_from,
        3 * 1024 * 1024 - 1024 * 1024,
        "replay starts at the oldest buffered byte"
    );
    assert_eq!(start.stderr_from, 0);
    let c = collect(&mut events).await;
    assert_eq!(c.stdout.len(), 1024 * 1024);
    assert!(c.stdout.iter().all(|b| *b == b'a'));
    assert_eq!(c.stderr_str(), "end");
}

#[tokio::test]
async fn fifty_mebibytes_flow_with_bounded_agent_memory() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    let idle_private = agent.private_kib();
    let idle_rss = agent.rss_kib();
    eprintln!("agent idle: VmRSS {idle_rss} KiB, private {idle_private} KiB");

    const TOTAL: u64 = 50 * 1024 * 1024;
    let (_, mut events) = client
        .spawn(shell("head -c 52428800 /dev/zero"))
        .await
        .expect("spawn");
    let mut received = 0u64;
    let mut peak_rss = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        match tokio::time::timeout_at(deadline, events.recv())
            .await
            .expect("50 MiB in time")
        {
            Some(ProcessEvent::Output { offset, data, .. }) => {
                assert_eq!(offset, received);
                received += data.len() as u64;
                if received % (8 * 1024 * 1024) < data.len() as u64 {
                    peak_rss = peak_rss.max(agent.rss_kib());
                }
            }
            Some(ProcessEvent::Exited(status)) => {
                assert_eq!(status.code, Some(0));
                break;
            }
            None => panic!("events ended early"),
        }
    }
    assert_eq!(received, TOTAL);
    eprintln!("agent peak VmRSS while streaming 50 MiB: {peak_rss} KiB");
    assert!(
        peak_rss < idle_rss + 16 * 1024,
        "agent memory grew with the output: {peak_rss} KiB"
    );
}

#[tokio::test]
async fn a_client_that_stops_reading_stops_the_process() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    let (pid, mut events) = client
        .spawn(shell("head -c 209715200 /dev/zero; echo finished >&2"))
        .await
        .expect("spawn");
    // Read a little, then stop reading: the agent must stop reading the pipe, not buffer 200 MiB.
    collect_until(&mut events, Duration::from_secs(10), |c| {
        c.stdout.len() > 1024 * 1024
    })
    .await;
    let before = agent.rss_kib();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = agent.rss_kib();
    let control = agent.connect().await;
    let list = control.list_processes().await.expect("list");
    let info = list.iter().find(|p| p.pid == pid).expect("listed");
    assert!(
        info.exit.is_none(),
        "the process finished although nobody read its output"
    );
    assert!(
        after < before + 8 * 1024,
        "agent memory grew while the client was not reading: {before} -> {after} KiB"
    );
    // Another connection still gets answers, and can kill it.
    control.kill_tree(pid, None).await.expect("kill");
    drop(events);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let list = control.list_processes().await.expect("list");
        if list.iter().any(|p| p.pid == pid && p.exit.is_some()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the killed process did not exit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn exit_waits_for_output_but_not_for_background_holders() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    // The background sleep keeps stdout open; the exit must still arrive (after ~100 ms), after the
    // foreground output.
    let started = std::time::Instant::now();
    let (_, mut events) = client
        .spawn(shell("sleep 30 & echo foreground"))
        .await
        .expect("spawn");
    let c = collect(&mut events).await;
    assert_eq!(c.stdout_str(), "foreground\n");
    assert_eq!(c.exit.expect("exit").code, Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "exit waited for the background process"
    );
}

#[tokio::test]
async fn detach_does_not_wait_for_a_stalled_consumer() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    let (pid, events) = client.spawn(shell("cat /dev/zero")).await.expect("spawn");
    // Nobody reads `events`: the client's reader is soon stuck waiting for room in that queue.
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::time::timeout(Duration::from_secs(10), client.detach(pid))
        .await
        .expect("detach completes although the events are not consumed")
        .expect("detach");
    let list = client
        .list_processes()
        .await
        .expect("the same client still gets answers");
    assert!(
        list.iter().any(|p| p.pid == pid && p.exit.is_none()),
        "detached process keeps running"
    );
    client.kill_tree(pid, None).await.expect("kill");
    drop(events);
}

//! Not a check: how long snapshots, rollbacks and forks take on a sandbox holding 1 GB.

use super::*;

/// Not a check: timings of snapshot, rollback and forks on a sandbox holding 1 GB in 10,000 files.
/// Run with `PADDOCK_LOG=debug cargo nextest run -p paddock --test e2e --run-ignored only --no-capture
/// runtime::snapshots::timings`.
#[tokio::test]
#[ignore = "a measurement (writes 1 GB), run by hand"]
async fn measure_snapshot_rollback_and_fork_times() {
    if !require_freezer() {
        return;
    }
    // PADDOCK_LOG=debug shows each step's time.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("PADDOCK_LOG"))
        .with_writer(std::io::stderr)
        .try_init();
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = Arc::new(backend(&env));
    let handle = backend.create_sandbox(&spec("sb-big")).expect("create");
    let client = connect(&handle).await;
    // 100 directories of 100 files of 100 KiB, each with bytes of its own.
    ok(
        &client,
        "mkdir -p /home/user/data && cd /home/user/data && for d in $(seq 0 99); do mkdir $d; \
         for f in $(seq 0 99); do head -c 100K /dev/urandom > $d/$f; done; done",
    )
    .await;
    sync_pool(&env);
    let p50 = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };

    let mut snapshots = Vec::new();
    for i in 0..21 {
        let snapshot = snapshot_id(&format!("sn-idle-{i}"));
        let t = Instant::now();
        backend.snapshot_sandbox(&handle, &snapshot).expect("snapshot");
        snapshots.push(t.elapsed());
    }
    eprintln!(
        "snapshot, idle 1 GB / 10k files: p50 {:?}, all {snapshots:?}",
        p50(snapshots.clone())
    );

    let mut busy = Vec::new();
    for i in 0..21 {
        ok(
            &client,
            &format!("echo {i} >> /home/user/data/0/0 && head -c 1M /dev/urandom > /home/user/step"),
        )
        .await;
        let snapshot = snapshot_id(&format!("sn-busy-{i}"));
        let t = Instant::now();
        backend.snapshot_sandbox(&handle, &snapshot).expect("snapshot");
        busy.push(t.elapsed());
    }
    eprintln!(
        "snapshot after small writes (1 MB dirty): p50 {:?}, all {busy:?}",
        p50(busy.clone())
    );

    let target = snapshot_id("sn-idle-0");
    let t = Instant::now();
    let usage = backend.snapshot_usage(&target).expect("usage");
    eprintln!("snapshot_usage of 10k files: {:?} ({usage:?})", t.elapsed());

    drop(client);
    let mut handle = handle;
    let mut rollbacks = Vec::new();
    for _ in 0..11 {
        let t = Instant::now();
        handle = backend.rollback_sandbox(handle, &target).expect("rollback");
        rollbacks.push(t.elapsed());
    }
    eprintln!(
        "rollback, 1 GB / 10k files: p50 {:?}, all {rollbacks:?}",
        p50(rollbacks.clone())
    );
    let client = connect(&handle).await;
    assert_eq!(ok(&client, "ls /home/user/data | wc -l").await.trim(), "100");
    drop(client);

    let mut sequential = Vec::new();
    let mut forks = Vec::new();
    for i in 0..10 {
        let t = Instant::now();
        forks.push(
            backend
                .create_sandbox(&fork_spec(&format!("sb-seq-{i}"), &target))
                .expect("fork"),
        );
        sequential.push(t.elapsed());
    }
    eprintln!(
        "10 sequential forks: total {:?}, p50 {:?}",
        sequential.iter().sum::<Duration>(),
        p50(sequential.clone())
    );
    let t = Instant::now();
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let backend = backend.clone();
            let spec = fork_spec(&format!("sb-par-{i}"), &target);
            tokio::task::spawn_blocking(move || backend.create_sandbox(&spec))
        })
        .collect();
    for task in tasks {
        forks.push(task.await.expect("join").expect("fork"));
    }
    eprintln!("10 concurrent forks: total {:?}", t.elapsed());

    for fork in forks {
        backend.destroy_sandbox(fork).expect("destroy");
    }
    backend.destroy_sandbox(handle).expect("destroy");
    for snapshot in backend.list_snapshots().expect("list") {
        backend.delete_snapshot(&snapshot).expect("delete");
    }
    assert_all_clean(&env);
}

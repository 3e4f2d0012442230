//! A paused sandbox uses no CPU until it is resumed.

use super::*;

/// CPU time the sandbox used over `window`, microseconds.
async fn cpu_burnt(backend: &NativeBackend, handle: &SandboxHandle, window: Duration) -> u64 {
    let before = backend.sandbox_usage(handle).expect("usage").cpu_time_us;
    tokio::time::sleep(window).await;
    backend.sandbox_usage(handle).expect("usage").cpu_time_us - before
}

/// Whether the sandbox burns 50 ms of CPU within ten seconds (on a busy test machine its loop may get
/// little of a CPU, but never none).
async fn burns_cpu(backend: &NativeBackend, handle: &SandboxHandle) -> bool {
    let before = backend.sandbox_usage(handle).expect("usage").cpu_time_us;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = backend.sandbox_usage(handle).expect("usage").cpu_time_us;
        if now - before >= 50_000 {
            return true;
        }
    }
    false
}

#[tokio::test]
async fn a_paused_sandbox_uses_no_cpu_until_resumed() {
    if !require_freezer() {
        return;
    }
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env);
    let handle = backend.create_sandbox(&spec("sb-paused")).expect("create");
    let client = connect(&handle).await;
    background(&client, "while :; do :; done").await;
    let window = Duration::from_millis(300);
    assert!(burns_cpu(&backend, &handle).await, "the loop does not burn CPU");

    backend.pause_sandbox(&handle).expect("pause");
    assert!(frozen(&env, "sb-paused"));
    let paused = cpu_burnt(&backend, &handle, window).await;
    assert!(paused < 2_000, "{paused} us of CPU while paused");
    backend.pause_sandbox(&handle).expect("pausing twice is fine");

    // A snapshot of a paused sandbox leaves it paused.
    let snapshot = snapshot_id("sn-paused");
    backend
        .snapshot_sandbox(&handle, &snapshot)
        .expect("snapshot while paused");
    assert!(frozen(&env, "sb-paused"), "the snapshot thawed a paused sandbox");
    assert!(cpu_burnt(&backend, &handle, window).await < 2_000);

    backend.resume_sandbox(&handle).expect("resume");
    assert!(!frozen(&env, "sb-paused"));
    assert!(burns_cpu(&backend, &handle).await, "no CPU after resume");
    assert_eq!(ok(&client, "echo alive").await, "alive\n");
    backend.resume_sandbox(&handle).expect("resuming twice is fine");

    // A rollback of a paused sandbox starts it running.
    backend.pause_sandbox(&handle).expect("pause");
    drop(client);
    let handle = backend
        .rollback_sandbox(handle, &snapshot)
        .expect("rollback while paused");
    assert!(!frozen(&env, "sb-paused"));
    let client = connect(&handle).await;
    assert_eq!(ok(&client, "echo alive").await, "alive\n");

    // A paused sandbox can be destroyed.
    background(&client, "exec sleep 1000").await;
    backend.pause_sandbox(&handle).expect("pause");
    drop(client);
    backend.destroy_sandbox(handle).expect("destroy while paused");
    assert!(backend.delete_snapshot(&snapshot).expect("delete"));
    assert_all_clean(&env);
}

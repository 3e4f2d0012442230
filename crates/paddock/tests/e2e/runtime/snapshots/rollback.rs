//! Rollback restores a snapshot exactly (contents, modes, owners, times, links, deletions) and
//! restarts the sandbox under the same id and limits, cold or prepared ahead; a sandbox adopted
//! from another process stays paused and rolls back; a symlink in a snapshot never gets a host
//! file bound into a sandbox made from it.

use super::*;

#[tokio::test]
async fn rollback_restores_the_file_system_exactly_and_restarts_the_sandbox() {
    rollback_case(false).await;
}

/// The same through a rollback prepared ahead (`prepare_rollback`: a copy of the sandbox booted on the
/// snapshot, switched to at the rollback).
#[tokio::test]
async fn a_prepared_rollback_restores_exactly_the_same_and_leaves_nothing_behind() {
    rollback_case(true).await;
}

async fn rollback_case(prepared: bool) {
    if !require_freezer() {
        return;
    }
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env);
    let handle = backend.create_sandbox(&spec("sb-roll")).expect("create");
    let client = connect(&handle).await;
    ok(
        &client,
        "mkdir -p /home/user/d/sub/deeper && echo original > /home/user/d/file && chmod 640 /home/user/d/file && \
         ln -s file /home/user/d/link && echo doomed > /home/user/d/sub/deeper/doomed && \
         chmod 751 /home/user/d/sub && head -c 300K /dev/urandom > /home/user/d/big && echo owned > /home/user/d/owned",
    )
    .await;
    let (code, out) = agent_sh_as(
        &client,
        Some("root"),
        "echo secret > /root/r && chmod 600 /root/r && echo custom > /etc/custom",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    // Workloads hold no capability (not even root's chown): odd owners and set-id bits come from the
    // host.
    let volume = crate::support::volume_in(&pool(&env), "sb-roll");
    let owned = volume.join("home/user/d/owned");
    std::os::unix::fs::chown(&owned, Some(ID_BASE + 1234), Some(ID_BASE + 2345)).expect("chown");
    std::fs::set_permissions(&owned, std::os::unix::fs::PermissionsExt::from_mode(0o4750)).expect("chmod");
    assert_eq!(
        ok(
            &client,
            "stat -c '%u:%g %a' /home/user/d/owned; readlink /home/user/d/link"
        )
        .await,
        "1234:2345 4750\nfile\n"
    );
    let expected = volume_tree(&env, "sb-roll");
    assert!(expected.len() > 20, "{expected:#?}");

    let snapshot = snapshot_id("sn-roll");
    backend.snapshot_sandbox(&handle, &snapshot).expect("snapshot");

    // Change everything: content, modes, owners, the symlink, deletions, new files; and leave a
    // process running.
    ok(
        &client,
        "echo changed > /home/user/d/file && chmod 600 /home/user/d/file && rm /home/user/d/link && \
         echo not-a-link > /home/user/d/link && rm -r /home/user/d/sub && echo new > /home/user/d/new && \
         : > /home/user/d/big && chmod 700 /home/user/d",
    )
    .await;
    let (code, out) = agent_sh_as(
        &client,
        Some("root"),
        "rm /root/r && echo other > /etc/custom && echo new > /etc/new",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    std::os::unix::fs::chown(&owned, Some(ID_BASE), Some(ID_BASE)).expect("chown");
    std::fs::set_permissions(&owned, std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");
    assert_ne!(volume_tree(&env, "sb-roll"), expected);
    background(&client, "exec sleep 1000").await;
    let old_init = handle.init_pid().expect("a native init");
    let old_processes: Vec<i32> = env.processes().into_iter().map(|(pid, _)| pid).collect();
    assert!(old_processes.len() >= 2, "{old_processes:?}");

    let next = run_dir(&env, "sb-roll.next");
    if prepared {
        backend
            .prepare_rollback(&handle, &snapshot)
            .expect("prepare the rollback");
        assert!(next.join("agent.sock").exists(), "a prepared sandbox runs");
        assert!(crate::support::volume_in(&pool(&env), "sb-roll.next").is_dir());
    }
    let started = Instant::now();
    let handle = backend.rollback_sandbox(handle, &snapshot).expect("rollback");
    assert!(!next.exists(), "the prepared sandbox became the sandbox");
    assert!(!pool(&env).join("sandboxes/sb-roll.next").exists());
    eprintln!("rollback took {:?}", started.elapsed());
    assert_eq!(handle.id().as_str(), "sb-roll");
    assert_ne!(handle.init_pid().expect("a native init"), old_init);
    let record = std::fs::read_to_string(run_dir(&env, "sb-roll").join("init.pid")).expect("init.pid");
    assert!(
        record.starts_with(&format!("{} ", handle.init_pid().expect("a native init"))),
        "{record}"
    );
    for pid in &old_processes {
        assert!(process_gone(*pid), "process {pid} survived the rollback");
    }
    // The old agent's connection is gone; a new one works at once.
    assert!(client.spawn(shell_request("true", None, false)).await.is_err());
    assert_eq!(
        volume_tree(&env, "sb-roll"),
        expected,
        "the file system differs from the snapshot"
    );
    // And the new sandbox sees it.
    let client = connect(&handle).await;
    assert_eq!(
        ok(
            &client,
            "cat /home/user/d/file /home/user/d/sub/deeper/doomed; readlink /home/user/d/link; \
             stat -c '%u:%g %a' /home/user/d/owned"
        )
        .await,
        "original\ndoomed\nfile\n1234:2345 4750\n"
    );
    assert_eq!(
        agent_sh_as(&client, Some("root"), "cat /root/r /etc/custom").await,
        (0, "secret\ncustom\n".to_owned())
    );
    let (code, out) = agent_sh(&client, "test ! -e /home/user/d/new && test ! -e /etc/new").await;
    assert_eq!(code, 0, "files created after the snapshot survived: {out}");
    assert_eq!(ok(&client, "hostname").await.trim(), "sb-roll");
    // Same limits: pids (64) and disk.
    let forked: u32 = ok(&client, &format!("{FORK_SCRIPT}100"))
        .await
        .trim()
        .parse()
        .expect("count");
    assert!(
        (10..64).contains(&forked),
        "{forked} forks under a pids limit of 64"
    );
    let usage = backend.sandbox_usage(&handle).expect("usage");
    assert_eq!(usage.disk_limit_bytes, Some(2 << 30));

    // The snapshot is intact: rolling back again, after more changes, gives the same tree.
    ok(&client, "rm -rf /home/user/d").await;
    if prepared {
        backend
            .prepare_rollback(&handle, &snapshot)
            .expect("prepare the rollback again");
    }
    let handle = backend
        .rollback_sandbox(handle, &snapshot)
        .expect("second rollback");
    assert_eq!(volume_tree(&env, "sb-roll"), expected);
    let client = connect(&handle).await;
    assert_eq!(ok(&client, "cat /home/user/d/file").await, "original\n");

    // A preparation that fails once its run directory is staged leaves no staging directory (here
    // the way is blocked by a file where `<id>.next` goes); one that finds a staging directory a
    // crash left (`run/.new-<id>.next`, empty: the crash came before its lock file) takes it over.
    if prepared {
        let run = env.state().join("run");
        let staged = |run: &Path| -> Vec<String> {
            names(run)
                .into_iter()
                .filter(|n| n.starts_with(".new-"))
                .collect()
        };
        std::fs::write(&next, "in the way").expect("a file where the run dir goes");
        backend
            .prepare_rollback(&handle, &snapshot)
            .expect_err("the way is blocked");
        assert_eq!(
            staged(&run),
            Vec::<String>::new(),
            "a failed preparation left its staging directory behind"
        );
        std::fs::remove_file(&next).expect("clear the way");
        std::fs::create_dir(run.join(".new-sb-roll.next")).expect("a crash's leftover");
        backend
            .prepare_rollback(&handle, &snapshot)
            .expect("prepare over a crash's staging directory");
        assert!(next.join("lock").exists());
        assert_eq!(staged(&run), Vec::<String>::new());
        backend.discard_rollback(&handle).expect("discard");
    }
    // A prepared rollback that is discarded leaves nothing behind.
    if prepared {
        backend.prepare_rollback(&handle, &snapshot).expect("prepare");
        assert!(next.exists());
        backend.discard_rollback(&handle).expect("discard");
        assert!(!next.exists(), "a discarded preparation is removed");
        assert!(!pool(&env).join("sandboxes/sb-roll.next").exists());
        // And one still prepared when the rollback goes elsewhere is removed with the sandbox.
        backend.prepare_rollback(&handle, &snapshot).expect("prepare");
    }
    // A rollback to a snapshot that does not exist fails, and takes the sandbox with it.
    drop(client);
    let err = backend
        .rollback_sandbox(handle, &snapshot_id("sn-missing"))
        .expect_err("rollback to a missing snapshot");
    assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err:?}");
    assert_gone(&env, "sb-roll");
    assert_gone(&env, "sb-roll.next");

    assert!(backend.delete_snapshot(&snapshot).expect("delete"));
    assert_all_clean(&env);
}

/// Set (to `<state dir>\n<cgroup parent>\n<id>`) when this binary runs as the process that creates a
/// sandbox and exits, as a restarted server's predecessor would.
const CREATOR_ENV: &str = "PADDOCK_TEST_SNAPSHOTS_CREATOR";

/// Not a test of its own: the body of the creating process (a no-op unless [`CREATOR_ENV`] is set).
#[tokio::test]
async fn helper_creates_a_sandbox_then_exits() {
    let Ok(job) = std::env::var(CREATOR_ENV) else {
        return;
    };
    let mut lines = job.lines();
    let (state, parent, id) = (
        lines.next().expect("state"),
        lines.next().expect("parent"),
        lines.next().expect("id"),
    );
    let backend = NativeBackend::open(NativeConfig {
        state_dir: state.into(),
        pool_size: "8G".parse().expect("size"),
        ids: IdRange::DEFAULT,
        agent_binary: agent_bin(),
        setup_binary: setup_bin(),
        cgroup_parent: parent.to_owned(),
        die_with_parent: false,
        network_subnet: Default::default(),
    })
    .expect("open the native backend");
    let handle = backend.create_sandbox(&spec(id)).expect("create");
    let client = connect(&handle).await;
    ok(&client, "echo from-the-first-owner > /home/user/first").await;
    // Exit without tearing down: the lock goes with this process, the sandbox stays.
    std::mem::forget(handle);
}

/// Creates sandbox `id` in another process, which exits before this returns.
fn create_elsewhere(env: &TestEnv, id: &str) {
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            &test_name(module_path!(), "helper_creates_a_sandbox_then_exits"),
            "--exact",
            "--nocapture",
        ])
        .env(
            CREATOR_ENV,
            format!("{}\n{}\n{id}", env.state().display(), env.cgroup_parent),
        )
        .output()
        .expect("run the creating process");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "creating process failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn an_adopted_sandbox_stays_paused_and_can_be_rolled_back() {
    if !require_freezer() {
        return;
    }
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    create_elsewhere(&env, "sb-adopted");
    // Paused when its owner went away (as `pause_sandbox` leaves it).
    std::fs::write(unified_cgroup(&env, "sb-adopted").join("cgroup.freeze"), "1").expect("freeze");
    let backend = backend(&env);
    let handle = match backend.adopt_sandbox(&sandbox_id("sb-adopted")).expect("adopt") {
        paddock_runtime::Adoption::Alive(handle) => handle,
        other => panic!("a paused sandbox was not adopted: {other:?}"),
    };
    assert!(frozen(&env, "sb-adopted"), "adoption resumed a paused sandbox");
    backend.resume_sandbox(&handle).expect("resume");
    let client = connect(&handle).await;
    assert_eq!(
        ok(&client, "cat /home/user/first").await,
        "from-the-first-owner\n"
    );

    // Its rollback restarts it from what its first owner recorded (root file system, user, mounts).
    let snapshot = snapshot_id("sn-adopted");
    backend.snapshot_sandbox(&handle, &snapshot).expect("snapshot");
    ok(&client, "rm /home/user/first").await;
    let old_init = handle.init_pid().expect("a native init");
    drop(client);
    let handle = backend
        .rollback_sandbox(handle, &snapshot)
        .expect("rollback of an adopted sandbox");
    assert!(wait_until(Duration::from_secs(10), || process_gone(old_init)));
    let client = connect(&handle).await;
    assert_eq!(
        ok(&client, "cat /home/user/first; id -un").await,
        "from-the-first-owner\nuser\n"
    );

    drop(client);
    backend.destroy_sandbox(handle).expect("destroy");
    assert!(backend.delete_snapshot(&snapshot).expect("delete"));
    // The first init, orphaned by its creator, is reaped by the host's init in its own time.
    assert!(
        wait_until(Duration::from_secs(30), || env.processes().is_empty()),
        "processes left: {:?}",
        env.processes()
    );
    assert_all_clean(&env);
}

/// A sandbox's files travel in snapshots. One that turned its `/etc/resolv.conf` into a symlink to a
/// host path must not get that host file mounted into a sandbox created from its snapshot on a
/// `--rootfs` template (whose generated `/etc` files are bound from the volume by path; `passwd`,
/// `group`, `hosts` and `hostname` are rewritten for the new sandbox, `resolv.conf` is not).
#[tokio::test]
async fn a_symlink_in_a_snapshot_never_binds_a_host_file() {
    if !require_freezer() {
        return;
    }
    let busybox = std::path::Path::new("/bin/busybox");
    assert!(
        busybox.exists(),
        "this test needs busybox-static (/bin/busybox); scripts/test.sh installs it"
    );
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env);
    let secret_dir = tempfile::Builder::new()
        .prefix("paddock-secret-")
        .tempdir_in("/var/tmp")
        .expect("secret dir");
    std::fs::set_permissions(
        secret_dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let secret = secret_dir.path().join("host-secret");
    std::fs::write(&secret, "host-only\n").expect("secret");
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");

    let handle = backend.create_sandbox(&spec("sb-evil")).expect("create");
    let client = connect(&handle).await;
    let (code, out) = agent_sh_as(
        &client,
        Some("root"),
        &format!(
            "ln -sf {} /etc/resolv.conf && ls -l /etc/resolv.conf",
            secret.display()
        ),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let snapshot = snapshot_id("sn-evil");
    backend.snapshot_sandbox(&handle, &snapshot).expect("snapshot");
    drop(client);
    backend.destroy_sandbox(handle).expect("destroy");

    let rootfs = tempfile::Builder::new()
        .prefix("paddock-rootfs-")
        .tempdir_in("/var/tmp")
        .expect("rootfs");
    std::fs::set_permissions(rootfs.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let bin = rootfs.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    std::fs::create_dir_all(rootfs.path().join("etc")).expect("etc");
    std::fs::copy(busybox, bin.join("busybox")).expect("copy busybox");
    for applet in ["sh", "cat"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("symlink");
    }
    std::fs::write(
        rootfs.path().join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\n",
    )
    .expect("passwd");
    std::fs::write(rootfs.path().join("etc/resolv.conf"), "nameserver 127.0.0.1\n").expect("resolv.conf");
    let custom = SandboxSpec {
        rootfs: RootfsSpec::Dir {
            path: rootfs.path().to_owned(),
        },
        ..fork_spec("sb-victim", &snapshot)
    };
    match backend.create_sandbox(&custom) {
        Err(e) => assert!(e.to_string().contains("not a regular file"), "{e}"),
        Ok(handle) => {
            let client = connect(&handle).await;
            let (_, out) = agent_sh(&client, "cat /etc/resolv.conf").await;
            drop(client);
            backend.destroy_sandbox(handle).expect("destroy");
            panic!("a sandbox was created on a symlinked /etc/resolv.conf; it reads: {out}");
        }
    }
    assert_gone(&env, "sb-victim");
    assert!(backend.delete_snapshot(&snapshot).expect("delete"));
    assert_all_clean(&env);
}

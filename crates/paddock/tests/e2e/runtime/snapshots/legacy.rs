//! Volumes an older paddock made: the subvolume `sandboxes/<id>` itself, where this one makes
//! `sandboxes/<id>/volume` in a directory of its own. Such a sandbox keeps working through every
//! operation that touches its volume (snapshot, usage, fork from it, stop and resume, cold and
//! prepared rollbacks, delete), and whatever makes its volume again makes it in the new layout.

use std::os::unix::fs::MetadataExt;

use super::*;

/// Every btrfs subvolume's root directory has this inode number.
const SUBVOLUME_ROOT_INODE: u64 = 256;

fn is_subvolume(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir() && m.ino() == SUBVOLUME_ROOT_INODE)
}

/// Puts running sandbox `id`'s volume where an older paddock kept it (`sandboxes/<id>`); its
/// mounts hold the subvolume, not its path, so the sandbox does not notice.
fn make_legacy(env: &TestEnv, id: &str) {
    let sandboxes = pool(env).join("sandboxes");
    let aside = sandboxes.join(format!("{id}.aside"));
    std::fs::rename(sandboxes.join(id).join("volume"), &aside).expect("move the volume aside");
    std::fs::remove_dir(sandboxes.join(id)).expect("remove its directory");
    std::fs::rename(&aside, sandboxes.join(id)).expect("move the volume to the old place");
    assert!(is_subvolume(&sandboxes.join(id)), "not an older layout");
}

/// Sandbox `id`'s volume is in the new layout, with nothing of the old one.
fn assert_new_layout(env: &TestEnv, id: &str) {
    let dir = pool(env).join("sandboxes").join(id);
    let meta = std::fs::symlink_metadata(&dir).expect("the volume's directory");
    assert!(
        meta.is_dir() && meta.ino() != SUBVOLUME_ROOT_INODE,
        "{id}: still the old layout"
    );
    assert_eq!(meta.mode() & 0o7777, 0o710, "{id}: the directory's mode");
    assert_eq!(
        names(&dir),
        ["volume"],
        "{id}: the directory holds only the volume"
    );
    assert!(
        is_subvolume(&dir.join("volume")),
        "{id}: no volume in its directory"
    );
}

#[tokio::test]
async fn an_older_layouts_volume_is_snapshotted_forked_stopped_resumed_and_deleted() {
    if !require_freezer() {
        return;
    }
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env);
    let handle = backend.create_sandbox(&spec("sb-old")).expect("create");
    assert_new_layout(&env, "sb-old");
    let client = connect(&handle).await;
    ok(&client, "echo old > /home/user/f").await;
    make_legacy(&env, "sb-old");
    ok(&client, "echo more > /home/user/g").await;
    let legacy = pool(&env).join("sandboxes/sb-old");
    assert_eq!(std::fs::read(legacy.join("home/user/g")).expect("g"), b"more\n");

    // Usage and a snapshot read it where it is.
    sync_pool(&env);
    let usage = backend.sandbox_usage(&handle).expect("usage");
    assert!(usage.disk_bytes > 0, "{usage:?}");
    let snapshot = snapshot_id("sn-old");
    backend.snapshot_sandbox(&handle, &snapshot).expect("snapshot");
    assert_eq!(
        std::fs::read(snapshot_dir(&env, &snapshot).join("home/user/f")).expect("f"),
        b"old\n"
    );
    // A fork of it is made in the new layout.
    let fork = backend
        .create_sandbox(&fork_spec("sb-oldfork", &snapshot))
        .expect("fork");
    assert_new_layout(&env, "sb-oldfork");
    assert_eq!(
        ok(&connect(&fork).await, "cat /home/user/f /home/user/g").await,
        "old\nmore\n"
    );
    backend.destroy_sandbox(fork).expect("destroy the fork");
    assert_gone(&env, "sb-oldfork");

    // Stopped, it leaves `sandboxes/`; resumed, it comes back in the new layout.
    drop(client);
    backend.stop_sandbox(handle).expect("stop");
    assert!(!legacy.exists(), "a stopped sandbox's volume stays in sandboxes/");
    assert!(is_subvolume(&pool(&env).join("stopped/sb-old")));
    let resumed = SandboxSpec {
        volume: VolumeSource::Stopped,
        ..spec("sb-old")
    };
    let handle = backend.create_sandbox(&resumed).expect("resume");
    assert_new_layout(&env, "sb-old");
    assert_eq!(
        ok(&connect(&handle).await, "cat /home/user/f /home/user/g").await,
        "old\nmore\n"
    );

    // Deleted, in the old layout again: nothing is left.
    make_legacy(&env, "sb-old");
    backend.destroy_sandbox(handle).expect("destroy");
    assert_gone(&env, "sb-old");
    assert!(backend.delete_snapshot(&snapshot).expect("delete the snapshot"));
    assert_all_clean(&env);
}

#[tokio::test]
async fn an_older_layouts_volume_rolls_back_cold_and_prepared_into_the_new_layout() {
    if !require_freezer() {
        return;
    }
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env);
    let mut handle = backend.create_sandbox(&spec("sb-oldroll")).expect("create");
    ok(&connect(&handle).await, "echo kept > /home/user/f").await;
    let snapshot = snapshot_id("sn-oldroll");
    backend.snapshot_sandbox(&handle, &snapshot).expect("snapshot");
    for prepared in [false, true] {
        ok(
            &connect(&handle).await,
            "echo changed > /home/user/f && echo new > /home/user/n",
        )
        .await;
        make_legacy(&env, "sb-oldroll");
        if prepared {
            backend
                .prepare_rollback(&handle, &snapshot)
                .expect("prepare the rollback");
            assert_new_layout(&env, "sb-oldroll.next");
        }
        handle = backend.rollback_sandbox(handle, &snapshot).expect("rollback");
        assert_new_layout(&env, "sb-oldroll");
        assert!(
            !pool(&env).join("sandboxes/sb-oldroll.next").exists(),
            "prepared: {prepared}"
        );
        let client = connect(&handle).await;
        assert_eq!(
            agent_sh(&client, "cat /home/user/f; test -e /home/user/n").await,
            (1, "kept\n".to_owned()),
            "prepared: {prepared}"
        );
    }
    backend.destroy_sandbox(handle).expect("destroy");
    assert_gone(&env, "sb-oldroll");
    assert!(backend.delete_snapshot(&snapshot).expect("delete the snapshot"));
    assert_all_clean(&env);
}

//! A create that fails after its volume was started (`early_volume.rs`: the volume is made on a
//! thread while the cgroups and the rest are set up) leaves nothing of it in the pool, and a resume
//! that fails so keeps its files in `stopped/` for the next try.

use std::path::{Path, PathBuf};

use paddock_runtime::native::NativeBackend;
use paddock_runtime::SandboxBackend;
use paddock_types::{SandboxSpec, VolumeSource};

use crate::support::{agent_sh, connect, host_spec, GcOnDrop, TestEnv};

/// Where sandbox `id`'s first cgroup directory goes (the one a create makes first): found beside
/// the running sandbox `beside`'s.
fn first_cgroup_dir(env: &TestEnv, beside: &str, id: &str) -> PathBuf {
    ["memory", "pids", "cpu", "blkio", "unified", ""]
        .iter()
        .map(|h| Path::new("/sys/fs/cgroup").join(h).join(&env.cgroup_parent))
        .find(|parent| parent.join(beside).is_dir())
        .expect("the running sandbox's cgroup")
        .join(id)
}

#[tokio::test]
async fn a_create_or_resume_failing_at_its_cgroups_leaves_no_volume_and_keeps_stopped_files() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = NativeBackend::open(env.native_config()).expect("open the native backend");
    // Keeps the parent cgroups while the others fail.
    let keep = backend.create_sandbox(&host_spec("sb-keep")).expect("create");
    let sandboxes = env.state().join("pool/sandboxes");

    // A new sandbox whose cgroup is in the way: refused, nothing of its volume left.
    let blocker = first_cgroup_dir(&env, "sb-keep", "sb-blocked");
    std::fs::create_dir(&blocker).expect("a cgroup in the way");
    let refused = backend.create_sandbox(&host_spec("sb-blocked"));
    std::fs::remove_dir(&blocker).expect("remove the blocking cgroup");
    assert!(refused.is_err(), "a create with its cgroup in the way");
    assert!(
        !sandboxes.join("sb-blocked").exists(),
        "a failed create left its volume"
    );
    assert!(!env.state().join("run/sb-blocked").exists());

    // A stopped sandbox whose resume fails the same way keeps its files, and resumes next time.
    let handle = backend.create_sandbox(&host_spec("sb-res")).expect("create");
    let (code, out) = agent_sh(&connect(&handle).await, "echo kept > /home/user/f").await;
    assert_eq!(code, 0, "{out}");
    backend.stop_sandbox(handle).expect("stop");
    let resume = SandboxSpec {
        volume: VolumeSource::Stopped,
        ..host_spec("sb-res")
    };
    let blocker = first_cgroup_dir(&env, "sb-keep", "sb-res");
    std::fs::create_dir(&blocker).expect("a cgroup in the way");
    let refused = backend.create_sandbox(&resume);
    std::fs::remove_dir(&blocker).expect("remove the blocking cgroup");
    assert!(refused.is_err(), "a resume with its cgroup in the way");
    assert!(
        !sandboxes.join("sb-res").exists(),
        "a failed resume left its volume in place"
    );
    let kept = env.state().join("pool/stopped/sb-res/home/user/f");
    assert_eq!(std::fs::read(&kept).expect("the stopped files"), b"kept\n");
    let handle = backend.create_sandbox(&resume).expect("resume");
    assert_eq!(
        agent_sh(&connect(&handle).await, "cat /home/user/f").await,
        (0, "kept\n".to_owned())
    );
    backend.destroy_sandbox(handle).expect("destroy");
    backend.destroy_sandbox(keep).expect("destroy");
    env.assert_clean();
}

//! Driving the native backend directly, as the runtime tests do: its configuration on a test's
//! environment, a sandbox spec on the host's root file system, a connection to a sandbox's agent.

use std::path::Path;

use super::env::{agent_bin, setup_bin, TestEnv};

/// The native backend's configuration on a state directory and cgroup parent: the pool size the
/// tests use, the default id range, the built binaries. Sandboxes do not die with their creator:
/// tests create them from several threads, and a parent-death signal fires when the creating
/// *thread* exits ([`GcOnDrop`] reclaims them when a test fails instead).
pub fn native_config(state: &Path, cgroup_parent: &str) -> paddock_runtime::native::NativeConfig {
    paddock_runtime::native::NativeConfig {
        state_dir: state.to_owned(),
        pool_size: "8G".parse().expect("size"),
        ids: paddock_runtime::native::IdRange::DEFAULT,
        agent_binary: agent_bin(),
        setup_binary: setup_bin(),
        cgroup_parent: cgroup_parent.to_owned(),
        die_with_parent: false,
        network_subnet: Default::default(),
    }
}

impl TestEnv {
    /// [`native_config`] on this environment's state directory and cgroup parent.
    pub fn native_config(&self) -> paddock_runtime::native::NativeConfig {
        native_config(self.state(), &self.cgroup_parent)
    }
}

/// Reclaims the sandboxes of a failed test (their handles, dropped first, release their locks) before
/// the environment destroys the pool; a passing test has nothing left to reclaim.
pub struct GcOnDrop<'a>(pub &'a TestEnv);

impl Drop for GcOnDrop<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.0.cmd().arg("gc").output();
        }
    }
}

/// A sandbox on the host's root file system as user `user`: 1 GiB of memory, 64 pids, 2 GiB of disk,
/// no mounts, volumes or network.
pub fn host_spec(id: &str) -> paddock_types::SandboxSpec {
    use paddock_types::{ByteSize, Limits, RootfsSpec, SandboxSpec, VolumeSource};
    SandboxSpec {
        id: id.parse().expect("sandbox id"),
        limits: Limits {
            memory: Some(ByteSize::gib(1)),
            cpus: None,
            pids: Some(64),
            disk: Some(ByteSize::gib(2)),
        },
        rootfs: RootfsSpec::Host,
        mounts: Vec::new(),
        workdir: None,
        user: "user".parse().expect("user"),
        env: Vec::new(),
        volume: VolumeSource::Template,
        volumes: Vec::new(),
        network: None,
    }
}

/// A connection to a sandbox's agent.
pub async fn connect(handle: &paddock_runtime::SandboxHandle) -> paddock_runtime::agent_client::AgentClient {
    paddock_runtime::agent_client::AgentClient::connect(&handle.agent_socket)
        .await
        .expect("connect to the agent")
}

/// A shell script for a sandbox's agent: `PATH=/usr/bin:/bin`, as the sandbox's default user unless
/// `user` names one; a foreground one is killed after 60 s, a detached one runs on.
pub fn shell_request(script: &str, user: Option<&str>, detached: bool) -> paddock_protocol::SpawnRequest {
    paddock_protocol::SpawnRequest {
        command: paddock_protocol::CommandSpec::Shell {
            script: script.to_owned(),
        },
        env: std::collections::BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
        cwd: None,
        user: user.map(str::to_owned),
        stdin: false,
        pty: None,
        timeout_ms: if detached { None } else { Some(60_000) },
        tag: None,
        detached,
    }
}

/// What a shell script printed on stdout, and its exit code (its stderr is printed when it fails).
pub async fn agent_sh(client: &paddock_runtime::agent_client::AgentClient, script: &str) -> (i32, String) {
    agent_sh_as(client, None, script).await
}

/// [`agent_sh`] as `user` (the sandbox's default user when `None`).
pub async fn agent_sh_as(
    client: &paddock_runtime::agent_client::AgentClient,
    user: Option<&str>,
    script: &str,
) -> (i32, String) {
    use paddock_protocol::Stream;
    use paddock_runtime::agent_client::ProcessEvent;
    let (_pid, mut events) = client
        .spawn(shell_request(script, user, false))
        .await
        .expect("spawn");
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    loop {
        let event = tokio::time::timeout(std::time::Duration::from_secs(60), events.recv())
            .await
            .expect("the script ends in time");
        match event {
            Some(ProcessEvent::Output { stream, data, .. }) => match stream {
                Stream::Stderr => stderr.extend(data),
                _ => stdout.extend(data),
            },
            Some(ProcessEvent::Exited(status)) => {
                let out = String::from_utf8_lossy(&stdout).into_owned();
                if status.shell_code() != 0 {
                    eprintln!("{script}: {}", String::from_utf8_lossy(&stderr));
                }
                return (status.shell_code(), out);
            }
            None => panic!("events ended without an exit"),
        }
    }
}

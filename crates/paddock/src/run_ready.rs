//! `paddock run --keep-ready`: the run's side of sandboxes made ahead (runtime `native/ready.rs`).
//! A run takes a ready sandbox (`run.rs` asks the backend), and at its end kills its sandbox's
//! processes and hands the rest of the teardown, with the maker lock, to a `paddock make-ready` it
//! starts, which makes the next run's sandbox first: neither is on the caller's path.
//!
//! This module does not decide which sandboxes can be made ahead or keep them (the runtime does),
//! and does not wait for the maker it starts.

use std::process::ExitCode;

use anyhow::Context;
use paddock_runtime::{RuntimeError, SandboxBackend, SandboxHandle};
use paddock_types::SandboxSpec;

use crate::config::Config;

/// Ends the run's sandbox. Without `ready` (a spec of `--keep-ready`'s), it is destroyed here. With
/// one, its processes are killed here and the rest of its teardown goes to the maker this starts,
/// which first makes the next run's sandbox: neither is on the caller's path. Only while no other
/// maker is at work (the maker lock is free): otherwise the sandbox is destroyed here, as the maker
/// lock is what `pool destroy` waits for and it is handed to the maker with the sandbox.
pub(crate) fn tear_down(
    config: &Config,
    backend: &paddock_runtime::native::NativeBackend,
    handle: SandboxHandle,
    ready: Option<&SandboxSpec>,
) -> Result<(), RuntimeError> {
    use paddock_runtime::native::MakerLock;
    let Some(spec) = ready else {
        return backend.destroy_sandbox(handle);
    };
    let lock = match MakerLock::for_maker(&config.state_dir) {
        Ok(Some(lock)) => lock,
        Ok(None) => return backend.destroy_sandbox(handle),
        Err(e) => {
            tracing::warn!(error = %e, "cannot make a sandbox ahead");
            return backend.destroy_sandbox(handle);
        }
    };
    let started = backend
        .end_for_another_process(&handle)
        .map_err(anyhow::Error::new)
        .and_then(|kept| {
            let fd = lock.keep_across_spawn()?;
            start_ready_maker(config, spec, fd, &crate::run_lean::kept_text(&handle.id, &kept))
        });
    match started {
        // The maker holds the sandbox's lock and pidfd, and the maker lock, from here.
        Ok(()) => Ok(()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start making a sandbox ahead");
            backend.destroy_sandbox(handle)
        }
    }
}

/// Starts `paddock make-ready` for runs shaped like `spec` (`--keep-ready`), handing it the maker
/// lock (descriptor `lock_fd`) and the sandbox `take` (`<id>:<KeptAcrossExec>`) to tear down: a
/// process of this program, detached (its own process group, none of this run's stdio, never waited
/// for), so the run's caller never waits for it.
fn start_ready_maker(config: &Config, spec: &SandboxSpec, lock_fd: i32, take: &str) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("find this program")?;
    let spec = serde_json::to_string(spec)?;
    let mut maker = std::process::Command::new(exe);
    maker
        .env_clear()
        .arg("--state-dir")
        .arg(&config.state_dir)
        .arg("--agent")
        .arg(&config.agent)
        .arg("--cgroup-parent")
        .arg(&config.cgroup_parent)
        .arg("--pool-size")
        .arg(config.pool_size.to_string())
        .arg("make-ready")
        .arg("--lock-fd")
        .arg(lock_fd.to_string())
        .arg("--take")
        .arg(take)
        .arg(spec)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0);
    // The log level, and a crash point armed for the crash tests (read by debug builds only).
    for var in ["PADDOCK_LOG", paddock_runtime::fault::FAULT_ENV] {
        if let Ok(value) = std::env::var(var) {
            maker.env(var, value);
        }
    }
    maker.spawn().context("start paddock make-ready")?;
    Ok(())
}

/// `paddock make-ready`: holding the maker lock (inherited through `lock_fd`), makes one sandbox
/// ahead for runs shaped like `spec` (a run's spec, as JSON, with an id no sandbox has) unless one is
/// ready, then tears down the sandbox `take` (`<id>:<KeptAcrossExec>`) the run left it.
pub fn make_ready(config: &Config, spec: &str, lock_fd: i32, take: &str) -> anyhow::Result<ExitCode> {
    let spec: SandboxSpec = serde_json::from_str(spec).context("the spec of a sandbox to make ahead")?;
    let lock = paddock_runtime::native::MakerLock::inherited(lock_fd, &config.state_dir)?;
    let backend = config.open_backend(false)?;
    // Taken back first: its descriptors are this process's from here, whatever fails next.
    let (id, kept) = crate::run_lean::parse_kept(take).context("--take is not <id>:<kept descriptors>")?;
    let taken = backend.take_back(&id, &kept);
    match backend.make_ready(&spec, &lock) {
        Ok(Some(id)) => tracing::debug!(sandbox_id = %id, "made a sandbox ahead"),
        Ok(None) => tracing::debug!("a sandbox of this shape is ready already"),
        Err(e) => tracing::warn!(error = %e, "cannot make a sandbox ahead"),
    }
    backend.destroy_sandbox(taken?)?;
    Ok(ExitCode::SUCCESS)
}

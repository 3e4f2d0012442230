//! Test plumbing: runs a test again in a fresh child process, for tests of irreversible changes to the
//! process (dropping capabilities, installing a seccomp filter, Landlock) that would otherwise affect the
//! other tests of the binary.
//!
//! A test `name` calls [`in_child`] with its module's environment variable: in the child it runs its
//! body, otherwise it calls [`run_in_child`], which starts the current test binary on `name` alone with
//! that variable set to `name`.

use std::ffi::OsStr;
use std::process::Command;

/// Runs the test `name` again in a fresh process, where `in_child(env_var, name)` holds, and asserts
/// that it passed. The child's stderr is passed on, so notes such as skipped parts show.
pub(crate) fn run_in_child(env_var: &str, name: &str) {
    run_in_child_with_env(env_var, name, &[]);
}

/// [`run_in_child`], with `extra_env` also set in the child's environment.
pub(crate) fn run_in_child_with_env(env_var: &str, name: &str, extra_env: &[(&str, &OsStr)]) {
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(env_var, name)
        .envs(extra_env.iter().copied())
        .output()
        .expect("run child test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child test {name} failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    eprint!("{stderr}");
}

/// Whether this process is the child started by [`run_in_child`] with `env_var` for `name`.
pub(crate) fn in_child(env_var: &str, name: &str) -> bool {
    std::env::var(env_var).is_ok_and(|v| v == name)
}

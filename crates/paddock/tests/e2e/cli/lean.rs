//! A long `paddock run` hands over to `paddock-wait` (`run_lean.rs`, `wait.rs`): the same process,
//! a small program, until the command ends; then `paddock` again tears the sandbox down. Output is
//! neither lost nor repeated across the hand-over, the command's exit code, `--timeout` and an
//! ending signal are answered as before, and nothing is left behind.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::support::{wait_until, TestEnv};

/// Generous: the hand-over happens half a second into the command.
const HAND_OVER_DEADLINE: Duration = Duration::from_secs(60);

fn exe(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Waits until `child` is `paddock-wait`; then checks what it holds: one thread, no async runtime's
/// descriptors, neither `paddock` nor `paddock-full` mapped.
#[track_caller]
fn assert_handed_over(child: &Child) {
    let pid = child.id();
    assert!(
        wait_until(HAND_OVER_DEADLINE, || exe(pid).ends_with("/paddock-wait")),
        "the run never handed over: it is {}",
        exe(pid)
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    assert!(status.contains("\nThreads:\t1\n"), "{status}");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    for line in maps.lines() {
        assert!(
            !line.ends_with("/paddock") && !line.ends_with("/paddock-full"),
            "the waiter still maps {line}"
        );
    }
    let kinds = crate::support::fd_kinds(pid as i32);
    assert!(
        !kinds
            .keys()
            .any(|k| k.contains("eventpoll") || k.contains("eventfd")),
        "the waiter holds the front's runtime: {kinds:?}"
    );
}

#[test]
fn a_long_run_hands_over_and_its_output_is_neither_lost_nor_repeated() {
    let env = TestEnv::new();
    let ctl = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(ctl.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mount = format!("{}:/ctl:ro", ctl.path().display());
    // Numbered lines as fast as the shell writes them, across the hand-over, until told to stop.
    let script =
        "i=0; while [ ! -e /ctl/stop ]; do echo $i; i=$((i+1)); done; echo end $i; echo stopped >&2; exit 3";
    let mut child = env
        .cmd()
        .args(["run", "-v", &mount, "--", "/bin/sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut out = child.stdout.take().expect("stdout");
    let received = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = received.clone();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 64 * 1024];
        loop {
            let n = out.read(&mut buf).expect("read stdout");
            if n == 0 {
                return all;
            }
            all.extend_from_slice(&buf[..n]);
            count.store(all.len(), std::sync::atomic::Ordering::SeqCst);
        }
    });
    assert_handed_over(&child);
    // Output keeps coming from the waiter before the command is told to stop.
    let at_hand_over = received.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        wait_until(HAND_OVER_DEADLINE, || {
            received.load(std::sync::atomic::Ordering::SeqCst) > at_hand_over + 64 * 1024
        }),
        "no output after the hand-over"
    );
    std::fs::write(ctl.path().join("stop"), b"").expect("stop");
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    let status = child.wait().expect("wait");
    let all = reader.join().expect("reader");
    assert_eq!(status.code(), Some(3), "stderr: {err}");
    assert!(err.contains("stopped"), "stderr: {err}");
    let text = String::from_utf8(all).expect("utf-8");
    let mut lines: Vec<&str> = text.lines().collect();
    let last = lines.pop().expect("output");
    assert_eq!(last, format!("end {}", lines.len()));
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(*line, i.to_string(), "line {i} of {}", lines.len());
    }
    env.assert_clean();
}

#[test]
fn a_handed_over_run_ends_on_its_timeout() {
    let env = TestEnv::new();
    let mut child = env
        .cmd()
        .args(["run", "--timeout", "10s", "--", "sleep", "600"])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn");
    assert_handed_over(&child);
    assert_eq!(child.wait().expect("wait").code(), Some(124));
    env.assert_clean();
}

#[test]
fn a_handed_over_run_ends_on_a_signal_and_is_torn_down() {
    let env = TestEnv::new();
    use rustix::process::Signal;
    for (signal, code) in [(Signal::TERM, 143), (Signal::INT, 130), (Signal::HUP, 129)] {
        let mut child = env
            .cmd()
            .args(["run", "--", "sleep", "600"])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn");
        assert_handed_over(&child);
        let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
        rustix::process::kill_process(pid, signal).expect("kill");
        assert_eq!(
            child.wait().expect("wait").code(),
            Some(code),
            "signal {signal:?}"
        );
        env.assert_clean();
    }
}

#[test]
fn a_run_whose_stdin_stays_open_keeps_the_front() {
    let env = TestEnv::new();
    // The command ends when its stdin ends; until then the front copies stdin and never hands over.
    let (mut child, mut out, mut seen) =
        env.spawn_run_until_up(&["--", "/bin/sh", "-c", "echo up; cat > /dev/null; echo done"]);
    // Not a synchronisation: a lower bound for a check that nothing happens, four times the
    // hand-over's delay (which would have replaced the front by now).
    std::thread::sleep(Duration::from_secs(2));
    let front = crate::support::paddock_bin().canonicalize().expect("paddock");
    assert_eq!(exe(child.id()), front.to_string_lossy());
    drop(child.stdin.take());
    out.read_to_end(&mut seen).expect("read");
    assert_eq!(child.wait().expect("wait").code(), Some(0));
    assert!(String::from_utf8_lossy(&seen).ends_with("up\ndone\n"));
    env.assert_clean();
}

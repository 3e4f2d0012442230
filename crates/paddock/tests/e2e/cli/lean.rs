//! A long `paddock run` hands over to `paddock-wait` (`run_lean.rs`, `wait.rs`): the same process,
//! a small program, until the command ends; then `paddock` again tears the sandbox down. Output is
//! neither lost nor repeated across the hand-over, the command's exit code, `--timeout` and an
//! ending signal are answered as before, and nothing is left behind.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, ChildStdout, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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

/// A directory through which the test tells the command when to stop, mounted at `/ctl`: returns it
/// and the `--mount` value.
fn control_dir() -> (tempfile::TempDir, String) {
    let ctl = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(ctl.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mount = format!("{}:/ctl:ro", ctl.path().display());
    (ctl, mount)
}

/// Reads `out` to its end on a thread, counting the bytes as they come. The thread returns the
/// output, or only its last `keep` bytes.
fn count_output(
    mut out: ChildStdout,
    keep: Option<usize>,
) -> (Arc<AtomicUsize>, std::thread::JoinHandle<Vec<u8>>) {
    let received = Arc::new(AtomicUsize::new(0));
    let count = received.clone();
    let reader = std::thread::spawn(move || {
        let (mut total, mut kept) = (0, Vec::new());
        let mut buf = [0u8; 64 * 1024];
        loop {
            let n = out.read(&mut buf).expect("read stdout");
            if n == 0 {
                return kept;
            }
            total += n;
            kept.extend_from_slice(&buf[..n]);
            if let Some(keep) = keep {
                let old = kept.len().saturating_sub(keep);
                kept.drain(..old);
            }
            count.store(total, Ordering::SeqCst);
        }
    });
    (received, reader)
}

#[test]
fn a_long_run_hands_over_and_its_output_is_neither_lost_nor_repeated() {
    let env = TestEnv::new();
    let (ctl, mount) = control_dir();
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
    let (received, reader) = count_output(child.stdout.take().expect("stdout"), None);
    assert_handed_over(&child);
    // Output keeps coming from the waiter before the command is told to stop.
    let at_hand_over = received.load(Ordering::SeqCst);
    assert!(
        wait_until(HAND_OVER_DEADLINE, || {
            received.load(Ordering::SeqCst) > at_hand_over + 64 * 1024
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

/// Stdin still open (a pipe) is copied on by the waiter: a command that reads it only later gets
/// every byte, and its output keeps coming while stdin waits for it to read.
#[test]
fn a_run_whose_stdin_stays_open_hands_over_and_stdin_keeps_flowing() {
    let env = TestEnv::new();
    let (ctl, mount) = control_dir();
    let script = "i=0; while [ ! -e /ctl/go ]; do echo tick $i; i=$((i+1)); done; echo bytes $(wc -c)";
    let mut child = env
        .cmd()
        .args(["run", "-v", &mount, "--", "/bin/sh", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    // The ticks are many: only the last bytes are kept.
    let (received, reader) = count_output(child.stdout.take().expect("stdout"), Some(4096));
    assert_handed_over(&child);
    // 1 MiB the command will not read until told to: the waiter delivers what the pipe takes and
    // waits for the command, while the ticks go on.
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || {
        stdin.write_all(&vec![b'x'; 1 << 20]).expect("write stdin");
    });
    let before = received.load(Ordering::SeqCst);
    assert!(
        wait_until(HAND_OVER_DEADLINE, || {
            received.load(Ordering::SeqCst) > before + 256 * 1024
        }),
        "the output stopped while stdin waited"
    );
    std::fs::write(ctl.path().join("go"), b"").expect("go");
    writer.join().expect("writer");
    let status = child.wait().expect("wait");
    let tail = String::from_utf8_lossy(&reader.join().expect("reader")).into_owned();
    assert_eq!(status.code(), Some(0));
    assert_eq!(tail.lines().last(), Some("bytes 1048576"), "{tail}");
    env.assert_clean();
}

/// A run with a terminal (`--tty`) keeps the front: the waiter serves no terminal. Checked all
/// through a command that outlives the hand-over's delay three times.
#[test]
fn a_run_with_a_terminal_keeps_the_front() {
    let env = TestEnv::new();
    let (master, slave) = paddock_sys::pty::open_pty(None).expect("pty");
    let mut child = env
        .cmd()
        .args(["run", "--tty", "--", "sleep", "1.5"])
        .stdin(Stdio::from(slave.try_clone().expect("dup")))
        .stdout(Stdio::from(slave.try_clone().expect("dup")))
        .stderr(Stdio::from(slave))
        .spawn()
        .expect("spawn");
    let drain = std::thread::spawn(move || {
        let mut f = std::fs::File::from(master);
        let mut buf = [0u8; 4096];
        // EIO once the last slave descriptor closes.
        while matches!(f.read(&mut buf), Ok(n) if n > 0) {}
    });
    let pid = child.id();
    let mut seen = std::collections::BTreeSet::new();
    while child.try_wait().expect("try_wait").is_none() {
        let exe = exe(pid);
        if !exe.is_empty() {
            seen.insert(exe.rsplit('/').next().unwrap_or_default().to_owned());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(child.wait().expect("wait").code(), Some(0));
    drain.join().expect("drain");
    assert!(
        !seen.contains("paddock-wait"),
        "a terminal run handed over: {seen:?}"
    );
    assert!(seen.contains("paddock"), "{seen:?}");
    env.assert_clean();
}

//! Resource limits hold, and nothing is left behind after a limit is hit.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::{assert_code, stderr, stdout, TestEnv};

#[test]
fn fork_bomb_stops_at_the_pids_limit() {
    let env = TestEnv::new();
    let code = r#"
import os, time
n = 0
for _ in range(500):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30); os._exit(0)
    n += 1
print(n)
"#;
    let o = env.run(&["--pids", "64"], &["python3", "-c", code]);
    assert_code(&o, 0);
    let forked: u32 = stdout(&o).trim().parse().expect("count");
    assert!(
        forked > 10 && forked < 64,
        "forked {forked} processes under --pids 64"
    );
    // A real shell fork bomb is contained too, and the sandbox still ends at its timeout.
    let o = env.run(
        &["--pids", "128", "--timeout", "3s"],
        &["/bin/bash", "-c", "f() { f | f & }; f; sleep 60"],
    );
    assert_code(&o, 124);
    // The host still runs sandboxes afterwards.
    assert_code(&env.run(&[], &["true"]), 0);
    env.assert_clean();
}

#[test]
fn memory_limit_kills_inside_the_sandbox_only() {
    let env = TestEnv::new();
    let o = env.run(
        &["--memory", "512M"],
        &["python3", "-c", "b = b'x' * (2 << 30); print('ALLOCATED')"],
    );
    assert!(!stdout(&o).contains("ALLOCATED"), "2 GiB allocated under 512M");
    assert_code(&o, 137);
    assert_code(&env.run(&[], &["true"]), 0);
    env.assert_clean();
}

#[test]
fn disk_limit_stops_writes() {
    let env = TestEnv::new();
    let o = env.sh(
        &["--disk", "1G"],
        "dd if=/dev/zero of=/home/user/big bs=1M count=3072 conv=fsync 2>/dev/shm/err; echo dd=$?; \
         cat /dev/shm/err >&2; du -m /home/user/big | cut -f1",
    );
    let out = stdout(&o);
    assert!(!out.contains("dd=0"), "3 GiB written under --disk 1G: {out}");
    let err = stderr(&o);
    assert!(
        err.contains("quota") || err.contains("space"),
        "unexpected dd error: {err}"
    );
    let mib: u64 = out
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .expect("size");
    assert!(mib <= 1100, "wrote {mib} MiB under --disk 1G");
    env.assert_clean();
}

#[test]
fn timeout_kills_the_whole_tree() {
    let env = TestEnv::new();
    let start = Instant::now();
    let o = env.sh(&["--timeout", "1s"], "sleep 100 & setsid sleep 100 & sleep 100");
    let elapsed = start.elapsed();
    assert_code(&o, 124);
    // A functional bound (the tree must not be waited for), not a performance assertion; the latency
    // itself is reported by bench/.
    assert!(elapsed < Duration::from_secs(30), "timeout took {elapsed:?}");
    eprintln!("timeout 1s returned after {elapsed:?}");
    env.assert_clean();
}

#[test]
fn a_gigabyte_of_output_streams_with_bounded_memory() {
    let env = TestEnv::new();
    let mut child = env
        .cmd()
        .args(["run", "--", "head", "-c", "1G", "/dev/zero"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let mut out = child.stdout.take().expect("stdout");
    let mut buf = vec![0u8; 1 << 20];
    let mut total: u64 = 0;
    let mut max_rss_kib: u64 = 0;
    let mut reads = 0u64;
    loop {
        let n = out.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        assert!(buf[..n].iter().all(|b| *b == 0), "corrupted output");
        total += n as u64;
        reads += 1;
        if reads.is_multiple_of(64) {
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                let rss = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
                max_rss_kib = max_rss_kib.max(rss);
            }
        }
    }
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
    assert_eq!(total, 1 << 30);
    assert!(max_rss_kib > 0, "never sampled paddock's memory");
    assert!(max_rss_kib < 64 * 1024, "paddock peaked at {max_rss_kib} KiB");
    eprintln!("paddock peak RSS while streaming 1 GiB: {max_rss_kib} KiB");
    env.assert_clean();
}

#[test]
fn run_refuses_limits_outside_the_hosts_bounds_in_one_line() {
    let env = TestEnv::new();
    // The issue's probes (this host: pid_max 32768, 2 CPUs, the tests' 8G pool), then the minima.
    for (flags, flag) in [
        (&["--pids", "4000000"][..], "--pids"),
        (&["--pids", "10000000"][..], "--pids"),
        (&["--pids", "1"][..], "--pids"),
        (&["--memory", "1"][..], "--memory"),
        (&["--memory", "1T"][..], "--memory"),
        (&["--cpus", "1000"][..], "--cpus"),
        (&["--disk", "1"][..], "--disk"),
        (&["--disk", "100T"][..], "--disk"),
    ] {
        let o = env.run(flags, &["true"]);
        assert_eq!(o.status.code(), Some(125), "{flags:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert_eq!(err.trim_end().lines().count(), 1, "{flags:?}: {err}");
        assert!(
            err.starts_with(&format!("paddock: {flag} ")),
            "{flags:?} does not name its flag: {err}"
        );
    }
    // The defaults fit the host (a 10G default disk is lowered to the 8G pool), and so do the minima.
    let o = env.run(&[], &["true"]);
    assert_code(&o, 0);
    let o = env.run(
        &["--memory", "32M", "--pids", "8", "--disk", "16M"],
        &["sh", "-c", "echo ok | cat"],
    );
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "ok\n");
    env.assert_clean();
}

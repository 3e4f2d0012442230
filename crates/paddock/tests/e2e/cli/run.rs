//! `paddock run` as a command-line tool: exit codes, streams, stdin, PTY, options, bad input.

use std::io::{Read, Write};
use std::process::Stdio;

use crate::support::{assert_code, stderr, stdout, TestEnv};

#[test]
fn exit_codes_follow_the_command() {
    let env = TestEnv::new();
    assert_code(&env.run(&[], &["true"]), 0);
    assert_code(&env.run(&[], &["false"]), 1);
    assert_code(&env.sh(&[], "exit 42"), 42);
    assert_code(&env.sh(&[], "kill -KILL $$"), 137);
    assert_code(&env.sh(&[], "kill -TERM $$"), 143);
    let o = env.run(&[], &["/nonexistent/binary"]);
    assert_code(&o, 125);
    assert!(stderr(&o).contains("/nonexistent/binary"), "{}", stderr(&o));
    env.assert_clean();
}

#[test]
fn stdout_and_stderr_stay_separate() {
    let env = TestEnv::new();
    let o = env.sh(&[], "echo out1; echo err1 >&2; echo out2; echo err2 >&2");
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "out1\nout2\n");
    assert_eq!(stderr(&o), "err1\nerr2\n");
    env.assert_clean();
}

#[test]
fn stdin_is_piped_through() {
    let env = TestEnv::new();
    let mut child = env
        .cmd()
        .args(["run", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let writer = {
        let payload = payload.clone();
        std::thread::spawn(move || {
            stdin.write_all(b"hi\n").expect("write");
            stdin.write_all(&payload).expect("write");
        })
    };
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_end(&mut out)
        .expect("read");
    writer.join().expect("writer");
    assert_eq!(child.wait().expect("wait").code(), Some(0));
    assert_eq!(&out[..3], b"hi\n");
    assert_eq!(&out[3..], &payload[..]);
    env.assert_clean();
}

#[test]
fn options_shape_the_sandbox() {
    let env = TestEnv::new();
    let o = env.sh(&[], "id -un; id -u; pwd; hostname; echo $HOME");
    assert_code(&o, 0);
    let lines: Vec<String> = stdout(&o).lines().map(str::to_owned).collect();
    assert_eq!(&lines[..3], &["user", "1000", "/home/user"]);
    assert!(lines[3].starts_with("sb-"), "hostname {}", lines[3]);
    assert_eq!(lines[4], "/home/user");
    let o = env.sh(&["--user", "root", "--workdir", "/tmp"], "id -u; pwd; echo $HOME");
    assert_eq!(stdout(&o), "0\n/tmp\n/root\n", "{}", stderr(&o));
    let o = env.sh(&["-e", "A=1", "--env", "B=two words"], "echo $A-$B");
    assert_eq!(stdout(&o), "1-two words\n");
    // Writable places work; the sandbox's storage is private and starts empty.
    let o = env.sh(
        &[],
        "echo data > ~/f && cat ~/f && echo t > /tmp/t && cat /tmp/t && echo s > /dev/shm/s && ls ~",
    );
    assert_eq!(stdout(&o), "data\nt\nf\n", "{}", stderr(&o));
    let o = env.sh(&[], "ls -A ~ | wc -l");
    assert_eq!(stdout(&o), "0\n");
    env.assert_clean();
}

#[test]
fn bad_input_gets_one_line_and_exit_125() {
    let env = TestEnv::new();
    let cases: &[&[&str]] = &[
        &["run", "--bogus", "--", "true"],
        &["run", "--memory", "12X", "--", "true"],
        &["run", "--cpus", "-1", "--", "true"],
        &["run", "--timeout", "soon", "--", "true"],
        &["run"],
        &["run", "--mount", "/nonexistent-paddock-src:/x", "--", "true"],
        &["run", "--mount", "relative:/x", "--", "true"],
        &["run", "--env", "NOEQUALS", "--", "true"],
        &["run", "--rootfs", "/nonexistent-rootfs", "--", "true"],
        &["run", "--user", "Bad User", "--", "true"],
        &["run", "--workdir", "../x", "--", "true"],
    ];
    for args in cases {
        let o = env.cmd().args(*args).stdin(Stdio::null()).output().expect("runs");
        assert_eq!(o.status.code(), Some(125), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?} printed more than one line: {err}"
        );
        assert!(err.starts_with("paddock: "), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?} printed to stdout");
    }
    env.assert_clean();
}

/// Runs `paddock run --tty -- script` with a real pseudo-terminal as its stdin/stdout/stderr, of size
/// 33x101, and returns what appeared on the terminal.
fn run_on_pty(env: &TestEnv, script: &str) -> (Option<i32>, String) {
    let (master, slave) =
        paddock_sys::pty::open_pty(Some(paddock_sys::pty::WinSize { rows: 33, cols: 101 })).expect("pty");
    let mut cmd = env.cmd();
    cmd.args(["run", "--tty", "--", "/bin/sh", "-c", script])
        .stdin(Stdio::from(slave.try_clone().expect("dup")))
        .stdout(Stdio::from(slave.try_clone().expect("dup")))
        .stderr(Stdio::from(slave));
    let mut child = cmd.spawn().expect("spawn");
    drop(cmd);
    let reader = std::thread::spawn(move || {
        let mut f = std::fs::File::from(master);
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        // EIO once the last slave fd closes.
        while let Ok(n) = f.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&out).into_owned()
    });
    let status = child.wait().expect("wait");
    let out = reader.join().expect("reader");
    (status.code(), out)
}

#[test]
fn tty_mode_runs_on_a_real_terminal() {
    let env = TestEnv::new();
    let (code, out) = run_on_pty(&env, "stty size; tty; test -t 0 && echo STDIN-IS-TTY; exit 3");
    assert_eq!(code, Some(3), "{out}");
    assert!(out.contains("33 101"), "window size not propagated: {out}");
    assert!(out.contains("/dev/pts/"), "{out}");
    assert!(out.contains("STDIN-IS-TTY"), "{out}");
    env.assert_clean();
}

#[test]
fn tiocsti_is_refused_under_tty() {
    let env = TestEnv::new();
    let (code, out) = run_on_pty(
        &env,
        "python3 -c \"import fcntl, termios\ntry:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x'); print('INJECTED')\nexcept OSError as e: print('refused', e.errno)\"",
    );
    assert_eq!(code, Some(0), "{out}");
    // ENOTTY is the seccomp ioctl allowlist's answer; the kernel itself never gives it for TIOCSTI
    // on a terminal (it injects, or answers EIO/EPERM), so this shows the filter refused it.
    assert!(
        out.contains("refused 25"),
        "TIOCSTI not refused by the filter with ENOTTY: {out}"
    );
    assert!(!out.contains("INJECTED"), "{out}");
    env.assert_clean();
}

#[test]
fn runs_on_a_custom_rootfs() {
    let busybox = std::path::Path::new("/bin/busybox");
    if !busybox.exists() {
        panic!("this test needs busybox-static (/bin/busybox); scripts/test.sh installs it");
    }
    let env = TestEnv::new();
    let rootfs = tempfile::tempdir().expect("rootfs");
    let bin = rootfs.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    std::fs::create_dir_all(rootfs.path().join("etc")).expect("etc");
    std::fs::copy(busybox, bin.join("busybox")).expect("copy busybox");
    for applet in ["sh", "cat", "id", "ls", "echo"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("symlink");
    }
    std::fs::write(
        rootfs.path().join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\n",
    )
    .expect("passwd");
    std::fs::write(rootfs.path().join("etc/marker"), "custom-rootfs\n").expect("marker");
    let o = env.sh(
        &["--rootfs", rootfs.path().to_str().expect("utf8")],
        "cat /etc/marker; id -u; ls /usr 2>/dev/null || echo no-usr; touch /bin/x 2>/dev/null || echo ro",
    );
    assert_eq!(stdout(&o), "custom-rootfs\n1000\nno-usr\nro\n", "{}", stderr(&o));
    env.assert_clean();
}

#[test]
fn tty_window_size_follows_the_terminal() {
    let env = TestEnv::new();
    let (master, slave) =
        paddock_sys::pty::open_pty(Some(paddock_sys::pty::WinSize { rows: 33, cols: 101 })).expect("pty");
    let mut cmd = env.cmd();
    // After the line, wait (bounded by --timeout) until the terminal size changes, then print it.
    cmd.args([
        "run",
        "--tty",
        "--timeout",
        "20s",
        "--",
        "/bin/sh",
        "-c",
        "stty size; read line; while [ \"$(stty size)\" = '33 101' ]; do sleep 0.01; done; stty size",
    ])
    .stdin(Stdio::from(slave.try_clone().expect("dup")))
    .stdout(Stdio::from(slave.try_clone().expect("dup")))
    .stderr(Stdio::from(slave));
    let mut child = cmd.spawn().expect("spawn");
    drop(cmd);
    let mut term = std::fs::File::from(master);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("33 101") {
        let n = term.read(&mut buf).expect("read");
        assert!(n > 0, "terminal closed early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    // The terminal is resized; its owner is told with SIGWINCH (the test is not a session leader with
    // this terminal, so the kernel does not send it here).
    paddock_sys::pty::set_window_size(
        std::os::fd::AsFd::as_fd(&term),
        paddock_sys::pty::WinSize { rows: 50, cols: 132 },
    )
    .expect("resize");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).expect("pid"),
        rustix::process::Signal::WINCH,
    )
    .expect("SIGWINCH");
    term.write_all(b"\n").expect("write line");
    while !String::from_utf8_lossy(&seen).contains("50 132") {
        let n = term.read(&mut buf).unwrap_or(0);
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    let status = child.wait().expect("wait");
    let out = String::from_utf8_lossy(&seen).into_owned();
    assert!(
        out.contains("50 132"),
        "window size did not follow the terminal: {out}"
    );
    assert_eq!(status.code(), Some(0), "{out}");
    env.assert_clean();
}

#[test]
fn a_foreign_state_directory_is_refused_untouched() {
    use std::os::unix::fs::PermissionsExt;
    let foreign = tempfile::tempdir().expect("tempdir");
    std::fs::write(foreign.path().join("notes.txt"), "someone else's").expect("write");
    std::fs::set_permissions(foreign.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let env = TestEnv::new();
    let o = env
        .cmd()
        .env("PADDOCK_STATE_DIR", foreign.path())
        .args(["run", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    assert_eq!(stderr(&o).trim_end().lines().count(), 1, "{}", stderr(&o));
    let mode = std::fs::metadata(foreign.path())
        .expect("stat")
        .permissions()
        .mode()
        & 0o7777;
    assert_eq!(mode, 0o755, "paddock changed a directory it does not own");
    let names: Vec<_> = std::fs::read_dir(foreign.path())
        .expect("read")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("notes.txt")]);
}

/// A first start killed (`kill -9`, a crash point) halfway through making its state directory (`run/`
/// made, not yet mounted) leaves one the next start takes as paddock's: it is marked before anything
/// else is made in it.
/// And first starts at once all succeed (the preparation is serialised).
#[test]
fn a_first_start_killed_midway_or_run_twice_at_once_leaves_a_usable_state_directory() {
    let env = TestEnv::new();
    let o = env
        .cmd()
        .env(paddock_runtime::fault::FAULT_ENV, "state.run_made")
        .args(["run", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert!(
        stderr(&o).contains("fault point state.run_made reached"),
        "{}",
        stderr(&o)
    );
    let o = env.run(&[], &["echo", "after"]);
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "after\n");
    // A second fresh directory, four first starts at once.
    let fresh = TestEnv::new();
    let runs: Vec<_> = (0..4)
        .map(|i| {
            fresh
                .cmd()
                .args(["run", "--", "echo", &i.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for (i, run) in runs.into_iter().enumerate() {
        let o = run.wait_with_output().expect("wait");
        assert_code(&o, 0);
        assert_eq!(stdout(&o), format!("{i}\n"));
    }
    env.assert_clean();
    fresh.assert_clean();
}

/// The setup shim is its own binary next to `paddock`: a `paddock` without it refuses to run, in one
/// line naming it, before making anything.
#[test]
fn a_missing_setup_shim_is_refused_in_one_line() {
    let env = TestEnv::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let lonely = dir.path().join("paddock");
    std::fs::copy(crate::support::paddock_bin(), &lonely).expect("copy paddock");
    // The test environment's variables (its state directory, agent, cgroup parent), another binary.
    let envs: Vec<_> = env
        .cmd()
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
        .collect();
    let o = std::process::Command::new(&lonely)
        .env_clear()
        .envs(envs)
        .args(["run", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("paddock-setup") && err.contains("does not exist"),
        "{err}"
    );
    env.assert_clean();
}

/// A run without a network is supervised by the small `paddock` front itself (or, half a second
/// in, by the smaller `paddock-wait` it hands over to: `cli::lean`) for the command's whole life: the
/// process neither is nor maps `paddock-full`, the binary that carries the server.
#[test]
fn a_run_is_supervised_by_the_small_front() {
    let env = TestEnv::new();
    // The command runs: the sandbox is made and its supervisor is what it will be until the end.
    let (mut child, _stdout, _) =
        env.spawn_run_until_up(&["--timeout", "60s", "--", "/bin/sh", "-c", "echo up; read line"]);
    let exe = std::fs::read_link(format!("/proc/{}/exe", child.id())).expect("exe");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).expect("maps");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"\n")
        .expect("write");
    assert_eq!(child.wait().expect("wait").code(), Some(0));
    let front = crate::support::paddock_bin().canonicalize().expect("paddock");
    assert!(
        exe == front || exe == front.with_file_name("paddock-wait"),
        "the run is supervised by {}",
        exe.display()
    );
    assert!(
        !maps.contains("paddock-full"),
        "the supervisor maps paddock-full:\n{maps}"
    );
    env.assert_clean();
}

/// The front execs `paddock-full` for the commands it does not run; without it beside the front,
/// such a command fails with one line naming it (and `run`, which the front runs, still works).
#[test]
fn a_missing_full_binary_is_refused_in_one_line() {
    let env = TestEnv::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let lonely = dir.path().join("paddock");
    std::fs::copy(crate::support::paddock_bin(), &lonely).expect("copy paddock");
    std::fs::copy(crate::support::setup_bin(), dir.path().join("paddock-setup")).expect("copy setup");
    let envs: Vec<_> = env
        .cmd()
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
        .collect();
    let lonely_cmd = |args: &[&str]| {
        std::process::Command::new(&lonely)
            .env_clear()
            .envs(envs.clone())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("runs")
    };
    let o = lonely_cmd(&["sandbox", "ls"]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("paddock-full"), "{err}");
    let o = lonely_cmd(&["run", "--", "echo", "ran"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "ran\n");
    env.assert_clean();
}

/// A run's gc keeps the empty parent cgroups a run made (the run after it would only make them
/// again); `paddock gc` removes them.
#[test]
fn a_run_keeps_the_parent_cgroups_it_needs_and_gc_removes_them() {
    use std::os::unix::fs::MetadataExt;
    let env = TestEnv::new();
    let parents = || -> Vec<(std::path::PathBuf, u64)> {
        let mut out = Vec::new();
        for h in ["memory", "pids", "cpu", "blkio", "unified", ""] {
            let dir = std::path::Path::new("/sys/fs/cgroup")
                .join(h)
                .join(&env.cgroup_parent);
            if let Ok(meta) = std::fs::symlink_metadata(&dir) {
                out.push((dir, meta.ino()));
            }
        }
        out
    };
    assert_code(&env.run(&[], &["true"]), 0);
    let made = parents();
    assert!(!made.is_empty(), "the run made no parent cgroup");
    assert_code(&env.run(&[], &["true"]), 0);
    // A parent removed and made again is a new directory with a new inode number.
    assert_eq!(
        parents(),
        made,
        "the second run removed and remade the parent cgroups"
    );
    env.gc();
    assert_eq!(parents(), Vec::new(), "gc left the empty parent cgroups it made");
    env.assert_clean();
}

/// The template's copies of the host's `/etc` keep the host files' modification times (Python's
/// cached bytecode names its source's time: a new time made every `python3` compile
/// `sitecustomize.py` again), and a template of an older layout is built again.
#[test]
fn the_template_keeps_the_host_files_times_and_an_older_one_is_rebuilt() {
    use std::os::unix::fs::MetadataExt;
    let env = TestEnv::new();
    // Files paddock writes itself (into the template, or at each start), not copies.
    let generated = [
        "/etc/passwd",
        "/etc/group",
        "/etc/resolv.conf",
        "/etc/nsswitch.conf",
        "/etc/hostname",
        "/etc/hosts",
    ];
    let check = |env: &TestEnv| {
        // The default user cannot read every directory (`/etc/ssl/private`): find says so and goes on.
        let o = env.sh(
            &[],
            "find /etc -type f -exec stat -c '%Y %n' {} + 2>/dev/null; true",
        );
        assert_code(&o, 0);
        let mut compared = 0;
        for line in stdout(&o).lines() {
            let (time, path) = line.split_once(' ').expect("time and path");
            if generated.contains(&path) {
                continue;
            }
            let host = std::fs::symlink_metadata(path).expect("a copied file exists on the host");
            assert_eq!(time.parse::<i64>().expect("a time"), host.mtime(), "{path}");
            compared += 1;
        }
        assert!(
            compared >= 3,
            "only {compared} copied files in the sandbox's /etc"
        );
    };
    check(&env);
    // A template built by an older layout (or before times were kept) is built again.
    let marker = env.state().join("pool/templates/host/.paddock-template");
    std::fs::write(&marker, "2").expect("mark the template old");
    let etc = env.state().join("pool/templates/host/etc");
    let some_file = std::fs::read_dir(&etc)
        .expect("read the template's etc")
        .flatten()
        .find(|e| {
            e.file_type().is_ok_and(|t| t.is_file())
                && !generated.contains(&format!("/etc/{}", e.file_name().to_string_lossy()).as_str())
        })
        .expect("a copied file")
        .path();
    std::fs::File::options()
        .append(true)
        .open(&some_file)
        .and_then(|f| f.set_modified(std::time::SystemTime::now()))
        .expect("touch a template file");
    check(&env);
    assert_eq!(std::fs::read_to_string(&marker).expect("marker").trim(), "3");
    env.assert_clean();
}

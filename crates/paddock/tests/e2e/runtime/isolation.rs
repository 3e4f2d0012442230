//! Each test tries to break one isolation property from inside a sandbox.

use std::io::Read;
use std::net::TcpListener;
use std::os::linux::net::SocketAddrExt;
use std::process::{Command, Stdio};

use crate::support::{assert_code, stderr, stdout, wait_until, TestEnv, ID_BASE};

/// Runs a Python snippet in a sandbox as `user` (and more options), returning the output.
fn py(env: &TestEnv, opts: &[&str], code: &str) -> std::process::Output {
    env.run(opts, &["python3", "-c", code])
}

#[test]
fn cannot_read_a_root_only_host_file() {
    let env = TestEnv::new();
    let name = format!("/root/paddock-secret-{}", std::process::id());
    std::fs::write(&name, "TOP-SECRET-CONTENT").expect("plant secret");
    rustix::fs::chmod(name.as_str(), rustix::fs::Mode::from_raw_mode(0o600)).expect("chmod");
    for user in ["user", "root"] {
        let o = env.sh(
            &["--user", user],
            &format!("cat {name}; ls -la /root; cat /proc/1/root{name}"),
        );
        assert!(
            !stdout(&o).contains("TOP-SECRET"),
            "secret leaked to {user}: {}",
            stdout(&o)
        );
        assert!(
            !stdout(&o).contains("paddock-secret"),
            "/root listing leaked to {user}"
        );
    }
    std::fs::remove_file(&name).expect("remove secret");
    env.assert_clean();
}

#[test]
fn cannot_see_the_callers_environment() {
    let env = TestEnv::new();
    let o = env
        .cmd()
        .env("PADDOCK_CALLER_SECRET", "caller-secret-value")
        .args([
            "run",
            "--",
            "/bin/sh",
            "-c",
            "env; cat /proc/self/environ; cat /proc/1/environ 2>/dev/null; true",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert_code(&o, 0);
    let out = stdout(&o);
    assert!(!out.contains("caller-secret-value"), "caller env leaked: {out}");
    for var in ["PATH=", "HOME=/home/user", "LANG=", "TERM="] {
        assert!(
            out.contains(var),
            "{var} missing from the clean environment: {out}"
        );
    }
    // --env adds exactly what it names.
    let o = env.sh(&["--env", "FOO=bar baz"], "echo \"$FOO\"");
    assert_eq!(stdout(&o), "bar baz\n");
    env.assert_clean();
}

#[test]
fn cannot_write_any_host_path() {
    let env = TestEnv::new();
    let probe = format!("paddock-probe-{}", std::process::id());
    for user in ["user", "root"] {
        let script = format!(
            "for d in / /usr /usr/bin /bin /lib /proc/sys/kernel /dev /sys; do \
               if touch $d/{probe} 2>/dev/null; then echo WROTE $d; fi; \
             done; \
             if echo x > /usr/bin/python3 2>/dev/null; then echo WROTE python; fi; \
             if mkdir /var 2>/dev/null; then echo WROTE /var; fi; \
             echo done"
        );
        let o = env.sh(&["--user", user], &script);
        assert_code(&o, 0);
        assert!(
            !stdout(&o).contains("WROTE"),
            "{user} wrote a host path: {}",
            stdout(&o)
        );
    }
    for d in ["/", "/usr", "/usr/bin", "/etc/ssl", "/dev"] {
        assert!(
            !std::path::Path::new(d).join(&probe).exists(),
            "probe appeared in host {d}"
        );
    }
    env.assert_clean();
}

#[test]
fn host_directories_are_not_visible() {
    let env = TestEnv::new();
    let o = env.sh(
        &[],
        "for p in /var /srv /opt /mnt /run /media /boot /sys/fs/cgroup /home/user/../../root/.bashrc /var/run/docker.sock; do \
           if [ -e $p ]; then echo VISIBLE $p; fi; done; ls /home; echo done",
    );
    assert_code(&o, 0);
    assert!(!stdout(&o).contains("VISIBLE"), "{}", stdout(&o));
    assert_eq!(stdout(&o), "user\ndone\n");
    env.assert_clean();
}

#[test]
fn cannot_see_or_signal_host_processes() {
    let env = TestEnv::new();
    let mut host = Command::new("sleep").arg("987654").spawn().expect("host sleep");
    let pid = host.id();
    // The needle is computed at run time so no command line inside the sandbox contains it literally.
    let code = format!(
        r#"
import os, signal
needle = str(987000 + 654).encode()
seen = [p for p in os.listdir("/proc") if p.isdigit() and needle in open(f"/proc/{{p}}/cmdline", "rb").read()]
print("SEEN" if seen else "not seen")
for sig in (0, signal.SIGKILL):
    try:
        os.kill({pid}, sig); print("SIGNALLED")
    except OSError as e: print("refused", e.errno)
print(len([p for p in os.listdir("/proc") if p.isdigit()]))
"#
    );
    let o = py(&env, &["--user", "root"], &code);
    assert!(host.try_wait().expect("wait").is_none(), "host process died");
    let out = stdout(&o);
    assert!(
        !out.contains("SIGNALLED") && !out.contains("KILLED") && !out.contains("SEEN"),
        "{out}"
    );
    let count: u32 = out
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .expect("pid count");
    assert!(count < 10, "sandbox sees {count} processes");
    host.kill().expect("kill host sleep");
    host.wait().expect("reap");
    env.assert_clean();
}

#[test]
fn cannot_reach_host_loopback_or_abstract_sockets() {
    let env = TestEnv::new();
    let tcp = TcpListener::bind("127.0.0.1:0").expect("bind");
    tcp.set_nonblocking(true).expect("nonblocking");
    let port = tcp.local_addr().expect("addr").port();
    let abstract_name = format!("paddock-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).expect("name");
    let unix = std::os::unix::net::UnixListener::bind_addr(&addr).expect("bind abstract");
    unix.set_nonblocking(true).expect("nonblocking");
    let code = format!(
        r#"
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2); print("TCP-CONNECTED")
except OSError as e: print("tcp refused", e.errno)
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\0{abstract_name}"); print("UNIX-CONNECTED")
except OSError as e: print("unix refused", e.errno)
"#
    );
    let o = py(&env, &[], &code);
    assert_code(&o, 0);
    assert!(!stdout(&o).contains("CONNECTED"), "{}", stdout(&o));
    assert!(tcp.accept().is_err(), "host listener got a connection");
    assert!(unix.accept().is_err(), "abstract socket got a connection");
    env.assert_clean();
}

#[test]
fn network_is_loopback_only_without_a_default_route() {
    let env = TestEnv::new();
    let o = env.sh(
        &[],
        "cat /proc/net/route; echo ---; cat /proc/net/dev; echo ---; cat /proc/net/if_inet6 2>/dev/null",
    );
    assert_code(&o, 0);
    let out = stdout(&o);
    let mut parts = out.split("---\n");
    let route = parts.next().expect("route");
    assert_eq!(route.lines().count(), 1, "routes present: {route}");
    let dev = parts.next().expect("dev");
    let ifaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, vec!["lo"], "interfaces: {dev}");
    // Loopback inside the sandbox works (it is the sandbox's own).
    let o = py(
        &env,
        &[],
        "import socket\ns=socket.socket(); s.bind(('127.0.0.1',0)); s.listen()\nc=socket.create_connection(s.getsockname()); print('ok')",
    );
    assert_eq!(stdout(&o), "ok\n", "{}", stderr(&o));
    env.assert_clean();
}

#[test]
fn no_capabilities_seccomp_and_no_new_privs() {
    let env = TestEnv::new();
    for user in ["user", "root"] {
        let o = env.sh(
            &["--user", user],
            "exec grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp|SigIgn|SigBlk):' /proc/self/status",
        );
        assert_code(&o, 0);
        let out = stdout(&o);
        for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert!(
                out.contains(&format!("{cap}:\t0000000000000000")),
                "{user} has {cap}: {out}"
            );
        }
        assert!(out.contains("NoNewPrivs:\t1"), "{out}");
        assert!(out.contains("Seccomp:\t2"), "{out}");
        // Nothing of the agent's signal state (the Rust runtime ignores SIGPIPE) reaches a workload.
        assert!(out.contains("SigIgn:\t0000000000000000"), "{user}: {out}");
        assert!(out.contains("SigBlk:\t0000000000000000"), "{user}: {out}");
    }
    env.assert_clean();
}

#[test]
fn kernel_knobs_are_not_writable() {
    let env = TestEnv::new();
    let o = env.sh(
        &["--user", "root"],
        "echo '|/tmp/x' > /proc/sys/kernel/core_pattern 2>/dev/null && echo WROTE core_pattern; \
         echo h > /proc/sysrq-trigger 2>/dev/null && echo WROTE sysrq; \
         cat /proc/kcore 2>/dev/null | head -c 1 | grep -q . && echo READ kcore; \
         cat /proc/sys/kernel/core_pattern; echo done",
    );
    assert!(
        !stdout(&o).contains("WROTE") && !stdout(&o).contains("READ"),
        "{}",
        stdout(&o)
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/core_pattern").expect("host core_pattern");
    assert!(!host.contains("/tmp/x"), "host core_pattern changed");
    env.assert_clean();
}

#[test]
fn no_kvm_or_block_devices() {
    let env = TestEnv::new();
    let o = env.sh(
        &["--user", "root"],
        "ls /dev; [ -e /dev/kvm ] && echo KVM; find /dev -type b | grep . && echo BLOCK; \
         mknod /tmp/sda b 8 0 2>/dev/null && echo MKNOD; echo done",
    );
    assert_code(&o, 0);
    let out = stdout(&o);
    assert!(
        !out.contains("KVM") && !out.contains("BLOCK") && !out.contains("MKNOD"),
        "{out}"
    );
    for dev in [
        "null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm",
    ] {
        assert!(out.lines().any(|l| l == dev), "/dev/{dev} missing: {out}");
    }
    env.assert_clean();
}

#[test]
fn dangerous_syscalls_are_refused() {
    let env = TestEnv::new();
    // x86_64 syscall numbers: io_uring_setup 425, userfaultfd 323, bpf 321, keyctl 250, add_key 248,
    // unshare 272, perf_event_open 298, mount 165, open_by_handle_at 304, kexec_load 246, init_module 175.
    let code = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(256)
calls = {
  "io_uring_setup": (425, 8, buf), "userfaultfd": (323, 0), "bpf": (321, 0, buf, 64),
  "keyctl": (250, 0, 0), "add_key": (248, b"user", b"x", b"y", 1, -3), "unshare_user": (272, 0x10000000),
  "unshare_net": (272, 0x40000000), "perf_event_open": (298, buf, 0, -1, -1, 0),
  "mount": (165, b"none", b"/tmp", b"tmpfs", 0, 0), "open_by_handle_at": (304, 3, buf, 0),
  "kexec_load": (246, 0, 0, 0, 0), "init_module": (175, buf, 0, b""),
}
for name, args in calls.items():
    r = libc.syscall(*args)
    print(name, "ALLOWED" if r >= 0 else "refused", ctypes.get_errno())
print("getpid", os.getpid() > 0)
"#;
    for user in ["user", "root"] {
        let o = py(&env, &["--user", user], code);
        assert_code(&o, 0);
        let out = stdout(&o);
        assert!(!out.contains("ALLOWED"), "{user}: {out}");
        assert!(out.contains("getpid True"), "{out}");
        assert_eq!(out.lines().filter(|l| l.contains("refused")).count(), 12, "{out}");
    }
    let o = env.run(&["--user", "root"], &["unshare", "-U", "true"]);
    assert_ne!(o.status.code(), Some(0), "unshare -U succeeded");
    env.assert_clean();
}

#[test]
fn sandbox_users_map_to_unprivileged_host_ids() {
    let env = TestEnv::new();
    for (user, inside) in [("user", 1000u32), ("root", 0u32)] {
        let mut child = env
            .cmd()
            .args([
                "run",
                "--user",
                user,
                "--",
                "/bin/sh",
                "-c",
                "id -u; id -g; exec sleep 30",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut out = child.stdout.take().expect("stdout");
        let mut first = [0u8; 64];
        let n = out.read(&mut first).expect("read");
        let text = String::from_utf8_lossy(&first[..n]).into_owned();
        assert!(text.starts_with(&format!("{inside}\n")), "{user}: {text}");
        assert!(wait_until(std::time::Duration::from_secs(10), || env
            .processes()
            .iter()
            .any(|(_, c)| c.starts_with("sleep 30"))));
        let (pid, _) = env
            .processes()
            .into_iter()
            .find(|(_, c)| c.starts_with("sleep 30"))
            .expect("sleep");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        let uid_line = status.lines().find(|l| l.starts_with("Uid:")).expect("uid");
        let host_uid: u32 = uid_line
            .split_whitespace()
            .nth(1)
            .and_then(|u| u.parse().ok())
            .expect("uid");
        assert_eq!(host_uid, ID_BASE + inside, "{user} maps to host uid {host_uid}");
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(child.id() as i32).expect("pid"),
            rustix::process::Signal::TERM,
        )
        .expect("term");
        let status = child.wait().expect("wait");
        assert_eq!(status.code(), Some(143));
    }
    env.assert_clean();
}

#[test]
fn mounts_honour_read_only() {
    let env = TestEnv::new();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("in.txt"), "from host").expect("write");
    rustix::fs::chmod(dir.path(), rustix::fs::Mode::from_raw_mode(0o777)).expect("chmod");
    let ro = format!("{}:/data:ro", dir.path().display());
    let o = env.sh(
        &["--mount", &ro],
        "cat /data/in.txt; touch /data/new 2>/dev/null && echo WROTE; echo",
    );
    assert_eq!(stdout(&o), "from host\n", "{}", stderr(&o));
    assert!(!dir.path().join("new").exists());
    let rw = format!("{}:/home/user/work", dir.path().display());
    let o = env.sh(&["--mount", &rw], "echo hi > /home/user/work/out.txt && echo ok");
    assert_eq!(stdout(&o), "ok\n", "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).expect("written"),
        "hi\n"
    );
    env.assert_clean();
}

/// Every process of a sandbox is in the sandbox's cgroup in every hierarchy paddock manages (the
/// init is cloned into its cgroup2 cgroup and inherits the v1 ones from the setup shim), and its
/// cgroup namespace is rooted there: inside, every hierarchy reads `/`, so nothing of the host's
/// cgroup tree (the parent's name, the caller's cgroup) is named.
#[test]
fn a_sandbox_is_in_its_own_cgroups_and_its_cgroup_namespace_names_nothing_of_the_host() {
    use std::io::Write;
    let env = TestEnv::new();
    let (mut child, _out, seen) = env.spawn_run_until_up(&[
        "--timeout",
        "60s",
        "--",
        "/bin/sh",
        "-c",
        "cat /proc/self/cgroup; echo up; read line",
    ]);
    // Read while the command waits for its line: each sandbox's processes with their cgroups.
    type Seen = (i32, String, String);
    let sandboxes: Vec<(String, Vec<Seen>)> = crate::support::sandbox_processes(&env)
        .into_iter()
        .map(|(id, processes)| {
            let processes = processes
                .into_iter()
                .map(|(pid, cmdline)| {
                    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
                    (pid, cmdline, cgroups)
                })
                .collect();
            (id, processes)
        })
        .collect();
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"\n")
        .expect("write");
    assert_eq!(child.wait().expect("wait").code(), Some(0));

    let inside = String::from_utf8_lossy(&seen).into_owned();
    let lines: Vec<&str> = inside.lines().filter(|l| *l != "up").collect();
    assert!(!lines.is_empty(), "{inside}");
    for line in lines {
        assert!(
            line.ends_with(":/"),
            "the sandbox sees a cgroup path of the host: {line}"
        );
    }

    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    let (id, processes) = &sandboxes[0];
    // The agent and the shell at least: every one of them, in every hierarchy.
    assert!(processes.len() >= 2, "{processes:?}");
    let cgroup2 = std::path::Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists()
        || std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let ours = format!("/{}/{id}", env.cgroup_parent);
    for (pid, cmdline, cgroups) in processes {
        let mut checked = 0;
        for line in cgroups.lines() {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (
                fields.next(),
                fields.next().unwrap_or(""),
                fields.next().unwrap_or(""),
            );
            let managed = if controllers.is_empty() {
                cgroup2
            } else {
                controllers
                    .split(',')
                    .any(|c| matches!(c, "memory" | "pids" | "cpu" | "blkio"))
            };
            if managed {
                assert_eq!(
                    path, ours,
                    "{cmdline} ({pid}) is outside its sandbox's cgroup: {line}"
                );
                checked += 1;
            }
        }
        assert!(
            checked >= 1,
            "{cmdline} ({pid}): no managed hierarchy in\n{cgroups}"
        );
    }
    env.assert_clean();
}

/// How the process running it was started: its persona, its nice value and scheduling policy
/// (`/proc/self/stat` fields 19 and 41), its I/O priority, and its core dump, nice and real-time
/// priority limits (soft and hard).
const STARTED_AS: &str = "cat /proc/self/personality; cut -d' ' -f19,41 /proc/self/stat; ionice; \
     grep -e '^Max core' -e '^Max nice' -e '^Max realtime priority' /proc/self/limits | tr -s ' '";

/// `argv` under a caller tuned every way a shell can: `SCHED_BATCH` (a real-time policy is passed
/// on the same way), nice 7, the idle I/O class, core dumps allowed, address-space randomization
/// off. (Real-time and nice limits above 0 need `CAP_SYS_RESOURCE`, which this host's root lacks;
/// the sandbox's are checked to be 0.)
fn tuned(argv: &[&std::ffi::OsStr]) -> Command {
    let mut c = Command::new("chrt");
    c.args(["-b", "0", "nice", "-n", "7", "ionice", "-c", "3"])
        .args(["prlimit", "--core=unlimited", "setarch"])
        .arg(std::env::consts::ARCH)
        .arg("-R")
        .args(argv);
    c
}

#[test]
fn a_sandbox_takes_no_scheduling_persona_or_core_limit_from_its_caller() {
    let env = TestEnv::new();
    let sh = ["/bin/sh", "-c", STARTED_AS].map(std::ffi::OsStr::new);
    // On the host, the tuning holds.
    let o = tuned(&sh).output().expect("tuned shell");
    assert_code(&o, 0);
    let host = stdout(&o);
    assert!(
        host.starts_with("00040000\n7 3\nidle\nMax core file size unlimited unlimited bytes \n"),
        "the caller is not tuned: {host}"
    );

    // In a sandbox its caller started so, none of it.
    let plain = env.cmd();
    let o = tuned(&[plain.get_program()])
        .env_clear()
        .envs(plain.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .args(["run", "--"])
        .args(sh)
        .stdin(Stdio::null())
        .output()
        .expect("tuned paddock run");
    assert_code(&o, 0);
    let expected = "00000000\n0 0\nnone: prio 0\nMax core file size 0 0 bytes \n\
                    Max nice priority 0 0 \nMax realtime priority 0 0 \n";
    assert_eq!(stdout(&o), expected, "{}", stderr(&o));
    // As in a sandbox an untuned caller started.
    let o = env.sh(&[], STARTED_AS);
    assert_code(&o, 0);
    assert_eq!(stdout(&o), expected);
}

/// What a sandbox's files look like to its user (names of the sandbox replaced by `<id>`).
const FILE_MODES: &str = "umask; id; stat -c '%a %U:%G %n' / /etc /etc/passwd /etc/group \
     /etc/resolv.conf /etc/nsswitch.conf /etc/hostname /etc/hosts /home /home/user /root /tmp; \
     echo x > /home/user/f && stat -c '%a' /home/user/f; mkdir /tmp/d && stat -c '%a' /tmp/d";

/// `paddock run -- sh -c script` on `env`, started with umask `umask` (the first run makes the pool).
fn run_with_umask(env: &TestEnv, umask: &str, script: &str) -> std::process::Output {
    let plain = env.cmd();
    Command::new("/bin/sh")
        .args(["-c", &format!("umask {umask}; exec \"$0\" \"$@\"")])
        .arg(plain.get_program())
        .args(["run", "--", "/bin/sh", "-c", script])
        .env_clear()
        .envs(plain.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(Stdio::null())
        .output()
        .expect("paddock run")
}

#[test]
fn a_callers_umask_neither_breaks_nor_reaches_a_sandbox() {
    let strict = TestEnv::new();
    let usual = TestEnv::new();
    let mut seen = Vec::new();
    for (env, umask) in [(&strict, "077"), (&usual, "022"), (&usual, "000")] {
        let o = run_with_umask(env, umask, &format!("hostname; {FILE_MODES}"));
        assert_code(&o, 0);
        let out = stdout(&o);
        let (id, modes) = out.split_once('\n').expect("hostname first");
        seen.push((umask, modes.replace(id, "<id>")));
    }
    let (_, usual_modes) = &seen[1];
    assert!(usual_modes.starts_with("0022\nuid=1000(user)"), "{usual_modes}");
    for (umask, modes) in &seen {
        assert_eq!(modes, usual_modes, "a sandbox started under umask {umask}");
    }
}

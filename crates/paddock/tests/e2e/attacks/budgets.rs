//! End to end: host-wide kernel budgets a sandbox could take from everyone (issue 11, class 7).
//! A sandbox holding every inotify instance it can get leaves the host and another sandbox theirs
//! (its user namespace is owned by a uid of its own, so the kernel counts its instances apart from
//! host root's); kernel AIO is refused, so `fs.aio-nr`, a host-wide budget, does not move; and a
//! sandbox with 128 MiB of memory cannot park much more than that in loopback TCP buffers (on this
//! cgroup v1 host they are counted apart from `memory.limit_in_bytes`); a sandbox holding every
//! pseudo-terminal it can leaves other sandboxes theirs (the host-wide pool of PTYs outside the
//! host's own is 3,072).

use std::time::Duration;

use serde_json::json;

use crate::support::harness::{poll, Client, Harness};

/// How long a background probe may take to report (a loaded 2-core host).
const REPORT_DEADLINE: Duration = Duration::from_secs(60);

/// Runs `script` (Python) in the background in sandbox `id`; it must write its report to
/// `/tmp/report` (renamed into place) and then keep what it holds until the sandbox ends. Returns
/// the report.
async fn background_report(client: &Client, id: &str, script: &str) -> String {
    let shell = format!("python3 - <<'EOF'\n{script}\nEOF");
    client.exec_background(id, json!({"shell": shell})).await;
    poll(REPORT_DEADLINE, "the probe's report", || async move {
        let r = client.read_file(id, "/tmp/report").await;
        (r.status == 200).then(|| r.text())
    })
    .await
}

/// Holds as many inotify instances as the kernel gives, reports `count errno`.
const HOLD_INOTIFY: &str = r#"
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
held = []
while len(held) < 100000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    held.append(fd)
with open("/tmp/report.new", "w") as f:
    f.write(f"{len(held)} {ctypes.get_errno()}")
os.rename("/tmp/report.new", "/tmp/report")
time.sleep(3600)
"#;

fn parse_pair(report: &str) -> (u64, i32) {
    let mut words = report.split_whitespace();
    let mut next = || words.next().and_then(|w| w.parse::<i64>().ok());
    match (next(), next()) {
        (Some(a), Some(b)) => (a as u64, b as i32),
        _ => panic!("unexpected report {report:?}"),
    }
}

fn init_pid(h: &Harness, id: &str) -> i32 {
    let path = h.env().state().join("run").join(id).join("init.pid");
    let record = std::fs::read_to_string(&path).expect("init.pid");
    record
        .split_whitespace()
        .next()
        .expect("pid")
        .parse()
        .expect("pid")
}

#[test]
fn inotify_instances_of_a_sandbox_are_its_own() {
    let h = Harness::start();
    let max: u64 = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
        .expect("max_user_instances")
        .trim()
        .parse()
        .expect("number");
    h.block_on(async {
        let a = h.admin.new_tenant("inotify-a").await;
        let b = h.admin.new_tenant("inotify-b").await;
        let greedy = a.create_sandbox(json!({})).await;
        let other = b.create_sandbox(json!({})).await;
        let (held, errno) = parse_pair(&background_report(&a, &greedy, HOLD_INOTIFY).await);
        eprintln!("the first sandbox holds {held} inotify instances (then errno {errno})");
        assert_eq!(
            errno,
            libc::EMFILE,
            "it ran out of its budget, not of something else"
        );
        assert!(
            held <= max,
            "{held} instances, more than max_user_instances ({max})"
        );

        // Host root (this test) still gets one, and so does the other sandbox: all it can, too.
        let own = rustix::fs::inotify::init(rustix::fs::inotify::CreateFlags::CLOEXEC);
        assert!(own.is_ok(), "the host cannot create an inotify instance: {own:?}");
        let (other_held, _) = parse_pair(&background_report(&b, &other, HOLD_INOTIFY).await);
        eprintln!("the second sandbox holds {other_held}");
        assert!(
            other_held >= max / 2,
            "the other sandbox got only {other_held} of {max}"
        );
        assert!(rustix::fs::inotify::init(rustix::fs::inotify::CreateFlags::CLOEXEC).is_ok());

        // Because each user namespace has an owner of its own, neither root nor the other's.
        let owners = [greedy.as_str(), other.as_str()]
            .map(|id| paddock_sys::namespace::user_namespace_owner(init_pid(&h, id)).expect("owner"));
        assert_ne!(owners[0], owners[1], "two live sandboxes share an owner");
        for owner in owners {
            assert!(
                (1_000_065_536..1_000_131_072).contains(&owner),
                "owner {owner} outside the owner range"
            );
        }
    });
}

/// Asks for kernel AIO contexts; reports `io_setup_result errno io_submit_errno`.
const AIO: &str = r#"
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ctx = ctypes.c_ulong(0)
r = libc.syscall(206, 32767, ctypes.byref(ctx))
setup_errno = ctypes.get_errno()
libc.syscall(209, ctx, 0, None)
submit_errno = ctypes.get_errno()
with open("/tmp/report.new", "w") as f:
    f.write(f"{r} {setup_errno} {submit_errno}")
os.rename("/tmp/report.new", "/tmp/report")
time.sleep(3600)
"#;

fn aio_nr() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/aio-nr")
        .expect("aio-nr")
        .trim()
        .parse()
        .expect("number")
}

#[test]
fn kernel_aio_is_refused_and_the_host_budget_does_not_move() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("aio").await;
        let id = a.create_sandbox(json!({})).await;
        let before = aio_nr();
        let report = background_report(&a, &id, AIO).await;
        let words: Vec<i64> = report
            .split_whitespace()
            .map(|w| w.parse().expect("number"))
            .collect();
        assert_eq!(
            words,
            [-1, i64::from(libc::ENOSYS), i64::from(libc::ENOSYS)],
            "io_setup(32767) inside a sandbox: {report}"
        );
        // While the sandbox lives (and would hold its context), the host's budget is untouched.
        let during = aio_nr();
        assert!(
            during < before + 32767,
            "fs.aio-nr went from {before} to {during}"
        );
    });
}

/// Opens up to 400 loopback TCP connections with the largest buffers it may ask for and writes to
/// each until the kernel takes no more, never reading; reports the bytes accepted.
const PARK_TCP: &str = r#"
import os, socket, time
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(1024)
held, parked, chunk = [], 0, b"x" * 65536
for _ in range(400):
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 20)
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    client.setblocking(False)
    while True:
        try:
            parked += client.send(chunk)
        except OSError:
            break
    held.append((client, server))
with open("/tmp/report.new", "w") as f:
    f.write(f"{parked} {len(held)}")
os.rename("/tmp/report.new", "/tmp/report")
time.sleep(3600)
"#;

#[test]
fn loopback_socket_buffers_count_against_the_memory_limit() {
    let h = Harness::start();
    const LIMIT: u64 = 128 << 20;
    h.block_on(async {
        let a = h.admin.new_tenant("tcp-park").await;
        let id = a
            .create_sandbox(json!({"limits": {"memory": "128M", "pids": 64}}))
            .await;
        let (parked, connections) = parse_pair(&background_report(&a, &id, PARK_TCP).await);
        eprintln!(
            "{connections} loopback connections parked {} MiB (memory limit {} MiB)",
            parked >> 20,
            LIMIT >> 20
        );
        assert_eq!(connections, 400, "the probe opened every connection");
        // The buffers hold a little more than the bytes (skb overhead), and each socket may queue
        // a minimum however tight memory is: the bytes parked stay within the limit plus 10%.
        assert!(
            parked <= LIMIT + LIMIT / 10,
            "{} MiB parked in socket buffers with a {} MiB memory limit",
            parked >> 20,
            LIMIT >> 20
        );
        let tcp = std::path::Path::new("/sys/fs/cgroup/memory")
            .join(&h.env().cgroup_parent)
            .join(&id)
            .join("memory.kmem.tcp.max_usage_in_bytes");
        if let Ok(tcp) = std::fs::read_to_string(tcp) {
            eprintln!("memory.kmem.tcp.max_usage_in_bytes: {}", tcp.trim());
        }
    });
}

/// Holds as many pseudo-terminals as it can open (with its open-file limit raised as far as it may),
/// reports `count errno`.
const HOLD_PTYS: &str = r#"
import os, resource, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held, errno = [], 0
while len(held) < 10000:
    try:
        held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    except OSError as e:
        errno = e.errno
        break
with open("/tmp/report.new", "w") as f:
    f.write(f"{len(held)} {errno}")
os.rename("/tmp/report.new", "/tmp/report")
time.sleep(3600)
"#;

#[test]
fn pseudo_terminals_are_capped_per_sandbox() {
    let h = Harness::start();
    let cap = u64::from(paddock_runtime::native::setup::plan::SANDBOX_MAX_PTYS);
    h.block_on(async {
        let a = h.admin.new_tenant("pty-a").await;
        let b = h.admin.new_tenant("pty-b").await;
        let greedy = a.create_sandbox(json!({})).await;
        let other = b.create_sandbox(json!({})).await;
        let (held, errno) = parse_pair(&background_report(&a, &greedy, HOLD_PTYS).await);
        eprintln!("the first sandbox holds {held} pseudo-terminals (then errno {errno})");
        assert_eq!((held, errno), (cap, libc::ENOSPC), "the per-sandbox cap");
        let (other_held, _) = parse_pair(&background_report(&b, &other, HOLD_PTYS).await);
        assert_eq!(other_held, cap, "the other sandbox's pseudo-terminals");
    });
}

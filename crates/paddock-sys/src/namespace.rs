//! Creating the sandbox's namespaces and the first process inside them.
//!
//! The setup shim calls [`clone_into_namespaces`] exactly once, while it is still single-threaded; the
//! child becomes PID 1 of the new PID namespace.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The namespaces a sandbox gets (all of them, for the native backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Namespaces {
    /// User namespace (required for everything else to be unprivileged).
    pub user: bool,
    /// Mount.
    pub mount: bool,
    /// PID.
    pub pid: bool,
    /// Network.
    pub net: bool,
    /// IPC.
    pub ipc: bool,
    /// UTS (hostname).
    pub uts: bool,
    /// Cgroup.
    pub cgroup: bool,
}

impl Namespaces {
    /// Every namespace.
    pub const ALL: Self = Self {
        user: true,
        mount: true,
        pid: true,
        net: true,
        ipc: true,
        uts: true,
        cgroup: true,
    };

    /// Every namespace but the network one: the sandbox joins a network namespace its host made
    /// (see [`join_network_namespace`]) instead of getting an empty one.
    pub const ALL_BUT_NET: Self = Self {
        net: false,
        ..Self::ALL
    };

    fn clone_flags(self) -> libc::c_ulong {
        let mut f = 0;
        let pairs = [
            (self.user, libc::CLONE_NEWUSER),
            (self.mount, libc::CLONE_NEWNS),
            (self.pid, libc::CLONE_NEWPID),
            (self.net, libc::CLONE_NEWNET),
            (self.ipc, libc::CLONE_NEWIPC),
            (self.uts, libc::CLONE_NEWUTS),
            (self.cgroup, libc::CLONE_NEWCGROUP),
        ];
        for (on, flag) in pairs {
            if on {
                f |= flag as libc::c_ulong;
            }
        }
        f
    }
}

/// Which side of [`clone_into_namespaces`] the caller is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneResult {
    /// In the new process (PID 1 of its namespace).
    Child,
    /// In the calling process; the child's pid as seen from here.
    Parent {
        /// The child's pid in the caller's PID namespace.
        pid: i32,
    },
}

/// Whether the calling process has exactly one thread (read from `/proc/self/status`).
pub fn is_single_threaded() -> io::Result<bool> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    Ok(status
        .lines()
        .any(|l| l.strip_prefix("Threads:").is_some_and(|n| n.trim() == "1")))
}

/// Forks into new namespaces with the `clone(2)` system call, fork-style (no new stack).
///
/// With `sibling`, the child gets the caller's parent as its parent (`CLONE_PARENT`), so the caller can
/// exit while the process that spawned it keeps waiting for the sandbox. Refuses with `EINVAL`-kind
/// error unless the process is single-threaded, because a forked child of a multi-threaded process
/// may only call async-signal-safe functions.
///
/// With `owner` (and a new user namespace), the namespace is owned by that host uid and gid instead
/// of the caller's: the kernel makes the creator's effective ids the owner, so the caller (host
/// root) takes them as its effective uid and gid for the clone alone, keeping its real and saved
/// ids (root) and, through `SECBIT_NO_SETUID_FIXUP`, its capabilities, and takes back uid and gid
/// 0 right after, in the parent. A real uid of root also keeps the child's process count out of
/// the owner's `RLIMIT_NPROC`. The child's credentials are the new namespace's (all capabilities
/// in it, the securebits reset); it becomes the namespace's root with [`become_namespace_root`].
///
/// With `cgroup` (a cgroup2 directory), the child is born in that cgroup (`clone3` with
/// `CLONE_INTO_CGROUP`) instead of in the caller's: no migration, which would take the kernel's
/// global cgroup lock and wait for an RCU grace period. A kernel without `clone3` or the flag
/// answers `ENOSYS` or `E2BIG` (see [`is_unsupported_clone3`]). The child's cgroup
/// namespace, if it gets a new one, is rooted at the caller's cgroups, not the child's: a caller
/// that wants it rooted at the child's leaves `ns.cgroup` out and has the child call
/// [`unshare_cgroup_namespace`].
pub fn clone_into_namespaces(
    ns: Namespaces,
    sibling: bool,
    owner: Option<u32>,
    cgroup: Option<BorrowedFd<'_>>,
) -> io::Result<CloneResult> {
    if !is_single_threaded()? {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to clone into namespaces from a multi-threaded process",
        ));
    }
    let mut flags = ns.clone_flags() | libc::SIGCHLD as libc::c_ulong;
    if sibling {
        flags |= libc::CLONE_PARENT as libc::c_ulong;
    }
    let clone = || match cgroup {
        None => raw_clone(flags),
        Some(cgroup) => raw_clone3(flags, cgroup),
    };
    let Some(owner) = owner.filter(|_| ns.user) else {
        return clone();
    };
    let assumed = OwnerIds::assume(owner)?;
    let cloned = clone();
    // The child's credentials are the new namespace's: nothing to restore there.
    if !matches!(cloned, Ok(CloneResult::Child)) {
        assumed.restore()?;
    }
    cloned
}

/// `SECBIT_NO_SETUID_FIXUP`: changing uids does not clear the capability sets.
const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;

/// The caller's securebits while it acts with a namespace owner's effective ids.
struct OwnerIds {
    securebits: libc::c_ulong,
}

impl OwnerIds {
    /// Keeps capabilities across uid changes, then takes `owner` as effective uid and gid (real and
    /// saved stay 0). The caller must be root, single-threaded (checked by the caller).
    fn assume(owner: u32) -> io::Result<Self> {
        // SAFETY: PR_GET_SECUREBITS takes no pointer; it returns the bits or -1.
        let securebits = unsafe { libc::prctl(libc::PR_GET_SECUREBITS) };
        if securebits < 0 {
            return Err(io::Error::other(format!(
                "failed to read the securebits: {}",
                io::Error::last_os_error()
            )));
        }
        let securebits = securebits as libc::c_ulong;
        set_securebits(securebits | SECBIT_NO_SETUID_FIXUP)?;
        let root_u = nix::unistd::Uid::from_raw(0);
        let root_g = nix::unistd::Gid::from_raw(0);
        let assumed = nix::unistd::setresgid(root_g, nix::unistd::Gid::from_raw(owner), root_g)
            .and_then(|()| nix::unistd::setresuid(root_u, nix::unistd::Uid::from_raw(owner), root_u));
        let this = Self { securebits };
        if let Err(e) = assumed {
            let _ = this.restore();
            return Err(io::Error::other(format!(
                "failed to take uid {owner} to own the user namespace: {e}"
            )));
        }
        Ok(this)
    }

    /// Back to uid and gid 0 and the securebits found.
    fn restore(self) -> io::Result<()> {
        let root_u = nix::unistd::Uid::from_raw(0);
        let root_g = nix::unistd::Gid::from_raw(0);
        nix::unistd::setresuid(root_u, root_u, root_u)
            .and_then(|()| nix::unistd::setresgid(root_g, root_g, root_g))
            .map_err(|e| io::Error::other(format!("failed to become root again after the clone: {e}")))?;
        set_securebits(self.securebits)
    }
}

fn set_securebits(bits: libc::c_ulong) -> io::Result<()> {
    // SAFETY: PR_SET_SECUREBITS takes the bits by value, no pointer.
    if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits) } < 0 {
        return Err(io::Error::other(format!(
            "failed to set the securebits: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// `clone(2)` with `flags`, fork-style; the caller checked that the process is single-threaded.
fn raw_clone(flags: libc::c_ulong) -> io::Result<CloneResult> {
    // SAFETY: the process is single-threaded (checked by the caller), so the child is an exact copy with one
    // thread and may run arbitrary code; a null stack makes clone behave like fork (the child continues
    // on a copy-on-write duplicate of the caller's stack); the remaining pointer arguments (parent tid,
    // child tid, tls) are unused for these flags and passed as null.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    match r {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(CloneResult::Child),
        pid => Ok(CloneResult::Parent { pid: pid as i32 }),
    }
}

/// `struct clone_args` of `clone3(2)` (`linux/sched.h`, `CLONE_ARGS_SIZE_VER2`: up to `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `CLONE_INTO_CGROUP` (`linux/sched.h`), a `clone3` flag beyond 32 bits.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
/// `CSIGNAL`: the exit signal's bits in `clone(2)`'s flags; `clone3` takes it in its own field.
const CSIGNAL: u64 = 0xff;

/// `clone3(2)` with `flags` (their exit signal moved to its field) and `CLONE_INTO_CGROUP`,
/// fork-style; the caller checked that the process is single-threaded.
fn raw_clone3(flags: u64, cgroup: BorrowedFd<'_>) -> io::Result<CloneResult> {
    // A child of the caller's parent (`CLONE_PARENT`) signals that parent as the caller itself
    // does; `clone(2)` ignores the exit signal given with the flag, and `clone3` refuses one.
    let exit_signal = if flags & libc::CLONE_PARENT as u64 != 0 {
        0
    } else {
        flags & CSIGNAL
    };
    let args = CloneArgs {
        flags: (flags & !CSIGNAL) | CLONE_INTO_CGROUP,
        exit_signal,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: as in `raw_clone`: the process is single-threaded (checked by the caller), so the child
    // is an exact copy that may run arbitrary code; a zero stack and stack size make clone3 behave like
    // fork. `args` is a valid `clone_args` of the size passed, which the kernel only reads, and
    // `cgroup` is an open descriptor for as long as the call runs; no other pointer is set.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match r {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(CloneResult::Child),
        pid => Ok(CloneResult::Parent { pid: pid as i32 }),
    }
}

/// Whether a failed [`clone_into_namespaces`] into a cgroup means the kernel lacks `clone3`
/// (before 5.3: `ENOSYS`) or `CLONE_INTO_CGROUP` (before 5.7, which do not know the `cgroup` field:
/// `E2BIG`): the caller then joins the cgroup itself and clones without it. Any other error is
/// one, on every kernel that has the flag.
pub fn is_unsupported_clone3(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::E2BIG))
}

/// Moves the calling process into a new cgroup namespace, rooted at its cgroups as they are now.
/// Needs `CAP_SYS_ADMIN` in its user namespace (a sandbox's init has it in its own).
pub fn unshare_cgroup_namespace() -> io::Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP)
        .map_err(|e| io::Error::other(format!("failed to make the cgroup namespace: {e}")))
}

/// One line of a `uid_map`/`gid_map`: `inside outside count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMapping {
    /// First id inside the namespace.
    pub inside: u32,
    /// First id outside.
    pub outside: u32,
    /// Number of ids.
    pub count: u32,
}

/// Writes the uid and gid maps of process `pid`'s user namespace. The caller must hold `CAP_SETUID`
/// and `CAP_SETGID` in the parent namespace (the shim runs as host root).
pub fn write_id_maps(pid: i32, uids: &[IdMapping], gids: &[IdMapping]) -> io::Result<()> {
    let render = |maps: &[IdMapping]| -> String {
        maps.iter()
            .map(|m| format!("{} {} {}\n", m.inside, m.outside, m.count))
            .collect()
    };
    let write = |file: &str, content: String| {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, content)
            .map_err(|e| io::Error::new(e.kind(), format!("failed to write {path}: {e}")))
    };
    write("uid_map", render(uids))?;
    write("gid_map", render(gids))
}

/// Becomes uid/gid 0 of the current user namespace with no supplementary groups.
pub fn become_namespace_root() -> io::Result<()> {
    let root_u = nix::unistd::Uid::from_raw(0);
    let root_g = nix::unistd::Gid::from_raw(0);
    nix::unistd::setgroups(&[]).map_err(|e| io::Error::other(format!("failed to setgroups: {e}")))?;
    nix::unistd::setresgid(root_g, root_g, root_g)
        .map_err(|e| io::Error::other(format!("failed to setresgid: {e}")))?;
    nix::unistd::setresuid(root_u, root_u, root_u)
        .map_err(|e| io::Error::other(format!("failed to setresuid: {e}")))
}

/// Sets the hostname of the current UTS namespace.
pub fn set_hostname(name: &str) -> io::Result<()> {
    rustix::system::sethostname(name.as_bytes())
        .map_err(|e| io::Error::other(format!("failed to sethostname: {e}")))
}

/// Asks the kernel to send `SIGKILL` to this process when its parent thread exits.
pub fn die_with_parent() -> io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(|e| io::Error::other(format!("failed to set the parent-death signal: {e}")))
}

/// Brings the loopback interface of the current network namespace up (`SIOCSIFFLAGS` on `lo`).
pub fn bring_loopback_up() -> io::Result<()> {
    let sock = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )
    .map_err(|e| io::Error::other(format!("failed to open a socket to configure lo: {e}")))?;
    // SAFETY: `ifreq` is plain old data for which all-zero bytes are a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: `sock` is an open socket and `req` a valid `ifreq` naming "lo"; SIOCGIFFLAGS writes only
    // within `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::other(format!(
            "failed to read lo flags: {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: SIOCGIFFLAGS filled the `ifru_flags` member of the union, which is the one read here.
    unsafe {
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
    }
    // SAFETY: as above; SIOCSIFFLAGS reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::other(format!(
            "failed to bring lo up: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Moves the calling thread into the network namespace pinned at `path` (an nsfs file, or a bind
/// mount of one), with `setns(CLONE_NEWNET)`. Processes it forks or clones afterwards are born in
/// that namespace. Needs `CAP_SYS_ADMIN` in the namespace's owning user namespace (the setup shim is
/// host root).
pub fn join_network_namespace(path: &std::path::Path) -> io::Result<()> {
    let fd = rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| {
        io::Error::other(format!(
            "failed to open the network namespace {}: {e}",
            path.display()
        ))
    })?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&fd),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(|e| {
        io::Error::other(format!(
            "failed to join the network namespace {}: {e}",
            path.display()
        ))
    })
}

/// Opens a pidfd for `pid` (`pidfd_open(2)`), for waiting on a process that is not our child.
pub fn pidfd_open(pid: i32) -> io::Result<std::os::fd::OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pid must be positive"))?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
        .map_err(|e| io::Error::other(format!("failed to open a pidfd for {pid:?}: {e}")))
}

/// `NS_GET_OWNER_UID`: `_IO(0xb7, 0x4)` from `linux/nsfs.h`.
const NS_GET_OWNER_UID: libc::c_ulong = 0xb704;

/// The host uid that owns the user namespace of process `pid` (`NS_GET_OWNER_UID` on
/// `/proc/<pid>/ns/user`), as seen from the caller's user namespace.
pub fn user_namespace_owner(pid: i32) -> io::Result<u32> {
    let path = format!("/proc/{pid}/ns/user");
    let ns = rustix::fs::open(
        path.as_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| io::Error::other(format!("failed to open {path}: {e}")))?;
    let mut uid: libc::uid_t = 0;
    use std::os::fd::AsRawFd;
    // SAFETY: `ns` is an open nsfs descriptor; NS_GET_OWNER_UID writes one `uid_t` through the
    // pointer, which points to the live, exclusively borrowed `uid`.
    if unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_OWNER_UID, std::ptr::from_mut(&mut uid)) } < 0 {
        return Err(io::Error::other(format!(
            "failed to read the owner of {path}: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(uid)
}

/// A TCP socket (non-blocking, close-on-exec, not connected) made in the network namespace that
/// `ns` names: a pidfd (the namespace of that very process, so a reused pid never leads elsewhere)
/// or an nsfs file (such as a pinned namespace). The caller stays where it is: a fresh thread joins
/// the namespace with `setns(CLONE_NEWNET)`, makes the socket and ends, so no thread of the caller
/// ever runs in a sandbox's namespace after this returns. A socket keeps the namespace it was made
/// in, so connecting it later (from any thread) reaches that namespace's addresses.
///
/// Needs `CAP_SYS_ADMIN` over the namespace's owning user namespace and, for a pidfd, ptrace read
/// access to the process (host root has both over a sandbox). Fails with `ESRCH` when the process
/// of a pidfd has exited.
pub fn tcp_socket_in_netns(ns: std::os::fd::BorrowedFd<'_>, ipv6: bool) -> io::Result<std::os::fd::OwnedFd> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("paddock-netns".into())
            .spawn_scoped(scope, move || {
                rustix::thread::move_into_link_name_space(
                    ns,
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))?;
                let family = if ipv6 {
                    rustix::net::AddressFamily::INET6
                } else {
                    rustix::net::AddressFamily::INET
                };
                rustix::net::socket_with(
                    family,
                    rustix::net::SocketType::STREAM,
                    rustix::net::SocketFlags::NONBLOCK | rustix::net::SocketFlags::CLOEXEC,
                    Some(rustix::net::ipproto::TCP),
                )
                .map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))
                // The thread ends here, and its membership of the namespace with it.
            })
            .map_err(|e| {
                io::Error::other(format!(
                    "failed to start a thread to enter a network namespace: {e}"
                ))
            })?
            .join()
            .map_err(|_| io::Error::other("the thread entering a network namespace panicked"))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_socket_made_in_another_namespace_reaches_its_loopback_only() {
        assert!(
            rustix::process::geteuid().is_root(),
            "this test needs root (to make a network namespace); the suite runs as root"
        );
        // A namespace of a thread of our own, with a listener on its loopback.
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            bring_loopback_up().expect("lo up");
            let ns = rustix::fs::open(
                "/proc/thread-self/ns/net",
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .expect("open ns");
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            tx.send((ns, listener)).expect("send");
            let _ = done_rx.recv();
        });
        let (ns, listener) = rx.recv().expect("namespace made");
        let port = listener.local_addr().expect("addr").port();
        let fd = tcp_socket_in_netns(ns.as_fd(), false).expect("socket in the namespace");
        let stream = std::net::TcpStream::from(fd);
        stream.set_nonblocking(false).expect("blocking");
        let sock = rustix::net::SocketAddrV4::new([127, 0, 0, 1].into(), port);
        rustix::net::connect(&stream, &sock).expect("connects inside the namespace");
        let (_peer, _) = listener.accept().expect("accepted inside");
        drop(done_tx);
        holder.join().expect("holder");
    }

    #[test]
    fn a_pidfd_of_an_exited_process_is_refused() {
        assert!(
            rustix::process::geteuid().is_root(),
            "this test needs root (to enter a namespace); the suite runs as root"
        );
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pidfd = pidfd_open(i32::try_from(child.id()).expect("pid")).expect("pidfd");
        child.wait().expect("wait");
        let e = tcp_socket_in_netns(pidfd.as_fd(), false).expect_err("refused");
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
    }
}

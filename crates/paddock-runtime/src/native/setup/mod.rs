//! The setup shim: a fresh, single-threaded process (the `paddock-setup` binary) that builds one sandbox and
//! ends by exec'ing the agent as the sandbox's PID 1, as Firecracker's jailer does.
//!
//! Protocol with the caller: the [`SetupSpec`] arrives as JSON on stdin; the shim prints one JSON line
//! on stdout, `{"pid":N}` (the sandbox's init, now a child of the caller) or `{"error":"..."}`, and
//! exits. The multi-threaded caller never calls unshare, mount or setns itself.
//!
//! Order of operations (each step's failure is reported and the half-built sandbox is killed):
//! 1. shim (host root, host namespaces): join the sandbox's v1 cgroups (its own thread, through
//!    `tasks`), bind the agent's listening socket, open the agent binary and its log, each through a
//!    detached mount of the file alone (so nothing the agent holds is named by a host path inside
//!    the sandbox), take a user-namespace owner uid of the sandbox's own (see [`owner`]), clone the
//!    init into its cgroup2 cgroup (`CLONE_INTO_CGROUP`) and new user/mount/pid/net/ipc/uts
//!    namespaces owned by it as a sibling (`CLONE_PARENT`), write its uid/gid maps, release it,
//!    wait for its exec or its error. A networked sandbox's shim first joins the network namespace
//!    its host made and clones without `CLONE_NEWNET`. In fresh cgroups no step migrates a process
//!    through a `cgroup.procs` file, which costs an RCU grace period; a rollback's reused cgroup2
//!    cgroup is joined that way instead of by the clone (see `SandboxCgroup::placement`).
//! 2. init (in the namespaces): become the namespace's root (an unprivileged host uid), a cgroup
//!    namespace rooted at its own cgroups, hostname, loopback (not in a host-made network
//!    namespace), build the root (see [`plan`]), `pivot_root`, drop the capability bounding set to
//!    what the agent needs, Landlock, `no_new_privs`, seccomp (the policy: [`seccomp_policy`]),
//!    reset what the caller's process state would otherwise pass on (open-file limit, signal
//!    dispositions and mask), exec the agent from its file descriptor.
//!
//! What a sandbox never inherits from its caller (a server may have raised or changed it): the
//! open-file limit is reset to soft [`NOFILE_SOFT`] / hard at most [`NOFILE_HARD`] (systemd's defaults
//! for services: `select(2)`-safe by default, raisable by programs that need more); every signal
//! disposition is reset to its default (a Rust caller ignores `SIGPIPE`, and `exec` keeps ignored
//! signals); no signal is blocked.

mod mounts;
pub mod owner;
pub mod plan;
pub mod seccomp_policy;

use std::fs;
use std::io::{self, BufRead, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use paddock_sys::namespace::{self, CloneResult, IdMapping, Namespaces};
use paddock_types::MountSpec;
use serde::{Deserialize, Serialize};

use super::cgroup::Placement;
use super::users::IdRange;
use owner::{OwnerPool, OWNER_LOCK_FD};
use plan::HostEntry;

/// A sandbox's root file system with its host paths resolved ([`paddock_types::RootfsSpec`] names
/// an image template by id; the pool knows where it is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Rootfs {
    /// The host's system directories read-only and the volume's curated `/etc`.
    Host,
    /// A root file system directory, read-only, with the volume's `/home`, `/root` and `/tmp`.
    Dir {
        /// The directory.
        path: PathBuf,
    },
    /// An image template: the volume (a writable snapshot of the template) is the whole tree.
    Image {
        /// The template's read-only subvolume, whose top level the mount plan mirrors (the
        /// sandbox cannot change the top level of its volume, which it never sees).
        template: PathBuf,
    },
}

impl Rootfs {
    /// Where the sandbox's system files come from on the host, read (never written) by host code
    /// such as the trust bundle's: never the volume, which the sandbox writes.
    pub fn system_root(&self) -> &Path {
        match self {
            Self::Host => Path::new("/"),
            Self::Dir { path } => path,
            Self::Image { template } => template,
        }
    }
}

/// Everything the shim needs, as typed JSON (never environment variables).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetupSpec {
    /// Hostname (the sandbox id).
    pub hostname: String,
    /// Host id range for the sandbox's uids and gids.
    pub ids: IdRange,
    /// How the init is put in the sandbox's cgroups.
    pub cgroups: Placement,
    /// An empty directory on the host the new root is built on (only inside the new mount namespace).
    pub root_mount: PathBuf,
    /// The sandbox's subvolume (etc/, home/, tmp/).
    pub volume: PathBuf,
    /// Root file system profile.
    pub rootfs: Rootfs,
    /// User mounts.
    pub mounts: Vec<MountSpec>,
    /// Named volumes: the volume's subvolume on the host and where it goes (bound after the user
    /// mounts, onto a mount point resolved inside the new root, `plan::MountStep::BindInRoot`).
    #[serde(default)]
    pub volumes: Vec<MountSpec>,
    /// The agent executable on the host.
    pub agent_binary: PathBuf,
    /// Where the agent's socket is bound (host path).
    pub agent_socket: PathBuf,
    /// Where the agent's log goes (host path).
    pub agent_log: PathBuf,
    /// The agent's default user.
    pub default_user: String,
    /// Kill the sandbox if the process that started the shim dies (`paddock run`).
    pub die_with_parent: bool,
    /// The pid of the process that started the shim (to detect it dying before the parent-death
    /// signal is armed).
    pub parent_pid: i32,
    /// A network namespace the host made and configured (a networked sandbox's, `native/network/`):
    /// the shim joins it before cloning, so the init is born in it instead of in a new, empty one.
    /// It belongs to the host's user namespace, so the sandbox's root cannot change its addresses,
    /// routes or firewall; and the host already brought its loopback up.
    #[serde(default)]
    pub netns: Option<PathBuf>,
    /// Where the owner of the sandbox's user namespace comes from ([`owner`]).
    pub owners: OwnerPool,
}

#[cfg(test)]
impl SetupSpec {
    pub(crate) fn example() -> Self {
        Self {
            hostname: "sb-test".into(),
            ids: IdRange::DEFAULT,
            cgroups: Placement::default(),
            root_mount: "/var/lib/paddock/run/sb-test/root".into(),
            volume: "/var/lib/paddock/pool/sandboxes/sb-test".into(),
            rootfs: Rootfs::Host,
            mounts: vec![],
            volumes: vec![],
            agent_binary: "/usr/local/bin/paddock-agent".into(),
            agent_socket: "/var/lib/paddock/run/sb-test/agent.sock".into(),
            agent_log: "/var/lib/paddock/run/sb-test/agent.log".into(),
            default_user: "user".into(),
            die_with_parent: true,
            parent_pid: 1,
            netns: None,
            owners: OwnerPool::default_pool(),
        }
    }
}

/// The shim's answer on stdout.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SetupOutcome {
    /// The sandbox's init (the agent) runs with this host pid.
    Pid(i32),
    /// Setup failed.
    Error(String),
    /// Setup failed after the init was cloned: the init was killed, and its parent (the shim's
    /// caller, through `CLONE_PARENT`) must reap it.
    InitFailed {
        /// What failed.
        error: String,
        /// The killed init's host pid.
        pid: i32,
    },
}

/// Why [`setup`] failed, and the init to reap if it had been cloned.
struct SetupError {
    message: String,
    init: Option<i32>,
}

impl From<String> for SetupError {
    fn from(message: String) -> Self {
        Self { message, init: None }
    }
}

impl From<&str> for SetupError {
    fn from(message: &str) -> Self {
        message.to_owned().into()
    }
}

/// Capabilities the agent keeps in its bounding set (inside the sandbox's user namespace): enough to
/// switch users, own files it creates for them, and signal processes. Everything else (SYS_ADMIN,
/// NET_ADMIN, ...) is gone for the sandbox's lifetime.
const AGENT_CAPS: [u32; 9] = [
    0, // CAP_CHOWN
    1, // CAP_DAC_OVERRIDE
    2, // CAP_DAC_READ_SEARCH
    3, // CAP_FOWNER
    4, // CAP_FSETID
    5, // CAP_KILL
    6, // CAP_SETGID
    7, // CAP_SETUID
    8, // CAP_SETPCAP
];

/// Soft `RLIMIT_NOFILE` of every sandbox's agent and workloads.
pub const NOFILE_SOFT: u64 = 1024;
/// Highest hard `RLIMIT_NOFILE` a sandbox gets (lower if the caller's own is lower).
pub const NOFILE_HARD: u64 = 524_288;

/// The line the caller sends once the sandbox's volume exists (it creates the volume while the shim
/// starts, clones and maps ids, so the two overlap).
pub const VOLUME_READY: &str = "volume-ready";

/// Entry point of the `paddock-setup` binary: returns the process exit code.
pub fn run_setup_shim() -> i32 {
    let mut input = io::stdin().lock();
    let mut line = String::new();
    let outcome = match input.read_line(&mut line) {
        Err(e) => SetupOutcome::Error(format!("failed to read the setup spec: {e}")),
        Ok(_) => match serde_json::from_str::<SetupSpec>(&line) {
            Err(e) => SetupOutcome::Error(format!("malformed setup spec: {e}")),
            Ok(spec) => match setup(&spec, &mut input) {
                Ok(pid) => SetupOutcome::Pid(pid),
                Err(SetupError {
                    message,
                    init: Some(pid),
                }) => SetupOutcome::InitFailed { error: message, pid },
                Err(SetupError { message, init: None }) => SetupOutcome::Error(message),
            },
        },
    };
    let ok = matches!(outcome, SetupOutcome::Pid(_));
    let line = serde_json::to_string(&outcome).unwrap_or_else(|_| "{\"error\":\"unencodable\"}".into());
    let _ = writeln!(io::stdout(), "{line}");
    if ok {
        0
    } else {
        1
    }
}

/// Waits for the caller's [`VOLUME_READY`] line; anything else (EOF included) aborts the setup.
fn wait_for_volume(input: &mut impl BufRead) -> Result<(), String> {
    let mut line = String::new();
    input
        .read_line(&mut line)
        .map_err(|e| format!("failed to read from the caller: {e}"))?;
    if line.trim_end() == VOLUME_READY {
        Ok(())
    } else {
        Err("the caller abandoned the setup".into())
    }
}

/// Phase 1, in the shim.
fn setup(spec: &SetupSpec, input: &mut impl BufRead) -> Result<i32, SetupError> {
    // The init (and so every process of the sandbox) inherits these from this shim, which inherited
    // them from its caller: a server started under `chrt`, `nice`, `ionice` or `setarch -R` must
    // not pass a real-time policy, a raised priority or an address space without randomization on.
    paddock_sys::inherited::reset_scheduling().map_err(|e| format!("reset the scheduling: {e}"))?;
    paddock_sys::inherited::reset_personality().map_err(|e| format!("reset the personality: {e}"))?;
    // The shim is single-threaded (`clone_into_namespaces` checks it again), so moving its thread
    // moves it whole.
    for file in spec.cgroups.tasks.iter().chain(&spec.cgroups.procs) {
        join_cgroup(file)?;
    }
    let cgroup2 = match &spec.cgroups.clone_into {
        None => None,
        Some(dir) => Some(open_cgroup2(dir)?),
    };
    let _ = fs::remove_file(&spec.agent_socket);
    let listener = UnixListener::bind(&spec.agent_socket)
        .map_err(|e| format!("failed to bind agent socket {}: {e}", spec.agent_socket.display()))?;
    let agent = open_agent(&spec.agent_binary)?;
    let log = open_agent_log(&spec.agent_log)?;
    let null = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| format!("/dev/null: {e}"))?;
    let (go_rx, go_tx) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    let (err_rx, err_tx) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    let top_level = read_top_level(spec)?;
    // Opened while the caller is certainly alive (it is waiting for this shim); the init checks it after
    // arming its parent-death signal, closing the window where the caller dies in between.
    let caller = if spec.die_with_parent {
        if rustix::process::getppid().map(|p| p.as_raw_nonzero().get()) != Some(spec.parent_pid) {
            return Err("the caller exited before setup".into());
        }
        Some(namespace::pidfd_open(spec.parent_pid).map_err(|e| e.to_string())?)
    } else {
        None
    };

    let namespaces = match &spec.netns {
        None => Namespaces::ALL,
        Some(netns) => {
            // Only this process moves (the shim is single-threaded and exits right after); the init
            // inherits the namespace through the clone below.
            namespace::join_network_namespace(netns).map_err(|e| e.to_string())?;
            Namespaces::ALL_BUT_NET
        }
    };
    // A cgroup namespace made by the clone would be rooted at this shim's cgroup2 cgroup, not the
    // init's: the init makes its own once it runs, in its cgroups (see `init`).
    let namespaces = Namespaces {
        cgroup: false,
        ..namespaces
    };
    // Held by the init from here on (the clone shares the locked file description).
    let owner = owner::allocate_owner(&spec.owners)?;
    // What the sandbox's files are created with unless a program says otherwise, whatever the
    // caller's umask (set after this shim's own files: the socket, the log, the owner's lock).
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    let clone = |cgroup: Option<&OwnedFd>| {
        namespace::clone_into_namespaces(namespaces, true, Some(owner.uid), cgroup.map(|fd| fd.as_fd()))
    };
    let cloned = match (&spec.cgroups.clone_into, clone(cgroup2.as_ref())) {
        // A kernel without CLONE_INTO_CGROUP: the shim joins the cgroup and the init inherits it.
        (Some(dir), Err(e)) if namespace::is_unsupported_clone3(&e) => {
            join_cgroup(&dir.join("cgroup.procs"))?;
            clone(None)
        }
        (_, cloned) => cloned,
    };
    match cloned.map_err(|e| format!("clone: {e}"))? {
        CloneResult::Child => {
            drop(go_tx);
            drop(err_rx);
            drop(cgroup2);
            let inherited = Inherited {
                owner_lock: &owner.lock,
                go: go_rx,
                caller: caller.as_ref(),
                listener: &listener,
                agent: &agent,
                log: &log,
                null: &null,
            };
            let result = init(spec, &top_level, inherited);
            // Only reached on failure: report and die.
            let msg = match result {
                Err(e) => e,
                Ok(never) => match never {},
            };
            let mut f = fs::File::from(err_tx);
            let _ = f.write_all(msg.as_bytes());
            std::process::exit(1);
        }
        CloneResult::Parent { pid } => {
            drop(go_rx);
            drop(err_tx);
            let map = [IdMapping {
                inside: 0,
                outside: spec.ids.base,
                count: spec.ids.count,
            }];
            // Release the init as soon as its ids are mapped (it builds the parts of its root that do not
            // need the volume), then again once the caller says the volume exists.
            let mut go = fs::File::from(go_tx);
            let released = namespace::write_id_maps(pid, &map, &map)
                .map_err(|e| format!("uid/gid maps: {e}"))
                .and_then(|()| go.write_all(b"g").map_err(|e| format!("release init: {e}")))
                .and_then(|()| wait_for_volume(input))
                .and_then(|()| go.write_all(b"v").map_err(|e| format!("release init: {e}")));
            drop(go);
            let mut failure = String::new();
            let _ = fs::File::from(err_rx).read_to_string(&mut failure);
            let outcome = match released {
                Err(e) => Err(e),
                Ok(()) if failure.is_empty() => Ok(pid),
                Ok(()) => Err(failure),
            };
            if outcome.is_err() {
                if let Some(p) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
            }
            outcome.map_err(|message| SetupError {
                message,
                init: Some(pid),
            })
        }
    }
}

/// The agent binary, opened `O_PATH` on a detached mount of its own
/// ([`paddock_sys::mount::clone_detached`]): the sandbox's `/proc/1/exe` and `/proc/1/maps` then
/// read `/`, not the binary's host path.
fn open_agent(path: &Path) -> Result<OwnedFd, String> {
    let file = rustix::fs::open(
        path,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| format!("failed to open the agent binary {}: {e}", path.display()))?;
    paddock_sys::mount::clone_detached(file.as_fd())
        .map_err(|e| format!("failed to detach the agent binary {}: {e}", path.display()))
}

/// Moves the (single-threaded) shim into a cgroup through its `tasks` or `cgroup.procs` `file`.
fn join_cgroup(file: &Path) -> Result<(), String> {
    fs::write(file, "0").map_err(|e| format!("failed to join cgroup {}: {e}", file.display()))
}

/// The sandbox's cgroup2 directory, for `CLONE_INTO_CGROUP`: host root's cgroup tree (nothing a
/// sandbox can write), opened as a directory without following a symlink.
fn open_cgroup2(dir: &Path) -> Result<OwnedFd, String> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("failed to open cgroup {}: {e}", dir.display()))
}

/// The agent's stderr: `path` (in the run directory, which only host root can enter), created mode
/// 0600 if missing, appended to through a detached mount of the file alone, so that the descriptor
/// the agent holds names `/` rather than a path under the state directory.
fn open_agent_log(path: &Path) -> Result<fs::File, String> {
    use rustix::fs::{Mode, OFlags};
    let fail = |what: &str, e: io::Error| format!("failed to {what} the agent log {}: {e}", path.display());
    let file = rustix::fs::open(
        path,
        OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| fail("open", e.into()))?;
    let detached = paddock_sys::mount::clone_detached(file.as_fd()).map_err(|e| fail("detach", e))?;
    paddock_sys::fs_in_root::reopen(detached.as_fd(), OFlags::WRONLY | OFlags::APPEND)
        .map(fs::File::from)
        .map_err(|e| fail("reopen", e))
}

/// Lists the top-level entries of the host's `/` or of the rootfs directory.
fn read_top_level(spec: &SetupSpec) -> Result<Vec<(String, HostEntry)>, String> {
    let dir = spec.rootfs.system_root();
    let rd = fs::read_dir(dir).map_err(|e| format!("cannot read root directory {}: {e}", dir.display()))?;
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let kind = match entry.file_type() {
            Ok(t) if t.is_symlink() => match fs::read_link(entry.path()) {
                Ok(to) => HostEntry::Symlink(to.to_string_lossy().into_owned()),
                Err(_) => HostEntry::Other,
            },
            Ok(t) if t.is_dir() => HostEntry::Dir,
            Ok(t) if t.is_file() => HostEntry::File,
            _ => HostEntry::Other,
        };
        out.push((name, kind));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Descriptors the init inherits from the shim.
struct Inherited<'a> {
    /// The lock on its user namespace's owner uid, kept by the agent for the sandbox's life.
    owner_lock: &'a OwnedFd,
    /// Readable once the shim has written the uid/gid maps.
    go: OwnedFd,
    /// A pidfd of the caller, when the sandbox dies with it.
    caller: Option<&'a OwnedFd>,
    /// The agent's listening socket.
    listener: &'a UnixListener,
    /// The agent executable.
    agent: &'a OwnedFd,
    /// The agent's log file.
    log: &'a fs::File,
    /// The host's /dev/null.
    null: &'a fs::File,
}

/// Phase 2, in the sandbox's init. Returns only on failure.
fn init(
    spec: &SetupSpec,
    top_level: &[(String, HostEntry)],
    fds: Inherited<'_>,
) -> Result<std::convert::Infallible, String> {
    let mut go = fs::File::from(fds.go);
    let mut byte = [0u8; 1];
    let n = go.read(&mut byte).map_err(|e| format!("wait for release: {e}"))?;
    if n != 1 {
        return Err("the shim died before releasing the sandbox".into());
    }
    namespace::become_namespace_root().map_err(|e| e.to_string())?;
    // Rooted at the sandbox's cgroups, which the init was born in (v2) or inherited (v1): inside,
    // they are `/`, and nothing of the host's cgroup tree is named.
    namespace::unshare_cgroup_namespace().map_err(|e| e.to_string())?;
    if let Some(caller) = fds.caller {
        namespace::die_with_parent().map_err(|e| e.to_string())?;
        // A pidfd polls readable once its process has exited.
        let mut fds = [rustix::event::PollFd::new(caller, rustix::event::PollFlags::IN)];
        let ready = rustix::event::poll(
            &mut fds,
            Some(&rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            }),
        )
        .map_err(|e| format!("poll caller: {e}"))?;
        if ready > 0 {
            return Err("the caller exited during setup".into());
        }
    }
    namespace::set_hostname(&spec.hostname).map_err(|e| e.to_string())?;
    if spec.netns.is_none() {
        // A host-made network namespace is not the init's to configure (it has no right to), and
        // the host brought its loopback up already.
        namespace::bring_loopback_up().map_err(|e| e.to_string())?;
    }
    paddock_sys::mount::make_private_recursive().map_err(|e| e.to_string())?;
    let steps = plan::plan_mounts(spec, top_level);
    mounts::execute(&spec.root_mount, &steps, || {
        let mut byte = [0u8; 1];
        match go.read(&mut byte)? {
            1 if byte[0] == b'v' => Ok(()),
            _ => Err(io::Error::other(
                "the shim abandoned the setup before the volume was ready",
            )),
        }
    })
    .map_err(|e| e.to_string())?;
    paddock_sys::mount::pivot_into(&spec.root_mount).map_err(|e| e.to_string())?;

    paddock_sys::caps::drop_bounding_except(&AGENT_CAPS)
        .map_err(|e| format!("capability bounding set: {e}"))?;
    let writable: Vec<PathBuf> = plan::writable_paths(spec, top_level)
        .into_iter()
        .map(PathBuf::from)
        .collect();
    let landlock = paddock_sys::landlock::restrict_writes(&writable, Some(fds.agent.as_fd()))
        .map_err(|e| format!("landlock: {e}"))?;
    // The caller warned already when the kernel has no Landlock; a kernel that has it must enforce.
    if paddock_sys::landlock::kernel_abi().is_some()
        && landlock == paddock_sys::landlock::LandlockStatus::NotEnforced
    {
        return Err("landlock: the kernel offers Landlock but did not enforce the ruleset".into());
    }
    limit_open_files().map_err(|e| format!("open file limit: {e}"))?;
    zero_limits().map_err(|e| format!("core, real-time and nice limits: {e}"))?;
    paddock_sys::caps::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    let policy = seccomp_policy::default_policy();
    paddock_sys::seccomp::install(&policy).map_err(|e| format!("seccomp: {e}"))?;

    use paddock_sys::exec;
    // Move the agent's descriptor out of the way of the numbers installed below.
    let agent = rustix::io::fcntl_dupfd_cloexec(fds.agent, 10).map_err(|e| format!("dup agent fd: {e}"))?;
    let owner_lock =
        rustix::io::fcntl_dupfd_cloexec(fds.owner_lock, 10).map_err(|e| format!("dup owner lock fd: {e}"))?;
    exec::install_fd(fds.null.as_fd(), 0).map_err(|e| format!("stdin: {e}"))?;
    exec::install_fd(fds.null.as_fd(), 1).map_err(|e| format!("stdout: {e}"))?;
    exec::install_fd(fds.log.as_fd(), 2).map_err(|e| format!("stderr: {e}"))?;
    exec::install_fd(fds.listener.as_fd(), 3).map_err(|e| format!("listener: {e}"))?;
    exec::install_fd(owner_lock.as_fd(), OWNER_LOCK_FD).map_err(|e| format!("owner lock: {e}"))?;
    exec::cloexec_from(OWNER_LOCK_FD as u32 + 1).map_err(|e| format!("close_range: {e}"))?;
    exec::reset_signal_dispositions();
    exec::unblock_all_signals().map_err(|e| format!("signal mask: {e}"))?;
    let err = exec::exec_fd(
        agent.as_fd(),
        &[
            "paddock-agent",
            "--listen-fd",
            "3",
            "--default-user",
            &spec.default_user,
        ],
        &["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"],
    );
    Err(format!("failed to exec the agent: {err}"))
}

/// Sets `RLIMIT_NOFILE` to [`NOFILE_SOFT`] / [`NOFILE_HARD`] (each capped by the current hard limit:
/// lowering needs no privilege, raising would).
fn limit_open_files() -> io::Result<()> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let (soft, hard) = nofile_limits(getrlimit(Resource::Nofile).maximum);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(soft),
            maximum: Some(hard),
        },
    )?;
    Ok(())
}

/// Sets `RLIMIT_CORE`, `RLIMIT_RTPRIO` and `RLIMIT_NICE` to 0, soft and hard, whatever the caller
/// had; no process of the sandbox can raise them again (that needs `CAP_SYS_RESOURCE` in the host's
/// user namespace). No core dumps: where the host's `core_pattern` is a pipe, each dump would start
/// the host's handler as root, outside the sandbox and its cgroups, on the sandbox's say. No
/// real-time policy and no raised priority: a caller given `LimitRTPRIO=` or `LimitNICE=` (systemd)
/// would otherwise let every sandbox take a CPU from the host (`sched_setscheduler` and
/// `setpriority` are allowed inside, within these limits).
fn zero_limits() -> io::Result<()> {
    use rustix::process::{setrlimit, Resource, Rlimit};
    for resource in [Resource::Core, Resource::Rtprio, Resource::Nice] {
        setrlimit(
            resource,
            Rlimit {
                current: Some(0),
                maximum: Some(0),
            },
        )?;
    }
    Ok(())
}

/// The (soft, hard) open-file limits for a sandbox whose caller's hard limit is `caller_hard`
/// (`None`: unlimited).
fn nofile_limits(caller_hard: Option<u64>) -> (u64, u64) {
    let hard = caller_hard.map_or(NOFILE_HARD, |h| h.min(NOFILE_HARD));
    (NOFILE_SOFT.min(hard), hard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_file_limits_are_reset_not_inherited() {
        assert_eq!(nofile_limits(Some(1 << 20)), (1024, 524_288));
        assert_eq!(nofile_limits(None), (1024, 524_288));
        assert_eq!(nofile_limits(Some(4096)), (1024, 4096));
        assert_eq!(nofile_limits(Some(512)), (512, 512));
    }
}

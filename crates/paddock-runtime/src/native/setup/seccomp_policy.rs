//! The sandbox's system-call policy, as data: an allowlist in the style of Docker's default profile
//! for x86_64, one reason per group of entries. The init installs it as its last hardening step,
//! after Landlock and `no_new_privs` (`setup/mod.rs`); `paddock_sys::seccomp` is the mechanism (the
//! policy's shape, the pure `decide`, the compiler to one BPF program and its installation) and
//! holds no policy.
//!
//! Ordinary programs (shells, coreutils, Python, Node, compilers, git, pip) work; the kernel
//! interfaces that let a process leave or attack the sandbox are refused with `EPERM` and a reason;
//! anything not listed gets the policy's default errno, `ENOSYS`, so that programs probing newer
//! system calls fall back as they would on an older kernel. `ioctl` is itself an allowlist of request
//! numbers ([`ioctls`], a reason per group); any other request fails with `ENOTTY`.
//!
//! The tests check the table's meaning with `decide`, and the compiled program against `decide`
//! (through `paddock_sys::seccomp::verify`, for every system call number, every rule and random
//! arguments), its path lengths (the kernel's cost of attaching it), and the installed filter with
//! ordinary programs in a child process.

pub mod ioctls;
#[cfg(test)]
mod tests;

use paddock_sys::seccomp::{RuleAction, SeccompPolicy, SyscallRule};

use ioctls::{allowed_ioctls, IOCTL_REFUSED_ERRNO};

const EPERM: u32 = libc::EPERM as u32;
const ENOSYS: u32 = libc::ENOSYS as u32;
const EAFNOSUPPORT: u32 = libc::EAFNOSUPPORT as u32;

/// System call numbers: libc's, plus the x86_64 numbers of calls newer than the libc crate in use.
#[expect(non_upper_case_globals, reason = "named like libc's SYS_* constants")]
mod nr {
    pub use libc::*;
    pub const SYS_io_pgetevents: i64 = 333;
    pub const SYS_cachestat: i64 = 451;
    pub const SYS_map_shadow_stack: i64 = 453;
    pub const SYS_futex_wake: i64 = 454;
    pub const SYS_futex_wait: i64 = 455;
    pub const SYS_futex_requeue: i64 = 456;
    pub const SYS_setxattrat: i64 = 463;
    pub const SYS_getxattrat: i64 = 464;
    pub const SYS_listxattrat: i64 = 465;
    pub const SYS_removexattrat: i64 = 466;
    pub const SYS_open_tree_attr: i64 = 467;
}

/// Builds the rule list from groups `action, "reason": SYS_a, SYS_b, ...;`, one rule per system call.
macro_rules! rules {
    ($($action:expr, $reason:literal: $($sys:ident),+;)+) => {
        vec![$($(SyscallRule {
            name: strip_sys(stringify!($sys)),
            nr: nr::$sys,
            reason: $reason,
            action: $action,
        }),+),+]
    };
}

fn strip_sys(name: &'static str) -> &'static str {
    name.strip_prefix("SYS_").unwrap_or(name)
}

/// The default sandbox policy for x86_64 (see the module docs).
pub fn default_policy() -> SeccompPolicy {
    use RuleAction::{Allow, AllowIfArgEquals, AllowUnlessArgMasked, Errno};
    let namespaces = [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWCGROUP,
    ]
    .iter()
    .fold(0, |mask, &flag| mask | flag as u64);
    // PER_LINUX, PER_LINUX32, UNAME26, UNAME26 | PER_LINUX32, and 0xffffffff which only queries.
    let personalities = [0, 0x0008, 0x2_0000, 0x2_0008, 0xffff_ffff];
    let families = [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK].map(|af| af as u64);
    let rules = rules! {
        Allow, "file descriptor I/O":
            SYS_read, SYS_write, SYS_readv, SYS_writev, SYS_pread64, SYS_pwrite64, SYS_preadv, SYS_pwritev,
            SYS_preadv2, SYS_pwritev2, SYS_lseek, SYS_close, SYS_close_range, SYS_dup, SYS_dup2, SYS_dup3,
            SYS_fcntl, SYS_flock, SYS_fsync, SYS_fdatasync, SYS_sync, SYS_syncfs, SYS_sync_file_range,
            SYS_fallocate, SYS_ftruncate, SYS_truncate, SYS_sendfile, SYS_splice, SYS_tee, SYS_vmsplice,
            SYS_copy_file_range, SYS_readahead, SYS_fadvise64, SYS_pipe, SYS_pipe2, SYS_cachestat;
        Allow, "paths and file metadata, confined by the mount namespace and Landlock":
            SYS_open, SYS_openat, SYS_openat2, SYS_creat, SYS_access, SYS_faccessat, SYS_faccessat2, SYS_stat,
            SYS_fstat, SYS_lstat, SYS_newfstatat, SYS_statx, SYS_statfs, SYS_fstatfs, SYS_getdents,
            SYS_getdents64, SYS_getcwd, SYS_chdir, SYS_fchdir, SYS_mkdir, SYS_mkdirat, SYS_rmdir, SYS_rename,
            SYS_renameat, SYS_renameat2, SYS_link, SYS_linkat, SYS_symlink, SYS_symlinkat, SYS_unlink,
            SYS_unlinkat, SYS_readlink, SYS_readlinkat, SYS_chmod, SYS_fchmod, SYS_fchmodat, SYS_fchmodat2,
            SYS_chown, SYS_fchown, SYS_lchown, SYS_fchownat, SYS_umask, SYS_utime, SYS_utimes, SYS_utimensat,
            SYS_futimesat, SYS_mknod, SYS_mknodat, SYS_getxattr, SYS_lgetxattr, SYS_fgetxattr, SYS_setxattr,
            SYS_lsetxattr, SYS_fsetxattr, SYS_listxattr, SYS_llistxattr, SYS_flistxattr, SYS_removexattr,
            SYS_lremovexattr, SYS_fremovexattr, SYS_setxattrat, SYS_getxattrat, SYS_listxattrat,
            SYS_removexattrat, SYS_inotify_init, SYS_inotify_init1, SYS_inotify_add_watch,
            SYS_inotify_rm_watch;
        Allow, "memory management of the caller's own address space":
            SYS_brk, SYS_mmap, SYS_munmap, SYS_mremap, SYS_mprotect, SYS_madvise, SYS_mincore, SYS_msync,
            SYS_mlock, SYS_mlock2, SYS_munlock, SYS_mlockall, SYS_munlockall, SYS_membarrier,
            SYS_memfd_create, SYS_memfd_secret, SYS_pkey_alloc, SYS_pkey_free, SYS_pkey_mprotect,
            SYS_remap_file_pages, SYS_map_shadow_stack, SYS_mseal;
        Allow, "processes and threads, bounded by the PID namespace and the cgroup":
            SYS_fork, SYS_vfork, SYS_execve, SYS_execveat, SYS_exit, SYS_exit_group, SYS_wait4, SYS_waitid,
            SYS_kill, SYS_tkill, SYS_tgkill, SYS_getpid, SYS_getppid, SYS_gettid, SYS_getpgid, SYS_setpgid,
            SYS_getpgrp, SYS_getsid, SYS_setsid, SYS_set_tid_address, SYS_set_robust_list,
            SYS_get_robust_list, SYS_futex, SYS_futex_waitv, SYS_futex_wake, SYS_futex_wait,
            SYS_futex_requeue, SYS_rseq, SYS_arch_prctl, SYS_prctl, SYS_set_thread_area,
            SYS_get_thread_area, SYS_getpriority, SYS_setpriority, SYS_sched_yield, SYS_sched_getaffinity,
            SYS_sched_setaffinity, SYS_sched_getattr, SYS_sched_setattr, SYS_sched_getparam,
            SYS_sched_setparam, SYS_sched_getscheduler, SYS_sched_setscheduler, SYS_sched_get_priority_max,
            SYS_sched_get_priority_min, SYS_sched_rr_get_interval, SYS_getrlimit, SYS_setrlimit,
            SYS_prlimit64, SYS_getrusage, SYS_times, SYS_ioprio_get, SYS_ioprio_set, SYS_getcpu,
            SYS_pidfd_open, SYS_pidfd_send_signal, SYS_pidfd_getfd, SYS_process_mrelease,
            SYS_restart_syscall, SYS_capget, SYS_capset;
        Allow, "debugging, limited by the kernel's ptrace access checks":
            SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev, SYS_kcmp, SYS_process_madvise;
        Allow, "self-restriction only ever narrows what a process may do":
            SYS_seccomp, SYS_landlock_create_ruleset, SYS_landlock_add_rule, SYS_landlock_restrict_self;
        Allow, "credentials, bounded by the user namespace and the dropped capabilities":
            SYS_getuid, SYS_geteuid, SYS_getgid, SYS_getegid, SYS_getresuid, SYS_getresgid, SYS_getgroups,
            SYS_setuid, SYS_setgid, SYS_setreuid, SYS_setregid, SYS_setresuid, SYS_setresgid,
            SYS_setfsuid, SYS_setfsgid, SYS_setgroups;
        Allow, "signals":
            SYS_rt_sigaction, SYS_rt_sigprocmask, SYS_rt_sigreturn, SYS_rt_sigpending, SYS_rt_sigsuspend,
            SYS_rt_sigtimedwait, SYS_rt_sigqueueinfo, SYS_rt_tgsigqueueinfo, SYS_sigaltstack,
            SYS_signalfd, SYS_signalfd4, SYS_pause, SYS_alarm;
        Allow, "clocks, sleeping and timers":
            SYS_nanosleep, SYS_clock_nanosleep, SYS_clock_gettime, SYS_clock_getres, SYS_gettimeofday,
            SYS_time, SYS_getitimer, SYS_setitimer, SYS_timer_create, SYS_timer_settime, SYS_timer_gettime,
            SYS_timer_getoverrun, SYS_timer_delete, SYS_timerfd_create, SYS_timerfd_settime,
            SYS_timerfd_gettime;
        Allow, "waiting for events":
            SYS_poll, SYS_ppoll, SYS_select, SYS_pselect6, SYS_epoll_create, SYS_epoll_create1,
            SYS_epoll_ctl, SYS_epoll_wait, SYS_epoll_pwait, SYS_epoll_pwait2, SYS_eventfd, SYS_eventfd2;
        Allow, "socket operations, bounded by the network namespace and the egress proxy":
            SYS_bind, SYS_connect, SYS_listen, SYS_accept, SYS_accept4, SYS_getsockname, SYS_getpeername,
            SYS_sendto, SYS_recvfrom, SYS_sendmsg, SYS_recvmsg, SYS_sendmmsg, SYS_recvmmsg, SYS_shutdown,
            SYS_setsockopt, SYS_getsockopt;
        Allow, "System V and POSIX IPC, bounded by the IPC namespace":
            SYS_msgget, SYS_msgsnd, SYS_msgrcv, SYS_msgctl, SYS_semget, SYS_semop, SYS_semtimedop,
            SYS_semctl, SYS_shmget, SYS_shmat, SYS_shmdt, SYS_shmctl, SYS_mq_open, SYS_mq_unlink,
            SYS_mq_timedsend, SYS_mq_timedreceive, SYS_mq_notify, SYS_mq_getsetattr;
        Allow, "system information, from the UTS namespace":
            SYS_uname, SYS_sysinfo, SYS_getrandom;

        AllowUnlessArgMasked { arg: 0, mask: namespaces, errno: EPERM },
        "new processes and threads, but no new namespaces": SYS_clone;
        Errno(ENOSYS), "clone3's flags are in memory BPF cannot read; ENOSYS makes libc fall back to clone":
            SYS_clone3;
        AllowIfArgEquals { arg: 1, values: allowed_ioctls(), errno: IOCTL_REFUSED_ERRNO },
        "device control: only the requests of the ioctl allowlist (ioctls.rs, a reason per group); \
         the rest, btrfs subvolume requests and TIOCSTI included, fail as not supported": SYS_ioctl;
        AllowIfArgEquals { arg: 0, values: personalities.to_vec(), errno: EPERM },
        "execution domains: no ADDR_NO_RANDOMIZE or other flags weakening hardening": SYS_personality;
        AllowIfArgEquals { arg: 0, values: families.to_vec(), errno: EAFNOSUPPORT },
        "only UNIX, IPv4, IPv6 and netlink sockets": SYS_socket, SYS_socketpair;

        Errno(ENOSYS), "kernel AIO: io_setup reserves events from the host-wide fs.aio-max-nr budget, \
         which no cgroup bounds (one call can take all of it from every other tenant); ENOSYS is \
         what a kernel without AIO answers, so libaio users fall back to threads":
            SYS_io_setup, SYS_io_destroy, SYS_io_submit, SYS_io_cancel, SYS_io_getevents,
            SYS_io_pgetevents;
        Errno(EPERM), "io_uring escapes seccomp and has been a rich source of kernel bugs":
            SYS_io_uring_setup, SYS_io_uring_enter, SYS_io_uring_register;
        Errno(EPERM), "kernel attack surface with no use in a sandbox":
            SYS_userfaultfd, SYS_bpf, SYS_perf_event_open, SYS_lookup_dcookie, SYS_nfsservctl,
            SYS_modify_ldt;
        Errno(EPERM), "kernel keyrings are not namespaced": SYS_keyctl, SYS_add_key, SYS_request_key;
        Errno(EPERM), "loading or replacing kernel code":
            SYS_kexec_load, SYS_kexec_file_load, SYS_init_module, SYS_finit_module, SYS_delete_module;
        Errno(EPERM), "file handles bypass path-based confinement (the \"shocker\" escape)":
            SYS_open_by_handle_at, SYS_name_to_handle_at;
        Errno(EPERM), "changing the mount tree or the root would undo the sandbox's file system view":
            SYS_mount, SYS_umount2, SYS_pivot_root, SYS_chroot, SYS_move_mount, SYS_open_tree,
            SYS_open_tree_attr, SYS_fsopen, SYS_fsmount, SYS_fsconfig, SYS_fspick, SYS_mount_setattr;
        Errno(EPERM), "new or other namespaces would undo the sandbox's isolation": SYS_unshare, SYS_setns;
        Errno(EPERM), "host-wide administration":
            SYS_swapon, SYS_swapoff, SYS_reboot, SYS_acct, SYS_quotactl, SYS_quotactl_fd, SYS_syslog,
            SYS_sethostname, SYS_setdomainname;
        Errno(EPERM), "direct access to hardware I/O ports": SYS_iopl, SYS_ioperm;
        Errno(EPERM), "the clock is shared with the host":
            SYS_clock_settime, SYS_settimeofday, SYS_adjtimex, SYS_clock_adjtime;
    };
    SeccompPolicy {
        default_errno: ENOSYS,
        rules,
    }
}

//! The `ioctl` allowlist: the request numbers a sandbox may pass to `ioctl(2)`, in groups with a
//! reason each. Every other request fails with [`IOCTL_REFUSED_ERRNO`] before reaching a driver.
//!
//! Why an allowlist: `ioctl` is the door to every driver and file system's private interface. A
//! denylist missed the btrfs ones (subvolume create and snapshot, which let a workload make copies
//! of read-only mounts, escape its disk quota and leave the host undeletable storage; subvolume
//! search and info, which disclose pool-internal ids and names), and would miss the next file
//! system's or driver's too. What ordinary programs need is small and stable: terminals, a few
//! generic file and socket requests, read-only interface queries, file flags and extents, reflinks.
//!
//! Why `ENOTTY`: it is what the kernel itself answers for a request the file does not implement
//! ("inappropriate ioctl for device"), so programs already treat it as "not supported here" and fall
//! back (a terminal request on a pipe, a modem request on a pseudo-terminal, `cp --reflink=auto` on a
//! file system without reflinks). `EPERM` would read as "you may not, retry as root" to some.
//!
//! Request numbers are those of x86_64 (`asm-generic/ioctls.h`, `linux/fs.h`, `linux/sockios.h`),
//! built with the header's own `_IO`/`_IOR`/`_IOW`/`_IOWR` encoding where the header uses it. The
//! kernel compares requests as `unsigned int`, so only their low 32 bits matter (see
//! [`RuleAction::AllowIfArgEquals`](paddock_sys::seccomp::RuleAction::AllowIfArgEquals)).
//!
//! What this list does not hold, on purpose: `TIOCSTI` (inject input into a terminal), `TIOCLINUX`
//! (console control), `TIOCCONS` (redirect the console), `TIOCSETD` (line disciplines: module
//! autoload and a history of kernel bugs), `TIOCVHANGUP`, `TIOCSLCKTRMIOS`, every serial and modem
//! control request, every btrfs request but the generic reflink ones (`FICLONE`, `FICLONERANGE`,
//! `FIDEDUPERANGE` share btrfs's magic 0x94), `FS_IOC_GETFSLABEL`/`GETFSUUID`/`GETFSSYSFSPATH` (they
//! name the pool), fs-verity and encryption requests, `FIFREEZE`/`FITHAW`/`FITRIM`/`FIBMAP`, nsfs and
//! pidfd requests, socket requests that change an interface or name its namespace (`SIOCS*`,
//! `SIOCGSKNS`), and anything for devices a sandbox does not have.

/// The errno of a request not on the list.
pub const IOCTL_REFUSED_ERRNO: u32 = libc::ENOTTY as u32;

/// One request number and its name in the kernel headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoctlCommand {
    /// The name in the kernel headers.
    pub name: &'static str,
    /// The request number (x86_64).
    pub nr: u32,
}

/// Request numbers allowed for one reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoctlGroup {
    /// Why a sandbox may use them.
    pub reason: &'static str,
    /// The requests.
    pub commands: &'static [IoctlCommand],
}

/// `_IOC_NONE`, `_IOC_WRITE`, `_IOC_READ` (`asm-generic/ioctl.h`).
const NONE: u32 = 0;
const WRITE: u32 = 1;
const READ: u32 = 2;

/// `_IOC(dir, type, nr, size)`.
const fn ioc(dir: u32, kind: u8, nr: u8, size: usize) -> u32 {
    dir << 30 | (size as u32) << 16 | (kind as u32) << 8 | nr as u32
}

const fn io(kind: u8, nr: u8) -> u32 {
    ioc(NONE, kind, nr, 0)
}

const fn ior(kind: u8, nr: u8, size: usize) -> u32 {
    ioc(READ, kind, nr, size)
}

const fn iow(kind: u8, nr: u8, size: usize) -> u32 {
    ioc(WRITE, kind, nr, size)
}

const fn iowr(kind: u8, nr: u8, size: usize) -> u32 {
    ioc(READ | WRITE, kind, nr, size)
}

/// Sizes of the argument structures the encoded requests name.
const INT: usize = 4;
const LONG: usize = 8;
/// `struct termios2`.
const TERMIOS2: usize = 44;
/// `struct fiemap` (without its extents).
const FIEMAP: usize = 32;
/// `struct fsxattr`.
const FSXATTR: usize = 28;
/// `struct file_clone_range`.
const FILE_CLONE_RANGE: usize = 32;
/// `struct file_dedupe_range` (without its entries).
const FILE_DEDUPE_RANGE: usize = 24;
/// `struct __kernel_timespec`/`__kernel_sock_timeval`'s 64-bit layout (`long long[2]`).
const TIMESTAMP64: usize = 16;

macro_rules! commands {
    ($($name:ident = $nr:expr),+ $(,)?) => {
        &[$(IoctlCommand { name: stringify!($name), nr: $nr }),+]
    };
}

/// The allowlist. [`allowed_ioctls`] flattens it for the policy.
pub const IOCTL_ALLOWLIST: &[IoctlGroup] = &[
    IoctlGroup {
        reason: "terminal settings, job control and window size, on the terminals and pseudo-terminals a \
                 sandbox has (shells, editors, pagers, readline, tcsetattr, isatty)",
        commands: commands![
            TCGETS = 0x5401,
            TCSETS = 0x5402,
            TCSETSW = 0x5403,
            TCSETSF = 0x5404,
            TCGETA = 0x5405,
            TCSETA = 0x5406,
            TCSETAW = 0x5407,
            TCSETAF = 0x5408,
            TCSBRK = 0x5409,
            TCXONC = 0x540a,
            TCFLSH = 0x540b,
            TIOCEXCL = 0x540c,
            TIOCNXCL = 0x540d,
            TIOCSCTTY = 0x540e,
            TIOCGPGRP = 0x540f,
            TIOCSPGRP = 0x5410,
            TIOCOUTQ = 0x5411,
            TIOCGWINSZ = 0x5413,
            TIOCSWINSZ = 0x5414,
            TIOCNOTTY = 0x5422,
            TIOCGETD = 0x5424,
            TCSBRKP = 0x5425,
            TIOCSBRK = 0x5427,
            TIOCCBRK = 0x5428,
            TIOCGSID = 0x5429,
            TCGETS2 = ior(b'T', 0x2a, TERMIOS2),
            TCSETS2 = iow(b'T', 0x2b, TERMIOS2),
            TCSETSW2 = iow(b'T', 0x2c, TERMIOS2),
            TCSETSF2 = iow(b'T', 0x2d, TERMIOS2),
            TIOCGDEV = ior(b'T', 0x32, INT),
            TIOCGEXCL = ior(b'T', 0x40, INT),
        ],
    },
    IoctlGroup {
        reason: "pseudo-terminal pairs, for the agent's PTY sessions and for programs that make their \
                 own (openpty, script, tmux, pexpect): packet mode, the peer, its number and lock, \
                 signalling its foreground group",
        commands: commands![
            TIOCPKT = 0x5420,
            TIOCGPTN = ior(b'T', 0x30, INT),
            TIOCSPTLCK = iow(b'T', 0x31, INT),
            TIOCSIG = iow(b'T', 0x36, INT),
            TIOCGPKT = ior(b'T', 0x38, INT),
            TIOCGPTLCK = ior(b'T', 0x39, INT),
            TIOCGPTPEER = io(b'T', 0x41),
        ],
    },
    IoctlGroup {
        reason: "generic descriptor requests, the same as fcntl's (Python, libuv and Rust's std set \
                 non-blocking and close-on-exec this way): bytes readable, non-blocking, async, \
                 close-on-exec, owner for SIGIO, size",
        commands: commands![
            FIONREAD = 0x541b,
            FIONBIO = 0x5421,
            FIONCLEX = 0x5450,
            FIOCLEX = 0x5451,
            FIOASYNC = 0x5452,
            FIOQSIZE = 0x5460,
            FIOSETOWN = 0x8901,
            SIOCSPGRP = 0x8902,
            FIOGETOWN = 0x8903,
            SIOCGPGRP = 0x8904,
        ],
    },
    IoctlGroup {
        reason: "socket state of the caller's own sockets: out-of-band mark, receive timestamps, \
                 unsent bytes",
        commands: commands![
            SIOCATMARK = 0x8905,
            SIOCGSTAMP_OLD = 0x8906,
            SIOCGSTAMPNS_OLD = 0x8907,
            SIOCGSTAMP_NEW = ior(0x89, 6, TIMESTAMP64),
            SIOCGSTAMPNS_NEW = ior(0x89, 7, TIMESTAMP64),
            SIOCOUTQNSD = 0x894b,
        ],
    },
    IoctlGroup {
        reason: "read-only queries of the sandbox's own network interfaces (if_nametoindex, ifconfig, \
                 Java's NetworkInterface, psutil); ethtool requests that change a device need \
                 CAP_NET_ADMIN over the network namespace, which no sandbox process has",
        commands: commands![
            SIOCGIFNAME = 0x8910,
            SIOCGIFCONF = 0x8912,
            SIOCGIFFLAGS = 0x8913,
            SIOCGIFADDR = 0x8915,
            SIOCGIFDSTADDR = 0x8917,
            SIOCGIFBRDADDR = 0x8919,
            SIOCGIFNETMASK = 0x891b,
            SIOCGIFMETRIC = 0x891d,
            SIOCGIFMTU = 0x8921,
            SIOCGIFHWADDR = 0x8927,
            SIOCGIFINDEX = 0x8933,
            SIOCGIFPFLAGS = 0x8935,
            SIOCGIFCOUNT = 0x8938,
            SIOCGIFTXQLEN = 0x8942,
            SIOCETHTOOL = 0x8946,
            SIOCGIFMAP = 0x8970,
        ],
    },
    IoctlGroup {
        reason: "file attributes and layout of the sandbox's own files (chattr/lsattr, filefrag): \
                 the flags that matter (immutable, append-only) need CAP_LINUX_IMMUTABLE, which no \
                 sandbox process has, and a project id can only change from the host",
        commands: commands![
            FIGETBSZ = io(0x00, 2),
            FS_IOC_GETFLAGS = ior(b'f', 1, LONG),
            FS_IOC_SETFLAGS = iow(b'f', 2, LONG),
            FS_IOC_FIEMAP = iowr(b'f', 11, FIEMAP),
            FS_IOC_GETVERSION = ior(b'v', 1, LONG),
            FS_IOC_FSGETXATTR = ior(b'X', 31, FSXATTR),
            FS_IOC_FSSETXATTR = iow(b'X', 32, FSXATTR),
        ],
    },
    IoctlGroup {
        reason: "reflink copies and deduplication between files the caller can already read and write \
                 on one mount (cp --reflink, libuv's copyfile): what copy_file_range, which is \
                 allowed, already does on btrfs. These share btrfs's magic 0x94; no other btrfs \
                 request is allowed",
        commands: commands![
            FICLONE = iow(0x94, 9, INT),
            FICLONERANGE = iow(0x94, 13, FILE_CLONE_RANGE),
            FIDEDUPERANGE = iowr(0x94, 54, FILE_DEDUPE_RANGE),
        ],
    },
    IoctlGroup {
        reason: "the entropy count of /dev/random (a read)",
        commands: commands![RNDGETENTCNT = ior(b'R', 0, INT)],
    },
];

/// Every allowed request number, in list order.
pub fn allowed_ioctls() -> Vec<u64> {
    IOCTL_ALLOWLIST
        .iter()
        .flat_map(|group| group.commands)
        .map(|command| u64::from(command.nr))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Where libc has a constant, it agrees with the table (a check of the encoding helpers too).
    #[test]
    fn numbers_match_libc() {
        let libc_values: [(&str, u64); 22] = [
            ("TCGETS", libc::TCGETS),
            ("TCSETSF", libc::TCSETSF),
            ("TIOCSCTTY", libc::TIOCSCTTY),
            ("TIOCSPGRP", libc::TIOCSPGRP),
            ("TIOCGWINSZ", libc::TIOCGWINSZ),
            ("TIOCSWINSZ", libc::TIOCSWINSZ),
            ("TIOCGSID", libc::TIOCGSID),
            ("TCGETS2", libc::TCGETS2),
            ("TCSETSF2", libc::TCSETSF2),
            ("TIOCGPTN", libc::TIOCGPTN),
            ("TIOCSPTLCK", libc::TIOCSPTLCK),
            ("TIOCGPTPEER", libc::TIOCGPTPEER),
            ("TIOCSIG", libc::TIOCSIG),
            ("TIOCGEXCL", libc::TIOCGEXCL),
            ("FIONREAD", libc::FIONREAD),
            ("FIONBIO", libc::FIONBIO),
            ("FIOCLEX", libc::FIOCLEX),
            ("FS_IOC_GETFLAGS", libc::FS_IOC_GETFLAGS),
            ("FS_IOC_SETFLAGS", libc::FS_IOC_SETFLAGS),
            ("FS_IOC_GETVERSION", libc::FS_IOC_GETVERSION),
            ("FICLONE", libc::FICLONE),
            ("FICLONERANGE", libc::FICLONERANGE),
        ];
        let by_name = |name: &str| {
            let found = IOCTL_ALLOWLIST
                .iter()
                .flat_map(|group| group.commands)
                .find(|command| command.name == name);
            found.unwrap_or_else(|| panic!("{name} is not in the list")).nr
        };
        for (name, value) in libc_values {
            assert_eq!(u64::from(by_name(name)), value & 0xffff_ffff, "{name}");
        }
        assert_eq!(by_name("SIOCGIFINDEX"), libc::SIOCGIFINDEX as u32);
        assert_eq!(by_name("SIOCETHTOOL"), libc::SIOCETHTOOL as u32);
    }

    #[test]
    fn list_is_well_formed() {
        let mut names = BTreeSet::new();
        let mut numbers = BTreeSet::new();
        for group in IOCTL_ALLOWLIST {
            assert!(!group.reason.is_empty() && !group.commands.is_empty());
            for command in group.commands {
                assert!(names.insert(command.name), "{} listed twice", command.name);
                assert!(numbers.insert(command.nr), "{} repeats a number", command.name);
            }
        }
        assert_eq!(allowed_ioctls().len(), numbers.len());
    }

    /// The requests that let a workload reach outside its sandbox or its own files stay out.
    #[test]
    fn refused_requests_are_not_listed() {
        let allowed: BTreeSet<u64> = allowed_ioctls().into_iter().collect();
        let refused = [
            ("TIOCSTI", libc::TIOCSTI),
            ("TIOCLINUX", libc::TIOCLINUX),
            ("TIOCCONS", libc::TIOCCONS),
            ("TIOCSETD", libc::TIOCSETD),
            ("TIOCVHANGUP", libc::TIOCVHANGUP),
            ("TIOCSSERIAL", libc::TIOCSSERIAL),
            ("TIOCMSET", libc::TIOCMSET),
            ("FIFREEZE", u64::from(iowr(b'X', 119, INT))),
            ("FITRIM", u64::from(iowr(b'X', 121, 24))),
            ("FIBMAP", u64::from(io(0x00, 1))),
            ("FS_IOC_GETFSUUID", u64::from(ior(0x15, 0, 17))),
            ("NS_GET_USERNS", u64::from(io(0xb7, 0x1))),
            ("SIOCSIFFLAGS", libc::SIOCSIFFLAGS),
            ("SIOCGSKNS", 0x894c),
        ];
        for (name, nr) in refused {
            assert!(
                !allowed.contains(&(nr & 0xffff_ffff)),
                "{name} must not be allowed"
            );
        }
        // Every btrfs request (magic 0x94) but the three generic reflink ones, whatever its
        // direction and size: subvolume create/snapshot/delete, search, info, label, quota, send...
        let reflink = [libc::FICLONE, libc::FICLONERANGE, u64::from(iowr(0x94, 54, 24))];
        for &nr in &allowed {
            if (nr >> 8) & 0xff == 0x94 {
                assert!(reflink.contains(&nr), "btrfs request {nr:#x} must not be allowed");
            }
        }
    }
}

#![expect(
    unsafe_code,
    reason = "paddock-sys is the one crate that wraps raw syscalls behind safe functions"
)]
//! The only paddock crate with `unsafe`: thin, safe wrappers over the Linux system calls paddock needs
//! (namespaces, mounts, pivot_root, seccomp, Landlock, capabilities, PTYs, btrfs ioctls, FIEMAP, openat2).
//!
//! Every function returns `io::Result` (or a typed error) and says in its docs which syscall it makes.
//! Policy does not live here: callers pass already-decided data (a seccomp policy, a list of writable
//! paths) and this crate only installs it.

pub mod btrfs;
pub mod caps;
#[cfg(test)]
mod child_test;
pub mod exec;
pub mod fiemap;
pub mod fs_in_root;
pub mod inherited;
pub mod landlock;
pub mod mount;
pub mod namespace;
pub mod pty;
pub mod reap;
pub mod seccomp;
pub mod signal;

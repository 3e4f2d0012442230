//! File operations confined to the sandbox root (see `paddock_sys::fs_in_root`): every path is
//! resolved by the kernel inside the root, relative paths start at the default user's home, and
//! failures carry the path and a stable error code.
//!
//! They run inline on the agent's single thread: each is a handful of system calls on local files
//! (reads are capped at 1 MiB per request), and staying single-threaded keeps `fork` in
//! `paddock_sys::reap` simple and the agent small.

pub(crate) mod list_dir;
pub(crate) mod mkdir;
pub(crate) mod path;
pub(crate) mod prefetch;
pub(crate) mod read_file;
pub(crate) mod remove;
pub(crate) mod rename;
pub(crate) mod stat;
pub(crate) mod symlink;
pub(crate) mod write_file;

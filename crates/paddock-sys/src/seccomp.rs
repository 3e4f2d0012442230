//! seccomp

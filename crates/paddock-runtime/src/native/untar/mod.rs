//! What unpacking an untrusted tar stream into a directory tree takes, shared by snapshot import
//! (`transfer/import/`) and image layers (`image/layer.rs`): checked member names
//! ([`member_path`]), the counted and capped input the tar crate reads ([`input`]), and the
//! descriptor-relative walk to a member's directory that never follows a symlink ([`dirs`]).
//!
//! This module does not decide what a member means (a duplicate, a whiteout, a replacement), which
//! types are allowed, or which error a refusal becomes: each unpacker does.

pub(crate) mod dirs;
pub(crate) mod input;
pub(crate) mod member_path;

/// Bytes copied at a time.
pub(crate) const CHUNK: usize = 64 * 1024;

//! The host uid/gid range sandbox ids map to.

use serde::{Deserialize, Serialize};

/// Sandbox uids and gids `0..count` map to host ids `base..base+count`: sandbox root (0) and `user`
/// (1000) are unprivileged, unnamed host ids, never host root. All sandboxes share the range, so a file
/// owned by `user` stays owned by `user` when a sandbox's storage is snapshotted or forked; the PID,
/// mount and network namespaces keep sandboxes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdRange {
    /// First host id.
    pub base: u32,
    /// Number of ids.
    pub count: u32,
}

impl IdRange {
    /// The default: 65536 ids starting at host uid 1,000,000,000 (far above ordinary users and
    /// systemd's dynamic ranges).
    pub const DEFAULT: Self = Self {
        base: 1_000_000_000,
        count: 65_536,
    };

    /// Host uid of sandbox uid `uid`.
    pub fn host_uid(self, uid: u32) -> u32 {
        self.base + uid
    }

    /// Host gid of sandbox gid `gid`.
    pub fn host_gid(self, gid: u32) -> u32 {
        self.base + gid
    }
}

//! Named volumes: persistent storage that outlives sandboxes and is mounted into several at once.
//!
//! A volume is shared, never copied: every sandbox mounting it (forks of a sandbox included) sees the
//! same files. Snapshots, rollbacks and diffs cover a sandbox's own file system only, never its
//! volumes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::ByteSize;

/// `POST /v1/volumes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeRequest {
    /// Its name, unique among the tenant's volumes: 1-63 characters of `A-Z a-z 0-9 . _ -`, starting
    /// with a letter or digit, not with `vol-`.
    pub name: String,
    /// The most bytes it may hold (writes beyond fail with `EDQUOT`); unlimited when absent (the
    /// storage pool's size still caps it).
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "1G")]
    pub size: Option<ByteSize>,
    /// Free-form labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// A named volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VolumeInfo {
    /// Its id (`vol-` and 16 hex digits).
    pub id: String,
    /// Its name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Its size limit in bytes, if any.
    #[serde(default)]
    pub size_bytes: Option<u64>,
    /// Bytes it holds (as of the storage pool's last commit, a few seconds behind at most), when
    /// known.
    #[serde(default)]
    pub used_bytes: Option<u64>,
    /// Live sandboxes that mount it.
    pub mounted_by: Vec<String>,
    /// When it was created (RFC 3339).
    pub created_at: String,
}

/// `GET /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VolumeList {
    /// The volumes, in id order.
    pub volumes: Vec<VolumeInfo>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `GET /v1/volumes` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListVolumesQuery {
    /// Page size (1-1000, default 100).
    #[serde(default)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[serde(default, deserialize_with = "super::cursor::deserialize_cursor")]
    pub cursor: Option<String>,
}

/// A volume to mount into a new sandbox (`CreateSandboxRequest.volumes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMountRequest {
    /// The volume's name or id.
    pub volume: String,
    /// Absolute path in the sandbox, e.g. `/data` or `/home/user/data`; not `/`, not in `/proc`,
    /// `/sys`, `/dev`, `/etc` or the system directories, not `/home`, `/root` or `/tmp` themselves,
    /// and not overlapping another volume's path.
    pub path: String,
    /// Mount it read-only (writes fail with `EROFS`).
    #[serde(default)]
    pub read_only: bool,
}

/// A volume a sandbox mounts (`SandboxInfo.volumes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VolumeMountInfo {
    /// The volume's id.
    pub volume: String,
    /// Where it is mounted.
    pub path: String,
    /// Mounted read-only.
    pub read_only: bool,
}

//! Named volumes in the storage pool: `<pool>/volumes/<vol-id>`, one writable subvolume each, with an
//! optional size limit (its simple-quota group's limit, so writes beyond it fail with `EDQUOT`).
//!
//! A volume belongs to no sandbox: sandboxes bind it in (`setup/plan.rs`), gc of sandboxes never
//! touches it, and only an explicit delete (or the control plane's gc of volumes it has no record
//! of) removes it. Its root directory belongs to the sandbox's default user (uid 1000 inside), so
//! that user can write to it.

use std::fs;
use std::io;
use std::os::unix::fs::{chown, DirBuilderExt, PermissionsExt};
use std::path::PathBuf;

use paddock_sys::btrfs;
use paddock_types::{ByteSize, VolumeId};

use super::pool::{pool_err, StoragePool};
use crate::{RuntimeError, VolumeUsage};

/// The uid and gid of the sandbox's default user, inside the sandbox.
const DEFAULT_USER_ID: u32 = 1000;

impl StoragePool {
    fn named_volumes_dir(&self) -> PathBuf {
        self.root().join("volumes")
    }

    /// Path of a named volume's subvolume.
    pub fn named_volume_path(&self, volume: &VolumeId) -> PathBuf {
        self.named_volumes_dir().join(volume.as_str())
    }

    /// The path of `volume`, which must exist ([`RuntimeError::InvalidSpec`] otherwise).
    pub fn existing_named_volume(&self, volume: &VolumeId) -> Result<PathBuf, RuntimeError> {
        let path = self.named_volume_path(volume);
        if path.is_dir() {
            Ok(path)
        } else {
            Err(RuntimeError::InvalidSpec(format!(
                "volume {volume} does not exist"
            )))
        }
    }

    /// Creates `volume`: an empty subvolume owned by the sandbox's default user, limited to `size`
    /// bytes when given.
    pub fn create_named_volume(&self, volume: &VolumeId, size: Option<ByteSize>) -> Result<(), RuntimeError> {
        let dir = self.named_volumes_dir();
        // Pools made before volumes existed have no `volumes/`. Like `sandboxes/`, it is searchable by
        // the sandbox root group only: each sandbox's init binds volumes in as that unprivileged uid.
        match fs::DirBuilder::new().mode(0o710).create(&dir) {
            Ok(()) => {
                chown(&dir, None, Some(self.ids().host_gid(0))).map_err(pool_err("chown", &dir))?;
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o710))
                    .map_err(pool_err("chmod", &dir))?;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(pool_err("create", &dir)(e)),
        }
        let path = self.named_volume_path(volume);
        match btrfs::create_subvolume(&dir, volume.as_str()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(RuntimeError::InvalidSpec(format!(
                    "volume {volume} already exists"
                )))
            }
            Err(e) => return Err(pool_err("create subvolume", &path)(e)),
        }
        let prepared = (|| {
            let (uid, gid) = (
                self.ids().host_uid(DEFAULT_USER_ID),
                self.ids().host_gid(DEFAULT_USER_ID),
            );
            chown(&path, Some(uid), Some(gid)).map_err(pool_err("chown", &path))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
                .map_err(pool_err("chmod", &path))?;
            if size.is_some() {
                let limit = btrfs::QgroupLimit {
                    max_exclusive: None,
                    max_referenced: size.map(ByteSize::as_u64),
                };
                btrfs::set_qgroup_limit(&path, limit).map_err(pool_err("set the size limit on", &path))?;
            }
            Ok(())
        })();
        if prepared.is_err() {
            let _ = self.delete_named_volume(volume);
        }
        prepared
    }

    /// What `volume` holds and its limit.
    pub fn named_volume_usage(&self, volume: &VolumeId) -> Result<VolumeUsage, RuntimeError> {
        self.subvolume_usage(&self.named_volume_path(volume))
    }

    /// Deletes `volume` and its qgroup, freeing its storage; false if it did not exist.
    pub fn delete_named_volume(&self, volume: &VolumeId) -> Result<bool, RuntimeError> {
        let dir = self.named_volumes_dir();
        let path = self.named_volume_path(volume);
        let subvol_id = match btrfs::subvolume_id(&path) {
            Ok(id) => id,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(pool_err("inspect", &path)(e)),
        };
        match btrfs::delete_subvolume(&dir, volume.as_str()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(pool_err("delete subvolume", &path)(e)),
        }
        // As for sandboxes: the kernel drops the qgroup once the subvolume's extents are cleaned.
        let _ = btrfs::remove_qgroup(self.root(), subvol_id);
        Ok(true)
    }

    /// Ids of every named volume present (names that are not volume ids are skipped).
    pub fn list_named_volumes(&self) -> Result<Vec<VolumeId>, RuntimeError> {
        let dir = self.named_volumes_dir();
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(pool_err("read", &dir)(e)),
        };
        let mut ids: Vec<VolumeId> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
            .collect();
        ids.sort();
        Ok(ids)
    }
}

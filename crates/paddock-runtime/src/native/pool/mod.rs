//! The storage pool: a btrfs file system holding one subvolume per sandbox.
//!
//! Layout under the pool root (see ARCHITECTURE.md):
//!
//! ```text
//! <pool>/templates/host      template: etc/, home/user/, root/, tmp/  (snapshot source)
//! <pool>/sandboxes/<id>/volume one per sandbox, with a qgroup limit: a writable snapshot of the
//!                            template, or of a snapshot (a fork; a rollback), in a directory of its
//!                            own (`place.rs`; an older paddock's are `sandboxes/<id>` itself)
//! <pool>/snapshots/<id>      read-only snapshots of sandboxes/<id> (`sn-...`), owned by nobody but the
//!                            caller that took them: gc never touches them, `pool destroy` removes them
//! <pool>/sandboxes/<id>.next/volume the volume of a sandbox prepared for a rollback of <id>
//!                            (rollback.rs)
//! <pool>/incoming/<id>/      what an older paddock's interrupted create left (`incoming.rs`)
//! <pool>/trash/<name>        subvolumes being deleted off the caller's path (a rolled-back volume)
//! <pool>/stopped/<id>        a stopped sandbox's subvolume (no processes; resumable); its owner is the
//!                            control plane's record, not a run directory, so gc leaves it alone
//! <pool>/imports/<id>        an imported snapshot being unpacked (`transfer/staging.rs`)
//! <pool>/images/<tp-id>     image templates (read-only, `native/template/`): a sandbox's volume is
//!                            a writable snapshot of the whole tree
//! <pool>/layers/<key>        the layer cache: read-only trees of an image's first layers, keyed by
//!                            their digests' chain, shared by templates, removed when none uses them
//! <pool>/builds/<tp-id>      a template being built, owned by the holder of `<tp-id>.lock`
//! <pool>/volumes/<id>        named volumes (`vol-...`, named_volumes.rs), mounted into sandboxes; like
//!                            snapshots, owned by the caller, removed by `pool destroy`
//! ```
//!
//! When the state directory is not on btrfs, the pool is a sparse image file `<state>/pool.img`
//! formatted with `mkfs.btrfs` and loop-mounted at `<state>/pool`; its size caps what all sandboxes
//! together can write, so they can never fill the host disk. Simple quotas (squota) are enabled so each
//! sandbox's writes are charged to its own qgroup and limited there.
//!
//! Simple quotas charge an extent to the subvolume that wrote it, for as long as the extent exists.
//! Hence: a sandbox made from a snapshot (or rolled back to one) starts at zero usage, like one made
//! from the template; a snapshot's own qgroup counts only its root node (its usage is measured from
//! its files' extents instead, `snapshot_usage.rs`); and the bytes a snapshot keeps alive stay charged
//! to the sandbox that wrote them, also after it overwrote or deleted them (its disk limit counts them).

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{chown, symlink, DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use paddock_sys::btrfs;
use paddock_types::{ByteSize, RootfsSpec, SandboxId, SnapshotId, TemplateId, VolumeSource};

use super::lock::StateLock;
use super::staging::{self, Area};
use super::users::IdRange;
use crate::{RuntimeError, VolumeUsage};

mod incoming;
mod place;
mod spare;

pub use spare::{Made, SpareMaker};

/// Bumped when the template layout changes, so old templates are rebuilt.
const TEMPLATE_VERSION: u32 = 3;
const TEMPLATE_NAME: &str = "host";

/// Files and directories of the host's `/etc` a sandbox sees (copied into the template; symlinks stay
/// symlinks). Everything else of the host's `/etc` stays invisible.
const CURATED_ETC: &[&str] = &[
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "os-release",
    "debian_version",
    "nsswitch.conf",
    "mime.types",
    "bash.bashrc",
    "profile",
    "profile.d",
    "inputrc",
    "gai.conf",
    "protocols",
    "services",
    "host.conf",
    "locale.alias",
    "magic",
    "python3",
    "python3.11",
    "terminfo",
    // Debian's matplotlib reads its defaults here (code contexts draw figures with it).
    "matplotlibrc",
];

pub(super) fn pool_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> RuntimeError + 'a {
    move |source| RuntimeError::Pool {
        what,
        path: path.to_owned(),
        source,
    }
}

/// An opened storage pool.
#[derive(Debug, Clone)]
pub struct StoragePool {
    root: PathBuf,
    ids: IdRange,
    /// The pool file system's UUID, naming its `/sys/fs/btrfs/<uuid>/` (quota group usage).
    fs_uuid: String,
}

impl StoragePool {
    /// Opens the pool under `state_dir`, creating and mounting it on first use.
    pub fn open(state_dir: &Path, image_size: ByteSize, ids: IdRange) -> Result<Self, RuntimeError> {
        let root = state_dir.join("pool");
        let marker = root.join(".paddock-pool");
        if btrfs::is_btrfs(&root).unwrap_or(false) && marker.exists() {
            let pool = Self {
                fs_uuid: fs_uuid(&root)?,
                root: root.clone(),
                ids,
            };
            if pool.template_ready() {
                return Ok(pool);
            }
        }
        let _guard = StateLock::acquire(&state_dir.join("pool.lock"))?;
        if !btrfs::is_btrfs(&root).unwrap_or(false) {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&root)
                .map_err(pool_err("create", &root))?;
            if !btrfs::is_btrfs(&root).map_err(pool_err("inspect", &root))? {
                mount_image(state_dir, &root, image_size)?;
            }
        }
        if !marker.exists() {
            btrfs::enable_quota(&root, true).map_err(pool_err("enable simple quotas on", &root))?;
            for dir in ["templates", place::DIR, "snapshots"] {
                let d = root.join(dir);
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&d)
                    .map_err(pool_err("create", &d))?;
            }
            // A sandbox's init builds its root as the sandbox's root user (an unprivileged host uid) and
            // must reach its volume: the pool and `sandboxes/` are searchable by the sandbox root group
            // only (mode 0710), and by no other host user.
            for d in [root.clone(), root.join(place::DIR)] {
                searchable_by_sandbox_root(&d, ids)?;
            }
            fs::write(
                &marker,
                format!("{{\"layout\":1,\"template\":{TEMPLATE_VERSION}}}\n"),
            )
            .map_err(pool_err("write", &marker))?;
        }
        let pool = Self {
            fs_uuid: fs_uuid(&root)?,
            root,
            ids,
        };
        if !pool.template_ready() {
            pool.build_template()?;
        }
        Ok(pool)
    }

    /// The pool's mount point.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn template(&self) -> PathBuf {
        self.root.join("templates").join(TEMPLATE_NAME)
    }

    /// Whether the template is built, by this version's layout (an older one is built again).
    fn template_ready(&self) -> bool {
        let marker = self.template().join(".paddock-template");
        // Written by `build_template`; a few bytes, never a sandbox's (sandboxes get snapshots).
        let mut text = String::new();
        fs::File::open(&marker)
            .and_then(|f| io::Read::read_to_string(&mut io::Read::take(f, 16), &mut text))
            .is_ok_and(|_| text.trim() == TEMPLATE_VERSION.to_string())
    }

    /// Path of an image template's subvolume (which may not exist).
    pub fn image_path(&self, template: &TemplateId) -> PathBuf {
        self.root.join("images").join(template.as_str())
    }

    /// Path of an existing image template's subvolume, or [`RuntimeError::InvalidSpec`].
    pub fn existing_image(&self, template: &TemplateId) -> Result<PathBuf, RuntimeError> {
        let path = self.image_path(template);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => Ok(path),
            _ => Err(RuntimeError::InvalidSpec(format!(
                "template {template} does not exist"
            ))),
        }
    }

    /// `rootfs` with its host paths resolved.
    pub(super) fn rootfs(&self, rootfs: &RootfsSpec) -> super::setup::Rootfs {
        use super::setup::Rootfs;
        match rootfs {
            RootfsSpec::Host => Rootfs::Host,
            RootfsSpec::Dir { path } => Rootfs::Dir { path: path.clone() },
            RootfsSpec::Image { template } => Rootfs::Image {
                template: self.image_path(template),
            },
        }
    }

    /// Path of sandbox `id`'s subvolume (see `place.rs`: an older paddock's volume is elsewhere);
    /// where a volume made now goes if it has none.
    pub fn volume_path(&self, id: &str) -> PathBuf {
        place::volume_path(&self.root, id)
    }

    /// Where a volume made now for sandbox `id` goes ([`Self::create_volume`]), whatever is there now:
    /// the path to give a sandbox that gets a new volume.
    pub fn fresh_volume_path(&self, id: &str) -> PathBuf {
        place::fresh_path(&self.root, id)
    }

    /// Builds the template subvolume from the host's curated `/etc`.
    fn build_template(&self) -> Result<(), RuntimeError> {
        let templates = self.root.join("templates");
        let staging = format!("{TEMPLATE_NAME}.building");
        let staging_path = templates.join(&staging);
        if staging_path.exists() {
            btrfs::delete_subvolume(&templates, &staging).map_err(pool_err("delete", &staging_path))?;
        }
        btrfs::create_subvolume(&templates, &staging).map_err(pool_err("create subvolume", &staging_path))?;
        populate_template(&staging_path, self.ids)?;
        let done = staging_path.join(".paddock-template");
        fs::write(&done, TEMPLATE_VERSION.to_string()).map_err(pool_err("write", &done))?;
        let old = self.template();
        if !old.exists() {
            return fs::rename(&staging_path, &old).map_err(pool_err("rename", &staging_path));
        }
        // An older template is swapped for the new one in one step, so a creation beside this never
        // finds none; the old one, now under the staging name, goes after.
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            &staging_path,
            rustix::fs::CWD,
            &old,
            rustix::fs::RenameFlags::EXCHANGE,
        )
        .map_err(|e| pool_err("exchange", &staging_path)(e.into()))?;
        btrfs::delete_subvolume(&templates, &staging).map_err(pool_err("delete", &staging_path))
    }

    /// Creates sandbox `id`'s subvolume as a writable snapshot of the template (the host profile's,
    /// or the image template `rootfs` names) or of a snapshot, limited to `disk` bytes.
    pub fn create_volume(
        &self,
        id: &SandboxId,
        source: &VolumeSource,
        rootfs: &RootfsSpec,
        disk: Option<ByteSize>,
    ) -> Result<PathBuf, RuntimeError> {
        self.create_volume_as(id.as_str(), source, rootfs, disk)
    }

    /// [`Self::create_volume`] under another name than the sandbox's id (a sandbox prepared for a
    /// rollback, `<id>.next`).
    pub fn create_volume_as(
        &self,
        name: &str,
        source: &VolumeSource,
        rootfs: &RootfsSpec,
        disk: Option<ByteSize>,
    ) -> Result<PathBuf, RuntimeError> {
        let id = name;
        // What the `(VolumeSource::Template, _)` arm below snapshots.
        let host_template =
            matches!(source, VolumeSource::Template) && !matches!(rootfs, RootfsSpec::Image { .. });
        let source = match (source, rootfs) {
            (VolumeSource::Template, RootfsSpec::Image { template }) => self.existing_image(template)?,
            (VolumeSource::Template, _) => self.template(),
            (VolumeSource::Snapshot(snapshot), _) => self.existing_snapshot(snapshot)?,
            (VolumeSource::Sandbox(source), _) => self.existing_sandbox_volume(source)?,
            (VolumeSource::Stopped, _) => {
                let kept = self.stopped_path(id);
                let path = place::make(&self.root, self.ids, id, |volume| {
                    place::rename_to(&kept, volume, "move a stopped volume back from")
                })?;
                self.set_disk_limit(id, disk)?;
                return Ok(path);
            }
        };
        let mut claimed_spare = false;
        let path = place::make(&self.root, self.ids, id, |volume| {
            // A spare made ahead from the host template, renamed into place: no snapshot to wait for.
            claimed_spare = host_template && spare::claim(&self.root, &source, volume)?;
            if claimed_spare {
                return Ok(());
            }
            // The limit comes with the snapshot: set after it, in a transaction of its own, it waited
            // for whatever commit was under way (a fork's other copies' snapshots: 12 ms measured).
            place::snapshot_to(&source, volume, disk)
        })?;
        // A claimed spare was made without a limit.
        if disk.is_some() && claimed_spare {
            if let Err(e) = self.set_disk_limit(id, disk) {
                let _ = self.delete_volume(id);
                return Err(e);
            }
        }
        Ok(path)
    }

    /// What makes spare volumes of this pool's host template (see `spare.rs`), from any thread.
    pub fn spare_maker(&self) -> SpareMaker {
        SpareMaker {
            root: self.root.clone(),
            template: self.template(),
        }
    }

    /// The key of the current host template (its subvolume id): what was made from another is not
    /// of this template.
    pub(crate) fn template_key(&self) -> Result<String, RuntimeError> {
        spare::key(&self.template())
    }

    /// gc of spare volumes: those of an older template, extras, and what a dead maker left.
    pub fn collect_spares(&self) {
        spare::collect(&self.root, &self.template());
    }

    /// Sets (or with `None` removes) the disk limit of sandbox `id`'s subvolume: its quota group's
    /// referenced-bytes limit. A limit below what the sandbox holds already refuses its next writes.
    pub fn set_disk_limit(&self, id: &str, disk: Option<ByteSize>) -> Result<(), RuntimeError> {
        let path = self.volume_path(id);
        btrfs::set_qgroup_limit(&path, place::disk_limit(disk))
            .map_err(pool_err("set the disk limit on", &path))
    }

    /// What sandbox `id`'s subvolume holds and its limit.
    pub fn volume_usage(&self, id: &str) -> Result<VolumeUsage, RuntimeError> {
        self.subvolume_usage(&self.volume_path(id))
    }

    /// The host id range the pool's files are owned in.
    pub(super) fn ids(&self) -> IdRange {
        self.ids
    }

    /// What the subvolume at `path` holds and its limit (its quota group's figures).
    pub(super) fn subvolume_usage(&self, path: &Path) -> Result<VolumeUsage, RuntimeError> {
        let subvolume = btrfs::subvolume_id(path).map_err(pool_err("inspect", path))?;
        let usage = btrfs::qgroup_usage(&self.fs_uuid, subvolume)
            .map_err(pool_err("read the quota group of", path))?;
        Ok(VolumeUsage {
            bytes: usage.referenced,
            limit: usage.max_referenced,
        })
    }

    /// Deletes sandbox `id`'s subvolume, its directory and its qgroup, and what an older paddock's
    /// crashed create of it left in `incoming/`. A missing subvolume is not an error.
    pub fn delete_volume(&self, id: &str) -> Result<(), RuntimeError> {
        incoming::remove_leftovers(&self.root, id)?;
        if let Some(sid) = place::delete(&self.root, id)? {
            // The qgroup can only go once the kernel has dropped the subvolume's extents; a stale one is
            // harmless and removed by a later `paddock gc`.
            let _ = btrfs::remove_qgroup(&self.root, sid);
        }
        Ok(())
    }

    /// Makes sandbox `from`'s volume sandbox `to`'s (a rollback's prepared `<id>.next` becoming
    /// `<id>`): one rename, refused if `to` has a volume. Its qgroup and limit go with it.
    pub fn move_volume(&self, from: &str, to: &str) -> Result<(), RuntimeError> {
        let source = self.volume_path(from);
        place::make(&self.root, self.ids, to, |volume| {
            place::rename_to(&source, volume, "move a prepared volume into place")
        })?;
        crate::fault::point("rollback.prepared.volume_moved");
        place::remove_empty_dir(&self.root, from)
    }

    /// Moves sandbox `id`'s subvolume out of its place (into `trash/`, a rename: no transaction
    /// commit) and deletes it on a background thread, so that a new volume can take the name at once.
    /// Deleting a subvolume whose files are cached costs as long as evicting them (about 200 ms for
    /// 1 GB). A missing subvolume is not an error; what a crash leaves in `trash/`, gc deletes.
    pub fn retire_volume(&self, id: &str) -> Result<(), RuntimeError> {
        if !place::holds(&self.root, id) {
            return Ok(());
        }
        let trash = self.private_dir("trash")?;
        let name = format!("{id}.{}", now_nanos());
        if !place::take_out(&self.root, id, &trash.join(&name), "move to the trash")? {
            return Ok(());
        }
        let root = self.root.clone();
        let spawned = std::thread::Builder::new()
            .name("pool-trash".into())
            .spawn(move || delete_with_qgroup(&root, &trash, &name));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a thread to empty the trash; gc will");
        }
        Ok(())
    }

    /// Deletes everything in `trash/` (left by a crash, or still being deleted by a retire).
    pub fn empty_trash(&self) {
        let trash = self.root.join("trash");
        for entry in fs::read_dir(&trash).into_iter().flatten().flatten() {
            if let Some(name) = entry.file_name().to_str() {
                delete_with_qgroup(&self.root, &trash, name);
            }
        }
    }

    /// `<pool>/<name>`, created (mode 0700) if missing: pools made by an older paddock lack it.
    fn private_dir(&self, name: &str) -> Result<PathBuf, RuntimeError> {
        private_dir(&self.root.join(name))
    }

    /// Where a stopped sandbox's subvolume is kept: out of `sandboxes/`, whose entries without a live
    /// owner gc reclaims.
    pub fn stopped_path(&self, id: &str) -> PathBuf {
        self.root.join("stopped").join(id)
    }

    /// Moves sandbox `id`'s subvolume to `stopped/` (a rename; its qgroup and limit go with it).
    pub fn keep_stopped(&self, id: &str) -> Result<(), RuntimeError> {
        self.private_dir("stopped")?;
        if place::take_out(
            &self.root,
            id,
            &self.stopped_path(id),
            "move a stopped volume from",
        )? {
            return Ok(());
        }
        let path = self.volume_path(id);
        Err(pool_err("move a stopped volume from", &path)(io::Error::from(
            io::ErrorKind::NotFound,
        )))
    }

    /// Moves a volume (back) to `stopped/` unless it is there already: after a failed resume, or for
    /// a stop or resume a crash interrupted, so that it is not lost.
    pub fn return_stopped(&self, id: &str) -> Result<(), RuntimeError> {
        if self.stopped_path(id).exists() {
            return Ok(());
        }
        self.private_dir("stopped")?;
        place::take_out(
            &self.root,
            id,
            &self.stopped_path(id),
            "move a stopped volume back to",
        )
        .map(drop)
    }

    /// Deletes stopped sandbox `id`'s subvolume; false if there is none.
    pub fn delete_stopped(&self, id: &str) -> Result<bool, RuntimeError> {
        let path = self.stopped_path(id);
        if !path.exists() {
            return Ok(false);
        }
        let subvol_id = btrfs::subvolume_id(&path).ok();
        btrfs::delete_subvolume(&self.root.join("stopped"), id)
            .map_err(pool_err("delete subvolume", &path))?;
        if let Some(sid) = subvol_id {
            let _ = btrfs::remove_qgroup(&self.root, sid);
        }
        Ok(true)
    }

    /// Ids of every stopped sandbox's subvolume.
    pub fn list_stopped(&self) -> Vec<String> {
        names_in(&self.root.join("stopped"))
    }

    /// Path of a snapshot's subvolume.
    pub fn snapshot_path(&self, snapshot: &SnapshotId) -> PathBuf {
        self.root.join("snapshots").join(snapshot.as_str())
    }

    /// The path of `snapshot`, which must exist ([`RuntimeError::InvalidSpec`] otherwise).
    pub fn existing_snapshot(&self, snapshot: &SnapshotId) -> Result<PathBuf, RuntimeError> {
        let path = self.snapshot_path(snapshot);
        if path.is_dir() {
            Ok(path)
        } else {
            Err(RuntimeError::InvalidSpec(format!(
                "snapshot {snapshot} does not exist"
            )))
        }
    }

    /// The volume of sandbox `id` (what a fork's copy is snapshotted from), or `InvalidSpec` if it has
    /// none here.
    pub fn existing_sandbox_volume(&self, id: &SandboxId) -> Result<PathBuf, RuntimeError> {
        let path = self.volume_path(id.as_str());
        if path.is_dir() {
            Ok(path)
        } else {
            Err(RuntimeError::InvalidSpec(format!(
                "sandbox {id} has no file system to copy"
            )))
        }
    }

    /// Takes a read-only snapshot of sandbox `id`'s subvolume as `snapshots/<snapshot>` (one ioctl,
    /// which flushes the sandbox's dirty data and commits a transaction).
    pub fn create_snapshot(&self, id: &str, snapshot: &SnapshotId) -> Result<(), RuntimeError> {
        let source = self.volume_path(id);
        let path = self.snapshot_path(snapshot);
        match btrfs::snapshot_subvolume(&source, &self.root.join("snapshots"), snapshot.as_str(), true) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Err(RuntimeError::InvalidSpec(format!(
                "snapshot {snapshot} already exists"
            ))),
            Err(e) => Err(pool_err("snapshot a sandbox into", &path)(e)),
        }
    }

    /// Deletes a snapshot and its qgroup; false if it did not exist. Sandboxes made from it keep their
    /// content (their extents are shared, not borrowed).
    pub fn delete_snapshot(&self, snapshot: &SnapshotId) -> Result<bool, RuntimeError> {
        let parent = self.root.join("snapshots");
        let path = self.snapshot_path(snapshot);
        let subvol_id = match btrfs::subvolume_id(&path) {
            Ok(id) => id,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(pool_err("inspect", &path)(e)),
        };
        match btrfs::delete_subvolume(&parent, snapshot.as_str()) {
            Ok(()) => {}
            // Deleted concurrently.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(pool_err("delete subvolume", &path)(e)),
        }
        // As for volumes: the kernel drops the qgroup itself once the snapshot's extents are cleaned.
        let _ = btrfs::remove_qgroup(&self.root, subvol_id);
        Ok(true)
    }

    /// Ids of every snapshot present (names that are not snapshot ids are skipped).
    pub fn list_snapshots(&self) -> Result<Vec<SnapshotId>, RuntimeError> {
        let dir = self.root.join("snapshots");
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(pool_err("read", &dir)(e)),
        };
        let mut ids: Vec<SnapshotId> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Ids of every sandbox subvolume present, and of every sandbox whose create left something in
    /// `incoming/` (possibly twice).
    pub fn list_volumes(&self) -> Vec<String> {
        let mut ids = incoming::list(&self.root);
        ids.extend(place::list(&self.root));
        ids
    }

    /// Whether anything of sandbox `id`'s volume is in the pool: the volume, or what a crashed
    /// create of it left.
    pub fn holds_volume(&self, id: &str) -> bool {
        place::holds(&self.root, id) || incoming::has_leftovers(&self.root, id)
    }

    /// Deletes every snapshot and named volume, unmounts the pool and removes its image and state (refused while
    /// sandboxes exist).
    pub fn destroy(state_dir: &Path) -> Result<(), RuntimeError> {
        let root = state_dir.join("pool");
        let holds = |dir: &str| {
            fs::read_dir(root.join(dir))
                .map(|mut rd| rd.next().is_some())
                .unwrap_or(false)
        };
        if holds(place::DIR) || holds("stopped") || holds(incoming::DIR) {
            return Err(RuntimeError::InvalidConfig(format!(
                "the pool at {} still holds sandboxes (running or stopped); delete them or run `paddock gc` first",
                root.display()
            )));
        }
        // Deleted one by one rather than left to the image's removal: a pool on the state directory's
        // own btrfs has no image.
        if btrfs::is_btrfs(&root).unwrap_or(false) {
            // Spares being made are subvolumes one level down; the ready ones go with the rest.
            spare::delete_making(&root)?;
            for dir in ["snapshots", "trash", "volumes", "images", "layers", "spares"] {
                let dir = root.join(dir);
                for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let name = entry.file_name();
                    let Some(name) = name.to_str() else { continue };
                    match btrfs::delete_subvolume(&dir, name) {
                        // Deleted meanwhile by a background thread.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        other => other.map_err(pool_err("delete subvolume", &entry.path()))?,
                    }
                }
            }
            for area in [Area::Imports, Area::Builds] {
                staging::delete_all(&root, area).map_err(pool_err("delete staging subvolumes in", &root))?;
            }
        }
        let image = state_dir.join("pool.img");
        if image.exists() {
            if btrfs::is_btrfs(&root).unwrap_or(false) {
                paddock_sys::mount::unmount_detach(&root).map_err(pool_err("unmount", &root))?;
            }
            fs::remove_file(&image).map_err(pool_err("remove", &image))?;
            let _ = fs::remove_dir(&root);
        }
        super::run_mount::unmount_if_empty(state_dir)
    }
}

/// Gives `dir` to the sandbox root's host group, mode 0710 (set explicitly, whatever the umask): a
/// sandbox's init, which builds its root as that unprivileged user, can traverse it to reach its
/// volume; no other host user can.
fn searchable_by_sandbox_root(dir: &Path, ids: IdRange) -> Result<(), RuntimeError> {
    chown(dir, None, Some(ids.host_gid(0))).map_err(pool_err("chown", dir))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o710)).map_err(pool_err("chmod", dir))
}

/// The names in `dir` that are UTF-8 (none if it cannot be read).
fn names_in(dir: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect()
}

/// `dir`, created (mode 0700) if missing.
fn private_dir(dir: &Path) -> Result<PathBuf, RuntimeError> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(dir.to_owned()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(dir.to_owned()),
        Err(e) => Err(pool_err("create", dir)(e)),
    }
}

/// Deletes subvolume `parent/name` and its qgroup, logging (not returning) a failure: the callers are
/// background and garbage-collection paths, which a later gc retries.
fn delete_with_qgroup(root: &Path, parent: &Path, name: &str) {
    let path = parent.join(name);
    let subvol_id = btrfs::subvolume_id(&path).ok();
    match btrfs::delete_subvolume(parent, name) {
        Ok(()) => {
            if let Some(sid) = subvol_id {
                let _ = btrfs::remove_qgroup(root, sid);
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot delete a subvolume; gc will retry")
        }
    }
}

/// Nanoseconds since the epoch: the suffix that makes a name set aside unique (`trash/`, `run/.gone-`).
pub(super) fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn fs_uuid(root: &Path) -> Result<String, RuntimeError> {
    btrfs::filesystem_uuid(root).map_err(pool_err("identify the file system of", root))
}

/// Creates (if needed) and loop-mounts the pool image at `root`.
fn mount_image(state_dir: &Path, root: &Path, size: ByteSize) -> Result<(), RuntimeError> {
    let image = state_dir.join("pool.img");
    if !image.exists() {
        let staging = state_dir.join("pool.img.new");
        let f = File::create(&staging).map_err(pool_err("create", &staging))?;
        f.set_len(size.as_u64()).map_err(pool_err("size", &staging))?;
        drop(f);
        run_tool(
            Command::new("mkfs.btrfs")
                .args(["-q", "-f", "-m", "single", "-d", "single"])
                .arg(&staging),
        )?;
        fs::rename(&staging, &image).map_err(pool_err("rename", &staging))?;
    }
    // Space freed in a full pool must be usable again within seconds, not half a minute. Measured on
    // a filled 512 MiB pool once the filler was deleted: with the defaults, snapshots (and so creates,
    // checkpoints and forks) kept failing with ENOSPC for about 25 s, because the emptied data block
    // groups are only given back (and metadata can only grow again) by the cleaner, which runs after
    // each periodic commit, every 30 s by default. `commit=5` brings that to under 2 s. `discard=sync`
    // replaces the loop device's default `discard=async`, whose rate-limited background discard kept
    // freed data extents out of reach for as long; it still returns freed space to the host's disk.
    run_tool(
        Command::new("mount")
            .args(["-o", "loop,noatime,discard=sync,commit=5"])
            .arg(&image)
            .arg(root),
    )
}

/// Runs a system tool (mkfs.btrfs, mount): no crate formats btrfs, and mount(8) sets up the loop
/// device with the right autoclear semantics.
fn run_tool(cmd: &mut Command) -> Result<(), RuntimeError> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().map_err(|e| {
        RuntimeError::Unsupported(format!("cannot run {name} (install btrfs-progs and mount): {e}"))
    })?;
    if !out.status.success() {
        return Err(RuntimeError::Setup(format!(
            "{name} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Fills a fresh template subvolume: curated `/etc`, generated passwd/group, `home/user`, `tmp`.
fn populate_template(dir: &Path, ids: IdRange) -> Result<(), RuntimeError> {
    let root_owner = (ids.host_uid(0), ids.host_gid(0));
    // Every mode here is set, not left to the umask of whoever made the pool first (under 077 the
    // template's `/etc` and `/home` were 0700 and its generated files 0600: unreadable to `user`).
    let etc = dir.join("etc");
    fs::create_dir(&etc).map_err(pool_err("create", &etc))?;
    fs::set_permissions(&etc, fs::Permissions::from_mode(0o755)).map_err(pool_err("chmod", &etc))?;
    for name in CURATED_ETC {
        let src = Path::new("/etc").join(name);
        if fs::symlink_metadata(&src).is_ok() {
            copy_tree(&src, &etc.join(name), root_owner)?;
        }
    }
    let files: [(&str, &str); 4] = [
        (
            "passwd",
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        ),
        (
            "group",
            "root:x:0:\ntty:x:5:\nusers:x:100:user\nuser:x:1000:\nnogroup:x:65534:\n",
        ),
        ("resolv.conf", "# paddock: this sandbox has no network access\n"),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n",
        ),
    ];
    for (name, content) in files {
        let p = etc.join(name);
        let _ = fs::remove_file(&p);
        fs::write(&p, content).map_err(pool_err("write", &p))?;
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).map_err(pool_err("chmod", &p))?;
        chown(&p, Some(root_owner.0), Some(root_owner.1)).map_err(pool_err("chown", &p))?;
    }
    chown(&etc, Some(root_owner.0), Some(root_owner.1)).map_err(pool_err("chown", &etc))?;
    let home = dir.join("home");
    let user_home = home.join("user");
    fs::create_dir_all(&user_home).map_err(pool_err("create", &user_home))?;
    fs::set_permissions(&home, fs::Permissions::from_mode(0o755)).map_err(pool_err("chmod", &home))?;
    fs::set_permissions(&user_home, fs::Permissions::from_mode(0o750))
        .map_err(pool_err("chmod", &user_home))?;
    chown(&user_home, Some(ids.host_uid(1000)), Some(ids.host_gid(1000)))
        .map_err(pool_err("chown", &user_home))?;
    chown(&home, Some(root_owner.0), Some(root_owner.1)).map_err(pool_err("chown", &home))?;
    let root_home = dir.join("root");
    fs::create_dir(&root_home).map_err(pool_err("create", &root_home))?;
    fs::set_permissions(&root_home, fs::Permissions::from_mode(0o700))
        .map_err(pool_err("chmod", &root_home))?;
    chown(&root_home, Some(root_owner.0), Some(root_owner.1)).map_err(pool_err("chown", &root_home))?;
    let tmp = dir.join("tmp");
    fs::create_dir(&tmp).map_err(pool_err("create", &tmp))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777)).map_err(pool_err("chmod", &tmp))?;
    chown(&tmp, Some(root_owner.0), Some(root_owner.1)).map_err(pool_err("chown", &tmp))?;
    chown(dir, Some(root_owner.0), Some(root_owner.1)).map_err(pool_err("chown", dir))?;
    Ok(())
}

/// Copies a file, symlink or directory tree, owned by `owner`, with the source's access and
/// modification times (as `cp -p` does). Special files are skipped.
///
/// The times matter: Python's cached bytecode records its source's modification time, so a copy of
/// `/etc/python3.11/sitecustomize.py` with a new time made every `python3` in a sandbox compile it
/// again (2-3 ms of each start).
fn copy_tree(src: &Path, dst: &Path, owner: (u32, u32)) -> Result<(), RuntimeError> {
    let meta = fs::symlink_metadata(src).map_err(pool_err("inspect", src))?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = fs::read_link(src).map_err(pool_err("read link", src))?;
        symlink(&target, dst).map_err(pool_err("create symlink", dst))?;
    } else if ft.is_dir() {
        fs::create_dir(dst).map_err(pool_err("create", dst))?;
        fs::set_permissions(
            dst,
            fs::Permissions::from_mode(meta.permissions().mode() & 0o7777),
        )
        .map_err(pool_err("chmod", dst))?;
        for entry in fs::read_dir(src).map_err(pool_err("read", src))? {
            let entry = entry.map_err(pool_err("read", src))?;
            copy_tree(&entry.path(), &dst.join(entry.file_name()), owner)?;
        }
    } else if ft.is_file() {
        // Private host files (mode without the "other read" bit) stay private.
        if meta.permissions().mode() & 0o004 == 0 {
            return Ok(());
        }
        fs::copy(src, dst).map_err(pool_err("copy", src))?;
    } else {
        return Ok(());
    }
    rustix::fs::chownat(
        rustix::fs::CWD,
        dst,
        Some(rustix::fs::Uid::from_raw(owner.0)),
        Some(rustix::fs::Gid::from_raw(owner.1)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| pool_err("chown", dst)(e.into()))?;
    // Last: a directory's time changes with every entry made in it.
    let times = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: meta.atime(),
            tv_nsec: meta.atime_nsec() as _,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: meta.mtime(),
            tv_nsec: meta.mtime_nsec() as _,
        },
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        dst,
        &times,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| pool_err("set the times of", dst)(e.into()))
}

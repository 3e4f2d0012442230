//! Debian base templates (`[templates.NAME] debian = { suite = ... }`): `mmdebstrap` makes the
//! root file system from the host's configured apt sources (or the mirrors named: a local mirror
//! serves an air-gapped host) and writes it as a tar to its standard output, which is read as a
//! root file system archive (`paddock_registry::read_rootfs_archive`) into an image layout and
//! built as any one-layer image: the same layer applier, cache and limits.
//!
//! Only the operator's configuration names one (tenants cannot run `mmdebstrap` on the host).
//! This module does not install `mmdebstrap` (the host's package) or check package signatures
//! beyond what apt does with the host's keys (a mirror line may say `[trusted=yes]`).

use std::process::Stdio;

use paddock_registry::ArchiveLimits;
use paddock_runtime::TemplateBuilt;
use paddock_types::api::{ErrorCode, TemplateBuildEvent};
use paddock_types::TemplateId;
use tokio::io::AsyncReadExt as _;
use tokio::sync::mpsc;

use super::{registry_error, BuildRoom};
use crate::{DebianBase, SandboxService, ServiceError};

/// Most bytes of `mmdebstrap`'s error output kept for the build's error.
const MAX_STDERR: u64 = 16 << 10;

impl SandboxService {
    /// Makes `base` with `mmdebstrap` into the image layout `dest`, then builds template `id` from
    /// it.
    pub(super) async fn debian_and_build(
        &self,
        id: &TemplateId,
        base: &DebianBase,
        dest: &std::path::Path,
        room: BuildRoom,
        events: &mpsc::Sender<TemplateBuildEvent>,
    ) -> Result<TemplateBuilt, ServiceError> {
        base.validate().map_err(|e| ServiceError::invalid("debian", e))?;
        let mut command = tokio::process::Command::new("mmdebstrap");
        command.arg("--quiet").arg(format!(
            "--variant={}",
            base.variant.as_deref().unwrap_or("minbase")
        ));
        if !base.packages.is_empty() {
            command.arg(format!("--include={}", base.packages.join(",")));
        }
        // `-`: the tarball on standard output.
        command.arg("--").arg(&base.suite).arg("-").args(&base.mirrors);
        let _ = events
            .send(TemplateBuildEvent::Pulling {
                reference: base.source(),
            })
            .await;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                ServiceError::new(
                    ErrorCode::Unsupported,
                    format!("cannot run mmdebstrap (install Debian's mmdebstrap package): {e}"),
                )
            })?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(ServiceError::internal("run mmdebstrap", &"no pipes"));
        };
        let errors = tokio::spawn(async move {
            let mut text = Vec::new();
            let _ = stderr.take(MAX_STDERR).read_to_end(&mut text).await;
            String::from_utf8_lossy(&text).trim().to_owned()
        });
        let limits = ArchiveLimits {
            max_bytes: self.inner.config.images.pull.max_total_bytes,
            max_members: u64::MAX,
        };
        let layout = dest.to_owned();
        let mut reader = tokio_util::io::SyncIoBridge::new(stdout);
        let read = tokio::task::spawn_blocking(move || {
            paddock_registry::read_rootfs_archive(&mut reader, &layout, &limits)
        })
        .await
        .map_err(|e| ServiceError::internal("read mmdebstrap's output", &e))?;
        // Nobody reads its output any more after a failed read: it would block writing. (It may
        // have ended already, failing: then its exit code and error output say why.)
        if read.is_err() {
            let _ = child.start_kill();
        }
        let status = child
            .wait()
            .await
            .map_err(|e| ServiceError::internal("wait for mmdebstrap", &e))?;
        let errors = errors.await.unwrap_or_default();
        // An exit code (not our signal) that is not 0: its own failure.
        if status.code().is_some_and(|c| c != 0) {
            let _ = std::fs::remove_dir_all(dest);
            let last = errors.lines().last().unwrap_or("no error output");
            return Err(ServiceError::new(
                ErrorCode::BuildFailed,
                format!("mmdebstrap failed ({status}): {last}"),
            ));
        }
        let read = read.map_err(registry_error)?;
        let _ = events
            .send(TemplateBuildEvent::Received {
                format: "rootfs".to_owned(),
                bytes: read.bytes,
            })
            .await;
        self.build_layout(id, dest, read.reference, room, events).await
    }
}

//! How templates and their failures are answered: the API's template info, and the error a
//! registry's or the backend's failure becomes (stable codes, one line).

use paddock_registry::{ErrorKind as RegistryErrorKind, RegistryError};
use paddock_runtime::native::image::ImageErrorKind;
use paddock_runtime::RuntimeError;
use paddock_store::TemplateRecord;
use paddock_types::api::{ErrorCode, TemplateInfo, TemplateLayer};

use crate::core::service::runtime_error;
use crate::core::time::rfc3339;
use crate::plan::template::TemplateDetail;
use crate::ServiceError;

pub(super) fn template_not_found(name: &str) -> ServiceError {
    ServiceError::new(ErrorCode::TemplateNotFound, format!("template {name} not found"))
}

pub(super) fn configured_info(name: &str, warm_pool_size: u32) -> TemplateInfo {
    TemplateInfo {
        name: name.to_owned(),
        warm_pool_size,
        id: None,
        source: None,
        digest: None,
        layers: Vec::new(),
        size_bytes: None,
        storage_bytes: None,
        config: None,
        created_at: None,
        start: None,
    }
}

pub(super) fn template_info(record: &TemplateRecord, detail: Option<&TemplateDetail>) -> TemplateInfo {
    let built = detail.map(|d| &d.built);
    TemplateInfo {
        name: record.name.clone(),
        warm_pool_size: 0,
        id: Some(record.id.clone()),
        source: Some(record.source.clone()),
        digest: built.map(|b| b.digest.clone()),
        layers: built
            .map(|b| {
                b.layers
                    .iter()
                    .map(|l| TemplateLayer {
                        digest: l.digest.clone(),
                        size: l.size,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        size_bytes: built.map(|b| b.layers.iter().map(|l| l.size).sum()),
        storage_bytes: Some(record.storage_bytes),
        config: built.map(|b| b.config.clone()),
        created_at: Some(rfc3339(record.created_at_ms)),
        start: detail.and_then(|d| d.start.clone()),
    }
}

/// A registry's failure as the API answers it.
pub(super) fn registry_error(e: RegistryError) -> ServiceError {
    let code = match e.kind() {
        RegistryErrorKind::InvalidReference | RegistryErrorKind::InvalidOptions => ErrorCode::InvalidRequest,
        RegistryErrorKind::Unreachable | RegistryErrorKind::Tls | RegistryErrorKind::Protocol => {
            ErrorCode::RegistryUnreachable
        }
        RegistryErrorKind::TimedOut => ErrorCode::Timeout,
        RegistryErrorKind::NotFound => ErrorCode::ImageNotFound,
        RegistryErrorKind::Unauthorized => ErrorCode::RegistryUnauthorized,
        RegistryErrorKind::UnsupportedMediaType
        | RegistryErrorKind::DigestMismatch
        | RegistryErrorKind::NoMatchingPlatform
        | RegistryErrorKind::InvalidArchive => ErrorCode::InvalidImage,
        RegistryErrorKind::TooLarge => ErrorCode::ImageTooLarge,
        RegistryErrorKind::Io => {
            if crate::core::error::chain_has_no_space(&e) {
                return ServiceError::pool_full();
            }
            return ServiceError::internal("pull an image", &e);
        }
    };
    ServiceError::new(code, one_line(&e))
}

/// An error and its causes on one line.
fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        next = cause.source();
    }
    text
}

/// How much a build may write to the pool, and whether that is what is left of its tenant's
/// storage quota (else it is the server's bound of one build).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BuildRoom {
    pub(crate) bytes: u64,
    pub(crate) by_quota: bool,
}

/// Whether `e` is a write refused by a disk limit (a quota group's, not a full pool).
fn over_disk_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::EDQUOT))
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// A backend's build failure as the API answers it: a build that wrote past `room` is
/// `quota_exceeded` when the room was its tenant's, `image_too_large` when it was the server's
/// bound.
pub(super) fn build_error(e: RuntimeError, room: BuildRoom) -> ServiceError {
    if over_disk_limit(&e) {
        return if room.by_quota {
            ServiceError {
                field: Some("max_storage".to_owned()),
                ..ServiceError::new(
                    ErrorCode::QuotaExceeded,
                    format!(
                        "tenant quota exceeded: the build writes more than the {} bytes left of max_storage",
                        room.bytes
                    ),
                )
            }
        } else {
            ServiceError::new(
                ErrorCode::ImageTooLarge,
                format!(
                    "the template's files exceed this server's bound of {} bytes per build",
                    room.bytes
                ),
            )
        };
    }
    match e {
        RuntimeError::Image(image) => match image.kind() {
            ImageErrorKind::InvalidImage | ImageErrorKind::Unsupported | ImageErrorKind::NotFound => {
                ServiceError::new(ErrorCode::InvalidImage, one_line(&image))
            }
            ImageErrorKind::TooLarge => ServiceError::new(ErrorCode::ImageTooLarge, one_line(&image)),
            ImageErrorKind::Io => runtime_error("build a template", RuntimeError::Image(image)),
        },
        other => runtime_error("build a template", other),
    }
}

//! Label and name bounds of snapshots, sandboxes and volumes. (The three checks differ slightly, as
//! they always have; they are kept as they are.)

use std::collections::BTreeMap;

use crate::ServiceError;

/// Longest snapshot name, label key or label value.
pub(crate) const MAX_NAME_LEN: usize = 256;
/// Most labels of a sandbox or a volume.
pub(crate) const MAX_LABELS: usize = 64;
/// Longest label key or value of a sandbox or a volume.
pub(crate) const MAX_LABEL_LEN: usize = 256;

/// Labels of a snapshot: keys 1 to [`MAX_NAME_LEN`] bytes, values at most as long.
pub(crate) fn check_snapshot_labels(labels: &BTreeMap<String, String>) -> Result<(), ServiceError> {
    for (k, v) in labels {
        if k.is_empty() || k.len() > MAX_NAME_LEN || v.len() > MAX_NAME_LEN {
            return Err(ServiceError::invalid(
                format!("labels.{k}"),
                format!("label keys are 1-{MAX_NAME_LEN} bytes, values at most {MAX_NAME_LEN}"),
            ));
        }
    }
    Ok(())
}

pub(crate) fn check_volume_labels(labels: &BTreeMap<String, String>) -> Result<(), ServiceError> {
    if labels.len() > MAX_LABELS {
        return Err(ServiceError::invalid(
            "labels",
            format!("at most {MAX_LABELS} labels"),
        ));
    }
    for (k, v) in labels {
        if k.is_empty() || k.len() > MAX_LABEL_LEN || v.len() > MAX_LABEL_LEN {
            return Err(ServiceError::invalid(
                format!("labels.{k}"),
                format!("label keys are 1-{MAX_LABEL_LEN} bytes, values at most {MAX_LABEL_LEN}"),
            ));
        }
    }
    Ok(())
}

//! Time as the service records it: milliseconds since the epoch, and RFC 3339 text.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::core::error::ServiceError;

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Unix milliseconds as RFC 3339 (UTC, millisecond precision).
pub(crate) fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// RFC 3339 to unix milliseconds.
pub(crate) fn parse_rfc3339(field: &str, text: &str) -> Result<i64, ServiceError> {
    humantime::parse_rfc3339_weak(text)
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
        .ok_or_else(|| ServiceError::invalid(field, format!("{text:?} is not an RFC 3339 time")))
}

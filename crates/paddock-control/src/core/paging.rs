//! Keyset pagination of list operations: one page is fetched with one extra row, whose presence says
//! whether a next page exists.

use crate::ServiceError;

/// Page size when a request names none.
const DEFAULT_LIMIT: u32 = 100;
/// The largest page a request may ask for.
const MAX_LIMIT: u32 = 1000;

/// The page size a request asked for, checked (`field` is named in the error).
pub(crate) fn page_limit(requested: Option<u32>) -> Result<u32, ServiceError> {
    let limit = requested.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ServiceError::invalid(
            "limit",
            format!("limit must be between 1 and {MAX_LIMIT}"),
        ));
    }
    Ok(limit)
}

/// Cuts `rows` (fetched with `limit + 1`) to `limit` and returns the cursor of the next page: the key of
/// the page's last row, or `None` on the last page.
pub(crate) fn finish_page<T, K>(rows: &mut Vec<T>, limit: u32, key: impl Fn(&T) -> K) -> Option<K> {
    if rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last().map(key)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_cursors() {
        assert_eq!(page_limit(None).ok(), Some(100));
        assert_eq!(page_limit(Some(1000)).ok(), Some(1000));
        for bad in [0, 1001] {
            assert_eq!(
                page_limit(Some(bad)).expect_err("refused").field.as_deref(),
                Some("limit")
            );
        }
        let mut rows = vec![1, 2, 3];
        assert_eq!(finish_page(&mut rows, 2, |r| *r), Some(2));
        assert_eq!(rows, [1, 2]);
        let mut last = vec![1, 2];
        assert_eq!(finish_page(&mut last, 2, |r| *r), None);
        assert_eq!(last, [1, 2]);
    }
}

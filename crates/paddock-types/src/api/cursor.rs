//! Page cursors of the list routes (`?cursor=`): the one rule every list applies when it reads one.
//!
//! A cursor is the `next_cursor` of a previous page, which is the id of that page's last item
//! (sandbox, snapshot or volume ids: lowercase letters, digits and `-`). Anything else cannot have
//! come from a page, so it is refused (`invalid_request` naming `cursor`) instead of answering an
//! empty page. This module does not say where a page starts: the store does.

use serde::{Deserialize, Deserializer};

/// The longest cursor (the longest id any list returns is shorter).
pub(crate) const MAX_CURSOR_LEN: usize = 64;

/// Why `cursor` is not one a list could have returned, or `None` when it could be.
pub(crate) fn cursor_problem(cursor: &str) -> Option<String> {
    if cursor.is_empty() || cursor.len() > MAX_CURSOR_LEN {
        return Some(format!(
            "a cursor is 1 to {MAX_CURSOR_LEN} characters: pass the `next_cursor` of the previous page"
        ));
    }
    if !cursor
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Some(
            "a cursor has only lowercase letters, digits and `-`: pass the `next_cursor` of the previous page"
                .to_owned(),
        );
    }
    None
}

/// `#[serde(deserialize_with)]` for an optional `cursor` query parameter.
pub(crate) fn deserialize_cursor<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let cursor = Option::<String>::deserialize(d)?;
    if let Some(problem) = cursor.as_deref().and_then(cursor_problem) {
        return Err(serde::de::Error::custom(problem));
    }
    Ok(cursor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_a_page_returns_is_a_cursor() {
        for good in ["sb-0123456789abcdef", "sn-00ff", "vol-0123456789abcdef", "my-box"] {
            assert_eq!(cursor_problem(good), None, "{good}");
        }
        let long = "a".repeat(MAX_CURSOR_LEN + 1);
        for bad in ["", "\u{ff}\0", "SB-1", "a b", "a/b", "x%ff", long.as_str()] {
            assert!(cursor_problem(bad).is_some(), "{bad:?}");
        }
    }
}

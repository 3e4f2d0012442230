//! Kubernetes' naming rules, and turning paddock's strings (execution ids, tenants, the caller's
//! labels) into names and label values that follow them. Pure functions.
//!
//! A string that already follows the rule is kept as it is. One that does not is cleaned (other
//! characters become `-`, the ends trimmed, the length cut) and given the first 8 hex digits of
//! its SHA-256, so two different inputs never end up with the same cleaned value by accident.

use sha2::{Digest, Sha256};

/// The longest DNS label, label value and label name.
pub const MAX_LABEL: usize = 63;
/// The longest DNS subdomain.
const MAX_SUBDOMAIN: usize = 253;
/// `-` and 8 hex digits.
const HASH_SUFFIX: usize = 9;

/// RFC 1123 label: 1-63 of `[a-z0-9-]`, starting and ending with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_LABEL
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: dot-separated labels, 253 characters at most.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_SUBDOMAIN && s.split('.').all(is_dns_label)
}

/// A label value: empty, or 1-63 of `[A-Za-z0-9-_.]` starting and ending with a letter or digit.
pub fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_label_name(s)
}

/// The name part of a label key: a non-empty label value.
fn is_label_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_LABEL
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// The Job's name for the execution `id`: the id itself when it is a DNS label (paddock's
/// `ex-<hex>` ids are), otherwise a cleaned, hashed form of it.
pub fn job_name(id: &str) -> String {
    if is_dns_label(id) {
        return id.to_owned();
    }
    let cleaned: String = id
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .collect();
    with_hash(&cleaned, id, |c| c.is_ascii_alphanumeric(), "ex")
}

/// `value` as a label value: kept when valid, otherwise cleaned and hashed.
pub fn label_value(value: &str) -> String {
    if is_label_value(value) {
        return value.to_owned();
    }
    with_hash(&clean_label(value), value, |c| c.is_ascii_alphanumeric(), "v")
}

/// `key` as the name part of a label key (after our `paddock.dev/` prefix): kept when valid,
/// otherwise cleaned and hashed.
pub fn label_name(key: &str) -> String {
    if is_label_name(key) {
        return key.to_owned();
    }
    with_hash(&clean_label(key), key, |c| c.is_ascii_alphanumeric(), "k")
}

fn clean_label(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '-' | '_' | '.' => c,
            _ => '-',
        })
        .collect()
}

/// `cleaned` with both ends trimmed to characters `keep` accepts, cut to leave room for the hash,
/// then `-` and the first 8 hex digits of SHA-256(`original`); `fallback` stands in for an empty
/// stem. At most 63 characters, starting and ending with a letter or digit.
fn with_hash(cleaned: &str, original: &str, keep: impl Fn(char) -> bool + Copy, fallback: &str) -> String {
    let trimmed = cleaned.trim_matches(|c: char| !keep(c));
    let mut stem: String = trimmed.chars().take(MAX_LABEL - HASH_SUFFIX).collect();
    while stem.ends_with(|c: char| !keep(c)) {
        stem.pop();
    }
    if stem.is_empty() {
        stem.push_str(fallback);
    }
    let digest = Sha256::digest(original.as_bytes());
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("{stem}-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn valid_strings_are_kept() {
        assert_eq!(job_name("ex-0123456789abcdef"), "ex-0123456789abcdef");
        assert_eq!(label_value("Tenant_A.1"), "Tenant_A.1");
        assert_eq!(label_value(""), "");
        assert_eq!(label_name("session_id"), "session_id");
    }

    #[test]
    fn invalid_strings_are_cleaned_and_hashed() {
        let name = job_name("EX/Hello World");
        assert!(name.starts_with("ex-hello-world-"), "{name}");
        assert!(is_dns_label(&name));
        assert_ne!(job_name("a b"), job_name("a-b!"));
        assert_eq!(job_name("a b"), job_name("a b"), "deterministic");
        let value = label_value("alice@example.com");
        assert!(value.starts_with("alice-example.com-"), "{value}");
        assert_eq!(job_name("---").len(), "ex-".len() + 8);
        assert!(job_name("---").starts_with("ex-"));
        assert!(label_value(&"x".repeat(64)).len() <= MAX_LABEL);
    }

    proptest! {
        #[test]
        fn outputs_always_follow_the_rules(s in "\\PC{0,80}") {
            let name = job_name(&s);
            prop_assert!(is_dns_label(&name), "job name {name:?}");
            let value = label_value(&s);
            prop_assert!(is_label_value(&value), "label value {value:?}");
            let key = label_name(&s);
            prop_assert!(is_label_name(&key), "label name {key:?}");
        }
    }
}

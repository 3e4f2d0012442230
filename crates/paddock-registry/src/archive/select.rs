//! Which image of an archive the caller means: names compared as written, then as docker
//! normalises them (`app:v1` is `docker.io/library/app:v1`), and the errors that list what the
//! archive offers instead (bounded, quoted: the names come from the archive).
//!
//! It does not read archives: `oci.rs` and `docker.rs` hand it the names they found.

use crate::error::RegistryError;
use crate::reference::ImageReference;

/// Names listed in an error at most.
const MAX_LISTED: usize = 10;
/// Characters of one name listed at most.
const MAX_NAME_CHARS: usize = 200;

/// Whether the archive's `candidate` is the image `wanted`.
pub(super) fn same_image(candidate: &str, wanted: &str) -> bool {
    candidate == wanted || matches!((normalise(candidate), normalise(wanted)), (Some(a), Some(b)) if a == b)
}

fn normalise(name: &str) -> Option<String> {
    name.parse::<ImageReference>().ok().map(|r| r.to_string())
}

/// `wanted` is none of the archive's images, which have these names.
pub(super) fn not_in_archive<'n>(wanted: &str, names: impl Iterator<Item = &'n str>) -> RegistryError {
    RegistryError::NotInArchive {
        image: wanted.chars().take(MAX_NAME_CHARS).collect(),
        offered: listed(names),
    }
}

/// No image was named and the archive holds `count`, with these names.
pub(super) fn several_images<'n>(count: usize, names: impl Iterator<Item = &'n str>) -> RegistryError {
    RegistryError::invalid_archive(format!(
        "the archive holds {count} images ({}): name one",
        listed(names)
    ))
}

fn listed<'n>(names: impl Iterator<Item = &'n str>) -> String {
    let names: Vec<&str> = names.collect();
    if names.is_empty() {
        return "no named image".into();
    }
    let mut text = names
        .iter()
        .take(MAX_LISTED)
        .map(|n| format!("{:?}", n.chars().take(MAX_NAME_CHARS).collect::<String>()))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > MAX_LISTED {
        text.push_str(&format!(" and {} more", names.len() - MAX_LISTED));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_as_docker_normalises_them() {
        assert!(same_image("docker.io/library/app:v1", "app:v1"));
        assert!(same_image("app:v1", "library/app:v1"));
        assert!(same_image("app:latest", "app"));
        assert!(same_image("v1", "v1"));
        assert!(!same_image("docker.io/library/app:v1", "app:v2"));
        assert!(!same_image("ghcr.io/x/app:v1", "app:v1"));
        assert!(!same_image("v1", "app:v1"));
    }

    #[test]
    fn listed_names_are_bounded_and_quoted() {
        let many: Vec<String> = (0..12).map(|i| format!("a{i}\n")).collect();
        let text = listed(many.iter().map(String::as_str));
        assert!(text.contains(r#""a0\n""#), "{text}");
        assert!(text.ends_with(" and 2 more"), "{text}");
        assert_eq!(listed(std::iter::empty()), "no named image");
    }
}

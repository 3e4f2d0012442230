//! What the archive's members mean: each regular file stored as a blob (by content, never under
//! its own name) and mapped from its normalised name; links recorded as aliases; the few small
//! top-level documents (`manifest.json`, `index.json`, `oci-layout`) kept in memory.
//!
//! Names are judged here: a leading `./` (and any `.` or empty component) is dropped; absolute
//! names, `..` components, NUL bytes, names that are not UTF-8 or longer than 4096 bytes are
//! refused, as is a name seen twice. A link is never created: a symlink's target is resolved
//! lexically from the link's directory, a hard link's from the archive's root, and a target
//! outside the archive is an error only once something looks the alias up. Directories, devices
//! and fifos are skipped.
//!
//! It does not know the image formats: `oci.rs` and `docker.rs` read what it collected.

use std::collections::HashMap;

use crate::error::RegistryError;
use crate::manifest::{sha256_hex, MAX_MANIFEST_BYTES};

use super::blobs::{NewLayout, StoredBlob};
use super::entries::{read_entries, Member, MemberData, MemberKind};
use super::stream::Stream;

/// The top-level members kept in memory.
pub(super) const DOCUMENTS: [&str; 3] = ["manifest.json", "index.json", "oci-layout"];
/// The longest member name or link target (Linux's `PATH_MAX`): names are kept in memory, one per
/// member.
const MAX_NAME_BYTES: usize = 4096;
/// Most links followed looking one name up.
const MAX_LINK_HOPS: usize = 16;

/// Where a link member leads.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Link {
    /// The normalised name of its target.
    To(String),
    /// Its target, as written, leaves the archive or is not a usable name.
    Unusable(String),
}

/// The members of an archive, read.
#[derive(Debug, Default)]
pub(super) struct Members {
    files: HashMap<String, StoredBlob>,
    links: HashMap<String, Link>,
    documents: HashMap<String, Vec<u8>>,
}

impl Members {
    /// Reads every member of the tar `stream`, storing regular files as blobs of `layout`.
    pub(super) fn collect(
        stream: &mut Stream<'_>,
        layout: &mut NewLayout,
        max_members: u64,
    ) -> Result<Self, RegistryError> {
        let mut members = Self::default();
        read_entries(stream, max_members, &mut |member, data| {
            members.add(member, data, layout)
        })?;
        Ok(members)
    }

    fn add(
        &mut self,
        member: &Member,
        data: &mut MemberData<'_, '_>,
        layout: &mut NewLayout,
    ) -> Result<(), RegistryError> {
        if matches!(member.kind, MemberKind::Directory | MemberKind::Other) {
            return Ok(());
        }
        let name = member_name(&member.name)?;
        if self.files.contains_key(&name)
            || self.links.contains_key(&name)
            || self.documents.contains_key(&name)
        {
            return Err(RegistryError::invalid_archive(format!(
                "member {name:?} appears twice"
            )));
        }
        match &member.kind {
            MemberKind::File if DOCUMENTS.contains(&name.as_str()) => {
                if member.size > MAX_MANIFEST_BYTES as u64 {
                    return Err(RegistryError::TooLarge {
                        what: format!("archive member {name:?}"),
                        limit: MAX_MANIFEST_BYTES as u64,
                    });
                }
                let bytes = data.read_all()?;
                self.documents.insert(name, bytes);
            }
            MemberKind::File => {
                let blob = store(data, layout)?;
                if let Some(named) = blob_name_hex(&name) {
                    if named != blob.hex {
                        return Err(RegistryError::DigestMismatch {
                            what: format!("archive member {name:?}"),
                            expected: format!("sha256:{named}"),
                            actual: blob.digest(),
                        });
                    }
                }
                self.files.insert(name, blob);
            }
            MemberKind::Symlink(target) => {
                let link = symlink_target(&name, target);
                self.links.insert(name, link);
            }
            MemberKind::HardLink(target) => {
                let link = match member_name(target) {
                    Ok(t) => Link::To(t),
                    Err(_) => unusable(target),
                };
                self.links.insert(name, link);
            }
            MemberKind::Directory | MemberKind::Other => {}
        }
        Ok(())
    }

    /// A top-level document kept in memory.
    pub(super) fn document(&self, name: &str) -> Option<&[u8]> {
        self.documents.get(name).map(Vec::as_slice)
    }

    /// The regular member `name` (as an archive's JSON writes it) names, through links.
    pub(super) fn resolve(&self, name: &str) -> Result<&StoredBlob, RegistryError> {
        let mut current = member_name(name.as_bytes()).map_err(|_| {
            RegistryError::invalid_archive(format!("the archive refers to an unsafe path {name:?}"))
        })?;
        for _ in 0..=MAX_LINK_HOPS {
            if let Some(blob) = self.files.get(&current) {
                return Ok(blob);
            }
            match self.links.get(&current) {
                Some(Link::To(next)) => current = next.clone(),
                Some(Link::Unusable(target)) => {
                    return Err(RegistryError::invalid_archive(format!(
                        "{name:?} is a link to {target:?}, outside the archive"
                    )))
                }
                None => {
                    return Err(RegistryError::invalid_archive(format!(
                        "{name:?} is missing from the archive"
                    )))
                }
            }
        }
        Err(RegistryError::invalid_archive(format!(
            "{name:?} is a chain of more than {MAX_LINK_HOPS} links"
        )))
    }

    /// The hex digests of the regular members named `blobs/sha256/<hex>`.
    pub(super) fn named_blobs(&self) -> impl Iterator<Item = &str> {
        self.files.keys().filter_map(|n| blob_name_hex(n))
    }
}

/// The hex of a member named `blobs/sha256/<64 lowercase hex>`.
fn blob_name_hex(name: &str) -> Option<&str> {
    let hex = name.strip_prefix("blobs/sha256/")?;
    sha256_hex(&format!("sha256:{hex}")).is_some().then_some(hex)
}

/// Streams a member's data into a new blob.
fn store(data: &mut MemberData<'_, '_>, layout: &mut NewLayout) -> Result<StoredBlob, RegistryError> {
    let mut blob = layout.begin_blob()?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = data.read(&mut buf)?;
        if n == 0 {
            break;
        }
        blob.write(&buf[..n])?;
    }
    layout.commit_blob(blob)
}

/// A member's name, normalised: components joined by `/`, without empty or `.` ones.
fn member_name(raw: &[u8]) -> Result<String, RegistryError> {
    let shown = || String::from_utf8_lossy(raw).into_owned();
    let unsafe_name =
        |why: &str| RegistryError::invalid_archive(format!("member name {:?} is unsafe: {why}", shown()));
    if raw.len() > MAX_NAME_BYTES {
        let shown: String = shown().chars().take(200).collect();
        return Err(RegistryError::invalid_archive(format!(
            "member name {shown:?}... is longer than {MAX_NAME_BYTES} bytes"
        )));
    }
    if raw.contains(&0) {
        return Err(unsafe_name("it holds a NUL byte"));
    }
    let text = std::str::from_utf8(raw).map_err(|_| unsafe_name("it is not UTF-8"))?;
    if text.starts_with('/') {
        return Err(unsafe_name("it is absolute"));
    }
    let mut parts = Vec::new();
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(unsafe_name("it climbs out with `..`")),
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err(unsafe_name("it is empty"));
    }
    Ok(parts.join("/"))
}

/// A symlink's target, resolved lexically from the link's directory.
fn symlink_target(link: &str, target: &[u8]) -> Link {
    let unusable = || unusable(target);
    if target.len() > MAX_NAME_BYTES {
        return unusable();
    }
    let Ok(text) = std::str::from_utf8(target) else {
        return unusable();
    };
    if text.starts_with('/') || text.contains('\0') {
        return unusable();
    }
    let mut parts: Vec<&str> = link.split('/').collect();
    parts.pop(); // the link's own name
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return unusable();
                }
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return unusable();
    }
    Link::To(parts.join("/"))
}

/// A link's target that cannot be used, kept (shortened) for the error naming it.
fn unusable(target: &[u8]) -> Link {
    Link::Unusable(String::from_utf8_lossy(target).chars().take(200).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn names_are_normalised_or_refused() {
        let ok = |raw: &str| member_name(raw.as_bytes()).expect(raw);
        assert_eq!(ok("./manifest.json"), "manifest.json");
        assert_eq!(ok("blobs//sha256/./ab"), "blobs/sha256/ab");
        assert_eq!(ok("dir/"), "dir");
        for bad in ["../x", "a/../../x", "a/..", "/etc/x", "", "./", "a\0b"] {
            let err = member_name(bad.as_bytes()).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::InvalidArchive, "{bad}");
        }
        assert!(member_name(b"\xff\xfe").is_err());
        assert!(member_name("a/".repeat(2048).as_bytes()).is_ok());
        assert!(member_name("a/".repeat(2049).as_bytes()).is_err());
    }

    #[test]
    fn symlinks_resolve_lexically_inside_the_archive() {
        let to = |s: &str| Link::To(s.into());
        assert_eq!(symlink_target("id/layer.tar", b"../abc.tar"), to("abc.tar"));
        assert_eq!(symlink_target("a/b/c", b"./d/../e"), to("a/b/e"));
        assert_eq!(symlink_target("top", b"other"), to("other"));
        for outside in ["../../etc/passwd", "/etc/passwd", "..", "../"] {
            assert!(
                matches!(
                    symlink_target("id/layer.tar", outside.as_bytes()),
                    Link::Unusable(_)
                ),
                "{outside}"
            );
        }
    }

    #[test]
    fn lookups_follow_links_and_fail_on_bad_ones() {
        let blob = StoredBlob {
            hex: "00".repeat(32),
            size: 1,
            head: vec![],
        };
        let mut m = Members::default();
        m.files.insert("a.tar".into(), blob.clone());
        m.links.insert("x/layer.tar".into(), Link::To("a.tar".into()));
        m.links
            .insert("y/layer.tar".into(), Link::To("x/layer.tar".into()));
        m.links.insert("loop1".into(), Link::To("loop2".into()));
        m.links.insert("loop2".into(), Link::To("loop1".into()));
        m.links
            .insert("out".into(), Link::Unusable("../../etc/passwd".into()));
        assert_eq!(m.resolve("./y/layer.tar").expect("two hops"), &blob);
        for bad in ["loop1", "out", "missing", "../a.tar"] {
            assert_eq!(m.resolve(bad).expect_err(bad).kind(), ErrorKind::InvalidArchive);
        }
    }
}

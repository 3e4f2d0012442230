//! The name of an archive member, checked before anything is created for it.
//!
//! A member name is untrusted bytes. It is accepted only as a relative path of plain names: empty
//! components and `.` are dropped (so `./etc/x`, `etc//x` and `etc/x/` all mean `etc/x`, and `./` is
//! the tree's root), while `..` anywhere, an absolute path, a NUL byte, a component longer than
//! `NAME_MAX` or a path deeper than [`MAX_DEPTH`] refuse the archive. Absolute names are refused rather
//! than made relative: an export never writes one, so an archive that has one was made for another
//! purpose (or to probe this one). Confinement does not rest on this check alone: extraction then
//! walks each component with `openat(O_NOFOLLOW | O_DIRECTORY)` from the tree's root.

/// Deepest member accepted (also the deepest tree an export descends into).
pub(crate) const MAX_DEPTH: usize = 512;
/// Longest member name accepted, in bytes.
const MAX_PATH_BYTES: usize = 32 * 1024;
/// `NAME_MAX`.
const NAME_MAX: usize = 255;

/// A checked member name: zero (the tree's root) or more plain components.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemberPath {
    components: Vec<Vec<u8>>,
}

impl MemberPath {
    /// Parses a member name; `Err` says why it is refused.
    pub(crate) fn parse(name: &[u8]) -> Result<Self, String> {
        let shown = || String::from_utf8_lossy(name).into_owned();
        if name.is_empty() {
            return Err("a member has an empty name".into());
        }
        if name.len() > MAX_PATH_BYTES {
            return Err(format!("a member name is longer than {MAX_PATH_BYTES} bytes"));
        }
        if name.contains(&0) {
            return Err(format!("member {:?} has a NUL byte in its name", shown()));
        }
        if name.starts_with(b"/") {
            return Err(format!(
                "member {:?} has an absolute path (archives hold paths relative to the snapshot's root)",
                shown()
            ));
        }
        let mut components = Vec::new();
        for c in name.split(|&b| b == b'/') {
            match c {
                b"" | b"." => {}
                b".." => return Err(format!("member {:?} has a `..` component", shown())),
                c if c.len() > NAME_MAX => {
                    return Err(format!(
                        "member {:?} has a component longer than {NAME_MAX} bytes",
                        shown()
                    ))
                }
                c => components.push(c.to_vec()),
            }
        }
        if components.len() > MAX_DEPTH {
            return Err(format!(
                "member {:?} is nested deeper than {MAX_DEPTH} directories",
                shown()
            ));
        }
        Ok(Self { components })
    }

    /// Whether this is the tree's root (`.`, `./`).
    pub(crate) fn is_root(&self) -> bool {
        self.components.is_empty()
    }

    /// The directories leading to the member, outermost first.
    pub(crate) fn parents(&self) -> &[Vec<u8>] {
        self.components
            .split_last()
            .map_or(&[][..], |(_, parents)| parents)
    }

    /// The final component (`None` for the root).
    pub(crate) fn name(&self) -> Option<&[u8]> {
        self.components.last().map(Vec::as_slice)
    }

    /// The components, outermost first.
    #[cfg(test)]
    pub(crate) fn components(&self) -> &[Vec<u8>] {
        &self.components
    }

    /// The canonical form, `a/b/c` (empty for the root): two names meaning the same member have the
    /// same key.
    pub(crate) fn key(&self) -> Vec<u8> {
        self.components.join(&b'/')
    }

    /// For messages: the canonical form, bytes that are not UTF-8 shown as U+FFFD.
    pub(crate) fn display(&self) -> String {
        if self.is_root() {
            ".".into()
        } else {
            String::from_utf8_lossy(&self.key()).into_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parts(name: &str) -> Vec<String> {
        MemberPath::parse(name.as_bytes())
            .expect(name)
            .components()
            .iter()
            .map(|c| String::from_utf8(c.clone()).expect("utf-8"))
            .collect()
    }

    #[test]
    fn plain_names_are_normalised() {
        assert_eq!(parts("./etc/passwd"), ["etc", "passwd"]);
        assert_eq!(parts("etc//x/"), ["etc", "x"]);
        assert_eq!(parts("home/./user"), ["home", "user"]);
        assert!(MemberPath::parse(b"./").expect("root").is_root());
        assert!(MemberPath::parse(b".").expect("root").is_root());
        let p = MemberPath::parse(b"a/b/c").expect("parse");
        assert_eq!(p.parents(), [b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(p.name(), Some(&b"c"[..]));
        assert_eq!(p.key(), b"a/b/c");
        let odd = MemberPath::parse(b"home/\xff\xfe").expect("not UTF-8 is fine");
        assert_eq!(odd.name(), Some(&b"\xff\xfe"[..]));
    }

    #[test]
    fn escapes_and_oddities_are_refused() {
        let long = "x".repeat(256);
        let deep = "d/".repeat(MAX_DEPTH + 1);
        for bad in [
            "",
            "/etc/passwd",
            "//etc",
            "..",
            "../x",
            "a/../../x",
            "a/..",
            "a/b/../c",
            "nul\0byte",
            long.as_str(),
            deep.as_str(),
        ] {
            assert!(MemberPath::parse(bad.as_bytes()).is_err(), "{bad:?} accepted");
        }
    }

    proptest! {
        /// Whatever the bytes, an accepted name is plain components only, and reparsing its key
        /// gives the same member.
        #[test]
        fn accepted_names_are_plain(name in proptest::collection::vec(
            prop_oneof![Just(b'/'), Just(b'.'), Just(b'a'), Just(0u8), any::<u8>()], 0..64)) {
            if let Ok(p) = MemberPath::parse(&name) {
                for c in p.components() {
                    prop_assert!(!c.is_empty());
                    prop_assert!(c != b"." && c != b"..");
                    prop_assert!(!c.contains(&b'/') && !c.contains(&0));
                }
                prop_assert!(!name.starts_with(b"/"));
                if !p.is_root() {
                    prop_assert_eq!(MemberPath::parse(&p.key()).expect("reparse"), p);
                }
            }
        }
    }
}

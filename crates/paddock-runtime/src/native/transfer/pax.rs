//! What the tar crate does not do for us, and only that.
//!
//! The crate writes the archive (`tar::Builder`: headers, contents, padding, the end-of-archive
//! marker) and its pax extended headers (`Builder::append_pax_extensions`: the records
//! `"<len> <key>=<value>\n"`, the header of type `x` before the member), and reads them back. It
//! cannot:
//! - write or read a timestamp with a fraction of a second: [`format_time`] here (pax `mtime`, to
//!   the nanosecond), and its reader `untar::input::parse_time` beside the other readers of untrusted
//!   archives (snapshot import and image layers);
//! - put a name into a ustar header as it is: its `set_path` normalises `.` components and trailing
//!   slashes away, and an archive member's name should be exactly what was meant (`./`, `dir/`):
//!   [`set_ustar_path`], with [`placeholder`] for what the ustar field shows when the real name is
//!   in a pax record.
//!
//! The extended header the crate writes has no name, mode or time of its own: readers take those
//! from the member's header that follows it.

use tar::Header;

/// A timestamp as pax writes it: seconds since the epoch, a `.` and up to nine digits of fraction,
/// negative values counting back from the epoch (`-1.5` is 1.5 s before it).
pub(super) fn format_time(secs: i64, nanos: u32) -> String {
    let nanos = nanos.min(999_999_999);
    if nanos == 0 {
        return secs.to_string();
    }
    // secs + nanos/1e9 as one signed decimal.
    let (sign, whole, frac) = if secs >= 0 {
        ("", secs.unsigned_abs(), nanos)
    } else {
        ("-", (secs + 1).unsigned_abs(), 1_000_000_000 - nanos)
    };
    let frac = format!("{frac:09}");
    format!("{sign}{whole}.{}", frac.trim_end_matches('0'))
}

/// Puts `path` verbatim into the ustar `name` field, or split at a `/` into `prefix` (155 bytes) and
/// `name` (100 bytes); false if it fits neither way. (The tar crate's `set_path` normalises `.`
/// components and trailing slashes away; an archive member's name should be exactly what was meant.)
pub(super) fn set_ustar_path(header: &mut Header, path: &[u8]) -> bool {
    let Some(ustar) = header.as_ustar_mut() else {
        return false;
    };
    let (prefix, name) = if path.len() <= ustar.name.len() {
        (&b""[..], path)
    } else {
        // The last usable slash: the name after it must be non-empty and fit, the prefix must fit.
        let split = path[..path.len() - 1]
            .iter()
            .enumerate()
            .rev()
            .filter(|&(_, &b)| b == b'/')
            .map(|(i, _)| i)
            .find(|&i| i <= ustar.prefix.len() && path.len() - i - 1 <= ustar.name.len());
        match split {
            Some(i) if i > 0 => (&path[..i], &path[i + 1..]),
            _ => return false,
        }
    };
    ustar.name.fill(0);
    ustar.prefix.fill(0);
    ustar.name[..name.len()].copy_from_slice(name);
    ustar.prefix[..prefix.len()].copy_from_slice(prefix);
    true
}

/// What the ustar name field holds when the real name is in a pax record: the name's last `max`
/// bytes of printable ASCII (readers that ignore pax see something recognisable).
pub(super) fn placeholder(name: &[u8], max: usize) -> String {
    let printable: String = name
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() && b != b'\\' {
                b as char
            } else {
                '_'
            }
        })
        .collect();
    let trimmed = printable.trim_matches('/');
    let start = trimmed.len().saturating_sub(max);
    let tail = trimmed[start..].trim_start_matches(['/', '.']);
    if tail.is_empty() {
        "pax".to_owned()
    } else {
        tail.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::native::untar::input::parse_time;

    /// The records of one pax extended header as the tar crate writes them (what export uses).
    fn record(key: &str, value: &[u8]) -> Vec<u8> {
        let mut archive = tar::Builder::new(Vec::new());
        archive.append_pax_extensions([(key, value)]).expect("append");
        let bytes = archive.into_inner().expect("finish");
        let header = Header::from_byte_slice(&bytes[..512]);
        assert_eq!(header.entry_type(), tar::EntryType::XHeader);
        let len = header.entry_size().expect("size") as usize;
        bytes[512..512 + len].to_vec()
    }

    #[test]
    fn records_count_their_own_length() {
        let out = record("path", b"a");
        assert_eq!(out, b"9 path=a\n");
        // 98 bytes + 2 digits is 100, which has 3 digits: the length grows to 101.
        let value = vec![b'x'; 91];
        let out = record("path", &value);
        assert_eq!(out.len(), 101);
        assert!(out.starts_with(b"101 path="));
    }

    #[test]
    fn times() {
        assert_eq!(format_time(1_700_000_000, 0), "1700000000");
        assert_eq!(format_time(1_700_000_000, 500_000_000), "1700000000.5");
        assert_eq!(format_time(-2, 500_000_000), "-1.5");
        assert_eq!(format_time(-1, 0), "-1");
        assert_eq!(parse_time(b"1.000000001"), Some((1, 1)));
        assert_eq!(parse_time(b"-1.5"), Some((-2, 500_000_000)));
        assert_eq!(parse_time(b"12.1234567891"), Some((12, 123_456_789)));
        for bad in [&b""[..], b"-", b".5", b"1.x", b"1e3", b"+1", b"1..2"] {
            assert_eq!(parse_time(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    proptest! {
        #[test]
        fn records_are_self_describing(key in "[a-z.]{1,20}", value in proptest::collection::vec(any::<u8>(), 0..300)) {
            let out = record(&key, &value);
            let space = out.iter().position(|&b| b == b' ').expect("space");
            let len: usize = std::str::from_utf8(&out[..space]).expect("digits").parse().expect("number");
            prop_assert_eq!(len, out.len());
            prop_assert_eq!(out.last(), Some(&b'\n'));
        }

        #[test]
        fn times_round_trip(secs in -10_000_000_000i64..10_000_000_000, nanos in 0u32..1_000_000_000) {
            prop_assert_eq!(parse_time(format_time(secs, nanos).as_bytes()), Some((secs, nanos)));
        }
    }
}

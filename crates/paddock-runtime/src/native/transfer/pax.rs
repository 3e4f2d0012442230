//! The two pieces of POSIX pax (`pax(1)`, "pax Interchange Format") the tar crate does not do for us:
//! writing extended-header records, and timestamps with a fraction of a second.
//!
//! The tar crate reads pax headers (`path`, `linkpath`, `size`, `uid`, `gid`) but has no writer for
//! them, so the records are encoded here: `"<len> <key>=<value>\n"`, where `<len>` counts the whole
//! record, its own digits included.

/// Appends one record to `out`.
pub(super) fn push_record(out: &mut Vec<u8>, key: &str, value: &[u8]) {
    // " " + key + "=" + value + "\n", then the decimal length, which counts its own digits.
    let rest = key.len() + value.len() + 3;
    let mut len = rest + 1;
    while len != rest + digits(len) {
        len = rest + digits(len);
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key.as_bytes());
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

fn digits(mut n: usize) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

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

/// Parses a pax timestamp (`1700000000`, `1700000000.5`, `-1.25`); `None` if malformed. Digits of
/// fraction past nanoseconds are dropped.
pub(super) fn parse_time(text: &[u8]) -> Option<(i64, u32)> {
    let text = std::str::from_utf8(text).ok()?;
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: i64 = whole.parse().ok()?;
    let mut nanos = 0u32;
    for (i, b) in frac.bytes().take(9).enumerate() {
        nanos += u32::from(b - b'0') * 10u32.pow(8 - i as u32);
    }
    if !negative {
        return Some((whole, nanos));
    }
    if nanos == 0 {
        Some((whole.checked_neg()?, 0))
    } else {
        Some((whole.checked_neg()?.checked_sub(1)?, 1_000_000_000 - nanos))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn records_count_their_own_length() {
        let mut out = Vec::new();
        push_record(&mut out, "path", b"a");
        assert_eq!(out, b"9 path=a\n");
        // 98 bytes + 2 digits is 100, which has 3 digits: the length grows to 101.
        let mut out = Vec::new();
        let value = vec![b'x'; 91];
        push_record(&mut out, "path", &value);
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
            let mut out = Vec::new();
            push_record(&mut out, &key, &value);
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

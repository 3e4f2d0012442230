//! The file name in a multipart part's `Content-Disposition`, read as Go's `mime` package (which
//! envd uses) reads it: `filename*` (RFC 5987, UTF-8) when present, else `filename` with its
//! quoted-string escapes undone. Pure; fed untrusted bytes, so property-tested.
//!
//! It does not undo percent signs in a plain `filename`: they are what browsers' and httpx's
//! escaping of `"` leaves, and envd keeps them too.

/// A part's `filename`, as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileName {
    /// Readable text.
    Text(String),
    /// Not UTF-8 (a path in a request must be).
    NotUtf8,
}

/// The file name in a `Content-Disposition` value: `filename*` when present and readable, else
/// `filename`.
pub fn file_name(value: &[u8]) -> Option<FileName> {
    let mut plain = None;
    for (key, raw) in parameters(value) {
        if key.eq_ignore_ascii_case("filename*") {
            if let Some(name) = extended_value(&raw) {
                return Some(name);
            }
        } else if key.eq_ignore_ascii_case("filename") && plain.is_none() {
            plain = Some(match String::from_utf8(raw) {
                Ok(text) => FileName::Text(text),
                Err(_) => FileName::NotUtf8,
            });
        }
    }
    plain
}

/// The `key=value` parameters after a disposition type, values unquoted.
fn parameters(value: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = match value.iter().position(|b| *b == b';') {
        Some(i) => &value[i + 1..],
        None => return out,
    };
    loop {
        rest = trim_start(rest);
        if rest.is_empty() {
            return out;
        }
        let key_end = rest
            .iter()
            .position(|b| *b == b'=' || *b == b';')
            .unwrap_or(rest.len());
        let key = String::from_utf8_lossy(trim_end(&rest[..key_end])).into_owned();
        rest = &rest[key_end..];
        let Some((b'=', after)) = rest.split_first() else {
            // A key without a value: skip it (and its `;`).
            rest = rest.get(1..).unwrap_or_default();
            continue;
        };
        rest = trim_start(after);
        let mut raw = Vec::new();
        if let Some((b'"', quoted)) = rest.split_first() {
            let mut i = 0;
            while i < quoted.len() {
                match quoted[i] {
                    b'\\' if i + 1 < quoted.len() => {
                        raw.push(quoted[i + 1]);
                        i += 2;
                    }
                    b'"' => {
                        i += 1;
                        break;
                    }
                    b => {
                        raw.push(b);
                        i += 1;
                    }
                }
            }
            rest = &quoted[i..];
            // Anything up to the next `;` after a closing quote is ignored.
            let next = rest.iter().position(|b| *b == b';').map_or(rest.len(), |p| p + 1);
            rest = &rest[next..];
        } else {
            let end = rest.iter().position(|b| *b == b';').unwrap_or(rest.len());
            raw.extend_from_slice(trim_end(&rest[..end]));
            rest = rest.get(end + 1..).unwrap_or_default();
        }
        out.push((key, raw));
    }
}

/// `UTF-8''<percent-encoded>` → the text; `None` for another charset or a bad encoding.
fn extended_value(raw: &[u8]) -> Option<FileName> {
    let text = std::str::from_utf8(raw).ok()?;
    let (charset, rest) = text.split_once('\'')?;
    let (_language, encoded) = rest.split_once('\'')?;
    if !charset.eq_ignore_ascii_case("utf-8") {
        return None;
    }
    let bytes: Vec<u8> = percent_decode(encoded)?;
    Some(match String::from_utf8(bytes) {
        Ok(text) => FileName::Text(text),
        Err(_) => FileName::NotUtf8,
    })
}

fn percent_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

fn trim_start(b: &[u8]) -> &[u8] {
    let i = b.iter().position(|c| !c.is_ascii_whitespace()).unwrap_or(b.len());
    &b[i..]
}

fn trim_end(b: &[u8]) -> &[u8] {
    let i = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(0, |p| p + 1);
    &b[..i]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text(s: &str) -> Option<FileName> {
        Some(FileName::Text(s.to_owned()))
    }

    #[test]
    fn file_names_are_read_as_go_reads_them() {
        let name = |v: &str| file_name(v.as_bytes());
        assert_eq!(
            name(r#"form-data; name="file"; filename="/home/user/a.txt""#),
            text("/home/user/a.txt")
        );
        assert_eq!(
            name(r#"form-data; filename="a\"b\\c"; name=file"#),
            text(r#"a"b\c"#)
        );
        assert_eq!(
            name(r#"form-data; name="file"; filename="a%22b.txt""#),
            text("a%22b.txt")
        );
        assert_eq!(
            name("form-data; name=file; filename=plain.txt"),
            text("plain.txt")
        );
        assert_eq!(
            name("form-data; filename=\"fallback\"; filename*=UTF-8''%C3%A9t%C3%A9.txt"),
            text("été.txt")
        );
        assert_eq!(name("form-data; filename*=latin-1''x; filename=\"y\""), text("y"));
        assert_eq!(
            name("form-data; name=\"file\"; filename=\"d/é.txt\""),
            text("d/é.txt")
        );
        assert_eq!(name(r#"form-data; name="file""#), None);
        assert_eq!(name(r#"form-data; name="file"; xfilename="no""#), None);
        assert_eq!(name("form-data; filename=\"unterminated"), text("unterminated"));
        assert_eq!(
            file_name(b"form-data; filename=\"\xff\""),
            Some(FileName::NotUtf8)
        );
    }

    proptest! {
        #[test]
        fn any_disposition_parses_without_panicking(value in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = file_name(&value);
        }

        #[test]
        fn quoted_names_round_trip(name in "[ -~é]{0,40}") {
            let quoted = name.replace('\\', "\\\\").replace('"', "\\\"");
            let value = format!("form-data; name=\"file\"; filename=\"{quoted}\"");
            prop_assert_eq!(file_name(value.as_bytes()), Some(FileName::Text(name)));
        }
    }
}

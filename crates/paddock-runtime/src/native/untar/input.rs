//! The archive as the tar crate reads it: counted, capped, and watched for its end, with flags that
//! let the caller tell its failures apart by what the reader saw (the input's, a limit, the
//! archive's, the tree's). Turning a [`Failure`] into an error is the caller's: an import and an
//! image layer answer with different errors.

use std::cell::Cell;
use std::io::{self, Read};
use std::rc::Rc;

use super::CHUNK;

/// Most bytes read while looking for one member: its header plus any pax / GNU long-name extension
/// headers before it, which the tar crate reads into memory.
pub(crate) const MAX_METADATA_BYTES: u64 = 1 << 20;

/// What went wrong inside the tar crate, told apart by what the reader saw; `E` is the caller's
/// error for a failure writing the tree.
#[derive(Debug)]
pub(crate) enum Failure<E> {
    /// The archive is malformed or unsafe.
    Invalid(String),
    /// An I/O error: the input's (classified by [`InputState`]) or the tree's.
    Io(io::Error),
    /// Writing the tree failed.
    Tree(E),
}

impl<E> From<io::Error> for Failure<E> {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// A member's modification time: `header_mtime` unless a pax `mtime` record (with its fraction)
/// says otherwise. A sparse member (`GNU.sparse*` records) is refused with "member PATH is a sparse
/// file, `sparse`", each unpacker saying why in its own words.
pub(crate) fn pax_mtime<R: Read, E>(
    entry: &mut tar::Entry<'_, R>,
    path: &super::member_path::MemberPath,
    header_mtime: (i64, u32),
    sparse: &str,
) -> Result<(i64, u32), Failure<E>> {
    let mut mtime = header_mtime;
    if let Some(records) = entry.pax_extensions().map_err(Failure::Io)? {
        for record in records {
            let record = record
                .map_err(|e| Failure::Invalid(format!("member {}: bad pax record: {e}", path.display())))?;
            match record.key_bytes() {
                b"mtime" => {
                    mtime = parse_time(record.value_bytes()).ok_or_else(|| {
                        Failure::Invalid(format!("member {}: bad pax mtime", path.display()))
                    })?;
                }
                key if key.starts_with(b"GNU.sparse") => {
                    return Err(Failure::Invalid(format!(
                        "member {} is a sparse file, {sparse}",
                        path.display()
                    )))
                }
                _ => {}
            }
        }
    }
    Ok(mtime)
}

/// Parses a pax timestamp (`1700000000`, `1700000000.5`, `-1.25`); `None` if malformed. Digits of
/// fraction past nanoseconds are dropped.
pub(crate) fn parse_time(text: &[u8]) -> Option<(i64, u32)> {
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

/// Counters shared between the reader the tar crate owns and the importer.
pub(crate) struct InputState {
    pub(crate) max_bytes: u64,
    pub(crate) read: Cell<u64>,
    /// Bytes left before the current metadata window is exceeded (`None`: no window).
    pub(crate) window: Cell<Option<u64>>,
    pub(crate) eof: Cell<bool>,
    pub(crate) too_large: Cell<bool>,
    pub(crate) metadata_too_large: Cell<bool>,
    pub(crate) source_failed: Cell<bool>,
}

impl InputState {
    pub(crate) fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes,
            read: Cell::new(0),
            window: Cell::new(None),
            eof: Cell::new(false),
            too_large: Cell::new(false),
            metadata_too_large: Cell::new(false),
            source_failed: Cell::new(false),
        }
    }
}

/// The input as the tar crate reads it: counted, capped, and watched for its end.
pub(crate) struct Input<'a> {
    pub(crate) inner: &'a mut dyn Read,
    pub(crate) state: Rc<InputState>,
}

impl Read for Input<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let s = &self.state;
        if buf.is_empty() {
            return Ok(0);
        }
        // One byte more than allowed may be read, so that an archive of exactly the limit passes and
        // one byte over does not.
        let allowed = (s.max_bytes + 1).saturating_sub(s.read.get());
        let allowed = s.window.get().map_or(allowed, |w| allowed.min(w + 1));
        let len = buf
            .len()
            .min(usize::try_from(allowed).unwrap_or(usize::MAX))
            .max(1);
        let n = match self.inner.read(&mut buf[..len]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Err(e),
            Err(e) => {
                s.source_failed.set(true);
                return Err(e);
            }
        };
        if n == 0 {
            s.eof.set(true);
            return Ok(0);
        }
        s.read.set(s.read.get() + n as u64);
        if s.read.get() > s.max_bytes {
            s.too_large.set(true);
            return Err(io::Error::other("the archive exceeds the import limit"));
        }
        if let Some(w) = s.window.get() {
            if n as u64 > w {
                s.metadata_too_large.set(true);
                return Err(io::Error::other("a member's headers are too large"));
            }
            s.window.set(Some(w - n as u64));
        }
        Ok(n)
    }
}

/// After the last member: the stream must have had an end-of-archive block (the tar crate stops at
/// the first zero block, or at the end of the input, which is a truncation), and only zeros may
/// follow it.
pub(crate) fn check_end<E>(reader: &mut Input<'_>, state: &InputState) -> Result<(), Failure<E>> {
    if state.eof.get() {
        return Err(Failure::Invalid(
            "the archive is truncated: it ends without an end-of-archive marker".into(),
        ));
    }
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Failure::Io(e)),
        };
        if buf[..n].iter().any(|&b| b != 0) {
            return Err(Failure::Invalid(
                "the archive has data after its end-of-archive marker".into(),
            ));
        }
    }
}

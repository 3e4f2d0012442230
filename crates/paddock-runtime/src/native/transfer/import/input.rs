//! The archive as the tar crate reads it: counted, capped, watched for its end, and the failures
//! told apart by what the reader saw (the input's, a limit, the archive's, the tree's).

use std::cell::Cell;
use std::io::{self, Read};
use std::path::Path;
use std::rc::Rc;

use super::CHUNK;
use crate::RuntimeError;

/// Most bytes read while looking for one member: its header plus any pax / GNU long-name extension
/// headers before it, which the tar crate reads into memory.
pub(crate) const MAX_METADATA_BYTES: u64 = 1 << 20;

/// What went wrong inside the tar crate, told apart by what the reader saw.
#[derive(Debug)]
pub(super) enum Failure {
    /// The archive is malformed or unsafe.
    Invalid(String),
    /// An I/O error: the input's (classified by [`InputState`]) or the tree's.
    Io(io::Error),
    /// Writing the tree failed.
    Tree(RuntimeError),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// Counters shared between the reader the tar crate owns and the importer.
pub(super) struct InputState {
    pub(super) max_bytes: u64,
    pub(super) read: Cell<u64>,
    /// Bytes left before the current metadata window is exceeded (`None`: no window).
    pub(super) window: Cell<Option<u64>>,
    pub(super) eof: Cell<bool>,
    pub(super) too_large: Cell<bool>,
    pub(super) metadata_too_large: Cell<bool>,
    pub(super) source_failed: Cell<bool>,
}

impl InputState {
    pub(super) fn new(max_bytes: u64) -> Self {
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

    /// Turns a failure into the error the caller answers with: what the reader saw first (the input
    /// failed, a limit was hit, the input ended early), then the failure itself. A write into `root`
    /// that found the pool full is the pool's failure, not the archive's.
    pub(super) fn classify(&self, failure: Failure, root: &Path) -> RuntimeError {
        if self.source_failed.get() {
            let source = match failure {
                Failure::Io(e) => e,
                other => io::Error::other(format!("{other:?}")),
            };
            return RuntimeError::Stream { what: "read", source };
        }
        if self.too_large.get() {
            return RuntimeError::ArchiveTooLarge(format!(
                "the archive is larger than the import limit of {} bytes",
                self.max_bytes
            ));
        }
        if self.metadata_too_large.get() {
            return RuntimeError::InvalidArchive(format!(
                "a member's headers are larger than {MAX_METADATA_BYTES} bytes"
            ));
        }
        match failure {
            Failure::Io(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
                ) =>
            {
                RuntimeError::Pool {
                    what: "write the imported files into",
                    path: root.to_owned(),
                    source: e,
                }
            }
            Failure::Invalid(message) => RuntimeError::InvalidArchive(message),
            Failure::Tree(e) => e,
            Failure::Io(e) if self.eof.get() || e.kind() == io::ErrorKind::UnexpectedEof => {
                RuntimeError::InvalidArchive(format!("the archive is truncated ({e})"))
            }
            // Everything else the tar crate reports is about the archive's structure (checksums,
            // numeric fields, sizes).
            Failure::Io(e) => RuntimeError::InvalidArchive(e.to_string()),
        }
    }
}

/// The input as the tar crate reads it: counted, capped, and watched for its end.
pub(super) struct Input<'a> {
    pub(super) inner: &'a mut dyn Read,
    pub(super) state: Rc<InputState>,
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
pub(super) fn check_end(reader: &mut Input<'_>, state: &InputState) -> Result<(), Failure> {
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

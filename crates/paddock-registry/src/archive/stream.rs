//! The archive's byte stream: its compression told by its first bytes, every byte counted and
//! bounded both as it arrives and as it is decompressed, and a failure told apart by where it
//! happened (the caller's reader, the bound, the decompressor, a blob being written beside it).
//!
//! It does not parse tar: `entries.rs` does, from this stream.

use std::cell::{Cell, RefCell};
use std::io::{self, BufReader, Read};
use std::path::PathBuf;
use std::rc::Rc;

use crate::error::RegistryError;

use super::blobs::BlobWriter;

/// How the archive stream is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Compression {
    None,
    Gzip,
}

/// Compressions recognised by their magic bytes only to be refused with a clear message.
const REFUSED: &[(&[u8], &str)] = &[
    (&[0x28, 0xb5, 0x2f, 0xfd], "zstd-compressed tar"),
    (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz-compressed tar"),
];
const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
/// The most bytes any magic above needs.
const MAGIC_LEN: usize = 6;

/// Where a read failed, recorded by the layer that saw it (the decompressor may rewrap errors
/// passing through it, so the error alone does not say).
#[derive(Debug)]
enum Fault {
    /// More bytes than the limit, before or after decompression.
    TooLarge,
    /// The caller's reader failed.
    Input,
    /// Writing the raw stream to its blob failed.
    Write(PathBuf),
}

#[derive(Debug)]
struct State {
    limit: u64,
    compression: Compression,
    /// Bytes handed to the reader of the stream (decompressed).
    read: Cell<u64>,
    fault: RefCell<Option<Fault>>,
}

/// The archive stream, decompressed, bounded and counted. Read errors are turned into a
/// [`RegistryError`] by [`Stream::error`].
pub(super) struct Stream<'a> {
    reader: Meter<Box<dyn Read + 'a>>,
    state: Rc<State>,
}

impl std::fmt::Debug for Stream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl<'a> Stream<'a> {
    /// Opens `input`, at most `limit` bytes as it arrives and as decompressed. With `raw_copy`,
    /// every byte as it arrives (compressed or not) is also written to that blob.
    pub(super) fn open(
        input: &'a mut dyn Read,
        limit: u64,
        raw_copy: Option<&'a mut BlobWriter>,
    ) -> Result<Self, RegistryError> {
        let mut magic = Vec::with_capacity(MAGIC_LEN);
        input
            .take(MAGIC_LEN as u64)
            .read_to_end(&mut magic)
            .map_err(|source| RegistryError::ReadArchive { source })?;
        if let Some((_, name)) = REFUSED.iter().find(|(m, _)| magic.starts_with(m)) {
            return Err(RegistryError::UnsupportedMediaType {
                what: "archive".into(),
                media_type: (*name).into(),
            });
        }
        let compression = if magic.starts_with(GZIP_MAGIC) {
            Compression::Gzip
        } else {
            Compression::None
        };
        let state = Rc::new(State {
            limit,
            compression,
            read: Cell::new(0),
            fault: RefCell::new(None),
        });
        let arriving = Meter {
            inner: io::Cursor::new(magic).chain(input),
            count: 0,
            arriving: true,
            state: Rc::clone(&state),
        };
        let arriving: Box<dyn Read + 'a> = match raw_copy {
            Some(blob) => Box::new(Tee {
                inner: arriving,
                blob,
                state: Rc::clone(&state),
            }),
            None => Box::new(arriving),
        };
        let decoded: Box<dyn Read + 'a> = match compression {
            Compression::None => arriving,
            Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(BufReader::with_capacity(
                1 << 16,
                arriving,
            ))),
        };
        Ok(Self {
            reader: Meter {
                inner: decoded,
                count: 0,
                arriving: false,
                state: Rc::clone(&state),
            },
            state,
        })
    }

    pub(super) fn compression(&self) -> Compression {
        self.state.compression
    }

    /// Bytes read so far, decompressed: what the limit bounds.
    pub(super) fn bytes_read(&self) -> u64 {
        self.state.read.get()
    }

    /// What a read error of this stream means.
    pub(super) fn error(&self, e: io::Error) -> RegistryError {
        match self.state.fault.borrow_mut().take() {
            Some(Fault::TooLarge) => RegistryError::TooLarge {
                what: "the archive stream".into(),
                limit: self.state.limit,
            },
            Some(Fault::Input) => RegistryError::ReadArchive { source: e },
            Some(Fault::Write(path)) => RegistryError::io("write", path, e),
            None => match self.state.compression {
                Compression::Gzip => {
                    RegistryError::invalid_archive(format!("the gzip stream is damaged or truncated: {e}"))
                }
                Compression::None => {
                    RegistryError::invalid_archive(format!("the stream cannot be read: {e}"))
                }
            },
        }
    }
}

impl Read for Stream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.reader.read(buf)?;
        self.state.read.set(self.reader.count);
        Ok(n)
    }
}

/// Counts what passes and fails once past the limit; on the arriving side, marks a failure of
/// the caller's reader.
struct Meter<R> {
    inner: R,
    count: u64,
    arriving: bool,
    state: Rc<State>,
}

impl<R: Read> Read for Meter<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = match self.inner.read(buf) {
            Ok(n) => n,
            Err(e) => {
                if self.arriving && e.kind() != io::ErrorKind::Interrupted {
                    self.state.fault.borrow_mut().get_or_insert(Fault::Input);
                }
                return Err(e);
            }
        };
        self.count = self.count.saturating_add(n as u64);
        if self.count > self.state.limit {
            self.state.fault.borrow_mut().get_or_insert(Fault::TooLarge);
            return Err(io::Error::other("the archive stream is past its limit"));
        }
        Ok(n)
    }
}

/// Copies every byte read through it to a blob.
struct Tee<'a, R> {
    inner: R,
    blob: &'a mut BlobWriter,
    state: Rc<State>,
}

impl<R: Read> Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Err(e) = self.blob.write_io(&buf[..n]) {
            self.state
                .fault
                .borrow_mut()
                .get_or_insert(Fault::Write(self.blob.path().to_owned()));
            return Err(e);
        }
        Ok(n)
    }
}

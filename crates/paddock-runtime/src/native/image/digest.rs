//! Content digests of OCI blobs, and a reader that checks a blob against its descriptor as it is
//! streamed.
//!
//! Only `sha256:` digests are accepted (the only algorithm registries and the OCI spec require);
//! any other algorithm is [`ImageError::Unsupported`]. This module does not read files: callers hand
//! [`VerifiedReader`] whatever they read the blob from.

use std::fmt;
use std::io::{self, Read};
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

use super::ImageError;

/// A blob's digest: `sha256:` and 64 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest {
    sha256: [u8; 32],
}

impl Digest {
    /// The 64 lowercase hex digits (the blob's file name in a layout's `blobs/sha256/`).
    pub fn hex(&self) -> String {
        hex::encode(self.sha256)
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self {
            sha256: Sha256::digest(bytes).into(),
        }
    }
}

impl FromStr for Digest {
    type Err = ImageError;

    fn from_str(s: &str) -> Result<Self, ImageError> {
        let Some((algorithm, encoded)) = s.split_once(':') else {
            return Err(ImageError::invalid_image(format!(
                "digest {s:?} has no algorithm"
            )));
        };
        if algorithm != "sha256" {
            return Err(ImageError::unsupported(format!(
                "digest algorithm {algorithm:?} (only sha256 is supported)"
            )));
        }
        let lower_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if encoded.len() != 64 || !encoded.bytes().all(lower_hex) {
            return Err(ImageError::invalid_image(format!(
                "digest {s:?} is not sha256: and 64 lowercase hex digits"
            )));
        }
        let mut sha256 = [0u8; 32];
        hex::decode_to_slice(encoded, &mut sha256)
            .map_err(|e| ImageError::invalid_image(format!("digest {s:?}: {e}")))?;
        Ok(Self { sha256 })
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

/// Streams a blob through SHA-256 and a size cap: reading past the declared size fails, and at the
/// end of the input a size or digest other than the descriptor's fails. The failures are
/// `io::Error`s of kind `InvalidData` wrapping an [`ImageError::InvalidImage`] (see
/// [`image_error`]), so whoever reads through layers of decoders still gets the typed error.
///
/// Bytes are handed on before the end is reached: a consumer must treat what it read as untrusted
/// until it has read to the end (an `Ok(0)`) without error.
pub struct VerifiedReader<R> {
    inner: R,
    expected: Digest,
    size: u64,
    read: u64,
    hasher: Sha256,
    done: bool,
}

impl<R> fmt::Debug for VerifiedReader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifiedReader")
            .field("expected", &self.expected)
            .field("size", &self.size)
            .field("read", &self.read)
            .finish_non_exhaustive()
    }
}

impl<R: Read> VerifiedReader<R> {
    /// Checks `inner` against `expected` and `size`.
    pub fn new(inner: R, expected: Digest, size: u64) -> Self {
        Self {
            inner,
            expected,
            size,
            read: 0,
            hasher: Sha256::new(),
            done: false,
        }
    }

    /// Reads what is left to the end, checking it (for a consumer that stops early, like a
    /// decompressor at the end of its stream): the whole blob must be what the descriptor says.
    pub fn finish(&mut self) -> io::Result<()> {
        let mut buf = [0u8; 8192];
        while self.read(&mut buf)? != 0 {}
        Ok(())
    }

    fn fail(&self, reason: String) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, ImageError::invalid_image(reason))
    }
}

impl<R: Read> Read for VerifiedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        // One byte past the declared size may be asked for, to tell a longer blob from one of
        // exactly the size.
        let allowed = (self.size + 1).saturating_sub(self.read);
        let len = buf.len().min(usize::try_from(allowed).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..len])?;
        if n == 0 {
            if self.read != self.size {
                return Err(self.fail(format!(
                    "blob {} has {} bytes, its descriptor says {}",
                    self.expected, self.read, self.size
                )));
            }
            let actual: [u8; 32] = self.hasher.clone().finalize().into();
            if actual != self.expected.sha256 {
                return Err(self.fail(format!(
                    "blob {} has digest {}",
                    self.expected,
                    Digest { sha256: actual }
                )));
            }
            self.done = true;
            return Ok(0);
        }
        self.read += n as u64;
        if self.read > self.size {
            return Err(self.fail(format!(
                "blob {} is longer than its descriptor's {} bytes",
                self.expected, self.size
            )));
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// The [`ImageError`] an `io::Error` carries, if it came from a [`VerifiedReader`] (or anything else
/// that wraps one); `Err` gives the error back.
pub fn image_error(e: io::Error) -> Result<ImageError, io::Error> {
    if e.get_ref().is_some_and(|inner| inner.is::<ImageError>()) {
        let inner = e.into_inner().expect("checked above");
        return Ok(*inner.downcast::<ImageError>().expect("checked above"));
    }
    Err(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(r: &mut impl Read) -> Result<Vec<u8>, ImageError> {
        let mut out = Vec::new();
        r.read_to_end(&mut out)
            .map_err(|e| image_error(e).expect("an image error"))?;
        Ok(out)
    }

    #[test]
    fn digests_parse_sha256_only() {
        let d = Digest::of(b"hello");
        let shown = d.to_string();
        assert_eq!(
            shown,
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(shown.parse::<Digest>().expect("parse"), d);
        for bad in [
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
            "sha256:2CF24DBA5FB0A30E26E83B2AC5B9E29E1B161E5C1FA7425E73043362938B9824",
            "sha256:2cf24d",
            "sha256:../../etc/passwd",
            "sha256:zzf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
        ] {
            let e = bad.parse::<Digest>().expect_err(bad);
            assert!(matches!(e, ImageError::InvalidImage { .. }), "{bad}: {e:?}");
        }
        for other in [
            "sha512:cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce",
            "md5:5d41402abc4b2a76b9719d911017c592",
        ] {
            let e = other.parse::<Digest>().expect_err(other);
            assert!(matches!(e, ImageError::Unsupported { .. }), "{other}: {e:?}");
        }
    }

    #[test]
    fn a_blob_must_match_its_descriptor() {
        let blob = b"layer bytes".to_vec();
        let d = Digest::of(&blob);
        let n = blob.len() as u64;
        let ok = read_all(&mut VerifiedReader::new(&blob[..], d, n)).expect("matches");
        assert_eq!(ok, blob);

        let wrong = Digest::of(b"other");
        let e = read_all(&mut VerifiedReader::new(&blob[..], wrong, n)).expect_err("wrong digest");
        assert!(e.to_string().contains("has digest"), "{e}");

        let e = read_all(&mut VerifiedReader::new(&blob[..], d, n + 1)).expect_err("short");
        assert!(e.to_string().contains("descriptor says"), "{e}");

        // Longer than declared: refused as soon as the extra byte is read, before any digest.
        let mut r = VerifiedReader::new(&blob[..], d, n - 1);
        let mut buf = vec![0u8; blob.len() - 1];
        r.read_exact(&mut buf).expect("the declared bytes read");
        let e = read_all(&mut r).expect_err("past the size");
        assert!(e.to_string().contains("longer than"), "{e}");

        // finish() checks what a consumer did not read.
        let mut r = VerifiedReader::new(&blob[..], wrong, n);
        let mut first = [0u8; 3];
        r.read_exact(&mut first).expect("some bytes");
        let e = image_error(r.finish().expect_err("finish checks")).expect("typed");
        assert!(matches!(e, ImageError::InvalidImage { .. }), "{e:?}");
    }
}

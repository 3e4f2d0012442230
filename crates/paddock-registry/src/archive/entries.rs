//! The tar stream, header by header: each member (its raw name, type, link target and size) is
//! handed over with a reader of exactly its data, pax and GNU long-name headers applied.
//!
//! The tar crate parses each 512-byte header; the loop is ours so that every bound holds on hostile
//! input: extension headers (pax, GNU long names) are read into memory only up to
//! [`MAX_EXTENSION_BYTES`], members are counted, a stream that ends anywhere but at the
//! end-of-archive block is truncated (an error, never a shorter archive), and GNU sparse members
//! (whose zeros would come from nowhere in the stream) are refused.
//!
//! It does not judge names or create anything: `members.rs` does what a member means.

use std::io::Read;

use tar::{EntryType, Header, PaxExtensions};

use crate::error::RegistryError;

use super::stream::Stream;

/// The largest pax or GNU long-name header read.
pub(super) const MAX_EXTENSION_BYTES: u64 = 1 << 20;
const BLOCK: u64 = 512;

/// What a member is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum MemberKind {
    File,
    Directory,
    Symlink(Vec<u8>),
    HardLink(Vec<u8>),
    /// A device, fifo or unknown type.
    Other,
}

/// A member's header, extensions applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Member {
    pub name: Vec<u8>,
    pub kind: MemberKind,
    pub size: u64,
}

/// The data of the member being visited: exactly its size, or a truncation error.
#[derive(Debug)]
pub(super) struct MemberData<'s, 'a> {
    stream: &'s mut Stream<'a>,
    left: u64,
}

impl MemberData<'_, '_> {
    /// Reads the next bytes of the member into `buf`; 0 at its end.
    pub(super) fn read(&mut self, buf: &mut [u8]) -> Result<usize, RegistryError> {
        if self.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = buf.len().min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = loop {
            match self.stream.read(&mut buf[..want]) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.stream.error(e)),
            }
        };
        if n == 0 {
            return Err(truncated());
        }
        self.left -= n as u64;
        Ok(n)
    }

    /// Reads the whole member into memory (the caller bounds its size).
    pub(super) fn read_all(&mut self) -> Result<Vec<u8>, RegistryError> {
        let mut bytes = vec![0; usize::try_from(self.left).unwrap_or(usize::MAX)];
        let mut at = 0;
        while at < bytes.len() {
            at += self.read(&mut bytes[at..])?;
        }
        Ok(bytes)
    }

    /// Reads and drops what is left.
    fn skip_rest(&mut self) -> Result<(), RegistryError> {
        let mut buf = [0u8; 8192];
        while self.read(&mut buf)? > 0 {}
        Ok(())
    }
}

fn truncated() -> RegistryError {
    RegistryError::invalid_archive("the tar stream is truncated")
}

/// Extension headers waiting for the member they describe.
#[derive(Debug, Default)]
struct Pending {
    pax: Option<Vec<u8>>,
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
}

/// Reads every member of the tar `stream` to its end-of-archive block, calling `visit` with each
/// (at most `max_members`) and a reader of its data (what `visit` leaves unread is skipped).
pub(super) fn read_entries(
    stream: &mut Stream<'_>,
    max_members: u64,
    visit: &mut dyn FnMut(&Member, &mut MemberData<'_, '_>) -> Result<(), RegistryError>,
) -> Result<(), RegistryError> {
    let mut block = [0u8; BLOCK as usize];
    let mut pending = Pending::default();
    let mut members = 0u64;
    let mut offset = 0u64;
    loop {
        if !read_block(stream, &mut block, offset)? {
            return Err(if offset == 0 {
                RegistryError::invalid_archive("the stream is empty")
            } else {
                RegistryError::invalid_archive("the tar stream ends without its end-of-archive block")
            });
        }
        if block.iter().all(|b| *b == 0) {
            if pending.pax.is_some() || pending.long_name.is_some() || pending.long_link.is_some() {
                return Err(RegistryError::invalid_archive(
                    "an extension header describes no member",
                ));
            }
            return Ok(());
        }
        let header = Header::from_byte_slice(&block);
        check_checksum(header, offset)?;
        let bad =
            |what: &str| RegistryError::invalid_archive(format!("bad tar header at offset {offset}: {what}"));
        let mut size = header.entry_size().map_err(|_| bad("unreadable size"))?;
        let entry_type = header.entry_type();
        match entry_type {
            EntryType::XHeader | EntryType::GNULongName | EntryType::GNULongLink => {
                let slot = match entry_type {
                    EntryType::XHeader => &mut pending.pax,
                    EntryType::GNULongName => &mut pending.long_name,
                    _ => &mut pending.long_link,
                };
                if slot.is_some() {
                    return Err(bad("two extension headers of one kind for one member"));
                }
                if size > MAX_EXTENSION_BYTES {
                    return Err(RegistryError::TooLarge {
                        what: "a pax or long-name header".into(),
                        limit: MAX_EXTENSION_BYTES,
                    });
                }
                let mut data = MemberData {
                    stream: &mut *stream,
                    left: size,
                };
                *slot = Some(data.read_all()?);
            }
            EntryType::XGlobalHeader => MemberData {
                stream: &mut *stream,
                left: size,
            }
            .skip_rest()?,
            EntryType::GNUSparse => {
                return Err(RegistryError::invalid_archive(
                    "GNU sparse members are not supported",
                ))
            }
            _ => {
                members += 1;
                if members > max_members {
                    return Err(RegistryError::TooManyMembers { limit: max_members });
                }
                let pending = std::mem::take(&mut pending);
                let mut name = header.path_bytes().into_owned();
                let mut link = header.link_name_bytes().map(|l| l.into_owned());
                if let Some(long) = pending.long_name {
                    name = trim_nuls(long);
                }
                if let Some(long) = pending.long_link {
                    link = Some(trim_nuls(long));
                }
                if let Some(pax) = &pending.pax {
                    for ext in PaxExtensions::new(pax) {
                        let ext = ext.map_err(|_| bad("unreadable pax header"))?;
                        match ext.key_bytes() {
                            b"path" => name = ext.value_bytes().to_vec(),
                            b"linkpath" => link = Some(ext.value_bytes().to_vec()),
                            b"size" => {
                                size = std::str::from_utf8(ext.value_bytes())
                                    .ok()
                                    .and_then(|s| s.parse().ok())
                                    .ok_or_else(|| bad("unreadable pax size"))?;
                            }
                            _ => {}
                        }
                    }
                }
                let kind = match entry_type {
                    // Old tars mark directories as files whose name ends with a slash.
                    EntryType::Regular | EntryType::Continuous if name.ends_with(b"/") => {
                        MemberKind::Directory
                    }
                    EntryType::Regular | EntryType::Continuous => MemberKind::File,
                    EntryType::Directory => MemberKind::Directory,
                    EntryType::Symlink => MemberKind::Symlink(link.unwrap_or_default()),
                    EntryType::Link => MemberKind::HardLink(link.unwrap_or_default()),
                    _ => MemberKind::Other,
                };
                let member = Member { name, kind, size };
                let mut data = MemberData {
                    stream: &mut *stream,
                    left: size,
                };
                visit(&member, &mut data)?;
                data.skip_rest()?;
            }
        }
        let padding = (BLOCK - size % BLOCK) % BLOCK;
        MemberData {
            stream: &mut *stream,
            left: padding,
        }
        .skip_rest()?;
        offset = [BLOCK, size, padding]
            .into_iter()
            .try_fold(offset, u64::checked_add)
            .ok_or_else(|| bad("size overflow"))?;
    }
}

/// Reads the block at `offset`: false at the stream's end before it, an error when it ends
/// inside it.
fn read_block(stream: &mut Stream<'_>, block: &mut [u8], offset: u64) -> Result<bool, RegistryError> {
    let mut at = 0;
    while at < block.len() {
        match stream.read(&mut block[at..]) {
            Ok(0) if at == 0 => return Ok(false),
            Ok(0) if offset == 0 => {
                return Err(RegistryError::invalid_archive(
                    "the stream is not a tar archive (shorter than one header)",
                ))
            }
            Ok(0) => return Err(truncated()),
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(stream.error(e)),
        }
    }
    Ok(true)
}

/// The header's checksum, as tar computes it (its own field counted as spaces).
fn check_checksum(header: &Header, offset: u64) -> Result<(), RegistryError> {
    let bytes = header.as_bytes();
    let sum: u32 = bytes[..148]
        .iter()
        .chain(&bytes[156..])
        .map(|b| u32::from(*b))
        .sum::<u32>()
        + 8 * u32::from(b' ');
    match header.cksum() {
        Ok(c) if c == sum => Ok(()),
        _ if offset == 0 => Err(RegistryError::invalid_archive("the stream is not a tar archive")),
        _ => Err(RegistryError::invalid_archive(format!(
            "bad tar header checksum at offset {offset}"
        ))),
    }
}

fn trim_nuls(mut bytes: Vec<u8>) -> Vec<u8> {
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes
}

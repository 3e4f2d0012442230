//! Framing: `[u32 BE header_len][u32 BE payload_len][header JSON][payload bytes]`.
//!
//! Hand-written rather than taken from a codec crate because the format is eight bytes of lengths and
//! must stay byte-for-byte stable across the host and every agent build; both limits are checked before
//! any allocation, so a hostile peer cannot make the reader allocate more than the limits.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Largest JSON header accepted (64 KiB).
pub const MAX_HEADER_LEN: usize = 64 * 1024;
/// Largest payload accepted in one frame (1 MiB). Writers split bigger data into several frames.
pub const MAX_PAYLOAD_LEN: usize = 1024 * 1024;
/// Length of the fixed prefix.
pub const PREFIX_LEN: usize = 8;

/// A decoded frame: a typed header and its raw payload (possibly empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<T> {
    /// The message.
    pub header: T,
    /// Bytes that travel with it (output, stdin, file data).
    pub payload: Vec<u8>,
}

/// Why bytes are not a valid frame.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The header length exceeds [`MAX_HEADER_LEN`].
    #[error("frame header of {0} bytes exceeds the limit")]
    HeaderTooLarge(usize),
    /// The payload length exceeds [`MAX_PAYLOAD_LEN`].
    #[error("frame payload of {0} bytes exceeds the limit")]
    PayloadTooLarge(usize),
    /// The header is not valid JSON for the expected message type.
    #[error("malformed frame header")]
    Header(#[source] serde_json::Error),
    /// The header could not be serialized.
    #[error("failed to encode frame header")]
    Encode(#[source] serde_json::Error),
}

/// Parses the 8-byte prefix into (header length, payload length), enforcing the limits.
pub fn decode_prefix(prefix: [u8; PREFIX_LEN]) -> Result<(usize, usize), FrameError> {
    let header_len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    let payload_len = u32::from_be_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]) as usize;
    if header_len > MAX_HEADER_LEN {
        return Err(FrameError::HeaderTooLarge(header_len));
    }
    if payload_len > MAX_PAYLOAD_LEN {
        return Err(FrameError::PayloadTooLarge(payload_len));
    }
    Ok((header_len, payload_len))
}

/// Encodes a frame into `out` (appending).
pub fn encode_frame<T: Serialize>(header: &T, payload: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError> {
    if payload.len() > MAX_PAYLOAD_LEN {
        return Err(FrameError::PayloadTooLarge(payload.len()));
    }
    let json = serde_json::to_vec(header).map_err(FrameError::Encode)?;
    if json.len() > MAX_HEADER_LEN {
        return Err(FrameError::HeaderTooLarge(json.len()));
    }
    out.reserve(PREFIX_LEN + json.len() + payload.len());
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(payload);
    Ok(())
}

/// Decodes one frame from the front of `buf`. Returns `Ok(None)` when `buf` holds an incomplete frame,
/// or the frame and the number of bytes it used.
pub fn decode_frame<T: DeserializeOwned>(buf: &[u8]) -> Result<Option<(Frame<T>, usize)>, FrameError> {
    let Some(prefix) = buf.get(..PREFIX_LEN) else {
        return Ok(None);
    };
    let mut p = [0u8; PREFIX_LEN];
    p.copy_from_slice(prefix);
    let (header_len, payload_len) = decode_prefix(p)?;
    let total = PREFIX_LEN + header_len + payload_len;
    if buf.len() < total {
        return Ok(None);
    }
    let header =
        serde_json::from_slice(&buf[PREFIX_LEN..PREFIX_LEN + header_len]).map_err(FrameError::Header)?;
    let payload = buf[PREFIX_LEN + header_len..total].to_vec();
    Ok(Some((Frame { header, payload }, total)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClientMessage, Request};
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let msg = ClientMessage {
            id: 7,
            request: Request::ListProcesses,
        };
        let mut buf = Vec::new();
        encode_frame(&msg, b"abc", &mut buf).expect("encodes");
        assert!(decode_frame::<ClientMessage>(&buf[..buf.len() - 1])
            .expect("ok")
            .is_none());
        let (frame, used) = decode_frame::<ClientMessage>(&buf)
            .expect("ok")
            .expect("complete");
        assert_eq!(used, buf.len());
        assert_eq!(frame.header, msg);
        assert_eq!(frame.payload, b"abc");
    }

    #[test]
    fn limits_are_checked_before_allocation() {
        let mut buf = Vec::new();
        buf.extend_from_slice(&u32::MAX.to_be_bytes());
        buf.extend_from_slice(&0u32.to_be_bytes());
        assert!(matches!(
            decode_frame::<ClientMessage>(&buf),
            Err(FrameError::HeaderTooLarge(_))
        ));
        let mut buf = Vec::new();
        buf.extend_from_slice(&2u32.to_be_bytes());
        buf.extend_from_slice(&(MAX_PAYLOAD_LEN as u32 + 1).to_be_bytes());
        assert!(matches!(
            decode_frame::<ClientMessage>(&buf),
            Err(FrameError::PayloadTooLarge(_))
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_frame::<ClientMessage>(&bytes);
            let _ = decode_frame::<crate::AgentMessage>(&bytes);
        }
    }
}

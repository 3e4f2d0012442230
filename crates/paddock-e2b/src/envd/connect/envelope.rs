//! Connect's envelopes: `flags | length (u32, big endian) | payload`, written whole and read
//! incrementally with a bound on the length.
//!
//! It does not decompress (no compression is negotiated, so a compressed flag is refused).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::{ConnectCode, ConnectError};

use super::invalid;

/// Envelope flag: the payload is compressed.
const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: the end-of-stream message.
pub const FLAG_END_STREAM: u8 = 0x02;

/// One envelope: `flags | length (u32, big endian) | payload`.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + payload.len());
    out.put_u8(flags);
    out.put_u32(payload.len() as u32);
    out.put_slice(payload);
    out.freeze()
}

/// The end-of-stream envelope: `{}`, or `{"error": {...}}`.
pub fn end_stream(error: Option<&ConnectError>) -> Bytes {
    let body = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({ "error": e.to_json() }),
    };
    envelope(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// Reads envelopes out of bytes as they arrive, refusing any whose length passes the bound before
/// its payload is buffered.
#[derive(Debug)]
pub struct EnvelopeDecoder {
    buf: BytesMut,
    max: usize,
}

impl EnvelopeDecoder {
    /// A decoder of envelopes of at most `max` payload bytes.
    pub fn new(max: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            max,
        }
    }

    /// Adds bytes received.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete envelope (flags, payload), `None` when more bytes are needed; an error for
    /// an oversized envelope (`resource_exhausted`) or an unknown or compressed flag
    /// (`invalid_argument`: this server negotiates no compression).
    pub fn next_envelope(&mut self) -> Result<Option<(u8, Bytes)>, ConnectError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if flags & FLAG_COMPRESSED != 0 {
            return Err(invalid(
                "a compressed envelope, but no compression was negotiated",
            ));
        }
        if flags & !(FLAG_COMPRESSED | FLAG_END_STREAM) != 0 {
            return Err(invalid(format!("unknown envelope flags {flags:#04x}")));
        }
        if len > self.max {
            return Err(ConnectError::new(
                ConnectCode::ResourceExhausted,
                format!(
                    "a message of {len} bytes is larger than the limit of {} bytes",
                    self.max
                ),
            ));
        }
        if self.buf.len() < 5 + len {
            self.buf.reserve(5 + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(5);
        Ok(Some((flags, self.buf.split_to(len).freeze())))
    }

    /// The input ended: fine between envelopes, `invalid_argument` inside one.
    pub fn finish(&self) -> Result<(), ConnectError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(invalid(format!(
                "the request ended inside an envelope ({} bytes left over)",
                self.buf.len()
            )))
        }
    }
}

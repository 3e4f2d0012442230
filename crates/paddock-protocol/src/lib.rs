//! The wire protocol between the host and paddock's in-sandbox agent.
//!
//! One protocol for every backend (native, gVisor, Kubernetes): the host opens a byte stream to the
//! agent (a unix socket for the native backend) and both sides exchange [frames](frame). A frame is a
//! JSON header (a [`ClientMessage`] or an [`AgentMessage`]) plus an optional raw payload, so bulk bytes
//! (process output, stdin, file contents) never pay for JSON escaping or base64.
//!
//! Versioning: the first request on a connection is [`Request::Hello`] with [`PROTOCOL_VERSION`]; the
//! agent answers with its own version or refuses with [`ErrorCode::UnsupportedVersion`]. Within a major
//! version, messages only gain optional fields (`#[serde(default)]`) and new variants; see
//! COMPATIBILITY.md. The golden test in `tests/golden.rs` freezes the JSON shape of every message.
//!
//! This crate does no I/O beyond encoding into and decoding from byte buffers.

pub mod frame;
pub mod kernel;
mod messages;

pub use frame::{
    decode_frame, decode_prefix, encode_frame, Frame, FrameError, MAX_HEADER_LEN, MAX_PAYLOAD_LEN, PREFIX_LEN,
};
pub use messages::*;

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;

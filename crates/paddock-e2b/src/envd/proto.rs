//! envd's protobuf messages (`process.proto` and `filesystem.proto`, as embedded in E2B's SDKs),
//! written by hand: each struct derives [`prost::Message`] for the binary codec and serde for
//! protobuf's canonical JSON mapping, the codec E2B's SDKs actually use (there is no build script
//! and no `protoc`; the field numbers below are the wire contract, checked by golden tests).
//!
//! JSON as protobuf's canonical mapping has it: lowerCamelCase names out, camelCase or snake_case
//! in; default values left out; `int64` as a string out (a string or a number in); `bytes` as
//! standard base64 (URL-safe and unpadded accepted in); enums by name (numbers accepted in); a
//! `Timestamp` as an RFC 3339 string; unknown fields ignored.
//!
//! It does not: check what a message means (the services do), or know any message but envd's.

pub mod filesystem;
pub mod json;
pub mod process;

pub use json::Timestamp;

/// What both codecs can carry: every request and response of envd's services.
pub trait RpcMessage:
    prost::Message + Default + serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static
{
}

impl<T> RpcMessage for T where
    T: prost::Message + Default + serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static
{
}

#[cfg(test)]
mod tests;

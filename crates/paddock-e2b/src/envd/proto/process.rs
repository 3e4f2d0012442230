//! `process.proto`: the messages of envd's `process.Process` service.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::json::{b64, enum_de, enum_ser, i32_num, is_default, oneof, proto_enum, u32_num};

/// `PTY`: a terminal and its size.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct Pty {
    /// The size.
    #[prost(message, optional, tag = "1")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<pty::Size>,
}

/// Nested messages of [`Pty`].
pub mod pty {
    use super::*;

    /// `PTY.Size`.
    #[derive(Clone, Copy, PartialEq, prost::Message, Serialize, Deserialize)]
    pub struct Size {
        /// Columns.
        #[prost(uint32, tag = "1")]
        #[serde(default, with = "u32_num", skip_serializing_if = "is_default")]
        pub cols: u32,
        /// Rows.
        #[prost(uint32, tag = "2")]
        #[serde(default, with = "u32_num", skip_serializing_if = "is_default")]
        pub rows: u32,
    }
}

/// `ProcessConfig`: what runs.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ProcessConfig {
    /// The program.
    #[prost(string, tag = "1")]
    #[serde(default, skip_serializing_if = "is_default")]
    pub cmd: String,
    /// Its arguments.
    #[prost(string, repeated, tag = "2")]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment.
    #[prost(btree_map = "string, string", tag = "3")]
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
    /// Working directory.
    #[prost(string, optional, tag = "4")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `ListRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ListRequest {}

/// `ProcessInfo`: a running process.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// What it runs.
    #[prost(message, optional, tag = "1")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ProcessConfig>,
    /// Its pid.
    #[prost(uint32, tag = "2")]
    #[serde(default, with = "u32_num", skip_serializing_if = "is_default")]
    pub pid: u32,
    /// Its tag.
    #[prost(string, optional, tag = "3")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `ListResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ListResponse {
    /// The running processes.
    #[prost(message, repeated, tag = "1")]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessInfo>,
}

/// `StartRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct StartRequest {
    /// What to run.
    #[prost(message, optional, tag = "1")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessConfig>,
    /// Run it under a terminal.
    #[prost(message, optional, tag = "2")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
    /// A tag to find it by.
    #[prost(string, optional, tag = "3")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Give it a stdin pipe (absent means yes, for old SDKs).
    #[prost(bool, optional, tag = "4")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
}

/// `UpdateRequest`: resize a process's terminal.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct UpdateRequest {
    /// Which process.
    #[prost(message, optional, tag = "1")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    /// Its new terminal size.
    #[prost(message, optional, tag = "2")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
}

/// `UpdateResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct UpdateResponse {}

/// `ProcessEvent`: one event of a process's stream.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ProcessEvent {
    /// The event.
    #[prost(oneof = "process_event::Event", tags = "1, 2, 3, 4")]
    #[serde(
        flatten,
        default,
        deserialize_with = "oneof",
        skip_serializing_if = "Option::is_none"
    )]
    pub event: Option<process_event::Event>,
}

/// Nested messages of [`ProcessEvent`].
pub mod process_event {
    use super::*;

    /// `ProcessEvent.event`.
    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum Event {
        /// The process started.
        #[prost(message, tag = "1")]
        Start(StartEvent),
        /// Output.
        #[prost(message, tag = "2")]
        Data(DataEvent),
        /// The process ended.
        #[prost(message, tag = "3")]
        End(EndEvent),
        /// Nothing happened for a while.
        #[prost(message, tag = "4")]
        Keepalive(KeepAlive),
    }

    /// `ProcessEvent.StartEvent`.
    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    pub struct StartEvent {
        /// Its pid.
        #[prost(uint32, tag = "1")]
        #[serde(default, with = "u32_num", skip_serializing_if = "is_default")]
        pub pid: u32,
    }

    /// `ProcessEvent.DataEvent`.
    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    pub struct DataEvent {
        /// Which stream, and the bytes.
        #[prost(oneof = "data_event::Output", tags = "1, 2, 3")]
        #[serde(
            flatten,
            default,
            deserialize_with = "oneof",
            skip_serializing_if = "Option::is_none"
        )]
        pub output: Option<data_event::Output>,
    }

    /// Nested messages of [`DataEvent`].
    pub mod data_event {
        use super::*;

        /// `ProcessEvent.DataEvent.output`.
        #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
        #[serde(rename_all = "camelCase")]
        pub enum Output {
            /// Standard output.
            #[prost(bytes, tag = "1")]
            Stdout(#[serde(with = "b64")] Vec<u8>),
            /// Standard error.
            #[prost(bytes, tag = "2")]
            Stderr(#[serde(with = "b64")] Vec<u8>),
            /// Terminal output.
            #[prost(bytes, tag = "3")]
            Pty(#[serde(with = "b64")] Vec<u8>),
        }
    }

    /// `ProcessEvent.EndEvent`.
    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct EndEvent {
        /// Exit code (-1 when a signal ended it).
        #[prost(sint32, tag = "1")]
        #[serde(
            default,
            alias = "exit_code",
            with = "i32_num",
            skip_serializing_if = "is_default"
        )]
        pub exit_code: i32,
        /// It exited (rather than being killed by a signal).
        #[prost(bool, tag = "2")]
        #[serde(default, skip_serializing_if = "is_default")]
        pub exited: bool,
        /// As Go's `ProcessState.String()`: `exit status 1`, `signal: killed`.
        #[prost(string, tag = "3")]
        #[serde(default, skip_serializing_if = "is_default")]
        pub status: String,
        /// What went wrong waiting for it.
        #[prost(string, optional, tag = "4")]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub error: Option<String>,
    }

    /// `ProcessEvent.KeepAlive`.
    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    pub struct KeepAlive {}
}

/// `StartResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct StartResponse {
    /// The event.
    #[prost(message, optional, tag = "1")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<ProcessEvent>,
}

/// `ConnectResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ConnectResponse {
    /// The event.
    #[prost(message, optional, tag = "1")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<ProcessEvent>,
}

/// `SendInputRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct SendInputRequest {
    /// Which process.
    #[prost(message, optional, tag = "1")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    /// The bytes.
    #[prost(message, optional, tag = "2")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<ProcessInput>,
}

/// `SendInputResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct SendInputResponse {}

/// `ProcessInput`: bytes for stdin or the terminal.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ProcessInput {
    /// Where they go.
    #[prost(oneof = "process_input::Input", tags = "1, 2")]
    #[serde(
        flatten,
        default,
        deserialize_with = "oneof",
        skip_serializing_if = "Option::is_none"
    )]
    pub input: Option<process_input::Input>,
}

/// Nested messages of [`ProcessInput`].
pub mod process_input {
    use super::*;

    /// `ProcessInput.input`.
    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum Input {
        /// To stdin.
        #[prost(bytes, tag = "1")]
        Stdin(#[serde(with = "b64")] Vec<u8>),
        /// To the terminal.
        #[prost(bytes, tag = "2")]
        Pty(#[serde(with = "b64")] Vec<u8>),
    }
}

/// `StreamInputRequest`: one message of an input stream.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct StreamInputRequest {
    /// The event.
    #[prost(oneof = "stream_input_request::Event", tags = "1, 2, 3")]
    #[serde(
        flatten,
        default,
        deserialize_with = "oneof",
        skip_serializing_if = "Option::is_none"
    )]
    pub event: Option<stream_input_request::Event>,
}

/// Nested messages of [`StreamInputRequest`].
pub mod stream_input_request {
    use super::*;

    /// `StreamInputRequest.event`.
    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum Event {
        /// Names the process (first).
        #[prost(message, tag = "1")]
        Start(StartEvent),
        /// Input.
        #[prost(message, tag = "2")]
        Data(DataEvent),
        /// Nothing.
        #[prost(message, tag = "3")]
        Keepalive(KeepAlive),
    }

    /// `StreamInputRequest.StartEvent`.
    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    pub struct StartEvent {
        /// Which process.
        #[prost(message, optional, tag = "1")]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub process: Option<ProcessSelector>,
    }

    /// `StreamInputRequest.DataEvent` (its one field is number 2).
    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    pub struct DataEvent {
        /// The bytes.
        #[prost(message, optional, tag = "2")]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub input: Option<ProcessInput>,
    }

    /// `StreamInputRequest.KeepAlive`.
    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    pub struct KeepAlive {}
}

/// `StreamInputResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct StreamInputResponse {}

/// `Signal`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Signal {
    /// No signal.
    Unspecified = 0,
    /// `SIGTERM`.
    Sigterm = 15,
    /// `SIGKILL`.
    Sigkill = 9,
}

impl Signal {
    /// The protobuf name.
    pub fn as_str_name(&self) -> &'static str {
        match self {
            Self::Unspecified => "SIGNAL_UNSPECIFIED",
            Self::Sigterm => "SIGNAL_SIGTERM",
            Self::Sigkill => "SIGNAL_SIGKILL",
        }
    }

    /// The value of a protobuf name.
    pub fn from_str_name(name: &str) -> Option<Self> {
        match name {
            "SIGNAL_UNSPECIFIED" => Some(Self::Unspecified),
            "SIGNAL_SIGTERM" => Some(Self::Sigterm),
            "SIGNAL_SIGKILL" => Some(Self::Sigkill),
            _ => None,
        }
    }
}

proto_enum!(Signal);

/// `SendSignalRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct SendSignalRequest {
    /// Which process.
    #[prost(message, optional, tag = "1")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    /// Which signal.
    #[prost(enumeration = "Signal", tag = "2")]
    #[serde(
        default,
        serialize_with = "enum_ser::<Signal, _>",
        deserialize_with = "enum_de::<Signal, _>",
        skip_serializing_if = "is_default"
    )]
    pub signal: i32,
}

/// `SendSignalResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct SendSignalResponse {}

/// `CloseStdinRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct CloseStdinRequest {
    /// Which process.
    #[prost(message, optional, tag = "1")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
}

/// `CloseStdinResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct CloseStdinResponse {}

/// `ConnectRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ConnectRequest {
    /// Which process.
    #[prost(message, optional, tag = "1")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
}

/// `ProcessSelector`: a process by pid or by tag.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ProcessSelector {
    /// The selector.
    #[prost(oneof = "process_selector::Selector", tags = "1, 2")]
    #[serde(
        flatten,
        default,
        deserialize_with = "oneof",
        skip_serializing_if = "Option::is_none"
    )]
    pub selector: Option<process_selector::Selector>,
}

/// Nested messages of [`ProcessSelector`].
pub mod process_selector {
    use super::*;

    /// `ProcessSelector.selector`.
    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum Selector {
        /// By pid.
        #[prost(uint32, tag = "1")]
        Pid(#[serde(with = "u32_num")] u32),
        /// By tag.
        #[prost(string, tag = "2")]
        Tag(String),
    }
}

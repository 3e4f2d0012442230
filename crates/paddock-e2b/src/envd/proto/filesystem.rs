//! `filesystem.proto`: the messages of envd's `filesystem.Filesystem` service (with `is_symlink`,
//! field 12 of `EntryInfo`, which SDK 2.63 added).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::json::{enum_de, enum_ser, i64_str, is_default, oneof, proto_enum, u32_num, Timestamp};

/// `FileType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum FileType {
    /// Neither a file nor a directory (dropped from listings by the SDKs).
    Unspecified = 0,
    /// A regular file.
    File = 1,
    /// A directory.
    Directory = 2,
    /// A symlink.
    Symlink = 3,
}

impl FileType {
    /// The protobuf name.
    pub fn as_str_name(&self) -> &'static str {
        match self {
            Self::Unspecified => "FILE_TYPE_UNSPECIFIED",
            Self::File => "FILE_TYPE_FILE",
            Self::Directory => "FILE_TYPE_DIRECTORY",
            Self::Symlink => "FILE_TYPE_SYMLINK",
        }
    }

    /// The value of a protobuf name.
    pub fn from_str_name(name: &str) -> Option<Self> {
        match name {
            "FILE_TYPE_UNSPECIFIED" => Some(Self::Unspecified),
            "FILE_TYPE_FILE" => Some(Self::File),
            "FILE_TYPE_DIRECTORY" => Some(Self::Directory),
            "FILE_TYPE_SYMLINK" => Some(Self::Symlink),
            _ => None,
        }
    }
}

/// `EventType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum EventType {
    /// None.
    Unspecified = 0,
    /// Created (or moved in).
    Create = 1,
    /// Written.
    Write = 2,
    /// Removed.
    Remove = 3,
    /// Renamed (moved away).
    Rename = 4,
    /// Attributes changed.
    Chmod = 5,
}

impl EventType {
    /// The protobuf name.
    pub fn as_str_name(&self) -> &'static str {
        match self {
            Self::Unspecified => "EVENT_TYPE_UNSPECIFIED",
            Self::Create => "EVENT_TYPE_CREATE",
            Self::Write => "EVENT_TYPE_WRITE",
            Self::Remove => "EVENT_TYPE_REMOVE",
            Self::Rename => "EVENT_TYPE_RENAME",
            Self::Chmod => "EVENT_TYPE_CHMOD",
        }
    }

    /// The value of a protobuf name.
    pub fn from_str_name(name: &str) -> Option<Self> {
        match name {
            "EVENT_TYPE_UNSPECIFIED" => Some(Self::Unspecified),
            "EVENT_TYPE_CREATE" => Some(Self::Create),
            "EVENT_TYPE_WRITE" => Some(Self::Write),
            "EVENT_TYPE_REMOVE" => Some(Self::Remove),
            "EVENT_TYPE_RENAME" => Some(Self::Rename),
            "EVENT_TYPE_CHMOD" => Some(Self::Chmod),
            _ => None,
        }
    }
}

proto_enum!(FileType, EventType);

/// `EntryInfo`: one file system entry.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    /// Final path component.
    #[prost(string, tag = "1")]
    #[serde(default, skip_serializing_if = "is_default")]
    pub name: String,
    /// Its type (a symlink's: its target's).
    #[prost(enumeration = "FileType", tag = "2")]
    #[serde(
        default,
        rename = "type",
        serialize_with = "enum_ser::<FileType, _>",
        deserialize_with = "enum_de::<FileType, _>",
        skip_serializing_if = "is_default"
    )]
    pub r#type: i32,
    /// Absolute path.
    #[prost(string, tag = "3")]
    #[serde(default, skip_serializing_if = "is_default")]
    pub path: String,
    /// Size in bytes.
    #[prost(int64, tag = "4")]
    #[serde(default, with = "i64_str", skip_serializing_if = "is_default")]
    pub size: i64,
    /// Permission bits.
    #[prost(uint32, tag = "5")]
    #[serde(default, with = "u32_num", skip_serializing_if = "is_default")]
    pub mode: u32,
    /// As Go's `FileMode.String()`: `-rw-r--r--`.
    #[prost(string, tag = "6")]
    #[serde(default, skip_serializing_if = "is_default")]
    pub permissions: String,
    /// Owner's name.
    #[prost(string, tag = "7")]
    #[serde(default, skip_serializing_if = "is_default")]
    pub owner: String,
    /// Group's name.
    #[prost(string, tag = "8")]
    #[serde(default, skip_serializing_if = "is_default")]
    pub group: String,
    /// Last modification.
    #[prost(message, optional, tag = "9")]
    #[serde(default, alias = "modified_time", skip_serializing_if = "Option::is_none")]
    pub modified_time: Option<Timestamp>,
    /// A symlink's target, absolute.
    #[prost(string, optional, tag = "10")]
    #[serde(default, alias = "symlink_target", skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// `user.e2b.*` extended attributes, prefix stripped.
    #[prost(btree_map = "string, string", tag = "11")]
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// The entry itself is a symlink.
    #[prost(bool, tag = "12")]
    #[serde(default, alias = "is_symlink", skip_serializing_if = "is_default")]
    pub is_symlink: bool,
}

/// A request naming one path (`StatRequest`, `MakeDirRequest`, `RemoveRequest`).
macro_rules! path_request {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "`.")]
        #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
        pub struct $name {
            /// The path.
            #[prost(string, tag = "1")]
            #[serde(default, skip_serializing_if = "is_default")]
            pub path: String,
        }
    )*};
}

/// A response carrying one entry (`StatResponse`, `MakeDirResponse`, `MoveResponse`).
macro_rules! entry_response {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "`.")]
        #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
        pub struct $name {
            /// The entry.
            #[prost(message, optional, tag = "1")]
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub entry: Option<EntryInfo>,
        }
    )*};
}

/// An empty message.
macro_rules! empty {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "`.")]
        #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
        pub struct $name {}
    )*};
}

path_request!(StatRequest, MakeDirRequest, RemoveRequest);
entry_response!(StatResponse, MakeDirResponse, MoveResponse);
empty!(RemoveResponse, RemoveWatcherResponse);

/// `MoveRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct MoveRequest {
    /// From.
    #[prost(string, tag = "1")]
    #[serde(default, skip_serializing_if = "is_default")]
    pub source: String,
    /// To.
    #[prost(string, tag = "2")]
    #[serde(default, skip_serializing_if = "is_default")]
    pub destination: String,
}

/// `ListDirRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ListDirRequest {
    /// The directory.
    #[prost(string, tag = "1")]
    #[serde(default, skip_serializing_if = "is_default")]
    pub path: String,
    /// How deep (0 counts as 1).
    #[prost(uint32, tag = "2")]
    #[serde(default, with = "u32_num", skip_serializing_if = "is_default")]
    pub depth: u32,
}

/// `ListDirResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ListDirResponse {
    /// The entries, depth first in lexical order.
    #[prost(message, repeated, tag = "1")]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<EntryInfo>,
}

/// A request to watch a directory (`WatchDirRequest`, `CreateWatcherRequest`).
macro_rules! watch_request {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "`.")]
        #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
        #[serde(rename_all = "camelCase")]
        pub struct $name {
            /// The directory.
            #[prost(string, tag = "1")]
            #[serde(default, skip_serializing_if = "is_default")]
            pub path: String,
            /// Its subdirectories too.
            #[prost(bool, tag = "2")]
            #[serde(default, skip_serializing_if = "is_default")]
            pub recursive: bool,
            /// Attach each entry's `EntryInfo` to its events.
            #[prost(bool, tag = "3")]
            #[serde(default, alias = "include_entry", skip_serializing_if = "is_default")]
            pub include_entry: bool,
            /// Allow a network file system.
            #[prost(bool, tag = "4")]
            #[serde(default, alias = "allow_network_mounts", skip_serializing_if = "is_default")]
            pub allow_network_mounts: bool,
        }
    )*};
}

watch_request!(WatchDirRequest, CreateWatcherRequest);

/// `FilesystemEvent`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct FilesystemEvent {
    /// The path, relative to the watched directory.
    #[prost(string, tag = "1")]
    #[serde(default, skip_serializing_if = "is_default")]
    pub name: String,
    /// What happened.
    #[prost(enumeration = "EventType", tag = "2")]
    #[serde(
        default,
        rename = "type",
        serialize_with = "enum_ser::<EventType, _>",
        deserialize_with = "enum_de::<EventType, _>",
        skip_serializing_if = "is_default"
    )]
    pub r#type: i32,
    /// The entry, when asked for and it could be read.
    #[prost(message, optional, tag = "3")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

/// `WatchDirResponse`: one message of a watch stream.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct WatchDirResponse {
    /// The event.
    #[prost(oneof = "watch_dir_response::Event", tags = "1, 2, 3")]
    #[serde(
        flatten,
        default,
        deserialize_with = "oneof",
        skip_serializing_if = "Option::is_none"
    )]
    pub event: Option<watch_dir_response::Event>,
}

/// Nested messages of [`WatchDirResponse`].
pub mod watch_dir_response {
    use super::*;

    /// `WatchDirResponse.event`.
    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[expect(
        clippy::large_enum_variant,
        reason = "one message of a stream at a time; boxing would only add an allocation per event"
    )]
    #[serde(rename_all = "camelCase")]
    pub enum Event {
        /// The watch is in place (first).
        #[prost(message, tag = "1")]
        Start(StartEvent),
        /// A change.
        #[prost(message, tag = "2")]
        Filesystem(FilesystemEvent),
        /// Nothing happened for a while.
        #[prost(message, tag = "3")]
        Keepalive(KeepAlive),
    }

    empty!(StartEvent, KeepAlive);
}

/// `CreateWatcherResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateWatcherResponse {
    /// The watcher's id.
    #[prost(string, tag = "1")]
    #[serde(default, alias = "watcher_id", skip_serializing_if = "is_default")]
    pub watcher_id: String,
}

/// `GetWatcherEventsRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetWatcherEventsRequest {
    /// The watcher's id.
    #[prost(string, tag = "1")]
    #[serde(default, alias = "watcher_id", skip_serializing_if = "is_default")]
    pub watcher_id: String,
}

/// `GetWatcherEventsResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct GetWatcherEventsResponse {
    /// The events since the last call.
    #[prost(message, repeated, tag = "1")]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<FilesystemEvent>,
}

/// `RemoveWatcherRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoveWatcherRequest {
    /// The watcher's id.
    #[prost(string, tag = "1")]
    #[serde(default, alias = "watcher_id", skip_serializing_if = "is_default")]
    pub watcher_id: String,
}

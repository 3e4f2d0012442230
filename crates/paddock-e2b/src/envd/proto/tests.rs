//! Both codecs of every message: JSON in protobuf's canonical spelling (golden strings, written
//! from the protos' field names and numbers), binary through prost, and each back again.

use serde_json::json;

use super::filesystem::{self as fs, watch_dir_response};
use super::process::{self as ps, process_event, process_input, process_selector, stream_input_request};
use super::{RpcMessage, Timestamp};
use crate::envd::connect::Codec;

/// `m` as JSON is `expected`, and reads back as `m`; as protobuf it round-trips too.
fn check<M: RpcMessage + PartialEq + std::fmt::Debug>(m: &M, expected: serde_json::Value) {
    let text = Codec::Json.encode(m);
    let value: serde_json::Value = serde_json::from_slice(&text).expect("json");
    assert_eq!(value, expected, "{m:?}");
    let back: M = Codec::Json.decode(&text).expect("decodes");
    assert_eq!(&back, m);
    let bytes = Codec::Proto.encode(m);
    let back: M = Codec::Proto.decode(&bytes).expect("decodes");
    assert_eq!(&back, m);
}

fn pid(n: u32) -> Option<ps::ProcessSelector> {
    Some(ps::ProcessSelector {
        selector: Some(process_selector::Selector::Pid(n)),
    })
}

fn event(e: process_event::Event) -> Option<ps::ProcessEvent> {
    Some(ps::ProcessEvent { event: Some(e) })
}

#[test]
fn process_messages() {
    let config = ps::ProcessConfig {
        cmd: "/bin/bash".into(),
        args: vec!["-l".into(), "-c".into(), "echo hi".into()],
        envs: [("A".to_owned(), "1".to_owned())].into(),
        cwd: Some("/tmp".into()),
    };
    check(
        &ps::StartRequest {
            process: Some(config.clone()),
            pty: Some(ps::Pty {
                size: Some(ps::pty::Size { cols: 80, rows: 24 }),
            }),
            tag: Some("t".into()),
            stdin: Some(false),
        },
        json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}, "cwd": "/tmp"},
               "pty": {"size": {"cols": 80, "rows": 24}}, "tag": "t", "stdin": false}),
    );
    check(&ps::StartRequest::default(), json!({}));
    check(&ps::ListRequest {}, json!({}));
    check(
        &ps::ListResponse {
            processes: vec![ps::ProcessInfo {
                config: Some(config),
                pid: 7,
                tag: None,
            }],
        },
        json!({"processes": [{"config": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}, "cwd": "/tmp"}, "pid": 7}]}),
    );
    check(
        &ps::StartResponse {
            event: event(process_event::Event::Start(process_event::StartEvent { pid: 12 })),
        },
        json!({"event": {"start": {"pid": 12}}}),
    );
    for (output, name) in [
        (
            process_event::data_event::Output::Stdout(b"hi\n".to_vec()),
            "stdout",
        ),
        (process_event::data_event::Output::Stderr(vec![0xff, 0]), "stderr"),
        (process_event::data_event::Output::Pty(b"$ ".to_vec()), "pty"),
    ] {
        let b64 = match name {
            "stdout" => "aGkK",
            "stderr" => "/wA=",
            _ => "JCA=",
        };
        check(
            &ps::ConnectResponse {
                event: event(process_event::Event::Data(process_event::DataEvent {
                    output: Some(output),
                })),
            },
            json!({"event": {"data": {name: b64}}}),
        );
    }
    check(
        &ps::StartResponse {
            event: event(process_event::Event::End(process_event::EndEvent {
                exit_code: -1,
                exited: false,
                status: "signal: killed".into(),
                error: Some("signal: killed".into()),
            })),
        },
        json!({"event": {"end": {"exitCode": -1, "status": "signal: killed", "error": "signal: killed"}}}),
    );
    check(
        &ps::StartResponse {
            event: event(process_event::Event::End(process_event::EndEvent {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None,
            })),
        },
        json!({"event": {"end": {"exited": true, "status": "exit status 0"}}}),
    );
    check(
        &ps::StartResponse {
            event: event(process_event::Event::Keepalive(process_event::KeepAlive {})),
        },
        json!({"event": {"keepalive": {}}}),
    );
    check(
        &ps::SendInputRequest {
            process: pid(3),
            input: Some(ps::ProcessInput {
                input: Some(process_input::Input::Stdin(b"x".to_vec())),
            }),
        },
        json!({"process": {"pid": 3}, "input": {"stdin": "eA=="}}),
    );
    check(
        &ps::StreamInputRequest {
            event: Some(stream_input_request::Event::Start(
                stream_input_request::StartEvent {
                    process: Some(ps::ProcessSelector {
                        selector: Some(process_selector::Selector::Tag("web".into())),
                    }),
                },
            )),
        },
        json!({"start": {"process": {"tag": "web"}}}),
    );
    check(
        &ps::StreamInputRequest {
            event: Some(stream_input_request::Event::Data(
                stream_input_request::DataEvent {
                    input: Some(ps::ProcessInput {
                        input: Some(process_input::Input::Pty(b"\x04".to_vec())),
                    }),
                },
            )),
        },
        json!({"data": {"input": {"pty": "BA=="}}}),
    );
    check(
        &ps::StreamInputRequest {
            event: Some(stream_input_request::Event::Keepalive(
                stream_input_request::KeepAlive {},
            )),
        },
        json!({"keepalive": {}}),
    );
    check(
        &ps::SendSignalRequest {
            process: pid(4),
            signal: ps::Signal::Sigkill as i32,
        },
        json!({"process": {"pid": 4}, "signal": "SIGNAL_SIGKILL"}),
    );
    check(
        &ps::UpdateRequest {
            process: pid(5),
            pty: Some(ps::Pty {
                size: Some(ps::pty::Size { cols: 100, rows: 30 }),
            }),
        },
        json!({"process": {"pid": 5}, "pty": {"size": {"cols": 100, "rows": 30}}}),
    );
    check(
        &ps::CloseStdinRequest { process: pid(6) },
        json!({"process": {"pid": 6}}),
    );
    check(
        &ps::ConnectRequest { process: pid(8) },
        json!({"process": {"pid": 8}}),
    );
    check(&ps::UpdateResponse {}, json!({}));
    check(&ps::SendInputResponse {}, json!({}));
    check(&ps::StreamInputResponse {}, json!({}));
    check(&ps::SendSignalResponse {}, json!({}));
    check(&ps::CloseStdinResponse {}, json!({}));
}

fn entry() -> fs::EntryInfo {
    fs::EntryInfo {
        name: "link".into(),
        r#type: fs::FileType::File as i32,
        path: "/home/user/link".into(),
        size: 5_000_000_000,
        mode: 0o644,
        permissions: "-rw-r--r--".into(),
        owner: "user".into(),
        group: "user".into(),
        modified_time: Some(Timestamp::from_millis(1_700_000_000_000)),
        symlink_target: Some("/home/user/target".into()),
        metadata: [("k".to_owned(), "v".to_owned())].into(),
        is_symlink: true,
    }
}

fn entry_json() -> serde_json::Value {
    json!({"name": "link", "type": "FILE_TYPE_FILE", "path": "/home/user/link", "size": "5000000000",
           "mode": 420, "permissions": "-rw-r--r--", "owner": "user", "group": "user",
           "modifiedTime": "2023-11-14T22:13:20Z", "symlinkTarget": "/home/user/target",
           "metadata": {"k": "v"}, "isSymlink": true})
}

#[test]
fn filesystem_messages() {
    check(&fs::StatRequest { path: "a".into() }, json!({"path": "a"}));
    check(
        &fs::StatResponse { entry: Some(entry()) },
        json!({"entry": entry_json()}),
    );
    check(&fs::MakeDirRequest { path: "d".into() }, json!({"path": "d"}));
    check(
        &fs::MakeDirResponse { entry: Some(entry()) },
        json!({"entry": entry_json()}),
    );
    check(
        &fs::MoveRequest {
            source: "a".into(),
            destination: "b".into(),
        },
        json!({"source": "a", "destination": "b"}),
    );
    check(&fs::MoveResponse { entry: None }, json!({}));
    check(
        &fs::ListDirRequest {
            path: "/".into(),
            depth: 2,
        },
        json!({"path": "/", "depth": 2}),
    );
    check(
        &fs::ListDirResponse {
            entries: vec![entry()],
        },
        json!({"entries": [entry_json()]}),
    );
    check(&fs::RemoveRequest { path: "x".into() }, json!({"path": "x"}));
    check(&fs::RemoveResponse {}, json!({}));
    let watch = json!({"path": "/d", "recursive": true, "includeEntry": true, "allowNetworkMounts": true});
    check(
        &fs::WatchDirRequest {
            path: "/d".into(),
            recursive: true,
            include_entry: true,
            allow_network_mounts: true,
        },
        watch.clone(),
    );
    check(
        &fs::CreateWatcherRequest {
            path: "/d".into(),
            recursive: true,
            include_entry: true,
            allow_network_mounts: true,
        },
        watch,
    );
    check(
        &fs::WatchDirResponse {
            event: Some(watch_dir_response::Event::Start(
                watch_dir_response::StartEvent {},
            )),
        },
        json!({"start": {}}),
    );
    let fs_event = fs::FilesystemEvent {
        name: "sub/f.txt".into(),
        r#type: fs::EventType::Write as i32,
        entry: None,
    };
    check(
        &fs::WatchDirResponse {
            event: Some(watch_dir_response::Event::Filesystem(fs_event.clone())),
        },
        json!({"filesystem": {"name": "sub/f.txt", "type": "EVENT_TYPE_WRITE"}}),
    );
    check(
        &fs::WatchDirResponse {
            event: Some(watch_dir_response::Event::Keepalive(
                watch_dir_response::KeepAlive {},
            )),
        },
        json!({"keepalive": {}}),
    );
    check(
        &fs::CreateWatcherResponse {
            watcher_id: "w1".into(),
        },
        json!({"watcherId": "w1"}),
    );
    check(
        &fs::GetWatcherEventsRequest {
            watcher_id: "w1".into(),
        },
        json!({"watcherId": "w1"}),
    );
    check(
        &fs::GetWatcherEventsResponse {
            events: vec![fs_event],
        },
        json!({"events": [{"name": "sub/f.txt", "type": "EVENT_TYPE_WRITE"}]}),
    );
    check(
        &fs::RemoveWatcherRequest {
            watcher_id: "w1".into(),
        },
        json!({"watcherId": "w1"}),
    );
    check(&fs::RemoveWatcherResponse {}, json!({}));
}

#[test]
fn json_input_is_read_leniently() {
    // snake_case names, numbers as strings, int64 as a number, enums by number, unknown fields.
    let watch: fs::CreateWatcherRequest = Codec::Json
        .decode(br#"{"path":"/d","include_entry":true,"allow_network_mounts":true,"extra":[1]}"#)
        .expect("reads");
    assert!(watch.include_entry && watch.allow_network_mounts);
    let info: fs::EntryInfo =
        Codec::Json.decode(br#"{"size":12,"mode":"420","type":2,"is_symlink":true,"symlink_target":"/x","modified_time":"2023-11-14T22:13:20Z"}"#).expect("reads");
    assert_eq!(
        (info.size, info.mode, info.r#type, info.is_symlink),
        (12, 420, 2, true)
    );
    assert_eq!(info.symlink_target.as_deref(), Some("/x"));
    let signal: ps::SendSignalRequest = Codec::Json
        .decode(br#"{"process":{"pid":"9"},"signal":15}"#)
        .expect("reads");
    assert_eq!((signal.process, signal.signal), (pid(9), 15));
    let end: ps::StartResponse = Codec::Json
        .decode(br#"{"event":{"end":{"exit_code":"2"}}}"#)
        .expect("reads");
    assert_eq!(
        end.event,
        event(process_event::Event::End(process_event::EndEvent {
            exit_code: 2,
            ..Default::default()
        }))
    );
    let url_safe: ps::SendInputRequest = Codec::Json
        .decode(br#"{"input":{"stdin":"_wA"}}"#)
        .expect("reads");
    assert_eq!(
        url_safe.input.and_then(|i| i.input),
        Some(process_input::Input::Stdin(vec![0xff, 0]))
    );
    // An absent oneof is no member; a present, malformed one is an error.
    let none: ps::ProcessEvent = Codec::Json.decode(br#"{"other":1}"#).expect("reads");
    assert_eq!(none.event, None);
    let bad_member: Result<ps::SendInputRequest, _> = Codec::Json.decode(br#"{"input":{"stdin":5}}"#);
    assert!(bad_member.is_err());
    for bad in [
        &br#"{"signal":"SIGNAL_NOPE"}"#[..],
        br#"{"process":{"pid":-1}}"#,
        br#"{"process":{"pid":1.5}}"#,
        br#"{"process":{"pid":4294967296}}"#,
    ] {
        let refused: Result<ps::SendSignalRequest, _> = Codec::Json.decode(bad);
        assert!(refused.is_err(), "{}", String::from_utf8_lossy(bad));
    }
    let refused: Result<ps::SendInputRequest, _> = Codec::Json.decode(br#"{"input":{"stdin":"!!"}}"#);
    assert!(refused.is_err());
}

#[test]
fn field_numbers_are_the_protos() {
    // EntryInfo.is_symlink is field 12 (varint): tag byte 12 << 3 = 0x60.
    let only_symlink = fs::EntryInfo {
        is_symlink: true,
        ..Default::default()
    };
    assert_eq!(Codec::Proto.encode(&only_symlink), [0x60, 0x01]);
    // EndEvent.exit_code is sint32 (zigzag): -1 is 1.
    let end = process_event::EndEvent {
        exit_code: -1,
        ..Default::default()
    };
    assert_eq!(Codec::Proto.encode(&end), [0x08, 0x01]);
    // StreamInputRequest.DataEvent's input is field 2.
    let data = stream_input_request::DataEvent {
        input: Some(ps::ProcessInput::default()),
    };
    assert_eq!(Codec::Proto.encode(&data), [0x12, 0x00]);
    // EntryInfo.size is int64 field 4; modified_time is field 9 (a message).
    let sized = fs::EntryInfo {
        size: 1,
        modified_time: Some(Timestamp { seconds: 1, nanos: 0 }),
        ..Default::default()
    };
    assert_eq!(Codec::Proto.encode(&sized), [0x20, 0x01, 0x4a, 0x02, 0x08, 0x01]);
}

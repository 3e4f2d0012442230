//! The handshake and malformed input, spoken with raw frames.

use std::time::Duration;

use paddock_protocol::{
    encode_frame, AgentMessage, ClientMessage, ErrorCode, Reply, Request, PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::harness::{collect, require_root, shell, TestAgent};

async fn send(stream: &mut UnixStream, id: u64, request: Request) {
    let mut frame = Vec::new();
    encode_frame(&ClientMessage { id, request }, &[], &mut frame).expect("encode");
    stream.write_all(&frame).await.expect("write");
}

async fn send_raw_header(stream: &mut UnixStream, header: &[u8]) {
    let mut frame = Vec::new();
    frame.extend_from_slice(&(header.len() as u32).to_be_bytes());
    frame.extend_from_slice(&0u32.to_be_bytes());
    frame.extend_from_slice(header);
    stream.write_all(&frame).await.expect("write");
}

async fn receive(stream: &mut UnixStream) -> Option<AgentMessage> {
    let mut prefix = [0u8; 8];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut prefix))
        .await
        .expect("in time");
    read.ok()?;
    let header_len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    let payload_len = u32::from_be_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]) as usize;
    let mut rest = vec![0u8; header_len + payload_len];
    stream.read_exact(&mut rest).await.expect("frame body");
    Some(serde_json::from_slice(&rest[..header_len]).expect("agent message"))
}

fn error_code(message: Option<AgentMessage>, expected_id: u64) -> ErrorCode {
    match message {
        Some(AgentMessage::Error { id, error }) if id == expected_id => error.code,
        other => panic!("expected an error for {expected_id}, got {other:?}"),
    }
}

#[tokio::test]
async fn hello_must_come_first_with_our_version() {
    require_root!();
    let (agent, _client) = TestAgent::start().await;
    let mut raw = UnixStream::connect(&agent.socket).await.expect("connect");
    send(&mut raw, 1, Request::ListProcesses).await;
    assert_eq!(
        error_code(receive(&mut raw).await, 1),
        ErrorCode::HandshakeRequired
    );
    send(
        &mut raw,
        2,
        Request::Hello {
            version: PROTOCOL_VERSION + 1,
        },
    )
    .await;
    assert_eq!(
        error_code(receive(&mut raw).await, 2),
        ErrorCode::UnsupportedVersion
    );
    send(
        &mut raw,
        3,
        Request::Hello {
            version: PROTOCOL_VERSION,
        },
    )
    .await;
    match receive(&mut raw).await {
        Some(AgentMessage::Reply {
            id: 3,
            body: Reply::Hello { version, .. },
        }) => assert_eq!(version, PROTOCOL_VERSION),
        other => panic!("expected hello, got {other:?}"),
    }
    send(
        &mut raw,
        4,
        Request::Hello {
            version: PROTOCOL_VERSION,
        },
    )
    .await;
    assert_eq!(
        error_code(receive(&mut raw).await, 4),
        ErrorCode::HandshakeRequired,
        "second hello"
    );
    send_raw_header(&mut raw, br#"{"id":5,"request":{"op":"frobnicate"}}"#).await;
    assert_eq!(
        error_code(receive(&mut raw).await, 5),
        ErrorCode::BadRequest,
        "unknown request"
    );
    send(&mut raw, 6, Request::ListProcesses).await;
    assert!(
        matches!(receive(&mut raw).await, Some(AgentMessage::Reply { id: 6, .. })),
        "still usable"
    );
}

#[tokio::test]
async fn a_malformed_frame_closes_only_its_connection() {
    require_root!();
    let (_agent, client) = TestAgent::start().await;
    let mut raw = UnixStream::connect(&_agent.socket).await.expect("connect");
    send(
        &mut raw,
        1,
        Request::Hello {
            version: PROTOCOL_VERSION,
        },
    )
    .await;
    assert!(matches!(
        receive(&mut raw).await,
        Some(AgentMessage::Reply { id: 1, .. })
    ));
    send_raw_header(&mut raw, b"this is not json").await;
    assert!(
        receive(&mut raw).await.is_none(),
        "the agent closes a connection that sent garbage"
    );

    let mut huge = UnixStream::connect(&_agent.socket).await.expect("connect");
    huge.write_all(&u32::MAX.to_be_bytes()).await.expect("write");
    huge.write_all(&0u32.to_be_bytes()).await.expect("write");
    assert!(
        receive(&mut huge).await.is_none(),
        "an oversized header closes the connection"
    );

    let (_, mut events) = client
        .spawn(shell("echo still-alive"))
        .await
        .expect("other connections still work");
    assert_eq!(collect(&mut events).await.stdout_str(), "still-alive\n");
}

#[tokio::test]
async fn a_client_notices_its_connection_closing() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    assert!(!client.is_closed());
    drop(agent);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !client.is_closed() {
        assert!(
            std::time::Instant::now() < deadline,
            "the client never saw the agent go"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(matches!(
        client.list_processes().await,
        Err(paddock_runtime::agent_client::AgentClientError::Closed)
    ));
}

/// `paddock run` writes its spawn right behind the handshake, without waiting for the answer in
/// between: both are answered, in order, and the process runs.
#[tokio::test]
async fn a_spawn_written_behind_the_handshake_runs() {
    require_root!();
    let (agent, _client) = TestAgent::start().await;
    let (client, pid, mut events) =
        paddock_runtime::agent_client::AgentClient::connect_and_spawn(&agent.socket, shell("echo pipelined"))
            .await
            .expect("handshake and spawn");
    assert!(pid > 0);
    assert_eq!(collect(&mut events).await.stdout_str(), "pipelined\n");
    assert!(!client.is_closed());
}

/// What makes that safe: a spawn behind a refused handshake starts nothing. The agent answers the
/// handshake's refusal, then refuses the spawn that was already on its way.
#[tokio::test]
async fn a_spawn_behind_a_refused_handshake_starts_nothing() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    let mut raw = UnixStream::connect(&agent.socket).await.expect("connect");
    let marker = agent.host_path("/tmp/ran");
    let spawn = Request::Spawn(shell("touch /tmp/ran"));
    let mut frames = Vec::new();
    for (id, request) in [
        (
            1,
            Request::Hello {
                version: PROTOCOL_VERSION + 1,
            },
        ),
        (2, spawn),
    ] {
        encode_frame(&ClientMessage { id, request }, &[], &mut frames).expect("encode");
    }
    // Both frames in one write: the agent has the spawn before it answers the handshake.
    raw.write_all(&frames).await.expect("write");
    assert_eq!(
        error_code(receive(&mut raw).await, 1),
        ErrorCode::UnsupportedVersion
    );
    assert_eq!(
        error_code(receive(&mut raw).await, 2),
        ErrorCode::HandshakeRequired
    );
    assert!(
        client.list_processes().await.expect("list").is_empty(),
        "a process was started"
    );
    assert!(!marker.exists(), "the refused spawn ran");
}

/// A connection that sent `hold` holds the sandbox: the agent (a sandbox's PID 1, whose exit ends
/// it) exits once the last such connection has closed, killing what it started, and not before.
/// Connections that did not hold it end nothing when they close.
#[tokio::test]
async fn the_agent_ends_when_the_last_connection_holding_it_closes() {
    require_root!();
    let (mut agent, unheld) = TestAgent::start().await;
    let first = agent.connect().await;
    first.hold().await.expect("hold");
    let second = agent.connect().await;
    second.hold().await.expect("hold");
    let mut sleeper = shell("sleep 1000");
    sleeper.detached = true;
    let (sleeper, _) = second.spawn(sleeper).await.expect("spawn");

    drop(unheld);
    drop(first);
    // Round trips on a new connection and on the one still holding it: an agent that ended on
    // either close would fail them once it had read that close; a correct one answers them.
    let probe = agent.connect().await;
    probe
        .list_processes()
        .await
        .expect("alive after an unheld and a held close");
    second.list_processes().await.expect("still held");
    drop(probe);
    assert!(
        agent.running(),
        "the agent exited while a connection still held it"
    );

    drop(second);
    let status = agent
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the agent ends with the last connection holding it");
    assert!(status.success(), "{status:?}");
    // Its processes went with it (outside a PID namespace, the agent kills them itself).
    let gone = std::path::Path::new("/proc").join(sleeper.to_string());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while gone.exists() && std::fs::read_to_string(gone.join("stat")).is_ok_and(|s| !s.contains(") Z ")) {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent's process outlived it"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

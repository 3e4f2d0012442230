use proptest::prelude::*;

use super::*;
use crate::envd::proto::process::{process_event, ProcessEvent, StartResponse};

#[test]
fn envelopes_are_flags_length_payload() {
    assert_eq!(&envelope(0, b"{}")[..], b"\x00\x00\x00\x00\x02{}");
    assert_eq!(&end_stream(None)[..], b"\x02\x00\x00\x00\x02{}");
    let e = ConnectError::new(ConnectCode::DeadlineExceeded, "late");
    let end = end_stream(Some(&e));
    assert_eq!(end[0], FLAG_END_STREAM);
    let body: serde_json::Value = serde_json::from_slice(&end[5..]).expect("json");
    assert_eq!(
        body,
        serde_json::json!({"error": {"code": "deadline_exceeded", "message": "late"}})
    );
}

#[test]
fn the_decoder_waits_for_whole_envelopes() {
    let mut d = EnvelopeDecoder::new(16);
    let bytes = [envelope(0, b"abc"), envelope(0, b"")].concat();
    for b in &bytes[..4] {
        d.push(&[*b]);
        assert_eq!(d.next_envelope().expect("fine"), None);
    }
    assert!(d.finish().is_err(), "a truncated header is an error at the end");
    d.push(&bytes[4..7]);
    assert_eq!(d.next_envelope().expect("fine"), None);
    d.push(&bytes[7..]);
    assert_eq!(
        d.next_envelope().expect("fine"),
        Some((0, Bytes::from_static(b"abc")))
    );
    assert_eq!(d.next_envelope().expect("fine"), Some((0, Bytes::new())));
    assert_eq!(d.next_envelope().expect("fine"), None);
    assert!(d.finish().is_ok());
}

#[test]
fn the_decoder_refuses_bad_envelopes() {
    let refuse = |bytes: &[u8]| {
        let mut d = EnvelopeDecoder::new(16);
        d.push(bytes);
        d.next_envelope().expect_err("refused").code
    };
    // Oversized: refused from the header alone, before the payload is buffered.
    assert_eq!(refuse(b"\x00\x00\x00\x00\x11"), ConnectCode::ResourceExhausted);
    assert_eq!(refuse(b"\x00\xff\xff\xff\xff"), ConnectCode::ResourceExhausted);
    // Compressed with no compression negotiated, or unknown flags.
    assert_eq!(refuse(b"\x01\x00\x00\x00\x00"), ConnectCode::InvalidArgument);
    assert_eq!(refuse(b"\x80\x00\x00\x00\x00"), ConnectCode::InvalidArgument);
    assert_eq!(refuse(b"\x04\x00\x00\x00\x00"), ConnectCode::InvalidArgument);
    // Truncated payload.
    let mut d = EnvelopeDecoder::new(16);
    d.push(b"\x00\x00\x00\x00\x05ab");
    assert_eq!(d.next_envelope().expect("waits"), None);
    assert_eq!(
        d.finish().expect_err("truncated").code,
        ConnectCode::InvalidArgument
    );
}

#[test]
fn codecs_refuse_what_is_no_message() {
    let bad: Result<StartResponse, _> = Codec::Json.decode(b"{not json");
    assert_eq!(bad.expect_err("refused").code, ConnectCode::InvalidArgument);
    let wrong_type: Result<StartResponse, _> = Codec::Json.decode(br#"{"event": 5}"#);
    assert_eq!(
        wrong_type.expect_err("refused").code,
        ConnectCode::InvalidArgument
    );
    let bad: Result<StartResponse, _> = Codec::Proto.decode(b"\x0a\x05\x0a");
    assert_eq!(bad.expect_err("refused").code, ConnectCode::InvalidArgument);
    // An empty JSON body is the empty message.
    let empty: StartResponse = Codec::Json.decode(b" ").expect("empty");
    assert_eq!(empty, StartResponse::default());
}

#[test]
fn metadata_from_headers() {
    let headers = |pairs: &[(&'static str, &str)]| {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("value"));
        }
        h
    };
    let meta = parse_meta(
        &headers(&[
            ("content-type", "application/connect+json; charset=utf-8"),
            ("connect-timeout-ms", "1500"),
            ("keepalive-ping-interval", "50"),
            ("authorization", "Basic cm9vdDo="),
        ]),
        Kind::Stream,
    )
    .expect("accepted");
    assert_eq!(meta.codec, Codec::Json);
    assert_eq!(meta.timeout, Some(Duration::from_millis(1500)));
    assert_eq!(meta.keepalive, Duration::from_secs(50));
    assert_eq!(meta.user.as_deref(), Some("root"));

    let meta = parse_meta(&headers(&[("content-type", "application/proto")]), Kind::Unary).expect("proto");
    assert_eq!(
        (meta.codec, meta.timeout, meta.keepalive, meta.user),
        (Codec::Proto, None, DEFAULT_KEEPALIVE, None)
    );

    let code = |pairs: &[(&'static str, &str)], kind| match parse_meta(&headers(pairs), kind) {
        Err(Refusal::Error(e)) => Some(e.code),
        Err(Refusal::MediaType(_)) => None,
        Ok(_) => panic!("{pairs:?} accepted"),
    };
    let json = ("content-type", "application/json");
    assert_eq!(code(&[json], Kind::Stream), None, "a unary type on a stream");
    assert_eq!(code(&[("content-type", "text/plain")], Kind::Unary), None);
    assert_eq!(
        code(&[json, ("content-encoding", "gzip")], Kind::Unary),
        Some(ConnectCode::Unimplemented)
    );
    assert_eq!(
        code(&[json, ("connect-protocol-version", "2")], Kind::Unary),
        Some(ConnectCode::InvalidArgument)
    );
    for bad in ["-1", "1.5", "12345678901", "", "x"] {
        assert_eq!(
            code(&[json, ("connect-timeout-ms", bad)], Kind::Unary),
            Some(ConnectCode::InvalidArgument),
            "{bad}"
        );
    }
    assert_eq!(
        code(&[json, ("authorization", "Basic !!!")], Kind::Unary),
        Some(ConnectCode::Unauthenticated)
    );
    let bearer = parse_meta(&headers(&[json, ("authorization", "Bearer x")]), Kind::Unary).expect("ignored");
    assert_eq!(bearer.user, None);
    let no_user =
        parse_meta(&headers(&[json, ("authorization", "Basic Og==")]), Kind::Unary).expect("empty user");
    assert_eq!(no_user.user, None);
}

#[test]
fn rpc_shaped_paths() {
    assert!(looks_like_rpc("/process.Process/Start"));
    assert!(looks_like_rpc("/foo.v1.Bar/Baz"));
    assert!(!looks_like_rpc("/files"));
    assert!(!looks_like_rpc("/health"));
    assert!(!looks_like_rpc("/a.b/c/d"));
    assert!(!looks_like_rpc("/nodot/Method"));
}

#[tokio::test]
async fn streams_send_keepalives_and_end_at_their_deadline() {
    tokio::time::pause();
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    let keepalive = || StartResponse {
        event: Some(ProcessEvent {
            event: Some(process_event::Event::Keepalive(process_event::KeepAlive {})),
        }),
    };
    let options = StreamOptions {
        codec: Codec::Json,
        deadline: Some(Instant::now() + Duration::from_secs(25)),
        keepalive: Duration::from_secs(10),
    };
    // A source that never yields: only keepalives, then the deadline.
    let source = futures_util::stream::pending::<Result<StartResponse, ConnectError>>();
    let task = tokio::spawn(drive_stream(options, source, keepalive, tx));
    let frames: Vec<Bytes> =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) })
            .collect()
            .await;
    task.await.expect("the task ends");
    assert_eq!(
        frames.len(),
        3,
        "two keepalives (10 s, 20 s), then the end at 25 s"
    );
    assert_eq!(&frames[0][5..], br#"{"event":{"keepalive":{}}}"#);
    assert_eq!(frames[2][0], FLAG_END_STREAM);
    assert!(std::str::from_utf8(&frames[2][5..])
        .expect("utf8")
        .contains("deadline_exceeded"));
}

#[tokio::test]
async fn a_stream_stops_when_its_client_leaves() {
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let options = StreamOptions {
        codec: Codec::Json,
        deadline: None,
        keepalive: Duration::from_secs(3600),
    };
    let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<()>();
    // The source holds `dropped_tx`: the task ending drops it.
    let source = futures_util::stream::unfold(dropped_tx, |d| async move {
        futures_util::future::pending::<()>().await;
        Some((Ok(StartResponse::default()), d))
    });
    let task = tokio::spawn(drive_stream(options, source, StartResponse::default, tx));
    drop(rx);
    task.await.expect("the task ends");
    assert!(dropped_rx.await.is_err(), "the source was dropped");
}

proptest! {
    #[test]
    fn any_split_of_a_body_gives_the_same_envelopes(
        payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..6),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let body: Vec<u8> = payloads.iter().flat_map(|p| envelope(0, p).to_vec()).collect();
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (body.len() + 1)).collect();
        cuts.sort_unstable();
        let mut d = EnvelopeDecoder::new(64);
        let mut got = Vec::new();
        let mut from = 0;
        for cut in cuts.into_iter().chain([body.len()]) {
            d.push(&body[from..cut]);
            from = cut;
            while let Some((flags, payload)) = d.next_envelope().expect("well formed") {
                prop_assert_eq!(flags, 0);
                got.push(payload.to_vec());
            }
        }
        prop_assert!(d.finish().is_ok());
        prop_assert_eq!(got, payloads);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut d = EnvelopeDecoder::new(16);
        d.push(&bytes);
        while let Ok(Some(_)) = d.next_envelope() {}
        let _ = d.finish();
    }
}

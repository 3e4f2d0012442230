//! A small Connect-RPC server layer on axum, for envd's two services: unary calls, server streams
//! and client streams, in the JSON and protobuf-binary codecs, without compression.
//!
//! Hand-written because no well-kept Connect server crate fits an axum router here (the Rust
//! implementations either bring their own server and code generator or follow gRPC only), and
//! envd's surface is small: a handler takes a [`Unary`], [`StreamCall`] or [`ClientStream`]
//! extractor and answers with [`unary_response`], [`stream_response`] or [`stream_error`].
//!
//! What it enforces on what a client sends: the content type of the call's kind (else 415), no
//! compression (`unimplemented`), `Connect-Protocol-Version: 1` when present, a valid
//! `Connect-Timeout-Ms`, at most [`MAX_MESSAGE`] bytes per message (`resource_exhausted`), well-formed
//! envelopes and messages (`invalid_argument`), `POST` only (405). A server stream sends a keepalive
//! message whenever nothing was sent for `Keepalive-Ping-Interval` seconds (default 90), ends at its
//! deadline with `deadline_exceeded`, and stops (dropping its source) as soon as the client leaves.
//!
//! It does not: serve gRPC or gRPC-Web, compress, accept `GET` for unary calls, or know what any
//! message means.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::handler::Handler;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, MethodRouter};
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use http_body_util::BodyExt as _;
use paddock_control::ServiceError;
use paddock_types::api::ErrorCode;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::envd::proto::RpcMessage;
use crate::{ConnectCode, ConnectError};

/// The largest message a client may send (one unary body, or one envelope's payload).
pub const MAX_MESSAGE: usize = 4 << 20;

/// How long a stream may be quiet before a keepalive message, when the client names no interval.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

/// Bounds of a client's `Keepalive-Ping-Interval` (seconds).
const KEEPALIVE_BOUNDS: (u64, u64) = (1, 3600);

/// Envelopes buffered between a stream's task and the response body.
const STREAM_QUEUE: usize = 8;

/// The message codec of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// Protobuf's canonical JSON (what E2B's SDKs use).
    Json,
    /// Protobuf binary.
    Proto,
}

impl Codec {
    /// A message's bytes.
    pub fn encode<M: RpcMessage>(self, m: &M) -> Vec<u8> {
        match self {
            // Serializing these plain structs cannot fail.
            Codec::Json => serde_json::to_vec(m).unwrap_or_else(|_| b"{}".to_vec()),
            Codec::Proto => m.encode_to_vec(),
        }
    }

    /// A message from bytes; `invalid_argument` when they are not one.
    pub fn decode<M: RpcMessage>(self, bytes: &[u8]) -> Result<M, ConnectError> {
        match self {
            Codec::Json if bytes.iter().all(u8::is_ascii_whitespace) => Ok(M::default()),
            Codec::Json => serde_json::from_slice(bytes)
                .map_err(|e| invalid(format!("the request message is not valid: {e}"))),
            Codec::Proto => {
                M::decode(bytes).map_err(|e| invalid(format!("the request message is not valid: {e}")))
            }
        }
    }

    fn unary_content_type(self) -> &'static str {
        match self {
            Codec::Json => "application/json",
            Codec::Proto => "application/proto",
        }
    }

    fn stream_content_type(self) -> &'static str {
        match self {
            Codec::Json => "application/connect+json",
            Codec::Proto => "application/connect+proto",
        }
    }
}

fn invalid(message: impl Into<String>) -> ConnectError {
    ConnectError::new(ConnectCode::InvalidArgument, message)
}

/// A service error as a Connect error. A sandbox that is gone (it ended, was paused or stopped
/// mid-call) reads as E2B's proxy says it: `unavailable`, "The sandbox was not found", the words
/// the SDKs look for.
pub fn service_error(e: ServiceError) -> ConnectError {
    match e.code {
        ErrorCode::SandboxNotFound | ErrorCode::SandboxNotRunning => {
            ConnectError::new(ConnectCode::Unavailable, "The sandbox was not found")
        }
        _ => ConnectError::from(e),
    }
}

/// What every call's headers say.
#[derive(Debug, Clone)]
pub struct CallMeta {
    /// The codec of its messages.
    pub codec: Codec,
    /// `Connect-Timeout-Ms`.
    pub timeout: Option<Duration>,
    /// How long a stream may be quiet before a keepalive.
    pub keepalive: Duration,
    /// The user of `Authorization: Basic base64("<user>:")`, if one was named.
    pub user: Option<String>,
}

impl CallMeta {
    /// When the call's deadline passes, if it has one.
    pub fn deadline(&self) -> Option<Instant> {
        self.timeout.map(|t| Instant::now() + t)
    }
}

/// Which kind of call a request must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Unary,
    Stream,
}

/// Why a request was refused before its messages were read: a status of its own (415) or a
/// Connect error.
#[derive(Debug)]
enum Refusal {
    MediaType(String),
    Error(ConnectError),
}

impl From<ConnectError> for Refusal {
    fn from(e: ConnectError) -> Self {
        Refusal::Error(e)
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

fn parse_meta(headers: &HeaderMap, kind: Kind) -> Result<CallMeta, Refusal> {
    let content_type = header_str(headers, header::CONTENT_TYPE.as_str()).unwrap_or("");
    let base = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let codec = match (kind, base.as_str()) {
        (Kind::Unary, "application/json") | (Kind::Stream, "application/connect+json") => Codec::Json,
        (Kind::Unary, "application/proto") | (Kind::Stream, "application/connect+proto") => Codec::Proto,
        _ => return Err(Refusal::MediaType(content_type.to_owned())),
    };
    if let Some(v) = header_str(headers, "connect-protocol-version") {
        if v != "1" {
            return Err(invalid(format!(
                "Connect protocol version {v:?} is not supported (only 1)"
            ))
            .into());
        }
    }
    let encoding_header = match kind {
        Kind::Unary => "content-encoding",
        Kind::Stream => "connect-content-encoding",
    };
    if let Some(enc) = header_str(headers, encoding_header) {
        if !enc.is_empty() && !enc.eq_ignore_ascii_case("identity") {
            return Err(ConnectError::new(
                ConnectCode::Unimplemented,
                format!("compression {enc:?} is not supported (only identity)"),
            )
            .into());
        }
    }
    let timeout = match header_str(headers, "connect-timeout-ms") {
        None => None,
        Some(v) => {
            let ms = (v.len() <= 10 && !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .then(|| v.parse::<u64>().ok())
                .flatten()
                .ok_or_else(|| {
                    invalid(format!(
                        "Connect-Timeout-Ms {v:?} is not a number of milliseconds"
                    ))
                })?;
            Some(Duration::from_millis(ms))
        }
    };
    let keepalive = header_str(headers, "keepalive-ping-interval")
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(DEFAULT_KEEPALIVE, |s| {
            Duration::from_secs(s.clamp(KEEPALIVE_BOUNDS.0, KEEPALIVE_BOUNDS.1))
        });
    Ok(CallMeta {
        codec,
        timeout,
        keepalive,
        user: basic_user(headers)?,
    })
}

/// The user named by `Authorization: Basic base64("<user>:")`; other schemes name none.
fn basic_user(headers: &HeaderMap) -> Result<Option<String>, ConnectError> {
    let Some(value) = header_str(headers, header::AUTHORIZATION.as_str()) else {
        return Ok(None);
    };
    let Some((scheme, encoded)) = value.split_once(' ') else {
        return Ok(None);
    };
    if !scheme.eq_ignore_ascii_case("basic") {
        return Ok(None);
    }
    let bad = || ConnectError::new(ConnectCode::Unauthenticated, "invalid username");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| bad())?;
    let text = String::from_utf8(decoded).map_err(|_| bad())?;
    let user = text.split_once(':').map_or(text.as_str(), |(u, _)| u);
    Ok((!user.is_empty()).then(|| user.to_owned()))
}

fn refusal_response(kind: Kind, refusal: Refusal) -> Response {
    match refusal {
        Refusal::MediaType(found) => {
            let accepted = match kind {
                Kind::Unary => "application/json, application/proto",
                Kind::Stream => "application/connect+json, application/connect+proto",
            };
            let e = ConnectError::new(
                ConnectCode::Unimplemented,
                format!("content type {found:?} is not one of {accepted}"),
            );
            let mut resp = e.into_response();
            *resp.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
            resp
        }
        Refusal::Error(e) => e.into_response(),
    }
}

/// A unary call: its headers and its one request message.
#[derive(Debug)]
pub struct Unary<M> {
    /// The headers.
    pub meta: CallMeta,
    /// The request.
    pub msg: M,
}

impl<S: Send + Sync, M: RpcMessage> FromRequest<S> for Unary<M> {
    type Rejection = Response;

    async fn from_request(req: Request, _: &S) -> Result<Self, Self::Rejection> {
        let meta = parse_meta(req.headers(), Kind::Unary).map_err(|r| refusal_response(Kind::Unary, r))?;
        let body = read_bounded(req.into_body())
            .await
            .map_err(IntoResponse::into_response)?;
        let msg = meta.codec.decode(&body).map_err(IntoResponse::into_response)?;
        Ok(Self { meta, msg })
    }
}

async fn read_bounded(body: Body) -> Result<Bytes, ConnectError> {
    match http_body_util::Limited::new(body, MAX_MESSAGE).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ConnectError::new(
            ConnectCode::ResourceExhausted,
            format!("the request message is larger than the limit of {MAX_MESSAGE} bytes"),
        )),
        Err(e) => Err(ConnectError::new(
            ConnectCode::Canceled,
            format!("reading the request failed: {e}"),
        )),
    }
}

/// A server-streaming call: its headers and its one (enveloped) request message. Refusals after
/// the content type was accepted are streams of their own (200, an end message with the error), as
/// Connect servers answer them.
#[derive(Debug)]
pub struct StreamCall<M> {
    /// The headers.
    pub meta: CallMeta,
    /// The request.
    pub msg: M,
}

impl<S: Send + Sync, M: RpcMessage> FromRequest<S> for StreamCall<M> {
    type Rejection = Response;

    async fn from_request(req: Request, _: &S) -> Result<Self, Self::Rejection> {
        let meta = parse_meta(req.headers(), Kind::Stream).map_err(|r| match r {
            Refusal::Error(e) => stream_error(stream_codec_of(req.headers()), e),
            media => refusal_response(Kind::Stream, media),
        })?;
        let codec = meta.codec;
        let mut reader = MessageReader::<M>::new(req.into_body(), codec);
        let msg = match reader.next().await {
            Some(Ok(msg)) => msg,
            Some(Err(e)) => return Err(stream_error(codec, e)),
            None => return Err(stream_error(codec, invalid("the request has no message"))),
        };
        match reader.next().await {
            None => Ok(Self { meta, msg }),
            Some(Err(e)) => Err(stream_error(codec, e)),
            Some(Ok(_)) => Err(stream_error(
                codec,
                invalid("a server-streaming call takes exactly one request message"),
            )),
        }
    }
}

/// The codec a stream's content type names (JSON when it names none we know).
fn stream_codec_of(headers: &HeaderMap) -> Codec {
    match header_str(headers, header::CONTENT_TYPE.as_str()) {
        Some(ct) if ct.to_ascii_lowercase().starts_with("application/connect+proto") => Codec::Proto,
        _ => Codec::Json,
    }
}

/// A client-streaming call: its headers and its messages, read as they arrive.
#[derive(Debug)]
pub struct ClientStream<M> {
    /// The headers.
    pub meta: CallMeta,
    /// The messages.
    pub messages: MessageReader<M>,
}

impl<S: Send + Sync, M: RpcMessage> FromRequest<S> for ClientStream<M> {
    type Rejection = Response;

    async fn from_request(req: Request, _: &S) -> Result<Self, Self::Rejection> {
        let meta = parse_meta(req.headers(), Kind::Stream).map_err(|r| match r {
            Refusal::Error(e) => stream_error(stream_codec_of(req.headers()), e),
            media => refusal_response(Kind::Stream, media),
        })?;
        let messages = MessageReader::new(req.into_body(), meta.codec);
        Ok(Self { meta, messages })
    }
}

/// The enveloped messages of a request body, decoded one at a time as their bytes arrive.
pub struct MessageReader<M> {
    body: axum::body::BodyDataStream,
    decoder: EnvelopeDecoder,
    codec: Codec,
    done: bool,
    _message: std::marker::PhantomData<fn() -> M>,
}

impl<M> std::fmt::Debug for MessageReader<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageReader")
            .field("codec", &self.codec)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<M: RpcMessage> MessageReader<M> {
    fn new(body: Body, codec: Codec) -> Self {
        Self {
            body: body.into_data_stream(),
            decoder: EnvelopeDecoder::new(MAX_MESSAGE),
            codec,
            done: false,
            _message: std::marker::PhantomData,
        }
    }

    /// The next message; `None` at the end of the request; an error (after which there is no more)
    /// for a malformed, oversized or truncated envelope or message.
    pub async fn next(&mut self) -> Option<Result<M, ConnectError>> {
        if self.done {
            return None;
        }
        let result = self.next_inner().await;
        if !matches!(result, Some(Ok(_))) {
            self.done = true;
        }
        result
    }

    async fn next_inner(&mut self) -> Option<Result<M, ConnectError>> {
        loop {
            match self.decoder.next_envelope() {
                Err(e) => return Some(Err(e)),
                Ok(Some((flags, _))) if flags & FLAG_END_STREAM != 0 => {
                    return Some(Err(invalid("a client may not send an end-of-stream envelope")));
                }
                Ok(Some((_, payload))) => return Some(self.codec.decode(&payload)),
                Ok(None) => {}
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.decoder.push(&chunk),
                Some(Err(e)) => {
                    return Some(Err(ConnectError::new(
                        ConnectCode::Canceled,
                        format!("reading the request failed: {e}"),
                    )))
                }
                None => return self.decoder.finish().err().map(Err),
            }
        }
    }
}

/// A unary call's answer: 200 with the message, or the error (always JSON, whatever the codec).
pub fn unary_response<M: RpcMessage>(codec: Codec, result: Result<M, ConnectError>) -> Response {
    match result {
        Ok(m) => {
            let mut resp = (StatusCode::OK, codec.encode(&m)).into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(codec.unary_content_type()),
            );
            resp
        }
        Err(e) => e.into_response(),
    }
}

fn stream_body(codec: Codec, body: Body) -> Response {
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(codec.stream_content_type()),
    );
    resp
}

/// A stream that fails before its first message: 200, and an end message with the error.
pub fn stream_error(codec: Codec, e: ConnectError) -> Response {
    stream_body(codec, Body::from(end_stream(Some(&e))))
}

/// A client-streaming call's answer: the one message, then the end message (or the error alone).
pub fn client_stream_response<M: RpcMessage>(codec: Codec, result: Result<M, ConnectError>) -> Response {
    match result {
        Ok(m) => {
            let mut bytes = BytesMut::new();
            bytes.extend_from_slice(&envelope(0, &codec.encode(&m)));
            bytes.extend_from_slice(&end_stream(None));
            stream_body(codec, Body::from(bytes.freeze()))
        }
        Err(e) => stream_error(codec, e),
    }
}

/// How a server stream runs.
#[derive(Debug, Clone, Copy)]
pub struct StreamOptions {
    /// Its codec.
    pub codec: Codec,
    /// When it ends with `deadline_exceeded`, if ever.
    pub deadline: Option<Instant>,
    /// How long it may be quiet before `keepalive()` is sent.
    pub keepalive: Duration,
}

/// A server stream's answer: 200, then each message of `source` as it comes (and `keepalive()`
/// whenever nothing was sent for the interval), then the end message: `{}` when `source` ends,
/// the error of an `Err` item (nothing of `source` is read after it), or `deadline_exceeded` when
/// the deadline passes first. When the client goes away the task ends and drops `source`.
pub fn stream_response<M, S, K>(options: StreamOptions, source: S, keepalive: K) -> Response
where
    M: RpcMessage,
    S: Stream<Item = Result<M, ConnectError>> + Send + 'static,
    K: Fn() -> M + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Bytes>(STREAM_QUEUE);
    tokio::spawn(drive_stream(options, source, keepalive, tx));
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    stream_body(options.codec, Body::from_stream(body))
}

async fn drive_stream<M, S, K>(options: StreamOptions, source: S, keepalive: K, tx: mpsc::Sender<Bytes>)
where
    M: RpcMessage,
    S: Stream<Item = Result<M, ConnectError>> + Send + 'static,
    K: Fn() -> M + Send + 'static,
{
    let codec = options.codec;
    let mut source = std::pin::pin!(source);
    let quiet = tokio::time::sleep(options.keepalive);
    tokio::pin!(quiet);
    let deadline = tokio::time::sleep_until(options.deadline.unwrap_or_else(Instant::now));
    tokio::pin!(deadline);
    let has_deadline = options.deadline.is_some();
    let end = loop {
        let message = tokio::select! {
            biased;
            () = tx.closed() => return,
            () = &mut deadline, if has_deadline => {
                break Some(ConnectError::new(ConnectCode::DeadlineExceeded, "the call's deadline passed"));
            }
            item = source.next() => match item {
                Some(Ok(m)) => m,
                Some(Err(e)) => break Some(e),
                None => break None,
            },
            () = &mut quiet => keepalive(),
        };
        if tx.send(envelope(0, &codec.encode(&message))).await.is_err() {
            return;
        }
        quiet.as_mut().reset(Instant::now() + options.keepalive);
    };
    let _ = tx.send(end_stream(end.as_ref())).await;
}

/// An RPC's route: `POST` only; any other method is answered 405 with a Connect error.
pub fn rpc<H, T, S>(handler: H) -> MethodRouter<S>
where
    H: Handler<T, S>,
    T: 'static,
    S: Clone + Send + Sync + 'static,
{
    post(handler).fallback(method_not_allowed)
}

async fn method_not_allowed() -> Response {
    let e = ConnectError::new(ConnectCode::Unimplemented, "Connect RPCs are called with POST");
    let mut resp = e.into_response();
    *resp.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    resp
}

/// The answer to an RPC this server does not have: `unimplemented`, HTTP 404 (the Connect
/// protocol's status for an unknown procedure).
pub fn unknown_rpc(path: &str) -> Response {
    let e = ConnectError::new(
        ConnectCode::Unimplemented,
        format!("{path} is not a procedure of this server"),
    );
    let mut resp = e.into_response();
    *resp.status_mut() = StatusCode::NOT_FOUND;
    resp
}

/// Whether `path` has the shape of an RPC (`/<package>.<Service>/<Method>`).
pub fn looks_like_rpc(path: &str) -> bool {
    let mut parts = path.strip_prefix('/').unwrap_or("").split('/');
    let (Some(service), Some(method), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let ident = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    service.contains('.') && service.split('.').all(ident) && ident(method)
}

mod envelope;

pub use envelope::{end_stream, envelope, EnvelopeDecoder, FLAG_END_STREAM};

#[cfg(test)]
mod tests;

//! The parts of a `multipart/form-data` upload, read as they arrive, in bounded memory.
//!
//! The parser (`multer`) buffers whatever its source has ready, and needs a part's headers whole
//! before it yields the part: on its own it would hold a part header that never ends, or a gzip body
//! that inflates faster than the sandbox takes it, without limit. So its source is windowed: it is
//! handed at most [`WINDOW`] bytes past the point where the upload last moved on (a new part, or
//! a chunk of a part's data taken by the write), and a header or preamble that fills the window
//! without ending is refused. Parts are bounded in number ([`MAX_PARTS`]) and in header bytes
//! ([`MAX_PART_HEADERS`]); a part's data is not bounded here (the sandbox's disk limit is its
//! bound, as for any write).
//!
//! It does not: read parts out of order or keep one once the next is asked for (each part must be
//! read to its end, or the upload abandoned), or honour a part's `Content-Type` (envd ignores it).

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, StreamExt as _};
use paddock_control::ByteStream;

use super::disposition::{file_name, FileName};

/// Bytes the parser may be handed while the upload does not move on (bounds what it buffers).
pub const WINDOW: u64 = 1024 * 1024;
/// Most parts in one upload (files and any other fields).
pub const MAX_PARTS: usize = 1000;
/// Most bytes of one part's headers (names and values).
pub const MAX_PART_HEADERS: usize = 16 * 1024;

/// Why a multipart body is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MultipartError {
    /// The `Content-Type` has no usable boundary.
    #[error("invalid multipart content type: {0}")]
    ContentType(String),
    /// A part's headers (or the preamble before the first part) run past the bound.
    #[error("a multipart part's headers are too large (at most {MAX_PART_HEADERS} bytes)")]
    HeadersTooLarge,
    /// More parts than [`MAX_PARTS`].
    #[error("too many parts in one upload (at most {MAX_PARTS})")]
    TooManyParts,
    /// Not well-formed multipart (truncated, a missing boundary, unreadable headers).
    #[error("error reading form: {0}")]
    Malformed(String),
    /// The request body itself failed (the client went away, a corrupt gzip coding).
    #[error("error reading the request body: {0}")]
    Body(String),
}

/// How far the upload has come, shared by the windowed source and the parts.
#[derive(Debug, Default)]
struct Progress {
    state: Mutex<ProgressState>,
}

#[derive(Debug, Default)]
struct ProgressState {
    /// Bytes handed to the parser since the upload last moved on.
    since: u64,
    /// How many times it moved on.
    epoch: u64,
    /// The first failure, when there was one.
    failure: Option<MultipartError>,
}

impl Progress {
    fn lock(&self) -> std::sync::MutexGuard<'_, ProgressState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn moved_on(&self) {
        let mut s = self.lock();
        s.since = 0;
        s.epoch += 1;
    }

    /// Records `e` unless a failure was recorded first; the recorded one.
    fn fail(&self, e: MultipartError) -> MultipartError {
        self.lock().failure.get_or_insert(e).clone()
    }
}

/// The parser's source: the body, never more than [`WINDOW`] bytes ahead of the upload.
struct Windowed {
    body: ByteStream,
    progress: Arc<Progress>,
    /// A chunk held back while the window was full.
    held: Option<Bytes>,
    /// The epoch at which a chunk was held back.
    held_at: Option<u64>,
}

impl Stream for Windowed {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let chunk = match this.held.take() {
            Some(chunk) => chunk,
            None => match this.body.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(chunk))) => chunk,
                Poll::Ready(Some(Err(e))) => {
                    let e = this.progress.fail(MultipartError::Body(e.to_string()));
                    return Poll::Ready(Some(Err(std::io::Error::other(e.to_string()))));
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            },
        };
        let mut s = this.progress.lock();
        // One chunk always goes in, whatever its size, so a large chunk cannot stall the upload.
        if s.since == 0 || s.since + chunk.len() as u64 <= WINDOW {
            s.since += chunk.len() as u64;
            this.held_at = None;
            return Poll::Ready(Some(Ok(chunk)));
        }
        if this.held_at == Some(s.epoch) {
            // Held back before, and the parser yielded nothing since: it is waiting for the end of
            // headers that the window cannot hold.
            drop(s);
            let e = this.progress.fail(MultipartError::HeadersTooLarge);
            return Poll::Ready(Some(Err(std::io::Error::other(e.to_string()))));
        }
        this.held_at = Some(s.epoch);
        drop(s);
        this.held = Some(chunk);
        // The parser yields what it has (or finds that it cannot), then polls again.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The parts of one upload.
pub struct Parts {
    multipart: multer::Multipart<'static>,
    progress: Arc<Progress>,
    count: usize,
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts")
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

impl Parts {
    /// The parts of `body`, a `multipart/form-data` body with this `Content-Type`.
    pub fn new(body: ByteStream, content_type: &str) -> Result<Self, MultipartError> {
        let boundary =
            multer::parse_boundary(content_type).map_err(|e| MultipartError::ContentType(e.to_string()))?;
        let progress = Arc::new(Progress::default());
        let source = Windowed {
            body,
            progress: progress.clone(),
            held: None,
            held_at: None,
        };
        Ok(Self {
            multipart: multer::Multipart::new(source, boundary),
            progress,
            count: 0,
        })
    }

    /// The next part; `None` after the last. The previous part must have been read to its end.
    pub async fn next(&mut self) -> Result<Option<Part>, MultipartError> {
        let field = match self.multipart.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => return Ok(None),
            Err(e) => return Err(self.progress.fail(MultipartError::Malformed(e.to_string()))),
        };
        self.progress.moved_on();
        self.count += 1;
        if self.count > MAX_PARTS {
            return Err(self.progress.fail(MultipartError::TooManyParts));
        }
        let header_bytes: usize = field
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len())
            .sum();
        if header_bytes > MAX_PART_HEADERS {
            return Err(self.progress.fail(MultipartError::HeadersTooLarge));
        }
        let file_name = field
            .headers()
            .get(axum::http::header::CONTENT_DISPOSITION)
            .and_then(|v| file_name(v.as_bytes()));
        Ok(Some(Part {
            name: field.name().map(str::to_owned),
            file_name,
            field,
            progress: self.progress.clone(),
        }))
    }

    /// The failure that ended the upload's body, when one did (a part's stream reports it only as
    /// an I/O error to the write that read it).
    pub fn failure(&self) -> Option<MultipartError> {
        self.progress.lock().failure.clone()
    }
}

/// One part.
pub struct Part {
    name: Option<String>,
    file_name: Option<FileName>,
    field: multer::Field<'static>,
    progress: Arc<Progress>,
}

impl std::fmt::Debug for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Part")
            .field("name", &self.name)
            .field("file_name", &self.file_name)
            .finish_non_exhaustive()
    }
}

impl Part {
    /// The form field's name (`file` for an upload's files).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The part's file name (`filename*` when given, else `filename`), unescaped.
    pub fn file_name(&self) -> Option<&FileName> {
        self.file_name.as_ref()
    }

    /// The part's data, as it arrives.
    pub fn into_stream(self) -> ByteStream {
        let progress = self.progress;
        Box::pin(self.field.map(move |chunk| match chunk {
            Ok(chunk) => {
                progress.moved_on();
                Ok(chunk)
            }
            Err(e) => {
                let e = progress.fail(MultipartError::Malformed(e.to_string()));
                Err(std::io::Error::other(e.to_string()))
            }
        }))
    }

    /// Reads the part to its end, keeping nothing.
    pub async fn skip(self) -> Result<(), MultipartError> {
        let progress = self.progress.clone();
        let mut stream = self.into_stream();
        while let Some(chunk) = stream.next().await {
            if chunk.is_err() {
                let failure = progress.lock().failure.clone();
                return Err(failure.unwrap_or_else(|| MultipartError::Malformed("unreadable part".into())));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIECE: usize = 64 * 1024;

    /// A source that is always ready, and counts the bytes taken from it.
    fn counted(
        chunks: impl Iterator<Item = Bytes> + Send + 'static,
    ) -> (ByteStream, Arc<std::sync::atomic::AtomicU64>) {
        let pulled = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = pulled.clone();
        let stream = futures_util::stream::iter(chunks.map(move |c| {
            counter.fetch_add(c.len() as u64, std::sync::atomic::Ordering::SeqCst);
            Ok(c)
        }));
        (Box::pin(stream), pulled)
    }

    fn pulled(counter: &std::sync::atomic::AtomicU64) -> u64 {
        counter.load(std::sync::atomic::Ordering::SeqCst)
    }

    const CONTENT_TYPE: &str = "multipart/form-data; boundary=XyZ";

    #[tokio::test]
    async fn part_headers_that_never_end_are_refused_within_the_window() {
        let start = Bytes::from_static(b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\nX-Pad: ");
        let endless = std::iter::repeat_with(|| Bytes::from(vec![b'a'; PIECE]));
        let (body, taken) = counted(std::iter::once(start).chain(endless));
        let mut parts = Parts::new(body, CONTENT_TYPE).expect("a boundary");
        let refused = parts.next().await.expect_err("refused");
        assert_eq!(refused, MultipartError::HeadersTooLarge);
        assert!(pulled(&taken) <= WINDOW + 2 * PIECE as u64, "{}", pulled(&taken));
        assert_eq!(parts.failure(), Some(MultipartError::HeadersTooLarge));
    }

    #[tokio::test]
    async fn a_part_that_arrives_faster_than_it_is_read_stays_within_the_window() {
        let size = 8 * 1024 * 1024;
        let head = Bytes::from_static(
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\n",
        );
        let data = (0..size / PIECE).map(|i| Bytes::from(vec![(i % 251) as u8; PIECE]));
        let tail = Bytes::from_static(b"\r\n--XyZ--\r\n");
        let (body, taken) = counted(std::iter::once(head).chain(data).chain(std::iter::once(tail)));
        let mut parts = Parts::new(body, CONTENT_TYPE).expect("a boundary");
        let part = parts.next().await.expect("a part").expect("one part");
        assert_eq!(part.file_name(), Some(&FileName::Text("a".into())));
        let mut stream = part.into_stream();
        let (mut read, mut furthest_ahead) = (0u64, 0u64);
        while let Some(chunk) = stream.next().await {
            read += chunk.expect("data").len() as u64;
            furthest_ahead = furthest_ahead.max(pulled(&taken) - read);
        }
        drop(stream);
        assert_eq!(read, size as u64);
        assert!(furthest_ahead <= WINDOW + 2 * PIECE as u64, "{furthest_ahead}");
        assert!(parts.next().await.expect("the end").is_none());
    }

    #[tokio::test]
    async fn parts_past_the_bound_are_refused() {
        let mut body = Vec::new();
        for _ in 0..=MAX_PARTS {
            body.extend_from_slice(b"--XyZ\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nx\r\n");
        }
        body.extend_from_slice(b"--XyZ--\r\n");
        let (body, _) = counted(std::iter::once(Bytes::from(body)));
        let mut parts = Parts::new(body, CONTENT_TYPE).expect("a boundary");
        for _ in 0..MAX_PARTS {
            let part = parts.next().await.expect("a part").expect("more parts");
            part.skip().await.expect("skipped");
        }
        assert_eq!(
            parts.next().await.expect_err("refused"),
            MultipartError::TooManyParts
        );
        assert!(matches!(
            Parts::new(counted(std::iter::empty()).0, "multipart/form-data"),
            Err(MultipartError::ContentType(_))
        ));
    }

    #[tokio::test]
    async fn a_truncated_part_is_malformed() {
        let body = Bytes::from_static(
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nsome data",
        );
        let (body, _) = counted(std::iter::once(body));
        let mut parts = Parts::new(body, CONTENT_TYPE).expect("a boundary");
        let part = parts.next().await.expect("a part").expect("one part");
        let mut stream = part.into_stream();
        // The parser repeats its error on every later poll: a reader stops at the first.
        let mut failed = false;
        while let Some(chunk) = stream.next().await {
            if chunk.is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed);
        assert!(matches!(parts.failure(), Some(MultipartError::Malformed(_))));
    }
}

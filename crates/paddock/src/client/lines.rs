//! Lines of a streamed response body as they arrive, each at most 16 MiB: what the NDJSON
//! (`exec.rs`) and Server-Sent Events (`approvals.rs`) readers split their streams with.
//!
//! What it does not do: parse a line (its readers do).

use anyhow::Context as _;
use bytes::{Buf as _, BytesMut};
use futures_util::StreamExt as _;
use reqwest::Response;

/// The longest line accepted (a server sends output in chunks far smaller).
const MAX_LINE: usize = 16 << 20;

/// A response body, split at `\n`.
pub struct Lines {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: BytesMut,
    done: bool,
}

impl std::fmt::Debug for Lines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lines")
            .field("buffered", &self.buf.len())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl Lines {
    pub fn new(response: Response) -> Self {
        Self {
            body: response.bytes_stream().boxed(),
            buf: BytesMut::new(),
            done: false,
        }
    }

    /// The next line without its `\n`; at the end of the body what is left after the last `\n`
    /// (if anything), then `None`.
    pub async fn next(&mut self) -> anyhow::Result<Option<BytesMut>> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line = self.buf.split_to(end);
                self.buf.advance(1);
                return Ok(Some(line));
            }
            if self.done {
                return Ok((!self.buf.is_empty()).then(|| self.buf.split()));
            }
            match self.body.next().await {
                Some(chunk) => {
                    self.buf
                        .extend_from_slice(&chunk.context("failed to read the stream")?);
                    if self.buf.len() > MAX_LINE {
                        anyhow::bail!("the server sent a line longer than {MAX_LINE} bytes");
                    }
                }
                None => self.done = true,
            }
        }
    }
}

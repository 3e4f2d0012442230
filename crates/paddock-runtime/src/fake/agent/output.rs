//! Process output: per stream, a ring of the last [`RING_CAPACITY`] bytes with byte offsets and one
//! cursor per attached connection, as the real agent's `process/output.rs`. A writer never overwrites
//! bytes an attached connection has not taken: it waits for room, so a host that stops reading
//! stops the process (and memory stays bounded). A stream nobody is attached to keeps its last
//! 1 MiB for a later attach to replay.

use std::collections::VecDeque;
use std::sync::Mutex;

use paddock_protocol::Stream;
use tokio::sync::Notify;

use super::lock;

/// Output kept per stream for replay.
pub(crate) const RING_CAPACITY: usize = 1 << 20;

/// One output stream of a process.
#[derive(Debug)]
pub(crate) struct OutputStream {
    kind: Stream,
    ring: Mutex<Ring>,
    /// Signalled when a cursor advances or goes away.
    space: Notify,
}

#[derive(Debug, Default)]
struct Ring {
    buf: VecDeque<u8>,
    /// Offset of `buf[0]` in the stream.
    start: u64,
    closed: bool,
    /// (connection, next offset to send) of every attached connection.
    cursors: Vec<(u64, u64)>,
}

impl Ring {
    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    fn oldest_needed(&self) -> u64 {
        self.cursors
            .iter()
            .map(|c| c.1)
            .min()
            .unwrap_or(self.end())
            .max(self.start)
    }

    fn room(&self) -> usize {
        RING_CAPACITY.saturating_sub((self.end() - self.oldest_needed()) as usize)
    }
}

impl OutputStream {
    pub(crate) fn new(kind: Stream) -> Self {
        Self {
            kind,
            ring: Mutex::new(Ring::default()),
            space: Notify::new(),
        }
    }

    pub(crate) fn kind(&self) -> Stream {
        self.kind
    }

    pub(crate) fn is_closed(&self) -> bool {
        lock(&self.ring).closed
    }

    pub(crate) fn buffered(&self) -> usize {
        lock(&self.ring).buf.len()
    }

    /// Places (or moves) `conn`'s cursor at `from`, clamped to what is buffered; where it went.
    pub(crate) fn add_cursor(&self, conn: u64, from: u64) -> u64 {
        let mut ring = lock(&self.ring);
        let from = from.clamp(ring.start, ring.end());
        ring.cursors.retain(|c| c.0 != conn);
        ring.cursors.push((conn, from));
        from
    }

    pub(crate) fn remove_cursor(&self, conn: u64) {
        lock(&self.ring).cursors.retain(|c| c.0 != conn);
        self.space.notify_waiters();
    }

    /// Whether `conn` has taken everything written so far.
    pub(crate) fn cursor_at_end(&self, conn: u64) -> bool {
        let ring = lock(&self.ring);
        ring.cursors
            .iter()
            .find(|c| c.0 == conn)
            .is_none_or(|c| c.1 >= ring.end())
    }

    /// Up to `max` bytes at `conn`'s cursor, which advances: `(offset, bytes)`.
    pub(crate) fn take_chunk(&self, conn: u64, max: usize) -> Option<(u64, Vec<u8>)> {
        let mut ring = lock(&self.ring);
        let (start, end) = (ring.start, ring.end());
        let cursor = ring.cursors.iter_mut().find(|c| c.0 == conn)?;
        let from = cursor.1.max(start);
        if from >= end {
            return None;
        }
        let len = ((end - from) as usize).min(max);
        cursor.1 = from + len as u64;
        let skip = (from - start) as usize;
        let data: Vec<u8> = ring.buf.range(skip..skip + len).copied().collect();
        drop(ring);
        self.space.notify_waiters();
        Some((from, data))
    }

    /// Appends `data`, waiting for room whenever an attached connection still needs the oldest
    /// bytes; `changed` is called after each piece.
    pub(crate) async fn write(&self, mut data: &[u8], changed: &(dyn Fn() + Sync)) {
        while !data.is_empty() {
            let space = self.space.notified();
            tokio::pin!(space);
            space.as_mut().enable();
            let took = {
                let mut ring = lock(&self.ring);
                let take = ring.room().min(data.len());
                if take > 0 {
                    let excess = (ring.buf.len() + take).saturating_sub(RING_CAPACITY);
                    ring.buf.drain(..excess);
                    ring.start += excess as u64;
                    ring.buf.extend(&data[..take]);
                }
                take
            };
            if took == 0 {
                space.await;
                continue;
            }
            data = &data[took..];
            changed();
        }
    }

    pub(crate) fn close(&self) {
        lock(&self.ring).closed = true;
    }

    /// Frees what no attached connection needs (an exited process past the output budget).
    pub(crate) fn release_unneeded(&self) {
        let mut ring = lock(&self.ring);
        let drop_len = (ring.oldest_needed() - ring.start) as usize;
        ring.buf.drain(..drop_len);
        ring.start += drop_len as u64;
        ring.buf.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keeps_the_last_mebibyte_and_clamps_cursors() {
        let s = OutputStream::new(Stream::Stdout);
        let chunk = vec![7u8; 600 * 1024];
        s.write(&chunk, &|| {}).await;
        s.write(&chunk, &|| {}).await;
        assert_eq!(s.buffered(), RING_CAPACITY);
        assert_eq!(s.add_cursor(1, 0), (1_200 * 1024 - RING_CAPACITY) as u64);
        let (offset, data) = s.take_chunk(1, 10).expect("data");
        assert_eq!((offset, data.len()), ((1_200 * 1024 - RING_CAPACITY) as u64, 10));
    }

    #[tokio::test]
    async fn a_cursor_back_pressures_the_writer() {
        let s = std::sync::Arc::new(OutputStream::new(Stream::Stderr));
        s.add_cursor(1, 0);
        s.write(&vec![1u8; RING_CAPACITY], &|| {}).await;
        let writer = {
            let s = s.clone();
            tokio::spawn(async move { s.write(b"more", &|| {}).await })
        };
        tokio::task::yield_now().await;
        assert!(!writer.is_finished(), "the writer waits for the reader");
        s.take_chunk(1, 4).expect("data");
        tokio::time::timeout(std::time::Duration::from_secs(5), writer)
            .await
            .expect("the writer continues")
            .expect("joined");
        assert!(!s.cursor_at_end(1));
    }
}

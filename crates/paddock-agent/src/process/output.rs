//! Process output: a per-stream ring buffer of the last 1 MiB with byte offsets, and the pump task
//! that moves bytes from a pipe (or PTY master) into it.
//!
//! Backpressure: every attached connection has a cursor in the stream, and the pump never reads
//! more than fits without overwriting bytes some cursor has not consumed. So when an attached host
//! stops reading, its cursor stops, the ring fills, the pump stops reading the pipe, and the process
//! blocks in `write`; memory stays bounded on both sides. A stream without cursors is drained
//! continuously and keeps only its last 1 MiB, for a later attach to replay.
//!
//! After the process exits, the pump keeps forwarding until end of file, but only for
//! [`DRAIN_AFTER_EXIT`] of its own time (time spent blocked by a slow reader does not count): a
//! background grandchild may hold the pipe open forever. From then on the stream is closed (so the
//! exit can be reported) and the pipe is read and discarded until end of file, so such a grandchild
//! does not die of `SIGPIPE`.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use paddock_protocol::Stream;
use tokio::net::unix::pipe;
use tokio::sync::Notify;

use crate::agent::Agent;
use crate::process::table::Process;

/// Output kept per stream for replay.
pub(crate) const RING_CAPACITY: usize = 1 << 20;
/// How long the pump waits for end of file after the process exited.
pub(crate) const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(100);
/// Largest single read from a pipe.
const READ_CHUNK: usize = 32 * 1024;

/// One output stream of a process.
#[derive(Debug)]
pub(crate) struct OutputStream {
    kind: Stream,
    ring: RefCell<Ring>,
    /// Signalled when a cursor advances or goes away (room for the pump).
    space: Notify,
}

#[derive(Debug, Default)]
struct Ring {
    buf: VecDeque<u8>,
    /// Offset of `buf[0]` in the stream.
    start: u64,
    /// No more bytes will arrive.
    closed: bool,
    /// (connection id, next offset to send) of every attached connection.
    cursors: Vec<(u64, u64)>,
}

impl Ring {
    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    /// The oldest byte some cursor still needs (the end when there are no cursors).
    fn oldest_needed(&self) -> u64 {
        self.cursors
            .iter()
            .map(|c| c.1)
            .min()
            .unwrap_or(self.end())
            .max(self.start)
    }
}

impl OutputStream {
    pub(crate) fn new(kind: Stream) -> Self {
        Self {
            kind,
            ring: RefCell::new(Ring::default()),
            space: Notify::new(),
        }
    }

    /// Which stream this is.
    pub(crate) fn kind(&self) -> Stream {
        self.kind
    }

    /// Offset one past the last byte received.
    #[cfg(test)]
    fn end(&self) -> u64 {
        self.ring.borrow().end()
    }

    /// Whether no more bytes will arrive.
    pub(crate) fn is_closed(&self) -> bool {
        self.ring.borrow().closed
    }

    /// Bytes held in the buffer.
    pub(crate) fn buffered(&self) -> usize {
        self.ring.borrow().buf.len()
    }

    /// A copy of the last `max` bytes received (for a kernel's stderr in an error message).
    pub(crate) fn tail(&self, max: usize) -> Vec<u8> {
        let ring = self.ring.borrow();
        let len = ring.buf.len().min(max);
        copy_range(&ring.buf, ring.buf.len() - len, len)
    }

    /// Registers (or moves) the cursor of connection `conn` at `from`, clamped to the buffered range;
    /// returns where it was placed.
    pub(crate) fn add_cursor(&self, conn: u64, from: u64) -> u64 {
        let mut ring = self.ring.borrow_mut();
        let from = from.clamp(ring.start, ring.end());
        ring.cursors.retain(|c| c.0 != conn);
        ring.cursors.push((conn, from));
        from
    }

    /// Removes the cursor of `conn`, giving the pump room.
    pub(crate) fn remove_cursor(&self, conn: u64) {
        self.ring.borrow_mut().cursors.retain(|c| c.0 != conn);
        self.space.notify_one();
    }

    /// Whether `conn`'s cursor has consumed everything received so far.
    pub(crate) fn cursor_at_end(&self, conn: u64) -> bool {
        let ring = self.ring.borrow();
        ring.cursors
            .iter()
            .find(|c| c.0 == conn)
            .is_none_or(|c| c.1 >= ring.end())
    }

    /// Copies up to `max` bytes at `conn`'s cursor and advances it: `(offset, bytes)`, or `None`
    /// when the cursor is at the end.
    pub(crate) fn take_chunk(&self, conn: u64, max: usize) -> Option<(u64, Vec<u8>)> {
        let mut ring = self.ring.borrow_mut();
        let (start, end) = (ring.start, ring.end());
        let cursor = ring.cursors.iter_mut().find(|c| c.0 == conn)?;
        let from = cursor.1.max(start);
        if from >= end {
            return None;
        }
        let len = ((end - from) as usize).min(max);
        cursor.1 = from + len as u64;
        let data = copy_range(&ring.buf, (from - start) as usize, len);
        drop(ring);
        self.space.notify_one();
        Some((from, data))
    }

    /// How many bytes may be added without dropping anything an attached connection still needs.
    fn room(&self) -> usize {
        let ring = self.ring.borrow();
        RING_CAPACITY.saturating_sub((ring.end() - ring.oldest_needed()) as usize)
    }

    /// Appends bytes, dropping the oldest unneeded ones beyond the capacity.
    fn push(&self, data: &[u8]) {
        let mut ring = self.ring.borrow_mut();
        let excess = (ring.buf.len() + data.len()).saturating_sub(RING_CAPACITY);
        if excess > 0 {
            ring.buf.drain(..excess);
            ring.start += excess as u64;
        }
        ring.buf.extend(data);
    }

    fn close(&self) {
        self.ring.borrow_mut().closed = true;
    }

    /// Frees buffered bytes no attached connection needs (an exited process's output beyond the
    /// agent's retention budget); a later attach then starts at the end.
    pub(crate) fn release_unneeded(&self) {
        let mut ring = self.ring.borrow_mut();
        let drop_len = (ring.oldest_needed() - ring.start) as usize;
        ring.buf.drain(..drop_len);
        ring.start += drop_len as u64;
        ring.buf.shrink_to_fit();
    }

    /// Gives back spare capacity once the stream is closed.
    pub(crate) fn shrink(&self) {
        self.ring.borrow_mut().buf.shrink_to_fit();
    }
}

/// Copies `len` bytes starting at index `from` of a ring.
fn copy_range(buf: &VecDeque<u8>, from: usize, len: usize) -> Vec<u8> {
    let (front, back) = buf.as_slices();
    let mut out = Vec::with_capacity(len);
    if from < front.len() {
        let take = len.min(front.len() - from);
        out.extend_from_slice(&front[from..from + take]);
        out.extend_from_slice(&back[..len - take]);
    } else {
        let from = from - front.len();
        out.extend_from_slice(&back[from..from + len]);
    }
    out
}

/// Moves bytes from `fd` into stream `index` of `process` until end of file (or the drain deadline
/// after the process exited), then closes the stream.
pub(crate) async fn pump_output(agent: Rc<Agent>, process: Rc<Process>, index: usize, fd: pipe::Receiver) {
    let stream = &process.streams()[index];
    let mut deadline: Option<Instant> = None;
    let reached_eof = loop {
        if deadline.is_none() {
            deadline = process.exited_at().map(|at| at + DRAIN_AFTER_EXIT);
        }
        if stream.room() == 0 {
            let began = Instant::now();
            let space = stream.space.notified();
            if stream.room() == 0 {
                space.await;
            }
            // Time spent waiting for a slow reader does not count against the drain deadline.
            if let Some(deadline) = deadline.as_mut() {
                *deadline += began.elapsed();
            }
            continue;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break false;
        }
        let far = Instant::now() + Duration::from_secs(3600);
        let sleep = tokio::time::sleep_until(deadline.unwrap_or(far).into());
        let exited = process.exit_notified();
        tokio::select! {
            ready = fd.readable() => {
                if ready.is_err() {
                    break true;
                }
                match read_into(&fd, stream, stream.room()) {
                    Ok(0) => break true,
                    Ok(_) => process.notify_changed(),
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                    // A PTY master reports EIO once every slave descriptor is closed: end of file.
                    Err(err) if err.raw_os_error() == Some(libc::EIO) => break true,
                    Err(err) => {
                        tracing::warn!(pid = process.pid(), error = %err, "reading process output failed");
                        break true;
                    }
                }
            }
            () = exited, if deadline.is_none() => {}
            () = sleep, if deadline.is_some() => break false,
        }
    };
    stream.close();
    process.notify_changed();
    agent.check_finished(&process);
    if !reached_eof {
        discard_until_eof(&fd).await;
    }
}

/// One non-blocking read of at most `room` bytes into the stream. The bytes land in a buffer's
/// spare capacity, never zeroed first: a read touches only the memory it fills (a 32 KiB zeroed
/// buffer on the stack left 32 KiB of every idle agent's stack resident).
fn read_into(fd: &pipe::Receiver, stream: &OutputStream, room: usize) -> io::Result<usize> {
    let mut buf = Vec::with_capacity(room.min(READ_CHUNK));
    let n = fd.try_read_buf(&mut buf)?;
    stream.push(&buf);
    Ok(n)
}

/// Reads and drops everything until end of file (a background writer that outlived the process).
async fn discard_until_eof(fd: &pipe::Receiver) {
    loop {
        if fd.readable().await.is_err() {
            return;
        }
        match discard_available(fd) {
            Ok(0) => return,
            Err(err) if err.kind() != io::ErrorKind::WouldBlock => return,
            Ok(_) | Err(_) => {}
        }
    }
}

/// One non-blocking read whose bytes are dropped (into a buffer's spare capacity, as [`read_into`]).
fn discard_available(fd: &pipe::Receiver) -> io::Result<usize> {
    fd.try_read_buf(&mut Vec::with_capacity(READ_CHUNK))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_last_mebibyte_without_cursors() {
        let s = OutputStream::new(Stream::Stdout);
        let chunk = vec![7u8; 600 * 1024];
        s.push(&chunk);
        s.push(&chunk);
        assert_eq!(s.end(), 1_200 * 1024);
        assert_eq!(s.buffered(), RING_CAPACITY);
        assert_eq!(
            s.add_cursor(1, 0),
            (1_200 * 1024 - RING_CAPACITY) as u64,
            "clamped to the oldest byte"
        );
    }

    #[test]
    fn cursors_limit_room_and_advance() {
        let s = OutputStream::new(Stream::Stderr);
        s.add_cursor(1, 0);
        s.push(&vec![1u8; RING_CAPACITY - 10]);
        assert_eq!(s.room(), 10);
        let (offset, data) = s.take_chunk(1, 64 * 1024).expect("data");
        assert_eq!((offset, data.len()), (0, 64 * 1024));
        assert_eq!(s.room(), 10 + 64 * 1024);
        s.remove_cursor(1);
        assert_eq!(s.room(), RING_CAPACITY);
        assert!(s.take_chunk(1, 10).is_none(), "no cursor, nothing to take");
    }

    #[test]
    fn chunks_are_contiguous_across_the_wrap() {
        let s = OutputStream::new(Stream::Stdout);
        let data: Vec<u8> = (0..3 * RING_CAPACITY / 2).map(|i| (i % 251) as u8).collect();
        s.push(&data[..RING_CAPACITY]);
        s.push(&data[RING_CAPACITY..]);
        let from = s.add_cursor(9, 0);
        let mut got = Vec::new();
        while let Some((offset, chunk)) = s.take_chunk(9, 100_000) {
            assert_eq!(offset, from + got.len() as u64);
            got.extend_from_slice(&chunk);
        }
        assert_eq!(got, &data[from as usize..]);
        assert!(s.cursor_at_end(9));
        s.release_unneeded();
        assert_eq!(s.buffered(), 0);
    }
}

//! Reading this process's stdin without ever blocking in `read`, when it is a pipe or a socket: a
//! run's stdin is copied between waits, so a run can hand over to `paddock-wait` between two reads
//! with nothing read and not yet delivered (`run_lean.rs`), and `paddock-wait` goes on the same way.
//!
//! The descriptor itself stays blocking (its open file description is shared with whoever started
//! paddock, who must not find it switched to non-blocking): a read asks for no more than `FIONREAD`
//! says is there. A terminal, a regular file or another device is not pollable here
//! ([`pollable`]): the front reads those on a helper thread and never hands over while they are open.
//! No async runtime here (`paddock-wait` links this module).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use rustix::event::{poll, PollFd, PollFlags};

/// Whether stdin (`fd`) is a pipe or a socket, which this module reads.
pub(crate) fn pollable(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|st| {
        matches!(
            rustix::fs::FileType::from_raw_mode(st.st_mode),
            rustix::fs::FileType::Fifo | rustix::fs::FileType::Socket
        )
    })
}

/// Reads what is there: `Ok(n > 0)` bytes, `Ok(0)` at the end (the writers are gone, the peer shut
/// down), `WouldBlock` when nothing is there yet (a wake-up with nothing to read).
pub(crate) fn read_available(fd: impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    let fd = fd.as_fd();
    loop {
        let n = rustix::io::ioctl_fionread(fd)? as usize;
        if n > 0 {
            let want = n.min(buf.len());
            return Ok(rustix::io::read(fd, &mut buf[..want])?);
        }
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        poll(&mut fds, Some(&zero))?;
        if fds[0].revents().is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        // Readable, hung up or failed: bytes that arrived since the count are read first; with none,
        // it is the end (no writer can add bytes after a hang-up or a shutdown).
        if rustix::io::ioctl_fionread(fd)? == 0 {
            return Ok(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_pipe_is_read_without_blocking_to_its_end() {
        let (r, w) = rustix::pipe::pipe().expect("pipe");
        assert!(pollable(r.as_fd()));
        let mut buf = [0u8; 4];
        let e = read_available(&r, &mut buf).expect_err("nothing yet");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let mut w = std::fs::File::from(w);
        w.write_all(b"abcdef").expect("write");
        assert_eq!(read_available(&r, &mut buf).expect("read"), 4);
        assert_eq!(&buf, b"abcd");
        drop(w);
        // The bytes written before the hang-up come first, then the end.
        assert_eq!(read_available(&r, &mut buf).expect("read"), 2);
        assert_eq!(&buf[..2], b"ef");
        assert_eq!(read_available(&r, &mut buf).expect("end"), 0);
    }

    #[test]
    fn a_socket_ends_at_its_peers_shutdown_and_files_are_not_pollable() {
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        assert!(pollable(a.as_fd()));
        let mut buf = [0u8; 8];
        assert_eq!(
            read_available(&a, &mut buf).expect_err("nothing yet").kind(),
            io::ErrorKind::WouldBlock
        );
        (&b).write_all(b"xy").expect("write");
        b.shutdown(std::net::Shutdown::Write).expect("shutdown");
        assert_eq!(read_available(&a, &mut buf).expect("read"), 2);
        assert_eq!(read_available(&a, &mut buf).expect("end"), 0);
        let file = tempfile::tempfile().expect("file");
        assert!(!pollable(file.as_fd()));
        let null = std::fs::File::open("/dev/null").expect("null");
        assert!(!pollable(null.as_fd()));
    }
}

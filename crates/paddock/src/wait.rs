//! `paddock-wait`: what a long `paddock run` becomes while its command runs (`run_lean.rs` hands over
//! to it). A single-threaded loop that copies the command's output from the agent to this process's
//! standard output and error, watches for the command's exit, `--timeout`'s deadline and
//! `SIGINT`/`SIGTERM`/`SIGHUP`, and then execs `paddock` again, which tears the sandbox down and
//! exits with the command's code.
//!
//! Why it exists: the supervising process of an idle run would otherwise keep `paddock`'s relocated
//! data, heap and stacks (about 700 KiB per sandbox). This program links no async runtime, no
//! command-line parser and no backend: its arguments are a fixed, internal list written by
//! `run_lean.rs` (hand-parsed here for that reason), and it reads frames with blocking calls.
//!
//! Stdin, when still open (a pipe or a socket), is copied as the front did: read what is there
//! (`stdin.rs`), send it, and read again only once the agent has answered that the bytes are in the
//! command's pipe; the request is sent without blocking, so output keeps flowing while a command is
//! slow to read its stdin.
//!
//! What it does not do: it serves no terminal and no network, and never touches the sandbox itself.
//! Its input from the agent is hostile: frame limits are `paddock-protocol`'s, offsets are checked,
//! and a malformed frame ends the wait as a lost agent.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

use paddock_protocol::{
    decode_prefix, encode_frame, AgentMessage, ClientMessage, Request, Stream, MAX_PAYLOAD_LEN, PREFIX_LEN,
};
use paddock_sys::signal::SignalReader;
use rustix::event::{poll, PollFd, PollFlags};

/// The signals that end a run, blocked by the front before it hands over (so none is lost or acted
/// on in between) and read here from a signalfd.
pub(crate) const ENDING_SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// How the run ended, for the `paddock` that tears the sandbox down (`PADDOCK_RUN_OUTCOME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The command exited; the shell's code for it.
    Exited(i32),
    /// `--timeout` passed.
    TimedOut,
    /// This signal asked the run to end.
    Interrupted(i32),
    /// The agent's connection ended or broke before the command's exit.
    Lost,
}

impl Ending {
    pub(crate) fn encode(&self) -> String {
        match self {
            Ending::Exited(code) => format!("exit:{code}"),
            Ending::TimedOut => "timeout".to_owned(),
            Ending::Interrupted(sig) => format!("signal:{sig}"),
            Ending::Lost => "lost".to_owned(),
        }
    }

    pub(crate) fn decode(s: &str) -> Option<Self> {
        match s.split_once(':') {
            None if s == "timeout" => Some(Ending::TimedOut),
            None if s == "lost" => Some(Ending::Lost),
            Some(("exit", code)) => code.parse().ok().map(Ending::Exited),
            Some(("signal", sig)) => sig
                .parse()
                .ok()
                .filter(|s| ENDING_SIGNALS.contains(s))
                .map(Ending::Interrupted),
            _ => None,
        }
    }
}

/// The waiter's arguments, in this order:
/// `<agent fd> <pid> <stdout from> <stderr from> <deadline ns|-> <stdin open|done> <front fd>
/// <front argv...>`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct WaitArgs {
    /// A connection to the agent, attached to the command, its replies to hello and attach read.
    pub agent_fd: i32,
    /// The command's pid (the agent's numbering).
    pub pid: u32,
    /// Output below these offsets (stdout, stderr) was written by the front already.
    pub from: [u64; 2],
    /// `CLOCK_MONOTONIC` deadline of `--timeout`, in nanoseconds.
    pub deadline_ns: Option<u64>,
    /// Stdin (a pipe or a socket) is still open and is copied to the command's.
    pub stdin_open: bool,
    /// The `paddock` executable to exec at the end, open.
    pub front_fd: i32,
    /// Its arguments (the run's own command line).
    pub front_argv: Vec<OsString>,
}

impl WaitArgs {
    pub(crate) fn to_argv(&self) -> Vec<OsString> {
        let mut argv: Vec<OsString> = [
            self.agent_fd.to_string(),
            self.pid.to_string(),
            self.from[0].to_string(),
            self.from[1].to_string(),
            self.deadline_ns.map_or_else(|| "-".to_owned(), |d| d.to_string()),
            if self.stdin_open { "open" } else { "done" }.to_owned(),
            self.front_fd.to_string(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        argv.extend(self.front_argv.iter().cloned());
        argv
    }

    pub(crate) fn parse(mut args: impl Iterator<Item = OsString>) -> Result<Self, String> {
        fn num<T: std::str::FromStr>(v: Option<OsString>, what: &str) -> Result<T, String> {
            v.as_deref()
                .and_then(OsStr::to_str)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("bad or missing {what}"))
        }
        let agent_fd = num(args.next(), "agent descriptor")?;
        let pid = num(args.next(), "pid")?;
        let from = [
            num(args.next(), "stdout offset")?,
            num(args.next(), "stderr offset")?,
        ];
        let deadline = args.next();
        let deadline_ns = match deadline.as_deref().and_then(OsStr::to_str) {
            Some("-") => None,
            other => Some(num(other.map(OsString::from), "deadline")?),
        };
        let stdin_open = match args.next().as_deref().and_then(OsStr::to_str) {
            Some("open") => true,
            Some("done") => false,
            _ => return Err("bad or missing stdin state".to_owned()),
        };
        let front_fd = num(args.next(), "paddock descriptor")?;
        let front_argv: Vec<OsString> = args.collect();
        if front_argv.is_empty() {
            return Err("missing paddock's command line".to_owned());
        }
        Ok(Self {
            agent_fd,
            pid,
            from,
            deadline_ns,
            stdin_open,
            front_fd,
            front_argv,
        })
    }
}

/// The environment variable that carries the ending to the tearing-down `paddock`.
pub(crate) const OUTCOME_VAR: &str = "PADDOCK_RUN_OUTCOME";

/// `paddock-wait`'s entry point. It returns only when it cannot exec `paddock` again; the sandbox is
/// then left to `paddock gc` (its lock is released when this process exits).
pub fn main_wait() -> ExitCode {
    let args = match WaitArgs::parse(std::env::args_os().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("paddock-wait: {e} (this program is started by `paddock run` only)");
            return ExitCode::from(crate::EXIT_PADDOCK_ERROR);
        }
    };
    let front = match paddock_sys::exec::take_inherited_fd(args.front_fd) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("paddock-wait: the paddock descriptor: {e}");
            return ExitCode::from(crate::EXIT_PADDOCK_ERROR);
        }
    };
    let ending = match wait(&args) {
        Ok(ending) => ending,
        Err(e) => {
            eprintln!("paddock: waiting for the command: {e}");
            Ending::Lost
        }
    };
    let mut env = environment_without(&[OUTCOME_VAR]);
    env.push(format!("{OUTCOME_VAR}={}", ending.encode()).into());
    let e = paddock_sys::exec::exec_fd(front.as_fd(), &args.front_argv, &env);
    eprintln!("paddock: cannot start paddock again to tear the sandbox down ({e}); `paddock gc` will");
    ExitCode::from(crate::EXIT_PADDOCK_ERROR)
}

fn wait(args: &WaitArgs) -> io::Result<Ending> {
    let agent: OwnedFd = paddock_sys::exec::take_inherited_fd(args.agent_fd)?;
    let agent = UnixStream::from(agent);
    // The front blocked them before the exec; blocking again is harmless and keeps this program
    // correct if started otherwise.
    paddock_sys::signal::block(&ENDING_SIGNALS)?;
    let mut signals = SignalReader::new(&ENDING_SIGNALS)?;
    let mut copier = Copier {
        pid: args.pid,
        from: args.from,
        lost_reported: false,
    };
    let mut stdin = StdinCopy {
        open: args.stdin_open,
        unsent: Vec::new(),
        answer: None,
        next_id: FIRST_STDIN_ID,
    };
    let stdin_fd = io::stdin();
    let mut buf = Vec::new();
    loop {
        let timeout = match due(&mut signals, args.deadline_ns)? {
            Err(ending) => return Ok(ending),
            Ok(timeout) => timeout,
        };
        let agent_events = if stdin.unsent.is_empty() {
            PollFlags::IN
        } else {
            PollFlags::IN | PollFlags::OUT
        };
        let mut fds = vec![
            PollFd::new(&agent, agent_events),
            PollFd::new(&signals, PollFlags::IN),
        ];
        if stdin.wants_input() {
            fds.push(PollFd::new(&stdin_fd, PollFlags::IN));
        }
        match poll(&mut fds, timeout.as_ref()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        let agent_ready = fds[0].revents();
        let stdin_ready = fds.get(2).is_some_and(|f| !f.revents().is_empty());
        drop(fds);
        if stdin_ready {
            // Allocated on first use: a run whose stdin had ended never needs it.
            buf.resize(64 * 1024, 0);
            stdin.read(args.pid, &stdin_fd, &mut buf)?;
        }
        if !stdin.unsent.is_empty() {
            stdin.send(&agent)?;
        }
        if agent_ready.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR) {
            let mut reader = AgentReader {
                agent: &agent,
                signals: &mut signals,
                deadline_ns: args.deadline_ns,
                stopped: None,
            };
            match copier.frame(&mut reader) {
                Ok(Frame::End(ending)) => return Ok(ending),
                Ok(Frame::Answer { id, ok }) => stdin.answered(id, ok),
                Ok(Frame::Other) => {}
                Err(e) => return reader.stopped.take().ok_or(e),
            }
        }
    }
}

/// What ends the wait first: an ending signal that arrived, or the deadline passed. Otherwise how
/// long a `poll` may wait.
fn due(
    signals: &mut SignalReader,
    deadline_ns: Option<u64>,
) -> io::Result<Result<Option<rustix::time::Timespec>, Ending>> {
    if let Some(sig) = signals.pending()? {
        return Ok(Err(Ending::Interrupted(sig)));
    }
    Ok(match deadline_ns {
        None => Ok(None),
        Some(deadline) => match deadline.checked_sub(monotonic_ns()) {
            None | Some(0) => Err(Ending::TimedOut),
            Some(left) => Ok(Some(rustix::time::Timespec {
                tv_sec: (left / 1_000_000_000) as i64,
                tv_nsec: (left % 1_000_000_000) as i64,
            })),
        },
    })
}

/// The agent's connection as the frame reader reads it: a read that would wait also watches the
/// ending signals and the deadline, so an agent that stops in the middle of a frame (stalled, or
/// hostile) cannot hold the run past either.
struct AgentReader<'a> {
    agent: &'a UnixStream,
    signals: &'a mut SignalReader,
    deadline_ns: Option<u64>,
    /// Why a read was cut short.
    stopped: Option<Ending>,
}

impl Read for AgentReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let timeout = match due(self.signals, self.deadline_ns)? {
                Err(ending) => {
                    self.stopped = Some(ending);
                    return Err(io::Error::other("the wait ended in the middle of a frame"));
                }
                Ok(timeout) => timeout,
            };
            let mut fds = [
                PollFd::new(self.agent, PollFlags::IN),
                PollFd::new(&*self.signals, PollFlags::IN),
            ];
            match poll(&mut fds, timeout.as_ref()) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            if !fds[0].revents().is_empty() {
                return (&*self.agent).read(buf);
            }
        }
    }
}

/// Ids of the stdin requests this program sends on its connection (the front's hello and attach
/// were 1 and 2).
const FIRST_STDIN_ID: u64 = 3;

/// Stdin still open, copied to the command: one request at a time, sent without blocking.
struct StdinCopy {
    open: bool,
    /// What is left to send of the current request.
    unsent: Vec<u8>,
    /// The id of the request sent and not yet answered.
    answer: Option<u64>,
    next_id: u64,
}

impl StdinCopy {
    /// Only once the last request is sent and answered (its bytes are in the command's pipe).
    fn wants_input(&self) -> bool {
        self.open && self.unsent.is_empty() && self.answer.is_none()
    }

    /// Reads what stdin has and makes it the next request (its end closes the command's stdin).
    fn read(&mut self, pid: u32, fd: &io::Stdin, buf: &mut [u8]) -> io::Result<()> {
        let n = match crate::stdin::read_available(fd, buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => {
                eprintln!("paddock: reading stdin: {e}");
                0
            }
            Ok(n) => n,
        };
        let close = n == 0;
        if close {
            self.open = false;
        }
        let request = ClientMessage {
            id: self.next_id,
            request: Request::WriteStdin { pid, close },
        };
        encode_frame(&request, &buf[..n], &mut self.unsent).map_err(io::Error::other)?;
        self.answer = Some(self.next_id);
        self.next_id += 1;
        Ok(())
    }

    /// Sends what it can of the request without blocking.
    fn send(&mut self, agent: &UnixStream) -> io::Result<()> {
        use rustix::net::SendFlags;
        while !self.unsent.is_empty() {
            match rustix::net::send(agent, &self.unsent, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
                Ok(n) => {
                    self.unsent.drain(..n);
                }
                Err(rustix::io::Errno::AGAIN) => return Ok(()),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The agent's answer to request `id`: the next read may start. A refusal (the command closed its
    /// stdin, or exited) ends the copy, as it ends the front's.
    fn answered(&mut self, id: u64, ok: bool) {
        if self.answer == Some(id) {
            self.answer = None;
            if !ok {
                self.open = false;
            }
        }
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of a deadline handed across an exec.
pub(crate) fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// This process's environment as `KEY=value` entries for an exec, without the variables `drop`.
pub(crate) fn environment_without(drop: &[&str]) -> Vec<OsString> {
    std::env::vars_os()
        .filter(|(k, _)| !drop.iter().any(|d| k == d))
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            kv
        })
        .collect()
}

/// What one frame from the agent meant.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// The run ends.
    End(Ending),
    /// The answer to request `id`.
    Answer { id: u64, ok: bool },
    /// Output (copied) or anything else (skipped).
    Other,
}

/// Copies output frames of one process to this process's stdout and stderr, from given offsets.
pub(crate) struct Copier {
    pub(crate) pid: u32,
    /// The next offset to write, per stream (stdout and PTY, stderr).
    pub(crate) from: [u64; 2],
    lost_reported: bool,
}

impl Copier {
    #[cfg(test)]
    pub(crate) fn new(pid: u32, from: [u64; 2]) -> Self {
        Self {
            pid,
            from,
            lost_reported: false,
        }
    }

    /// Reads one frame: the run's ending when it is the process's exit or the end of the connection,
    /// an answer to a request, or something else (output, copied).
    pub(crate) fn frame(&mut self, agent: &mut impl Read) -> io::Result<Frame> {
        let mut prefix = [0u8; PREFIX_LEN];
        if !read_exact_or_eof(agent, &mut prefix)? {
            return Ok(Frame::End(Ending::Lost));
        }
        let (header_len, payload_len) = decode_prefix(prefix).map_err(io::Error::other)?;
        let mut header = vec![0u8; header_len];
        agent.read_exact(&mut header)?;
        let message: AgentMessage = serde_json::from_slice(&header).map_err(io::Error::other)?;
        match message {
            AgentMessage::Output { pid, stream, offset } if pid == self.pid => {
                let index = usize::from(stream == Stream::Stderr);
                self.copy(agent, index, offset, payload_len)?;
                Ok(Frame::Other)
            }
            AgentMessage::Exited { pid, status } if pid == self.pid => {
                skip(agent, payload_len)?;
                Ok(Frame::End(Ending::Exited(status.shell_code())))
            }
            AgentMessage::Reply { id, .. } => {
                skip(agent, payload_len)?;
                Ok(Frame::Answer { id, ok: true })
            }
            AgentMessage::Error { id, .. } => {
                skip(agent, payload_len)?;
                Ok(Frame::Answer { id, ok: false })
            }
            _ => {
                skip(agent, payload_len)?;
                Ok(Frame::Other)
            }
        }
    }

    /// Writes the payload's bytes at or past `from[index]`; earlier ones were written before.
    fn copy(&mut self, agent: &mut impl Read, index: usize, offset: u64, len: usize) -> io::Result<()> {
        let end = offset
            .checked_add(len as u64)
            .ok_or_else(|| io::Error::other("output offset out of range"))?;
        if offset > self.from[index] && !self.lost_reported {
            // Never expected: the front hands over only once it has written up to where this
            // connection's replay starts.
            self.lost_reported = true;
            eprintln!(
                "paddock: {} bytes of the command's output were lost",
                offset - self.from[index]
            );
        }
        let mut skip_first = self.from[index].saturating_sub(offset).min(len as u64) as usize;
        let mut left = len;
        let mut buf = [0u8; 16 * 1024];
        while left > 0 {
            let n = left.min(buf.len());
            agent.read_exact(&mut buf[..n])?;
            left -= n;
            let part = &buf[skip_first.min(n)..n];
            skip_first = skip_first.saturating_sub(n);
            if !part.is_empty() {
                write_out(index, part);
            }
        }
        self.from[index] = self.from[index].max(end);
        Ok(())
    }
}

/// A closed or broken stdout (say, `| head`) must not stop the run from ending and being torn down:
/// write errors are dropped, as the front drops them.
fn write_out(index: usize, bytes: &[u8]) {
    let _ = if index == 0 {
        let mut out = io::stdout().lock();
        out.write_all(bytes).and_then(|()| out.flush())
    } else {
        io::stderr().lock().write_all(bytes)
    };
}

fn skip(agent: &mut impl Read, mut len: usize) -> io::Result<()> {
    debug_assert!(len <= MAX_PAYLOAD_LEN);
    let mut buf = [0u8; 4096];
    while len > 0 {
        let n = len.min(buf.len());
        agent.read_exact(&mut buf[..n])?;
        len -= n;
    }
    Ok(())
}

/// `read_exact`, or `false` at a clean end of stream before the first byte.
fn read_exact_or_eof(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// An argument as bytes, for messages.
#[cfg(test)]
fn bytes(s: &OsStr) -> &[u8] {
    std::os::unix::ffi::OsStrExt::as_bytes(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_protocol::{encode_frame, ExitStatus};

    fn output(pid: u32, stream: Stream, offset: u64, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_frame(&AgentMessage::Output { pid, stream, offset }, data, &mut out).expect("test");
        out
    }

    #[test]
    fn endings_read_back_and_nothing_else_does() {
        for e in [
            Ending::Exited(0),
            Ending::Exited(137),
            Ending::TimedOut,
            Ending::Interrupted(libc::SIGTERM),
            Ending::Lost,
        ] {
            assert_eq!(Ending::decode(&e.encode()), Some(e));
        }
        for bad in [
            "",
            "exit:",
            "exit:x",
            "signal:9",
            "signal:",
            "timeout:1",
            "lost:",
            "other",
        ] {
            assert_eq!(Ending::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn arguments_read_back_as_written() {
        let args = WaitArgs {
            agent_fd: 7,
            pid: 2,
            from: [10, 0],
            deadline_ns: Some(123),
            stdin_open: true,
            front_fd: 8,
            front_argv: vec!["paddock".into(), "run".into(), "--".into(), "sleep".into()],
        };
        assert_eq!(WaitArgs::parse(args.to_argv().into_iter()).expect("test"), args);
        let none = WaitArgs {
            deadline_ns: None,
            stdin_open: false,
            ..args
        };
        assert_eq!(WaitArgs::parse(none.to_argv().into_iter()).expect("test"), none);
        assert_eq!(bytes(&none.to_argv()[4]), b"-");
        assert_eq!(bytes(&none.to_argv()[5]), b"done");
        // No front command line, a bad number or a bad stdin state is refused.
        let parse = |v: &[&str]| WaitArgs::parse(v.iter().map(OsString::from));
        assert!(parse(&["7", "2", "0", "0", "-", "done", "8"]).is_err());
        assert!(parse(&["7", "x", "0", "0", "-", "done", "8", "p"]).is_err());
        assert!(parse(&["7", "2", "0", "0", "-", "maybe", "8", "p"]).is_err());
        assert!(parse(&["7", "2", "0", "0", "-", "open", "8", "p"]).is_ok());
    }

    /// The front wrote stdout up to 4 and stderr up to 2: a replay from 0 skips exactly those bytes,
    /// later frames pass whole, another process's frames and replies are skipped, and the exit ends it.
    #[test]
    fn a_replay_is_written_from_where_the_front_stopped() {
        let mut wire = Vec::new();
        wire.extend(output(5, Stream::Stdout, 0, b"abcdef"));
        wire.extend(output(9, Stream::Stdout, 0, b"other process"));
        wire.extend(output(5, Stream::Stderr, 0, b"xy"));
        wire.extend(output(5, Stream::Stdout, 6, b"gh"));
        let status = ExitStatus {
            code: Some(3),
            signal: None,
            timed_out: false,
            cpu_time_us: 0,
            max_rss_kib: 0,
            duration_ms: 0,
        };
        encode_frame(&AgentMessage::Exited { pid: 5, status }, &[], &mut wire).expect("test");
        let mut r = std::io::Cursor::new(wire);
        let mut c = Copier::new(5, [4, 2]);
        for _ in 0..4 {
            assert_eq!(c.frame(&mut r).expect("test"), Frame::Other);
        }
        assert_eq!(c.from, [8, 2]);
        assert_eq!(c.frame(&mut r).expect("test"), Frame::End(Ending::Exited(3)));
        assert_eq!(c.frame(&mut r).expect("test"), Frame::End(Ending::Lost));
    }

    /// An agent that stops in the middle of a frame does not hold the run past its deadline.
    #[test]
    fn a_frame_cut_short_ends_at_the_deadline() {
        let (ours, theirs) = UnixStream::pair().expect("pair");
        let mut wire = output(5, Stream::Stdout, 0, b"abcdef");
        wire.truncate(12);
        (&theirs).write_all(&wire).expect("write");
        let mut signals = SignalReader::new(&ENDING_SIGNALS).expect("signalfd");
        let mut reader = AgentReader {
            agent: &ours,
            signals: &mut signals,
            deadline_ns: Some(monotonic_ns() + 50_000_000),
            stopped: None,
        };
        assert!(Copier::new(5, [0, 0]).frame(&mut reader).is_err());
        assert_eq!(reader.stopped, Some(Ending::TimedOut));
    }

    #[test]
    fn a_hostile_frame_is_an_error_not_a_crash() {
        // An offset that overflows.
        let mut r = std::io::Cursor::new(output(5, Stream::Stdout, u64::MAX, b"ab"));
        assert!(Copier::new(5, [0, 0]).frame(&mut r).is_err());
        // A header over the limit.
        let mut r = std::io::Cursor::new([0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0].to_vec());
        assert!(Copier::new(5, [0, 0]).frame(&mut r).is_err());
        // A frame cut short.
        let mut wire = output(5, Stream::Stdout, 0, b"abcdef");
        wire.truncate(wire.len() - 2);
        assert!(Copier::new(5, [0, 0])
            .frame(&mut std::io::Cursor::new(wire))
            .is_err());
    }
}

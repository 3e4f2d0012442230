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
//! What it does not do: it writes nothing to the command's stdin (a run hands over only once its
//! stdin has ended), serves no terminal and no network, and never touches the sandbox itself. Its
//! input from the agent is hostile: frame limits are `paddock-protocol`'s, offsets are checked, and a
//! malformed frame ends the wait as a lost agent.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::time::Duration;

use paddock_protocol::{decode_prefix, AgentMessage, Stream, MAX_PAYLOAD_LEN, PREFIX_LEN};
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
/// `<agent fd> <pid> <stdout from> <stderr from> <deadline ns|-> <front fd> <front argv...>`.
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
    let mut env: Vec<OsString> = std::env::vars_os()
        .filter(|(k, _)| k != OUTCOME_VAR)
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            kv
        })
        .collect();
    env.push(format!("{OUTCOME_VAR}={}", ending.encode()).into());
    let e = paddock_sys::exec::exec_fd(front.as_fd(), &args.front_argv, &env);
    eprintln!("paddock: cannot start paddock again to tear the sandbox down ({e}); `paddock gc` will");
    ExitCode::from(crate::EXIT_PADDOCK_ERROR)
}

fn wait(args: &WaitArgs) -> io::Result<Ending> {
    let agent: OwnedFd = paddock_sys::exec::take_inherited_fd(args.agent_fd)?;
    let mut agent = UnixStream::from(agent);
    // The front blocked them before the exec; blocking again is harmless and keeps this program
    // correct if started otherwise.
    paddock_sys::signal::block(&ENDING_SIGNALS)?;
    let mut signals = SignalReader::new(&ENDING_SIGNALS)?;
    let mut copier = Copier {
        pid: args.pid,
        from: args.from,
        lost_reported: false,
    };
    loop {
        if let Some(sig) = signals.pending()? {
            return Ok(Ending::Interrupted(sig));
        }
        let timeout = match args.deadline_ns {
            None => None,
            Some(deadline) => match deadline.checked_sub(monotonic_ns()?) {
                None | Some(0) => return Ok(Ending::TimedOut),
                Some(left) => Some(Duration::from_nanos(left)),
            },
        };
        let mut fds = [
            PollFd::new(&agent, PollFlags::IN),
            PollFd::new(&signals, PollFlags::IN),
        ];
        let timeout = timeout.map(|d| rustix::time::Timespec {
            tv_sec: d.as_secs() as i64,
            tv_nsec: i64::from(d.subsec_nanos()),
        });
        match poll(&mut fds, timeout.as_ref()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        if fds[0].revents().is_empty() {
            continue;
        }
        match copier.frame(&mut agent)? {
            Some(ending) => return Ok(ending),
            None => continue,
        }
    }
}

fn monotonic_ns() -> io::Result<u64> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    Ok(t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64)
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

    /// Reads one frame; the run's ending when it is the process's exit or the end of the connection.
    pub(crate) fn frame(&mut self, agent: &mut impl Read) -> io::Result<Option<Ending>> {
        let mut prefix = [0u8; PREFIX_LEN];
        if !read_exact_or_eof(agent, &mut prefix)? {
            return Ok(Some(Ending::Lost));
        }
        let (header_len, payload_len) = decode_prefix(prefix).map_err(io::Error::other)?;
        let mut header = vec![0u8; header_len];
        agent.read_exact(&mut header)?;
        let message: AgentMessage = serde_json::from_slice(&header).map_err(io::Error::other)?;
        match message {
            AgentMessage::Output { pid, stream, offset } if pid == self.pid => {
                let index = usize::from(stream == Stream::Stderr);
                self.copy(agent, index, offset, payload_len)?;
                Ok(None)
            }
            AgentMessage::Exited { pid, status } if pid == self.pid => {
                skip(agent, payload_len)?;
                Ok(Some(Ending::Exited(status.shell_code())))
            }
            _ => {
                skip(agent, payload_len)?;
                Ok(None)
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
            front_fd: 8,
            front_argv: vec!["paddock".into(), "run".into(), "--".into(), "sleep".into()],
        };
        assert_eq!(WaitArgs::parse(args.to_argv().into_iter()).expect("test"), args);
        let none = WaitArgs {
            deadline_ns: None,
            ..args
        };
        assert_eq!(WaitArgs::parse(none.to_argv().into_iter()).expect("test"), none);
        assert_eq!(bytes(&none.to_argv()[4]), b"-");
        // No front command line, or a bad number, is refused.
        assert!(WaitArgs::parse(["7", "2", "0", "0", "-", "8"].map(OsString::from).into_iter()).is_err());
        assert!(WaitArgs::parse(
            ["7", "x", "0", "0", "-", "8", "p"]
                .map(OsString::from)
                .into_iter()
        )
        .is_err());
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
            assert_eq!(c.frame(&mut r).expect("test"), None);
        }
        assert_eq!(c.from, [8, 2]);
        assert_eq!(c.frame(&mut r).expect("test"), Some(Ending::Exited(3)));
        assert_eq!(c.frame(&mut r).expect("test"), Some(Ending::Lost));
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

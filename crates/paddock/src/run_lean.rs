//! A long `paddock run` becomes small: once its command has run for [`HAND_OVER_AFTER`], at a moment
//! when nothing read from stdin is on its way, the process replaces its program with `paddock-wait`
//! (`wait.rs`), which copies the rest of the output (and of stdin) and watches for the end; then `paddock-wait` replaces itself with `paddock`
//! again, which takes the sandbox back and tears it down ([`finish`]). It is one process throughout:
//! the shell waits for the same pid, and the sandbox's init stays its child.
//!
//! Why: an idle run's supervisor otherwise keeps this binary's relocated data, heap and stacks, about
//! 700 KiB per sandbox (`bench/startup.py`'s idle memory).
//!
//! No output is lost or written twice. Before the exec, [`attach`] opens a second connection to the
//! agent, attached to the command from the offsets written so far; the agent then keeps every byte
//! past them for that connection (its cursor holds the buffer). The front goes on copying from its
//! own connection until it has written up to where the second connection's replay starts (the
//! agent answers with that offset), and `paddock-wait` skips what the front wrote.
//!
//! What survives the execs: the second connection, the run directory's lock and the init's pidfd
//! (`paddock_runtime::native::KeptAcrossExec`), an open descriptor of this executable, and the ending
//! signals, blocked (a signal that arrives in between stays pending and is read by the waiter).
//! Stdin still open is handed over only when it is a pipe or a socket read between waits
//! (`stdin.rs`) and idle; a busy one is tried again later. This module does not hand over a run with
//! a terminal or a network, nor one whose stdin is a terminal or a file still being read: they keep
//! the front.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use paddock_protocol::{
    decode_prefix, encode_frame, AgentMessage, ClientMessage, Reply, Request, PREFIX_LEN, PROTOCOL_VERSION,
};
use paddock_runtime::native::{KeptAcrossExec, NativeBackend};
use paddock_runtime::SandboxHandle;
use paddock_types::SandboxId;

use crate::config::Config;
use crate::wait::{Ending, WaitArgs, ENDING_SIGNALS, OUTCOME_VAR};

/// A run whose command is still going after this long hands over to `paddock-wait` (and one whose
/// stdin was busy then tries again after as long). Short runs never do: the hand-back before
/// teardown costs about 2 ms (a start of `paddock`).
pub(crate) const HAND_OVER_AFTER: Duration = Duration::from_millis(500);

/// The environment variable naming the kept sandbox (`<id>:<KeptAcrossExec>`), for [`finish`].
const HANDOVER_VAR: &str = "PADDOCK_RUN_HANDOVER";

/// How long the agent may take to answer the second connection's hello and attach (a safety net; it
/// answers at once).
const ATTACH_TIMEOUT: Duration = Duration::from_secs(5);

/// A second connection to the agent, attached to the command.
pub(crate) struct Attached {
    conn: UnixStream,
    /// Where its replay starts (stdout, stderr): the front must have written up to here.
    pub(crate) start: [u64; 2],
}

/// Opens a second connection to the agent at `socket`, holding the sandbox, and attaches it to
/// process `pid` from offsets `from` (what the front has written). Reads exactly the three replies,
/// nothing past them: the output that follows is `paddock-wait`'s.
pub(crate) fn attach(socket: &Path, pid: u32, from: [u64; 2]) -> anyhow::Result<Attached> {
    let mut conn = UnixStream::connect(socket).context("connect")?;
    conn.set_read_timeout(Some(ATTACH_TIMEOUT))
        .context("set a timeout")?;
    conn.set_write_timeout(Some(ATTACH_TIMEOUT))
        .context("set a timeout")?;
    let mut frames = Vec::new();
    for (id, request) in [
        (
            1,
            Request::Hello {
                version: PROTOCOL_VERSION,
            },
        ),
        // Held like the front's own connection (`AgentClient::connect_and_spawn`), which closes
        // at the exec: the sandbox ends with this one, in `paddock-wait`, however it ends.
        (2, Request::Hold),
        (
            3,
            Request::Attach {
                pid,
                stdout_from: from[0],
                stderr_from: from[1],
            },
        ),
    ] {
        encode_frame(&ClientMessage { id, request }, &[], &mut frames).context("encode")?;
    }
    conn.write_all(&frames).context("write")?;
    match read_reply(&mut conn)? {
        AgentMessage::Reply {
            id: 1,
            body: Reply::Hello { version, .. },
        } if version == PROTOCOL_VERSION => {}
        other => anyhow::bail!("unexpected answer to hello: {other:?}"),
    }
    match read_reply(&mut conn)? {
        AgentMessage::Reply {
            id: 2,
            body: Reply::Done,
        } => {}
        other => anyhow::bail!("unexpected answer to hold: {other:?}"),
    }
    let start = match read_reply(&mut conn)? {
        AgentMessage::Reply {
            id: 3,
            body: Reply::Attached {
                stdout_from,
                stderr_from,
            },
        } => [stdout_from, stderr_from],
        other => anyhow::bail!("unexpected answer to attach: {other:?}"),
    };
    conn.set_read_timeout(None).context("clear the timeout")?;
    conn.set_write_timeout(None).context("clear the timeout")?;
    Ok(Attached { conn, start })
}

/// One frame, which must carry no payload (a reply).
fn read_reply(conn: &mut UnixStream) -> anyhow::Result<AgentMessage> {
    let mut prefix = [0u8; PREFIX_LEN];
    conn.read_exact(&mut prefix).context("read")?;
    let (header_len, payload_len) = decode_prefix(prefix)?;
    anyhow::ensure!(payload_len == 0, "a reply with a payload");
    let mut header = vec![0u8; header_len];
    conn.read_exact(&mut header).context("read")?;
    Ok(serde_json::from_slice(&header)?)
}

/// What the exec needs besides the second connection.
pub(crate) struct HandOver<'a> {
    pub(crate) backend: &'a NativeBackend,
    pub(crate) handle: &'a SandboxHandle,
    pub(crate) pid: u32,
    pub(crate) deadline: Option<tokio::time::Instant>,
    /// Stdin (a pipe or a socket, read up to a wait) is still open: `paddock-wait` goes on copying it.
    pub(crate) stdin_open: bool,
}

/// Replaces this process with `paddock-wait`. The ending signals must be blocked, every earlier
/// output written (`written` is where, per stream, and must have reached `attached.start`), and no
/// other thread of this process may be doing anything that matters (exec ends them). Returns only on
/// failure, when the run goes on as before.
pub(crate) fn exec_waiter(over: &HandOver<'_>, attached: &Attached, written: [u64; 2]) -> anyhow::Error {
    match try_exec_waiter(over, attached, written) {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

fn try_exec_waiter(
    over: &HandOver<'_>,
    attached: &Attached,
    written: [u64; 2],
) -> anyhow::Result<std::convert::Infallible> {
    anyhow::ensure!(
        written[0] >= attached.start[0] && written[1] >= attached.start[1],
        "the output written ({written:?}) has not reached the replay's start ({:?})",
        attached.start
    );
    let waiter_path = crate::config::beside_this_binary("paddock-wait")?;
    let waiter =
        std::fs::File::open(&waiter_path).with_context(|| format!("open {}", waiter_path.display()))?;
    // This very executable, whatever its path names by the end.
    let front = std::fs::File::open("/proc/self/exe").context("open this executable")?;
    let kept = over.backend.keep_across_exec(over.handle)?;
    paddock_sys::exec::keep_across_exec(front.as_fd()).context("keep this executable open")?;
    paddock_sys::exec::keep_across_exec(attached.conn.as_fd()).context("keep the agent connection")?;
    let deadline_ns = over.deadline.map(|d| {
        let left = d.saturating_duration_since(tokio::time::Instant::now());
        crate::wait::monotonic_ns().saturating_add(left.as_nanos() as u64)
    });
    let args = WaitArgs {
        agent_fd: attached.conn.as_raw_fd(),
        pid: over.pid,
        from: written,
        deadline_ns,
        stdin_open: over.stdin_open,
        front_fd: front.as_raw_fd(),
        front_argv: std::env::args_os().collect(),
    };
    let mut argv: Vec<OsString> = vec!["paddock-wait".into()];
    argv.extend(args.to_argv());
    let mut env = crate::wait::environment_without(&[HANDOVER_VAR, OUTCOME_VAR]);
    env.push(format!("{HANDOVER_VAR}={}", kept_text(&over.handle.id, &kept)).into());
    tracing::debug!(sandbox_id = %over.handle.id, "handing the run over to paddock-wait");
    let e = paddock_sys::exec::exec_fd(waiter.as_fd(), &argv, &env);
    Err(anyhow::Error::new(e).context(format!("exec {}", waiter_path.display())))
}

/// Sandbox `id` kept across an exec or a spawn, as text for the process that takes it back
/// (`<id>:<KeptAcrossExec>`): `paddock` after `paddock-wait`, or a `--keep-ready` run's maker.
pub(crate) fn kept_text(id: &SandboxId, kept: &KeptAcrossExec) -> String {
    format!("{id}:{kept}")
}

/// [`kept_text`] read back.
pub(crate) fn parse_kept(text: &str) -> Option<(SandboxId, KeptAcrossExec)> {
    let (id, kept) = text.split_once(':')?;
    Some((id.parse().ok()?, kept.parse().ok()?))
}

/// Blocks the ending signals before a hand-over; `unblock_ending_signals` undoes it if the exec
/// does not happen.
pub(crate) fn block_ending_signals() -> anyhow::Result<()> {
    paddock_sys::signal::block(&ENDING_SIGNALS).context("block signals")
}

pub(crate) fn unblock_ending_signals() {
    if let Err(e) = paddock_sys::signal::unblock(&ENDING_SIGNALS) {
        tracing::warn!(error = %e, "cannot unblock signals");
    }
}

/// When this process is `paddock` again after `paddock-wait` (both variables set): takes the sandbox
/// back, tears it down, and returns the run's exit code. `None` for any other start.
pub(crate) fn finish(config: &Config, args: &crate::cli::RunArgs) -> Option<anyhow::Result<ExitCode>> {
    let handover = std::env::var_os(HANDOVER_VAR)?;
    Some(finish_handed_over(config, args, &handover))
}

fn finish_handed_over(
    config: &Config,
    args: &crate::cli::RunArgs,
    handover: &std::ffi::OsStr,
) -> anyhow::Result<ExitCode> {
    let bad = || anyhow::anyhow!("{HANDOVER_VAR} is set but is not a run handed over by paddock-wait");
    let (id, kept) = handover.to_str().and_then(parse_kept).ok_or_else(bad)?;
    let ending = std::env::var(OUTCOME_VAR)
        .ok()
        .and_then(|v| Ending::decode(&v))
        .ok_or_else(bad)?;
    let backend = config.open_backend(true)?;
    let handle = backend
        .take_back(&id, &kept)
        .context("cannot take the sandbox back after waiting")?;
    let ready = crate::run::ready_spec(config, args);
    if let Err(e) = crate::run_ready::tear_down(config, &backend, handle, ready.as_ref()) {
        eprintln!("paddock: warning: {e}");
    }
    Ok(match ending {
        Ending::Exited(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Ending::TimedOut => ExitCode::from(crate::run::EXIT_TIMEOUT),
        Ending::Interrupted(sig) => ExitCode::from((128 + sig) as u8),
        Ending::Lost => anyhow::bail!("the sandbox agent exited unexpectedly"),
    })
}

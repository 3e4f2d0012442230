//! The double's processes: starting one (a task running the interpreter), its output streams and
//! the per-connection forwarding of them, stdin, signals, timeouts, exits, and the table of running
//! and recently exited processes.
//!
//! A signal that is not ignored ends the process at once with that signal (the interpreter has no
//! handlers); `SIGSTOP`-like and ignored-by-default signals (`STOP`, `TSTP`, `TTIN`, `TTOU`, `CONT`,
//! `CHLD`, `URG`, `WINCH`) change nothing. Every command runs inside its one process: there are no
//! children, so killing the tree is signalling the process.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use paddock_protocol::{
    AgentError, AgentMessage, CommandSpec, ErrorCode, ExitStatus, ProcessInfo, PtySize, Reply, SpawnRequest,
    Stream, MAX_HEADER_LEN,
};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::AbortHandle;

use super::outbound::{agent_error, Outbound};
use super::output::OutputStream;
use super::shell::{self, Program};
use super::{lock, Agent};

/// Exited processes kept for listing and attaching.
const FINISHED_KEPT: usize = 256;
/// Output kept in total for exited processes.
const FINISHED_OUTPUT_BUDGET: usize = 16 << 20;
/// Largest output payload per frame.
const OUTPUT_FRAME: usize = 64 * 1024;
/// Stdin writes queued per process before the requesting connection waits.
const STDIN_QUEUE: usize = 16;
/// Chunks in a process's stdin "pipe".
const PIPE_CHUNKS: usize = 16;

/// Signals whose default action is to ignore or stop (the double changes nothing for them).
const HARMLESS_SIGNALS: [i32; 8] = [
    libc::SIGSTOP,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGCONT,
    libc::SIGCHLD,
    libc::SIGURG,
    libc::SIGWINCH,
];

/// One queued stdin write.
#[derive(Debug)]
pub(crate) struct StdinWrite {
    id: u64,
    data: Vec<u8>,
    close: bool,
    out: Outbound,
}

/// One process of the double.
#[derive(Debug)]
pub(crate) struct Process {
    pid: u32,
    command: CommandSpec,
    tag: Option<String>,
    pty: bool,
    started_at_ms: u64,
    started: Instant,
    /// stdout and stderr, or the PTY's one stream.
    streams: Vec<OutputStream>,
    /// Signalled on output, a closed stream or the exit.
    changed: Notify,
    /// The signal that ends it, once one came.
    killed: watch::Sender<Option<i32>>,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    exit: Option<ExitStatus>,
    timed_out: bool,
    finished: bool,
    subscribers: HashMap<u64, AbortHandle>,
    stdin: Option<mpsc::Sender<StdinWrite>>,
    pty_size: Option<PtySize>,
}

impl Process {
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    pub(crate) fn exit_status(&self) -> Option<ExitStatus> {
        lock(&self.inner).exit
    }

    fn stream(&self, stream: Stream) -> &OutputStream {
        match stream {
            Stream::Stderr if !self.pty => &self.streams[1],
            _ => &self.streams[0],
        }
    }

    /// Writes process output (what a command prints), waiting while an attached reader lags.
    pub(crate) async fn write(&self, stream: Stream, data: &[u8]) {
        self.stream(stream)
            .write(data, &|| self.changed.notify_waiters())
            .await;
    }

    /// Ends when a signal killed the process; the signal.
    pub(crate) async fn killed(&self) -> i32 {
        let mut rx = self.killed.subscribe();
        let signal = match rx.wait_for(Option::is_some).await {
            Ok(signal) => *signal,
            Err(_) => None,
        };
        match signal {
            Some(signal) => signal,
            None => std::future::pending().await,
        }
    }

    fn info(&self) -> ProcessInfo {
        ProcessInfo {
            pid: self.pid,
            tag: self.tag.clone(),
            command: self.command.clone(),
            pty: self.pty,
            started_at_ms: self.started_at_ms,
            exit: self.exit_status(),
        }
    }

    /// Delivers `signal`; false if the process had exited.
    pub(crate) fn signal(&self, signal: i32) -> bool {
        if self.exit_status().is_some() {
            return false;
        }
        if signal != 0 && !HARMLESS_SIGNALS.contains(&signal) {
            self.killed.send_if_modified(|s| {
                let first = s.is_none();
                s.get_or_insert(signal);
                first
            });
        }
        true
    }

    pub(crate) fn resize(&self, size: PtySize) -> bool {
        if !self.pty {
            return false;
        }
        lock(&self.inner).pty_size = Some(size);
        true
    }

    /// Places `conn`'s cursors; the offsets replay starts from.
    pub(crate) fn add_cursors(&self, conn: u64, stdout_from: u64, stderr_from: u64) -> (u64, u64) {
        self.unsubscribe(conn);
        let stdout = self.streams[0].add_cursor(conn, stdout_from);
        let stderr = self.streams.get(1).map_or(0, |s| s.add_cursor(conn, stderr_from));
        (stdout, stderr)
    }

    /// Stops forwarding to `conn` and drops its cursors.
    pub(crate) fn unsubscribe(&self, conn: u64) {
        if let Some(task) = lock(&self.inner).subscribers.remove(&conn) {
            task.abort();
        }
        for s in &self.streams {
            s.remove_cursor(conn);
        }
    }

    /// The stdin queue while stdin is open.
    pub(crate) fn stdin(&self) -> Option<mpsc::Sender<StdinWrite>> {
        lock(&self.inner).stdin.clone()
    }

    fn buffered(&self) -> usize {
        self.streams.iter().map(OutputStream::buffered).sum()
    }
}

/// Every process the double knows, by pid.
#[derive(Debug, Default)]
pub(crate) struct ProcessTable {
    by_pid: BTreeMap<u32, Arc<Process>>,
    finished: VecDeque<u32>,
}

impl ProcessTable {
    pub(crate) fn get(&self, pid: u32) -> Result<Arc<Process>, AgentError> {
        self.by_pid.get(&pid).cloned().ok_or_else(|| {
            agent_error(
                ErrorCode::ProcessNotFound,
                format!("no process {pid} was started by the agent"),
            )
        })
    }

    pub(crate) fn all(&self) -> Vec<Arc<Process>> {
        self.by_pid.values().cloned().collect()
    }

    pub(crate) fn running(&self) -> u64 {
        self.by_pid.values().filter(|p| p.exit_status().is_none()).count() as u64
    }

    /// Every process, oldest first; the oldest exited ones are left out while the list would not fit
    /// a reply header.
    pub(crate) fn list(&self) -> Vec<ProcessInfo> {
        let mut infos: Vec<ProcessInfo> = self.by_pid.values().map(|p| p.info()).collect();
        infos.sort_by_key(|i| (i.started_at_ms, i.pid));
        let size = |infos: &[ProcessInfo]| serde_json::to_vec(infos).map_or(usize::MAX, |v| v.len());
        while size(&infos) > MAX_HEADER_LEN - 1024 && !infos.is_empty() {
            let oldest = infos.iter().position(|i| i.exit.is_some()).unwrap_or(0);
            infos.remove(oldest);
        }
        infos
    }

    /// Records that `process` finished; forgets or trims the oldest finished ones past the bounds.
    fn mark_finished(&mut self, process: &Arc<Process>) {
        if !self
            .by_pid
            .get(&process.pid)
            .is_some_and(|p| Arc::ptr_eq(p, process))
        {
            return;
        }
        self.finished.push_back(process.pid);
        while self.finished.len() > FINISHED_KEPT {
            if let Some(old) = self.finished.pop_front() {
                self.by_pid.remove(&old);
            }
        }
        let mut total: usize = self
            .finished
            .iter()
            .filter_map(|p| self.by_pid.get(p))
            .map(|p| p.buffered())
            .sum();
        for pid in &self.finished {
            if total <= FINISHED_OUTPUT_BUDGET {
                break;
            }
            if let Some(p) = self.by_pid.get(pid) {
                let before = p.buffered();
                p.streams.iter().for_each(OutputStream::release_unneeded);
                total -= before - p.buffered();
            }
        }
    }
}

/// Starts the process `request` describes; the caller answers the request.
pub(crate) fn spawn(agent: &Arc<Agent>, request: &SpawnRequest) -> Result<Arc<Process>, AgentError> {
    let program = shell::resolve(&request.command)?;
    let user_name = request.user.clone().unwrap_or_else(|| agent.default_user.clone());
    let user = shell::User::lookup(agent, &user_name)?;
    for key in request.env.keys() {
        if key.is_empty() || key.contains('=') {
            return Err(agent_error(
                ErrorCode::BadRequest,
                format!("invalid environment variable name {key:?}"),
            ));
        }
    }
    let cwd = match &request.cwd {
        Some(cwd) if cwd.starts_with('/') => cwd.clone(),
        Some(cwd) => format!("{}/{cwd}", user.home.trim_end_matches('/')),
        None => user.home.clone(),
    };
    shell::check_cwd(agent, &cwd)?;
    let pty = request.pty.is_some();
    let streams = if pty {
        vec![OutputStream::new(Stream::Pty)]
    } else {
        vec![
            OutputStream::new(Stream::Stdout),
            OutputStream::new(Stream::Stderr),
        ]
    };
    let process = Arc::new(Process {
        pid: agent.next_pid(),
        command: request.command.clone(),
        tag: request.tag.clone(),
        pty,
        started_at_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        started: Instant::now(),
        streams,
        changed: Notify::new(),
        killed: watch::Sender::new(None),
        inner: Mutex::new(Inner {
            pty_size: request.pty,
            ..Inner::default()
        }),
    });
    let pipe = if request.stdin || pty {
        let (pipe_tx, pipe_rx) = mpsc::channel(PIPE_CHUNKS);
        let (queue_tx, queue_rx) = mpsc::channel(STDIN_QUEUE);
        lock(&process.inner).stdin = Some(queue_tx);
        agent.spawn(feed_stdin(process.clone(), queue_rx, pipe_tx));
        Some(pipe_rx)
    } else {
        None
    };
    lock(&agent.processes).by_pid.insert(process.pid, process.clone());
    let context = shell::Context {
        agent: agent.clone(),
        process: process.clone(),
        stdin: pipe,
        env: request.env.clone(),
        cwd,
        user,
    };
    agent.spawn(drive(
        agent.clone(),
        process.clone(),
        program,
        context,
        request.timeout_ms,
    ));
    Ok(process)
}

/// Runs the program to its end (or its signal, or its timeout) and records the exit.
async fn drive(
    agent: Arc<Agent>,
    process: Arc<Process>,
    program: Program,
    context: shell::Context,
    timeout_ms: Option<u64>,
) {
    let timeout = async {
        match timeout_ms {
            Some(ms) => tokio::time::sleep(std::time::Duration::from_millis(ms)).await,
            None => std::future::pending().await,
        }
    };
    let (code, signal) = tokio::select! {
        code = shell::run(context, program) => (Some(code), None),
        signal = process.killed() => (None, Some(signal)),
        () = timeout => {
            lock(&process.inner).timed_out = true;
            (None, Some(libc::SIGKILL))
        }
    };
    // A frozen process does not exit until it is thawed.
    agent.until_running().await;
    for s in &process.streams {
        s.close();
    }
    let status = {
        let mut inner = lock(&process.inner);
        let status = ExitStatus {
            code,
            signal,
            timed_out: inner.timed_out,
            cpu_time_us: 0,
            max_rss_kib: 0,
            duration_ms: process.started.elapsed().as_millis() as u64,
        };
        inner.exit = Some(status);
        inner.stdin = None;
        inner.finished = true;
        status
    };
    tracing::debug!(pid = process.pid, ?status, "fake process exited");
    process.changed.notify_waiters();
    lock(&agent.processes).mark_finished(&process);
}

/// Starts forwarding `process`'s output (from the cursors placed) and then its exit to `out`.
pub(crate) fn start_forwarding(agent: &Arc<Agent>, process: &Arc<Process>, out: Outbound) {
    let conn = out.conn();
    let task = agent.spawn(forward(agent.clone(), process.clone(), out));
    if let Some(old) = lock(&process.inner).subscribers.insert(conn, task) {
        old.abort();
    }
}

async fn forward(agent: Arc<Agent>, process: Arc<Process>, out: Outbound) {
    let conn = out.conn();
    let pid = process.pid;
    loop {
        let changed = process.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        agent.until_running().await;
        let mut sent = false;
        for stream in &process.streams {
            let Some((offset, data)) = stream.take_chunk(conn, OUTPUT_FRAME) else {
                continue;
            };
            let message = AgentMessage::Output {
                pid,
                stream: stream.kind(),
                offset,
            };
            if out.send(&message, &data).await.is_err() {
                return done_forwarding(&process, conn);
            }
            sent = true;
        }
        if sent {
            continue;
        }
        let drained = process
            .streams
            .iter()
            .all(|s| s.is_closed() && s.cursor_at_end(conn));
        if let (true, Some(status)) = (drained, process.exit_status()) {
            let _ = out.send(&AgentMessage::Exited { pid, status }, &[]).await;
            return done_forwarding(&process, conn);
        }
        changed.await;
    }
}

fn done_forwarding(process: &Process, conn: u64) {
    lock(&process.inner).subscribers.remove(&conn);
    for s in &process.streams {
        s.remove_cursor(conn);
    }
}

/// The stdin task of one process: writes queued chunks into its pipe in order and answers each
/// request once the process's pipe took it (which waits while the process does not read).
async fn feed_stdin(
    process: Arc<Process>,
    mut queue: mpsc::Receiver<StdinWrite>,
    pipe: mpsc::Sender<Vec<u8>>,
) {
    let pid = process.pid;
    let mut pipe = Some(pipe);
    while let Some(write) = queue.recv().await {
        let exited = || agent_error(ErrorCode::ProcessExited, format!("process {pid} has exited"));
        let result = match pipe.as_ref() {
            _ if process.exit_status().is_some() => Err(exited()),
            None => Err(agent_error(
                ErrorCode::BadRequest,
                format!("stdin of process {pid} is closed"),
            )),
            Some(_) if write.data.is_empty() => Ok(()),
            Some(tx) => {
                tokio::select! {
                    sent = tx.send(write.data) => sent.map_err(|_| exited()),
                    _ = process.killed() => Err(exited()),
                }
            }
        };
        if write.close && !process.pty {
            pipe = None;
            lock(&process.inner).stdin = None;
        }
        let _ = write
            .out
            .answer(write.id, result.map(|()| (Reply::Done, Vec::new())))
            .await;
    }
}

/// Queues a stdin write for `pid` (answered by its stdin task), or answers why it cannot be.
pub(crate) async fn queue_stdin(
    agent: &Agent,
    out: &Outbound,
    id: u64,
    pid: u32,
    close: bool,
    data: Vec<u8>,
) {
    let queue = lock(&agent.processes).get(pid).and_then(|process| {
        if process.exit_status().is_some() {
            return Err(agent_error(
                ErrorCode::ProcessExited,
                format!("process {pid} has exited"),
            ));
        }
        process.stdin().ok_or_else(|| {
            agent_error(
                ErrorCode::BadRequest,
                format!("process {pid} has no open stdin (spawned without stdin, or closed)"),
            )
        })
    });
    let write = StdinWrite {
        id,
        data,
        close,
        out: out.clone(),
    };
    match queue {
        Ok(queue) => {
            if let Err(mpsc::error::SendError(write)) = queue.send(write).await {
                let error = agent_error(ErrorCode::ProcessExited, format!("process {pid} has exited"));
                let _ = write.out.answer(id, Err(error)).await;
            }
        }
        Err(error) => {
            let _ = out.answer(id, Err(error)).await;
        }
    }
}

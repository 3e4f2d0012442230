//! The processes the agent started: running ones, and the most recent exited ones (with their
//! buffered output) for listing and re-attaching.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::Instant;

use paddock_protocol::{CommandSpec, ExitStatus, ProcessInfo, Stream, MAX_HEADER_LEN};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::process::output::OutputStream;
use crate::process::stdin::StdinWrite;

/// Exited processes kept for listing and attaching.
pub(crate) const FINISHED_KEPT: usize = 256;
/// Output bytes kept in total for exited processes; beyond it the oldest ones lose their output.
pub(crate) const FINISHED_OUTPUT_BUDGET: usize = 16 << 20;

/// One process started through the agent.
#[derive(Debug)]
pub(crate) struct Process {
    pid: u32,
    command: CommandSpec,
    tag: Option<String>,
    pty: bool,
    started_at_ms: u64,
    started: Instant,
    /// stdout and stderr, or the PTY alone.
    streams: Vec<OutputStream>,
    /// Data arrived, a stream closed, or the process exited.
    changed: Notify,
    /// The process exited.
    exited: Notify,
    exit: Cell<Option<ExitStatus>>,
    exited_at: Cell<Option<Instant>>,
    timed_out: Cell<bool>,
    finished: Cell<bool>,
    /// The output forwarding task of each attached connection.
    subscribers: RefCell<HashMap<u64, JoinHandle<()>>>,
    stdin: RefCell<Option<mpsc::Sender<StdinWrite>>>,
    pty_master: RefCell<Option<OwnedFd>>,
    timeout: RefCell<Option<JoinHandle<()>>>,
}

impl Process {
    /// A running process.
    pub(crate) fn new(
        pid: u32,
        command: CommandSpec,
        tag: Option<String>,
        pty: bool,
        started_at_ms: u64,
    ) -> Self {
        let streams = if pty {
            vec![OutputStream::new(Stream::Pty)]
        } else {
            vec![
                OutputStream::new(Stream::Stdout),
                OutputStream::new(Stream::Stderr),
            ]
        };
        Self {
            pid,
            command,
            tag,
            pty,
            started_at_ms,
            started: Instant::now(),
            streams,
            changed: Notify::new(),
            exited: Notify::new(),
            exit: Cell::new(None),
            exited_at: Cell::new(None),
            timed_out: Cell::new(false),
            finished: Cell::new(false),
            subscribers: RefCell::new(HashMap::new()),
            stdin: RefCell::new(None),
            pty_master: RefCell::new(None),
            timeout: RefCell::new(None),
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    pub(crate) fn is_pty(&self) -> bool {
        self.pty
    }

    pub(crate) fn streams(&self) -> &[OutputStream] {
        &self.streams
    }

    /// The stream that carries stdout offsets (stdout, or the PTY).
    pub(crate) fn stdout_stream(&self) -> &OutputStream {
        &self.streams[0]
    }

    /// The stderr stream (absent on a PTY).
    pub(crate) fn stderr_stream(&self) -> Option<&OutputStream> {
        self.streams.get(1)
    }

    pub(crate) fn info(&self) -> ProcessInfo {
        ProcessInfo {
            pid: self.pid,
            tag: self.tag.clone(),
            command: self.command.clone(),
            pty: self.pty,
            started_at_ms: self.started_at_ms,
            exit: self.exit.get(),
        }
    }

    pub(crate) fn exit_status(&self) -> Option<ExitStatus> {
        self.exit.get()
    }

    pub(crate) fn exited_at(&self) -> Option<Instant> {
        self.exited_at.get()
    }

    /// Milliseconds since the process started.
    pub(crate) fn runtime_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub(crate) fn notify_changed(&self) {
        self.changed.notify_waiters();
    }

    /// A future that completes at the next [`Self::notify_changed`] (registered at creation).
    pub(crate) fn change_notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    /// A future that completes when the process exits (registered at creation).
    pub(crate) fn exit_notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.exited.notified()
    }

    pub(crate) fn mark_timed_out(&self) {
        self.timed_out.set(true);
    }

    pub(crate) fn timed_out(&self) -> bool {
        self.timed_out.get()
    }

    /// Records the exit: stops the timeout, closes stdin and wakes pumps and forwarders.
    pub(crate) fn set_exit(&self, status: ExitStatus) {
        self.exit.set(Some(status));
        self.exited_at.set(Some(Instant::now()));
        if let Some(timeout) = self.timeout.borrow_mut().take() {
            timeout.abort();
        }
        self.stdin.borrow_mut().take();
        self.exited.notify_waiters();
        self.changed.notify_waiters();
    }

    pub(crate) fn set_timeout_task(&self, task: JoinHandle<()>) {
        *self.timeout.borrow_mut() = Some(task);
    }

    pub(crate) fn set_stdin(&self, tx: mpsc::Sender<StdinWrite>) {
        *self.stdin.borrow_mut() = Some(tx);
    }

    /// The stdin queue, while stdin is open.
    pub(crate) fn stdin(&self) -> Option<mpsc::Sender<StdinWrite>> {
        self.stdin.borrow().clone()
    }

    pub(crate) fn close_stdin(&self) {
        self.stdin.borrow_mut().take();
    }

    /// Keeps a descriptor of the PTY master for resizing (until the process finishes).
    pub(crate) fn set_pty_master(&self, master: OwnedFd) {
        *self.pty_master.borrow_mut() = Some(master);
    }

    /// Sets the PTY's window size.
    pub(crate) fn resize_pty(&self, size: paddock_sys::pty::WinSize) -> Option<std::io::Result<()>> {
        let master = self.pty_master.borrow();
        master
            .as_ref()
            .map(|fd| paddock_sys::pty::set_window_size(std::os::fd::AsFd::as_fd(fd), size))
    }

    /// Whether the exit is known and every stream is closed; marks it so only once (true once).
    pub(crate) fn take_finished(&self) -> bool {
        if self.finished.get()
            || self.exit.get().is_none()
            || !self.streams.iter().all(OutputStream::is_closed)
        {
            return false;
        }
        self.finished.set(true);
        self.pty_master.borrow_mut().take();
        self.streams.iter().for_each(OutputStream::shrink);
        true
    }

    /// Registers the forwarding task of connection `conn`, replacing (and stopping) an older one.
    pub(crate) fn set_subscriber(&self, conn: u64, task: JoinHandle<()>) {
        if let Some(old) = self.subscribers.borrow_mut().insert(conn, task) {
            old.abort();
        }
    }

    /// Stops connection `conn`'s forwarding (if any) and drops its cursors.
    pub(crate) fn unsubscribe(&self, conn: u64) {
        if let Some(task) = self.subscribers.borrow_mut().remove(&conn) {
            task.abort();
        }
        for stream in &self.streams {
            stream.remove_cursor(conn);
        }
    }

    /// Called by a forwarding task that ends by itself: forget it without aborting it.
    pub(crate) fn subscriber_done(&self, conn: u64) {
        self.subscribers.borrow_mut().remove(&conn);
        for stream in &self.streams {
            stream.remove_cursor(conn);
        }
    }

    fn buffered(&self) -> usize {
        self.streams.iter().map(OutputStream::buffered).sum()
    }
}

/// Every process the agent knows, by pid.
#[derive(Debug, Default)]
pub(crate) struct ProcessTable {
    by_pid: HashMap<u32, Rc<Process>>,
    /// Finished processes, oldest first.
    finished: VecDeque<u32>,
}

impl ProcessTable {
    /// Adds a new process, replacing a finished one that had the same pid.
    pub(crate) fn insert(&mut self, process: Rc<Process>) {
        let pid = process.pid;
        self.finished.retain(|p| *p != pid);
        self.by_pid.insert(pid, process);
    }

    pub(crate) fn get(&self, pid: u32) -> Option<Rc<Process>> {
        self.by_pid.get(&pid).cloned()
    }

    pub(crate) fn all(&self) -> Vec<Rc<Process>> {
        self.by_pid.values().cloned().collect()
    }

    /// Records that `process` finished; forgets the oldest finished ones beyond [`FINISHED_KEPT`] and
    /// frees the output of the oldest beyond [`FINISHED_OUTPUT_BUDGET`].
    pub(crate) fn mark_finished(&mut self, process: &Rc<Process>) {
        if !self
            .by_pid
            .get(&process.pid)
            .is_some_and(|p| Rc::ptr_eq(p, process))
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

    /// Every process, oldest first, trimmed so the reply header fits a frame: the oldest exited
    /// processes are left out first, then long commands are shortened.
    pub(crate) fn list(&self) -> Vec<ProcessInfo> {
        let mut infos: Vec<ProcessInfo> = self.by_pid.values().map(|p| p.info()).collect();
        infos.sort_by_key(|i| (i.started_at_ms, i.pid));
        fit_in_header(infos)
    }
}

/// Room for the rest of the reply around the process list.
const LIST_BUDGET: usize = MAX_HEADER_LEN - 1024;
/// Longest command string shown when the list must be shortened.
const SHORT_COMMAND: usize = 256;

fn fit_in_header(mut infos: Vec<ProcessInfo>) -> Vec<ProcessInfo> {
    let size = |infos: &[ProcessInfo]| serde_json::to_vec(infos).map_or(usize::MAX, |v| v.len());
    while size(&infos) > LIST_BUDGET {
        let Some(oldest_exited) = infos.iter().position(|i| i.exit.is_some()) else {
            break;
        };
        infos.remove(oldest_exited);
    }
    if size(&infos) > LIST_BUDGET {
        for info in &mut infos {
            shorten_command(&mut info.command);
        }
    }
    while size(&infos) > LIST_BUDGET && !infos.is_empty() {
        infos.remove(0);
    }
    infos
}

fn shorten_command(command: &mut CommandSpec) {
    let shorten = |s: &mut String| {
        if s.len() > SHORT_COMMAND {
            let mut cut = SHORT_COMMAND;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
            s.push('…');
        }
    };
    match command {
        CommandSpec::Argv { argv } => {
            argv.iter_mut().for_each(shorten);
            argv.truncate(64);
        }
        CommandSpec::Shell { script } => shorten(script),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(pid: u32, script_len: usize, exited: bool) -> ProcessInfo {
        let status = ExitStatus {
            code: Some(0),
            signal: None,
            timed_out: false,
            cpu_time_us: 0,
            max_rss_kib: 0,
            duration_ms: 0,
        };
        ProcessInfo {
            pid,
            tag: None,
            command: CommandSpec::Shell {
                script: "x".repeat(script_len),
            },
            pty: false,
            started_at_ms: u64::from(pid),
            exit: exited.then_some(status),
        }
    }

    #[test]
    fn long_lists_are_trimmed_to_fit() {
        let infos: Vec<_> = (0..100).map(|pid| info(pid, 2000, pid < 90)).collect();
        let fitted = fit_in_header(infos);
        assert!(serde_json::to_vec(&fitted).expect("json").len() <= LIST_BUDGET);
        assert!(
            fitted.iter().filter(|i| i.exit.is_none()).count() == 10,
            "running ones stay"
        );
        let huge: Vec<_> = (0..100).map(|pid| info(pid, 10_000, false)).collect();
        let fitted = fit_in_header(huge);
        assert_eq!(
            fitted.len(),
            100,
            "commands are shortened before running processes are dropped"
        );
    }

    #[test]
    fn finished_processes_are_bounded() {
        let mut table = ProcessTable::default();
        for pid in 1..=(FINISHED_KEPT as u32 + 10) {
            let p = Rc::new(Process::new(
                pid,
                CommandSpec::Shell {
                    script: "true".into(),
                },
                None,
                false,
                0,
            ));
            table.insert(p.clone());
            table.mark_finished(&p);
        }
        assert_eq!(table.by_pid.len(), FINISHED_KEPT);
        assert!(table.get(1).is_none() && table.get(FINISHED_KEPT as u32 + 10).is_some());
    }
}

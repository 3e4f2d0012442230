//! The messages of protocol version 1.
//!
//! Unknown fields are ignored by both sides (so a newer peer may add optional fields); an unknown
//! request variant is answered with [`ErrorCode::BadRequest`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The most paths one [`Request::Prefetch`] may name (more is refused as `bad_request`).
pub const PREFETCH_MAX_PATHS: usize = 64;
/// The most bytes [`Request::Prefetch`] reads of one file.
pub const PREFETCH_MAX_FILE_BYTES: u64 = 16 << 20;
/// The most bytes one [`Request::Prefetch`] reads in all.
pub const PREFETCH_MAX_TOTAL_BYTES: u64 = 64 << 20;

/// A request from the host, with an id the agent echoes in its reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientMessage {
    /// Chosen by the host; unique per connection while the request is outstanding.
    pub id: u64,
    /// What to do.
    pub request: Request,
}

/// The operations the agent performs. Frames that carry bytes (stdin, file data) put them in the
/// frame payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Must be the first request on a connection. Reply: [`Reply::Hello`].
    Hello {
        /// The protocol version the host speaks.
        version: u32,
    },
    /// This connection holds the sandbox: once every connection that sent it has closed (its
    /// supervisor exited, however it exited), the agent ends the sandbox by exiting, which ends every
    /// process in it. For a supervisor whose sandbox's init is not its child (one made ahead and
    /// claimed), which no parent-death signal ties to it. Reply: [`Reply::Done`].
    Hold,
    /// Start a process. Reply: [`Reply::Spawned`]; unless `detached`, this connection then receives
    /// the process's [`AgentMessage::Output`] and [`AgentMessage::Exited`].
    Spawn(SpawnRequest),
    /// Write the frame payload to the process's stdin (or PTY); `close` closes stdin afterwards.
    /// Reply: [`Reply::Done`].
    WriteStdin {
        /// Target process.
        pid: u32,
        /// Close stdin after writing.
        #[serde(default)]
        close: bool,
    },
    /// Send a signal to one process. Reply: [`Reply::Done`].
    Signal {
        /// Target process.
        pid: u32,
        /// Signal number.
        signal: i32,
    },
    /// Send a signal (SIGKILL by default) to a process and every process descended from it.
    /// Reply: [`Reply::Done`].
    KillTree {
        /// Root of the tree.
        pid: u32,
        /// Signal number; SIGKILL (9) when absent.
        #[serde(default)]
        signal: Option<i32>,
    },
    /// Resize a process's PTY. Reply: [`Reply::Done`].
    Resize {
        /// Target process (must have been spawned with a PTY).
        pid: u32,
        /// New size.
        size: PtySize,
    },
    /// List processes started through the agent (running and recently exited). Reply:
    /// [`Reply::Processes`].
    ListProcesses,
    /// Subscribe this connection to a process's output, replaying buffered output from the given
    /// offsets first. Reply: [`Reply::Attached`], then output and (if it has exited) the exit.
    Attach {
        /// Target process.
        pid: u32,
        /// Replay stdout (or PTY output) from this byte offset.
        #[serde(default)]
        stdout_from: u64,
        /// Replay stderr from this byte offset.
        #[serde(default)]
        stderr_from: u64,
    },
    /// Stop receiving a process's output on this connection. Reply: [`Reply::Done`].
    Detach {
        /// Target process.
        pid: u32,
    },
    /// Read up to `max_len` bytes of a file from `offset`. Reply: [`Reply::FileData`] with the
    /// bytes as payload.
    ReadFile {
        /// Path inside the sandbox; symlinks and `..` resolve inside the sandbox root.
        path: String,
        /// Start offset.
        #[serde(default)]
        offset: u64,
        /// At most this many bytes (capped at the frame payload limit).
        #[serde(default)]
        max_len: Option<u32>,
    },
    /// Write the frame payload at `offset`, creating the file if needed. Reply: [`Reply::Written`].
    WriteFile {
        /// Path inside the sandbox.
        path: String,
        /// Write position.
        #[serde(default)]
        offset: u64,
        /// Truncate the file to `offset` before writing (set on the first chunk of a whole-file write).
        #[serde(default)]
        truncate: bool,
        /// Permission bits for a newly created file (default 0o644).
        #[serde(default)]
        mode: Option<u32>,
        /// Owner of a newly created file (default: the sandbox's default user).
        #[serde(default)]
        user: Option<String>,
    },
    /// List a directory. Reply: [`Reply::Entries`], one page of it: a directory too large for one
    /// reply header is listed in pages, each continuing after the last name of the previous one.
    ListDir {
        /// Path inside the sandbox.
        path: String,
        /// Start after this entry name (the last name of the previous page); from the start when
        /// absent.
        #[serde(default)]
        after: Option<String>,
    },
    /// Describe a path without following a final symlink. Reply: [`Reply::Stat`].
    Stat {
        /// Path inside the sandbox.
        path: String,
    },
    /// Create a directory. Reply: [`Reply::Done`].
    Mkdir {
        /// Path inside the sandbox.
        path: String,
        /// Create missing parents, and succeed if it exists.
        #[serde(default)]
        parents: bool,
        /// Permission bits (default 0o755).
        #[serde(default)]
        mode: Option<u32>,
        /// Owner (default: the sandbox's default user).
        #[serde(default)]
        user: Option<String>,
    },
    /// Remove a file, symlink or (empty, or with `recursive` any) directory. Reply: [`Reply::Done`].
    Remove {
        /// Path inside the sandbox.
        path: String,
        /// Remove directories with their contents.
        #[serde(default)]
        recursive: bool,
    },
    /// Create a symbolic link at `path` pointing at `target` (stored as given; it resolves inside
    /// the sandbox when used). Reply: [`Reply::Done`].
    Symlink {
        /// Path inside the sandbox (must not exist).
        path: String,
        /// What the link points at.
        target: String,
        /// Owner (default: the sandbox's default user).
        #[serde(default)]
        user: Option<String>,
    },
    /// Rename within the sandbox, replacing an existing target. Reply: [`Reply::Done`].
    Rename {
        /// Existing path.
        from: String,
        /// New path.
        to: String,
    },
    /// Watch a directory for changes. Reply: [`Reply::Watching`]; this connection then receives
    /// [`AgentMessage::FsEvents`] for it, and [`AgentMessage::WatchEnded`] if the directory goes
    /// away. A watch ends with [`Request::Unwatch`] or when its connection closes.
    Watch {
        /// Directory inside the sandbox (symlinks and `..` resolve inside the sandbox root).
        path: String,
        /// Also watch every subdirectory, including ones created later.
        #[serde(default)]
        recursive: bool,
    },
    /// Stop a watch of this connection; no event of it follows the reply. Reply: [`Reply::Done`].
    Unwatch {
        /// The watch.
        watch_id: u32,
    },
    /// Read files into the page cache ahead of use (a sandbox's files are copies of its
    /// template's, so no other sandbox's cache serves them). Each path that names a regular file
    /// (symlinks resolve inside the sandbox root) is read, at most [`PREFETCH_MAX_FILE_BYTES`] of
    /// it and [`PREFETCH_MAX_TOTAL_BYTES`] in all; other and missing paths are skipped. At most
    /// [`PREFETCH_MAX_PATHS`] paths. Reply: [`Reply::Prefetched`].
    Prefetch {
        /// Paths inside the sandbox.
        paths: Vec<String>,
    },
    /// Start a Jupyter kernel (see [`crate::kernel`]). Reply: [`Reply::KernelStarted`].
    KernelStart(crate::kernel::KernelStart),
    /// Run `code` on a kernel. Cells of one kernel run one at a time (a second waits for the
    /// first). Reply: [`Reply::CellStarted`]; this connection then receives
    /// [`AgentMessage::Cell`] events, the last one [`crate::kernel::CellEvent::End`]. Closing the
    /// connection does not stop the cell.
    KernelExecute {
        /// The kernel.
        kernel_id: String,
        /// The cell.
        code: String,
        /// Interrupt it after this long (its end says `timed_out`).
        #[serde(default)]
        timeout_ms: Option<u64>,
        /// Run it as Jupyter's silent execution: no execution count, no history, no results
        /// published (setup code).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        silent: bool,
        /// Silent code run just before and just after the cell, in the same turn of the kernel's
        /// queue (no other cell between them): per-cell environment variables, set then restored.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        around: Option<crate::kernel::CellAround>,
    },
    /// Interrupt the kernel's running cell (`SIGINT` to the kernel, as Jupyter does); the kernel
    /// lives on. Reply: [`Reply::Done`].
    KernelInterrupt {
        /// The kernel.
        kernel_id: String,
    },
    /// Stop a kernel and forget it: its running cell ends `kernel_died`. Reply: [`Reply::Done`].
    KernelShutdown {
        /// The kernel.
        kernel_id: String,
    },
}

/// How to start a process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnRequest {
    /// What to run.
    pub command: CommandSpec,
    /// The complete environment of the process (the host composes defaults; the agent adds nothing).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory; the user's home when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// User name from the sandbox's /etc/passwd; `user` (uid 1000) when absent.
    #[serde(default)]
    pub user: Option<String>,
    /// Keep a stdin pipe open for [`Request::WriteStdin`]; otherwise stdin is /dev/null.
    #[serde(default)]
    pub stdin: bool,
    /// Run on a new PTY of this size (stdin, stdout and stderr all on the terminal).
    #[serde(default)]
    pub pty: Option<PtySize>,
    /// Kill the process tree after this many milliseconds; the exit then reports `timed_out`.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// A caller-chosen label, shown by [`Request::ListProcesses`].
    #[serde(default)]
    pub tag: Option<String>,
    /// Do not stream output to this connection (a background process; attach later).
    #[serde(default)]
    pub detached: bool,
}

/// The program and arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CommandSpec {
    /// Exec `argv[0]` (looked up in the process's PATH) with these arguments.
    Argv {
        /// Program and arguments; must not be empty.
        argv: Vec<String>,
    },
    /// Run a shell script with `/bin/bash -c` (or `/bin/sh -c` where bash is missing).
    Shell {
        /// The script.
        script: String,
    },
}

/// A terminal size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// Which output stream bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// The PTY of a terminal process (its offsets count as stdout's).
    Pty,
}

/// How a process ended, with its resource usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// Exit code, when it exited normally.
    pub code: Option<i32>,
    /// Signal number, when a signal killed it.
    pub signal: Option<i32>,
    /// Killed by the agent because its timeout passed.
    #[serde(default)]
    pub timed_out: bool,
    /// User plus system CPU time, microseconds.
    #[serde(default)]
    pub cpu_time_us: u64,
    /// Peak resident memory, KiB.
    #[serde(default)]
    pub max_rss_kib: u64,
    /// Milliseconds from start to exit.
    #[serde(default)]
    pub duration_ms: u64,
}

impl ExitStatus {
    /// The shell convention: the exit code, or 128 + the signal number.
    pub fn shell_code(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 255,
        }
    }
}

/// A message from the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentMessage {
    /// The successful answer to request `id`.
    Reply {
        /// The request's id.
        id: u64,
        /// The answer.
        body: Reply,
    },
    /// The failed answer to request `id`.
    Error {
        /// The request's id.
        id: u64,
        /// What went wrong.
        error: AgentError,
    },
    /// Output of a process; the bytes are the frame payload, starting at byte `offset` of the stream.
    Output {
        /// The process.
        pid: u32,
        /// Which stream.
        stream: Stream,
        /// Offset of the payload's first byte within the stream.
        offset: u64,
    },
    /// A process ended. Sent after all of its output.
    Exited {
        /// The process.
        pid: u32,
        /// How.
        status: ExitStatus,
    },
    /// Changes seen by a watch, oldest first. Consecutive identical events are merged.
    FsEvents {
        /// The watch.
        watch_id: u32,
        /// What changed.
        events: Vec<FsEvent>,
    },
    /// A watch ended on its own (its directory went away); sent after its last events.
    WatchEnded {
        /// The watch.
        watch_id: u32,
        /// Why.
        reason: WatchEndReason,
    },
    /// One event of a cell; the payload is the event's JSON (a [`crate::kernel::CellEvent`], at
    /// most [`crate::kernel::MAX_CELL_EVENT_LEN`] bytes).
    Cell {
        /// The cell.
        cell_id: u64,
    },
}

/// One change in a watched directory tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEvent {
    /// Absolute path inside the sandbox of the entry that changed (for `overflow`, the watched
    /// directory).
    pub path: String,
    /// What happened.
    pub kind: FsEventKind,
    /// The entry is a directory.
    #[serde(default)]
    pub is_dir: bool,
}

/// What happened to an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsEventKind {
    /// Created (or, in a recursive watch, found in a directory that just appeared).
    Create,
    /// Its contents were written.
    Modify,
    /// Deleted.
    Remove,
    /// Renamed away from this path.
    RenameFrom,
    /// Renamed to this path.
    RenameTo,
    /// Metadata changed (permissions, owner, timestamps, link count).
    Attrib,
    /// Events were lost (the consumer or the kernel queue fell behind, or a watch limit was hit):
    /// rescan the watched tree.
    Overflow,
}

/// Why a watch ended without an [`Request::Unwatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchEndReason {
    /// The watched directory was deleted.
    Deleted,
    /// The watched directory was renamed or moved away.
    Moved,
    /// The file system holding it was unmounted.
    Unmounted,
}

/// Successful answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// Handshake answer.
    Hello {
        /// The protocol version the agent speaks.
        version: u32,
        /// The agent's build version.
        agent_version: String,
    },
    /// A process started.
    Spawned {
        /// Its pid inside the sandbox.
        pid: u32,
    },
    /// Done, nothing to return.
    Done,
    /// Process list.
    Processes {
        /// Running and recently exited processes.
        processes: Vec<ProcessInfo>,
    },
    /// Attached; replay starts at these offsets (later than requested when the buffer dropped older
    /// output).
    Attached {
        /// First stdout byte that will be replayed.
        stdout_from: u64,
        /// First stderr byte that will be replayed.
        stderr_from: u64,
    },
    /// File bytes as payload.
    FileData {
        /// The read reached the end of the file.
        eof: bool,
        /// The file's size at the time of the read.
        size: u64,
    },
    /// Bytes written.
    Written {
        /// How many.
        bytes: u64,
    },
    /// Directory listing.
    Entries {
        /// Entries, sorted by name, without `.` and `..`.
        entries: Vec<FileStat>,
        /// More entries follow: list again with `after` set to the last name of this page.
        #[serde(default)]
        more: bool,
    },
    /// One path's metadata.
    Stat {
        /// Its metadata.
        stat: FileStat,
    },
    /// A watch started.
    Watching {
        /// Its id, unique within the agent; events carry it.
        watch_id: u32,
    },
    /// Files read ahead.
    Prefetched {
        /// How many of the paths were regular files, read.
        files: u32,
        /// Bytes read.
        bytes: u64,
    },
    /// A kernel started and answered.
    KernelStarted {
        /// What it said about itself.
        kernel: crate::kernel::KernelInfo,
    },
    /// A cell was queued on its kernel; its events carry this id.
    CellStarted {
        /// Unique within the agent.
        cell_id: u64,
    },
}

/// A process known to the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Pid inside the sandbox.
    pub pid: u32,
    /// The caller's label.
    #[serde(default)]
    pub tag: Option<String>,
    /// The command as started.
    pub command: CommandSpec,
    /// Whether it runs on a PTY.
    pub pty: bool,
    /// Start time, milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// Exit status once it has exited.
    #[serde(default)]
    pub exit: Option<ExitStatus>,
}

/// The kind of a file system entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Anything else (device, fifo, socket).
    Other,
}

/// Metadata of a path (a final symlink is described, not followed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    /// Final path component.
    pub name: String,
    /// Kind.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (including setuid/setgid/sticky).
    pub mode: u32,
    /// Owner uid inside the sandbox.
    pub uid: u32,
    /// Owner gid inside the sandbox.
    pub gid: u32,
    /// Modification time, milliseconds since the Unix epoch.
    pub mtime_ms: i64,
    /// Target of a symlink.
    #[serde(default)]
    pub symlink_target: Option<String>,
}

/// A failed request: a stable code and a human-readable message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct AgentError {
    /// Stable machine-readable code.
    pub code: ErrorCode,
    /// Explanation for people.
    pub message: String,
}

/// Stable error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The first request was not `hello`, or a second `hello` arrived.
    HandshakeRequired,
    /// The host's protocol version is not supported.
    UnsupportedVersion,
    /// The request is malformed or not understood.
    BadRequest,
    /// No such file or directory.
    NotFound,
    /// It exists already.
    AlreadyExists,
    /// Permission denied.
    PermissionDenied,
    /// A path component is not a directory.
    NotADirectory,
    /// The path is a directory.
    IsADirectory,
    /// The directory is not empty.
    DirectoryNotEmpty,
    /// The path would resolve outside the sandbox root, or is otherwise unacceptable.
    InvalidPath,
    /// No process with that pid was started through the agent.
    ProcessNotFound,
    /// The process has exited already.
    ProcessExited,
    /// The user does not exist in the sandbox's /etc/passwd.
    UnknownUser,
    /// The program could not be executed (not found, not executable).
    ExecFailed,
    /// The disk or quota is full.
    NoSpace,
    /// A limit on the number of something (watched directories) was reached.
    LimitExceeded,
    /// Any other failure.
    Io,
}

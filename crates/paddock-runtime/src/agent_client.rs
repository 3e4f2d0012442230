//! The host side of `paddock-protocol`: an async client for one connection to a sandbox's agent.
//!
//! [`AgentClient::connect`] opens the unix socket (with a timeout) and does the handshake. A
//! background task reads every frame: replies go to the request that is waiting for them (by id),
//! output and exits go to the [`ProcessEvents`] of their pid. Those channels are bounded, so a
//! consumer that does not keep up stops the reader task, the socket fills, and the agent stops
//! reading that process's output: memory stays bounded end to end. The flip side: while one
//! process's events are not consumed, *no* frame of this connection is read, replies included, so
//! consume events concurrently with other calls on the same client (or use a second client).
//! Dropping a [`ProcessEvents`] discards that pid's later events. Directory watches work the same
//! way: [`AgentClient::watch`] returns the [`WatchEvents`] of the watch, and dropping them ends the
//! watch (best effort: an `unwatch` is sent in the background).
//!
//! The client is cheap to clone (all clones share the connection); the reader task stops when the
//! last clone is dropped.
//!
//! This module does not start or find agents; it only talks to one.

mod kernel;
mod probe;
mod routing;

pub use kernel::CellEvents;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paddock_protocol::{
    encode_frame, AgentError, ClientMessage, ErrorCode, ExitStatus, FileStat, FsEvent, ProcessInfo, PtySize,
    Reply, Request, SpawnRequest, Stream, WatchEndReason, MAX_PAYLOAD_LEN, PROTOCOL_VERSION,
};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

pub use probe::probe;
use routing::{
    cancel_route, cancel_watch, lock, read_frames, watch_events, Answer, Pending, Routes, Subscribe,
};

/// How long [`AgentClient::connect`] waits for the socket and the handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request waits for its reply (stdin writes excepted: they complete when the process
/// has taken the bytes, which may legitimately take forever).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentClientError {
    /// The socket could not be connected (or the handshake did not complete in time).
    #[error("failed to connect to the agent at {path}")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Reading or writing the connection failed.
    #[error("agent connection failed while {op}")]
    Io {
        /// What the client was doing.
        op: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The agent sent something this client does not understand.
    #[error("agent protocol violation: {detail}")]
    Protocol {
        /// What was wrong.
        detail: String,
    },
    /// The agent answered with an error.
    #[error("the agent refused the request")]
    Agent(#[source] AgentError),
    /// No answer in time.
    #[error("the agent did not answer {op} within {after:?}")]
    Timeout {
        /// The request.
        op: &'static str,
        /// How long the client waited.
        after: Duration,
    },
    /// The connection is closed (the agent exited, or the socket broke).
    #[error("the agent connection is closed")]
    Closed,
    /// The request does not fit in one message of the protocol (a command, its environment and
    /// settings together over [`paddock_protocol::MAX_HEADER_LEN`] bytes): nothing was sent.
    #[error("{op} is {len} bytes encoded, more than the {max} one request may be")]
    TooLarge {
        /// The request.
        op: &'static str,
        /// Its encoded size.
        len: usize,
        /// The most one request may be.
        max: usize,
    },
}

impl AgentClientError {
    /// The agent's error code, when the agent refused the request.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Agent(error) => Some(error.code),
            _ => None,
        }
    }
}

/// Something that happened to a process this client follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    /// Output bytes starting at `offset` of `stream`.
    Output {
        /// Which stream.
        stream: Stream,
        /// Offset of the first byte in the stream.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// The process exited; sent after all of its output, and last.
    Exited(ExitStatus),
}

/// The events of one process, in order. `recv` returns `None` after the exit, after a detach, or
/// when the connection closes.
#[derive(Debug)]
pub struct ProcessEvents {
    pid: u32,
    rx: mpsc::Receiver<ProcessEvent>,
}

impl ProcessEvents {
    /// The process these events belong to.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The next event.
    pub async fn recv(&mut self) -> Option<ProcessEvent> {
        self.rx.recv().await
    }
}

/// Something a directory watch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchUpdate {
    /// Changes, oldest first.
    Events(Vec<FsEvent>),
    /// The watch ended on its own (its directory went away); nothing follows.
    Ended(WatchEndReason),
}

/// The updates of one directory watch, in order. `recv` returns `None` after
/// [`WatchUpdate::Ended`], after an unwatch, or when the connection closes. Dropping it ends the watch
/// on the agent (best effort, in the background).
#[derive(Debug)]
pub struct WatchEvents {
    watch_id: u32,
    rx: mpsc::Receiver<WatchUpdate>,
    client: std::sync::Weak<Shared>,
}

impl WatchEvents {
    /// The watch these updates belong to.
    pub fn watch_id(&self) -> u32 {
        self.watch_id
    }

    /// The next update.
    pub async fn recv(&mut self) -> Option<WatchUpdate> {
        self.rx.recv().await
    }
}

impl Drop for WatchEvents {
    fn drop(&mut self) {
        let Some(shared) = self.client.upgrade() else {
            return;
        };
        // No route left: the watch ended, was unwatched, or the connection closed.
        if !cancel_watch(&shared.routes, self.watch_id) {
            return;
        }
        // Sending needs the runtime; without one (a drop outside it) the watch ends with the
        // connection instead.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = AgentClient { shared };
            let watch_id = self.watch_id;
            runtime.spawn(async move {
                if let Err(err) = client.done("unwatch", Request::Unwatch { watch_id }, &[]).await {
                    tracing::debug!(watch_id, error = %err, "unwatch on drop failed");
                }
            });
        }
    }
}

/// Where an attach's replay starts (later than asked when the agent's buffer dropped older bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayStart {
    /// First stdout (or PTY) byte replayed.
    pub stdout_from: u64,
    /// First stderr byte replayed.
    pub stderr_from: u64,
}

/// Part of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChunk {
    /// The bytes read.
    pub data: Vec<u8>,
    /// The file's size when it was read.
    pub size: u64,
    /// The read reached the end of the file.
    pub eof: bool,
}

/// How [`AgentClient::write_file`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOptions {
    /// Where the data goes.
    pub offset: u64,
    /// Cut the file at `offset` first (the default: the data becomes the whole file).
    pub truncate: bool,
    /// Permission bits if the file is created (agent default 0o644).
    pub mode: Option<u32>,
    /// Owner if the file is created (agent default: the sandbox's default user).
    pub user: Option<String>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            offset: 0,
            truncate: true,
            mode: None,
            user: None,
        }
    }
}

/// How [`AgentClient::mkdir`] creates a directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MkdirOptions {
    /// Create missing parents, and succeed if it exists.
    pub parents: bool,
    /// Permission bits (agent default 0o755).
    pub mode: Option<u32>,
    /// Owner (agent default: the sandbox's default user).
    pub user: Option<String>,
}

/// A connection to an agent.
#[derive(Debug, Clone)]
pub struct AgentClient {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    next_id: AtomicU64,
    routes: Arc<Mutex<Routes>>,
    reader: JoinHandle<()>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl AgentClient {
    /// Connects to the agent socket at `path` and does the handshake, within [`CONNECT_TIMEOUT`].
    pub async fn connect(path: impl AsRef<Path>) -> Result<Self, AgentClientError> {
        let path = path.as_ref();
        let client = Self::open(path).await?;
        client.handshake(path).await?;
        Ok(client)
    }

    /// [`Self::connect`], [`Self::hold`] and [`Self::spawn`] in one round trip: the hold and the
    /// spawn are written right behind the handshake, so the agent answers all three without waiting
    /// for this side in between (`paddock run`'s first and only process, in a sandbox that ends with
    /// this connection). The agent handles a connection's requests in order and refuses any before a
    /// successful handshake (`HandshakeRequired`), so an agent that does not speak this protocol
    /// starts nothing; the handshake's error is the one returned.
    pub async fn connect_and_spawn(
        path: impl AsRef<Path>,
        request: SpawnRequest,
    ) -> Result<(Self, u32, ProcessEvents), AgentClientError> {
        let path = path.as_ref();
        let client = Self::open(path).await?;
        // `join!` polls in order: the handshake's frame is written first, then the hold's.
        let (greeted, held, spawned) =
            tokio::join!(client.handshake(path), client.hold(), client.spawn(request));
        greeted?;
        held?;
        let (pid, events) = spawned?;
        Ok((client, pid, events))
    }

    /// This connection holds the sandbox: the agent ends it once every connection that did so has
    /// closed ([`Request::Hold`]).
    pub async fn hold(&self) -> Result<(), AgentClientError> {
        let answer = self
            .call("hold", Request::Hold, &[], Subscribe::No, Some(REQUEST_TIMEOUT))
            .await?;
        match answer.body {
            Reply::Done => Ok(()),
            other => Err(unexpected("hold", &other)),
        }
    }

    /// The connection, before the handshake.
    async fn open(path: &Path) -> Result<Self, AgentClientError> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(path))
            .await
            .map_err(|_| connect_timed_out(path))?
            .map_err(|source| AgentClientError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        let (read, write) = stream.into_split();
        let routes = Arc::new(Mutex::new(Routes::default()));
        let reader = tokio::spawn(read_frames(read, routes.clone()));
        Ok(Self {
            shared: Arc::new(Shared {
                writer: tokio::sync::Mutex::new(write),
                next_id: AtomicU64::new(1),
                routes,
                reader,
            }),
        })
    }

    /// The handshake: the first request on a connection.
    async fn handshake(&self, path: &Path) -> Result<(), AgentClientError> {
        let hello = self.call(
            "hello",
            Request::Hello {
                version: PROTOCOL_VERSION,
            },
            &[],
            Subscribe::No,
            Some(CONNECT_TIMEOUT),
        );
        match hello.await {
            Ok(Answer {
                body:
                    Reply::Hello {
                        version: PROTOCOL_VERSION,
                        agent_version,
                    },
                ..
            }) => {
                tracing::debug!(path = %path.display(), %agent_version, "connected to agent");
                Ok(())
            }
            Ok(Answer { body, .. }) => Err(unexpected("hello", &body)),
            Err(AgentClientError::Timeout { .. }) => Err(connect_timed_out(path)),
            Err(err) => Err(err),
        }
    }

    /// Whether the connection has ended (the agent exited or the socket broke): every call fails
    /// with [`AgentClientError::Closed`] from then on, so a cached client should be replaced.
    pub fn is_closed(&self) -> bool {
        lock(&self.shared.routes).closed
    }

    /// Starts a process. Unless `request.detached`, the returned events carry its output and exit;
    /// for a detached process they end at once (attach later).
    pub async fn spawn(&self, request: SpawnRequest) -> Result<(u32, ProcessEvents), AgentClientError> {
        let subscribe = if request.detached {
            Subscribe::No
        } else {
            Subscribe::Spawn
        };
        let answer = self
            .call(
                "spawn",
                Request::Spawn(request),
                &[],
                subscribe,
                Some(REQUEST_TIMEOUT),
            )
            .await?;
        match answer.body {
            Reply::Spawned { pid } => Ok((pid, answer.events.unwrap_or_else(|| ended_events(pid)))),
            other => Err(unexpected("spawn", &other)),
        }
    }

    /// Follows process `pid` on this connection, replaying buffered output from the given offsets
    /// first; an exited process's replay ends with its exit.
    pub async fn attach(
        &self,
        pid: u32,
        stdout_from: u64,
        stderr_from: u64,
    ) -> Result<(ReplayStart, ProcessEvents), AgentClientError> {
        let request = Request::Attach {
            pid,
            stdout_from,
            stderr_from,
        };
        let answer = self
            .call(
                "attach",
                request,
                &[],
                Subscribe::Attach(pid),
                Some(REQUEST_TIMEOUT),
            )
            .await?;
        match answer.body {
            Reply::Attached {
                stdout_from,
                stderr_from,
            } => Ok((
                ReplayStart {
                    stdout_from,
                    stderr_from,
                },
                answer.events.unwrap_or_else(|| ended_events(pid)),
            )),
            other => Err(unexpected("attach", &other)),
        }
    }

    /// Stops following `pid` on this connection (the process keeps running); its events end at once
    /// (output still in flight is dropped), even if their consumer has stopped reading.
    pub async fn detach(&self, pid: u32) -> Result<(), AgentClientError> {
        cancel_route(&self.shared.routes, pid);
        self.done("detach", Request::Detach { pid }, &[]).await
    }

    /// Writes `data` to the process's stdin (in frames of at most 1 MiB), then closes stdin if
    /// `close`. Completes when the agent has written the bytes into the pipe or PTY, which takes as
    /// long as the process takes to read them: there is no timeout.
    pub async fn write_stdin(&self, pid: u32, data: &[u8], close: bool) -> Result<(), AgentClientError> {
        let mut chunks: Vec<&[u8]> = data.chunks(MAX_PAYLOAD_LEN).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let request = Request::WriteStdin {
                pid,
                close: close && i == last,
            };
            let answer = self
                .call("write_stdin", request, chunk, Subscribe::No, None)
                .await?;
            expect_done("write_stdin", answer.body)?;
        }
        Ok(())
    }

    /// Sends signal number `signal` to process `pid`.
    pub async fn signal(&self, pid: u32, signal: i32) -> Result<(), AgentClientError> {
        self.done("signal", Request::Signal { pid, signal }, &[]).await
    }

    /// Sends `signal` (SIGKILL when `None`) to `pid` and all its descendants.
    pub async fn kill_tree(&self, pid: u32, signal: Option<i32>) -> Result<(), AgentClientError> {
        self.done("kill_tree", Request::KillTree { pid, signal }, &[])
            .await
    }

    /// Resizes the PTY of `pid`.
    pub async fn resize(&self, pid: u32, size: PtySize) -> Result<(), AgentClientError> {
        self.done("resize", Request::Resize { pid, size }, &[]).await
    }

    /// Running and recently exited processes started through the agent.
    pub async fn list_processes(&self) -> Result<Vec<ProcessInfo>, AgentClientError> {
        match self
            .reply("list_processes", Request::ListProcesses, &[])
            .await?
            .body
        {
            Reply::Processes { processes } => Ok(processes),
            other => Err(unexpected("list_processes", &other)),
        }
    }

    /// Reads up to `max_len` bytes (at most 1 MiB) of `path` from `offset`.
    pub async fn read_file(
        &self,
        path: &str,
        offset: u64,
        max_len: Option<u32>,
    ) -> Result<FileChunk, AgentClientError> {
        let request = Request::ReadFile {
            path: path.to_owned(),
            offset,
            max_len,
        };
        let answer = self.reply("read_file", request, &[]).await?;
        match answer.body {
            Reply::FileData { eof, size } => Ok(FileChunk {
                data: answer.payload,
                size,
                eof,
            }),
            other => Err(unexpected("read_file", &other)),
        }
    }

    /// Reads a whole file, refusing (with `Protocol`) one larger than `limit` bytes.
    pub async fn read_file_to_end(&self, path: &str, limit: u64) -> Result<Vec<u8>, AgentClientError> {
        let mut data = Vec::new();
        loop {
            let chunk = self.read_file(path, data.len() as u64, None).await?;
            data.extend_from_slice(&chunk.data);
            if data.len() as u64 > limit {
                return Err(AgentClientError::Protocol {
                    detail: format!("{path} is larger than {limit} bytes"),
                });
            }
            if chunk.eof || chunk.data.is_empty() {
                return Ok(data);
            }
        }
    }

    /// Writes `data` to `path` (in frames of at most 1 MiB); returns the bytes written.
    pub async fn write_file(
        &self,
        path: &str,
        data: &[u8],
        options: &WriteOptions,
    ) -> Result<u64, AgentClientError> {
        let mut chunks: Vec<&[u8]> = data.chunks(MAX_PAYLOAD_LEN).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let mut written = 0u64;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let request = Request::WriteFile {
                path: path.to_owned(),
                offset: options.offset + written,
                truncate: options.truncate && i == 0,
                mode: options.mode,
                user: options.user.clone(),
            };
            match self.reply("write_file", request, chunk).await?.body {
                Reply::Written { bytes } => written += bytes,
                other => return Err(unexpected("write_file", &other)),
            }
        }
        Ok(written)
    }

    /// Lists a directory (all pages), sorted by name.
    pub async fn list_dir(&self, path: &str) -> Result<Vec<FileStat>, AgentClientError> {
        let mut all: Vec<FileStat> = Vec::new();
        loop {
            let after = all.last().map(|e| e.name.clone());
            let request = Request::ListDir {
                path: path.to_owned(),
                after,
            };
            match self.reply("list_dir", request, &[]).await?.body {
                Reply::Entries { entries, more } => {
                    let progressed = !entries.is_empty();
                    all.extend(entries);
                    if !more || !progressed {
                        return Ok(all);
                    }
                }
                other => return Err(unexpected("list_dir", &other)),
            }
        }
    }

    /// Describes `path` without following a final symlink.
    pub async fn stat(&self, path: &str) -> Result<FileStat, AgentClientError> {
        match self
            .reply(
                "stat",
                Request::Stat {
                    path: path.to_owned(),
                },
                &[],
            )
            .await?
            .body
        {
            Reply::Stat { stat } => Ok(stat),
            other => Err(unexpected("stat", &other)),
        }
    }

    /// Creates a directory.
    pub async fn mkdir(&self, path: &str, options: &MkdirOptions) -> Result<(), AgentClientError> {
        let request = Request::Mkdir {
            path: path.to_owned(),
            parents: options.parents,
            mode: options.mode,
            user: options.user.clone(),
        };
        self.done("mkdir", request, &[]).await
    }

    /// Creates the symbolic link `path` pointing at `target`, owned by `user` (default: the
    /// sandbox's default user).
    pub async fn symlink(
        &self,
        path: &str,
        target: &str,
        user: Option<&str>,
    ) -> Result<(), AgentClientError> {
        let request = Request::Symlink {
            path: path.to_owned(),
            target: target.to_owned(),
            user: user.map(str::to_owned),
        };
        self.done("symlink", request, &[]).await
    }

    /// Reads `paths` (inside the sandbox) into the page cache; how many were regular files, and
    /// the bytes read.
    pub async fn prefetch(&self, paths: &[String]) -> Result<(u32, u64), AgentClientError> {
        let request = Request::Prefetch {
            paths: paths.to_vec(),
        };
        let answer = self
            .call("prefetch", request, &[], Subscribe::No, Some(REQUEST_TIMEOUT))
            .await?;
        match answer.body {
            Reply::Prefetched { files, bytes } => Ok((files, bytes)),
            other => Err(unexpected("prefetch", &other)),
        }
    }

    /// Removes a file, symlink or directory (`recursive` for a non-empty one).
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<(), AgentClientError> {
        self.done(
            "remove",
            Request::Remove {
                path: path.to_owned(),
                recursive,
            },
            &[],
        )
        .await
    }

    /// Renames `from` to `to`, replacing `to`.
    pub async fn rename(&self, from: &str, to: &str) -> Result<(), AgentClientError> {
        self.done(
            "rename",
            Request::Rename {
                from: from.to_owned(),
                to: to.to_owned(),
            },
            &[],
        )
        .await
    }

    /// Watches directory `path` (and with `recursive` every directory below it, including new
    /// ones) for changes; returns the watch id and its updates. The agent batches events (about every
    /// 50 ms) and, when this side does not keep up, replaces what it could not queue with one
    /// `overflow` event rather than buffering without bound.
    pub async fn watch(&self, path: &str, recursive: bool) -> Result<(u32, WatchEvents), AgentClientError> {
        let request = Request::Watch {
            path: path.to_owned(),
            recursive,
        };
        let answer = self
            .call("watch", request, &[], Subscribe::Watch, Some(REQUEST_TIMEOUT))
            .await?;
        match answer.body {
            Reply::Watching { watch_id } => Ok((
                watch_id,
                watch_events(watch_id, answer.watch, Arc::downgrade(&self.shared)),
            )),
            other => Err(unexpected("watch", &other)),
        }
    }

    /// Ends watch `watch_id`; its updates end at once (events in flight are dropped).
    pub async fn unwatch(&self, watch_id: u32) -> Result<(), AgentClientError> {
        cancel_watch(&self.shared.routes, watch_id);
        self.done("unwatch", Request::Unwatch { watch_id }, &[]).await
    }

    async fn reply(
        &self,
        op: &'static str,
        request: Request,
        payload: &[u8],
    ) -> Result<Answer, AgentClientError> {
        self.call(op, request, payload, Subscribe::No, Some(REQUEST_TIMEOUT))
            .await
    }

    async fn done(&self, op: &'static str, request: Request, payload: &[u8]) -> Result<(), AgentClientError> {
        expect_done(op, self.reply(op, request, payload).await?.body)
    }

    /// Sends one request and waits for its answer.
    async fn call(
        &self,
        op: &'static str,
        request: Request,
        payload: &[u8],
        subscribe: Subscribe,
        timeout: Option<Duration>,
    ) -> Result<Answer, AgentClientError> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::new();
        encode_frame(&ClientMessage { id, request }, payload, &mut frame).map_err(|err| match err {
            paddock_protocol::FrameError::HeaderTooLarge(len) => AgentClientError::TooLarge {
                op,
                len,
                max: paddock_protocol::MAX_HEADER_LEN,
            },
            err => AgentClientError::Protocol {
                detail: format!("cannot encode {op}: {err}"),
            },
        })?;
        let (tx, rx) = oneshot::channel();
        {
            let mut routes = lock(&self.shared.routes);
            if routes.closed {
                return Err(AgentClientError::Closed);
            }
            routes.pending.insert(id, Pending { tx, subscribe });
        }
        let forget = || lock(&self.shared.routes).pending.remove(&id);
        let send = async {
            let mut writer = self.shared.writer.lock().await;
            writer.write_all(&frame).await
        };
        let sent = match timeout {
            Some(after) => tokio::time::timeout(after, send)
                .await
                .map_err(|_| AgentClientError::Timeout { op, after }),
            None => Ok(send.await),
        };
        if let Err(err) = sent.and_then(|r| r.map_err(|source| AgentClientError::Io { op, source })) {
            forget();
            return Err(err);
        }
        let answer = match timeout {
            Some(after) => match tokio::time::timeout(after, rx).await {
                Ok(answer) => answer,
                Err(_) => {
                    forget();
                    return Err(AgentClientError::Timeout { op, after });
                }
            },
            None => rx.await,
        };
        answer.unwrap_or(Err(AgentClientError::Closed))
    }
}

/// Reaching the agent at `path` (its socket, or its handshake) took longer than [`CONNECT_TIMEOUT`].
fn connect_timed_out(path: &Path) -> AgentClientError {
    AgentClientError::Connect {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::TimedOut, "timed out"),
    }
}

fn expect_done(op: &'static str, body: Reply) -> Result<(), AgentClientError> {
    match body {
        Reply::Done => Ok(()),
        other => Err(unexpected(op, &other)),
    }
}

fn unexpected(op: &'static str, body: &Reply) -> AgentClientError {
    AgentClientError::Protocol {
        detail: format!("unexpected reply to {op}: {body:?}"),
    }
}

/// Events that are already over (a detached spawn).
fn ended_events(pid: u32) -> ProcessEvents {
    let (_, rx) = mpsc::channel(1);
    ProcessEvents { pid, rx }
}

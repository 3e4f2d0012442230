//! envd's `filesystem.Filesystem` service, answered from the service's file operations: Stat,
//! ListDir, MakeDir, Move, Remove, the WatchDir stream and the polling watchers (CreateWatcher,
//! GetWatcherEvents, RemoveWatcher).
//!
//! Paths resolve as envd resolves them ([`paths`]); entries are envd's `EntryInfo` ([`entry`]);
//! polling watchers are buffered here, bounded ([`watchers`]).
//!
//! Differences from envd, from what the service offers: operations act with the agent's
//! authority, not the calling user's (the user only picks the home `~` means and the owner of
//! directories MakeDir creates): a file the user could not read in E2B can be listed here; the
//! network-mount check of watches is not made (a sandbox has no network file systems); watch
//! events are the agent's (a rename's new name is `CREATE`, its old one `RENAME`, as fsnotify
//! reports them).
//!
//! It does not: read or write file contents (`/files` does), or hold anything between calls but
//! the bounded watchers.

pub mod entry;
pub mod paths;
pub mod watchers;

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use axum::routing::any;
use axum::{Extension, Router};
use futures_util::{FutureExt as _, Stream};
use paddock_control::{ServiceError, WatchStream};
use paddock_types::api::{
    ErrorCode, FileEntry, FileKindBody, MkdirRequest, RenameRequest, WatchEvent, WatchEventKind,
};

use crate::envd::connect::{
    rpc, service_error, stream_error, stream_response, unary_response, unknown_rpc, StreamCall,
    StreamOptions, Unary,
};
use crate::envd::proto::filesystem::{self as pb, watch_dir_response, EventType};
use crate::envd::EnvdCaller;
use crate::{ConnectCode, ConnectError, E2bState};

use self::entry::entry_info;
use self::paths::{parent, relative_to, resolve_path, UserContext};
use self::watchers::Watchers;

/// The most entries one ListDir answers (a deeper listing than that is refused: list less deep).
pub const MAX_LIST_ENTRIES: usize = 50_000;

/// The filesystem service's routes.
pub fn routes() -> Router<E2bState> {
    let watchers = Arc::new(Watchers::default());
    Router::new()
        .route("/filesystem.Filesystem/Stat", rpc(stat))
        .route("/filesystem.Filesystem/ListDir", rpc(list_dir))
        .route("/filesystem.Filesystem/MakeDir", rpc(make_dir))
        .route("/filesystem.Filesystem/Move", rpc(move_entry))
        .route("/filesystem.Filesystem/Remove", rpc(remove))
        .route("/filesystem.Filesystem/WatchDir", rpc(watch_dir))
        .route("/filesystem.Filesystem/CreateWatcher", rpc(create_watcher))
        .route("/filesystem.Filesystem/GetWatcherEvents", rpc(get_watcher_events))
        .route("/filesystem.Filesystem/RemoveWatcher", rpc(remove_watcher))
        .route("/filesystem.Filesystem/{*method}", any(unknown))
        .layer(Extension(watchers))
}

async fn unknown(uri: axum::http::Uri) -> Response {
    unknown_rpc(uri.path())
}

/// A file error, with envd's words for a missing path.
fn file_error(e: ServiceError, path: &str) -> ConnectError {
    match e.code {
        ErrorCode::FileNotFound => {
            ConnectError::new(ConnectCode::NotFound, format!("path '{path}' does not exist"))
        }
        _ => service_error(e),
    }
}

async fn stat_path(state: &E2bState, caller: &EnvdCaller, path: &str) -> Result<FileEntry, ConnectError> {
    state
        .service
        .stat_file(&caller.principal, &caller.id, path)
        .await
        .map_err(|e| file_error(e, path))
}

/// Stat of `path` following a symlink at its end (for directories that are links).
async fn stat_following(
    state: &E2bState,
    caller: &EnvdCaller,
    path: &str,
) -> Result<FileEntry, ConnectError> {
    let mut entry = stat_path(state, caller, path).await?;
    let mut current = path.to_owned();
    for _ in 0..40 {
        let (FileKindBody::Symlink, Some(target)) = (&entry.kind, &entry.symlink_target) else {
            return Ok(entry);
        };
        current = if target.starts_with('/') {
            paths::normalize(target)
        } else {
            paths::normalize(&format!("{}/{target}", parent(&current)))
        };
        entry = stat_path(state, caller, &current).await?;
    }
    Err(ConnectError::new(
        ConnectCode::InvalidArgument,
        format!("path '{path}': too many levels of symbolic links"),
    ))
}

async fn stat(caller: EnvdCaller, State(state): State<E2bState>, call: Unary<pb::StatRequest>) -> Response {
    let Unary { meta, msg } = call;
    let result = async {
        let user = UserContext::load(&state, &caller, meta.user.as_deref()).await?;
        let path = resolve_path(&msg.path, &user.home)?;
        let found = stat_path(&state, &caller, &path).await?;
        Ok(pb::StatResponse {
            entry: Some(entry_info(&state, &caller, &user, &found, path).await),
        })
    };
    unary_response(meta.codec, result.await)
}

async fn list_dir(
    caller: EnvdCaller,
    State(state): State<E2bState>,
    call: Unary<pb::ListDirRequest>,
) -> Response {
    let Unary { meta, msg } = call;
    let result = async {
        let user = UserContext::load(&state, &caller, meta.user.as_deref()).await?;
        let path = resolve_path(&msg.path, &user.home)?;
        let root = stat_following(&state, &caller, &path).await?;
        if root.kind != FileKindBody::Dir {
            return Err(ConnectError::new(
                ConnectCode::InvalidArgument,
                format!("path '{path}' is not a directory"),
            ));
        }
        let depth = msg.depth.max(1);
        let entries = walk(&state, &caller, &user, &root.path, &path, depth).await?;
        Ok(pb::ListDirResponse { entries })
    };
    unary_response(meta.codec, result.await)
}

/// The entries under `dir` (listed at `real`, reported under `shown`) down to `depth` levels, in
/// lexical depth-first order; symlinked directories below the first level are not entered.
async fn walk(
    state: &E2bState,
    caller: &EnvdCaller,
    user: &UserContext,
    real: &str,
    shown: &str,
    depth: u32,
) -> Result<Vec<pb::EntryInfo>, ConnectError> {
    let mut out = Vec::new();
    // A stack of directories being listed: their remaining entries (reversed, next last), the
    // path they are shown under and their depth.
    let mut stack = vec![(list_sorted(state, caller, real).await?, shown.to_owned(), 1u32)];
    while let Some((entries, shown_dir, level)) = stack.last_mut() {
        let Some(entry) = entries.pop() else {
            stack.pop();
            continue;
        };
        let (shown_dir, level) = (shown_dir.clone(), *level);
        if out.len() >= MAX_LIST_ENTRIES {
            return Err(ConnectError::new(
                ConnectCode::ResourceExhausted,
                format!("the listing has more than {MAX_LIST_ENTRIES} entries; list less deep"),
            ));
        }
        let shown_path = if shown_dir == "/" {
            format!("/{}", entry.name)
        } else {
            format!("{shown_dir}/{}", entry.name)
        };
        out.push(entry_info(state, caller, user, &entry, shown_path.clone()).await);
        if entry.kind == FileKindBody::Dir && level < depth {
            // A directory that went away meanwhile is just not descended into.
            match list_sorted(state, caller, &entry.path).await {
                Ok(children) => stack.push((children, shown_path, level + 1)),
                Err(e) if e.code == ConnectCode::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(out)
}

/// A directory's entries in reverse lexical order (so popping gives lexical order).
async fn list_sorted(
    state: &E2bState,
    caller: &EnvdCaller,
    dir: &str,
) -> Result<Vec<FileEntry>, ConnectError> {
    let mut entries = state
        .service
        .list_dir(&caller.principal, &caller.id, dir)
        .await
        .map_err(|e| file_error(e, dir))?
        .entries;
    entries.sort_by(|a, b| b.name.cmp(&a.name));
    Ok(entries)
}

async fn make_dir(
    caller: EnvdCaller,
    State(state): State<E2bState>,
    call: Unary<pb::MakeDirRequest>,
) -> Response {
    let Unary { meta, msg } = call;
    let result = async {
        let user = UserContext::load(&state, &caller, meta.user.as_deref()).await?;
        let path = resolve_path(&msg.path, &user.home)?;
        match state
            .service
            .stat_file(&caller.principal, &caller.id, &path)
            .await
        {
            Ok(found) if found.kind == FileKindBody::Dir => {
                return Err(ConnectError::new(
                    ConnectCode::AlreadyExists,
                    format!("directory '{path}' already exists"),
                ))
            }
            Ok(_) => {
                return Err(ConnectError::new(
                    ConnectCode::InvalidArgument,
                    format!("path '{path}' already exists and is not a directory"),
                ))
            }
            Err(e) if e.code == ErrorCode::FileNotFound => {}
            Err(e) => return Err(service_error(e)),
        }
        let made = mkdir_all(&state, &caller, &user, &path).await?;
        Ok(pb::MakeDirResponse {
            entry: Some(entry_info(&state, &caller, &user, &made, path).await),
        })
    };
    unary_response(meta.codec, result.await)
}

/// Creates `path` and its missing parents, owned by the user.
async fn mkdir_all(
    state: &E2bState,
    caller: &EnvdCaller,
    user: &UserContext,
    path: &str,
) -> Result<FileEntry, ConnectError> {
    let request = MkdirRequest {
        path: path.to_owned(),
        parents: true,
        mode: Some(0o755),
        user: Some(user.name.clone()),
        approval_id: None,
    };
    state
        .service
        .make_dir(&caller.principal, &caller.id, request)
        .await
        .map_err(|e| match e.code {
            ErrorCode::NotADirectory | ErrorCode::AlreadyExists => ConnectError::new(
                ConnectCode::InvalidArgument,
                format!("path '{path}': a parent is not a directory"),
            ),
            _ => file_error(e, path),
        })
}

async fn move_entry(
    caller: EnvdCaller,
    State(state): State<E2bState>,
    call: Unary<pb::MoveRequest>,
) -> Response {
    let Unary { meta, msg } = call;
    let result = async {
        let user = UserContext::load(&state, &caller, meta.user.as_deref()).await?;
        let source = resolve_path(&msg.source, &user.home)?;
        let destination = resolve_path(&msg.destination, &user.home)?;
        stat_path(&state, &caller, &source).await?;
        let dest_parent = parent(&destination);
        match state
            .service
            .stat_file(&caller.principal, &caller.id, &dest_parent)
            .await
        {
            Ok(_) => {}
            Err(e) if e.code == ErrorCode::FileNotFound => {
                mkdir_all(&state, &caller, &user, &dest_parent).await?;
            }
            Err(e) => return Err(service_error(e)),
        }
        let request = RenameRequest {
            from: source.clone(),
            to: destination.clone(),
            approval_id: None,
        };
        let moved = state
            .service
            .rename_file(&caller.principal, &caller.id, request)
            .await
            .map_err(|e| file_error(e, &source))?;
        Ok(pb::MoveResponse {
            entry: Some(entry_info(&state, &caller, &user, &moved, destination).await),
        })
    };
    unary_response(meta.codec, result.await)
}

async fn remove(
    caller: EnvdCaller,
    State(state): State<E2bState>,
    call: Unary<pb::RemoveRequest>,
) -> Response {
    let Unary { meta, msg } = call;
    let result = async {
        let user = UserContext::load(&state, &caller, meta.user.as_deref()).await?;
        let path = resolve_path(&msg.path, &user.home)?;
        match state
            .service
            .remove_file(&caller.principal, &caller.id, &path, true, None)
            .await
        {
            // `rm -rf`: a missing path is no error.
            Err(e) if e.code == ErrorCode::FileNotFound => Ok(pb::RemoveResponse {}),
            Err(e) => Err(service_error(e)),
            Ok(()) => Ok(pb::RemoveResponse {}),
        }
    };
    unary_response(meta.codec, result.await)
}

/// A watch as both kinds of watcher start it: the directory must exist and be one.
async fn start_watch(
    state: &E2bState,
    caller: &EnvdCaller,
    user: &UserContext,
    path: &str,
    recursive: bool,
) -> Result<WatchStream, ConnectError> {
    let found = stat_following(state, caller, path).await?;
    if found.kind != FileKindBody::Dir {
        return Err(ConnectError::new(
            ConnectCode::InvalidArgument,
            format!("path '{path}' is not a directory"),
        ));
    }
    let _ = user;
    state
        .service
        .watch_dir(&caller.principal, &caller.id, &found.path, recursive)
        .await
        .map_err(|e| file_error(e, path))
}

/// What a watch event becomes: its name relative to the watched directory and envd's type
/// (`None` for what envd does not report: overflow markers, the directory itself).
fn event_of(event: &WatchEvent, root: &str) -> Option<(String, EventType)> {
    let kind = match event.kind {
        WatchEventKind::Create | WatchEventKind::RenameTo => EventType::Create,
        WatchEventKind::Modify => EventType::Write,
        WatchEventKind::Remove => EventType::Remove,
        WatchEventKind::RenameFrom => EventType::Rename,
        WatchEventKind::Attrib => EventType::Chmod,
        _ => return None,
    };
    let path = paths::normalize(&event.path);
    let name = relative_to(&path, root)?;
    Some((name.to_owned(), kind))
}

/// The envd event of a watch event, with its entry when asked for and it can be read.
async fn filesystem_event(
    state: &E2bState,
    caller: &EnvdCaller,
    user: &UserContext,
    event: &WatchEvent,
    (watched, shown): (&str, &str),
    include_entry: bool,
) -> Option<pb::FilesystemEvent> {
    let (name, kind) = event_of(event, watched)?;
    let entry = if include_entry && matches!(kind, EventType::Create | EventType::Write | EventType::Chmod) {
        let path = paths::normalize(&event.path);
        match state
            .service
            .stat_file(&caller.principal, &caller.id, &path)
            .await
        {
            Ok(found) => {
                let shown_path = if shown == "/" {
                    format!("/{name}")
                } else {
                    format!("{shown}/{name}")
                };
                Some(entry_info(state, caller, user, &found, shown_path).await)
            }
            Err(_) => None,
        }
    } else {
        None
    };
    Some(pb::FilesystemEvent {
        name,
        r#type: kind as i32,
        entry,
    })
}

async fn watch_dir(
    caller: EnvdCaller,
    State(state): State<E2bState>,
    call: StreamCall<pb::WatchDirRequest>,
) -> Response {
    let StreamCall { meta, msg } = call;
    let options = StreamOptions {
        codec: meta.codec,
        deadline: meta.deadline(),
        keepalive: meta.keepalive,
    };
    let started = async {
        let user = UserContext::load(&state, &caller, meta.user.as_deref()).await?;
        let path = resolve_path(&msg.path, &user.home)?;
        let stream = start_watch(&state, &caller, &user, &path, msg.recursive).await?;
        Ok::<_, ConnectError>((user, path, stream))
    };
    match started.await {
        Ok((user, path, stream)) => {
            let events = watch_events(state, caller, user, path, stream, msg.include_entry);
            stream_response(options, events, || pb::WatchDirResponse {
                event: Some(watch_dir_response::Event::Keepalive(
                    watch_dir_response::KeepAlive {},
                )),
            })
        }
        Err(e) => stream_error(meta.codec, e),
    }
}

/// A WatchDir stream: `start`, then each event; it ends when the watch does.
fn watch_events(
    state: E2bState,
    caller: EnvdCaller,
    user: UserContext,
    path: String,
    stream: WatchStream,
    include_entry: bool,
) -> impl Stream<Item = Result<pb::WatchDirResponse, ConnectError>> + Send + 'static {
    let start = pb::WatchDirResponse {
        event: Some(watch_dir_response::Event::Start(
            watch_dir_response::StartEvent {},
        )),
    };
    let first = futures_util::stream::once(async move { Ok(start) });
    let rest = futures_util::stream::unfold(
        (state, caller, user, path, stream),
        move |(state, caller, user, path, mut stream)| async move {
            loop {
                let event = stream.recv().await?;
                if event.kind == WatchEventKind::Ended {
                    return None;
                }
                if let Some(event) =
                    filesystem_event(&state, &caller, &user, &event, (&path, &path), include_entry).await
                {
                    let message = pb::WatchDirResponse {
                        event: Some(watch_dir_response::Event::Filesystem(event)),
                    };
                    return Some((Ok(message), (state, caller, user, path, stream)));
                }
            }
        },
    );
    futures_util::StreamExt::chain(first, rest)
}

async fn create_watcher(
    caller: EnvdCaller,
    State(state): State<E2bState>,
    Extension(watchers): Extension<Arc<Watchers>>,
    call: Unary<pb::CreateWatcherRequest>,
) -> Response {
    let Unary { meta, msg } = call;
    let result = async {
        let user = UserContext::load(&state, &caller, meta.user.as_deref()).await?;
        let path = resolve_path(&msg.path, &user.home)?;
        // Claim the slot first, so that concurrent creations cannot pass the bounds together.
        let (id, watcher) = watchers.add(&caller.id, &caller.principal.tenant)?;
        let stream = match start_watch(&state, &caller, &user, &path, msg.recursive).await {
            Ok(stream) => stream,
            Err(e) => {
                watchers.forget(&id, &watcher);
                return Err(e);
            }
        };
        let include_entry = msg.include_entry;
        let (live_state, live_id) = (state.clone(), caller.id.clone());
        let caller = Arc::new(caller);
        let user = Arc::new(user);
        let root = Arc::new(path);
        let convert: watchers::Convert = Box::new(move |event| {
            let (state, caller, user, root) = (state.clone(), caller.clone(), user.clone(), root.clone());
            async move { filesystem_event(&state, &caller, &user, &event, (&root, &root), include_entry).await }
                .boxed()
        });
        let sandbox_live = move || {
            live_state
                .service
                .live_sandbox_principal(&live_id, crate::envd::ENVD_KEY_ID)
                .is_some()
        };
        tokio::spawn(watchers::pump(
            watchers.clone(),
            id.clone(),
            watcher,
            stream,
            convert,
            sandbox_live,
        ));
        Ok(pb::CreateWatcherResponse { watcher_id: id })
    };
    unary_response(meta.codec, result.await)
}

async fn get_watcher_events(
    caller: EnvdCaller,
    Extension(watchers): Extension<Arc<Watchers>>,
    call: Unary<pb::GetWatcherEventsRequest>,
) -> Response {
    let Unary { meta, msg } = call;
    let result = watchers
        .poll(&caller.id, &msg.watcher_id)
        .map(|events| pb::GetWatcherEventsResponse { events });
    unary_response(meta.codec, result)
}

async fn remove_watcher(
    caller: EnvdCaller,
    Extension(watchers): Extension<Arc<Watchers>>,
    call: Unary<pb::RemoveWatcherRequest>,
) -> Response {
    let Unary { meta, msg } = call;
    let result = watchers
        .remove(&caller.id, &msg.watcher_id)
        .map(|()| pb::RemoveWatcherResponse {});
    unary_response(meta.codec, result)
}

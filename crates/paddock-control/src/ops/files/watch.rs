//! Directory watches: the agent's inotify events, on a connection of their own, as API events.

use std::sync::Arc;

use paddock_protocol::FsEventKind;
use paddock_runtime::agent_client::WatchUpdate;
use paddock_types::api::{WatchEvent, WatchEventKind};
use tokio::sync::mpsc;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::live::LiveSandbox;
use crate::ops::files::file_error;
use crate::{Principal, SandboxService, ServiceError, WatchStream};

const WATCH_QUEUE: usize = 256;

fn kind(k: FsEventKind) -> WatchEventKind {
    match k {
        FsEventKind::Create => WatchEventKind::Create,
        FsEventKind::Modify => WatchEventKind::Modify,
        FsEventKind::Remove => WatchEventKind::Remove,
        FsEventKind::RenameFrom => WatchEventKind::RenameFrom,
        FsEventKind::RenameTo => WatchEventKind::RenameTo,
        FsEventKind::Attrib => WatchEventKind::Attrib,
        FsEventKind::Overflow => WatchEventKind::Overflow,
    }
}

pub(crate) async fn start_watch(
    service: &SandboxService,
    p: &Principal,
    id: &str,
    sb: &Arc<LiveSandbox>,
    path: &str,
    recursive: bool,
) -> Result<WatchStream, ServiceError> {
    let client = sb.own_connection().await?;
    let (_, mut events) = client
        .watch(path, recursive)
        .await
        .map_err(|e| file_error("watch a directory", path, e))?;
    service
        .audit(
            AuditEntry::ok(p, AuditAction::FileWatch, Some(id)).detail(audit::FilePathRecursive {
                path: path.to_owned(),
                recursive,
            }),
        )
        .await?;
    let (tx, rx) = mpsc::channel(WATCH_QUEUE);
    let root = path.to_owned();
    tokio::spawn(async move {
        // The connection lives as long as this task; dropping it ends the watch in the agent.
        let _client = client;
        loop {
            tokio::select! {
                update = events.recv() => match update {
                    Some(WatchUpdate::Events(batch)) => {
                        for event in batch {
                            let event = WatchEvent { path: event.path, kind: kind(event.kind), is_dir: event.is_dir };
                            if tx.send(event).await.is_err() {
                                return;
                            }
                        }
                    }
                    Some(WatchUpdate::Ended(_)) | None => {
                        let _ = tx
                            .send(WatchEvent { path: root.clone(), kind: WatchEventKind::Ended, is_dir: true })
                            .await;
                        return;
                    }
                },
                () = tx.closed() => return,
            }
        }
    });
    Ok(WatchStream { rx })
}

//! A sandbox's files as MCP resources, `paddock://sandbox/{sandbox_id}/file/{+path}` (the path
//! without its leading `/`, percent-encoded where it must be): read as text when UTF-8, else as a
//! base64 blob, at most [`MAX_FILE_READ`](crate::MAX_FILE_READ) bytes; subscribable, so a client hears
//! `notifications/resources/updated` when the file is written, replaced or removed (through
//! `resources/subscribe` in the `initialize`-based generation, `subscriptions/listen` in
//! 2026-07-28).
//!
//! What it does not do: list files as resources (a sandbox's tree is unbounded: the template
//! names them, `file_list` lists them), watch more than [`MAX_SUBSCRIPTIONS`] files per session,
//! or read past the cap (`file_read` reads line ranges). Each watch is the service's `watch_dir`
//! of the file's directory: it costs the sandbox one inotify instance, charged to it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use paddock_control::Principal;
use paddock_types::api::WatchEventKind;
use paddock_types::SandboxId;
use rmcp::model::{
    ErrorData, ReadResourceResult, ResourceContents, ResourceTemplate, ResourceUpdatedNotificationParam,
};
use rmcp::service::Peer;
use rmcp::RoleServer;
use tokio::task::AbortHandle;

use crate::tools::{decode, failure, Decoded};
use crate::PaddockMcp;

/// The template of every file resource.
pub const FILE_TEMPLATE: &str = "paddock://sandbox/{sandbox_id}/file/{+path}";
/// Files one session may watch at once.
pub const MAX_SUBSCRIPTIONS: usize = 32;

const PREFIX: &str = "paddock://sandbox/";

/// The template, as `resources/templates/list` gives it.
pub(crate) fn template() -> ResourceTemplate {
    ResourceTemplate::new(FILE_TEMPLATE, "sandbox-file")
        .with_title("A file of a sandbox")
        .with_description(
            "A file inside one of your sandboxes, by absolute path without its leading slash \
             (paddock://sandbox/sb-0123456789abcdef/file/home/user/app.py). Read it, or subscribe \
             to hear when it changes.",
        )
}

/// The resource URI of `path` (absolute) in sandbox `id`.
pub fn file_uri(id: &str, path: &str) -> String {
    let encoded: String = path
        .trim_start_matches('/')
        .split('/')
        .map(|segment| percent_encoding::utf8_percent_encode(segment, SEGMENT).to_string())
        .collect::<Vec<_>>()
        .join("/");
    format!("{PREFIX}{id}/file/{encoded}")
}

/// What a path segment keeps as it is: unreserved characters (RFC 3986).
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The sandbox and absolute path a file URI names.
pub fn parse_file_uri(uri: &str) -> Result<(SandboxId, String), String> {
    let invalid = |why: &str| format!("invalid_request: uri: {uri:?} {why} (expected {FILE_TEMPLATE})");
    let rest = uri
        .strip_prefix(PREFIX)
        .ok_or_else(|| invalid("is not a paddock sandbox file"))?;
    let (id, rest) = rest.split_once('/').ok_or_else(|| invalid("names no file"))?;
    let encoded = rest
        .strip_prefix("file/")
        .ok_or_else(|| invalid("names no file"))?;
    if encoded.contains(['?', '#']) {
        return Err(invalid("has a query or fragment"));
    }
    let id = id
        .parse::<SandboxId>()
        .map_err(|e| format!("invalid_request: uri: sandbox id: {e}"))?;
    let decoded = percent_encoding::percent_decode_str(encoded)
        .decode_utf8()
        .map_err(|_| invalid("is not UTF-8 once decoded"))?;
    Ok((id, format!("/{decoded}")))
}

/// A tool-style failure text as a protocol error of a resource request.
fn resource_error(text: String) -> ErrorData {
    if text.starts_with("invalid_request:") {
        ErrorData::invalid_params(text, None)
    } else if text.starts_with("file_not_found:") || text.starts_with("sandbox_not_found:") {
        ErrorData::resource_not_found(text, None)
    } else {
        ErrorData::internal_error(text, None)
    }
}

/// The file watches of one session: their tasks by URI.
#[derive(Debug, Default, Clone)]
pub(crate) struct Subscriptions(Arc<Mutex<HashMap<String, AbortHandle>>>);

impl Subscriptions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, AbortHandle>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the watch of `uri`, if there is one.
    pub(crate) fn remove(&self, uri: &str) {
        if let Some(task) = self.lock().remove(uri) {
            task.abort();
        }
    }
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        // The last handle of a session's registry: its watches end with it.
        if Arc::strong_count(&self.0) == 1 {
            for (_, task) in self.lock().drain() {
                task.abort();
            }
        }
    }
}

impl PaddockMcp {
    /// `resources/read` of a file URI.
    pub(crate) async fn read_file_resource(
        &self,
        p: &Principal,
        uri: &str,
    ) -> Result<ReadResourceResult, ErrorData> {
        let (id, path) = parse_file_uri(uri).map_err(resource_error)?;
        let (bytes, _, truncated) = self.read_capped(p, &id, &path).await.map_err(resource_error)?;
        let contents = match decode(bytes, truncated) {
            Decoded::Text(text) => ResourceContents::text(text, uri).with_mime_type("text/plain"),
            Decoded::Base64(blob) => {
                ResourceContents::blob(blob, uri).with_mime_type("application/octet-stream")
            }
        };
        Ok(ReadResourceResult::new(vec![contents]))
    }

    /// Starts watching the file `uri` names for `p`; `changed` is called (in a task of its own)
    /// each time it is written, made, replaced or removed, until it returns false, the sandbox
    /// ends, or the returned task is aborted.
    pub(crate) async fn watch_file<F, Fut>(
        &self,
        p: &Principal,
        uri: &str,
        changed: F,
    ) -> Result<tokio::task::JoinHandle<()>, ErrorData>
    where
        F: Fn(String) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = bool> + Send,
    {
        let (id, path) = parse_file_uri(uri).map_err(resource_error)?;
        let dir = match path.rsplit_once('/') {
            Some(("", _)) | None => "/".to_owned(),
            Some((dir, _)) => dir.to_owned(),
        };
        let mut watch = self
            .service
            .watch_dir(p, &id, &dir, false)
            .await
            .map_err(|e| resource_error(failure(e)))?;
        let uri = uri.to_owned();
        Ok(tokio::spawn(async move {
            while let Some(event) = watch.recv().await {
                let ours = event.path == path && !matches!(event.kind, WatchEventKind::Attrib)
                    || matches!(event.kind, WatchEventKind::Overflow | WatchEventKind::Ended);
                if ours && !changed(uri.clone()).await {
                    break;
                }
                if matches!(event.kind, WatchEventKind::Ended) {
                    break;
                }
            }
        }))
    }

    /// `resources/subscribe` (the `initialize`-based generation): a watch whose changes go to
    /// `peer` as `notifications/resources/updated`.
    pub(crate) async fn subscribe_file(
        &self,
        p: &Principal,
        uri: &str,
        peer: Peer<RoleServer>,
    ) -> Result<(), ErrorData> {
        if self.subscriptions.lock().contains_key(uri) {
            return Ok(());
        }
        if self.subscriptions.lock().len() >= MAX_SUBSCRIPTIONS {
            return Err(ErrorData::invalid_params(
                format!(
                    "quota_exceeded: a session watches at most {MAX_SUBSCRIPTIONS} files; unsubscribe one"
                ),
                None,
            ));
        }
        let task = self
            .watch_file(p, uri, move |uri| {
                let peer = peer.clone();
                async move {
                    peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                        .await
                        .is_ok()
                }
            })
            .await?;
        let previous = self
            .subscriptions
            .lock()
            .insert(uri.to_owned(), task.abort_handle());
        if let Some(previous) = previous {
            previous.abort();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_uris_round_trip_and_refuse_what_is_not_one() {
        let uri = file_uri("sb-0123456789abcdef", "/home/user/my file%.py");
        assert_eq!(
            uri,
            "paddock://sandbox/sb-0123456789abcdef/file/home/user/my%20file%25.py"
        );
        let (id, path) = parse_file_uri(&uri).expect("parses");
        assert_eq!(
            (id.as_str(), path.as_str()),
            ("sb-0123456789abcdef", "/home/user/my file%.py")
        );
        assert_eq!(
            parse_file_uri("paddock://sandbox/sb-0123456789abcdef/file/").map(|(_, p)| p),
            Ok("/".to_owned())
        );
        for bad in [
            "file:///etc/passwd",
            "paddock://sandbox/sb-0123456789abcdef",
            "paddock://sandbox/sb-0123456789abcdef/dir/x",
            "paddock://sandbox/../file/etc/passwd",
            "paddock://sandbox/sb-0123456789abcdef/file/x?y",
            "paddock://sandbox/sb-0123456789abcdef/file/%ff",
        ] {
            let e = parse_file_uri(bad).expect_err(bad);
            assert!(e.starts_with("invalid_request:"), "{bad}: {e}");
        }
    }
}

//! The tools an agent's edit-test loop needs beyond running commands: list a directory, edit a
//! file by exact string replacement, checkpoint the sandbox, roll back to it, and extend its
//! lifetime. Each a thin translation onto the service, as in `tools.rs`.
//!
//! What it does not do: edit anything but UTF-8 text, or a file over [`MAX_FILE_READ`] bytes
//! (refused, never half-written).

use paddock_types::api::{RollbackRequest, SetTimeoutRequest};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, Json, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::sandboxes::{summary, SandboxArgs, SandboxSummary};
use crate::tools::{failure, sandbox_id, wire_name, MAX_FILE_READ};
use crate::PaddockMcp;

/// The most entries `file_list` returns.
pub const MAX_LIST_ENTRIES: usize = 1000;

/// `file_list`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileListArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// Absolute path of a directory inside the sandbox.
    pub path: String,
}

/// One entry of a directory.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ListedEntry {
    /// Its name.
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Its size in bytes.
    pub size: u64,
}

/// `file_list`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Listing {
    /// The entries, by name (at most 1000).
    pub entries: Vec<ListedEntry>,
    /// Whether there were more.
    pub truncated: bool,
}

/// `file_edit`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileEditArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// Absolute path of a UTF-8 text file.
    pub path: String,
    /// The exact text to replace; it must occur exactly once in the file.
    pub old_text: String,
    /// The text to put in its place.
    pub new_text: String,
}

/// `file_edit`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Edited {
    /// The path edited.
    pub path: String,
    /// The file's size afterwards, in bytes.
    pub bytes: u64,
}

/// `checkpoint`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Checkpoint {
    /// The checkpoint's id (`rollback` returns to the newest one by default).
    pub checkpoint_id: String,
}

/// `rollback`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// The checkpoint to return to (default: the newest, which the rollback uses up).
    #[serde(default)]
    pub checkpoint_id: Option<String>,
}

/// `sandbox_extend`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// Seconds from now until it ends by itself.
    pub timeout_secs: u64,
}

/// The one place `old` occurs in `text`, replaced by `new`; why not when it occurs zero or
/// several times.
pub(crate) fn replace_once(text: &str, old: &str, new: &str) -> Result<String, String> {
    if old.is_empty() {
        return Err("invalid_request: old_text: empty".to_owned());
    }
    let mut found = text.match_indices(old);
    match (found.next(), found.next()) {
        (Some((at, _)), None) => Ok(format!("{}{new}{}", &text[..at], &text[at + old.len()..])),
        (None, _) => Err("invalid_request: old_text: not found in the file".to_owned()),
        (Some(_), Some(_)) => Err(
            "invalid_request: old_text: found more than once; include more of the surrounding text"
                .to_owned(),
        ),
    }
}

#[tool_router(router = steps_router, vis = "pub(crate)")]
impl PaddockMcp {
    #[tool(
        name = "file_list",
        description = "List a directory of a sandbox (names, kinds, sizes; at most 1000 entries).",
        annotations(read_only_hint = true, idempotent_hint = true)
    )]
    async fn file_list(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<FileListArgs>,
    ) -> Result<Json<Listing>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let list = self
            .service
            .list_dir(&p, &id, &args.path)
            .await
            .map_err(failure)?;
        let truncated = list.entries.len() > MAX_LIST_ENTRIES;
        let entries = list
            .entries
            .into_iter()
            .take(MAX_LIST_ENTRIES)
            .map(|e| ListedEntry {
                name: e.name,
                kind: wire_name(e.kind),
                size: e.size,
            })
            .collect();
        Ok(Json(Listing { entries, truncated }))
    }

    #[tool(
        name = "file_edit",
        description = "Edit a text file of a sandbox: replace old_text, which must occur exactly once, with new_text.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false)
    )]
    async fn file_edit(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<FileEditArgs>,
    ) -> Result<Json<Edited>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let (bytes, _, truncated) = self.read_capped(&p, &id, &args.path).await?;
        if truncated {
            return Err(format!(
                "invalid_request: path: {} is larger than {MAX_FILE_READ} bytes; edit it with run_command",
                args.path
            ));
        }
        let text = String::from_utf8(bytes)
            .map_err(|_| format!("invalid_request: path: {} is not UTF-8 text", args.path))?;
        let edited = replace_once(&text, &args.old_text, &args.new_text)?;
        let bytes = self
            .write_bytes(&p, &id, &args.path, edited.into_bytes(), false)
            .await?;
        Ok(Json(Edited {
            path: args.path,
            bytes,
        }))
    }

    #[tool(
        name = "checkpoint",
        description = "Save the sandbox's files now, to return to them with rollback (e.g. before a risky change).",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn checkpoint(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> Result<Json<Checkpoint>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let snapshot = self.service.checkpoint(&p, &id).await.map_err(failure)?;
        Ok(Json(Checkpoint {
            checkpoint_id: snapshot.id,
        }))
    }

    #[tool(
        name = "rollback",
        description = "Return the sandbox's files to a checkpoint (the newest by default). Its running processes restart.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false)
    )]
    async fn rollback(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<RollbackArgs>,
    ) -> Result<Json<SandboxSummary>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let request = RollbackRequest {
            snapshot: args.checkpoint_id,
        };
        let info = self.service.rollback(&p, &id, request).await.map_err(failure)?;
        Ok(Json(summary(info)))
    }

    #[tool(
        name = "sandbox_extend",
        description = "Keep a sandbox alive longer: it now ends timeout_secs from now.",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true)
    )]
    async fn sandbox_extend(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ExtendArgs>,
    ) -> Result<Json<SandboxSummary>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let request = SetTimeoutRequest {
            timeout_secs: args.timeout_secs,
        };
        let info = self
            .service
            .set_timeout(&p, &id, request)
            .await
            .map_err(failure)?;
        Ok(Json(summary(info)))
    }
}

#[cfg(test)]
mod tests {
    use super::replace_once;

    #[test]
    fn an_edit_replaces_exactly_one_occurrence() {
        assert_eq!(
            replace_once("a = 1\nb = 2\n", "b = 2", "b = 3"),
            Ok("a = 1\nb = 3\n".to_owned())
        );
        assert!(replace_once("x x", "x", "y").is_err_and(|e| e.contains("more than once")));
        assert!(replace_once("abc", "z", "y").is_err_and(|e| e.contains("not found")));
        assert!(replace_once("abc", "", "y").is_err_and(|e| e.contains("empty")));
        assert_eq!(replace_once("é1é", "1", "22"), Ok("é22é".to_owned()));
    }
}

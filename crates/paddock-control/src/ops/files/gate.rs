//! The approval policy's check of file-API changes: writes (a file written, a directory made, an
//! archive unpacked, a move's target) and deletes (a removal, a move's source), by path, before
//! anything of them happens (see `core/approvals/gate.rs`).
//!
//! What an approval of a file write names is the operation, the path and the request's options,
//! not the bytes: the body is streamed, and is not known when the approval is asked for.
//!
//! What it does not do: check reads, lists, stats or watches (a policy names changes only).

use paddock_policy::{Action, FileOp};
use paddock_types::api::ApprovalKind;
use paddock_types::SandboxId;

use crate::core::approvals::{Asked, Gated};
use crate::{Principal, SandboxService, ServiceError};

fn op_name(op: FileOp) -> &'static str {
    match op {
        FileOp::Write => "write",
        FileOp::Delete => "delete",
    }
}

impl SandboxService {
    /// Checks one file-API change of sandbox `id`: its `parts` (operation and path each; a move
    /// has two) and, for a person and the approval's hash, the whole `request`. `approval_id` is
    /// the caller's claim of an approval.
    pub(super) async fn gate_file(
        &self,
        p: &Principal,
        id: &SandboxId,
        parts: &[(FileOp, &str)],
        request: serde_json::Value,
        approval_id: Option<&str>,
    ) -> Result<Gated, ServiceError> {
        let actions: Vec<Action<'_>> = parts
            .iter()
            .map(|&(op, path)| Action::File { op, path })
            .collect();
        let asked = || Asked {
            kind: ApprovalKind::File,
            summary: parts
                .iter()
                .map(|&(op, path)| format!("{} {path}", op_name(op)))
                .collect::<Vec<_>>()
                .join(", "),
            request,
        };
        self.gate(p, Some(id.as_str()), &actions, asked, approval_id, None)
            .await
    }
}

//! The audit log's vocabulary and its one write path: [`AuditAction`] (every action a row can
//! name, with its string), the typed details of each action (`details.rs`), [`AuditEntry`] (a row
//! being built), and, inside a store transaction, [`append`] (a row) and [`record`] (a state change
//! with its row, or nothing).
//!
//! The action strings and the details' fields are part of the compatibility contract: the golden
//! list `tests/golden/audit_actions.txt` is generated from them and checked by a test here
//! (`UPDATE_GOLDEN=1` rewrites it). Which state changes are allowed is not decided here but in
//! `lifecycle/states.rs`, whose table builds every [`StateChange`].

mod details;
#[cfg(test)]
mod golden;
pub(crate) mod ports;

use paddock_store::{NewAuditEntry, SandboxState, StoreError, StoreTx};
use serde::Serialize;

pub(crate) use self::details::*;
use crate::core::time::now_ms;
use crate::Principal;

/// Declares [`AuditAction`]: each variant with its string, in the order of the golden list.
macro_rules! actions {
    ($($variant:ident => $text:literal,)*) => {
        /// Every action an audit row can name. The strings are a contract (see the module's doc).
        #[cfg_attr(not(test), expect(dead_code, reason = "`audit.prune` is written by the store"))]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub(crate) enum AuditAction {
            $($variant,)*
        }

        impl AuditAction {
            /// Every action, in the order of the golden list.
            #[cfg(test)]
            pub(crate) const ALL: &'static [AuditAction] = &[$(AuditAction::$variant,)*];

            /// The action as rows store it (`sandbox.create`, ...).
            pub(crate) const fn as_str(self) -> &'static str {
                match self {
                    $(AuditAction::$variant => $text,)*
                }
            }
        }
    };
}

actions! {
    ApprovalApprove => "approval.approve",
    ApprovalExpire => "approval.expire",
    ApprovalReject => "approval.reject",
    ApprovalRequest => "approval.request",
    ApprovalWebhook => "approval.webhook",
    AuditPrune => "audit.prune",
    AuthFailed => "auth.failed",
    CodeContext => "code.context",
    CodeRun => "code.run",
    ExecutionCancel => "execution.cancel",
    ExecutionFinish => "execution.finish",
    ExecutionRequest => "execution.request",
    ExecutionStart => "execution.start",
    FileList => "file.list",
    FileMkdir => "file.mkdir",
    FileRead => "file.read",
    FileRemove => "file.remove",
    FileRename => "file.rename",
    FileTarDownload => "file.tar_download",
    FileTarUpload => "file.tar_upload",
    FileWatch => "file.watch",
    FileWrite => "file.write",
    KeyCreate => "key.create",
    KeyRevoke => "key.revoke",
    McpCall => "mcp.call",
    NetworkConnection => "network.connection",
    NetworkDns => "network.dns",
    NetworkPolicy => "network.policy",
    NetworkRefused => "network.refused",
    NetworkSuppressed => "network.suppressed",
    PolicyDelete => "policy.delete",
    PolicyDeny => "policy.deny",
    PolicySet => "policy.set",
    ProcessAttach => "process.attach",
    ProcessDiff => "process.diff",
    ProcessExit => "process.exit",
    ProcessKill => "process.kill",
    ProcessSignal => "process.signal",
    ProcessStart => "process.start",
    SandboxAdopt => "sandbox.adopt",
    SandboxCheckpoint => "sandbox.checkpoint",
    SandboxCommit => "sandbox.commit",
    SandboxCreate => "sandbox.create",
    SandboxDiff => "sandbox.diff",
    SandboxExpire => "sandbox.expire",
    SandboxFork => "sandbox.fork",
    SandboxKill => "sandbox.kill",
    SandboxLost => "sandbox.lost",
    SandboxPause => "sandbox.pause",
    SandboxPortConnect => "sandbox.port_connect",
    SandboxResume => "sandbox.resume",
    SandboxRollback => "sandbox.rollback",
    SandboxStop => "sandbox.stop",
    SandboxTimeout => "sandbox.timeout",
    SecretCreate => "secret.create",
    SecretDelete => "secret.delete",
    SnapshotConsume => "snapshot.consume",
    SnapshotCreate => "snapshot.create",
    SnapshotDelete => "snapshot.delete",
    SnapshotExport => "snapshot.export",
    SnapshotImport => "snapshot.import",
    TemplateBuild => "template.build",
    TemplateDelete => "template.delete",
    TenantQuota => "tenant.quota",
    VolumeCreate => "volume.create",
    VolumeDelete => "volume.delete",
}

impl AuditAction {
    /// The detail shapes rows of this action carry (see `details.rs`).
    #[cfg(test)]
    pub(crate) fn details(self) -> impl Iterator<Item = &'static DetailShape> {
        SHAPES.iter().copied().filter(move |s| s.actions.contains(&self))
    }

    /// Its area with the dot (`process.` for `process.exit`): the prefix that selects every action
    /// of the area when reading rows back.
    pub(crate) fn area(self) -> &'static str {
        let s = self.as_str();
        s.find('.').map_or(s, |dot| &s[..=dot])
    }

    /// Whether `row` (read back from the store) is a row of this action.
    pub(crate) fn is(self, row_action: &str) -> bool {
        row_action == self.as_str()
    }
}

impl PartialEq<&str> for AuditAction {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::fmt::Display for AuditAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One audit row being written: who, what, on which sandbox, how it ended, and details.
#[derive(Debug)]
pub(crate) struct AuditEntry<'a> {
    pub(crate) principal: Option<&'a Principal>,
    pub(crate) tenant: Option<String>,
    pub(crate) action: AuditAction,
    pub(crate) sandbox: Option<&'a str>,
    pub(crate) outcome: String,
    /// `None`: the empty detail `{}` (an action whose rows may carry none: see [`Empty`]).
    detail: Option<serde_json::Value>,
}

impl<'a> AuditEntry<'a> {
    /// A successful action by `p`.
    pub(crate) fn ok(p: &'a Principal, action: AuditAction, sandbox: Option<&'a str>) -> Self {
        Self {
            principal: Some(p),
            tenant: None,
            action,
            sandbox,
            outcome: "ok".into(),
            detail: None,
        }
    }

    /// An action taken by paddock itself (reaper, recovery, pools) for `tenant`.
    pub(crate) fn system(action: AuditAction, tenant: Option<String>, sandbox: Option<&'a str>) -> Self {
        Self {
            principal: None,
            tenant,
            action,
            sandbox,
            outcome: "ok".into(),
            detail: None,
        }
    }

    /// An action by `principal` if there is one, else by paddock itself; its tenant is `tenant`.
    pub(crate) fn by(
        principal: Option<&'a Principal>,
        tenant: Option<String>,
        action: AuditAction,
        sandbox: Option<&'a str>,
    ) -> Self {
        Self {
            principal,
            tenant,
            action,
            sandbox,
            outcome: "ok".into(),
            detail: None,
        }
    }

    pub(crate) fn outcome(mut self, outcome: impl Into<String>) -> Self {
        self.outcome = outcome.into();
        self
    }

    /// The row's details: one of the shapes declared for its action.
    pub(crate) fn detail<D: Detail>(mut self, detail: D) -> Self {
        debug_assert!(
            D::SHAPE.actions.contains(&self.action),
            "{} rows do not carry {} details (declare it in details.rs)",
            self.action,
            D::SHAPE.name
        );
        self.detail = Some(detail.to_value());
        self
    }

    pub(crate) fn into_row(self) -> NewAuditEntry {
        debug_assert!(
            self.detail.is_some() || Empty::SHAPE.actions.contains(&self.action),
            "{} rows need details",
            self.action
        );
        self.row()
    }

    /// The row, its details to be given inside the transaction that writes it (they name what
    /// the transaction makes, as a created key's id).
    pub(crate) fn pending(self) -> PendingRow {
        PendingRow {
            action: self.action,
            row: self.row(),
        }
    }

    fn row(self) -> NewAuditEntry {
        NewAuditEntry {
            ts_ms: now_ms(),
            tenant: self.tenant.or_else(|| self.principal.map(|p| p.tenant.clone())),
            key_id: self.principal.map(|p| p.key_id.clone()).filter(|k| !k.is_empty()),
            action: self.action.as_str().to_owned(),
            sandbox_id: self.sandbox.map(str::to_owned),
            outcome: self.outcome,
            detail: self
                .detail
                .unwrap_or_else(|| serde_json::Value::Object(Default::default())),
        }
    }
}

/// A row waiting for its details (see [`AuditEntry::pending`]).
#[derive(Debug)]
pub(crate) struct PendingRow {
    action: AuditAction,
    row: NewAuditEntry,
}

impl PendingRow {
    /// The row with its details: one of the shapes declared for its action.
    pub(crate) fn detail<D: Detail>(self, detail: D) -> NewAuditEntry {
        debug_assert!(
            D::SHAPE.actions.contains(&self.action),
            "{} rows do not carry {} details (declare it in details.rs)",
            self.action,
            D::SHAPE.name
        );
        NewAuditEntry {
            detail: detail.to_value(),
            ..self.row
        }
    }
}

/// A change of a stored sandbox's state, as `lifecycle/states.rs`'s table allows it (built only
/// there, by `Transition::change`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StateChange {
    /// From one of `from` to `to` (compare-and-set). `unpause` clears the paused flag first (a
    /// stop ends a frozen sandbox's processes too).
    State {
        from: &'static [SandboxState],
        to: SandboxState,
        unpause: bool,
    },
    /// A running sandbox's paused flag set (`true`) or cleared.
    Paused(bool),
}

/// Applies `change` to sandbox `id` inside `tx` (`reason`: an ended sandbox's end reason). Whether
/// it applied: the sandbox was in a state the change starts from.
pub(crate) fn change_state(
    tx: &StoreTx<'_>,
    change: StateChange,
    id: &str,
    reason: Option<&str>,
) -> Result<bool, StoreError> {
    match change {
        StateChange::State { from, to, unpause } => {
            if unpause {
                tx.set_sandbox_paused(id, false)?;
            }
            tx.transition_sandbox(id, from, to, now_ms(), reason)
        }
        StateChange::Paused(paused) => tx.set_sandbox_paused(id, paused),
    }
}

/// Applies `change` to sandbox `id` and, if it applied, appends `row` in the same transaction: a
/// state change is never without its row, and a row never claims a change that did not happen.
pub(crate) fn record(
    tx: &StoreTx<'_>,
    change: StateChange,
    id: &str,
    reason: Option<&str>,
    row: &NewAuditEntry,
) -> Result<bool, StoreError> {
    let changed = change_state(tx, change, id, reason)?;
    if changed {
        append(tx, row)?;
    }
    Ok(changed)
}

/// Appends `row` inside `tx`, timed when written.
pub(crate) fn append(tx: &StoreTx<'_>, row: &NewAuditEntry) -> Result<(), StoreError> {
    tx.append_audit(&row_with_time(row.clone())).map(|_| ())
}

/// Rows written inside a caller's transaction get their time when written.
fn row_with_time(mut row: NewAuditEntry) -> NewAuditEntry {
    row.ts_ms = now_ms();
    row
}

/// A detail serialized as its row stores it.
pub(crate) trait Detail: Serialize {
    /// Its name, fields and the actions whose rows carry it (the golden list).
    const SHAPE: &'static DetailShape;

    fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_else(|e| {
            tracing::error!(error = %e, "an audit detail did not serialize");
            serde_json::Value::Object(Default::default())
        })
    }
}

/// What a detail type looks like in the golden list.
#[derive(Debug)]
pub(crate) struct DetailShape {
    pub(crate) name: &'static str,
    pub(crate) actions: &'static [AuditAction],
    /// Each field's name, type and serde attributes, as declared.
    #[cfg_attr(not(test), expect(dead_code, reason = "read by the golden list's test"))]
    pub(crate) fields: &'static [(&'static str, &'static str, &'static str)],
}

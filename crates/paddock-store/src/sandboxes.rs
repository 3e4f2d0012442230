//! Sandbox records: their states, the stored row, and plain inserts.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use rusqlite::{Connection, Row};
use serde::{Deserialize, Serialize};

use crate::cached::Cached;
use crate::error::{from_i64, to_i64, violation, Violation};
use crate::{Store, StoreError, StoreTx};

/// Where a sandbox is in its life, as stored (snake_case text in the database).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Created ahead of demand, owned by no tenant, waiting in a warm pool.
    Warm,
    Creating,
    Running,
    /// Its files kept, no processes (resumable); not ended.
    Stopped,
    /// Killed on request (ended).
    Killed,
    Expired,
    Failed,
}

impl SandboxState {
    pub const ALL: [SandboxState; 7] = [
        SandboxState::Warm,
        SandboxState::Creating,
        SandboxState::Running,
        SandboxState::Stopped,
        SandboxState::Killed,
        SandboxState::Expired,
        SandboxState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Warm => "warm",
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
            SandboxState::Stopped => "stopped",
            SandboxState::Killed => "killed",
            SandboxState::Expired => "expired",
            SandboxState::Failed => "failed",
        }
    }

    /// Whether the sandbox may have processes and cgroups: warm, creating or running.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            SandboxState::Warm | SandboxState::Creating | SandboxState::Running
        )
    }

    /// Whether the sandbox has ended: killed, expired or failed (a stopped one has not: it holds its
    /// files and can resume).
    pub fn is_ended(self) -> bool {
        matches!(
            self,
            SandboxState::Killed | SandboxState::Expired | SandboxState::Failed
        )
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no [`SandboxState`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sandbox state {0:?}")]
pub struct UnknownSandboxState(pub String);

impl FromStr for SandboxState {
    type Err = UnknownSandboxState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SandboxState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownSandboxState(s.to_owned()))
    }
}

/// A stored sandbox. The store keeps `spec_json` as the caller gave it and never interprets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    /// `None` while the sandbox sits in a warm pool.
    pub tenant: Option<String>,
    pub state: SandboxState,
    pub profile: String,
    pub spec_json: String,
    pub labels: BTreeMap<String, String>,
    pub memory_bytes: u64,
    pub cpu_millis: u32,
    /// Its disk limit (0: none), charged against the tenant's storage quota.
    pub disk_bytes: u64,
    /// What it started from (the charge of its source snapshot; 0 for the template), charged too.
    pub base_bytes: u64,
    pub created_at_ms: i64,
    pub claimed_at_ms: Option<i64>,
    pub expires_at_ms: Option<i64>,
    pub ended_at_ms: Option<i64>,
    pub end_reason: Option<String>,
    /// Every process frozen (the sandbox keeps its state and resources).
    #[serde(default)]
    pub paused: bool,
}

/// A sandbox to insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSandbox {
    pub id: String,
    /// `None` for a warm-pool sandbox.
    pub tenant: Option<String>,
    pub state: SandboxState,
    pub profile: String,
    pub spec_json: String,
    pub labels: BTreeMap<String, String>,
    pub memory_bytes: u64,
    pub cpu_millis: u32,
    /// Its disk limit (0: none), charged against the tenant's storage quota.
    pub disk_bytes: u64,
    /// What it starts from (the charge of its source snapshot; 0 for the template), charged too.
    pub base_bytes: u64,
    pub created_at_ms: i64,
    pub expires_at_ms: Option<i64>,
}

pub(crate) const SANDBOX_COLUMNS: &str = "id, tenant, state, profile, spec_json, labels_json, memory_bytes, \
     cpu_millis, created_at_ms, claimed_at_ms, expires_at_ms, ended_at_ms, end_reason, paused, disk_bytes, \
     base_bytes";

impl Store {
    /// Inserts `sandbox` without any quota check (warm-pool sandboxes, recovery). A duplicate id is
    /// [`StoreError::Conflict`]; an unknown tenant is [`StoreError::UnknownTenant`].
    pub fn insert_sandbox(&self, sandbox: &NewSandbox) -> Result<(), StoreError> {
        insert_sandbox(&self.conn(), sandbox)
    }
}

impl StoreTx<'_> {
    /// [`Store::insert_sandbox`] inside this transaction.
    pub fn insert_sandbox(&self, sandbox: &NewSandbox) -> Result<(), StoreError> {
        insert_sandbox(&self.tx, sandbox)
    }
}

pub(crate) fn insert_sandbox(conn: &Connection, sandbox: &NewSandbox) -> Result<(), StoreError> {
    let labels_json = encode_labels(&sandbox.labels)?;
    let memory_bytes = to_i64("memory_bytes", sandbox.memory_bytes)?;
    let disk_bytes = to_i64("disk_bytes", sandbox.disk_bytes)?;
    let base_bytes = to_i64("base_bytes", sandbox.base_bytes)?;
    let inserted = conn.execute_cached(
        "INSERT INTO sandboxes (id, tenant, state, profile, spec_json, labels_json, memory_bytes, cpu_millis,
                                created_at_ms, expires_at_ms, disk_bytes, base_bytes)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        (
            &sandbox.id,
            &sandbox.tenant,
            sandbox.state.as_str(),
            &sandbox.profile,
            &sandbox.spec_json,
            labels_json,
            memory_bytes,
            sandbox.cpu_millis,
            sandbox.created_at_ms,
            sandbox.expires_at_ms,
            disk_bytes,
            base_bytes,
        ),
    );
    match inserted {
        Ok(_) => Ok(()),
        Err(e) => Err(match (violation(&e), &sandbox.tenant) {
            (Some(Violation::PrimaryKey), _) => StoreError::Conflict {
                what: "sandbox",
                id: sandbox.id.clone(),
            },
            (Some(Violation::ForeignKey), Some(tenant)) => StoreError::UnknownTenant {
                tenant: tenant.clone(),
            },
            _ => StoreError::write("sandbox")(e),
        }),
    }
}

pub(crate) fn encode_labels(labels: &BTreeMap<String, String>) -> Result<String, StoreError> {
    serde_json::to_string(labels).map_err(|source| StoreError::EncodeJson {
        what: "sandbox labels",
        source,
    })
}

/// A sandbox row as SQLite returns it, before the conversions that can find it corrupt.
pub(crate) struct SandboxRow {
    id: String,
    tenant: Option<String>,
    state: String,
    profile: String,
    spec_json: String,
    labels_json: String,
    memory_bytes: i64,
    cpu_millis: i64,
    created_at_ms: i64,
    claimed_at_ms: Option<i64>,
    expires_at_ms: Option<i64>,
    ended_at_ms: Option<i64>,
    end_reason: Option<String>,
    paused: bool,
    disk_bytes: i64,
    base_bytes: i64,
}

impl SandboxRow {
    /// Reads one row of [`SANDBOX_COLUMNS`].
    pub(crate) fn read(row: &Row<'_>) -> rusqlite::Result<SandboxRow> {
        Ok(SandboxRow {
            id: row.get(0)?,
            tenant: row.get(1)?,
            state: row.get(2)?,
            profile: row.get(3)?,
            spec_json: row.get(4)?,
            labels_json: row.get(5)?,
            memory_bytes: row.get(6)?,
            cpu_millis: row.get(7)?,
            created_at_ms: row.get(8)?,
            claimed_at_ms: row.get(9)?,
            expires_at_ms: row.get(10)?,
            ended_at_ms: row.get(11)?,
            end_reason: row.get(12)?,
            paused: row.get(13)?,
            disk_bytes: row.get(14)?,
            base_bytes: row.get(15)?,
        })
    }

    pub(crate) fn into_record(self) -> Result<SandboxRecord, StoreError> {
        let state = self
            .state
            .parse()
            .map_err(|e: UnknownSandboxState| StoreError::Corrupt {
                what: "sandbox state",
                detail: format!("sandbox {}: {e}", self.id),
            })?;
        let labels = serde_json::from_str(&self.labels_json).map_err(|e| StoreError::Corrupt {
            what: "sandbox labels",
            detail: format!("sandbox {}: {e}", self.id),
        })?;
        Ok(SandboxRecord {
            state,
            labels,
            memory_bytes: from_i64("sandbox memory_bytes", self.memory_bytes)?,
            cpu_millis: from_i64("sandbox cpu_millis", self.cpu_millis)?,
            disk_bytes: from_i64("sandbox disk_bytes", self.disk_bytes)?,
            base_bytes: from_i64("sandbox base_bytes", self.base_bytes)?,
            id: self.id,
            tenant: self.tenant,
            profile: self.profile,
            spec_json: self.spec_json,
            created_at_ms: self.created_at_ms,
            claimed_at_ms: self.claimed_at_ms,
            expires_at_ms: self.expires_at_ms,
            ended_at_ms: self.ended_at_ms,
            end_reason: self.end_reason,
            paused: self.paused,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_text_and_serde() {
        for state in SandboxState::ALL {
            assert_eq!(state.as_str().parse::<SandboxState>(), Ok(state));
            let json = serde_json::to_string(&state).expect("state serializes");
            assert_eq!(json, format!("\"{}\"", state.as_str()));
        }
        assert!("Running".parse::<SandboxState>().is_err());
        assert!("".parse::<SandboxState>().is_err());
    }

    #[test]
    fn live_states_are_warm_creating_running() {
        let live: Vec<_> = SandboxState::ALL.into_iter().filter(|s| s.is_live()).collect();
        assert_eq!(
            live,
            [SandboxState::Warm, SandboxState::Creating, SandboxState::Running]
        );
    }
}

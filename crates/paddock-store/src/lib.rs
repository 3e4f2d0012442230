//! The control plane's embedded state: one SQLite database (WAL) holding tenants and their quotas, API
//! keys, sandbox records, snapshot and volume records, approval policies and the append-only, hash-chained audit log.
//!
//! This crate is the only place in paddock that speaks SQL: its API is everything the control plane gets,
//! and no `rusqlite` type appears in it. Every call is synchronous and short; async callers wrap it in
//! `spawn_blocking` or `block_in_place`. Times are `i64` unix milliseconds supplied by the caller.
//!
//! What it guarantees:
//! - the schema is created and upgraded by embedded, forward-only migrations; a database from a newer
//!   paddock is refused rather than misread;
//! - quota checks and the insert (sandbox, warm claim, resume, snapshot, volume) they guard are one
//!   `BEGIN IMMEDIATE` transaction, so concurrent writes, even from several processes, can never
//!   overshoot a quota;
//! - API key secrets are never stored, only their SHA-256, compared in constant time;
//! - audit rows are only ever appended (SQL triggers refuse UPDATE and DELETE), each carrying the hash of
//!   its predecessor, and [`Store::verify_audit`] finds the first altered, inserted or removed row (all
//!   but the removal of the newest rows, which only a copy of the latest hash kept elsewhere can show).
//!   The one exception is retention of the egress proxy's `network.*` rows
//!   ([`Store::prune_network_audit`]): removed runs are recorded, with the hashes that bridge them, by an
//!   `audit.prune` row in the chain, and verification crosses them only through that record;
//! - [`Store::transaction`] writes a state change and its audit row atomically.
//!
//! What it does not do: no HTTP, no sandbox lifecycle (it records states, it does not start or stop
//! anything), no interpretation of a sandbox's spec (stored as the caller's JSON), no clock of its own,
//! and no authorization decisions beyond "this key text is valid".

mod approvals;
mod audit;
mod audit_hash;
mod audit_prune;
mod cached;
mod error;
mod executions;
mod inspect;
mod intents;
mod keys;
mod list;
mod migrate;
mod network;
mod open;
mod policies;
mod quota;
mod sandboxes;
mod shm;
mod snapshots;
mod templates;
mod tenants;
mod transition;
mod verify;
mod volumes;

pub use approvals::{ApprovalDecision, ApprovalRecord, ApprovalUse};
pub use audit::{AuditFilter, AuditRecord, NewAuditEntry};
pub use audit_hash::{audit_hash, AuditFields, GENESIS_HASH};
pub use audit_prune::{pruned_ranges_digest, NetworkRetention, PruneReport, PrunedRange, PRUNE_ACTION};
pub use error::{DbError, StoreError};
pub use executions::{ExecutionChange, ExecutionRecord};
pub use intents::{IntentOp, IntentRecord, NewIntent};
pub use keys::{e2b_spelling, ApiKeyRecord, KeyPermissions};
pub use list::SandboxFilter;
pub use migrate::SCHEMA_VERSION;
pub use network::{SandboxNetworkRecord, SecretInfo, SecretRecord};
pub use open::{SpaceStatus, Store, StoreTx};
pub use policies::ApprovalPolicyRecord;
pub use quota::{first_exceeded, Claim, QuotaRequest};
pub use sandboxes::{NewSandbox, SandboxRecord, SandboxState, UnknownSandboxState};
pub use shm::SHM_DIRECTORY;
pub use snapshots::{NewSnapshot, SnapshotFilter, SnapshotKind, SnapshotRecord};
pub use templates::{NewTemplate, TemplateDeletion, TemplateRecord};
pub use tenants::{QuotaDefaults, TenantQuota, TenantRecord, TenantUsage};
pub use verify::{AuditVerification, BrokenRow};
pub use volumes::{NewVolume, VolumeFilter, VolumeMountRecord, VolumeRecord};

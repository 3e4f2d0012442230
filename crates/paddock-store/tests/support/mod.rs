//! What the store's integration tests share: temporary databases and sample rows.

#![expect(dead_code, reason = "each test binary uses a different part of this module")]

use std::collections::BTreeMap;
use std::path::PathBuf;

use paddock_store::{NewSandbox, SandboxState, Store};

/// A temporary directory holding `state.db`, removed when dropped.
pub struct TempDb {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl TempDb {
    pub fn new() -> TempDb {
        let dir = tempfile::tempdir().expect("create temporary directory");
        let path = dir.path().join("state.db");
        TempDb { dir, path }
    }

    pub fn open(&self) -> Store {
        Store::open(&self.path).expect("open store")
    }

    /// A raw connection to the same file, for tests that play the attacker.
    pub fn raw(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(&self.path).expect("open raw connection")
    }
}

pub fn new_sandbox(id: &str, tenant: Option<&str>, state: SandboxState) -> NewSandbox {
    NewSandbox {
        id: id.to_owned(),
        tenant: tenant.map(str::to_owned),
        state,
        profile: "default".to_owned(),
        spec_json: r#"{"image":"base"}"#.to_owned(),
        labels: BTreeMap::new(),
        memory_bytes: 256 << 20,
        cpu_millis: 500,
        disk_bytes: 1 << 30,
        base_bytes: 0,
        created_at_ms: 1_000,
        expires_at_ms: None,
    }
}

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

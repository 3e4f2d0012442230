//! The REST API in-process against a real service (native backend, SQLite store, axum on a loopback
//! port: `support/harness.rs`), by area. Each test has its own service, state directory and cgroup
//! parent; teardown kills every sandbox and checks nothing was left behind. Below the modules: the
//! constants and archives the areas share.

mod approval_policies;
mod archives;
mod audit;
mod code;
mod exec;
mod files;
mod lifecycle;
mod limits;
mod listener;
mod network_keys;
mod path_attacks;
mod quotas;
mod snapshots;
mod stop;
mod templates;
mod tenancy;
mod terminal;
mod volumes;
mod warm_pool;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An id no sandbox has.
const NO_SUCH_SANDBOX: &str = "sb-0000000000000000";
const NDJSON: &str = "application/x-ndjson";
const SSE: &str = "text/event-stream";
const JSON: &str = "application/json";

/// Generous bound for anything that should happen "soon".
const SOON: Duration = Duration::from_secs(20);

/// A string no other run of this test produces.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_nanos();
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

/// A tar archive of regular files.
fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, *data).expect("tar member");
    }
    b.into_inner().expect("tar")
}

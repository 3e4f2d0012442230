//! What must hold after a crash and a restart, whatever the crash interrupted: the checks shared by
//! the crash-point test and the randomized kill test.
//!
//! Every sandbox the store says is live has exactly its run directory, subvolume, cgroups and
//! processes, and nothing else has any; kept (stopped) file systems are exactly the stopped
//! sandboxes'; snapshot storage is exactly the existing snapshot records'; no intent is left; the
//! audit chain verifies; and every process that ran has its start row.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

use super::host::*;
use super::server::*;
use super::TestEnv;

fn names(dir: &std::path::Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn strings(rows: Vec<Vec<Value>>) -> BTreeSet<String> {
    rows.into_iter()
        .filter_map(|r| r.first().and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// Asserts everything this module's docs list, on a server that has finished recovering and has
/// nothing in flight.
pub async fn assert_consistent(env: &TestEnv, api: &Api, admin: &str) {
    let creating = store_ids(env, &["creating"]);
    assert!(creating.is_empty(), "sandboxes left `creating`: {creating:?}");
    let live = store_ids(env, &["running", "warm"]);
    // A run directory being created is staged as `.new-<id>` (gc removes a crash's after a grace
    // period): only real names are sandboxes.
    let runs: BTreeSet<String> = run_dirs(env)
        .into_iter()
        .filter(|n| !n.starts_with(".new-"))
        .collect();
    assert_eq!(runs, live, "run directories vs the store's live sandboxes");
    assert_eq!(subvolumes(env), live, "subvolumes vs the store's live sandboxes");
    let staged = names(&env.state().join("pool/incoming"));
    assert!(staged.is_empty(), "volumes left half-made: {staged:?}");
    assert_eq!(
        names(&env.state().join("pool/stopped")),
        store_ids(env, &["stopped"]),
        "kept file systems vs the store's stopped sandboxes"
    );
    assert_cgroups_are(env, &live);
    let mut strays = Default::default();
    let clean = wait_for(Duration::from_secs(20), async || {
        let mut found = sandbox_processes(env);
        found.retain(|id, _| !live.contains(id));
        strays = found;
        strays.is_empty()
    })
    .await;
    assert!(clean, "processes of sandboxes that are not live: {strays:?}");
    let with_processes: BTreeSet<String> = sandbox_processes(env).into_keys().collect();
    assert_eq!(with_processes, live, "sandboxes with processes vs live ones");
    // Snapshot storage is freed off the request path: give it a moment.
    let recorded = strings(store_query(
        env,
        "SELECT id FROM snapshots WHERE deleted_at_ms IS NULL",
    ));
    let mut on_disk = BTreeSet::new();
    let settled = wait_for(Duration::from_secs(20), async || {
        on_disk = names(&env.state().join("pool/snapshots"));
        on_disk == recorded
    })
    .await;
    assert!(settled, "snapshot storage {on_disk:?} vs records {recorded:?}");
    // Checkpoints do not outlive their sandbox.
    let orphans = store_query(
        env,
        "SELECT id FROM snapshots WHERE kind = 'checkpoint' AND deleted_at_ms IS NULL AND sandbox_id NOT IN \
         (SELECT id FROM sandboxes WHERE state IN ('warm', 'creating', 'running', 'stopped'))",
    );
    assert!(orphans.is_empty(), "checkpoints of ended sandboxes: {orphans:?}");
    let intents = store_query(env, "SELECT id, sandbox_id, op FROM intents");
    assert!(intents.is_empty(), "intents left after recovery: {intents:?}");
    let verified = api.verify_audit(admin).await;
    assert_eq!(verified["ok"], true, "audit verification: {verified}");
    assert_every_exit_has_a_start(api, admin).await;
}

/// Every `process.exit` row names (by `exec_id`) an earlier `process.start` row of the same sandbox.
pub async fn assert_every_exit_has_a_start(api: &Api, admin: &str) {
    let rows = api.audit_rows(admin, "action=process.").await;
    let mut started = BTreeSet::new();
    for row in &rows {
        let exec_id = row["detail"]["exec_id"].as_str();
        match row["action"].as_str() {
            Some("process.start") => {
                let exec_id = exec_id.unwrap_or_else(|| panic!("a start row without exec_id: {row}"));
                started.insert((row["sandbox_id"].to_string(), exec_id.to_owned()));
            }
            Some("process.exit") => {
                let key = exec_id.map(|e| (row["sandbox_id"].to_string(), e.to_owned()));
                assert!(
                    key.is_some_and(|k| started.contains(&k)),
                    "an exit without a start row: {row}"
                );
            }
            _ => {}
        }
    }
}

//! What a test environment's sandboxes hold, seen from the host: the store's records (read through
//! the store crate), run directories, subvolumes, cgroups and processes, a server's descriptors and
//! threads, mounts; and the CLI's `audit verify` and `gc` on the state directory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::TestEnv;

/// A sandbox as the store records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSandbox {
    pub id: String,
    pub state: String,
    pub tenant: Option<String>,
    pub end_reason: Option<String>,
}

/// Rows of a read-only query on the store, each row a list of JSON values. Read through the store
/// crate opened read-only (no SQL outside it is run by paddock's code; an outside SQLite cannot read a
/// database paddock has open, see `paddock_store::SHM_DIRECTORY`).
pub fn store_query(env: &TestEnv, sql: &str) -> Vec<Vec<Value>> {
    let db = env.state().join("paddock.db");
    let store = paddock_store::Store::open_read_only(&db).expect("open the store read-only");
    store
        .inspect(sql)
        .unwrap_or_else(|e| panic!("query {sql:?} failed: {e:#}"))
}

/// Every sandbox the store records.
pub fn store_sandboxes(env: &TestEnv) -> Vec<StoredSandbox> {
    let text = |v: &Value| v.as_str().map(str::to_owned);
    store_query(
        env,
        "SELECT id, state, tenant, end_reason FROM sandboxes ORDER BY created_at_ms",
    )
    .into_iter()
    .map(|row| StoredSandbox {
        id: text(&row[0]).expect("id"),
        state: text(&row[1]).expect("state"),
        tenant: text(&row[2]),
        end_reason: text(&row[3]),
    })
    .collect()
}

/// Ids of the store's sandboxes in one of `states`.
pub fn store_ids(env: &TestEnv, states: &[&str]) -> BTreeSet<String> {
    store_sandboxes(env)
        .into_iter()
        .filter(|s| states.contains(&s.state.as_str()))
        .map(|s| s.id)
        .collect()
}

fn dir_names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Entries of `<state>/run`.
pub fn run_dirs(env: &TestEnv) -> BTreeSet<String> {
    dir_names(&env.state().join("run"))
}

/// Entries of `<state>/pool/sandboxes` (one per sandbox: the directory holding its volume).
pub fn subvolumes(env: &TestEnv) -> BTreeSet<String> {
    dir_names(&env.state().join("pool/sandboxes"))
}

/// Where sandbox `id`'s volume (its writable subvolume) is, in the pool mounted at `pool`.
pub fn volume_in(pool: &Path, id: &str) -> PathBuf {
    pool.join("sandboxes").join(id).join("volume")
}

/// Where sandbox `id`'s volume is, in the environment's pool.
pub fn volume_of(env: &TestEnv, id: &str) -> PathBuf {
    volume_in(&env.state().join("pool"), id)
}

/// The sandbox cgroups under the environment's parent, per mounted hierarchy that has the parent.
pub fn cgroups(env: &TestEnv) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") else {
        return out;
    };
    let mut roots: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    roots.push("/sys/fs/cgroup".into());
    for root in roots {
        let parent = root.join(&env.cgroup_parent);
        if !parent.is_dir() {
            continue;
        }
        let ids = std::fs::read_dir(&parent)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().is_dir())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        out.insert(root.display().to_string(), ids);
    }
    out
}

/// Asserts every hierarchy holds exactly the cgroups of `ids`.
#[track_caller]
pub fn assert_cgroups_are(env: &TestEnv, ids: &BTreeSet<String>) {
    let all = cgroups(env);
    assert!(
        !all.is_empty() || ids.is_empty(),
        "no cgroup hierarchy has the parent"
    );
    for (hierarchy, have) in all {
        assert_eq!(&have, ids, "cgroups under {hierarchy}/{}", env.cgroup_parent);
    }
}

/// Sandbox ids of the environment's host processes (from their cgroup paths), with (pid, cmdline).
/// Zombies are left out: they hold nothing but a pid, and the host's init reaps them late.
pub fn sandbox_processes(env: &TestEnv) -> BTreeMap<String, Vec<(i32, String)>> {
    let marker = format!("/{}/", env.cgroup_parent);
    let mut out: BTreeMap<String, Vec<(i32, String)>> = BTreeMap::new();
    for (pid, cmdline) in env.processes() {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if zombie {
            continue;
        }
        let Ok(cg) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        let id = cg.lines().find_map(|l| {
            let (_, after) = l.split_once(&marker)?;
            Some(after.split('/').next().unwrap_or(after).to_owned())
        });
        if let Some(id) = id {
            out.entry(id).or_default().push((pid, cmdline));
        }
    }
    out
}

/// Open file descriptors of process `pid`.
pub fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/<pid>/fd")
        .count()
}

/// The server's open file descriptors by kind (`socket`, `anon_inode:[pidfd]`, a path ...), to show
/// what leaked.
pub fn fd_kinds(pid: i32) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in rd.flatten() {
            let target = std::fs::read_link(e.path())
                .map(|t| t.display().to_string())
                .unwrap_or_default();
            let kind = match target.split_once(':') {
                Some((k, _)) if !target.starts_with('/') && k != "anon_inode" => k.to_owned(),
                _ => target,
            };
            *kinds.entry(kind).or_default() += 1;
        }
    }
    kinds
}

/// Threads of process `pid`.
pub fn threads(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("/proc/<pid>/task")
        .count()
}

/// Lines of this process's mount table that mention the state directory.
pub fn state_mounts(env: &TestEnv) -> Vec<String> {
    let state = env.state().to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&state))
        .map(str::to_owned)
        .collect()
}

/// `paddock audit verify` on the state directory: exits 0 and says the log is intact.
#[track_caller]
pub fn cli_audit_verify(env: &TestEnv) -> String {
    let o = env
        .cmd()
        .args(["audit", "verify"])
        .output()
        .expect("paddock runs");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "paddock audit verify: {:?}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.starts_with("audit log intact: "), "{out}");
    out
}

/// `paddock gc` on the state directory (after the server stopped): reclaims what no process owns.
#[track_caller]
pub fn cli_gc(env: &TestEnv) -> String {
    let o = env.cmd().arg("gc").output().expect("paddock runs");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "paddock gc: {:?}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

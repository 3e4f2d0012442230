//! Restarts: a service "killed" (its runtime dropped, as `kill -9` would end its tasks) and a new
//! one started on the same fake backend (`FakeBackend::restart`). With the same store, it adopts
//! the live sandboxes in their state and follows their processes; with a new store, it collects
//! what nothing records.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use paddock_runtime::fake::FakeBackend;
use paddock_runtime::SandboxBackend;
use paddock_store::Store;
use paddock_types::api::{AuditQuery, KillRequest, SandboxStateBody};
use paddock_types::{Limits, RootfsSpec, SandboxId, SandboxSpec, UserSpec, VolumeSource};
use serde_json::json;

use crate::fixture::{body, poll, test_config, Fixture};

/// Where `paddock-store` keeps every database's wal-index (its `shm.rs`).
const SHM_DIRECTORY: &str = "/dev/shm/paddock-sqlite";

/// A database file the two services can share, when this user may open one: `Store::open` keeps
/// its wal-index in [`SHM_DIRECTORY`], which must be this user's own (a test must not create it as
/// another user than the one paddock runs as, or root's paddock would refuse it afterwards).
/// `None` (with a loud reason) otherwise: `Store::open_in_memory` cannot outlive its service.
pub(crate) fn shared_database(dir: &Path) -> Option<PathBuf> {
    let euid = rustix::process::geteuid().as_raw();
    match std::fs::metadata(SHM_DIRECTORY) {
        Ok(meta) if meta.uid() == euid => Some(dir.join("paddock.db")),
        Err(_) if euid == 0 => Some(dir.join("paddock.db")),
        found => {
            eprintln!(
                "SKIPPED: a restart with the same store needs a database file, whose wal-index lives in \
                 {SHM_DIRECTORY}; that directory is {} for uid {euid}",
                match found {
                    Ok(meta) => format!("owned by uid {}", meta.uid()),
                    Err(_) => "missing, and creating it is root's (paddock's) to do".into(),
                }
            );
            None
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// What the first service left behind.
struct Before {
    running: SandboxId,
    follower: u32,
    ending: u32,
    paused: SandboxId,
    stopped: SandboxId,
    unrecorded: String,
}

#[test]
fn a_restarted_service_adopts_sandboxes_in_their_state_and_follows_their_processes() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let Some(database) = shared_database(dir.path()) else {
        return;
    };
    let backend = FakeBackend::new().expect("the fake backend");
    let first = runtime();
    let before = first.block_on(async {
        let store = Store::open(&database).expect("the store");
        let f = Fixture::on(backend.clone(), store, test_config()).await;
        let running = f.create(&f.a, json!({})).await.id;
        f.sh(&f.a, &running, "echo kept > /home/user/f").await;
        let follower = f
            .service
            .exec(
                &f.a,
                &running,
                body(json!({"argv": ["sleep", "1000"], "background": true})),
            )
            .await
            .expect("exec")
            .pid();
        let ending = f
            .service
            .exec(
                &f.a,
                &running,
                body(json!({"shell": "sleep 0.2; exit 4", "background": true})),
            )
            .await
            .expect("exec")
            .pid();
        let paused = f.create(&f.a, json!({})).await.id;
        f.service.pause_sandbox(&f.a, &paused).await.expect("pause");
        let stopped = f.create(&f.a, json!({})).await.id;
        f.sh(&f.a, &stopped, "echo stopped > /home/user/s").await;
        f.service.stop_sandbox(&f.a, &stopped).await.expect("stop");
        // A sandbox the backend runs that no record knows (a crash between boot and record).
        let unrecorded = "sb-00000000000000aa".to_owned();
        let spec = SandboxSpec {
            id: unrecorded.parse().expect("id"),
            limits: Limits::default(),
            rootfs: RootfsSpec::Host,
            mounts: Vec::new(),
            workdir: None,
            user: UserSpec::default_user(),
            env: Vec::new(),
            volume: VolumeSource::Template,
            volumes: Vec::new(),
            network: None,
        };
        let b = backend.clone();
        tokio::task::spawn_blocking(move || b.create_sandbox(&spec).map(drop))
            .await
            .expect("joined")
            .expect("created behind the service's back");
        Before {
            running,
            follower,
            ending,
            paused,
            stopped,
            unrecorded,
        }
    });
    // The "kill -9": every task of the first service ends, no destructor of the service runs first.
    first.shutdown_timeout(Duration::from_secs(5));
    let restarted = backend.restart();
    let second = runtime();
    second.block_on(async {
        let store = Store::open(&database).expect("the store again");
        let f = Fixture::on(restarted, store, test_config()).await;
        let info = f.service.get_sandbox(&f.a, &before.running).await.expect("get");
        assert_eq!(info.state, SandboxStateBody::Running);
        assert_eq!(f.sh(&f.a, &before.running, "cat /home/user/f").await, "kept\n");
        let processes = f
            .service
            .list_processes(&f.a, &before.running)
            .await
            .expect("processes");
        assert!(
            processes
                .processes
                .iter()
                .any(|p| p.pid == before.follower && p.running),
            "the process kept running: {processes:?}"
        );
        // The process that ended while no server watched gets its exit row, once, tied to its start.
        let ended = poll("the exit row of the process that ended meanwhile", || async {
            f.rows("process.exit")
                .await
                .into_iter()
                .find(|r| r.detail["pid"] == before.ending)
        })
        .await;
        assert_eq!(ended.detail["exit_code"], 4);
        assert!(ended.detail["exec_id"].is_string(), "{ended:?}");
        // The followed one's exit is recorded by the new server.
        f.service
            .kill_process(
                &f.a,
                &before.running,
                before.follower,
                KillRequest { signal: None },
            )
            .await
            .expect("kill");
        let killed = poll("the followed process's exit row", || async {
            f.rows("process.exit")
                .await
                .into_iter()
                .find(|r| r.detail["pid"] == before.follower)
        })
        .await;
        assert_eq!(killed.detail["signal"], 9);
        let exits = f.rows("process.exit").await;
        assert_eq!(
            exits.iter().filter(|r| r.detail["pid"] == before.ending).count(),
            1
        );

        // The paused one is still paused (frozen again after the connection was made), the
        // stopped one still stopped, and both come back.
        let paused = f.service.get_sandbox(&f.a, &before.paused).await.expect("get");
        assert!(
            paused.paused && paused.state == SandboxStateBody::Running,
            "{paused:?}"
        );
        assert_eq!(
            f.backend.is_paused(&before.paused.parse().expect("id")),
            Some(true)
        );
        f.service
            .resume_sandbox(&f.a, &before.paused)
            .await
            .expect("resume");
        f.sh(&f.a, &before.paused, "true").await;
        let stopped = f.service.get_sandbox(&f.a, &before.stopped).await.expect("get");
        assert_eq!(stopped.state, SandboxStateBody::Stopped);
        f.service
            .resume_sandbox(&f.a, &before.stopped)
            .await
            .expect("resume");
        assert_eq!(f.sh(&f.a, &before.stopped, "cat /home/user/s").await, "stopped\n");
        // What no record knows was collected.
        assert!(!f
            .backend
            .sandbox_ids()
            .iter()
            .any(|id| id.as_str() == before.unrecorded));
        let adopted: Vec<String> = f
            .rows("sandbox.adopt")
            .await
            .into_iter()
            .filter_map(|r| r.sandbox_id)
            .collect();
        let mut expected = vec![before.running.clone(), before.paused.clone()];
        expected.sort();
        let mut adopted_sorted = adopted.clone();
        adopted_sorted.sort();
        assert_eq!(adopted_sorted, expected);
        let adopt = &f.rows("sandbox.adopt").await[0];
        assert_eq!(
            (adopt.key_id.as_deref(), adopt.tenant.as_deref()),
            (None, Some("tenant-a"))
        );
        f.finish().await;
    });
}

#[test]
fn a_service_on_a_new_store_collects_the_sandboxes_nothing_records() {
    let backend = FakeBackend::new().expect("the fake backend");
    let first = runtime();
    let id = first.block_on(async {
        let f = Fixture::on(
            backend.clone(),
            Store::open_in_memory().expect("store"),
            test_config(),
        )
        .await;
        let id = f.create(&f.a, json!({})).await.id;
        f.sh(&f.a, &id, "true").await;
        id
    });
    first.shutdown_timeout(Duration::from_secs(5));
    assert_eq!(backend.stats().live, 1, "the sandbox survived its server");
    let restarted = backend.restart();
    let second = runtime();
    second.block_on(async {
        let f = Fixture::on(restarted, Store::open_in_memory().expect("store"), test_config()).await;
        // Recovery finished (the fixture waits for it), so garbage collection has run.
        assert_eq!(f.backend.stats().live, 0);
        assert!(f.backend.stats().ended >= 1);
        assert_eq!(
            crate::fixture::code(f.service.get_sandbox(&f.a, &id).await),
            paddock_types::api::ErrorCode::SandboxNotFound
        );
        assert!(f
            .audit(AuditQuery::default())
            .await
            .iter()
            .all(|r| r.sandbox_id.is_none()));
        f.finish().await;
    });
}

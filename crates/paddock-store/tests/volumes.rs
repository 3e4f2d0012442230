//! Volume records, their names, and which live sandboxes mount them.

mod support;

use paddock_store::{
    NewVolume, QuotaDefaults, SandboxState, Store, StoreError, VolumeFilter, VolumeMountRecord,
};
use support::{labels, new_sandbox};

fn store() -> Store {
    let store = Store::open_in_memory().expect("open");
    store.ensure_tenant("acme", 0).expect("tenant");
    store.ensure_tenant("beta", 0).expect("tenant");
    store
}

fn vol(id: &str, tenant: &str, name: &str) -> NewVolume {
    NewVolume {
        id: id.to_owned(),
        tenant: tenant.to_owned(),
        name: name.to_owned(),
        labels: labels(&[("k", id)]),
        size_bytes: Some(1 << 30),
        created_at_ms: 10,
    }
}

fn mount(sandbox: &str, volume: &str, path: &str) -> VolumeMountRecord {
    VolumeMountRecord {
        sandbox_id: sandbox.to_owned(),
        volume_id: volume.to_owned(),
        path: path.to_owned(),
        read_only: path.ends_with("ro"),
    }
}

#[test]
fn names_are_unique_per_tenant_among_existing_volumes() {
    let s = store();
    s.insert_volume(&vol("vol-1", "acme", "data")).expect("insert");
    // Another tenant may use the same name.
    s.insert_volume(&vol("vol-2", "beta", "data")).expect("insert");
    assert!(matches!(
        s.insert_volume(&vol("vol-3", "acme", "data")),
        Err(StoreError::Conflict {
            what: "volume name",
            ..
        })
    ));
    let got = s.find_volume("acme", "data").expect("find").expect("present");
    assert_eq!((got.id.as_str(), got.size_bytes), ("vol-1", Some(1 << 30)));
    assert_eq!(got.labels, labels(&[("k", "vol-1")]));
    assert_eq!(
        s.find_volume("acme", "vol-1").expect("find").map(|v| v.name),
        Some("data".into())
    );
    // Tenants never find each other's volumes, by id or by name.
    assert_eq!(s.find_volume("beta", "vol-1").expect("find"), None);
    assert_eq!(
        s.find_volume("beta", "data").expect("find").map(|v| v.id),
        Some("vol-2".into())
    );

    assert!(s.mark_volume_deleted("vol-1", 20).expect("delete"));
    assert!(!s.mark_volume_deleted("vol-1", 30).expect("delete again"));
    assert_eq!(s.find_volume("acme", "data").expect("find"), None);
    assert_eq!(
        s.get_volume("vol-1").expect("get").and_then(|v| v.deleted_at_ms),
        Some(20)
    );
    // The name is free again.
    s.insert_volume(&vol("vol-4", "acme", "data"))
        .expect("reuse the name");
    let listed = s
        .list_volumes(&VolumeFilter {
            tenant: Some("acme".into()),
            limit: 10,
            ..Default::default()
        })
        .expect("list");
    assert_eq!(
        listed.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(),
        ["vol-4"]
    );
    assert_eq!(s.existing_volume_ids().expect("ids"), ["vol-2", "vol-4"]);
}

#[test]
fn mounts_are_checked_in_the_transaction_and_only_live_sandboxes_use_a_volume() {
    let s = store();
    s.insert_volume(&vol("vol-1", "acme", "data")).expect("insert");
    s.insert_volume(&vol("vol-2", "beta", "theirs")).expect("insert");
    s.transaction(|tx| {
        tx.insert_sandbox_checked(
            &new_sandbox("sb-1", Some("acme"), SandboxState::Creating),
            &QuotaDefaults::default(),
        )?;
        tx.insert_volume_mount("acme", &mount("sb-1", "vol-1", "/data"))?;
        tx.insert_volume_mount("acme", &mount("sb-1", "vol-1", "/ro"))
    })
    .expect("mount");
    // Another tenant's volume, or a deleted one, cannot be mounted: the whole insert rolls back.
    for (volume, sandbox) in [("vol-2", "sb-2"), ("vol-9", "sb-3")] {
        let err = s
            .transaction(|tx| {
                tx.insert_sandbox_checked(
                    &new_sandbox(sandbox, Some("acme"), SandboxState::Creating),
                    &QuotaDefaults::default(),
                )?;
                tx.insert_volume_mount("acme", &mount(sandbox, volume, "/data"))
            })
            .expect_err("refused");
        assert!(matches!(err, StoreError::Missing { what: "volume", .. }), "{err}");
        assert_eq!(s.get_sandbox(sandbox).expect("get"), None);
    }
    assert_eq!(s.volume_users("vol-1").expect("users"), ["sb-1"]);
    assert_eq!(
        s.sandbox_volume_mounts("sb-1").expect("mounts"),
        [mount("sb-1", "vol-1", "/data"), mount("sb-1", "vol-1", "/ro")]
    );
    // A stopped sandbox still holds its volumes (it mounts them again when resumed).
    s.transition_sandbox("sb-1", &[SandboxState::Creating], SandboxState::Stopped, 40, None)
        .expect("stop");
    assert_eq!(s.volume_users("vol-1").expect("users"), ["sb-1"]);
    s.transition_sandbox(
        "sb-1",
        &[SandboxState::Stopped],
        SandboxState::Killed,
        50,
        Some("killed"),
    )
    .expect("kill");
    assert!(s.volume_users("vol-1").expect("users").is_empty());
    // Purging the ended sandbox's row takes its mount rows along.
    s.purge_ended_sandboxes(100).expect("purge");
    assert!(s.sandbox_volume_mounts("sb-1").expect("mounts").is_empty());
    assert!(s.mark_volume_deleted("vol-1", 200).expect("delete"));
}

//! Named volumes: create, get (by id or name), list, delete; mounts shared live between sandboxes,
//! read-only mounts, size limits, refusal while mounted; with the `volume.*` rows.

use paddock_control::WriteFileOptions;
use paddock_runtime::RuntimeError;
use paddock_types::api::{ErrorCode, ListVolumesQuery};
use serde_json::json;

use crate::fixture::{body, bytes_body, code, error, Fixture};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_outlives_its_sandboxes_is_shared_live_and_is_not_deleted_while_mounted() {
    let f = Fixture::start().await;
    let s = &f.service;
    let vol = s
        .create_volume(
            &f.a,
            body(json!({"name": "data", "size": "1M", "labels": {"k": "v"}})),
        )
        .await
        .expect("create");
    assert_eq!((vol.size_bytes, vol.used_bytes), (Some(1 << 20), Some(0)));
    assert_eq!(s.get_volume(&f.a, "data").await.expect("by name").id, vol.id);
    assert_eq!(s.get_volume(&f.a, &vol.id).await.expect("by id").name, "data");
    assert_eq!(
        code(s.create_volume(&f.a, body(json!({"name": "data"}))).await),
        ErrorCode::VolumeExists
    );
    let writer = f
        .create(&f.a, json!({"volumes": [{"volume": "data", "path": "/data"}]}))
        .await
        .id;
    let reader = f
        .create(
            &f.a,
            json!({"volumes": [{"volume": vol.id, "path": "/mnt/ro", "read_only": true}]}),
        )
        .await
        .id;
    f.sh(&f.a, &writer, "echo shared > /data/f").await;
    assert_eq!(
        f.sh(&f.a, &reader, "cat /mnt/ro/f").await,
        "shared\n",
        "seen live by the other sandbox"
    );
    let e = error(
        s.write_file(
            &f.a,
            &reader,
            "/mnt/ro/g",
            WriteFileOptions::default(),
            bytes_body(b"x"),
        )
        .await,
    );
    assert_eq!(
        e.code,
        ErrorCode::PermissionDenied,
        "a read-only mount stays read-only: {e:?}"
    );
    let info = s.get_volume(&f.a, "data").await.expect("get");
    assert_eq!(info.used_bytes, Some(7));
    let mut mounted_by = info.mounted_by.clone();
    mounted_by.sort();
    let mut expected = vec![writer.clone(), reader.clone()];
    expected.sort();
    assert_eq!(mounted_by, expected);
    // Past its size a write fails with no_space.
    let e = error(
        s.write_file(
            &f.a,
            &writer,
            "/data/big",
            WriteFileOptions::default(),
            bytes_body(&vec![0u8; 2 << 20]),
        )
        .await,
    );
    assert_eq!(e.code, ErrorCode::NoSpace, "{e:?}");
    // Volumes are not part of a sandbox's own files: a checkpoint's diff does not see them.
    s.checkpoint(&f.a, &writer).await.expect("checkpoint");
    f.sh(&f.a, &writer, "echo more > /data/g").await;
    let diff = s
        .diff_sandbox(&f.a, &writer, body(json!({})))
        .await
        .expect("diff");
    assert!(diff.entries.is_empty(), "{diff:?}");

    let e = error(s.delete_volume(&f.a, "data").await);
    assert_eq!(e.code, ErrorCode::VolumeInUse);
    for id in [&writer, &reader] {
        s.kill_sandbox(&f.a, id).await.expect("kill");
    }
    assert_eq!(f.backend.stats().volumes, 1);
    s.delete_volume(&f.a, "data").await.expect("delete");
    assert_eq!(f.backend.stats().volumes, 0);
    assert_eq!(code(s.get_volume(&f.a, "data").await), ErrorCode::VolumeNotFound);
    assert_eq!(
        code(s.delete_volume(&f.a, &vol.id).await),
        ErrorCode::VolumeNotFound
    );
    assert!(s
        .list_volumes(&f.a, ListVolumesQuery::default())
        .await
        .expect("list")
        .volumes
        .is_empty());
    let outcomes: Vec<(String, String)> = f
        .rows("volume.")
        .await
        .into_iter()
        .map(|r| (r.action, r.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("volume.create".to_owned(), "ok".to_owned()),
            ("volume.delete".to_owned(), "volume_in_use".to_owned()),
            ("volume.delete".to_owned(), "ok".to_owned()),
        ]
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounts_are_checked_and_a_full_pool_makes_no_volume() {
    let f = Fixture::start().await;
    f.service
        .create_volume(&f.a, body(json!({"name": "v"})))
        .await
        .expect("create");
    for (mount, field) in [
        (json!({"volume": "v", "path": "/"}), "volumes[0].path"),
        (json!({"volume": "v", "path": "relative"}), "volumes[0].path"),
        (json!({"volume": "v", "path": "/proc/x"}), "volumes[0].path"),
        (json!({"volume": "nope", "path": "/data"}), "volumes[0].volume"),
    ] {
        let e = error(f.try_create(&f.a, json!({"volumes": [mount]})).await);
        assert_eq!(e.field.as_deref(), Some(field), "{mount}: {e:?}");
    }
    let twice = json!({"volumes": [{"volume": "v", "path": "/a"}, {"volume": "v", "path": "/a"}]});
    assert_eq!(code(f.try_create(&f.a, twice).await), ErrorCode::InvalidRequest);
    assert_eq!(f.backend.stats().created, 0, "nothing was booted");
    f.backend.fail_next(
        "create_volume",
        RuntimeError::Pool {
            what: "create the subvolume of",
            path: "/pool/volumes/x".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        },
    );
    assert_eq!(
        code(f.service.create_volume(&f.a, body(json!({"name": "w"}))).await),
        ErrorCode::NoSpace
    );
    let listed = f
        .service
        .list_volumes(&f.a, ListVolumesQuery::default())
        .await
        .expect("list");
    assert_eq!(listed.volumes.len(), 1);
    f.finish().await;
}

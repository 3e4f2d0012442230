//! Forks of one snapshot are sandboxes of their own: none sees another's writes.

use super::*;

#[tokio::test]
async fn forks_never_see_each_others_writes() {
    if !require_freezer() {
        return;
    }
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = Arc::new(backend(&env));
    let source = backend.create_sandbox(&spec("sb-source")).expect("create");
    let source_client = connect(&source).await;
    ok(
        &source_client,
        "echo base > /home/user/base && mkdir /home/user/shared",
    )
    .await;
    let snapshot = snapshot_id("sn-base");
    backend.snapshot_sandbox(&source, &snapshot).expect("snapshot");

    let mut forks = Vec::new();
    for i in 0..3 {
        let id = format!("sb-fork-{i}");
        let handle = backend.create_sandbox(&fork_spec(&id, &snapshot)).expect("fork");
        let client = connect(&handle).await;
        assert_eq!(ok(&client, "cat /home/user/base").await, "base\n");
        assert_eq!(
            ok(&client, "hostname; cat /etc/hostname").await,
            format!("{id}\n{id}\n")
        );
        ok(
            &client,
            &format!("echo {i} > /home/user/shared/mine-{i} && echo {i} > /home/user/base"),
        )
        .await;
        forks.push((handle, client));
    }
    ok(
        &source_client,
        "echo source > /home/user/shared/source-after && rm /home/user/base",
    )
    .await;

    for (i, (_, client)) in forks.iter().enumerate() {
        assert_eq!(ok(client, "ls /home/user/shared").await, format!("mine-{i}\n"));
        assert_eq!(ok(client, "cat /home/user/base").await, format!("{i}\n"));
    }
    assert_eq!(
        ok(&source_client, "ls /home/user/shared; ls /home/user").await,
        "source-after\nshared\n"
    );
    let in_snapshot = snapshot_dir(&env, &snapshot).join("home/user");
    assert_eq!(names(&in_snapshot.join("shared")), Vec::<String>::new());
    assert_eq!(
        std::fs::read_to_string(in_snapshot.join("base")).expect("base"),
        "base\n"
    );

    // A fork of a snapshot that does not exist is refused up front, leaving nothing.
    let err = backend
        .create_sandbox(&fork_spec("sb-nowhere", &snapshot_id("sn-missing")))
        .expect_err("fork of a missing snapshot");
    assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err:?}");
    assert_gone(&env, "sb-nowhere");

    // Ten forks of one snapshot at once (as a control plane's fork into N copies does).
    let started = Instant::now();
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let backend = backend.clone();
            let spec = fork_spec(&format!("sb-many-{i}"), &snapshot);
            tokio::task::spawn_blocking(move || backend.create_sandbox(&spec))
        })
        .collect();
    let mut many = Vec::new();
    for task in tasks {
        many.push(task.await.expect("join").expect("concurrent fork"));
    }
    eprintln!("10 concurrent forks of one snapshot took {:?}", started.elapsed());
    for handle in &many {
        let client = connect(handle).await;
        assert_eq!(
            ok(&client, "cat /home/user/base; ls /home/user/shared").await,
            "base\n"
        );
    }

    for handle in many {
        backend.destroy_sandbox(handle).expect("destroy");
    }
    drop(source_client);
    backend.destroy_sandbox(source).expect("destroy");
    for (handle, client) in forks {
        drop(client);
        backend.destroy_sandbox(handle).expect("destroy");
    }
    // The snapshot outlived the sandbox it was taken of.
    assert_eq!(backend.list_snapshots().expect("list"), vec![snapshot.clone()]);
    assert!(backend.delete_snapshot(&snapshot).expect("delete"));
    assert_all_clean(&env);
}

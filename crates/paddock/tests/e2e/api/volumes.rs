//! Named volumes through the REST API, in-process against a real service (`support/harness.rs`):
//! data outlives its sandboxes and is shared live between the sandboxes mounting it; read-only mounts
//! stay read-only from inside; symlinks in a volume (and planted on the way to its mount point) resolve
//! inside the sandbox, never on the host; the size limit gives EDQUOT; a delete is refused while a
//! sandbox mounts the volume and frees its subvolume afterwards; another tenant's volume answers
//! exactly like a missing one, on every documented volume route and when mounting.

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::harness::{Client, Harness, Options, Reply};

/// An id no volume has.
const NO_SUCH_VOLUME: &str = "vol-0000000000000000";

/// Creates a volume; returns its info.
async fn create_volume(client: &Client, body: Value) -> Value {
    let info = client.post("/v1/volumes", body).await.ok(201);
    assert!(
        info["id"].as_str().is_some_and(|id| id.starts_with("vol-")),
        "{info}"
    );
    info
}

/// Runs a shell script as `user`; returns (exit code, stdout, stderr).
async fn try_sh(client: &Client, id: &str, user: &str, script: &str) -> (i64, String, String) {
    let r = client.exec_json(id, json!({"shell": script, "user": user})).await;
    (
        r["exit"]["exit_code"].as_i64().unwrap_or(-1),
        r["stdout"].as_str().unwrap_or_default().to_owned(),
        r["stderr"].as_str().unwrap_or_default().to_owned(),
    )
}

/// The mount options of the mount at `path` in the sandbox (`/proc/self/mountinfo` field 6).
async fn mount_options(client: &Client, id: &str, path: &str) -> String {
    client
        .sh(
            id,
            &format!("awk '$5 == \"{path}\" {{ print $6 }}' /proc/self/mountinfo | tail -n 1"),
        )
        .await
        .trim()
        .to_owned()
}

#[test]
fn data_outlives_sandboxes_is_shared_live_and_delete_frees_it() {
    // A warm pool, to show that a create with volumes is not served by a warm sandbox (which has none).
    let h = Harness::with(Options {
        warm_pool: 1,
        ..Options::default()
    });
    h.block_on(async {
        let a = h.admin.new_tenant("vol-owner").await;
        let info = create_volume(
            &a,
            json!({"name": "data", "size": "256M", "labels": {"team": "x"}}),
        )
        .await;
        let vid = info["id"].as_str().expect("id").to_owned();
        assert_eq!(info["name"], "data");
        assert_eq!(info["size_bytes"], 256u64 << 20);
        assert_eq!(info["labels"]["team"], "x");
        assert_eq!(info["mounted_by"], json!([]));
        let subvolume = h.env().state().join("pool/volumes").join(&vid);
        assert!(subvolume.is_dir(), "{} missing", subvolume.display());
        a.post("/v1/volumes", json!({"name": "data"}))
            .await
            .err(409, "volume_exists");

        // Two sandboxes mount it at once (by name and by id), and see each other's writes.
        let one = a
            .create_sandbox(json!({"volumes": [{"volume": "data", "path": "/data"}]}))
            .await;
        let two = a
            .create_sandbox(json!({"volumes": [{"volume": vid, "path": "/home/user/shared"}]}))
            .await;
        let got = a.get(&format!("/v1/sandboxes/{one}")).await.ok(200);
        assert_eq!(
            got["volumes"],
            json!([{"volume": vid, "path": "/data", "read_only": false}])
        );
        assert_eq!(
            a.sh(
                &one,
                "echo from-one > /data/note && stat -c '%U %a' /data /data/note"
            )
            .await,
            "user 755\nuser 644\n",
            "the default user owns the volume's root and what it writes there"
        );
        assert_eq!(a.sh(&two, "cat /home/user/shared/note").await, "from-one\n");
        a.sh(&two, "echo from-two >> /home/user/shared/note").await;
        assert_eq!(a.sh(&one, "cat /data/note").await, "from-one\nfrom-two\n");
        let opts = mount_options(&a, &one, "/data").await;
        assert!(
            opts.split(',').any(|o| o == "rw") && opts.contains("nosuid") && opts.contains("nodev"),
            "{opts}"
        );
        let got = a.get(&format!("/v1/volumes/{vid}")).await.ok(200);
        let users: BTreeSet<&str> = got["mounted_by"]
            .as_array()
            .expect("mounted_by")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(users, BTreeSet::from([one.as_str(), two.as_str()]));

        // Snapshots and diffs cover the sandbox's own files only.
        a.post(&format!("/v1/sandboxes/{one}/checkpoint"), json!(null))
            .await
            .ok(201);
        a.sh(&one, "echo later >> /data/note").await;
        let diff = a.get(&format!("/v1/sandboxes/{one}/diff")).await.ok(200);
        assert_eq!(diff["entries"], json!([]), "a volume is not in a diff: {diff}");

        // In use: refused, and nothing is freed.
        let refused = a
            .delete(&format!("/v1/volumes/{vid}"))
            .await
            .err(409, "volume_in_use");
        assert!(
            refused["message"].as_str().is_some_and(|m| m.contains(&one)),
            "{refused}"
        );
        a.delete(&format!("/v1/sandboxes/{one}")).await.ok(204);
        a.delete("/v1/volumes/data").await.err(409, "volume_in_use");
        a.delete(&format!("/v1/sandboxes/{two}")).await.ok(204);

        // The data outlives both sandboxes.
        let three = a
            .create_sandbox(json!({"volumes": [{"volume": "data", "path": "/mnt/data", "read_only": true}]}))
            .await;
        assert_eq!(
            a.sh(&three, "cat /mnt/data/note").await,
            "from-one\nfrom-two\nlater\n"
        );
        let got = a.get("/v1/volumes/data").await.ok(200);
        assert_eq!(got["mounted_by"], json!([three]));
        assert!(
            got["used_bytes"].as_u64().is_some(),
            "used bytes are reported: {got}"
        );
        a.delete(&format!("/v1/sandboxes/{three}")).await.ok(204);

        // Deleting frees the subvolume; the name is free again.
        a.delete("/v1/volumes/data").await.ok(204);
        assert!(!subvolume.exists(), "{} still exists", subvolume.display());
        a.get(&format!("/v1/volumes/{vid}"))
            .await
            .err(404, "volume_not_found");
        a.delete(&format!("/v1/volumes/{vid}"))
            .await
            .err(404, "volume_not_found");
        assert_eq!(a.get("/v1/volumes").await.ok(200)["volumes"], json!([]));
        a.post(
            "/v1/sandboxes",
            json!({"volumes": [{"volume": "data", "path": "/data"}]}),
        )
        .await
        .err(404, "volume_not_found");

        // Every operation left its audit row.
        for action in ["volume.create", "volume.delete"] {
            let rows = h
                .admin
                .get_q("/v1/audit", &[("action", action), ("tenant", "vol-owner")])
                .await
                .ok(200);
            let rows = rows["records"].as_array().cloned().unwrap_or_default();
            assert!(
                rows.iter()
                    .any(|r| r["outcome"] == "ok" && r["detail"]["volume"] == vid.as_str()),
                "no {action} row: {rows:?}"
            );
            if action == "volume.delete" {
                assert!(
                    rows.iter().any(|r| r["outcome"] == "volume_in_use"),
                    "the refusal is recorded: {rows:?}"
                );
            }
        }
    });
}

#[test]
fn read_only_stays_read_only_and_links_resolve_inside_the_sandbox() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("vol-ro").await;
        create_volume(&a, json!({"name": "shared"})).await;
        let writer = a
            .create_sandbox(json!({"volumes": [{"volume": "shared", "path": "/data"}]}))
            .await;
        a.sh(
            &writer,
            "echo content > /data/f && ln -s / /data/root && ln -s /etc/passwd /data/pw && ln -s ../../.. /data/up",
        )
        .await;
        let reader = a
            .create_sandbox(json!({
                "user": "root",
                "volumes": [{"volume": "shared", "path": "/ro", "read_only": true}],
            }))
            .await;
        assert_eq!(a.sh(&reader, "cat /ro/f").await, "content\n");
        // Writes fail with EROFS, also for the sandbox's root, and the mount cannot be made writable.
        for user in ["user", "root"] {
            let (code, _, err) = try_sh(&a, &reader, user, "echo x > /ro/f").await;
            assert_ne!(code, 0, "{user} wrote to a read-only volume");
            assert!(err.contains("Read-only file system"), "{user}: {err}");
            let (code, _, err) = try_sh(&a, &reader, user, "touch /ro/new").await;
            assert_ne!(code, 0, "{user} created a file in a read-only volume: {err}");
        }
        let (code, _, err) = try_sh(&a, &reader, "root", "mount -o remount,rw /ro").await;
        assert_ne!(code, 0, "remount rw succeeded: {err}");
        let (code, _, err) = try_sh(&a, &reader, "root", "mount -o remount,bind,rw /ro").await;
        assert_ne!(code, 0, "bind remount rw succeeded: {err}");
        let (code, _, err) = try_sh(&a, &reader, "root", "umount /ro && echo x > /ro/f").await;
        assert_ne!(code, 0, "unmounted the read-only volume: {err}");
        let (code, _, err) = try_sh(&a, &reader, "root", "echo x > /ro/f").await;
        assert_ne!(code, 0, "still writable after the attempts: {err}");
        let opts = mount_options(&a, &reader, "/ro").await;
        assert!(
            opts.split(',').any(|o| o == "ro") && opts.contains("nosuid") && opts.contains("nodev"),
            "{opts}"
        );
        assert_eq!(a.sh(&writer, "cat /data/f").await, "content\n");

        // Symlinks stored in a volume resolve in the sandbox that follows them, never on the host.
        let hostname = a.sh(&reader, "cat /ro/root/etc/hostname").await;
        assert_eq!(hostname.trim(), reader, "/ is the sandbox's root");
        assert_eq!(
            a.sh(&reader, "cat /ro/pw").await,
            a.sh(&reader, "cat /etc/passwd").await
        );
        assert_eq!(a.sh(&reader, "cat /ro/up/etc/hostname").await.trim(), reader);
        assert!(
            std::path::Path::new("/etc/shadow").exists(),
            "the host has /etc/shadow (the probe below needs it)"
        );
        let (code, out, _) = try_sh(&a, &reader, "root", "cat /ro/root/etc/shadow /ro/up/etc/shadow").await;
        assert_ne!(code, 0, "the host's /etc/shadow is reachable through a volume: {out}");
        let (_, out, _) = try_sh(&a, &reader, "root", "ls /ro/root/").await;
        for host_only in ["var", "srv", "boot"] {
            assert!(
                !out.lines().any(|l| l == host_only),
                "{host_only} of the host is visible: {out}"
            );
        }
    });
}

#[test]
fn a_link_planted_on_the_way_to_a_mount_point_stays_inside_the_sandbox() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("vol-link").await;
        create_volume(&a, json!({"name": "v"})).await;
        let id = a
            .create_sandbox(json!({"volumes": [{"volume": "v", "path": "/home/user/proj/data"}]}))
            .await;
        a.sh(&id, "echo in-volume > /home/user/proj/data/f").await;
        // The sandbox swaps the directory holding its mount point for a symlink to a host-looking
        // path. A fork (and a rollback) rebuilds the mount point from these files: it must resolve
        // inside the new sandbox's root, never create or mount anything at the host's path.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("time")
            .as_nanos();
        let unique = format!("paddock-volume-escape-{}-{nanos:x}", std::process::id());
        // A link whose target exists in the sandbox (its own /tmp) but not on the host.
        let target = format!("/tmp/{unique}");
        a.sh(
            &id,
            &format!(
                "mkdir {target} && mv /home/user/proj /home/user/proj.old && ln -s {target} /home/user/proj"
            ),
        )
        .await;
        let fork = a
            .post(&format!("/v1/sandboxes/{id}/fork"), json!({"count": 1}))
            .await
            .ok(201);
        let copy = fork["sandboxes"][0]["id"].as_str().expect("copy").to_owned();
        assert!(
            !std::path::Path::new(&target).exists(),
            "the fork's setup created {target} on the host"
        );
        // The volume is where the link leads inside the copy, shared with the source.
        assert_eq!(a.sh(&copy, &format!("cat {target}/data/f")).await, "in-volume\n");
        assert_eq!(a.sh(&copy, "cat /home/user/proj/data/f").await, "in-volume\n");
        a.sh(&copy, "echo from-copy > /home/user/proj/data/g").await;
        assert_eq!(a.sh(&id, "cat /home/user/proj.old/data/g").await, "from-copy\n");

        // A link to a place that exists nowhere in the sandbox (a host directory anyone may write
        // to): the copy cannot be built, and nothing appears on the host.
        let host_target = format!("/var/tmp/{unique}");
        a.sh(
            &id,
            &format!("rm /home/user/proj && ln -s {host_target} /home/user/proj"),
        )
        .await;
        let refused = a
            .post(&format!("/v1/sandboxes/{id}/fork"), json!({"count": 1}))
            .await;
        assert_ne!(refused.status, 201, "{refused:?}");
        assert!(
            !std::path::Path::new(&host_target).exists(),
            "the fork's setup created {host_target} on the host"
        );
        assert!(!std::path::Path::new(&target).exists());
    });
}

#[test]
fn the_size_limit_gives_edquot() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("vol-quota").await;
        create_volume(&a, json!({"name": "small", "size": "32M"})).await;
        let id = a
            .create_sandbox(json!({"volumes": [{"volume": "small", "path": "/data"}]}))
            .await;
        let (code, out, err) = try_sh(
            &a,
            &id,
            "user",
            "dd if=/dev/zero of=/data/big bs=1M count=256 conv=fsync; echo dd=$? >&2; du -m /data/big | cut -f1",
        )
        .await;
        assert_eq!(code, 0, "{err}");
        assert!(!err.contains("dd=0"), "256 MiB written into a 32M volume: {err}");
        assert!(err.contains("Disk quota exceeded"), "unexpected dd error: {err}");
        let mib: u64 = out.trim().parse().expect("size");
        assert!(mib <= 40, "wrote {mib} MiB into a 32M volume");
        // The sandbox's own disk is not what filled up.
        a.sh(&id, "echo fine > /home/user/f").await;
    });
}

#[test]
fn mount_paths_are_validated() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("vol-paths").await;
        create_volume(&a, json!({"name": "v"})).await;
        create_volume(&a, json!({"name": "w"})).await;
        for (volumes, field) in [
            (json!([{"volume": "v", "path": "/"}]), "volumes[0].path"),
            (json!([{"volume": "v", "path": "data"}]), "volumes[0].path"),
            (
                json!([{"volume": "v", "path": "/data/../etc"}]),
                "volumes[0].path",
            ),
            (json!([{"volume": "v", "path": "/proc/sys"}]), "volumes[0].path"),
            (json!([{"volume": "v", "path": "/sys"}]), "volumes[0].path"),
            (json!([{"volume": "v", "path": "/dev/shm"}]), "volumes[0].path"),
            (json!([{"volume": "v", "path": "/usr/local"}]), "volumes[0].path"),
            (json!([{"volume": "v", "path": "/etc"}]), "volumes[0].path"),
            (json!([{"volume": "v", "path": "/home"}]), "volumes[0].path"),
            (json!([{"volume": "v", "path": "/tmp"}]), "volumes[0].path"),
            (
                json!([{"volume": "v", "path": "/data"}, {"volume": "w", "path": "/data/sub"}]),
                "volumes[1].path",
            ),
            (
                json!([{"volume": "v", "path": "/data"}, {"volume": "v", "path": "/data"}]),
                "volumes[1].path",
            ),
        ] {
            let e = a
                .post("/v1/sandboxes", json!({ "volumes": volumes }))
                .await
                .err(400, "invalid_request");
            assert_eq!(e["field"], field, "{volumes}: {e}");
        }
        let e = a
            .post(
                "/v1/sandboxes",
                json!({"volumes": [{"volume": "nope", "path": "/data"}]}),
            )
            .await
            .err(404, "volume_not_found");
        assert_eq!(e["field"], "volumes[0].volume", "{e}");
        for (body, field) in [
            (json!({"name": "vol-0123456789abcdef"}), "name"),
            (json!({"name": "a/b"}), "name"),
            (json!({"name": ""}), "name"),
            (json!({"name": "ok", "size": 0}), "size"),
        ] {
            let e = a
                .post("/v1/volumes", body.clone())
                .await
                .err(400, "invalid_request");
            assert_eq!(e["field"], field, "{body}: {e}");
        }
        a.post("/v1/volumes", json!({"name": "x", "extra": 1}))
            .await
            .err(400, "invalid_request");
        // Nothing was created by the refusals.
        let list = a.get("/v1/volumes").await.ok(200);
        assert_eq!(list["volumes"].as_array().map(Vec::len), Some(2), "{list}");
        assert_eq!(a.get("/v1/sandboxes").await.ok(200)["sandboxes"], json!([]));
    });
}

/// The requests to try on a documented volume route (`None`: this test does not know it).
fn volume_probes_for(method: &str, template: &str) -> Option<Vec<(Method, Option<Value>)>> {
    match (method, template) {
        ("GET", "/v1/volumes/{volume_id}") => Some(vec![(Method::GET, None)]),
        ("DELETE", "/v1/volumes/{volume_id}") => Some(vec![(Method::DELETE, None)]),
        _ => None,
    }
}

#[test]
fn another_tenants_volume_answers_like_a_missing_one() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("vol-a").await;
        let b = h.admin.new_tenant("vol-b").await;
        let info = create_volume(&a, json!({"name": "secret-data"})).await;
        let vid = info["id"].as_str().expect("id").to_owned();
        let id = a
            .create_sandbox(json!({"volumes": [{"volume": "secret-data", "path": "/data"}]}))
            .await;
        a.sh(&id, "echo A-only > /data/f").await;

        let doc = b.get("/openapi.json").await.ok(200);
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            if !path.contains("{volume_id}") {
                continue;
            }
            for method in item.as_object().expect("path item").keys() {
                let method = method.to_ascii_uppercase();
                if ["GET", "POST", "PUT", "DELETE", "PATCH"].contains(&method.as_str()) {
                    documented.insert((method, path.clone()));
                }
            }
        }
        assert_eq!(documented.len(), 2, "{documented:?}");
        let outcome = |r: Reply, probed: &str| {
            let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            (
                r.status,
                v["code"].as_str().unwrap_or("").to_owned(),
                v["message"].as_str().unwrap_or("").replace(probed, "{id}"),
            )
        };
        for (method, template) in &documented {
            let probes = volume_probes_for(method, template)
                .unwrap_or_else(|| panic!("{method} {template}: documented but not probed"));
            for (m, body) in probes {
                // By id and by name, against a missing volume of the same shape.
                for (probed, missing) in [(vid.as_str(), NO_SUCH_VOLUME), ("secret-data", "no-such-name")] {
                    let send = |target: &str| {
                        let mut rb = b.request(m.clone(), &template.replace("{volume_id}", target));
                        if let Some(body) = &body {
                            rb = rb.json(body);
                        }
                        Client::send(rb)
                    };
                    let foreign = outcome(send(probed).await, probed);
                    let absent = outcome(send(missing).await, missing);
                    assert_eq!(foreign.0, 404, "{method} {template} on A's {probed}: {foreign:?}");
                    assert_eq!(foreign.1, "volume_not_found");
                    assert_eq!(foreign, absent, "{method} {template}: {probed} vs {missing}");
                }
            }
        }
        // B cannot mount it, by id or by name: the answer is that of a missing volume.
        for (probed, missing) in [(vid.as_str(), NO_SUCH_VOLUME), ("secret-data", "no-such-name")] {
            let mut answers = Vec::new();
            for target in [probed, missing] {
                let r = b
                    .post(
                        "/v1/sandboxes",
                        json!({"volumes": [{"volume": target, "path": "/data"}]}),
                    )
                    .await;
                answers.push(outcome(r, target));
            }
            assert_eq!(answers[0].1, "volume_not_found", "{answers:?}");
            assert_eq!(answers[0], answers[1]);
        }
        assert_eq!(b.get("/v1/volumes").await.ok(200)["volumes"], json!([]));
        assert_eq!(b.get("/v1/sandboxes").await.ok(200)["sandboxes"], json!([]));
        // B may use the same name for its own, separate volume.
        let theirs = create_volume(&b, json!({"name": "secret-data"})).await;
        assert_ne!(theirs["id"], vid.as_str());
        let bs = b
            .create_sandbox(json!({"volumes": [{"volume": "secret-data", "path": "/data"}]}))
            .await;
        assert_eq!(b.sh(&bs, "ls -A /data").await, "");
        // A's volume and data are intact.
        assert_eq!(a.sh(&id, "cat /data/f").await, "A-only\n");
        let got = a.get(&format!("/v1/volumes/{vid}")).await.ok(200);
        assert_eq!(got["mounted_by"], json!([id]));
    });
}

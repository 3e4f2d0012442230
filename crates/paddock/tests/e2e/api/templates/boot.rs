//! What runs at a boot: a template's start command and its readiness check, and the templates
//! the server's configuration has it build, with their warm pools.

use serde_json::{json, Value};

use super::*;

#[test]
fn a_start_command_runs_at_every_boot_and_a_sandbox_is_handed_out_once_ready() {
    let registry = TestRegistry::start();
    let image = app_image();
    registry.push(&image.path(), "v1", "paddock/app", "v1");
    let from = format!("{}/paddock/app:v1", registry.host());
    let h = Harness::with(options(&registry, good_credentials()));
    h.block_on(async {
        let a = h.admin.new_tenant("tpl-start").await;
        // The server listens a second after the command starts: a sandbox handed out before its
        // port accepts would fail the first request below.
        let start = json!({
            "command": ["sh", "-c", "sleep 1; exec httpd -f -p 8000 -h /srv"],
            "ready": {"port": 8000, "timeout_secs": 60}
        });
        let info = build_with(&a, json!({"name": "web", "from": from, "start": start}))
            .await
            .ok(201);
        assert_eq!(info["start"]["ready"]["port"], 8000, "{info}");
        // Ready when handed out: the first request inside the sandbox is served.
        let sb = a.create_sandbox(json!({"template": "web"})).await;
        let (code, out, err) = run_in(&a, &sb, json!({"argv": ["wget", "-qO-", "http://127.0.0.1:8000/index.html"]})).await;
        assert_eq!((code, out.as_str()), (0, "served at boot\n"), "{err}");
        let processes = a.get(&format!("/v1/sandboxes/{sb}/processes")).await.ok(200);
        let started: Vec<&Value> = processes["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .filter(|p| p["tag"] == "start")
            .collect();
        assert_eq!(started.len(), 1, "{processes:#}");
        assert_eq!(started[0]["running"], true, "{processes:#}");
        // Again at a resume: a stopped sandbox boots anew.
        a.post(&format!("/v1/sandboxes/{sb}/stop"), json!({})).await.ok(200);
        a.post(&format!("/v1/sandboxes/{sb}/resume"), json!({})).await.ok(200);
        let (code, out, _) = run_in(&a, &sb, json!({"argv": ["wget", "-qO-", "http://127.0.0.1:8000/index.html"]})).await;
        assert_eq!((code, out.as_str()), (0, "served at boot\n"));
        // Both starts are in the tenant's audit log, with the sandbox.
        let starts: Vec<Value> = a
            .audit_rows(&[("action", "process.start"), ("sandbox", sb.as_str())])
            .await
            .into_iter()
            .filter(|r| r["detail"]["tag"] == "start")
            .collect();
        assert_eq!(starts.len(), 2, "{starts:#?}");
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);

        // A check that never passes: the create fails with `timeout` and leaves no sandbox.
        let never = json!({"command": ["sleep", "600"], "ready": {"command": ["test", "-e", "/nothing"], "timeout_secs": 1}});
        build_with(&a, json!({"name": "never", "from": from, "start": never}))
            .await
            .ok(201);
        a.post("/v1/sandboxes", json!({"template": "never"}))
            .await
            .err(504, "timeout");
        let list = a.get("/v1/sandboxes").await.ok(200);
        let running: Vec<&Value> = list["sandboxes"]
            .as_array()
            .expect("sandboxes")
            .iter()
            .filter(|s| s["state"] == "running")
            .collect();
        assert!(running.is_empty(), "{list:#}");
        // Invalid start specifications are refused before anything is fetched.
        for (start, field) in [
            (json!({"command": []}), "start.command"),
            (json!({"ready": {"port": 80, "command": ["true"]}}), "start.ready"),
            (json!({"ready": {"port": 0}}), "start.ready.port"),
            (json!({"ready": {"port": 80, "timeout_secs": 100000}}), "start.ready.timeout_secs"),
        ] {
            let refused = build_with(&a, json!({"name": "bad-start", "from": from, "start": start}))
                .await
                .err(400, "invalid_request");
            assert_eq!(refused["field"], field, "{refused}");
        }
    });
}

#[test]
fn a_configured_image_template_is_built_at_start_for_every_tenant_with_its_warm_pool() {
    let registry = TestRegistry::start();
    let image = app_image();
    registry.push(&image.path(), "v1", "paddock/app", "v1");
    let from = format!("{}/paddock/app:v1", registry.host());
    let recipe = format!("FROM {from}\nUSER root\nRUN echo from-the-recipe > /srv/recipe\nUSER app\n");
    let mut opts = options(&registry, good_credentials());
    opts.templates = vec![
        (
            "app-pool".to_owned(),
            paddock_control::TemplateConfig {
                rootfs: paddock_types::RootfsSpec::Host,
                warm_pool_size: 2,
                image: Some(from.clone()),
                recipe: None,
                debian: None,
                kernels: Vec::new(),
                build: Default::default(),
            },
        ),
        (
            "app-recipe".to_owned(),
            paddock_control::TemplateConfig {
                rootfs: paddock_types::RootfsSpec::Host,
                warm_pool_size: 0,
                image: None,
                recipe: Some(recipe),
                debian: None,
                kernels: Vec::new(),
                build: Default::default(),
            },
        ),
    ];
    let h = Harness::with(opts);
    h.block_on(async {
        // Built in the background; its pool fills once it is.
        crate::support::harness::poll(SOON * 6, "the configured template's warm pool", || async {
            let metrics = h.admin.get("/metrics").await.text();
            (warm_gauge(&metrics, "app-pool") == Some(2)).then_some(())
        })
        .await;
        let a = h.admin.new_tenant("tpl-config-a").await;
        let b = h.admin.new_tenant("tpl-config-b").await;
        for (client, tenant) in [(&a, "a"), (&b, "b")] {
            let list = client.get("/v1/templates").await.ok(200);
            let names: Vec<&str> = list["templates"]
                .as_array()
                .expect("templates")
                .iter()
                .filter_map(|t| t["name"].as_str())
                .collect();
            assert!(
                names.contains(&"app-pool") && names.contains(&"app-recipe"),
                "{tenant}: {list}"
            );
            // Claimed from the pool, as the image's user with its env and workdir.
            let sb = client.create_sandbox(json!({"template": "app-pool"})).await;
            if tenant == "a" {
                assert_read_ahead(&h, &sb, "/bin/busybox");
            }
            let (code, out, err) = run_in(
                client,
                &sb,
                json!({"shell": "cat /etc/greeting; echo $GREETING; pwd; id -un"}),
            )
            .await;
            assert_eq!(
                (code, out.as_str()),
                (0, "hello from the image\nhi\n/srv\napp\n"),
                "{tenant}: {err}"
            );
            client.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);
            // A tenant cannot delete the server's template.
            client
                .delete("/v1/templates/app-pool")
                .await
                .err(403, "forbidden");
        }
        let claims = a
            .audit_rows(&[("action", "sandbox.create")])
            .await
            .into_iter()
            .filter(|r| r["detail"]["source"] == "pool")
            .count();
        assert_eq!(claims, 1, "the create was not a claim from the warm pool");
        // The recipe template (cold) once built.
        let sb = crate::support::harness::poll(SOON * 6, "the configured recipe template", || async {
            let r = a.post("/v1/sandboxes", json!({"template": "app-recipe"})).await;
            (r.status == 201).then(|| r.json()["id"].as_str().expect("id").to_owned())
        })
        .await;
        let (_, out, _) = run_in(&a, &sb, json!({"shell": "cat /srv/recipe; id -un"})).await;
        assert_eq!(out, "from-the-recipe\napp\n");
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);
    });
}

/// Asserts the sandbox's copy of `path` is wholly in the page cache although nothing has run in
/// the sandbox yet: the warm pool read it ahead. A sandbox's files are its own inodes (a btrfs
/// snapshot shares no cached pages with its template or other sandboxes), so nothing else has.
fn assert_read_ahead(h: &Harness, sb: &str, path: &str) {
    let pid = crate::support::sandbox_processes(h.env())
        .remove(sb)
        .and_then(|procs| procs.first().map(|(pid, _)| *pid))
        .expect("the sandbox's processes");
    let file = format!("/proc/{pid}/root{path}");
    let out = std::process::Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES,SIZE", &file])
        .output()
        .expect("fincore");
    let text = String::from_utf8_lossy(&out.stdout);
    let figures: Vec<u64> = text.split_whitespace().filter_map(|f| f.parse().ok()).collect();
    let [resident, size] = figures[..] else {
        panic!("fincore {file}: {text} {}", String::from_utf8_lossy(&out.stderr));
    };
    assert!(
        size > 0 && resident >= size,
        "{path}: {resident} of {size} bytes cached"
    );
}

//! Templates from recipes: `RUN` steps in sandboxes, cached steps on a rebuild, failures.

use serde_json::{json, Value};

use super::*;

#[test]
fn a_recipe_runs_its_steps_in_sandboxes_and_a_rebuild_reuses_the_unchanged_ones() {
    let registry = TestRegistry::start();
    let image = app_image();
    registry.push(&image.path(), "v1", "paddock/app", "v1");
    let from = format!("{}/paddock/app:v1", registry.host());
    let h = Harness::with(options(&registry, good_credentials()));
    h.block_on(async {
        let a = h.admin.new_tenant("tpl-recipe").await;
        let recipe = |last: &str| {
            format!(
                "ARG BASE={from}\n\
                 FROM $BASE\n\
                 # a comment (the image's USER is app: RUN steps run as it until this)\n\
                 USER root\n\
                 RUN echo made > /srv/made && id -u > /srv/made-by && echo to-the-log\n\
                 ENV STAGE=one\n\
                 RUN echo \"$STAGE\" >> /srv/made\n\
                 USER app\n\
                 WORKDIR /srv/work\n\
                 RUN {last}\n\
                 CMD [\"httpd\", \"-f\", \"-p\", \"8000\"]\n"
            )
        };
        let first = recipe("id -un > who");
        let run_rows = |rows: Vec<Value>| {
            rows.iter()
                .filter(|r| r["detail"]["tag"] == "recipe-step")
                .count()
        };

        // Built: every step runs (the FROM is pulled), its output streams as it comes.
        let events = build_streamed(&a, json!({"name": "r1", "recipe": first})).await;
        assert_eq!(
            events.last().map(|e| e["event"].clone()),
            Some(json!("done")),
            "{events:#?}"
        );
        assert!(kinds(&events).contains(&"pulling"), "{events:#?}");
        assert!(steps(&events).iter().all(|(_, cached)| !cached), "{events:#?}");
        assert!(
            events
                .iter()
                .any(|e| e["event"] == "log" && e["text"].as_str().is_some_and(|t| t.contains("to-the-log"))),
            "{events:#?}"
        );
        let info = &events.last().expect("done")["template"];
        assert_eq!(info["config"]["user"], "app");
        assert_eq!(info["config"]["working_dir"], "/srv/work");
        assert_eq!(info["config"]["cmd"], json!(["httpd", "-f", "-p", "8000"]));
        assert_eq!(run_rows(a.audit_rows(&[("action", "process.start")]).await), 3);
        // It is charged its whole tree: the image's (two copies of busybox) and what the steps
        // wrote; its tenant's usage says so.
        let busybox = std::fs::metadata("/bin/busybox").expect("busybox").len();
        let charged = info["storage_bytes"].as_u64().expect("storage_bytes");
        assert!(charged >= 2 * busybox, "{info}");
        let used = a.get("/v1/tenants/tpl-recipe").await.ok(200)["usage"].clone();
        assert_eq!(used["storage_bytes"], charged, "{used}");

        // A sandbox from it has what the steps made, as their users, and the recipe's defaults.
        let sb = a.create_sandbox(json!({"template": "r1"})).await;
        let (code, out, err) = run_in(
            &a,
            &sb,
            json!({"shell": "cat /srv/made /srv/made-by /srv/work/who; echo $STAGE; pwd; id -un"}),
        )
        .await;
        assert_eq!(
            (code, out.as_str()),
            (0, "made\none\n0\napp\none\n/srv/work\napp\n"),
            "{err}"
        );
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);

        // The same recipe again: nothing runs, nothing is pulled.
        let events = build_streamed(&a, json!({"name": "r2", "recipe": first})).await;
        assert_eq!(
            events.last().map(|e| e["event"].clone()),
            Some(json!("done")),
            "{events:#?}"
        );
        assert!(!kinds(&events).contains(&"pulling"), "{events:#?}");
        assert!(steps(&events).iter().all(|(_, cached)| *cached), "{events:#?}");
        assert_eq!(run_rows(a.audit_rows(&[("action", "process.start")]).await), 3);

        // The last step changed: only it runs.
        let events = build_streamed(
            &a,
            json!({"name": "r3", "recipe": recipe("echo changed > /srv/work/changed")}),
        )
        .await;
        assert_eq!(
            events.last().map(|e| e["event"].clone()),
            Some(json!("done")),
            "{events:#?}"
        );
        let runs: Vec<bool> = steps(&events)
            .iter()
            .filter(|(instruction, _)| instruction.starts_with("RUN"))
            .map(|(_, cached)| *cached)
            .collect();
        assert_eq!(runs, [true, true, false], "{events:#?}");
        assert_eq!(run_rows(a.audit_rows(&[("action", "process.start")]).await), 4);
        let sb = a.create_sandbox(json!({"template": "r3"})).await;
        let (_, out, _) = run_in(
            &a,
            &sb,
            json!({"shell": "cat /srv/work/changed; test -e /srv/work/who || echo no-who"}),
        )
        .await;
        assert_eq!(out, "changed\nno-who\n");
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);

        // A failing step fails the build (with its line), keeps nothing of it and no sandbox.
        let failed = build_with(
            &a,
            json!({"name": "broken", "recipe": format!("FROM {from}\nRUN echo fine\nRUN exit 7\n")}),
        )
        .await
        .err(422, "build_failed");
        let message = failed["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("line 3") && message.contains("code 7"),
            "{failed}"
        );
        a.get("/v1/templates/broken").await.err(404, "template_not_found");
        let list = a.get("/v1/sandboxes").await.ok(200);
        assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(0), "{list:#}");
        let images = names_in(&h.env().state().join("pool/images"));
        assert_eq!(images.len(), 3, "{images:?}");
        // What this server does not build, and what is no recipe.
        build_with(
            &a,
            json!({"name": "x", "recipe": format!("FROM {from}\nCOPY a /a\n")}),
        )
        .await
        .err(501, "unsupported");
        let bad = build_with(
            &a,
            json!({"name": "x", "recipe": format!("FROM {from}\nHEALTHCHECK NONE\n")}),
        )
        .await
        .err(400, "invalid_request");
        assert_eq!(bad["field"], "recipe", "{bad}");
        build_with(
            &a,
            json!({"name": "x", "from": from, "recipe": format!("FROM {from}\n")}),
        )
        .await
        .err(400, "invalid_request");
    });
}

/// A `RUN` step given a network sees it as every process of a networked sandbox does: the proxy,
/// and the sandbox's CA for the clients that keep their own trust store (pip reads `PIP_CERT`,
/// Node `NODE_EXTRA_CA_CERTS`); without them pip refused every certificate the proxy presented.
/// The template made keeps none of them.
#[test]
fn a_networked_recipe_step_gets_its_proxy_and_ca_and_the_template_keeps_neither() {
    let registry = TestRegistry::start();
    let image = app_image();
    registry.push(&image.path(), "v1", "paddock/app", "v1");
    let from = format!("{}/paddock/app:v1", registry.host());
    // A server with sandbox networks (nothing outside is reached: the step only looks).
    let h = Harness::with(Options {
        network: Some(crate::support::harness::unreachable_network()),
        ..options(&registry, good_credentials())
    });
    h.block_on(async {
        let a = h.admin.new_tenant("tpl-recipe-net").await;
        let recipe = format!(
            "FROM {from}\nUSER root\nENV OWN=mine\n\
             RUN env > /srv/step-env && cat \"$PIP_CERT\" > /srv/step-ca\n"
        );
        let events = build_streamed(
            &a,
            json!({"name": "net", "recipe": recipe, "network": {"allow": [{"domain": "pypi.test"}]}}),
        )
        .await;
        let done = events.last().cloned().unwrap_or_default();
        assert_eq!(done["event"], "done", "{events:#?}");
        let env = done["template"]["config"]["env"].to_string();
        assert!(
            env.contains("OWN") && !env.contains("PROXY") && !env.contains("CERT"),
            "{env}"
        );
        let sb = a.create_sandbox(json!({"template": "net"})).await;
        let (code, out, err) = run_in(
            &a,
            &sb,
            json!({"shell": "cat /srv/step-env; grep -c 'BEGIN CERTIFICATE' /srv/step-ca"}),
        )
        .await;
        assert_eq!(code, 0, "{err}");
        for wanted in [
            "HTTPS_PROXY=http://",
            "PIP_CERT=/",
            "NODE_EXTRA_CA_CERTS=/",
            "OWN=mine",
        ] {
            assert!(
                out.lines().any(|l| l.starts_with(wanted)),
                "{wanted} missing: {out}"
            );
        }
        assert!(
            out.lines()
                .last()
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|n| n >= 1),
            "{out}"
        );
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);
    });
}

//! Templates count against their tenant's quotas: how many it keeps (`max_templates`) and the bytes
//! of the pool each holds (`max_storage`: measured when its build ends, the cached layers it
//! started from included; while it is built, the most its build may write). A build past either
//! is refused with `quota_exceeded` naming the quota, and leaves nothing in the pool.

use serde_json::{json, Value};

use super::*;

async fn usage(c: &Client, tenant: &str) -> Value {
    c.get(&format!("/v1/tenants/{tenant}")).await.ok(200)["usage"].clone()
}

/// Expects a `quota_exceeded` refusal naming `quota`.
fn refused(body: &Value, quota: &str) {
    assert_eq!(body["code"], "quota_exceeded", "{body}");
    assert_eq!(body["field"], quota, "{body}");
}

#[test]
fn templates_are_charged_to_their_tenants_count_and_storage_quotas() {
    let registry = TestRegistry::start();
    let image = app_image();
    registry.push(&image.path(), "v1", "paddock/app", "v1");
    let from = format!("{}/paddock/app:v1", registry.host());
    // The image holds two copies of busybox: its tree is at least that much.
    let busybox = std::fs::metadata("/bin/busybox").expect("busybox").len();
    let h = Harness::with(options(&registry, good_credentials()));
    let pool = h.env().state().join("pool");
    h.block_on(async {
        h.admin
            .put(
                "/v1/tenants/tq/quota",
                json!({"max_templates": 2, "max_storage": "1G"}),
            )
            .await
            .ok(200);
        let a = h.admin.new_tenant("tq").await;

        // Built: charged what its tree holds, measured (not its compressed layers).
        let one = build(&a, "one", &from).await.ok(201);
        let one_bytes = one["storage_bytes"].as_u64().expect("storage_bytes");
        assert!(one_bytes >= 2 * busybox, "{one_bytes} < two busyboxes: {one}");
        assert!(
            one_bytes < 64 << 20,
            "{one_bytes}: more than the image could hold"
        );
        let used = usage(&a, "tq").await;
        assert_eq!(used["templates"], 1, "{used}");
        assert_eq!(used["storage_bytes"], one_bytes, "{used}");

        // The same image again: nothing is unpacked, but it holds the cached tree as much. (With
        // the cache's figures lost, as a crash between caching and recording leaves them, the
        // cached tree is measured from its extents instead.)
        let figures = pool.join("layers.bytes");
        assert_eq!(names_in(&figures), names_in(&pool.join("layers")));
        for name in names_in(&figures) {
            std::fs::remove_file(figures.join(name)).expect("remove a figure");
        }
        let two = build(&a, "two", &from).await.ok(201);
        let two_bytes = two["storage_bytes"].as_u64().expect("storage_bytes");
        assert!(two_bytes >= one_bytes, "the cached layers are not charged: {two}");
        let used = usage(&a, "tq").await;
        assert_eq!(used["templates"], 2, "{used}");
        assert_eq!(used["storage_bytes"], one_bytes + two_bytes, "{used}");

        // A third is past max_templates: refused before anything is fetched, and audited.
        let body = build(&a, "three", &from).await.err(429, "quota_exceeded");
        refused(&body, "max_templates");
        assert_eq!(names_in(&pool.join("images")).len(), 2);
        let rows = a.audit_rows(&[("action", "template.build")]).await;
        assert!(rows.iter().any(|r| r["outcome"] == "quota_exceeded"), "{rows:#?}");

        // Deleting one gives its count and bytes back.
        a.delete("/v1/templates/two").await.ok(204);
        let used = usage(&a, "tq").await;
        assert_eq!(
            (used["templates"].as_u64(), used["storage_bytes"].as_u64()),
            (Some(1), Some(one_bytes))
        );

        // Room for less than the image's tree: its layers are cached, so the build writes almost
        // nothing, but what the template would hold is checked when it ends: refused, and gone.
        let room = one_bytes + (one_bytes / 2);
        h.admin
            .put(
                "/v1/tenants/tq/quota",
                json!({"max_templates": 2, "max_storage": room}),
            )
            .await
            .ok(200);
        let body = build(&a, "cached", &from).await.err(429, "quota_exceeded");
        refused(&body, "max_storage");
        assert_eq!(names_in(&pool.join("images")), [one["id"].as_str().expect("id")]);
        assert!(names_in(&pool.join("builds"))
            .iter()
            .all(|n| !n.starts_with("tp-")));
        a.get("/v1/templates/cached").await.err(404, "template_not_found");

        // With the layers gone from the cache, a build that must unpack more than the room left
        // stops at its disk limit.
        a.delete("/v1/templates/one").await.ok(204);
        assert!(names_in(&pool.join("layers")).is_empty());
        assert!(names_in(&figures).is_empty(), "figures of uncached trees stay");
        h.admin
            .put(
                "/v1/tenants/tq/quota",
                json!({"max_templates": 2, "max_storage": busybox / 2}),
            )
            .await
            .ok(200);
        let body = build(&a, "small", &from).await.err(429, "quota_exceeded");
        refused(&body, "max_storage");
        assert!(names_in(&pool.join("images")).is_empty());
        assert!(names_in(&pool.join("builds"))
            .iter()
            .all(|n| !n.starts_with("tp-")));
        let used = usage(&a, "tq").await;
        assert_eq!(
            (used["templates"].as_u64(), used["storage_bytes"].as_u64()),
            (Some(0), Some(0))
        );

        // Nothing left at all: a build is refused at once.
        h.admin
            .put("/v1/tenants/tq/quota", json!({"max_storage": 0}))
            .await
            .ok(200);
        let body = build(&a, "none", &from).await.err(429, "quota_exceeded");
        refused(&body, "max_storage");
    });
}

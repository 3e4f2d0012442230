//! Debian base templates: the server runs `mmdebstrap` for a configured `debian = { ... }` and
//! builds its output as a one-layer image. Offline: the test makes a package with `dpkg-deb` (a
//! static busybox) and a flat repository with `dpkg-scanpackages`, served to mmdebstrap by a
//! `copy://` mirror (no network).

use std::process::Command;

use serde_json::json;

use super::*;

/// A flat apt repository holding one essential package, `paddock-test-base` (busybox as `/bin`).
fn local_repository(dir: &Path) -> PathBuf {
    let pkg = dir.join("pkg");
    std::fs::create_dir_all(pkg.join("DEBIAN")).expect("mkdir");
    std::fs::create_dir_all(pkg.join("bin")).expect("mkdir");
    std::fs::copy("/bin/busybox", pkg.join("bin/busybox")).expect("copy busybox");
    for applet in ["sh", "cat", "id", "echo"] {
        std::os::unix::fs::symlink("busybox", pkg.join("bin").join(applet)).expect("applet");
    }
    std::fs::write(
        pkg.join("DEBIAN/control"),
        "Package: paddock-test-base\nVersion: 1.0\nArchitecture: amd64\n\
         Maintainer: paddock tests <tests@invalid>\nPriority: required\nEssential: yes\n\
         Description: a test base\n",
    )
    .expect("control");
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).expect("mkdir");
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-b"])
        .arg(&pkg)
        .arg(repo.join("paddock-test-base_1.0_amd64.deb")));
    let packages = run(Command::new("dpkg-scanpackages")
        .args([".", "/dev/null"])
        .current_dir(&repo));
    std::fs::write(repo.join("Packages"), packages).expect("Packages");
    repo
}

#[test]
fn a_debian_base_is_made_by_mmdebstrap_from_the_configured_mirror() {
    let work = tempfile::tempdir().expect("tempdir");
    let repo = local_repository(work.path());
    let base = |packages: Vec<String>| paddock_control::TemplateConfig {
        rootfs: paddock_types::RootfsSpec::Host,
        warm_pool_size: 0,
        image: None,
        recipe: None,
        debian: Some(paddock_control::DebianBase {
            suite: "bookworm".into(),
            variant: Some("extract".into()),
            packages,
            mirrors: vec![format!("deb [trusted=yes] copy://{} ./", repo.display())],
        }),
        kernels: Vec::new(),
        build: Default::default(),
    };
    let opts = Options {
        templates: vec![
            ("deb-base".to_owned(), base(vec!["paddock-test-base".into()])),
            ("deb-broken".to_owned(), base(vec!["no-such-package".into()])),
        ],
        ..Options::default()
    };
    let h = Harness::with(opts);
    h.block_on(async {
        let a = h.admin.new_tenant("tpl-debian").await;
        // Built in the background for every tenant; a create succeeds once it is.
        let sb = crate::support::harness::poll(SOON * 6, "the Debian base template", || async {
            let r = a.post("/v1/sandboxes", json!({"template": "deb-base"})).await;
            (r.status == 201).then(|| r.json()["id"].as_str().expect("id").to_owned())
        })
        .await;
        let (code, out, err) = run_in(
            &a,
            &sb,
            json!({"argv": ["/bin/sh", "-c", "echo from debian; id -un"]}),
        )
        .await;
        assert_eq!((code, out.as_str()), (0, "from debian\nuser\n"), "{err}");
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);
        let info = a.get("/v1/templates/deb-base").await.ok(200);
        let source = info["source"].as_str().unwrap_or_default();
        assert!(
            source
                .starts_with("debian: bookworm (extract) + paddock-test-base from deb [trusted=yes] copy://"),
            "{info}"
        );
        assert_eq!(info["layers"].as_array().map(Vec::len), Some(1), "{info}");
        // A base mmdebstrap cannot make is never built: its failure is audited with
        // mmdebstrap's reason, creates wait for it, and nothing stays behind.
        let failed = crate::support::harness::poll(SOON * 6, "the failed build's audit row", || async {
            let rows = h.admin.audit_rows(&[("action", "template.build")]).await;
            rows.into_iter()
                .find(|r| r["outcome"] == "build_failed" && r["detail"]["name"] == "deb-broken")
        })
        .await;
        let message = failed["detail"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("mmdebstrap failed"), "{failed}");
        a.post("/v1/sandboxes", json!({"template": "deb-broken"}))
            .await
            .err(503, "unavailable");
        assert!(names_in(&h.env().state().join("pulls")).is_empty());
    });
}

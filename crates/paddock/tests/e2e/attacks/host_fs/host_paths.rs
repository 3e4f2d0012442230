//! Nothing inside a sandbox names a host path of paddock's.

use super::*;

/// Nothing inside a sandbox names a host path of paddock's (the state directory, the agent binary
/// or its directory): not the agent's `/proc/1/exe`, `fd/`, `cwd`, `maps` or `mountinfo` as the file
/// API (the agent itself) shows them, nor anything a workload can read under `/proc`, as the
/// sandbox's user or root.
#[test]
fn nothing_host_side_is_named_inside_a_sandbox() {
    let h = Harness::start();
    let state = h.env().state().to_string_lossy().into_owned();
    let agent = agent_bin();
    let needles = [
        state.clone(),
        agent.to_string_lossy().into_owned(),
        agent.parent().expect("dir").to_string_lossy().into_owned(),
        // The user-namespace owner locks the agent keeps (setup/owner.rs).
        "/run/paddock".to_owned(),
    ];
    let check = |what: &str, text: &str| {
        for needle in &needles {
            assert!(!text.contains(needle.as_str()), "{what} names {needle}:\n{text}");
        }
    };
    h.block_on(async {
        let a = h.admin.new_tenant("looker").await;
        let id = a.create_sandbox(json!({})).await;
        // The agent's view, through the file API.
        for path in ["/proc/1/exe", "/proc/1/cwd", "/proc/self/exe"] {
            let r = a
                .get_q(&format!("/v1/sandboxes/{id}/files/stat"), &[("path", path)])
                .await;
            check(path, &r.text());
        }
        let fds = a
            .get_q(
                &format!("/v1/sandboxes/{id}/files/list"),
                &[("path", "/proc/1/fd")],
            )
            .await
            .ok(200);
        assert!(
            fds.to_string().contains("socket:["),
            "the listing shows link targets: {fds}"
        );
        check("/proc/1/fd", &fds.to_string());
        for path in [
            "/proc/1/maps",
            "/proc/1/mountinfo",
            "/proc/1/environ",
            "/proc/1/cmdline",
        ] {
            let r = a.read_file(&id, path).await;
            assert_eq!(r.status, 200, "{path}: {r:?}");
            check(path, &r.text());
        }
        // A workload's view, as the sandbox's user and root.
        let script = "for f in /proc/[0-9]*/exe /proc/[0-9]*/cwd /proc/[0-9]*/root /proc/[0-9]*/fd/*; do \
                      printf '%s -> %s\\n' \"$f\" \"$(readlink \"$f\" 2>&1)\"; done; \
                      cat /proc/[0-9]*/maps /proc/self/mountinfo /proc/[0-9]*/mountinfo 2>&1";
        for user in ["user", "root"] {
            let r = a.exec_json(&id, json!({"shell": script, "user": user})).await;
            let out = format!(
                "{}{}",
                r["stdout"].as_str().unwrap_or(""),
                r["stderr"].as_str().unwrap_or("")
            );
            assert!(
                out.contains("/proc/self/mountinfo") || out.contains(" / / "),
                "{out}"
            );
            check(&format!("/proc as {user}"), &out);
        }
    });
}

// ---- helpers ----

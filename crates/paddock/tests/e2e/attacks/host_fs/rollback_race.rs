//! A kill or a stop racing a rollback never leaves an init the service does not hold.

use super::*;

/// A kill, or a stop, arriving while a rollback (cold or prepared) runs: whichever finishes second
/// sees the other's result, so afterwards the sandbox is ended (or stopped) with no process left in
/// its cgroups, and never running unrecorded. The kill is sent at staggered moments after the
/// rollback (the delays only spread the interleavings; every one must end clean).
#[test]
fn a_kill_racing_a_rollback_leaves_no_untracked_init() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("racer").await;
        for round in 0..12u64 {
            let id = a.create_sandbox(json!({})).await;
            a.exec_background(&id, json!({"argv": ["sleep", "1000"]})).await;
            let prepared = round % 3 == 2;
            let body = if prepared {
                a.post(&format!("/v1/sandboxes/{id}/checkpoint"), Value::Null)
                    .await
                    .ok(201);
                Value::Null
            } else {
                json!({"snapshot": snapshot_of(&a, &id).await})
            };
            let stop = round % 4 == 3;
            let delay = Duration::from_millis(round * 9 % 70);
            let rollback_path = format!("/v1/sandboxes/{id}/rollback");
            let rollback = a.post(&rollback_path, body);
            let end = async {
                tokio::time::sleep(delay).await;
                if stop {
                    a.post(&format!("/v1/sandboxes/{id}/stop"), Value::Null).await
                } else {
                    a.delete(&format!("/v1/sandboxes/{id}")).await
                }
            };
            let (rolled, ended) = tokio::join!(rollback, end);
            let info = a.get(&format!("/v1/sandboxes/{id}")).await.ok(200);
            let state = info["state"].as_str().expect("state").to_owned();
            let context = format!(
                "round {round} (prepared {prepared}, stop {stop}, delay {delay:?}): rollback {} {}, \
                 end {} {}, state {state}",
                rolled.status,
                rolled.text(),
                ended.status,
                ended.text()
            );
            eprintln!("{context}");
            if state == "running" {
                // Only if the end lost cleanly (a stop refused because the sandbox was restarting
                // is an answer too); then it must still be fully served.
                assert!(stop, "{context}");
                assert_eq!(a.sh(&id, "echo alive").await, "alive\n", "{context}");
                a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
            } else {
                assert!(
                    matches!(state.as_str(), "killed" | "stopped" | "failed"),
                    "{context}"
                );
            }
            // Nothing of it runs any more (and nothing is left in its cgroups).
            let left = poll(Duration::from_secs(30), "its processes to go", || async {
                let procs = h.env().processes();
                procs.is_empty().then_some(())
            });
            tokio::time::timeout(Duration::from_secs(60), left)
                .await
                .unwrap_or_else(|_| panic!("{context}: processes left: {:?}", h.env().processes()));
            if state == "stopped" {
                a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
            }
            assert!(
                h.env().cgroup_ids().is_empty(),
                "{context}: {:?}",
                h.env().cgroup_ids()
            );
        }
    });
}

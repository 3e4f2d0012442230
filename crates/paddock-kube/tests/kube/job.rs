//! `job_for` and `manifests`: golden files (regenerate with
//! `UPDATE_GOLDEN=1 cargo test -p paddock-kube --test kube` and review the diff), and properties:
//! every security field is set, whatever the spec says.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use paddock_control::ExecutionSpec;
use paddock_kube::{job_for, manifests, JobSettings, ManifestOptions, PullPolicy};
use proptest::prelude::*;
use serde_json::Value;

/// The spec the golden file and the schema check use: every optional part present.
pub fn golden_spec() -> ExecutionSpec {
    ExecutionSpec {
        id: "ex-00112233aabbccdd".to_owned(),
        tenant: "acme corp".to_owned(),
        template: None,
        image: Some("registry.example/tools:1.2".to_owned()),
        command: vec!["sh".to_owned(), "-c".to_owned()],
        args: vec!["kubectl rollout restart deploy/web".to_owned()],
        env: BTreeMap::from([
            ("ZONE".to_owned(), "eu-1".to_owned()),
            ("APP".to_owned(), "web".to_owned()),
        ]),
        timeout: Duration::from_millis(90_500),
        log_limit: 65536,
        labels: BTreeMap::from([
            ("session_id".to_owned(), "ses-1".to_owned()),
            ("task id".to_owned(), "T#42".to_owned()),
        ]),
    }
}

/// Settings with every optional part present.
pub fn golden_settings() -> JobSettings {
    JobSettings {
        runtime_class_name: Some("gvisor".to_owned()),
        image_pull_policy: Some(PullPolicy::IfNotPresent),
        ..JobSettings::default()
    }
}

fn check_golden(file: &str, actual: &str) {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, actual).expect("write golden file");
        return;
    }
    let expected = std::fs::read_to_string(&golden).expect("read golden file (UPDATE_GOLDEN=1 creates it)");
    assert!(
        expected == actual,
        "tests/golden/{file} differs; if the change is intended, regenerate with UPDATE_GOLDEN=1 and \
         review the diff.\n--- actual ---\n{actual}"
    );
}

#[test]
fn the_job_matches_its_golden_file() {
    let job = job_for(&golden_spec(), &golden_settings());
    let json = serde_json::to_string_pretty(&job).expect("job json") + "\n";
    check_golden("job.json", &json);
}

#[test]
fn the_manifests_match_their_golden_file() {
    let options = ManifestOptions {
        api_server_cidrs: vec!["10.0.0.1/32".parse().expect("cidr")],
        ..ManifestOptions::default()
    };
    check_golden("manifests.yaml", &manifests(&JobSettings::default(), &options));
}

#[test]
fn the_network_policy_has_no_api_server_rule_without_its_addresses() {
    let built = paddock_kube::Manifests::build(&JobSettings::default(), &ManifestOptions::default());
    let policy = serde_json::to_value(&built.network_policy).expect("json");
    let egress = policy["spec"]["egress"].as_array().expect("egress rules");
    assert_eq!(egress.len(), 1, "DNS only: {policy}");
    assert_eq!(egress[0]["ports"][0]["port"], 53);
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    // No rule anywhere without a destination: that would open its ports to the whole internet.
    assert!(egress
        .iter()
        .all(|rule| rule["to"].as_array().is_some_and(|to| !to.is_empty())));
}

/// Every field that confines the pod, checked on the Job as JSON (as built, or as an API server
/// received it).
pub fn assert_locked_down(job: &Value) {
    let spec = &job["spec"];
    assert_eq!(spec["backoffLimit"], 0, "{job}");
    assert!(
        spec["activeDeadlineSeconds"].as_i64().is_some_and(|s| s >= 1),
        "{job}"
    );
    assert!(spec["ttlSecondsAfterFinished"].as_i64().is_some(), "{job}");
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Never");
    assert!(pod["serviceAccountName"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(pod["automountServiceAccountToken"].is_boolean());
    assert_eq!(pod["enableServiceLinks"], false);
    for host in ["hostNetwork", "hostPID", "hostIPC", "hostUsers", "nodeName"] {
        assert!(pod[host].is_null(), "{host} set: {job}");
    }
    let psc = &pod["securityContext"];
    assert_eq!(psc["runAsNonRoot"], true);
    assert!(psc["runAsUser"].as_i64().is_some_and(|u| u > 0));
    assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault");
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1);
    assert!(pod["initContainers"].is_null() && pod["ephemeralContainers"].is_null());
    let c = &containers[0];
    assert_eq!(c["name"], "run");
    assert!(c["image"].as_str().is_some_and(|i| !i.is_empty()));
    let csc = &c["securityContext"];
    assert_eq!(csc["allowPrivilegeEscalation"], false);
    assert_eq!(csc["privileged"], false);
    assert_eq!(csc["readOnlyRootFilesystem"], true);
    assert_eq!(csc["runAsNonRoot"], true);
    assert_eq!(csc["capabilities"], serde_json::json!({"drop": ["ALL"]}));
    for kind in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                c["resources"][kind][resource].is_string(),
                "{kind}.{resource}: {job}"
            );
        }
    }
    let volumes = pod["volumes"].as_array().expect("volumes");
    assert!(
        volumes
            .iter()
            .all(|v| v.as_object().is_some_and(|o| o.len() == 2) && v["emptyDir"].is_object()),
        "only emptyDir volumes: {job}"
    );
    let mounts = c["volumeMounts"].as_array().expect("mounts");
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0]["mountPath"], "/tmp");
    assert!(volumes.iter().any(|v| v["name"] == mounts[0]["name"]));
}

fn any_spec() -> impl Strategy<Value = ExecutionSpec> {
    let text = "\\PC{0,70}";
    (
        (text, text, proptest::option::of(text)),
        (
            proptest::collection::vec(text, 0..4),
            proptest::collection::vec(text, 0..4),
            proptest::collection::btree_map(text, text, 0..4),
        ),
        (any::<u64>(), 0u32..1_000_000_000, any::<u64>()),
        proptest::collection::btree_map(text, text, 0..4),
    )
        .prop_map(
            |((id, tenant, image), (command, args, env), (secs, nanos, log_limit), labels)| ExecutionSpec {
                id,
                tenant,
                template: None,
                image: image.filter(|i| !i.is_empty()),
                command,
                args,
                env,
                timeout: Duration::new(secs, nanos),
                log_limit,
                labels,
            },
        )
}

fn any_settings() -> impl Strategy<Value = JobSettings> {
    (
        any::<bool>(),
        proptest::option::of("[a-z]{1,10}"),
        1u32..,
        any::<u32>(),
    )
        .prop_map(|(automount, runtime_class_name, run_as_user, ttl)| JobSettings {
            automount_service_account_token: automount,
            runtime_class_name,
            run_as_user,
            ttl_seconds_after_finished: ttl,
            ..JobSettings::default()
        })
}

fn is_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && v.as_bytes()[0].is_ascii_alphanumeric()
            && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric())
}

proptest! {
    #[test]
    fn every_job_is_locked_down_and_validly_named(spec in any_spec(), settings in any_settings()) {
        let job = serde_json::to_value(job_for(&spec, &settings)).expect("json");
        assert_locked_down(&job);
        let pod = &job["spec"]["template"]["spec"];
        let automount = Value::Bool(settings.automount_service_account_token);
        prop_assert_eq!(&pod["automountServiceAccountToken"], &automount);
        prop_assert_eq!(pod["securityContext"]["runAsUser"].as_i64(), Some(i64::from(settings.run_as_user)));
        let name = job["metadata"]["name"].as_str().expect("name");
        prop_assert!(
            !name.is_empty() && name.len() <= 63
                && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !name.starts_with('-') && !name.ends_with('-'),
            "job name {:?}", name
        );
        for labels in [&job["metadata"]["labels"], &job["spec"]["template"]["metadata"]["labels"]] {
            let labels = labels.as_object().expect("labels");
            prop_assert_eq!(labels["app.kubernetes.io/managed-by"].as_str(), Some("paddock"));
            for (key, value) in labels {
                let value = value.as_str().expect("string label");
                prop_assert!(is_label_value(value), "label {}={:?}", key, value);
                let name = key.rsplit('/').next().unwrap_or_default();
                prop_assert!(!name.is_empty() && is_label_value(name), "label key {:?}", key);
            }
        }
        // The timeout, rounded up to whole seconds, at least 1.
        let deadline = job["spec"]["activeDeadlineSeconds"].as_i64().expect("deadline");
        let want = spec.timeout.as_secs() + u64::from(spec.timeout.subsec_nanos() > 0);
        prop_assert_eq!(deadline, i64::try_from(want.max(1)).unwrap_or(i64::MAX));
        // Environment variables in name order.
        let env: Vec<&str> = pod["containers"][0]["env"]
            .as_array()
            .map(|e| e.iter().filter_map(|v| v["name"].as_str()).collect())
            .unwrap_or_default();
        let mut sorted = env.clone();
        sorted.sort_unstable();
        prop_assert_eq!(env, sorted);
    }
}

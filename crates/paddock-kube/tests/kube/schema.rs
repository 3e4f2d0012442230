//! The Job and the manifests against Kubernetes' own OpenAPI schemas, offline: the PyPI package
//! `kubernetes-validate` (pinned in `tests/requirements-kubernetes-validate.txt`) bundles them
//! per Kubernetes version. `scripts/install-e2b-clients.sh` installs it (into
//! `target/e2b-clients/python-kubernetes-validate`); without it these tests fail, never skip.
//!
//! The version checked is the minor of the k8s-openapi feature the workspace pins (`v1_33`), and
//! `--strict` refuses fields the schema does not know, so a misspelt field fails too.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use paddock_kube::{job_for, manifests, JobSettings, ManifestOptions};

use crate::job::{golden_settings, golden_spec};

/// The Kubernetes version whose schemas are used: k8s-openapi's `v1_33`.
const KUBERNETES_VERSION: &str = "1.33.0";

fn validator() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin = root.join("target/e2b-clients/python-kubernetes-validate/bin/kubernetes-validate");
    assert!(
        bin.is_file(),
        "{} is missing: run scripts/install-e2b-clients.sh (scripts/test.sh does), which installs \
         kubernetes-validate from PyPI into that venv",
        bin.display()
    );
    bin
}

fn validate(files: &[PathBuf]) -> Output {
    Command::new(validator())
        .args(["--strict", "--no-warn", "-k", KUBERNETES_VERSION])
        .args(files)
        .output()
        .expect("run kubernetes-validate")
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write manifest");
    path
}

#[test]
fn jobs_and_manifests_pass_the_kubernetes_schema() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let full = serde_json::to_string_pretty(&job_for(&golden_spec(), &golden_settings())).expect("json");
    let mut bare_spec = golden_spec();
    bare_spec.image = None;
    bare_spec.command.clear();
    bare_spec.args.clear();
    bare_spec.env.clear();
    bare_spec.labels.clear();
    let bare = serde_json::to_string_pretty(&job_for(&bare_spec, &JobSettings::default())).expect("json");
    let with_api_server = ManifestOptions {
        api_server_cidrs: vec![
            "10.0.0.1/32".parse().expect("cidr"),
            "fd00::1/128".parse().expect("cidr"),
        ],
        ..ManifestOptions::default()
    };
    let files = [
        write(dir.path(), "job.json", &full),
        write(dir.path(), "bare-job.json", &bare),
        write(
            dir.path(),
            "manifests.yaml",
            &manifests(&JobSettings::default(), &with_api_server),
        ),
        write(
            dir.path(),
            "manifests-dns-only.yaml",
            &manifests(&golden_settings(), &ManifestOptions::default()),
        ),
        // Names YAML 1.1 reads as a boolean and a null unless quoted.
        write(
            dir.path(),
            "manifests-yaml-words.yaml",
            &manifests(
                &JobSettings {
                    namespace: "yes".to_owned(),
                    service_account: "null".to_owned(),
                    ..JobSettings::default()
                },
                &ManifestOptions {
                    server_account: "on".to_owned(),
                    server_namespace: "true".to_owned(),
                    ..ManifestOptions::default()
                },
            ),
        ),
    ];
    let out = validate(&files);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kubernetes-validate refused them:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // All seventeen objects (two Jobs, three times five manifests) were checked against that
    // version, none silently passed over.
    let passed = format!("against version {}", &KUBERNETES_VERSION[..4]);
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.contains("passed") && l.contains(&passed))
            .count(),
        17,
        "{stdout}"
    );
}

#[test]
fn a_broken_job_fails_the_schema_check() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut job = serde_json::to_value(job_for(&golden_spec(), &golden_settings())).expect("json");
    job["spec"]["backoffLimit"] = serde_json::json!("zero");
    let broken = write(dir.path(), "broken.json", &job.to_string());
    let out = validate(&[broken]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a broken Job passed: {text}");
    assert!(text.contains("backoffLimit") && text.contains("zero"), "{text}");

    // And a field the API does not have, which only --strict refuses.
    let mut job = serde_json::to_value(job_for(&golden_spec(), &golden_settings())).expect("json");
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] =
        serde_json::json!(true);
    let misspelt = write(dir.path(), "misspelt.json", &job.to_string());
    let out = validate(&[misspelt]);
    assert!(!out.status.success(), "a misspelt field passed");
}

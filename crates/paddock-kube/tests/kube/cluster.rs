//! Against a real cluster, opt-in: built only to run when `KUBECONFIG` is set (see `build.rs`);
//! otherwise reported as skipped, with the reason. It applies nothing cluster-wide: one tiny Job
//! in the kubeconfig context's namespace (or `PADDOCK_KUBE_TEST_NAMESPACE`), run as that
//! namespace's `default` service account (or `PADDOCK_KUBE_TEST_SERVICE_ACCOUNT`), in
//! `busybox:1.37` (or `PADDOCK_KUBE_TEST_IMAGE`), then deleted.
//!
//! The account running the test needs, in that namespace, what the Role in `manifests` grants.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use paddock_control::{ExecutionSpec, Executor, ExecutorStatus, Finished, Outcome};
use paddock_kube::{JobSettings, KubernetesJobExecutor};

/// How long the Job may take, image pull included.
const DEADLINE: Duration = Duration::from_secs(300);

#[tokio::test]
#[cfg_attr(
    not(paddock_kube_cluster),
    ignore = "SKIPPED: KUBECONFIG is not set; set it to run this test against a real cluster"
)]
async fn a_job_runs_on_a_real_cluster() {
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "built for a cluster (KUBECONFIG was set at build time) but KUBECONFIG is not set now"
    );
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let client = kube::Client::try_default().await.expect("client from KUBECONFIG");
    let settings = JobSettings {
        namespace: env("PADDOCK_KUBE_TEST_NAMESPACE")
            .unwrap_or_else(|| client.default_namespace().to_owned()),
        service_account: env("PADDOCK_KUBE_TEST_SERVICE_ACCOUNT").unwrap_or_else(|| "default".to_owned()),
        default_image: env("PADDOCK_KUBE_TEST_IMAGE").unwrap_or_else(|| "busybox:1.37".to_owned()),
        ttl_seconds_after_finished: 300,
        ..JobSettings::default()
    };
    let executor = KubernetesJobExecutor::new(client, settings).expect("valid settings");
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let spec = ExecutionSpec {
        id: format!("ex-test-{:016x}", (nanos as u64) ^ u64::from(std::process::id())),
        tenant: "paddock-test".to_owned(),
        template: None,
        image: None,
        command: vec!["echo".to_owned()],
        args: vec!["hi".to_owned()],
        env: BTreeMap::new(),
        timeout: Duration::from_secs(120),
        log_limit: 4096,
        labels: BTreeMap::from([("test".to_owned(), "cluster".to_owned())]),
    };
    let job = executor.execute(&spec).await.expect("create the job");
    let outcome = wait_for_end(&executor, &job, &spec).await;
    // Removed whatever happened above; a second cancel is a success too.
    executor.cancel(&job).await.expect("cancel");
    executor.cancel(&job).await.expect("second cancel");
    let finished = outcome.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (finished.outcome, finished.exit_code),
        (Outcome::Succeeded, Some(0)),
        "{finished:?}"
    );
    assert_eq!(finished.logs, b"hi\n");
    assert!(!finished.truncated);
}

/// Polls `status` until the Job ends or [`DEADLINE`] passes.
async fn wait_for_end(
    executor: &KubernetesJobExecutor,
    job: &str,
    spec: &ExecutionSpec,
) -> Result<Finished, String> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        match executor.status(job, spec).await {
            Ok(ExecutorStatus::Finished(finished)) => return Ok(finished),
            Ok(ExecutorStatus::Running) => {}
            Err(e) => return Err(format!("status of {job}: {e}")),
        }
        if Instant::now() >= deadline {
            return Err(format!("job {job} still running after {DEADLINE:?}"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

//! The executor through the real `kube::Client` against the loopback API server of `fake_api`.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::http::Method;
use paddock_control::{ExecutionSpec, Executor, ExecutorStatus, Finished, Outcome};
use paddock_kube::JobSettings;
use serde_json::json;

use crate::fake_api::FakeApi;

const NS: &str = "paddock-executions";

fn spec(id: &str) -> ExecutionSpec {
    ExecutionSpec {
        id: id.to_owned(),
        tenant: "acme".to_owned(),
        template: None,
        image: Some("debian:12-slim".to_owned()),
        command: vec!["sh".to_owned(), "-c".to_owned()],
        args: vec!["echo hello".to_owned()],
        env: BTreeMap::from([("A".to_owned(), "1".to_owned())]),
        timeout: Duration::from_secs(60),
        log_limit: 1024,
        labels: BTreeMap::new(),
    }
}

async fn started(id: &str) -> (FakeApi, paddock_kube::KubernetesJobExecutor, ExecutionSpec) {
    let (api, executor) = FakeApi::start(JobSettings::default()).await;
    let spec = spec(id);
    let name = executor.execute(&spec).await.expect("execute");
    assert_eq!(name, id, "paddock's ids are valid Job names as they are");
    (api, executor, spec)
}

async fn finished(executor: &paddock_kube::KubernetesJobExecutor, spec: &ExecutionSpec) -> Finished {
    match executor.status(&spec.id, spec).await.expect("status") {
        ExecutorStatus::Finished(finished) => finished,
        ExecutorStatus::Running => panic!("{} still running", spec.id),
    }
}

#[tokio::test]
async fn execute_creates_a_locked_down_job_once() {
    let (api, executor, spec) = started("ex-0000000000000001").await;
    assert_eq!(executor.backend(), "kubernetes-job");
    let posts: Vec<_> = api
        .seen()
        .into_iter()
        .filter(|s| s.method == Method::POST)
        .collect();
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].path, format!("/apis/batch/v1/namespaces/{NS}/jobs"));
    let received = posts[0].body.clone().expect("job body");
    crate::job::assert_locked_down(&received);
    assert_eq!(received["metadata"]["labels"]["paddock.dev/execution"], spec.id);
    assert_eq!(
        received["spec"]["template"]["spec"]["containers"][0]["image"],
        "debian:12-slim"
    );

    // Again (a retry after a lost answer): the same Job, no error.
    assert_eq!(executor.execute(&spec).await.expect("execute again"), spec.id);
    // A Job of that name made for another execution is a clash, not a success.
    let mut other = api.job(NS, &spec.id).expect("stored job");
    other["metadata"]["name"] = json!("ex-0000000000000002");
    other["metadata"]["labels"]["paddock.dev/execution"] = json!("ex-something-else");
    api.put_job(NS, other);
    let err = executor
        .execute(&self::spec("ex-0000000000000002"))
        .await
        .expect_err("name clash");
    assert!(err.message.contains("another execution"), "{err}");
    assert!(!err.gone);
    api.assert_nothing_unexpected();
}

#[tokio::test]
async fn a_job_runs_then_succeeds_with_exit_code_and_logs() {
    let (api, executor, spec) = started("ex-0000000000000010").await;
    assert_eq!(
        executor.status(&spec.id, &spec).await.expect("status"),
        ExecutorStatus::Running
    );
    api.end_job(
        NS,
        &spec.id,
        "Complete",
        "CompletionsReached",
        "Reached expected number of succeeded pods",
    );
    api.add_pod(NS, &spec.id, 0, b"hello\n");
    let done = finished(&executor, &spec).await;
    assert_eq!(
        done,
        Finished {
            outcome: Outcome::Succeeded,
            exit_code: Some(0),
            logs: b"hello\n".to_vec(),
            truncated: false,
            message: None,
        }
    );
    // The pod was found by the controller's uid, and the logs asked of its `run` container.
    let seen = api.seen();
    let list = seen
        .iter()
        .find(|s| s.path.ends_with("/pods"))
        .expect("pods listed");
    assert_eq!(
        list.query["labelSelector"],
        format!("batch.kubernetes.io/controller-uid=uid-{}", spec.id)
    );
    let log = seen.iter().find(|s| s.path.ends_with("/log")).expect("logs read");
    assert_eq!(
        log.path,
        format!("/api/v1/namespaces/{NS}/pods/{}-abcde/log", spec.id)
    );
    assert_eq!(log.query["container"], "run");
    assert_eq!(log.query["limitBytes"], "1025");
    api.assert_nothing_unexpected();
}

#[tokio::test]
async fn a_failed_job_gives_its_exit_code_and_reason() {
    let (api, executor, spec) = started("ex-0000000000000020").await;
    api.end_job(
        NS,
        &spec.id,
        "Failed",
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
    );
    api.add_pod(NS, &spec.id, 3, b"boom\n");
    let done = finished(&executor, &spec).await;
    assert_eq!(done.outcome, Outcome::Failed);
    assert_eq!(done.exit_code, Some(3));
    assert_eq!(done.logs, b"boom\n");
    assert_eq!(
        done.message.as_deref(),
        Some("BackoffLimitExceeded: Job has reached the specified backoff limit")
    );
}

#[tokio::test]
async fn a_job_past_its_deadline_timed_out() {
    let (api, executor, spec) = started("ex-0000000000000030").await;
    api.end_job(
        NS,
        &spec.id,
        "Failed",
        "DeadlineExceeded",
        "Job was active longer than specified deadline",
    );
    api.add_pod(NS, &spec.id, 137, b"partial");
    let done = finished(&executor, &spec).await;
    assert_eq!(done.outcome, Outcome::TimedOut);
    assert_eq!(done.logs, b"partial");
    assert!(done
        .message
        .as_deref()
        .is_some_and(|m| m.starts_with("DeadlineExceeded")));
}

#[tokio::test]
async fn logs_are_cut_at_the_limit_and_say_so() {
    let (api, executor, mut spec) = started("ex-0000000000000040").await;
    api.end_job(NS, &spec.id, "Complete", "CompletionsReached", "");
    api.add_pod(NS, &spec.id, 0, &[b'x'; 100]);
    spec.log_limit = 10;
    let done = finished(&executor, &spec).await;
    assert_eq!(done.logs, vec![b'x'; 10]);
    assert!(done.truncated);
    let limits: Vec<_> = api
        .seen()
        .into_iter()
        .filter_map(|s| s.query.get("limitBytes").cloned())
        .collect();
    assert_eq!(limits, ["11"]);
    // Exactly the limit is not a cut; one byte more is.
    for (limit, truncated) in [(100, false), (99, true)] {
        spec.log_limit = limit;
        let done = finished(&executor, &spec).await;
        assert_eq!(done.logs.len() as u64, limit);
        assert_eq!(done.truncated, truncated, "limit {limit}");
    }
}

#[tokio::test]
async fn an_ended_job_whose_pod_is_gone_still_has_an_outcome() {
    let (api, executor, spec) = started("ex-0000000000000050").await;
    api.end_job(NS, &spec.id, "Complete", "CompletionsReached", "");
    let done = finished(&executor, &spec).await;
    assert_eq!((done.outcome, done.exit_code), (Outcome::Succeeded, Some(0)));
    assert!(done.logs.is_empty() && !done.truncated);
}

#[tokio::test]
async fn cancel_deletes_with_propagation_and_is_idempotent() {
    let (api, executor, spec) = started("ex-0000000000000060").await;
    api.add_pod(NS, &spec.id, 0, b"");
    executor.cancel(&spec.id).await.expect("cancel");
    let deletes: Vec<_> = api
        .seen()
        .into_iter()
        .filter(|s| s.method == Method::DELETE)
        .collect();
    assert_eq!(deletes.len(), 1);
    assert_eq!(
        deletes[0].path,
        format!("/apis/batch/v1/namespaces/{NS}/jobs/{}", spec.id)
    );
    let options = deletes[0].body.clone().expect("delete options");
    assert_eq!(options["propagationPolicy"], "Foreground", "{options}");
    assert!(api.job(NS, &spec.id).is_none());

    executor.cancel(&spec.id).await.expect("second cancel");
    executor
        .cancel("ex-never-made")
        .await
        .expect("cancel of an unknown job");
    assert_eq!(
        api.seen().iter().filter(|s| s.method == Method::DELETE).count(),
        3
    );
    api.assert_nothing_unexpected();
}

#[tokio::test]
async fn the_status_of_a_deleted_job_is_gone() {
    let (api, executor, spec) = started("ex-0000000000000070").await;
    api.remove_job(NS, &spec.id);
    let err = executor.status(&spec.id, &spec).await.expect_err("gone");
    assert!(err.gone, "{err:?}");
    assert!(err.message.contains(&spec.id), "{err}");
}

#[tokio::test]
async fn an_empty_image_is_refused_before_any_request() {
    let (api, executor) = FakeApi::start(JobSettings::default()).await;
    let mut spec = spec("ex-0000000000000080");
    spec.image = Some(" ".to_owned());
    let err = executor.execute(&spec).await.expect_err("empty image");
    assert!(err.message.contains("image is empty"), "{err}");
    assert!(api.seen().is_empty());
}

#[tokio::test]
async fn an_https_client_builds_with_the_one_crypto_provider() {
    // Building the client sets up rustls (no connection is made): it must find its crypto provider
    // on its own, as the binary's `connect` will.
    let config = kube::Config::new("https://127.0.0.1:6443".parse().expect("url"));
    let client = kube::Client::try_from(config).expect("https client");
    paddock_kube::KubernetesJobExecutor::new(client, JobSettings::default()).expect("executor");
}

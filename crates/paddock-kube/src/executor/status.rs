//! `status`: read the Job; once it has ended, its pod's exit code and logs.

use futures_util::AsyncReadExt as _;
use k8s_openapi::api::batch::v1::{Job, JobCondition};
use k8s_openapi::api::core::v1::{ContainerState, Pod};
use kube::api::{ListParams, LogParams};
use paddock_control::{CappedLogs, ExecutionSpec, ExecutorError, ExecutorStatus, Finished, Outcome};

use super::{api_code, describe, KubernetesJobExecutor};
use crate::job::CONTAINER;

impl KubernetesJobExecutor {
    #[tracing::instrument(skip_all, fields(job = %object, execution_id = %spec.id))]
    pub(super) async fn job_status(
        &self,
        object: &str,
        spec: &ExecutionSpec,
    ) -> Result<ExecutorStatus, ExecutorError> {
        let job = match self.jobs().get(object).await {
            Ok(job) => job,
            Err(e) if api_code(&e) == Some(404) => {
                return Err(ExecutorError::gone(format!(
                    "kubernetes: job {object} is gone (deleted, or removed after it finished)"
                )))
            }
            Err(e) => return Err(describe(&format!("reading job {object}"), &e)),
        };
        let Some((outcome, message)) = ended(&job) else {
            return Ok(ExecutorStatus::Running);
        };
        let pod = self.job_pod(object, &job).await?;
        let state = pod.as_ref().and_then(container_state);
        let mut exit_code = state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code);
        if outcome == Outcome::Succeeded {
            // Complete means the container exited 0, even when its pod is already gone.
            exit_code.get_or_insert(0);
        }
        // A container that never ran says why (ImagePullBackOff, CreateContainerConfigError).
        let waiting = state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.clone());
        let message = match (message, waiting) {
            (Some(m), Some(w)) => Some(format!("{m}; the container was waiting: {w}")),
            (m, w) => m.or(w),
        };
        let (logs, truncated) = match &pod {
            Some(pod) => self.pod_logs(pod, spec.log_limit).await?,
            None => (Vec::new(), false),
        };
        Ok(ExecutorStatus::Finished(Finished {
            outcome,
            exit_code,
            logs,
            truncated,
            message,
        }))
    }

    /// The Job's pod: by the controller's uid label (unique even if a Job of the same name was
    /// made again), by its name on a Job without a uid. With `backoffLimit: 0` there is one; if
    /// more, the newest whose container ended.
    async fn job_pod(&self, name: &str, job: &Job) -> Result<Option<Pod>, ExecutorError> {
        let selector = match &job.metadata.uid {
            Some(uid) => format!("batch.kubernetes.io/controller-uid={uid}"),
            None => format!("batch.kubernetes.io/job-name={name}"),
        };
        let mut pods = self
            .pods()
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| describe(&format!("listing the pods of job {name}"), &e))?
            .items;
        pods.sort_by(|a, b| a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp));
        let ended = pods
            .iter()
            .rposition(|p| container_state(p).is_some_and(|s| s.terminated.is_some()));
        Ok(match ended {
            Some(i) => Some(pods.swap_remove(i)),
            None => pods.pop(),
        })
    }

    /// The first `limit` bytes of the container's output and whether there was more: the API
    /// server is asked for one byte past the limit, so a cut is seen. No logs (the pod is gone,
    /// or its container never started) is an empty output, not an error.
    async fn pod_logs(&self, pod: &Pod, limit: u64) -> Result<(Vec<u8>, bool), ExecutorError> {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let asked = limit.saturating_add(1);
        let params = LogParams {
            container: Some(CONTAINER.to_owned()),
            limit_bytes: Some(i64::try_from(asked).unwrap_or(i64::MAX)),
            ..LogParams::default()
        };
        let doing = || format!("reading the logs of pod {name}");
        let stream = match self.pods().log_stream(name, &params).await {
            Ok(stream) => stream,
            Err(e) if matches!(api_code(&e), Some(400 | 404)) => return Ok((Vec::new(), false)),
            Err(e) => return Err(describe(&doing(), &e)),
        };
        let mut bytes = Vec::new();
        // Read no more than asked, whatever the server sends.
        stream.take(asked).read_to_end(&mut bytes).await.map_err(|e| {
            tracing::warn!(error = %e, pod = %name, "reading logs failed");
            ExecutorError::new(format!("kubernetes: failed {}: the stream broke", doing()))
        })?;
        let mut logs = CappedLogs::new(limit);
        logs.push(&bytes);
        Ok(logs.into_parts())
    }
}

/// How the Job ended, if it has, and why in words when it did not succeed. Only `Complete` and
/// `Failed` are final (`SuccessCriteriaMet` and `FailureTarget` come while pods still stop).
fn ended(job: &Job) -> Option<(Outcome, Option<String>)> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    let is = |c: &&JobCondition, kind: &str| c.type_ == kind && c.status == "True";
    if conditions.iter().any(|c| is(&c, "Complete")) {
        return Some((Outcome::Succeeded, None));
    }
    let failed = conditions.iter().find(|c| is(c, "Failed"))?;
    let reason = failed.reason.clone().unwrap_or_else(|| "Failed".to_owned());
    let outcome = if reason == "DeadlineExceeded" {
        Outcome::TimedOut
    } else {
        Outcome::Failed
    };
    let message = match failed.message.as_deref() {
        Some(m) if !m.is_empty() => format!("{reason}: {m}"),
        _ => reason,
    };
    Some((outcome, Some(message)))
}

/// The state of the `run` container.
fn container_state(pod: &Pod) -> Option<ContainerState> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == CONTAINER)?
        .state
        .clone()
}

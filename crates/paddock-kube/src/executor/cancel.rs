//! `cancel`: delete the Job and, with it, its pods; a Job already gone is a success.

use kube::api::{DeleteParams, PropagationPolicy};
use paddock_control::ExecutorError;

use super::{api_code, describe, KubernetesJobExecutor};

impl KubernetesJobExecutor {
    /// Foreground propagation: the Job stays (marked for deletion) until its pods are gone, so
    /// as long as anything of the execution is left, the Job that names it is too. Kubernetes
    /// finishes the deletion asynchronously (the pod gets its grace period).
    #[tracing::instrument(skip_all, fields(job = %object))]
    pub(super) async fn cancel_job(&self, object: &str) -> Result<(), ExecutorError> {
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            ..DeleteParams::default()
        };
        match self.jobs().delete(object, &params).await {
            Ok(_) => {
                tracing::info!("deleted job");
                Ok(())
            }
            Err(e) if api_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(describe(&format!("deleting job {object}"), &e)),
        }
    }
}

//! `execute`: create the execution's Job; creating it again is a success.

use kube::api::PostParams;
use paddock_control::{ExecutionSpec, ExecutorError};

use super::{api_code, describe, KubernetesJobExecutor};
use crate::job::{job_for, LABEL_EXECUTION};
use crate::names::label_value;

impl KubernetesJobExecutor {
    #[tracing::instrument(skip_all, fields(execution_id = %spec.id))]
    pub(super) async fn execute_job(&self, spec: &ExecutionSpec) -> Result<String, ExecutorError> {
        if spec.image.as_deref().is_some_and(|image| image.trim().is_empty()) {
            return Err(ExecutorError::new("kubernetes: the execution's image is empty"));
        }
        let job = job_for(spec, &self.settings);
        let name = job.metadata.name.clone().unwrap_or_default();
        match self.jobs().create(&PostParams::default(), &job).await {
            Ok(_) => {
                tracing::info!(job = %name, namespace = %self.settings.namespace, "created job");
                Ok(name)
            }
            // Created before (a retry after a lost answer, a restart): the same execution's Job is
            // this execution running; another's is a name clash to refuse.
            Err(e) if api_code(&e) == Some(409) => {
                let existing = self
                    .jobs()
                    .get(&name)
                    .await
                    .map_err(|e| describe(&format!("reading the existing job {name}"), &e))?;
                let owner = existing
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|labels| labels.get(LABEL_EXECUTION));
                if owner == Some(&label_value(&spec.id)) {
                    tracing::info!(job = %name, "job already exists for this execution");
                    Ok(name)
                } else {
                    Err(ExecutorError::new(format!(
                        "kubernetes: a job named {name} already exists for another execution"
                    )))
                }
            }
            Err(e) => Err(describe(&format!("creating job {name}"), &e)),
        }
    }
}

//! [`KubernetesJobExecutor`]: the [`Executor`] that runs each approved execution as one Job, with
//! one file per operation (`execute`, `status`, `cancel`).

mod cancel;
mod execute;
mod status;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use paddock_control::{BoxFuture, ExecutionSpec, Executor, ExecutorError, ExecutorStatus};

use crate::settings::{JobSettings, SettingsError};

/// Runs approved executions as Kubernetes Jobs in `settings.namespace`, through `client`.
///
/// The client needs, in that namespace, what [`crate::manifests`]' Role grants: jobs
/// create/get/list/watch/delete, pods get/list/watch, pods/log get. Nothing cluster-wide.
#[derive(Clone)]
pub struct KubernetesJobExecutor {
    client: kube::Client,
    settings: JobSettings,
}

impl std::fmt::Debug for KubernetesJobExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesJobExecutor")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Why the executor could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error("failed to load the Kubernetes client configuration (KUBECONFIG, ~/.kube/config or in-cluster)")]
    Config(#[source] kube::Error),
}

impl KubernetesJobExecutor {
    /// The executor for `settings` (validated first) through `client`.
    pub fn new(client: kube::Client, settings: JobSettings) -> Result<Self, SettingsError> {
        settings.validate()?;
        Ok(Self { client, settings })
    }

    /// The executor for `settings`, with a client configured as `kubectl` would be: `KUBECONFIG`,
    /// then `~/.kube/config`, then the in-cluster service account.
    pub async fn connect(settings: JobSettings) -> Result<Self, ConnectError> {
        settings.validate()?;
        let client = kube::Client::try_default().await.map_err(ConnectError::Config)?;
        Ok(Self { client, settings })
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &JobSettings {
        &self.settings
    }

    fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }
}

impl Executor for KubernetesJobExecutor {
    fn backend(&self) -> &'static str {
        "kubernetes-job"
    }

    fn execute<'a>(&'a self, spec: &'a ExecutionSpec) -> BoxFuture<'a, Result<String, ExecutorError>> {
        Box::pin(self.execute_job(spec))
    }

    fn status<'a>(
        &'a self,
        object: &'a str,
        spec: &'a ExecutionSpec,
    ) -> BoxFuture<'a, Result<ExecutorStatus, ExecutorError>> {
        Box::pin(self.job_status(object, spec))
    }

    fn cancel<'a>(&'a self, object: &'a str) -> BoxFuture<'a, Result<(), ExecutorError>> {
        Box::pin(self.cancel_job(object))
    }
}

/// The HTTP status of an API error, if `error` is one.
fn api_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// `error` in words fit for the execution's owner: the API server's own message for an API
/// error; for anything else (a connection, TLS, a malformed answer) a generic sentence, with the
/// detail (which may name cluster addresses) in the server's log only.
fn describe(doing: &str, error: &kube::Error) -> ExecutorError {
    match error {
        kube::Error::Api(status) => ExecutorError::new(format!(
            "kubernetes: failed {doing}: {} ({})",
            status.message, status.code
        )),
        kube::Error::BuildRequest(e) => ExecutorError::new(format!("kubernetes: failed {doing}: {e}")),
        other => {
            tracing::warn!(error = %other, "kubernetes API request failed while {doing}");
            ExecutorError::new(format!(
                "kubernetes: failed {doing}: the API server could not be reached"
            ))
        }
    }
}

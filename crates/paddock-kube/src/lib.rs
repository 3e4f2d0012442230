//! The `kubernetes-job` executor: each approved execution runs as one Kubernetes Job, in a pod
//! locked down whatever the execution asks (non-root, `RuntimeDefault` seccomp, no capabilities,
//! no privilege escalation, read-only root with an `emptyDir` at `/tmp`, no service-account token
//! unless configured), behind `paddock_control::Executor`.
//!
//! - [`JobSettings`]: `[executions.kubernetes]` in the server's configuration, and its checks.
//! - [`job_for`]: the Job for an execution; a pure function, golden- and property-tested.
//! - [`manifests`]: what an administrator applies once: the namespace, the pods' service account,
//!   a Role and RoleBinding giving `paddock serve` exactly what the executor uses there, and a
//!   NetworkPolicy letting the pods reach DNS (and the API server, when its addresses are given)
//!   and nothing else.
//! - [`KubernetesJobExecutor`]: create, read (outcome, exit code, capped logs) and delete Jobs
//!   through `kube`'s client.
//!
//! What it does not do: decide what runs or when (the control plane approves, polls `status` and
//! calls `cancel` at the deadline), apply its own manifests or touch anything outside its
//! namespace, watch (it is polled), or run sandboxes on Kubernetes (that would be a runtime
//! backend, not an executor).

mod executor;
mod job;
mod manifests;
mod names;
mod settings;

pub use crate::executor::{ConnectError, KubernetesJobExecutor};
pub use crate::job::{job_for, CONTAINER, LABEL_EXECUTION, LABEL_MANAGED_BY, LABEL_TENANT, MANAGED_BY};
pub use crate::manifests::{manifests, ManifestOptions, Manifests, OBJECT_NAME};
pub use crate::settings::{
    JobResources, JobSettings, PullPolicy, ResourceLimits, ResourceRequests, SettingsError,
};

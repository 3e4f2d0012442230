//! [`job_for`]: the Job an approved execution runs as. A pure function of the spec and the
//! settings: every security field is set here, whatever the spec says, so no execution can ask
//! for more than the settings give.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, PodSecurityContext, PodSpec, PodTemplateSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use paddock_control::ExecutionSpec;

use crate::names::{job_name, label_name, label_value};
use crate::settings::JobSettings;

/// `app.kubernetes.io/managed-by`: on everything paddock creates (the NetworkPolicy selects the
/// executions' pods by it).
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "paddock";
/// The execution id, as a label value.
pub const LABEL_EXECUTION: &str = "paddock.dev/execution";
/// The tenant, as a label value.
pub const LABEL_TENANT: &str = "paddock.dev/tenant";
/// The caller's own labels go under this prefix (`paddock.dev/session_id`).
const LABEL_PREFIX: &str = "paddock.dev/";
/// The one container's name.
pub const CONTAINER: &str = "run";
/// The writable scratch directory (the root file system is read-only).
const TMP: &str = "/tmp";

/// The Job that runs `spec` under `settings`: named after the execution, run once
/// (`backoffLimit: 0`, `restartPolicy: Never`), ended by Kubernetes at the spec's timeout, kept
/// `ttl_seconds_after_finished` once over, in a pod that is non-root, seccomp'd, without
/// capabilities or privilege escalation, on a read-only root with an `emptyDir` at `/tmp`.
pub fn job_for(spec: &ExecutionSpec, settings: &JobSettings) -> Job {
    let labels = labels_for(spec);
    let metadata = ObjectMeta {
        name: Some(job_name(&spec.id)),
        namespace: Some(settings.namespace.clone()),
        labels: Some(labels.clone()),
        ..ObjectMeta::default()
    };
    let run_as_user = i64::from(settings.run_as_user);
    let pod = PodSpec {
        restart_policy: Some("Never".to_owned()),
        service_account_name: Some(settings.service_account.clone()),
        automount_service_account_token: Some(settings.automount_service_account_token),
        runtime_class_name: settings.runtime_class_name.clone(),
        // Service addresses as environment variables are noise at best, a map of the cluster at
        // worst.
        enable_service_links: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(run_as_user),
            run_as_group: Some(run_as_user),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        containers: vec![container_for(spec, settings)],
        volumes: Some(vec![Volume {
            name: "tmp".to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(Quantity(settings.tmp_size_limit.clone())),
                ..EmptyDirVolumeSource::default()
            }),
            ..Volume::default()
        }]),
        ..PodSpec::default()
    };
    Job {
        metadata,
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(deadline_seconds(spec.timeout)),
            ttl_seconds_after_finished: Some(
                i32::try_from(settings.ttl_seconds_after_finished).unwrap_or(i32::MAX),
            ),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..JobSpec::default()
        }),
        status: None,
    }
}

fn container_for(spec: &ExecutionSpec, settings: &JobSettings) -> Container {
    let image = spec
        .image
        .clone()
        .unwrap_or_else(|| settings.default_image.clone());
    let amounts = |cpu: &str, memory: &str| {
        BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(memory.to_owned())),
        ])
    };
    let resources = &settings.resources;
    Container {
        name: CONTAINER.to_owned(),
        image: Some(image),
        image_pull_policy: settings.image_pull_policy.map(|p| p.as_str().to_owned()),
        command: non_empty(spec.command.clone()),
        args: non_empty(spec.args.clone()),
        // A BTreeMap: sorted by name, so the same spec always gives the same Job.
        env: non_empty(
            spec.env
                .iter()
                .map(|(name, value)| EnvVar {
                    name: name.clone(),
                    value: Some(value.clone()),
                    value_from: None,
                })
                .collect(),
        ),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                add: None,
            }),
            ..SecurityContext::default()
        }),
        resources: Some(ResourceRequirements {
            requests: Some(amounts(&resources.requests.cpu, &resources.requests.memory)),
            limits: Some(amounts(&resources.limits.cpu, &resources.limits.memory)),
            ..ResourceRequirements::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "tmp".to_owned(),
            mount_path: TMP.to_owned(),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    }
}

/// The caller's labels (under `paddock.dev/`), then ours over them: a caller cannot pose as
/// another execution or tenant.
fn labels_for(spec: &ExecutionSpec) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = spec
        .labels
        .iter()
        .map(|(k, v)| (format!("{LABEL_PREFIX}{}", label_name(k)), label_value(v)))
        .collect();
    labels.insert(LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
    labels.insert(LABEL_EXECUTION.to_owned(), label_value(&spec.id));
    labels.insert(LABEL_TENANT.to_owned(), label_value(&spec.tenant));
    labels
}

/// The timeout in whole seconds, rounded up, at least 1 (Kubernetes refuses 0).
fn deadline_seconds(timeout: Duration) -> i64 {
    let secs = timeout
        .as_secs()
        .saturating_add(u64::from(timeout.subsec_nanos() > 0));
    i64::try_from(secs).unwrap_or(i64::MAX).max(1)
}

fn non_empty<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_round_up_and_are_never_zero() {
        assert_eq!(deadline_seconds(Duration::ZERO), 1);
        assert_eq!(deadline_seconds(Duration::from_millis(1)), 1);
        assert_eq!(deadline_seconds(Duration::from_secs(30)), 30);
        assert_eq!(deadline_seconds(Duration::from_millis(30_001)), 31);
        assert_eq!(deadline_seconds(Duration::MAX), i64::MAX);
    }
}

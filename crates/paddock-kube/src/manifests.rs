//! [`manifests`]: what a cluster administrator applies once (`kubectl apply -f`) so the executor
//! can run: the executions' namespace, the service account their pods run as, the least
//! permissions `paddock serve` needs there, and a NetworkPolicy that shuts the pods in.
//!
//! Built from k8s-openapi's types, so every field name is the API's own.

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::job::{LABEL_MANAGED_BY, MANAGED_BY};
use crate::settings::JobSettings;

/// The name of the Role, RoleBinding and NetworkPolicy in the executions' namespace.
pub const OBJECT_NAME: &str = "paddock-executions";

/// What the manifests need beyond [`JobSettings`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestOptions {
    /// The service account `paddock serve` runs as (in-cluster, or the one whose token its
    /// kubeconfig holds): the RoleBinding grants it the executor's permissions. Default `paddock`.
    pub server_account: String,
    /// That account's namespace. Default `paddock-system`.
    pub server_namespace: String,
    /// Where the executions' pods may reach the API server (TCP 443 and 6443): its endpoint
    /// addresses (`kubectl get endpoints kubernetes -n default`), as CIDRs. Empty (the default):
    /// the pods reach DNS only. NetworkPolicy cannot name the API server otherwise, and a port
    /// rule without addresses would open HTTPS to the whole internet.
    pub api_server_cidrs: Vec<IpNet>,
}

impl Default for ManifestOptions {
    fn default() -> Self {
        Self {
            server_account: "paddock".to_owned(),
            server_namespace: "paddock-system".to_owned(),
            api_server_cidrs: Vec::new(),
        }
    }
}

/// The objects [`manifests`] renders, in the order they apply.
#[derive(Debug, Clone)]
pub struct Manifests {
    pub namespace: Namespace,
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub network_policy: NetworkPolicy,
}

/// The objects as one multi-document YAML stream, ready for `kubectl apply -f -`.
pub fn manifests(settings: &JobSettings, options: &ManifestOptions) -> String {
    Manifests::build(settings, options).to_yaml()
}

impl Manifests {
    /// The five objects for `settings` and `options`.
    pub fn build(settings: &JobSettings, options: &ManifestOptions) -> Self {
        let ns = &settings.namespace;
        let meta = |name: &str| ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(ns.clone()),
            labels: Some(paddock_labels()),
            ..ObjectMeta::default()
        };
        let mut ns_labels = paddock_labels();
        // The executor's pods meet the "restricted" Pod Security Standard; enforcing it means no
        // other pod in this namespace can be laxer.
        ns_labels.insert(
            "pod-security.kubernetes.io/enforce".to_owned(),
            "restricted".to_owned(),
        );
        ns_labels.insert(
            "pod-security.kubernetes.io/enforce-version".to_owned(),
            "latest".to_owned(),
        );
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.clone()),
                labels: Some(ns_labels),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let service_account = ServiceAccount {
            metadata: meta(&settings.service_account),
            // No token unless a pod asks: the Jobs say explicitly whether they mount one.
            automount_service_account_token: Some(false),
            ..ServiceAccount::default()
        };
        let rule = |group: &str, resource: &str, verbs: &[&str]| PolicyRule {
            api_groups: Some(vec![group.to_owned()]),
            resources: Some(vec![resource.to_owned()]),
            verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
            ..PolicyRule::default()
        };
        let role = Role {
            metadata: meta(OBJECT_NAME),
            rules: Some(vec![
                rule("batch", "jobs", &["create", "get", "list", "watch", "delete"]),
                rule("", "pods", &["get", "list", "watch"]),
                rule("", "pods/log", &["get"]),
            ]),
        };
        let role_binding = RoleBinding {
            metadata: meta(OBJECT_NAME),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".to_owned(),
                kind: "Role".to_owned(),
                name: OBJECT_NAME.to_owned(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".to_owned(),
                name: options.server_account.clone(),
                namespace: Some(options.server_namespace.clone()),
                api_group: None,
            }]),
        };
        Self {
            namespace,
            service_account,
            role,
            role_binding,
            network_policy: network_policy(meta(OBJECT_NAME), options),
        }
    }

    /// One YAML document per object, in apply order, after a comment saying what they are.
    pub fn to_yaml(&self) -> String {
        let mut out = String::from(
            "# paddock's kubernetes-job executor: the executions' namespace, the account their pods run as,\n\
             # the permissions `paddock serve` needs there, and the executions' NetworkPolicy.\n",
        );
        for doc in self.to_json() {
            out.push_str("---\n");
            out.push_str(&serde_saphyr::to_string(&doc).expect("JSON values always render as YAML"));
        }
        out
    }

    /// The objects as JSON values, in apply order.
    pub fn to_json(&self) -> Vec<serde_json::Value> {
        let value = |v: Result<serde_json::Value, serde_json::Error>| v.expect("API objects serialize");
        vec![
            value(serde_json::to_value(&self.namespace)),
            value(serde_json::to_value(&self.service_account)),
            value(serde_json::to_value(&self.role)),
            value(serde_json::to_value(&self.role_binding)),
            value(serde_json::to_value(&self.network_policy)),
        ]
    }
}

fn paddock_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
        ("app.kubernetes.io/part-of".to_owned(), "paddock".to_owned()),
    ])
}

/// Selects the executions' pods (by [`LABEL_MANAGED_BY`], so other pods in a shared namespace
/// are left alone) and denies them everything but DNS to kube-dns and, when its addresses are
/// given, the API server. No ingress at all: nothing needs to reach an execution (its logs come
/// through the kubelet). Enforced only where the cluster's network plugin implements
/// NetworkPolicy; a node-local DNS cache on a link-local address is not covered.
fn network_policy(metadata: ObjectMeta, options: &ManifestOptions) -> NetworkPolicy {
    let port = |protocol: &str, port: i32| NetworkPolicyPort {
        protocol: Some(protocol.to_owned()),
        port: Some(IntOrString::Int(port)),
        end_port: None,
    };
    let selector = |key: &str, value: &str| LabelSelector {
        match_labels: Some(BTreeMap::from([(key.to_owned(), value.to_owned())])),
        match_expressions: None,
    };
    let mut egress = vec![NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(selector("kubernetes.io/metadata.name", "kube-system")),
            pod_selector: Some(selector("k8s-app", "kube-dns")),
            ip_block: None,
        }]),
        ports: Some(vec![port("UDP", 53), port("TCP", 53)]),
    }];
    if !options.api_server_cidrs.is_empty() {
        egress.push(NetworkPolicyEgressRule {
            to: Some(
                options
                    .api_server_cidrs
                    .iter()
                    .map(|cidr| NetworkPolicyPeer {
                        ip_block: Some(IPBlock {
                            cidr: cidr.to_string(),
                            except: None,
                        }),
                        ..NetworkPolicyPeer::default()
                    })
                    .collect(),
            ),
            ports: Some(vec![port("TCP", 443), port("TCP", 6443)]),
        });
    }
    NetworkPolicy {
        metadata,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(LABEL_MANAGED_BY, MANAGED_BY)),
            policy_types: Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
            ingress: None,
            egress: Some(egress),
        }),
    }
}

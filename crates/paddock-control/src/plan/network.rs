//! Planning a sandbox's network: the policy and secret names a request asks for, checked (no allow
//! rule the operator's deny list makes useless, every secret the tenant's), and the secrets' wire
//! form. It attaches nothing (`lifecycle::network` does) and decides no connection (the egress
//! proxy does).

use paddock_egress::policy::shadowed_allow_rules;
use paddock_egress::{BoundHeader, Secret, SecretBinding, SecretName};
use paddock_store::SandboxNetworkRecord;
use paddock_types::api::{ErrorCode, SecretInfo};
use paddock_types::{DomainPattern, NetworkPolicy};
use zeroize::Zeroizing;

use crate::core::time::rfc3339;
use crate::{Principal, SandboxService, ServiceError};

/// A networked sandbox's egress state, decided at create time.
#[derive(Debug, Clone)]
pub(crate) struct NetworkPlan {
    pub(crate) policy: NetworkPolicy,
    pub(crate) secrets: Vec<String>,
}

impl SandboxService {
    /// Checks a create request's `network` and `secrets` for `p`'s tenant.
    pub(crate) async fn plan_network(
        &self,
        p: &Principal,
        policy: Option<NetworkPolicy>,
        secrets: Vec<String>,
    ) -> Result<Option<NetworkPlan>, ServiceError> {
        if policy.is_none() && secrets.is_empty() {
            return Ok(None);
        }
        self.egress()?;
        let policy = policy.unwrap_or_default();
        self.check_reachable(&policy, "network")?;
        let secrets = self.check_secret_names(p, secrets).await?;
        Ok(Some(NetworkPlan { policy, secrets }))
    }

    /// Refuses a policy with an allow rule the operator's deny list makes useless (every address and
    /// port it covers denied, no exception reaching it: `shadowed_allow_rules`), naming the first
    /// one as `{field}.allow[i]` and the operator's reason, rather than let every connection it was
    /// meant for be refused at run time. Domain rules are never refused here.
    pub(crate) fn check_reachable(&self, policy: &NetworkPolicy, field: &str) -> Result<(), ServiceError> {
        let Some(network) = &self.inner.config.network else {
            return Ok(());
        };
        match shadowed_allow_rules(policy, &network.egress.operator).first() {
            Some(s) => Err(ServiceError::invalid(
                format!("{field}.allow[{}]", s.index),
                s.to_string(),
            )),
            None => Ok(()),
        }
    }

    /// Every name must be one of the tenant's secrets.
    pub(crate) async fn check_secret_names(
        &self,
        p: &Principal,
        mut names: Vec<String>,
    ) -> Result<Vec<String>, ServiceError> {
        names.sort();
        names.dedup();
        if names.len() > MAX_SECRETS {
            return Err(ServiceError::invalid(
                "secrets",
                format!("at most {MAX_SECRETS} secrets"),
            ));
        }
        let tenant = p.tenant.clone();
        // Names only: checking that they exist needs no value.
        let found = self.db("read secrets", move |s| s.list_secrets(&tenant)).await?;
        if let Some(missing) = names.iter().find(|n| !found.iter().any(|f| &f.name == *n)) {
            return Err(ServiceError {
                code: ErrorCode::SecretNotFound,
                message: format!("no secret {missing:?}; create it with POST /v1/secrets"),
                field: Some("secrets".into()),
                approval_id: None,
            });
        }
        Ok(names)
    }
}

/// Most secrets a tenant may hold, and most a sandbox may inject.
pub(crate) const MAX_SECRETS: usize = 256;

/// Most hosts a secret may be bound to.
pub(crate) const MAX_SECRET_HOSTS: usize = 64;

/// Longest secret value accepted (it goes into HTTP headers).
pub(crate) const MAX_SECRET_VALUE: usize = 16 * 1024;

/// Recorded secret names (checked when recorded).
pub(crate) fn secret_names(names: &[String]) -> Result<Vec<SecretName>, ServiceError> {
    names
        .iter()
        .map(|n| {
            n.parse()
                .map_err(|e| ServiceError::internal("parse a stored secret name", &e))
        })
        .collect()
}

pub(crate) fn decode_policy(row: &SandboxNetworkRecord) -> Result<NetworkPolicy, ServiceError> {
    serde_json::from_value(row.policy.clone())
        .map_err(|e| ServiceError::internal("decode a stored network policy", &e))
}

/// A secret from its parts as the API (or the store) has them; `headers: None` is the default
/// binding (`authorization`).
pub(crate) fn to_secret(
    name: &str,
    hosts: &[String],
    headers: Option<&[String]>,
    query: bool,
    value: Zeroizing<String>,
) -> Result<Secret, ServiceError> {
    let name: SecretName = name
        .parse()
        .map_err(|e: paddock_egress::SecretError| ServiceError::invalid("name", e.to_string()))?;
    let hosts = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            h.parse::<DomainPattern>()
                .map_err(|e| ServiceError::invalid(format!("hosts.{i}"), e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let headers = headers
        .map(|list| {
            list.iter()
                .enumerate()
                .map(|(i, h)| {
                    h.parse::<BoundHeader>()
                        .map_err(|e| ServiceError::invalid(format!("headers.{i}"), e.to_string()))
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let binding = SecretBinding::new(hosts, headers, query)
        .map_err(|e| ServiceError::invalid("headers", e.to_string()))?;
    Secret::new(name, value, binding).map_err(|e| ServiceError::invalid("value", e.to_string()))
}

pub(crate) fn secret_info(info: &paddock_store::SecretInfo) -> SecretInfo {
    SecretInfo {
        name: info.name.clone(),
        hosts: info.hosts.clone(),
        headers: info.headers.clone(),
        query: info.query,
        created_at: rfc3339(info.created_at_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value() -> Zeroizing<String> {
        Zeroizing::new("v".into())
    }

    #[test]
    fn secrets_are_bound_to_authorization_unless_fields_are_named() {
        let hosts = ["api.test".to_owned()];
        let s = to_secret("GH", &hosts, None, false, value()).expect("default");
        assert_eq!(s.binding().headers(), &[BoundHeader::authorization()]);
        let named = ["X-Api-Key".to_owned(), "x-api-key".to_owned()];
        let s = to_secret("GH", &hosts, Some(&named), true, value()).expect("named");
        let fields: Vec<&str> = s.binding().headers().iter().map(|h| h.as_str()).collect();
        assert_eq!((fields, s.binding().query()), (vec!["x-api-key"], true));
        let field = |r: Result<Secret, ServiceError>| r.expect_err("refused").field;
        let host = ["Host".to_owned()];
        assert_eq!(
            field(to_secret("GH", &hosts, Some(&host), false, value())).as_deref(),
            Some("headers.0")
        );
        assert_eq!(
            field(to_secret("GH", &hosts, Some(&[]), false, value())).as_deref(),
            Some("headers")
        );
        assert_eq!(
            field(to_secret("GH", &["a b".to_owned()], None, false, value())).as_deref(),
            Some("hosts.0")
        );
    }
}

//! Sandbox networks: the egress proxy's owner. A sandbox created with a `network` policy (or
//! secrets) gets a link to the host from the backend; this module serves it on the egress proxy
//! (listeners on the link's host address, the sandbox's CA, its policy and secret values), writes the
//! proxy's records to the audit log, and changes policies and secrets live.
//!
//! What lives where: the policy, secret names and CA of each networked sandbox in the store's
//! `sandbox_networks` (so a restarted server serves it under the same CA); secret values in
//! `secrets`, read only here and handed to the proxy; the link itself is the backend's.

use std::sync::Arc;

use paddock_egress::{
    BoundHeader, Egress, EgressConfig, SandboxCaKey, SandboxListen, Secret, SecretBinding, SecretName,
};
use paddock_runtime::SandboxHandle;
use paddock_store::{AuditFilter, SandboxNetworkRecord};
use paddock_types::api::{
    CreateSecretRequest, ErrorCode, NetworkEvent, SandboxNetworkInfo, SecretInfo, SecretList,
    SetNetworkRequest,
};
use paddock_types::{
    ConntrackLimits, DomainPattern, EgressPorts, NetworkLink, NetworkPolicy, NetworkSpec, SandboxId,
};
use zeroize::Zeroizing;

use crate::service::{lock, now_ms, rfc3339, AuditEntry};
use crate::{Principal, SandboxService, ServiceError};

/// How many recent connections `GET /v1/sandboxes/{id}/network` shows.
const RECENT_EVENTS: u32 = 50;
/// Most secrets a tenant may hold, and most a sandbox may inject.
const MAX_SECRETS: usize = 256;
/// Most hosts a secret may be bound to.
const MAX_SECRET_HOSTS: usize = 64;
/// Longest secret value accepted (it goes into HTTP headers).
const MAX_SECRET_VALUE: usize = 16 * 1024;

/// The egress proxy's configuration, in the service's.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// The ports the proxy listens on, on the host side of every sandbox's link.
    pub ports: EgressPorts,
    /// The proxy itself: the operator's deny list and exceptions, host map, resolver, upstream
    /// trust, and the bounds on what sandboxes can make it hold.
    pub egress: EgressConfig,
    /// Each networked sandbox's share of the host's connection tracking table (its link's firewall).
    pub conntrack: ConntrackLimits,
}

/// A networked sandbox being served on the egress proxy: what its processes' environment is made of.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    pub(crate) link: NetworkLink,
    /// Names of the secrets it injects (as recorded; checked to be valid names when recorded).
    pub(crate) secrets: Vec<SecretName>,
}

/// A networked sandbox's egress state, decided at create time.
#[derive(Debug, Clone)]
pub(crate) struct NetworkPlan {
    pub(crate) policy: NetworkPolicy,
    pub(crate) secrets: Vec<String>,
}

impl SandboxService {
    pub(crate) fn egress(&self) -> Result<&Arc<Egress>, ServiceError> {
        self.inner.egress.as_ref().ok_or_else(|| {
            ServiceError::new(
                ErrorCode::Unsupported,
                "this server gives sandboxes no network: it has no egress proxy configured",
            )
        })
    }

    /// The proxy's ports on every link.
    fn egress_ports(&self) -> EgressPorts {
        self.inner
            .config
            .network
            .as_ref()
            .map(|n| n.ports)
            .unwrap_or_default()
    }

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
        let secrets = self.check_secret_names(p, secrets).await?;
        Ok(Some(NetworkPlan {
            policy: policy.unwrap_or_default(),
            secrets,
        }))
    }

    /// Every name must be one of the tenant's secrets.
    async fn check_secret_names(
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
            });
        }
        Ok(names)
    }

    /// The store row of a new networked sandbox: its plan and a fresh CA.
    pub(crate) fn network_record(
        id: &SandboxId,
        plan: &NetworkPlan,
    ) -> Result<SandboxNetworkRecord, ServiceError> {
        let ca = SandboxCaKey::generate(id).map_err(|e| ServiceError::internal("make a sandbox CA", &e))?;
        Ok(SandboxNetworkRecord {
            sandbox_id: id.to_string(),
            policy: serde_json::to_value(&plan.policy)
                .map_err(|e| ServiceError::internal("encode a network policy", &e))?,
            secrets: plan.secrets.clone(),
            ca_cert_pem: ca.cert_pem().to_owned(),
            ca_key_pem: ca.key_pem().to_owned(),
            updated_at_ms: now_ms(),
        })
    }

    /// The egress state of sandbox `id`, if it is networked.
    pub(crate) async fn stored_network(
        &self,
        id: &str,
    ) -> Result<Option<SandboxNetworkRecord>, ServiceError> {
        let sid = id.to_owned();
        self.db("read a sandbox network", move |s| s.get_sandbox_network(&sid))
            .await
    }

    /// What the backend needs to boot the networked sandbox recorded as `row`.
    pub(crate) fn network_spec(&self, row: &SandboxNetworkRecord) -> Result<NetworkSpec, ServiceError> {
        // A sandbox recorded with a network on a server now configured without one is refused
        // rather than booted with a network nobody serves.
        self.egress()?;
        let conntrack = self
            .inner
            .config
            .network
            .as_ref()
            .map(|n| n.conntrack)
            .unwrap_or_default();
        Ok(NetworkSpec {
            ports: self.egress_ports(),
            ca_pem: row.ca_cert_pem.clone(),
            conntrack,
        })
    }

    /// Serves a booted (or adopted) networked sandbox on the egress proxy; `row` is its record when
    /// the caller has read it already. Nothing to do for one without a link.
    pub(crate) async fn attach_network(
        &self,
        handle: &SandboxHandle,
        row: Option<SandboxNetworkRecord>,
    ) -> Result<(), ServiceError> {
        let Some(link) = handle.network else {
            return Ok(());
        };
        let egress = self.egress()?.clone();
        let row = match row {
            Some(row) => Some(row),
            None => self.stored_network(handle.id.as_str()).await?,
        }
        .ok_or_else(|| {
            ServiceError::new(
                ErrorCode::Internal,
                format!("sandbox {} has a link but no network record", handle.id),
            )
        })?;
        let sid = handle.id.to_string();
        let tenant = self
            .db("read a sandbox", move |s| s.get_sandbox(&sid))
            .await?
            .and_then(|r| r.tenant);
        let listen = SandboxListen::on_link(&link, &self.egress_ports());
        let ca = SandboxCaKey::from_pem(row.ca_cert_pem.clone(), Zeroizing::new(row.ca_key_pem.clone()));
        egress
            .add_sandbox_at(handle.id.clone(), decode_policy(&row)?, listen, &ca)
            .await
            .map_err(|e| ServiceError::internal("serve a sandbox on the egress proxy", &e))?;
        let secrets = secret_names(&row.secrets)?;
        if let Err(e) = self.push_secrets(&handle.id, tenant.as_deref(), &secrets).await {
            let _ = egress.remove_sandbox(&handle.id);
            return Err(e);
        }
        lock(&self.inner.served).insert(handle.id.to_string(), Served { link, secrets });
        Ok(())
    }

    /// Stops serving a sandbox on the egress proxy (it ended or stopped).
    pub(crate) fn detach_network(&self, id: &SandboxId) {
        if let Some(egress) = &self.inner.egress {
            let _ = egress.remove_sandbox(id);
        }
        lock(&self.inner.served).remove(id.as_str());
    }

    /// Hands the proxy the current values of the sandbox's secrets.
    async fn push_secrets(
        &self,
        id: &SandboxId,
        tenant: Option<&str>,
        names: &[SecretName],
    ) -> Result<(), ServiceError> {
        let egress = self.egress()?.clone();
        let Some(tenant) = tenant.map(str::to_owned) else {
            return Ok(());
        };
        let wanted: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let records = self
            .db("read secrets", move |s| s.secret_values(&tenant, &wanted))
            .await?;
        let mut secrets = Vec::with_capacity(records.len());
        for r in records {
            let value = Zeroizing::new(r.value);
            let text = Zeroizing::new(String::from_utf8_lossy(&value).into_owned());
            secrets.push(to_secret(
                &r.info.name,
                &r.info.hosts,
                Some(&r.info.headers),
                r.info.query,
                text,
            )?);
        }
        egress
            .set_secrets(id, secrets)
            .map_err(|e| ServiceError::internal("give the egress proxy a sandbox's secrets", &e))
    }

    /// Environment every process of a networked sandbox gets: the proxy variables, trust bundle and
    /// one placeholder variable per secret.
    pub(crate) fn network_env(&self, id: &str) -> Vec<(String, String)> {
        let Some(served) = lock(&self.inner.served).get(id).cloned() else {
            return Vec::new();
        };
        let mut env = served.link.env(&self.egress_ports());
        env.extend(served.secrets.iter().map(SecretName::env_var));
        env
    }

    /// `GET /v1/sandboxes/{id}/network`.
    pub async fn get_network(&self, p: &Principal, id: &str) -> Result<SandboxNetworkInfo, ServiceError> {
        self.owned_record(p, id).await?;
        let row = self.network_row(id).await?;
        self.network_info(id, row).await
    }

    /// What `GET` and `PUT /v1/sandboxes/{id}/network` answer: `row` and the newest events.
    async fn network_info(
        &self,
        id: &str,
        row: SandboxNetworkRecord,
    ) -> Result<SandboxNetworkInfo, ServiceError> {
        let filter = AuditFilter {
            sandbox_id: Some(id.to_owned()),
            action: Some("network.".into()),
            limit: RECENT_EVENTS,
            newest_first: true,
            ..Default::default()
        };
        let rows = self
            .db("read the audit log", move |s| s.query_audit(&filter))
            .await?;
        let link = lock(&self.inner.served).get(id).map(|s| s.link);
        let ports = self.egress_ports();
        Ok(SandboxNetworkInfo {
            sandbox_id: id.to_owned(),
            policy: decode_policy(&row)?,
            secrets: row.secrets,
            proxy_url: link.map(|l| l.proxy_url(&ports)),
            sandbox_ip: link.map(|l| l.sandbox_ip.to_string()),
            recent: rows
                .into_iter()
                .map(|r| NetworkEvent {
                    kind: r.action.trim_start_matches("network.").to_owned(),
                    at: rfc3339(r.ts_ms),
                    allowed: r.outcome == "allowed",
                    detail: r.detail,
                })
                .collect(),
        })
    }

    /// `PUT /v1/sandboxes/{id}/network`: a new policy and/or secret list, recorded and applied to new
    /// connections at once.
    pub async fn set_network(
        &self,
        p: &Principal,
        id: &str,
        req: SetNetworkRequest,
    ) -> Result<SandboxNetworkInfo, ServiceError> {
        self.owned_record(p, id).await?;
        let mut row = self.network_row(id).await?;
        if let Some(names) = req.secrets {
            row.secrets = self.check_secret_names(p, names).await?;
        }
        if let Some(policy) = &req.policy {
            row.policy = serde_json::to_value(policy)
                .map_err(|e| ServiceError::internal("encode a network policy", &e))?;
        }
        row.updated_at_ms = now_ms();
        let entry = AuditEntry::ok(p, "network.policy", Some(id))
            .detail(serde_json::json!({ "policy": row.policy, "secrets": row.secrets }))
            .into_row();
        let stored = row.clone();
        self.db("record a network policy", move |s| {
            s.transaction(|tx| {
                tx.put_sandbox_network(&stored)?;
                tx.append_audit(&entry)?;
                Ok::<_, paddock_store::StoreError>(())
            })
        })
        .await?;
        // A sandbox not served right now (stopped) gets the new state from the store when it resumes.
        let served = lock(&self.inner.served).contains_key(id);
        if served {
            let sid: SandboxId = id
                .parse()
                .map_err(|e| ServiceError::internal("parse a sandbox id", &e))?;
            self.egress()?
                .set_policy(&sid, decode_policy(&row)?)
                .map_err(|e| ServiceError::internal("change a sandbox's egress policy", &e))?;
            let secrets = secret_names(&row.secrets)?;
            self.push_secrets(&sid, Some(&p.tenant), &secrets).await?;
            if let Some(s) = lock(&self.inner.served).get_mut(id) {
                s.secrets = secrets;
            }
        }
        self.network_info(id, row).await
    }

    /// The policy and secret names of a networked sandbox (for its forks), `None` for one with
    /// loopback only.
    pub(crate) async fn network_of(
        &self,
        id: &str,
    ) -> Result<Option<(NetworkPolicy, Vec<String>)>, ServiceError> {
        self.stored_network(id)
            .await?
            .map(|r| Ok((decode_policy(&r)?, r.secrets)))
            .transpose()
    }

    async fn network_row(&self, id: &str) -> Result<SandboxNetworkRecord, ServiceError> {
        self.stored_network(id).await?.ok_or_else(|| {
            ServiceError::new(
                ErrorCode::InvalidRequest,
                format!("sandbox {id} has no network: create it with a `network` policy"),
            )
        })
    }

    /// `POST /v1/secrets`.
    pub async fn create_secret(
        &self,
        p: &Principal,
        req: CreateSecretRequest,
    ) -> Result<SecretInfo, ServiceError> {
        let name: SecretName = req
            .name
            .parse()
            .map_err(|e: paddock_egress::SecretError| ServiceError::invalid("name", e.to_string()))?;
        if req.value.len() > MAX_SECRET_VALUE {
            return Err(ServiceError::invalid(
                "value",
                format!("at most {MAX_SECRET_VALUE} bytes"),
            ));
        }
        if req.hosts.is_empty() || req.hosts.len() > MAX_SECRET_HOSTS {
            return Err(ServiceError::invalid(
                "hosts",
                format!("bind the secret to 1 to {MAX_SECRET_HOSTS} hosts"),
            ));
        }
        if req
            .headers
            .as_ref()
            .is_some_and(|h| h.len() > paddock_egress::MAX_BOUND_HEADERS)
        {
            return Err(ServiceError::invalid(
                "headers",
                format!(
                    "bind the secret to at most {} headers",
                    paddock_egress::MAX_BOUND_HEADERS
                ),
            ));
        }
        let value = Zeroizing::new(req.value.clone());
        // Validates the hosts, the headers and the value (it must fit in an HTTP header).
        let secret = to_secret(
            name.as_str(),
            &req.hosts,
            req.headers.as_deref(),
            req.query,
            value.clone(),
        )?;
        let tenant = p.tenant.clone();
        let count = {
            let t = tenant.clone();
            self.db("read secrets", move |s| s.list_secrets(&t)).await?.len()
        };
        if count >= MAX_SECRETS {
            return Err(ServiceError::invalid(
                "name",
                format!("a tenant holds at most {MAX_SECRETS} secrets"),
            ));
        }
        let binding = secret.binding();
        let info = paddock_store::SecretInfo {
            tenant,
            name: name.to_string(),
            hosts: req.hosts.clone(),
            headers: binding.headers().iter().map(|h| h.as_str().to_owned()).collect(),
            query: binding.query(),
            created_at_ms: now_ms(),
        };
        drop(secret);
        let entry = AuditEntry::ok(p, "secret.create", None)
            .detail(serde_json::json!({
                "name": info.name, "hosts": info.hosts, "headers": info.headers, "query": info.query,
            }))
            .into_row();
        let stored = info.clone();
        let bytes = Zeroizing::new(value.as_bytes().to_vec());
        self.db("record a secret", move |s| {
            s.transaction(|tx| {
                tx.insert_secret(&stored, &bytes)?;
                tx.append_audit(&entry)?;
                Ok::<_, paddock_store::StoreError>(())
            })
        })
        .await?;
        self.refresh_secrets(&p.tenant, &info.name).await;
        Ok(secret_info(&info))
    }

    /// `GET /v1/secrets`.
    pub async fn list_secrets(&self, p: &Principal) -> Result<SecretList, ServiceError> {
        let tenant = p.tenant.clone();
        let rows = self.db("read secrets", move |s| s.list_secrets(&tenant)).await?;
        Ok(SecretList {
            secrets: rows.iter().map(secret_info).collect(),
        })
    }

    /// `DELETE /v1/secrets/{name}`: from now on no sandbox's requests carry it.
    pub async fn delete_secret(&self, p: &Principal, name: &str) -> Result<(), ServiceError> {
        let (tenant, n) = (p.tenant.clone(), name.to_owned());
        let entry = AuditEntry::ok(p, "secret.delete", None)
            .detail(serde_json::json!({ "name": name }))
            .into_row();
        let deleted = self
            .db("delete a secret", move |s| {
                s.transaction(|tx| {
                    let deleted = tx.delete_secret(&tenant, &n)?;
                    if deleted {
                        tx.append_audit(&entry)?;
                    }
                    Ok::<_, paddock_store::StoreError>(deleted)
                })
            })
            .await?;
        if !deleted {
            return Err(ServiceError::new(
                ErrorCode::SecretNotFound,
                format!("no secret {name:?}"),
            ));
        }
        self.refresh_secrets(&p.tenant, name).await;
        Ok(())
    }

    /// Gives the proxy the current values for every live sandbox of `tenant` that injects `name`.
    async fn refresh_secrets(&self, tenant: &str, name: &str) {
        let served: Vec<(String, Vec<SecretName>)> = lock(&self.inner.served)
            .iter()
            .filter(|(_, s)| s.secrets.iter().any(|n| n.as_str() == name))
            .map(|(id, s)| (id.clone(), s.secrets.clone()))
            .collect();
        for (id, secrets) in served {
            if self.live_sandbox(&id).and_then(|sb| sb.tenant()).as_deref() != Some(tenant) {
                continue;
            }
            let Ok(sid) = id.parse::<SandboxId>() else {
                continue;
            };
            if let Err(e) = self.push_secrets(&sid, Some(tenant), &secrets).await {
                tracing::warn!(sandbox_id = %id, error = %e.message, "cannot refresh a sandbox's secrets");
            }
        }
    }
}

/// Recorded secret names (checked when recorded).
fn secret_names(names: &[String]) -> Result<Vec<SecretName>, ServiceError> {
    names
        .iter()
        .map(|n| {
            n.parse()
                .map_err(|e| ServiceError::internal("parse a stored secret name", &e))
        })
        .collect()
}

fn decode_policy(row: &SandboxNetworkRecord) -> Result<NetworkPolicy, ServiceError> {
    serde_json::from_value(row.policy.clone())
        .map_err(|e| ServiceError::internal("decode a stored network policy", &e))
}

/// A secret from its parts as the API (or the store) has them; `headers: None` is the default
/// binding (`authorization`).
fn to_secret(
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

fn secret_info(info: &paddock_store::SecretInfo) -> SecretInfo {
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

//! Networks of live sandboxes: serving a sandbox on the egress proxy when it boots or is adopted,
//! pushing its secrets, its proxy environment, and detaching it when it ends.

use std::collections::BTreeMap;
use std::sync::Arc;

use paddock_egress::{Egress, SandboxCaKey, SandboxListen, SecretName};
use paddock_runtime::SandboxHandle;
use paddock_store::SandboxNetworkRecord;
use paddock_types::api::ErrorCode;
use paddock_types::{EgressPorts, NetworkPolicy, NetworkSpec, SandboxId};
use zeroize::Zeroizing;

use crate::core::live::{lock, LiveSandbox, Served};
use crate::plan::network::{decode_policy, secret_names, to_secret};
use crate::{SandboxService, ServiceError};

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
    pub(crate) fn egress_ports(&self) -> EgressPorts {
        self.inner
            .config
            .network
            .as_ref()
            .map(|n| n.ports)
            .unwrap_or_default()
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

    /// The egress state of sandbox `id`, if it is networked.
    pub(crate) async fn stored_network(
        &self,
        id: &str,
    ) -> Result<Option<SandboxNetworkRecord>, ServiceError> {
        let sid = id.to_owned();
        self.db("read a sandbox network", move |s| s.get_sandbox_network(&sid))
            .await
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
        lock(&self.inner.served).insert(handle.id.clone(), Served { link, secrets });
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
    pub(crate) async fn push_secrets(
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

    /// The variables a sandbox's processes start with unless a request overrides them: the
    /// network's first, then the sandbox's own, which may override them (the transparent
    /// interception filters a client that ignores or changes its proxy anyway).
    pub(crate) fn process_env(&self, sb: &LiveSandbox) -> BTreeMap<String, String> {
        let mut env: BTreeMap<String, String> = self.network_env(&sb.id).into_iter().collect();
        env.extend(sb.spec().env);
        env
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

    pub(crate) async fn network_row(&self, id: &str) -> Result<SandboxNetworkRecord, ServiceError> {
        self.stored_network(id).await?.ok_or_else(|| {
            ServiceError::new(
                ErrorCode::InvalidRequest,
                format!("sandbox {id} has no network: create it with a `network` policy"),
            )
        })
    }

    /// Gives the proxy the current values for every live sandbox of `tenant` that injects `name`.
    pub(crate) async fn refresh_secrets(&self, tenant: &str, name: &str) {
        let served: Vec<(SandboxId, Vec<SecretName>)> = lock(&self.inner.served)
            .iter()
            .filter(|(_, s)| s.secrets.iter().any(|n| n.as_str() == name))
            .map(|(id, s)| (id.clone(), s.secrets.clone()))
            .collect();
        for (id, secrets) in served {
            if self.live_sandbox(&id).and_then(|sb| sb.tenant()).as_deref() != Some(tenant) {
                continue;
            }
            if let Err(e) = self.push_secrets(&id, Some(tenant), &secrets).await {
                tracing::warn!(sandbox_id = %id, error = %e.message, "cannot refresh a sandbox's secrets");
            }
        }
    }
}

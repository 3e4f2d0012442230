//! Secrets: create, list and delete a tenant's named credentials for egress injection. The values
//! never come back out; live sandboxes that use a changed secret get it at once.

use paddock_egress::SecretName;
use paddock_types::api::{CreateSecretRequest, ErrorCode, SecretInfo, SecretList};
use zeroize::Zeroizing;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::time::now_ms;
use crate::plan::network::{secret_info, to_secret, MAX_SECRETS, MAX_SECRET_HOSTS, MAX_SECRET_VALUE};
use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
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
        let entry = AuditEntry::ok(p, AuditAction::SecretCreate, None)
            .detail(audit::SecretCreated {
                name: info.name.clone(),
                hosts: info.hosts.clone(),
                headers: info.headers.clone(),
                query: info.query,
            })
            .into_row();
        let stored = info.clone();
        let bytes = Zeroizing::new(value.as_bytes().to_vec());
        self.db("record a secret", move |s| {
            s.transaction(|tx| {
                tx.insert_secret(&stored, &bytes)?;
                audit::append(tx, &entry)?;
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
        let entry = AuditEntry::ok(p, AuditAction::SecretDelete, None)
            .detail(audit::SecretDeleted {
                name: name.to_owned(),
            })
            .into_row();
        let deleted = self
            .db("delete a secret", move |s| {
                s.transaction(|tx| {
                    let deleted = tx.delete_secret(&tenant, &n)?;
                    if deleted {
                        audit::append(tx, &entry)?;
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
}

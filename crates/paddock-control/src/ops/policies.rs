//! Approval policies: set, read and delete the tenant's policy and its sandboxes' policies
//! (`/v1/policy`, `/v1/sandboxes/{id}/policy`). A policy is compiled by `paddock_policy::compile`
//! before anything is stored, so a faulty one is refused whole (`invalid_request`, `field` naming
//! the fault under `policy.`) and the stored text is always one that compiles. Setting and deleting
//! need an approver (or admin) key; any key of the tenant may read.
//!
//! What it does not do: apply a policy (`core/approvals` does, from the cache this forgets a
//! scope's entry of after each change) or hold an `ask` for a person.

use paddock_policy::PolicySpec;
use paddock_store::ApprovalPolicyRecord;
use paddock_types::api::{ApprovalPolicyInfo, ErrorCode, SetApprovalPolicyRequest};
use paddock_types::SandboxId;
use sha2::Digest as _;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::principal::Permission;
use crate::core::time::{now_ms, rfc3339};
use crate::{Principal, SandboxService, ServiceError};

/// What a policy applies to: the caller's tenant, or one of its sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyScope {
    /// Every sandbox of the caller's tenant.
    Tenant,
    /// One sandbox of the caller's tenant.
    Sandbox(SandboxId),
}

impl PolicyScope {
    fn sandbox(&self) -> Option<&str> {
        match self {
            PolicyScope::Tenant => None,
            PolicyScope::Sandbox(id) => Some(id.as_str()),
        }
    }

    /// How audit rows name it.
    fn name(&self) -> &'static str {
        match self {
            PolicyScope::Tenant => "tenant",
            PolicyScope::Sandbox(_) => "sandbox",
        }
    }
}

fn policy_not_found(scope: &PolicyScope) -> ServiceError {
    let message = match scope {
        PolicyScope::Tenant => "no approval policy is set for this tenant".to_owned(),
        PolicyScope::Sandbox(id) => format!("no approval policy is set for sandbox {id}"),
    };
    ServiceError::new(ErrorCode::PolicyNotFound, message)
}

fn policy_info(record: &ApprovalPolicyRecord) -> Result<ApprovalPolicyInfo, ServiceError> {
    Ok(ApprovalPolicyInfo {
        sandbox_id: record.sandbox_id.clone(),
        policy: serde_json::from_str(&record.spec)
            .map_err(|e| ServiceError::internal("read a stored approval policy", &e))?,
        updated_at: rfc3339(record.updated_at_ms),
    })
}

impl SandboxService {
    /// Checks that `scope` is the caller's: another tenant's sandbox is `sandbox_not_found`.
    async fn check_policy_scope(&self, p: &Principal, scope: &PolicyScope) -> Result<(), ServiceError> {
        if let PolicyScope::Sandbox(id) = scope {
            self.owned_record(p, id.as_str()).await?;
        }
        Ok(())
    }

    /// `PUT /v1/policy` and `PUT /v1/sandboxes/{id}/policy`: compiles the policy and, only if it
    /// compiles, stores it (replacing any before) with its `policy.set` row.
    #[tracing::instrument(skip_all, fields(tenant = %p.tenant, scope = scope.name()))]
    pub async fn set_policy(
        &self,
        p: &Principal,
        scope: &PolicyScope,
        req: SetApprovalPolicyRequest,
    ) -> Result<ApprovalPolicyInfo, ServiceError> {
        p.require(Permission::Approve, "setting an approval policy")?;
        self.check_policy_scope(p, scope).await?;
        let spec: PolicySpec =
            serde_json::from_value(req.policy).map_err(|e| ServiceError::invalid("policy", e.to_string()))?;
        let compiled = paddock_policy::compile(spec)
            .map_err(|e| ServiceError::invalid(format!("policy.{}", e.field), e.message))?;
        let text = serde_json::to_string(compiled.spec())
            .map_err(|e| ServiceError::internal("encode an approval policy", &e))?;
        let record = ApprovalPolicyRecord {
            tenant: p.tenant.clone(),
            sandbox_id: scope.sandbox().map(str::to_owned),
            updated_at_ms: now_ms(),
            spec: text,
        };
        let entry = AuditEntry::ok(p, AuditAction::PolicySet, scope.sandbox())
            .detail(audit::PolicySet {
                scope: scope.name(),
                rules: compiled.len() as u64,
                spec_sha256: hex::encode(sha2::Sha256::digest(record.spec.as_bytes())),
                spec_bytes: record.spec.len() as u64,
            })
            .into_row();
        let stored = record.clone();
        self.db("record an approval policy", move |s| {
            s.transaction(|tx| {
                tx.put_approval_policy(&stored)?;
                audit::append(tx, &entry)?;
                Ok::<_, paddock_store::StoreError>(())
            })
        })
        .await?;
        self.forget_policy(&p.tenant, scope.sandbox());
        policy_info(&record)
    }

    /// `GET /v1/policy` and `GET /v1/sandboxes/{id}/policy`: the stored policy, `policy_not_found`
    /// if none is set.
    pub async fn get_policy(
        &self,
        p: &Principal,
        scope: &PolicyScope,
    ) -> Result<ApprovalPolicyInfo, ServiceError> {
        self.check_policy_scope(p, scope).await?;
        let (tenant, sandbox) = (p.tenant.clone(), scope.sandbox().map(str::to_owned));
        let record = self
            .db("read an approval policy", move |s| {
                s.get_approval_policy(&tenant, sandbox.as_deref())
            })
            .await?;
        match record {
            Some(record) => policy_info(&record),
            None => Err(policy_not_found(scope)),
        }
    }

    /// `DELETE /v1/policy` and `DELETE /v1/sandboxes/{id}/policy`, with its `policy.delete` row;
    /// `policy_not_found` (and no row) if none was set.
    #[tracing::instrument(skip_all, fields(tenant = %p.tenant, scope = scope.name()))]
    pub async fn delete_policy(&self, p: &Principal, scope: &PolicyScope) -> Result<(), ServiceError> {
        p.require(Permission::Approve, "deleting an approval policy")?;
        self.check_policy_scope(p, scope).await?;
        let (tenant, sandbox) = (p.tenant.clone(), scope.sandbox().map(str::to_owned));
        let entry = AuditEntry::ok(p, AuditAction::PolicyDelete, scope.sandbox())
            .detail(audit::PolicyDeleted { scope: scope.name() })
            .into_row();
        let deleted = self
            .db("delete an approval policy", move |s| {
                s.transaction(|tx| {
                    let deleted = tx.delete_approval_policy(&tenant, sandbox.as_deref())?;
                    if deleted {
                        audit::append(tx, &entry)?;
                    }
                    Ok::<_, paddock_store::StoreError>(deleted)
                })
            })
            .await?;
        self.forget_policy(&p.tenant, scope.sandbox());
        if deleted {
            Ok(())
        } else {
            Err(policy_not_found(scope))
        }
    }
}

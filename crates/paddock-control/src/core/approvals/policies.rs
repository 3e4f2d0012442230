//! The effective approval policy of a sandbox: its own if it has one, else its tenant's, else
//! none (everything allowed, as before policies existed). Policies are compiled once and cached;
//! `ops/policies.rs` forgets a scope's entry in the same step that changes its row, and only this
//! server writes the store, so the cache never serves a policy the store no longer has.
//!
//! What it does not do: decide (that is `paddock_policy::decide`, called by `gate.rs`).

use std::sync::Arc;

use paddock_policy::{Policy, PolicySpec};

use crate::core::live::lock;
use crate::{SandboxService, ServiceError};

/// Scopes cached before the cache is emptied and refilled from the store (a bound, not a tuning
/// knob: an entry is one compiled policy or a `None`).
const MAX_CACHED: usize = 10_000;

/// A policy that applies, and whose it is.
#[derive(Clone)]
pub(crate) struct Effective {
    pub(crate) policy: Arc<Policy>,
    /// `sandbox` or `tenant`.
    pub(crate) scope: &'static str,
}

impl SandboxService {
    /// The compiled policy of one scope, from the cache or the store.
    async fn scope_policy(
        &self,
        tenant: &str,
        sandbox: Option<&str>,
    ) -> Result<Option<Arc<Policy>>, ServiceError> {
        let key = (tenant.to_owned(), sandbox.unwrap_or("").to_owned());
        let forgets = {
            let cache = lock(&self.inner.policies.0);
            if let Some(cached) = cache.scopes.get(&key) {
                return Ok(cached.clone());
            }
            cache.forgets
        };
        let (t, s) = (key.0.clone(), sandbox.map(str::to_owned));
        let record = self
            .db("read an approval policy", move |store| {
                store.get_approval_policy(&t, s.as_deref())
            })
            .await?;
        let compiled = match record {
            None => None,
            Some(record) => {
                let spec: PolicySpec = serde_json::from_str(&record.spec)
                    .map_err(|e| ServiceError::internal("read a stored approval policy", &e))?;
                let policy = paddock_policy::compile(spec)
                    .map_err(|e| ServiceError::internal("compile a stored approval policy", &e))?;
                Some(Arc::new(policy))
            }
        };
        let mut cache = lock(&self.inner.policies.0);
        if cache.forgets == forgets {
            if cache.scopes.len() >= MAX_CACHED {
                cache.scopes.clear();
            }
            cache.scopes.insert(key, compiled.clone());
        }
        Ok(compiled)
    }

    /// The policy that applies to `sandbox` of `tenant` (`None` for a request not in a sandbox:
    /// the tenant's).
    pub(crate) async fn effective_policy(
        &self,
        tenant: &str,
        sandbox: Option<&str>,
    ) -> Result<Option<Effective>, ServiceError> {
        if let Some(id) = sandbox {
            if let Some(policy) = self.scope_policy(tenant, Some(id)).await? {
                return Ok(Some(Effective {
                    policy,
                    scope: "sandbox",
                }));
            }
        }
        Ok(self.scope_policy(tenant, None).await?.map(|policy| Effective {
            policy,
            scope: "tenant",
        }))
    }

    /// Whether the tenant's policy lets a key approve its own requests.
    pub(crate) async fn self_approval_allowed(&self, tenant: &str) -> Result<bool, ServiceError> {
        Ok(self
            .scope_policy(tenant, None)
            .await?
            .is_some_and(|p| p.spec().self_approval))
    }

    /// Drops the cached policy of one scope (its row was just changed or deleted).
    pub(crate) fn forget_policy(&self, tenant: &str, sandbox: Option<&str>) {
        let mut cache = lock(&self.inner.policies.0);
        cache.forgets += 1;
        cache
            .scopes
            .remove(&(tenant.to_owned(), sandbox.unwrap_or("").to_owned()));
    }
}

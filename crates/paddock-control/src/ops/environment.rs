//! What a sandbox's processes start with: its default user and its environment variables, for a
//! front-end that answers in the sandbox's place (E2B's envd resolves relative paths against the
//! user's home and serves `GET /envs` to the code interpreter).
//!
//! It does not: change either (they are fixed at create), or show a secret's value (a sandbox's
//! secret variables hold placeholders, which the egress proxy swaps for the value on the way out).
//! Reads are not audited, as reads of a sandbox's other settings are not: the same values reach
//! anyone who may run `env` in the sandbox, and that run is audited.

use std::collections::BTreeMap;

use paddock_types::SandboxId;

use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
    /// The default user of a running sandbox's processes and new files.
    pub async fn sandbox_user(&self, p: &Principal, id: &SandboxId) -> Result<String, ServiceError> {
        Ok(self.owned_live(p, id).await?.spec().user)
    }

    /// The environment variables, with their values, that a running sandbox's processes get
    /// unless a request overrides them: the network's (proxy settings, secret placeholders), then
    /// the sandbox's own (which win).
    #[tracing::instrument(skip_all, fields(sandbox_id = %id))]
    pub async fn sandbox_env(
        &self,
        p: &Principal,
        id: &SandboxId,
    ) -> Result<BTreeMap<String, String>, ServiceError> {
        let sb = self.owned_live(p, id).await?;
        Ok(self.process_env(&sb))
    }
}

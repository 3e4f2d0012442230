//! Sandbox lifecycle operations.

use paddock_types::api::{
    CreateSandboxRequest, ErrorCode, ListSandboxesQuery, SandboxInfo, SandboxList, SandboxUsageBody,
    SetTimeoutRequest, TemplateList,
};

use crate::{Principal, SandboxService, ServiceError};

fn pending() -> ServiceError {
    ServiceError::new(ErrorCode::Unsupported, "not implemented yet")
}

impl SandboxService {
    /// Creates a sandbox (a claim from the template's warm pool when one is ready).
    pub async fn create_sandbox(
        &self,
        p: &Principal,
        req: CreateSandboxRequest,
    ) -> Result<SandboxInfo, ServiceError> {
        let _ = (p, req);
        Err(pending())
    }

    /// One sandbox of the caller's tenant.
    pub async fn get_sandbox(&self, p: &Principal, id: &str) -> Result<SandboxInfo, ServiceError> {
        let _ = (p, id);
        Err(pending())
    }

    /// The caller's sandboxes, filtered and paginated.
    pub async fn list_sandboxes(
        &self,
        p: &Principal,
        q: ListSandboxesQuery,
    ) -> Result<SandboxList, ServiceError> {
        let _ = (p, q);
        Err(pending())
    }

    /// Sets the sandbox to expire `timeout_secs` from now.
    pub async fn set_timeout(
        &self,
        p: &Principal,
        id: &str,
        req: SetTimeoutRequest,
    ) -> Result<SandboxInfo, ServiceError> {
        let _ = (p, id, req);
        Err(pending())
    }

    /// Kills the sandbox and removes everything of it.
    pub async fn kill_sandbox(&self, p: &Principal, id: &str) -> Result<(), ServiceError> {
        let _ = (p, id);
        Err(pending())
    }

    /// What the sandbox uses now.
    pub async fn sandbox_usage(&self, p: &Principal, id: &str) -> Result<SandboxUsageBody, ServiceError> {
        let _ = (p, id);
        Err(pending())
    }

    /// The templates sandboxes can be created from.
    pub fn templates(&self) -> TemplateList {
        TemplateList { templates: vec![] }
    }
}

//! Planning the image template a new sandbox is made from: a ready template of the caller's
//! tenant, by name or id, with the build's result (its process defaults).

use paddock_runtime::TemplateBuilt;
use paddock_store::TemplateRecord;
use paddock_types::api::TemplateStart;
use paddock_types::TemplateId;
use serde::{Deserialize, Serialize};

use crate::{SandboxService, ServiceError};

/// What the store keeps of a built template (`detail_json`): the backend's build result and the
/// start command, resolved (its command always given).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TemplateDetail {
    #[serde(flatten)]
    pub(crate) built: TemplateBuilt,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) start: Option<TemplateStart>,
}

/// A ready template a sandbox is made from.
#[derive(Debug, Clone)]
pub(crate) struct ResolvedTemplate {
    pub(crate) id: TemplateId,
    pub(crate) detail: TemplateDetail,
}

impl SandboxService {
    /// The configured template `name` the server built (from an image or a recipe); `unavailable`
    /// while its build has not finished.
    pub(crate) async fn configured_template(&self, name: &str) -> Result<ResolvedTemplate, ServiceError> {
        let id = crate::core::live::lock(&self.inner.built_templates)
            .get(name)
            .cloned();
        let unavailable = || {
            ServiceError::new(
                paddock_types::api::ErrorCode::Unavailable,
                format!("template {name} is being built by the server; try again shortly"),
            )
        };
        let id = id.ok_or_else(unavailable)?;
        self.resolve_template(crate::core::principal::ADMIN_TENANT, id.as_str())
            .await?
            .ok_or_else(unavailable)
    }

    /// The tenant's ready template named (or with id) `id_or_name`, if there is one.
    pub(crate) async fn resolve_template(
        &self,
        tenant: &str,
        id_or_name: &str,
    ) -> Result<Option<ResolvedTemplate>, ServiceError> {
        let (tenant, lookup) = (tenant.to_owned(), id_or_name.to_owned());
        let Some(record) = self
            .db("read a template", move |s| s.find_template(&tenant, &lookup))
            .await?
        else {
            return Ok(None);
        };
        if !record.ready {
            return Err(ServiceError::invalid(
                "template",
                format!("template {} is still being built", record.name),
            ));
        }
        let detail = parse_detail(&record)?
            .ok_or_else(|| ServiceError::internal("read a template", &"no build result"))?;
        let id = record
            .id
            .parse()
            .map_err(|e| ServiceError::internal("parse a template id", &e))?;
        Ok(Some(ResolvedTemplate { id, detail }))
    }
}

/// The label of a recipe step's sandbox (its value: the template being made). No build outlives
/// its server, so recovery ends such a sandbox instead of adopting it.
pub(crate) const BUILD_STEP_LABEL: &str = "paddock.template-build";

/// A ready template's build result (`None` while it is being built).
pub(crate) fn parse_detail(record: &TemplateRecord) -> Result<Option<TemplateDetail>, ServiceError> {
    if !record.ready {
        return Ok(None);
    }
    serde_json::from_str(&record.detail_json)
        .map(Some)
        .map_err(|e| ServiceError::internal("read a template's build result", &e))
}

//! Templates built from images: build (pull, then the backend unpacks), get, list, delete, and
//! resolving the template a new sandbox is made from.
//!
//! A template's files live in the pool, its record (owner, name, source, the image's digest,
//! process defaults and layers) in the store. The record is written `building` before anything
//! is fetched (so the name is taken at once and a concurrent build of it is refused) and becomes
//! `ready` with its audit row once the files are in place; a failed build removes its record, and
//! the backend leaves nothing of it. Another tenant's template answers exactly like a missing one.
//! This module does not run recipes (`recipe.rs`), read uploaded archives (`archive.rs`) or
//! build contexts (`context.rs`).

mod answers;
mod archive;
mod configured;
mod context;
mod copy;
mod debian;
mod recipe;

use paddock_registry::{ImageReference, RegistryError};
use paddock_runtime::{TemplateBuilt, TemplateProgress, TemplateSource};
use paddock_store::{NewTemplate, StoreError, TemplateDeletion, TemplateRecord};
use paddock_types::api::{
    BuildTemplateRequest, ErrorCode, TemplateBuildEvent, TemplateInfo, TemplateList, TemplateStart,
};
use paddock_types::{TemplateId, VolumeName};
use tokio::sync::mpsc;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::time::now_ms;
use crate::plan::template::{parse_detail, TemplateDetail};
use crate::{Principal, SandboxService, ServiceError};

pub(crate) use answers::BuildRoom;
use answers::{build_error, configured_info, registry_error, template_info, template_not_found};
use archive::Upload;
use configured::recipe_source;
use recipe::RecipePlan;

/// What a template is built from.
enum Source {
    Image(ImageReference),
    Recipe(Box<RecipePlan>),
    Archive(Upload),
    Debian(crate::DebianBase),
}

/// What a build is asked for besides its source: its name, what it was built from as recorded,
/// a recipe's network and the start command.
struct Wanted {
    name: VolumeName,
    source_text: String,
    network: Option<paddock_types::NetworkPolicy>,
    start: Option<TemplateStart>,
}

/// A template name as given, checked.
fn template_name(name: &str) -> Result<VolumeName, ServiceError> {
    let name: VolumeName = name.parse().map_err(|e: paddock_types::VolumeNameError| {
        ServiceError::invalid(
            "name",
            e.to_string()
                .replace("volume name", "template name")
                .replace("'vol-'", "'tp-'"),
        )
    })?;
    if name.as_str().starts_with("tp-") {
        return Err(ServiceError::invalid(
            "name",
            "template names do not start with 'tp-' (ids do)",
        ));
    }
    Ok(name)
}

impl SandboxService {
    /// Builds a template for `p`'s tenant from the image `req.from`, sending each step to
    /// `events` as it happens (a closed receiver does not stop the build; a reader that falls
    /// behind misses layer events, never the last one). An invalid request is refused before the
    /// first event.
    #[tracing::instrument(skip_all, fields(tenant = %p.tenant))]
    pub async fn build_template(
        &self,
        p: &Principal,
        req: BuildTemplateRequest,
        events: mpsc::Sender<TemplateBuildEvent>,
    ) -> Result<TemplateInfo, ServiceError> {
        self.build_named(p, req, events, false).await
    }

    /// [`Self::build_template`]; `configured`: the server builds one of its configured templates
    /// (for the operator's tenant, under the configured name).
    pub(super) async fn build_named(
        &self,
        p: &Principal,
        req: BuildTemplateRequest,
        events: mpsc::Sender<TemplateBuildEvent>,
        configured: bool,
    ) -> Result<TemplateInfo, ServiceError> {
        let name = template_name(&req.name)?;
        let source = match (&req.from, &req.recipe) {
            (Some(from), None) => Source::Image(
                from.parse()
                    .map_err(|e: RegistryError| ServiceError::invalid("from", e.to_string()))?,
            ),
            (None, Some(text)) => {
                let recipe = paddock_types::recipe::parse_recipe(text, &req.build_args)
                    .map_err(|e| ServiceError::invalid("recipe", e.to_string()))?;
                Source::Recipe(Box::new(RecipePlan::new(recipe, None)?))
            }
            _ => {
                return Err(ServiceError::invalid(
                    "from",
                    "give exactly one of `from` and `recipe`",
                ))
            }
        };
        if req.network.is_some() && req.recipe.is_none() {
            return Err(ServiceError::invalid(
                "network",
                "a network is for a recipe's steps",
            ));
        }
        let source_text = match &source {
            Source::Recipe(plan) => recipe_source(req.recipe.as_deref().unwrap_or_default(), &plan.recipe),
            _ => req.from.clone().unwrap_or_default(),
        };
        let wanted = Wanted {
            name,
            source_text,
            network: req.network,
            start: req.start,
        };
        self.build_from(p, wanted, source, events, configured).await
    }

    /// Builds `source` as `wanted` says: the steps every build shares (the name's check, the
    /// quota's room, the record, the audit rows, the last event).
    async fn build_from(
        &self,
        p: &Principal,
        wanted: Wanted,
        source: Source,
        events: mpsc::Sender<TemplateBuildEvent>,
        configured: bool,
    ) -> Result<TemplateInfo, ServiceError> {
        let Wanted {
            name,
            source_text,
            network,
            start,
        } = wanted;
        if !configured && self.inner.config.templates.contains_key(name.as_str()) {
            return Err(ServiceError::new(
                ErrorCode::TemplateExists,
                format!("{name} is one of this server's templates"),
            ));
        }
        if let Some(start) = &start {
            check_start(start)?;
        }
        let pull_dir = self.pull_dir()?;
        let room = self.build_room(p, configured).await?;
        let id = TemplateId::from_random(rand::random());
        let new = NewTemplate {
            id: id.to_string(),
            tenant: p.tenant.clone(),
            name: name.to_string(),
            source: source_text,
            created_at_ms: now_ms(),
            storage_bytes: room.bytes,
        };
        let (record, defaults) = (new.clone(), self.quota_defaults());
        let inserted = self
            .db("record a template", move |s| {
                if configured {
                    s.insert_template(&record)
                } else {
                    s.insert_template_checked(&record, &defaults)
                }
            })
            .await;
        self.audit_refusal(p, AuditAction::TemplateBuild, None, inserted)
            .await?;
        let dest = pull_dir.join(id.as_str());
        let built = match source {
            Source::Image(reference) => self.pull_and_build(&id, &reference, &dest, room, &events).await,
            Source::Recipe(plan) => self.build_recipe(p, &id, &plan, network, room, &events).await,
            Source::Archive(upload) => self.receive_and_build(&id, upload, &dest, room, &events).await,
            Source::Debian(base) => self.debian_and_build(&id, &base, &dest, room, &events).await,
        };
        let result = built.and_then(|built| {
            // The image's own command when the request names none (known once it is read).
            let start = match start {
                None => None,
                Some(mut start) => {
                    if start.command.is_none() {
                        start.command = Some(built.config.start_command().ok_or_else(|| {
                            ServiceError::invalid(
                                "start.command",
                                "the image has no Entrypoint or Cmd: give start.command",
                            )
                        })?);
                    }
                    Some(start)
                }
            };
            Ok(TemplateDetail { built, start })
        });
        if let Err(e) = std::fs::remove_dir_all(&dest) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %dest.display(), error = %e, "pulled image not removed");
            }
        }
        match result {
            Ok(detail) => {
                let built = &detail.built;
                let encoded = serde_json::to_string(&detail)
                    .map_err(|e| ServiceError::internal("encode a template", &e))?;
                let row = AuditEntry::ok(p, AuditAction::TemplateBuild, None)
                    .detail(audit::TemplateBuilt {
                        template: id.to_string(),
                        name: new.name.clone(),
                        source: new.source.clone(),
                        digest: built.digest.clone(),
                        layers: built.layers.len(),
                        cached_layers: built.layers.iter().filter(|l| l.cached).count(),
                    })
                    .into_row();
                let (tid, bytes) = (id.to_string(), built.bytes);
                let defaults = (!configured).then(|| self.quota_defaults());
                let stored = self
                    .db("record a built template", move |s| {
                        s.transaction(|tx| {
                            tx.finish_template(&tid, &encoded, bytes, defaults.as_ref())?;
                            audit::append(tx, &row)?;
                            Ok::<_, StoreError>(())
                        })
                    })
                    .await;
                if let Err(e) = stored {
                    self.discard_build(&id).await;
                    let refused = self
                        .audit_refusal(p, AuditAction::TemplateBuild, None, Err::<(), _>(e))
                        .await;
                    let e = match refused {
                        Err(e) => e,
                        Ok(()) => ServiceError::internal("record a built template", &"no error"),
                    };
                    let _ = events
                        .send(TemplateBuildEvent::Error {
                            code: e.code,
                            message: e.message.clone(),
                        })
                        .await;
                    return Err(e);
                }
                let info = template_info(
                    &TemplateRecord {
                        id: id.to_string(),
                        tenant: new.tenant,
                        name: new.name,
                        source: new.source,
                        ready: true,
                        detail_json: String::new(),
                        created_at_ms: new.created_at_ms,
                        storage_bytes: built.bytes,
                    },
                    Some(&detail),
                );
                let _ = events
                    .send(TemplateBuildEvent::Done {
                        template: Box::new(info.clone()),
                    })
                    .await;
                Ok(info)
            }
            Err(e) => {
                self.discard_build(&id).await;
                let entry = AuditEntry::ok(p, AuditAction::TemplateBuild, None)
                    .outcome(e.code.as_str())
                    .detail(audit::TemplateBuildFailed {
                        template: id.to_string(),
                        name: new.name.clone(),
                        source: new.source.clone(),
                        code: e.code.as_str().to_owned(),
                        message: e.message.clone(),
                    });
                self.audit(entry).await?;
                let _ = events
                    .send(TemplateBuildEvent::Error {
                        code: e.code,
                        message: e.message.clone(),
                    })
                    .await;
                Err(e)
            }
        }
    }

    /// The directory builds fetch and unpack their sources in, made when missing: the server's own
    /// (0700), since a private registry's image is nobody else's to read. `unsupported` when none
    /// is configured.
    pub(super) fn pull_dir(&self) -> Result<std::path::PathBuf, ServiceError> {
        use std::os::unix::fs::DirBuilderExt;
        let Some(pull_dir) = self.inner.config.images.pull_dir.clone() else {
            return Err(ServiceError::new(
                ErrorCode::Unsupported,
                "this server builds no templates (no pull directory is configured)",
            ));
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&pull_dir)
            .map_err(|e| ServiceError::internal("create the pull directory", &e))?;
        Ok(pull_dir)
    }

    /// How much a build for `p` may write: the server's bound of one build, or what is left of
    /// the tenant's storage quota when that is less (`quota_exceeded` when nothing is left). The
    /// operator's own templates (`configured`) get the server's bound.
    async fn build_room(&self, p: &Principal, configured: bool) -> Result<BuildRoom, ServiceError> {
        let bound = self.inner.config.images.limits.max_bytes;
        let left = if configured {
            None
        } else {
            self.storage_room(p).await?
        };
        match left {
            Some(0) => {
                let request = paddock_store::QuotaRequest {
                    templates: 1,
                    storage_bytes: 1,
                    ..paddock_store::QuotaRequest::default()
                };
                self.precheck_quota(p, AuditAction::TemplateBuild, None, request)
                    .await?;
                // (Room freed meanwhile: build within the bound.)
                Ok(BuildRoom {
                    bytes: bound,
                    by_quota: false,
                })
            }
            Some(left) if left < bound => Ok(BuildRoom {
                bytes: left,
                by_quota: true,
            }),
            _ => Ok(BuildRoom {
                bytes: bound,
                by_quota: false,
            }),
        }
    }

    /// Fetches the image into `dest` and has the backend build template `id` from it, writing at
    /// most `room`.
    pub(crate) async fn pull_and_build(
        &self,
        id: &TemplateId,
        reference: &ImageReference,
        dest: &std::path::Path,
        room: BuildRoom,
        events: &mpsc::Sender<TemplateBuildEvent>,
    ) -> Result<TemplateBuilt, ServiceError> {
        let _ = events
            .send(TemplateBuildEvent::Pulling {
                reference: reference.to_string(),
            })
            .await;
        // Layers whose trees the layer cache holds are not fetched: their blobs would not be read.
        let service = self.clone();
        let cached: paddock_registry::CachedLayers<'static> =
            Box::new(move |digests| Box::pin(async move { service.cached_layers(&digests).await }));
        let options = &self.inner.config.images.pull;
        let pulled = paddock_registry::pull_reusing(reference, dest, options, cached)
            .await
            .map_err(registry_error)?;
        paddock_runtime::fault::point("template.pulled");
        let _ = events
            .send(TemplateBuildEvent::Pulled {
                digest: pulled.manifest_digest.clone(),
                layers: pulled.layers.len(),
                bytes: pulled.bytes_downloaded,
            })
            .await;
        let built = self
            .build_layout(id, dest, Some(pulled.ref_name.clone()), room, events)
            .await;
        if built.is_err() && pulled.skipped_layers > 0 {
            // The layers not fetched may have left the cache since (their last template was
            // deleted meanwhile): then fetch them and build again; else the failure stands.
            let digests: Vec<String> = pulled.layers.iter().map(|l| l.digest.clone()).collect();
            if self.cached_layers(&digests).await < pulled.skipped_layers {
                tracing::info!(template = %id, "cached layers vanished during the build; fetching them");
                paddock_registry::pull(reference, dest, options)
                    .await
                    .map_err(registry_error)?;
                return self
                    .build_layout(id, dest, Some(pulled.ref_name.clone()), room, events)
                    .await;
            }
        }
        built
    }

    /// How many of the first of an image's layers (digests, bottom first) the layer cache holds
    /// the trees of (0 when it cannot tell).
    async fn cached_layers(&self, digests: &[String]) -> usize {
        let keys = paddock_runtime::image_chain_keys(digests);
        match self
            .on_backend("read the layer cache", move |b| b.cached_prefix(&keys))
            .await
        {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "layer cache unreadable; fetching every layer");
                0
            }
            Err(_) => 0,
        }
    }

    /// Has the backend build template `id` from the image `reference` of the OCI image layout
    /// `dest`, writing at most `room`.
    pub(crate) async fn build_layout(
        &self,
        id: &TemplateId,
        dest: &std::path::Path,
        reference: Option<String>,
        room: BuildRoom,
        events: &mpsc::Sender<TemplateBuildEvent>,
    ) -> Result<TemplateBuilt, ServiceError> {
        let source = TemplateSource::ImageLayout {
            path: dest.to_owned(),
            reference,
        };
        let limits = paddock_runtime::TemplateLimits {
            max_bytes: room.bytes,
            ..self.inner.config.images.limits
        };
        let (template, sender) = (id.clone(), events.clone());
        self.on_backend("build a template", move |b| {
            let mut of = 0;
            b.build_template(&template, &source, &limits, &mut |progress| match progress {
                TemplateProgress::Resolved { layers, .. } => of = layers,
                TemplateProgress::Layer {
                    index,
                    digest,
                    size,
                    cached,
                } => {
                    // Progress is never worth stalling a build for: a reader that fell 64 events
                    // behind misses some (the last event is always sent).
                    let _ = sender.try_send(TemplateBuildEvent::Layer {
                        index,
                        of,
                        digest,
                        size,
                        cached,
                    });
                }
            })
        })
        .await?
        .map_err(|e| build_error(e, room))
    }

    /// Removes what a failed build may have left: its files and its record.
    async fn discard_build(&self, id: &TemplateId) {
        let template = id.clone();
        if let Ok(Err(e)) = self
            .on_backend("delete a template", move |b| b.delete_template(&template))
            .await
        {
            tracing::warn!(template = %id, error = %e, "files of a failed build not removed; gc will");
        }
        let tid = id.to_string();
        if let Err(e) = self
            .db("forget a template", move |s| s.forget_template(&tid))
            .await
        {
            tracing::warn!(template = %id, error = %e, "record of a failed build not removed");
        }
    }

    /// One of the caller's templates, by id or name, or one of the server's.
    pub async fn get_template(&self, p: &Principal, id_or_name: &str) -> Result<TemplateInfo, ServiceError> {
        if let Some(t) = self.inner.config.templates.get(id_or_name) {
            return self.server_template_info(id_or_name, t).await;
        }
        let record = self.owned_template(p, id_or_name).await?;
        let detail = parse_detail(&record)?;
        Ok(template_info(&record, detail.as_ref()))
    }

    /// The server's templates, then the caller's (ready ones and those being built), by name.
    pub async fn list_templates(&self, p: &Principal) -> Result<TemplateList, ServiceError> {
        let mut templates = Vec::new();
        for (name, t) in &self.inner.config.templates {
            templates.push(self.server_template_info(name, t).await?);
        }
        let tenant = p.tenant.clone();
        let records = self
            .db("list templates", move |s| s.list_templates(&tenant))
            .await?;
        // (The operator's tenant also holds the configured templates the server built.)
        for record in records
            .iter()
            .filter(|r| !self.inner.config.templates.contains_key(&r.name))
        {
            templates.push(template_info(record, parse_detail(record)?.as_ref()));
        }
        Ok(TemplateList { templates })
    }

    /// The names [`Self::list_templates`] lists, without reading what each was built from (one
    /// query: for front-ends that map a name on every create).
    pub async fn template_names(&self, p: &Principal) -> Result<Vec<String>, ServiceError> {
        let mut names: Vec<String> = self.inner.config.templates.keys().cloned().collect();
        let tenant = p.tenant.clone();
        let records = self
            .db("list templates", move |s| s.list_templates(&tenant))
            .await?;
        names.extend(
            records
                .into_iter()
                .map(|r| r.name)
                .filter(|n| !self.inner.config.templates.contains_key(n)),
        );
        Ok(names)
    }

    /// One of the server's templates: a built one with what it was built from, once ready.
    async fn server_template_info(
        &self,
        name: &str,
        t: &crate::TemplateConfig,
    ) -> Result<TemplateInfo, ServiceError> {
        let built = crate::core::live::lock(&self.inner.built_templates)
            .get(name)
            .cloned();
        if let Some(id) = built {
            let id = id.to_string();
            let record = self
                .db("read a template", move |s| {
                    s.find_template(crate::core::principal::ADMIN_TENANT, &id)
                })
                .await?;
            if let Some(record) = record {
                let mut info = template_info(&record, parse_detail(&record)?.as_ref());
                info.warm_pool_size = t.warm_pool_size;
                return Ok(info);
            }
        }
        Ok(configured_info(name, t.warm_pool_size))
    }

    /// Deletes one of the caller's templates and frees its storage; refused (`template_in_use`)
    /// while a sandbox made from it runs or is stopped.
    #[tracing::instrument(skip_all, fields(tenant = %p.tenant))]
    pub async fn delete_template(&self, p: &Principal, id_or_name: &str) -> Result<(), ServiceError> {
        if self.inner.config.templates.contains_key(id_or_name) {
            return Err(ServiceError::new(
                ErrorCode::Forbidden,
                format!("{id_or_name} is one of this server's templates (its configuration owns it)"),
            ));
        }
        let record = self.owned_template(p, id_or_name).await?;
        if !record.ready {
            return Err(ServiceError::new(
                ErrorCode::TemplateInUse,
                format!("template {} is being built", record.name),
            ));
        }
        let id: TemplateId = record
            .id
            .parse()
            .map_err(|e| ServiceError::internal("parse a template id", &e))?;
        let tid = record.id.clone();
        let outcome = self
            .db("delete a template", move |s| {
                s.delete_template_unless_used(&tid, now_ms())
            })
            .await?;
        match outcome {
            TemplateDeletion::InUse(users) => {
                let entry = AuditEntry::ok(p, AuditAction::TemplateDelete, None)
                    .outcome(ErrorCode::TemplateInUse.as_str())
                    .detail(audit::TemplateInUse {
                        template: record.id.clone(),
                        used_by: users.clone(),
                    });
                self.audit(entry).await?;
                Err(ServiceError::new(
                    ErrorCode::TemplateInUse,
                    format!(
                        "template {} is used by {}; delete those sandboxes and snapshots first",
                        record.name,
                        users.join(", ")
                    ),
                ))
            }
            TemplateDeletion::Absent => Err(template_not_found(id_or_name)),
            TemplateDeletion::Deleted => {
                self.audit(AuditEntry::ok(p, AuditAction::TemplateDelete, None).detail(
                    audit::TemplateDeleted {
                        template: record.id.clone(),
                        name: record.name.clone(),
                    },
                ))
                .await?;
                let template = id.clone();
                if let Ok(Err(e)) = self
                    .on_backend("delete a template", move |b| b.delete_template(&template))
                    .await
                {
                    tracing::warn!(template = %id, error = %e, "template storage not freed; gc will");
                }
                Ok(())
            }
        }
    }

    async fn owned_template(&self, p: &Principal, id_or_name: &str) -> Result<TemplateRecord, ServiceError> {
        let (tenant, lookup) = (p.tenant.clone(), id_or_name.to_owned());
        self.db("read a template", move |s| s.find_template(&tenant, &lookup))
            .await?
            .ok_or_else(|| template_not_found(id_or_name))
    }
}

/// The most a readiness check may wait.
const MAX_READY_SECS: u64 = 600;

/// Refuses a start command that could never run or never be ready, naming the field.
fn check_start(start: &TemplateStart) -> Result<(), ServiceError> {
    if start
        .command
        .as_ref()
        .is_some_and(|c| c.is_empty() || c[0].is_empty())
    {
        return Err(ServiceError::invalid(
            "start.command",
            "give a program and its arguments",
        ));
    }
    if let Some(ready) = &start.ready {
        match (&ready.port, &ready.command) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(ServiceError::invalid(
                    "start.ready",
                    "give exactly one of `port` and `command`",
                ))
            }
            (Some(0), None) => {
                return Err(ServiceError::invalid(
                    "start.ready.port",
                    "a port from 1 to 65535",
                ))
            }
            (None, Some(c)) if c.is_empty() || c[0].is_empty() => {
                return Err(ServiceError::invalid(
                    "start.ready.command",
                    "give a program and its arguments",
                ))
            }
            _ => {}
        }
        if ready.timeout_secs == 0 || ready.timeout_secs > MAX_READY_SECS {
            return Err(ServiceError::invalid(
                "start.ready.timeout_secs",
                format!("from 1 to {MAX_READY_SECS}"),
            ));
        }
    }
    Ok(())
}

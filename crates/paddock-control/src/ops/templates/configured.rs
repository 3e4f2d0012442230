//! Templates the server's configuration has it build (`[templates.NAME] image` or `recipe`): built
//! in the background at start for the operator's tenant, reused while their source is unchanged,
//! and registered so that creates and warm pools of that name resolve to them.

use paddock_types::api::BuildTemplateRequest;
use paddock_types::TemplateId;
use tokio::sync::mpsc;

use crate::core::time::now_ms;
use crate::{Principal, SandboxService, ServiceError};

/// The source a recipe template is recorded with: the first 16 hex digits of the text's SHA-256
/// (which text it was built from, what a restart compares), its base and its length.
pub(super) fn recipe_source(text: &str, recipe: &paddock_types::recipe::Recipe) -> String {
    use sha2::Digest as _;
    let digest = &hex::encode(sha2::Sha256::digest(text.as_bytes()))[..16];
    format!(
        "recipe sha256:{digest}: FROM {}, {} steps",
        recipe.from,
        recipe.steps.len()
    )
}

/// The source string a configured template is recorded with (what a restart compares).
fn configured_source(t: &crate::TemplateConfig) -> String {
    if let Some(debian) = &t.debian {
        return debian.source();
    }
    match (&t.image, &t.recipe) {
        (Some(image), _) => image.clone(),
        // (The configuration refused a recipe that does not parse.)
        (None, Some(text)) => paddock_types::recipe::parse_recipe(text, &t.build.args)
            .map(|recipe| recipe_source(text, &recipe) + &t.build.source_suffix())
            .unwrap_or_default(),
        (None, None) => String::new(),
    }
}

/// The last [`TAIL_BYTES`] of the `RUN` steps' output among `events` (until the build drops its
/// sender), for the log of a failed configured build.
async fn output_tail(mut events: mpsc::Receiver<paddock_types::api::TemplateBuildEvent>) -> String {
    let mut tail = String::new();
    while let Some(event) = events.recv().await {
        if let paddock_types::api::TemplateBuildEvent::Log { text, .. } = event {
            tail.push_str(&text);
            keep_tail(&mut tail, TAIL_BYTES);
        }
    }
    tail
}

/// How much of a failed configured build's output its log line keeps.
const TAIL_BYTES: usize = 4096;

/// Cuts `text` to its last `max` bytes (at a character boundary).
fn keep_tail(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut cut = text.len() - max;
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    text.drain(..cut);
}

impl SandboxService {
    /// Builds, in the background, every configured template made from an image or a recipe, for
    /// the operator's tenant under its configured name; one already built from the same source is
    /// used as it is (a recipe whose steps are cached rebuilds in moments anyway). Once one is ready,
    /// sandboxes can be made from it and its warm pool fills. A failed build is logged and retried
    /// a minute later.
    pub fn ensure_configured_templates(&self) {
        let mut tasks = Vec::new();
        for (name, t) in &self.inner.config.templates {
            if !t.is_built() {
                continue;
            }
            let (service, name, t) = (self.clone(), name.clone(), t.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    match service.ensure_configured(&name, &t).await {
                        Ok(id) => {
                            tracing::info!(template = %name, id = %id, "configured template ready");
                            crate::core::live::lock(&service.inner.built_templates).insert(name.clone(), id);
                            service.inner.pool_wakeup.notify_waiters();
                            return;
                        }
                        Err(e) => {
                            tracing::error!(template = %name, error = %e.message, code = e.code.as_str(), "configured template not built; retrying in a minute");
                        }
                    }
                    tokio::select! {
                        () = service.inner.stop.cancelled() => return,
                        () = tokio::time::sleep(std::time::Duration::from_secs(60)) => {}
                    }
                }
            }));
        }
        crate::core::live::lock(&self.inner.tasks).extend(tasks);
    }

    async fn ensure_configured(
        &self,
        name: &str,
        t: &crate::TemplateConfig,
    ) -> Result<TemplateId, ServiceError> {
        use crate::core::principal::ADMIN_TENANT;
        let operator = Principal {
            tenant: ADMIN_TENANT.to_owned(),
            key_id: "server-config".to_owned(),
            admin: true,
            change_network: true,
            approver: false,
        };
        let source = configured_source(t);
        // The operator's tenant exists once an admin key does; a fresh store may not have it yet.
        self.db("record the operator's tenant", move |s| {
            s.ensure_tenant(ADMIN_TENANT, now_ms())
        })
        .await?;
        let lookup = name.to_owned();
        let existing = self
            .db("read a template", move |s| s.find_template(ADMIN_TENANT, &lookup))
            .await?;
        if let Some(record) = existing {
            if record.ready && record.source == source {
                return record
                    .id
                    .parse()
                    .map_err(|e| ServiceError::internal("parse a template id", &e));
            }
            // Built from something else: replaced (refused while a sandbox holds it).
            self.delete_template(&operator, &record.id).await?;
        }
        if let Some(debian) = &t.debian {
            let (events, _) = mpsc::channel(1);
            let wanted = super::Wanted {
                name: super::template_name(name)?,
                source_text: source,
                network: None,
                start: None,
            };
            let info = self
                .build_from(
                    &operator,
                    wanted,
                    super::Source::Debian(debian.clone()),
                    events,
                    true,
                )
                .await?;
            return info
                .id
                .ok_or_else(|| ServiceError::internal("build a configured template", &"no id"))?
                .parse()
                .map_err(|e| ServiceError::internal("parse a template id", &e));
        }
        let request = BuildTemplateRequest {
            name: name.to_owned(),
            from: t.image.clone(),
            recipe: t.recipe.clone(),
            build_args: t.build.args.clone(),
            network: t.build.network.clone(),
            start: None,
        };
        // The events are read only for the end of the steps' output, which a failure logs (the
        // operator has no other view of a configured build). Sends never wait: what the reader
        // misses is missed.
        let (events, received) = mpsc::channel(64);
        let tail = tokio::spawn(output_tail(received));
        let built = self.build_named(&operator, request, events, true).await;
        let info = match built {
            Ok(info) => info,
            Err(e) => {
                let tail = tail.await.unwrap_or_default();
                if !tail.is_empty() {
                    tracing::error!(template = %name, error = %e.message, "the end of the failed build's output:\n{tail}");
                }
                return Err(e);
            }
        };
        info.id
            .ok_or_else(|| ServiceError::internal("build a configured template", &"no id"))?
            .parse()
            .map_err(|e| ServiceError::internal("parse a template id", &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_last_bytes_on_a_character_boundary() {
        let mut text = "abcdé".repeat(3);
        keep_tail(&mut text, 5);
        assert_eq!(text, "bcdé");
        // A cut inside 'é' (two bytes) moves past it rather than splitting it.
        keep_tail(&mut text, 1);
        assert_eq!(text, "");
        let mut short = "ok".to_owned();
        keep_tail(&mut short, 5);
        assert_eq!(short, "ok");
    }

    #[tokio::test]
    async fn the_tail_is_the_end_of_the_steps_output() {
        use paddock_types::api::TemplateBuildEvent;
        let (tx, rx) = mpsc::channel(8);
        let reader = tokio::spawn(output_tail(rx));
        for text in ["first\n", "x".repeat(TAIL_BYTES).as_str(), "last line\n"] {
            tx.send(TemplateBuildEvent::Log {
                step: 1,
                stream: "stderr".into(),
                text: text.to_owned(),
            })
            .await
            .expect("sent");
        }
        drop(tx);
        let tail = reader.await.expect("the reader ends with the build");
        assert_eq!(tail.len(), TAIL_BYTES);
        assert!(tail.ends_with("last line\n") && !tail.contains("first"), "{tail}");
    }
}

//! Templates built by recipes (a Dockerfile subset, parsed by `paddock_types::recipe`): the
//! `FROM` image is built as any image template, then each `RUN` runs in a sandbox of the template
//! so far (the caller's sandbox: its quota, audit rows and network policy apply; never the host),
//! and its files become the next template. The other instructions change the process defaults.
//!
//! Every step's result is kept in the backend's layer cache under a key chaining the `FROM`
//! reference and the steps before it (a `RUN`'s key covers the instructions since the previous
//! `RUN`, so an `ENV` change reruns what follows it): a rebuild reuses the longest unchanged prefix
//! and runs nothing of it, not even the pull. The templates between steps are never recorded; a
//! crash leaves them to startup gc, and their sandboxes expire with their timeout.
//!
//! `COPY` and `ADD` run like `RUN` steps, in a sandbox of the template so far, and make the files
//! of the build context (`context.rs`, uploaded with the recipe) through its agent (`copy.rs`);
//! their keys cover what they copy. Without a context they are refused.

use std::collections::BTreeMap;

use paddock_runtime::TemplateBuilt;
use paddock_types::api::{CreateSandboxRequest, ErrorCode, TemplateBuildEvent};
use paddock_types::recipe::{Command, ConfigApplier, Instruction, Recipe};
use paddock_types::{ImageConfig, SandboxId, TemplateId};
use sha2::{Digest as _, Sha256};
use tokio::sync::mpsc;

use crate::core::service::runtime_error;
use crate::lifecycle::build_step::BuildCommand;
use crate::plan::template::{ResolvedTemplate, TemplateDetail};
use crate::{Principal, SandboxService, ServiceError};

use super::context::{ArchiveKind, Context, Kind, Placed};
use std::sync::Arc;

/// How long one `RUN` may take.
const STEP_TIMEOUT_MS: u64 = 3600 * 1000;
/// How long a step's sandbox lives at most (its step's timeout and some): one a crash left behind
/// expires by itself.
const STEP_SANDBOX_TIMEOUT_SECS: u64 = 3600 + 600;
/// Most bytes of a step's output sent as build events (the rest is cut, and said so).
const MAX_STEP_LOG: usize = 64 << 10;

/// What a step that changes files does in its sandbox.
enum StepAction<'a> {
    Run(StepRun<'a>),
    Copy(CopyRun<'a>),
}

/// One `COPY` (or `ADD`) to make: what goes where, from which context, owned by whom (`root` when
/// `chown` is `None`).
pub(super) struct CopyRun<'a> {
    pub(super) placed: &'a [Placed],
    pub(super) context: Arc<Context>,
    pub(super) chown: Option<String>,
}

/// One `RUN` to run: its step's index, command, environment (build arguments under the image's
/// variables) and the network of its sandbox.
struct StepRun<'a> {
    index: usize,
    command: &'a Command,
    env: BTreeMap<String, String>,
    network: Option<paddock_types::NetworkPolicy>,
}

/// A recipe with the cache keys of its trees: the `FROM` image's, then one per step that changes
/// files (`RUN`, `COPY`, `ADD`).
#[derive(Debug, Clone)]
pub(crate) struct RecipePlan {
    pub(crate) recipe: Recipe,
    /// `keys[0]`: the `FROM` image; `keys[i]`: after the i-th step that changes files.
    keys: Vec<String>,
    /// For each step that changes files (in order), its index in `recipe.steps`.
    runs: Vec<usize>,
    /// What each `COPY` and `ADD` (by step index) puts where.
    copies: BTreeMap<usize, Vec<Placed>>,
    /// The build context they copy from.
    context: Option<Arc<Context>>,
    /// Top-level directories the steps need (of `WORKDIR`s and `COPY` destinations), added to
    /// the `FROM` image's tree where it has none: a template's top level is fixed for its
    /// sandboxes.
    top_dirs: Vec<String>,
}

/// Most bytes an archive `ADD` unpacks.
const MAX_ADD_ARCHIVE_BYTES: u64 = 16 << 30;

/// What `ADD` makes of `placed` (step `step`): a local tar archive (plain or gzip, told by its
/// bytes as docker does) is unpacked into the destination directory instead of copied.
fn unpack_archives(
    context: &Arc<Context>,
    placed: Vec<Placed>,
    dest: &str,
    step: usize,
) -> Result<Vec<Placed>, String> {
    let mut out = Vec::with_capacity(placed.len());
    for (n, p) in placed.into_iter().enumerate() {
        let kind = context
            .archive_kind(&p.member)
            .map_err(|e| format!("cannot read {}: {e}", p.name))?;
        match kind {
            ArchiveKind::None => out.push(p),
            ArchiveKind::Unsupported(what) => {
                return Err(format!(
                    "ADD would unpack {}, a {what}-compressed archive, which is not supported (plain or gzip tar only)",
                    p.name
                ))
            }
            ArchiveKind::Tar => {
                let nested = context
                    .unpack(&p.member, &format!("add-{step}-{n}.tar"), MAX_ADD_ARCHIVE_BYTES)
                    .map_err(|e| format!("ADD of {}: {e}", p.name))?;
                out.extend(Arc::new(nested).place_all(dest)?);
            }
        }
    }
    Ok(out)
}

/// The top-level directory of `path` (absolute, normalised) that a step needs: one it is under,
/// or the path itself when `is_dir`; not paddock's own (`proc`, `dev`, `sys`).
fn top_dir(path: &str, is_dir: bool) -> Option<String> {
    let rest = path.trim_start_matches('/');
    let (top, deeper) = match rest.split_once('/') {
        Some((top, _)) => (top, true),
        None => (rest, false),
    };
    (!top.is_empty() && (deeper || is_dir) && !matches!(top, "proc" | "dev" | "sys" | "." | ".."))
        .then(|| top.to_owned())
}

fn sha256_hex(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for part in parts {
        h.update(part.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())
}

impl RecipePlan {
    /// Plans `recipe`, whose `COPY` and `ADD` take files from `context`; refuses what this
    /// server cannot build (`invalid_request`, field `recipe`, for what the context lacks).
    pub(crate) fn new(recipe: Recipe, context: Option<Arc<Context>>) -> Result<Self, ServiceError> {
        let mut top_dirs = std::collections::BTreeSet::new();
        // Per step that changes files: what its key covers (the instructions since the previous
        // one, its own text, what it copies).
        let mut parts: Vec<(String, String, String)> = Vec::new();
        let mut runs = Vec::new();
        let mut copies = BTreeMap::new();
        let mut since_last = String::new();
        for (i, step) in recipe.steps.iter().enumerate() {
            let content = match &step.instruction {
                Instruction::Run { .. } => String::new(),
                Instruction::Copy { sources, dest, .. } | Instruction::Add { sources, dest, .. } => {
                    let Some(context) = &context else {
                        return Err(ServiceError::new(
                            ErrorCode::Unsupported,
                            format!(
                                "line {}: COPY and ADD need a build context: upload it (POST /v1/templates/import?format=context, or `paddock template build -f Recipe --context DIR`)",
                                step.line
                            ),
                        ));
                    };
                    let refuse =
                        |m: String| ServiceError::invalid("recipe", format!("line {}: {m}", step.line));
                    let mut placed = context.select(sources, dest).map_err(refuse)?;
                    if matches!(step.instruction, Instruction::Add { .. }) {
                        placed = unpack_archives(context, placed, dest, i).map_err(refuse)?;
                    }
                    let digest = Context::digest(&placed);
                    top_dirs.extend(
                        placed
                            .iter()
                            .filter_map(|p| top_dir(&p.dest, p.member.kind == Kind::Dir)),
                    );
                    copies.insert(i, placed);
                    digest
                }
                Instruction::Workdir { path } => {
                    top_dirs.extend(top_dir(path, true));
                    since_last.push_str(&step.cache_text());
                    since_last.push('\n');
                    continue;
                }
                _ => {
                    since_last.push_str(&step.cache_text());
                    since_last.push('\n');
                    continue;
                }
            };
            parts.push((std::mem::take(&mut since_last), step.cache_text(), content));
            runs.push(i);
        }
        // The `FROM` tree's key, with the directories the steps add to it (without any, the key
        // of before they were added), then the steps'.
        let top_dirs: Vec<String> = top_dirs.into_iter().collect();
        let from_key = if top_dirs.is_empty() {
            sha256_hex(&["paddock-recipe-v1", "from", &recipe.from])
        } else {
            sha256_hex(&[
                "paddock-recipe-v1",
                "from",
                &recipe.from,
                "dirs",
                &top_dirs.join("/"),
            ])
        };
        let mut keys = vec![from_key];
        for (since, text, content) in &parts {
            let previous = keys.last().cloned().unwrap_or_default();
            // (A `RUN`'s key has no content part: keys cached before `COPY` existed stay valid.)
            keys.push(if content.is_empty() {
                sha256_hex(&[&previous, since, text])
            } else {
                sha256_hex(&[&previous, since, text, content])
            });
        }
        Ok(Self {
            recipe,
            keys,
            runs,
            copies,
            context,
            top_dirs,
        })
    }
}

fn event(events: &mpsc::Sender<TemplateBuildEvent>, e: TemplateBuildEvent) {
    // Progress never stalls a build (see `build_template`).
    let _ = events.try_send(e);
}

impl SandboxService {
    /// Builds `plan` as template `id` (recorded by the caller) for `p`; returns the result to
    /// record. Every template made on the way is removed, also on failure.
    pub(crate) async fn build_recipe(
        &self,
        p: &Principal,
        id: &TemplateId,
        plan: &RecipePlan,
        network: Option<paddock_types::NetworkPolicy>,
        room: super::BuildRoom,
        events: &mpsc::Sender<TemplateBuildEvent>,
    ) -> Result<TemplateBuilt, ServiceError> {
        let mut made: Vec<TemplateId> = Vec::new();
        let result = self
            .run_recipe(p, (id, plan), network, room, events, &mut made)
            .await;
        for template in made {
            let t = template.clone();
            if let Ok(Err(e)) = self
                .on_backend("delete a template", move |b| b.delete_template(&t))
                .await
            {
                tracing::warn!(template = %template, error = %e, "a recipe's step template not removed; gc will");
            }
        }
        result
    }

    /// [`Self::build_recipe`] of `build` (the template's id and its plan).
    async fn run_recipe(
        &self,
        p: &Principal,
        build: (&TemplateId, &RecipePlan),
        network: Option<paddock_types::NetworkPolicy>,
        room: super::BuildRoom,
        events: &mpsc::Sender<TemplateBuildEvent>,
        made: &mut Vec<TemplateId>,
    ) -> Result<TemplateBuilt, ServiceError> {
        let (id, plan) = build;
        let steps = &plan.recipe.steps;
        let of = steps.len() + 1;
        let keys = plan.keys.clone();
        let cached = self
            .on_backend("read the layer cache", move |b| b.cached_prefix(&keys))
            .await?
            .map_err(|e| runtime_error("read the layer cache", e))?;
        // The template so far, its chain, its process defaults, the steps it covers, and what it
        // holds.
        let (mut current, mut chain, config, mut done, mut bytes) = if cached == 0 {
            event(
                events,
                TemplateBuildEvent::Step {
                    index: 0,
                    of,
                    instruction: format!("FROM {}", plan.recipe.from),
                    cached: false,
                },
            );
            let base = TemplateId::from_random(rand::random());
            made.push(base.clone());
            let reference = plan
                .recipe
                .from
                .parse()
                .map_err(|e: paddock_registry::RegistryError| {
                    ServiceError::invalid("recipe", e.to_string())
                })?;
            let dest = self.pull_dir()?.join(base.as_str());
            let built = self.pull_and_build(&base, &reference, &dest, room, events).await;
            if let Err(e) = std::fs::remove_dir_all(&dest) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %dest.display(), error = %e, "pulled image not removed");
                }
            }
            let built = built?;
            if plan.top_dirs.is_empty() {
                let (t, key, bytes) = (base.clone(), plan.keys[0].clone(), built.bytes);
                self.on_backend("cache a template", move |b| b.cache_template(&t, &key, bytes))
                    .await?
                    .map_err(|e| runtime_error("cache a template", e))?;
                (base, vec![plan.keys[0].clone()], built.config, 0, built.bytes)
            } else {
                // The image with the top-level directories the steps need, cached as the `FROM`.
                let with_dirs = TemplateId::from_random(rand::random());
                made.push(with_dirs.clone());
                let (t, from, bytes) = (with_dirs.clone(), base.clone(), built.bytes);
                let (chain, dirs) = (vec![plan.keys[0].clone()], plan.top_dirs.clone());
                let made_dirs = self
                    .on_backend("add top-level directories", move |b| {
                        b.template_with_dirs(&t, &from, bytes, &chain, &dirs)
                    })
                    .await?
                    .map_err(|e| runtime_error("add top-level directories", e))?;
                (
                    with_dirs,
                    vec![plan.keys[0].clone()],
                    built.config,
                    0,
                    made_dirs.bytes,
                )
            }
        } else {
            let template = TemplateId::from_random(rand::random());
            made.push(template.clone());
            let chain = plan.keys[..cached].to_vec();
            let (t, c) = (template.clone(), chain.clone());
            let built = self
                .on_backend("make a template from the cache", move |b| {
                    b.template_from_cache(&t, &c)
                })
                .await?
                .map_err(|e| runtime_error("make a template from the cache", e))?
                .ok_or_else(|| {
                    ServiceError::internal("make a template from the cache", &"a cached step vanished")
                })?;
            // The steps up to the last cached `RUN` are done; their defaults are in its record.
            let done = if cached == 1 { 0 } else { plan.runs[cached - 2] + 1 };
            event(
                events,
                TemplateBuildEvent::Step {
                    index: 0,
                    of,
                    instruction: format!("FROM {}", plan.recipe.from),
                    cached: true,
                },
            );
            for (i, step) in steps.iter().enumerate().take(done) {
                event(
                    events,
                    TemplateBuildEvent::Step {
                        index: i + 1,
                        of,
                        instruction: step.cache_text(),
                        cached: true,
                    },
                );
            }
            (template, chain, built.config, done, built.bytes)
        };
        let base_digest = plan.keys[0].clone();
        // Until a `RUN` runs, the defaults-only steps are what the cache had too.
        let mut ran = cached == 0;
        // What the defaults were at the last step done, applied onward as the parser applies them.
        let recipe_cmd = steps[..done]
            .iter()
            .any(|s| matches!(s.instruction, Instruction::Cmd { .. }));
        let mut config = ConfigApplier::new(config, recipe_cmd);
        while done < steps.len() {
            let step = &steps[done];
            let changes_files = plan.runs.contains(&done);
            ran |= changes_files;
            event(
                events,
                TemplateBuildEvent::Step {
                    index: done + 1,
                    of,
                    instruction: step.cache_text(),
                    cached: !ran,
                },
            );
            if !changes_files {
                config.apply(&step.instruction);
                done += 1;
                continue;
            }
            let run = plan.runs.iter().position(|&i| i == done).unwrap_or_default();
            let next = TemplateId::from_random(rand::random());
            made.push(next.clone());
            chain.push(plan.keys[run + 1].clone());
            let line = step.line;
            let action = if let Instruction::Run { command, arg_env } = &step.instruction {
                // The step's build arguments are in its environment, under the image's own.
                let run_env: BTreeMap<String, String> = arg_env
                    .iter()
                    .cloned()
                    .chain(
                        config
                            .config()
                            .env
                            .iter()
                            .filter_map(|e| e.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned()))),
                    )
                    .collect();
                StepAction::Run(StepRun {
                    index: done,
                    command,
                    env: run_env,
                    network: network.clone(),
                })
            } else {
                let chown = match &step.instruction {
                    Instruction::Copy { chown, .. } | Instruction::Add { chown, .. } => chown.clone(),
                    _ => None,
                };
                let (Some(placed), Some(context)) = (plan.copies.get(&done), &plan.context) else {
                    return Err(ServiceError::internal("copy files", &"a planned copy is missing"));
                };
                StepAction::Copy(CopyRun {
                    placed,
                    context: context.clone(),
                    chown,
                })
            };
            bytes = self
                .run_step(
                    p,
                    (&current, config.config(), bytes),
                    (&next, &chain),
                    action,
                    events,
                )
                .await
                .map_err(|mut e| {
                    e.message = format!("line {line}: {}", e.message);
                    e
                })?;
            current = next;
            done += 1;
        }
        // The template itself: the last tree, recorded under the build's id.
        let (t, c) = (id.clone(), chain.clone());
        let last = self
            .on_backend("make a template from the cache", move |b| {
                b.template_from_cache(&t, &c)
            })
            .await?
            .map_err(|e| runtime_error("make a template from the cache", e))?
            .ok_or_else(|| {
                ServiceError::internal("make a template from the cache", &"the last step vanished")
            })?;
        let _ = (current, bytes);
        Ok(TemplateBuilt {
            digest: format!("recipe:{}", chain.last().unwrap_or(&base_digest)),
            config: config.into_config(),
            layers: Vec::new(),
            added_default_user: false,
            bytes: last.bytes,
        })
    }

    /// Runs one `RUN` in a sandbox of `from` (a template, its defaults and what it holds) and makes
    /// template `to.0` of its files, cached as `to.1`'s last key; returns what that holds.
    async fn run_step(
        &self,
        p: &Principal,
        from: (&TemplateId, &ImageConfig, u64),
        to: (&TemplateId, &[String]),
        action: StepAction<'_>,
        events: &mpsc::Sender<TemplateBuildEvent>,
    ) -> Result<u64, ServiceError> {
        let (template, config, bytes) = from;
        let network = match &action {
            StepAction::Run(run) => run.network.clone(),
            // A copy needs no network.
            StepAction::Copy(_) => None,
        };
        let image = ResolvedTemplate {
            id: template.clone(),
            detail: TemplateDetail {
                built: TemplateBuilt {
                    digest: String::new(),
                    config: config.clone(),
                    layers: Vec::new(),
                    added_default_user: false,
                    bytes,
                },
                start: None,
            },
        };
        let request = CreateSandboxRequest {
            template: Some(".recipe-step".into()),
            network,
            timeout_secs: Some(STEP_SANDBOX_TIMEOUT_SECS),
            labels: BTreeMap::from([(
                crate::plan::template::BUILD_STEP_LABEL.to_owned(),
                to.0.to_string(),
            )]),
            ..CreateSandboxRequest::default()
        };
        let plan = self.plan_request_with(p, request, Some(image)).await?;
        let (sandbox, entry) = self
            .boot_recorded(p, plan, paddock_types::VolumeSource::Template, 0)
            .await?;
        self.commit_created(p, sandbox.as_str(), entry).await?;
        let result = self
            .step_in(p, &sandbox, (config, bytes), to, &action, events)
            .await;
        if let Err(e) = self.kill_sandbox(p, &sandbox).await {
            tracing::warn!(sandbox_id = %sandbox, error = %e, "a recipe step's sandbox not removed; it expires");
        }
        result
    }

    /// Runs a `RUN` step's command in `sandbox`; `build_failed` unless it exits 0.
    async fn run_in(
        &self,
        p: &Principal,
        sandbox: &SandboxId,
        config: &ImageConfig,
        step: &StepRun<'_>,
        events: &mpsc::Sender<TemplateBuildEvent>,
    ) -> Result<(), ServiceError> {
        let index = step.index;
        let user = config
            .user
            .as_deref()
            .map(|u| u.split(':').next().unwrap_or(u).to_owned())
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "root".into());
        let mut logged = 0usize;
        let mut on_output = |stream: paddock_protocol::Stream, data: &[u8]| {
            if logged >= MAX_STEP_LOG {
                return;
            }
            let take = data.len().min(MAX_STEP_LOG - logged);
            logged += take;
            let mut text = String::from_utf8_lossy(&data[..take]).into_owned();
            if logged == MAX_STEP_LOG {
                text.push_str("\n[paddock: the rest of this step's output is not shown]\n");
            }
            let stream = match stream {
                paddock_protocol::Stream::Stderr => "stderr",
                _ => "stdout",
            };
            event(
                events,
                TemplateBuildEvent::Log {
                    step: index + 1,
                    stream: stream.to_owned(),
                    text,
                },
            );
        };
        // The step's network as every process of a networked sandbox sees it (proxy, and the
        // sandbox's CA for the clients that keep their own trust store: pip's, Node's), beneath
        // the recipe's own variables; the template's configuration never holds them.
        let mut env: BTreeMap<String, String> = self.network_env(sandbox.as_str()).into_iter().collect();
        env.extend(step.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let command = BuildCommand {
            argv: step.command.argv(),
            env,
            cwd: config.working_dir.clone().unwrap_or_else(|| "/".into()),
            user,
            timeout_ms: STEP_TIMEOUT_MS,
            tag: "recipe-step",
        };
        let exit = self
            .run_build_command(p, sandbox, command, &mut on_output)
            .await?;
        if exit.timed_out || exit.code != Some(0) {
            return Err(ServiceError::new(
                ErrorCode::BuildFailed,
                if exit.timed_out {
                    format!("RUN timed out after {} s", STEP_TIMEOUT_MS / 1000)
                } else if let Some(signal) = exit.signal {
                    format!("RUN was killed by signal {signal}")
                } else {
                    format!("RUN exited with code {}", exit.code.unwrap_or(-1))
                },
            ));
        }
        Ok(())
    }

    async fn step_in(
        &self,
        p: &Principal,
        sandbox: &SandboxId,
        from: (&ImageConfig, u64),
        to: (&TemplateId, &[String]),
        action: &StepAction<'_>,
        events: &mpsc::Sender<TemplateBuildEvent>,
    ) -> Result<u64, ServiceError> {
        let (config, from_bytes) = from;
        match action {
            StepAction::Run(step) => self.run_in(p, sandbox, config, step, events).await?,
            StepAction::Copy(copy) => self.copy_in(sandbox, copy).await?,
        }
        paddock_runtime::fault::point("template.step_done");
        // A snapshot of the step's files, kept only until the template is made of it (a crash
        // in between leaves storage without a record, which startup gc removes).
        let snapshot = paddock_types::SnapshotId::from_random(rand::random());
        let sb = self
            .live_sandbox(sandbox.as_str())
            .ok_or_else(|| ServiceError::sandbox_ending(sandbox))?;
        let s = snapshot.clone();
        // The capture commits the pool's transaction: the sandbox's count then covers every byte
        // the snapshot holds of its own writes (as a checkpoint's charge is measured).
        let written = self
            .on_live_handle(&sb, "snapshot a recipe step", move |b, h| {
                b.snapshot_sandbox(h, &s)?;
                b.sandbox_usage(h).map(|u| u.disk_bytes).inspect_err(|_| {
                    let _ = b.delete_snapshot(&s);
                })
            })
            .await?;
        let snapshot_bytes = from_bytes.saturating_add(written);
        let (t, s, c, cfg) = (to.0.clone(), snapshot.clone(), to.1.to_vec(), config.clone());
        let made = self
            .on_backend("make a template of a step", move |b| {
                b.template_from_snapshot(&t, &s, &c, &cfg, snapshot_bytes)
            })
            .await
            .and_then(|r| r.map_err(|e| runtime_error("make a template of a step", e)));
        let s = snapshot.clone();
        if let Ok(Err(e)) = self
            .on_backend("delete a snapshot", move |b| b.delete_snapshot(&s))
            .await
        {
            tracing::warn!(snapshot = %snapshot, error = %e, "a recipe step's snapshot not removed; gc will");
        }
        made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_chain_the_runs_and_fold_in_what_came_between() {
        let plan = |text: &str| {
            RecipePlan::new(
                paddock_types::recipe::parse_recipe(text, &BTreeMap::new()).expect("parses"),
                None,
            )
            .expect("plans")
        };
        let a = plan("FROM img:1\nRUN echo a\nENV X=1\nRUN echo b\nCMD [\"sh\"]\n");
        assert_eq!(a.keys.len(), 3);
        assert_eq!(a.runs, [0, 2]);
        // Same prefix: same keys; a changed ENV before the second RUN changes only its key.
        let b = plan("FROM img:1\nRUN echo a\nENV X=2\nRUN echo b\n");
        assert_eq!(a.keys[..2], b.keys[..2]);
        assert_ne!(a.keys[2], b.keys[2]);
        // Another base changes everything.
        let c = plan("FROM img:2\nRUN echo a\nENV X=1\nRUN echo b\n");
        assert!(a.keys.iter().zip(&c.keys).all(|(x, y)| x != y));
        // Keys name subvolumes: 64 hex digits.
        assert!(a
            .keys
            .iter()
            .all(|k| k.len() == 64 && k.bytes().all(|b| b.is_ascii_hexdigit())));
        let copy =
            paddock_types::recipe::parse_recipe("FROM img\nCOPY a /a\n", &BTreeMap::new()).expect("parses");
        assert_eq!(
            RecipePlan::new(copy, None).err().map(|e| e.code),
            Some(ErrorCode::Unsupported)
        );
    }

    #[test]
    fn defaults_follow_the_instructions() {
        let recipe = paddock_types::recipe::parse_recipe(
            "FROM img\nENV A=1 B=2\nENV A=3\nWORKDIR /srv\nUSER app\nEXPOSE 80\nCMD [\"serve\"]\nENTRYPOINT [\"/bin/app\"]\n",
            &BTreeMap::new(),
        )
        .expect("parses");
        let mut applier = ConfigApplier::new(
            ImageConfig {
                env: vec!["PATH=/bin".into(), "A=0".into()],
                cmd: Some(vec!["old".into()]),
                ..ImageConfig::default()
            },
            false,
        );
        for step in &recipe.steps {
            applier.apply(&step.instruction);
        }
        let config = applier.into_config();
        assert_eq!(config.env, ["PATH=/bin", "A=3", "B=2"], "replaced in place");
        assert_eq!(config.working_dir.as_deref(), Some("/srv"));
        assert_eq!(config.user.as_deref(), Some("app"));
        assert_eq!(config.exposed_ports, ["80/tcp"]);
        assert_eq!(config.entrypoint, Some(vec!["/bin/app".to_owned()]));
        assert_eq!(
            config.cmd,
            Some(vec!["serve".to_owned()]),
            "an ENTRYPOINT keeps the recipe's own CMD"
        );
        assert_eq!(
            config,
            recipe.image_config(&ImageConfig {
                env: vec!["PATH=/bin".into(), "A=0".into()],
                cmd: Some(vec!["old".into()]),
                ..ImageConfig::default()
            }),
            "as the parser's own reading of the recipe"
        );
    }
}

//! Reclaiming what crashed runs left behind.
//!
//! A sandbox is alive while some process holds the lock on `<state>/run/<id>/lock`. Anything of a
//! sandbox whose lock is free (its run directory, cgroups, subvolume) is garbage; so are cgroups and
//! subvolumes with no run directory at all (a crash between creation steps), the staging subvolume of
//! an import whose process died (`transfer/staging.rs`), the pool's trash (subvolumes whose deletion
//! a crash interrupted), the last teardown steps of a destroyed sandbox that a crash interrupted
//! (`run/.gone-<id>-<n>`, `deferred.rs`), a run directory's staging (`run/.new-<name>`) whose creator died (after a
//! minute's grace), and the parent cgroups paddock made that hold no sandbox any more
//! (`cgroup/parents.rs`; `paddock pool destroy` runs gc first, so it removes them too). A sandbox
//! prepared for a rollback (`<id>.next`) is a sandbox like any other here: its own run directory,
//! lock, cgroups and subvolume. A sandbox made ahead (`ready.rs`) has no lock held either: gc keeps
//! it while its record matches this host and its init lives, and reclaims it otherwise.
//!
//! Garbage collection never fails because of one item: whatever a sandbox left (nested subvolumes
//! included, which the pool deletes too), an item that cannot be reclaimed is logged and skipped,
//! and the next gc tries again. `paddock serve` runs it at start, so a start never depends on it.

use std::fs;
use std::time::Duration;

use super::lock::StateLock;
use super::NativeBackend;
use crate::RuntimeError;

/// How old a half-created run directory must be before gc removes it.
const STAGING_GRACE: Duration = Duration::from_secs(60);

impl NativeBackend {
    /// Reclaims every abandoned sandbox; returns the ids of those reclaimed. One that cannot be
    /// reclaimed (completely) is logged and left for the next gc, never an error of the whole. Last,
    /// removes the parent cgroups it made that hold none any more.
    pub fn collect_garbage_now(&self) -> Result<Vec<String>, RuntimeError> {
        let reclaimed = self.collect_garbage_keeping_parents()?;
        // Last, once every abandoned sandbox's cgroups are gone: the parents made here that hold
        // none any more.
        self.cgroups.remove_created_parents();
        Ok(reclaimed)
    }

    /// [`Self::collect_garbage_now`] for a caller about to create a sandbox (`paddock run`): the
    /// empty parent cgroups stay, since the creation would make them again at once (five `rmdir`s
    /// and five `mkdir`s, 0.5-1 ms of every run otherwise).
    pub fn collect_garbage_keeping_parents(&self) -> Result<Vec<String>, RuntimeError> {
        self.pool.empty_trash();
        let run = self.config.state_dir.join("run");
        let mut reclaimed = Vec::new();
        let mut alive = Vec::new();
        // What ready sandboxes (`ready.rs`) must have been made with to be kept (none when it cannot
        // be described).
        let made_with = std::cell::OnceCell::new();
        if let Ok(rd) = fs::read_dir(&run) {
            for entry in rd.flatten() {
                let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                if id.starts_with(super::deferred::GONE_PREFIX) {
                    // A destroyed sandbox's last steps (`deferred.rs`); only a crash leaves one
                    // whose lock is free.
                    if let Ok(Some(_lock)) = StateLock::try_acquire(&entry.path().join("lock")) {
                        if let Err(e) = self.finish_gone(&entry.path()) {
                            tracing::warn!(run_dir = %entry.path().display(), error = %e, "cannot finish a teardown; gc will retry");
                        }
                    }
                    continue;
                }
                if id.starts_with(".new-") {
                    // A run directory being created; only a crash leaves one behind for long.
                    let stale = entry
                        .metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > STAGING_GRACE);
                    if stale
                        && StateLock::try_acquire(&entry.path().join("lock"))
                            .ok()
                            .flatten()
                            .is_some()
                    {
                        let _ = fs::remove_dir_all(entry.path());
                    }
                    continue;
                }
                match StateLock::try_acquire(&entry.path().join("lock")) {
                    Ok(Some(_lock)) => {
                        if self.ready_to_keep(&id, made_with.get_or_init(|| self.made_with().ok()).as_ref()) {
                            alive.push(id);
                            continue;
                        }
                        tracing::info!(sandbox_id = %id, "reclaiming abandoned sandbox");
                        if self.reclaim_logged(&id) {
                            reclaimed.push(id);
                        } else {
                            // Its leftovers are not an orphan's: do not try them twice.
                            alive.push(id);
                        }
                    }
                    Ok(None) => alive.push(id),
                    Err(e) => {
                        // The run dir may vanish under us when its owner finishes teardown.
                        if entry.path().exists() {
                            tracing::warn!(sandbox_id = %id, error = %e, "cannot check a sandbox's lock; gc will retry");
                            alive.push(id);
                        }
                    }
                }
            }
        }
        // Imports and template builds interrupted by a crash: their staging subvolumes (not
        // sandboxes: not returned).
        super::staging::collect_abandoned(self.pool.root(), super::staging::Area::Imports);
        super::staging::collect_abandoned(self.pool.root(), super::staging::Area::Builds);
        self.pool.collect_spares();
        // Cached layers no template or running build names (a build that died after caching).
        super::template::collect_unused_layers(self.pool.root());
        let mut orphans: Vec<String> = self.cgroups.list_ids();
        orphans.extend(self.pool.list_volumes());
        orphans.sort();
        orphans.dedup();
        for id in orphans {
            if alive.contains(&id) || reclaimed.contains(&id) || run.join(&id).exists() {
                continue;
            }
            tracing::info!(sandbox_id = %id, "reclaiming orphaned cgroup or subvolume");
            if self.reclaim_logged(&id) {
                reclaimed.push(id);
            }
        }
        Ok(reclaimed)
    }

    /// [`Self::reclaim`], logging a failure instead of returning it; whether it succeeded.
    fn reclaim_logged(&self, id: &str) -> bool {
        match self.reclaim(id) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(sandbox_id = %id, error = %e, "cannot reclaim all of a sandbox; gc will retry");
                false
            }
        }
    }
}

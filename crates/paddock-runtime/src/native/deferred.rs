//! Teardown work taken off the caller's path: the part of a destroy that only waits on the kernel.
//!
//! Removing a networked sandbox's link (its firewall table, its veth pair, its namespace's pin)
//! costs about 35 ms of kernel RCU grace periods, nearly all of it waiting. Once the sandbox's
//! processes are dead, its cgroups removed and its volume deleted, nothing of the sandbox runs or
//! holds data any more: what is left is kernel objects with no process behind them. That rest runs
//! on a background thread, which holds the sandbox's lock until it is done, so:
//! - a crash in between leaves a run directory whose lock is free, which gc reclaims (link included,
//!   from the record) like any other abandoned sandbox;
//! - the run directory is first renamed out of the sandbox's name (`run/.gone-<id>-<n>`), so the
//!   same id can be created again at once (a resume after a stop);
//! - the link's slot stays taken until its interface is gone, so no new sandbox can get it early.
//!
//! Bounded: at most [`MAX_IN_FLIGHT`] such threads per backend; beyond that the caller does the work
//! itself (back-pressure instead of a queue that could grow without bound).
//!
//! Only a networked sandbox's link is deferred, and only in a backend whose sandboxes outlive their
//! creator (`paddock serve`): a `paddock run` process exits right after its teardown, so it does all
//! of it itself. What this module does not do: anything that must be finished when a destroy
//! returns (killing processes, cgroups, the volume: `lifecycle.rs`, before it is called).

use std::fs;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::lifecycle::{error_chain, teardown_result};
use super::network::{netns_pin, remove_link};
use super::pool::now_nanos;
use super::sandbox::{BootSpec, NativeSandbox};
use super::NativeBackend;
use crate::RuntimeError;

/// The most background teardowns one backend runs at once.
pub(super) const MAX_IN_FLIGHT: usize = 16;

/// Prefix of a run directory whose sandbox is gone and whose last teardown steps are running (or,
/// after a crash, left for gc).
pub(super) const GONE_PREFIX: &str = ".gone-";

impl NativeBackend {
    /// The end of a destroy or stop, once the init is dead: what [`Self::cleanup`] does, except that
    /// a networked sandbox's link and run directory go on a background thread (see the module docs).
    pub(super) fn finish_teardown(&self, id: &str, sb: NativeSandbox) -> Result<(), RuntimeError> {
        let network = BootSpec::read(&sb.run_dir).and_then(|b| b.network);
        let mut errors = self.remove_cgroups_and_volume(id, &sb.cgroup);
        let (network, tools) = match (network, &self.network_tools) {
            (Some(network), Ok(tools)) if !self.config.die_with_parent => (network, tools.clone()),
            (network, _) => {
                errors.extend(self.remove_link_and_run_dir(&sb.run_dir, network.as_ref()));
                return teardown_result(errors);
            }
        };
        let NativeSandbox { run_dir, _lock, .. } = sb;
        let gone = run_dir.with_file_name(format!("{GONE_PREFIX}{id}-{}", now_nanos()));
        if let Err(e) = fs::rename(&run_dir, &gone) {
            tracing::debug!(error = %e, "cannot move the run directory aside; removing the link in place");
            errors.extend(self.remove_link_and_run_dir(&run_dir, Some(&network)));
            return teardown_result(errors);
        }
        let id = id.to_owned();
        let job = move || {
            // Held until the last step: gc leaves this run directory alone while it is ours.
            let _lock = _lock;
            crate::fault::point("teardown.deferred");
            let t = Instant::now();
            if let Err(e) = remove_link(&tools, Some(&network.made), &netns_pin(&gone)) {
                tracing::warn!(sandbox_id = %id, error = %e, detail = error_chain(&e), "cannot remove a link; gc will");
                return;
            }
            if let Err(e) = fs::remove_dir_all(&gone) {
                tracing::warn!(sandbox_id = %id, error = %e, "cannot remove a run directory; gc will");
            }
            tracing::debug!(sandbox_id = %id, step = "remove link (background)", us = t.elapsed().as_micros() as u64);
        };
        if let Err(job) = self.deferred.spawn(job) {
            job();
        }
        teardown_result(errors)
    }

    /// Finishes the teardown of a sandbox whose background steps a crash interrupted (gc): its run
    /// directory `run_dir` (`.gone-...`, whose lock the caller holds) and the link it records.
    pub(super) fn finish_gone(&self, run_dir: &Path) -> Result<(), RuntimeError> {
        let network = BootSpec::read(run_dir).and_then(|b| b.network);
        teardown_result(self.remove_link_and_run_dir(run_dir, network.as_ref()))
    }
}

/// Background teardowns in flight.
#[derive(Debug, Clone, Default)]
pub(super) struct Deferred(Arc<(Mutex<usize>, Condvar)>);

impl Deferred {
    /// Runs `job` on a thread of its own, or gives it back when [`MAX_IN_FLIGHT`] are running (or no
    /// thread can be started): the caller then runs it.
    pub(super) fn spawn<F>(&self, job: F) -> Result<(), F>
    where
        F: FnOnce() + Send + 'static,
    {
        {
            let mut n = lock(&self.0 .0);
            if *n >= MAX_IN_FLIGHT {
                return Err(job);
            }
            *n += 1;
        }
        // The job travels through a slot so that it can be given back if the thread does not start.
        let slot = Arc::new(Mutex::new(Some(job)));
        let (taken, state) = (slot.clone(), self.0.clone());
        let spawned = std::thread::Builder::new()
            .name("teardown".into())
            .spawn(move || {
                if let Some(job) = lock(&taken).take() {
                    job();
                }
                let (count, done) = &*state;
                *lock(count) -= 1;
                done.notify_all();
            });
        match spawned {
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start a teardown thread; tearing down in place");
                *lock(&self.0 .0) -= 1;
                let job = lock(&slot)
                    .take()
                    .expect("the thread never started: the job is still here");
                Err(job)
            }
        }
    }

    /// Waits until no background teardown is running, at most `timeout`; returns whether none is.
    pub(super) fn settle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let (count, done) = &*self.0;
        let mut n = lock(count);
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            n = done.wait_timeout(n, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        true
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn jobs_run_in_the_background_and_settle_waits_for_them() {
        let deferred = Deferred::default();
        let (release, gate) = mpsc::channel::<()>();
        let (report, ran) = mpsc::channel();
        let gate = Arc::new(Mutex::new(gate));
        for i in 0..3 {
            let (gate, report) = (gate.clone(), report.clone());
            assert!(deferred
                .spawn(move || {
                    let _ = lock(&gate).recv();
                    let _ = report.send(i);
                })
                .is_ok());
        }
        // Held by the gate: nothing has finished, and settling gives up at its timeout.
        assert!(!deferred.settle(Duration::from_millis(1)));
        for _ in 0..3 {
            release.send(()).expect("a job waits");
        }
        assert!(deferred.settle(Duration::from_secs(60)));
        let mut done: Vec<i32> = ran.try_iter().collect();
        done.sort_unstable();
        assert_eq!(done, vec![0, 1, 2]);
    }

    #[test]
    fn beyond_the_bound_the_job_comes_back_to_the_caller() {
        let deferred = Deferred::default();
        let (release, gate) = mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate));
        for _ in 0..MAX_IN_FLIGHT {
            let gate = gate.clone();
            assert!(deferred
                .spawn(move || {
                    let _ = lock(&gate).recv();
                })
                .is_ok());
        }
        let returned = deferred.spawn(|| {});
        assert!(
            returned.is_err(),
            "a job past the bound must be the caller's to run"
        );
        for _ in 0..MAX_IN_FLIGHT {
            release.send(()).expect("a job waits");
        }
        assert!(deferred.settle(Duration::from_secs(60)));
        assert!(deferred.spawn(|| {}).is_ok(), "room again once they finished");
        assert!(deferred.settle(Duration::from_secs(60)));
    }
}

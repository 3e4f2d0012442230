//! When requests last reached a sandbox, so background work (warm-pool refills) can wait for a
//! quiet moment instead of competing with a caller's next request for the host's CPUs.
//!
//! A claim from a warm pool wakes the pool's filler at once, and a refill boots a sandbox (a
//! few milliseconds of CPU across the server, the new sandbox's init and its agent). On a small
//! host that boot ran beside the claimer's first command and added 1.5 ms to it (measured with
//! `bench/templates.py`). [`refill_wait`] decides how long a due refill waits.
//!
//! What it does not do: schedule anything, or count requests that touch no sandbox (listing,
//! metrics); callers record activity where sandbox requests begin.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A refill waits for this long without a sandbox request beginning...
pub(crate) const REFILL_QUIET: Duration = Duration::from_millis(20);
/// ...but never longer than this after it became due, so a busy server's pools still refill.
pub(crate) const REFILL_MAX_DEFER: Duration = Duration::from_millis(250);

/// The time the latest sandbox request began, as nanoseconds since the service's start.
#[derive(Debug)]
pub(crate) struct Activity {
    start: Instant,
    /// 0 until the first request.
    last_ns: AtomicU64,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ns: AtomicU64::new(0),
        }
    }

    /// Records that a sandbox request begins now.
    pub(crate) fn touch(&self) {
        let ns = u64::try_from(self.start.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        self.last_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// How long ago the latest request began (`None`: none yet).
    pub(crate) fn since_last(&self) -> Option<Duration> {
        match self.last_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(self.start.elapsed().saturating_sub(Duration::from_nanos(ns))),
        }
    }
}

/// How much longer a refill that became due `due_for` ago waits, given how long ago the latest
/// sandbox request began (`None`: none yet) and how many sandboxes the pool holds. Zero means now.
///
/// An empty pool refills at once (the next create would boot cold anyway); otherwise the refill
/// waits until [`REFILL_QUIET`] has passed since the latest request, at most until it has been due
/// for [`REFILL_MAX_DEFER`].
pub(crate) fn refill_wait(due_for: Duration, since_request: Option<Duration>, pooled: usize) -> Duration {
    if pooled == 0 {
        return Duration::ZERO;
    }
    let Some(since) = since_request else {
        return Duration::ZERO;
    };
    let quiet_in = REFILL_QUIET.saturating_sub(since);
    let deadline_in = REFILL_MAX_DEFER.saturating_sub(due_for);
    quiet_in.min(deadline_in)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_for_a_quiet_moment() {
        assert_eq!(refill_wait(Duration::ZERO, Some(MS), 3), REFILL_QUIET - MS);
        assert_eq!(refill_wait(10 * MS, Some(5 * MS), 3), REFILL_QUIET - 5 * MS);
        assert_eq!(refill_wait(10 * MS, Some(REFILL_QUIET), 3), Duration::ZERO);
        assert_eq!(refill_wait(10 * MS, Some(REFILL_QUIET * 3), 3), Duration::ZERO);
    }

    #[test]
    fn never_waits_past_the_deadline_or_with_an_empty_pool_or_an_idle_server() {
        assert_eq!(refill_wait(REFILL_MAX_DEFER - MS, Some(Duration::ZERO), 3), MS);
        assert_eq!(
            refill_wait(REFILL_MAX_DEFER, Some(Duration::ZERO), 3),
            Duration::ZERO
        );
        assert_eq!(
            refill_wait(Duration::ZERO, Some(Duration::ZERO), 0),
            Duration::ZERO
        );
        assert_eq!(refill_wait(Duration::ZERO, None, 5), Duration::ZERO);
    }

    #[test]
    fn activity_reports_the_latest_request() {
        let activity = Activity::new();
        assert_eq!(activity.since_last(), None);
        activity.touch();
        let since = activity.since_last().expect("touched");
        assert!(since < Duration::from_secs(60), "{since:?}");
    }

    proptest! {
        /// The wait never exceeds what is left of either bound, and is zero once the refill has
        /// been due for the maximum or the server has been quiet long enough.
        #[test]
        fn bounded(due_ms in 0u64..1000, since_ms in proptest::option::of(0u64..1000), pooled in 0usize..4) {
            let (due, since) = (Duration::from_millis(due_ms), since_ms.map(Duration::from_millis));
            let wait = refill_wait(due, since, pooled);
            prop_assert!(wait <= REFILL_MAX_DEFER.saturating_sub(due));
            prop_assert!(wait <= REFILL_QUIET);
            if pooled == 0 || since.is_none_or(|s| s >= REFILL_QUIET) || due >= REFILL_MAX_DEFER {
                prop_assert_eq!(wait, Duration::ZERO);
            } else {
                prop_assert!(wait > Duration::ZERO);
            }
        }
    }
}

//! What one sandbox (and all of them together) can make the egress proxy hold: connections per door
//! and per sandbox, descriptors across sandboxes, DNS questions and name resolutions in flight, and
//! how long a connection may stay idle or open. A connection over a cap is accepted and reset at
//! once (the sandbox fails fast; its own listeners keep serving it, and no other sandbox's listener
//! waits); a DNS question over a cap is dropped (UDP) or answered SERVFAIL (resolution). Each refusal
//! is counted, and reported as one [`RefusalRecord`] per sandbox, cap and window rather than one
//! record per refused connection, so a flood cannot flood the audit log.
//!
//! What this module does not do: bound what the kernel keeps for a sandbox (conntrack entries and
//! the rate of new connections are capped by the link's nftables table, which the runtime renders).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use paddock_types::SandboxId;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::audit::{AuditRecord, AuditSink, Door};

/// The egress proxy's bounds. Per-sandbox caps apply to each sandbox separately; `descriptors`
/// and `resolutions` to all sandboxes together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressLimits {
    /// Concurrent connections of one sandbox through its explicit proxy (`HTTP(S)_PROXY`).
    pub proxy_connections: usize,
    /// Concurrent connections of one sandbox through its transparent door.
    pub transparent_connections: usize,
    /// Concurrent DNS-over-TCP connections of one sandbox.
    pub dns_tcp_connections: usize,
    /// Descriptors all sandboxes' connections may hold together (a proxied connection holds two:
    /// the sandbox's socket and the upstream one; a DNS-over-TCP connection one). `None`: half of
    /// the process's `RLIMIT_NOFILE` soft limit when the proxy starts, leaving the other half to the
    /// rest of the server (its API listener, database, sandboxes' agent connections).
    pub descriptors: Option<usize>,
    /// A proxied connection that moves no byte either way for this long is closed.
    pub idle_timeout: Duration,
    /// A proxied connection is closed after this long, busy or not.
    pub max_lifetime: Duration,
    /// DNS over TCP: how long a connection may wait for (and take to send) its next question.
    pub dns_tcp_idle: Duration,
    /// DNS over TCP: how long a connection may stay open.
    pub dns_tcp_lifetime: Duration,
    /// DNS over TCP: questions answered per connection before it is closed.
    pub dns_tcp_questions: u32,
    /// DNS over UDP: questions of one sandbox being answered at once (more are dropped; the
    /// client retries).
    pub dns_in_flight: usize,
    /// Name resolutions (system resolver lookups, each a blocking thread) of one sandbox at once.
    pub resolutions_per_sandbox: usize,
    /// Name resolutions of all sandboxes at once.
    pub resolutions: usize,
    /// Refusals at one cap are reported at most about twice per window per sandbox.
    pub refusal_window: Duration,
}

impl Default for EgressLimits {
    fn default() -> Self {
        Self {
            proxy_connections: 256,
            transparent_connections: 256,
            dns_tcp_connections: 16,
            descriptors: None,
            idle_timeout: Duration::from_secs(300),
            max_lifetime: Duration::from_secs(3600),
            dns_tcp_idle: Duration::from_secs(5),
            dns_tcp_lifetime: Duration::from_secs(30),
            dns_tcp_questions: 100,
            dns_in_flight: 64,
            resolutions_per_sandbox: 8,
            resolutions: 64,
            refusal_window: Duration::from_secs(10),
        }
    }
}

/// The most descriptors the proxy takes when the limit is derived from `RLIMIT_NOFILE`.
const DESCRIPTOR_CEILING: usize = 1 << 18;

/// The descriptor budget for sandbox connections: half the soft `RLIMIT_NOFILE` (`None`:
/// unlimited), at most [`DESCRIPTOR_CEILING`], at least 2 (one proxied connection).
pub fn descriptor_budget(soft_nofile: Option<u64>) -> usize {
    let half = soft_nofile.map_or(DESCRIPTOR_CEILING, |s| {
        usize::try_from(s / 2).unwrap_or(DESCRIPTOR_CEILING)
    });
    half.clamp(2, DESCRIPTOR_CEILING)
}

/// The process's soft `RLIMIT_NOFILE` now (`None`: unlimited). Read, never changed here.
pub(crate) fn soft_nofile() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Which cap refused something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// [`EgressLimits::proxy_connections`].
    ProxyConnections,
    /// [`EgressLimits::transparent_connections`].
    TransparentConnections,
    /// [`EgressLimits::dns_tcp_connections`].
    DnsTcpConnections,
    /// [`EgressLimits::descriptors`] (all sandboxes together).
    Descriptors,
    /// [`EgressLimits::dns_in_flight`].
    DnsInFlight,
    /// [`EgressLimits::resolutions_per_sandbox`] or [`EgressLimits::resolutions`]: no resolution
    /// could start before the lookup timeout.
    Resolutions,
    /// [`EgressLimits::dns_tcp_questions`] or an oversized DNS-over-TCP message: the connection was
    /// closed.
    DnsTcpMessages,
}

impl Limit {
    /// The label used for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ProxyConnections => "proxy_connections",
            Self::TransparentConnections => "transparent_connections",
            Self::DnsTcpConnections => "dns_tcp_connections",
            Self::Descriptors => "descriptors",
            Self::DnsInFlight => "dns_in_flight",
            Self::Resolutions => "resolutions",
            Self::DnsTcpMessages => "dns_tcp_messages",
        }
    }
}

/// Refusals of one sandbox at one cap, summed over a window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefusalRecord {
    /// The sandbox.
    pub sandbox: SandboxId,
    /// The cap.
    pub limit: Limit,
    /// How many were refused between `since` and `until`.
    pub count: u64,
    /// The first refusal counted here.
    pub since: SystemTime,
    /// When the record was made.
    pub until: SystemTime,
}

/// Where a connection enters, for its caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A proxied connection through a door.
    Door(Door),
    /// DNS over TCP.
    DnsTcp,
}

impl Entry {
    fn limit(self) -> Limit {
        match self {
            Self::Door(Door::Proxy) => Limit::ProxyConnections,
            Self::Door(Door::Transparent) => Limit::TransparentConnections,
            Self::DnsTcp => Limit::DnsTcpConnections,
        }
    }
    /// Descriptors a connection of this kind holds.
    fn descriptors(self) -> u32 {
        match self {
            Self::Door(_) => 2,
            Self::DnsTcp => 1,
        }
    }
}

/// A connection's places under its caps, given back when it is dropped.
#[derive(Debug)]
pub(crate) struct Admission {
    _sandbox: OwnedSemaphorePermit,
    _server: OwnedSemaphorePermit,
}

/// One sandbox's caps and its pending refusal counts.
#[derive(Debug)]
pub(crate) struct SandboxLimits {
    proxy: Arc<Semaphore>,
    transparent: Arc<Semaphore>,
    dns_tcp: Arc<Semaphore>,
    pub(crate) dns_in_flight: Arc<Semaphore>,
    pub(crate) resolutions: Arc<Semaphore>,
    refusals: Mutex<BTreeMap<Limit, Pending>>,
}

#[derive(Debug)]
struct Pending {
    count: u64,
    since: SystemTime,
    /// When a record for this cap was last made.
    reported: Option<Instant>,
}

impl SandboxLimits {
    pub(crate) fn new(limits: &EgressLimits) -> Self {
        let sem = |n: usize| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS)));
        Self {
            proxy: sem(limits.proxy_connections),
            transparent: sem(limits.transparent_connections),
            dns_tcp: sem(limits.dns_tcp_connections),
            dns_in_flight: sem(limits.dns_in_flight),
            resolutions: sem(limits.resolutions_per_sandbox),
            refusals: Mutex::new(BTreeMap::new()),
        }
    }

    /// A place for a new connection, or the cap that is full. Never waits.
    pub(crate) fn admit(&self, descriptors: &Arc<Semaphore>, entry: Entry) -> Result<Admission, Limit> {
        let door = match entry {
            Entry::Door(Door::Proxy) => &self.proxy,
            Entry::Door(Door::Transparent) => &self.transparent,
            Entry::DnsTcp => &self.dns_tcp,
        };
        let sandbox = door.clone().try_acquire_owned().map_err(|_| entry.limit())?;
        let server = descriptors
            .clone()
            .try_acquire_many_owned(entry.descriptors())
            .map_err(|_| Limit::Descriptors)?;
        Ok(Admission {
            _sandbox: sandbox,
            _server: server,
        })
    }

    /// Counts a refusal at `limit`; reports at once when nothing was reported for it within
    /// `window`, else leaves it to [`SandboxLimits::flush`].
    pub(crate) fn refused(&self, sandbox: &SandboxId, limit: Limit, window: Duration, audit: &dyn AuditSink) {
        let now = Instant::now();
        let record = {
            let mut all = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
            let p = all.entry(limit).or_insert(Pending {
                count: 0,
                since: SystemTime::now(),
                reported: None,
            });
            if p.count == 0 {
                p.since = SystemTime::now();
            }
            p.count += 1;
            let due = p.reported.is_none_or(|at| now.duration_since(at) >= window);
            due.then(|| take(sandbox, limit, p, now))
        };
        if let Some(r) = record {
            tracing::debug!(sandbox_id = %sandbox, limit = limit.as_str(), count = r.count, "egress refusals at a cap");
            audit.record(AuditRecord::Refused(r));
        }
    }

    /// Reports every pending count (a window ended, or the sandbox is going).
    pub(crate) fn flush(&self, sandbox: &SandboxId, audit: &dyn AuditSink) {
        let now = Instant::now();
        let records: Vec<RefusalRecord> = {
            let mut all = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
            all.iter_mut()
                .filter(|(_, p)| p.count > 0)
                .map(|(limit, p)| take(sandbox, *limit, p, now))
                .collect()
        };
        for r in records {
            audit.record(AuditRecord::Refused(r));
        }
    }
}

fn take(sandbox: &SandboxId, limit: Limit, p: &mut Pending, now: Instant) -> RefusalRecord {
    let r = RefusalRecord {
        sandbox: sandbox.clone(),
        limit,
        count: p.count,
        since: p.since,
        until: SystemTime::now(),
    };
    p.count = 0;
    p.reported = Some(now);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default)]
    struct Sink(Mutex<Vec<AuditRecord>>);
    impl AuditSink for Sink {
        fn record(&self, r: AuditRecord) {
            self.0.lock().expect("sink").push(r);
        }
    }
    impl Sink {
        fn counts(&self) -> Vec<(Limit, u64)> {
            std::mem::take(&mut *self.0.lock().expect("sink"))
                .into_iter()
                .map(|r| match r {
                    AuditRecord::Refused(r) => (r.limit, r.count),
                    other => panic!("{other:?}"),
                })
                .collect()
        }
    }

    #[test]
    fn the_budget_is_half_the_descriptor_limit_within_bounds() {
        assert_eq!(descriptor_budget(Some(1024)), 512);
        assert_eq!(descriptor_budget(Some(20_000)), 10_000);
        assert_eq!(descriptor_budget(Some(3)), 2);
        assert_eq!(descriptor_budget(Some(u64::MAX)), DESCRIPTOR_CEILING);
        assert_eq!(descriptor_budget(None), DESCRIPTOR_CEILING);
    }

    #[test]
    fn each_door_has_its_cap_and_all_share_the_descriptors() {
        let limits = EgressLimits {
            proxy_connections: 2,
            transparent_connections: 1,
            dns_tcp_connections: 1,
            ..EgressLimits::default()
        };
        let descriptors = Arc::new(Semaphore::new(6));
        let a = SandboxLimits::new(&limits);
        let b = SandboxLimits::new(&limits);
        let p1 = a.admit(&descriptors, Entry::Door(Door::Proxy)).expect("first");
        let _p2 = a.admit(&descriptors, Entry::Door(Door::Proxy)).expect("second");
        assert_eq!(
            a.admit(&descriptors, Entry::Door(Door::Proxy)).err(),
            Some(Limit::ProxyConnections)
        );
        // Another door of the same sandbox, and another sandbox, are not held up by that cap.
        let _t = a
            .admit(&descriptors, Entry::Door(Door::Transparent))
            .expect("transparent");
        // 6 descriptors: three proxied connections hold them all; DNS/TCP needs one more.
        assert_eq!(
            b.admit(&descriptors, Entry::DnsTcp).err(),
            Some(Limit::Descriptors)
        );
        drop(p1);
        let _d = b.admit(&descriptors, Entry::DnsTcp).expect("a freed place");
        assert_eq!(descriptors.available_permits(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_refusals_makes_a_few_records_with_counts() {
        let sink = Sink::default();
        let id: SandboxId = "sb-1".parse().expect("id");
        let window = Duration::from_secs(10);
        let l = SandboxLimits::new(&EgressLimits::default());
        // The first refusal is reported at once; the next 999 within the window wait for a flush.
        for _ in 0..1000 {
            l.refused(&id, Limit::DnsTcpConnections, window, &sink);
        }
        l.refused(&id, Limit::Descriptors, window, &sink);
        assert_eq!(
            sink.counts(),
            vec![(Limit::DnsTcpConnections, 1), (Limit::Descriptors, 1)]
        );
        l.flush(&id, &sink);
        assert_eq!(sink.counts(), vec![(Limit::DnsTcpConnections, 999)]);
        l.flush(&id, &sink);
        assert_eq!(sink.counts(), vec![]);
        // After a quiet window, a refusal is reported at once again.
        tokio::time::advance(window).await;
        l.refused(&id, Limit::DnsTcpConnections, window, &sink);
        assert_eq!(sink.counts(), vec![(Limit::DnsTcpConnections, 1)]);
    }
}

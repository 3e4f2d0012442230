//! The pure part of the network audit: egress events in, audit rows out, with a clock passed in.
//!
//! - The first event of a key (sandbox, kind, decision, and the rest of what decided: name, address,
//!   port, rule, door, query type, secrets) is a row of its own, in full, with `count: 1`.
//! - Repeats of that key within `window` of that first row fold into one more row when the window
//!   ends: `count` (the repeats), first and last time, bytes summed, the last repeat's detail.
//! - Every row of a sandbox takes a token from the sandbox's bucket and from its tenant's; without
//!   one, the row's events are counted instead, and the counts become one `network.suppressed` row
//!   per sandbox per window (which takes no token), together with the events the writer's queue
//!   dropped.
//!
//! Nothing is lost silently: the events a sandbox's rows account for (`count` of event rows,
//! `events` of suppressed rows) add up to the events observed and dropped (a property test says so).
//! Memory is bounded too: a key is only remembered after its first row took a token.
//!
//! It does not: read a clock, write anything, or know what an egress record is beyond the
//! [`NetEvent`] the writer makes of it.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Value};

use crate::core::audit::{self, AuditAction, Detail};

/// The rates and window, from the service's configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AggregateLimits {
    /// Repeats of a key within this many milliseconds of its row fold into one more row.
    pub(crate) window_ms: i64,
    /// Rows per second one sandbox may add, sustained.
    pub(crate) sandbox_rate: f64,
    /// Rows one sandbox may add at once.
    pub(crate) sandbox_burst: f64,
    /// Rows per second one tenant's sandboxes may add together, sustained.
    pub(crate) tenant_rate: f64,
    /// Rows one tenant's sandboxes may add at once.
    pub(crate) tenant_burst: f64,
}

/// What an egress record is, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum EventKind {
    Connection,
    Dns,
    /// Refusals at an egress cap, already counted over a window by the proxy (one record for many).
    Refused,
}

impl EventKind {
    pub(crate) fn action(self) -> AuditAction {
        match self {
            Self::Connection => AuditAction::NetworkConnection,
            Self::Dns => AuditAction::NetworkDns,
            Self::Refused => AuditAction::NetworkRefused,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Dns => "dns",
            Self::Refused => "refused",
        }
    }
}

/// One egress event as the aggregator sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NetEvent {
    pub(crate) sandbox: String,
    pub(crate) tenant: Option<String>,
    pub(crate) kind: EventKind,
    pub(crate) allowed: bool,
    /// Everything else that decided, canonical text (events with equal keys are repeats).
    pub(crate) key: String,
    /// The record as stored in a row's detail.
    pub(crate) detail: Value,
    pub(crate) bytes_up: u64,
    pub(crate) bytes_down: u64,
    pub(crate) at_ms: i64,
}

/// A row to append.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NetRow {
    pub(crate) ts_ms: i64,
    pub(crate) sandbox: String,
    pub(crate) tenant: Option<String>,
    pub(crate) action: AuditAction,
    pub(crate) outcome: &'static str,
    pub(crate) detail: Value,
    /// The events this row accounts for.
    pub(crate) events: u64,
    pub(crate) what: RowKind,
}

/// What made a row (for the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowKind {
    First,
    Aggregate,
    Suppressed,
}

/// (kind, allowed) → events.
type Counts = BTreeMap<(EventKind, bool), u64>;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EventKey {
    sandbox: String,
    kind: EventKind,
    allowed: bool,
    key: String,
}

#[derive(Debug)]
struct KeyState {
    tenant: Option<String>,
    window_start_ms: i64,
    /// Repeats folded since the first row, and when the first and last of them came.
    count: u64,
    first_ms: i64,
    last_ms: i64,
    bytes_up: u64,
    bytes_down: u64,
    /// The latest repeat's detail.
    detail: Option<Value>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at_ms: i64,
}

impl Bucket {
    fn full(burst: f64, now: i64) -> Self {
        Self {
            tokens: burst,
            at_ms: now,
        }
    }

    fn refill(&mut self, rate: f64, burst: f64, now: i64) {
        let elapsed = (now - self.at_ms).max(0) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.at_ms = self.at_ms.max(now);
    }
}

#[derive(Debug)]
struct SandboxState {
    tenant: Option<String>,
    bucket: Bucket,
    /// Events whose rows had no token.
    rate_limited: Counts,
    /// Events the writer's queue dropped.
    queue_full: Counts,
    /// When the first of those was counted.
    since_ms: Option<i64>,
    last_ms: i64,
}

/// What the aggregator did, for the metrics (taken with [`Aggregator::take_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AggregateStats {
    /// Events folded into another event's row.
    pub(crate) aggregated: u64,
    /// Events only counted on a suppressed row because no token was left.
    pub(crate) rate_limited: u64,
    /// Events the queue dropped (counted on a suppressed row).
    pub(crate) queue_full: u64,
}

/// The aggregator's state.
#[derive(Debug)]
pub(crate) struct Aggregator {
    limits: AggregateLimits,
    keys: HashMap<EventKey, KeyState>,
    sandboxes: HashMap<String, SandboxState>,
    tenants: HashMap<Option<String>, Bucket>,
    stats: AggregateStats,
}

impl Aggregator {
    pub(crate) fn new(limits: AggregateLimits) -> Self {
        Self {
            limits,
            keys: HashMap::new(),
            sandboxes: HashMap::new(),
            tenants: HashMap::new(),
            stats: AggregateStats::default(),
        }
    }

    /// Takes one event; rows due now are appended to `out`.
    pub(crate) fn observe(&mut self, e: NetEvent, out: &mut Vec<NetRow>) {
        let now = e.at_ms;
        let key = EventKey {
            sandbox: e.sandbox.clone(),
            kind: e.kind,
            allowed: e.allowed,
            key: e.key.clone(),
        };
        if let Some(state) = self.keys.get_mut(&key) {
            if now < state.window_start_ms + self.limits.window_ms {
                if state.count == 0 {
                    state.first_ms = now;
                }
                state.count += 1;
                state.last_ms = state.last_ms.max(now);
                state.bytes_up += e.bytes_up;
                state.bytes_down += e.bytes_down;
                state.detail = Some(e.detail);
                return;
            }
            if let Some(state) = self.keys.remove(&key) {
                self.emit_aggregate(&key, state, now, out);
            }
        }
        if self.take_token(&e.sandbox, &e.tenant, now) {
            let mut detail = e.detail;
            merge(&mut detail, &audit::NetworkFirst { count: 1 });
            out.push(NetRow {
                ts_ms: now,
                sandbox: e.sandbox.clone(),
                tenant: e.tenant.clone(),
                action: e.kind.action(),
                outcome: outcome(e.allowed),
                detail,
                events: 1,
                what: RowKind::First,
            });
            self.keys.insert(
                key,
                KeyState {
                    tenant: e.tenant,
                    window_start_ms: now,
                    count: 0,
                    first_ms: now,
                    last_ms: now,
                    bytes_up: 0,
                    bytes_down: 0,
                    detail: None,
                },
            );
        } else {
            self.stats.rate_limited += 1;
            self.count_suppressed(&e.sandbox, &e.tenant, e.kind, e.allowed, 1, now, false);
        }
    }

    /// Events of `sandbox` the writer's queue dropped.
    pub(crate) fn dropped(
        &mut self,
        sandbox: &str,
        tenant: &Option<String>,
        kind: EventKind,
        allowed: bool,
        n: u64,
        now: i64,
    ) {
        if n == 0 {
            return;
        }
        self.stats.queue_full += n;
        self.count_suppressed(sandbox, tenant, kind, allowed, n, now, true);
    }

    /// Rows of windows that ended by `now`; forgets what no longer matters.
    pub(crate) fn flush(&mut self, now: i64, out: &mut Vec<NetRow>) {
        self.flush_where(now, out, |start, window| now >= start + window);
    }

    /// Every row still held, windows ended or not (at shutdown).
    pub(crate) fn drain(&mut self, now: i64, out: &mut Vec<NetRow>) {
        self.flush_where(now, out, |_, _| true);
    }

    pub(crate) fn take_stats(&mut self) -> AggregateStats {
        std::mem::take(&mut self.stats)
    }

    fn flush_where(&mut self, now: i64, out: &mut Vec<NetRow>, due: impl Fn(i64, i64) -> bool) {
        let window = self.limits.window_ms;
        let ended: Vec<EventKey> = self
            .keys
            .iter()
            .filter(|(_, s)| due(s.window_start_ms, window))
            .map(|(k, _)| k.clone())
            .collect();
        for key in ended {
            if let Some(state) = self.keys.remove(&key) {
                self.emit_aggregate(&key, state, now, out);
            }
        }
        let mut sandboxes: Vec<&String> = self
            .sandboxes
            .iter()
            .filter(|(_, s)| s.since_ms.is_some_and(|since| due(since, window)))
            .map(|(id, _)| id)
            .collect();
        sandboxes.sort();
        let due_ids: Vec<String> = sandboxes.into_iter().cloned().collect();
        for id in due_ids {
            if let Some(s) = self.sandboxes.get_mut(&id) {
                out.push(suppressed_row(&id, s, window, now));
                s.rate_limited.clear();
                s.queue_full.clear();
                s.since_ms = None;
            }
        }
        // A bucket that has refilled is the same as a new one: forget it.
        let limits = self.limits;
        self.sandboxes.retain(|_, s| {
            s.bucket.refill(limits.sandbox_rate, limits.sandbox_burst, now);
            s.since_ms.is_some() || s.bucket.tokens < limits.sandbox_burst
        });
        self.tenants.retain(|_, b| {
            b.refill(limits.tenant_rate, limits.tenant_burst, now);
            b.tokens < limits.tenant_burst
        });
    }

    fn emit_aggregate(&mut self, key: &EventKey, state: KeyState, now: i64, out: &mut Vec<NetRow>) {
        if state.count == 0 {
            return;
        }
        if !self.take_token(&key.sandbox, &state.tenant, now) {
            self.stats.rate_limited += state.count;
            self.count_suppressed(
                &key.sandbox,
                &state.tenant,
                key.kind,
                key.allowed,
                state.count,
                now,
                false,
            );
            return;
        }
        self.stats.aggregated += state.count;
        let mut detail = state.detail.unwrap_or_else(|| json!({}));
        let connection = key.kind == EventKind::Connection;
        let aggregate = audit::NetworkAggregate {
            count: state.count,
            aggregated: true,
            first_ms: state.first_ms,
            last_ms: state.last_ms,
            bytes_up: connection.then_some(state.bytes_up),
            bytes_down: connection.then_some(state.bytes_down),
        };
        merge(&mut detail, &aggregate);
        out.push(NetRow {
            ts_ms: now,
            sandbox: key.sandbox.clone(),
            tenant: state.tenant,
            action: key.kind.action(),
            outcome: outcome(key.allowed),
            detail,
            events: state.count,
            what: RowKind::Aggregate,
        });
    }

    /// One token from the sandbox's bucket and one from its tenant's, or none from either.
    fn take_token(&mut self, sandbox: &str, tenant: &Option<String>, now: i64) -> bool {
        let l = self.limits;
        let s = self.sandbox_state(sandbox, tenant, now);
        s.bucket.refill(l.sandbox_rate, l.sandbox_burst, now);
        let sandbox_has = s.bucket.tokens >= 1.0;
        let t = self
            .tenants
            .entry(tenant.clone())
            .or_insert_with(|| Bucket::full(l.tenant_burst, now));
        t.refill(l.tenant_rate, l.tenant_burst, now);
        if !sandbox_has || t.tokens < 1.0 {
            return false;
        }
        t.tokens -= 1.0;
        if let Some(s) = self.sandboxes.get_mut(sandbox) {
            s.bucket.tokens -= 1.0;
        }
        true
    }

    fn sandbox_state(&mut self, sandbox: &str, tenant: &Option<String>, now: i64) -> &mut SandboxState {
        let burst = self.limits.sandbox_burst;
        self.sandboxes
            .entry(sandbox.to_owned())
            .or_insert_with(|| SandboxState {
                tenant: tenant.clone(),
                bucket: Bucket::full(burst, now),
                rate_limited: Counts::new(),
                queue_full: Counts::new(),
                since_ms: None,
                last_ms: now,
            })
    }

    #[expect(clippy::too_many_arguments, reason = "one count's whole identity")]
    fn count_suppressed(
        &mut self,
        sandbox: &str,
        tenant: &Option<String>,
        kind: EventKind,
        allowed: bool,
        n: u64,
        now: i64,
        queue: bool,
    ) {
        let s = self.sandbox_state(sandbox, tenant, now);
        let counts = if queue {
            &mut s.queue_full
        } else {
            &mut s.rate_limited
        };
        *counts.entry((kind, allowed)).or_insert(0) += n;
        s.since_ms.get_or_insert(now);
        s.last_ms = s.last_ms.max(now);
        if s.tenant.is_none() {
            s.tenant.clone_from(tenant);
        }
    }
}

/// Sets `part`'s fields in `detail` (the proxy's record as JSON), replacing any of the same name.
fn merge(detail: &mut Value, part: &impl Detail) {
    if let (Some(map), Value::Object(fields)) = (detail.as_object_mut(), part.to_value()) {
        map.extend(fields);
    }
}

fn outcome(allowed: bool) -> &'static str {
    if allowed {
        "allowed"
    } else {
        "denied"
    }
}

/// `{"dns.denied": 12, ...}`.
fn counts_json(counts: &Counts) -> Value {
    Value::Object(
        counts
            .iter()
            .map(|((kind, allowed), n)| (format!("{}.{}", kind.name(), outcome(*allowed)), json!(n)))
            .collect(),
    )
}

fn suppressed_row(sandbox: &str, s: &SandboxState, window: i64, now: i64) -> NetRow {
    let rate_limited: u64 = s.rate_limited.values().sum();
    let queue_full: u64 = s.queue_full.values().sum();
    NetRow {
        ts_ms: now,
        sandbox: sandbox.to_owned(),
        tenant: s.tenant.clone(),
        action: AuditAction::NetworkSuppressed,
        outcome: "suppressed",
        detail: audit::Suppressed {
            events: rate_limited + queue_full,
            rate_limited: counts_json(&s.rate_limited),
            queue_full: counts_json(&s.queue_full),
            first_ms: s.since_ms,
            last_ms: s.last_ms,
            window_ms: window,
        }
        .to_value(),
        events: rate_limited + queue_full,
        what: RowKind::Suppressed,
    }
}

#[cfg(test)]
mod tests;

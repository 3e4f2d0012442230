//! The egress proxy's records on their way to the audit log, bounded at every step.
//!
//! - The sink ([`NetworkAuditSink`]), called on the proxy's tasks, counts each record in the metrics
//!   and hands it to a bounded queue without ever waiting; when the queue is full the record is
//!   counted per sandbox as dropped instead (and recorded later on a `network.suppressed` row).
//! - One writer task drains the queue into the [`Aggregator`] (repeats folded, rows capped per
//!   sandbox and per tenant, the excess counted), writes the rows it produces in batches, one batch
//!   in flight at a time while it keeps draining, and ends windows every second. At shutdown it
//!   writes everything it holds.
//! - Retention ([`SandboxService::prune_network_audit`], every `retention_interval`) removes old
//!   network rows and each tenant's oldest beyond a count, through the store's recorded prune, so
//!   `verify` still passes.
//!
//! So a sandbox flooding the proxy with DNS questions or connections adds at most its bucket's rows
//! per second plus one `network.suppressed` row per window, and the counts on those rows add up to
//! the events the proxy reported. It does not make the proxy's decisions or change its records.

mod aggregate;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aggregate::{AggregateLimits, Aggregator, EventKind, NetEvent, NetRow, RowKind};
use paddock_egress::{AuditRecord, AuditSink};
use paddock_store::{NetworkRetention, NewAuditEntry};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::core::metrics::AuditCounters;
use crate::core::time::now_ms;
use crate::{NetworkAuditConfig, SandboxService, ServiceError};

/// Records the queue holds before the sink starts counting instead.
pub(crate) const QUEUE: usize = 8192;
/// How often windows are ended.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Records taken off the queue between two looks at the clock and the writes.
const DRAIN_BATCH: usize = 4096;
/// Rows waiting for the database beyond which they are counted as dropped instead.
const MAX_PENDING: usize = 100_000;
/// Rows removed per transaction by retention, and transactions per run.
const PRUNE_BATCH: u32 = 10_000;
const PRUNE_BATCHES_PER_RUN: usize = 100;

/// (kind, allowed) → records dropped, per sandbox.
type Dropped = HashMap<String, BTreeMap<(EventKind, bool), u64>>;

/// Where the egress proxy puts its records.
#[derive(Debug)]
pub(crate) struct NetworkAuditSink {
    tx: mpsc::Sender<AuditRecord>,
    dropped: Mutex<Dropped>,
    counters: AuditCounters,
}

impl NetworkAuditSink {
    /// The sink and the queue's receiving end (for [`SandboxService::run_network_audit`]).
    pub(crate) fn new(counters: AuditCounters) -> (Arc<Self>, mpsc::Receiver<AuditRecord>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let sink = Arc::new(Self {
            tx,
            dropped: Mutex::new(HashMap::new()),
            counters,
        });
        (sink, rx)
    }

    fn take_dropped(&self) -> Dropped {
        std::mem::take(&mut *self.dropped.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl AuditSink for NetworkAuditSink {
    fn record(&self, record: AuditRecord) {
        let (kind, sandbox, allowed) = match &record {
            AuditRecord::Connection(c) => {
                self.counters
                    .count_egress("connection", c.allowed, c.bytes_up, c.bytes_down);
                (EventKind::Connection, &c.sandbox, c.allowed)
            }
            AuditRecord::Dns(d) => {
                self.counters.count_egress("dns", d.allowed, 0, 0);
                (EventKind::Dns, &d.sandbox, d.allowed)
            }
            AuditRecord::Refused(r) => {
                self.counters.count_refused(r.limit.as_str(), r.count);
                (EventKind::Refused, &r.sandbox, false)
            }
        };
        let sandbox = sandbox.to_string();
        match self.tx.try_send(record) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                let mut dropped = self.dropped.lock().unwrap_or_else(PoisonError::into_inner);
                *dropped
                    .entry(sandbox)
                    .or_default()
                    .entry((kind, allowed))
                    .or_insert(0) += 1;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::warn!(sandbox_id = %sandbox, "the audit writer has stopped; egress record dropped");
            }
        }
    }
}

impl NetworkAuditConfig {
    fn limits(&self) -> AggregateLimits {
        AggregateLimits {
            window_ms: i64::try_from(self.window.as_millis()).unwrap_or(i64::MAX),
            sandbox_rate: self.sandbox_rows_per_second,
            sandbox_burst: f64::from(self.sandbox_burst),
            tenant_rate: self.tenant_rows_per_second,
            tenant_burst: f64::from(self.tenant_burst),
        }
    }
}

impl SandboxService {
    /// Writes the egress proxy's records to the audit log until the service stops.
    pub(crate) async fn run_network_audit(
        self,
        mut rx: mpsc::Receiver<AuditRecord>,
        sink: Arc<NetworkAuditSink>,
    ) {
        let mut agg = Aggregator::new(self.inner.config.network_audit.limits());
        let mut pending: Vec<NetRow> = Vec::new();
        // The batch being written (one at a time), while the queue keeps being drained.
        let mut writing = tokio::task::JoinSet::new();
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                record = rx.recv() => {
                    let Some(record) = record else { break };
                    self.observe(&mut agg, record, &mut pending);
                    for _ in 0..DRAIN_BATCH {
                        match rx.try_recv() {
                            Ok(record) => self.observe(&mut agg, record, &mut pending),
                            Err(_) => break,
                        }
                    }
                }
                _ = tick.tick() => {
                    self.count_dropped(&sink, &mut agg);
                    agg.flush(now_ms(), &mut pending);
                }
                Some(_) = writing.join_next(), if !writing.is_empty() => {}
                () = self.inner.stop.cancelled() => break,
            }
            self.count_stats(&mut agg);
            if pending.len() > MAX_PENDING {
                let excess = pending.split_off(MAX_PENDING);
                requeue_as_dropped(&mut agg, excess, &mut pending, now_ms());
            }
            if writing.is_empty() && !pending.is_empty() {
                let rows = std::mem::take(&mut pending);
                writing.spawn(self.clone().write_network_rows(rows));
            }
        }
        // Whatever is still queued or held is written too.
        rx.close();
        while let Ok(record) = rx.try_recv() {
            self.observe(&mut agg, record, &mut pending);
        }
        self.count_dropped(&sink, &mut agg);
        agg.drain(now_ms(), &mut pending);
        self.count_stats(&mut agg);
        while writing.join_next().await.is_some() {}
        if !pending.is_empty() {
            self.write_network_rows(pending).await;
        }
    }

    fn observe(&self, agg: &mut Aggregator, record: AuditRecord, out: &mut Vec<NetRow>) {
        let at_ms = now_ms();
        let (kind, sandbox, allowed, bytes_up, bytes_down, key) = match &record {
            AuditRecord::Connection(c) => (
                EventKind::Connection,
                c.sandbox.to_string(),
                c.allowed,
                c.bytes_up,
                c.bytes_down,
                json!({
                    "door": c.door,
                    "name": c.name,
                    "ip": c.ip,
                    "port": c.port,
                    "rule": c.rule,
                    "secrets": c.secrets_injected,
                    "requests_refused": c.requests_refused,
                    "cut": c.cut,
                }),
            ),
            AuditRecord::Dns(d) => (
                EventKind::Dns,
                d.sandbox.to_string(),
                d.allowed,
                0,
                0,
                json!({ "name": d.name, "type": d.query_type, "rule": d.rule }),
            ),
            AuditRecord::Refused(r) => (
                EventKind::Refused,
                r.sandbox.to_string(),
                false,
                0,
                0,
                Value::Null,
            ),
        };
        let tenant = self.live_sandbox(&sandbox).and_then(|sb| sb.tenant());
        let mut detail = serde_json::to_value(&record).unwrap_or_default();
        if let Some(map) = detail.as_object_mut() {
            map.remove("type");
            map.remove("sandbox");
        }
        if kind == EventKind::Refused {
            // The proxy already counted these over a window (at most one record per sandbox, cap
            // and window): one row as it is, its `count` the refusals, outside the row buckets.
            out.push(NetRow {
                ts_ms: at_ms,
                sandbox,
                tenant,
                action: kind.action(),
                outcome: "denied",
                detail,
                events: 1,
                what: RowKind::First,
            });
            return;
        }
        agg.observe(
            NetEvent {
                sandbox,
                tenant,
                kind,
                allowed,
                key: key.to_string(),
                detail,
                bytes_up,
                bytes_down,
                at_ms,
            },
            out,
        );
    }

    fn count_dropped(&self, sink: &NetworkAuditSink, agg: &mut Aggregator) {
        let now = now_ms();
        for (sandbox, counts) in sink.take_dropped() {
            let tenant = self.live_sandbox(&sandbox).and_then(|sb| sb.tenant());
            for ((kind, allowed), n) in counts {
                agg.dropped(&sandbox, &tenant, kind, allowed, n, now);
            }
        }
    }

    fn count_stats(&self, agg: &mut Aggregator) {
        let stats = agg.take_stats();
        let counters = self.inner.metrics.audit();
        counters.events_aggregated(stats.aggregated);
        counters.events_suppressed("rate", stats.rate_limited);
        counters.events_suppressed("queue", stats.queue_full);
    }

    async fn write_network_rows(self, rows: Vec<NetRow>) {
        let mut by_kind = [0u64; 3];
        let mut events = 0u64;
        for r in &rows {
            by_kind[r.what as usize] += 1;
            events += r.events;
        }
        let entries: Vec<NewAuditEntry> = rows
            .into_iter()
            .map(|r| NewAuditEntry {
                ts_ms: r.ts_ms,
                tenant: r.tenant,
                key_id: None,
                action: r.action.as_str().to_owned(),
                sandbox_id: Some(r.sandbox),
                outcome: r.outcome.to_owned(),
                detail: r.detail,
            })
            .collect();
        let written = self
            .db("write network audit rows", move |s| {
                let rows = with_tenants(s, entries)?;
                s.append_audit_batch(&rows).map(|_| ())
            })
            .await;
        let counters = self.inner.metrics.audit();
        match written {
            Ok(()) => {
                counters.rows_written("first", by_kind[RowKind::First as usize]);
                counters.rows_written("aggregate", by_kind[RowKind::Aggregate as usize]);
                counters.rows_written("suppressed", by_kind[RowKind::Suppressed as usize]);
            }
            Err(e) => {
                counters.events_lost(events);
                tracing::error!(error = %e.message, events, "egress audit rows lost");
            }
        }
    }

    /// Applies the network audit's retention once: removes network rows older than `retention` and
    /// each tenant's oldest beyond `max_rows_per_tenant`, recorded by `audit.prune` rows. Returns
    /// the rows removed.
    pub async fn prune_network_audit(&self) -> Result<u64, ServiceError> {
        let config = &self.inner.config.network_audit;
        let age = i64::try_from(config.retention.as_millis()).unwrap_or(i64::MAX);
        let rule = NetworkRetention {
            older_than_ms: Some(now_ms().saturating_sub(age)),
            max_rows_per_tenant: Some(config.max_rows_per_tenant),
            batch: PRUNE_BATCH,
        };
        let mut total = 0;
        for _ in 0..PRUNE_BATCHES_PER_RUN {
            let report = self
                .db("prune network audit rows", move |s| {
                    s.prune_network_audit(&rule, now_ms())
                })
                .await?;
            total += report.rows;
            self.inner.metrics.audit().rows_pruned(report.rows);
            if report.rows < u64::from(PRUNE_BATCH) {
                break;
            }
        }
        if total > 0 {
            tracing::info!(rows = total, "network audit rows removed by retention");
        }
        Ok(total)
    }

    /// Runs retention every `retention_interval` until the service stops.
    pub(crate) async fn run_audit_retention(self) {
        let mut tick = tokio::time::interval(self.inner.config.network_audit.retention_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = self.inner.stop.cancelled() => return,
            }
            if let Err(e) = self.prune_network_audit().await {
                tracing::error!(error = %e.message, "network audit retention failed");
            }
        }
    }
}

/// Event rows that cannot wait for the database any longer become counts on suppressed rows
/// (suppressed rows, one per sandbox and window, stay).
fn requeue_as_dropped(agg: &mut Aggregator, rows: Vec<NetRow>, pending: &mut Vec<NetRow>, now: i64) {
    for r in rows {
        let kind = match r.what {
            RowKind::Suppressed => {
                pending.push(r);
                continue;
            }
            _ if r.action == EventKind::Dns.action() => EventKind::Dns,
            _ if r.action == EventKind::Refused.action() => EventKind::Refused,
            _ => EventKind::Connection,
        };
        agg.dropped(&r.sandbox, &r.tenant, kind, r.outcome == "allowed", r.events, now);
    }
}

/// Fills in the tenant of rows whose sandbox has already left the live map (the records of
/// connections cut when it ended arrive after it did), from its store record.
fn with_tenants(
    store: &paddock_store::Store,
    mut rows: Vec<NewAuditEntry>,
) -> Result<Vec<NewAuditEntry>, paddock_store::StoreError> {
    let mut known: HashMap<String, Option<String>> = HashMap::new();
    for row in rows.iter_mut().filter(|r| r.tenant.is_none()) {
        let Some(id) = row.sandbox_id.clone() else {
            continue;
        };
        if !known.contains_key(&id) {
            let tenant = store.get_sandbox(&id)?.and_then(|r| r.tenant);
            known.insert(id.clone(), tenant);
        }
        row.tenant = known[&id].clone();
    }
    Ok(rows)
}

//! Prometheus metrics of the service (text exposition via `prometheus-client`).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TemplateLabel {
    template: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EgressLabels {
    kind: String,
    decision: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabel {
    limit: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RowKindLabel {
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// The counters the egress proxy's audit sink and writer update (clones share the series).
#[derive(Clone)]
pub(crate) struct AuditCounters {
    egress: Family<EgressLabels, Counter>,
    egress_bytes: Family<DirectionLabel, Counter>,
    egress_refused: Family<LimitLabel, Counter>,
    rows: Family<RowKindLabel, Counter>,
    aggregated: Counter,
    suppressed: Family<ReasonLabel, Counter>,
    lost: Counter,
    pruned: Counter,
}

impl std::fmt::Debug for AuditCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditCounters").finish_non_exhaustive()
    }
}

impl AuditCounters {
    /// One record from the egress proxy (counted whether or not it gets a row of its own).
    pub(crate) fn count_egress(&self, kind: &str, allowed: bool, bytes_up: u64, bytes_down: u64) {
        let decision = if allowed { "allowed" } else { "denied" };
        self.egress
            .get_or_create(&EgressLabels {
                kind: kind.into(),
                decision: decision.into(),
            })
            .inc();
        for (direction, n) in [("up", bytes_up), ("down", bytes_down)] {
            if n > 0 {
                self.egress_bytes
                    .get_or_create(&DirectionLabel {
                        direction: direction.into(),
                    })
                    .inc_by(n);
            }
        }
    }

    /// Sandbox connections or DNS questions refused at one of the egress proxy's caps.
    pub(crate) fn count_refused(&self, limit: &str, n: u64) {
        self.egress_refused
            .get_or_create(&LimitLabel { limit: limit.into() })
            .inc_by(n);
    }

    /// Network audit rows written, by kind (`first`, `aggregate`, `suppressed`).
    pub(crate) fn rows_written(&self, kind: &str, n: u64) {
        if n > 0 {
            self.rows
                .get_or_create(&RowKindLabel { kind: kind.into() })
                .inc_by(n);
        }
    }

    /// Events folded into another event's row.
    pub(crate) fn events_aggregated(&self, n: u64) {
        self.aggregated.inc_by(n);
    }

    /// Events only counted on a `network.suppressed` row (`reason`: `rate` or `queue`).
    pub(crate) fn events_suppressed(&self, reason: &str, n: u64) {
        if n > 0 {
            self.suppressed
                .get_or_create(&ReasonLabel {
                    reason: reason.into(),
                })
                .inc_by(n);
        }
    }

    /// Events whose rows the database refused.
    pub(crate) fn events_lost(&self, n: u64) {
        self.lost.inc_by(n);
    }

    /// Network audit rows removed by retention.
    pub(crate) fn rows_pruned(&self, n: u64) {
        self.pruned.inc_by(n);
    }
}

/// Every metric the service exports.
pub(crate) struct Metrics {
    registry: Registry,
    sandboxes: Family<StateLabel, Gauge>,
    ended: Family<StateLabel, Counter>,
    create_seconds: Family<SourceLabel, Histogram>,
    exec_start_seconds: Histogram,
    exec_seconds: Histogram,
    snapshot_seconds: Family<SourceLabel, Histogram>,
    pool_size: Family<TemplateLabel, Gauge>,
    pool_target: Family<TemplateLabel, Gauge>,
    requests: Family<RequestLabels, Counter>,
    request_seconds: Family<RequestLabels, Histogram>,
    errors: Family<CodeLabel, Counter>,
    egress_descriptors: Family<StateLabel, Gauge>,
    store_no_space: Gauge,
    store_writes_refused: Counter,
    audit: AuditCounters,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn latency_buckets() -> impl Iterator<Item = f64> {
    // 250 µs .. ~65 s, doubling.
    prometheus_client::metrics::histogram::exponential_buckets(0.00025, 2.0, 19)
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("paddock");
        let sandboxes = Family::<StateLabel, Gauge>::default();
        registry.register(
            "sandboxes",
            "Sandboxes held by this server, by state",
            sandboxes.clone(),
        );
        let ended = Family::<StateLabel, Counter>::default();
        registry.register(
            "sandboxes_ended",
            "Sandboxes ended, by final state",
            ended.clone(),
        );
        let create_seconds =
            Family::<SourceLabel, Histogram>::new_with_constructor(|| Histogram::new(latency_buckets()));
        registry.register(
            "sandbox_create_seconds",
            "Time to create a sandbox (source=pool: a warm claim, boot: a fresh start)",
            create_seconds.clone(),
        );
        let exec_start_seconds = Histogram::new(latency_buckets());
        registry.register(
            "exec_start_seconds",
            "Time from an exec request to the process running",
            exec_start_seconds.clone(),
        );
        let exec_seconds = Histogram::new(latency_buckets());
        registry.register(
            "exec_seconds",
            "Time from an exec request to the process's exit",
            exec_seconds.clone(),
        );
        let snapshot_seconds =
            Family::<SourceLabel, Histogram>::new_with_constructor(|| Histogram::new(latency_buckets()));
        registry.register(
            "snapshot_seconds",
            "Time of snapshot operations (source=snapshot, checkpoint, rollback)",
            snapshot_seconds.clone(),
        );
        let pool_size = Family::<TemplateLabel, Gauge>::default();
        registry.register(
            "warm_pool_size",
            "Warm sandboxes ready, by template",
            pool_size.clone(),
        );
        let pool_target = Family::<TemplateLabel, Gauge>::default();
        registry.register(
            "warm_pool_target",
            "Configured warm pool size, by template",
            pool_target.clone(),
        );
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests, by route and status",
            requests.clone(),
        );
        let request_seconds =
            Family::<RequestLabels, Histogram>::new_with_constructor(|| Histogram::new(latency_buckets()));
        registry.register(
            "http_request_seconds",
            "HTTP request latency until the response head (streams excluded)",
            request_seconds.clone(),
        );
        let errors = Family::<CodeLabel, Counter>::default();
        registry.register("api_errors", "Error responses, by error code", errors.clone());
        let egress = Family::<EgressLabels, Counter>::default();
        registry.register(
            "egress",
            "Sandbox connections and DNS questions through the egress proxy (kind=connection|dns), by decision",
            egress.clone(),
        );
        let egress_bytes = Family::<DirectionLabel, Counter>::default();
        registry.register(
            "egress_bytes",
            "Bytes relayed by the egress proxy (direction=up: from sandboxes, down: to them)",
            egress_bytes.clone(),
        );
        let egress_refused = Family::<LimitLabel, Counter>::default();
        registry.register(
            "egress_refused",
            "Sandbox connections and DNS questions refused by the egress proxy at a cap, by cap",
            egress_refused.clone(),
        );
        let egress_descriptors = Family::<StateLabel, Gauge>::default();
        registry.register(
            "egress_descriptors",
            "Descriptors held by sandbox connections through the egress proxy (state=in_use), and its budget (state=budget)",
            egress_descriptors.clone(),
        );
        let store_no_space = Gauge::default();
        registry.register(
            "store_no_space",
            "1 while the state directory's file system is full and the database refuses writes \
             (requests that write answer no_space), 0 otherwise",
            store_no_space.clone(),
        );
        let store_writes_refused = Counter::default();
        registry.register(
            "store_writes_refused_no_space",
            "Database writes refused because the state directory's file system was full",
            store_writes_refused.clone(),
        );
        let audit = AuditCounters {
            egress,
            egress_bytes,
            egress_refused,
            rows: Family::default(),
            aggregated: Counter::default(),
            suppressed: Family::default(),
            lost: Counter::default(),
            pruned: Counter::default(),
        };
        registry.register(
            "audit_network_rows",
            "Audit rows written for the egress proxy's events (kind=first: an event in full, aggregate: \
             repeats folded with a count, suppressed: events over a rate cap or dropped, counted)",
            audit.rows.clone(),
        );
        registry.register(
            "audit_network_events_aggregated",
            "Egress events folded into an aggregate audit row",
            audit.aggregated.clone(),
        );
        registry.register(
            "audit_network_events_suppressed",
            "Egress events only counted on a network.suppressed audit row (reason=rate: over the \
             sandbox's or tenant's row rate, queue: the audit writer's queue was full)",
            audit.suppressed.clone(),
        );
        registry.register(
            "audit_network_events_lost",
            "Egress events whose audit rows the database refused (logged as errors)",
            audit.lost.clone(),
        );
        registry.register(
            "audit_rows_pruned",
            "Network audit rows removed by retention (recorded by audit.prune rows)",
            audit.pruned.clone(),
        );
        Self {
            registry,
            sandboxes,
            ended,
            create_seconds,
            exec_start_seconds,
            exec_seconds,
            snapshot_seconds,
            pool_size,
            pool_target,
            requests,
            request_seconds,
            errors,
            egress_descriptors,
            store_no_space,
            store_writes_refused,
            audit,
        }
    }

    /// Copies the store's no-space condition and its count of refused writes.
    pub(crate) fn set_store_space(&self, status: paddock_store::SpaceStatus) {
        self.store_no_space.set(i64::from(status.full));
        let counted = self.store_writes_refused.get();
        if status.refused_writes > counted {
            self.store_writes_refused.inc_by(status.refused_writes - counted);
        }
    }

    pub(crate) fn set_egress_descriptors(&self, in_use: usize, budget: usize) {
        for (state, n) in [("in_use", in_use), ("budget", budget)] {
            self.egress_descriptors
                .get_or_create(&StateLabel { state: state.into() })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The counters of the network audit (shared with the egress proxy's sink).
    pub(crate) fn audit(&self) -> &AuditCounters {
        &self.audit
    }

    pub(crate) fn observe_create(&self, source: &str, elapsed: Duration) {
        self.create_seconds
            .get_or_create(&SourceLabel {
                source: source.into(),
            })
            .observe(elapsed.as_secs_f64());
    }

    pub(crate) fn observe_exec_start(&self, elapsed: Duration) {
        self.exec_start_seconds.observe(elapsed.as_secs_f64());
    }

    pub(crate) fn observe_exec(&self, elapsed: Duration) {
        self.exec_seconds.observe(elapsed.as_secs_f64());
    }

    pub(crate) fn observe_snapshot(&self, operation: &str, elapsed: Duration) {
        self.snapshot_seconds
            .get_or_create(&SourceLabel {
                source: operation.into(),
            })
            .observe(elapsed.as_secs_f64());
    }

    pub(crate) fn sandbox_ended(&self, state: &str) {
        self.ended
            .get_or_create(&StateLabel { state: state.into() })
            .inc();
    }

    pub(crate) fn set_pool_size(&self, template: &str, n: i64) {
        self.pool_size
            .get_or_create(&TemplateLabel {
                template: template.into(),
            })
            .set(n);
    }

    pub(crate) fn set_pool_target(&self, template: &str, n: i64) {
        self.pool_target
            .get_or_create(&TemplateLabel {
                template: template.into(),
            })
            .set(n);
    }

    pub(crate) fn set_sandboxes(&self, state: &str, n: i64) {
        self.sandboxes
            .get_or_create(&StateLabel { state: state.into() })
            .set(n);
    }

    pub(crate) fn observe_request(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let labels = RequestLabels {
            method: method.into(),
            route: route.into(),
            status: status.to_string(),
        };
        self.requests.get_or_create(&labels).inc();
        self.request_seconds
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    pub(crate) fn count_error(&self, code: &str) {
        self.errors.get_or_create(&CodeLabel { code: code.into() }).inc();
    }

    pub(crate) fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

//! The aggregator's promises: nothing lost (the rows' counts add up to the events), repeats folded,
//! rows per sandbox and per tenant within their buckets, memory bounded by the tokens.

use proptest::prelude::*;

use super::*;

const LIMITS: AggregateLimits = AggregateLimits {
    window_ms: 10_000,
    sandbox_rate: 2.0,
    sandbox_burst: 5.0,
    tenant_rate: 3.0,
    tenant_burst: 8.0,
};

fn event(sandbox: usize, key: usize, kind: EventKind, allowed: bool, at_ms: i64) -> NetEvent {
    NetEvent {
        sandbox: format!("sb-{sandbox}"),
        tenant: Some(format!("t-{}", sandbox % 2)),
        kind,
        allowed,
        key: format!("k{key}"),
        detail: json!({ "name": format!("k{key}"), "bytes_up": 10, "bytes_down": 20 }),
        bytes_up: 10,
        bytes_down: 20,
        at_ms,
    }
}

/// (sandbox, key, kind, allowed, gap before it in ms, dropped instead of observed)
type Step = (usize, usize, bool, bool, i64, bool);

fn steps() -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec(
        (
            0usize..4,
            0usize..6,
            any::<bool>(),
            any::<bool>(),
            0i64..4_000,
            proptest::bool::weighted(0.1),
        ),
        0..300,
    )
}

/// Runs `steps` with flushes every second of their time, then drains; returns the rows and the
/// events fed in, per sandbox.
fn run(steps: &[Step]) -> (Vec<NetRow>, BTreeMap<String, u64>, i64, Aggregator) {
    let mut agg = Aggregator::new(LIMITS);
    let mut rows = Vec::new();
    let mut fed: BTreeMap<String, u64> = BTreeMap::new();
    let mut now = 1_000_000i64;
    let mut next_flush = now + 1_000;
    for &(sandbox, key, dns, allowed, gap, dropped) in steps {
        now += gap;
        while next_flush <= now {
            agg.flush(next_flush, &mut rows);
            next_flush += 1_000;
        }
        let kind = if dns {
            EventKind::Dns
        } else {
            EventKind::Connection
        };
        let e = event(sandbox, key, kind, allowed, now);
        *fed.entry(e.sandbox.clone()).or_insert(0) += 1;
        if dropped {
            agg.dropped(&e.sandbox, &e.tenant, kind, allowed, 1, now);
        } else {
            agg.observe(e, &mut rows);
        }
    }
    agg.drain(now, &mut rows);
    (rows, fed, now, agg)
}

/// The events a row says it accounts for, read from its detail as a reader of the log would.
fn events_in_detail(row: &NetRow) -> u64 {
    match row.what {
        RowKind::Suppressed => row.detail["events"].as_u64().expect("events"),
        _ => row.detail["count"].as_u64().expect("count"),
    }
}

proptest! {
    #[test]
    fn the_rows_account_for_every_event(steps in steps()) {
        let (rows, fed, _, agg) = run(&steps);
        let mut accounted: BTreeMap<String, u64> = BTreeMap::new();
        for r in &rows {
            prop_assert_eq!(events_in_detail(r), r.events, "{:?}", r);
            if r.what == RowKind::Suppressed {
                let parts: u64 = ["rate_limited", "queue_full"]
                    .iter()
                    .flat_map(|k| r.detail[*k].as_object().into_iter().flatten())
                    .map(|(_, v)| v.as_u64().unwrap_or(0))
                    .sum();
                prop_assert_eq!(parts, r.events);
            }
            *accounted.entry(r.sandbox.clone()).or_insert(0) += r.events;
        }
        prop_assert_eq!(accounted, fed);
        prop_assert!(agg.keys.is_empty(), "drained");
    }

    #[test]
    fn rows_stay_within_each_sandboxs_and_tenants_bucket(steps in steps()) {
        let (rows, _, now, _) = run(&steps);
        let start = 1_000_000i64;
        let seconds = (now - start) as f64 / 1000.0;
        let mut per_sandbox: BTreeMap<&str, u64> = BTreeMap::new();
        let mut per_tenant: BTreeMap<Option<&str>, u64> = BTreeMap::new();
        let mut suppressed: BTreeMap<&str, u64> = BTreeMap::new();
        for r in &rows {
            if r.what == RowKind::Suppressed {
                *suppressed.entry(&r.sandbox).or_insert(0) += 1;
            } else {
                *per_sandbox.entry(&r.sandbox).or_insert(0) += 1;
                *per_tenant.entry(r.tenant.as_deref()).or_insert(0) += 1;
            }
        }
        for (sb, n) in per_sandbox {
            prop_assert!((n as f64) <= LIMITS.sandbox_burst + LIMITS.sandbox_rate * seconds + 1e-9, "{} rows for {}", n, sb);
        }
        for (t, n) in per_tenant {
            prop_assert!((n as f64) <= LIMITS.tenant_burst + LIMITS.tenant_rate * seconds + 1e-9, "{} rows for {:?}", n, t);
        }
        // One suppressed row per window at most (and one more at the final drain).
        let windows = (now - start) / LIMITS.window_ms + 2;
        for (sb, n) in suppressed {
            prop_assert!(n as i64 <= windows, "{} suppressed rows for {}", n, sb);
        }
    }
}

#[test]
fn repeats_within_a_window_are_one_more_row_with_their_count() {
    let mut agg = Aggregator::new(AggregateLimits {
        sandbox_burst: 100.0,
        tenant_burst: 100.0,
        ..LIMITS
    });
    let mut rows = Vec::new();
    for i in 0..100 {
        agg.observe(event(0, 0, EventKind::Connection, false, 1_000 + i), &mut rows);
    }
    assert_eq!(rows.len(), 1, "the first in full, the rest wait for the window");
    assert_eq!(rows[0].detail["count"], 1);
    assert_eq!(rows[0].outcome, "denied");
    agg.flush(1_000 + LIMITS.window_ms - 1, &mut rows);
    assert_eq!(rows.len(), 1, "the window has not ended");
    agg.flush(1_000 + LIMITS.window_ms, &mut rows);
    assert_eq!(rows.len(), 2);
    let folded = &rows[1];
    assert_eq!(folded.what, RowKind::Aggregate);
    assert_eq!(folded.detail["count"], 99);
    assert_eq!(folded.detail["bytes_up"], 990);
    assert_eq!(folded.detail["bytes_down"], 1980);
    assert_eq!(folded.detail["first_ms"], 1_001);
    assert_eq!(folded.detail["last_ms"], 1_099);
    assert_eq!(folded.detail["name"], "k0");
    // After the window, the same event is a first occurrence again.
    agg.observe(event(0, 0, EventKind::Connection, false, 50_000), &mut rows);
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[2].what, RowKind::First);
}

#[test]
fn a_flood_of_distinct_names_is_capped_and_counted() {
    let mut agg = Aggregator::new(LIMITS);
    let mut rows = Vec::new();
    // 13,000 different names at once from one sandbox.
    for i in 0..13_000 {
        agg.observe(event(0, i, EventKind::Dns, false, 1_000), &mut rows);
    }
    assert_eq!(
        rows.len(),
        LIMITS.sandbox_burst as usize,
        "the burst, then nothing"
    );
    assert!(
        agg.keys.len() <= LIMITS.sandbox_burst as usize,
        "only keys that made a row are kept"
    );
    agg.flush(1_000 + LIMITS.window_ms, &mut rows);
    let suppressed: Vec<_> = rows.iter().filter(|r| r.what == RowKind::Suppressed).collect();
    assert_eq!(suppressed.len(), 1);
    assert_eq!(suppressed[0].detail["events"], 13_000 - 5);
    assert_eq!(suppressed[0].detail["rate_limited"]["dns.denied"], 13_000 - 5);
    assert_eq!(suppressed[0].action, "network.suppressed");
    let stats = agg.take_stats();
    assert_eq!(stats.rate_limited, 13_000 - 5);
}

#[test]
fn one_sandbox_does_not_use_up_another_tenants_rows() {
    let mut agg = Aggregator::new(LIMITS);
    let mut rows = Vec::new();
    for i in 0..1_000 {
        agg.observe(event(0, i, EventKind::Dns, true, 1_000), &mut rows);
    }
    // sb-1 is tenant t-1: its own buckets are full.
    agg.observe(event(1, 0, EventKind::Dns, true, 1_000), &mut rows);
    assert_eq!(rows.last().map(|r| r.sandbox.as_str()), Some("sb-1"));
    // sb-2 shares t-0 with the flooding sb-0: the tenant's bucket has 3 tokens left.
    for i in 0..10 {
        agg.observe(event(2, i, EventKind::Dns, true, 1_000), &mut rows);
    }
    let sb2 = rows.iter().filter(|r| r.sandbox == "sb-2").count();
    assert_eq!(sb2, 3, "t-0's burst of 8 less sb-0's 5");
}

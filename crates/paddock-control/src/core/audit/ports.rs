//! Audit rows of connections to sandboxes' ports (`sandbox.port_connect`), bounded so that a client
//! opening connections in a loop cannot flood the audit log.
//!
//! - The first connection of a key (sandbox, port, door, key id) is a row of its own, written by the
//!   operation before the connection is handed out, with `count: 1`.
//! - Repeats of the key within `audit_window` of that row are counted and become one more row when
//!   the window ends (`count`, first and last time), written by `SandboxService::run_port_audit`.
//! - A first row takes a token from its sandbox's bucket and its tenant's; without one the
//!   connection is still made, and counted on one `suppressed` row per sandbox per window.
//!
//! So a sandbox's ports add at most its bucket's rows plus as many aggregate rows, plus one
//! suppressed row per window; the counts on the rows add up to the connections made (a test says
//! so). Memory is bounded too: a key is remembered only after its first row took a token.
//!
//! The decisions ([`PortAudit`]) are pure, with the clock passed in; the task that writes the
//! later rows is `lifecycle/port_audit.rs`.

use std::collections::HashMap;

use paddock_store::NewAuditEntry;

use crate::core::audit::{self, AuditAction, Detail};
use crate::PortsConfig;

/// What a connection is, for its rows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PortKey {
    pub(crate) sandbox: String,
    pub(crate) tenant: String,
    pub(crate) key_id: Option<String>,
    pub(crate) port: u16,
    pub(crate) door: &'static str,
}

/// What to do about one connection's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Write its row now (`count: 1`).
    Row,
    /// Counted: a later row says so.
    Counted,
}

#[derive(Debug)]
struct Window {
    start_ms: i64,
    count: u64,
    first_ms: i64,
    last_ms: i64,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at_ms: i64,
}

impl Bucket {
    fn refill(&mut self, rate: f64, burst: f64, now: i64) {
        let elapsed = (now - self.at_ms).max(0) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.at_ms = self.at_ms.max(now);
    }
}

#[derive(Debug)]
struct Suppressed {
    tenant: String,
    count: u64,
    first_ms: i64,
    last_ms: i64,
}

/// The row decisions.
#[derive(Debug)]
pub(crate) struct PortAudit {
    limits: PortsConfig,
    keys: HashMap<PortKey, Window>,
    sandboxes: HashMap<String, Bucket>,
    tenants: HashMap<String, Bucket>,
    suppressed: HashMap<String, Suppressed>,
}

impl PortAudit {
    pub(crate) fn new(limits: PortsConfig) -> Self {
        Self {
            limits,
            keys: HashMap::new(),
            sandboxes: HashMap::new(),
            tenants: HashMap::new(),
            suppressed: HashMap::new(),
        }
    }

    fn window_ms(&self) -> i64 {
        i64::try_from(self.limits.audit_window.as_millis()).unwrap_or(i64::MAX)
    }

    /// One connection made at `now`; rows due now (a window it ended) are appended to `out`.
    pub(crate) fn observe(&mut self, key: &PortKey, now: i64, out: &mut Vec<NewAuditEntry>) -> Admit {
        let window = self.window_ms();
        if let Some(w) = self.keys.get_mut(key) {
            if now < w.start_ms.saturating_add(window) {
                if w.count == 0 {
                    w.first_ms = now;
                }
                w.count += 1;
                w.last_ms = w.last_ms.max(now);
                return Admit::Counted;
            }
            if let Some(w) = self.keys.remove(key) {
                out.extend(aggregate_row(key, &w, now));
            }
        }
        if self.take_token(key, now) {
            self.keys.insert(
                key.clone(),
                Window {
                    start_ms: now,
                    count: 0,
                    first_ms: now,
                    last_ms: now,
                },
            );
            return Admit::Row;
        }
        let s = self
            .suppressed
            .entry(key.sandbox.clone())
            .or_insert_with(|| Suppressed {
                tenant: key.tenant.clone(),
                count: 0,
                first_ms: now,
                last_ms: now,
            });
        s.count += 1;
        s.last_ms = s.last_ms.max(now);
        Admit::Counted
    }

    /// The first row of `key` could not be written (the connection failed with it): forget it, so
    /// the next connection gets a first row again.
    pub(crate) fn forget(&mut self, key: &PortKey) {
        self.keys.remove(key);
    }

    /// Rows of windows ended by `now`; forgets what no longer matters.
    pub(crate) fn flush(&mut self, now: i64, out: &mut Vec<NewAuditEntry>) {
        let window = self.window_ms();
        self.flush_where(now, out, |start| now >= start.saturating_add(window));
    }

    /// Every row still held (at shutdown).
    pub(crate) fn drain(&mut self, now: i64, out: &mut Vec<NewAuditEntry>) {
        self.flush_where(now, out, |_| true);
    }

    fn flush_where(&mut self, now: i64, out: &mut Vec<NewAuditEntry>, due: impl Fn(i64) -> bool) {
        let ended: Vec<PortKey> = self
            .keys
            .iter()
            .filter(|(_, w)| due(w.start_ms))
            .map(|(k, _)| k.clone())
            .collect();
        for key in ended {
            if let Some(w) = self.keys.remove(&key) {
                out.extend(aggregate_row(&key, &w, now));
            }
        }
        let ended: Vec<String> = self
            .suppressed
            .iter()
            .filter(|(_, s)| due(s.first_ms))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ended {
            if let Some(s) = self.suppressed.remove(&id) {
                out.push(suppressed_row(&id, &s, now));
            }
        }
        let l = &self.limits;
        let (sr, sb) = (l.sandbox_rows_per_second, f64::from(l.sandbox_burst));
        let (tr, tb) = (l.tenant_rows_per_second, f64::from(l.tenant_burst));
        // A bucket that has refilled is the same as a new one: forget it.
        self.sandboxes.retain(|_, b| {
            b.refill(sr, sb, now);
            b.tokens < sb
        });
        self.tenants.retain(|_, b| {
            b.refill(tr, tb, now);
            b.tokens < tb
        });
    }

    /// One token from the sandbox's bucket and one from its tenant's, or none from either.
    fn take_token(&mut self, key: &PortKey, now: i64) -> bool {
        let l = &self.limits;
        let (sr, sb) = (l.sandbox_rows_per_second, f64::from(l.sandbox_burst));
        let (tr, tb) = (l.tenant_rows_per_second, f64::from(l.tenant_burst));
        let s = self.sandboxes.entry(key.sandbox.clone()).or_insert(Bucket {
            tokens: sb,
            at_ms: now,
        });
        s.refill(sr, sb, now);
        let t = self.tenants.entry(key.tenant.clone()).or_insert(Bucket {
            tokens: tb,
            at_ms: now,
        });
        t.refill(tr, tb, now);
        if s.tokens < 1.0 || t.tokens < 1.0 {
            return false;
        }
        s.tokens -= 1.0;
        t.tokens -= 1.0;
        true
    }
}

fn aggregate_row(key: &PortKey, w: &Window, now: i64) -> Option<NewAuditEntry> {
    (w.count > 0).then(|| NewAuditEntry {
        ts_ms: now,
        tenant: Some(key.tenant.clone()),
        key_id: key.key_id.clone(),
        action: AuditAction::SandboxPortConnect.as_str().to_owned(),
        sandbox_id: Some(key.sandbox.clone()),
        outcome: "ok".into(),
        detail: audit::PortConnected {
            port: key.port,
            door: key.door.to_owned(),
            count: w.count,
            first_ms: Some(w.first_ms),
            last_ms: Some(w.last_ms),
        }
        .to_value(),
    })
}

fn suppressed_row(sandbox: &str, s: &Suppressed, now: i64) -> NewAuditEntry {
    NewAuditEntry {
        ts_ms: now,
        tenant: Some(s.tenant.clone()),
        key_id: None,
        action: AuditAction::SandboxPortConnect.as_str().to_owned(),
        sandbox_id: Some(sandbox.to_owned()),
        outcome: "suppressed".into(),
        detail: audit::PortsSuppressed {
            count: s.count,
            first_ms: s.first_ms,
            last_ms: s.last_ms,
        }
        .to_value(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(sandbox: &str, port: u16) -> PortKey {
        PortKey {
            sandbox: sandbox.into(),
            tenant: "t".into(),
            key_id: Some("k".into()),
            port,
            door: "v1",
        }
    }

    fn limits() -> PortsConfig {
        PortsConfig {
            audit_window: Duration::from_secs(10),
            sandbox_rows_per_second: 1.0,
            sandbox_burst: 3,
            tenant_rows_per_second: 100.0,
            tenant_burst: 100,
            ..PortsConfig::default()
        }
    }

    /// The connections the rows account for.
    fn counted(rows: &[NewAuditEntry]) -> u64 {
        rows.iter()
            .map(|r| r.detail["count"].as_u64().expect("a count"))
            .sum()
    }

    #[test]
    fn repeats_fold_into_one_row_per_window() {
        let mut a = PortAudit::new(limits());
        let mut rows = Vec::new();
        assert_eq!(a.observe(&key("sb-1", 80), 0, &mut rows), Admit::Row);
        for t in 1..=50 {
            assert_eq!(a.observe(&key("sb-1", 80), t, &mut rows), Admit::Counted);
        }
        assert!(rows.is_empty());
        a.flush(9_999, &mut rows);
        assert!(rows.is_empty(), "the window has not ended");
        a.flush(10_000, &mut rows);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].detail["count"], 50);
        assert_eq!(rows[0].detail["first_ms"], 1);
        assert_eq!(rows[0].detail["last_ms"], 50);
        assert_eq!(rows[0].detail["port"], 80);
        assert_eq!(rows[0].key_id.as_deref(), Some("k"));
        // A new window starts with a row of its own.
        assert_eq!(a.observe(&key("sb-1", 80), 10_001, &mut rows), Admit::Row);
    }

    #[test]
    fn a_flood_adds_bounded_rows_and_every_connection_is_counted() {
        let mut a = PortAudit::new(limits());
        let mut rows = Vec::new();
        let mut first_rows = 0u64;
        let mut made = 0u64;
        // 1,000 connections to 1,000 ports in two seconds.
        for port in 1..=1000u16 {
            made += 1;
            if a.observe(&key("sb-1", port), i64::from(port) * 2, &mut rows) == Admit::Row {
                first_rows += 1;
            }
        }
        assert_eq!(first_rows, 4, "the burst and one refilled token");
        a.drain(3_000, &mut rows);
        let suppressed: Vec<_> = rows.iter().filter(|r| r.outcome == "suppressed").collect();
        assert_eq!(suppressed.len(), 1);
        assert_eq!(first_rows + counted(&rows), made);
        assert!(a.keys.is_empty() && a.suppressed.is_empty());
    }
}

//! Audit records: one per connection and one per DNS query, handed to a sink the owner provides (the
//! control plane writes them to its audit table). Records never carry secret values.

use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use paddock_types::{DomainName, SandboxId};
use serde::Serialize;

use crate::limits::RefusalRecord;
use crate::policy::Rule;

/// How a connection reached the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Door {
    /// Intercepted transparently (the original destination came from the kernel).
    Transparent,
    /// Through the sandbox's `HTTP(S)_PROXY` (CONNECT or absolute-form HTTP).
    Proxy,
}

/// One TCP connection from a sandbox, allowed or refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConnectionRecord {
    /// The sandbox.
    pub sandbox: SandboxId,
    /// How the connection came in.
    pub door: Door,
    /// The name the sandbox used (SNI, `Host`, or the proxy request), when it gave one.
    pub name: Option<DomainName>,
    /// The address connected to (or refused); `None` when no address was chosen.
    pub ip: Option<IpAddr>,
    /// The destination port.
    pub port: u16,
    /// Whether the connection was let through.
    pub allowed: bool,
    /// What decided.
    pub rule: Rule,
    /// Names of the secrets substituted into requests on this connection (never their values).
    pub secrets_injected: Vec<String>,
    /// Why the proxy cut the connection, when it did (absent when a side closed it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut: Option<Cut>,
    /// Requests on this (intercepted) connection the proxy refused with 403, by reason (distinct,
    /// a few at most): a target other than the intercepted host. Absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub requests_refused: Vec<String>,
    /// Bytes from the sandbox towards the destination.
    pub bytes_up: u64,
    /// Bytes from the destination towards the sandbox.
    pub bytes_down: u64,
    /// When the connection was accepted.
    pub started: SystemTime,
    /// How long it lasted.
    pub duration: Duration,
}

/// Why the proxy ended a connection itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cut {
    /// No byte moved either way for the idle timeout.
    IdleTimeout,
    /// It reached the longest lifetime allowed.
    Lifetime,
    /// The sandbox stopped being served (it ended, stopped, or the proxy shut down).
    SandboxRemoved,
}

/// One DNS question from a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DnsRecord {
    /// The sandbox.
    pub sandbox: SandboxId,
    /// The name asked for, as sent (it may not be a valid domain name).
    pub name: String,
    /// The record type asked for (`A`, `AAAA`, `TXT`, ...).
    pub query_type: String,
    /// Whether it was answered.
    pub allowed: bool,
    /// What decided.
    pub rule: Rule,
    /// The addresses answered (and pinned for connections to this name).
    pub answers: Vec<IpAddr>,
    /// When.
    pub at: SystemTime,
}

/// Anything the egress proxy records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AuditRecord {
    /// A connection ended (or was refused).
    Connection(ConnectionRecord),
    /// A DNS question was answered or refused.
    Dns(DnsRecord),
    /// Connections or questions refused at a cap, counted over a window (one record for many).
    Refused(RefusalRecord),
}

/// Where records go. It must not block: it is called on the proxy's tasks.
pub trait AuditSink: Send + Sync + fmt::Debug + 'static {
    /// Take one record.
    fn record(&self, record: AuditRecord);
}

impl AuditSink for tokio::sync::mpsc::UnboundedSender<AuditRecord> {
    fn record(&self, record: AuditRecord) {
        if self.send(record).is_err() {
            tracing::warn!("egress audit receiver is gone; record dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The records' shape is what the control plane will store: frozen here.
    #[test]
    fn record_shapes_are_stable() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let conn = AuditRecord::Connection(ConnectionRecord {
            sandbox: "sb-1".parse().expect("id"),
            door: Door::Transparent,
            name: Some("api.example.com".parse().expect("name")),
            ip: Some("192.0.2.7".parse().expect("ip")),
            port: 443,
            allowed: true,
            rule: Rule::TenantAllow { index: 2 },
            secrets_injected: vec!["GH".into()],
            requests_refused: vec![],
            cut: None,
            bytes_up: 517,
            bytes_down: 4096,
            started: at,
            duration: Duration::from_millis(1500),
        });
        assert_eq!(
            serde_json::to_string(&conn).expect("json"),
            r#"{"type":"connection","sandbox":"sb-1","door":"transparent","name":"api.example.com","ip":"192.0.2.7","port":443,"allowed":true,"rule":{"kind":"tenant_allow","index":2},"secrets_injected":["GH"],"bytes_up":517,"bytes_down":4096,"started":{"secs_since_epoch":1700000000,"nanos_since_epoch":0},"duration":{"secs":1,"nanos":500000000}}"#
        );
        let dns = AuditRecord::Dns(DnsRecord {
            sandbox: "sb-1".parse().expect("id"),
            name: "evil.example.".into(),
            query_type: "TXT".into(),
            allowed: false,
            rule: Rule::UnsupportedQuery,
            answers: vec![],
            at,
        });
        assert_eq!(
            serde_json::to_string(&dns).expect("json"),
            r#"{"type":"dns","sandbox":"sb-1","name":"evil.example.","query_type":"TXT","allowed":false,"rule":{"kind":"unsupported_query"},"answers":[],"at":{"secs_since_epoch":1700000000,"nanos_since_epoch":0}}"#
        );
        let refused = AuditRecord::Refused(RefusalRecord {
            sandbox: "sb-1".parse().expect("id"),
            limit: crate::limits::Limit::DnsTcpConnections,
            count: 4096,
            since: at,
            until: at + Duration::from_secs(10),
        });
        assert_eq!(
            serde_json::to_string(&refused).expect("json"),
            r#"{"type":"refused","sandbox":"sb-1","limit":"dns_tcp_connections","count":4096,"since":{"secs_since_epoch":1700000000,"nanos_since_epoch":0},"until":{"secs_since_epoch":1700000010,"nanos_since_epoch":0}}"#
        );
        let AuditRecord::Connection(mut cut) = conn else {
            unreachable!()
        };
        cut.cut = Some(Cut::IdleTimeout);
        cut.requests_refused = vec!["no Host header".into()];
        let json = serde_json::to_value(AuditRecord::Connection(cut)).expect("json");
        assert_eq!(json["cut"], "idle_timeout");
        assert_eq!(json["requests_refused"], serde_json::json!(["no Host header"]));
    }
}

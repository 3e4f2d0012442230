//! The `[http]` section: what one client can make the API listener hold (connections, descriptors,
//! time). File only, like `[egress]`; every key has a default meant for a production server.
//!
//! ```toml
//! [http]
//! header_read_timeout = "10s"      # a request head must arrive whole within this, from its first byte
//! idle_timeout = "60s"             # a keep-alive connection with no request in flight is closed after this
//! request_body_timeout = "60s"     # a request body that sends nothing for this long fails the request
//! max_header_bytes = "64K"         # largest request head (request line and headers)
//! max_connections = 1024           # open API connections; more wait in the kernel's backlog
//! max_connections_per_client = 256 # open connections from one source address; more are closed at once
//! collected_output_budget = "256M" # process output held for `Accept: application/json` answers, all together
//! ```
//!
//! It does not cover WebSocket sessions once upgraded (they are the handler's), nor the egress
//! proxy's listeners (`[egress]`).

use std::time::Duration;

use paddock_types::ByteSize;
use serde::{Deserialize, Serialize};

/// Descriptors the server keeps for itself beyond its API connections (listener, database, logs,
/// signal and timer descriptors, agent connections of API requests in flight). The egress proxy's
/// caps must keep everything else under `RLIMIT_NOFILE - api_fd_reserve()` (ARCHITECTURE.md).
pub const API_FD_OVERHEAD: u64 = 256;

/// The `[http]` section, resolved (defaults filled in).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// How long a request head may take from its first byte to its last.
    #[serde(default = "default_header_read_timeout", with = "super::human_duration")]
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight and no byte of a new one. A
    /// response being streamed (NDJSON, SSE) is a request in flight, however quiet.
    #[serde(default = "default_idle_timeout", with = "super::human_duration")]
    pub idle_timeout: Duration,
    /// How long a request body may go without sending a byte while the server waits for one.
    #[serde(default = "default_request_body_timeout", with = "super::human_duration")]
    pub request_body_timeout: Duration,
    /// The largest request head.
    #[serde(default = "default_max_header_bytes", with = "size")]
    pub max_header_bytes: ByteSize,
    /// The most API connections open at once; further ones wait in the listen backlog.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// The most API connections open at once from one source address; further ones are closed as
    /// soon as they are accepted. Behind a reverse proxy every client shares the proxy's address:
    /// raise it to `max_connections` there.
    #[serde(default = "default_max_connections_per_client")]
    pub max_connections_per_client: u32,
    /// Process output (JSON-encoded) that exec answers collected into one JSON document may hold,
    /// all requests together, one tenant's at most a quarter of it; past it, answers are cut and say
    /// so. Each stream of one answer holds at most 16 MiB whatever this is.
    #[serde(default = "default_collected_output_budget", with = "size")]
    pub collected_output_budget: ByteSize,
    /// PEM file of the listener's certificate chain. With `tls_key`, the listener speaks HTTPS
    /// only (HTTP/1.1 by ALPN); a wildcard certificate (`*.<[e2b] domain>`) makes per-sandbox hosts
    /// work. Without both, plain HTTP (keep it on loopback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM file of the certificate's private key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<std::path::PathBuf>,
}

/// hyper reads a head into a buffer of at least this size.
const MIN_HEADER_BYTES: u64 = 8 * 1024;
const MAX_HEADER_BYTES: u64 = 1024 * 1024;
const MAX_CONNECTIONS: u32 = 1 << 20;
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// One stream's first buffer.
const MIN_COLLECTED_OUTPUT_BUDGET: u64 = 64 * 1024;

fn default_header_read_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_idle_timeout() -> Duration {
    Duration::from_secs(60)
}

fn default_request_body_timeout() -> Duration {
    Duration::from_secs(60)
}

fn default_max_header_bytes() -> ByteSize {
    ByteSize::bytes(64 * 1024)
}

fn default_max_connections() -> u32 {
    1024
}

fn default_max_connections_per_client() -> u32 {
    256
}

fn default_collected_output_budget() -> ByteSize {
    ByteSize::bytes(paddock_control::DEFAULT_COLLECT_BUDGET)
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            header_read_timeout: default_header_read_timeout(),
            idle_timeout: default_idle_timeout(),
            request_body_timeout: default_request_body_timeout(),
            max_header_bytes: default_max_header_bytes(),
            max_connections: default_max_connections(),
            max_connections_per_client: default_max_connections_per_client(),
            collected_output_budget: default_collected_output_budget(),
            tls_cert: None,
            tls_key: None,
        }
    }
}

impl HttpSettings {
    /// Checks the ranges; the error names the key.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            anyhow::bail!("http.tls_cert and http.tls_key: give both (HTTPS) or neither (plain HTTP)");
        }
        for (key, value) in [
            ("header_read_timeout", self.header_read_timeout),
            ("idle_timeout", self.idle_timeout),
            ("request_body_timeout", self.request_body_timeout),
        ] {
            if value.is_zero() || value > MAX_TIMEOUT {
                anyhow::bail!(
                    "http.{key}: must be between 1ms and {}, got {}",
                    humantime::format_duration(MAX_TIMEOUT),
                    humantime::format_duration(value)
                );
            }
        }
        let header = self.max_header_bytes.as_u64();
        if !(MIN_HEADER_BYTES..=MAX_HEADER_BYTES).contains(&header) {
            anyhow::bail!(
                "http.max_header_bytes: must be between {} and {}, got {}",
                ByteSize::bytes(MIN_HEADER_BYTES),
                ByteSize::bytes(MAX_HEADER_BYTES),
                self.max_header_bytes
            );
        }
        if self.collected_output_budget.as_u64() < MIN_COLLECTED_OUTPUT_BUDGET {
            anyhow::bail!(
                "http.collected_output_budget: must be at least {}, got {}",
                ByteSize::bytes(MIN_COLLECTED_OUTPUT_BUDGET),
                self.collected_output_budget
            );
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.max_connections) {
            anyhow::bail!(
                "http.max_connections: must be between 1 and {MAX_CONNECTIONS}, got {}",
                self.max_connections
            );
        }
        if !(1..=self.max_connections).contains(&self.max_connections_per_client) {
            anyhow::bail!(
                "http.max_connections_per_client: must be between 1 and max_connections ({}), got {}",
                self.max_connections,
                self.max_connections_per_client
            );
        }
        Ok(())
    }

    /// Descriptors the API may need: one per connection plus [`API_FD_OVERHEAD`]. The open-file
    /// limit must leave at least this much beyond what the egress proxy may hold.
    pub fn api_fd_reserve(&self) -> u64 {
        u64::from(self.max_connections) + API_FD_OVERHEAD
    }
}

/// Serde of a size written as `64K` (a number of bytes is accepted too).
mod size {
    use paddock_types::ByteSize;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::super::Size;

    pub fn serialize<S: Serializer>(b: &ByteSize, s: S) -> Result<S::Ok, S::Error> {
        Size(*b).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ByteSize, D::Error> {
        Size::deserialize(d).map(|s| s.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<HttpSettings, String> {
        toml::from_str::<HttpSettings>(text).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_valid_and_round_trip() {
        let d = parse("").expect("empty section");
        assert_eq!(d, HttpSettings::default());
        d.validate().expect("defaults are valid");
        let text = toml::to_string(&d).expect("renders");
        assert!(text.contains("header_read_timeout = \"10s\""), "{text}");
        assert!(text.contains("max_header_bytes = \"64K\""), "{text}");
        assert_eq!(parse(&text).expect("reloads"), d);
        assert_eq!(d.api_fd_reserve(), 1024 + API_FD_OVERHEAD);
    }

    #[test]
    fn keys_parse() {
        let s = parse(
            "header_read_timeout = \"2s\"\nidle_timeout = 5\nmax_header_bytes = \"16K\"\n\
             max_connections = 10\nmax_connections_per_client = 3\nrequest_body_timeout = \"1m\"\n",
        )
        .expect("parses");
        assert_eq!(s.header_read_timeout, Duration::from_secs(2));
        assert_eq!(s.idle_timeout, Duration::from_secs(5));
        assert_eq!(s.request_body_timeout, Duration::from_secs(60));
        assert_eq!(s.max_header_bytes, ByteSize::bytes(16 * 1024));
        assert_eq!((s.max_connections, s.max_connections_per_client), (10, 3));
        s.validate().expect("valid");
        assert!(parse("max_conections = 3").is_err(), "unknown keys are refused");
    }

    #[test]
    fn out_of_range_values_are_refused_by_name() {
        let bad = [
            ("max_header_bytes = \"1K\"", "http.max_header_bytes"),
            ("max_header_bytes = \"2M\"", "http.max_header_bytes"),
            ("max_connections = 0", "http.max_connections"),
            (
                "max_connections = 10\nmax_connections_per_client = 11",
                "http.max_connections_per_client",
            ),
            (
                "max_connections_per_client = 0",
                "http.max_connections_per_client",
            ),
            ("idle_timeout = \"2h\"", "http.idle_timeout"),
        ];
        for (text, key) in bad {
            let e = parse(text)
                .expect("parses")
                .validate()
                .expect_err(text)
                .to_string();
            assert!(e.starts_with(key), "{text}: {e}");
        }
    }
}

//! Pure translations between E2B's bodies and paddock's: templates, create requests, network
//! lists, sandbox bodies and times. No I/O; unit-tested here.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use paddock_types::api::{CreateSandboxRequest, OnTimeout, SandboxInfo, SandboxStateBody};
use paddock_types::{Cidr, DomainPattern, EgressRule, EgressTarget, NetworkPolicy, SnapshotId};

use super::models::{Lifecycle, NetworkConfig, NewSandbox, SandboxDetail};
use crate::{E2bError, ENVD_VERSION};

/// E2B's name of the default template.
pub const BASE_TEMPLATE: &str = "base";
/// paddock's name of it.
pub const DEFAULT_TEMPLATE: &str = "default";
/// E2B's code interpreter template (the `e2b-code-interpreter` SDKs' default), and paddock's name
/// of the template built from `templates/code-interpreter/Recipe`, which answers for it when the
/// server has no template of E2B's name.
pub const CODE_INTERPRETER_TEMPLATES: (&str, &str) = ("code-interpreter-v1", "code-interpreter");
/// E2B's default sandbox lifetime, in seconds.
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// What E2B calls every destination.
const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// What a `templateID` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateRef {
    /// A template of the server (`None`: the default one).
    Template(Option<String>),
    /// One of the tenant's snapshots.
    Snapshot(SnapshotId),
}

/// Reads a `templateID`: `base` (or paddock's `default`) is the default template, a snapshot id is
/// a snapshot, anything else a template name `known` must list (else E2B's 404).
pub fn template_ref(template_id: &str, known: &[String]) -> Result<TemplateRef, E2bError> {
    let name = template_id.trim();
    // E2B accepts `name:tag`; paddock's templates have no tags, so only the default tag is one.
    let name = name.strip_suffix(":default").unwrap_or(name);
    if name.is_empty() || name == BASE_TEMPLATE || name == DEFAULT_TEMPLATE {
        return Ok(TemplateRef::Template(None));
    }
    if known.iter().any(|k| k == name) {
        return Ok(TemplateRef::Template(Some(name.to_owned())));
    }
    let (e2b_name, paddock_name) = CODE_INTERPRETER_TEMPLATES;
    if name == e2b_name && known.iter().any(|k| k == paddock_name) {
        return Ok(TemplateRef::Template(Some(paddock_name.to_owned())));
    }
    // Anything else may be a snapshot of the tenant's; the service says whether it is.
    name.parse::<SnapshotId>()
        .map(TemplateRef::Snapshot)
        .map_err(|_| template_not_found(name))
}

/// E2B's answer for a template (or snapshot) that does not exist.
pub fn template_not_found(name: &str) -> E2bError {
    E2bError::new(
        axum::http::StatusCode::NOT_FOUND,
        format!("template '{name}' not found"),
    )
}

/// E2B's name of a paddock template (the default one is `base`).
pub fn template_alias(template: &str) -> String {
    if template == DEFAULT_TEMPLATE {
        BASE_TEMPLATE.to_owned()
    } else {
        template.to_owned()
    }
}

/// A create request in paddock's terms. `internet_default` is the server's meaning of
/// `allow_internet_access: true` (see [`crate::E2bConfig::internet_access`]).
pub fn create_request(
    req: &NewSandbox,
    template: TemplateRef,
    internet_default: bool,
) -> Result<CreateSandboxRequest, E2bError> {
    if req.mcp.as_ref().is_some_and(|m| !m.is_null()) {
        return Err(E2bError::bad_request(
            "mcp: E2B's MCP gateway is not offered by paddock",
        ));
    }
    if req.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(E2bError::bad_request(
            "volumeMounts: E2B volumes are not offered; use paddock's named volumes through /v1",
        ));
    }
    let (template, snapshot) = match template {
        TemplateRef::Template(t) => (t, None),
        TemplateRef::Snapshot(s) => (None, Some(s.as_str().to_owned())),
    };
    let timeout = req.timeout.filter(|t| *t > 0).unwrap_or(DEFAULT_TIMEOUT_SECS);
    let network = network_policy(
        req.network.as_ref(),
        req.allow_internet_access
            .or_else(|| req.network.as_ref().and_then(|n| n.allow_internet_access)),
        internet_default,
    )?;
    Ok(CreateSandboxRequest {
        template,
        snapshot,
        env: req.env_vars.clone().unwrap_or_default(),
        labels: req.metadata.clone().unwrap_or_default(),
        timeout_secs: Some(timeout),
        on_timeout: req.auto_pause.unwrap_or(false).then_some(OnTimeout::Pause),
        network,
        // E2B's user ports are public unless the sandbox asks otherwise.
        public_ports: req
            .network
            .as_ref()
            .and_then(|n| n.allow_public_traffic)
            .unwrap_or(true),
        ..CreateSandboxRequest::default()
    })
}

/// E2B's egress settings as a paddock policy; `None` is no network at all (loopback only).
///
/// E2B's rule: a destination in `allowOut` passes even when `denyOut` covers it; else one in
/// `denyOut` is refused; else the internet switch decides. paddock's policy refuses what a deny
/// rule covers whatever the allow rules say, so the two meet like this:
/// - internet closed (switch off, or `denyOut` holding `0.0.0.0/0`): allow `allowOut`, deny nothing;
/// - internet open: allow every destination (`0.0.0.0/0` and every name), deny `denyOut`; an
///   `allowOut` entry is then only accepted when no `denyOut` entry could cover it (a narrower
///   exception inside a denied range cannot be expressed and is refused rather than dropped).
///
/// The switch (`allow_internet_access`, E2B's default `true`) opens the internet only when the
/// server allows that (`internet_default`); explicit `allowOut` entries always apply.
pub fn network_policy(
    net: Option<&NetworkConfig>,
    internet_switch: Option<bool>,
    internet_default: bool,
) -> Result<Option<NetworkPolicy>, E2bError> {
    let allow_out = net.and_then(|n| n.allow_out.clone()).unwrap_or_default();
    let deny_out = net.and_then(|n| n.deny_out.clone()).unwrap_or_default();
    let deny_all = deny_out.iter().any(|d| d.trim() == ALL_TRAFFIC);
    let internet = internet_switch.unwrap_or(true) && internet_default && !deny_all;
    if !internet {
        if allow_out.is_empty() && deny_out.is_empty() && net.is_none() {
            return Ok(None);
        }
        let allow = allow_out
            .iter()
            .map(|a| rule("allowOut", a))
            .collect::<Result<Vec<_>, _>>()?;
        return NetworkPolicy::new(allow, Vec::new())
            .map(Some)
            .map_err(|e| E2bError::bad_request(format!("network: {e}")));
    }
    if !allow_out.is_empty() && !deny_out.is_empty() {
        return Err(E2bError::bad_request(
            "network: allowOut entries as exceptions inside denyOut are only supported with denyOut \
             holding 0.0.0.0/0 (allow only the listed destinations)",
        ));
    }
    let all = vec![
        EgressRule::new(
            EgressTarget::Cidr(ALL_TRAFFIC.parse().map_err(internal)?),
            Vec::new(),
        ),
        EgressRule::new(EgressTarget::Domain(DomainPattern::Any), Vec::new()),
    ];
    let deny = deny_out
        .iter()
        .map(|d| rule("denyOut", d))
        .collect::<Result<Vec<_>, _>>()?;
    NetworkPolicy::new(all, deny)
        .map(Some)
        .map_err(|e| E2bError::bad_request(format!("network: {e}")))
}

fn internal(e: impl std::fmt::Display) -> E2bError {
    E2bError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// One `allowOut`/`denyOut` entry: an address or CIDR, else a domain name or `*.suffix` pattern.
fn rule(field: &str, entry: &str) -> Result<EgressRule, E2bError> {
    let entry = entry.trim();
    if let Ok(cidr) = entry.parse::<Cidr>() {
        return Ok(EgressRule::new(EgressTarget::Cidr(cidr), Vec::new()));
    }
    entry
        .parse::<DomainPattern>()
        .map(|d| EgressRule::new(EgressTarget::Domain(d), Vec::new()))
        .map_err(|e| {
            E2bError::bad_request(format!(
                "network.{field}: {entry:?} is neither an address, a CIDR nor a domain name: {e}"
            ))
        })
}

/// A sandbox as `GET /sandboxes/{id}` and the list show it. `detail` adds the details' extras.
pub fn detail(
    info: &SandboxInfo,
    host_cpus: u32,
    envd_token: Option<String>,
    domain: Option<String>,
) -> SandboxDetail {
    let mib = |b: Option<u64>| b.map(|b| b >> 20).unwrap_or(0);
    let cpu_count = info
        .limits
        .cpus
        .map(|c| f64::from(c).ceil() as u32)
        .unwrap_or(host_cpus)
        .max(1);
    let on_timeout = match info.on_timeout {
        OnTimeout::Kill => "kill",
        OnTimeout::Pause | OnTimeout::Stop => "pause",
    };
    let lifecycle = envd_token.is_some().then_some(Lifecycle {
        auto_resume: false,
        on_timeout,
    });
    SandboxDetail {
        template_id: template_alias(&info.template),
        alias: template_alias(&info.template),
        sandbox_id: info.id.clone(),
        client_id: "paddock",
        started_at: info.created_at.clone(),
        end_at: info
            .expires_at
            .clone()
            .or_else(|| info.ended_at.clone())
            .unwrap_or_else(|| info.created_at.clone()),
        cpu_count,
        memory_mb: mib(info.limits.memory.map(|m| m.as_u64())),
        disk_size_mb: mib(info.limits.disk.map(|d| d.as_u64())),
        state: e2b_state(info),
        envd_version: ENVD_VERSION,
        metadata: info.labels.clone(),
        envd_access_token: envd_token,
        domain,
        lifecycle,
    }
}

/// `running` or `paused` (paddock's paused and stopped sandboxes both resume on connect).
pub fn e2b_state(info: &SandboxInfo) -> &'static str {
    if info.paused || info.state == SandboxStateBody::Stopped {
        "paused"
    } else {
        "running"
    }
}

/// Parses RFC 3339 with `Z` or a numeric offset (`2026-12-04T10:00:00.5+01:00`).
pub fn parse_time(text: &str) -> Option<SystemTime> {
    let text = text.trim();
    let (base, offset_secs) = if let Some(base) = text.strip_suffix('Z').or_else(|| text.strip_suffix('z')) {
        (base.to_owned(), 0i64)
    } else {
        let split = text.len().checked_sub(6)?;
        let (base, off) = text.split_at(split);
        let sign = match off.as_bytes().first()? {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let (h, m) = off[1..].split_once(':')?;
        let secs = h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60;
        (base.to_owned(), sign * secs)
    };
    let utc = humantime::parse_rfc3339_weak(&base).ok()?;
    if offset_secs >= 0 {
        utc.checked_sub(Duration::from_secs(offset_secs.unsigned_abs()))
    } else {
        utc.checked_add(Duration::from_secs(offset_secs.unsigned_abs()))
    }
}

/// Seconds since the Unix epoch.
pub fn unix_secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Nanoseconds since the Unix epoch (an order key).
pub fn unix_nanos(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// Decodes `GET /v2/sandboxes?metadata=...`: the SDKs percent-encode each key and value
/// (`quote`), join them as a query string (`urlencode`, which encodes them again) and send that as
/// one parameter (encoded a third time). The query layer has undone the outer encoding; this parses
/// the query string (the second) and percent-decodes each key and value (the first).
pub fn metadata_filter(param: &str) -> BTreeMap<String, String> {
    form_urlencoded::parse(param.as_bytes())
        .map(|(k, v)| (percent_decode(&k), percent_decode(&v)))
        .collect()
}

/// `%XX` sequences decoded (`+` kept: `quote` never writes one for a space); invalid UTF-8 is
/// replaced, and a `%` not followed by two hex digits is kept as it is.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(allow: &[&str], deny: &[&str]) -> NetworkConfig {
        NetworkConfig {
            allow_out: Some(allow.iter().map(|s| s.to_string()).collect()),
            deny_out: Some(deny.iter().map(|s| s.to_string()).collect()),
            ..NetworkConfig::default()
        }
    }

    #[test]
    fn templates_by_name() {
        let known = vec!["python".to_owned()];
        assert_eq!(
            template_ref("base", &known).expect("ok"),
            TemplateRef::Template(None)
        );
        assert_eq!(
            template_ref("base:default", &known).expect("ok"),
            TemplateRef::Template(None)
        );
        assert_eq!(
            template_ref("python", &known).expect("ok"),
            TemplateRef::Template(Some("python".into()))
        );
        assert!(matches!(
            template_ref("sn-00000000000000ff", &known).expect("ok"),
            TemplateRef::Snapshot(_)
        ));
        // E2B's code interpreter template is paddock's `code-interpreter`, unless the server has
        // one of E2B's name.
        assert!(!matches!(
            template_ref("code-interpreter-v1", &known),
            Ok(TemplateRef::Template(_))
        ));
        let with = vec!["code-interpreter".to_owned()];
        assert_eq!(
            template_ref("code-interpreter-v1", &with).expect("ok"),
            TemplateRef::Template(Some("code-interpreter".into()))
        );
        let both = vec!["code-interpreter".to_owned(), "code-interpreter-v1".to_owned()];
        assert_eq!(
            template_ref("code-interpreter-v1", &both).expect("ok"),
            TemplateRef::Template(Some("code-interpreter-v1".into()))
        );
        let e = template_ref("Not A Name", &known).expect_err("an error");
        assert_eq!(e.status, 404);
        assert!(e.message.contains("'Not A Name'"));
    }

    #[test]
    fn the_internet_switch_only_opens_what_the_server_allows() {
        // Old SDKs send allow_internet_access: true on every create.
        assert_eq!(network_policy(None, Some(true), false).expect("ok"), None);
        assert_eq!(network_policy(None, None, false).expect("ok"), None);
        let open = network_policy(None, Some(true), true).expect("ok").expect("ok");
        assert_eq!(open.allow().len(), 2);
        assert!(open.deny().is_empty());
        assert_eq!(network_policy(None, Some(false), true).expect("ok"), None);
    }

    #[test]
    fn allow_lists_deny_lists_and_their_precedence() {
        // deny all + allow some = only those.
        let only = network_policy(Some(&net(&["1.1.1.1", "pypi.org"], &["0.0.0.0/0"])), None, true)
            .expect("ok")
            .expect("ok");
        assert_eq!(only.allow().len(), 2);
        assert!(only.deny().is_empty());
        // Internet closed by the server: allowOut still applies.
        let closed = network_policy(Some(&net(&["*.example.com"], &[])), Some(true), false)
            .expect("ok")
            .expect("ok");
        assert_eq!(closed.allow().len(), 1);
        // Internet open with a deny list.
        let open = network_policy(Some(&net(&[], &["10.0.0.0/8"])), None, true)
            .expect("ok")
            .expect("ok");
        assert_eq!(open.deny().len(), 1);
        // An exception inside a denied range cannot be expressed: refused, not dropped.
        assert!(network_policy(Some(&net(&["10.1.1.1"], &["10.0.0.0/8"])), None, true).is_err());
        // Garbage is named.
        let e = network_policy(Some(&net(&["not a host!"], &[])), None, false).expect_err("an error");
        assert!(e.message.contains("allowOut"), "{}", e.message);
    }

    #[test]
    fn times_with_offsets() {
        let z = parse_time("2026-12-04T10:00:00Z").expect("ok");
        assert_eq!(parse_time("2026-12-04T11:00:00+01:00").expect("ok"), z);
        assert_eq!(parse_time("2026-12-04T09:30:00-00:30").expect("ok"), z);
        assert!(parse_time("2026-12-04T10:00:00.250000+00:00").is_some());
        assert!(parse_time("yesterday").is_none());
    }

    #[test]
    fn metadata_filters_are_decoded_twice() {
        // Python's urlencode({quote(k): quote(v)}) for {"k": "v w", "a&b": "c=d"}, as the query
        // layer hands it over.
        let m = metadata_filter("k=v%2520w&a%2526b=c%253Dd");
        assert_eq!(m.get("k").map(String::as_str), Some("v w"));
        assert_eq!(m.get("a&b").map(String::as_str), Some("c=d"));
    }
}

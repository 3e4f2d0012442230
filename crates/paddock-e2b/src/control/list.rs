//! `GET /v2/sandboxes` (and the older `GET /sandboxes`): the tenant's running, paused and stopped
//! sandboxes, filtered by E2B's metadata, state, template and start time, newest first by default,
//! paged with `X-Next-Token`.
//!
//! The service lists by id; E2B's order (by start time, either way) and its filters are applied
//! here over the tenant's live and stopped sandboxes, which its sandbox quota bounds. The token is
//! the last entry's start time and id, so a page never repeats or skips an entry that existed when
//! the first page was read.

use std::collections::BTreeMap;

use axum::extract::{Query, State};
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use paddock_types::api::{ListSandboxesQuery, SandboxInfo};
use serde::Deserialize;

use super::extract::Caller;
use super::translate::{self, parse_time};
use crate::{E2bError, E2bState};
use paddock_control::host_cpus;

/// The most sandboxes one list request reads from the service (beyond it: an error, never a
/// silently short list).
const MAX_SCAN: usize = 100_000;
/// A page of E2B's list holds at most this many.
const MAX_PAGE: usize = 100;

/// The list's query.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListQuery {
    #[serde(default)]
    metadata: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    order: Option<String>,
    #[serde(default)]
    started_after: Option<String>,
    #[serde(default)]
    template: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    next_token: Option<String>,
}

/// `GET /v2/sandboxes`.
pub(super) async fn list_v2(
    State(state): State<E2bState>,
    Caller(p): Caller,
    Query(q): Query<ListQuery>,
) -> Result<Response, E2bError> {
    let all = scan(&state, &p).await?;
    let (page, next) = select(all, &q, MAX_PAGE)?;
    let items: Vec<_> = page
        .iter()
        .map(|info| translate::detail(info, host_cpus(), None, None))
        .collect();
    let mut resp = Json(items).into_response();
    if let Some(token) = next {
        if let Ok(v) = HeaderValue::from_str(&token) {
            resp.headers_mut()
                .insert(HeaderName::from_static("x-next-token"), v);
        }
    }
    Ok(resp)
}

/// `GET /sandboxes` (older SDKs): the running ones, no paging.
pub(super) async fn list_v1(State(state): State<E2bState>, Caller(p): Caller) -> Result<Response, E2bError> {
    let all = scan(&state, &p).await?;
    let q = ListQuery {
        state: Some("running".into()),
        ..ListQuery::default()
    };
    let (page, _) = select(all, &q, usize::MAX)?;
    let items: Vec<_> = page
        .iter()
        .map(|info| translate::detail(info, host_cpus(), None, None))
        .collect();
    Ok(Json(items).into_response())
}

/// The tenant's running (paused included) and stopped sandboxes.
async fn scan(state: &E2bState, p: &paddock_control::Principal) -> Result<Vec<SandboxInfo>, E2bError> {
    let mut out = Vec::new();
    for which in ["running", "stopped"] {
        let mut cursor = None;
        loop {
            let page = state
                .service
                .list_sandboxes(
                    p,
                    ListSandboxesQuery {
                        state: Some(which.to_owned()),
                        label: None,
                        limit: Some(1000),
                        cursor: cursor.take(),
                    },
                )
                .await?;
            out.extend(page.sandboxes);
            if out.len() > MAX_SCAN {
                return Err(E2bError::bad_request(format!(
                    "more than {MAX_SCAN} sandboxes to list; use /v1/sandboxes with its cursor"
                )));
            }
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
    }
    Ok(out)
}

/// Filters, orders and pages (pure).
fn select(
    mut all: Vec<SandboxInfo>,
    q: &ListQuery,
    max_page: usize,
) -> Result<(Vec<SandboxInfo>, Option<String>), E2bError> {
    let metadata: BTreeMap<String, String> = q
        .metadata
        .as_deref()
        .map(translate::metadata_filter)
        .unwrap_or_default();
    let states: Vec<String> = q
        .state
        .as_deref()
        .map(|s| {
            s.split(',')
                .map(|x| x.trim().to_owned())
                .filter(|x| !x.is_empty())
                .collect()
        })
        .unwrap_or_else(|| vec!["running".into(), "paused".into()]);
    for s in &states {
        if s != "running" && s != "paused" {
            return Err(E2bError::bad_request(format!(
                "state: unknown state {s:?} (running or paused)"
            )));
        }
    }
    let desc = match q.order.as_deref() {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(o) => {
            return Err(E2bError::bad_request(format!(
                "order: {o:?} is neither asc nor desc"
            )))
        }
    };
    let after =
        match &q.started_after {
            None => None,
            Some(t) => Some(parse_time(t).ok_or_else(|| {
                E2bError::bad_request(format!("startedAfter: {t:?} is not an RFC 3339 time"))
            })?),
        };
    let limit = q.limit.unwrap_or(max_page).min(max_page);
    if limit == 0 {
        return Err(E2bError::bad_request("limit: at least 1"));
    }
    let cursor = match &q.next_token {
        None => None,
        Some(t) if t.is_empty() => None,
        Some(t) => Some(
            decode_token(t)
                .ok_or_else(|| E2bError::bad_request("nextToken: not a token this server gave"))?,
        ),
    };
    all.retain(|info| {
        super::sandboxes::is_alive(info)
            && states.iter().any(|s| s == translate::e2b_state(info))
            && metadata.iter().all(|(k, v)| info.labels.get(k) == Some(v))
            && q.template
                .as_deref()
                .is_none_or(|t| translate::template_alias(&info.template) == t || info.template == t)
            && after.is_none_or(|a| parse_time(&info.created_at).is_some_and(|c| c >= a))
    });
    let key = |i: &SandboxInfo| {
        (
            parse_time(&i.created_at).map(translate::unix_nanos).unwrap_or(0),
            i.id.clone(),
        )
    };
    all.sort_by_key(key);
    if desc {
        all.reverse();
    }
    if let Some(c) = cursor {
        all.retain(|i| if desc { key(i) < c } else { key(i) > c });
    }
    let next = (all.len() > limit).then(|| encode_token(&key(&all[limit - 1])));
    all.truncate(limit);
    Ok((all, next))
}

fn encode_token(key: &(u128, String)) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{}|{}", key.0, key.1))
}

fn decode_token(token: &str) -> Option<(u128, String)> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (nanos, id) = text.split_once('|')?;
    Some((nanos.parse().ok()?, id.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_types::api::{OnTimeout, SandboxStateBody};
    use paddock_types::Limits;

    fn sb(id: &str, created: &str, labels: &[(&str, &str)], paused: bool) -> SandboxInfo {
        SandboxInfo {
            id: id.into(),
            tenant: "t".into(),
            state: SandboxStateBody::Running,
            template: "default".into(),
            limits: Limits::unbounded(),
            env_keys: vec![],
            workdir: None,
            user: "user".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            created_at: created.into(),
            expires_at: None,
            ended_at: None,
            end_reason: None,
            paused,
            on_timeout: OnTimeout::Kill,
            audit_exec_diff: false,
            public_ports: false,
            volumes: vec![],
        }
    }

    fn ids(v: &[SandboxInfo]) -> Vec<&str> {
        v.iter().map(|i| i.id.as_str()).collect()
    }

    #[test]
    fn newest_first_across_pages_with_filters() {
        let all = vec![
            sb("sb-a", "2026-12-04T10:00:00Z", &[("k", "v")], false),
            sb("sb-b", "2026-12-04T10:00:01Z", &[("k", "v")], true),
            sb("sb-c", "2026-12-04T10:00:02Z", &[("k", "w")], false),
            sb("sb-d", "2026-12-04T10:00:03Z", &[("k", "v")], false),
        ];
        let q = ListQuery {
            limit: Some(2),
            ..ListQuery::default()
        };
        let (p1, next) = select(all.clone(), &q, MAX_PAGE).expect("ok");
        assert_eq!(ids(&p1), ["sb-d", "sb-c"]);
        let q2 = ListQuery {
            limit: Some(2),
            next_token: next,
            ..ListQuery::default()
        };
        let (p2, next2) = select(all.clone(), &q2, MAX_PAGE).expect("ok");
        assert_eq!(ids(&p2), ["sb-b", "sb-a"]);
        assert_eq!(next2, None);
        let q = ListQuery {
            metadata: Some("k=v".into()),
            state: Some("running".into()),
            ..ListQuery::default()
        };
        assert_eq!(
            ids(&select(all.clone(), &q, MAX_PAGE).expect("ok").0),
            ["sb-d", "sb-a"]
        );
        let q = ListQuery {
            state: Some("paused".into()),
            order: Some("asc".into()),
            ..ListQuery::default()
        };
        assert_eq!(ids(&select(all.clone(), &q, MAX_PAGE).expect("ok").0), ["sb-b"]);
        let q = ListQuery {
            started_after: Some("2026-12-04T11:00:01.5+01:00".into()),
            order: Some("asc".into()),
            ..ListQuery::default()
        };
        assert_eq!(
            ids(&select(all.clone(), &q, MAX_PAGE).expect("ok").0),
            ["sb-c", "sb-d"]
        );
        let bad = ListQuery {
            next_token: Some("garbage!".into()),
            ..ListQuery::default()
        };
        assert!(select(all, &bad, MAX_PAGE).is_err());
    }
}

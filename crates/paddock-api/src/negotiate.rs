//! `Accept` negotiation for the endpoints that stream events: NDJSON (the default), Server-Sent Events,
//! or one JSON document once the process has ended.

use axum::http::{header, HeaderMap};

/// How a stream of events is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFormat {
    /// `application/x-ndjson`: one JSON object per line, each flushed as it is produced.
    Ndjson,
    /// `text/event-stream`: `event: <type>` and `data: <json>` per event.
    Sse,
    /// `application/json`: one document at the end (collected).
    Json,
}

impl StreamFormat {
    /// The media type.
    pub fn media_type(self) -> &'static str {
        match self {
            Self::Ndjson => "application/x-ndjson",
            Self::Sse => "text/event-stream",
            Self::Json => "application/json",
        }
    }
}

/// Picks one of `offered` (in the server's order of preference) for the request's `Accept` header:
/// the one with the highest `q`, then the most specific match (`type/sub` over `type/*` over `*/*`),
/// then the client's order, then the server's. A missing or empty header, or one that accepts none of
/// them, gets the first offered (the server answers rather than failing with 406).
pub fn negotiate(headers: &HeaderMap, offered: &[StreamFormat]) -> StreamFormat {
    let fallback = offered.first().copied().unwrap_or(StreamFormat::Ndjson);
    let ranges: Vec<MediaRange<'_>> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(MediaRange::parse)
        .collect();
    if ranges.is_empty() {
        return fallback;
    }
    // (q in thousandths, specificity, -client index, -server index): higher is better.
    let mut best: Option<((u16, u8, isize, isize), StreamFormat)> = None;
    for (server_index, &format) in offered.iter().enumerate() {
        let (kind, subtype) = format
            .media_type()
            .split_once('/')
            .unwrap_or((format.media_type(), ""));
        let matched = ranges
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.specificity(kind, subtype).map(|s| (s, i, r.q)))
            // The most specific range decides the q of this format (RFC 9110 §12.5.1).
            .max_by_key(|&(s, i, _)| (s, -(i as isize)));
        let Some((specificity, client_index, q)) = matched else {
            continue;
        };
        if q == 0 {
            continue;
        }
        let key = (q, specificity, -(client_index as isize), -(server_index as isize));
        if best.is_none_or(|(k, _)| key > k) {
            best = Some((key, format));
        }
    }
    best.map_or(fallback, |(_, f)| f)
}

/// One element of an `Accept` header.
struct MediaRange<'a> {
    kind: &'a str,
    subtype: &'a str,
    /// Quality in thousandths (RFC 9110 allows three decimals).
    q: u16,
}

impl<'a> MediaRange<'a> {
    fn parse(text: &'a str) -> Option<Self> {
        let mut parts = text.split(';');
        let (kind, subtype) = parts.next()?.trim().split_once('/')?;
        let (kind, subtype) = (kind.trim(), subtype.trim());
        if kind.is_empty() || subtype.is_empty() {
            return None;
        }
        let mut q = 1000;
        for param in parts {
            if let Some((name, value)) = param.split_once('=') {
                if name.trim().eq_ignore_ascii_case("q") {
                    q = parse_q(value.trim())?;
                }
            }
        }
        Some(Self { kind, subtype, q })
    }

    /// How specifically this range matches `kind/subtype`: 2 exact, 1 `kind/*`, 0 `*/*`.
    fn specificity(&self, kind: &str, subtype: &str) -> Option<u8> {
        if self.kind == "*" {
            return (self.subtype == "*").then_some(0);
        }
        if !self.kind.eq_ignore_ascii_case(kind) {
            return None;
        }
        if self.subtype == "*" {
            return Some(1);
        }
        self.subtype.eq_ignore_ascii_case(subtype).then_some(2)
    }
}

fn parse_q(value: &str) -> Option<u16> {
    let (int, frac) = value.split_once('.').unwrap_or((value, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac_value = format!("{frac:0<3}").parse::<u16>().ok()?;
    match int {
        "0" => Some(frac_value),
        "1" if frac_value == 0 => Some(1000),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;
    use StreamFormat::{Json, Ndjson, Sse};

    const EXEC: &[StreamFormat] = &[Ndjson, Sse, Json];

    fn pick(accept: &[&str]) -> StreamFormat {
        let mut h = HeaderMap::new();
        for a in accept {
            h.append(header::ACCEPT, HeaderValue::from_str(a).expect("header"));
        }
        negotiate(&h, EXEC)
    }

    #[test]
    fn defaults_to_ndjson() {
        assert_eq!(pick(&[]), Ndjson);
        assert_eq!(pick(&[""]), Ndjson);
        assert_eq!(pick(&["*/*"]), Ndjson);
        assert_eq!(pick(&["application/*"]), Ndjson);
        assert_eq!(pick(&["text/html"]), Ndjson, "nothing acceptable: still answer");
        assert_eq!(pick(&["garbage"]), Ndjson);
    }

    #[test]
    fn exact_types() {
        assert_eq!(pick(&["application/x-ndjson"]), Ndjson);
        assert_eq!(pick(&["text/event-stream"]), Sse);
        assert_eq!(pick(&["application/json"]), Json);
        assert_eq!(pick(&["Application/JSON; charset=utf-8"]), Json);
        assert_eq!(pick(&["text/*"]), Sse);
    }

    #[test]
    fn quality_and_specificity() {
        assert_eq!(pick(&["application/json, */*;q=0.1"]), Json);
        assert_eq!(pick(&["application/json;q=0.5, text/event-stream"]), Sse);
        assert_eq!(pick(&["*/*, application/x-ndjson;q=0"]), Sse, "q=0 excludes");
        assert_eq!(pick(&["application/json;q=0.9", "text/event-stream;q=0.95"]), Sse);
        assert_eq!(pick(&["application/*;q=0.2, application/json"]), Json);
        // Same q: the client's order, then the server's.
        assert_eq!(pick(&["text/event-stream, application/json"]), Sse);
        assert_eq!(pick(&["application/json, text/event-stream"]), Json);
        // A bad q makes the range unusable rather than maximal.
        assert_eq!(pick(&["application/json;q=2"]), Ndjson);
        assert_eq!(pick(&["application/json;q=0.0001"]), Ndjson);
    }

    #[test]
    fn q_values() {
        assert_eq!(parse_q("1"), Some(1000));
        assert_eq!(parse_q("1.000"), Some(1000));
        assert_eq!(parse_q("0.5"), Some(500));
        assert_eq!(parse_q("0.05"), Some(50));
        assert_eq!(parse_q("0"), Some(0));
        assert_eq!(parse_q("1.5"), None);
        assert_eq!(parse_q("x"), None);
    }

    #[test]
    fn watch_offers_no_json() {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        assert_eq!(negotiate(&h, &[Ndjson, Sse]), Ndjson);
    }
}

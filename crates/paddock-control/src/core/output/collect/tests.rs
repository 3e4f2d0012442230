//! The collector against serde_json and `String::from_utf8_lossy`: same text, same escapes, cut only
//! at whole characters and escapes, never more held than the caps allow.

use paddock_types::api::ExecResult;
use proptest::prelude::*;

use super::*;

/// What serde_json makes of the lossy text of `bytes`, without the quotes.
fn expected(bytes: &[u8]) -> Vec<u8> {
    let json = serde_json::to_vec(&String::from_utf8_lossy(bytes)).expect("serializes");
    json[1..json.len() - 1].to_vec()
}

fn collect(chunks: &[&[u8]], cap: usize, budget: &OutputBudget) -> (JsonText, Held) {
    let mut held = budget.claim("t");
    let mut text = JsonText::default();
    for c in chunks {
        text.push(c, cap, &mut held);
    }
    text.finish(cap, &mut held);
    (text, held)
}

/// Bytes rich in what matters here: controls, quotes, backslashes, multi-byte and broken UTF-8.
fn tricky_bytes() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        Just(0u8),
        Just(b'"'),
        Just(b'\\'),
        Just(b'\n'),
        0x01u8..0x20,
        0x20u8..0x7f,
        0x80u8..=0xff,
    ];
    let piece = prop_oneof![
        proptest::collection::vec(byte, 0..4),
        Just("é".as_bytes().to_vec()),
        Just("€".as_bytes().to_vec()),
        Just("😀".as_bytes().to_vec()),
        Just(vec![0xe2, 0x82]),
        Just(vec![0xf0, 0x9f, 0x98]),
    ];
    proptest::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

/// `bytes` cut at the (sorted, deduplicated) positions `cuts`.
fn split<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.sort_unstable();
    points.dedup();
    let mut out = Vec::new();
    let mut start = 0;
    for p in points {
        out.push(&bytes[start..p]);
        start = p;
    }
    out.push(&bytes[start..]);
    out
}

proptest! {
    #[test]
    fn chunked_text_is_escaped_exactly_as_serde_json_does(
        bytes in tricky_bytes(),
        cuts in proptest::collection::vec(0usize..1000, 0..8),
    ) {
        let budget = OutputBudget::new(u64::MAX);
        let (text, _held) = collect(&split(&bytes, &cuts), usize::MAX, &budget);
        prop_assert!(!text.truncated());
        prop_assert_eq!(text.as_json_content(), &expected(&bytes)[..]);
    }

    #[test]
    fn a_cut_is_a_valid_prefix_within_the_cap(
        bytes in tricky_bytes(),
        cuts in proptest::collection::vec(0usize..1000, 0..8),
        cap in 0usize..200,
    ) {
        let budget = OutputBudget::new(u64::MAX);
        let (text, _held) = collect(&split(&bytes, &cuts), cap, &budget);
        let full = expected(&bytes);
        let got = text.as_json_content();
        prop_assert!(got.len() <= cap);
        prop_assert!(full.starts_with(got));
        prop_assert_eq!(text.truncated(), got.len() < full.len());
        // Cut between characters and escapes: still the content of a valid JSON string.
        let literal = [b"\"".as_slice(), got, b"\""].concat();
        prop_assert!(serde_json::from_slice::<String>(&literal).is_ok(), "{:?}", String::from_utf8_lossy(got));
    }

    #[test]
    fn never_more_is_held_than_the_budget(
        bytes in proptest::collection::vec(any::<u8>(), 0..5000),
        limit in 0u64..80_000,
    ) {
        let budget = OutputBudget::new(limit);
        let (text, held) = collect(&[&bytes], usize::MAX, &budget);
        prop_assert!(budget.held() <= limit / TENANT_SHARE);
        // What is held pays for the buffer's capacity.
        prop_assert!(text.json.capacity() as u64 <= held.bytes || text.json.capacity() == 0);
        prop_assert!(expected(&bytes).starts_with(text.as_json_content()));
        drop(held);
        prop_assert_eq!(budget.held(), 0);
    }
}

#[test]
fn one_tenant_holds_at_most_its_share_and_others_keep_theirs() {
    let budget = OutputBudget::new(4 * 1024 * 1024);
    let chunk = vec![b'x'; 64 * 1024];
    let fill = |tenant: &str| {
        let mut held = budget.claim(tenant);
        let mut text = JsonText::default();
        for _ in 0..64 {
            text.push(&chunk, COLLECT_LIMIT, &mut held);
        }
        (text, held)
    };
    // A tenant whose answers are never read keeps its claims: it gets a quarter, then nothing.
    let (a1, a1_held) = fill("greedy");
    assert!(a1.truncated() && a1.json.len() <= 1024 * 1024);
    let (a2, a2_held) = fill("greedy");
    assert!(a2.truncated() && a2.json.is_empty(), "{}", a2.json.len());
    // Another tenant still gets its own share.
    let (b, b_held) = fill("other");
    assert!(b.json.len() >= 1024 * 1024 - FIRST_CAPACITY, "{}", b.json.len());
    assert!(budget.held() <= 2 * 1024 * 1024);
    drop((a1_held, a2_held, b_held));
    assert_eq!(budget.held(), 0);
    assert!(budget.inner.lock().by_tenant.is_empty());
}

#[test]
fn the_document_is_what_serde_json_writes() {
    let budget = OutputBudget::new(u64::MAX);
    let mut held = budget.claim("t");
    let (mut out, mut err) = (JsonText::default(), JsonText::default());
    out.push(b"hello \"world\"\n\x00", usize::MAX, &mut held);
    err.push(&[0xff, b'x'], 3, &mut held);
    let exit = ExitInfo {
        exit_code: 3,
        signal: None,
        timed_out: false,
        duration_ms: 5,
        cpu_time_us: 10,
        max_rss_kib: 1024,
    };
    let collected = CollectedOutput::new(7, out, err, Some(exit), held);
    let result = collected.to_result();
    assert!(!result.stdout_truncated && result.stderr_truncated, "{result:?}");
    assert_eq!(result.stdout.as_deref(), Some("hello \"world\"\n\0"));
    assert_eq!(result.stderr.as_deref(), Some("\u{fffd}"));
    let (pieces, _held) = collected.into_json();
    let written = pieces.concat();
    assert_eq!(
        String::from_utf8(written).expect("utf-8"),
        serde_json::to_string(&result).expect("serializes")
    );
    let background = CollectedOutput::background(9);
    assert_eq!(
        pieces_text(background.into_json().0),
        serde_json::to_string(&background_result(9)).expect("serializes")
    );
}

fn pieces_text(pieces: Vec<Bytes>) -> String {
    String::from_utf8(pieces.concat()).expect("utf-8")
}

fn background_result(pid: u32) -> ExecResult {
    ExecResult {
        pid,
        stdout: None,
        stdout_truncated: false,
        stderr: None,
        stderr_truncated: false,
        exit: None,
    }
}

/// The probe: 17 MB of NULs is 102 MB once escaped; the collector keeps 16 MiB of it.
#[test]
fn seventeen_megabytes_of_nuls_hold_sixteen_mebibytes() {
    let budget = OutputBudget::new(u64::MAX);
    let mut held = budget.claim("t");
    let mut text = JsonText::default();
    let chunk = vec![0u8; 32 * 1024];
    for _ in 0..(17_000_000 / chunk.len() + 1) {
        text.push(&chunk, COLLECT_LIMIT, &mut held);
    }
    assert!(text.truncated());
    assert!(text.json.len() <= COLLECT_LIMIT);
    assert_eq!(text.json.len() % 6, 0, "cut between escapes");
    assert!(budget.held() <= COLLECT_LIMIT as u64, "{} held", budget.held());
}

//! The accept loop's pieces without a server: error classes, back-off, per-client slots. The loop
//! itself is tried against a real server in `tests/e2e/api/listener.rs`.

use super::*;

fn os(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

#[test]
fn accept_errors_are_classified() {
    assert_eq!(classify(&os(libc::EMFILE)), AcceptFailure::Exhausted);
    assert_eq!(classify(&os(libc::ENFILE)), AcceptFailure::Exhausted);
    assert_eq!(classify(&os(libc::ENOBUFS)), AcceptFailure::Exhausted);
    assert_eq!(classify(&os(libc::ECONNABORTED)), AcceptFailure::Connection);
    assert_eq!(classify(&os(libc::EINVAL)), AcceptFailure::Other);
    assert_eq!(classify(&io::Error::other("x")), AcceptFailure::Other);
}

#[test]
fn exhaustion_backs_off_exponentially_up_to_a_cap_and_resets() {
    let mut b = AcceptBackoff::default();
    assert_eq!(
        b.failed(&os(libc::ECONNABORTED)),
        None,
        "a lost connection is no reason to wait"
    );
    let pauses: Vec<Duration> = (0..12)
        .map(|_| b.failed(&os(libc::EMFILE)).expect("waits"))
        .collect();
    assert_eq!(pauses[0], MIN_ACCEPT_BACKOFF);
    assert!(pauses.windows(2).all(|w| w[1] >= w[0]), "{pauses:?}");
    assert_eq!(*pauses.last().expect("some"), MAX_ACCEPT_BACKOFF);
    // Never zero: a loop that cannot accept never spins.
    assert!(pauses.iter().all(|p| !p.is_zero()));
    b.succeeded();
    assert_eq!(b.failed(&os(libc::ENFILE)), Some(MIN_ACCEPT_BACKOFF));
}

#[test]
fn client_slots_cap_each_address_and_come_back() {
    let slots = ClientSlots::new(2);
    let a: IpAddr = "127.0.0.2".parse().expect("ip");
    let b: IpAddr = "::1".parse().expect("ip");
    let first = slots.take(a).expect("1st");
    let second = slots.take(a).expect("2nd");
    assert!(
        slots.take(a).is_none(),
        "a third from the same address is refused"
    );
    // The same address written as IPv4-mapped IPv6 is the same client.
    assert!(slots.take("::ffff:127.0.0.2".parse().expect("ip")).is_none());
    let other = slots.take(b).expect("another address has its own slots");
    drop(first);
    let again = slots.take(a).expect("a slot is given back on drop");
    drop((second, again, other));
    assert!(
        slots.open.lock().expect("lock").is_empty(),
        "no entry is kept for an address with no connection"
    );
}

#[test]
fn log_lines_are_rate_limited_with_counts() {
    let mut e = EveryFew::default();
    assert_eq!(e.tick(), Some(1));
    assert_eq!(e.tick(), None);
    assert_eq!(e.tick(), None);
    e.last = Some(Instant::now() - LOG_EVERY);
    assert_eq!(e.tick(), Some(3), "the count since the last line");
}

#[test]
fn an_error_before_the_body_was_read_closes_the_connection() {
    use hyper::StatusCode;
    assert!(conn::must_close(StatusCode::UNAUTHORIZED, false));
    assert!(conn::must_close(StatusCode::INTERNAL_SERVER_ERROR, false));
    assert!(!conn::must_close(StatusCode::UNAUTHORIZED, true));
    // A success may stream while it reads (stdin of a process): the connection is the client's.
    assert!(!conn::must_close(StatusCode::OK, false));
}

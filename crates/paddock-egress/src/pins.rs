//! The addresses paddock's DNS answered for each name, per sandbox: a connection that names a host
//! must go to one of them (no DNS rebinding, no "allowed SNI, arbitrary address").

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use paddock_types::DomainName;

/// How long a pin outlives the TTL answered: clients connect a little after they resolve.
const GRACE: Duration = Duration::from_secs(60);
/// Most names pinned per sandbox; the soonest to expire goes first.
const MAX_NAMES: usize = 4096;

/// Name → answered addresses, each with its expiry.
#[derive(Debug, Default)]
pub(crate) struct Pins {
    names: HashMap<DomainName, Vec<(IpAddr, Instant)>>,
}

impl Pins {
    /// Record that `ips` were answered for `name` with `ttl`.
    pub(crate) fn pin(&mut self, name: &DomainName, ips: &[IpAddr], ttl: Duration, now: Instant) {
        self.names.retain(|_, v| {
            v.retain(|(_, exp)| *exp > now);
            !v.is_empty()
        });
        if !self.names.contains_key(name) && self.names.len() >= MAX_NAMES {
            let soonest = self
                .names
                .iter()
                .min_by_key(|(_, v)| v.iter().map(|(_, e)| *e).max())
                .map(|(n, _)| n.clone());
            if let Some(n) = soonest {
                self.names.remove(&n);
            }
        }
        let expiry = now + ttl + GRACE;
        let entry = self.names.entry(name.clone()).or_default();
        for ip in ips {
            let ip = ip.to_canonical();
            match entry.iter_mut().find(|(p, _)| *p == ip) {
                Some((_, exp)) => *exp = (*exp).max(expiry),
                None => entry.push((ip, expiry)),
            }
        }
    }

    /// Whether `ip` was answered for `name` and has not expired.
    pub(crate) fn is_pinned(&self, name: &DomainName, ip: IpAddr, now: Instant) -> bool {
        let ip = ip.to_canonical();
        self.names
            .get(name)
            .is_some_and(|v| v.iter().any(|(p, exp)| *p == ip && *exp > now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_hold_until_ttl_plus_grace_and_per_name() {
        let mut pins = Pins::default();
        let a: DomainName = "a.example.com".parse().expect("name");
        let b: DomainName = "b.example.com".parse().expect("name");
        let ip: IpAddr = "192.0.2.1".parse().expect("ip");
        let t0 = Instant::now();
        pins.pin(&a, &[ip], Duration::from_secs(30), t0);
        assert!(pins.is_pinned(&a, ip, t0 + Duration::from_secs(89)));
        assert!(pins.is_pinned(&a, "::ffff:192.0.2.1".parse().expect("ip"), t0));
        assert!(!pins.is_pinned(&a, ip, t0 + Duration::from_secs(91)));
        assert!(!pins.is_pinned(&b, ip, t0));
        assert!(!pins.is_pinned(&a, "192.0.2.2".parse().expect("ip"), t0));
    }

    #[test]
    fn the_table_is_bounded() {
        let mut pins = Pins::default();
        let t0 = Instant::now();
        let ip: IpAddr = "192.0.2.1".parse().expect("ip");
        for i in 0..MAX_NAMES + 10 {
            let n: DomainName = format!("n{i}.example.com").parse().expect("name");
            pins.pin(&n, &[ip], Duration::from_secs(i as u64), t0);
        }
        assert_eq!(pins.names.len(), MAX_NAMES);
        let last: DomainName = format!("n{}.example.com", MAX_NAMES + 9).parse().expect("name");
        assert!(pins.is_pinned(&last, ip, t0));
    }
}

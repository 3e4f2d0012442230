//! Name resolution for the proxy and the DNS responder: the operator's host map first, then (when
//! enabled) the system resolver. Addresses the operator denies on every port are dropped here, so a
//! public name that resolves to 127.0.0.1 or 169.254.169.254 is never answered nor connected to.
//!
//! A system lookup is `getaddrinfo` on a blocking thread, which a timeout cannot stop: each holds a
//! place of its sandbox's and of the server's resolution caps until the thread returns, so no
//! sandbox can fill the runtime's blocking pool (which the rest of the server needs) with lookups.

use std::net::{IpAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use paddock_types::DomainName;
use tokio::sync::Semaphore;

use crate::policy::OperatorPolicy;

/// The TTL given for answers: the host map has none, and `getaddrinfo` does not report one.
pub(crate) const ANSWER_TTL: Duration = Duration::from_secs(60);
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// A system lookup: the name's addresses (blocking).
type Lookup = dyn Fn(&str) -> std::io::Result<Vec<IpAddr>> + Send + Sync;

/// No resolution could start before the lookup timeout: the sandbox's or the server's cap was full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Busy;

/// Resolves names for every sandbox.
pub(crate) struct Resolver {
    system: bool,
    /// Places for system lookups, all sandboxes together.
    server: Arc<Semaphore>,
    lookup: Arc<Lookup>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("system", &self.system)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

fn getaddrinfo(name: &str) -> std::io::Result<Vec<IpAddr>> {
    Ok((name, 0).to_socket_addrs()?.map(|a| a.ip()).collect())
}

impl Resolver {
    /// `system`: use the system resolver for names absent from the host map, at most `concurrent`
    /// lookups at once.
    pub(crate) fn new(system: bool, concurrent: usize) -> Self {
        Self::with_lookup(system, concurrent, Arc::new(getaddrinfo))
    }

    fn with_lookup(system: bool, concurrent: usize, lookup: Arc<Lookup>) -> Self {
        Self {
            system,
            server: Arc::new(Semaphore::new(concurrent.clamp(1, Semaphore::MAX_PERMITS))),
            lookup,
        }
    }

    /// Addresses of `name` the operator does not deny outright; empty when the name does not resolve.
    /// A system lookup takes a place of `sandbox`'s (its per-sandbox cap) and of the server's.
    pub(crate) async fn resolve(
        &self,
        operator: &OperatorPolicy,
        name: &DomainName,
        sandbox: &Arc<Semaphore>,
    ) -> Result<Vec<IpAddr>, Busy> {
        let ips = match operator.hosts.get(name) {
            Some(ips) => ips.clone(),
            None if self.system => self.system_lookup(name, sandbox).await?,
            None => Vec::new(),
        };
        let mut out: Vec<IpAddr> = Vec::with_capacity(ips.len());
        for ip in ips.into_iter().map(|ip| ip.to_canonical()) {
            if !operator.denies_every_port(ip) && !out.contains(&ip) {
                out.push(ip);
            }
        }
        Ok(out)
    }

    async fn system_lookup(&self, name: &DomainName, sandbox: &Arc<Semaphore>) -> Result<Vec<IpAddr>, Busy> {
        let deadline = tokio::time::Instant::now() + LOOKUP_TIMEOUT;
        let place = |sem: &Arc<Semaphore>| tokio::time::timeout_at(deadline, sem.clone().acquire_owned());
        let Ok(Ok(mine)) = place(sandbox).await else {
            return Err(Busy);
        };
        let Ok(Ok(all)) = place(&self.server).await else {
            return Err(Busy);
        };
        let (lookup, text) = (self.lookup.clone(), name.as_str().to_owned());
        let task = tokio::task::spawn_blocking(move || {
            let r = lookup(&text);
            drop((mine, all));
            r
        });
        Ok(match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(Ok(addrs))) => addrs,
            Ok(Ok(Err(e))) => {
                tracing::debug!(name = %name, error = %e, "name does not resolve");
                Vec::new()
            }
            Ok(Err(e)) => {
                tracing::warn!(name = %name, error = %e, "name lookup task failed");
                Vec::new()
            }
            Err(_) => {
                tracing::debug!(name = %name, "name resolution timed out");
                Vec::new()
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use super::*;

    /// Lookups that block until released, reporting how many run at once.
    struct Gate {
        running: tokio::sync::watch::Sender<usize>,
        most: AtomicUsize,
        open: Mutex<bool>,
        changed: std::sync::Condvar,
    }

    impl Gate {
        fn lookup(&self) -> std::io::Result<Vec<IpAddr>> {
            self.running.send_modify(|n| {
                *n += 1;
                self.most.fetch_max(*n, Ordering::SeqCst);
            });
            let mut open = self.open.lock().expect("gate");
            while !*open {
                open = self.changed.wait(open).expect("gate");
            }
            drop(open);
            self.running.send_modify(|n| *n -= 1);
            Ok(vec![IpAddr::from([192, 0, 2, 1])])
        }
        fn release(&self) {
            *self.open.lock().expect("gate") = true;
            self.changed.notify_all();
        }
    }

    /// Ten lookups from one sandbox and ten from another: at most 2 run for each sandbox and 3 in
    /// all, however many are asked for; the rest wait for a place.
    #[tokio::test]
    async fn lookups_are_bounded_per_sandbox_and_server_wide() {
        let (running, mut watch) = tokio::sync::watch::channel(0);
        let gate = Arc::new(Gate {
            running,
            most: AtomicUsize::new(0),
            open: Mutex::new(false),
            changed: std::sync::Condvar::new(),
        });
        // Released whatever happens, so a failing assertion cannot leave threads blocked (the
        // runtime waits for them when it shuts down).
        struct Release(Arc<Gate>);
        impl Drop for Release {
            fn drop(&mut self) {
                self.0.release();
            }
        }
        let release = Release(gate.clone());
        let g = gate.clone();
        let resolver = Arc::new(Resolver::with_lookup(
            true,
            3,
            Arc::new(move |_: &str| g.lookup()),
        ));
        let operator = Arc::new(OperatorPolicy::default());
        let (a, b) = (Arc::new(Semaphore::new(2)), Arc::new(Semaphore::new(2)));
        let mut tasks = Vec::new();
        for i in 0..20 {
            let (resolver, operator) = (resolver.clone(), operator.clone());
            let sandbox = if i % 2 == 0 { a.clone() } else { b.clone() };
            tasks.push(tokio::spawn(async move {
                let name: DomainName = format!("n{i}.test").parse().expect("name");
                resolver.resolve(&operator, &name, &sandbox).await
            }));
        }
        // Wait (with a deadline) until the lookups that may run are running.
        tokio::time::timeout(Duration::from_secs(4), watch.wait_for(|n| *n == 3))
            .await
            .expect("three lookups start")
            .expect("gate");
        // Both sandboxes' places are taken (three running, one waiting for a server place).
        assert_eq!(resolver.server.available_permits(), 0);
        assert_eq!((a.available_permits(), b.available_permits()), (0, 0));
        drop(release);
        for t in tasks {
            assert_eq!(t.await.expect("task"), Ok(vec![IpAddr::from([192, 0, 2, 1])]));
        }
        assert_eq!(gate.most.load(Ordering::SeqCst), 3);
    }

    /// A sandbox whose places are all taken by lookups that do not return gets `Busy` after the
    /// lookup timeout, without starting another thread.
    #[tokio::test(start_paused = true)]
    async fn a_full_cap_is_busy_after_the_timeout() {
        let resolver = Resolver::with_lookup(true, 8, Arc::new(|_: &str| unreachable!("no place")));
        let sandbox = Arc::new(Semaphore::new(1));
        let _held = sandbox.clone().acquire_owned().await.expect("place");
        let name: DomainName = "x.test".parse().expect("name");
        let r = resolver
            .resolve(&OperatorPolicy::default(), &name, &sandbox)
            .await;
        assert_eq!(r, Err(Busy));
    }
}

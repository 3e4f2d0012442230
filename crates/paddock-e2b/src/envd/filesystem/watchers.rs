//! The polling watchers of `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher`: a directory
//! watch of the service whose events the front-end buffers between two polls.
//!
//! Everything a caller can make the host hold here is bounded: at most [`MAX_PER_SANDBOX`]
//! watchers per sandbox and [`MAX_PER_TENANT`] per tenant, at most [`MAX_BUFFERED`] events per
//! watcher (what comes beyond is counted, and the next poll says how many were lost), and a
//! watcher nobody polled for [`IDLE_LIMIT`] is dropped, as is one whose sandbox has ended.
//!
//! It does not: survive a server restart (the ids are unknown afterwards, `not_found`), or share a
//! watch between watchers.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use paddock_control::WatchStream;
use paddock_types::SandboxId;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::envd::proto::filesystem::FilesystemEvent;
use crate::{ConnectCode, ConnectError};

/// Watchers one sandbox may have.
pub const MAX_PER_SANDBOX: usize = 8;
/// Watchers one tenant may have, over all its sandboxes.
pub const MAX_PER_TENANT: usize = 32;
/// Events kept per watcher between two polls.
pub const MAX_BUFFERED: usize = 1024;
/// A watcher not polled for this long is dropped.
pub const IDLE_LIMIT: Duration = Duration::from_secs(600);

/// One watcher's buffer.
#[derive(Debug, Default)]
struct Buffer {
    events: VecDeque<FilesystemEvent>,
    /// Events that did not fit since the last poll.
    lost: u64,
    /// The watch ended (its directory went away, or its sandbox ended).
    ended: bool,
}

/// One watcher.
#[derive(Debug)]
pub struct Watcher {
    sandbox: SandboxId,
    tenant: String,
    buffer: Mutex<Buffer>,
    last_poll: Mutex<Instant>,
    stop: Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each critical section is a few pushes and pops: a panic cannot leave it half-done.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Watcher {
    /// Adds an event (or counts it as lost when the buffer is full).
    pub fn push(&self, event: FilesystemEvent) {
        let mut buffer = lock(&self.buffer);
        if buffer.events.len() >= MAX_BUFFERED {
            buffer.lost += 1;
        } else {
            buffer.events.push_back(event);
        }
    }

    /// Marks the watch as ended.
    pub fn end(&self) {
        lock(&self.buffer).ended = true;
    }

    /// Whether nobody polled it for [`IDLE_LIMIT`]; else when that will be.
    pub fn idle_until(&self) -> Instant {
        *lock(&self.last_poll) + IDLE_LIMIT
    }

    /// Waits until [`Watchers::remove`] stops it.
    pub async fn stopped(&self) {
        self.stop.notified().await;
    }
}

/// Every watcher of one front-end.
#[derive(Debug, Default)]
pub struct Watchers {
    by_id: Mutex<HashMap<String, Arc<Watcher>>>,
    next_id: AtomicU64,
}

impl Watchers {
    /// Registers a watcher for `sandbox` of `tenant` if the bounds allow; its id and itself.
    pub fn add(&self, sandbox: &SandboxId, tenant: &str) -> Result<(String, Arc<Watcher>), ConnectError> {
        let mut by_id = lock(&self.by_id);
        let of_sandbox = by_id.values().filter(|w| w.sandbox == *sandbox).count();
        let of_tenant = by_id.values().filter(|w| w.tenant == tenant).count();
        if of_sandbox >= MAX_PER_SANDBOX || of_tenant >= MAX_PER_TENANT {
            return Err(ConnectError::new(
                ConnectCode::ResourceExhausted,
                format!(
                    "too many watchers: at most {MAX_PER_SANDBOX} per sandbox and {MAX_PER_TENANT} per \
                     tenant; remove one first"
                ),
            ));
        }
        let id = format!("w{:x}", self.next_id.fetch_add(1, Ordering::Relaxed) + 1);
        let watcher = Arc::new(Watcher {
            sandbox: sandbox.clone(),
            tenant: tenant.to_owned(),
            buffer: Mutex::new(Buffer::default()),
            last_poll: Mutex::new(Instant::now()),
            stop: Notify::new(),
        });
        by_id.insert(id.clone(), watcher.clone());
        Ok((id, watcher))
    }

    /// The watcher `id` of `sandbox`, else `not_found` (another sandbox's watcher is not found too).
    fn get(&self, sandbox: &SandboxId, id: &str) -> Result<Arc<Watcher>, ConnectError> {
        lock(&self.by_id)
            .get(id)
            .filter(|w| w.sandbox == *sandbox)
            .cloned()
            .ok_or_else(|| {
                ConnectError::new(ConnectCode::NotFound, format!("watcher with id {id} not found"))
            })
    }

    /// Takes the events buffered since the last poll. When some were lost to the bound, the poll
    /// is `resource_exhausted` saying how many (the buffered ones are dropped with them: the
    /// caller has to look at the directory again anyway). A watch that has ended is removed once
    /// its events are taken.
    pub fn poll(&self, sandbox: &SandboxId, id: &str) -> Result<Vec<FilesystemEvent>, ConnectError> {
        let watcher = self.get(sandbox, id)?;
        *lock(&watcher.last_poll) = Instant::now();
        let (events, lost, ended) = {
            let mut buffer = lock(&watcher.buffer);
            let lost = std::mem::take(&mut buffer.lost);
            (std::mem::take(&mut buffer.events), lost, buffer.ended)
        };
        if ended {
            self.remove(sandbox, id)?;
        }
        if lost > 0 {
            return Err(ConnectError::new(
                ConnectCode::ResourceExhausted,
                format!(
                    "the watcher's buffer overflowed: {lost} events were lost (at most {MAX_BUFFERED} \
                     are kept between two polls)"
                ),
            ));
        }
        Ok(events.into())
    }

    /// Removes watcher `id` of `sandbox` and stops its watch.
    pub fn remove(&self, sandbox: &SandboxId, id: &str) -> Result<(), ConnectError> {
        self.get(sandbox, id)?;
        if let Some(watcher) = lock(&self.by_id).remove(id) {
            watcher.stop.notify_one();
        }
        Ok(())
    }

    /// Removes `watcher` if it is still registered as `id` (its task's own exit).
    pub fn forget(&self, id: &str, watcher: &Arc<Watcher>) {
        let mut by_id = lock(&self.by_id);
        if by_id.get(id).is_some_and(|w| Arc::ptr_eq(w, watcher)) {
            by_id.remove(id);
        }
    }

    /// How many watchers exist (for tests).
    pub fn len(&self) -> usize {
        lock(&self.by_id).len()
    }

    /// Whether none exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a watcher's task does with its watch's events.
pub type Convert = Box<
    dyn FnMut(
            paddock_types::api::WatchEvent,
        ) -> futures_util::future::BoxFuture<'static, Option<FilesystemEvent>>
        + Send,
>;

/// Pumps `stream` into `watcher` until it is removed, idle too long, or its sandbox ended; then
/// forgets it. `sandbox_live` says whether the sandbox still runs when the watch ends.
pub async fn pump(
    watchers: Arc<Watchers>,
    id: String,
    watcher: Arc<Watcher>,
    mut stream: WatchStream,
    mut convert: Convert,
    sandbox_live: impl Fn() -> bool + Send,
) {
    let mut watching = true;
    loop {
        let idle = tokio::time::sleep_until(watcher.idle_until());
        tokio::select! {
            () = watcher.stopped() => break,
            () = idle => {
                if watcher.idle_until() <= Instant::now() {
                    tracing::debug!(watcher = %id, "dropping a watcher nobody polls");
                    break;
                }
            }
            event = stream.recv(), if watching => match event {
                Some(event) if event.kind != paddock_types::api::WatchEventKind::Ended => {
                    if let Some(event) = convert(event).await {
                        watcher.push(event);
                    }
                }
                _ => {
                    watching = false;
                    watcher.end();
                    if !sandbox_live() {
                        break;
                    }
                }
            },
        }
    }
    watchers.forget(&id, &watcher);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str) -> FilesystemEvent {
        FilesystemEvent {
            name: name.into(),
            r#type: 1,
            entry: None,
        }
    }

    #[test]
    fn bounded_per_sandbox_and_tenant() {
        let watchers = Watchers::default();
        let sb: SandboxId = "sb-0000000000000001".parse().expect("id");
        for _ in 0..MAX_PER_SANDBOX {
            watchers.add(&sb, "t").expect("room");
        }
        let e = watchers.add(&sb, "t").expect_err("full");
        assert_eq!(e.code, ConnectCode::ResourceExhausted);
        let mut n = MAX_PER_SANDBOX;
        let mut i = 2u64;
        while n < MAX_PER_TENANT {
            let other: SandboxId = format!("sb-{i:016x}").parse().expect("id");
            watchers.add(&other, "t").expect("room");
            n += 1;
            if n.is_multiple_of(MAX_PER_SANDBOX) {
                i += 1;
            }
        }
        let fresh: SandboxId = "sb-00000000000000ff".parse().expect("id");
        assert!(watchers.add(&fresh, "t").is_err());
        assert!(watchers.add(&fresh, "other tenant").is_ok());
    }

    #[test]
    fn buffers_are_bounded_and_say_what_they_lost() {
        let watchers = Watchers::default();
        let sb: SandboxId = "sb-0000000000000001".parse().expect("id");
        let other: SandboxId = "sb-0000000000000002".parse().expect("id");
        let (id, watcher) = watchers.add(&sb, "t").expect("room");
        watcher.push(event("a"));
        assert_eq!(watchers.poll(&sb, &id).expect("poll").len(), 1);
        assert!(watchers.poll(&sb, &id).expect("poll").is_empty());
        assert_eq!(
            watchers.poll(&other, &id).expect_err("not its watcher").code,
            ConnectCode::NotFound
        );
        for _ in 0..MAX_BUFFERED + 3 {
            watcher.push(event("b"));
        }
        let e = watchers.poll(&sb, &id).expect_err("overflowed");
        assert_eq!(e.code, ConnectCode::ResourceExhausted);
        assert!(e.message.contains("3 events were lost"), "{}", e.message);
        assert!(watchers.poll(&sb, &id).expect("poll").is_empty());
        watcher.push(event("c"));
        watcher.end();
        assert_eq!(watchers.poll(&sb, &id).expect("last poll").len(), 1);
        assert_eq!(
            watchers.poll(&sb, &id).expect_err("gone").code,
            ConnectCode::NotFound
        );
        assert!(watchers.is_empty());
    }
}

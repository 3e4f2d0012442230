//! Progress notifications of a long tool call (a command): when the client asked for them (a
//! `progressToken` in the request's `_meta`), `notifications/progress` with the seconds the call
//! has run as progress, its time limit as the total, and the last line of output as the message.
//! The first comes with the first output (before the call's result, however quickly it follows),
//! then one per [`INTERVAL`], so a client sees a quiet command is still running.
//!
//! What it does not do: send anything when no token was given, or wait for a slow client (a
//! notification that cannot be sent is dropped; the call goes on).

use std::time::Duration;

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RequestContext};
use rmcp::RoleServer;
use tokio::time::Instant;

use crate::tools::tail;

/// The least time between two notifications.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);

/// The longest message: the tail of the last line of output.
const MAX_MESSAGE: usize = 200;

/// The progress of one call (inert without a token).
pub(crate) struct Progress {
    target: Option<(Peer<RoleServer>, ProgressToken)>,
    started: Instant,
    total_secs: u64,
    /// When the next notification goes (output before then waits for it).
    next: Instant,
    /// Whether one went (the first output is reported at once).
    sent_any: bool,
}

impl Progress {
    /// The progress of the call of `ctx`, whose time limit is `total_secs`.
    pub(crate) fn new(ctx: &RequestContext<RoleServer>, total_secs: u64) -> Self {
        let now = Instant::now();
        Self {
            target: ctx
                .meta
                .get_progress_token()
                .map(|token| (ctx.peer.clone(), token)),
            started: now,
            total_secs,
            next: now + INTERVAL,
            sent_any: false,
        }
    }

    /// Output arrived: true when it is the first, to be reported at once (before anything that
    /// follows it, the call's result included); later output waits for the next tick.
    pub(crate) fn output(&self) -> bool {
        self.target.is_some() && !self.sent_any
    }

    /// Resolves when a notification is due; never without a token.
    pub(crate) async fn tick(&self) {
        if self.target.is_none() {
            return std::future::pending().await;
        }
        tokio::time::sleep_until(self.next).await;
    }

    /// Sends the notification that is due, with the last line of `stdout` (else `stderr`).
    pub(crate) async fn report(&mut self, stdout: &[u8], stderr: &[u8]) {
        let now = Instant::now();
        self.next = now + INTERVAL;
        self.sent_any = true;
        let Some((peer, token)) = &self.target else { return };
        let elapsed = now.duration_since(self.started).as_secs_f64();
        let mut param =
            ProgressNotificationParam::new(token.clone(), elapsed).with_total(self.total_secs as f64);
        let line = last_line(if stdout.is_empty() { stderr } else { stdout });
        param = param.with_message(if line.is_empty() {
            format!("running for {elapsed:.0} s")
        } else {
            line
        });
        let _ = tokio::time::timeout(INTERVAL, peer.notify_progress(param)).await;
    }
}

/// The last non-empty line of `output`, its tail when long, invalid UTF-8 replaced.
fn last_line(output: &[u8]) -> String {
    let text = String::from_utf8_lossy(output);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    tail(line, MAX_MESSAGE).to_owned()
}

#[cfg(test)]
mod tests {
    use super::last_line;

    #[test]
    fn the_message_is_the_tail_of_the_last_line() {
        assert_eq!(last_line(b"one\ntwo\n\n"), "two");
        assert_eq!(last_line(b""), "");
        let long = "é".repeat(150);
        let tail = last_line(long.as_bytes());
        assert!(tail.len() <= 200 && tail.chars().all(|c| c == 'é'), "{tail}");
    }
}

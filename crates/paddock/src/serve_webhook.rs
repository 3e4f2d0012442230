//! The approvals webhook: every change of the approvals queue (`requested`, `approved`,
//! `rejected`, `expired`, `used`) POSTed as JSON to the operator's URL, signed, retried with
//! back-off, and recorded (`approval.webhook` audit rows, delivered or given up on).
//!
//! Each request carries `Paddock-Event` (the change), `Paddock-Delivery` (an id the receiver can
//! de-duplicate retries by) and `Paddock-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
//! "<t>.<body>" under the key in `webhook_secret_file`>`: the receiver recomputes it and refuses a
//! stale `t` to stop replays. Any 2xx answer is a delivery; anything else (no answer in 10 s, a
//! refused connection, another status) is retried after `webhook_backoff`, doubled each time, up
//! to `webhook_attempts` tries.
//!
//! What it does not do: decide anything (a webhook tells; people decide through `/v1/approvals`),
//! keep order between changes (each has its time and id), or deliver changes the server made
//! before it started (the queue itself is in the store: list it).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use paddock_control::{SandboxService, WebhookDelivery};
use paddock_types::api::ApprovalEvent;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::Semaphore;

use crate::serve_config::ApprovalsSettings;

/// Deliveries in flight at once (retries included); past it, new changes wait their turn.
const IN_FLIGHT: usize = 16;
/// How long one attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest wait between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Where and how deliveries go.
struct Webhook {
    url: reqwest::Url,
    key: Vec<u8>,
    attempts: u32,
    backoff: Duration,
    client: reqwest::Client,
}

/// Starts delivering the queue's changes when `settings` name a webhook (the key is read now, so
/// a bad file stops the start).
pub(crate) fn start(service: &SandboxService, settings: &ApprovalsSettings) -> anyhow::Result<()> {
    let (Some(url), Some(key)) = (&settings.webhook_url, settings.webhook_key()?) else {
        return Ok(());
    };
    let webhook = Webhook {
        url: reqwest::Url::parse(url).with_context(|| format!("approvals.webhook_url: {url:?}"))?,
        key,
        attempts: settings.webhook_attempts,
        backoff: settings.webhook_backoff,
        client: reqwest::Client::builder()
            .timeout(ATTEMPT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("failed to build the webhook's HTTP client")?,
    };
    let events = service.approval_events();
    tokio::spawn(run(service.clone(), Arc::new(webhook), events));
    Ok(())
}

async fn run(
    service: SandboxService,
    webhook: Arc<Webhook>,
    mut events: tokio::sync::broadcast::Receiver<ApprovalEvent>,
) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        let event = match events.recv().await {
            Ok(event) => event,
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!(
                    missed,
                    "approval changes went by faster than the webhook takes them; not delivered"
                );
                continue;
            }
            Err(RecvError::Closed) => return,
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (service, webhook) = (service.clone(), webhook.clone());
        tokio::spawn(async move {
            let delivery = webhook.deliver(&event).await;
            if let Err(e) = service.record_webhook_delivery(&event, delivery).await {
                tracing::warn!(error = %e, approval = %event.approval.id, "a webhook delivery not recorded");
            }
            drop(slot);
        });
    }
}

impl Webhook {
    /// Tries to deliver `event` until an attempt succeeds or none are left.
    async fn deliver(&self, event: &ApprovalEvent) -> WebhookDelivery {
        let body = serde_json::to_vec(event).unwrap_or_default();
        let delivery = format!(
            "{}.{}.{}",
            event.approval.id,
            event.event,
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
        );
        let mut outcome = WebhookDelivery {
            delivery: delivery.clone(),
            attempts: 0,
            delivered: false,
            status: None,
            error: None,
        };
        let mut wait = self.backoff;
        for attempt in 1..=self.attempts {
            if attempt > 1 {
                // A back-off between attempts, not a synchronisation.
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_BACKOFF);
            }
            outcome.attempts = attempt;
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            let sent = self
                .client
                .post(self.url.clone())
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header("Paddock-Event", &event.event)
                .header("Paddock-Delivery", &delivery)
                .header(
                    "Paddock-Signature",
                    paddock_control::sign_webhook(&self.key, t, &body),
                )
                .body(body.clone())
                .send()
                .await;
            match sent {
                Ok(answer) if answer.status().is_success() => {
                    outcome.delivered = true;
                    outcome.status = Some(answer.status().as_u16());
                    outcome.error = None;
                    return outcome;
                }
                Ok(answer) => {
                    outcome.status = Some(answer.status().as_u16());
                    outcome.error = Some(format!("answered {}", answer.status()));
                }
                Err(e) => {
                    outcome.status = None;
                    outcome.error = Some(format!("no answer: {e}"));
                }
            }
            tracing::debug!(attempt, error = ?outcome.error, "a webhook delivery failed");
        }
        tracing::warn!(
            approval = %event.approval.id,
            attempts = outcome.attempts,
            error = ?outcome.error,
            "a webhook delivery was given up on"
        );
        outcome
    }
}

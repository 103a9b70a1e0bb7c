//! Publishes audit events from a task of its own: a worker hands its event
//! over and goes on; a slow or absent stream never holds provisioning up.
//! At most [`WAITING_LIMIT`] events wait; past that new ones are dropped
//! and counted (`choria_provisioner_audit_events{outcome="dropped"}`), as
//! a flood of refused names must not grow our memory.

use super::event::{self, Event, Kind};
use crate::backoff::Backoff;
use crate::provision::metrics::Metrics;
use choria_config::audit::AuditConfig;
use choria_config::day_two::RecordsConfig;
use choria_wire::security::seal::SealKey;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// Events waiting to be published, at most.
pub const WAITING_LIMIT: usize = 10_000;

/// Where workers hand events to; does nothing without `audit:`.
#[derive(Clone)]
pub struct Auditor {
    tx: Option<mpsc::Sender<(Kind, Event)>>,
    source: String,
    metrics: Option<Arc<Metrics>>,
}

impl Auditor {
    /// An auditor that writes nothing.
    pub fn off() -> Self {
        Auditor {
            tx: None,
            source: String::new(),
            metrics: None,
        }
    }

    /// An auditor for `source` and the receiver its task ([`run`]) takes.
    pub fn new(source: String, metrics: Arc<Metrics>) -> (Self, mpsc::Receiver<(Kind, Event)>) {
        let (tx, rx) = mpsc::channel(WAITING_LIMIT);
        (
            Auditor {
                tx: Some(tx),
                source,
                metrics: Some(metrics),
            },
            rx,
        )
    }

    /// Hands over an event about `node`.
    pub fn event(&self, kind: Kind, node: &str, data: serde_json::Value) {
        let Some(tx) = &self.tx else { return };
        let e = Event::new(kind, node, &self.source, data);
        if tx.try_send((kind, e)).is_err() {
            if let Some(m) = &self.metrics {
                m.audit_event("dropped");
            }
        }
    }
}

/// Connects (retrying), makes sure of the stream, then publishes every
/// event handed over until `stop`.
pub async fn run(
    records: RecordsConfig,
    cfg: AuditConfig,
    key: SealKey,
    site: String,
    mut rx: mpsc::Receiver<(Kind, Event)>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut waiting: VecDeque<(Kind, Event)> = VecDeque::new();
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let mut js: Option<async_nats::jetstream::Context> = None;
    loop {
        while let Ok(e) = rx.try_recv() {
            waiting.push_back(e);
        }
        if waiting.is_empty() {
            tokio::select! {
                e = rx.recv() => match e {
                    Some(e) => { waiting.push_back(e); continue; }
                    None => return,
                },
                _ = stop.cancelled() => return,
            }
        }
        if stop.is_cancelled() {
            return give_up(&mut waiting, &metrics);
        }
        if js.is_none() {
            match open(&records, &cfg).await {
                Ok(j) => {
                    info!(stream = %cfg.stream, "writing the audit stream");
                    backoff.reset();
                    js = Some(j);
                }
                Err(e) => {
                    metrics.audit_event("error");
                    warn!(error = %e, waiting = waiting.len(), "cannot reach the audit stream; retrying");
                    if !backoff.wait(&stop).await {
                        return give_up(&mut waiting, &metrics);
                    }
                    continue;
                }
            }
        }
        let Some(j) = &js else { continue };
        let (kind, e) = waiting.front().expect("not empty");
        match publish(j, &cfg, &key, &site, *kind, e).await {
            Ok(()) => {
                debug!(node = %e.subject, kind = kind.name(), "audited");
                metrics.audit_event("written");
                waiting.pop_front();
                backoff.reset();
            }
            Err(err) => {
                metrics.audit_event("error");
                warn!(error = %err, waiting = waiting.len(), "could not write an audit event; retrying");
                if !backoff.wait(&stop).await {
                    return give_up(&mut waiting, &metrics);
                }
            }
        }
    }
}

/// Publishes one event now, for a command (`rebind`) rather than a
/// running provisioner: the stream made when missing (as `audit.create_stream`
/// allows), the event sealed and stored once.
pub async fn publish_one(
    records: &RecordsConfig,
    cfg: &AuditConfig,
    key: &SealKey,
    site: &str,
    kind: Kind,
    event: &Event,
) -> Result<(), String> {
    let js = open(records, cfg).await?;
    publish(&js, cfg, key, site, kind, event).await
}

/// Stopping with events not written yet: each is counted as dropped and the
/// log says how many, so none goes missing unseen.
fn give_up(waiting: &mut VecDeque<(Kind, Event)>, metrics: &Metrics) {
    if waiting.is_empty() {
        return;
    }
    let n = waiting.len();
    for _ in waiting.drain(..) {
        metrics.audit_event("dropped");
    }
    error!(
        events = n,
        "stopping with audit events not written; counted as dropped"
    );
}

async fn open(
    records: &RecordsConfig,
    cfg: &AuditConfig,
) -> Result<async_nats::jetstream::Context, String> {
    let nats = crate::records::store::connect(records, "choria-provisioner audit")
        .await
        .map_err(|e| e.to_string())?;
    let js = async_nats::jetstream::new(nats);
    super::stream(&js, cfg).await?;
    Ok(js)
}

async fn publish(
    js: &async_nats::jetstream::Context,
    cfg: &AuditConfig,
    key: &SealKey,
    site: &str,
    kind: Kind,
    e: &Event,
) -> Result<(), String> {
    let body = event::seal(e, key, &cfg.stream).map_err(|e| e.to_string())?;
    let subject = super::subject(cfg, site, kind);
    // The event's id as the message id: a publish retried after its
    // acknowledgement was lost (a stream leader gone mid-write) is stored
    // once, within the stream's duplicate window.
    let msg = async_nats::jetstream::message::PublishMessage::build()
        .payload(body.into())
        .message_id(&e.id);
    js.send_publish(subject, msg)
        .await
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

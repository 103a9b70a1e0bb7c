//! Reading the audit stream back: every event since a time, opened, in the
//! order the stream holds them. Used by `choria-provisioner audit`.

use super::event::{self, Opened};
use async_nats::jetstream::consumer::{self, DeliverPolicy};
use choria_config::audit::AuditConfig;
use choria_wire::security::seal::SealVerifier;
use futures::StreamExt;
use std::time::Duration;

/// How long a read waits for the next message before it takes the stream
/// as read to its end.
const IDLE: Duration = Duration::from_secs(2);

/// Every event since `since` (all of them when `None`), at most `limit`
/// (the newest are kept); messages that are not events are skipped.
pub async fn read(
    records: &choria_config::day_two::RecordsConfig,
    cfg: &AuditConfig,
    verifier: &SealVerifier,
    since: Option<chrono::DateTime<chrono::Utc>>,
    limit: usize,
) -> Result<Vec<Opened>, String> {
    let nats = crate::records::store::connect(records, "choria-provisioner audit")
        .await
        .map_err(|e| e.to_string())?;
    let js = async_nats::jetstream::new(nats);
    let read_only = AuditConfig {
        create_stream: false,
        ..cfg.clone()
    };
    let mut stream = super::stream(&js, &read_only).await?;
    let info = stream.info().await.map_err(|e| e.to_string())?;
    let last = info.state.last_sequence;
    if info.state.messages == 0 {
        return Ok(Vec::new());
    }
    let deliver_policy = match since {
        Some(t) => DeliverPolicy::ByStartTime {
            start_time: time::OffsetDateTime::from_unix_timestamp(t.timestamp())
                .map_err(|e| e.to_string())?,
        },
        None => DeliverPolicy::All,
    };
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
    let mut out = std::collections::VecDeque::new();
    // Event ids read so far: one read again is a copy someone published.
    let mut ids = std::collections::HashSet::new();
    loop {
        let next = match tokio::time::timeout(IDLE, messages.next()).await {
            Ok(Some(m)) => m.map_err(|e| e.to_string())?,
            Ok(None) | Err(_) => break,
        };
        let seq = next.info().map(|i| i.stream_sequence).unwrap_or(last);
        if let Some(mut opened) = event::open(&next.payload, verifier, &cfg.stream) {
            opened.repeated = !ids.insert(opened.event.id.clone());
            out.push_back(opened);
            if out.len() > limit {
                out.pop_front();
            }
        }
        if seq >= last {
            break;
        }
    }
    Ok(out.into())
}

//! Lifecycle events on the bus: publishing ours, subscribing to the nodes'.

use super::{ChoriaClient, ClientError};
use crate::lifecycle::{self, Event, EventType};

/// The two lifecycle encodings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventFormat {
    Choria,
    CloudEvent,
}

/// Publishes `event` on its lifecycle subject, encoded as `format` says.
pub async fn publish_event(
    nats: &async_nats::Client,
    kind: EventType,
    event: &Event,
    format: EventFormat,
) -> Result<(), ClientError> {
    let subject = lifecycle::subject(kind, &event.component);
    let payload = match format {
        EventFormat::Choria => event.to_choria_json(),
        EventFormat::CloudEvent => event.to_cloudevent_json(),
    };
    nats.publish(subject.clone(), payload.into())
        .await
        .map_err(|source| ClientError::Publish { subject, source })
}

/// Subscribes to lifecycle events of one type and component (no queue group, so
/// every replica sees every event).
pub async fn subscribe_events(
    nats: &async_nats::Client,
    kind: EventType,
    component: &str,
) -> Result<async_nats::Subscriber, ClientError> {
    let subject = lifecycle::subject(kind, component);
    nats.subscribe(subject.clone())
        .await
        .map_err(|source| ClientError::Subscribe { subject, source })
}

impl ChoriaClient {
    /// Publishes a lifecycle event in the Choria format (as the Go provisioner does
    /// for itself).
    pub async fn publish_event(&self, kind: EventType, event: &Event) -> Result<(), ClientError> {
        publish_event(&self.nats, kind, event, EventFormat::Choria).await
    }
}

//! The broker connection: connecting (retried while the broker is down,
//! reported on `/readyz`) and following it afterwards.

use crate::backoff::Backoff;
use crate::monitor::Health;
use crate::provision::pipeline::lanes::Pool;
use crate::provision::steering::Steering;
use choria_config::ClientSetup;
use choria_wire::client::{self, ClientError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// Connects, retrying while the broker is unreachable (reported on /readyz)
/// rather than exiting; `None` when shutdown came first.
pub(crate) async fn connect_until_up(
    setup: &ClientSetup,
    events: mpsc::UnboundedSender<async_nats::Event>,
    fence: &choria_wire::fence::Fence,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<Option<async_nats::Client>, ClientError> {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    loop {
        match client::connect_observed(&setup.connect, Some(events.clone()), Some(fence.clone()))
            .await
        {
            Ok(nats) => {
                health.set("broker", Ok(()));
                return Ok(Some(nats));
            }
            Err(e @ (ClientError::NoServers | ClientError::Tls(_))) => return Err(e),
            Err(e) => {
                error!(error = %e, "could not connect to the broker; retrying");
                health.set("broker", Err(e.to_string()));
            }
        }
        if !backoff.wait(shutdown).await {
            return Ok(None);
        }
    }
}

/// Tracks the broker connection: readiness follows it, a reconnect
/// triggers a discovery so nodes whose work failed meanwhile are found
/// again, and a lost connection or a slow consumer cuts the lanes' bounds.
pub(crate) async fn watch_broker(
    mut events: mpsc::UnboundedReceiver<async_nats::Event>,
    steering: Arc<Steering>,
    lanes: Pool,
    stop: CancellationToken,
) {
    // async-nats also reports the first connection; only a reconnect after a
    // disconnect calls for a new discovery.
    let mut disconnected = false;
    loop {
        let event = tokio::select! {
            e = events.recv() => match e { Some(e) => e, None => return },
            _ = stop.cancelled() => return,
        };
        match event {
            async_nats::Event::Connected if disconnected => {
                disconnected = false;
                info!("connected to the broker again; rediscovering");
                steering.health.set("broker", Ok(()));
                steering.trigger_discovery();
            }
            async_nats::Event::Connected => steering.health.set("broker", Ok(())),
            async_nats::Event::Disconnected => {
                disconnected = true;
                lanes.trouble();
                warn!("disconnected from the broker; reconnecting");
                steering
                    .health
                    .set("broker", Err("disconnected from the broker".into()));
            }
            async_nats::Event::SlowConsumer(sid) => {
                // Replies came faster than we read them: fewer in flight.
                // One event per dropped message: the cut (logged by the
                // budgets) comes at most once a second.
                debug!(subscription = sid, "slow consumer: messages were dropped");
                lanes.trouble();
            }
            other => debug!(event = %other, "broker connection event"),
        }
    }
}

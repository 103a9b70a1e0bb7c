//! The confirmation stage: a name offered by discovery or a `startup` event
//! enters the work queue only once it answers a directed ping in its own
//! name.
//!
//! Anyone on the provisioning collective can answer a broadcast discovery,
//! or publish a `startup` event, under names that do not exist. Unconfirmed,
//! each such name would hold a worker for its first RPC's timeout and
//! retries, ahead of real nodes (20,000 forged discovery replies kept 500
//! real nodes from being provisioned at all). Here a name costs one ping,
//! many of which run at once, and never a worker.
//!
//! Each source has its own stage (channel, ping budget), so a flood of one
//! kind does not delay the other: startup events keep confirming while
//! discovery works through a flood of made-up names.
//!
//! A confirmed name waits here for room in the work queue: the pending set
//! (bounded by [`super::registry::PENDING_CAPACITY`]) holds the part of a
//! large fleet the queue cannot, so one discovery is enough for it.

use super::registry::{Added, Source, Ticket};
use super::Handle;
use crate::choria::client::ChoriaClient;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info};

/// Startup events waiting for their node to answer a ping, at most (more
/// are dropped and counted: discovery finds real nodes later).
pub const EVENT_QUEUE: usize = 10_000;
/// Pings to event-announced nodes in flight at once.
pub const EVENT_PINGS: usize = 256;
/// Pings to discovered nodes in flight at once. Each is a subscription and
/// a timer: 4,096 of them cost a few MiB, and a flood of 20,000 names that
/// never answer is worked through in five ping timeouts.
pub const DISCOVERY_PINGS: usize = 4096;
/// How long a node has to answer its ping when `rpc_timeout` is not set.
pub const PING_TIMEOUT: Duration = Duration::from_secs(3);

/// One confirmation stage's settings.
#[derive(Clone, Copy, Debug)]
pub struct Stage {
    pub source: Source,
    /// Pings in flight at once.
    pub pings: usize,
    pub timeout: Duration,
}

/// Runs one stage until `stop` fires or its sender is dropped: pings each
/// offered ticket's node and queues it when it answers, forgets it when it
/// does not.
pub async fn run(
    stage: Stage,
    mut offered: mpsc::Receiver<Arc<Ticket>>,
    client: ChoriaClient,
    handle: Handle,
    stop: CancellationToken,
) {
    let pings = Arc::new(Semaphore::new(stage.pings));
    let tracker = TaskTracker::new();
    loop {
        let ticket = tokio::select! {
            t = offered.recv() => match t { Some(t) => t, None => break },
            _ = stop.cancelled() => break,
        };
        let permit = tokio::select! {
            p = pings.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stop.cancelled() => break,
        };
        let (client, handle, stop) = (client.clone(), handle.clone(), stop.clone());
        tracker.spawn(async move {
            let _permit = permit;
            tokio::select! {
                _ = confirm(stage, ticket, &client, &handle) => {}
                _ = stop.cancelled() => {}
            }
        });
    }
    tracker.close();
    tracker.wait().await;
}

/// Pings one node and moves its ticket on.
async fn confirm(stage: Stage, ticket: Arc<Ticket>, client: &ChoriaClient, handle: &Handle) {
    if !handle.registry.is_current(&ticket) {
        return;
    }
    match client.ping(&ticket.identity, stage.timeout).await {
        Ok(()) => {
            if handle.gate.is_paused() || !handle.ownership.owns(&ticket.identity) {
                handle.registry.unconfirmed(&ticket);
                return;
            }
            let identity = ticket.identity.clone();
            if handle.registry.confirmed(ticket).await != Added::Queued {
                return;
            }
            match stage.source {
                Source::Discovery => handle.metrics.discovered(),
                Source::Event => {
                    handle.metrics.event_discovered();
                    info!(node = %identity, "adding node after its startup event");
                }
            }
        }
        Err(e) => {
            handle.registry.unconfirmed(&ticket);
            match stage.source {
                Source::Discovery => handle.metrics.unconfirmed_discovery(),
                Source::Event => handle.metrics.unconfirmed_event(),
            }
            debug!(node = %ticket.identity, source = ?stage.source, error = %e, "a node did not answer its confirmation ping; not queued");
        }
    }
}

//! Lifecycle events: a node's `startup` offers it (to be confirmed before it
//! is queued), a `shutdown` drops it while it is still waiting.

use super::registry::{Offered, Source, Ticket};
use super::{suspects, Handle};
use crate::choria::identity;
use crate::choria::lifecycle::{self, EventType};
use futures::StreamExt;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

/// Takes nodes that announce themselves with a `startup` event to the
/// confirmation stage, and drops waiting nodes that announce a shutdown.
/// Identities are checked here, where they enter; the confirmation queue is
/// bounded, so a flood of events costs a counter, not memory.
pub async fn listen(
    mut events: impl futures::Stream<Item = async_nats::Message> + Unpin,
    handle: Handle,
    suspects: suspects::Suspects,
    confirm: mpsc::Sender<Arc<Ticket>>,
    stop: CancellationToken,
) {
    loop {
        let msg = tokio::select! {
            m = events.next() => match m {
                Some(m) => m,
                None => {
                    error!("the lifecycle event subscription ended");
                    return;
                }
            },
            _ = stop.cancelled() => return,
        };
        match lifecycle::parse(&msg.payload) {
            Ok((kind @ (EventType::Startup | EventType::Shutdown), event)) => {
                if let Err(e) = identity::validate(&event.identity) {
                    suspects.rejected_event_identity(&e, &event.identity);
                    continue;
                }
                if kind == EventType::Shutdown {
                    // Even while paused: a replica about to work must know
                    // which nodes are restarting (provisioned by another).
                    if handle.registry.shut_down(&event.identity) {
                        debug!(node = %event.identity, "dropped a waiting node that shut down");
                    }
                } else if handle.gate.is_paused() {
                    debug!("skipping a startup event while paused");
                } else {
                    offer(&handle, &suspects, &confirm, &event.identity);
                }
            }
            Ok((kind, _)) => debug!(?kind, "ignoring lifecycle event"),
            Err(lifecycle::EventError::NoIdentity) => {
                suspects.rejected_event_identity(&identity::IdentityError::Empty, "");
            }
            Err(e) => {
                if let Some(n) = suspects.should_log("undecodable lifecycle event") {
                    warn!(subject = %identity::preview(&msg.subject), error = %e, suppressed_before = n, "could not handle a lifecycle event");
                }
            }
        }
    }
}

/// Offers an event-announced node to the confirmation stage; a full stage
/// drops it (counted, logged at a bounded rate).
fn offer(
    handle: &Handle,
    suspects: &suspects::Suspects,
    confirm: &mpsc::Sender<Arc<Ticket>>,
    identity: &str,
) {
    if !handle.ownership.owns(identity) {
        return;
    }
    let ticket = match handle.registry.offer(identity, Source::Event) {
        Offered::Pending(ticket) => ticket,
        Offered::Full => {
            handle.metrics.dropped_event();
            return;
        }
        Offered::Recent | Offered::Busy => return,
    };
    if let Err(e) = confirm.try_send(ticket) {
        let ticket = e.into_inner();
        handle.registry.unconfirmed(&ticket);
        handle.metrics.dropped_event();
        if let Some(n) = suspects.should_log("confirmation queue full") {
            warn!(
                capacity = super::confirm::EVENT_QUEUE,
                suppressed_before = n,
                "too many startup events to confirm; dropping some (discovery finds real nodes later)"
            );
        }
    }
}

//! Lifecycle events: a node's `startup` offers it (its sequence's first
//! request confirms it), a `shutdown` is a hint that a waiting node is
//! restarting (taken at most once per node every two intervals: see
//! [`crate::provision::pipeline::registry::Registry::shut_down`]).

use crate::provision::pipeline::context::Context;
use crate::provision::pipeline::registry::{Offered, Source};
use crate::provision::suspects;
use choria_wire::identity;
use choria_wire::lifecycle::{self, EventType};
use futures::StreamExt;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

/// Offers nodes that announce themselves with a `startup` event, and takes
/// `shutdown` events as hints. Identities are checked here, where they
/// enter; the events' lane is bounded, so a flood of events costs a
/// counter, not memory.
pub async fn listen(
    mut events: impl futures::Stream<Item = async_nats::Message> + Unpin,
    ctx: Arc<Context>,
    suspects: suspects::Suspects,
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
                    ctx.registry.shut_down(&event.identity);
                } else if ctx.gate.is_paused() {
                    debug!("skipping a startup event while paused");
                } else {
                    offer(&ctx, &suspects, &event.identity);
                }
            }
            Ok((kind, _)) => debug!(?kind, "ignoring lifecycle event"),
            Err(lifecycle::EventError::NoIdentity) => {
                suspects.rejected_event_identity(&identity::IdentityError::Empty, "");
            }
            Err(e) => {
                if let Some(n) = suspects.should_log("undecodable lifecycle event") {
                    warn!(subject = %identity::preview(&msg.subject), error = %e, suppressed_before = n, "could not read a lifecycle event");
                }
            }
        }
    }
}

/// Offers an event-announced node; a full lane drops it (counted, logged
/// at a bounded rate).
fn offer(ctx: &Context, suspects: &suspects::Suspects, identity: &str) {
    if !ctx.ownership.owns(identity) {
        return;
    }
    match ctx.registry.offer(identity, Source::Event) {
        Offered::Queued(_) | Offered::Recent | Offered::Busy => {}
        Offered::Full => {
            ctx.metrics.dropped_event();
            if let Some(n) = suspects.should_log("events lane full") {
                warn!(
                    capacity = crate::provision::pipeline::registry::EVENT_QUEUE,
                    suppressed_before = n,
                    "too many startup events waiting; dropping some (discovery finds real nodes later)"
                );
            }
        }
    }
}

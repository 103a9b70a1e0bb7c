//! Broadcast discovery: at start, on the interval, and on a trigger (a won
//! election, a broker reconnect, a resume). Each name found is offered to
//! the registry and, when new, to the confirmation stage.

use super::registry::{Offered, Ticket, PENDING_CAPACITY};
use super::Handle;
use crate::choria::client::{ChoriaClient, DiscoveryOptions};
use crate::choria::filter::Filter;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Discovers at once, then on every tick of `interval` and every trigger,
/// until `shutdown`; shutdown wins over a pending trigger and cuts a
/// running discovery short.
pub async fn run(
    client: &ChoriaClient,
    handle: &Handle,
    opts: DiscoveryOptions,
    interval: Duration,
    trigger: &mut mpsc::Receiver<()>,
    confirm: &mpsc::Sender<Arc<Ticket>>,
    shutdown: &CancellationToken,
) {
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut first = true;
    loop {
        if !first {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
                Some(()) = trigger.recv() => {}
            }
        }
        first = false;
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = discover(client, handle, opts, confirm) => {}
        }
    }
}

/// The options of one round: as many names as the pending set holds.
pub fn options(timeout: Duration, window: Duration) -> DiscoveryOptions {
    DiscoveryOptions {
        timeout,
        sliding_window: Some(window),
        max_nodes: PENDING_CAPACITY,
    }
}

/// Offers one discovered name to the registry and the confirmation stage;
/// true when it was new.
fn offer(handle: &Handle, confirm: &mpsc::Sender<Arc<Ticket>>, node: &str) -> bool {
    match handle
        .registry
        .offer(node, super::registry::Source::Discovery)
    {
        Offered::Pending(ticket) => match confirm.try_send(ticket) {
            Ok(()) => true,
            Err(e) => {
                handle.registry.unconfirmed(&e.into_inner());
                handle.metrics.dropped_discovery();
                false
            }
        },
        Offered::Full => {
            handle.metrics.dropped_discovery();
            false
        }
        Offered::Recent | Offered::Busy => false,
    }
}

/// One discovery round, skipped while paused. Names are offered as their
/// replies arrive, so confirmation and work start while the discovery
/// window is still open.
async fn discover(
    client: &ChoriaClient,
    handle: &Handle,
    opts: DiscoveryOptions,
    confirm: &mpsc::Sender<Arc<Ticket>>,
) {
    if let Err(e) = handle.gate.check() {
        warn!(reason = %e, "skipping discovery");
        return;
    }
    handle.metrics.discover_cycle();
    info!("looking for provisionable hosts");
    let started = Instant::now();
    let mut offered = 0;
    let found = client
        .discover_each(&Filter::with_agent("choria_provision"), opts, |node| {
            if handle.ownership.owns(node) {
                offered += usize::from(offer(handle, confirm, node));
            }
        })
        .await;
    match found {
        Ok(nodes) => {
            info!(found = nodes.len(), offered, took = ?started.elapsed(), "discovery finished");
        }
        Err(e) => {
            handle.metrics.discovery_error();
            error!(error = %e, "could not discover nodes");
        }
    }
}

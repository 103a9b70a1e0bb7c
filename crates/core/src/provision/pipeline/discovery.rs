//! Broadcast discovery: at start, on the interval, and on a trigger (a won
//! election, a broker reconnect, a resume). Each name found is offered to
//! the registry, which queues it in the discovery lane when it is new.
//!
//! A round ends when no reply came for `discovery_window`, or at
//! `discovery_timeout`. A fleet too large to answer within the timeout
//! (a quarter of a million simulated nodes reply at ~15,000/s here) is cut
//! short: then, once the nodes found are mostly worked, another round
//! follows at once instead of at the next interval, up to
//! [`MAX_FOLLOW_UPS`] times.

use crate::provision::pipeline::context::Context;
use crate::provision::pipeline::registry::{Offered, PENDING_CAPACITY};
use choria_wire::client::{ChoriaClient, Discovered, DiscoveryOptions};
use choria_wire::filter::Filter;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Follow-up rounds after one cut short, at most, before the interval's.
pub const MAX_FOLLOW_UPS: usize = 10;
/// A follow-up starts once no more than this many nodes wait to be
/// confirmed or worked (and at most one interval after the last round).
const DRAINED: usize = 2_000;

/// Discovers at once, then on every tick of `interval` and every trigger,
/// until `shutdown`; shutdown wins over a pending trigger and cuts a
/// running discovery short.
pub async fn run(
    client: &ChoriaClient,
    ctx: &Context,
    opts: DiscoveryOptions,
    interval: Duration,
    trigger: &mut mpsc::Receiver<()>,
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
        for follow_up in 0..=MAX_FOLLOW_UPS {
            let round = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                r = discover(client, ctx, opts) => r,
            };
            let more = round.is_some_and(|(d, offered)| d.cut_short && offered > 0);
            if !more || follow_up == MAX_FOLLOW_UPS {
                break;
            }
            if !drained(ctx, interval, shutdown).await {
                return;
            }
            info!(follow_up = follow_up + 1, "the last discovery was cut short by discovery_timeout while replies still arrived; discovering again");
        }
    }
}

/// Waits until the nodes found are mostly worked; false on shutdown.
async fn drained(ctx: &Context, within: Duration, shutdown: &CancellationToken) -> bool {
    let until = tokio::time::Instant::now() + within;
    while ctx.registry.pending() > DRAINED && tokio::time::Instant::now() < until {
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    !shutdown.is_cancelled()
}

/// The options of one round: as many names as the pending set holds.
pub fn options(timeout: Duration, window: Duration) -> DiscoveryOptions {
    DiscoveryOptions {
        timeout,
        sliding_window: Some(window),
        max_nodes: PENDING_CAPACITY,
    }
}

/// Offers one discovered name to the registry; true when it was new.
fn offer(ctx: &Context, node: &str) -> bool {
    match ctx.registry.offer(
        node,
        crate::provision::pipeline::registry::Source::Discovery,
    ) {
        Offered::Queued(_) => true,
        Offered::Full => {
            ctx.metrics.dropped_discovery();
            false
        }
        Offered::Recent | Offered::Busy => false,
    }
}

/// One discovery round, skipped while paused. Names are offered as their
/// replies arrive, so confirmation and work start while the discovery
/// window is still open. What it found and how many it offered.
async fn discover(
    client: &ChoriaClient,
    ctx: &Context,
    opts: DiscoveryOptions,
) -> Option<(Discovered, usize)> {
    if let Err(e) = ctx.gate.check() {
        warn!(reason = %e, "skipping discovery");
        return None;
    }
    ctx.metrics.discover_cycle();
    info!("looking for provisionable hosts");
    let started = Instant::now();
    let mut offered = 0;
    let found = client
        .discover_each(&Filter::with_agent("choria_provision"), opts, |node| {
            if ctx.ownership.owns(node) {
                offered += usize::from(offer(ctx, node));
            }
        })
        .await;
    match found {
        Ok(d) => {
            info!(found = d.nodes, offered, cut_short = d.cut_short, took = ?started.elapsed(), "discovery finished");
            Some((d, offered))
        }
        Err(e) => {
            ctx.metrics.discovery_error();
            error!(error = %e, "could not discover nodes");
            None
        }
    }
}

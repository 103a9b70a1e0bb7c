//! The graceful stop: the gate closes, in-flight sequences get their grace,
//! the election is released, and every step is bounded in time.

use super::pipeline::lanes;
use super::{Steering, FLUSH_AT_SHUTDOWN, SHUTDOWN_GRACE, SHUTDOWN_LIMIT};
use crate::provision::gate::PauseReason;
use crate::provision::sequence;
use std::sync::Arc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// What [`stop`] winds down.
pub(super) struct Stopping {
    pub(super) steering: Arc<Steering>,
    /// The sequences' context: their abandon token, cert-manager's signer.
    pub(super) sequences: Arc<sequence::Context>,
    pub(super) pool: lanes::Pool,
    pub(super) dispatchers: JoinSet<()>,
    pub(super) election: Option<tokio::task::JoinHandle<()>>,
    pub(super) election_stop: CancellationToken,
    pub(super) stop_tasks: CancellationToken,
    pub(super) tasks: JoinSet<()>,
    pub(super) nats: async_nats::Client,
}

/// The graceful stop. Every step is bounded: a broker that is gone
/// (async-nats reconnects for ever) or a slow API server must not keep the
/// process past [`SHUTDOWN_LIMIT`].
pub(super) async fn stop(s: Stopping) {
    let Stopping {
        steering,
        sequences,
        pool,
        mut dispatchers,
        election,
        election_stop,
        stop_tasks,
        mut tasks,
        nats,
    } = s;
    let deadline = tokio::time::Instant::now() + SHUTDOWN_LIMIT;
    steering.gate.pause(PauseReason::Shutdown);
    steering.registry.close_queue();
    let dropped = steering.registry.clear();
    debug!(dropped, "dropped queued nodes");
    // A dispatcher may wait for room in its lane's budget: it has nothing
    // to finish.
    dispatchers.abort_all();
    info!(
        in_flight = pool.tracker.len(),
        bounds = pool.bounds(),
        "stopping the node sequences in flight at their next checkpoint"
    );
    while dispatchers.join_next().await.is_some() {}
    pool.tracker.close();
    let graceful = tokio::time::timeout(SHUTDOWN_GRACE, pool.tracker.wait()).await;
    if graceful.is_err() {
        warn!("in-flight nodes did not reach an attempt boundary within {SHUTDOWN_GRACE:?}; abandoning them");
        sequences.abandon.cancel();
        // Abandoned sequences stop at their next await; a helper still
        // running is killed when its future is dropped (the runtime drops
        // what is left when the process ends).
        let _ = tokio::time::timeout_at(deadline, pool.tracker.wait()).await;
    }
    // Only now, with our workers stopped, may a standby take over. The
    // release gets what is left of the limit (a Lease is released through
    // the API server even when the broker is gone).
    election_stop.cancel();
    if let Some(mut task) = election {
        match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => error!(error = %e, "the election task failed"),
            Err(_) => {
                warn!("the election did not release its leadership within {SHUTDOWN_LIMIT:?} of the shutdown; it expires instead");
                task.abort();
            }
        }
    }
    // CertificateRequests still around are deleted (or left to the next
    // start's sweep when the time is up).
    if let Some(signer) = &sequences.signing.cert_manager {
        let _ = tokio::time::timeout_at(deadline, signer.shutdown()).await;
    }
    stop_tasks.cancel();
    if tokio::time::timeout_at(deadline, async {
        while tasks.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tasks.abort_all();
    }
    // Flushing waits for a connection; without one there is nothing worth
    // waiting for.
    let flush_until = deadline.min(tokio::time::Instant::now() + FLUSH_AT_SHUTDOWN);
    match tokio::time::timeout_at(flush_until, nats.flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!(error = %e, "flush at shutdown failed"),
        Err(_) => debug!("no flush at shutdown: the broker is unreachable"),
    }
    info!("stopped");
}

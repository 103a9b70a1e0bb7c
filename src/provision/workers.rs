//! The worker pool: takes nodes off the work queue and runs each node's
//! [`HostSequence`], then records how it ended.

use super::host::{Context, HostSequence, Outcome, ProvisionError};
use super::{registry, Handle};
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info};

/// How nodes are worked: `slots` are the `workers` setting, one per node
/// being actively worked on; a node waiting out its reply windows gives its
/// slot back and waits in a `parked` task, at most `confirming` at a time.
#[derive(Clone)]
pub(super) struct Pool {
    pub(super) slots: Arc<Semaphore>,
    pub(super) confirming: Arc<Semaphore>,
    pub(super) parked: TaskTracker,
}

/// Takes nodes off the queue until it is closed and drained, and runs each
/// up to its reply windows: on at once when they are over already, else in
/// a parked task, so the windows cost no worker time.
pub(super) async fn worker(n: usize, ctx: Arc<Context>, handle: Handle, pool: Pool) {
    debug!(worker = n, "worker starting");
    while let Some(ticket) = handle.registry.next().await {
        // The term first, then whether the ticket is current: a loss
        // between the two leaves the sequence in a term that is over.
        let term = handle.gate.term();
        // The queue can hold registrations that were since replaced or
        // dropped (lost leadership): skip those.
        if !handle.registry.is_current(&ticket) || !handle.ownership.owns(&ticket.identity) {
            debug!(node = %ticket.identity, "skipping a stale queue entry");
            continue;
        }
        let Ok(slot) = pool.slots.clone().acquire_owned().await else {
            break;
        };
        let busy = ctx.metrics.busy_worker();
        info!(node = %ticket.identity, "provisioning");
        let mut seq = HostSequence::new(ctx.clone(), Arc::from(ticket.identity.as_str()), term);
        if let Err(e) = seq.gather(ticket.added.elapsed()).await {
            drop(busy);
            record(&ctx, &handle, ticket, Err(e));
            continue;
        }
        if seq.is_settled() {
            let result = async {
                seq.settle().await?;
                seq.finish().await
            }
            .await;
            drop(busy);
            drop(slot);
            record(&ctx, &handle, ticket, result);
            continue;
        }
        drop(busy);
        drop(slot);
        let Ok(confirming) = pool.confirming.clone().acquire_owned().await else {
            break;
        };
        let (ctx, handle, slots) = (ctx.clone(), handle.clone(), pool.slots.clone());
        pool.parked.spawn(async move {
            let _confirming = confirming;
            let result = async {
                seq.settle().await?;
                let _slot = slots
                    .acquire_owned()
                    .await
                    .map_err(|_| ProvisionError::Abandoned)?;
                let _busy = ctx.metrics.busy_worker();
                seq.finish().await
            }
            .await;
            record(&ctx, &handle, ticket, result);
        });
    }
    debug!(worker = n, "worker stopped");
}

/// What a node's sequence ended with: metrics, the log line, and what the
/// registry does with the node.
fn record(
    ctx: &Context,
    handle: &Handle,
    ticket: Arc<registry::Ticket>,
    result: Result<Outcome, ProvisionError>,
) {
    match result {
        Ok(Outcome::Provisioned(record)) => {
            ctx.metrics.provisioned();
            info!(node = %ticket.identity, "provisioned");
            if let Some(record) = record {
                handle.recorder.record(*record);
            }
            handle
                .registry
                .remove_later(ticket, registry::HOLD_AFTER_SUCCESS);
        }
        Ok(Outcome::Shutdown) => {
            handle
                .registry
                .remove_later(ticket, registry::HOLD_AFTER_SUCCESS);
        }
        Ok(Outcome::Upgrading { to }) => {
            info!(node = %ticket.identity, version = %to, "node is upgrading; it is provisioned after its next startup");
            handle.registry.remove(&ticket);
        }
        Err(e) if e.is_pause() => {
            info!(node = %ticket.identity, reason = %e, "stopped provisioning the node");
            handle.registry.remove(&ticket);
        }
        Err(e @ ProvisionError::Locked { .. }) => {
            // Not ours to work now; a later discovery finds it again if
            // its holder does not finish it (the lock lasts two minutes).
            info!(node = %ticket.identity, reason = %e, "left the node to the provisioner holding it");
            handle.registry.remove(&ticket);
        }
        Err(e) => {
            ctx.metrics.provision_error();
            error!(node = %ticket.identity, step = %e.step(), error = %e, "could not provision the node");
            handle.registry.remove(&ticket);
        }
    }
}

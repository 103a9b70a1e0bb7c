//! Kubernetes status: a pod's link to its own `Provisioner` resource
//! (`run --provisioner`): it follows `spec.paused` and keeps the pods'
//! status fields (leader, provisioned, refused, renewal and revocation
//! counts, shard members) true, and writes `spec.revocations` and
//! `spec.bindings`.

pub mod bindings;
pub mod resource;
pub mod revocations;

use crate::monitor::Exposition;
use crate::provision::shared::Shared;
use choria_k8s::crd::Provisioner;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often the resource's lists are applied again without a new version
/// of the resource: a replica that starts working, or a change written by
/// hand while an entry is still listed.
pub const REAPPLY: Duration = Duration::from_secs(10);

/// The rounds a list is applied in: each new version of the resource, and
/// every [`REAPPLY`] without one.
pub(crate) struct Rounds {
    seen: watch::Receiver<Option<Arc<Provisioner>>>,
    tick: tokio::time::Interval,
    stop: CancellationToken,
}

impl Rounds {
    pub(crate) fn new(
        seen: watch::Receiver<Option<Arc<Provisioner>>>,
        stop: CancellationToken,
    ) -> Self {
        let mut tick = tokio::time::interval(REAPPLY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Rounds { seen, tick, stop }
    }

    /// Waits for the next round: the resource as last seen (`None` before
    /// its first read), or `Err` once stopped.
    pub(crate) async fn next(&mut self) -> Result<Option<Arc<Provisioner>>, ()> {
        tokio::select! {
            _ = self.stop.cancelled() => return Err(()),
            r = self.seen.changed() => r.map_err(|_| ())?,
            _ = self.tick.tick() => {}
        }
        Ok(self.seen.borrow().clone())
    }
}

/// Whether this replica writes the resource's lists into the buckets: the
/// leader, or in shards mode the first member by name (as it prunes
/// `status.members`), so two replicas with different versions of the
/// resource never undo each other's writes.
pub(crate) fn applies_lists(shared: &Shared) -> bool {
    let working = shared.metrics.value("choria_provisioner_leader") == Some(1.0);
    if shared.ownership.sharded() {
        working && shared.ownership.members().iter().min() == Some(&shared.me)
    } else {
        working
    }
}

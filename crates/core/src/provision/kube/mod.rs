//! Kubernetes status: a pod's link to its own `Provisioner` resource
//! (`run --provisioner`): it follows `spec.paused` and keeps the pods'
//! status fields (leader, provisioned, refused, renewal and revocation
//! counts, shard members) true, and writes `spec.revocations` and
//! `spec.bindings`.

pub mod lists;
pub mod resource;

use crate::audit::writer::Auditor;
use crate::monitor::Exposition;
use crate::provision::steering::Steering;
use choria_config::day_two::RecordsConfig;
use choria_k8s::crd::Provisioner;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What a pod's link to its own `Provisioner` works with.
pub struct Link {
    /// Pauses and resumes for `spec.paused`, discovers after a list
    /// changed who may be provisioned, and says who leads and what was
    /// done (status).
    pub steering: Arc<Steering>,
    /// This process's candidate name (the shards' members, connection
    /// names).
    pub me: String,
    /// The process's Kubernetes client.
    pub kube: choria_k8s::Kube,
    /// Where `spec.revocations` are written (with `records:`).
    pub records: Option<RecordsConfig>,
    /// The site the revocations are sealed for.
    pub site: String,
    /// The revoked set, for `status.revoked` and to write only what changed.
    pub revoked: Option<crate::revocations::Revoked>,
    /// The names' bucket `spec.bindings` is written into (`evidence:`).
    pub evidence: Option<Arc<crate::evidence::Gate>>,
    /// `spec.bindings`' rebindings are audited.
    pub auditor: Auditor,
}

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
pub(crate) fn applies_lists(link: &Link) -> bool {
    let steering = &link.steering;
    let working = steering.metrics.value("choria_provisioner_leader") == Some(1.0);
    if steering.ownership.sharded() {
        working && steering.ownership.members().iter().min() == Some(&link.me)
    } else {
        working
    }
}

//! How a running provisioner is steered from outside its pipeline: the
//! election (won, lost, the shards' share), a pod's `spec.paused`, the
//! broker coming back, shutdown, and whoever watches it work (`run
//! --progress`, tests). One [`Steering`], made by
//! [`Provisioner::new`](super::Provisioner::new), handed out as
//! `Arc<Steering>`; the election's side of it is in
//! `pipeline::leadership`.

use crate::monitor::Health;
use crate::provision::gate::{PauseGate, PauseReason};
use crate::provision::metrics::Metrics;
use crate::provision::ownership::Ownership;
use crate::provision::pipeline::registry::Registry;
use choria_wire::fence::Fence;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tracing::info;

/// A running provisioner's controls, and what they act on.
pub struct Steering {
    /// Whether nodes may be worked now, and the leadership term.
    pub(crate) gate: PauseGate,
    /// The nodes waiting, being worked, or held after their success: a
    /// lost leadership empties it.
    pub(crate) registry: Arc<Registry>,
    pub(crate) metrics: Arc<Metrics>,
    /// `/readyz`'s checks (the election's and the broker's among them).
    pub(crate) health: Health,
    /// Which nodes are ours (the shards' membership moves it).
    pub(crate) ownership: Ownership,
    /// Holds reconnects after a loss of leadership while disconnected.
    pub(crate) fence: Fence,
    /// Who leads (with an election); `None` when unknown or no election.
    pub(crate) leader: watch::Receiver<Option<String>>,
    /// Asks the discovery loop for a round now.
    pub(crate) trigger: mpsc::Sender<()>,
}

impl Steering {
    /// Asks for a discovery now; coalesces with one already pending.
    pub fn trigger_discovery(&self) {
        let _ = self.trigger.try_send(());
    }

    /// Pauses for `reason`; when leadership is lost the registry and queue
    /// are emptied too, so nothing stale is worked after a later win.
    pub fn pause(&self, reason: PauseReason, forget_hosts: bool) {
        self.gate.pause(reason);
        if forget_hosts {
            let dropped = self.registry.clear();
            info!(dropped, "emptied the host registry and work queue");
        }
    }

    /// Lifts `reason` and, when that opened the gate, discovers at once.
    pub fn resume(&self, reason: PauseReason) {
        self.gate.resume(reason);
        if !self.gate.is_paused() {
            self.trigger_discovery();
        }
    }

    /// Whether anything holds the gate closed.
    pub fn is_paused(&self) -> bool {
        self.gate.is_paused()
    }

    /// The provisioner's metrics, as `/metrics` shows them.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The nodes it remembers.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

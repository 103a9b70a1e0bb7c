//! What every part of a running provisioner shares: one [`Shared`], made
//! by [`Provisioner::new`](super::Provisioner::new) before anything
//! connects and handed out as `Arc<Shared>` to the pipeline, each node's
//! sequence, day two, the Kubernetes link, and whatever steers the
//! provisioner from outside (the election, `run --progress`, tests).

use crate::monitor::Health;
use crate::provision::day_two::recorder::Recorder;
use crate::provision::gate::{PauseGate, PauseReason};
use crate::provision::metrics::Metrics;
use crate::provision::ownership::Ownership;
use crate::provision::pipeline::registry::Registry;
use crate::provision::signing::Signing;
use crate::provision::suspects::LogLimiter;
use choria_config::ProvisionerConfig;
use choria_k8s::crd::ResourceRef;
use choria_k8s::Kube;
use choria_wire::fence::Fence;
use std::sync::Arc;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// A running provisioner's shared parts.
pub struct Shared {
    pub cfg: Arc<ProvisionerConfig>,
    /// This process's own name in the election or the shards (the records
    /// name the replica that wrote them by it).
    pub me: String,
    /// Whether nodes may be worked now, and the leadership term.
    pub gate: PauseGate,
    /// The nodes waiting, being worked, or held after their success.
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    /// `/readyz`'s checks.
    pub health: Health,
    /// Who leads (with an election); `None` when unknown or no election.
    pub leader: watch::Receiver<Option<String>>,
    /// Which nodes are ours (all of them, except in shards mode).
    pub ownership: Ownership,
    /// Where records of provisionings go (nowhere without `records:`).
    pub recorder: Recorder,
    /// What each identity holds on record (with `records:`).
    pub held: Option<crate::records::held::Held>,
    /// The identities revoked now (with `records:`; `None` without).
    pub revoked: Option<crate::records::revocations::Revoked>,
    /// Where audit events go (nowhere without `audit:`).
    pub auditor: crate::audit::writer::Auditor,
    /// Holds reconnects after a loss of leadership while disconnected.
    pub fence: Fence,
    /// What deciding and signing a node's configuration needs.
    pub signing: Signing,
    /// The admission policy every node passes before it is decided for
    /// (`admission:` or `rego_policy`).
    pub admission: Option<std::sync::Arc<crate::admission::Policy>>,
    /// The instance identity evidence every node must present
    /// (`evidence:`).
    pub evidence: Option<crate::evidence::Gate>,
    /// The `workers` slots: a sequence holds one only while it works.
    pub slots: Arc<Semaphore>,
    /// Fired at shutdown once in-flight nodes had their grace period: waits
    /// for replies and backoff sleeps end at once.
    pub abandon: CancellationToken,
    /// Per-node warnings and errors at a bounded rate
    /// ([`crate::provision::suspects::NODE_LOG_BURST`] per kind every ten
    /// seconds): whoever holds the fleet's provisioning JWT can make up
    /// names that answer and then stall, as many as they like.
    pub logs: Arc<LogLimiter>,
    /// The process's Kubernetes client (or why there is none).
    pub kube: Kube,
    /// The `Provisioner` resource this process runs as (`run --provisioner`).
    pub resource: Option<ResourceRef>,
    pub(crate) trigger: mpsc::Sender<()>,
}

impl Shared {
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
}

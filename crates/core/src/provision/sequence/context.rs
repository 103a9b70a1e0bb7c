//! What every node's sequence works with, made once at start-up by the
//! wiring and shared by all of them as `Arc<Context>`: the settings, the
//! gate, what deciding and signing need, the checks a node passes, where
//! its outcome is written down, and the limits on its work.

use crate::provision::day_two::recorder::Recorder;
use crate::provision::gate::PauseGate;
use crate::provision::metrics::Metrics;
use crate::provision::ownership::Ownership;
use crate::provision::signing::Signing;
use crate::provision::suspects::LogLimiter;
use choria_config::ProvisionerConfig;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// A sequence's world.
pub struct Context {
    pub(crate) cfg: Arc<ProvisionerConfig>,
    /// This process's own name in the election or the shards (the records
    /// name the replica that wrote them by it).
    pub(crate) me: String,
    /// Read before every request and at every checkpoint.
    pub(crate) gate: PauseGate,
    pub(crate) metrics: Arc<Metrics>,
    /// Which nodes are ours (all of them, except in shards mode).
    pub(crate) ownership: Ownership,
    /// What deciding and signing a node's configuration needs.
    pub(crate) signing: Signing,
    /// What a node must pass before it is decided for.
    pub(crate) checks: Checks,
    /// Where what was decided is written down.
    pub(crate) trail: Trail,
    /// The `workers` slots: a sequence holds one only while it works.
    pub(crate) slots: Arc<Semaphore>,
    /// Fired at shutdown once in-flight nodes had their grace period: waits
    /// for replies and backoff sleeps end at once.
    pub(crate) abandon: CancellationToken,
    /// Per-node warnings and errors at a bounded rate
    /// ([`crate::provision::suspects::NODE_LOG_BURST`] per kind every ten
    /// seconds): whoever holds the fleet's provisioning JWT can make up
    /// names that answer and then stall, as many as they like.
    pub(crate) logs: Arc<LogLimiter>,
    /// Each sampled sequence's trace (off without `telemetry:`).
    pub(crate) tracer: crate::provision::traces::Tracer,
}

impl Context {
    /// What configures the nodes: `template`, `helper` or
    /// `template+helper` (records and traces name it).
    pub fn mode(&self) -> &'static str {
        match (
            self.signing.template.is_some(),
            self.signing.helper.is_some(),
        ) {
            (true, true) => "template+helper",
            (true, false) => "template",
            _ => "helper",
        }
    }
}

/// The checks of a node's standing, each only when configured.
#[derive(Default)]
pub struct Checks {
    /// The identities revoked now (with `records:`).
    pub(crate) revoked: Option<crate::revocations::Revoked>,
    /// What each identity holds on record (with `records:`).
    pub(crate) held: Option<crate::held::Held>,
    /// The admission policy (`admission:` or `rego_policy`).
    pub(crate) admission: Option<Arc<crate::admission::Policy>>,
    /// The instance identity evidence every node must present
    /// (`evidence:`).
    pub(crate) evidence: Option<Arc<crate::evidence::Gate>>,
}

/// Where a sequence writes down what it decided.
#[derive(Clone)]
pub struct Trail {
    /// Records of provisionings (nowhere without `records:`).
    pub(crate) recorder: Recorder,
    /// Audit events (nowhere without `audit:`).
    pub(crate) auditor: crate::audit::writer::Auditor,
}

//! What the pipeline's intake and dispatchers work with: the registry and
//! its gate, which names are ours, what is counted and logged of them, and
//! what every sequence they start takes. Made once at start-up by the
//! wiring.

use crate::audit::writer::Auditor;
use crate::provision::gate::PauseGate;
use crate::provision::metrics::Metrics;
use crate::provision::ownership::Ownership;
use crate::provision::pipeline::registry::Registry;
use crate::provision::sequence;
use crate::provision::suspects::LogLimiter;
use std::sync::Arc;

/// Discovery's, the events' and the dispatchers' world.
pub struct Context {
    /// The nodes waiting, being worked, or held after their success.
    pub(crate) registry: Arc<Registry>,
    /// Nothing is offered or started while it is closed.
    pub(crate) gate: PauseGate,
    /// Which names are ours to offer and to start.
    pub(crate) ownership: Ownership,
    pub(crate) metrics: Arc<Metrics>,
    /// How a sequence ended, logged at a bounded rate.
    pub(crate) logs: Arc<LogLimiter>,
    /// How a sequence ended, when it was a decision about a node.
    pub(crate) auditor: Auditor,
    /// What each sequence started takes.
    pub(crate) sequences: Arc<sequence::Context>,
}

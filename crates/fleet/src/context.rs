//! What every task of a run shares: the per-run context, the connection a
//! task answers on, and the nodes themselves.

use crate::journal::Journal;
use crate::node::{Failure, Node};
use crate::FleetOptions;
use choria_wire::protocol::Version;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// One simulated server, shared by the tasks that serve it.
pub(crate) type NodeRef = Arc<Mutex<Node>>;

pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) replies: AtomicU64,
}

/// Shared per-run context handed to tasks.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub(crate) journal: Journal,
    pub(crate) counters: Arc<Counters>,
    pub(crate) protocol: Version,
    /// Nodes without injected failures still in provisioning; `--exit-when-done`
    /// waits for zero. Kept as a count so each change costs O(1), not a scan.
    pub(crate) remaining: Arc<AtomicUsize>,
    pub(crate) changed: Arc<Notify>,
    /// Nodes with an index below this answer directed requests after `slow_delay`.
    pub(crate) slow_nodes: usize,
    pub(crate) slow_delay: Duration,
}

impl Ctx {
    /// A run's context, with every node given no failure in `failures` still
    /// to leave provisioning.
    pub(crate) fn new(journal: Journal, opts: &FleetOptions, failures: &[Option<Failure>]) -> Self {
        Ctx {
            journal,
            counters: Arc::new(Counters {
                requests: 0.into(),
                replies: 0.into(),
            }),
            protocol: opts.protocol,
            remaining: Arc::new(AtomicUsize::new(
                failures.iter().filter(|f| f.is_none()).count(),
            )),
            changed: Arc::new(Notify::new()),
            slow_nodes: opts.slow_nodes,
            slow_delay: Duration::from_millis(opts.slow_delay_ms),
        }
    }

    /// Called when a node leaves provisioning (restart into normal mode, shutdown).
    pub(crate) fn node_left(&self, failure: Option<Failure>) {
        if failure.is_none() {
            self.remaining.fetch_sub(1, Ordering::Relaxed);
        }
        self.changed.notify_waiters();
    }
}

/// A NATS connection and the server URL it records as its network hop.
#[derive(Clone)]
pub(crate) struct Link {
    pub(crate) nats: async_nats::Client,
    pub(crate) url: Arc<str>,
}

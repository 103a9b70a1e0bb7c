//! Who leads among the operator's replicas: the campaign for the Lease
//! [`LEASE_NAME`] and what it steers. Only the leader runs the controller
//! (see [`crate::controller`]).

use super::metrics::Metrics;
use super::LEASE_NAME;
use choria_config::ElectionConfig;
use choria_replica::election::machine::LossReason;
use choria_replica::election::{self, lease::LeaseBackend, Steer};
use choria_replica::monitor::Health;
use kube::Client;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// What the election steers: the controller follows `leading`; health and
/// metrics follow the election.
struct Leadership {
    leading: watch::Sender<bool>,
    health: Health,
    metrics: Arc<Metrics>,
}

impl Steer for Leadership {
    fn won(&self, me: &str) {
        self.metrics.set_leader(true);
        self.leading.won(me);
    }

    fn lost(&self, me: &str, reason: &LossReason) {
        self.metrics.set_leader(false);
        self.leading.lost(me, reason);
    }

    fn failed(&self, error: &str) {
        self.health
            .set(election::HEALTH_CHECK, Err(error.to_string()));
    }

    fn worked(&self) {
        self.health.set(election::HEALTH_CHECK, Ok(()));
    }
}

/// The campaign for the operator's Lease, or its stand-in when the
/// election is off; `leading` says whether this replica leads now.
pub(crate) struct Campaign {
    pub(crate) leading: watch::Receiver<bool>,
    /// The election's task; none without an election.
    task: Option<JoinHandle<()>>,
    stop: CancellationToken,
    /// Without an election the sender is kept, as dropping it would end the
    /// wait for leadership.
    _always_leading: Option<watch::Sender<bool>>,
}

impl Campaign {
    /// Campaigns for the Lease `lease_namespace`/[`LEASE_NAME`] as
    /// `identity`.
    pub(crate) fn run(
        client: &Client,
        identity: &str,
        lease_namespace: &str,
        config: &ElectionConfig,
        health: &Health,
        metrics: &Arc<Metrics>,
    ) -> Self {
        let (leading_tx, leading) = watch::channel(false);
        let stop = CancellationToken::new();
        let (leader_tx, _leader) = watch::channel(None);
        let backend = LeaseBackend::new(client.clone(), config, identity, lease_namespace);
        info!(identity = %identity, lease = %format!("{lease_namespace}/{LEASE_NAME}"), "campaigning for leadership");
        let task = tokio::spawn(election::drive(
            backend,
            Leadership {
                leading: leading_tx,
                health: health.clone(),
                metrics: metrics.clone(),
            },
            stop.clone(),
            leader_tx,
        ));
        Campaign {
            leading,
            task: Some(task),
            stop,
            _always_leading: None,
        }
    }

    /// No election: this replica leads from the start, and alone.
    pub(crate) fn none(metrics: &Metrics) -> Self {
        let (leading_tx, leading) = watch::channel(false);
        warn!("leader election is off: run a single operator replica");
        metrics.set_leader(true);
        leading_tx.send_replace(true);
        Campaign {
            leading,
            task: None,
            stop: CancellationToken::new(),
            _always_leading: Some(leading_tx),
        }
    }

    /// Ends the campaign; the election releases the Lease before its task
    /// ends.
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        if let Some(task) = self.task {
            if let Err(e) = task.await {
                error!(error = %e, "the election task failed");
            }
        }
    }
}

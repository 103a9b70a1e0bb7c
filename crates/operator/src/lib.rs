//! The Kubernetes operator (`choria-provisioner operator`): each
//! `Provisioner` resource becomes a Deployment of leader-elected
//! `choria-provisioner run` pods with their configuration, RBAC, metrics
//! Service and PodDisruptionBudget.
//!
//! * [`crd`](choria_k8s::crd): the resource's types and CRD;
//! * [`build`]: the owned objects, built without a cluster;
//! * [`validate`]: what makes a spec invalid, with messages saying what to fix;
//! * [`reconcile`]: one reconciliation (server-side apply, status, events);
//! * [`metrics`]: counters, served on the `/metrics`, `/healthz`, `/readyz` endpoint;
//! * [`policy`]: what the cluster admin allows a Provisioner to ask for;
//! * [`admission`]: the ValidatingAdmissionPolicies that hold the pods and
//!   Provisioner writers to it in the API server;
//! * `fixtures` (tests only): Provisioner fixtures and a mocked API server.
//!
//! The operator runs HA: every replica campaigns for the Lease
//! `choria-provisioner-operator` through [`choria_replica::election`], and only the
//! leader runs the controller. On losing leadership the controller is shut
//! down (in-flight reconciliations get [`DRAIN`] to finish) and the replica
//! campaigns again, building a fresh controller when it wins. The process is
//! not exited: the election already keeps campaigning, a new controller
//! starts from a fresh watch anyway, and an exit would only add a restart
//! with its back-off.
//!
//! This file holds the run's stages; what the operator is told is in
//! `options`, the campaign in `leadership`, each term's controller in
//! `controller`.

pub mod admission;
pub mod build;
mod controller;
mod leadership;
pub mod metrics;
mod options;
pub mod policy;
pub mod reconcile;
pub mod validate;

pub use controller::DEBOUNCE;
pub use options::OperatorOptions;

use choria_k8s::crd::Provisioner;
use choria_k8s::{describe_error as describe, hostname_from_proc, POD_NAMESPACE_FILE};
use choria_replica::monitor::{self, Health, MonitorError};
use controller::TermSetup;
use kube::api::{Api, ListParams};
use kube::runtime::events::Reporter;
use kube::Client;
use leadership::Campaign;
use metrics::Metrics;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The field manager of everything the operator writes.
pub const FIELD_MANAGER: &str = "choria-provisioner-operator";
/// The field manager the provisioner pods write their status with.
pub use choria_k8s::crd::POD_FIELD_MANAGER;
/// The Lease operator replicas campaign for.
pub const LEASE_NAME: &str = "choria-provisioner-operator";
/// How long in-flight reconciliations may finish on shutdown (not on a lost
/// Lease: then they stop at once).
pub const DRAIN: Duration = Duration::from_secs(10);

/// Why the operator did not start, or stopped before it was told to.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("cannot build a Kubernetes client (in-cluster service account or KUBECONFIG): {0}")]
    Client(String),
    #[error(
        "cannot list Provisioners ({0}); is the CRD installed? Install it with `choria-provisioner crd | kubectl apply -f -`"
    )]
    NoCrd(String),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Monitor(#[from] MonitorError),
    #[error("the leader election stopped unexpectedly")]
    ElectionEnded,
}

/// Runs the operator until `shutdown` resolves: stops the controller
/// (draining reconciliations), then releases the Lease.
pub async fn run(
    options: OperatorOptions,
    kube: &choria_k8s::Kube,
    shutdown: impl Future<Output = ()>,
) -> Result<(), OperatorError> {
    let client = kube.client().map_err(OperatorError::Client)?;
    let identity = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(hostname_from_proc)
        .unwrap_or_else(|| "choria-provisioner-operator".into());
    run_with(client, &identity, options, shutdown).await
}

/// [`run`] with a given client and identity (tests use a mocked client).
pub async fn run_with(
    client: Client,
    identity: &str,
    options: OperatorOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), OperatorError> {
    let settings = options.settings()?;
    let lease_namespace = lease_namespace(&options, &client);
    check_crd(&client, options.namespace.as_deref()).await?;

    let metrics = Arc::new(Metrics::new());
    let health = Health::new();
    let endpoint = Endpoint::start(options.metrics_port, &metrics, &health).await?;
    let election = options.election(&lease_namespace)?;
    let campaign = if options.leader_election {
        Campaign::run(
            &client,
            identity,
            &lease_namespace,
            &election,
            &health,
            &metrics,
        )
    } else {
        Campaign::none(&metrics)
    };
    info!(
        scope = options.namespace.as_deref().unwrap_or("all namespaces"),
        "operator started"
    );

    let setup = TermSetup {
        client,
        reporter: Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(identity.to_string()),
        },
        metrics,
        settings,
        admission_policy: options.admission_policy.clone(),
        provisioner_admission_policy: options.provisioner_admission_policy.clone(),
    };
    let namespace = options.namespace.as_deref();
    let outcome =
        controller::lead_terms(namespace, &setup, campaign.leading.clone(), shutdown).await;

    // The Lease is released only once the controller stopped writing.
    campaign.stop().await;
    endpoint.stop().await;
    outcome
}

/// Where the operator's Lease is: the watched namespace, else the pod's
/// own, else the client's default.
fn lease_namespace(options: &OperatorOptions, client: &Client) -> String {
    options
        .namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .or_else(|| {
            std::fs::read_to_string(POD_NAMESPACE_FILE)
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| client.default_namespace().to_string())
}

/// Refuses to start without the Provisioner CRD (or the right to list
/// Provisioners), saying how to install it, rather than campaign for a
/// controller whose watch would only fail.
async fn check_crd(client: &Client, namespace: Option<&str>) -> Result<(), OperatorError> {
    let provisioners: Api<Provisioner> = scoped(client, namespace);
    provisioners
        .list(&ListParams::default().limit(1))
        .await
        .map_err(|e| OperatorError::NoCrd(describe(&e)))?;
    Ok(())
}

/// The `/metrics`, `/healthz` and `/readyz` endpoint; none on port 0.
struct Endpoint {
    task: Option<JoinHandle<Result<(), MonitorError>>>,
    stop: CancellationToken,
}

impl Endpoint {
    async fn start(
        port: u16,
        metrics: &Arc<Metrics>,
        health: &Health,
    ) -> Result<Self, OperatorError> {
        let stop = CancellationToken::new();
        let task = if port > 0 {
            let listener = monitor::bind(port).await?;
            Some(tokio::spawn(monitor::serve(
                listener,
                metrics.clone(),
                health.clone(),
                stop.clone(),
            )))
        } else {
            None
        };
        Ok(Endpoint { task, stop })
    }

    async fn stop(self) {
        self.stop.cancel();
        if let Some(task) = self.task {
            match task.await {
                Ok(Err(e)) => warn!(error = %e, "monitoring endpoint failed"),
                Err(e) => warn!(error = %e, "monitoring endpoint task failed"),
                Ok(Ok(())) => {}
            }
        }
    }
}

/// An Api over one namespace, or all of them.
fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

#[cfg(test)]
mod fixtures;

#[cfg(test)]
mod tests {
    use super::*;
    use fixtures::{fake_cluster, wait_for_line, LEASES, PROVISIONERS};

    #[tokio::test]
    async fn the_leader_runs_the_controller_and_releases_the_lease_on_shutdown() {
        let (client, log, server) = fake_cluster();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let options = OperatorOptions {
            namespace: Some("ops".into()),
            metrics_port: 0,
            ..Default::default()
        };
        let run = tokio::spawn(run_with(client, "operator-0", options, async {
            let _ = stop_rx.await;
        }));
        wait_for_line(&log, &format!("GET {PROVISIONERS} watch")).await;
        stop_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(15), run)
            .await
            .expect("the operator stops")
            .unwrap()
            .unwrap();
        let lease = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the client is gone")
            .unwrap()
            .expect("a Lease was written");

        let lines = log.lock().unwrap().clone();
        assert_eq!(
            lines[0],
            format!("GET {PROVISIONERS}"),
            "the CRD check first"
        );
        let first = |l: &str| lines.iter().position(|x| x == l);
        let created = first(&format!("POST {LEASES}")).expect("the Lease is created");
        let watching = first(&format!("GET {PROVISIONERS} watch")).unwrap();
        assert!(
            created < watching,
            "the controller starts only once leading: {lines:#?}"
        );
        for kind in [
            "/api/v1/namespaces/ops/configmaps",
            "/apis/apps/v1/namespaces/ops/deployments",
            "/apis/policy/v1/namespaces/ops/poddisruptionbudgets",
        ] {
            assert!(
                lines.contains(&format!("GET {kind} watch")),
                "{kind}: {lines:#?}"
            );
        }
        assert_eq!(
            lines.last().unwrap(),
            &format!("PUT {LEASES}/{LEASE_NAME}"),
            "released last"
        );
        assert_eq!(lease["metadata"]["name"], LEASE_NAME);
        assert_eq!(lease["spec"]["holderIdentity"], "", "released: {lease}");
    }
}

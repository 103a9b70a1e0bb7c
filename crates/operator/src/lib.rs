//! The Kubernetes operator (`choria-provisioner operator`): each
//! `Provisioner` resource becomes a Deployment of leader-elected
//! `choria-provisioner run` pods with their configuration, RBAC, metrics
//! Service and PodDisruptionBudget.
//!
//! * [`crd`]: the resource's types and CRD;
//! * [`build`]: the owned objects, built without a cluster;
//! * [`validate`]: what makes a spec invalid, with messages saying what to fix;
//! * [`reconcile`]: one reconciliation (server-side apply, status, events);
//! * [`metrics`]: counters, served on the `/metrics`, `/healthz`, `/readyz` endpoint.
//!
//! The operator runs HA: every replica campaigns for the Lease
//! `choria-provisioner-operator` through [`choria_core::election`], and only the
//! leader runs the controller. On losing leadership the controller is shut
//! down (in-flight reconciliations get [`DRAIN`] to finish) and the replica
//! campaigns again, building a fresh controller when it wins. The process is
//! not exited: the election already keeps campaigning, a new controller
//! starts from a fresh watch anyway, and an exit would only add a restart
//! with its back-off.

pub mod admission;
pub mod build;
pub mod metrics;
pub mod policy;
pub mod reconcile;
pub mod validate;

use choria_config::{ElectionBackend as ConfigBackend, ElectionConfig};
use choria_core::election::machine::LossReason;
use choria_core::election::{self, lease::LeaseBackend, Steer};
use choria_core::monitor::{self, Health, MonitorError};
use choria_k8s::crd::{self, Provisioner};
use choria_k8s::{describe_error as describe, hostname_from_proc, POD_NAMESPACE_FILE};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{controller, predicates, watcher, Controller, WatchStreamExt};
use kube::Client;
use metrics::Metrics;
use reconcile::{Context, Stores};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// The field manager of everything the operator writes.
pub const FIELD_MANAGER: &str = "choria-provisioner-operator";
/// The field manager the provisioner pods write `status.leader` and
/// `status.provisioned` with.
pub const POD_FIELD_MANAGER: &str = "choria-provisioner-pod";
/// The Lease operator replicas campaign for.
pub const LEASE_NAME: &str = "choria-provisioner-operator";
/// How long in-flight reconciliations may finish on shutdown (not on a lost
/// Lease: then they stop at once).
pub const DRAIN: Duration = Duration::from_secs(10);

/// What `choria-provisioner operator` can be told (`cmd::operator` in the
/// binary turns its command line into these).
#[derive(Clone, Debug, PartialEq)]
pub struct OperatorOptions {
    /// Watch Provisioners only in this namespace and hold the operator's
    /// Lease there (`None`: all namespaces; the Lease in the pod's namespace).
    pub namespace: Option<String>,
    /// Port of `/metrics`, `/healthz` and `/readyz`; 0 disables them.
    pub metrics_port: u16,
    /// Campaign for the Lease before reconciling; off only with a single
    /// operator replica.
    pub leader_election: bool,
    /// The operator's own image: what a Provisioner without `spec.image`
    /// runs, and the only image allowed unless `allowed_images` says
    /// otherwise (`None`: this build's `choria-provisioner:<version>`).
    pub image: Option<String>,
    /// Images a Provisioner may run; `*` stands for any run of characters
    /// (`registry.example.net/choria-provisioner:*`). Empty: only `image`.
    pub allowed_images: Vec<String>,
    /// Issuers outside a Provisioner's namespace that may sign its nodes'
    /// certificates.
    pub allowed_cluster_issuers: Vec<policy::IssuerPattern>,
    /// Key usages the nodes' certificates may carry (cert-manager's names).
    pub allowed_usages: Vec<String>,
    /// The ValidatingAdmissionPolicy (and binding) bounding the
    /// CertificateRequests a Provisioner's pods may make, applied when the
    /// operator leads; empty: none (then only the spec is bounded).
    pub admission_policy: String,
    /// The ClusterRole granting Leases, bound in a Provisioner's namespace to
    /// its pods when they elect through a Lease.
    pub lease_cluster_role: String,
    /// The ClusterRole granting CertificateRequests, bound to the pods of a
    /// Provisioner with `spec.pki.certManager`.
    pub cert_manager_cluster_role: String,
    /// The operator's Lease: how long a leader's record is valid.
    pub lease_duration: Duration,
    /// The operator's Lease: a leader that could not renew for this long
    /// stops its controller at once (before `lease_duration` has passed, so
    /// the next leader never reconciles beside it).
    pub renew_deadline: Duration,
    /// The operator's Lease: time between attempts.
    pub retry_period: Duration,
}

impl Default for OperatorOptions {
    /// The command line's defaults (a test of `cmd::operator` keeps them
    /// equal): all namespaces, leader-elected, only its own image, no
    /// issuer beyond a Provisioner's namespace.
    fn default() -> Self {
        OperatorOptions {
            namespace: None,
            metrics_port: 8080,
            leader_election: true,
            image: None,
            allowed_images: Vec::new(),
            allowed_cluster_issuers: Vec::new(),
            allowed_usages: choria_config::provisioner::DEFAULT_CERT_MANAGER_USAGES
                .map(String::from)
                .to_vec(),
            admission_policy: admission::DEFAULT_POLICY_NAME.into(),
            lease_cluster_role: build::DEFAULT_LEASE_CLUSTER_ROLE.into(),
            cert_manager_cluster_role: build::DEFAULT_CERT_MANAGER_CLUSTER_ROLE.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl OperatorOptions {
    /// The operator's election, with client-go's rule on its timings.
    pub fn election(&self, namespace: &str) -> Result<ElectionConfig, OperatorError> {
        let (lease, renew, retry) = (self.lease_duration, self.renew_deadline, self.retry_period);
        if lease <= renew || renew.as_secs_f64() <= 1.2 * retry.as_secs_f64() {
            return Err(OperatorError::Usage(format!(
                "--lease-duration ({lease:?}) > --renew-deadline ({renew:?}) > 1.2 × --retry-period ({retry:?}) does not hold"
            )));
        }
        Ok(ElectionConfig {
            backend: ConfigBackend::Lease,
            lease_name: LEASE_NAME.into(),
            lease_namespace: Some(namespace.to_string()),
            lease_duration: lease,
            renew_deadline: renew,
            retry_period: retry,
            ..ElectionConfig::default()
        })
    }

    /// The policy and roles every reconciliation applies; refuses usages
    /// cert-manager does not know.
    pub fn settings(&self) -> Result<build::Settings, OperatorError> {
        use choria_config::provisioner::CERT_MANAGER_USAGES;
        if let Some(u) = self
            .allowed_usages
            .iter()
            .find(|u| !CERT_MANAGER_USAGES.contains(&u.as_str()))
        {
            return Err(OperatorError::Usage(format!(
                "--allowed-usage {u:?} is not a cert-manager key usage; use one of: {}",
                CERT_MANAGER_USAGES.join(", ")
            )));
        }
        let own = self.image.clone().unwrap_or_else(crd::default_image);
        let mut settings = build::Settings::new(own);
        settings.policy.images = self
            .allowed_images
            .iter()
            .map(policy::Pattern::new)
            .collect();
        settings.policy.cluster_issuers = self.allowed_cluster_issuers.clone();
        settings.policy.usages = self.allowed_usages.clone();
        settings.lease_cluster_role = self.lease_cluster_role.clone();
        settings.cert_manager_cluster_role = self.cert_manager_cluster_role.clone();
        Ok(settings)
    }
}

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
    let identity = identity.to_string();
    let settings = options.settings()?;
    let lease_namespace = options
        .namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .or_else(|| {
            std::fs::read_to_string(POD_NAMESPACE_FILE)
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| client.default_namespace().to_string());

    let provisioners: Api<Provisioner> = scoped(&client, options.namespace.as_deref());
    provisioners
        .list(&ListParams::default().limit(1))
        .await
        .map_err(|e| OperatorError::NoCrd(describe(&e)))?;

    let metrics = Arc::new(Metrics::new());
    let health = Health::new();
    let stop = CancellationToken::new();
    let monitor = if options.metrics_port > 0 {
        let listener = monitor::bind(options.metrics_port).await?;
        Some(tokio::spawn(monitor::serve(
            listener,
            metrics.clone(),
            health.clone(),
            stop.clone(),
        )))
    } else {
        None
    };

    let election_cfg = options.election(&lease_namespace)?;
    let (leading_tx, leading) = watch::channel(false);
    let election_stop = CancellationToken::new();
    // Without an election the sender is kept, as dropping it would end the
    // wait for leadership below.
    let (election, _always_leading) = if options.leader_election {
        let (leader_tx, _leader) = watch::channel(None);
        let backend = LeaseBackend::new(client.clone(), &election_cfg, &identity, &lease_namespace);
        info!(identity = %identity, lease = %format!("{lease_namespace}/{LEASE_NAME}"), "campaigning for leadership");
        let task = tokio::spawn(election::drive(
            backend,
            Leadership {
                leading: leading_tx,
                health: health.clone(),
                metrics: metrics.clone(),
            },
            election_stop.clone(),
            leader_tx,
        ));
        (Some(task), None)
    } else {
        warn!("leader election is off: run a single operator replica");
        metrics.set_leader(true);
        leading_tx.send_replace(true);
        (None, Some(leading_tx))
    };
    info!(
        scope = options.namespace.as_deref().unwrap_or("all namespaces"),
        "operator started"
    );

    let shared = Shared {
        client: client.clone(),
        reporter: Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(identity.clone()),
        },
        metrics: metrics.clone(),
        settings,
        admission_policy: options.admission_policy.clone(),
    };
    let shutting_down = CancellationToken::new();
    let signal = shutting_down.clone();
    let lead_loop = async {
        let mut leading = leading.clone();
        loop {
            tokio::select! {
                // The guard wait_for returns is not Send: keep only the outcome.
                won = async { leading.wait_for(|l| *l).await.is_ok() } => if !won { break },
                _ = shutting_down.cancelled() => break,
            }
            lead(
                options.namespace.as_deref(),
                &shared,
                leading.clone(),
                shutting_down.clone(),
            )
            .await;
            if shutting_down.is_cancelled() {
                break;
            }
        }
    };
    tokio::pin!(lead_loop);
    let outcome = tokio::select! {
        // Only when the election task is gone: nothing can lead any more.
        _ = &mut lead_loop => Err(OperatorError::ElectionEnded),
        _ = shutdown => {
            info!("shutting down: draining reconciliations, then releasing the lease");
            signal.cancel();
            lead_loop.await;
            Ok(())
        }
    };

    election_stop.cancel();
    if let Some(Err(e)) = match election {
        Some(task) => Some(task.await),
        None => None,
    } {
        error!(error = %e, "the election task failed");
    }
    stop.cancel();
    if let Some(m) = monitor {
        match m.await {
            Ok(Err(e)) => warn!(error = %e, "monitoring endpoint failed"),
            Err(e) => warn!(error = %e, "monitoring endpoint task failed"),
            Ok(Ok(())) => {}
        }
    }
    outcome
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

/// What every term's controller gets.
#[derive(Clone)]
struct Shared {
    client: Client,
    reporter: Reporter,
    metrics: Arc<Metrics>,
    settings: build::Settings,
    /// The admission policy's name; empty: none.
    admission_policy: String,
}

/// Aborts its task when dropped (the term it belongs to ended).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keeps the admission policy applied for this term: looks every 5
/// minutes (a read; it writes only what differs), every 30 s while it fails
/// (an API server without admissionregistration.k8s.io/v1, or an operator
/// without the RBAC for it, is told in the log each time).
async fn keep_admission_policy(
    client: Client,
    name: String,
    policy: policy::Policy,
    namespace: Option<String>,
    metrics: Arc<Metrics>,
) {
    if name.is_empty() {
        warn!("no admission policy (--admission-policy is empty): a Provisioner's pods may ask cert-manager for any issuer, usage or a CA certificate");
        metrics.set_admission_policy(false);
        return;
    }
    let mut told = false;
    loop {
        let wait = match admission::apply(&client, &name, &policy, namespace.as_deref()).await {
            Ok(()) => {
                if !told {
                    info!(policy = %name, "CertificateRequests of Provisioner pods are bounded by the admission policy");
                    told = true;
                }
                metrics.set_admission_policy(true);
                Duration::from_secs(300)
            }
            Err(e) => {
                metrics.set_admission_policy(false);
                told = false;
                error!(policy = %name, error = %describe(&e), "cannot apply the admission policy bounding Provisioner pods' CertificateRequests (needs Kubernetes 1.30 and the chart's RBAC); retrying in 30 s");
                Duration::from_secs(30)
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// How long the controller waits for more triggers of one Provisioner
/// before reconciling it: the watch events of one apply of several owned
/// objects arrive together and make one reconciliation, not one each.
pub const DEBOUNCE: Duration = Duration::from_millis(300);

/// What of a Provisioner sets off a reconciliation: its spec (generation)
/// and the leader its pods report (the LeaderElected condition and its
/// Event). Status writes of the count, and the operator's own status
/// writes, do not.
fn provisioner_changed(p: &Provisioner) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    p.metadata.generation.hash(&mut h);
    p.status
        .as_ref()
        .and_then(|s| s.leader.as_ref())
        .hash(&mut h);
    Some(h.finish())
}

/// A watch of the owned objects of kind `K` (by our label) feeding a store;
/// each change, deletion included, sets off their owner's reconciliation.
fn owned_watch<K>(
    client: &Client,
    namespace: Option<&str>,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().labels(&reconcile::owned_selector());
    let stream = watcher(scoped::<K>(client, namespace), config)
        .default_backoff()
        .reflect(writer)
        .touched_objects()
        // A re-list brings every object again, unchanged: not a change.
        .predicate_filter(predicates::resource_version, Default::default());
    (reader, stream)
}

/// Runs the controller while we lead and until shutdown. On shutdown
/// in-flight reconciliations get [`DRAIN`] to finish (the Lease is released
/// after); on losing leadership they are dropped at once: a standby may
/// take over as soon as our Lease expires, and nothing of this term may
/// write after that.
async fn lead(
    namespace: Option<&str>,
    shared: &Shared,
    mut leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    let client = &shared.client;
    let _admission = AbortOnDrop(tokio::spawn(keep_admission_policy(
        client.clone(),
        shared.admission_policy.clone(),
        shared.settings.policy.clone(),
        namespace.map(str::to_string),
        shared.metrics.clone(),
    )));
    let (service_accounts, sa) = owned_watch::<ServiceAccount>(client, namespace);
    let (roles, role) = owned_watch::<Role>(client, namespace);
    let (role_bindings, rb) = owned_watch::<RoleBinding>(client, namespace);
    let (config_maps, cm) = owned_watch::<ConfigMap>(client, namespace);
    let (services, svc) = owned_watch::<Service>(client, namespace);
    let (deployments, deploy) = owned_watch::<Deployment>(client, namespace);
    let (pdbs, pdb) = owned_watch::<PodDisruptionBudget>(client, namespace);
    let ctx = Arc::new(Context {
        client: client.clone(),
        reporter: shared.reporter.clone(),
        metrics: shared.metrics.clone(),
        settings: shared.settings.clone(),
        stores: Stores {
            service_accounts,
            roles,
            role_bindings,
            config_maps,
            services,
            deployments,
            pdbs,
        },
        leaders: Default::default(),
        signing_keys: Default::default(),
    });
    let (provisioners, writer) = reflector::store();
    let changes = watcher(
        scoped::<Provisioner>(client, namespace),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff()
    .reflect(writer)
    .applied_objects()
    .predicate_filter(provisioner_changed, Default::default());

    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let controller = Controller::for_stream(changes, provisioners)
        .owns_stream(sa)
        .owns_stream(role)
        .owns_stream(rb)
        .owns_stream(cm)
        .owns_stream(svc)
        .owns_stream(deploy)
        .owns_stream(pdb)
        .with_config(controller::Config::default().debounce(DEBOUNCE))
        .graceful_shutdown_on(async move { stopped.cancelled().await })
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move {
            use kube::runtime::controller::Error as E;
            match result {
                Ok((obj, _)) => tracing::debug!(provisioner = %obj, "reconciled"),
                // error_policy logged it.
                Err(E::ReconcilerFailed(..)) => {}
                Err(E::QueueError(e)) => {
                    warn!(error = %describe_watch(&e), "watch failed; retrying")
                }
                Err(e) => warn!(error = %e, "controller error"),
            }
        });
    tokio::pin!(controller);
    info!("controller started");
    tokio::select! {
        _ = &mut controller => {
            warn!("the controller stopped by itself; restarting it");
            // Not a busy loop if it keeps stopping.
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
        _ = async { leading.wait_for(|l| !*l).await.is_ok() } => {
            // Dropping the controller drops its reconciliations with it.
            info!("controller stopped: leadership lost");
            return;
        }
        _ = shutdown.cancelled() => {}
    }
    stop.cancel();
    if tokio::time::timeout(DRAIN, controller).await.is_err() {
        warn!(drain = ?DRAIN, "reconciliations did not finish in time; abandoned");
    }
    info!("controller stopped: shutting down");
}

/// A watch error as text, without exec-plugin output (see [`describe`]).
fn describe_watch(e: &watcher::Error) -> String {
    match e {
        watcher::Error::InitialListFailed(k) => format!("initial list failed: {}", describe(k)),
        watcher::Error::WatchStartFailed(k) => {
            format!("starting the watch failed: {}", describe(k))
        }
        watcher::Error::WatchFailed(k) => format!("the watch failed: {}", describe(k)),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod fixtures;

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::{json, Value};
    use std::sync::Mutex;

    const PROVISIONERS: &str = "/apis/provisioning.choria.io/v1alpha1/namespaces/ops/provisioners";
    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases";

    type Log = Arc<Mutex<Vec<String>>>;

    // What the command line turns into these options is tested with it, in
    // the binary's `cmd::operator`.

    #[test]
    fn the_policy_comes_from_the_command_line() {
        let s = OperatorOptions::default().settings().unwrap();
        assert_eq!(s.policy.default_image, crd::default_image());
        assert!(s.policy.images.is_empty() && s.policy.cluster_issuers.is_empty());
        assert_eq!(
            s.policy.usages,
            choria_config::provisioner::DEFAULT_CERT_MANAGER_USAGES
        );
        assert_eq!(s.lease_cluster_role, build::DEFAULT_LEASE_CLUSTER_ROLE);
        let s = OperatorOptions {
            image: Some("r.example.net/cp:1".into()),
            allowed_images: vec![
                "r.example.net/cp:*".into(),
                "r.example.net/cp@sha256:*".into(),
            ],
            allowed_cluster_issuers: vec![
                "corp-ca".parse().unwrap(),
                "X.example.net/y".parse().unwrap(),
            ],
            allowed_usages: vec!["client auth".into()],
            ..Default::default()
        }
        .settings()
        .unwrap();
        assert_eq!(s.policy.default_image, "r.example.net/cp:1");
        assert_eq!(s.policy.images.len(), 2);
        assert_eq!(s.policy.cluster_issuers.len(), 2);
        assert_eq!(s.policy.usages, ["client auth"]);
        let e = OperatorOptions {
            allowed_usages: vec!["everything".into()],
            ..Default::default()
        }
        .settings()
        .unwrap_err();
        assert!(
            e.to_string().contains("not a cert-manager key usage"),
            "{e}"
        );
    }

    /// An empty cluster with a Lease store. Lists are empty, watches never
    /// answer. Returns the Lease as last written once the client is gone.
    fn fake_cluster() -> (Client, Log, tokio::task::JoinHandle<Option<Value>>) {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(svc, "ops");
        let log: Log = Arc::default();
        let seen = log.clone();
        let task = tokio::spawn(async move {
            let mut lease: Option<Value> = None;
            let mut version = 0;
            let mut watches = Vec::new();
            while let Some((req, send)) = handle.next_request().await {
                let (parts, body) = req.into_parts();
                let bytes = body.collect_bytes().await.unwrap();
                let path = parts.uri.path().to_string();
                let method = parts.method.to_string();
                let watch = parts.uri.query().unwrap_or_default().contains("watch=true");
                let suffix = if watch { " watch" } else { "" };
                seen.lock()
                    .unwrap()
                    .push(format!("{method} {path}{suffix}"));
                if watch {
                    watches.push(send);
                    continue;
                }
                let (code, reply) = if path.starts_with(LEASES) {
                    match (method.as_str(), &lease) {
                        ("GET", Some(l)) => (200, l.clone()),
                        ("GET", None) => (
                            404,
                            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "reason": "NotFound", "code": 404, "message": "not found"}),
                        ),
                        _ => {
                            version += 1;
                            let mut l: Value = serde_json::from_slice(&bytes).unwrap();
                            l["metadata"]["resourceVersion"] = json!(version.to_string());
                            lease = Some(l.clone());
                            (if method == "POST" { 201 } else { 200 }, l)
                        }
                    }
                } else {
                    (
                        200,
                        json!({"apiVersion": "v1", "kind": "List",
                               "metadata": {"resourceVersion": "1"}, "items": []}),
                    )
                };
                send.send_response(
                    Response::builder()
                        .status(code)
                        .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                        .unwrap(),
                );
            }
            lease
        });
        (client, log, task)
    }

    async fn wait_for_line(log: &Log, line: &str) {
        let found = async {
            while !log.lock().unwrap().iter().any(|l| l == line) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), found)
            .await
            .is_err()
        {
            panic!("no {line:?} in {:#?}", log.lock().unwrap());
        }
    }

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

    #[tokio::test]
    async fn losing_leadership_stops_the_controller() {
        let (client, log, _server) = fake_cluster();
        let (leading_tx, leading) = watch::channel(true);
        let shared = Shared {
            client: client.clone(),
            reporter: Reporter::from(FIELD_MANAGER),
            metrics: Arc::new(Metrics::new()),
            settings: fixtures::settings(),
            admission_policy: String::new(),
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { lead(Some("ops"), &shared, leading, shutdown).await }
        });
        wait_for_line(&log, &format!("GET {PROVISIONERS} watch")).await;
        assert!(!task.is_finished());
        leading_tx.send_replace(false);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the controller stops when leadership is lost")
            .unwrap();
        assert!(
            !shutdown.is_cancelled(),
            "the process goes on, to campaign again"
        );
    }
}

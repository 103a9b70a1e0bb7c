//! The controller the leader runs, one per term: a fresh one each time the
//! replica wins the Lease, stopped when it loses it or shuts down.

use super::admission::{self, Bounded};
use super::metrics::Metrics;
use super::reconcile::{self, Context, OwnedKind, Stores};
use super::{build, policy, scoped, OperatorError, DRAIN};
use choria_k8s::crd::Provisioner;
use choria_k8s::describe_error as describe;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::runtime::controller::{self, Action};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{predicates, watcher, Controller, WatchStreamExt};
use kube::Client;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// How long the controller waits for more triggers of one Provisioner
/// before reconciling it: the watch events of one apply of several owned
/// objects arrive together and make one reconciliation, not one each.
pub const DEBOUNCE: Duration = Duration::from_millis(300);

/// What every term's controller gets.
#[derive(Clone)]
pub(crate) struct TermSetup {
    pub(crate) client: Client,
    pub(crate) reporter: Reporter,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) settings: build::Settings,
    /// The admission policy's name; empty: none.
    pub(crate) admission_policy: String,
    /// The name of the admission policy bounding Provisioners; empty: none.
    pub(crate) provisioner_admission_policy: String,
}

/// Runs a controller for each term `leading` says we lead, until
/// `shutdown` resolves. Fails only when `leading` can no longer change (the
/// election task is gone): nothing can lead any more.
pub(crate) async fn lead_terms(
    namespace: Option<&str>,
    setup: &TermSetup,
    leading: watch::Receiver<bool>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), OperatorError> {
    let shutting_down = CancellationToken::new();
    let signal = shutting_down.clone();
    let terms = async {
        let mut leading = leading.clone();
        loop {
            tokio::select! {
                // The guard wait_for returns is not Send: keep only the outcome.
                won = async { leading.wait_for(|l| *l).await.is_ok() } => if !won { break },
                _ = shutting_down.cancelled() => break,
            }
            lead(namespace, setup, leading.clone(), shutting_down.clone()).await;
            if shutting_down.is_cancelled() {
                break;
            }
        }
    };
    tokio::pin!(terms);
    tokio::select! {
        _ = &mut terms => Err(OperatorError::ElectionEnded),
        _ = shutdown => {
            info!("shutting down: draining reconciliations, then releasing the lease");
            signal.cancel();
            terms.await;
            Ok(())
        }
    }
}

/// Runs the controller while we lead and until shutdown. On shutdown
/// in-flight reconciliations get [`DRAIN`] to finish (the Lease is released
/// after); on losing leadership they are dropped at once: a standby may
/// take over as soon as our Lease expires, and nothing of this term may
/// write after that.
pub(crate) async fn lead(
    namespace: Option<&str>,
    setup: &TermSetup,
    mut leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    let keep = |bounded, name: &String| {
        AbortOnDrop(tokio::spawn(keep_admission_policy(
            setup.client.clone(),
            bounded,
            name.clone(),
            setup.settings.policy.clone(),
            namespace.map(str::to_string),
            setup.metrics.clone(),
        )))
    };
    let _admission = [
        keep(Bounded::CertificateRequests, &setup.admission_policy),
        keep(Bounded::Provisioners, &setup.provisioner_admission_policy),
    ];
    let (controller, ctx) = controller(namespace, setup);
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let controller = controller
        .graceful_shutdown_on(async move { stopped.cancelled().await })
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move { log_outcome(result) });
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

/// A term's controller: the Provisioners' watch, and a watch of each owned
/// kind feeding its store in the reconciliations' context.
fn controller(
    namespace: Option<&str>,
    setup: &TermSetup,
) -> (Controller<Provisioner>, Arc<Context>) {
    let client = &setup.client;
    let (service_accounts, sa) = owned_watch::<ServiceAccount>(client, namespace);
    let (roles, role) = owned_watch::<Role>(client, namespace);
    let (role_bindings, rb) = owned_watch::<RoleBinding>(client, namespace);
    let (config_maps, cm) = owned_watch::<ConfigMap>(client, namespace);
    let (services, svc) = owned_watch::<Service>(client, namespace);
    let (deployments, deploy) = owned_watch::<Deployment>(client, namespace);
    let (pdbs, pdb) = owned_watch::<PodDisruptionBudget>(client, namespace);
    let ctx = Arc::new(Context {
        client: client.clone(),
        reporter: setup.reporter.clone(),
        metrics: setup.metrics.clone(),
        settings: setup.settings.clone(),
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
    let controller = Controller::for_stream(changes, provisioners)
        .owns_stream(sa)
        .owns_stream(role)
        .owns_stream(rb)
        .owns_stream(cm)
        .owns_stream(svc)
        .owns_stream(deploy)
        .owns_stream(pdb)
        .with_config(controller::Config::default().debounce(DEBOUNCE));
    (controller, ctx)
}

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
fn owned_watch<K: OwnedKind>(
    client: &Client,
    namespace: Option<&str>,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
) {
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

/// What one reconciliation (or the controller's watch) came to, in the log.
fn log_outcome(
    result: Result<
        (ObjectRef<Provisioner>, Action),
        controller::Error<reconcile::Error, watcher::Error>,
    >,
) {
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

/// Aborts its task when dropped (the term it belongs to ended).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The gauge that says whether the policy of `bounded` is applied.
fn set_gauge(metrics: &Metrics, bounded: Bounded, applied: bool) {
    match bounded {
        Bounded::CertificateRequests => metrics.set_admission_policy(applied),
        Bounded::Provisioners => metrics.set_provisioner_admission_policy(applied),
    }
}

/// Keeps the admission policy of `bounded` applied for this term: looks
/// every 5 minutes (a read; it writes only what differs), every 30 s while
/// it fails (an API server without admissionregistration.k8s.io/v1, or an
/// operator without the RBAC for it, is told in the log each time).
async fn keep_admission_policy(
    client: Client,
    bounded: Bounded,
    name: String,
    policy: policy::Policy,
    namespace: Option<String>,
    metrics: Arc<Metrics>,
) {
    let (flag, what) = (bounded.flag(), bounded.what());
    if name.is_empty() {
        warn!(
            "no admission policy ({flag} is empty): {}",
            bounded.without()
        );
        set_gauge(&metrics, bounded, false);
        return;
    }
    let mut told = false;
    loop {
        let applied =
            admission::apply(&client, bounded, &name, &policy, namespace.as_deref()).await;
        let wait = match applied {
            Ok(()) => {
                if !told {
                    info!(policy = %name, "{what} are bounded by the admission policy");
                    told = true;
                }
                set_gauge(&metrics, bounded, true);
                Duration::from_secs(300)
            }
            Err(e) => {
                set_gauge(&metrics, bounded, false);
                told = false;
                error!(policy = %name, error = %describe(&e), "cannot apply the admission policy bounding {what} (needs Kubernetes 1.30 and the chart's RBAC); retrying in 30 s");
                Duration::from_secs(30)
            }
        };
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, fake_cluster, wait_for_line, PROVISIONERS};
    use crate::FIELD_MANAGER;

    #[tokio::test]
    async fn losing_leadership_stops_the_controller() {
        let (client, log, _server) = fake_cluster();
        let (leading_tx, leading) = watch::channel(true);
        let setup = TermSetup {
            client: client.clone(),
            reporter: Reporter::from(FIELD_MANAGER),
            metrics: Arc::new(Metrics::new()),
            settings: fixtures::settings(),
            admission_policy: String::new(),
            provisioner_admission_policy: String::new(),
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { lead(Some("ops"), &setup, leading, shutdown).await }
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

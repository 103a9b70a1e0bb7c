//! Starting a provisioner's rooms, each with the context it takes: the
//! monitoring endpoint, the client the sequences ask through, day two
//! (records, renewal, the followers of the buckets), the audit writer,
//! the intake (events, the broker, the finisher), the election, a pod's
//! link to its resource, and the dispatchers.

use super::{
    day_two, kube, pipeline, suspects, AuditRx, FinisherRx, RunError, Steering, COMPONENT,
};
use crate::monitor;
use crate::provision::metrics::Metrics;
use crate::provision::sequence;
use choria_config::{ClientSetup, ProvisionerConfig};
use choria_wire::client::{self, ChoriaClient};
use choria_wire::lifecycle::{Event, EventType};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// Who we say we are in requests. In shards mode each replica sends as its
/// own member id: go-choria's provisioning lock is keyed on
/// `<senderid>.<callerid>`, and replicas sharing one configuration would
/// otherwise share one key, so the lock could not tell them apart. The
/// sender is not checked in provisioning mode, whatever the security
/// provider (x509 or JWT callers alike), so the caller id stays as
/// configured.
fn sender(setup: &ClientSetup, cfg: &ProvisionerConfig, me: &str) -> client::Identity {
    let mut identity = setup.identity.clone();
    if cfg.election.sharded() {
        identity.identity = me.to_string();
    }
    identity
}

/// Serves `/metrics`, `/healthz` and `/readyz` when `monitor_port` is set.
pub(super) async fn monitor(
    cfg: &ProvisionerConfig,
    steering: &Steering,
    stop: &CancellationToken,
    tasks: &mut JoinSet<()>,
) -> Result<(), RunError> {
    if let Some(port) = cfg.monitor_port {
        let listener = monitor::bind(port).await?;
        info!(port, "serving /metrics, /healthz and /readyz");
        tasks.spawn(monitor_task(
            listener,
            steering.metrics.clone(),
            steering.health.clone(),
            stop.clone(),
        ));
    }
    Ok(())
}

async fn monitor_task(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    health: monitor::Health,
    stop: CancellationToken,
) {
    if let Err(e) = monitor::serve(listener, metrics, health, stop).await {
        error!(error = %e, "the monitoring endpoint stopped");
    }
}

/// The client every node's sequence and discovery ask through: it tells
/// the suspects about replies that were not the answer, and the fence
/// about every request's TTL.
pub(super) fn choria_client(
    nats: &async_nats::Client,
    setup: &ClientSetup,
    cfg: &ProvisionerConfig,
    me: &str,
    steering: &Steering,
    suspects: &suspects::Suspects,
) -> ChoriaClient {
    let mut client = ChoriaClient::new(nats.clone(), sender(setup, cfg, me))
        .with_observer(Arc::new(suspects.clone()))
        .with_fence(steering.fence.clone())
        .with_batching(cfg.request_batch_window);
    client.discovery_timeout = Duration::from_secs(2);
    client
}

/// Day two, with `records:`: the writer of records, the followers of the
/// held credentials and the revocations, the guard of the buckets and,
/// with `renewal:`, the renewal schedule, all sealing with the
/// Provisioner's key.
pub(super) fn day_two(
    cfg: &ProvisionerConfig,
    me: &str,
    steering: &Steering,
    sequences: &sequence::Context,
    records_rx: Option<mpsc::UnboundedReceiver<crate::records::Record>>,
    stop: &CancellationToken,
    tasks: &mut JoinSet<()>,
) -> Result<(), RunError> {
    let (Some(records), Some(rx)) = (&cfg.records, records_rx) else {
        return Ok(());
    };
    let sealer = crate::records::store::sealer(records, &cfg.site)?;
    if let Some(renewal) = &cfg.renewal {
        let env = choria_config::Environment::from_process();
        let setup = day_two::renewal::setup(renewal, cfg.choria_insecure, &env)?;
        let settings = day_two::renewal::Renewal {
            cfg: renewal.clone(),
            records: records.clone(),
            sealer: sealer.clone(),
            setup,
            token: cfg.token.clone(),
            name: format!("choria-provisioner renewal {me}"),
            sender: cfg.election.sharded().then(|| me.to_string()),
        };
        let ctx = day_two::renewal::Context {
            gate: steering.gate.clone(),
            metrics: steering.metrics.clone(),
            ownership: steering.ownership.clone(),
            registry: steering.registry.clone(),
            held: sequences.checks.held.clone(),
            revoked: sequences.checks.revoked.clone(),
            auditor: sequences.trail.auditor.clone(),
        };
        tasks.spawn(day_two::renewal::run(settings, ctx, stop.clone()));
    }
    followers(
        cfg,
        records,
        me,
        steering,
        sequences,
        sealer.clone(),
        stop,
        tasks,
    );
    guard(cfg, records, me, steering, stop, tasks);
    tasks.spawn(day_two::recorder::run(
        records.clone(),
        sealer,
        format!("choria-provisioner records {me}"),
        rx,
        steering.metrics.clone(),
        stop.clone(),
    ));
    Ok(())
}

/// What follows the buckets into what the sequences read: the held
/// credentials and the revocations.
#[allow(clippy::too_many_arguments)]
fn followers(
    cfg: &ProvisionerConfig,
    records: &choria_config::day_two::RecordsConfig,
    me: &str,
    steering: &Steering,
    sequences: &sequence::Context,
    sealer: crate::records::sealed::Sealer,
    stop: &CancellationToken,
    tasks: &mut JoinSet<()>,
) {
    if let Some(held) = sequences.checks.held.clone() {
        tasks.spawn(crate::held::follow::follow(
            records.clone(),
            sealer,
            held,
            format!("choria-provisioner holders {me}"),
            stop.clone(),
        ));
    }
    if let Some(revoked) = sequences.checks.revoked.clone() {
        let follower = crate::revocations::follow::Follower {
            revoked,
            site: cfg.site.clone(),
            name: format!("choria-provisioner revocations {me}"),
            metrics: steering.metrics.clone(),
            health: steering.health.clone(),
        };
        tasks.spawn(crate::revocations::follow::follow(
            records.clone(),
            follower,
            stop.clone(),
        ));
    }
}

/// Watches that no bucket we keep was erased through the JetStream API.
fn guard(
    cfg: &ProvisionerConfig,
    records: &choria_config::day_two::RecordsConfig,
    me: &str,
    steering: &Steering,
    stop: &CancellationToken,
    tasks: &mut JoinSet<()>,
) {
    let mut watched = vec![
        day_two::guard::Watched {
            bucket: records.bucket.clone(),
            label: "records",
        },
        day_two::guard::Watched {
            bucket: crate::revocations::bucket(records),
            label: "revocations",
        },
    ];
    if cfg.evidence.is_some() {
        watched.push(day_two::guard::Watched {
            bucket: crate::bindings::bucket(records),
            label: "bindings",
        });
    }
    tasks.spawn(day_two::guard::watch(
        records.clone(),
        watched,
        format!("choria-provisioner guard {me}"),
        steering.metrics.clone(),
        {
            let health = steering.health.clone();
            move |why| health.set(day_two::guard::HEALTH_CHECK, Err(why))
        },
        stop.clone(),
    ));
}

/// The audit writer, with `audit:` (which needs `records:`).
pub(super) fn audit(
    cfg: &ProvisionerConfig,
    metrics: &Arc<Metrics>,
    audit_rx: Option<AuditRx>,
    stop: &CancellationToken,
    tasks: &mut JoinSet<()>,
) -> Result<(), RunError> {
    let (Some(records), Some(audit), Some(rx)) = (&cfg.records, &cfg.audit, audit_rx) else {
        return Ok(());
    };
    let key = choria_wire::security::seal::SealKey::from_file(&records.signing_key)
        .map_err(crate::records::store::RecordsError::Key)?;
    tasks.spawn(crate::audit::writer::run(
        records.clone(),
        audit.clone(),
        key,
        cfg.site.clone(),
        rx,
        metrics.clone(),
        stop.clone(),
    ));
    Ok(())
}

/// The trace exporter, with `telemetry.otlp_endpoint`.
pub(super) fn traces(
    cfg: &ProvisionerConfig,
    me: &str,
    queue: Option<super::traces::export::Queue>,
    stop: &CancellationToken,
    tasks: &mut JoinSet<()>,
) {
    let (Some(telemetry), Some(queue)) = (&cfg.telemetry, queue) else {
        return;
    };
    let resource = super::traces::export::Resource::new(telemetry, me, &cfg.site);
    tasks.spawn(super::traces::export::run(
        queue,
        telemetry.clone(),
        resource,
        stop.clone(),
    ));
}

/// The election (or the shards' membership), when configured.
pub(super) fn election(
    nats: &async_nats::Client,
    campaign: pipeline::leadership::Campaign,
    steering: &Arc<Steering>,
    leader_tx: tokio::sync::watch::Sender<Option<String>>,
    stop: &CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    if campaign.cfg.enabled() {
        info!(candidate = %campaign.me, "campaigning under this process's own name");
    }
    pipeline::leadership::spawn(nats, campaign, steering.clone(), stop.clone(), leader_tx)
}

/// Which resource a pod follows, and who it is there.
pub(super) struct Linked {
    pub(super) resource: choria_k8s::crd::ResourceRef,
    pub(super) kube: choria_k8s::Kube,
    pub(super) pod_name: Option<String>,
    /// The candidate name.
    pub(super) me: String,
}

/// A pod's link to its own `Provisioner` (pause, status, its lists).
pub(super) fn resource_link(
    linked: Linked,
    cfg: &ProvisionerConfig,
    setup: &ClientSetup,
    steering: &Arc<Steering>,
    sequences: &sequence::Context,
    stop: &CancellationToken,
    tasks: &mut JoinSet<()>,
) {
    // status.leader names the pod (what `kubectl logs` takes), not the
    // suffixed candidate name.
    let shown = linked
        .pod_name
        .unwrap_or_else(|| setup.identity.identity.clone());
    let who = kube::resource::Me {
        candidate: linked.me.clone(),
        shown,
    };
    let link = kube::Link {
        steering: steering.clone(),
        me: linked.me,
        kube: linked.kube,
        records: cfg.records.clone(),
        site: cfg.site.clone(),
        revoked: sequences.checks.revoked.clone(),
        evidence: sequences.checks.evidence.clone(),
        auditor: sequences.trail.auditor.clone(),
    };
    let renewal = cfg.renewal.is_some() && cfg.records.is_some();
    tasks.spawn(kube::resource::run(
        linked.resource,
        who,
        Arc::new(link),
        renewal,
        stop.clone(),
    ));
}
/// Logs what we run with and publishes our own `startup` event.
pub(super) async fn announce(
    client: &ChoriaClient,
    cfg: &ProvisionerConfig,
    setup: &ClientSetup,
    version: &str,
    nats: &async_nats::Client,
) {
    info!(
        config = %cfg.file.display(),
        interval = %cfg.interval_text,
        workers = cfg.workers,
        broker = %client::connected_url(nats),
        identity = %setup.identity.identity,
        protocol = %setup.version,
        "Choria Provisioner starting"
    );
    let startup = Event::new(
        EventType::Startup,
        &setup.identity.identity,
        COMPONENT,
        Some(version),
    );
    if let Err(e) = client.publish_event(EventType::Startup, &startup).await {
        error!(error = %e, "could not publish our startup event");
    }
}

/// What the intake tasks take over.
pub(super) struct Intake {
    pub(super) broker_events: mpsc::UnboundedReceiver<async_nats::Event>,
    pub(super) finisher: FinisherRx,
    /// Bad identities and undecodable events, counted and logged at a
    /// bounded rate.
    pub(super) suspects: suspects::Suspects,
    /// The lanes' budgets, which the broker's trouble cuts.
    pub(super) pool: pipeline::lanes::Pool,
}

/// Starts what feeds the lanes besides discovery — lifecycle events — and
/// what follows the broker and forgets finished nodes.
pub(super) async fn intake(
    nats: &async_nats::Client,
    cfg: &ProvisionerConfig,
    pipeline: &Arc<pipeline::Context>,
    steering: &Arc<Steering>,
    intake: Intake,
    stop: &CancellationToken,
    tasks: &mut JoinSet<()>,
) -> Result<(), RunError> {
    // Startup events add nodes; shutdown events are hints about waiting ones.
    let startups =
        client::subscribe_events(nats, EventType::Startup, &cfg.lifecycle_component).await?;
    let shutdowns =
        client::subscribe_events(nats, EventType::Shutdown, &cfg.lifecycle_component).await?;
    tasks.spawn(pipeline::events::listen(
        futures::stream::select(startups, shutdowns),
        pipeline.clone(),
        intake.suspects,
        stop.clone(),
    ));
    tasks.spawn(pipeline::broker::watch_broker(
        intake.broker_events,
        steering.clone(),
        intake.pool,
        stop.clone(),
    ));
    tasks.spawn(
        pipeline
            .registry
            .clone()
            .run_finisher(intake.finisher, stop.clone()),
    );
    Ok(())
}

/// A dispatcher per lane.
pub(super) fn dispatchers(
    pipeline: &Arc<pipeline::Context>,
    client: &Arc<ChoriaClient>,
    pool: &pipeline::lanes::Pool,
) -> JoinSet<()> {
    let mut set = JoinSet::new();
    for lane in pipeline::registry::Lane::ALL {
        set.spawn(pipeline::dispatch::run(
            lane,
            pipeline.clone(),
            client.clone(),
            pool.clone(),
        ));
    }
    set
}

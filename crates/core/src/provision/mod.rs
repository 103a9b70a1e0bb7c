//! The provisioner: discovery and startup events offer nodes to the
//! registry; each waits in its lane until the dispatcher starts its
//! [`sequence::HostSequence`] in a task of its own (its first request
//! confirms the name); a sequence takes one of the `workers` slots only
//! while it works; the pause gate decides whether any of it may talk to
//! nodes.
//!
//! ```text
//! discovery (interval, trigger) ─┐            lanes (in flight)              slots (`workers`)
//!                                ├─> Registry ─ events (256) ────┐
//! startup events ────────────────┘      ^     discovery (512) ───┼─> HostSequence ─> template, helper, signing
//!                                       │     suspect (512) ─────┘        │ waits: RPC replies, reply windows (timers)
//!                                       └──────────── finisher <─────────┘ (forget now, or after 60 s)
//! ```
//!
//! The rooms: [`pipeline`] finds nodes and runs their sequences (broker,
//! discovery, events, registry, dispatch, and the election's steering);
//! [`sequence`] is one node's sequence (asking the node, deciding and
//! signing, applying); [`signing`] holds what deciding and signing need
//! (helper, template, cert-manager, grants, keys); [`day_two`] records what
//! was issued and renews it; [`kube`] is a pod's link to its own
//! `Provisioner`. [`gate`], [`metrics`], [`ownership`] and [`suspects`] are
//! leaves every room uses, and [`shared`] the one context they share. This
//! file wires them and stops them.

pub mod day_two;
pub mod gate;
pub mod kube;
pub mod metrics;
pub mod ownership;
pub mod pipeline;
mod prepare;
pub mod sequence;
pub mod shared;
pub mod signing;
mod stop;
pub mod suspects;
pub(crate) mod text;

pub use prepare::{prepare, PrepareError, Prepared};
pub use shared::Shared;
pub use text::one_line;

use crate::monitor::{self, Health};
use crate::provision::metrics::Metrics;
use choria_config::{ClientSetup, ConfigError, ProvisionerConfig};
use choria_k8s::Kube;
use choria_wire::client::{self, ChoriaClient, ClientError};
use choria_wire::lifecycle::{Event, EventType};
use gate::{PauseGate, PauseReason};
use pipeline::registry::{self, Registry};
use pipeline::{broker, discovery, lanes, leadership};
use signing::Signing;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// The component name in our own lifecycle events.
pub const COMPONENT: &str = "provisioner";
/// How long in-flight nodes get to reach an attempt boundary at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// The longest a shutdown takes from the signal, whatever the broker or
/// the API server do: the grace, releasing the election, stopping tasks.
pub const SHUTDOWN_LIMIT: Duration = Duration::from_millis(1500);
/// The longest the final flush of published messages may wait.
const FLUSH_AT_SHUTDOWN: Duration = Duration::from_millis(300);

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("monitoring endpoint: {0}")]
    Monitor(#[from] monitor::MonitorError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0}")]
    Unsupported(String),
    #[error("records: {0}")]
    Records(#[from] crate::records::store::RecordsError),
    #[error(transparent)]
    Admission(#[from] crate::admission::PolicyError),
    #[error(transparent)]
    Evidence(#[from] crate::evidence::EvidenceError),
}

/// How this process runs, beyond its two files.
pub struct Options {
    /// Our version, in our `startup` event.
    pub version: String,
    /// The `Provisioner` resource this process runs as (`run --provisioner`).
    pub resource: Option<choria_k8s::crd::ResourceRef>,
    /// The process's Kubernetes client: for a Lease election, cert-manager
    /// or the resource.
    pub kube: Kube,
}

impl Options {
    /// Version `version`, no resource, no Kubernetes client.
    pub fn new(version: &str) -> Self {
        Options {
            version: version.to_string(),
            resource: None,
            kube: Kube::unavailable("this provisioner was started without a Kubernetes client"),
        }
    }
}

/// Whether a provisioner with `cfg` (running as a resource or not) talks
/// to Kubernetes, so the binary makes a client only when one is needed.
pub fn needs_kubernetes(cfg: &ProvisionerConfig, resource: bool) -> bool {
    resource
        || cfg.cert_manager.is_some()
        || cfg.election.backend == choria_config::ElectionBackend::Lease
}

type AuditRx = mpsc::Receiver<(crate::audit::event::Kind, crate::audit::event::Event)>;
type FinisherRx = mpsc::UnboundedReceiver<(Arc<registry::Ticket>, Duration)>;

/// The `run` subcommand's work, until `shutdown` fires.
pub struct Provisioner {
    shared: Arc<Shared>,
    setup: ClientSetup,
    version: String,
    /// What the record writer takes (with `records:`).
    records_rx: Option<mpsc::UnboundedReceiver<crate::records::Record>>,
    /// What the audit writer takes (with `audit:`).
    audit_rx: Option<AuditRx>,
    pod_name: Option<String>,
    trigger_rx: mpsc::Receiver<()>,
    finisher_rx: FinisherRx,
    leader_tx: tokio::sync::watch::Sender<Option<String>>,
}

impl Provisioner {
    /// Everything made before anything connects. With an election, or
    /// running as a resource, it starts paused.
    pub fn new(
        cfg: ProvisionerConfig,
        setup: ClientSetup,
        options: Options,
    ) -> Result<Self, RunError> {
        let cfg = Arc::new(cfg);
        let metrics = Arc::new(Metrics::new(&cfg.site));
        let gate = PauseGate::new(metrics.clone());
        let (registry, finisher_rx) = Registry::new(cfg.interval, metrics.clone());
        let (trigger, trigger_rx) = mpsc::channel(1);
        let (leader_tx, leader) = tokio::sync::watch::channel(None);
        // With an election every replica starts paused, before any work.
        if cfg.election.enabled() {
            gate.pause(PauseReason::Election);
        }
        // A pod is paused until its resource's first watch event says
        // whether `spec.paused` is set: it must not work before it knows
        // (the API server may be slow or unreachable at start).
        if options.resource.is_some() {
            gate.pause(PauseReason::Requested);
        }
        let pod_name = std::env::var("POD_NAME").ok().filter(|p| !p.is_empty());
        let me = candidate_identity(&setup.identity.identity, pod_name.as_deref());
        let ownership = if cfg.election.sharded() {
            ownership::Ownership::shard(&me)
        } else {
            ownership::Ownership::everything()
        };
        let (recorder, records_rx) = match cfg.records {
            Some(_) => {
                let (r, rx) = day_two::recorder::Recorder::new();
                (r, Some(rx))
            }
            None => (day_two::recorder::Recorder::off(), None),
        };
        let (auditor, audit_rx) = match cfg.audit {
            Some(_) => {
                let site = if cfg.site.is_empty() { "-" } else { &cfg.site };
                let (a, rx) = crate::audit::writer::Auditor::new(
                    format!("choria-provisioner/{site}/{me}"),
                    metrics.clone(),
                );
                (a, Some(rx))
            }
            None => (crate::audit::writer::Auditor::off(), None),
        };
        let signing = Signing::new(&cfg, &options.kube, options.resource.as_ref())?;
        let admission = cfg
            .admission
            .as_ref()
            .map(crate::admission::Policy::load)
            .transpose()?
            .map(Arc::new);
        let evidence = crate::evidence::Gate::load(&cfg, &me)?;
        let shared = Shared {
            evidence,
            held: cfg
                .records
                .as_ref()
                .map(|_| crate::records::held::Held::default()),
            revoked: cfg
                .records
                .as_ref()
                .map(|_| crate::records::revocations::Revoked::default()),
            admission,
            auditor,
            me,
            gate,
            registry,
            health: Health::new(),
            leader,
            ownership,
            recorder,
            fence: choria_wire::fence::Fence::default(),
            signing,
            slots: Arc::new(tokio::sync::Semaphore::new(cfg.workers.max(1))),
            abandon: CancellationToken::new(),
            logs: Arc::new(suspects::LogLimiter::with_burst(suspects::NODE_LOG_BURST)),
            kube: options.kube,
            resource: options.resource,
            trigger,
            metrics,
            cfg,
        };
        Ok(Provisioner {
            shared: Arc::new(shared),
            setup,
            version: options.version,
            records_rx,
            audit_rx,
            pod_name,
            trigger_rx,
            finisher_rx,
            leader_tx,
        })
    }

    /// The parts a running provisioner shares, for whatever steers it.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Runs until `shutdown` fires, then stops gracefully: the gate closes at
    /// once, in-flight nodes get [`SHUTDOWN_GRACE`] to reach an attempt
    /// boundary and are then abandoned (whoever leads next retries them).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), RunError> {
        let Provisioner {
            shared,
            setup,
            version,
            records_rx,
            audit_rx,
            pod_name,
            mut trigger_rx,
            finisher_rx,
            leader_tx,
        } = self;
        let stop_tasks = CancellationToken::new();
        let mut tasks = JoinSet::new();
        start_monitor(&shared, &stop_tasks, &mut tasks).await?;

        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let connected =
            broker::connect_until_up(&setup, events_tx, &shared.fence, &shared.health, &shutdown);
        let Some(nats) = connected.await? else {
            stop_tasks.cancel();
            while tasks.join_next().await.is_some() {}
            return Ok(());
        };
        let suspects = suspects::Suspects::new(shared.metrics.clone());
        let client = Arc::new(choria_client(&nats, &setup, &shared, &suspects));
        announce(&client, &shared.cfg, &setup, &version, &nats).await;

        start_day_two(&shared, records_rx, &stop_tasks, &mut tasks)?;
        start_audit(&shared, audit_rx, &stop_tasks, &mut tasks)?;
        let credentials = shared.signing.credentials.clone();
        tasks.spawn(credentials.watch(stop_tasks.clone()));
        let pool = lanes::Pool::new();
        let intake = Intake {
            broker_events: events_rx,
            finisher: finisher_rx,
        };
        start_intake(&nats, &shared, &suspects, intake, &stop_tasks, &mut tasks).await?;

        let election_stop = CancellationToken::new();
        let election = start_election(&shared, &nats, leader_tx, &election_stop);
        start_resource_link(&shared, &setup, pod_name, &stop_tasks, &mut tasks);

        let dispatchers = start_dispatchers(&shared, &client, &pool);
        let cfg = &shared.cfg;
        let opts = discovery::options(cfg.discovery_timeout, cfg.discovery_window);
        let interval = cfg.interval;
        discovery::run(&client, &shared, opts, interval, &mut trigger_rx, &shutdown).await;

        info!("shutting down");
        stop::stop(stop::Stopping {
            shared,
            pool,
            dispatchers,
            election,
            election_stop,
            stop_tasks,
            tasks,
            nats,
        })
        .await;
        Ok(())
    }
}

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
async fn start_monitor(
    shared: &Arc<Shared>,
    stop: &CancellationToken,
    tasks: &mut JoinSet<()>,
) -> Result<(), RunError> {
    if let Some(port) = shared.cfg.monitor_port {
        let listener = monitor::bind(port).await?;
        info!(port, "serving /metrics, /healthz and /readyz");
        tasks.spawn(monitor_task(
            listener,
            shared.metrics.clone(),
            shared.health.clone(),
            stop.clone(),
        ));
    }
    Ok(())
}

/// The client every node's sequence and discovery ask through: it tells
/// the suspects about replies that were not the answer, and the fence
/// about every request's TTL.
fn choria_client(
    nats: &async_nats::Client,
    setup: &ClientSetup,
    shared: &Shared,
    suspects: &suspects::Suspects,
) -> ChoriaClient {
    let mut client = ChoriaClient::new(nats.clone(), sender(setup, &shared.cfg, &shared.me))
        .with_observer(Arc::new(suspects.clone()))
        .with_fence(shared.fence.clone());
    client.discovery_timeout = Duration::from_secs(2);
    client
}

/// Day two, with `records:`: the writer of records and, with `renewal:`,
/// the renewal schedule, both sealing with the Provisioner's key.
fn start_day_two(
    shared: &Arc<Shared>,
    records_rx: Option<mpsc::UnboundedReceiver<crate::records::Record>>,
    stop: &CancellationToken,
    tasks: &mut JoinSet<()>,
) -> Result<(), RunError> {
    let cfg = &shared.cfg;
    let (Some(records), Some(rx)) = (&cfg.records, records_rx) else {
        return Ok(());
    };
    let sealer = crate::records::store::sealer(records, &cfg.site)?;
    if let Some(renewal) = &cfg.renewal {
        let env = choria_config::Environment::from_process();
        let setup = day_two::renewal::setup(renewal, cfg.choria_insecure, &env)?;
        let me = &shared.me;
        tasks.spawn(day_two::renewal::run(
            day_two::renewal::Renewal {
                cfg: renewal.clone(),
                records: records.clone(),
                sealer: sealer.clone(),
                setup,
                token: cfg.token.clone(),
                name: format!("choria-provisioner renewal {me}"),
                sender: cfg.election.sharded().then(|| me.clone()),
            },
            shared.clone(),
            stop.clone(),
        ));
    }
    tasks.spawn(day_two::holders::follow(
        records.clone(),
        sealer.clone(),
        shared.clone(),
        stop.clone(),
    ));
    tasks.spawn(day_two::revocations::follow(
        records.clone(),
        shared.clone(),
        stop.clone(),
    ));
    let mut watched = vec![
        day_two::guard::Watched {
            bucket: records.bucket.clone(),
            label: "records",
        },
        day_two::guard::Watched {
            bucket: crate::records::revocations::bucket(records),
            label: "revocations",
        },
    ];
    if cfg.evidence.is_some() {
        watched.push(day_two::guard::Watched {
            bucket: crate::evidence::bindings::bucket(records),
            label: "bindings",
        });
    }
    tasks.spawn(day_two::guard::watch(
        records.clone(),
        watched,
        format!("choria-provisioner guard {}", shared.me),
        shared.metrics.clone(),
        {
            let health = shared.health.clone();
            move |why| health.set(day_two::guard::HEALTH_CHECK, Err(why))
        },
        stop.clone(),
    ));
    tasks.spawn(day_two::recorder::run(
        records.clone(),
        sealer,
        format!("choria-provisioner records {}", shared.me),
        rx,
        shared.metrics.clone(),
        stop.clone(),
    ));
    Ok(())
}

/// The audit writer, with `audit:` (which needs `records:`).
fn start_audit(
    shared: &Arc<Shared>,
    audit_rx: Option<AuditRx>,
    stop: &CancellationToken,
    tasks: &mut JoinSet<()>,
) -> Result<(), RunError> {
    let cfg = &shared.cfg;
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
        shared.metrics.clone(),
        stop.clone(),
    ));
    Ok(())
}

/// The election (or the shards' membership), when configured.
fn start_election(
    shared: &Arc<Shared>,
    nats: &async_nats::Client,
    leader_tx: tokio::sync::watch::Sender<Option<String>>,
    stop: &CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    if shared.cfg.election.enabled() {
        info!(candidate = %shared.me, "campaigning under this process's own name");
    }
    leadership::spawn(nats, shared.clone(), stop.clone(), leader_tx)
}

/// A pod's link to its own `Provisioner` (pause, status), when it runs as
/// one.
fn start_resource_link(
    shared: &Arc<Shared>,
    setup: &ClientSetup,
    pod_name: Option<String>,
    stop: &CancellationToken,
    tasks: &mut JoinSet<()>,
) {
    let Some(r) = shared.resource.clone() else {
        return;
    };
    // status.leader names the pod (what `kubectl logs` takes), not the
    // suffixed candidate name.
    let shown = pod_name.unwrap_or_else(|| setup.identity.identity.clone());
    let who = kube::resource::Me {
        candidate: shared.me.clone(),
        shown,
    };
    let renewal = shared.cfg.renewal.is_some() && shared.cfg.records.is_some();
    tasks.spawn(kube::resource::run(
        r,
        who,
        shared.clone(),
        renewal,
        stop.clone(),
    ));
}

/// Logs what we run with and publishes our own `startup` event.
async fn announce(
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

/// The receivers the intake tasks take over.
struct Intake {
    broker_events: mpsc::UnboundedReceiver<async_nats::Event>,
    finisher: FinisherRx,
}

/// Starts what feeds the lanes besides discovery — lifecycle events — and
/// what follows the broker and forgets finished nodes.
#[allow(clippy::too_many_arguments)]
async fn start_intake(
    nats: &async_nats::Client,
    shared: &Arc<Shared>,
    suspects: &suspects::Suspects,
    intake: Intake,
    stop: &CancellationToken,
    tasks: &mut JoinSet<()>,
) -> Result<(), RunError> {
    // Startup events add nodes; shutdown events are hints about waiting ones.
    let cfg = &shared.cfg;
    let startups =
        client::subscribe_events(nats, EventType::Startup, &cfg.lifecycle_component).await?;
    let shutdowns =
        client::subscribe_events(nats, EventType::Shutdown, &cfg.lifecycle_component).await?;
    tasks.spawn(pipeline::events::listen(
        futures::stream::select(startups, shutdowns),
        shared.clone(),
        suspects.clone(),
        stop.clone(),
    ));
    tasks.spawn(pipeline::broker::watch_broker(
        intake.broker_events,
        shared.clone(),
        stop.clone(),
    ));
    tasks.spawn(
        shared
            .registry
            .clone()
            .run_finisher(intake.finisher, stop.clone()),
    );
    Ok(())
}

/// A dispatcher per lane.
fn start_dispatchers(
    shared: &Arc<Shared>,
    client: &Arc<ChoriaClient>,
    pool: &pipeline::lanes::Pool,
) -> JoinSet<()> {
    let mut set = JoinSet::new();
    for lane in pipeline::registry::Lane::ALL {
        set.spawn(pipeline::dispatch::run(
            lane,
            shared.clone(),
            client.clone(),
            pool.clone(),
        ));
    }
    set
}

/// The name we campaign under: the pod name in Kubernetes, else the Choria
/// identity, with a random suffix that makes it this process's own.
/// Replicas share their configuration, so the Choria identity is not
/// unique, and even pod names repeat (a StatefulSet, a pod re-created under
/// its name, two processes in one pod): with a shared name every replica
/// would take the record for its own and believe it leads. The suffix also
/// tells a restarted process from its predecessor in `choria election view`.
pub fn candidate_identity(choria_identity: &str, pod_name: Option<&str>) -> String {
    let base = pod_name
        .filter(|p| !p.is_empty())
        .unwrap_or(choria_identity);
    format!("{base}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

async fn monitor_task(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    health: Health,
    stop: CancellationToken,
) {
    if let Err(e) = monitor::serve(listener, metrics, health, stop).await {
        error!(error = %e, "the monitoring endpoint stopped");
    }
}

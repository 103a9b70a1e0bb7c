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
//! `Provisioner`. [`gate`], [`metrics`], [`ownership`], [`suspects`] and
//! [`traces`] (one trace per node sequence, exported over OTLP) are
//! leaves every room uses; [`steering`] is what steers a running
//! provisioner from outside (the election, `spec.paused`, shutdown). Each
//! room takes a context of its own, made here once: this file makes them,
//! `start` starts the rooms' tasks with them, `stop` stops them.

pub mod day_two;
pub mod gate;
pub mod kube;
pub mod metrics;
pub mod ownership;
pub mod pipeline;
mod prepare;
pub mod sequence;
pub mod signing;
mod start;
pub mod steering;
mod stop;
pub mod suspects;
pub(crate) mod text;
pub mod traces;

pub use prepare::{prepare, PrepareError, Prepared};
pub use steering::Steering;
pub use text::one_line;

use crate::monitor::{self, Health};
use crate::provision::metrics::Metrics;
use choria_config::{ClientSetup, ConfigError, ProvisionerConfig};
use choria_k8s::Kube;
use choria_wire::client::{ChoriaClient, ClientError};
use gate::{PauseGate, PauseReason};
use pipeline::registry::{self, Registry};
use pipeline::{broker, discovery, lanes};
use sequence::{Checks, Trail};
use signing::Signing;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::info;

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
    rooms: Rooms,
    channels: Channels,
}

/// What the rooms are started with.
struct Rooms {
    cfg: Arc<ProvisionerConfig>,
    /// This process's own name in the election or the shards.
    me: String,
    steering: Arc<Steering>,
    /// What discovery, the events and the dispatchers work with (every
    /// sequence's context inside).
    pipeline: Arc<pipeline::Context>,
    /// The process's Kubernetes client (or why there is none).
    kube: Kube,
    /// The `Provisioner` resource this process runs as (`run --provisioner`).
    resource: Option<choria_k8s::crd::ResourceRef>,
    setup: ClientSetup,
    version: String,
    pod_name: Option<String>,
}

/// The receiving ends the rooms' tasks take over when they start.
struct Channels {
    /// What the record writer takes (with `records:`).
    records_rx: RecordsRx,
    /// What the audit writer takes (with `audit:`).
    audit_rx: Option<AuditRx>,
    trigger_rx: mpsc::Receiver<()>,
    finisher_rx: FinisherRx,
    leader_tx: tokio::sync::watch::Sender<Option<String>>,
    /// What the trace exporter takes (with `telemetry.otlp_endpoint`).
    traces: Option<traces::export::Queue>,
}

impl Provisioner {
    /// Everything made before anything connects: each room's context. With
    /// an election, or running as a resource, it starts paused.
    pub fn new(
        cfg: ProvisionerConfig,
        setup: ClientSetup,
        options: Options,
    ) -> Result<Self, RunError> {
        let cfg = Arc::new(cfg);
        let pod_name = std::env::var("POD_NAME").ok().filter(|p| !p.is_empty());
        let me = candidate_identity(&setup.identity.identity, pod_name.as_deref());
        let metrics = Arc::new(Metrics::new(&cfg.site));
        let (steering, finisher_rx, trigger_rx, leader_tx) =
            steering(&cfg, &me, &metrics, options.resource.is_some());
        let (trail, records_rx, audit_rx) = trail(&cfg, &me, &metrics);
        let (tracer, traces) = match &cfg.telemetry {
            Some(t) => {
                let (tracer, queue) = traces::Tracer::new(t);
                (tracer, Some(queue))
            }
            None => (traces::Tracer::off(), None),
        };
        let sequences = sequence::Context {
            signing: Signing::new(&cfg, &options.kube, options.resource.as_ref())?,
            checks: checks(&cfg, &me)?,
            me: me.clone(),
            gate: steering.gate.clone(),
            metrics: metrics.clone(),
            ownership: steering.ownership.clone(),
            trail: trail.clone(),
            slots: Arc::new(tokio::sync::Semaphore::new(cfg.workers.max(1))),
            abandon: CancellationToken::new(),
            logs: Arc::new(suspects::LogLimiter::with_burst(suspects::NODE_LOG_BURST)),
            tracer,
            cfg: cfg.clone(),
        };
        let pipeline = pipeline::Context {
            registry: steering.registry.clone(),
            gate: steering.gate.clone(),
            ownership: steering.ownership.clone(),
            metrics,
            logs: sequences.logs.clone(),
            auditor: trail.auditor,
            sequences: Arc::new(sequences),
        };
        let rooms = Rooms {
            cfg,
            me,
            steering: Arc::new(steering),
            pipeline: Arc::new(pipeline),
            kube: options.kube,
            resource: options.resource,
            setup,
            version: options.version,
            pod_name,
        };
        let channels = Channels {
            records_rx,
            audit_rx,
            trigger_rx,
            finisher_rx,
            leader_tx,
            traces,
        };
        Ok(Provisioner { rooms, channels })
    }

    /// How the running provisioner is steered and watched from outside
    /// (`run --progress`, tests).
    pub fn steering(&self) -> Arc<Steering> {
        self.rooms.steering.clone()
    }

    /// Runs until `shutdown` fires, then stops gracefully: the gate closes at
    /// once, in-flight nodes get [`SHUTDOWN_GRACE`] to reach an attempt
    /// boundary and are then abandoned (whoever leads next retries them).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), RunError> {
        let Provisioner { rooms, channels } = self;
        let stop_tasks = CancellationToken::new();
        let mut tasks = JoinSet::new();
        start::monitor(&rooms.cfg, &rooms.steering, &stop_tasks, &mut tasks).await?;
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let steering = &rooms.steering;
        let connected = broker::connect_until_up(
            &rooms.setup,
            events_tx,
            &steering.fence,
            &steering.health,
            &shutdown,
        );
        let Some(nats) = connected.await? else {
            stop_tasks.cancel();
            while tasks.join_next().await.is_some() {}
            return Ok(());
        };
        let Channels {
            records_rx,
            audit_rx,
            mut trigger_rx,
            finisher_rx,
            leader_tx,
            traces,
        } = channels;
        start::traces(&rooms.cfg, &rooms.me, traces, &stop_tasks, &mut tasks);
        let metrics = steering.metrics.clone();
        let pool = lanes::Pool::new(|lane| metrics.in_flight_bound(lane.name()));
        let intake = start::Intake {
            broker_events: events_rx,
            finisher: finisher_rx,
            suspects: suspects::Suspects::new(steering.metrics.clone()),
            pool: pool.clone(),
        };
        let client = rooms
            .start_work(&nats, intake, records_rx, audit_rx, &stop_tasks, &mut tasks)
            .await?;
        let election_stop = CancellationToken::new();
        let election =
            rooms.start_steering(&nats, leader_tx, &election_stop, &stop_tasks, &mut tasks);
        let dispatchers = start::dispatchers(&rooms.pipeline, &client, &pool);
        let cfg = &rooms.cfg;
        let opts = discovery::options(cfg.discovery_timeout, cfg.discovery_window);
        let pipeline = &rooms.pipeline;
        discovery::run(
            &client,
            pipeline,
            opts,
            cfg.interval,
            &mut trigger_rx,
            &shutdown,
        )
        .await;

        info!("shutting down");
        stop::stop(stop::Stopping {
            steering: rooms.steering.clone(),
            sequences: pipeline.sequences.clone(),
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

impl Rooms {
    /// Once connected: the client every sequence asks through, our
    /// startup event, day two, the audit, the credentials' watch and the
    /// intake (events, the broker, the finisher).
    async fn start_work(
        &self,
        nats: &async_nats::Client,
        intake: start::Intake,
        records_rx: RecordsRx,
        audit_rx: Option<AuditRx>,
        stop: &CancellationToken,
        tasks: &mut JoinSet<()>,
    ) -> Result<Arc<ChoriaClient>, RunError> {
        let (cfg, me, steering) = (&self.cfg, &self.me, &self.steering);
        let sequences = &self.pipeline.sequences;
        let client = start::choria_client(nats, &self.setup, cfg, me, steering, &intake.suspects);
        let client = Arc::new(client);
        start::announce(&client, cfg, &self.setup, &self.version, nats).await;
        start::day_two(cfg, me, steering, sequences, records_rx, stop, tasks)?;
        start::audit(cfg, &steering.metrics, audit_rx, stop, tasks)?;
        let credentials = sequences.signing.credentials.clone();
        tasks.spawn(credentials.watch(stop.clone()));
        start::intake(nats, cfg, &self.pipeline, steering, intake, stop, tasks).await?;
        Ok(client)
    }

    /// What steers the work: the election (or the shards' membership) and
    /// a pod's link to its own resource.
    fn start_steering(
        &self,
        nats: &async_nats::Client,
        leader_tx: tokio::sync::watch::Sender<Option<String>>,
        election_stop: &CancellationToken,
        stop: &CancellationToken,
        tasks: &mut JoinSet<()>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let campaign = pipeline::leadership::Campaign {
            cfg: self.cfg.election.clone(),
            me: self.me.clone(),
            kube: self.kube.clone(),
            resource: self.resource.clone(),
        };
        let election = start::election(nats, campaign, &self.steering, leader_tx, election_stop);
        if let Some(resource) = self.resource.clone() {
            let linked = start::Linked {
                resource,
                kube: self.kube.clone(),
                pod_name: self.pod_name.clone(),
                me: self.me.clone(),
            };
            let (cfg, sequences) = (&self.cfg, &self.pipeline.sequences);
            start::resource_link(
                linked,
                cfg,
                &self.setup,
                &self.steering,
                sequences,
                stop,
                tasks,
            );
        }
        election
    }
}

type Made = (
    Steering,
    FinisherRx,
    mpsc::Receiver<()>,
    tokio::sync::watch::Sender<Option<String>>,
);

/// The controls, and the channels behind them (the finisher's, discovery's
/// trigger, the leader's). Paused from the start with an election (every
/// replica, before any work), and for a pod until its resource's first
/// watch event says whether `spec.paused` is set: it must not work before
/// it knows (the API server may be slow or unreachable at start).
fn steering(cfg: &ProvisionerConfig, me: &str, metrics: &Arc<Metrics>, resource: bool) -> Made {
    let gate = PauseGate::new(metrics.clone());
    let (registry, finisher_rx) = Registry::new(cfg.interval, metrics.clone());
    let (trigger, trigger_rx) = mpsc::channel(1);
    let (leader_tx, leader) = tokio::sync::watch::channel(None);
    if cfg.election.enabled() {
        gate.pause(PauseReason::Election);
    }
    if resource {
        gate.pause(PauseReason::Requested);
    }
    let ownership = if cfg.election.sharded() {
        ownership::Ownership::shard(me)
    } else {
        ownership::Ownership::everything()
    };
    let steering = Steering {
        gate,
        registry,
        metrics: metrics.clone(),
        health: Health::new(),
        ownership,
        fence: choria_wire::fence::Fence::default(),
        leader,
        trigger,
    };
    (steering, finisher_rx, trigger_rx, leader_tx)
}

type RecordsRx = Option<mpsc::UnboundedReceiver<crate::records::Record>>;

/// Where sequences write what they decided: the records (with
/// `records:`) and the audit (with `audit:`), and what their writers take.
fn trail(
    cfg: &ProvisionerConfig,
    me: &str,
    metrics: &Arc<Metrics>,
) -> (Trail, RecordsRx, Option<AuditRx>) {
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
    (Trail { recorder, auditor }, records_rx, audit_rx)
}

/// The checks of a node's standing that are configured: revocations and
/// held credentials (with `records:`), the admission policy, the evidence.
fn checks(cfg: &ProvisionerConfig, me: &str) -> Result<Checks, RunError> {
    let admission = cfg
        .admission
        .as_ref()
        .map(crate::admission::Policy::load)
        .transpose()?
        .map(Arc::new);
    Ok(Checks {
        revoked: cfg
            .records
            .as_ref()
            .map(|_| crate::revocations::Revoked::default()),
        held: cfg.records.as_ref().map(|_| crate::held::Held::default()),
        admission,
        evidence: crate::evidence::Gate::load(cfg, me)?.map(Arc::new),
    })
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

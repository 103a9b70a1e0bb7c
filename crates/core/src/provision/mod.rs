//! The provisioner: discovery and startup events offer nodes to the
//! registry; each waits in its lane until the dispatcher starts its
//! [`sequence::host::HostSequence`] in a task of its own (its first request confirms
//! the name); a sequence takes one of the `workers` slots only while it
//! works; the pause gate decides whether any of it may talk to nodes.
//!
//! ```text
//! discovery (interval, trigger) ─┐            lanes (in flight)              slots (`workers`)
//!                                ├─> Registry ─ events (256) ────┐
//! startup events ────────────────┘      ^     discovery (512) ───┼─> HostSequence ─> template, helper, signing
//!                                       │     suspect (512) ─────┘        │ waits: RPC replies, reply windows (timers)
//!                                       └──────────── finisher <─────────┘ (forget now, or after 60 s)
//! ```
//!
//! One file per stage: `broker` (connecting, following the connection),
//! `discovery`, `events`, `dispatch` (the lanes' budgets, the slots, and
//! what a sequence's outcome does); this file wires them and stops them.

pub mod day_two;
pub mod gate;
pub mod kube;
pub mod metrics;
pub mod ownership;
pub mod pipeline;
pub mod sequence;
pub mod signing;
pub mod suspects;

use crate::monitor::{self, Health};
use crate::provision::metrics::Metrics;
use choria_config::{ClientSetup, ConfigError, ProvisionerConfig};
use choria_wire::client::{self, ChoriaClient, ClientError};
use choria_wire::lifecycle::{Event, EventType};
use gate::{PauseGate, PauseReason};
use pipeline::registry::Registry;
use sequence::host::Context;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

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
}

/// Why the provisioner cannot start: a file is missing, malformed or
/// inconsistent. Found before anything connects (`run` and `run --check`).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("the provisioner could not be configured: {0}")]
    Provisioner(#[source] ConfigError),
    #[error("could not load the Choria client configuration: {0}")]
    Choria(#[source] ConfigError),
    #[error("could not set up the Choria client: {0}")]
    Setup(#[source] ConfigError),
    #[error("could not set up renewal's Choria client (renewal.choria_config): {0}")]
    Renewal(#[source] ConfigError),
    #[error("records: {0}")]
    Records(#[source] crate::records::store::RecordsError),
    #[error("could not set up TLS to the broker ({}): {source}", .file.display())]
    Tls {
        file: std::path::PathBuf,
        #[source]
        source: choria_wire::tls::TlsError,
    },
}

/// Both configuration files, loaded and checked: what [`Provisioner::new`]
/// takes.
#[derive(Debug)]
pub struct Prepared {
    pub config: ProvisionerConfig,
    pub setup: ClientSetup,
}

impl Prepared {
    /// Every warning of both files.
    pub fn warnings(&self) -> Vec<choria_config::ConfigWarning> {
        let mut all = self.config.warnings.clone();
        all.extend(self.setup.warnings.iter().cloned());
        all
    }

    /// The effective settings of both files, secrets redacted, as
    /// `key: value` lines under a heading per file.
    pub fn report(&self) -> String {
        let mut out = format!("# {} (effective settings)\n", self.config.file.display());
        for (k, v) in self.config.effective_settings() {
            out.push_str(&format!("{k}: {v}\n"));
        }
        out.push_str("\n# Choria client (how the provisioner connects and signs)\n");
        for (k, v) in self.setup.effective_settings() {
            out.push_str(&format!("{k}: {v}\n"));
        }
        out
    }
}

/// Loads and checks both files: everything `run` verifies before it
/// connects (the files the settings point at, the helper, the deny list, the
/// TLS credentials). `run --check` is this and a report.
pub fn prepare(
    config: &std::path::Path,
    choria_config: &std::path::Path,
    env: &choria_config::Environment,
) -> Result<Prepared, PrepareError> {
    let cfg = ProvisionerConfig::load(config).map_err(PrepareError::Provisioner)?;
    cfg.helper_command().map_err(PrepareError::Provisioner)?;
    cfg.cert_deny_regexes().map_err(PrepareError::Provisioner)?;
    let ccfg = choria_config::ChoriaClientConfig::load_with(choria_config, env)
        .map_err(PrepareError::Choria)?;
    let setup = ccfg.client_setup(&cfg, env).map_err(PrepareError::Setup)?;
    if let Some(r) = &cfg.renewal {
        day_two::renewal::setup(r, cfg.choria_insecure, env).map_err(PrepareError::Renewal)?;
    }
    if let Some(r) = &cfg.records {
        crate::records::store::sealer(r, &cfg.site).map_err(PrepareError::Records)?;
    }
    if setup.connect.tls.is_custom() {
        setup
            .connect
            .tls
            .client_config()
            .map_err(|source| PrepareError::Tls {
                file: ccfg.file.clone(),
                source,
            })?;
    }
    Ok(Prepared { config: cfg, setup })
}

/// A running provisioner's shared parts, handed to whatever steers it (the
/// election, the operator's pause, tests).
#[derive(Clone)]
pub struct Handle {
    pub gate: PauseGate,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    pub health: Health,
    /// Who leads (with an election); `None` when unknown or no election.
    pub leader: tokio::sync::watch::Receiver<Option<String>>,
    /// Which nodes are ours (all of them, except in shards mode).
    pub ownership: ownership::Ownership,
    /// Where records of provisionings go (nowhere without `records:`).
    pub recorder: day_two::recorder::Recorder,
    /// Holds reconnects after a loss of leadership while disconnected.
    pub fence: choria_wire::fence::Fence,
    trigger: mpsc::Sender<()>,
}

impl Handle {
    /// Asks for a discovery now; coalesces with one already pending.
    pub fn trigger_discovery(&self) {
        let _ = self.trigger.try_send(());
    }

    /// Pauses for `reason`; when leadership is lost the registry and queue
    /// are emptied too, so nothing stale is worked after a later win.
    pub fn pause(&self, reason: PauseReason, forget_hosts: bool) {
        self.gate.pause(reason);
        if forget_hosts {
            let dropped = self.registry.clear();
            info!(dropped, "emptied the host registry and work queue");
        }
    }

    /// Lifts `reason` and, when that opened the gate, discovers at once.
    pub fn resume(&self, reason: PauseReason) {
        self.gate.resume(reason);
        if !self.gate.is_paused() {
            self.trigger_discovery();
        }
    }
}

type FinisherRx = mpsc::UnboundedReceiver<(Arc<pipeline::registry::Ticket>, Duration)>;

/// The `run` subcommand's work, until `shutdown` fires.
pub struct Provisioner {
    cfg: Arc<ProvisionerConfig>,
    setup: ClientSetup,
    /// This process's own name in the election or the shards.
    me: String,
    /// What the record writer takes (with `records:`).
    records_rx: Option<mpsc::UnboundedReceiver<crate::records::Record>>,
    pod_name: Option<String>,
    version: String,
    handle: Handle,
    trigger_rx: mpsc::Receiver<()>,
    finisher_rx: FinisherRx,
    leader_tx: tokio::sync::watch::Sender<Option<String>>,
    resource: Option<kube::resource::ResourceRef>,
}

impl Provisioner {
    pub fn new(cfg: ProvisionerConfig, setup: ClientSetup, version: &str) -> Self {
        let metrics = Arc::new(Metrics::new(&cfg.site));
        let gate = PauseGate::new(metrics.clone());
        let (registry, finisher_rx) = Registry::new(cfg.interval, metrics.clone());
        let (trigger, trigger_rx) = mpsc::channel(1);
        let (leader_tx, leader) = tokio::sync::watch::channel(None);
        // With an election every replica starts paused, before any work.
        if cfg.election.enabled() {
            gate.pause(PauseReason::Election);
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
        Provisioner {
            cfg: Arc::new(cfg),
            setup,
            me,
            pod_name,
            version: version.to_string(),
            handle: Handle {
                gate,
                registry,
                metrics,
                health: Health::new(),
                leader,
                ownership,
                recorder,
                fence: choria_wire::fence::Fence::default(),
                trigger,
            },
            records_rx,
            trigger_rx,
            finisher_rx,
            leader_tx,
            resource: None,
        }
    }

    /// Follows this Provisioner resource (pause, leader status), as pods the
    /// operator runs do.
    pub fn with_resource(mut self, resource: kube::resource::ResourceRef) -> Self {
        // Paused until the resource's first watch event says whether
        // `spec.paused` is set: a pod must not work before it knows (the
        // API server may be slow or unreachable at start).
        self.handle.gate.pause(PauseReason::Requested);
        self.resource = Some(resource);
        self
    }

    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Runs until `shutdown` fires, then stops gracefully: the gate closes at
    /// once, in-flight nodes get [`SHUTDOWN_GRACE`] to reach an attempt
    /// boundary and are then abandoned (whoever leads next retries them).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), RunError> {
        let Provisioner {
            cfg,
            setup,
            me,
            records_rx,
            pod_name,
            version,
            handle,
            mut trigger_rx,
            finisher_rx,
            leader_tx,
            resource,
        } = self;
        let stop_tasks = CancellationToken::new();
        let mut tasks = JoinSet::new();
        start_monitor(&cfg, &handle, &stop_tasks, &mut tasks).await?;

        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let Some(nats) = pipeline::broker::connect_until_up(
            &setup,
            events_tx,
            &handle.fence,
            &handle.health,
            &shutdown,
        )
        .await?
        else {
            stop_tasks.cancel();
            while tasks.join_next().await.is_some() {}
            return Ok(());
        };
        let suspects = suspects::Suspects::new(handle.metrics.clone());
        let mut client = ChoriaClient::new(nats.clone(), sender(&setup, &cfg, &me))
            .with_observer(Arc::new(suspects.clone()))
            .with_fence(handle.fence.clone());
        client.discovery_timeout = Duration::from_secs(2);
        announce(&client, &cfg, &setup, &version, &nats).await;

        let sealer = match &cfg.records {
            Some(r) => Some(crate::records::store::sealer(r, &cfg.site)?),
            None => None,
        };
        if let (Some(renewal), Some(records), Some(sealer)) = (&cfg.renewal, &cfg.records, &sealer)
        {
            let env = choria_config::Environment::from_process();
            let setup = day_two::renewal::setup(renewal, cfg.choria_insecure, &env)?;
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
                handle.clone(),
                stop_tasks.clone(),
            ));
        }
        if let (Some(records), Some(rx), Some(sealer)) = (&cfg.records, records_rx, sealer) {
            tasks.spawn(day_two::recorder::run(
                records.clone(),
                sealer,
                format!("choria-provisioner records {me}"),
                rx,
                handle.metrics.clone(),
                stop_tasks.clone(),
            ));
        }
        let abandon = CancellationToken::new();
        let credentials = Arc::new(signing::credentials::Credentials::load(cfg.clone()));
        tasks.spawn(credentials.clone().watch(stop_tasks.clone()));
        let pool = pipeline::dispatch::Pool::new(cfg.workers);
        let ctx = Arc::new(context(
            &cfg,
            &client,
            &handle,
            &resource,
            &abandon,
            &credentials,
            &me,
            &pool,
        )?);
        start_intake(
            &nats,
            &cfg,
            &handle,
            &suspects,
            Intake {
                broker_events: events_rx,
                finisher: finisher_rx,
            },
            &stop_tasks,
            &mut tasks,
        )
        .await?;

        if cfg.election.enabled() {
            info!(candidate = %me, "campaigning under this process's own name");
        }
        let election_stop = CancellationToken::new();
        let election = pipeline::leadership::spawn(
            &cfg.election,
            &nats,
            me.clone(),
            handle.clone(),
            election_stop.clone(),
            leader_tx,
            resource.clone(),
        );
        if let Some(r) = resource {
            // status.leader names the pod (what `kubectl logs` takes), not
            // the suffixed candidate name.
            let shown = pod_name.unwrap_or_else(|| setup.identity.identity.clone());
            let who = kube::resource::Me {
                candidate: me,
                shown,
            };
            let renewal = cfg.renewal.is_some() && cfg.records.is_some();
            tasks.spawn(kube::resource::run(
                r,
                who,
                handle.clone(),
                renewal,
                stop_tasks.clone(),
            ));
        }

        let dispatchers = start_dispatchers(&ctx, &handle, &pool);
        let opts = pipeline::discovery::options(cfg.discovery_timeout, cfg.discovery_window);
        pipeline::discovery::run(
            &client,
            &handle,
            opts,
            cfg.interval,
            &mut trigger_rx,
            &shutdown,
        )
        .await;

        info!("shutting down");
        stop(Stopping {
            handle,
            ctx,
            pool,
            dispatchers,
            abandon,
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
    cfg: &ProvisionerConfig,
    handle: &Handle,
    stop: &CancellationToken,
    tasks: &mut JoinSet<()>,
) -> Result<(), RunError> {
    if let Some(port) = cfg.monitor_port {
        let listener = monitor::bind(port).await?;
        info!(port, "serving /metrics, /healthz and /readyz");
        tasks.spawn(monitor_task(
            listener,
            handle.metrics.clone(),
            handle.health.clone(),
            stop.clone(),
        ));
    }
    Ok(())
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

/// What every node's sequence shares.
#[allow(clippy::too_many_arguments)]
fn context(
    cfg: &Arc<ProvisionerConfig>,
    client: &ChoriaClient,
    handle: &Handle,
    resource: &Option<kube::resource::ResourceRef>,
    abandon: &CancellationToken,
    credentials: &Arc<signing::credentials::Credentials>,
    me: &str,
    pool: &pipeline::dispatch::Pool,
) -> Result<Context, RunError> {
    let argv = cfg.helper_command()?;
    let helper = (!argv.is_empty())
        .then(|| signing::helper::Helper::new(argv).with_timeout(cfg.helper_timeout));
    let template = match &cfg.configuration_template {
        Some(t) => Some(
            signing::template::NodeTemplate::new(t, &cfg.site).map_err(|e| {
                ConfigError::invalid(
                    &cfg.file,
                    None,
                    format!("configuration_template.{}", e.name),
                    e.reason.to_string(),
                )
            })?,
        ),
        None => None,
    };
    Ok(Context {
        cfg: cfg.clone(),
        client: client.clone(),
        gate: handle.gate.clone(),
        metrics: handle.metrics.clone(),
        helper,
        template,
        signer: cfg
            .cert_manager
            .clone()
            .map(|c| signing::certmanager::Signer::new(c, resource.clone())),
        deny_list: cfg.cert_deny_regexes()?,
        csr_allowed_dns: cfg.csr_allowed_dns_regexes()?,
        reply_window: cfg.reply_window,
        rpc_timeout: cfg.rpc_timeout,
        abandon: abandon.clone(),
        credentials: credentials.clone(),
        ownership: handle.ownership.clone(),
        replica: me.to_string(),
        slots: pool.slots.clone(),
        logs: Arc::new(suspects::LogLimiter::with_burst(suspects::NODE_LOG_BURST)),
    })
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
    cfg: &ProvisionerConfig,
    handle: &Handle,
    suspects: &suspects::Suspects,
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
        handle.clone(),
        suspects.clone(),
        stop.clone(),
    ));
    tasks.spawn(pipeline::broker::watch_broker(
        intake.broker_events,
        handle.clone(),
        stop.clone(),
    ));
    tasks.spawn(
        handle
            .registry
            .clone()
            .run_finisher(intake.finisher, stop.clone()),
    );
    Ok(())
}

/// A dispatcher per lane.
fn start_dispatchers(
    ctx: &Arc<Context>,
    handle: &Handle,
    pool: &pipeline::dispatch::Pool,
) -> JoinSet<()> {
    let mut set = JoinSet::new();
    for lane in pipeline::registry::Lane::ALL {
        set.spawn(pipeline::dispatch::run(
            lane,
            ctx.clone(),
            handle.clone(),
            pool.clone(),
        ));
    }
    set
}

/// What [`stop`] winds down.
struct Stopping {
    handle: Handle,
    ctx: Arc<Context>,
    pool: pipeline::dispatch::Pool,
    dispatchers: JoinSet<()>,
    abandon: CancellationToken,
    election: Option<tokio::task::JoinHandle<()>>,
    election_stop: CancellationToken,
    stop_tasks: CancellationToken,
    tasks: JoinSet<()>,
    nats: async_nats::Client,
}

/// The graceful stop. Every step is bounded: a broker that is gone
/// (async-nats reconnects for ever) or a slow API server must not keep the
/// process past [`SHUTDOWN_LIMIT`].
async fn stop(s: Stopping) {
    let Stopping {
        handle,
        ctx,
        pool,
        mut dispatchers,
        abandon,
        election,
        election_stop,
        stop_tasks,
        mut tasks,
        nats,
    } = s;
    let deadline = tokio::time::Instant::now() + SHUTDOWN_LIMIT;
    handle.gate.pause(PauseReason::Shutdown);
    handle.registry.close_queue();
    let dropped = handle.registry.clear();
    debug!(dropped, "dropped queued nodes");
    // A dispatcher may wait for room in its lane's budget: it has nothing
    // to finish.
    dispatchers.abort_all();
    info!(
        in_flight = pool.tracker.len(),
        "stopping the node sequences in flight at their next checkpoint"
    );
    while dispatchers.join_next().await.is_some() {}
    pool.tracker.close();
    let graceful = tokio::time::timeout(SHUTDOWN_GRACE, pool.tracker.wait()).await;
    if graceful.is_err() {
        warn!("in-flight nodes did not reach an attempt boundary within {SHUTDOWN_GRACE:?}; abandoning them");
        abandon.cancel();
        // Abandoned sequences stop at their next await; a helper still
        // running is killed when its future is dropped (the runtime drops
        // what is left when the process ends).
        let _ = tokio::time::timeout_at(deadline, pool.tracker.wait()).await;
    }
    // Only now, with our workers stopped, may a standby take over. The
    // release gets what is left of the limit (a Lease is released through
    // the API server even when the broker is gone).
    election_stop.cancel();
    if let Some(mut task) = election {
        match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => error!(error = %e, "the election task failed"),
            Err(_) => {
                warn!("the election did not release its leadership within {SHUTDOWN_LIMIT:?} of the shutdown; it expires instead");
                task.abort();
            }
        }
    }
    // CertificateRequests still around are deleted (or left to the next
    // start's sweep when the time is up).
    if let Some(signer) = &ctx.signer {
        let _ = tokio::time::timeout_at(deadline, signer.shutdown()).await;
    }
    stop_tasks.cancel();
    if tokio::time::timeout_at(deadline, async {
        while tasks.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tasks.abort_all();
    }
    // Flushing waits for a connection; without one there is nothing worth
    // waiting for.
    let flush_until = deadline.min(tokio::time::Instant::now() + FLUSH_AT_SHUTDOWN);
    match tokio::time::timeout_at(flush_until, nats.flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!(error = %e, "flush at shutdown failed"),
        Err(_) => debug!("no flush at shutdown: the broker is unreachable"),
    }
    info!("stopped");
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

/// Text from outside (a node, cert-manager) made fit for one log line or
/// error: control characters become spaces, and it is cut at `max`
/// characters (marked with `…`).
pub fn one_line(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect();
    if text.chars().count() > max {
        out.push('…');
    }
    out
}

//! The provisioner: discovery and startup events feed the host registry and
//! its work queue; workers run each node's [`host::HostSequence`]; the pause
//! gate decides whether any of it may talk to nodes.
//!
//! ```text
//! discovery (interval, trigger) ─┐
//!                                ├─> Registry ─> queue ─> workers ─> HostSequence ─> RPC / helper
//! startup events ────────────────┘      ^                    │
//!                                       └──── finisher <─────┘ (forget now, or after 60 s)
//! ```

pub mod certmanager;
pub mod gate;
pub mod helper;
pub mod host;
mod leadership;
pub mod metrics;
pub mod registry;
pub mod resource;
mod suspects;
pub mod template;
pub mod version;

use crate::backoff::Backoff;
use crate::choria::client::{self, ChoriaClient, ClientError, DiscoveryOptions};
use crate::choria::filter::Filter;
use crate::choria::identity;
use crate::choria::lifecycle::{self, Event, EventType};
use crate::config::{ClientSetup, ConfigError, ProvisionerConfig};
use crate::monitor::{self, Health};
use crate::provision::metrics::Metrics;
use futures::StreamExt;
use gate::{PauseGate, PauseReason};
use host::{Context, HostSequence, Outcome, ProvisionError};
use registry::{Added, Registry};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

/// The component name in our own lifecycle events.
pub const COMPONENT: &str = "provisioner";
/// How long in-flight nodes get to reach an attempt boundary at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// The longest a shutdown takes from the signal, whatever the broker or
/// the API server do: the grace, releasing the election, stopping tasks.
pub const SHUTDOWN_LIMIT: Duration = Duration::from_millis(1500);
/// Startup events waiting for their node to answer a ping, at most.
pub const EVENT_CONFIRM_QUEUE: usize = 10_000;
/// Pings to event-announced nodes in flight at once.
pub const EVENT_PINGS: usize = 256;
/// How long an event-announced node has to answer its ping.
pub const EVENT_PING_TIMEOUT: Duration = Duration::from_secs(3);
/// Nodes waiting out their reply windows at once (each a small task).
pub const CONFIRMING_LIMIT: usize = 4096;
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
    #[error("could not set up TLS to the broker ({}): {source}", .file.display())]
    Tls {
        file: std::path::PathBuf,
        #[source]
        source: crate::choria::tls::TlsError,
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
    pub fn warnings(&self) -> Vec<crate::config::ConfigWarning> {
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
    env: &crate::config::Environment,
) -> Result<Prepared, PrepareError> {
    let cfg = ProvisionerConfig::load(config).map_err(PrepareError::Provisioner)?;
    cfg.helper_command().map_err(PrepareError::Provisioner)?;
    cfg.cert_deny_regexes().map_err(PrepareError::Provisioner)?;
    let ccfg = crate::config::ChoriaClientConfig::load_with(choria_config, env)
        .map_err(PrepareError::Choria)?;
    let setup = ccfg.client_setup(&cfg, env).map_err(PrepareError::Setup)?;
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

type FinisherRx = mpsc::UnboundedReceiver<(Arc<registry::Ticket>, Duration)>;

/// The `run` subcommand's work, until `shutdown` fires.
pub struct Provisioner {
    cfg: Arc<ProvisionerConfig>,
    setup: ClientSetup,
    version: String,
    handle: Handle,
    trigger_rx: mpsc::Receiver<()>,
    finisher_rx: FinisherRx,
    leader_tx: tokio::sync::watch::Sender<Option<String>>,
    resource: Option<resource::ResourceRef>,
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
        Provisioner {
            cfg: Arc::new(cfg),
            setup,
            version: version.to_string(),
            handle: Handle {
                gate,
                registry,
                metrics,
                health: Health::new(),
                leader,
                trigger,
            },
            trigger_rx,
            finisher_rx,
            leader_tx,
            resource: None,
        }
    }

    /// Follows this Provisioner resource (pause, leader status), as pods the
    /// operator runs do.
    pub fn with_resource(mut self, resource: resource::ResourceRef) -> Self {
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
            version,
            handle,
            mut trigger_rx,
            finisher_rx,
            leader_tx,
            resource,
        } = self;
        let metrics = handle.metrics.clone();
        let health = handle.health.clone();
        let stop_tasks = CancellationToken::new();
        let mut tasks = JoinSet::new();

        if let Some(port) = cfg.monitor_port {
            let listener = monitor::bind(port).await?;
            info!(port, "serving /metrics, /healthz and /readyz");
            tasks.spawn(monitor_task(
                listener,
                metrics.clone(),
                health.clone(),
                stop_tasks.clone(),
            ));
        }

        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let Some(nats) = connect_until_up(&setup, events_tx, &health, &shutdown).await? else {
            stop_tasks.cancel();
            while tasks.join_next().await.is_some() {}
            return Ok(());
        };
        let suspects = suspects::Suspects::new(metrics.clone());
        let mut client = ChoriaClient::new(nats.clone(), setup.identity.clone())
            .with_observer(Arc::new(suspects.clone()));
        client.discovery_timeout = Duration::from_secs(2);
        info!(
            config = %cfg.file.display(),
            interval = %cfg.interval_text,
            workers = cfg.workers,
            broker = %client::connected_url(&nats),
            identity = %setup.identity.identity,
            protocol = %setup.version,
            "Choria Provisioner starting"
        );

        let startup = Event::new(
            EventType::Startup,
            &setup.identity.identity,
            COMPONENT,
            Some(&version),
        );
        if let Err(e) = client.publish_event(EventType::Startup, &startup).await {
            error!(error = %e, "could not publish our startup event");
        }

        let argv = cfg.helper_command()?;
        let helper =
            (!argv.is_empty()).then(|| helper::Helper::new(argv).with_timeout(cfg.helper_timeout));
        let template = match &cfg.configuration_template {
            Some(t) => Some(template::NodeTemplate::new(t, &cfg.site).map_err(|e| {
                ConfigError::invalid(
                    &cfg.file,
                    None,
                    format!("configuration_template.{}", e.name),
                    e.source.to_string(),
                )
            })?),
            None => None,
        };
        let abandon = CancellationToken::new();
        let ctx = Arc::new(Context {
            cfg: cfg.clone(),
            client: client.clone(),
            gate: handle.gate.clone(),
            metrics: metrics.clone(),
            helper,
            template,
            signer: cfg
                .cert_manager
                .clone()
                .map(|c| certmanager::Signer::new(c, resource.clone())),
            deny_list: cfg.cert_deny_regexes()?,
            csr_allowed_dns: cfg.csr_allowed_dns_regexes()?,
            reply_window: cfg.reply_window,
            rpc_timeout: cfg.rpc_timeout,
            abandon: abandon.clone(),
            verify_key: host::VerifyKeyCache::default(),
        });

        // Startup events add nodes; shutdown events drop waiting ones.
        let startups =
            client::subscribe_events(&nats, EventType::Startup, &cfg.lifecycle_component).await?;
        let shutdowns =
            client::subscribe_events(&nats, EventType::Shutdown, &cfg.lifecycle_component).await?;
        let events = futures::stream::select(startups, shutdowns);
        let (confirm_tx, confirm_rx) = mpsc::channel(EVENT_CONFIRM_QUEUE);
        tasks.spawn(listen_for_startups(
            events,
            handle.clone(),
            suspects.clone(),
            confirm_tx,
            stop_tasks.clone(),
        ));
        tasks.spawn(confirm_event_nodes(
            confirm_rx,
            client.clone(),
            handle.clone(),
            stop_tasks.clone(),
        ));
        tasks.spawn(watch_broker(events_rx, handle.clone(), stop_tasks.clone()));
        tasks.spawn(
            handle
                .registry
                .clone()
                .run_finisher(finisher_rx, stop_tasks.clone()),
        );

        let pod_name = std::env::var("POD_NAME").ok();
        let me = candidate_identity(&setup.identity.identity, pod_name.as_deref());
        if cfg.election.enabled() {
            info!(candidate = %me, "campaigning under this process's own name");
        }
        let election_stop = CancellationToken::new();
        let election = leadership::spawn(
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
            let shown = pod_name
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| setup.identity.identity.clone());
            let who = resource::Me {
                candidate: me.clone(),
                shown,
            };
            tasks.spawn(resource::run(r, who, handle.clone(), stop_tasks.clone()));
        }

        let pool = Pool {
            slots: Arc::new(Semaphore::new(cfg.workers)),
            confirming: Arc::new(Semaphore::new(CONFIRMING_LIMIT)),
            parked: TaskTracker::new(),
        };
        let mut workers = JoinSet::new();
        for n in 1..=cfg.workers {
            workers.spawn(worker(n, ctx.clone(), handle.clone(), pool.clone()));
        }

        let discovery = DiscoveryOptions {
            timeout: cfg.discovery_timeout,
            sliding_window: Some(cfg.discovery_window),
            // No more than the work queue can hold.
            max_nodes: registry::QUEUE_CAPACITY,
        };
        let mut ticker =
            tokio::time::interval_at(tokio::time::Instant::now() + cfg.interval, cfg.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Discover at once, then on the interval and on triggers; shutdown
        // wins over a pending trigger and cuts a running discovery short.
        let mut first = true;
        loop {
            if !first {
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => break,
                    _ = ticker.tick() => {}
                    Some(()) = trigger_rx.recv() => {}
                }
            }
            first = false;
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = discover(&client, &handle, discovery) => {}
            }
        }

        info!("shutting down");
        // Every step below is bounded: a broker that is gone (async-nats
        // reconnects for ever) or a slow API server must not keep the
        // process past SHUTDOWN_LIMIT.
        let deadline = tokio::time::Instant::now() + SHUTDOWN_LIMIT;
        handle.gate.pause(PauseReason::Shutdown);
        handle.registry.close_queue();
        let dropped = handle.registry.clear();
        debug!(dropped, "dropped queued nodes");
        pool.parked.close();
        let graceful = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while workers.join_next().await.is_some() {}
            pool.parked.wait().await;
        })
        .await;
        if graceful.is_err() {
            warn!("in-flight nodes did not reach an attempt boundary within {SHUTDOWN_GRACE:?}; abandoning them");
            abandon.cancel();
            // Abandoned sequences stop at their next await; a helper still
            // running is killed when its future is dropped.
            if tokio::time::timeout_at(deadline, async {
                while workers.join_next().await.is_some() {}
                pool.parked.wait().await;
            })
            .await
            .is_err()
            {
                workers.abort_all();
            }
        }
        // Only now, with our workers stopped, may a standby take over. The
        // release gets what is left of the limit (a Lease is released
        // through the API server even when the broker is gone).
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
        // Flushing waits for a connection; without one there is nothing
        // worth waiting for.
        let flush_until = deadline.min(tokio::time::Instant::now() + FLUSH_AT_SHUTDOWN);
        match tokio::time::timeout_at(flush_until, nats.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => debug!(error = %e, "flush at shutdown failed"),
            Err(_) => debug!("no flush at shutdown: the broker is unreachable"),
        }
        info!("stopped");
        Ok(())
    }
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

/// Connects, retrying while the broker is unreachable (reported on /readyz)
/// rather than exiting; `None` when shutdown came first.
async fn connect_until_up(
    setup: &ClientSetup,
    events: mpsc::UnboundedSender<async_nats::Event>,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<Option<async_nats::Client>, RunError> {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    loop {
        match client::connect_observed(&setup.connect, Some(events.clone())).await {
            Ok(nats) => {
                health.set("broker", Ok(()));
                return Ok(Some(nats));
            }
            Err(e @ (ClientError::NoServers | ClientError::Tls(_))) => return Err(e.into()),
            Err(e) => {
                error!(error = %e, "could not connect to the broker; retrying");
                health.set("broker", Err(e.to_string()));
            }
        }
        if !backoff.wait(shutdown).await {
            return Ok(None);
        }
    }
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

/// One discovery round, skipped while paused.
async fn discover(client: &ChoriaClient, handle: &Handle, opts: DiscoveryOptions) {
    if let Err(e) = handle.gate.check() {
        warn!(reason = %e, "skipping discovery");
        return;
    }
    handle.metrics.discover_cycle();
    info!("looking for provisionable hosts");
    let started = Instant::now();
    // Nodes are queued as their replies arrive: workers start while the
    // discovery window is still open.
    let mut added = 0;
    let found = client
        .discover_each(&Filter::with_agent("choria_provision"), opts, |node| {
            if handle.registry.add(node) == Added::Queued {
                handle.metrics.discovered();
                added += 1;
            }
        })
        .await;
    match found {
        Ok(nodes) => {
            info!(found = nodes.len(), added, took = ?started.elapsed(), "discovery finished");
        }
        Err(e) => {
            handle.metrics.discovery_error();
            error!(error = %e, "could not discover nodes");
        }
    }
}

/// Takes nodes that announce themselves with a `startup` event to the
/// confirmation stage, and drops waiting nodes that announce a shutdown.
/// Identities are checked here, where they enter; the confirmation queue is
/// bounded, so a flood of events costs a counter, not memory.
async fn listen_for_startups(
    mut events: impl futures::Stream<Item = async_nats::Message> + Unpin,
    handle: Handle,
    suspects: suspects::Suspects,
    confirm: mpsc::Sender<String>,
    stop: CancellationToken,
) {
    loop {
        let msg = tokio::select! {
            m = events.next() => match m {
                Some(m) => m,
                None => {
                    error!("the lifecycle event subscription ended");
                    return;
                }
            },
            _ = stop.cancelled() => return,
        };
        if handle.gate.is_paused() {
            debug!("skipping a lifecycle event while paused");
            continue;
        }
        match lifecycle::parse(&msg.payload) {
            Ok((kind @ (EventType::Startup | EventType::Shutdown), event)) => {
                if let Err(e) = identity::validate(&event.identity) {
                    suspects.rejected_event_identity(&e, &event.identity);
                    continue;
                }
                if kind == EventType::Shutdown {
                    if handle.registry.forget_waiting(&event.identity) {
                        debug!(node = %event.identity, "dropped a waiting node that shut down");
                    }
                } else if handle.registry.would_queue(&event.identity) {
                    match confirm.try_send(event.identity) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            handle.metrics.dropped_event();
                            if let Some(n) = suspects.should_log("confirmation queue full") {
                                warn!(capacity = EVENT_CONFIRM_QUEUE, suppressed_before = n, "too many startup events to confirm; dropping some (discovery finds real nodes later)");
                            }
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => return,
                    }
                }
            }
            Ok((kind, _)) => debug!(?kind, "ignoring lifecycle event"),
            Err(lifecycle::EventError::NoIdentity) => {
                suspects.rejected_event_identity(&identity::IdentityError::Empty, "");
            }
            Err(e) => {
                if let Some(n) = suspects.should_log("undecodable lifecycle event") {
                    warn!(subject = %identity::preview(&msg.subject), error = %e, suppressed_before = n, "could not handle a lifecycle event");
                }
            }
        }
    }
}

/// Queues event-announced nodes only once they answer a directed ping in
/// their own name: anyone can publish a `startup` event for a name that
/// does not exist, and each such name would otherwise hold a worker for the
/// whole `jwt` timeout and its retries. At most [`EVENT_PINGS`] pings are in
/// flight; a name already being confirmed is not pinged twice.
async fn confirm_event_nodes(
    mut names: mpsc::Receiver<String>,
    client: ChoriaClient,
    handle: Handle,
    stop: CancellationToken,
) {
    let pings = Arc::new(Semaphore::new(EVENT_PINGS));
    let in_flight = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let tracker = TaskTracker::new();
    loop {
        let name = tokio::select! {
            n = names.recv() => match n { Some(n) => n, None => break },
            _ = stop.cancelled() => break,
        };
        if !in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.clone())
        {
            continue;
        }
        let permit = tokio::select! {
            p = pings.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stop.cancelled() => break,
        };
        let (client, handle, in_flight, stop) = (
            client.clone(),
            handle.clone(),
            in_flight.clone(),
            stop.clone(),
        );
        tracker.spawn(async move {
            let _permit = permit;
            let answered = tokio::select! {
                r = client.ping(&name, EVENT_PING_TIMEOUT) => r,
                _ = stop.cancelled() => return,
            };
            in_flight
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&name);
            match answered {
                Ok(()) => {
                    if handle.gate.is_paused() {
                        return;
                    }
                    if handle.registry.add(&name) == Added::Queued {
                        handle.metrics.event_discovered();
                        info!(node = %name, "adding node after its startup event");
                    }
                }
                Err(e) => {
                    handle.metrics.unconfirmed_event();
                    debug!(node = %name, error = %e, "a node announced by a startup event did not answer a ping; not queued");
                }
            }
        });
    }
    tracker.close();
    tracker.wait().await;
}
/// Tracks the broker connection: readiness follows it, and a reconnect
/// triggers a discovery so nodes whose work failed meanwhile are found again.
async fn watch_broker(
    mut events: mpsc::UnboundedReceiver<async_nats::Event>,
    handle: Handle,
    stop: CancellationToken,
) {
    // async-nats also reports the first connection; only a reconnect after a
    // disconnect calls for a new discovery.
    let mut disconnected = false;
    loop {
        let event = tokio::select! {
            e = events.recv() => match e { Some(e) => e, None => return },
            _ = stop.cancelled() => return,
        };
        match event {
            async_nats::Event::Connected if disconnected => {
                disconnected = false;
                info!("connected to the broker again; rediscovering");
                handle.health.set("broker", Ok(()));
                handle.trigger_discovery();
            }
            async_nats::Event::Connected => handle.health.set("broker", Ok(())),
            async_nats::Event::Disconnected => {
                disconnected = true;
                warn!("disconnected from the broker; reconnecting");
                handle
                    .health
                    .set("broker", Err("disconnected from the broker".into()));
            }
            other => debug!(event = %other, "broker connection event"),
        }
    }
}

/// How nodes are worked: `slots` are the `workers` setting, one per node
/// being actively worked on; a node waiting out its reply windows gives its
/// slot back and waits in a `parked` task, at most `confirming` at a time.
#[derive(Clone)]
struct Pool {
    slots: Arc<Semaphore>,
    confirming: Arc<Semaphore>,
    parked: TaskTracker,
}

/// Takes nodes off the queue until it is closed and drained, and runs each
/// up to its reply windows: on at once when they are over already, else in
/// a parked task, so the windows cost no worker time.
async fn worker(n: usize, ctx: Arc<Context>, handle: Handle, pool: Pool) {
    debug!(worker = n, "worker starting");
    while let Some(ticket) = handle.registry.next().await {
        // The queue can hold registrations that were since replaced or
        // dropped (lost leadership): skip those.
        if !handle.registry.is_current(&ticket) {
            debug!(node = %ticket.identity, "skipping a stale queue entry");
            continue;
        }
        let Ok(slot) = pool.slots.clone().acquire_owned().await else {
            break;
        };
        let busy = ctx.metrics.busy_worker();
        info!(node = %ticket.identity, "provisioning");
        let mut seq = HostSequence::new(ctx.clone(), Arc::from(ticket.identity.as_str()));
        if let Err(e) = seq.gather(ticket.added.elapsed()).await {
            drop(busy);
            record(&ctx, &handle, ticket, Err(e));
            continue;
        }
        if seq.is_settled() {
            let result = async {
                seq.settle().await?;
                seq.finish().await
            }
            .await;
            drop(busy);
            drop(slot);
            record(&ctx, &handle, ticket, result);
            continue;
        }
        drop(busy);
        drop(slot);
        let Ok(confirming) = pool.confirming.clone().acquire_owned().await else {
            break;
        };
        let (ctx, handle, slots) = (ctx.clone(), handle.clone(), pool.slots.clone());
        pool.parked.spawn(async move {
            let _confirming = confirming;
            let result = async {
                seq.settle().await?;
                let _slot = slots
                    .acquire_owned()
                    .await
                    .map_err(|_| ProvisionError::Abandoned)?;
                let _busy = ctx.metrics.busy_worker();
                seq.finish().await
            }
            .await;
            record(&ctx, &handle, ticket, result);
        });
    }
    debug!(worker = n, "worker stopped");
}

/// What a node's sequence ended with: metrics, the log line, and what the
/// registry does with the node.
fn record(
    ctx: &Context,
    handle: &Handle,
    ticket: Arc<registry::Ticket>,
    result: Result<Outcome, ProvisionError>,
) {
    match result {
        Ok(Outcome::Provisioned) => {
            ctx.metrics.provisioned();
            info!(node = %ticket.identity, "provisioned");
            handle
                .registry
                .remove_later(ticket, registry::HOLD_AFTER_SUCCESS);
        }
        Ok(Outcome::Shutdown) => {
            handle
                .registry
                .remove_later(ticket, registry::HOLD_AFTER_SUCCESS);
        }
        Ok(Outcome::Upgrading { to }) => {
            info!(node = %ticket.identity, version = %to, "node is upgrading; it is provisioned after its next startup");
            handle.registry.remove(&ticket);
        }
        Err(e) if e.is_pause() => {
            info!(node = %ticket.identity, reason = %e, "stopped provisioning the node");
            handle.registry.remove(&ticket);
        }
        Err(e) => {
            ctx.metrics.provision_error();
            error!(node = %ticket.identity, step = %e.step(), error = %e, "could not provision the node");
            handle.registry.remove(&ticket);
        }
    }
}

/// Text from outside (a node, cert-manager) made fit for one log line or
/// error: control characters become spaces, and it is cut at `max`
/// characters (marked with `…`).
pub(crate) fn one_line(text: &str, max: usize) -> String {
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

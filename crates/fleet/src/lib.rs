//! `choria-provisioner fleet`: many simulated Choria Servers in provisioning mode
//! in one process.
//!
//! Layout: nodes are spread over a few NATS connections. Each node subscribes to
//! its own `provisioning.node.<identity>` subject and handles its requests in its
//! own task (go-choria serialises the provisioning agent's actions, so one at a
//! time per node is faithful). Broadcasts arrive once per connection and are
//! decoded once, then offered to every node on that connection.

pub mod ca;
pub mod helper;
pub mod journal;
pub mod node;

use choria_wire::client::{self, BrokerOptions, ConnectOptions, EventFormat};
use choria_wire::lifecycle::{Event, EventType};
use choria_wire::protocol::{self, ReplySpec, Request, Version};
use choria_wire::security::csr::RsaKeyPool;
use choria_wire::security::tokens::{ProvisioningClaims, TokenSigningKey};
use choria_wire::subjects;
use futures::StreamExt;
use journal::{Entry, Journal, Outcome};
use node::{Failure, FleetShared, Mode, Node, Response};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

/// The component provisioning-mode servers publish lifecycle events as.
pub const PROVISION_MODE_COMPONENT: &str = "provision_mode_server";
/// The component of a server after provisioning.
pub const SERVER_COMPONENT: &str = "server";
/// The longest the fleet waits to flush its connections when it stops.
const FLUSH_AT_STOP: Duration = Duration::from_millis(500);

/// Everything `choria-provisioner fleet` can be told (`cmd::fleet` in the
/// binary turns its command line into these), and what tests start.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetOptions {
    pub broker: BrokerOptions,
    /// How many servers to simulate.
    pub nodes: usize,
    /// The provisioning token (`cht` claim) the nodes expect; empty accepts any.
    pub token: String,
    /// Key that signs the provisioning JWT: RSA PEM (PKCS#1 or PKCS#8) or a hex
    /// ed25519 seed. Without it a throwaway ed25519 key is used and its public key logged.
    pub jwt_signer: Option<PathBuf>,
    /// Protocol the nodes speak (the provisioning JWT's `v2` claim).
    pub protocol: Version,
    /// Write a JSON-lines journal of every request and each node's final state.
    pub journal: Option<PathBuf>,
    /// Identities are `<prefix><number><suffix>`.
    pub identity_prefix: String,
    pub identity_suffix: String,
    /// Share of nodes (0..1) that never answer.
    pub fail_silent: f64,
    /// Share of nodes that answer RPCs with an error status.
    pub fail_error: f64,
    /// Share of nodes that answer RPCs with malformed replies.
    pub fail_malformed: f64,
    /// How many nodes (the first ones) answer directed requests slowly;
    /// they are healthy, just slow (broadcast discovery is answered at once).
    pub slow_nodes: usize,
    /// How long a slow node takes to answer each directed request, in ms.
    pub slow_delay_ms: u64,
    /// Seed for choosing which nodes fail.
    pub seed: u64,
    /// Allow `release_update` (the JWT's `update` claim) and report `upgradable`.
    pub upgradable: bool,
    /// The version the nodes report.
    pub server_version: String,
    /// Pre-generated RSA keys shared by `gencsr` (generating one per node is slow).
    pub key_pool_size: usize,
    /// Sign every node's default CSR (CN = its identity) before the nodes
    /// start, so `gencsr` costs the fleet no RSA work while a benchmark is
    /// measured. The CSR is the same one `gencsr` would make.
    pub presign_csrs: bool,
    /// NATS connections the nodes are spread over.
    pub connections: usize,
    /// How directed requests reach the nodes.
    pub directed: Directed,
    /// Provisioned nodes keep serving in their collective (the first of
    /// their written `collectives`, else `mcollective`) and answer
    /// `choria_provision#reprovision` as go-choria does: for renewal tests
    /// and benchmarks. One queue subscription per connection on
    /// `*.node.>`.
    pub serve_provisioned: bool,
    /// Configuration keys whose written values the journal's final states
    /// record (`config_values`); other values are left out, as they may
    /// hold secrets.
    pub journal_config_keys: Vec<String>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Stop once every node without injected failures has left provisioning.
    pub exit_when_done: bool,
    /// Facts (a JSON object) every node reports in its inventory.
    pub facts: serde_json::Value,
}

impl Default for FleetOptions {
    /// The command line's defaults (a test of `cmd::fleet` keeps them equal):
    /// ten healthy v1 nodes on a local broker, accepting any token.
    fn default() -> Self {
        FleetOptions {
            broker: BrokerOptions::default(),
            nodes: 10,
            token: String::new(),
            jwt_signer: None,
            protocol: Version::V1,
            journal: None,
            identity_prefix: "node-".into(),
            identity_suffix: ".fleet.example.net".into(),
            fail_silent: 0.0,
            fail_error: 0.0,
            fail_malformed: 0.0,
            slow_nodes: 0,
            slow_delay_ms: 0,
            seed: 1,
            upgradable: false,
            server_version: "0.30.2".into(),
            key_pool_size: 16,
            presign_csrs: false,
            connections: 4,
            directed: Directed::PerNode,
            serve_provisioned: false,
            journal_config_keys: Vec::new(),
            duration: None,
            exit_when_done: false,
            facts: serde_json::json!({}),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("invalid fleet option: {0}")]
    Options(String),
    #[error("--jwt-signer {path}: {reason}")]
    Signer { path: PathBuf, reason: String },
    #[error("could not generate the RSA key pool: {0}")]
    KeyPool(String),
    #[error("could not open the journal {path}: {source}")]
    Journal {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Client(#[from] client::ClientError),
}

/// What the fleet did, printed when it stops.
#[derive(Debug, Default, serde::Serialize)]
pub struct FleetSummary {
    pub nodes: usize,
    pub provisioned: usize,
    pub provisioning: usize,
    pub shutdown: usize,
    pub requests: u64,
    pub replies: u64,
}

type NodeRef = Arc<Mutex<Node>>;

/// How directed requests reach the nodes ([`FleetOptions::directed`]). What
/// the provisioner sees is the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Directed {
    /// Each node subscribes its own subject, as go-choria servers do (the
    /// broker sees one subscription per node; ~10 KiB of simulator memory per
    /// node, most of it the subscription's channel).
    #[default]
    PerNode,
    /// `provisioning.node.>` is subscribed once per connection in one queue
    /// group and each request handed to its node (~1 KiB per node: for
    /// fleets of hundreds of thousands).
    Shared,
}

/// The queue group of `--directed shared`, with [`queue_group`]'s suffix.
const SHARED_QUEUE: &str = "choria-fleet";

/// This fleet's own queue group: its connections share the work, and
/// another fleet on the same broker (a second prefix, a later wave) must not
/// take its messages, which it would drop as addressed to nodes it lacks.
fn queue_group(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{SHARED_QUEUE}{what}-{}-{nanos}", std::process::id())
}

struct Counters {
    requests: AtomicU64,
    replies: AtomicU64,
}

/// Shared per-run context handed to tasks.
#[derive(Clone)]
struct Ctx {
    journal: Journal,
    counters: Arc<Counters>,
    protocol: Version,
    /// Nodes without injected failures still in provisioning; `--exit-when-done`
    /// waits for zero. Kept as a count so each change costs O(1), not a scan.
    remaining: Arc<AtomicUsize>,
    changed: Arc<Notify>,
    /// Nodes with an index below this answer directed requests after `slow_delay`.
    slow_nodes: usize,
    slow_delay: Duration,
}

impl Ctx {
    /// Called when a node leaves provisioning (restart into normal mode, shutdown).
    fn node_left(&self, failure: Option<Failure>) {
        if failure.is_none() {
            self.remaining.fetch_sub(1, Ordering::Relaxed);
        }
        self.changed.notify_waiters();
    }
}

impl FleetOptions {
    fn validate(&self) -> Result<(), FleetError> {
        if self.nodes == 0 {
            return Err(FleetError::Options("--nodes must be at least 1".into()));
        }
        for (name, v) in [
            ("--fail-silent", self.fail_silent),
            ("--fail-error", self.fail_error),
            ("--fail-malformed", self.fail_malformed),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(FleetError::Options(format!(
                    "{name} must be between 0 and 1, got {v}"
                )));
            }
        }
        if self.fail_silent + self.fail_error + self.fail_malformed > 1.0 + f64::EPSILON {
            return Err(FleetError::Options(
                "the failure shares add up to more than 1".into(),
            ));
        }
        if self.connections == 0 {
            return Err(FleetError::Options(
                "--connections must be at least 1".into(),
            ));
        }
        if self.broker.nats.is_empty() {
            return Err(FleetError::Options("--nats needs at least one URL".into()));
        }
        Ok(())
    }
}

/// The identity of node `i`.
pub fn identity_for(opts: &FleetOptions, i: usize) -> String {
    let width = opts.nodes.saturating_sub(1).to_string().len().max(3);
    format!(
        "{}{:0width$}{}",
        opts.identity_prefix, i, opts.identity_suffix
    )
}

/// Assigns injected failures to a deterministic share of nodes.
fn assign_failures(opts: &FleetOptions) -> Vec<Option<Failure>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let n = opts.nodes;
    let mut failures = vec![None; n];
    let mut order: Vec<usize> = (0..n).collect();
    // Fisher-Yates so that failed nodes are spread over the fleet.
    for i in (1..n).rev() {
        let j = rng.gen_range(0..=i);
        order.swap(i, j);
    }
    let mut next = order.into_iter();
    for (share, failure) in [
        (opts.fail_silent, Failure::Silent),
        (opts.fail_error, Failure::ErrorStatus),
        (opts.fail_malformed, Failure::Malformed),
    ] {
        let count = (share * n as f64).round() as usize;
        for idx in next.by_ref().take(count) {
            failures[idx] = Some(failure);
        }
    }
    failures
}

/// Builds the provisioning JWT the nodes hand out, signed by `--jwt-signer` or by
/// a throwaway ed25519 key whose public half is logged.
fn provisioning_jwt(opts: &FleetOptions) -> Result<String, FleetError> {
    let signer = match &opts.jwt_signer {
        Some(path) => TokenSigningKey::from_file(path).map_err(|e| FleetError::Signer {
            path: path.clone(),
            reason: e.to_string(),
        })?,
        None => {
            let pair = choria_wire::security::ed25519::Ed25519KeyPair::generate();
            info!(
                public_key = %pair.public_hex(),
                "no --jwt-signer given: provisioning JWT signed with a throwaway ed25519 key"
            );
            TokenSigningKey::Ed25519(pair.signing_key().clone())
        }
    };
    let now = chrono::Utc::now().timestamp();
    let mut claims = ProvisioningClaims::new_at(
        &opts.token,
        &opts.broker.nats.join(","),
        "",
        Duration::from_secs(365 * 24 * 3600),
        now,
    )
    .map_err(|e| FleetError::Options(format!("provisioning JWT claims: {e}")))?;
    claims.proto_v2 = opts.protocol == Version::V2;
    claims.allow_update = opts.upgradable;
    signer.sign(&claims).map_err(|e| FleetError::Signer {
        path: opts.jwt_signer.clone().unwrap_or_default(),
        reason: e.to_string(),
    })
}

/// The default-subject CSR (CN = identity) of every node, signed with the
/// node's pool key on one thread per core.
fn presign_csrs(
    pool: &RsaKeyPool,
    identities: &[String],
) -> Result<Vec<String>, choria_wire::security::csr::CsrError> {
    use choria_wire::security::csr::{make_csr, CsrSubject};
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = identities.len().div_ceil(threads).max(1);
    let parts: Vec<Result<Vec<String>, _>> = std::thread::scope(|scope| {
        let handles: Vec<_> = identities
            .chunks(chunk)
            .enumerate()
            .map(|(c, ids)| {
                scope.spawn(move || {
                    ids.iter()
                        .enumerate()
                        .map(|(j, id)| {
                            make_csr(&pool.get(c * chunk + j), &CsrSubject::new(id.clone()))
                        })
                        .collect::<Result<Vec<String>, _>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a CSR thread panicked"))
            .collect()
    });
    let mut all = Vec::with_capacity(identities.len());
    for part in parts {
        all.extend(part?);
    }
    Ok(all)
}

/// Runs the fleet until `stop` resolves, `--duration` passes or (with
/// `--exit-when-done`) every healthy node has left provisioning.
pub async fn run(
    opts: FleetOptions,
    stop: impl std::future::Future<Output = ()>,
) -> Result<FleetSummary, FleetError> {
    opts.validate()?;
    let jwt = provisioning_jwt(&opts)?;

    let pool_size = opts.key_pool_size.clamp(1, opts.nodes.max(1));
    let started = std::time::Instant::now();
    let pool = tokio::task::spawn_blocking(move || RsaKeyPool::generate(pool_size, 2048))
        .await
        .map_err(|e| FleetError::KeyPool(e.to_string()))?
        .map_err(|e| FleetError::KeyPool(e.to_string()))?;
    debug!(keys = pool_size, elapsed = ?started.elapsed(), "RSA key pool ready");
    let pool = Arc::new(pool);
    let presigned_csrs = if opts.presign_csrs {
        let started = std::time::Instant::now();
        let identities: Vec<String> = (0..opts.nodes).map(|i| identity_for(&opts, i)).collect();
        let keys = pool.clone();
        let csrs = tokio::task::spawn_blocking(move || presign_csrs(&keys, &identities))
            .await
            .map_err(|e| FleetError::KeyPool(e.to_string()))?
            .map_err(|e| FleetError::KeyPool(e.to_string()))?;
        info!(csrs = csrs.len(), elapsed = ?started.elapsed(), "CSRs signed ahead (--presign-csrs)");
        csrs
    } else {
        Vec::new()
    };

    let shared = Arc::new(FleetShared {
        protocol: opts.protocol,
        server_version: opts.server_version.clone(),
        token: opts.token.clone(),
        provisioning_jwt: Some(jwt.clone()),
        upgradable: opts.upgradable,
        key_pool: pool,
        presigned_csrs,
        config_root: "/etc/choria-fleet".into(),
        facts: opts.facts.clone(),
        journal_config_keys: opts.journal_config_keys.clone(),
    });

    let (journal, writer) = match &opts.journal {
        Some(path) => {
            let (j, w) = Journal::open(path).map_err(|source| FleetError::Journal {
                path: path.clone(),
                source,
            })?;
            (j, Some(w))
        }
        None => (Journal::disabled(), None),
    };
    let failures = assign_failures(&opts);
    let ctx = Ctx {
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
    };
    let nodes: Vec<NodeRef> = (0..opts.nodes)
        .map(|i| {
            Arc::new(Mutex::new(Node::new(
                identity_for(&opts, i),
                i,
                failures[i],
                shared.clone(),
            )))
        })
        .collect();

    // Connect like provisioning-mode servers: the provisioning JWT as the
    // token — unless the URL carries a user, as when a test broker with
    // accounts (which would refuse the token) stands in for a Choria broker.
    let url_has_user = opts.broker.nats.iter().any(|u| {
        u.split_once("://")
            .map_or(u.as_str(), |(_, rest)| rest)
            .split('/')
            .next()
            .is_some_and(|authority| authority.contains('@'))
    });
    let token = (!url_has_user).then(|| jwt.clone());
    let connections = opts.connections.min(opts.nodes);
    let mut conns = Vec::with_capacity(connections);
    let mut tasks = Vec::new();
    // A signal during start-up (the broker may be gone: flushes and
    // publishes would wait for it) stops the fleet too.
    tokio::pin!(stop);
    let startup = async {
        for c in 0..connections {
            let nats = client::connect(&ConnectOptions {
                servers: opts.broker.nats.clone(),
                name: format!("choria-fleet-{c}"),
                tls: opts.broker.tls(),
                token: token.clone(),
                ..Default::default()
            })
            .await?;
            conns.push(nats);
        }

        // `--directed shared`: every node by name, for the shared loops.
        let by_name: Arc<HashMap<String, NodeRef>> = Arc::new(match opts.directed {
            Directed::PerNode if !opts.serve_provisioned => HashMap::new(),
            _ => nodes
                .iter()
                .map(|n| (n.lock().expect("node lock").identity.clone(), n.clone()))
                .collect(),
        });
        let turns = Arc::new(SlowTurns::new(opts.slow_nodes));
        let (directed_group, provisioned_group) = (queue_group(""), queue_group("-provisioned"));
        for (c, nats) in conns.iter().enumerate() {
            // The hop URL recorded in replies: one server per connection, looked up once.
            let url: Arc<str> = client::connected_url(nats).into();
            let mine: Vec<NodeRef> = nodes.iter().skip(c).step_by(connections).cloned().collect();
            let link = Link {
                nats: nats.clone(),
                url: url.clone(),
            };
            match opts.directed {
                Directed::PerNode => {
                    for node in &mine {
                        let identity = node.lock().expect("node lock").identity.clone();
                        let subject = subjects::node(subjects::PROVISIONING_COLLECTIVE, &identity);
                        let sub = nats
                            .subscribe(subject.clone())
                            .await
                            .map_err(|source| client::ClientError::Subscribe { subject, source })?;
                        tasks.push(tokio::spawn(directed_loop(
                            node.clone(),
                            sub,
                            link.clone(),
                            ctx.clone(),
                        )));
                    }
                }
                Directed::Shared => {
                    // Identities hold dots: `>`, not `*`.
                    let subject = subjects::node(subjects::PROVISIONING_COLLECTIVE, ">");
                    let sub = nats
                        .queue_subscribe(subject.clone(), directed_group.clone())
                        .await
                        .map_err(|source| client::ClientError::Subscribe { subject, source })?;
                    tasks.push(tokio::spawn(shared_directed_loop(
                        by_name.clone(),
                        turns.clone(),
                        sub,
                        link.clone(),
                        ctx.clone(),
                    )));
                }
            }
            if opts.serve_provisioned {
                let subject = "*.node.>".to_string();
                let sub = nats
                    .queue_subscribe(subject.clone(), provisioned_group.clone())
                    .await
                    .map_err(|source| client::ClientError::Subscribe { subject, source })?;
                tasks.push(tokio::spawn(provisioned_loop(
                    by_name.clone(),
                    sub,
                    link.clone(),
                    ctx.clone(),
                )));
            }
            let mut subs = Vec::new();
            for agent in node::AGENTS {
                let subject = subjects::broadcast_agent(subjects::PROVISIONING_COLLECTIVE, agent);
                subs.push(
                    nats.subscribe(subject.clone())
                        .await
                        .map_err(|source| client::ClientError::Subscribe { subject, source })?,
                );
            }
            tasks.push(tokio::spawn(broadcast_loop(
                mine,
                futures::stream::select_all(subs),
                Link {
                    nats: nats.clone(),
                    url,
                },
                ctx.clone(),
            )));
        }
        for nats in &conns {
            nats.flush().await.map_err(client::ClientError::from)?;
        }

        // Subscribed: now announce ourselves as go-choria does.
        for (i, node) in nodes.iter().enumerate() {
            let (identity, version) = {
                let n = node.lock().expect("node lock");
                (n.identity.clone(), n.version.clone())
            };
            publish_event(
                &conns[i % connections],
                &ctx,
                &identity,
                EventType::Startup,
                PROVISION_MODE_COMPONENT,
                Some(&version),
            )
            .await;
        }
        for nats in &conns {
            let _ = nats.flush().await;
        }
        Ok::<(), FleetError>(())
    };
    let stopped_early = tokio::select! {
        r = startup => { r?; false }
        _ = &mut stop => { info!("stopping fleet during start-up"); true }
    };
    if !stopped_early {
        info!(nodes = opts.nodes, protocol = %opts.protocol, connections, "fleet started");

        let done = async {
            if !opts.exit_when_done {
                return std::future::pending::<()>().await;
            }
            loop {
                let notified = ctx.changed.notified();
                if ctx.remaining.load(Ordering::Relaxed) == 0 {
                    return;
                }
                notified.await;
            }
        };
        let limit = async {
            match opts.duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = &mut stop => info!("stopping fleet"),
            _ = done => info!("every node has left provisioning"),
            _ = limit => info!("fleet duration reached"),
        }
    }

    for t in &tasks {
        t.abort();
    }
    // Replies and events already published go out if the broker is there;
    // a broker that is gone must not hold the fleet (async-nats would wait
    // for a reconnect for ever).
    let _ = tokio::time::timeout(
        FLUSH_AT_STOP,
        futures::future::join_all(conns.iter().map(|n| n.flush())),
    )
    .await;

    let mut summary = FleetSummary {
        nodes: opts.nodes,
        requests: ctx.counters.requests.load(Ordering::Relaxed),
        replies: ctx.counters.replies.load(Ordering::Relaxed),
        ..Default::default()
    };
    for node in &nodes {
        let n = node.lock().expect("node lock");
        match n.mode {
            Mode::Provisioning => summary.provisioning += 1,
            Mode::Provisioned => summary.provisioned += 1,
            Mode::Shutdown => summary.shutdown += 1,
        }
        ctx.journal.record(Entry::Final(n.final_state()));
    }
    let mut journal = ctx.journal.clone();
    drop(ctx);
    journal.close();
    if let Some(w) = writer {
        match w.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "journal write failed"),
            Err(e) => warn!(error = %e, "journal writer failed"),
        }
    }
    Ok(summary)
}

/// A NATS connection and the server URL it records as its network hop.
#[derive(Clone)]
struct Link {
    nats: async_nats::Client,
    url: Arc<str>,
}

async fn directed_loop(node: NodeRef, mut sub: async_nats::Subscriber, link: Link, ctx: Ctx) {
    while let Some(msg) = sub.next().await {
        // A node that left the collective is no longer subscribed in go-choria;
        // whatever was still in flight is simply never received.
        if node.lock().expect("node lock").mode != Mode::Provisioning {
            break;
        }
        let Some(req) = decode_directed(&node, &msg, &ctx) else {
            continue;
        };
        if is_slow(&node, &ctx) {
            // go-choria serialises a node's provisioning actions: a slow
            // node is slow for each request in turn.
            tokio::time::sleep(ctx.slow_delay).await;
        }
        serve(&node, &req, &link, &ctx).await;
    }
}

/// `--directed shared`: one subscription per connection for every node's
/// subject; each request goes to its node. A request for a name no node
/// has, or for a node that left provisioning, is dropped, as the broker
/// would not have delivered it to anyone.
async fn shared_directed_loop(
    by_name: Arc<HashMap<String, NodeRef>>,
    turns: Arc<SlowTurns>,
    mut sub: async_nats::Subscriber,
    link: Link,
    ctx: Ctx,
) {
    let prefix = subjects::node(subjects::PROVISIONING_COLLECTIVE, "");
    while let Some(msg) = sub.next().await {
        let Some(node) = msg
            .subject
            .strip_prefix(prefix.as_str())
            .and_then(|name| by_name.get(name))
        else {
            continue;
        };
        if node.lock().expect("node lock").mode != Mode::Provisioning {
            continue;
        }
        let Some(req) = decode_directed(node, &msg, &ctx) else {
            continue;
        };
        if !is_slow(node, &ctx) {
            serve(node, &req, &link, &ctx).await;
            continue;
        }
        // A slow node answers its requests in turn, each after the delay;
        // the others on this connection do not wait for it.
        let (node, link, ctx, turns) = (node.clone(), link.clone(), ctx.clone(), turns.clone());
        tokio::spawn(async move {
            let index = node.lock().expect("node lock").index;
            let _turn = turns.take(index).await;
            tokio::time::sleep(ctx.slow_delay).await;
            serve(&node, &req, &link, &ctx).await;
        });
    }
}

/// `--serve-provisioned`: requests in any collective but the provisioning
/// one, to provisioned nodes (which answer in their own collective).
async fn provisioned_loop(
    by_name: Arc<HashMap<String, NodeRef>>,
    mut sub: async_nats::Subscriber,
    link: Link,
    ctx: Ctx,
) {
    let provisioning = format!("{}.", subjects::PROVISIONING_COLLECTIVE);
    while let Some(msg) = sub.next().await {
        if msg.subject.starts_with(provisioning.as_str()) {
            continue;
        }
        let Some(node) = msg
            .subject
            .split_once(".node.")
            .and_then(|(_, name)| by_name.get(name))
        else {
            continue;
        };
        if node.lock().expect("node lock").mode != Mode::Provisioned {
            continue;
        }
        if let Some(req) = decode_directed(node, &msg, &ctx) {
            serve(node, &req, &link, &ctx).await;
        }
    }
}

/// One lock per slow node, so its requests are answered in turn.
struct SlowTurns(Vec<tokio::sync::Mutex<()>>);

impl SlowTurns {
    fn new(slow_nodes: usize) -> Self {
        SlowTurns(
            (0..slow_nodes)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
        )
    }

    async fn take(&self, index: usize) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        Some(self.0.get(index)?.lock().await)
    }
}

fn is_slow(node: &NodeRef, ctx: &Ctx) -> bool {
    ctx.slow_delay > Duration::ZERO && node.lock().expect("node lock").index < ctx.slow_nodes
}

/// The request in `msg`, or `None` (journaled) when a real server would
/// drop it as undecodable.
fn decode_directed(node: &NodeRef, msg: &async_nats::Message, ctx: &Ctx) -> Option<Request> {
    match protocol::decode_request(&msg.payload, ctx.protocol) {
        Ok(r) => Some(r),
        Err(e) => {
            // A real server logs and drops what it cannot decode.
            let identity = node.lock().expect("node lock").identity.clone();
            debug!(node = %identity, error = %e, "dropping undecodable request");
            record_drop(ctx, &identity, &e.to_string());
            None
        }
    }
}

async fn broadcast_loop(
    nodes: Vec<NodeRef>,
    mut subs: futures::stream::SelectAll<async_nats::Subscriber>,
    link: Link,
    ctx: Ctx,
) {
    while let Some(msg) = subs.next().await {
        let req = match protocol::decode_request(&msg.payload, ctx.protocol) {
            Ok(r) => r,
            Err(e) => {
                debug!(error = %e, subject = %msg.subject, "dropping undecodable broadcast");
                record_drop(&ctx, "*", &e.to_string());
                continue;
            }
        };
        for node in &nodes {
            let interested = node.lock().expect("node lock").accepts(&req);
            if interested {
                serve(node, &req, &link, &ctx).await;
            }
        }
    }
}

fn record_drop(ctx: &Ctx, node: &str, reason: &str) {
    ctx.journal.record(Entry::action(
        node,
        None,
        "",
        Outcome::Dropped,
        None,
        reason,
    ));
}

/// Handles one request on one node, replies, journals, and carries out effects.
async fn serve(node: &NodeRef, req: &Request, link: &Link, ctx: &Ctx) {
    ctx.counters.requests.fetch_add(1, Ordering::Relaxed);
    let (handled, identity, failure, version, component) = {
        let mut n = node.lock().expect("node lock");
        // A provisioned node's events name the `server` component.
        let component = if n.mode == Mode::Provisioned {
            SERVER_COMPONENT
        } else {
            PROVISION_MODE_COMPONENT
        };
        let h = n.handle(req, client::now_nanos());
        (
            h,
            n.identity.clone(),
            n.failure,
            n.version.clone(),
            component,
        )
    };
    let nats = &link.nats;
    let outcome = match &handled.response {
        Response::Reply(body) => {
            let spec = ReplySpec {
                request_id: &req.id,
                sender: &identity,
                agent: &req.agent,
                time_nanos: client::now_nanos(),
                body,
                connected_url: &link.url,
            };
            match protocol::encode_reply(req.version, &spec) {
                Ok(bytes) => {
                    if let Err(e) = nats.publish(req.reply_to.clone(), bytes.into()).await {
                        warn!(node = %identity, error = %e, "could not publish reply");
                    }
                    ctx.counters.replies.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => warn!(node = %identity, error = %e, "could not encode reply"),
            }
            match handled.statuscode {
                Some(code) if code != choria_wire::mcorpc::StatusCode::Ok => Outcome::Error,
                _ => Outcome::Ok,
            }
        }
        Response::Malformed => {
            let garbage = malformed_reply(req.version, &identity);
            let _ = nats.publish(req.reply_to.clone(), garbage.into()).await;
            Outcome::Malformed
        }
        Response::NoReply(reason) => {
            debug!(node = %identity, %reason, agent = %req.agent, "not replying");
            if failure == Some(Failure::Silent) {
                Outcome::Silent
            } else {
                Outcome::Dropped
            }
        }
    };
    let statusmsg = match &handled.response {
        Response::NoReply(reason) => reason,
        _ => &handled.statusmsg,
    };
    ctx.journal.record(Entry::action(
        &identity,
        Some(req),
        &handled.action,
        outcome,
        handled.statuscode.map(u8::from),
        statusmsg,
    ));

    for event in &handled.effects.events {
        let v = matches!(event, EventType::Upgraded).then_some(version.as_str());
        publish_event(nats, ctx, &identity, *event, component, v).await;
    }
    if let Some(delay) = handled.effects.restart_after {
        tokio::spawn(restart_later(
            node.clone(),
            nats.clone(),
            ctx.clone(),
            delay,
        ));
    }
    if let Some(delay) = handled.effects.shutdown_after {
        tokio::spawn(shutdown_later(node.clone(), ctx.clone(), delay));
    }
}

/// The end of the `shutdown` action's splay: the node stops.
async fn shutdown_later(node: NodeRef, ctx: Ctx, delay: Duration) {
    tokio::time::sleep(delay).await;
    let (was, failure) = {
        let mut n = node.lock().expect("node lock");
        let was = n.mode;
        n.complete_shutdown();
        (was, n.failure)
    };
    if was == Mode::Provisioning {
        ctx.node_left(failure);
    }
}

/// The re-exec: after the splay the node either leaves provisioning (and
/// announces itself as a normal server) or comes back into it.
async fn restart_later(node: NodeRef, nats: async_nats::Client, ctx: Ctx, delay: Duration) {
    tokio::time::sleep(delay).await;
    let (identity, version, was, mode, failure) = {
        let mut n = node.lock().expect("node lock");
        let was = n.mode;
        n.complete_restart();
        (
            n.identity.clone(),
            n.version.clone(),
            was,
            n.mode,
            n.failure,
        )
    };
    let component = if mode == Mode::Provisioned {
        SERVER_COMPONENT
    } else {
        PROVISION_MODE_COMPONENT
    };
    publish_event(
        &nats,
        &ctx,
        &identity,
        EventType::Startup,
        component,
        Some(&version),
    )
    .await;
    if was == Mode::Provisioning && mode != Mode::Provisioning {
        ctx.node_left(failure);
    }
}

async fn publish_event(
    nats: &async_nats::Client,
    ctx: &Ctx,
    identity: &str,
    kind: EventType,
    component: &str,
    version: Option<&str>,
) {
    let event = Event::new(kind, identity, component, version);
    if let Err(e) = client::publish_event(nats, kind, &event, EventFormat::CloudEvent).await {
        warn!(node = %identity, error = %e, "could not publish lifecycle event");
    }
    let (time, time_us) = journal::timestamp();
    ctx.journal.record(Entry::Event {
        node: identity.to_string(),
        event: kind.name().to_string(),
        component: component.to_string(),
        time,
        time_us,
    });
}

/// A reply whose transport is well-formed enough to be routed and attributed,
/// but whose secure layer fails the hash check.
fn malformed_reply(version: Version, identity: &str) -> Vec<u8> {
    let random: u32 = rand::thread_rng().gen();
    match version {
        Version::V1 => serde_json::json!({
            "protocol": protocol::v1::TRANSPORT_PROTOCOL,
            "data": base64_of(&format!(r#"{{"protocol":"choria:secure:reply:1","message":"{{}}","hash":"bogus{random}"}}"#)),
            "headers": {"mc_sender": identity}
        }),
        Version::V2 => serde_json::json!({
            "protocol": protocol::v2::TRANSPORT_PROTOCOL,
            "data": base64_of(&format!(r#"{{"protocol":"io.choria.protocol.v2.secure_reply","reply":"e30=","hash":"bogus{random}"}}"#)),
            "headers": {"sender": identity}
        }),
    }
    .to_string()
    .into_bytes()
}

fn base64_of(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

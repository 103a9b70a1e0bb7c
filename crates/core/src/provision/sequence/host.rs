//! The per-node sequence, step for step as the Go provisioner's `host`
//! package runs it:
//!
//! jwt → gen25519 → rpcutil#inventory → gencsr → helper → (defer | shutdown)
//! → server JWT → private key encryption → release_update → configure → restart
//!
//! Each RPC is a directed request that must get one reply with status OK; it
//! is retried with Go's backoff up to the per-action tries, and the pause gate
//! is read before the call and before every attempt, so pausing stops a node
//! at its next attempt boundary. Errors name the node and the step.
//!
//! A sequence waits without a worker: it takes one of the `workers` slots
//! only for its work (the template and helper, cert-manager's signing, the
//! server JWT and key encryption). Its first request confirms the name; a name that never
//! answers ends in [`ProvisionError::Unconfirmed`], logged at debug only,
//! and a failed attempt moves the sequence to the suspect lane (see
//! `dispatch`).

use crate::provision::gate::{PauseGate, Paused};
use crate::provision::metrics::Metrics;
use crate::provision::sequence::version::Version;
use crate::provision::signing::certmanager::{SignError, Signer};
use crate::provision::signing::helper::{
    CsrReply, Ed25519Reply, Helper, HelperError, HelperInput, HelperResponse,
};
use crate::provision::signing::template::{self, NodeTemplate, TemplateError};
use choria_config::{ConfigError, ProvisionerConfig, Secret};
use choria_wire::client::{ChoriaClient, ClientError, RpcOptions, RpcResult};
use choria_wire::identity;
use choria_wire::replies::{Confirmation, Conflict};
use choria_wire::security::csr::{check_csr, parse_csr, CsrError};
use choria_wire::security::ecdh::EcdhKeyPair;
use choria_wire::security::ed25519::verify_nonce;
use choria_wire::security::pem_crypt::encrypt_private_key;
use choria_wire::security::tokens::{
    parse_provisioning_token, ProvisioningClaims, ServerClaims, TokenError, PROVISIONER_ISSUER,
};
use regex::Regex;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// Everything a host sequence needs; shared by all workers.
pub struct Context {
    pub cfg: Arc<ProvisionerConfig>,
    pub client: ChoriaClient,
    pub gate: PauseGate,
    pub metrics: Arc<Metrics>,
    /// The user's helper; `None` when `configuration_template` alone
    /// configures the nodes.
    pub helper: Option<Helper>,
    /// `configuration_template`, compiled.
    pub template: Option<NodeTemplate>,
    /// `cert_manager`: signs the nodes' CSRs when the helper did not.
    pub signer: Option<Signer>,
    pub deny_list: Vec<Regex>,
    /// DNS names besides the identity a CSR may ask for.
    pub csr_allowed_dns: Vec<Regex>,
    /// How long trusted answers' reply subjects stay watched; zero: not.
    pub reply_window: Duration,
    /// How long one RPC attempt waits for its reply; `None` is Go's (the
    /// 2 s discovery timeout plus the agent's DDL timeout).
    pub rpc_timeout: Option<Duration>,
    /// Fired at shutdown once in-flight nodes had their grace period: waits
    /// for replies and backoff sleeps end at once.
    pub abandon: CancellationToken,
    /// The keys we verify and sign with, kept current by a watcher.
    pub credentials: Arc<crate::provision::signing::credentials::Credentials>,
    /// Which nodes are ours (shards mode): checked at every checkpoint.
    pub ownership: crate::provision::ownership::Ownership,
    /// Our name in the election or the shards, for the records.
    pub replica: String,
    /// The `workers` slots: a sequence holds one only while it works.
    pub slots: Arc<tokio::sync::Semaphore>,
    /// Per-node warnings and errors at a bounded rate
    /// ([`crate::provision::suspects::NODE_LOG_BURST`] per kind every ten seconds):
    /// whoever holds the fleet's provisioning JWT can make up names that
    /// answer and then stall, as many as they like.
    pub logs: Arc<crate::provision::suspects::LogLimiter>,
}

/// How a node's sequence ended without error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Configured and restarted; what was issued, for the records (`None`
    /// when it could not be read, which is logged).
    Provisioned(Option<Box<crate::records::Record>>),
    /// The helper asked for a shutdown and the node was told to shut down.
    Shutdown,
    /// `release_update` succeeded; the node restarts on the new version and
    /// is provisioned when its next startup event arrives.
    Upgrading { to: String },
}

#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("{0}")]
    Paused(#[from] Paused),
    #[error("skipping node that has been waiting {0:?}, more than twice the discovery interval")]
    Stale(Duration),
    #[error("shutting down")]
    Abandoned,
    #[error("{rpc} failed after {tries} {}: {last}", if *.tries == 1 { "try" } else { "tries" })]
    Rpc {
        rpc: &'static str,
        tries: u32,
        last: String,
    },
    /// The first request never got an answer in the node's name: nothing
    /// confirms the name exists.
    #[error("{rpc} got no answer in {tries} {}, so nothing confirms the node: {last}", if *.tries == 1 { "try" } else { "tries" })]
    Unconfirmed {
        rpc: &'static str,
        tries: u32,
        last: String,
    },
    #[error("could not validate JWT: {0}")]
    Jwt(#[source] TokenError),
    #[error("could not validate JWT: the node's provisioning JWT expects a different token (its cht claim) than `token` in the provisioner configuration")]
    TokenMismatch,
    #[error("could not verify the ed25519 public key: {0}")]
    Ed25519(String),
    #[error("could not validate CSR: {0}")]
    Csr(#[source] CsrError),
    #[error("could not validate CSR: no CSR received")]
    NoCsr,
    #[error("the helper failed: {0}")]
    Helper(#[from] HelperError),
    #[error("{0}")]
    Template(#[source] TemplateError),
    #[error("cert-manager: {0}")]
    CertManager(#[source] SignError),
    #[error("configuration deferred by the helper: {0}")]
    Deferred(String),
    #[error("could not sign the server JWT: {0}")]
    ServerJwt(#[source] TokenError),
    #[error("could not sign the server JWT: {0}")]
    ServerJwtSetup(&'static str),
    #[error("could not encrypt the private key for the node: {0}")]
    KeyEncryption(String),
    #[error("upgrade to {version} failed: {reason}")]
    Upgrade { version: String, reason: String },
    #[error("the helper returned an empty configuration")]
    EmptyConfiguration,
    #[error("the node's identity matches the deny list pattern {0:?}")]
    DeniedIdentity(String),
    #[error("{0}")]
    Refused(#[source] crate::provision::signing::grants::Refused),
    #[error(
        "{rpc}: another provisioner holds the node's provisioning lock; leaving the node to it"
    )]
    Locked { rpc: &'static str },
    #[error("{0}")]
    Conflict(#[source] Conflict),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Key(#[from] crate::provision::signing::credentials::KeyUnavailable),
}

impl ProvisionError {
    /// The step, for logs (`choria_provision#jwt`, `helper`...).
    pub fn step(&self) -> &'static str {
        match self {
            ProvisionError::Rpc { rpc, .. } | ProvisionError::Unconfirmed { rpc, .. } => rpc,
            ProvisionError::Paused(_) | ProvisionError::Abandoned => "pause",
            ProvisionError::Stale(_) => "queue",
            ProvisionError::Jwt(_) | ProvisionError::TokenMismatch => "choria_provision#jwt",
            ProvisionError::Ed25519(_) => "choria_provision#gen25519",
            ProvisionError::Csr(_) | ProvisionError::NoCsr => "choria_provision#gencsr",
            ProvisionError::Helper(_) | ProvisionError::Deferred(_) => "helper",
            ProvisionError::Template(_) => "template",
            ProvisionError::CertManager(_) => "cert_manager",
            ProvisionError::ServerJwt(_) | ProvisionError::ServerJwtSetup(_) => "server_jwt",
            ProvisionError::KeyEncryption(_) => "key_encryption",
            ProvisionError::Upgrade { .. } => "choria_provision#release_update",
            ProvisionError::EmptyConfiguration => "choria_provision#configure",
            ProvisionError::Config(_) | ProvisionError::Key(_) => "config",
            ProvisionError::DeniedIdentity(_) => "deny_list",
            ProvisionError::Refused(_) => "grant",
            ProvisionError::Locked { rpc } => rpc,
            ProvisionError::Conflict(_) => "reply_window",
        }
    }

    /// A pause or shutdown rather than a fault of the node.
    pub fn is_pause(&self) -> bool {
        matches!(self, ProvisionError::Paused(_) | ProvisionError::Abandoned)
    }
}

/// go-choria's answer when another `<senderid>.<callerid>` holds the node's
/// provisioning lock (statuscode 1, Aborted).
pub const LOCK_REFUSED: &str = "Could not obtain provisioning lock";

fn is_lock_refusal(r: &RpcResult) -> bool {
    r.body.statuscode == choria_wire::mcorpc::StatusCode::Aborted
        && r.body.statusmsg == LOCK_REFUSED
}

/// Go's `backoff.FiveSec` policy: the sleep after try n is `FIVE_SEC[n]`
/// milliseconds, jittered to 50–150 %.
const FIVE_SEC: [u64; 11] = [
    500, 750, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000,
];

fn backoff(try_number: u32) -> Duration {
    let base = FIVE_SEC[(try_number as usize).min(FIVE_SEC.len() - 1)];
    Duration::from_millis(base / 2 + rand::random::<u64>() % base)
}

/// What a node told us along the way.
#[derive(Default)]
struct Gathered {
    raw_jwt: String,
    jwt: Option<ProvisioningClaims>,
    /// The node's X25519 public key from the `jwt` reply.
    ecdh_public: String,
    ed25519: Option<Ed25519Reply>,
    inventory: String,
    version: String,
    upgradable: bool,
    csr: Option<CsrReply>,
}

/// One run of the sequence for one node. It owns what it needs, so the part
/// after the reply windows can finish in a task of its own.
pub struct HostSequence {
    ctx: Arc<Context>,
    identity: Arc<str>,
    /// The token sent in requests: `token` from the config, or the JWT's `cht`
    /// when the config has none.
    token: Secret,
    got: Gathered,
    /// Set once `configure` succeeded: a shutdown then still lets `restart`
    /// go out, so the node is not left configured but holding our
    /// provisioning lock (two minutes for any other provisioner).
    finishing: bool,
    /// The reply subjects of trusted answers still watched.
    pending: Vec<Confirmation>,
    /// The leadership term this sequence belongs to: once it is over, the
    /// sequence stops at its next checkpoint (see [`PauseGate`]).
    term: u64,
    /// Its place in its lane's in-flight budget.
    place: std::sync::Mutex<crate::provision::pipeline::dispatch::LanePlace>,
    /// Where its name came from, once dispatched (metrics).
    source: Option<crate::provision::pipeline::registry::Source>,
    /// Set once any request got the node's own answer: the name is real.
    answered: std::sync::atomic::AtomicBool,
}

/// A `workers` slot held while a sequence works.
struct Working<'a> {
    _slot: tokio::sync::OwnedSemaphorePermit,
    _busy: crate::provision::metrics::BusyWorker<'a>,
}

impl HostSequence {
    /// A sequence of the leadership term `term` (the gate's term when the
    /// worker took the node, read before it checked the node was current).
    pub fn new(ctx: Arc<Context>, identity: Arc<str>, term: u64) -> Self {
        HostSequence {
            term,
            token: ctx.cfg.token.clone(),
            ctx,
            identity,
            got: Gathered::default(),
            finishing: false,
            pending: Vec::new(),
            place: std::sync::Mutex::new(
                crate::provision::pipeline::dispatch::LanePlace::unbounded(),
            ),
            source: None,
            answered: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Runs in a lane's budget, for a name that came from `source`.
    pub fn in_lane(
        mut self,
        place: crate::provision::pipeline::dispatch::LanePlace,
        source: crate::provision::pipeline::registry::Source,
    ) -> Self {
        self.place = std::sync::Mutex::new(place);
        self.source = Some(source);
        self
    }

    fn is_answered(&self) -> bool {
        self.answered.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes a `workers` slot for the work that follows (released when the
    /// guard goes). Waits for one, but never past shutdown's abandon.
    async fn working(&self) -> Result<Working<'_>, ProvisionError> {
        let slot = tokio::select! {
            s = self.ctx.slots.clone().acquire_owned() => s.map_err(|_| ProvisionError::Abandoned)?,
            _ = self.ctx.abandon.cancelled() => return Err(ProvisionError::Abandoned),
        };
        Ok(Working {
            _slot: slot,
            _busy: self.ctx.metrics.busy_worker(),
        })
    }

    /// The first answer in the node's own name: counted where it came
    /// from, and from now on the sequence logs at info.
    fn confirmed(&self) {
        if self
            .answered
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        match self.source {
            Some(crate::provision::pipeline::registry::Source::Discovery) => {
                self.ctx.metrics.discovered()
            }
            Some(crate::provision::pipeline::registry::Source::Event) => {
                self.ctx.metrics.event_discovered();
                info!(
                    node = &*self.identity,
                    "adding node after its startup event"
                );
            }
            None => {}
        }
        info!(node = &*self.identity, "provisioning");
    }

    /// Runs the whole sequence inline. `waiting` is how long the node sat
    /// in the queue.
    pub async fn run(mut self, waiting: Duration) -> Result<Outcome, ProvisionError> {
        // The two parts on the heap, each only while it runs: many
        // sequences wait out their reply windows at once (in `settle`), and
        // then cost little more than the sequence itself.
        Box::pin(self.gather(waiting)).await?;
        if self.is_settled() {
            // Every window closed already: their outcomes are read, nothing
            // is waited for.
            self.settle().await?;
        } else {
            // Waiting out the reply windows is pure waiting: the lane's
            // place goes to another sequence meanwhile.
            let budget = {
                let mut place = self
                    .place
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                place.release();
                place.budget()
            };
            self.settle().await?;
            let permit = tokio::select! {
                p = budget.acquire_owned() => p.map_err(|_| ProvisionError::Abandoned)?,
                _ = self.ctx.abandon.cancelled() => return Err(ProvisionError::Abandoned),
            };
            self.place
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .hold(permit);
        }
        Box::pin(self.finish()).await
    }

    /// The first part: what the node tells about itself (JWT, ed25519 key,
    /// inventory, CSR), checked. Nothing is acted on yet.
    pub async fn gather(&mut self, waiting: Duration) -> Result<(), ProvisionError> {
        let cfg = self.ctx.cfg.clone();
        if waiting > 2 * cfg.interval {
            return Err(ProvisionError::Stale(waiting));
        }
        // The deny list applies to the identity in every mode (Go applies
        // it to CSR names only, so ed25519 and plain networks had none).
        if let Some(re) = self
            .ctx
            .deny_list
            .iter()
            .find(|re| re.is_match(&self.identity))
        {
            return Err(ProvisionError::DeniedIdentity(re.as_str().to_string()));
        }
        if cfg.features.jwt {
            self.fetch_jwt().await?;
            self.validate_jwt()?;
        }
        if cfg.features.ed25519 {
            self.fetch_ed25519().await?;
        }
        self.fetch_inventory().await?;
        if cfg.features.pki {
            self.fetch_csr().await?;
        }
        Ok(())
    }

    /// Whether every trusted answer's reply window is over already, so
    /// [`HostSequence::settle`] would not wait.
    pub fn is_settled(&self) -> bool {
        self.pending.iter().all(Confirmation::is_finished)
    }

    /// Waits out the reply windows of the trusted answers: a second,
    /// different answer to any of them means someone else answers in the
    /// node's name, and the node is not provisioned this cycle (no helper
    /// run, no key material sent).
    pub async fn settle(&mut self) -> Result<(), ProvisionError> {
        let _confirming = self.ctx.metrics.confirming_node();
        for c in std::mem::take(&mut self.pending) {
            let result = tokio::select! {
                r = c.wait() => r,
                _ = self.ctx.abandon.cancelled() => return Err(ProvisionError::Abandoned),
            };
            if let Err(conflict) = result {
                self.ctx.metrics.conflicting_reply();
                error!(
                    node = &*self.identity,
                    rpc = %conflict.rpc,
                    first_sender = %identity::shown(&conflict.first_sender),
                    second_sender = %identity::shown(&conflict.second_sender),
                    after = ?conflict.after,
                    "SECURITY: two different answers in the name of this node; not provisioning it this cycle"
                );
                return Err(ProvisionError::Conflict(conflict));
            }
        }
        Ok(())
    }

    /// The rest, once settled: the helper, then shutdown, or server JWT,
    /// key encryption, upgrade, configure and restart.
    pub async fn finish(mut self) -> Result<Outcome, ProvisionError> {
        let cfg = self.ctx.cfg.clone();
        // Every trusted answer's window must have been read: an unread one
        // could hold a second answer in the node's name.
        if !self.pending.is_empty() {
            self.settle().await?;
        }
        let mut response = self.decide().await?;
        crate::provision::signing::grants::check_configuration(&response.configuration)
            .map_err(|e| self.refused(e))?;
        if response.defer {
            return Err(ProvisionError::Deferred(response.msg));
        }
        if response.shutdown {
            if response.msg.is_empty() {
                warn!(
                    node = &*self.identity,
                    "shutting down the node as the helper asked, no reason given"
                );
            } else {
                warn!(node = &*self.identity, reason = %response.msg, "shutting down the node as the helper asked");
            }
            self.shutdown().await?;
            return Ok(Outcome::Shutdown);
        }

        let helper_signed = !response.certificate.is_empty();
        if cfg.features.pki && response.certificate.is_empty() {
            self.sign_with_cert_manager(&mut response).await?;
        }

        let (server_jwt, key, provisioner_ecdh_public) = {
            let _working = if cfg.features.ed25519 || !response.key.is_empty() {
                Some(self.working().await?)
            } else {
                None
            };
            let server_jwt = if cfg.features.ed25519 {
                self.sign_server_jwt(&response)?
            } else {
                String::new()
            };
            let (key, ecdh) = if response.key.is_empty() {
                (String::new(), String::new())
            } else {
                self.encrypt_key(&response.key)?
            };
            (server_jwt, key, ecdh)
        };

        if cfg.features.upgrades && !response.upgrade.is_empty() {
            match self.upgrade(&response.upgrade).await {
                Ok(true) => {}
                Ok(false) => {
                    return Ok(Outcome::Upgrading {
                        to: response.upgrade.clone(),
                    })
                }
                Err(e) if e.is_pause() => return Err(e),
                Err(e) if cfg.upgrades_optional => {
                    warn!(node = &*self.identity, error = %e, "could not upgrade, continuing as upgrades_optional is set");
                }
                Err(e) => return Err(e),
            }
        }

        let config = self
            .configure(&response, &key, &provisioner_ecdh_public, &server_jwt)
            .await?;
        self.finishing = true;
        self.restart().await?;
        let signer = match (response.certificate.is_empty(), helper_signed) {
            (true, _) => None,
            (false, true) => Some("helper"),
            (false, false) => Some("cert-manager"),
        };
        Ok(Outcome::Provisioned(self.record(
            &response,
            &server_jwt,
            &config,
            signer,
        )))
    }

    /// The record of this provisioning (see [`crate::records`]).
    fn record(
        &self,
        response: &HelperResponse,
        server_jwt: &str,
        config: &str,
        signer: Option<&str>,
    ) -> Option<Box<crate::records::Record>> {
        let mode = match (self.ctx.template.is_some(), self.ctx.helper.is_some()) {
            (true, true) => "template+helper",
            (true, false) => "template",
            _ => "helper",
        };
        let protocol = self.ctx.client.version().to_string();
        let issued = crate::records::Issued {
            identity: &self.identity,
            replica: &self.ctx.replica,
            site: &self.ctx.cfg.site,
            protocol: &protocol,
            mode,
            signer,
            certificate: &response.certificate,
            server_jwt,
            config,
            provisioning_jwt_expires: self.got.jwt.as_ref().and_then(|c| c.standard.expire_time()),
            now: chrono::Utc::now(),
        };
        match issued.record() {
            Ok(r) => Some(Box::new(r)),
            Err(e) => {
                warn!(node = &*self.identity, error = %e, "no record of this provisioning");
                None
            }
        }
    }

    /// One RPC with retries. `check` turns a reply into the caller's value or a
    /// retryable error (most start with [`require_ok`]).
    async fn call<T: Serialize, R>(
        &self,
        rpc: &'static str,
        tries: u32,
        data: &T,
        check: impl FnMut(&RpcResult) -> Result<R, String>,
    ) -> Result<R, ProvisionError> {
        Ok(self.call_with(rpc, tries, data, false, check).await?.0)
    }

    /// [`HostSequence::call`] for an answer later steps trust: its reply
    /// subject stays watched for `reply_window` (settled before the helper).
    async fn call_trusted<T: Serialize, R>(
        &mut self,
        rpc: &'static str,
        tries: u32,
        data: &T,
        check: impl FnMut(&RpcResult) -> Result<R, String>,
    ) -> Result<R, ProvisionError> {
        let (value, confirmation) = self.call_with(rpc, tries, data, true, check).await?;
        self.pending.extend(confirmation);
        Ok(value)
    }

    async fn call_with<T: Serialize, R>(
        &self,
        rpc: &'static str,
        tries: u32,
        data: &T,
        trusted: bool,
        mut check: impl FnMut(&RpcResult) -> Result<R, String>,
    ) -> Result<(R, Option<Confirmation>), ProvisionError> {
        let (agent, action) = rpc.split_once('#').expect("rpc names are agent#action");
        self.gate_check()?;
        let mut last = String::new();
        let mut tried = 0;
        let client = &self.ctx.client;
        let opts = RpcOptions {
            timeout: self
                .ctx
                .rpc_timeout
                .unwrap_or_else(|| client.rpc_timeout(agent)),
            confirm: trusted.then_some(self.ctx.reply_window),
        };
        for attempt in 1..=tries {
            // Pausing mid-sequence stops the node here, at an attempt boundary.
            self.gate_check()?;
            tried = attempt;
            debug!(node = &*self.identity, rpc, attempt, tries, "calling");
            let started = Instant::now();
            let request = client.request(&self.identity, agent, action, data, opts);
            let result = tokio::select! {
                r = request => r,
                _ = self.ctx.abandon.cancelled() => return Err(ProvisionError::Abandoned),
            };
            self.ctx.metrics.observe_rpc(rpc, started.elapsed());
            // An answer in the node's own name confirms it, even one whose
            // body is not what we asked for.
            if matches!(&result, Ok(_) | Err(ClientError::BadReply { .. })) {
                self.confirmed();
            }
            if let Ok((r, _)) = &result {
                if is_lock_refusal(r) {
                    // Another provisioner holds this node (go-choria's
                    // per-node lock): not a failure to retry in a storm;
                    // the node is left to its holder until it shows up again.
                    self.ctx.metrics.lock_refusal();
                    return Err(ProvisionError::Locked { rpc });
                }
            }
            let outcome = match result {
                Ok((r, confirmation)) => check(&r).map(|v| (v, confirmation)),
                Err(ClientError::Timeout { timeout, .. }) => {
                    Err(format!("no reply within {timeout:?}"))
                }
                Err(e) => Err(e.to_string()),
            };
            match outcome {
                Ok(value) => return Ok(value),
                Err(e) if self.is_answered() => {
                    if let crate::provision::suspects::Allow::Yes { suppressed } =
                        self.ctx.logs.check("rpc attempt", Instant::now())
                    {
                        warn!(node = &*self.identity, rpc, attempt, tries, error = %e, suppressed_before = suppressed, "RPC attempt failed");
                    }
                    last = e;
                }
                // Nothing says the name is real yet: a made-up one must not
                // cost a log line per attempt.
                Err(e) => {
                    debug!(node = &*self.identity, rpc, attempt, tries, error = %e, "RPC attempt failed");
                    last = e;
                }
            }
            // A name that never answered is not asked again now: one
            // request is what a made-up name costs (a real node that
            // missed it is found again by the next discovery).
            if !self.is_answered() {
                break;
            }
            if attempt < tries {
                // Retried behind the names that have not failed, or at the
                // next discovery when there is no room for that now.
                let demoted = self
                    .place
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .demote();
                if !demoted {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff(attempt)) => {}
                    _ = self.ctx.abandon.cancelled() => return Err(ProvisionError::Abandoned),
                }
            }
        }
        self.ctx.metrics.rpc_error(rpc);
        let tries = tried;
        if !self.is_answered() {
            return Err(ProvisionError::Unconfirmed { rpc, tries, last });
        }
        Err(ProvisionError::Rpc { rpc, tries, last })
    }

    /// Every checkpoint: the gate is open (after `configure`, a shutdown
    /// still lets `restart` go out) and our term is the current one.
    fn gate_check(&self) -> Result<(), Paused> {
        let ignored = self
            .finishing
            .then_some(crate::provision::gate::PauseReason::Shutdown);
        self.ctx.gate.check_term_ignoring(self.term, ignored)?;
        // Once configured, the node is finished here even if it became
        // another replica's share: stopping before `restart` would leave
        // it configured, holding our lock, for its new owner to configure
        // again two minutes later.
        if !self.finishing && !self.ctx.ownership.owns(&self.identity) {
            return Err(Paused("the node is another replica's share now".into()));
        }
        Ok(())
    }

    /// A step's log line: info once the name is confirmed, debug before.
    fn step(&self, what: &'static str) {
        if self.is_answered() {
            info!(node = &*self.identity, "{what}");
        } else {
            debug!(node = &*self.identity, "{what}");
        }
    }

    fn token_data(&self) -> TokenOnly<'_> {
        TokenOnly {
            token: self.token.expose(),
        }
    }

    async fn fetch_jwt(&mut self) -> Result<(), ProvisionError> {
        #[derive(serde::Deserialize)]
        struct Reply {
            #[serde(default)]
            jwt: String,
            #[serde(default)]
            ecdh_public: String,
        }
        self.step("fetching JWT");
        let token = self.token.expose().to_string();
        let (jwt, ecdh) = self
            .call_trusted(
                "choria_provision#jwt",
                3,
                &TokenOnly { token: &token },
                |r| {
                    require_ok(r)?;
                    let reply: Reply = decode(&r.body.data)?;
                    if reply.jwt.is_empty() {
                        return Err("the reply holds no JWT".into());
                    }
                    Ok((reply.jwt, reply.ecdh_public))
                },
            )
            .await?;
        self.got.raw_jwt = jwt;
        self.got.ecdh_public = ecdh;
        Ok(())
    }

    /// Verifies the provisioning JWT with `jwt_verify_cert` (re-read each time
    /// so a rotated key takes effect) and settles the token to use.
    fn validate_jwt(&mut self) -> Result<(), ProvisionError> {
        let key = self.ctx.credentials.verify_key()?;
        let claims =
            parse_provisioning_token(&self.got.raw_jwt, &key).map_err(ProvisionError::Jwt)?;
        if !claims.token.is_empty() {
            if self.token.is_empty() {
                // The JWT is signed by the organisation: its `cht` is the token
                // this node expects, so use it when we were given none.
                self.token = Secret::new(claims.token.clone());
            } else if self.token.expose() != claims.token {
                return Err(ProvisionError::TokenMismatch);
            }
        }
        self.got.jwt = Some(claims);
        Ok(())
    }

    async fn fetch_ed25519(&mut self) -> Result<(), ProvisionError> {
        #[derive(Serialize)]
        struct Args<'t> {
            nonce: &'t str,
            token: &'t str,
        }
        let nonce = choria_wire::ids::v1_request_id();
        self.step("fetching ED25519 public key");
        let token = self.token.expose().to_string();
        let reply = self
            .call_trusted(
                "choria_provision#gen25519",
                5,
                &Args {
                    nonce: &nonce,
                    token: &token,
                },
                |r| {
                    require_ok(r)?;
                    let reply: Ed25519Reply = decode(&r.body.data)?;
                    if reply.public_key.is_empty() {
                        return Err("no public key received".into());
                    }
                    if reply.signature.is_empty() {
                        return Err("no signature received".into());
                    }
                    verify_nonce(&reply.public_key, &nonce, &reply.signature)
                        .map_err(|e| format!("nonce signature check failed: {e}"))?;
                    Ok(reply)
                },
            )
            .await?;
        self.got.ed25519 = Some(reply);
        Ok(())
    }

    async fn fetch_inventory(&mut self) -> Result<(), ProvisionError> {
        #[derive(Serialize)]
        struct Empty {}
        self.step("fetching inventory");
        let (inventory, version, upgradable) = self
            .call("rpcutil#inventory", 5, &Empty {}, |r| {
                require_ok(r)?;
                let data = &r.body.data;
                if !data.is_object() {
                    return Err("the inventory reply holds no data".into());
                }
                let json = choria_wire::json::to_vec(data)
                    .map_err(|e| format!("could not encode the inventory: {e}"))?;
                let version = data
                    .get("version")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string();
                let upgradable = data
                    .get("upgradable")
                    .and_then(|v| v.as_bool())
                    .unwrap_or(false);
                Ok((
                    String::from_utf8(json).expect("JSON is UTF-8"),
                    version,
                    upgradable,
                ))
            })
            .await?;
        self.got.inventory = inventory;
        self.got.version = version;
        self.got.upgradable = upgradable;
        Ok(())
    }

    async fn fetch_csr(&mut self) -> Result<(), ProvisionError> {
        #[derive(Serialize)]
        struct Args<'t> {
            cn: &'t str,
            token: &'t str,
        }
        self.step("fetching CSR");
        let token = self.token.expose().to_string();
        let identity = self.identity.clone();
        let reply = self
            .call_trusted(
                "choria_provision#gencsr",
                1,
                &Args {
                    cn: &identity,
                    token: &token,
                },
                |r| {
                    require_ok(r)?;
                    decode::<CsrReply>(&r.body.data)
                },
            )
            .await?;
        if reply.csr.is_empty() {
            return Err(ProvisionError::NoCsr);
        }
        let checked = parse_csr(&reply.csr).and_then(|info| {
            check_csr(
                &info,
                &self.identity,
                &self.ctx.deny_list,
                &self.ctx.csr_allowed_dns,
            )
        });
        if let Err(e) = checked {
            self.ctx.metrics.rejected_csr(e.reason());
            return Err(ProvisionError::Csr(e));
        }
        self.got.csr = Some(reply);
        Ok(())
    }

    /// The node's configuration: the template's, the helper's, or the
    /// helper's merged over the template's (`template::merge`).
    /// A grant refused: counted, and the node fails.
    fn refused(&self, e: crate::provision::signing::grants::Refused) -> ProvisionError {
        self.ctx.metrics.refused_value(e.place);
        ProvisionError::Refused(e)
    }

    async fn decide(&self) -> Result<HelperResponse, ProvisionError> {
        self.gate_check()?;
        let _working = self.working().await?;
        self.gate_check()?;
        let input = HelperInput {
            identity: &self.identity,
            csr: self.got.csr.as_ref(),
            ed25519_pubkey: self.got.ed25519.as_ref(),
            inventory: &self.got.inventory,
            jwt: self.got.jwt.as_ref(),
        };
        let templated = match &self.ctx.template {
            Some(t) => Some(t.render(&input).map_err(|e| {
                self.ctx.metrics.template_error();
                if let Some(place) = e.refused {
                    self.ctx.metrics.refused_value(place.label());
                }
                ProvisionError::Template(e)
            })?),
            None => None,
        };
        let Some(helper) = &self.ctx.helper else {
            // The configuration says one of the two is there.
            return Ok(templated.unwrap_or_default());
        };
        let started = Instant::now();
        let result = tokio::select! {
            r = helper.run(&input) => r,
            _ = self.ctx.abandon.cancelled() => return Err(ProvisionError::Abandoned),
        };
        self.ctx.metrics.observe_helper(started.elapsed());
        let helped = result.map_err(|e| {
            self.ctx.metrics.helper_error();
            ProvisionError::Helper(e)
        })?;
        Ok(match templated {
            Some(t) => template::merge(t, helped),
            None => helped,
        })
    }

    /// The certificate and CA from cert-manager, when it is the signer and
    /// the helper (if any) gave no certificate.
    async fn sign_with_cert_manager(
        &self,
        response: &mut HelperResponse,
    ) -> Result<(), ProvisionError> {
        let (Some(signer), Some(csr)) = (&self.ctx.signer, &self.got.csr) else {
            return Ok(());
        };
        self.gate_check()?;
        // Signing is work: `workers` bounds the requests cert-manager has
        // in hand from us at once.
        let _working = self.working().await?;
        let started = Instant::now();
        match signer
            .sign(&self.identity, &csr.csr, &self.ctx.gate, &self.ctx.abandon)
            .await
        {
            Ok(issued) => {
                self.ctx.metrics.cert_manager_request("issued");
                debug!(node = &*self.identity, took = ?started.elapsed(), "certificate issued by cert-manager");
                response.certificate = issued.certificate;
                if response.ca.is_empty() {
                    response.ca = issued.ca;
                }
                Ok(())
            }
            Err(SignError::Paused(p)) => Err(ProvisionError::Paused(p)),
            Err(SignError::Abandoned) => Err(ProvisionError::Abandoned),
            Err(e) => {
                self.ctx.metrics.cert_manager_request(e.outcome());
                Err(ProvisionError::CertManager(e))
            }
        }
    }

    async fn shutdown(&self) -> Result<(), ProvisionError> {
        let identity: &str = &self.identity;
        let metrics = &self.ctx.metrics;
        // A shutdown the node refuses is only logged and not retried, as in
        // Go: the helper wants the node gone either way.
        let accepted = self
            .call("choria_provision#shutdown", 3, &self.token_data(), |r| {
                if !r.body.is_ok() {
                    warn!(node = identity, sender = %r.reply.sender, status = %r.body.statusmsg, "the node refused to shut down");
                }
                Ok(r.body.is_ok())
            })
            .await?;
        if accepted {
            metrics.helper_shutdown();
            info!(node = identity, "node is shutting down");
        }
        Ok(())
    }

    /// The server JWT for ed25519 networks, as Go's `generateServerJWT` makes it.
    fn sign_server_jwt(&self, response: &HelperResponse) -> Result<String, ProvisionError> {
        let cfg = &self.ctx.cfg;
        let err = ProvisionError::ServerJwt;
        let Some(ed) = self.got.ed25519.as_ref() else {
            return Err(ProvisionError::ServerJwtSetup("no ed25519 public key set"));
        };
        let mut org = "choria".to_string();
        let mut validity = cfg.server_jwt_validity;
        let mut collectives = vec!["mcollective".to_string()];
        let mut pub_subjects = Vec::new();
        let mut permissions = None;
        // Choria switches its default collective with the v2 security provider.
        if response
            .configuration
            .get("plugin.security.provider")
            .is_some_and(|p| p == "choria")
        {
            collectives = vec!["choria".to_string()];
        }
        if let Some(c) = response.configuration.get("collectives") {
            collectives = crate::provision::signing::grants::split_list(c);
        }
        if let Some(claims) = &response.server_claims {
            if !claims.organization_unit.is_empty() {
                org = claims.organization_unit.clone();
            }
            if let Some(exp) = claims.standard.expires_at.filter(|e| *e > 0) {
                let now = chrono::Utc::now().timestamp();
                validity = Duration::from_secs(exp.saturating_sub(now).max(0) as u64);
            }
            if !claims.collectives.is_empty() {
                collectives = claims.collectives.clone();
            }
            if !claims.additional_publish_subjects.is_empty() {
                pub_subjects = claims.additional_publish_subjects.clone();
            }
            if claims.permissions.is_some() {
                permissions = claims.permissions;
            }
        }
        crate::provision::signing::grants::check_collectives("collectives", &collectives)
            .map_err(|e| self.refused(e))?;
        crate::provision::signing::grants::check_publish_subjects(&pub_subjects)
            .map_err(|e| self.refused(e))?;
        if validity <= Duration::from_secs(3600) {
            warn!(node = &*self.identity, requested = ?validity, default = %cfg.server_jwt_validity_text(), "server JWT validity too short, using the default");
            validity = cfg.server_jwt_validity;
        }
        let mut claims = ServerClaims::new(
            &self.identity,
            collectives,
            &org,
            permissions,
            pub_subjects,
            &ed.public_key,
            PROVISIONER_ISSUER,
            validity,
        )
        .map_err(err)?;
        // Rotated keys take effect: the watcher reads changed files again.
        let key = self.ctx.credentials.signing_key()?;
        if let Some((_, signer)) = self.ctx.credentials.signing_token()?.as_ref() {
            let Some(ed_key) = key.as_ed25519() else {
                return Err(ProvisionError::ServerJwtSetup(
                    "jwt_signing_key must be an ed25519 seed to chain-sign",
                ));
            };
            claims.add_chain_issuer_data(signer, ed_key).map_err(err)?;
        }
        key.sign(&claims).map_err(err)
    }

    /// Encrypts the helper's private key to the node (X25519 + AES-256 PEM);
    /// returns the encrypted PEM and our public half for the node.
    fn encrypt_key(&self, key_pem: &str) -> Result<(String, String), ProvisionError> {
        let err = ProvisionError::KeyEncryption;
        if self.got.ecdh_public.is_empty() {
            return Err(err(
                "the helper returned a private key but the node did not start a Diffie-Hellman exchange (enable features.jwt so its jwt reply carries ecdh_public)".into(),
            ));
        }
        let ours = EcdhKeyPair::generate();
        let shared = ours
            .shared_secret(&self.got.ecdh_public)
            .map_err(|e| err(format!("the node's ecdh_public is unusable: {e}")))?;
        let encrypted = encrypt_private_key(key_pem, &shared).map_err(|e| err(e.to_string()))?;
        Ok((encrypted, ours.public_hex()))
    }

    /// `Ok(true)` when no upgrade is needed, `Ok(false)` when one was started.
    async fn upgrade(&self, target: &str) -> Result<bool, ProvisionError> {
        let cfg = &self.ctx.cfg;
        let fail = |reason: &str| ProvisionError::Upgrade {
            version: target.to_string(),
            reason: reason.to_string(),
        };
        let Some(repository) = cfg.upgrades_repository.as_deref() else {
            return Err(fail("upgrades_repository is not configured"));
        };
        if self.got.version.is_empty() {
            return Err(fail("the node's inventory has no version"));
        }
        if !self.got.upgradable {
            return Err(fail("the node does not support upgrades"));
        }
        if Version::parse(&self.got.version).equal(&Version::parse(target)) {
            return Ok(true);
        }
        warn!(node = &*self.identity, from = %self.got.version, to = target, "updating the node's version");
        #[derive(Serialize)]
        struct Args<'t> {
            repository: &'t str,
            token: &'t str,
            version: &'t str,
        }
        self.call(
            "choria_provision#release_update",
            3,
            &Args {
                repository,
                token: self.token.expose(),
                version: target,
            },
            require_ok,
        )
        .await?;
        Ok(false)
    }

    async fn configure(
        &self,
        response: &HelperResponse,
        key: &str,
        ecdh_public: &str,
        server_jwt: &str,
    ) -> Result<String, ProvisionError> {
        if response.configuration.is_empty() {
            return Err(ProvisionError::EmptyConfiguration);
        }
        let config = String::from_utf8(
            choria_wire::json::to_vec(&response.configuration).expect("a string map encodes"),
        )
        .expect("JSON is UTF-8");
        // The CSR's ssldir wins over the helper's, as in Go.
        let ssldir = match &self.got.csr {
            Some(csr) if !csr.ssldir.is_empty() => csr.ssldir.as_str(),
            _ => response.ssldir.as_str(),
        };
        // Go's generated client sends every input, in key order.
        let args = ConfigureArgs {
            action_policies: &response.action_policies,
            ca: &response.ca,
            certificate: &response.certificate,
            config: &config,
            ecdh_public,
            key,
            opa_policies: &response.opa_policies,
            server_jwt,
            ssldir,
            token: self.token.expose(),
        };
        info!(node = &*self.identity, "configuring node");
        self.call("choria_provision#configure", 5, &args, require_ok)
            .await?;
        Ok(config)
    }

    async fn restart(&self) -> Result<(), ProvisionError> {
        #[derive(Serialize)]
        struct Args<'t> {
            splay: u32,
            token: &'t str,
        }
        info!(node = &*self.identity, "restarting node");
        self.call(
            "choria_provision#restart",
            3,
            &Args {
                splay: 1,
                token: self.token.expose(),
            },
            require_ok,
        )
        .await
    }
}

#[derive(Serialize)]
struct TokenOnly<'t> {
    token: &'t str,
}

/// `choria_provision#configure` inputs, fields in the order Go's map encodes them.
#[derive(Serialize)]
struct ConfigureArgs<'t> {
    action_policies: &'t BTreeMap<String, String>,
    ca: &'t str,
    certificate: &'t str,
    config: &'t str,
    ecdh_public: &'t str,
    key: &'t str,
    opa_policies: &'t BTreeMap<String, String>,
    server_jwt: &'t str,
    ssldir: &'t str,
    token: &'t str,
}

/// A reply with a status other than OK is a failed attempt, with Go's message.
fn require_ok(r: &RpcResult) -> Result<(), String> {
    if r.body.is_ok() {
        Ok(())
    } else {
        Err(format!(
            "invalid response from {}: {} ({})",
            r.reply.sender, r.body.statusmsg, r.body.statuscode as u8
        ))
    }
}

fn decode<T: serde::de::DeserializeOwned>(data: &serde_json::Value) -> Result<T, String> {
    serde_json::from_value(data.clone())
        .map_err(|e| format!("could not decode the reply data: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_follows_go_five_sec_policy_with_jitter() {
        for (try_number, base) in [(1u32, 750u64), (2, 1000), (3, 1500), (50, 5000)] {
            for _ in 0..50 {
                let d = backoff(try_number).as_millis() as u64;
                assert!(
                    d >= base / 2 && d < base / 2 + base,
                    "try {try_number}: {d} ms outside [{}, {})",
                    base / 2,
                    base / 2 + base
                );
            }
        }
    }

    #[test]
    fn configure_inputs_encode_in_go_map_order() {
        let empty = BTreeMap::new();
        let args = ConfigureArgs {
            action_policies: &empty,
            ca: "",
            certificate: "",
            config: "{\"a\":\"b\"}",
            ecdh_public: "",
            key: "",
            opa_policies: &empty,
            server_jwt: "",
            ssldir: "",
            token: "t",
        };
        let json = String::from_utf8(choria_wire::json::to_vec(&args).unwrap()).unwrap();
        assert_eq!(
            json,
            r#"{"action_policies":{},"ca":"","certificate":"","config":"{\"a\":\"b\"}","ecdh_public":"","key":"","opa_policies":{},"server_jwt":"","ssldir":"","token":"t"}"#
        );
    }

    #[test]
    fn errors_name_their_step() {
        let e = ProvisionError::Rpc {
            rpc: "choria_provision#jwt",
            tries: 3,
            last: "no reply within 2s".into(),
        };
        assert_eq!(e.step(), "choria_provision#jwt");
        assert_eq!(
            e.to_string(),
            "choria_provision#jwt failed after 3 tries: no reply within 2s"
        );
        assert!(ProvisionError::Paused(Paused("x".into())).is_pause());
    }
}

//! The per-node sequence, step for step as the Go provisioner's `host`
//! package runs it:
//!
//! jwt → gen25519 → rpcutil#inventory → gencsr → (our admission policy)
//! → helper → (defer | shutdown)
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
//! `pipeline::lanes`).
//!
//! This file holds the sequence and the order of its stages (gather,
//! settle, finish); each stage's steps live by what they do: `call` (one
//! request with its tries), `ask` (what the node tells: JWT, key,
//! inventory, CSR), `admit` (the admission policy), `decide` (template, helper, cert-manager, server JWT,
//! key encryption), `apply` (`release_update`, `configure`, `restart`,
//! `shutdown`), `error` (one error per step).

mod admit;
mod apply;
mod ask;
mod call;
mod context;
mod decide;
mod error;
mod evidence;
pub mod version;

pub use call::LOCK_REFUSED;
pub use context::{Checks, Context, Trail};
pub use error::ProvisionError;

use crate::provision::gate::Paused;
use crate::provision::pipeline::lanes::LanePlace;
use crate::provision::pipeline::registry::Source;
use crate::provision::signing::helper::{CsrReply, Ed25519Reply, HelperResponse};
use crate::provision::traces::{traced, NodeTrace};
use choria_config::Secret;
use choria_wire::client::ChoriaClient;
use choria_wire::identity;
use choria_wire::replies::Confirmation;
use choria_wire::security::tokens::ProvisioningClaims;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, error, info, warn};

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
    /// Who asks the node: the provisioner's connection to the broker.
    client: Arc<ChoriaClient>,
    identity: Arc<str>,
    /// The token sent in requests: `token` from the config, or the JWT's `cht`
    /// when the config has none.
    token: Secret,
    got: Gathered,
    /// Set once `configure` succeeded: a shutdown or a requested pause then
    /// still lets `restart` go out, so the node is not left configured but
    /// holding our provisioning lock (two minutes for any other
    /// provisioner), to be configured again.
    finishing: bool,
    /// The reply subjects of trusted answers still watched.
    pending: Vec<Confirmation>,
    /// The leadership term this sequence belongs to: once it is over, the
    /// sequence stops at its next checkpoint (see [`PauseGate`]).
    term: u64,
    /// Its place in its lane's in-flight budget.
    place: std::sync::Mutex<LanePlace>,
    /// Where its name came from, once dispatched (metrics).
    source: Option<Source>,
    /// Set once any request got the node's own answer: the name is real.
    answered: std::sync::atomic::AtomicBool,
    /// Its trace, when tracing is on and it was sampled.
    trace: Option<Arc<NodeTrace>>,
}

/// A `workers` slot held while a sequence works.
struct Working<'a> {
    _slot: tokio::sync::OwnedSemaphorePermit,
    _busy: crate::provision::metrics::BusyWorker<'a>,
}

/// How long after a lost term a configured node's `restart` still goes
/// out: under the time a leader steps down before its record expires for
/// the others (1.2 s was the least seen on a loaded machine with a 5 s
/// Streams TTL; a Lease's is seconds).
pub const FINISH_GRACE: Duration = Duration::from_secs(1);

impl HostSequence {
    /// A sequence of the leadership term `term` (the gate's term when the
    /// worker took the node, read before it checked the node was current).
    pub fn new(
        ctx: Arc<Context>,
        client: Arc<ChoriaClient>,
        identity: Arc<str>,
        term: u64,
    ) -> Self {
        HostSequence {
            term,
            token: ctx.cfg.token.clone(),
            ctx,
            client,
            identity,
            got: Gathered::default(),
            finishing: false,
            pending: Vec::new(),
            place: std::sync::Mutex::new(LanePlace::unbounded()),
            source: None,
            answered: std::sync::atomic::AtomicBool::new(false),
            trace: None,
        }
    }

    /// Records its steps in `trace` (see [`crate::provision::traces`]).
    pub fn traced(mut self, trace: Option<Arc<NodeTrace>>) -> Self {
        self.trace = trace;
        self
    }

    /// Runs in a lane's budget, for a name that came from `source`.
    pub fn in_lane(mut self, place: LanePlace, source: Source) -> Self {
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
        let wait = async {
            tokio::select! {
                s = self.ctx.slots.clone().acquire_owned() => s.map_err(|_| ProvisionError::Abandoned),
                _ = self.ctx.abandon.cancelled() => Err(ProvisionError::Abandoned),
            }
        };
        let slot = traced(self.trace.as_deref(), "wait for a worker", wait).await?;
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
            Some(Source::Discovery) => self.ctx.metrics.discovered(),
            Some(Source::Event) => {
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
        let trace = self.trace.clone();
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
            traced(trace.as_deref(), "reply windows", self.settle()).await?;
            let permit = tokio::select! {
                p = budget.acquire() => p.map_err(|_| ProvisionError::Abandoned)?,
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
            .signing
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
        self.admit_node().await?;
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
        self.sign(&mut response).await?;
        let (server_jwt, key, provisioner_ecdh_public) = self.issue(&response).await?;

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
        let signer = match (response.certificate.is_empty(), helper_signed) {
            (true, _) => None,
            (false, true) => Some("helper"),
            (false, false) if self.ctx.signing.ca.is_some() => Some("ca"),
            (false, false) => Some("cert-manager"),
        };
        let record = self.record(&response, &server_jwt, &config, signer);
        self.configured(record.as_deref());
        self.restart().await?;
        Ok(Outcome::Provisioned(record))
    }

    /// The certificate, from cert-manager or the built-in CA, when the
    /// network has certificates and the helper gave none.
    async fn sign(&self, response: &mut HelperResponse) -> Result<(), ProvisionError> {
        let signer = self.ctx.signing.cert_manager.is_some() || self.ctx.signing.ca.is_some();
        if !self.ctx.cfg.features.pki || !response.certificate.is_empty() || !signer {
            return Ok(());
        }
        let signing = async {
            self.sign_with_cert_manager(response).await?;
            self.sign_with_ca(response).await
        };
        traced(self.trace.as_deref(), "signing", signing).await
    }

    /// What is issued besides a certificate, in a `workers` slot: the
    /// server JWT (`features.ed25519`) and the helper's private key
    /// encrypted for the node; and our ECDH public key for it.
    async fn issue(
        &self,
        response: &HelperResponse,
    ) -> Result<(String, String, String), ProvisionError> {
        let cfg = &self.ctx.cfg;
        let _working = if cfg.features.ed25519 || !response.key.is_empty() {
            Some(self.working().await?)
        } else {
            None
        };
        let server_jwt = if cfg.features.ed25519 {
            traced(
                self.trace.as_deref(),
                "server JWT",
                self.sign_server_jwt(response),
            )
            .await?
        } else {
            String::new()
        };
        let (key, ecdh) = if response.key.is_empty() {
            (String::new(), String::new())
        } else {
            self.encrypt_key(&response.key)?
        };
        Ok((server_jwt, key, ecdh))
    }

    /// Every check and the admission policy, in order: revocation and held
    /// credentials, the instance evidence, the policy; then the instance
    /// is bound to this identity. Nothing was signed yet.
    async fn admit_node(&self) -> Result<(), ProvisionError> {
        // A span for each check that is configured.
        let checks = &self.ctx.checks;
        let trace = |on: bool| self.trace.as_deref().filter(|_| on);
        let standing = checks.revoked.is_some() || checks.held.is_some();
        traced(trace(standing), "revocation", self.check_revoked()).await?;
        let evidence = traced(
            trace(checks.evidence.is_some()),
            "evidence",
            self.check_evidence(),
        )
        .await?;
        traced(
            trace(checks.admission.is_some()),
            "policy",
            self.admit(evidence.as_ref()),
        )
        .await?;
        self.bind_evidence(evidence.as_ref()).await
    }

    /// The node was configured: it holds what it was issued from here on,
    /// whether the answer to its `restart` is heard or not (it can be lost
    /// with a broker of a cluster). Its record and its `provisioned` event
    /// go out now, and renewal's ask, if there was one, is answered: another
    /// arrival under the name is judged like any other.
    fn configured(&self, record: Option<&crate::records::Record>) {
        if let Some(r) = record {
            self.ctx.trail.recorder.record(r.clone());
        }
        if let Some(held) = &self.ctx.checks.held {
            held.answered(&self.identity);
        }
        self.ctx.trail.auditor.event(
            crate::audit::event::Kind::Provisioned,
            &self.identity,
            record
                .and_then(|r| serde_json::to_value(r).ok())
                .unwrap_or_else(|| serde_json::json!({})),
        );
    }

    /// The record of this provisioning (see [`crate::records`]).
    fn record(
        &self,
        response: &HelperResponse,
        server_jwt: &str,
        config: &str,
        signer: Option<&str>,
    ) -> Option<Box<crate::records::Record>> {
        let mode = self.ctx.mode();
        let protocol = self.client.version().to_string();
        let issued = crate::records::Issued {
            identity: &self.identity,
            replica: &self.ctx.me,
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

    /// Every checkpoint: the gate is open and our term is the current one
    /// — until `configure` went out: from then on the node's `restart` goes
    /// out through a pause or a shutdown, and through a term lost less than
    /// [`FINISH_GRACE`] ago.
    fn gate_check(&self) -> Result<(), Paused> {
        // A pause, a shutdown or a lost term asks that nothing more be
        // configured; a node configured already and stopped before its
        // `restart` would be configured again by whoever works next (the
        // node tier saw 8 of 1,000 so after a pause; the cluster tier saw
        // it when the leader's broker was lost). Its `restart` is the end
        // of what was already done, not new work — unless it is so late
        // that the next leader may be working the node (the fault tier saw
        // a restart 4.5 s after the loss land inside the new leader's
        // sequence).
        if self.finishing {
            return self.ctx.gate.check_finishing(self.term, FINISH_GRACE);
        }
        self.ctx.gate.check_term(self.term)?;
        // Once configured, the node is finished here even if it became
        // another replica's share: stopping before `restart` would leave
        // it configured, holding our lock, for its new owner to configure
        // again two minutes later.
        if !self.ctx.ownership.owns(&self.identity) {
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
}

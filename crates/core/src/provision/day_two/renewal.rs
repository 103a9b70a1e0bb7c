//! Credentials renewed before they expire (`renewal:`).
//!
//! Every replica follows the records bucket (all current records, then each
//! new one) and keeps when each node is due: the earliest expiry of what it
//! was issued, less `renewal.before` (a duration or a share of the
//! lifetime), less a stable share of `renewal.jitter` taken from the node's
//! name (a fleet provisioned at once is not renewed at once). When a node is
//! due, its owner — the leader, or in shards mode the member that owns it,
//! checked right before the request — sends `choria_provision#reprovision`
//! with the provisioning token to the node in its own collective, at most
//! `renewal.rate` a minute for the whole fleet (each of N members sends a
//! 1/N share). The node rewrites its configuration to provisioning mode
//! and restarts (go-choria 0.30.2; it needs a provisioning JWT with
//! `chpd`), comes back through provisioning, gets fresh credentials and a
//! new record, which moves its due time.
//!
//! Only records sealed by us are acted on ([`crate::records::sealed`]):
//! anyone who may write the bucket could otherwise choose whom we ask to
//! reprovision, into which collective, and when. An older record of a node
//! than one already seen (an old revision written again) is refused too, and
//! a deleted key changes nothing: the schedule keeps what it knew.
//!
//! A node whose provisioning JWT expires before it could be provisioned
//! again (`renewal.retry` from the request) is never asked: the broker
//! would refuse it on its way back, and the node would be lost. It is
//! counted (`outcome="cannot_return"`, `choria_provisioner_renewals_stranded`)
//! and left on its current credentials.
//!
//! A node asked is asked again after `renewal.retry` if no new record came;
//! a failed request is retried with backoff. Outcomes are counted in
//! `choria_provisioner_renewals{outcome}`.

use crate::audit::writer::Auditor;
use crate::provision::gate::PauseGate;
use crate::provision::metrics::Metrics;
use crate::provision::ownership::Ownership;
use crate::provision::pipeline::registry::Registry;
use crate::provision::suspects::{Allow, LogLimiter};
use crate::records::sealed::{Read, Refusal, Sealer};
use crate::records::store::RecordStore;
use choria_config::day_two::{RecordsConfig, RenewalConfig};
use choria_config::Secret;
use choria_wire::client::ChoriaClient;
use futures::StreamExt;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

mod schedule;
pub use schedule::{
    can_return, share_of_rate, DueNode, RateLimit, Schedule, Upserted, SETTLE_AFTER_PROVISIONING,
};

/// Renewal requests in flight at once.
const IN_FLIGHT: usize = 32;
/// How often due requests are sent (as permits and the rate allow).
const SEND_TICK: Duration = Duration::from_millis(100);
/// The gauges are refreshed every this many ticks (a second).
const GAUGE_EVERY: u64 = 10;
/// How long one `reprovision` request waits for its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How a renewal request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewalOutcome {
    /// The node accepted: it restarts into provisioning.
    Sent,
    /// The node answered with an error (not authorized, bad token, ...).
    Refused,
    /// No answer, or the request could not be made.
    Failed,
    /// Not sent: the node could not come back (its provisioning JWT
    /// expires first).
    CannotReturn,
}

impl RenewalOutcome {
    pub fn label(self) -> &'static str {
        match self {
            RenewalOutcome::Sent => "sent",
            RenewalOutcome::Refused => "refused",
            RenewalOutcome::Failed => "failed",
            RenewalOutcome::CannotReturn => "cannot_return",
        }
    }
}

/// What the renewal loop needs.
pub struct Renewal {
    pub cfg: RenewalConfig,
    pub records: RecordsConfig,
    /// Opens the records (only ours are acted on).
    pub sealer: Sealer,
    /// How to reach the provisioned nodes (`renewal.choria_config`).
    pub setup: choria_config::ClientSetup,
    pub token: Secret,
    pub name: String,
    /// Our sender id in shards mode (see `provision::sender`).
    pub sender: Option<String>,
}

/// Loads `renewal.choria_config` (at start-up: an error there is a
/// configuration error).
///
/// `choria_insecure` is about the provisioning network; the provisioned
/// nodes check their callers with their own security. So a renewal
/// configuration that names an x509 certificate and key signs with them
/// even then, and only one without them goes unsigned.
pub fn setup(
    cfg: &RenewalConfig,
    choria_insecure: bool,
    env: &choria_config::Environment,
) -> Result<choria_config::ClientSetup, choria_config::ConfigError> {
    let client = choria_config::ChoriaClientConfig::load_with(&cfg.choria_config, env)?;
    let signs = client.file_certificate.is_some() && client.file_key.is_some();
    client.client_setup_for(choria_insecure && !signs, None, env)
}

/// Connects to the provisioned nodes' network, retrying; `None` on stop.
/// Requests are sent as `r.sender` (the replica's own name in shards
/// mode, as for provisioning).
async fn connect(r: &Renewal, stop: &CancellationToken) -> Option<ChoriaClient> {
    let mut backoff = crate::backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        match choria_wire::client::connect(&r.setup.connect).await {
            Ok(nats) => {
                let mut me = r.setup.identity.clone();
                if let Some(sender) = &r.sender {
                    me.identity = sender.clone();
                }
                return Some(ChoriaClient::new(nats, me));
            }
            Err(e) => {
                warn!(error = %e, "renewal cannot reach the provisioned nodes' broker; retrying");
                if !backoff.wait(stop).await {
                    return None;
                }
            }
        }
    }
}

/// What renewal works with besides its settings: whether it may send, what
/// it counts and writes down, which nodes are ours, and what it tells the
/// rest of the provisioner of a node asked back.
pub struct Context {
    /// Nothing is sent while it is closed.
    pub gate: PauseGate,
    pub metrics: Arc<Metrics>,
    /// Which nodes are ours to renew (the shards' share).
    pub ownership: Ownership,
    /// Forgets a node asked back, so it is provisioned at once on return.
    pub registry: Arc<Registry>,
    /// Told when a node is asked back (with `records:`).
    pub held: Option<crate::held::Held>,
    /// A revoked identity is never asked back.
    pub revoked: Option<crate::revocations::Revoked>,
    /// Each request sent is audited.
    pub auditor: Auditor,
}

type Done = (String, RenewalOutcome);

/// Follows the records and renews what is due until `stop`.
pub async fn run(r: Renewal, ctx: Context, stop: CancellationToken) {
    let Some(mut records) = watch_records(&r, &ctx, &stop).await else {
        return;
    };
    let Some(client) = connect(&r, &stop).await else {
        return;
    };
    info!(before = ?r.cfg.before, rate = r.cfg.rate, "renewing credentials before they expire");
    let mut state = Loop {
        schedule: Schedule::default(),
        limit: RateLimit::per_minute(r.cfg.rate, std::time::Instant::now()),
        in_flight: Arc::new(Semaphore::new(IN_FLIGHT)),
        sending: HashSet::new(),
        superseded: HashSet::new(),
        logs: LogLimiter::default(),
    };
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    // Requests go out every tick, at most the permits free: a tick of a
    // second capped renewal at IN_FLIGHT a second (~1,900/min) whatever
    // `rate` said. The gauges, which walk the schedule, every tenth tick.
    let mut tick = tokio::time::interval(SEND_TICK);
    let mut ticks: u64 = 0;
    loop {
        tokio::select! {
            read = records.next() => match read {
                Some(read) => state.take(read, &r.cfg, &ctx),
                None => {
                    error!("the records watch ended; renewal stops");
                    return;
                }
            },
            Some((identity, outcome)) = done_rx.recv() => state.done(identity, outcome, &r.cfg, &ctx),
            _ = tick.tick() => {
                let now = chrono::Utc::now().timestamp();
                if ticks.is_multiple_of(GAUGE_EVERY) {
                    ctx.metrics.set_records(state.schedule.len());
                    ctx.metrics.set_renewals_due(state.schedule.due_count(now));
                    ctx.metrics.set_renewals_stranded(state.schedule.stranded());
                }
                ticks += 1;
                if !ctx.gate.is_paused() {
                    state.send_due(&r, &client, &ctx, &done_tx, now);
                }
            }
            _ = stop.cancelled() => return,
        }
    }
}

/// The records watch (every current record, then each new one),
/// retrying with backoff until it opens; `None` once stopped.
async fn watch_records(
    r: &Renewal,
    ctx: &Context,
    stop: &CancellationToken,
) -> Option<impl futures::Stream<Item = Read> + Send + Unpin + 'static> {
    let mut backoff = crate::backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        let watched = async {
            let store = RecordStore::connect(&r.records, r.sealer.clone(), &r.name).await?;
            store.watch().await
        };
        match watched.await {
            Ok(w) => return Some(w),
            Err(e) => {
                ctx.metrics.record_error();
                warn!(error = %e, "renewal cannot read the records; retrying");
                if !backoff.wait(stop).await {
                    return None;
                }
            }
        }
    }
}

/// The renewal loop's state between events.
struct Loop {
    schedule: Schedule,
    limit: RateLimit,
    in_flight: Arc<Semaphore>,
    /// Requests under way.
    sending: HashSet<String>,
    /// Requests under way whose node has a newer record since.
    superseded: HashSet<String>,
    /// Refused records and stranded nodes, logged at a bounded rate.
    logs: LogLimiter,
}

impl Loop {
    /// A request ended: counted, and the schedule moves (asked: wait
    /// for the new record; failed: retry later), unless a newer record
    /// came meanwhile.
    fn done(
        &mut self,
        identity: String,
        outcome: RenewalOutcome,
        cfg: &RenewalConfig,
        ctx: &Context,
    ) {
        self.sending.remove(&identity);
        ctx.metrics.renewal(outcome.label());
        if self.superseded.remove(&identity) {
            return;
        }
        let now = chrono::Utc::now().timestamp();
        match outcome {
            RenewalOutcome::Sent => {
                ctx.auditor.event(
                    crate::audit::event::Kind::Renewal,
                    &identity,
                    serde_json::json!({"step": "reprovision"}),
                );
                if let Some(held) = &ctx.held {
                    held.asked(&identity, now);
                }
                self.schedule.asked(&identity, now, cfg.retry);
                // It comes back through provisioning at once: the hold
                // after its last success must not stop it.
                ctx.registry.forget_done(&identity);
            }
            _ => self.schedule.failed(&identity, now, cfg.retry),
        }
    }

    /// One value from the records watch.
    fn take(&mut self, read: Read, cfg: &RenewalConfig, ctx: &Context) {
        let (key, why) = match read {
            Read::Verified(record) => match self.schedule.upsert(&record, cfg) {
                Upserted::Replayed => (record.identity, Refusal::Replayed),
                Upserted::Same => return,
                upserted => {
                    // A request still under way was for the old record: its
                    // outcome must not move the new record's due time.
                    if self.sending.remove(&record.identity) {
                        self.superseded.insert(record.identity.clone());
                    }
                    if upserted == Upserted::Shortened {
                        self.warn(
                                "shortened",
                                &record.identity,
                                "its credential lives no longer than renewal.before plus jitter; renewing it at half its lifetime",
                            );
                    }
                    return;
                }
            },
            Read::Refused { key, why, .. } => (key, why),
        };
        ctx.metrics.record_refused(why.reason());
        self.warn(why.reason(), &key, why.describe());
    }

    fn warn(&self, kind: &'static str, key: &str, what: &str) {
        if let Allow::Yes { suppressed } = self.logs.check(kind, std::time::Instant::now()) {
            warn!(
                key = %choria_wire::identity::shown(key),
                suppressed_before = suppressed,
                "a record in the records bucket is not acted on: {what}"
            );
        }
    }

    /// Sends what is due, as the rate and the permits allow.
    fn send_due(
        &mut self,
        r: &Renewal,
        client: &ChoriaClient,
        ctx: &Context,
        done: &mpsc::UnboundedSender<Done>,
        now: i64,
    ) {
        let instant = std::time::Instant::now();
        if ctx.ownership.sharded() {
            // The fleet's rate, shared: each member sends its share.
            let members = ctx.ownership.members().len();
            self.limit
                .set_per_minute(share_of_rate(r.cfg.rate, members), instant);
        }
        let available = self.limit.available(instant);
        let mut sent = 0;
        for node in self.schedule.due(now, available + self.sending.len()) {
            if sent == available {
                break;
            }
            if self.sending.contains(&node.identity) {
                continue;
            }
            let Some(collective) = self.askable(&node, r, ctx, now, instant) else {
                continue;
            };
            let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
                break;
            };
            sent += 1;
            self.sending.insert(node.identity.clone());
            let client = client.in_collective(&collective);
            let (token, done) = (r.token.clone(), done.clone());
            tokio::spawn(async move {
                let _permit = permit;
                let outcome = reprovision(&client, &node.identity, &token).await;
                let _ = done.send((node.identity, outcome));
            });
        }
        self.limit.take(sent);
    }

    /// Whether `node`, due now, may be asked, and in which collective: it
    /// is ours, not revoked, could come back, and its record names a valid
    /// identity and collective. One that may not is moved on the schedule
    /// (later, or stranded) and counted.
    fn askable(
        &mut self,
        node: &DueNode,
        r: &Renewal,
        ctx: &Context,
        now: i64,
        instant: std::time::Instant,
    ) -> Option<String> {
        // Ours to renew only while it is in our share.
        if !ctx.ownership.owns(&node.identity) {
            self.schedule.later(&node.identity, now, 30);
            return None;
        }
        // A revoked identity is never asked back: its credentials run
        // out. Looked at again in a minute, in case it is unrevoked.
        if ctx
            .revoked
            .as_ref()
            .is_some_and(|rv| rv.of(&node.identity).is_some())
        {
            self.schedule.later(&node.identity, now, 60);
            ctx.metrics.revoked_refusal("renewal");
            return None;
        }
        if !can_return(node.returns_until, now, r.cfg.retry) {
            self.schedule.strand(&node.identity);
            ctx.metrics.renewal(RenewalOutcome::CannotReturn.label());
            // A fleet shares its provisioning JWT: its expiry strands
            // them all at once.
            if let Allow::Yes { suppressed } = self.logs.check("stranded", instant) {
                error!(
                    node = %node.identity,
                    suppressed_before = suppressed,
                    "not asking the node to renew: its provisioning JWT expires before it could be provisioned again, so it would not come back; give it a new provisioning JWT (it keeps its current credentials until they expire)"
                );
            }
            return None;
        }
        let collective = node
            .collective
            .clone()
            .unwrap_or_else(|| r.cfg.collective.clone());
        if choria_wire::identity::validate(&node.identity).is_err()
            || crate::provision::signing::grants::check_collectives(
                "collectives",
                std::slice::from_ref(&collective),
            )
            .is_err()
        {
            // Records are ours, checked when granted: never here.
            self.schedule.strand(&node.identity);
            error!(key = %choria_wire::identity::shown(&node.identity), "a sealed record names an identity or collective that is not valid; not renewing it");
            return None;
        }
        Some(collective)
    }
}

/// One `choria_provision#reprovision` request.
async fn reprovision(client: &ChoriaClient, identity: &str, token: &Secret) -> RenewalOutcome {
    #[derive(serde::Serialize)]
    struct Args<'t> {
        token: &'t str,
    }
    let args = Args {
        token: token.expose(),
    };
    match client
        .rpc_with_timeout(
            identity,
            "choria_provision",
            "reprovision",
            &args,
            REQUEST_TIMEOUT,
        )
        .await
    {
        Ok(r) if r.body.is_ok() => {
            info!(
                node = identity,
                "asked the node to renew its credentials (reprovision)"
            );
            RenewalOutcome::Sent
        }
        Ok(r) => {
            warn!(node = identity, status = %crate::provision::text::one_line(&r.body.statusmsg, 200), "the node refused to reprovision");
            RenewalOutcome::Refused
        }
        Err(e) => {
            debug!(node = identity, error = %e, "reprovision request failed");
            RenewalOutcome::Failed
        }
    }
}

#[cfg(test)]
mod tests;

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
//! `renewal.rate` a minute. The node rewrites its configuration to
//! provisioning mode and restarts (go-choria 0.30.2; it needs a provisioning
//! JWT with `chpd`), comes back through provisioning, gets fresh credentials
//! and a new record, which moves its due time.
//!
//! A node asked is asked again after `renewal.retry` if no new record came;
//! a failed request is retried with backoff. Outcomes are counted in
//! `choria_provisioner_renewals{outcome}`.

use super::Handle;
use crate::choria::client::ChoriaClient;
use crate::config::day_two::{RecordsConfig, RenewalConfig};
use crate::config::Secret;
use crate::records::store::RecordStore;
use crate::records::Record;
use futures::StreamExt;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Renewal requests in flight at once.
const IN_FLIGHT: usize = 32;
/// How often due requests are sent (as permits and the rate allow).
const SEND_TICK: Duration = Duration::from_millis(100);
/// The gauges are refreshed every this many ticks (a second).
const GAUGE_EVERY: u64 = 10;
/// How long one `reprovision` request waits for its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The first retry after a failed request; it doubles up to `retry`.
const FIRST_BACKOFF: i64 = 30;
/// A node is not asked within this many seconds of its provisioning: it is
/// still restarting (go-choria's restart splay is up to 12 s) and would not
/// answer in its collective yet.
pub const SETTLE_AFTER_PROVISIONING: i64 = 15;

/// When each node is due, pure: every call takes `now` (Unix seconds).
#[derive(Debug, Default)]
pub struct Schedule {
    nodes: HashMap<String, Due>,
    by_time: BTreeSet<(i64, String)>,
}

#[derive(Clone, Debug, PartialEq)]
struct Due {
    at: i64,
    /// When the credential expires.
    expires: i64,
    collective: Option<String>,
    /// Consecutive failed requests.
    failures: u32,
}

/// How a renewal request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewalOutcome {
    /// The node accepted: it restarts into provisioning.
    Sent,
    /// The node answered with an error (not authorized, bad token, ...).
    Refused,
    /// No answer, or the request could not be made.
    Failed,
}

impl RenewalOutcome {
    pub fn label(self) -> &'static str {
        match self {
            RenewalOutcome::Sent => "sent",
            RenewalOutcome::Refused => "refused",
            RenewalOutcome::Failed => "failed",
        }
    }
}

/// A stable share (0..1) of the jitter for `identity`.
fn jitter_share(identity: &str) -> f64 {
    (crate::election::shards::weight("renewal", identity) % 10_000) as f64 / 10_000.0
}

impl Schedule {
    /// Takes a node's newest record: its due time follows its expiry.
    pub fn upsert(&mut self, record: &Record, cfg: &RenewalConfig) {
        self.remove(&record.identity);
        let Some((issued, expires)) = record.expiry() else {
            return;
        };
        let lead = cfg.before.lead(issued, expires).as_secs_f64()
            + cfg.jitter.as_secs_f64() * jitter_share(&record.identity);
        let at = (expires - lead.round() as i64).max(record.time_unix + SETTLE_AFTER_PROVISIONING);
        self.insert(
            record.identity.clone(),
            Due {
                at,
                expires,
                collective: record.collective().map(str::to_string),
                failures: 0,
            },
        );
    }

    fn insert(&mut self, identity: String, due: Due) {
        self.by_time.insert((due.at, identity.clone()));
        self.nodes.insert(identity, due);
    }

    fn remove(&mut self, identity: &str) -> Option<Due> {
        let due = self.nodes.remove(identity)?;
        self.by_time.remove(&(due.at, identity.to_string()));
        Some(due)
    }

    /// Nodes on record with something expiring.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Nodes due now (asked ones count again once their retry is up).
    pub fn due_count(&self, now: i64) -> usize {
        self.by_time.range(..(now + 1, String::new())).count()
    }

    /// The nodes due now, earliest first, at most `limit`, and the
    /// collective of each (`None`: the configured default).
    pub fn due(&self, now: i64, limit: usize) -> Vec<(String, Option<String>)> {
        self.by_time
            .range(..(now + 1, String::new()))
            .take(limit)
            .map(|(_, id)| (id.clone(), self.nodes[id].collective.clone()))
            .collect()
    }

    /// A request went out: wait `retry` for the node's new record.
    pub fn asked(&mut self, identity: &str, now: i64, retry: Duration) {
        if let Some(mut d) = self.remove(identity) {
            d.at = now + retry.as_secs() as i64;
            d.failures = 0;
            self.insert(identity.to_string(), d);
        }
    }

    /// A request failed: try again after a backoff that doubles, up to
    /// `retry`.
    pub fn failed(&mut self, identity: &str, now: i64, retry: Duration) {
        if let Some(mut d) = self.remove(identity) {
            d.failures += 1;
            let wait = (FIRST_BACKOFF << (d.failures - 1).min(16)).min(retry.as_secs() as i64);
            d.at = now + wait.max(1);
            self.insert(identity.to_string(), d);
        }
    }

    /// Not ours to renew (another member's share): look again after
    /// `later` seconds.
    pub fn later(&mut self, identity: &str, now: i64, later: i64) {
        if let Some(mut d) = self.remove(identity) {
            d.at = d.at.max(now + later);
            self.insert(identity.to_string(), d);
        }
    }

    /// When `identity` is due, for tests and the `nodes` listing.
    pub fn due_at(&self, identity: &str) -> Option<i64> {
        self.nodes.get(identity).map(|d| d.at)
    }
}

/// At most `rate` a minute, in whole requests, refilled continuously.
#[derive(Debug)]
pub struct RateLimit {
    per_second: f64,
    capacity: f64,
    tokens: f64,
    at: std::time::Instant,
}

impl RateLimit {
    pub fn per_minute(rate: u32, now: std::time::Instant) -> Self {
        // A burst of at most one second's worth (at least one).
        let per_second = f64::from(rate) / 60.0;
        let capacity = per_second.max(1.0);
        RateLimit {
            per_second,
            capacity,
            tokens: capacity,
            at: now,
        }
    }

    /// How many requests may go now; the caller takes them with [`take`].
    pub fn available(&mut self, now: std::time::Instant) -> usize {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.capacity);
        self.at = now;
        self.tokens.floor() as usize
    }

    pub fn take(&mut self, n: usize) {
        self.tokens -= n as f64;
    }
}

/// What the renewal loop needs.
pub struct Renewal {
    pub cfg: RenewalConfig,
    pub records: RecordsConfig,
    /// How to reach the provisioned nodes (`renewal.choria_config`).
    pub setup: crate::config::ClientSetup,
    pub token: Secret,
    pub name: String,
    /// Our sender id in shards mode (see `provision::sender`).
    pub sender: Option<String>,
}

/// Loads `renewal.choria_config` (at start-up: an error there is a
/// configuration error).
pub fn setup(
    cfg: &RenewalConfig,
    insecure: bool,
    env: &crate::config::Environment,
) -> Result<crate::config::ClientSetup, crate::config::ConfigError> {
    crate::config::ChoriaClientConfig::load_with(&cfg.choria_config, env)?
        .client_setup_for(insecure, None, env)
}

/// Connects to the provisioned nodes' network, retrying; `None` on stop.
/// Requests are sent as `r.sender` (the replica's own name in shards
/// mode, as for provisioning).
async fn connect(r: &Renewal, stop: &CancellationToken) -> Option<ChoriaClient> {
    let mut backoff = crate::backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        match crate::choria::client::connect(&r.setup.connect).await {
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

type Done = (String, RenewalOutcome);

/// Follows the records and renews what is due until `stop`.
pub async fn run(r: Renewal, handle: Handle, stop: CancellationToken) {
    let mut backoff = crate::backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    let mut records = loop {
        let watched = async {
            let store = RecordStore::connect(&r.records, &r.name).await?;
            store.watch().await
        };
        match watched.await {
            Ok(w) => break w,
            Err(e) => {
                handle.metrics.record_error();
                warn!(error = %e, "renewal cannot read the records; retrying");
                if !backoff.wait(&stop).await {
                    return;
                }
            }
        }
    };
    let Some(client) = connect(&r, &stop).await else {
        return;
    };
    info!(before = ?r.cfg.before, rate = r.cfg.rate, "renewing credentials before they expire");
    let mut schedule = Schedule::default();
    let mut limit = RateLimit::per_minute(r.cfg.rate, std::time::Instant::now());
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let mut sending: std::collections::HashSet<String> = Default::default();
    // Requests go out every tick, at most the permits free: a tick of a
    // second capped renewal at IN_FLIGHT a second (~1,900/min) whatever
    // `rate` said. The gauges, which walk the schedule, every tenth tick.
    let mut tick = tokio::time::interval(SEND_TICK);
    let mut ticks: u64 = 0;
    loop {
        tokio::select! {
            record = records.next() => match record {
                Some(record) => {
                    sending.remove(&record.identity);
                    schedule.upsert(&record, &r.cfg);
                }
                None => {
                    warn!("the records watch ended; renewal stops");
                    return;
                }
            },
            Some((identity, outcome)) = done_rx.recv() => {
                sending.remove(&identity);
                handle.metrics.renewal(outcome.label());
                let now = chrono::Utc::now().timestamp();
                match outcome {
                    RenewalOutcome::Sent => {
                        schedule.asked(&identity, now, r.cfg.retry);
                        // It comes back through provisioning at once: the
                        // hold after its last success must not stop it.
                        handle.registry.forget_done(&identity);
                    }
                    _ => schedule.failed(&identity, now, r.cfg.retry),
                }
            }
            _ = tick.tick() => {
                let now = chrono::Utc::now().timestamp();
                if ticks.is_multiple_of(GAUGE_EVERY) {
                    handle.metrics.set_records(schedule.len());
                    handle.metrics.set_renewals_due(schedule.due_count(now));
                }
                ticks += 1;
                if handle.gate.is_paused() {
                    continue;
                }
                let available = limit.available(std::time::Instant::now());
                let mut sent = 0;
                for (identity, collective) in schedule.due(now, available + sending.len()) {
                    if sent == available {
                        break;
                    }
                    if sending.contains(&identity) {
                        continue;
                    }
                    // Ours to renew only while it is in our share.
                    if !handle.ownership.owns(&identity) {
                        schedule.later(&identity, now, 30);
                        continue;
                    }
                    let Ok(permit) = in_flight.clone().try_acquire_owned() else { break };
                    sent += 1;
                    sending.insert(identity.clone());
                    let client = client.in_collective(
                        collective.as_deref().unwrap_or(&r.cfg.collective),
                    );
                    let (token, done) = (r.token.clone(), done_tx.clone());
                    tokio::spawn(async move {
                        let _permit = permit;
                        let outcome = reprovision(&client, &identity, &token).await;
                        let _ = done.send((identity, outcome));
                    });
                }
                limit.take(sent);
            }
            _ = stop.cancelled() => return,
        }
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
            warn!(node = identity, status = %super::one_line(&r.body.statusmsg, 200), "the node refused to reprovision");
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

//! When each node is due for renewal, and how fast requests may go out:
//! pure, every call takes `now`. The schedule keeps one due time per node
//! from its verified records (expiry less `renewal.before` and a stable
//! share of the jitter), moves it when a node is asked, fails, or must
//! wait; the rate limit spreads the requests over the minute; a node whose
//! provisioning JWT would not let it come back is never asked.

use crate::records::Record;
use choria_config::day_two::RenewalConfig;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

/// The first retry after a failed request; it doubles up to `retry`.
const FIRST_BACKOFF: i64 = 30;
/// A node is not asked within this many seconds of its provisioning: it is
/// still restarting (go-choria's restart splay is up to 12 s) and would not
/// answer in its collective yet.
pub const SETTLE_AFTER_PROVISIONING: i64 = 15;

/// How long before its provisioning JWT stops it from coming back a node
/// is asked at the latest (besides `renewal.retry`).
const RETURN_MARGIN: i64 = 60;

/// When each node is due, pure: every call takes `now` (Unix seconds).
#[derive(Debug, Default)]
pub struct Schedule {
    nodes: HashMap<String, Due>,
    by_time: BTreeSet<(i64, String)>,
    /// The newest record seen for each node, as its time and a digest of
    /// it: an older one is a replay of an earlier revision, the same one
    /// again changes nothing.
    newest: HashMap<String, (i64, u64)>,
    /// Nodes that could not come back from a `reprovision`; not due again
    /// until a newer record arrives.
    stranded: HashSet<String>,
}

#[derive(Clone, Debug, PartialEq)]
struct Due {
    at: i64,
    /// When the credential expires.
    expires: i64,
    collective: Option<String>,
    /// When its provisioning JWT expires, if it does.
    returns_until: Option<i64>,
    /// Consecutive failed requests.
    failures: u32,
}

/// A node due now, as [`Schedule::due`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueNode {
    pub identity: String,
    /// Its collective from its record; `None`: the configured default.
    pub collective: Option<String>,
    /// When its provisioning JWT expires, if it does.
    pub returns_until: Option<i64>,
}

/// What [`Schedule::upsert`] did with a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upserted {
    Scheduled,
    /// Scheduled, at half its lifetime: `before` plus `jitter` is not
    /// shorter than the lifetime (a short credential from a helper).
    Shortened,
    /// Nothing on it expires.
    NothingExpires,
    /// Older than a record of the node already seen: ignored.
    Replayed,
    /// The record already seen, again (written again, or read again after
    /// a reconnect): nothing changes, not even a wait for a retry.
    Same,
}

/// A digest of a record, to tell the same one from another of its time.
fn digest(record: &Record) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(record)
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
}

/// A stable share (0..1) of the jitter for `identity`.
fn jitter_share(identity: &str) -> f64 {
    (crate::election::shards::weight("renewal", identity) % 10_000) as f64 / 10_000.0
}

impl Schedule {
    /// Takes a node's newest record: its due time follows its expiry.
    pub fn upsert(&mut self, record: &Record, cfg: &RenewalConfig) -> Upserted {
        let seen = (record.time_unix, digest(record));
        match self.newest.get(&record.identity) {
            Some(last) if last.0 > seen.0 => return Upserted::Replayed,
            Some(last) if *last == seen => return Upserted::Same,
            _ => {}
        }
        self.newest.insert(record.identity.clone(), seen);
        self.stranded.remove(&record.identity);
        self.remove(&record.identity);
        let Some((issued, expires)) = record.expiry() else {
            return Upserted::NothingExpires;
        };
        let lifetime = expires.saturating_sub(issued).max(0) as f64;
        let mut lead = cfg.before.lead(issued, expires).as_secs_f64()
            + cfg.jitter.as_secs_f64() * jitter_share(&record.identity);
        let mut upserted = Upserted::Scheduled;
        if lead >= lifetime {
            // Due at issue would ask the node again as soon as it is back,
            // for ever: renew at half its life instead.
            lead = lifetime / 2.0;
            upserted = Upserted::Shortened;
        }
        let mut at = expires - lead.round() as i64;
        // A node must be asked while it can still come back: before its
        // provisioning JWT expires, with `retry` to spare.
        if let Some(until) = record.provisioning_jwt_expires_unix {
            at = at.min(until - cfg.retry.as_secs() as i64 - RETURN_MARGIN);
        }
        let at = at.max(record.time_unix + SETTLE_AFTER_PROVISIONING);
        self.insert(
            record.identity.clone(),
            Due {
                at,
                expires,
                collective: record.collective().map(str::to_string),
                returns_until: record.provisioning_jwt_expires_unix,
                failures: 0,
            },
        );
        upserted
    }

    /// The node cannot come back from a `reprovision`: not due again until
    /// a newer record.
    pub fn strand(&mut self, identity: &str) {
        if self.remove(identity).is_some() {
            self.stranded.insert(identity.to_string());
        }
    }

    /// Nodes left on their credentials because they could not come back.
    pub fn stranded(&self) -> usize {
        self.stranded.len()
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

    /// The nodes due now, earliest first, at most `limit`.
    pub fn due(&self, now: i64, limit: usize) -> Vec<DueNode> {
        self.by_time
            .range(..(now + 1, String::new()))
            .take(limit)
            .map(|(_, id)| {
                let d = &self.nodes[id];
                DueNode {
                    identity: id.clone(),
                    collective: d.collective.clone(),
                    returns_until: d.returns_until,
                }
            })
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

    /// A new rate from now on (a member's share changes with the members).
    pub fn set_per_minute(&mut self, rate: u32, now: std::time::Instant) {
        let per_second = f64::from(rate) / 60.0;
        if per_second != self.per_second {
            self.available(now);
            self.per_second = per_second;
            self.capacity = per_second.max(1.0);
            self.tokens = self.tokens.min(self.capacity);
        }
    }
}

/// A member's share of the fleet's `rate`: `rate / members`, at least one
/// a minute.
pub fn share_of_rate(rate: u32, members: usize) -> u32 {
    (rate / members.max(1) as u32).max(1)
}

/// Whether a node whose provisioning JWT expires at `returns_until` can
/// come back from a `reprovision` sent at `now`: it must still be valid
/// when the node is provisioned again, within `retry` of the request.
pub fn can_return(returns_until: Option<i64>, now: i64, retry: Duration) -> bool {
    returns_until.is_none_or(|t| t > now + retry.as_secs() as i64)
}

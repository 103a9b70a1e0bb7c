//! Sharded membership (`election.mode: shards`): every replica works, each
//! the nodes rendezvous hashing gives it.
//!
//! * Each replica holds a membership of its own — its own Lease
//!   ([`lease`]), or heartbeats over the broker ([`heartbeats`]) — renewed
//!   every `retry_period`. The live members are those seen renewing within
//!   `lease_duration`, judged by when *we* saw their record change (no
//!   clock is compared across machines).
//! * A node belongs to the live member with the highest weight
//!   `hash(member, node)` ([`owner`]): when a member comes or goes, only
//!   that member's nodes move.
//! * A replica that could not renew for `renew_deadline` stops working
//!   before the others count it gone (`lease_duration` > `renew_deadline`),
//!   as a leader steps down before its record expires.
//! * Every member publishes its view of the members with each renewal. A
//!   member that joins works only once every live member's view holds it
//!   (or `lease_duration` passed): by then the others have stopped
//!   starting the nodes that became its own. Sequences already under way
//!   stop at their next checkpoint; the go-choria provisioning lock refuses
//!   anything that still overlaps.
//!
//! [`Roster`] holds these rules without I/O or clock (every call takes
//! `now`), [`drive`] runs a [`Membership`] backend and tells a
//! [`ShardSteer`] what changed.

pub mod heartbeats;
pub mod lease;

use super::ElectionError;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// Members counted at most (us not included): a membership record beyond
/// this is ignored. Replicas are a handful; this bounds what a flood of
/// records could cost.
pub const MAX_MEMBERS: usize = 100;

/// One member's record as a backend read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    pub member: String,
    /// Changes with every renewal (a resourceVersion, a sequence number).
    pub stamp: String,
    /// The members it saw when it renewed.
    pub view: Vec<String>,
    /// It said it is leaving.
    pub leaving: bool,
}

/// A membership store.
pub trait Membership: Send {
    /// For logs: `lease choria/choria-provisioner-*`.
    fn describe(&self) -> String;
    /// Our member id.
    fn me(&self) -> &str;
    /// Renews our own record, publishing `view`.
    fn renew(&mut self, view: &[String]) -> impl Future<Output = Result<(), ElectionError>> + Send;
    /// The records seen since the last call (a poll, or what was pushed).
    fn sightings(&mut self) -> impl Future<Output = Result<Vec<Sighting>, ElectionError>> + Send;
    /// Resolves when records may have changed before the next renewal is
    /// due (a backend that is pushed to); pending for a polling one.
    fn changed(&mut self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
    /// Why records were ignored since the last call (not sealed by us, a
    /// replay, malformed): one reason per record.
    fn refused(&mut self) -> Vec<&'static str> {
        Vec::new()
    }
    /// Gives our membership up (our workers have stopped).
    fn leave(&mut self) -> impl Future<Output = Result<(), ElectionError>> + Send;
}

/// What a sharded membership steers.
pub trait ShardSteer: Send {
    /// The live members (us included, sorted) changed.
    fn members(&self, members: &[String]);
    /// Whether we may work: a member whose renewals work and whom every
    /// other member has seen.
    fn working(&self, working: bool);
    /// A renewal or read failed; reported until one works.
    fn failed(&self, _error: &str) {}
    fn worked(&self) {}
    /// A membership record was ignored, for `reason`.
    fn refused(&self, _reason: &'static str) {}
}

/// A shared steer steers as what it shares.
impl<T: ShardSteer + Sync + ?Sized> ShardSteer for std::sync::Arc<T> {
    fn members(&self, members: &[String]) {
        (**self).members(members)
    }
    fn working(&self, working: bool) {
        (**self).working(working)
    }
    fn failed(&self, error: &str) {
        (**self).failed(error)
    }
    fn worked(&self) {
        (**self).worked()
    }
    fn refused(&self, reason: &'static str) {
        (**self).refused(reason)
    }
}

/// The timings of a membership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardTimings {
    /// How long a member counts without renewing.
    pub ttl: Duration,
    /// How long we may fail to renew before we stop working.
    pub renew_deadline: Duration,
    /// How often we renew (and read the others).
    pub renew_period: Duration,
}

/// Who is a member, from what we saw and when (see the module docs).
#[derive(Debug)]
pub struct Roster {
    me: String,
    timings: ShardTimings,
    seen: BTreeMap<String, Seen>,
    /// When our own last renewal was sent and succeeded.
    renewed: Option<Instant>,
    /// When we first renewed in this membership: the acknowledgement wait
    /// counts from here.
    joined: Option<Instant>,
}

#[derive(Debug)]
struct Seen {
    stamp: String,
    changed_at: Instant,
    view: Vec<String>,
}

impl Roster {
    pub fn new(me: &str, timings: ShardTimings) -> Self {
        Roster {
            me: me.to_string(),
            timings,
            seen: BTreeMap::new(),
            renewed: None,
            joined: None,
        }
    }

    /// Records another member's record; ours is ignored (our liveness is
    /// our renewals). A member that says it leaves is gone at once. False
    /// when a new member was refused: [`MAX_MEMBERS`] are known already.
    pub fn observe(&mut self, s: Sighting, now: Instant) -> bool {
        if s.member == self.me {
            return true;
        }
        if s.leaving {
            self.seen.remove(&s.member);
            return true;
        }
        if !self.seen.contains_key(&s.member) {
            let ttl = self.timings.ttl;
            let live = self
                .seen
                .values()
                .filter(|v| now.saturating_duration_since(v.changed_at) < ttl)
                .count();
            if live >= MAX_MEMBERS {
                return false;
            }
        }
        match self.seen.get_mut(&s.member) {
            Some(seen) if seen.stamp == s.stamp => seen.view = s.view,
            _ => {
                self.seen.insert(
                    s.member,
                    Seen {
                        stamp: s.stamp,
                        changed_at: now,
                        view: s.view,
                    },
                );
            }
        }
        true
    }

    /// A renewal of ours that was sent at `sent` worked.
    pub fn renewed(&mut self, sent: Instant) {
        self.renewed = Some(sent);
        self.joined.get_or_insert(sent);
    }

    /// Whether our renewals are recent enough to work.
    pub fn alive(&self, now: Instant) -> bool {
        self.renewed
            .is_some_and(|t| now.saturating_duration_since(t) < self.timings.renew_deadline)
    }

    /// The live members, us included when alive, sorted.
    pub fn live(&self, now: Instant) -> Vec<String> {
        let mut members: Vec<String> = self
            .seen
            .iter()
            .filter(|(_, s)| now.saturating_duration_since(s.changed_at) < self.timings.ttl)
            .map(|(m, _)| m.clone())
            .collect();
        if self.alive(now) {
            members.push(self.me.clone());
            members.sort();
        }
        members
    }

    /// Whether we may work: alive, listening for two renewal periods since
    /// we joined (every member renews once a period: before that we may
    /// not know them all, and would take their nodes for ours), and every
    /// other live member's view holds us — or `ttl` passed since we joined
    /// (a member that never updates its view must not keep us idle for
    /// ever).
    pub fn may_work(&self, now: Instant) -> bool {
        if !self.alive(now) {
            return false;
        }
        let since_join = self
            .joined
            .map(|j| now.saturating_duration_since(j))
            .unwrap_or_default();
        if since_join < 2 * self.timings.renew_period {
            return false;
        }
        let waited = since_join >= self.timings.ttl;
        waited
            || self
                .seen
                .values()
                .filter(|s| now.saturating_duration_since(s.changed_at) < self.timings.ttl)
                .all(|s| s.view.contains(&self.me))
    }

    /// Drops what expired long ago (memory only; `live` filters anyway).
    pub fn forget_expired(&mut self, now: Instant) {
        let ttl = self.timings.ttl;
        self.seen
            .retain(|_, s| now.saturating_duration_since(s.changed_at) < ttl * 4);
    }
}

/// The member that owns `node`: highest rendezvous weight, ties to the
/// lower name. `None` without members.
pub fn owner<'a>(members: &'a [String], node: &str) -> Option<&'a str> {
    members
        .iter()
        .map(|m| (weight(m, node), m))
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)))
        .map(|(_, m)| m.as_str())
}

/// The rendezvous weight: FNV-1a over `member \0 node`, finished with
/// SplitMix64 so the high bits are as mixed as the low ones. Stable across
/// builds and platforms, so replicas of different versions agree.
pub fn weight(member: &str, node: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in member.bytes().chain([0u8]).chain(node.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Runs a membership until `stop`: renews, reads the others, tells the
/// steer; leaves at the end (the caller stopped its work first).
pub async fn drive<M: Membership, S: ShardSteer>(
    mut backend: M,
    timings: ShardTimings,
    steer: S,
    stop: CancellationToken,
) {
    let me = backend.me().to_string();
    let mut roster = Roster::new(&me, timings);
    let mut told_members: Vec<String> = Vec::new();
    let mut told_working = false;
    let mut failing = false;
    let mut refused = Refused::default();
    info!(membership = %backend.describe(), member = %me, "joining the shards");
    let mut next = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {
                next = tokio::time::Instant::now() + timings.renew_period;
                let view = roster.live(Instant::now());
                let sent = Instant::now();
                match tokio::time::timeout(timings.renew_period, backend.renew(&view)).await {
                    Ok(Ok(())) => roster.renewed(sent),
                    Ok(Err(e)) => report(&steer, &mut failing, &e.to_string()),
                    Err(_) => report(&steer, &mut failing, "renewing our membership timed out"),
                }
            }
            _ = backend.changed() => {}
            _ = stop.cancelled() => break,
        }
        match tokio::time::timeout(timings.renew_period, backend.sightings()).await {
            Ok(Ok(seen)) => {
                let now = Instant::now();
                for s in seen {
                    if !roster.observe(s, now) {
                        refused.note("too_many", &steer);
                    }
                }
                if roster.alive(now) && failing {
                    failing = false;
                    info!(membership = %backend.describe(), "membership works again");
                    steer.worked();
                }
            }
            Ok(Err(e)) => report(&steer, &mut failing, &e.to_string()),
            Err(_) => report(&steer, &mut failing, "reading the members timed out"),
        }
        for reason in backend.refused() {
            refused.note(reason, &steer);
        }
        let now = Instant::now();
        roster.forget_expired(now);
        let live = roster.live(now);
        if live != told_members {
            info!(members = ?live, "shard members changed");
            steer.members(&live);
            told_members = live;
        }
        let working = roster.may_work(now);
        if working != told_working {
            if working {
                info!(member = %me, "working our share");
            } else {
                warn!(member = %me, "not working: our membership is not renewed");
            }
            steer.working(working);
            told_working = working;
        }
    }
    if told_working {
        steer.working(false);
    }
    match tokio::time::timeout(timings.renew_period, backend.leave()).await {
        Ok(Ok(())) => info!(membership = %backend.describe(), "left the shards"),
        Ok(Err(e)) => {
            warn!(error = %e, "could not leave the shards; our membership expires instead")
        }
        Err(_) => warn!("leaving the shards timed out; our membership expires instead"),
    }
    debug!("membership stopped");
}

/// Ignored membership records: counted each, logged at most once a
/// [`REFUSED_LOG_EVERY`] with how many since.
#[derive(Default)]
struct Refused {
    logged: Option<Instant>,
    since: u64,
}

/// How often ignored membership records are logged at most.
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(10);

impl Refused {
    fn note<S: ShardSteer>(&mut self, reason: &'static str, steer: &S) {
        steer.refused(reason);
        self.since += 1;
        let now = Instant::now();
        if self
            .logged
            .is_none_or(|t| now.saturating_duration_since(t) >= REFUSED_LOG_EVERY)
        {
            warn!(
                reason,
                ignored = self.since,
                "ignoring membership records that are not ours (not sealed with our key, replayed, malformed, or too many members)"
            );
            self.logged = Some(now);
            self.since = 0;
        }
    }
}

fn report<S: ShardSteer>(steer: &S, failing: &mut bool, error: &str) {
    steer.failed(error);
    if !*failing {
        error!(error, "membership failed; retrying");
    }
    *failing = true;
}

#[cfg(test)]
mod tests;

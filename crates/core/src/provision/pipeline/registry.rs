//! The host registry and the lanes nodes wait in for their sequence.
//!
//! Discovery and startup events *offer* hosts. An offered host is
//! registered, [`State::Pending`], and waits in a lane until the dispatcher
//! (`dispatch`) starts its sequence; the sequence's first request is what
//! confirms the name (a name nobody answers for costs that request's timer,
//! never a worker). Lanes, each bounded and each with an in-flight budget of
//! its own:
//!
//! * [`Lane::Events`]: names from `startup` events;
//! * [`Lane::Discovery`]: names from discovery replies;
//! * [`Lane::Suspect`]: names that failed within [`FAILURE_MEMORY`], from
//!   either source, so a name that answers and then stalls is retried
//!   behind the names that have not failed, never ahead of a real node.
//!
//! Anyone on the provisioning collective can answer a discovery, or publish
//! an event, under any name, so registrations are bounded: at most
//! [`PENDING_CAPACITY`] names wait at once (the largest fleet one discovery
//! feeds in one pass), events at most [`EVENT_QUEUE`] of them.
//!
//! The registry follows the Go provisioner's rules: a host seen again within
//! one `interval` of being added is ignored; an older waiting entry is
//! replaced. A provisioned host stays registered for [`HOLD_AFTER_SUCCESS`]
//! from its success so the burst of events around its restart does not queue
//! it again; a failed host is forgotten at once (and remembered as failed)
//! so the next discovery retries it.
//!
//! Unlike Go, a host that is being worked on, or held after success, is
//! never replaced, however long ago it was added: Go replaces any entry older
//! than `interval`, so a node whose wait plus sequence outlasts one interval
//! and is discovered again runs twice at once (two helper runs, two
//! certificates, interleaved `configure`).
//!
//! Unlike Go, each registration gets a generation number and a waiting
//! ticket is only current while its generation is the registered one: after
//! the registry was emptied (lost leadership) and the host added again, the
//! old ticket still in a lane is rejected instead of provisioning twice.

use crate::provision::metrics::Metrics;
use crate::provision::suspects::{Allow, LogLimiter};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{debug, warn};

mod hosts;
use hosts::{remember, Entry, Hosts, State};

/// Names waiting for their sequence, at most, over every lane: the largest
/// fleet one discovery feeds in one pass.
pub const PENDING_CAPACITY: usize = 500_000;
/// Names from startup events waiting, at most (more are dropped and
/// counted: discovery finds real nodes later).
pub const EVENT_QUEUE: usize = 10_000;
/// How long a provisioned host stays registered (Go: 60 s).
pub const HOLD_AFTER_SUCCESS: Duration = Duration::from_secs(60);
/// How long a host that announced its shutdown is not offered again: it
/// is restarting (out of provisioning, as a rule) and may still answer a
/// discovery in the splay before it goes (2 s after `restart`, up to 12 s
/// after `reprovision`).
pub const HOLD_AFTER_SHUTDOWN: Duration = Duration::from_secs(15);
/// How long a failed name is remembered, and offered in the suspect lane.
pub const FAILURE_MEMORY: Duration = Duration::from_secs(3600);
/// A registration older than this (and three intervals) that blocks a name
/// found again is worth a warning: no hold lasts that long, and a sequence
/// starts within two intervals of its offer and only runs longer than one
/// when thousands wait for a slow helper.
const LONG_HELD: Duration = Duration::from_secs(120);

/// One registration of a host.
#[derive(Debug)]
pub struct Ticket {
    pub identity: String,
    pub generation: u64,
    /// When it was registered; its sequence stops when it waited too long.
    pub added: Instant,
    pub source: Source,
    pub lane: Lane,
}

/// Where a host came from (for logs and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Discovery,
    Event,
}

/// The lane a host waits in (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    Events,
    Discovery,
    Suspect,
}

impl Lane {
    pub const ALL: [Lane; 3] = [Lane::Events, Lane::Discovery, Lane::Suspect];

    /// Its name as a metric label and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Lane::Events => "events",
            Lane::Discovery => "discovery",
            Lane::Suspect => "suspect",
        }
    }

    fn index(self) -> usize {
        match self {
            Lane::Events => 0,
            Lane::Discovery => 1,
            Lane::Suspect => 2,
        }
    }
}

/// Result of [`Registry::offer`].
#[derive(Debug)]
pub enum Offered {
    /// Registered and waiting in this lane.
    Queued(Lane),
    /// Registered less than one interval ago, or held after success or
    /// a shutdown.
    Recent,
    /// A sequence is working on it right now.
    Busy,
    /// Its lane, or the registry, is full; not registered.
    Full,
}

type LaneChannel = (
    async_channel::Sender<Arc<Ticket>>,
    async_channel::Receiver<Arc<Ticket>>,
);

pub struct Registry {
    hosts: Mutex<Hosts>,
    next_generation: AtomicU64,
    lanes: [LaneChannel; 3],
    finisher: mpsc::UnboundedSender<(Arc<Ticket>, Duration)>,
    interval: Duration,
    metrics: Arc<Metrics>,
    /// Per-node warnings (a lane full) at a bounded rate.
    limiter: LogLimiter,
    capacity: Capacity,
}

/// How much the registry holds at most.
#[derive(Clone, Copy, Debug)]
pub struct Capacity {
    /// Names waiting over every lane (and holds, and memories).
    pub pending: usize,
    /// Names from events waiting.
    pub events: usize,
}

impl Default for Capacity {
    fn default() -> Self {
        Capacity {
            pending: PENDING_CAPACITY,
            events: EVENT_QUEUE,
        }
    }
}

impl Registry {
    /// A registry whose finisher (delayed removal) runs until `finisher_rx`
    /// is dropped; spawn [`Registry::run_finisher`] with it.
    pub fn new(
        interval: Duration,
        metrics: Arc<Metrics>,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<(Arc<Ticket>, Duration)>) {
        Self::with_capacity(interval, metrics, Capacity::default())
    }

    /// [`Registry::new`] holding at most `capacity`.
    pub fn with_capacity(
        interval: Duration,
        metrics: Arc<Metrics>,
        capacity: Capacity,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<(Arc<Ticket>, Duration)>) {
        let (finisher, finisher_rx) = mpsc::unbounded_channel();
        let registry = Arc::new(Registry {
            hosts: Mutex::new(Hosts::default()),
            next_generation: AtomicU64::new(1),
            lanes: [
                async_channel::bounded(capacity.events.max(1)),
                async_channel::bounded(capacity.pending.max(1)),
                async_channel::bounded(capacity.pending.max(1)),
            ],
            finisher,
            interval,
            metrics,
            limiter: LogLimiter::default(),
            capacity,
        });
        registry.update_gauges(&Hosts::default());
        (registry, finisher_rx)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Hosts> {
        self.hosts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Why an existing registration keeps `identity` from a new one, if it
    /// does (Go's dedupe rule; see the module docs).
    fn blocked(&self, entry: Option<&Entry>, source: Source) -> Option<Offered> {
        let entry = entry?;
        match entry.state {
            State::Restarting if source == Source::Event => None,
            State::Restarting | State::Held => Some(Offered::Recent),
            State::Working => Some(Offered::Busy),
            State::Pending if entry.added.elapsed() < self.interval => Some(Offered::Recent),
            // Go's rule: an old waiting entry is replaced (the stale
            // ticket still in its lane is then skipped).
            State::Pending => None,
        }
    }

    fn ticket(&self, identity: &str, source: Source, lane: Lane) -> Arc<Ticket> {
        Arc::new(Ticket {
            identity: identity.to_string(),
            generation: self.next_generation.fetch_add(1, Ordering::Relaxed),
            added: Instant::now(),
            source,
            lane,
        })
    }

    /// Registers `identity` and queues it in its lane, unless it is
    /// registered already (see the module docs for the rule) or its lane or
    /// the registry is full.
    pub fn offer(&self, identity: &str, source: Source) -> Offered {
        let mut hosts = self.lock();
        if let Some(blocked) = self.blocked(hosts.entries.get(identity), source) {
            if let Some(e) = hosts.entries.get(identity) {
                self.note_long_held(identity, e);
            }
            return blocked;
        }
        if hosts.pending >= self.capacity.pending {
            drop(hosts);
            self.warn_full("pending", self.capacity.pending, identity);
            return Offered::Full;
        }
        let lane = match source {
            _ if hosts.failed_recently(identity, Instant::now()) => Lane::Suspect,
            Source::Event => Lane::Events,
            Source::Discovery => Lane::Discovery,
        };
        let ticket = self.ticket(identity, source, lane);
        if self.lanes[lane.index()].0.try_send(ticket.clone()).is_err() {
            drop(hosts);
            self.warn_full(
                "lane",
                self.lanes[lane.index()].0.capacity().unwrap_or(0),
                identity,
            );
            return Offered::Full;
        }
        hosts.insert(
            identity,
            Entry {
                generation: ticket.generation,
                added: ticket.added,
                state: State::Pending,
                shutdown_seen: false,
            },
        );
        self.update_gauges(&hosts);
        Offered::Queued(lane)
    }

    /// A name found again while its registration is older than any
    /// sequence or hold should be: said at a bounded rate, with its state,
    /// so a sequence that never ends shows in the log rather than as a node
    /// that is silently never provisioned.
    fn note_long_held(&self, identity: &str, entry: &Entry) {
        let age = entry.added.elapsed();
        let state = match entry.state {
            State::Working => "worked",
            State::Held => "held after success",
            State::Restarting => "held after a shutdown",
            State::Pending => return,
        };
        if age < LONG_HELD.max(self.interval * 3) {
            return;
        }
        if let Allow::Yes { suppressed } = self.limiter.check("long held", Instant::now()) {
            warn!(
                node = %choria_wire::identity::shown(identity),
                state,
                since = ?age,
                suppressed_before = suppressed,
                "a node found again is still registered long after its sequence should have ended"
            );
        }
    }

    /// One warning per kind and window (a flood must not flood the logs).
    fn warn_full(&self, which: &'static str, capacity: usize, identity: &str) {
        if let Allow::Yes { suppressed } = self.limiter.check(which, Instant::now()) {
            warn!(
                node = %choria_wire::identity::shown(identity),
                capacity,
                which,
                suppressed_before = suppressed,
                "too many nodes waiting, not adding the node; a later discovery retries it"
            );
        }
    }

    /// Whether `ticket` is still the registered generation of its host.
    pub fn is_current(&self, ticket: &Ticket) -> bool {
        self.lock()
            .entries
            .get(&ticket.identity)
            .is_some_and(|e| e.generation == ticket.generation)
    }

    /// The next ticket of `lane`, current or not (see [`Registry::start`]);
    /// `None` once the lanes are closed.
    pub async fn next(&self, lane: Lane) -> Option<Arc<Ticket>> {
        let ticket = self.lanes[lane.index()].1.recv().await.ok()?;
        self.metrics.set_work_queue_entries(self.queued());
        Some(ticket)
    }

    /// Its sequence starts: whether `ticket` is still the host's waiting
    /// registration (a replaced or dropped one is skipped).
    pub fn start(&self, ticket: &Ticket) -> bool {
        let mut hosts = self.lock();
        let started = hosts
            .entries
            .get(&ticket.identity)
            .is_some_and(|e| e.generation == ticket.generation && e.state == State::Pending)
            && hosts.set_state(&ticket.identity, ticket.generation, State::Working);
        self.update_gauges(&hosts);
        started
    }

    /// Forgets the host now, if `ticket` is still its registration.
    pub fn remove(&self, ticket: &Ticket) {
        let mut hosts = self.lock();
        if hosts
            .entries
            .get(&ticket.identity)
            .is_some_and(|e| e.generation == ticket.generation)
        {
            hosts.remove(&ticket.identity);
        }
        self.update_gauges(&hosts);
    }

    /// The host failed: forgotten now, so the next discovery offers it
    /// again, and remembered as failed, so it waits in the suspect lane
    /// then, behind names that have not failed.
    pub fn failed(&self, ticket: &Ticket) {
        let mut hosts = self.lock();
        if hosts
            .entries
            .get(&ticket.identity)
            .is_some_and(|e| e.generation == ticket.generation)
        {
            hosts.remove(&ticket.identity);
        }
        let limit = self.capacity.pending;
        remember(
            &mut hosts.failed,
            &ticket.identity,
            Instant::now(),
            FAILURE_MEMORY,
            limit,
        );
        self.update_gauges(&hosts);
    }

    /// A node announced its shutdown: forgets it when it is still waiting
    /// and, when it is not being worked or held already, holds it for
    /// [`HOLD_AFTER_SHUTDOWN`] so a discovery during its restart splay does
    /// not offer it again (another replica, or a previous leader, just
    /// provisioned it).
    ///
    /// Anyone may publish a `shutdown` event in any node's name, as often
    /// as they like, so one is a hint, taken at most once per node every
    /// [`Registry::hint_window`] (two discovery intervals): a forger
    /// repeating it cannot keep a node out, and the next discovery after
    /// the hold offers it again (a delay of one interval at most). Hints
    /// remembered and holds are bounded like the pending set. Whether the
    /// hint was taken.
    pub fn shut_down(&self, identity: &str) -> bool {
        let ticket = {
            let mut hosts = self.lock();
            let limit = self.capacity.pending;
            // Worked or held after success: the hint changes nothing, so
            // no hint is remembered (every node we restart announces its
            // shutdown: a hint per node would cost ~100 bytes each for two
            // intervals). The entry notes the first; a repeat is counted.
            if let Some(e) = hosts
                .entries
                .get_mut(identity)
                .filter(|e| matches!(e.state, State::Working | State::Held))
            {
                let repeat = std::mem::replace(&mut e.shutdown_seen, true);
                drop(hosts);
                if repeat {
                    self.metrics.ignored_shutdown();
                }
                return !repeat;
            }
            if !hosts.hint(identity, Instant::now(), self.hint_window(), limit) {
                drop(hosts);
                self.metrics.ignored_shutdown();
                return false;
            }
            if hosts
                .entries
                .get(identity)
                .is_some_and(|e| e.state == State::Pending)
            {
                hosts.remove(identity);
                debug!(node = %identity, "dropped a waiting node that shut down");
            }
            if hosts.entries.contains_key(identity) || hosts.entries.len() >= limit {
                self.update_gauges(&hosts);
                return true;
            }
            let ticket = self.ticket(identity, Source::Event, Lane::Events);
            hosts.insert(
                identity,
                Entry {
                    generation: ticket.generation,
                    added: ticket.added,
                    state: State::Restarting,
                    shutdown_seen: false,
                },
            );
            self.update_gauges(&hosts);
            ticket
        };
        if self
            .finisher
            .send((ticket.clone(), HOLD_AFTER_SHUTDOWN))
            .is_err()
        {
            self.remove(&ticket);
        }
        true
    }

    /// How long a node's shutdown hint stands: two discovery intervals, so
    /// a discovery always falls between the end of one hold and the next
    /// hint that could be taken.
    pub fn hint_window(&self) -> Duration {
        self.interval * 2
    }

    /// Forgets a node held after its success (or restart): we asked it to
    /// come back through provisioning (renewal), so its next startup
    /// event must queue it.
    pub fn forget_done(&self, identity: &str) {
        let mut hosts = self.lock();
        if hosts
            .entries
            .get(identity)
            .is_some_and(|e| matches!(e.state, State::Held | State::Restarting))
        {
            hosts.remove(identity);
            self.update_gauges(&hosts);
        }
    }

    /// Forgets a node still waiting in a lane; a node being worked (our own
    /// restart makes it announce a shutdown) or held stays.
    pub fn forget_waiting(&self, identity: &str) -> bool {
        let mut hosts = self.lock();
        let forget = hosts
            .entries
            .get(identity)
            .is_some_and(|e| e.state == State::Pending);
        if forget {
            hosts.remove(identity);
            self.update_gauges(&hosts);
        }
        forget
    }

    /// Done: forgets the host after `delay` (the finisher does it), and
    /// that it ever failed.
    pub fn remove_later(&self, ticket: Arc<Ticket>, delay: Duration) {
        {
            let mut hosts = self.lock();
            hosts.set_state(&ticket.identity, ticket.generation, State::Held);
            hosts.failed.remove(&ticket.identity);
            self.update_gauges(&hosts);
        }
        if self.finisher.send((ticket.clone(), delay)).is_err() {
            self.remove(&ticket);
        }
    }

    /// Empties the registry and drains the lanes (leadership lost).
    /// Sequences under way find their ticket no longer current.
    pub fn clear(&self) -> usize {
        let mut hosts = self.lock();
        let dropped = hosts.clear();
        for (_, rx) in &self.lanes {
            while rx.try_recv().is_ok() {}
        }
        self.update_gauges(&hosts);
        dropped
    }

    /// Wakes every [`Registry::next`] with `None` (shutting down).
    pub fn close_queue(&self) {
        for (tx, _) in &self.lanes {
            tx.close();
        }
    }

    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tickets in the lanes (stale ones included until they are taken).
    pub fn queued(&self) -> usize {
        self.lanes.iter().map(|(_, rx)| rx.len()).sum()
    }

    /// Hosts waiting for their sequence.
    pub fn pending(&self) -> usize {
        self.lock().pending
    }

    fn update_gauges(&self, hosts: &Hosts) {
        self.metrics.set_waiting_nodes(hosts.entries.len());
        self.metrics.set_pending_nodes(hosts.pending);
        self.metrics.set_work_queue_entries(self.queued());
    }

    /// Removes hosts when their hold time is up; ends when the registry is
    /// dropped or `stop` fires.
    pub async fn run_finisher(
        self: Arc<Self>,
        mut rx: mpsc::UnboundedReceiver<(Arc<Ticket>, Duration)>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let mut due = tokio_util::time::DelayQueue::new();
        loop {
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some((ticket, delay)) => { due.insert(ticket, delay); }
                    None => return,
                },
                Some(expired) = futures::StreamExt::next(&mut due) => {
                    let ticket = expired.into_inner();
                    debug!(node = %ticket.identity, "removing from the provision list");
                    self.remove(&ticket);
                }
                _ = stop.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests;

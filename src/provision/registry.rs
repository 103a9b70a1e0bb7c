//! The host registry, the bounded work queue, and the names waiting to be
//! confirmed.
//!
//! Discovery and startup events *offer* hosts; an offered host waits,
//! [`State::Pending`], until it answers a directed ping in its own name (the
//! `confirm` stage), and only then enters the work queue that workers take
//! hosts from. Anyone on the provisioning collective can answer a discovery
//! or publish an event under any name, and a name nobody answers for would
//! otherwise hold a worker for every RPC timeout of its sequence.
//!
//! Pending names cost little (an entry here, a name in the confirmation
//! stage) and are bounded by [`PENDING_CAPACITY`], so a fleet larger than
//! the work queue is found in one discovery and fed to the queue as it
//! drains, and a flood of made-up names costs memory up to the bound and
//! one ping each.
//!
//! The registry follows the Go provisioner's rules: a host seen again within
//! one `interval` of being added is ignored; an older *queued* entry is
//! replaced. A provisioned host stays registered for [`HOLD_AFTER_SUCCESS`]
//! from its success so the burst of events around its restart does not queue
//! it again; a failed host is forgotten at once so the next discovery retries
//! it.
//!
//! Unlike Go, a host that is being worked on, or held after success, is
//! never replaced, however long ago it was added: Go replaces any entry older
//! than `interval`, so a node whose wait plus sequence outlasts one interval
//! and is discovered again runs on two workers at once (two helper runs, two
//! certificates, interleaved `configure`).
//!
//! Unlike Go, each registration gets a generation number and a queued ticket
//! is only current while its generation is the registered one: after the
//! registry was emptied (lost leadership) and the host added again, the old
//! ticket still in the queue is rejected instead of provisioning twice.

use crate::provision::metrics::Metrics;
use crate::provision::suspects::{Allow, LogLimiter};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Work queue capacity (Go: 50,000).
pub const QUEUE_CAPACITY: usize = 50_000;
/// Names waiting for confirmation (or, confirmed, for room in the work
/// queue) at most: the largest fleet one discovery feeds in one pass.
pub const PENDING_CAPACITY: usize = 500_000;
/// How long a provisioned host stays registered (Go: 60 s).
pub const HOLD_AFTER_SUCCESS: Duration = Duration::from_secs(60);
/// How long a host that announced its shutdown is not offered again: it
/// is restarting (out of provisioning, as a rule) and may still answer a
/// discovery in the splay before it goes (2 s after `restart`, up to 12 s
/// after `reprovision`).
pub const HOLD_AFTER_SHUTDOWN: Duration = Duration::from_secs(15);

/// One registration of a host.
#[derive(Debug)]
pub struct Ticket {
    pub identity: String,
    pub generation: u64,
    /// When it was registered; a worker skips it when it waited too long.
    pub added: Instant,
    pub source: Source,
}

/// Where a host came from (for logs and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Discovery,
    Event,
}

/// Result of [`Registry::add`] and [`Registry::confirmed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    Queued,
    /// Registered less than one interval ago, or held after success.
    Recent,
    /// A worker is provisioning it right now.
    Busy,
    /// The work queue is full; the host was not registered.
    QueueFull,
    /// The registration was replaced or dropped while it waited.
    Stale,
}

/// Result of [`Registry::offer`].
#[derive(Debug)]
pub enum Offered {
    /// Registered as pending: confirm it, then [`Registry::confirmed`].
    Pending(Arc<Ticket>),
    /// Registered less than one interval ago, pending, or held after success.
    Recent,
    /// A worker is provisioning it right now.
    Busy,
    /// [`PENDING_CAPACITY`] names are pending already; not registered.
    Full,
}

/// One registration: its generation, when it was made, and where it is.
#[derive(Clone, Copy)]
struct Entry {
    generation: u64,
    added: Instant,
    state: State,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Offered, waiting to answer its confirmation ping.
    Pending,
    /// In the work queue.
    Queued,
    /// A worker took it.
    Working,
    /// Done; held so repeated events do not queue it again.
    Held,
    /// Announced its shutdown and is restarting: discovery does not offer
    /// it again, its next `startup` event does.
    Restarting,
}

pub struct Registry {
    hosts: Mutex<Hosts>,
    next_generation: AtomicU64,
    queue_tx: async_channel::Sender<Arc<Ticket>>,
    queue_rx: async_channel::Receiver<Arc<Ticket>>,
    finisher: mpsc::UnboundedSender<(Arc<Ticket>, Duration)>,
    interval: Duration,
    metrics: Arc<Metrics>,
    /// Per-node warnings (queue or pending set full) at a bounded rate.
    limiter: LogLimiter,
    capacity: Capacity,
}

/// How much the registry holds at most.
#[derive(Clone, Copy, Debug)]
pub struct Capacity {
    pub queue: usize,
    pub pending: usize,
}

impl Default for Capacity {
    fn default() -> Self {
        Capacity {
            queue: QUEUE_CAPACITY,
            pending: PENDING_CAPACITY,
        }
    }
}

/// The registrations and how many of them are pending.
#[derive(Default)]
struct Hosts {
    entries: HashMap<String, Entry>,
    pending: usize,
}

impl Hosts {
    fn insert(&mut self, identity: &str, entry: Entry) {
        if entry.state == State::Pending {
            self.pending += 1;
        }
        if let Some(old) = self.entries.insert(identity.to_string(), entry) {
            self.forgot(old);
        }
    }

    fn remove(&mut self, identity: &str) -> Option<Entry> {
        let old = self.entries.remove(identity)?;
        self.forgot(old);
        Some(old)
    }

    fn set_state(&mut self, identity: &str, generation: u64, state: State) -> bool {
        match self.entries.get_mut(identity) {
            Some(e) if e.generation == generation => {
                if e.state == State::Pending {
                    self.pending -= 1;
                }
                if state == State::Pending {
                    self.pending += 1;
                }
                e.state = state;
                true
            }
            _ => false,
        }
    }

    fn forgot(&mut self, old: Entry) {
        if old.state == State::Pending {
            self.pending -= 1;
        }
    }

    fn clear(&mut self) -> usize {
        let n = self.entries.len();
        self.entries.clear();
        self.pending = 0;
        n
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
        let (queue_tx, queue_rx) = async_channel::bounded(capacity.queue);
        let (finisher, finisher_rx) = mpsc::unbounded_channel();
        let registry = Arc::new(Registry {
            hosts: Mutex::new(Hosts::default()),
            next_generation: AtomicU64::new(1),
            queue_tx,
            queue_rx,
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
    fn blocked(&self, entry: Option<&Entry>, source: Source) -> Option<Added> {
        match entry?.state {
            State::Restarting if source == Source::Event => None,
            State::Restarting => Some(Added::Recent),
            State::Working => Some(Added::Busy),
            State::Held | State::Pending => Some(Added::Recent),
            State::Queued if entry?.added.elapsed() < self.interval => Some(Added::Recent),
            // Go's rule: an old queued entry is replaced (the stale ticket
            // still in the queue is then skipped).
            State::Queued => None,
        }
    }

    fn ticket(&self, identity: &str, source: Source) -> Arc<Ticket> {
        Arc::new(Ticket {
            identity: identity.to_string(),
            generation: self.next_generation.fetch_add(1, Ordering::Relaxed),
            added: Instant::now(),
            source,
        })
    }

    /// Registers `identity` as pending confirmation unless it is registered
    /// already (see [`Registry::add`] for the rule) or the pending set is
    /// full.
    pub fn offer(&self, identity: &str, source: Source) -> Offered {
        let mut hosts = self.lock();
        match self.blocked(hosts.entries.get(identity), source) {
            Some(Added::Busy) => return Offered::Busy,
            Some(_) => return Offered::Recent,
            None => {}
        }
        if hosts.pending >= self.capacity.pending {
            drop(hosts);
            self.warn_full("pending", self.capacity.pending, identity);
            return Offered::Full;
        }
        let ticket = self.ticket(identity, source);
        hosts.insert(
            identity,
            Entry {
                generation: ticket.generation,
                added: ticket.added,
                state: State::Pending,
            },
        );
        self.update_gauges(&hosts);
        Offered::Pending(ticket)
    }

    /// A pending host answered its confirmation: into the work queue,
    /// waiting for room there (the pending set holds the rest of a large
    /// fleet meanwhile).
    pub async fn confirmed(&self, ticket: Arc<Ticket>) -> Added {
        {
            let mut hosts = self.lock();
            if !hosts.set_state(&ticket.identity, ticket.generation, State::Queued) {
                return Added::Stale;
            }
            self.update_gauges(&hosts);
        }
        let identity = ticket.identity.clone();
        if self.queue_tx.send(ticket).await.is_err() {
            // Closed: shutting down.
            self.lock().remove(&identity);
            return Added::Stale;
        }
        self.metrics.set_work_queue_entries(self.queue_rx.len());
        Added::Queued
    }

    /// A pending host did not answer its confirmation: forgotten, so the
    /// next discovery or event offers it again.
    pub fn unconfirmed(&self, ticket: &Ticket) {
        self.remove(ticket);
    }

    /// Registers and queues a host at once, without confirmation, unless it
    /// was registered recently.
    pub fn add(&self, identity: &str) -> Added {
        let mut hosts = self.lock();
        if let Some(blocked) = self.blocked(hosts.entries.get(identity), Source::Discovery) {
            return blocked;
        }
        let ticket = self.ticket(identity, Source::Discovery);
        let result = match self.queue_tx.try_send(ticket.clone()) {
            Ok(()) => {
                hosts.insert(
                    identity,
                    Entry {
                        generation: ticket.generation,
                        added: ticket.added,
                        state: State::Queued,
                    },
                );
                Added::Queued
            }
            Err(_) => {
                hosts.remove(identity);
                self.update_gauges(&hosts);
                drop(hosts);
                self.warn_full("work", self.capacity.queue, identity);
                return Added::QueueFull;
            }
        };
        self.update_gauges(&hosts);
        result
    }

    /// One warning per kind and window (a flood must not flood the logs).
    fn warn_full(&self, which: &'static str, capacity: usize, identity: &str) {
        if let Allow::Yes { suppressed } = self.limiter.check(which, Instant::now()) {
            warn!(
                node = %crate::choria::identity::shown(identity),
                capacity,
                which,
                suppressed_before = suppressed,
                "a queue is full, not adding the node; a later discovery retries it"
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

    /// A node announced its shutdown: forgets it when it is still waiting
    /// (see [`Registry::forget_waiting`]) and, when it is not being worked
    /// or held already, holds it for [`HOLD_AFTER_SHUTDOWN`] so a discovery
    /// during its restart splay does not offer it again (another replica,
    /// or a previous leader, just provisioned it). Holds are bounded like
    /// the pending set, so a flood of made-up shutdowns costs a bounded
    /// amount of memory and delays real nodes by one hold at most.
    pub fn shut_down(&self, identity: &str) -> bool {
        let forgot = self.forget_waiting(identity);
        let ticket = {
            let mut hosts = self.lock();
            if hosts.entries.contains_key(identity) || hosts.entries.len() >= self.capacity.pending
            {
                return forgot;
            }
            let ticket = self.ticket(identity, Source::Event);
            hosts.insert(
                identity,
                Entry {
                    generation: ticket.generation,
                    added: ticket.added,
                    state: State::Restarting,
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
        forgot
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

    /// Forgets a node still waiting (pending or queued): it announced its
    /// shutdown (e.g. restarted by a previous leader), so working it would
    /// only wait for replies that never come. A node being worked (our own
    /// restart makes it announce a shutdown) or held stays.
    pub fn forget_waiting(&self, identity: &str) -> bool {
        let mut hosts = self.lock();
        let forget = hosts
            .entries
            .get(identity)
            .is_some_and(|e| matches!(e.state, State::Queued | State::Pending));
        if forget {
            hosts.remove(identity);
            self.update_gauges(&hosts);
        }
        forget
    }

    /// Forgets the host after `delay` (the finisher does it).
    pub fn remove_later(&self, ticket: Arc<Ticket>, delay: Duration) {
        self.lock()
            .set_state(&ticket.identity, ticket.generation, State::Held);
        if self.finisher.send((ticket.clone(), delay)).is_err() {
            self.remove(&ticket);
        }
    }

    /// Empties the registry and drains the queue (leadership lost). Workers
    /// holding a ticket, and confirmations under way, find theirs no longer
    /// current.
    pub fn clear(&self) -> usize {
        let mut hosts = self.lock();
        let dropped = hosts.clear();
        while self.queue_rx.try_recv().is_ok() {}
        self.update_gauges(&hosts);
        dropped
    }

    /// The next queued ticket; `None` once the queue is closed.
    pub async fn next(&self) -> Option<Arc<Ticket>> {
        let ticket = self.queue_rx.recv().await.ok()?;
        self.lock()
            .set_state(&ticket.identity, ticket.generation, State::Working);
        self.metrics.set_work_queue_entries(self.queue_rx.len());
        Some(ticket)
    }

    /// Wakes workers waiting in [`Registry::next`] with `None`.
    pub fn close_queue(&self) {
        self.queue_tx.close();
    }

    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn queued(&self) -> usize {
        self.queue_rx.len()
    }

    /// Hosts waiting for confirmation (or for room in the work queue).
    pub fn pending(&self) -> usize {
        self.lock().pending
    }

    fn update_gauges(&self, hosts: &Hosts) {
        self.metrics.set_waiting_nodes(hosts.entries.len());
        self.metrics.set_pending_nodes(hosts.pending);
        self.metrics.set_work_queue_entries(self.queue_rx.len());
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
mod tests {
    use super::*;

    fn registry(interval: Duration) -> Arc<Registry> {
        Registry::new(interval, Arc::new(Metrics::new("t"))).0
    }

    #[tokio::test]
    async fn a_host_seen_again_within_the_interval_is_not_queued_twice() {
        let r = registry(Duration::from_secs(60));
        assert_eq!(r.add("n1"), Added::Queued);
        assert_eq!(r.add("n1"), Added::Recent);
        assert_eq!(r.queued(), 1);
        assert_eq!(r.len(), 1);
    }

    #[tokio::test]
    async fn an_old_queued_registration_is_replaced_and_its_ticket_goes_stale() {
        let r = registry(Duration::from_millis(10));
        assert_eq!(r.add("n1"), Added::Queued);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(r.add("n1"), Added::Queued);
        let first = r.next().await.unwrap();
        let second = r.next().await.unwrap();
        assert!(!r.is_current(&first), "replaced registration is stale");
        assert!(r.is_current(&second));
        // Removing with the stale ticket leaves the new registration alone.
        r.remove(&first);
        assert!(r.is_current(&second));
    }

    #[tokio::test]
    async fn a_host_being_worked_or_held_is_never_replaced_however_old() {
        // Keep the finisher's receiver: without it held nodes go at once.
        let (r, _finisher) = Registry::new(Duration::from_millis(10), Arc::new(Metrics::new("t")));
        assert_eq!(r.add("n1"), Added::Queued);
        let working = r.next().await.unwrap();
        // The sequence outlasts the interval and the node is seen again.
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(r.add("n1"), Added::Busy);
        assert_eq!(r.queued(), 0, "not queued a second time");
        assert!(r.is_current(&working));
        // Done: held from its success, however long ago it was added.
        r.remove_later(working, HOLD_AFTER_SUCCESS);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(r.add("n1"), Added::Recent);
        assert_eq!(r.queued(), 0);
    }

    #[tokio::test]
    async fn clear_empties_the_registry_and_drains_the_queue() {
        let r = registry(Duration::from_secs(60));
        for i in 0..5 {
            r.add(&format!("n{i}"));
        }
        let taken = r.next().await.unwrap();
        assert_eq!(r.clear(), 5);
        assert_eq!(r.queued(), 0);
        assert!(r.is_empty());
        assert!(
            !r.is_current(&taken),
            "a worker's ticket is rejected after clear"
        );
        // After clearing, the host can be added again at once.
        assert_eq!(r.add("n0"), Added::Queued);
    }

    #[tokio::test]
    async fn a_node_that_shut_down_is_forgotten_only_while_queued() {
        // Keep the finisher's receiver: without it held nodes go at once.
        let (r, _finisher) = Registry::new(Duration::from_secs(60), Arc::new(Metrics::new("t")));
        r.add("working");
        r.add("done");
        r.add("waiting");
        let _w = r.next().await.unwrap();
        let d = r.next().await.unwrap();
        r.remove_later(d, HOLD_AFTER_SUCCESS);
        assert!(r.forget_waiting("waiting"));
        assert!(!r.forget_waiting("working"), "a node being worked stays");
        assert!(!r.forget_waiting("done"), "a provisioned node stays held");
        assert!(!r.forget_waiting("unknown"));
        assert_eq!(r.len(), 2);
    }

    fn small(queue: usize, pending: usize) -> Arc<Registry> {
        Registry::with_capacity(
            Duration::from_secs(60),
            Arc::new(Metrics::new("t")),
            Capacity { queue, pending },
        )
        .0
    }

    fn pending(offered: Offered) -> Arc<Ticket> {
        match offered {
            Offered::Pending(t) => t,
            other => panic!("not pending: {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_offered_host_waits_for_its_confirmation_before_the_queue() {
        let r = small(10, 10);
        let t = pending(r.offer("n1", Source::Discovery));
        assert!(matches!(r.offer("n1", Source::Event), Offered::Recent));
        assert_eq!(r.add("n1"), Added::Recent, "pending counts as registered");
        assert_eq!((r.pending(), r.queued()), (1, 0));
        assert_eq!(r.confirmed(t).await, Added::Queued);
        assert_eq!((r.pending(), r.queued()), (0, 1));
        // A name nobody answers for is forgotten, and offered again later.
        let t = pending(r.offer("ghost", Source::Discovery));
        r.unconfirmed(&t);
        assert_eq!(r.pending(), 0);
        assert!(matches!(
            r.offer("ghost", Source::Discovery),
            Offered::Pending(_)
        ));
    }

    #[tokio::test]
    async fn the_pending_set_is_bounded_and_a_full_one_registers_nothing() {
        let r = small(10, 3);
        for i in 0..3 {
            pending(r.offer(&format!("n{i}"), Source::Discovery));
        }
        assert!(matches!(r.offer("n3", Source::Discovery), Offered::Full));
        assert_eq!(r.len(), 3);
    }

    #[tokio::test]
    async fn a_confirmed_host_waits_for_room_in_a_full_queue() {
        let r = small(2, 10);
        let tickets: Vec<_> = (0..3)
            .map(|i| pending(r.offer(&format!("n{i}"), Source::Discovery)))
            .collect();
        let mut tickets = tickets.into_iter();
        assert_eq!(r.confirmed(tickets.next().unwrap()).await, Added::Queued);
        assert_eq!(r.confirmed(tickets.next().unwrap()).await, Added::Queued);
        let third = tokio::spawn({
            let r = r.clone();
            let t = tickets.next().unwrap();
            async move { r.confirmed(t).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!third.is_finished(), "waits while the queue is full");
        assert_eq!(r.next().await.unwrap().identity, "n0");
        assert_eq!(
            third.await.unwrap(),
            Added::Queued,
            "not lost: queued once there is room"
        );
        assert_eq!(r.queued(), 2);
    }

    #[tokio::test]
    async fn a_confirmation_after_clear_or_shutdown_is_stale() {
        let r = small(10, 10);
        let t = pending(r.offer("n1", Source::Event));
        r.clear();
        assert_eq!(r.confirmed(t).await, Added::Stale);
        assert_eq!(r.queued(), 0);
        let t = pending(r.offer("n2", Source::Event));
        assert!(
            r.forget_waiting("n2"),
            "a pending node that shut down is forgotten"
        );
        assert_eq!(r.confirmed(t).await, Added::Stale);
        assert_eq!(r.pending(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_that_shut_down_is_not_offered_again_during_its_restart() {
        let (r, rx) = Registry::with_capacity(
            Duration::from_secs(60),
            Arc::new(Metrics::new("t")),
            Capacity {
                queue: 10,
                pending: 3,
            },
        );
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(r.clone().run_finisher(rx, stop.clone()));
        // Provisioned by another replica: we never registered it.
        assert!(!r.shut_down("restarting"));
        assert!(matches!(
            r.offer("restarting", Source::Discovery),
            Offered::Recent
        ));
        // A waiting one is forgotten and held too.
        pending(r.offer("queued", Source::Discovery));
        assert!(r.shut_down("queued"));
        assert!(matches!(
            r.offer("queued", Source::Discovery),
            Offered::Recent
        ));
        // Its startup event (it came back into provisioning: an upgrade, a
        // restart without provision=false) offers it at once.
        assert!(matches!(
            r.offer("queued", Source::Event),
            Offered::Pending(_)
        ));
        // Holds are bounded.
        pending(r.offer("x", Source::Discovery));
        assert!(!r.shut_down("flood-1"));
        assert_eq!(r.len(), 3, "no hold beyond the bound");
        tokio::time::sleep(HOLD_AFTER_SHUTDOWN + Duration::from_secs(1)).await;
        assert!(matches!(
            r.offer("restarting", Source::Discovery),
            Offered::Pending(_)
        ));
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_finisher_forgets_a_host_after_its_hold_time() {
        let (r, rx) = Registry::new(Duration::from_secs(60), Arc::new(Metrics::new("t")));
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(r.clone().run_finisher(rx, stop.clone()));
        r.add("n1");
        let t = r.next().await.unwrap();
        r.remove_later(t, HOLD_AFTER_SUCCESS);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(r.len(), 1, "held during the hold time");
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(r.len(), 0, "forgotten after it");
        stop.cancel();
        task.await.unwrap();
    }
}

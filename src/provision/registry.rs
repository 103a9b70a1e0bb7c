//! The host registry and the bounded work queue.
//!
//! Discovery and startup events add hosts; workers take them off the queue.
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
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Work queue capacity (Go: 50,000).
pub const QUEUE_CAPACITY: usize = 50_000;
/// How long a provisioned host stays registered (Go: 60 s).
pub const HOLD_AFTER_SUCCESS: Duration = Duration::from_secs(60);

/// One queued registration of a host.
#[derive(Debug)]
pub struct Ticket {
    pub identity: String,
    pub generation: u64,
    /// When it was registered; a worker skips it when it waited too long.
    pub added: Instant,
}

/// Where a host came from (for logs and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Discovery,
    Event,
}

/// Result of [`Registry::add`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    Queued,
    /// Registered less than one interval ago, or held after success.
    Recent,
    /// A worker is provisioning it right now.
    Busy,
    /// The work queue is full; the host was not registered.
    QueueFull,
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
    /// In the work queue.
    Queued,
    /// A worker took it.
    Working,
    /// Done; held so repeated events do not queue it again.
    Held,
}

pub struct Registry {
    hosts: Mutex<HashMap<String, Entry>>,
    next_generation: AtomicU64,
    queue_tx: async_channel::Sender<Arc<Ticket>>,
    queue_rx: async_channel::Receiver<Arc<Ticket>>,
    finisher: mpsc::UnboundedSender<(Arc<Ticket>, Duration)>,
    interval: Duration,
    metrics: Arc<Metrics>,
}

impl Registry {
    /// A registry whose finisher (delayed removal) runs until `finisher_rx`
    /// is dropped; spawn [`Registry::run_finisher`] with it.
    pub fn new(
        interval: Duration,
        metrics: Arc<Metrics>,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<(Arc<Ticket>, Duration)>) {
        let (queue_tx, queue_rx) = async_channel::bounded(QUEUE_CAPACITY);
        let (finisher, finisher_rx) = mpsc::unbounded_channel();
        let registry = Arc::new(Registry {
            hosts: Mutex::new(HashMap::new()),
            next_generation: AtomicU64::new(1),
            queue_tx,
            queue_rx,
            finisher,
            interval,
            metrics,
        });
        registry.update_gauges(0);
        (registry, finisher_rx)
    }

    /// Registers and queues a host unless it was registered recently.
    pub fn add(&self, identity: &str) -> Added {
        let mut hosts = self.hosts.lock().expect("registry lock");
        if let Some(entry) = hosts.get(identity) {
            match entry.state {
                State::Working => return Added::Busy,
                State::Held => return Added::Recent,
                State::Queued if entry.added.elapsed() < self.interval => return Added::Recent,
                // Go's rule: an old queued entry is replaced (the stale
                // ticket still in the queue is then skipped).
                State::Queued => {}
            }
        }
        let ticket = Arc::new(Ticket {
            identity: identity.to_string(),
            generation: self.next_generation.fetch_add(1, Ordering::Relaxed),
            added: Instant::now(),
        });
        let result = match self.queue_tx.try_send(ticket.clone()) {
            Ok(()) => {
                hosts.insert(
                    identity.to_string(),
                    Entry {
                        generation: ticket.generation,
                        added: ticket.added,
                        state: State::Queued,
                    },
                );
                Added::Queued
            }
            Err(_) => {
                warn!(
                    node = identity,
                    queued = self.queue_tx.len(),
                    capacity = QUEUE_CAPACITY,
                    "work queue is full, not adding the node; a later discovery retries it"
                );
                hosts.remove(identity);
                Added::QueueFull
            }
        };
        self.update_gauges(hosts.len());
        result
    }

    /// Whether [`Registry::add`] would queue `identity` now (it is unknown,
    /// or only an old queued entry): cheap, for deciding whether to confirm
    /// an event-announced node at all.
    pub fn would_queue(&self, identity: &str) -> bool {
        match self.hosts.lock().expect("registry lock").get(identity) {
            None => true,
            Some(e) => e.state == State::Queued && e.added.elapsed() >= self.interval,
        }
    }

    /// Whether `ticket` is still the registered generation of its host.
    pub fn is_current(&self, ticket: &Ticket) -> bool {
        self.hosts
            .lock()
            .expect("registry lock")
            .get(&ticket.identity)
            .is_some_and(|e| e.generation == ticket.generation)
    }

    /// Forgets the host now, if `ticket` is still its registration.
    pub fn remove(&self, ticket: &Ticket) {
        let mut hosts = self.hosts.lock().expect("registry lock");
        if hosts
            .get(&ticket.identity)
            .is_some_and(|e| e.generation == ticket.generation)
        {
            hosts.remove(&ticket.identity);
        }
        self.update_gauges(hosts.len());
    }

    /// Forgets a node still waiting in the queue: it announced its shutdown
    /// (e.g. restarted by a previous leader), so working it would only wait
    /// for replies that never come. A node being worked (our own restart
    /// makes it announce a shutdown) or held stays.
    pub fn forget_waiting(&self, identity: &str) -> bool {
        let mut hosts = self.hosts.lock().expect("registry lock");
        let forget = hosts
            .get(identity)
            .is_some_and(|e| e.state == State::Queued);
        if forget {
            hosts.remove(identity);
            self.update_gauges(hosts.len());
        }
        forget
    }

    /// Moves the ticket's registration to `state`, unless a newer
    /// registration replaced it.
    fn set_state(&self, ticket: &Ticket, state: State) {
        if let Some(e) = self
            .hosts
            .lock()
            .expect("registry lock")
            .get_mut(&ticket.identity)
            .filter(|e| e.generation == ticket.generation)
        {
            e.state = state;
        }
    }

    /// Forgets the host after `delay` (the finisher does it).
    pub fn remove_later(&self, ticket: Arc<Ticket>, delay: Duration) {
        self.set_state(&ticket, State::Held);
        if self.finisher.send((ticket.clone(), delay)).is_err() {
            self.remove(&ticket);
        }
    }

    /// Empties the registry and drains the queue (leadership lost). Workers
    /// holding a ticket find it no longer current.
    pub fn clear(&self) -> usize {
        let mut hosts = self.hosts.lock().expect("registry lock");
        let dropped = hosts.len();
        hosts.clear();
        while self.queue_rx.try_recv().is_ok() {}
        self.update_gauges(0);
        dropped
    }

    /// The next queued ticket; `None` once the queue is closed.
    pub async fn next(&self) -> Option<Arc<Ticket>> {
        let ticket = self.queue_rx.recv().await.ok()?;
        self.set_state(&ticket, State::Working);
        self.metrics.set_work_queue_entries(self.queue_rx.len());
        Some(ticket)
    }

    /// Wakes workers waiting in [`Registry::next`] with `None`.
    pub fn close_queue(&self) {
        self.queue_tx.close();
    }

    pub fn len(&self) -> usize {
        self.hosts.lock().expect("registry lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn queued(&self) -> usize {
        self.queue_rx.len()
    }

    fn update_gauges(&self, registered: usize) {
        self.metrics.set_waiting_nodes(registered);
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

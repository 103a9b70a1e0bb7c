//! The pause gate: whether this provisioner may work right now.
//!
//! Several independent parties can hold it closed at once — the election
//! (not the leader), the operator (`spec.paused`), shutdown — and it opens only
//! when none does. Every step that talks to nodes reads it: discovery, event
//! handling, each RPC and every retry attempt, the helper.
//!
//! The gate also counts leadership terms: every change of the election
//! reason (won or lost) starts a new term. A node's sequence remembers the
//! term it started in and stops at its next checkpoint once that term is
//! over, even when the gate is open again: after losing and at once
//! regaining leadership, a sequence from the old term must not carry on
//! beside the new term's sequence for the same node.

use crate::provision::metrics::Metrics;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

/// Why the gate is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseReason {
    /// Not (yet) the elected leader.
    Election = 1,
    /// Paused by the operator or a user.
    Requested = 2,
    /// The process is shutting down.
    Shutdown = 4,
}

impl PauseReason {
    const ALL: [PauseReason; 3] = [
        PauseReason::Election,
        PauseReason::Requested,
        PauseReason::Shutdown,
    ];

    fn name(self) -> &'static str {
        match self {
            PauseReason::Election => "not the leader",
            PauseReason::Requested => "paused on request",
            PauseReason::Shutdown => "shutting down",
        }
    }
}

/// Cheap to clone; all clones share one state.
#[derive(Clone)]
pub struct PauseGate {
    reasons: Arc<AtomicU8>,
    term: Arc<AtomicU64>,
    /// When the last term was lost (the election reason closed the gate).
    lost_at: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    changes: Arc<watch::Sender<bool>>,
    metrics: Arc<Metrics>,
}

impl PauseGate {
    /// An open gate.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        metrics.set_paused(false);
        let (tx, _) = watch::channel(false);
        PauseGate {
            reasons: Arc::new(AtomicU8::new(0)),
            term: Arc::new(AtomicU64::new(1)),
            lost_at: Arc::new(std::sync::Mutex::new(None)),
            changes: Arc::new(tx),
            metrics,
        }
    }

    /// Closes the gate for `reason` (idempotent).
    pub fn pause(&self, reason: PauseReason) {
        let before = self.reasons.fetch_or(reason as u8, Ordering::SeqCst);
        self.next_term_if_changed(reason, before);
        self.publish();
    }

    /// Lifts `reason`; the gate opens when no other reason holds it.
    pub fn resume(&self, reason: PauseReason) {
        let before = self.reasons.fetch_and(!(reason as u8), Ordering::SeqCst);
        self.next_term_if_changed(reason, before);
        self.publish();
    }

    /// A won or lost election starts a new term.
    fn next_term_if_changed(&self, reason: PauseReason, before: u8) {
        let after = self.reasons.load(Ordering::SeqCst);
        let bit = PauseReason::Election as u8;
        if reason == PauseReason::Election && (before ^ after) & bit != 0 {
            self.term.fetch_add(1, Ordering::SeqCst);
            let lost = (after & bit != 0).then(std::time::Instant::now);
            *self.lost_at.lock().unwrap_or_else(|e| e.into_inner()) = lost;
        }
    }

    /// For the end of work already done (a configured node's `restart`),
    /// begun in `term`: a requested pause and a shutdown let it go out, and
    /// so does the loss of that term within `grace` of it — less than
    /// another replica can take over in (the leader steps down before its
    /// record expires for the others), so the new leader never finds the
    /// node mid-sequence. A new term of ours, or a later end, stops it.
    pub fn check_finishing(&self, term: u64, grace: std::time::Duration) -> Result<(), Paused> {
        let bits = self.reasons.load(Ordering::SeqCst);
        let election = PauseReason::Election as u8;
        let others = PauseReason::Requested as u8 | PauseReason::Shutdown as u8;
        if bits & !(others | election) != 0 {
            return Err(Paused(self.reasons().join(", ")));
        }
        let now = self.term();
        if now == term && bits & election == 0 {
            return Ok(());
        }
        let just_lost = self
            .lost_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| t.elapsed() < grace);
        if now == term + 1 && bits & election != 0 && just_lost {
            return Ok(());
        }
        Err(Paused("the leadership term it started in is over".into()))
    }

    /// The current leadership term (see the module docs).
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::SeqCst)
    }

    /// [`PauseGate::check`] for work that began in `term`: also `Err` once
    /// that term is over.
    pub fn check_term(&self, term: u64) -> Result<(), Paused> {
        self.check_term_ignoring(term, &[])
    }

    /// [`PauseGate::check_term`] as if the reasons in `ignored` did not
    /// hold the gate.
    pub fn check_term_ignoring(&self, term: u64, ignored: &[PauseReason]) -> Result<(), Paused> {
        self.check_ignoring(ignored)?;
        if self.term() != term {
            return Err(Paused("the leadership term it started in is over".into()));
        }
        Ok(())
    }

    pub fn is_paused(&self) -> bool {
        self.reasons.load(Ordering::SeqCst) != 0
    }

    /// Why the gate is closed, for messages (empty when open).
    pub fn reasons(&self) -> Vec<&'static str> {
        let bits = self.reasons.load(Ordering::SeqCst);
        PauseReason::ALL
            .iter()
            .filter(|r| bits & (**r as u8) != 0)
            .map(|r| r.name())
            .collect()
    }

    /// `Err` naming why, when closed; for use with `?` at each checkpoint.
    pub fn check(&self) -> Result<(), Paused> {
        if self.is_paused() {
            Err(Paused(self.reasons().join(", ")))
        } else {
            Ok(())
        }
    }

    /// [`PauseGate::check`] as if the reasons in `ignored` did not hold the
    /// gate.
    pub fn check_ignoring(&self, ignored: &[PauseReason]) -> Result<(), Paused> {
        let mask = ignored.iter().fold(0u8, |m, r| m | *r as u8);
        if self.reasons.load(Ordering::SeqCst) & !mask != 0 {
            Err(Paused(self.reasons().join(", ")))
        } else {
            Ok(())
        }
    }

    /// A receiver that sees every open/closed change (true = paused).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.changes.subscribe()
    }

    fn publish(&self) {
        let paused = self.is_paused();
        self.metrics.set_paused(paused);
        self.changes.send_if_modified(|p| {
            let changed = *p != paused;
            *p = paused;
            changed
        });
    }
}

/// The gate was closed at a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("provisioning is paused ({0})")]
pub struct Paused(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    fn gate() -> PauseGate {
        PauseGate::new(Arc::new(Metrics::new("test")))
    }

    #[test]
    fn gate_opens_only_when_every_reason_is_lifted() {
        let g = gate();
        assert!(!g.is_paused());
        g.pause(PauseReason::Election);
        g.pause(PauseReason::Requested);
        g.resume(PauseReason::Election);
        assert!(g.is_paused(), "still paused on request");
        assert_eq!(g.reasons(), vec!["paused on request"]);
        g.resume(PauseReason::Requested);
        assert!(!g.is_paused());
        assert!(g.check().is_ok());
    }

    #[test]
    fn check_names_the_reason() {
        let g = gate();
        g.pause(PauseReason::Shutdown);
        assert_eq!(
            g.check().unwrap_err().to_string(),
            "provisioning is paused (shutting down)"
        );
    }

    #[test]
    fn check_ignoring_skips_only_the_named_reason() {
        let g = gate();
        g.pause(PauseReason::Shutdown);
        assert!(g.check().is_err());
        assert!(g.check_ignoring(&[PauseReason::Shutdown]).is_ok());
        g.pause(PauseReason::Requested);
        assert!(g.check_ignoring(&[PauseReason::Shutdown]).is_err());
        assert!(g
            .check_ignoring(&[PauseReason::Shutdown, PauseReason::Requested])
            .is_ok());
        g.pause(PauseReason::Election);
        assert!(g
            .check_ignoring(&[PauseReason::Shutdown, PauseReason::Requested])
            .is_err());
    }

    #[test]
    fn winning_or_losing_starts_a_new_term_and_ends_the_old_ones_work() {
        let g = gate();
        g.pause(PauseReason::Election);
        g.resume(PauseReason::Election);
        let term = g.term();
        assert!(g.check_term(term).is_ok());
        // Lost and at once won again: the gate is open, the term is over.
        g.pause(PauseReason::Election);
        g.resume(PauseReason::Election);
        assert!(!g.is_paused());
        let e = g.check_term(term).unwrap_err();
        assert!(e.to_string().contains("term it started in is over"), "{e}");
        assert!(g.check_term(g.term()).is_ok());
        // Other reasons and repeated calls do not end a term.
        let now = g.term();
        g.resume(PauseReason::Election);
        g.pause(PauseReason::Requested);
        g.resume(PauseReason::Requested);
        g.pause(PauseReason::Shutdown);
        assert_eq!(g.term(), now);
        assert!(g.check_term_ignoring(now, &[PauseReason::Shutdown]).is_ok());
    }

    #[tokio::test]
    async fn subscribers_see_changes() {
        let g = gate();
        let mut rx = g.subscribe();
        g.pause(PauseReason::Election);
        rx.changed().await.unwrap();
        assert!(*rx.borrow());
        g.resume(PauseReason::Election);
        rx.changed().await.unwrap();
        assert!(!*rx.borrow());
    }

    #[test]
    fn finishing_work_goes_through_a_pause_and_a_fresh_loss_only() {
        use std::time::Duration;
        let g = gate();
        let term = g.term();
        g.pause(PauseReason::Requested);
        assert!(g.check_finishing(term, Duration::ZERO).is_ok(), "a pause");
        g.resume(PauseReason::Requested);
        g.pause(PauseReason::Election);
        assert!(
            g.check_finishing(term, Duration::from_secs(60)).is_ok(),
            "lost just now"
        );
        assert!(
            g.check_finishing(term, Duration::ZERO).is_err(),
            "lost longer ago than the grace"
        );
        g.resume(PauseReason::Election);
        assert!(
            g.check_finishing(term, Duration::from_secs(60)).is_err(),
            "won again: a new term of ours may be working the node"
        );
    }
}

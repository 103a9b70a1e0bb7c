//! The election state machine, free of I/O and of the clock: every method takes
//! `now`, so tests drive it with synthetic instants.
//!
//! One rule set for every backend (client-go's): a follower campaigns every
//! retry period; a leader renews every renew period and steps down when no
//! renewal has succeeded for the renew deadline — even if nobody else took
//! over — so a partitioned leader stops working before its record expires for
//! the others. Errors never end the election: they back off and are reported.

use std::time::{Duration, Instant};

/// The election's timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// How often a follower campaigns.
    pub retry_period: Duration,
    /// How often the leader renews.
    pub renew_period: Duration,
    /// A leader without a successful renewal for this long steps down.
    pub renew_deadline: Duration,
}

/// What one campaign or renewal produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// We hold (or now hold) leadership.
    Leading,
    /// Someone else holds it (`None`: unknown who).
    Following(Option<String>),
}

/// A change the caller must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    Won,
    Lost(LossReason),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LossReason {
    /// The backend says another holds the record now.
    TakenOver(Option<String>),
    /// No renewal succeeded within the renew deadline.
    RenewDeadline(Duration),
    /// We gave it up (shutdown).
    Released,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossReason::TakenOver(Some(h)) => write!(f, "{h} holds the leadership now"),
            LossReason::TakenOver(None) => write!(f, "another candidate holds the leadership now"),
            LossReason::RenewDeadline(d) => {
                write!(f, "no renewal succeeded for {d:?} (the renew deadline)")
            }
            LossReason::Released => write!(f, "released on shutdown"),
        }
    }
}

#[derive(Debug)]
pub struct Machine {
    timings: Timings,
    leading: bool,
    last_renewal: Option<Instant>,
    /// Consecutive failed attempts (errors, not lost campaigns).
    errors: u32,
    leader: Option<String>,
}

impl Machine {
    pub fn new(timings: Timings) -> Self {
        Machine {
            timings,
            leading: false,
            last_renewal: None,
            errors: 0,
            leader: None,
        }
    }

    pub fn is_leader(&self) -> bool {
        self.leading
    }

    /// Who leads, as far as we know.
    pub fn leader(&self) -> Option<&str> {
        self.leader.as_deref()
    }

    /// Consecutive errors; non-zero means the election is failing right now.
    pub fn errors(&self) -> u32 {
        self.errors
    }

    /// Feeds the result of an attempt that started and ended at `now`.
    pub fn observe<E>(
        &mut self,
        now: Instant,
        result: &Result<Outcome, E>,
        me: &str,
    ) -> Option<Transition> {
        self.observe_attempt(now, now, result, me)
    }

    /// Feeds the result of a campaign (follower) or renewal (leader) that
    /// was sent at `started` and answered at `now`.
    ///
    /// A successful renewal counts from `started`, not from its answer: the
    /// store's expiry (a KV entry's TTL, a Lease's duration as others see
    /// it) runs from when it stored the write, which is after we sent it and
    /// may be long before its acknowledgement reached us. Counting from the
    /// answer would let a late acknowledgement stretch our belief past the
    /// real expiry, while a standby already won.
    pub fn observe_attempt<E>(
        &mut self,
        started: Instant,
        now: Instant,
        result: &Result<Outcome, E>,
        me: &str,
    ) -> Option<Transition> {
        match result {
            Ok(Outcome::Leading) => {
                self.errors = 0;
                self.last_renewal = Some(started);
                self.leader = Some(me.to_string());
                if self.leading {
                    // Renewed, but perhaps too late to count.
                    self.check_deadline(now)
                } else if now.saturating_duration_since(started) >= self.timings.renew_deadline {
                    // Won with an answer so late the win may be over already.
                    self.last_renewal = None;
                    self.leader = None;
                    None
                } else {
                    self.leading = true;
                    Some(Transition::Won)
                }
            }
            Ok(Outcome::Following(holder)) => {
                self.errors = 0;
                self.leader = holder.clone();
                if self.leading {
                    self.leading = false;
                    self.last_renewal = None;
                    Some(Transition::Lost(LossReason::TakenOver(holder.clone())))
                } else {
                    None
                }
            }
            Err(_) => {
                self.errors = self.errors.saturating_add(1);
                self.check_deadline(now)
            }
        }
    }

    /// Steps down when the renew deadline passed without a renewal; call it
    /// when waking up, since a hung backend call produces no result at all.
    pub fn check_deadline(&mut self, now: Instant) -> Option<Transition> {
        let last = self.last_renewal?;
        if self.leading && now.saturating_duration_since(last) >= self.timings.renew_deadline {
            self.leading = false;
            self.last_renewal = None;
            self.leader = None;
            return Some(Transition::Lost(LossReason::RenewDeadline(
                self.timings.renew_deadline,
            )));
        }
        None
    }

    /// Stops leading at once for `reason` (the watchdog saw the deadline
    /// pass by real time).
    pub fn step_down(&mut self, reason: LossReason) -> Option<Transition> {
        if !self.leading {
            return None;
        }
        self.leading = false;
        self.last_renewal = None;
        self.leader = None;
        Some(Transition::Lost(reason))
    }

    /// Leadership given up on shutdown.
    pub fn release(&mut self) -> Option<Transition> {
        if !self.leading {
            return None;
        }
        self.leading = false;
        self.last_renewal = None;
        self.leader = None;
        Some(Transition::Lost(LossReason::Released))
    }

    /// When to act next. A leader renews on its period but never sleeps past
    /// its deadline; errors back off (doubling, capped at four periods) so a
    /// broken backend is not hammered.
    pub fn next_attempt(&self, now: Instant) -> Instant {
        match (self.leading, self.last_renewal) {
            // A leader whose renewals fail keeps trying at its period so that
            // one success within the deadline keeps it leading.
            (true, Some(last)) => {
                (now + self.timings.renew_period).min(last + self.timings.renew_deadline)
            }
            _ => now + self.timings.retry_period * 2u32.saturating_pow(self.errors.min(2)),
        }
    }

    /// How long an attempt may take before it counts as failed: a leader's
    /// attempt must end before its deadline.
    pub fn attempt_timeout(&self, now: Instant) -> Duration {
        match (self.leading, self.last_renewal) {
            (true, Some(last)) => (last + self.timings.renew_deadline)
                .saturating_duration_since(now)
                .max(Duration::from_millis(100)),
            _ => self.timings.retry_period.max(Duration::from_secs(1)) * 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timings = Timings {
        retry_period: Duration::from_secs(2),
        renew_period: Duration::from_secs(2),
        renew_deadline: Duration::from_secs(10),
    };

    fn ok(o: Outcome) -> Result<Outcome, ()> {
        Ok(o)
    }

    #[test]
    fn a_successful_campaign_wins_once() {
        let t0 = Instant::now();
        let mut m = Machine::new(T);
        assert_eq!(
            m.observe(t0, &ok(Outcome::Following(Some("b".into()))), "a"),
            None
        );
        assert_eq!(m.leader(), Some("b"));
        assert_eq!(
            m.observe(t0, &ok(Outcome::Leading), "a"),
            Some(Transition::Won)
        );
        assert_eq!(
            m.observe(t0 + T.renew_period, &ok(Outcome::Leading), "a"),
            None
        );
        assert!(m.is_leader());
        assert_eq!(m.leader(), Some("a"));
    }

    #[test]
    fn a_leader_that_is_taken_over_loses_at_once() {
        let t0 = Instant::now();
        let mut m = Machine::new(T);
        m.observe(t0, &ok(Outcome::Leading), "a");
        assert_eq!(
            m.observe(
                t0 + Duration::from_secs(1),
                &ok(Outcome::Following(Some("b".into()))),
                "a"
            ),
            Some(Transition::Lost(LossReason::TakenOver(Some("b".into()))))
        );
        assert!(!m.is_leader());
    }

    #[test]
    fn a_leader_whose_renewals_fail_steps_down_at_the_deadline_not_before() {
        let t0 = Instant::now();
        let mut m = Machine::new(T);
        m.observe(t0, &ok(Outcome::Leading), "a");
        let err: Result<Outcome, ()> = Err(());
        assert_eq!(m.observe(t0 + Duration::from_secs(2), &err, "a"), None);
        assert_eq!(m.observe(t0 + Duration::from_secs(9), &err, "a"), None);
        assert!(m.is_leader(), "still inside the deadline");
        assert_eq!(m.errors(), 2);
        assert_eq!(
            m.observe(t0 + Duration::from_secs(10), &err, "a"),
            Some(Transition::Lost(LossReason::RenewDeadline(
                T.renew_deadline
            )))
        );
        assert!(!m.is_leader());
    }

    #[test]
    fn a_renewal_inside_the_deadline_resets_it() {
        let t0 = Instant::now();
        let mut m = Machine::new(T);
        m.observe(t0, &ok(Outcome::Leading), "a");
        m.observe(t0 + Duration::from_secs(8), &Err::<Outcome, ()>(()), "a");
        m.observe(t0 + Duration::from_secs(9), &ok(Outcome::Leading), "a");
        assert_eq!(m.errors(), 0);
        assert_eq!(m.check_deadline(t0 + Duration::from_secs(18)), None);
        assert!(m.check_deadline(t0 + Duration::from_secs(19)).is_some());
    }

    #[test]
    fn a_late_acknowledgement_counts_from_when_the_renewal_was_sent() {
        let t0 = Instant::now();
        let mut m = Machine::new(T);
        m.observe(t0, &ok(Outcome::Leading), "a");
        // Sent at 5 s, acknowledged at 9 s: the store's clock started at 5 s.
        let sent = t0 + Duration::from_secs(5);
        assert_eq!(
            m.observe_attempt(
                sent,
                t0 + Duration::from_secs(9),
                &ok(Outcome::Leading),
                "a"
            ),
            None
        );
        assert!(m.is_leader());
        assert_eq!(m.check_deadline(t0 + Duration::from_secs(14)), None);
        // 10 s after sending, not after the acknowledgement (19 s).
        assert!(m.check_deadline(t0 + Duration::from_secs(15)).is_some());
    }

    #[test]
    fn an_attempt_that_outlives_the_deadline_steps_down_even_if_it_succeeded() {
        let t0 = Instant::now();
        let mut m = Machine::new(T);
        m.observe(t0, &ok(Outcome::Leading), "a");
        // A renewal sent at 1 s whose answer took 12 s: by then the deadline
        // counted from the send is over too.
        let lost = m.observe_attempt(
            t0 + Duration::from_secs(1),
            t0 + Duration::from_secs(13),
            &ok(Outcome::Leading),
            "a",
        );
        assert!(matches!(
            lost,
            Some(Transition::Lost(LossReason::RenewDeadline(_)))
        ));
        assert!(!m.is_leader());
        // A campaign answered that late is not a win either.
        assert_eq!(
            m.observe_attempt(
                t0 + Duration::from_secs(20),
                t0 + Duration::from_secs(31),
                &ok(Outcome::Leading),
                "a"
            ),
            None
        );
        assert!(!m.is_leader());
    }

    #[test]
    fn a_hung_backend_is_caught_by_the_deadline_check() {
        let t0 = Instant::now();
        let mut m = Machine::new(T);
        m.observe(t0, &ok(Outcome::Leading), "a");
        // No result arrives at all; the driver checks on waking.
        assert!(m.check_deadline(t0 + T.renew_deadline).is_some());
    }

    #[test]
    fn the_leader_never_sleeps_past_its_deadline() {
        let t0 = Instant::now();
        let mut m = Machine::new(T);
        m.observe(t0, &ok(Outcome::Leading), "a");
        let now = t0 + Duration::from_secs(9);
        m.observe(now, &Err::<Outcome, ()>(()), "a");
        assert_eq!(m.next_attempt(now), t0 + T.renew_deadline);
        assert_eq!(m.attempt_timeout(now), Duration::from_secs(1));
    }

    #[test]
    fn follower_errors_back_off_and_recover() {
        let t0 = Instant::now();
        let mut m = Machine::new(T);
        assert_eq!(m.next_attempt(t0), t0 + T.retry_period);
        for _ in 0..5 {
            m.observe(t0, &Err::<Outcome, ()>(()), "a");
        }
        assert_eq!(
            m.next_attempt(t0),
            t0 + T.retry_period * 4,
            "capped backoff"
        );
        m.observe(t0, &ok(Outcome::Following(None)), "a");
        assert_eq!(m.errors(), 0);
        assert_eq!(m.next_attempt(t0), t0 + T.retry_period);
    }

    #[test]
    fn release_loses_only_when_leading() {
        let t0 = Instant::now();
        let mut m = Machine::new(T);
        assert_eq!(m.release(), None);
        m.observe(t0, &ok(Outcome::Leading), "a");
        assert_eq!(m.release(), Some(Transition::Lost(LossReason::Released)));
        assert!(!m.is_leader());
    }
}

//! Driving a backend that is set up: campaigns, renews, steps down,
//! releases. The rules are [`Machine`]'s; this file is the clock and the
//! I/O around them: when to attempt, how long an attempt may take, what
//! the watchdog says, and what the steer is told.

use super::machine::{self, LossReason, Machine, Transition};
use super::{watchdog, Backend, ElectionError, Steer, RELEASE_TIMEOUT};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// Drives a backend that is set up: campaigns, renews, steps down, releases.
pub async fn drive<B: Backend, S: Steer>(
    backend: B,
    steer: S,
    stop: CancellationToken,
    leader_tx: watch::Sender<Option<String>>,
) {
    let mut d = Driver::new(backend, steer, leader_tx);
    info!(election = %d.backend.describe(), identity = %d.me, "campaigning for leadership");
    let mut next = Instant::now();
    loop {
        match d.wait(next, &stop).await {
            Wake::Stop => break,
            Wake::Again => continue,
            Wake::Now => {
                next = Instant::now();
                continue;
            }
            Wake::Attempt => {}
        }
        next = match d.attempt(&stop).await {
            Some(at) => at,
            None => break,
        };
    }
    d.finish().await;
}

/// What the driver does next.
enum Wake {
    /// Attempt now (campaign or renew).
    Attempt,
    /// Handled something; wait for the same time again.
    Again,
    /// Stepped down; attempt at once.
    Now,
    Stop,
}

/// One backend's election: the rules, the watchdog, and what the steer
/// has been told.
struct Driver<B, S> {
    backend: B,
    steer: S,
    me: String,
    timings: machine::Timings,
    machine: Machine,
    watchdog: watchdog::Watchdog,
    /// A win we hold back from the steer until the previous holder stopped.
    pending_win: Option<Instant>,
    leader_tx: watch::Sender<Option<String>>,
}

impl<B: Backend, S: Steer> Driver<B, S> {
    fn new(backend: B, steer: S, leader_tx: watch::Sender<Option<String>>) -> Self {
        let timings = backend.timings();
        Driver {
            me: backend.identity().to_string(),
            machine: Machine::new(timings),
            watchdog: watchdog::Watchdog::start(timings.renew_deadline),
            timings,
            backend,
            steer,
            pending_win: None,
            leader_tx,
        }
    }

    /// Waits until the next attempt is due, or something comes first: a
    /// held-back win whose wait is over, an announced release, the
    /// watchdog, the stop.
    async fn wait(&mut self, next: Instant, stop: &CancellationToken) -> Wake {
        let leading = self.machine.is_leader();
        tokio::select! {
            _ = tokio::time::sleep_until(self.pending_win.unwrap_or(next)), if self.pending_win.is_some() => {
                self.pending_win = None;
                if self.machine.is_leader() {
                    self.steer.won(&self.me);
                }
                Wake::Again
            }
            _ = tokio::time::sleep_until(next) => Wake::Attempt,
            _ = self.backend.announcement(leading) => {
                if leading {
                    warn!(election = %self.backend.describe(), "someone announced a release of our record; renewing at once to find out whether we still lead");
                } else {
                    debug!("leadership was released; campaigning now");
                }
                Wake::Attempt
            }
            _ = self.watchdog.expired(), if leading => {
                self.clock_step_down();
                Wake::Now
            }
            _ = stop.cancelled() => Wake::Stop,
        }
    }

    /// One campaign or renewal, bounded by the machine's attempt timeout
    /// and cut short by the watchdog or the stop (`None`); its outcome is
    /// observed. Returns when to attempt next.
    async fn attempt(&mut self, stop: &CancellationToken) -> Option<Instant> {
        let now = Instant::now();
        if let Some(t) = self.machine.check_deadline(now.into_std()) {
            self.relay(&t);
        }
        let leading = self.machine.is_leader();
        let timeout = self.machine.attempt_timeout(now.into_std());
        // The renewal counts from here, when it is sent (see Machine::observe_attempt).
        let started = now.into_std();
        let sent_tick = self.watchdog.now();
        let backend = &mut self.backend;
        let attempt = async {
            if leading {
                backend.renew().await
            } else {
                backend.campaign().await
            }
        };
        let result = tokio::select! {
            r = tokio::time::timeout(timeout, attempt) => r.unwrap_or(Err(ElectionError::Timeout {
                what: if leading { "renewal" } else { "campaign" },
                timeout,
            })),
            _ = self.watchdog.expired(), if leading => {
                self.clock_step_down();
                return Some(Instant::now());
            }
            _ = stop.cancelled() => return None,
        };
        Some(self.observe(started, sent_tick, &result))
    }

    /// What an attempt's result means: the steer hears of failures and
    /// recoveries, the machine of the outcome, the watchdog of a renewal,
    /// the leader channel of who leads. Returns when to attempt next.
    fn observe(
        &mut self,
        started: std::time::Instant,
        sent_tick: u64,
        result: &Result<machine::Outcome, ElectionError>,
    ) -> Instant {
        let errors = self.machine.errors();
        match result {
            Err(e) => {
                self.steer.failed(&e.to_string());
                if errors == 0 {
                    error!(election = %self.backend.describe(), error = %e, "election attempt failed; retrying");
                } else {
                    warn!(election = %self.backend.describe(), error = %e, failures = errors + 1, "election still failing");
                }
            }
            Ok(_) => {
                if errors > 0 {
                    info!(election = %self.backend.describe(), "election works again");
                }
                self.steer.worked();
            }
        }
        let now = Instant::now().into_std();
        if let Some(t) = self.machine.observe_attempt(started, now, result, &self.me) {
            self.relay(&t);
        }
        if self.machine.is_leader() && result.is_ok() {
            self.watchdog.renewed(sent_tick);
        } else if !self.machine.is_leader() {
            self.watchdog.stand_down();
        }
        let leader = self.machine.leader().map(str::to_string);
        self.leader_tx.send_if_modified(|l| {
            let changed = *l != leader;
            *l = leader.clone();
            changed
        });
        Instant::from_std(self.machine.next_attempt(now))
    }

    /// At the stop: a leader stops working before giving the record away
    /// (the caller already stopped its workers), then releases it so a
    /// standby takes over at once.
    async fn finish(mut self) {
        if self.machine.is_leader() {
            if let Some(t) = self.machine.release() {
                self.relay(&t);
            }
            let describe = self.backend.describe();
            match tokio::time::timeout(RELEASE_TIMEOUT, self.backend.release()).await {
                Ok(Ok(())) => info!(election = %describe, "released leadership"),
                Ok(Err(e)) => {
                    self.steer
                        .failed(&format!("could not release leadership: {e}"));
                    warn!(election = %describe, error = %e, "could not release leadership; it expires instead");
                }
                Err(_) => {
                    warn!(election = %describe, "releasing leadership timed out; it expires instead")
                }
            }
            self.leader_tx.send_replace(None);
        }
        debug!("election stopped");
    }

    /// Tells the steer about a transition; a win the backend asks to hold
    /// back is told later (see [`Backend::settle`]), and a loss before then
    /// is not told at all (the steer never heard of the win).
    fn relay(&mut self, t: &Transition) {
        let me = &self.me;
        match t {
            Transition::Won => {
                let settle = self.backend.settle();
                if settle.is_zero() {
                    self.steer.won(me);
                } else {
                    warn!(identity = %me, wait = ?settle, "won a record deleted under its holder; waiting until that holder must have noticed before working");
                    self.pending_win = Some(Instant::now() + settle);
                }
            }
            Transition::Lost(reason) => {
                if self.pending_win.take().is_some() {
                    warn!(identity = %me, %reason, "lost leadership before starting to work");
                } else {
                    self.steer.lost(me, reason);
                }
            }
        }
    }

    /// The watchdog's count says the renew deadline passed since the last
    /// renewal was sent, whatever the monotonic clock says: step down now.
    fn clock_step_down(&mut self) {
        error!(
            deadline = ?self.timings.renew_deadline,
            "the renew deadline passed by real time but not by this process's clock (did the clock stall or go back?); stepping down"
        );
        let deadline = self.timings.renew_deadline;
        if let Some(t) = self.machine.step_down(LossReason::RenewDeadline(deadline)) {
            self.relay(&t);
        }
        self.watchdog.stand_down();
    }
}

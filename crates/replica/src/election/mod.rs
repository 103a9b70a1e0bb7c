//! Leader election: every replica starts paused and only the winner works.
//!
//! [`machine`] holds the rules (client-go's, for every backend); a backend
//! only performs one campaign, renewal or release against its store:
//! [`streams`] — the Choria Streams KV bucket Go provisioners use — or
//! [`lease`] — a Kubernetes Lease. [`run`] sets a backend up and drives it,
//! telling a [`Steer`] when leadership is won or lost and when attempts fail
//! or work: the provisioner (`provision::pipeline::leadership`) resumes and discovers
//! on winning and pauses and empties its queue on losing; the operator
//! follows a `watch` channel. Errors are retried with backoff and reported
//! through the steer (logs, counter, `/readyz`) — never a silent pause and
//! never a process exit.
//!
//! This module knows nothing of what it steers: it imports only `config`
//! (its settings), `k8s` (the Lease) and `backoff`.

mod driver;
pub mod lease;
pub mod machine;
pub mod shards;
pub mod streams;
pub mod watchdog;

pub use driver::drive;

use crate::backoff::Backoff;
use machine::{LossReason, Outcome, Timings};
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// The readiness check the election reports under.
pub const HEALTH_CHECK: &str = "election";
/// How long a release on shutdown may take.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    #[error("{0}")]
    Streams(#[from] streams::StreamsError),
    #[error("{0}")]
    Other(String),
    #[error("{what} did not finish within {timeout:?}")]
    Timeout {
        what: &'static str,
        timeout: Duration,
    },
}

/// One election store.
pub trait Backend: Send {
    /// For logs: `streams CHORIA_LEADER_ELECTION/provisioner`.
    fn describe(&self) -> String;
    fn identity(&self) -> &str;
    fn timings(&self) -> Timings;
    /// One attempt to become leader.
    fn campaign(&mut self) -> impl Future<Output = Result<Outcome, ElectionError>> + Send;
    /// One attempt to keep leadership.
    fn renew(&mut self) -> impl Future<Output = Result<Outcome, ElectionError>> + Send;
    /// Gives leadership up so a standby can take over at once.
    fn release(&mut self) -> impl Future<Output = Result<(), ElectionError>> + Send;
    /// Resolves when another instance announced a release of the record.
    /// A follower (`leading` false) then campaigns at once: leadership may
    /// be free. A leader did not release it, so the announcement is forged
    /// (or stale): it renews at once, and if a standby claimed the record
    /// on it, the leader learns of its loss within a round trip instead of
    /// at its next renewal.
    fn announcement(&mut self, leading: bool) -> impl Future<Output = ()> + Send {
        let _ = leading;
        std::future::pending()
    }
    /// Asked right after a win: how long to hold back before working,
    /// because the previous holder may not know yet that it lost (its
    /// record was deleted under it rather than released or expired).
    fn settle(&mut self) -> Duration {
        Duration::ZERO
    }
}

/// Who leads, for status reporting (the operator's `status.leader`).
pub type LeaderWatch = watch::Receiver<Option<String>>;

/// What an election steers. `me` is our identity, for logs.
pub trait Steer: Send {
    /// We lead now: start working.
    fn won(&self, me: &str);
    /// We no longer lead (taken over, renew deadline missed, or released):
    /// stop working.
    fn lost(&self, me: &str, reason: &LossReason);
    /// An election attempt failed; reported until one [`Steer::worked`].
    fn failed(&self, _error: &str) {}
    /// An election attempt worked.
    fn worked(&self) {}
}

/// A shared steer steers as what it shares (the provisioner hands its
/// election an `Arc` of what it steers).
impl<T: Steer + Sync + ?Sized> Steer for std::sync::Arc<T> {
    fn won(&self, me: &str) {
        (**self).won(me)
    }
    fn lost(&self, me: &str, reason: &LossReason) {
        (**self).lost(me, reason)
    }
    fn failed(&self, error: &str) {
        (**self).failed(error)
    }
    fn worked(&self) {
        (**self).worked()
    }
}

/// `true` while we lead: for callers that start and stop work themselves.
impl Steer for watch::Sender<bool> {
    fn won(&self, me: &str) {
        info!(identity = me, "became leader");
        self.send_replace(true);
    }

    fn lost(&self, me: &str, reason: &LossReason) {
        warn!(identity = me, %reason, "lost leadership");
        self.send_replace(false);
    }
}

/// How set-up failures are retried: from 1 s, doubling to 30 s.
const SETUP_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

/// Sets the backend up with `setup` — retried with backoff while it fails,
/// each failure reported through `steer` — then runs the election until
/// `stop` fires and releases leadership if held. The caller keeps itself
/// from working before [`Steer::won`] and cancels `stop` only once its work
/// has stopped, so the next leader never overlaps with it.
pub async fn run<B, S, F, Fut>(
    mut setup: F,
    steer: S,
    stop: CancellationToken,
    leader_tx: watch::Sender<Option<String>>,
) where
    B: Backend,
    S: Steer,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<B, ElectionError>>,
{
    let mut backoff = SETUP_BACKOFF;
    let backend = loop {
        let attempt = tokio::select! {
            r = setup() => r,
            _ = stop.cancelled() => return,
        };
        match attempt {
            Ok(b) => break b,
            Err(e) => {
                steer.failed(&format!("cannot set up the election: {e}"));
                error!(error = %e, "cannot set up the election; staying paused and retrying");
                if !backoff.wait(&stop).await {
                    return;
                }
            }
        }
    };
    steer.worked();
    drive(backend, steer, stop, leader_tx).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    /// Always wins; asks to settle `settle` after the win.
    struct Winner {
        settle: Duration,
    }

    impl Backend for Winner {
        fn describe(&self) -> String {
            "fake".into()
        }
        fn identity(&self) -> &str {
            "me"
        }
        fn timings(&self) -> Timings {
            Timings {
                retry_period: Duration::from_millis(100),
                renew_period: Duration::from_millis(100),
                renew_deadline: Duration::from_secs(5),
            }
        }
        async fn campaign(&mut self) -> Result<Outcome, ElectionError> {
            Ok(Outcome::Leading)
        }
        async fn renew(&mut self) -> Result<Outcome, ElectionError> {
            Ok(Outcome::Leading)
        }
        async fn release(&mut self) -> Result<(), ElectionError> {
            Ok(())
        }
        fn settle(&mut self) -> Duration {
            std::mem::take(&mut self.settle)
        }
    }

    /// What the steer was told, on tokio's clock.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<(tokio::time::Instant, &'static str)>>>);

    impl Steer for Seen {
        fn won(&self, _: &str) {
            self.0
                .lock()
                .unwrap()
                .push((tokio::time::Instant::now(), "won"));
        }
        fn lost(&self, _: &str, _: &LossReason) {
            self.0
                .lock()
                .unwrap()
                .push((tokio::time::Instant::now(), "lost"));
        }
    }

    async fn won_after(settle: Duration) -> Duration {
        let seen = Seen::default();
        let stop = CancellationToken::new();
        let (tx, _rx) = watch::channel(None);
        let t = tokio::time::Instant::now();
        let task = tokio::spawn(drive(Winner { settle }, seen.clone(), stop.clone(), tx));
        let deadline = Instant::now() + Duration::from_secs(5);
        while seen.0.lock().unwrap().is_empty() {
            assert!(Instant::now() < deadline, "never won");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.cancel();
        task.await.unwrap();
        let events = seen.0.lock().unwrap().clone();
        assert_eq!(events[0].1, "won");
        assert_eq!(events.last().unwrap().1, "lost", "released on stop");
        events[0].0 - t
    }

    /// On tokio's paused clock, which moves only when every task waits: a
    /// loaded machine's scheduling cannot stretch "at once", and the only
    /// rounding is the timer wheel's millisecond.
    #[tokio::test(start_paused = true)]
    async fn a_win_is_told_at_once_unless_the_backend_asks_to_settle() {
        let at_once = won_after(Duration::ZERO).await;
        assert!(at_once <= Duration::from_millis(1), "{at_once:?}");
        let held = won_after(Duration::from_millis(600)).await;
        assert!(
            held >= Duration::from_millis(600) && held <= Duration::from_millis(601),
            "{held:?}"
        );
    }
}

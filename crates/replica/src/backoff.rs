//! Exponential backoff for retry loops that wait on something outside
//! (the broker, the API server, a bucket): the first retry after `first`,
//! each next one twice as late, never later than `max`.
//!
//! The per-node RPC retries follow Go's `backoff.FiveSec` table instead
//! (`provision/host.rs`): that schedule is part of the compatibility.

use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug)]
pub struct Backoff {
    first: Duration,
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub const fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            next: first,
            max,
        }
    }

    /// The delay before the next retry; doubles the one after it.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// Back to the first delay, after a success.
    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// Sleeps for the next delay; `false` when `stop` fired first.
    pub async fn wait(&mut self, stop: &CancellationToken) -> bool {
        let delay = self.next_delay();
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = stop.cancelled() => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(3));
        let got: Vec<u64> = (0..5).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(got, [500, 1000, 2000, 3000, 3000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_gives_way_to_stop() {
        let stop = CancellationToken::new();
        let mut b = Backoff::new(Duration::from_secs(60), Duration::from_secs(60));
        assert!(b.wait(&stop).await, "slept the full delay");
        stop.cancel();
        let t = tokio::time::Instant::now();
        assert!(!b.wait(&stop).await);
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}

//! The reconnect fence: what keeps a replica's requests queued before a
//! connection loss from reaching nodes after another replica took over.
//!
//! The NATS client queues what it is handed and, when a connection drops,
//! sends what was still queued once it reconnects. For a leader cut off
//! from the broker that is seconds or minutes later, after it paused and a
//! standby started working the same nodes: a queued `configure` would land
//! inside the new leader's sequence. The client cannot drop its queue, but
//! a request carries its own expiry (its time plus its TTL, checked by
//! every Choria server). So a replica that loses leadership while it is
//! disconnected does not reconnect until every request it ever queued has
//! expired: whatever the client then sends is refused by the nodes as too
//! old. A replica that stays connected, or loses leadership after it is
//! back, has nothing queued that could arrive late, and is not fenced.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Added to the longest TTL sent: clocks of nodes and provisioner differ a
/// little, and a request's time is stamped before it is queued.
const MARGIN: Duration = Duration::from_secs(2);
/// The longest wait between reconnect attempts when not fenced (async-nats
/// doubles from 2 ms up to 4 s): short, so an attempt planned before the
/// fence went up happens before a standby can have started.
const MAX_RETRY: Duration = Duration::from_secs(1);

/// Shared by the connection (reconnect delays, connected or not), the
/// client (the TTLs it sends) and the leadership glue (a loss).
#[derive(Clone, Debug)]
pub struct Fence {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    base: Instant,
    /// Milliseconds after `base` before which no reconnect is made.
    until_ms: AtomicU64,
    connected: AtomicBool,
    /// The longest TTL (seconds) of any request handed to the client.
    max_ttl: AtomicI64,
}

impl Default for Fence {
    fn default() -> Self {
        Fence {
            inner: Arc::new(Inner {
                base: Instant::now(),
                until_ms: AtomicU64::new(0),
                connected: AtomicBool::new(true),
                max_ttl: AtomicI64::new(0),
            }),
        }
    }
}

impl Fence {
    /// A request with `ttl` seconds was handed to the client.
    pub fn sent(&self, ttl: i64) {
        self.inner.max_ttl.fetch_max(ttl, Ordering::Relaxed);
    }

    /// The connection went down (`false`) or came back (`true`).
    pub fn set_connected(&self, up: bool) {
        self.inner.connected.store(up, Ordering::Relaxed);
    }

    /// Leadership was lost at `now`: when disconnected, no reconnect until
    /// every request sent so far has expired. Returns how long that is.
    pub fn lost_leadership(&self, now: Instant) -> Option<Duration> {
        if self.inner.connected.load(Ordering::Relaxed) {
            return None;
        }
        let ttl = self.inner.max_ttl.load(Ordering::Relaxed);
        if ttl <= 0 {
            return None;
        }
        let hold = Duration::from_secs(ttl.unsigned_abs()) + MARGIN;
        let until = now.saturating_duration_since(self.inner.base) + hold;
        let ms = u64::try_from(until.as_millis()).unwrap_or(u64::MAX);
        self.inner.until_ms.fetch_max(ms, Ordering::Relaxed);
        Some(hold)
    }

    /// The wait before reconnect attempt `attempts` at `now`: async-nats's
    /// doubling, capped at [`MAX_RETRY`], or the rest of the fence.
    pub fn delay(&self, attempts: usize, now: Instant) -> Duration {
        let retry = if attempts <= 1 {
            Duration::ZERO
        } else {
            let exp = u32::try_from(attempts - 1).unwrap_or(u32::MAX);
            Duration::from_millis(2u64.saturating_pow(exp)).min(MAX_RETRY)
        };
        let until = Duration::from_millis(self.inner.until_ms.load(Ordering::Relaxed));
        let fenced = until.saturating_sub(now.saturating_duration_since(self.inner.base));
        retry.max(fenced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Equal to the millisecond the fence is kept in.
    fn about(got: Duration, want: Duration) {
        let off = got.abs_diff(want);
        assert!(off <= Duration::from_millis(1), "{got:?} is not {want:?}");
    }

    #[test]
    fn a_loss_while_disconnected_holds_reconnects_until_every_request_sent_expired() {
        let f = Fence::default();
        let t0 = Instant::now();
        f.sent(30);
        f.sent(3);
        f.set_connected(false);
        assert_eq!(f.lost_leadership(t0), Some(Duration::from_secs(32)));
        about(f.delay(1, t0), Duration::from_secs(32));
        let later = t0 + Duration::from_secs(31);
        about(f.delay(5, later), Duration::from_secs(1));
        // Over: back to the plain retry.
        let after = t0 + Duration::from_secs(40);
        assert_eq!(f.delay(1, after), Duration::ZERO);
        assert_eq!(f.delay(3, after), Duration::from_millis(4));
    }

    #[test]
    fn a_loss_while_connected_or_with_nothing_sent_is_not_fenced() {
        let f = Fence::default();
        let now = Instant::now();
        assert_eq!(f.lost_leadership(now), None, "nothing sent");
        f.sent(30);
        assert_eq!(f.lost_leadership(now), None, "connected");
        assert_eq!(f.delay(1, now), Duration::ZERO);
        assert_eq!(f.delay(20, now), MAX_RETRY);
    }
}

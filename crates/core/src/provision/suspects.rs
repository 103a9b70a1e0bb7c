//! What the provisioner does with input that is not what it asked for:
//! replies from someone other than the node asked, identities that are not
//! host names, CSRs that ask for more than the node's name. Each is counted
//! by kind and logged — a few lines per kind every [`LOG_WINDOW`], then a
//! count of what was left out, so a flood cannot flood the logs too.

use super::metrics::Metrics;
use choria_wire::identity::{self, IdentityError};
use choria_wire::replies::{Ignored, ReplyObserver};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::warn;

/// The window of the log limit.
pub const LOG_WINDOW: Duration = Duration::from_secs(10);
/// Lines per kind and window.
pub const LOG_BURST: u32 = 5;
/// Lines per kind and window about nodes that answered and then failed:
/// enough for every node of a real fleet's bad minute, not for every
/// made-up name of a flood.
pub const NODE_LOG_BURST: u32 = 50;

/// Allows [`LOG_BURST`] (or its own burst) lines per kind per
/// [`LOG_WINDOW`].
pub struct LogLimiter {
    kinds: Mutex<HashMap<&'static str, Window>>,
    burst: u32,
}

impl Default for LogLimiter {
    fn default() -> Self {
        Self::with_burst(LOG_BURST)
    }
}

struct Window {
    started: Instant,
    logged: u32,
    suppressed: u64,
}

/// What the limiter says about one line.
#[derive(Debug, PartialEq, Eq)]
pub enum Allow {
    /// Log it; `suppressed` lines of this kind were left out before it.
    Yes {
        suppressed: u64,
    },
    No,
}

impl LogLimiter {
    /// `burst` lines per kind and window.
    pub fn with_burst(burst: u32) -> Self {
        LogLimiter {
            kinds: Mutex::default(),
            burst,
        }
    }

    pub fn check(&self, kind: &'static str, now: Instant) -> Allow {
        let mut kinds = self
            .kinds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let w = kinds.entry(kind).or_insert(Window {
            started: now,
            logged: 0,
            suppressed: 0,
        });
        if now.duration_since(w.started) >= LOG_WINDOW {
            let suppressed = w.suppressed;
            *w = Window {
                started: now,
                logged: 1,
                suppressed: 0,
            };
            return Allow::Yes { suppressed };
        }
        if w.logged < self.burst {
            w.logged += 1;
            Allow::Yes { suppressed: 0 }
        } else {
            w.suppressed += 1;
            Allow::No
        }
    }
}

/// Counts and logs suspicious input; the provisioner's [`ReplyObserver`].
#[derive(Clone)]
pub struct Suspects {
    metrics: Arc<Metrics>,
    limiter: Arc<LogLimiter>,
}

impl Suspects {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Suspects {
            metrics,
            limiter: Arc::new(LogLimiter::default()),
        }
    }

    /// Whether to log a line of `kind` now; `Some(n)`: n were left out before.
    pub fn should_log(&self, kind: &'static str) -> Option<u64> {
        match self.limiter.check(kind, Instant::now()) {
            Allow::Yes { suppressed } => Some(suppressed),
            Allow::No => None,
        }
    }

    /// A startup event's identity failed validation.
    pub fn rejected_event_identity(&self, error: &IdentityError, raw: &str) {
        self.rejected_identity("event", error, raw);
    }
}

impl ReplyObserver for Suspects {
    fn ignored(&self, node: &str, rpc: &str, why: Ignored, claimed: Option<&str>) {
        self.metrics.ignored_reply(why.reason());
        let kind = match why {
            Ignored::OtherSender => "reply from another sender",
            Ignored::WrongRequest => "reply to another request",
            Ignored::Undecodable => "undecodable reply",
            Ignored::Duplicate => "repeated reply",
            Ignored::Overflow => "discovery overflow",
        };
        if let Some(suppressed) = self.should_log(kind) {
            let claimed = claimed.map(identity::shown).unwrap_or_default();
            warn!(
                node = %identity::shown(node),
                rpc,
                reason = why.reason(),
                claimed_sender = %claimed,
                suppressed_before = suppressed,
                "ignored a message on the reply subject: not the answer of the node asked"
            );
        }
    }

    fn batched(&self, rpc: &str, targets: usize) {
        self.metrics.signed_request(rpc, targets);
    }

    fn rejected_identity(&self, source: &str, error: &IdentityError, raw: &str) {
        let source = if source == "event" {
            "event"
        } else {
            "discovery"
        };
        self.metrics.rejected_identity(source);
        let kind = if source == "event" {
            "invalid identity in an event"
        } else {
            "invalid identity in discovery"
        };
        if let Some(suppressed) = self.should_log(kind) {
            warn!(
                source,
                error = %error,
                identity = %identity::preview(raw),
                suppressed_before = suppressed,
                "refused a node identity"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_per_kind_then_silence_then_a_count() {
        let l = LogLimiter::default();
        let t0 = Instant::now();
        for _ in 0..LOG_BURST {
            assert_eq!(l.check("a", t0), Allow::Yes { suppressed: 0 });
        }
        for _ in 0..100 {
            assert_eq!(l.check("a", t0 + Duration::from_secs(1)), Allow::No);
        }
        // Other kinds have their own budget.
        assert_eq!(l.check("b", t0), Allow::Yes { suppressed: 0 });
        assert_eq!(
            l.check("a", t0 + LOG_WINDOW),
            Allow::Yes { suppressed: 100 }
        );
        assert_eq!(l.check("a", t0 + LOG_WINDOW), Allow::Yes { suppressed: 0 });
    }

    #[test]
    fn every_kind_is_counted_under_its_label() {
        use crate::monitor::Exposition;
        let m = Arc::new(Metrics::new("t"));
        let s = Suspects::new(m.clone());
        for _ in 0..20 {
            s.ignored(
                "n1",
                "choria_provision#jwt",
                Ignored::OtherSender,
                Some("imp"),
            );
        }
        s.ignored("n1", "choria_provision#jwt", Ignored::WrongRequest, None);
        s.rejected_identity("discovery", &IdentityError::Empty, "");
        s.rejected_event_identity(&IdentityError::TooLong(9000), &"x".repeat(9000));
        let text = m.encode_text();
        for want in [
            "choria_provisioner_ignored_replies{reason=\"other_sender\",site=\"t\"} 20",
            "choria_provisioner_ignored_replies{reason=\"wrong_request\",site=\"t\"} 1",
            "choria_provisioner_ignored_replies{reason=\"undecodable\",site=\"t\"} 0",
            "choria_provisioner_rejected_identities{site=\"t\",source=\"discovery\"} 1",
            "choria_provisioner_rejected_identities{site=\"t\",source=\"event\"} 1",
        ] {
            assert!(text.lines().any(|l| l == want), "no {want:?} in\n{text}");
        }
    }
}

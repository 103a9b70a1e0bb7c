//! What each identity holds on record, for the sequence: when it was last
//! provisioned, when what it was issued expires, and whether renewal asked
//! it to come back. A node that comes back through provisioning while it
//! still holds valid credentials that renewal did not ask it to replace is
//! either reinstalled or someone else answering under its name
//! (`records.exclusive` refuses it; otherwise it is flagged).
//!
//! Fed from the verified records (the same watch renewal reads) and from
//! renewal's own requests; pure apart from the lock, every call takes `now`.
//! [`follow`] is the task that feeds it from the records.

pub mod follow;

use crate::records::Record;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// How long after renewal asks a node its coming back counts as asked for.
pub const ASKED_FOR: i64 = 3600;

/// One identity's standing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Standing {
    pub provisioned_unix: i64,
    /// When the earliest of what it was issued expires (0: nothing expires).
    pub expires_unix: i64,
    /// When renewal last asked it to reprovision (0: never).
    pub renewal_asked_unix: i64,
}

impl Standing {
    /// Whether it holds credentials still valid at `now` that renewal did
    /// not ask it to replace.
    pub fn holds_unasked(&self, now: i64) -> bool {
        let valid = self.expires_unix > now;
        let asked = self.renewal_asked_unix > 0 && now - self.renewal_asked_unix <= ASKED_FOR;
        valid && !asked
    }
}

#[derive(Clone, Default)]
pub struct Held {
    inner: Arc<RwLock<HashMap<String, Standing>>>,
    loaded: Arc<std::sync::atomic::AtomicBool>,
    on_load: Arc<tokio::sync::Notify>,
}

impl Held {
    /// Every record stored was read once.
    pub fn set_loaded(&self) {
        self.loaded
            .store(true, std::sync::atomic::Ordering::Release);
        self.on_load.notify_waiters();
    }

    /// Waits until the records were read once (or `limit` passed); whether
    /// they were.
    pub async fn wait_loaded(&self, limit: std::time::Duration) -> bool {
        let notified = self.on_load.notified();
        if self.loaded.load(std::sync::atomic::Ordering::Acquire) {
            return true;
        }
        let _ = tokio::time::timeout(limit, notified).await;
        self.loaded.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A verified record: newer than what is known replaces it.
    pub fn record(&self, r: &Record) {
        let expires = r.expiry().map_or(0, |(_, e)| e);
        let mut m = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let s = m.entry(r.identity.clone()).or_default();
        if r.time_unix >= s.provisioned_unix {
            s.provisioned_unix = r.time_unix;
            s.expires_unix = expires;
        }
        // Provisioned since renewal asked: the ask was answered.
        if s.renewal_asked_unix > 0 && r.time_unix >= s.renewal_asked_unix {
            s.renewal_asked_unix = 0;
        }
    }

    /// `identity` was configured: renewal's ask (if any) is answered, and a
    /// second arrival under the name is judged like any other.
    pub fn answered(&self, identity: &str) {
        let mut m = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = m.get_mut(identity) {
            s.renewal_asked_unix = 0;
        }
    }

    /// Renewal asked `identity` to reprovision at `now`.
    pub fn asked(&self, identity: &str, now: i64) {
        let mut m = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = m.get_mut(identity) {
            s.renewal_asked_unix = now;
        }
    }

    pub fn of(&self, identity: &str) -> Option<Standing> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(identity)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_credentials_not_asked_for_are_held_unasked() {
        let s = Standing {
            provisioned_unix: 100,
            expires_unix: 1_000,
            renewal_asked_unix: 0,
        };
        assert!(s.holds_unasked(500));
        assert!(!s.holds_unasked(1_000), "expired: nothing held");
        let asked = Standing {
            renewal_asked_unix: 400,
            ..s
        };
        assert!(!asked.holds_unasked(500), "renewal asked it back");
        let long = Standing {
            expires_unix: 100_000,
            ..asked
        };
        assert!(
            long.holds_unasked(400 + ASKED_FOR + 1),
            "an old request does not cover a much later return"
        );
        let nothing = Standing {
            expires_unix: 0,
            ..s
        };
        assert!(!nothing.holds_unasked(500), "nothing expiring was issued");
    }

    fn record(identity: &str, time_unix: i64) -> Record {
        Record {
            identity: identity.into(),
            time: String::new(),
            time_unix,
            replica: "r".into(),
            site: "s".into(),
            protocol: "v1".into(),
            mode: "helper".into(),
            signer: None,
            certificate: None,
            server_jwt: Some(crate::records::ServerJwtRecord {
                jti: "j".into(),
                issued_unix: time_unix,
                expires_unix: time_unix + 3600,
                collectives: vec!["c".into()],
            }),
            config_sha256: String::new(),
            provisioning_jwt_expires_unix: None,
        }
    }

    #[test]
    fn an_ask_covers_one_return_only() {
        let held = Held::default();
        held.record(&record("n1", 100));
        held.asked("n1", 200);
        assert!(!held.of("n1").unwrap().holds_unasked(210), "asked back");
        // Configured again: the ask is answered; a second arrival inside
        // the hour holds valid credentials nobody asked it to replace.
        held.answered("n1");
        assert!(held.of("n1").unwrap().holds_unasked(220));
        // The same when the new record arrives first.
        held.asked("n1", 300);
        held.record(&record("n1", 310));
        assert!(held.of("n1").unwrap().holds_unasked(320));
    }
}

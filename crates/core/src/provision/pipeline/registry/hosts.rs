//! The registrations behind the [`Registry`](super::Registry): one entry
//! per name with its generation and state, how many wait, and the bounded
//! memories of shutdown hints and recent failures.

use super::FAILURE_MEMORY;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One registration: its generation, when it was made, and where it is.
#[derive(Clone, Copy)]
pub(super) struct Entry {
    pub(super) generation: u64,
    pub(super) added: Instant,
    pub(super) state: State,
    /// A shutdown was announced while it was worked or held (our own
    /// restart announces one): a second is a repeat, ignored and counted.
    /// Kept here rather than as a hint, in the entry's padding: free.
    pub(super) shutdown_seen: bool,
}

// The flag above lives in padding: an entry stays 32 bytes on 64-bit Linux.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
const _: () = assert!(std::mem::size_of::<Entry>() == 32);

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Offered, waiting in its lane.
    Pending,
    /// Its sequence runs.
    Working,
    /// Done; held so repeated events do not queue it again.
    Held,
    /// Announced its shutdown and is restarting: discovery does not offer
    /// it again, its next `startup` event does.
    Restarting,
}

/// The registrations and how many of them are pending.
#[derive(Default)]
pub(super) struct Hosts {
    pub(super) entries: HashMap<String, Entry>,
    pub(super) pending: usize,
    /// When a `shutdown` event was last taken for each node: one is a
    /// hint taken at most once per [`Registry::hint_window`] (anyone may
    /// publish them, as often as they like).
    pub(super) hinted: HashMap<String, Instant>,
    /// When each name last failed (within [`FAILURE_MEMORY`]).
    pub(super) failed: HashMap<String, Instant>,
}

impl Hosts {
    pub(super) fn insert(&mut self, identity: &str, entry: Entry) {
        if entry.state == State::Pending {
            self.pending += 1;
        }
        if let Some(old) = self.entries.insert(identity.to_string(), entry) {
            self.forgot(old);
        }
    }

    pub(super) fn remove(&mut self, identity: &str) -> Option<Entry> {
        let old = self.entries.remove(identity)?;
        self.forgot(old);
        Some(old)
    }

    pub(super) fn set_state(&mut self, identity: &str, generation: u64, state: State) -> bool {
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

    pub(super) fn forgot(&mut self, old: Entry) {
        if old.state == State::Pending {
            self.pending -= 1;
        }
    }

    pub(super) fn clear(&mut self) -> usize {
        let n = self.entries.len();
        self.entries.clear();
        self.pending = 0;
        n
    }

    /// Takes a shutdown hint for `identity` at `now`, unless one was taken
    /// within `window` or too many are remembered; whether it was taken.
    pub(super) fn hint(
        &mut self,
        identity: &str,
        now: Instant,
        window: Duration,
        limit: usize,
    ) -> bool {
        if remembered(&self.hinted, identity, now, window) {
            return false;
        }
        remember(&mut self.hinted, identity, now, window, limit)
    }

    pub(super) fn failed_recently(&self, identity: &str, now: Instant) -> bool {
        remembered(&self.failed, identity, now, FAILURE_MEMORY)
    }
}

/// Whether `map` holds `key` from within `window` of `now`.
pub(super) fn remembered(
    map: &HashMap<String, Instant>,
    key: &str,
    now: Instant,
    window: Duration,
) -> bool {
    map.get(key)
        .is_some_and(|t| now.saturating_duration_since(*t) < window)
}

/// Remembers `key` at `now` in a map of at most `limit` (older than
/// `window` make room first); whether there was room.
pub(super) fn remember(
    map: &mut HashMap<String, Instant>,
    key: &str,
    now: Instant,
    window: Duration,
    limit: usize,
) -> bool {
    if map.len() >= limit && !map.contains_key(key) {
        map.retain(|_, t| now.saturating_duration_since(*t) < window);
        if map.len() >= limit {
            return false;
        }
    }
    map.insert(key.to_string(), now);
    true
}

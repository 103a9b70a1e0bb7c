//! Broadcast discovery: who answers a `ping` to the discovery agent within
//! the discovery window.

use super::{ChoriaClient, ClientError};
use crate::filter::Filter;
use crate::identity;
use crate::protocol;
use crate::replies::Ignored;
use crate::subjects;
use futures::StreamExt;
use std::time::{Duration, Instant};
use tracing::debug;

/// What one discovery round found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Discovered {
    /// Distinct valid names (at most `max_nodes`).
    pub nodes: usize,
    /// Replies were still arriving when the round's `timeout` ended it:
    /// there may be more nodes than it found.
    pub cut_short: bool,
}

/// Timing of broadcast discovery.
#[derive(Clone, Copy, Debug)]
pub struct DiscoveryOptions {
    /// The longest a discovery may take.
    pub timeout: Duration,
    /// End early once no reply arrived for this long (Go: 300 ms).
    pub sliding_window: Option<Duration>,
    /// Stop taking new nodes after this many (what the work queue can hold):
    /// a flood of made-up names must not grow the result without bound.
    pub max_nodes: usize,
}

impl Default for DiscoveryOptions {
    fn default() -> Self {
        // go-choria's broadcast discovery: 2 s overall, 300 ms after the last reply.
        DiscoveryOptions {
            timeout: Duration::from_secs(2),
            sliding_window: Some(Duration::from_millis(300)),
            max_nodes: 50_000,
        }
    }
}

fn name_hash(name: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // Fixed keys: stable within the process, no per-map randomness needed.
    let mut h =
        std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .build_hasher();
    h.write(name.as_bytes());
    h.finish()
}

impl ChoriaClient {
    /// Broadcast discovery of nodes matching `filter` (go-choria's broadcast
    /// discovery: a `ping` to the discovery agent, identities taken from the
    /// transport sender of each reply). Duplicates are removed.
    pub async fn discover(
        &self,
        filter: &Filter,
        opts: DiscoveryOptions,
    ) -> Result<Vec<String>, ClientError> {
        let mut found = Vec::new();
        self.discover_each(filter, opts, |n| found.push(n.to_string()))
            .await?;
        found.sort();
        Ok(found)
    }

    /// [`ChoriaClient::discover`], calling `on_found` once for each node as
    /// its reply arrives, so work can start before the discovery window
    /// closes. Names are told apart by a 64-bit hash (8 bytes per node
    /// instead of a copy of each name: a fleet of a million costs 8 MB); a
    /// collision would hide one node until the next round.
    pub async fn discover_each(
        &self,
        filter: &Filter,
        opts: DiscoveryOptions,
        mut on_found: impl FnMut(&str),
    ) -> Result<Discovered, ClientError> {
        let id = self.new_request_id();
        let reply_to = subjects::reply(&self.collective, &self.me.caller, &id);
        let msg = self.encode(
            &id,
            "discovery",
            filter,
            b"cGluZw==",
            &reply_to,
            opts.timeout,
        )?;
        let target = subjects::broadcast_agent(&self.collective, "discovery");
        let mut sub = self.publish_awaiting(&reply_to, target, msg).await?;

        let started = Instant::now();
        let hard_deadline = tokio::time::Instant::now() + opts.timeout;
        let mut window_deadline = hard_deadline;
        let mut found = std::collections::HashSet::new();
        let mut cut_short = false;
        loop {
            let deadline = window_deadline.min(hard_deadline);
            match tokio::time::timeout_at(deadline, sub.next()).await {
                Ok(Some(m)) => match protocol::transport_sender(&m.payload) {
                    Ok(sender) => {
                        if let Err(e) = identity::validate(&sender) {
                            self.rejected_identity("discovery", &e, &sender);
                        } else if !found.contains(&name_hash(&sender)) {
                            if found.len() >= opts.max_nodes {
                                self.ignored(&sender, "discovery", Ignored::Overflow, None);
                            } else {
                                on_found(&sender);
                                found.insert(name_hash(&sender));
                            }
                        }
                        if let Some(w) = opts.sliding_window {
                            window_deadline = tokio::time::Instant::now() + w;
                        }
                    }
                    Err(_) => self.ignored("", "discovery", Ignored::Undecodable, None),
                },
                Ok(None) => break,
                Err(_) => {
                    // The hard deadline came while replies still arrived
                    // (the sliding window had not closed).
                    cut_short = opts.sliding_window.is_some() && window_deadline > hard_deadline;
                    break;
                }
            }
        }
        let _ = sub.unsubscribe().await;
        debug!(found = found.len(), elapsed = ?started.elapsed(), cut_short, "discovery finished");
        Ok(Discovered {
            nodes: found.len(),
            cut_short,
        })
    }
}

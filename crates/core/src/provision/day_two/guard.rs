//! Watches the streams of what the provisioner remembers for what only
//! erasing does. A writer of the buckets cannot erase or roll back anything
//! ([`crate::records::ledger`]), but whoever may use the JetStream API on
//! them can delete a stream, lower its history or remove its protection:
//! not prevented by the stream (only by the broker's permissions), so seen
//! here, every [`EVERY`], and said loudly: a `SECURITY` log line,
//! `choria_provisioner_memory_erased{bucket}`, and the `memory` check of
//! `/readyz` failing until the process restarts.
//!
//! A replica that was running keeps what it read before (revocations are
//! never forgotten by a follower); one that starts after the erasure cannot
//! know, which is why the broker's permissions matter (the book's
//! "What survives what").

use crate::provision::metrics::Metrics;
use crate::records::ledger::{Ledger, View};
use choria_config::day_two::RecordsConfig;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

/// How often the streams are looked at.
pub const EVERY: Duration = Duration::from_secs(10);
/// The `/readyz` check an erasure fails.
pub const HEALTH_CHECK: &str = "memory";

/// One bucket to watch: its name and its label in the metrics.
pub struct Watched {
    pub bucket: String,
    pub label: &'static str,
}

/// Watches `buckets` until `stop`; `erased` is told why, each time one is
/// found erased (the caller fails `/readyz` with it).
pub async fn watch(
    records: RecordsConfig,
    buckets: Vec<Watched>,
    name: String,
    metrics: Arc<Metrics>,
    erased: impl Fn(String) + Send + 'static,
    stop: CancellationToken,
) {
    let mut open: HashMap<String, Ledger> = HashMap::new();
    let mut first: HashMap<String, View> = HashMap::new();
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        for w in &buckets {
            if !open.contains_key(&w.bucket) {
                match Ledger::existing(&records, &w.bucket, &name).await {
                    Ok(l) => {
                        open.insert(w.bucket.clone(), l);
                    }
                    // Not there yet, or not reachable now: its readers say so.
                    Err(e) => {
                        debug!(bucket = %w.bucket, error = %e, "not watching the bucket yet");
                        continue;
                    }
                }
            }
            let now = match open[&w.bucket].view().await {
                Ok(now) => now,
                // Not reachable now: its readers say so.
                Err(_) => continue,
            };
            let Some(before) = first.get(&w.bucket) else {
                if let Some(now) = now {
                    info!(bucket = %w.bucket, "watching the bucket: a deletion or a loss of its values will be reported");
                    first.insert(w.bucket.clone(), now);
                }
                continue;
            };
            let why = match &now {
                Some(now) => now.erased_since(before),
                None => Some("the stream was deleted: everything it held is gone".into()),
            };
            if let Some(why) = why {
                error!(bucket = %w.bucket, "SECURITY: what the provisioner remembers was erased: {why}; only a client allowed the JetStream API can do this (see the book's What survives what)");
                metrics.memory_erased(w.label);
                erased(format!("bucket {} erased: {why}", w.bucket));
                // Told once; what is there now is the new baseline.
                match now {
                    Some(now) => first.insert(w.bucket.clone(), now),
                    None => first.remove(&w.bucket),
                };
            }
        }
    }
}

//! Writes a record of every provisioning (see [`crate::records`]) from a
//! task of its own: a worker hands its record over and goes on, and a slow
//! or absent records store never holds provisioning up. Records that cannot
//! be written yet wait (a bounded number; past that the oldest are dropped,
//! counted) and are retried with backoff.

use crate::backoff::Backoff;
use crate::provision::metrics::Metrics;
use crate::records::sealed::Sealer;
use crate::records::store::RecordStore;
use crate::records::Record;
use choria_config::day_two::RecordsConfig;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// Records waiting to be written, at most.
pub const WAITING_LIMIT: usize = 100_000;

/// Where workers hand records to; does nothing without `records:`.
#[derive(Clone)]
pub struct Recorder {
    tx: Option<mpsc::UnboundedSender<Record>>,
}

impl Recorder {
    /// A recorder that records nothing.
    pub fn off() -> Self {
        Recorder { tx: None }
    }

    /// A recorder and the receiver its task ([`run`]) takes.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<Record>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Recorder { tx: Some(tx) }, rx)
    }

    pub fn record(&self, record: Record) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(record);
        }
    }
}

/// Connects (retrying), then writes every record handed over until `stop`.
pub async fn run(
    cfg: RecordsConfig,
    sealer: Sealer,
    name: String,
    mut rx: mpsc::UnboundedReceiver<Record>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut waiting: VecDeque<Record> = VecDeque::new();
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let mut store: Option<RecordStore> = None;
    loop {
        // Take what arrived, keeping at most WAITING_LIMIT.
        while let Ok(r) = rx.try_recv() {
            waiting.push_back(r);
        }
        while waiting.len() > WAITING_LIMIT {
            waiting.pop_front();
            metrics.record_dropped();
        }
        if waiting.is_empty() {
            tokio::select! {
                r = rx.recv() => match r {
                    Some(r) => { waiting.push_back(r); continue; }
                    None => return,
                },
                _ = stop.cancelled() => return,
            }
        }
        if stop.is_cancelled() {
            return give_up(&mut waiting, &metrics);
        }
        if store.is_none() {
            match RecordStore::connect(&cfg, sealer.clone(), &name).await {
                Ok(s) => {
                    info!(bucket = s.bucket(), "writing records");
                    backoff.reset();
                    store = Some(s);
                }
                Err(e) => {
                    metrics.record_error();
                    warn!(error = %e, waiting = waiting.len(), "cannot reach the records store; retrying");
                    if !backoff.wait(&stop).await {
                        return give_up(&mut waiting, &metrics);
                    }
                    continue;
                }
            }
        }
        let Some(s) = &store else { continue };
        let record = waiting.front().expect("not empty");
        match s.put(record).await {
            Ok(revision) => {
                debug!(node = %record.identity, revision, "recorded");
                metrics.record_written();
                waiting.pop_front();
                backoff.reset();
            }
            Err(e) => {
                metrics.record_error();
                warn!(error = %e, waiting = waiting.len(), "could not write a record; retrying");
                if !backoff.wait(&stop).await {
                    return give_up(&mut waiting, &metrics);
                }
            }
        }
    }
}

/// Stopping with records not written yet: each is counted as dropped and
/// the log says how many, so none goes missing unseen.
fn give_up(waiting: &mut VecDeque<Record>, metrics: &Metrics) {
    if waiting.is_empty() {
        return;
    }
    let n = waiting.len();
    for _ in waiting.drain(..) {
        metrics.record_dropped();
    }
    error!(
        records = n,
        "stopping with records not written; counted as dropped"
    );
}

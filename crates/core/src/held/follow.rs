//! Follows the verified records into the [`Held`] set: what each identity
//! holds, for the sequence's check of a node that comes back while its
//! credentials are still good (see [`super`]).

use super::Held;
use crate::backoff::Backoff;
use crate::records::sealed::{Read, Sealer};
use crate::records::store::RecordStore;
use choria_config::day_two::RecordsConfig;
use futures::StreamExt;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::debug;

pub async fn follow(
    records: RecordsConfig,
    sealer: Sealer,
    held: Held,
    name: String,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    loop {
        let watch = match RecordStore::connect(&records, sealer.clone(), &name).await {
            // What is stored now, then what comes: the sequence waits for
            // the first part before it judges a node.
            Ok(store) => match store.all().await {
                Ok(now) => {
                    for read in now {
                        if let Read::Verified(r) = read {
                            held.record(&r);
                        }
                    }
                    held.set_loaded();
                    store.watch().await
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match watch {
            Ok(mut reads) => {
                backoff.reset();
                loop {
                    let read = tokio::select! {
                        r = reads.next() => r,
                        _ = stop.cancelled() => return,
                    };
                    match read {
                        Some(Read::Verified(r)) => held.record(&r),
                        Some(_) => {}
                        None => break,
                    }
                }
            }
            Err(e) => {
                debug!(error = %e, "cannot follow the records for held credentials; retrying")
            }
        }
        if !backoff.wait(&stop).await {
            return;
        }
    }
}

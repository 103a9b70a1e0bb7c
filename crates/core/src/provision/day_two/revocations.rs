//! Follows the revocations' bucket into [`Shared::revoked`], reconnecting
//! with backoff, and keeps `choria_provisioner_revocations` current.

use crate::backoff::Backoff;
use crate::provision::shared::Shared;
use crate::records::revocations::RevocationStore;
use choria_config::day_two::RecordsConfig;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

pub async fn follow(records: RecordsConfig, shared: Arc<Shared>, stop: CancellationToken) {
    let Some(revoked) = shared.revoked.clone() else {
        return;
    };
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let gauge = {
        let (revoked, metrics, stop) = (revoked.clone(), shared.metrics.clone(), stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => metrics.set_revocations(revoked.count()),
                    _ = stop.cancelled() => return,
                }
            }
        })
    };
    loop {
        let store = match crate::records::store::seal_keys(&records) {
            Ok((key, verifier)) => {
                let name = format!("choria-provisioner revocations {}", shared.me);
                RevocationStore::connect(&records, key, verifier, &shared.cfg.site, &name).await
            }
            Err(e) => Err(e),
        };
        let result = match store {
            Ok(store) => {
                backoff.reset();
                debug!("following the revocations");
                store
                    .follow(
                        &revoked,
                        || shared.metrics.record_refused("signature"),
                        stop.clone(),
                    )
                    .await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => break,
            // The bucket is someone else's to make (`create_bucket: false`)
            // and is not there: nothing is revoked. Said loudly, and looked
            // for again, rather than holding every node back.
            Err(e @ crate::records::store::RecordsError::Bucket { .. })
                if !records.create_bucket =>
            {
                revoked.set_loaded();
                warn!(error = %e, "no revocations bucket and records.create_bucket is false: nothing can be revoked until it is created");
                if !backoff.wait(&stop).await {
                    break;
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot read the revocations; retrying (nodes wait until they are read)");
                if !backoff.wait(&stop).await {
                    break;
                }
            }
        }
    }
    gauge.abort();
}

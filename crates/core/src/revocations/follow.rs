//! Follows the revocations' bucket into the revoked set the sequences and
//! renewal read ([`Revoked`]), reconnecting
//! with backoff, and keeps `choria_provisioner_revocations` and the
//! `revocations` check of `/readyz` current.
//!
//! A read that fails never reads as "nothing revoked": until the bucket is
//! read again to its end, the set is marked unknown and sequences hold
//! their nodes (refused as `RevocationsUnknown` after a wait, retried like
//! any failure). Only a bucket known to be missing, with
//! `records.create_bucket: false`, means no revocations, and says so.

use super::{RevocationStore, Revoked};
use crate::backoff::Backoff;
use crate::monitor::Health;
use crate::provision::metrics::Metrics;
use crate::records::store::RecordsError;
use choria_config::day_two::RecordsConfig;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

/// The `/readyz` check this follower keeps.
pub const HEALTH_CHECK: &str = "revocations";

/// What following the revocations keeps current, and under which names.
pub struct Follower {
    /// The set the sequences and renewal read.
    pub revoked: Revoked,
    /// The site the revocations are sealed for.
    pub site: String,
    /// The connection's name.
    pub name: String,
    pub metrics: Arc<Metrics>,
    pub health: Health,
}

pub async fn follow(records: RecordsConfig, follower: Follower, stop: CancellationToken) {
    let Follower {
        revoked,
        site,
        name,
        metrics,
        health,
    } = follower;
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    // Why the revocations are not known now, for `/readyz`.
    let why: Arc<Mutex<String>> = Arc::new(Mutex::new("not read yet".into()));
    let gauge = {
        let (revoked, metrics, stop, why) =
            (revoked.clone(), metrics.clone(), stop.clone(), why.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        metrics.set_revocations(revoked.count());
                        let state = if revoked.is_loaded() {
                            Ok(())
                        } else {
                            Err(format!("the revocations are not known: {}; nodes are held until they are", why.lock().unwrap_or_else(|e| e.into_inner())))
                        };
                        health.set(HEALTH_CHECK, state);
                    }
                    _ = stop.cancelled() => return,
                }
            }
        })
    };
    loop {
        let store = match crate::records::store::seal_keys(&records) {
            Ok((key, verifier)) => {
                RevocationStore::connect(&records, key, verifier, &site, &name).await
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
                        || metrics.record_refused("signature"),
                        stop.clone(),
                    )
                    .await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => break,
            // The bucket is someone else's to make (`create_bucket: false`)
            // and is known not to be there: nothing is revoked. Said
            // loudly, and looked for again, rather than holding every node.
            Err(e @ RecordsError::Missing { .. }) if !records.create_bucket => {
                revoked.set_loaded();
                error!(error = %e, "no revocations bucket and records.create_bucket is false: nothing can be revoked until it is created");
            }
            // Anything else (a timeout, JetStream away, a permission, an
            // unprotected bucket): not known, so nodes are held.
            Err(e) => {
                revoked.set_unknown();
                metrics.memory_read_error("revocations");
                *why.lock().unwrap_or_else(|e| e.into_inner()) = e.to_string();
                warn!(error = %e, "cannot read the revocations; retrying (nodes are held until they are read)");
            }
        }
        if !backoff.wait(&stop).await {
            break;
        }
    }
    gauge.abort();
}

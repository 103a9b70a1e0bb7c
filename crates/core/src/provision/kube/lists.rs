//! The resource's lists, applied by one replica: `spec.revocations` into
//! the revocations' bucket ([`crate::revocations::listed`] plans each
//! write) and `spec.bindings` into the names' bucket
//! ([`crate::bindings::listed`]). The leader applies them, or in shards
//! mode the first member by name ([`applies_lists`]), in rounds: each new
//! version of the resource, and every [`REAPPLY`](super::REAPPLY).

use super::{applies_lists, Link, Rounds};
use crate::audit::event::Kind;
use crate::revocations::{listed, RevocationStore};
use choria_config::day_two::RecordsConfig;
use choria_k8s::crd::{BoundNode, Provisioner, ResourceRef};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Applies `spec.revocations` while this replica works, until `stop`.
pub async fn revocations(
    resource: ResourceRef,
    records: RecordsConfig,
    link: Arc<Link>,
    seen: watch::Receiver<Option<Arc<Provisioner>>>,
    stop: CancellationToken,
) {
    let Some(revoked) = link.revoked.clone() else {
        return;
    };
    let writer = listed::writer(&resource);
    let mut backoff =
        crate::backoff::Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let store = loop {
        let store = match crate::records::store::seal_keys(&records) {
            Ok((key, verifier)) => {
                let name = format!("choria-provisioner spec.revocations {}", link.me);
                RevocationStore::connect(&records, key, verifier, &link.site, &name).await
            }
            Err(e) => Err(e),
        };
        match store {
            Ok(s) => break s,
            Err(e) => {
                warn!(%resource, error = %e, "cannot open the revocations to apply spec.revocations; retrying");
                if !backoff.wait(&stop).await {
                    return;
                }
            }
        }
    };
    let mut rounds = Rounds::new(seen, stop);
    while let Ok(seen) = rounds.next().await {
        // Until the bucket was read, "not revoked" means "not known yet".
        if !applies_lists(&link) || !revoked.is_loaded() {
            continue;
        }
        let Some(p) = seen else {
            continue;
        };
        let writes = listed::plan(
            &p.spec.revocations,
            &revoked.all(),
            &writer,
            &link.site,
            &listed::Now::current(),
        );
        let mut lifted = false;
        for r in writes {
            let node = r.identity.clone();
            match listed::write_if_still_due(&store, &p.spec.revocations, &writer, &link.site, r)
                .await
            {
                Ok(None) => {}
                Ok(Some(r)) => {
                    if r.revoked {
                        info!(%resource, node = %r.identity, reason = %r.reason, "revoked by spec.revocations");
                    } else {
                        info!(%resource, node = %r.identity, "lifted: no longer in spec.revocations");
                        lifted = true;
                    }
                    revoked.set(r);
                }
                Err(e) => {
                    warn!(%resource, %node, error = %e, "could not write a revocation of spec.revocations; trying again");
                    break;
                }
            }
        }
        // A lifted node waits among the failed names; look for it now
        // rather than at the next interval.
        if lifted {
            link.steering.trigger_discovery();
        }
        debug!(%resource, "spec.revocations applied");
    }
}

/// Applies `spec.bindings` while this replica works, until `stop`.
pub async fn bindings(
    resource: ResourceRef,
    link: Arc<Link>,
    seen: watch::Receiver<Option<Arc<Provisioner>>>,
    stop: CancellationToken,
) {
    let writer = crate::revocations::listed::writer(&resource);
    let mut rounds = Rounds::new(seen, stop);
    while let Ok(seen) = rounds.next().await {
        let Some(p) = seen else {
            continue;
        };
        if p.spec.bindings.is_empty() || !applies_lists(&link) {
            continue;
        }
        match apply_once(&p.spec.bindings, &link, &writer).await {
            Ok(0) => debug!(%resource, "spec.bindings applied"),
            Ok(_) => link.steering.trigger_discovery(),
            Err(e) => {
                warn!(%resource, error = %e, "could not apply spec.bindings; trying again")
            }
        }
    }
}

/// One pass: reads each listed name's word and writes those the plan
/// says; how many were written.
async fn apply_once(listed: &[BoundNode], link: &Link, writer: &str) -> Result<usize, String> {
    let names = match &link.evidence {
        Some(gate) => gate.names().await.map_err(|e| e.to_string())?,
        None => None,
    };
    let Some(names) = names else {
        return Err("no instance bindings here: spec.bindings needs spec.evidence with one identity per instance".into());
    };
    let mut current = HashMap::new();
    for b in listed {
        if choria_wire::identity::validate(&b.identity).is_ok() {
            let word = names.word(&b.identity).await.map_err(|e| e.to_string())?;
            current.insert(b.identity.clone(), word);
        }
    }
    let due = crate::bindings::listed::plan(listed, &current);
    for b in &due {
        let reason = crate::provision::text::one_line(&b.reason, 500);
        let now = chrono::Utc::now().timestamp();
        let word = names
            .rebind(&b.identity, &b.instance, writer, &reason, now)
            .await
            .map_err(|e| e.to_string())?;
        info!(node = %b.identity, instance = %b.instance, %reason, "bound by spec.bindings");
        link.auditor.event(
            Kind::Rebound,
            &b.identity,
            serde_json::json!({"step": "rebind", "reason": format!("{reason} (instance {}, {writer})", b.instance), "n": word.n}),
        );
    }
    Ok(due.len())
}

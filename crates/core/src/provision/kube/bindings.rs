//! `spec.bindings`: names held to a cloud instance through the
//! `Provisioner` resource.
//!
//! The pods write each listed name's binding as `choria-provisioner rebind
//! --instance` does (a sealed, numbered word in `<records.bucket>_NAMES`):
//! the operator cannot, it holds no key. While a name is listed it is held
//! to its instance: a binding written meanwhile by hand or by another
//! instance's node is overwritten at the next reapplication. A name that
//! leaves the list stays where it is: the binding is the node's from then
//! on, as one made by hand is.
//!
//! The same replica applies this list as `spec.revocations`
//! ([`super::applies_lists`]).

use super::Link;
use crate::audit::event::Kind;
use crate::evidence::bindings::Binding;
use choria_k8s::crd::{BoundNode, Provisioner, ResourceRef};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The listed names whose binding is not the list's: those to write.
/// `current` is each listed name's word now (`None`: never bound). A name
/// or instance the API server's rules would refuse is skipped.
pub fn plan<'a>(
    listed: &'a [BoundNode],
    current: &HashMap<String, Option<Binding>>,
) -> Vec<&'a BoundNode> {
    listed
        .iter()
        .filter(|b| {
            choria_wire::identity::validate(&b.identity).is_ok()
                && choria_k8s::crd::is_instance(&b.instance)
        })
        .filter(|b| {
            current
                .get(&b.identity)
                .and_then(|w| w.as_ref())
                .is_none_or(|w| w.instance != b.instance)
        })
        .collect()
}

/// Applies the resource's list while this replica works, until `stop`.
pub async fn apply(
    resource: ResourceRef,
    link: Arc<Link>,
    seen: watch::Receiver<Option<Arc<Provisioner>>>,
    stop: CancellationToken,
) {
    let writer = super::revocations::writer(&resource);
    let mut rounds = super::Rounds::new(seen, stop);
    while let Ok(seen) = rounds.next().await {
        let Some(p) = seen else {
            continue;
        };
        if p.spec.bindings.is_empty() || !super::applies_lists(&link) {
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
    let due = plan(listed, &current);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(items: &[(&str, &str)]) -> Vec<BoundNode> {
        items
            .iter()
            .map(|(identity, instance)| BoundNode {
                identity: identity.to_string(),
                instance: instance.to_string(),
                reason: "replaced".into(),
            })
            .collect()
    }

    fn word(identity: &str, instance: &str) -> Option<Binding> {
        Some(Binding {
            instance: instance.into(),
            identity: identity.into(),
            time: String::new(),
            time_unix: 0,
            site: "s".into(),
            n: 1,
            by: String::new(),
            reason: String::new(),
        })
    }

    #[test]
    fn a_name_bound_elsewhere_freed_or_never_bound_is_written_and_one_in_place_is_not() {
        let list = listed(&[
            ("web-1", "aws.1.i-b"),
            ("web-2", "aws.1.i-c"),
            ("web-3", "aws.1.i-d"),
            ("web-4", "aws.1.i-e"),
        ]);
        let current = HashMap::from([
            ("web-1".to_string(), word("web-1", "aws.1.i-a")),
            ("web-2".to_string(), word("web-2", "aws.1.i-c")),
            ("web-3".to_string(), word("web-3", "")),
            ("web-4".to_string(), None),
        ]);
        let due: Vec<&str> = plan(&list, &current)
            .iter()
            .map(|b| b.identity.as_str())
            .collect();
        assert_eq!(due, ["web-1", "web-3", "web-4"]);
    }

    #[test]
    fn what_the_api_server_would_refuse_is_skipped() {
        let list = listed(&[
            ("web-*", "aws.1.i-b"),
            ("web-1", "aws.1.>"),
            ("web-2", "i-b"),
        ]);
        assert!(plan(&list, &HashMap::new()).is_empty());
    }
}

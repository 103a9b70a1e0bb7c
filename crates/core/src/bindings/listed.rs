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
//! (`provision::kube::lists`).

use super::Binding;
use choria_k8s::crd::BoundNode;
use std::collections::HashMap;

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

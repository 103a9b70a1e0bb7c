//! The bodies of status writes to a `Provisioner`, typed, for both sides:
//! a server-side apply of the status fields one field manager owns (the
//! operator's conditions and counts, a pod's leader and provisioned count,
//! a member's entry), and the merge patch that prunes `status.members`.
//!
//! With server-side apply a field the manager owned and leaves out is
//! removed, so every field of [`ProvisionerStatus`] is left out when unset:
//! a body says exactly what its manager owns.

use super::{Member, ProvisionerStatus, API_VERSION, KIND};
use serde::Serialize;

/// A server-side apply of `status`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusApply {
    api_version: &'static str,
    kind: &'static str,
    #[serde(skip_serializing_if = "Meta::is_empty")]
    metadata: Meta,
    pub status: ProvisionerStatus,
}

/// The metadata a patch carries: the object's name, and the
/// resourceVersion that makes it conditional.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_version: Option<String>,
}

impl Meta {
    fn is_empty(&self) -> bool {
        self.name.is_none() && self.resource_version.is_none()
    }
}

impl StatusApply {
    /// Applies `status` (the name comes from the request's URL).
    pub fn new(status: ProvisionerStatus) -> Self {
        StatusApply {
            api_version: API_VERSION,
            kind: KIND,
            metadata: Meta::default(),
            status,
        }
    }

    /// Names the object in the body too.
    pub fn named(mut self, name: &str) -> Self {
        self.metadata.name = Some(name.to_string());
        self
    }

    /// Applies only if the object is still at `resource_version`: two
    /// writers adding to one count never lose each other's additions.
    pub fn conditional_on(mut self, resource_version: Option<String>) -> Self {
        self.metadata.resource_version = resource_version;
        self
    }
}

/// A merge patch replacing `status.members` whole (a merge patch replaces
/// a list; server-side apply would only add to it), conditionally on a
/// resourceVersion.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MembersMerge {
    #[serde(skip_serializing_if = "Meta::is_empty")]
    metadata: Meta,
    status: MembersOnly,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
struct MembersOnly {
    /// `None` (null) removes the list.
    members: Option<Vec<Member>>,
}

impl MembersMerge {
    /// Keeps only `kept` (none: the list is removed).
    pub fn keep(kept: Vec<Member>, resource_version: Option<String>) -> Self {
        MembersMerge {
            metadata: Meta {
                name: None,
                resource_version,
            },
            status: MembersOnly {
                members: (!kept.is_empty()).then_some(kept),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_apply_says_only_what_its_manager_owns() {
        let status = ProvisionerStatus {
            leader: Some("pod-a".into()),
            provisioned: Some(3),
            ..ProvisionerStatus::default()
        };
        let body = serde_json::to_value(StatusApply::new(status.clone())).unwrap();
        assert_eq!(
            body,
            json!({"apiVersion": API_VERSION, "kind": KIND,
                   "status": {"leader": "pod-a", "provisioned": 3}})
        );
        let body = StatusApply::new(status)
            .named("prov")
            .conditional_on(Some("7".into()));
        assert_eq!(
            serde_json::to_value(body).unwrap()["metadata"],
            json!({"name": "prov", "resourceVersion": "7"})
        );
    }

    #[test]
    fn pruning_every_member_removes_the_list() {
        let body = serde_json::to_value(MembersMerge::keep(vec![], Some("4".into()))).unwrap();
        assert_eq!(
            body,
            json!({"metadata": {"resourceVersion": "4"}, "status": {"members": null}})
        );
        let kept = vec![Member {
            name: "a".into(),
            pod: None,
            provisioned: 2,
        }];
        let body = serde_json::to_value(MembersMerge::keep(kept, None)).unwrap();
        assert_eq!(
            body,
            json!({"status": {"members": [{"name": "a", "provisioned": 2}]}})
        );
    }
}

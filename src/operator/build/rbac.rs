//! What the pods may do: their ServiceAccount, and a Role granting exactly what they use.

use super::*;

pub fn service_account(p: &Provisioner) -> Result<ServiceAccount, BuildError> {
    Ok(ServiceAccount {
        metadata: meta(p, p.name_any())?,
        ..ServiceAccount::default()
    })
}

pub(super) fn rule(group: &str, resource: &str, names: Option<&str>, verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        resource_names: names.map(|n| vec![n.to_string()]),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        non_resource_urls: None,
    }
}

/// What the pods may do: follow their own Provisioner (a watch restricted by
/// name needs a `metadata.name` field selector), write its status, and —
/// with the lease backend — hold the Lease named like it; with
/// `spec.pki.certManager`, make CertificateRequests. `create` cannot be
/// restricted to a name, so it is a rule of its own.
pub fn role(p: &Provisioner) -> Result<Role, BuildError> {
    let name = p.name_any();
    let group = crate::operator::crd::GROUP;
    let mut rules = vec![
        rule(
            group,
            "provisioners",
            Some(&name),
            &["get", "watch", "list"],
        ),
        rule(
            group,
            "provisioners/status",
            Some(&name),
            &["get", "patch", "update"],
        ),
    ];
    if p.spec.election.backend == ElectionBackend::Lease {
        rules.push(rule("coordination.k8s.io", "leases", None, &["create"]));
        rules.push(rule(
            "coordination.k8s.io",
            "leases",
            Some(&name),
            &["get", "update"],
        ));
    }
    if p.spec
        .pki
        .as_ref()
        .is_some_and(|k| k.cert_manager.is_some())
    {
        // One CertificateRequest per node, made, read until issued, deleted.
        rules.push(rule(
            "cert-manager.io",
            "certificaterequests",
            None,
            &["create", "get", "delete"],
        ));
    }
    Ok(Role {
        metadata: meta(p, name)?,
        rules: Some(rules),
    })
}

pub fn role_binding(p: &Provisioner) -> Result<RoleBinding, BuildError> {
    let name = p.name_any();
    Ok(RoleBinding {
        metadata: meta(p, name.clone())?,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: Some(namespace(p)?),
            api_group: None,
        }]),
    })
}

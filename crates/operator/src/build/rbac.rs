//! What the pods may do: their ServiceAccount, a Role for their own
//! Provisioner, and RoleBindings to the two ClusterRoles the chart ships
//! for Leases and CertificateRequests.
//!
//! Kubernetes lets the operator write a Role only when it holds every
//! permission in it. The Provisioner rules are ones it holds anyway (it
//! watches Provisioners and writes their status), so the Role names them.
//! Leases and CertificateRequests it never needs itself: rather than hold
//! their verbs in every namespace (kube-system's Leases included) only to
//! grant them, it binds ClusterRoles that hold exactly those verbs, which
//! needs only `bind` on those two ClusterRoles by name. A binding that is
//! not needed (another election backend, no cert-manager) is applied with
//! no subjects, so it grants nothing and the operator needs no `delete` to
//! follow a change.

use super::*;

/// The pods' ServiceAccount, named like the Provisioner.
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

/// The pods follow their own Provisioner (a watch restricted by name needs
/// a `metadata.name` field selector) and write their part of its status
/// (server-side apply: `patch`).
pub fn role(p: &Provisioner) -> Result<Role, BuildError> {
    let name = p.name_any();
    let group = choria_k8s::crd::GROUP;
    Ok(Role {
        metadata: meta(p, name.clone())?,
        rules: Some(vec![
            rule(
                group,
                "provisioners",
                Some(&name),
                &["get", "watch", "list"],
            ),
            rule(group, "provisioners/status", Some(&name), &["patch"]),
        ]),
    })
}

fn subjects(p: &Provisioner) -> Result<Vec<Subject>, BuildError> {
    Ok(vec![Subject {
        kind: "ServiceAccount".into(),
        name: p.name_any(),
        namespace: Some(namespace(p)?),
        api_group: None,
    }])
}

fn binding(
    p: &Provisioner,
    name: String,
    kind: &str,
    role: &str,
    granted: bool,
) -> Result<RoleBinding, BuildError> {
    Ok(RoleBinding {
        metadata: meta(p, name)?,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: kind.into(),
            name: role.into(),
        },
        subjects: Some(if granted { subjects(p)? } else { Vec::new() }),
    })
}

pub fn role_binding(p: &Provisioner) -> Result<RoleBinding, BuildError> {
    binding(p, p.name_any(), "Role", &p.name_any(), true)
}

/// `<name>-leases`
pub fn lease_binding_name(name: &str) -> String {
    format!("{name}-leases")
}

/// `<name>-certificaterequests`
pub fn cert_manager_binding_name(name: &str) -> String {
    format!("{name}-certificaterequests")
}

/// Leases in the namespace, for the Lease election backend.
pub fn lease_binding(p: &Provisioner, cluster_role: &str) -> Result<RoleBinding, BuildError> {
    let used = p.spec.election.backend == ElectionBackend::Lease;
    binding(
        p,
        lease_binding_name(&p.name_any()),
        "ClusterRole",
        cluster_role,
        used,
    )
}

/// CertificateRequests in the namespace, with `spec.pki.certManager`.
pub fn cert_manager_binding(
    p: &Provisioner,
    cluster_role: &str,
) -> Result<RoleBinding, BuildError> {
    let used = p
        .spec
        .pki
        .as_ref()
        .is_some_and(|k| k.cert_manager.is_some());
    binding(
        p,
        cert_manager_binding_name(&p.name_any()),
        "ClusterRole",
        cluster_role,
        used,
    )
}

//! The rules of `spec.pki`: the signer's fields, what the provisioner's
//! `cert_manager:` would refuse.

use super::{duration_rules, object_name, rule, Rule, DURATION_MAX_LENGTH};

/// `spec.pki.certManager`'s issuer, usages and durations.
pub(super) fn rules() -> Vec<Rule> {
    let usages = choria_config::provisioner::CERT_MANAGER_USAGES;
    let usage_list = usages
        .iter()
        .map(|u| format!("'{u}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut all = vec![
        object_name("spec.pki.certManager.issuerRef.name", "an issuer's name"),
        rule(
            "spec.pki.certManager.issuerRef.kind",
            "self.matches('^[A-Za-z0-9]+$')",
            "spec.pki.certManager.issuerRef.kind must be a kind such as Issuer or ClusterIssuer",
        ),
        object_name("spec.pki.certManager.issuerRef.group", "an API group"),
        rule(
            "spec.pki.certManager.usages",
            format!("self.all(u, u in [{usage_list}])"),
            format!(
                "spec.pki.certManager.usages must be cert-manager key usages: {}",
                usages.join(", ")
            ),
        ),
    ];
    all.extend(duration_rules(
        "spec.pki.certManager.duration",
        Some(("1h", "is shorter than cert-manager's minimum of 1h")),
    ));
    all.extend(duration_rules("spec.pki.certManager.keep", None));
    all
}

/// Bounds on the strings and lists these rules read.
pub(super) fn bounds() -> Vec<(&'static str, &'static str, i64)> {
    vec![
        ("spec.pki.certManager.issuerRef.name", "maxLength", 253),
        ("spec.pki.certManager.issuerRef.kind", "maxLength", 63),
        ("spec.pki.certManager.issuerRef.group", "maxLength", 253),
        ("spec.pki.certManager.usages", "maxItems", 22),
        ("spec.pki.certManager.usages[]", "maxLength", 32),
        (
            "spec.pki.certManager.duration",
            "maxLength",
            DURATION_MAX_LENGTH,
        ),
        (
            "spec.pki.certManager.keep",
            "maxLength",
            DURATION_MAX_LENGTH,
        ),
    ]
}

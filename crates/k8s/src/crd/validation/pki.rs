//! The rules of `spec.pki`: one signer, and its fields, what the
//! provisioner's `cert_manager:` and `ca:` would refuse.

use super::{duration_rules, object_name, rule, Rule, DURATION_MAX_LENGTH, SECRET_KEY};

/// The CA's two Secret keys.
const CA_KEYS: [&str; 2] = ["spec.pki.ca.certificateKey", "spec.pki.ca.keyKey"];

/// `spec.pki.certManager`'s issuer, usages and durations; `spec.pki.ca`'s
/// Secret, its keys and the lifetime of what it signs.
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
    all.push(rule(
        "spec.pki",
        "!(has(self.certManager) && has(self.ca))",
        "spec.pki.certManager and spec.pki.ca both sign the nodes' CSRs; keep one of them",
    ));
    all.push(object_name("spec.pki.ca.secretName", "a Secret's name"));
    for at in CA_KEYS {
        all.push(rule(
            at,
            format!("self.matches('{SECRET_KEY}') && self != '.' && self != '..'"),
            format!("{at} must be a Secret key: letters, digits, '-', '_' and '.'"),
        ));
    }
    all.extend(duration_rules(
        "spec.pki.ca.validity",
        Some((
            "1h",
            "is shorter than 1h: renewal would have no time to act",
        )),
    ));
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
        ("spec.pki.ca.secretName", "maxLength", 253),
        (CA_KEYS[0], "maxLength", 253),
        (CA_KEYS[1], "maxLength", 253),
        ("spec.pki.ca.validity", "maxLength", DURATION_MAX_LENGTH),
    ]
}

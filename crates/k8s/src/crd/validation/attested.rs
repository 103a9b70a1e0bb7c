//! The rules of the attested-provisioning sections: `spec.admission`,
//! `spec.evidence`, `spec.audit` and `spec.revocations`, what the
//! provisioner's `admission:`, `evidence:` and `audit:` would refuse, and
//! the lists the pods write into the records' buckets.

use super::{about, rule, Rule, DURATION_MAX_LENGTH, IDENTITY, OBJECT_NAME, SECRET_KEY};

/// `spec.admission`, `spec.evidence` and `spec.audit`: what the
/// provisioner's `admission:`, `evidence:` and `audit:` refuse.
pub(super) fn rules() -> Vec<Rule> {
    vec![
        rule(
            "spec.admission.policy",
            format!("self.name.size() <= 253 && self.name.matches('{OBJECT_NAME}')"),
            "spec.admission.policy.name must be a ConfigMap's name: lower case letters, digits, '-' and '.'",
        ),
        rule(
            "spec.admission.policy",
            format!("self.key.size() <= 253 && self.key.matches('{SECRET_KEY}') && self.key != '.' && self.key != '..'"),
            "spec.admission.policy.key must be a ConfigMap key: letters, digits, '-', '_' and '.'",
        ),
        about(
            "spec",
            ".evidence",
            "!has(self.evidence) || has(self.records) || (has(self.evidence.oneIdentityPerInstance) && !self.evidence.oneIdentityPerInstance)",
            "spec.evidence keeps one identity per instance beside the records: set spec.records too (or spec.evidence.oneIdentityPerInstance: false)",
        ),
        rule(
            "spec.evidence",
            "has(self.awsCertificates) || has(self.gcpCertificates) || has(self.azureCertificates)",
            "spec.evidence needs awsCertificates, gcpCertificates or azureCertificates: the Secret that verifies the instance identity documents",
        ),
        rule(
            "spec.evidence.awsAccounts",
            "self.all(a, a.matches('^[0-9]{12}$'))",
            "spec.evidence.awsAccounts must be AWS account ids: 12 digits each",
        ),
        rule(
            "spec.evidence.gcpProjects",
            "self.all(p, p.matches('^[-_a-zA-Z0-9]+$'))",
            "spec.evidence.gcpProjects must be GCP project ids: letters, digits, '-' and '_'",
        ),
        rule(
            "spec.evidence.azureSubscriptions",
            "self.all(s, s.matches('^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'))",
            "spec.evidence.azureSubscriptions must be Azure subscription ids: UUIDs",
        ),
        rule(
            "spec.evidence.gcpAudience",
            "self.contains('{identity}')",
            "spec.evidence.gcpAudience must hold {identity}: a token for one node would otherwise be good for any name",
        ),
        rule(
            "spec.evidence.nodeName",
            "self == 'instance_id' || self == 'instance_name'",
            "spec.evidence.nodeName must be instance_id or instance_name",
        ),
        about(
            "spec",
            ".audit",
            "!has(self.audit) || has(self.records)",
            "spec.audit goes through the records' connection and is sealed with their key: set spec.records too",
        ),
        rule(
            "spec.audit.stream",
            "self.matches('^[-_a-zA-Z0-9]+$')",
            "spec.audit.stream must be a stream name: letters, digits, '-' and '_'",
        ),
        rule(
            "spec.audit.subject",
            "self.matches('^[-_a-zA-Z0-9]+([.][-_a-zA-Z0-9]+)*$')",
            "spec.audit.subject must be a subject prefix: dot-separated tokens of letters, digits, '-' and '_', no wildcards",
        ),
        rule(
            "spec.audit.maxBytes",
            "self >= 1048576",
            "spec.audit.maxBytes must be at least 1 MiB (1048576); the stream's size is bounded, but not to nothing",
        ),
        rule(
            "spec.audit.replicas",
            "self >= 1 && self <= 5",
            "spec.audit.replicas must be 1 to 5 servers holding a copy (default 1)",
        ),
    ]
    .into_iter()
    .chain(lists())
    .collect()
}

/// `spec.revocations` and `spec.bindings`: the lists the pods write into
/// the records' buckets.
fn lists() -> Vec<Rule> {
    vec![
        about(
            "spec",
            ".revocations",
            "!has(self.revocations) || size(self.revocations) == 0 || has(self.records)",
            "spec.revocations are written beside the records and sealed with their key: set spec.records too",
        ),
        rule(
            "spec.revocations[]",
            format!("self.identity.matches('{IDENTITY}')"),
            "spec.revocations[].identity must be a node's identity: dot-separated labels of letters, digits, '-' and '_'",
        ),
        rule(
            "spec.revocations[]",
            "!self.reason.matches('^[[:space:]]*$') && !self.reason.contains('\\n') && !self.reason.contains('\\r')",
            "spec.revocations[].reason must be one line of text, not empty",
        ),
        about(
            "spec",
            ".bindings",
            "!has(self.bindings) || size(self.bindings) == 0 || (has(self.records) && has(self.evidence) && (!has(self.evidence.oneIdentityPerInstance) || self.evidence.oneIdentityPerInstance))",
            "spec.bindings bind names beside the records, for evidence with one identity per instance: set spec.records and spec.evidence too",
        ),
        rule(
            "spec.bindings[]",
            format!("self.identity.matches('{IDENTITY}')"),
            "spec.bindings[].identity must be a node's identity: dot-separated labels of letters, digits, '-' and '_'",
        ),
        rule(
            "spec.bindings[]",
            format!("self.instance.matches('{}')", crate::crd::INSTANCE),
            "spec.bindings[].instance must name an instance as the provisioner does: aws.<account>.<id>, gcp.<project>.<id> or azure.<subscription>.<vm id>",
        ),
        rule(
            "spec.bindings[]",
            "!self.reason.matches('^[[:space:]]*$') && !self.reason.contains('\\n') && !self.reason.contains('\\r')",
            "spec.bindings[].reason must be one line of text, not empty",
        ),
    ]
}

/// Bounds on the strings and lists these rules read.
pub(super) fn bounds() -> Vec<(&'static str, &'static str, i64)> {
    vec![
        ("spec.admission.policy", "name", 253),
        ("spec.admission.policy", "key", 253),
        ("spec.evidence.awsAccounts", "maxItems", 64),
        ("spec.evidence.awsAccounts[]", "maxLength", 12),
        ("spec.evidence.gcpProjects", "maxItems", 64),
        ("spec.evidence.gcpProjects[]", "maxLength", 64),
        ("spec.evidence.gcpAudience", "maxLength", 253),
        ("spec.evidence.azureSubscriptions", "maxItems", 64),
        ("spec.evidence.azureSubscriptions[]", "maxLength", 36),
        ("spec.evidence.nodeName", "maxLength", 16),
        ("spec.audit.stream", "maxLength", 64),
        ("spec.audit.subject", "maxLength", 253),
        ("spec.revocations", "maxItems", crate::crd::MAX_REVOCATIONS),
        ("spec.revocations[].identity", "maxLength", 253),
        ("spec.revocations[].reason", "maxLength", 500),
        ("spec.bindings", "maxItems", crate::crd::MAX_BINDINGS),
        ("spec.bindings[].identity", "maxLength", 253),
        ("spec.bindings[].instance", "maxLength", 253),
        ("spec.bindings[].reason", "maxLength", 500),
        ("spec.evidence.maxAge", "maxLength", DURATION_MAX_LENGTH),
        ("spec.audit.maxAge", "maxLength", DURATION_MAX_LENGTH),
    ]
}

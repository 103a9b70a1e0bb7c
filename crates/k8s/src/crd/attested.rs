//! The attested-provisioning sections of a `Provisioner`: `spec.admission`,
//! `spec.evidence` and `spec.audit`, each the `provisioner.yaml` section of
//! the same name (the operator writes them, `build/config.rs`), and
//! `spec.revocations` and `spec.bindings`, which the pods read from the
//! resource itself (as they read `spec.paused`) and write as sealed
//! revocations and name bindings: only they hold the key that seals them.

use super::SecretKeyRef;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The admission policy (`admission:` of `provisioner.yaml`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionSpec {
    /// The Rego file: a key of a ConfigMap in this namespace (package
    /// `choria.provisioner`, rules `allow`, `deny_reason`, `defer`).
    pub policy: ConfigMapKeyRef,
    /// The file is Rego v0 (rules without `if`; default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rego_v0: Option<bool>,
}

/// Cloud instance identity evidence (`evidence:` of `provisioner.yaml`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvidenceSpec {
    /// The AWS regions' certificates (PEM) that verify instance identity
    /// documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_certificates: Option<SecretKeyRef>,
    /// AWS account ids (12 digits) whose instances may be provisioned
    /// (default: any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aws_accounts: Vec<String>,
    /// Google's certificates (`oauth2/v1/certs` JSON, or PEM) that verify
    /// GCP instance identity tokens; refresh the Secret as Google rotates
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcp_certificates: Option<SecretKeyRef>,
    /// The audience a GCP token must be for; `{identity}` is the node's
    /// name (default `choria:{identity}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcp_audience: Option<String>,
    /// GCP project ids whose instances may be provisioned (default: any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gcp_projects: Vec<String>,
    /// The Microsoft intermediates (PEM) that issue the
    /// `metadata.azure.com` certificate Azure signs attested documents
    /// with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure_certificates: Option<SecretKeyRef>,
    /// Azure subscription ids (UUIDs) whose virtual machines may be
    /// provisioned (default: any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub azure_subscriptions: Vec<String>,
    /// Refuse instances launched longer ago than this (a Go or Choria
    /// duration; default: any age).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
    /// What of the instance the node's identity must name: `instance_id`
    /// or `instance_name` (default: not compared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// An instance is provisioned under one identity only, and an identity
    /// from one instance only (default true; needs `records`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_identity_per_instance: Option<bool>,
    /// A name bound to an instance may be taken by another instance once
    /// its credentials on record expired (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebind_after_expiry: Option<bool>,
}

/// The audit stream (`audit:` of `provisioner.yaml`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditSpec {
    /// The JetStream stream (default `CHORIA_PROVISIONER_AUDIT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// The subject prefix (default `choria.provisioner.audit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// How long events are kept (default `90d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
    /// The most the stream keeps, in bytes, at least 1 MiB (default 1 GiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<i64>,
    /// Servers that hold a copy of the stream, 1 to 5 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
}

/// A key of a ConfigMap in this resource's namespace, mounted as a file.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub struct ConfigMapKeyRef {
    /// The ConfigMap's name.
    pub name: String,
    /// The key in the ConfigMap.
    pub key: String,
}

/// One identity `spec.revocations` revokes: never provisioned or renewed
/// again while it is listed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub struct RevokedNode {
    /// The node's identity.
    pub identity: String,
    /// Why, as `choria-provisioner nodes` and the audit stream show it.
    pub reason: String,
}

/// The most identities `spec.revocations` lists (a bound on the rules'
/// cost; more belong in the bucket, through `choria-provisioner revoke`).
pub const MAX_REVOCATIONS: i64 = 1000;

/// `spec.revocations` is a map keyed by identity: each listed once.
pub(super) fn revocations_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    super::pod::keyed::<RevokedNode>(generator, "identity")
}

/// One name `spec.bindings` binds to a cloud instance, as
/// `choria-provisioner rebind --instance` does: a replaced machine's name
/// moved to its successor.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub struct BoundNode {
    /// The node's identity.
    pub identity: String,
    /// The instance, as the provisioner names instances:
    /// `aws.<account>.<instance id>`, `gcp.<project>.<id>`,
    /// `azure.<subscription>.<vm id>` (`bound_elsewhere` audit events and
    /// the provisioner's log name the one refused).
    pub instance: String,
    /// Why, as the audit stream shows it.
    pub reason: String,
}

/// The most names `spec.bindings` lists: each is read back from the bucket
/// on every reapplication (more belong to `choria-provisioner rebind`).
pub const MAX_BINDINGS: i64 = 256;

/// A cloud instance as the provisioner names it: a provider, then the
/// account and the instance's id, each of letters, digits, `-` and `_`.
pub const INSTANCE: &str = "^(aws|gcp|azure)[.][-_a-zA-Z0-9]+[.][-_a-zA-Z0-9]+$";

/// Whether `s` names an instance as [`INSTANCE`] says, without a regex
/// engine: a provider, an account and an id.
pub fn is_instance(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    s.len() <= 253
        && parts.len() == 3
        && ["aws", "gcp", "azure"].contains(&parts[0])
        && parts[1..].iter().all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

/// `spec.bindings` is a map keyed by identity: each listed once.
pub(super) fn bindings_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    super::pod::keyed::<BoundNode>(generator, "identity")
}

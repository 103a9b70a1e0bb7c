//! `spec.pki`: who signs the nodes' certificates (cert-manager and its
//! issuer).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Certificate signing for `features.pki`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PkiSpec {
    /// A cert-manager issuer signs each node's CSR through a
    /// CertificateRequest in this resource's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_manager: Option<CertManagerSpec>,
}

/// cert-manager as the signer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertManagerSpec {
    /// The issuer that signs.
    pub issuer_ref: IssuerRef,
    /// Requested certificate lifetime, e.g. `2160h` (default: the issuer's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// cert-manager key usages (default: digital signature, key
    /// encipherment, server auth, client auth).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usages: Vec<String>,
    /// How long a request may wait to be issued (default `30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// How long a used request is kept before deletion (default `0s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<String>,
}

/// A cert-manager issuer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IssuerRef {
    /// The issuer's name.
    pub name: String,
    /// `Issuer` (default) or `ClusterIssuer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Default `cert-manager.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

//! `spec.pki`: who signs the nodes' certificates (cert-manager and its
//! issuer, or the built-in CA from a Secret).

use super::SecretKeyRef;
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
    /// The built-in CA signs each node's CSR in the provisioner pods, with
    /// a certificate and key from a Secret in this resource's namespace
    /// (`ca:` of `provisioner.yaml`). Not with `certManager`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<CaSpec>,
}

/// The built-in CA as the signer: its certificate and key are two keys of
/// one Secret, mounted read-only into the pods.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaSpec {
    /// The Secret, in this resource's namespace, holding the CA's
    /// certificate and key: a `kubernetes.io/tls` Secret (`kubectl create
    /// secret tls`) fits, such as the one a cert-manager CA issuer reads.
    pub secret_name: String,
    /// The Secret key holding the CA certificate (PEM), followed by its
    /// chain up to the root when it is an intermediate.
    #[serde(default = "default_certificate_key")]
    pub certificate_key: String,
    /// The Secret key holding the CA's private key: unencrypted PEM, RSA or
    /// ECDSA P-256.
    #[serde(default = "default_key_key")]
    pub key_key: String,
    /// Lifetime of each certificate it signs, a Choria duration of at least
    /// `1h` such as `2160h` or `90d`, never past the CA's own expiry
    /// (default `90d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validity: Option<String>,
}

/// `spec.pki.ca.certificateKey` when unset: a TLS Secret's certificate.
pub const CA_CERTIFICATE_KEY: &str = "tls.crt";
/// `spec.pki.ca.keyKey` when unset: a TLS Secret's key.
pub const CA_KEY_KEY: &str = "tls.key";

fn default_certificate_key() -> String {
    CA_CERTIFICATE_KEY.into()
}

fn default_key_key() -> String {
    CA_KEY_KEY.into()
}

impl CaSpec {
    /// The Secret key of the CA certificate.
    pub fn certificate_ref(&self) -> SecretKeyRef {
        SecretKeyRef {
            name: self.secret_name.clone(),
            key: self.certificate_key.clone(),
        }
    }

    /// The Secret key of the CA's private key.
    pub fn key_ref(&self) -> SecretKeyRef {
        SecretKeyRef {
            name: self.secret_name.clone(),
            key: self.key_key.clone(),
        }
    }
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

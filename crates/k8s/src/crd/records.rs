//! `spec.records` and `spec.renewal`: the JetStream the provisionings are
//! recorded in, and renewing credentials from those records before they
//! expire.

use super::{BrokerSpec, SecretKeyRef};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where records are kept (`records:`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecordsSpec {
    /// NATS URLs of a JetStream the records may be written to, such as
    /// `nats://records.example.net:4222`.
    pub urls: Vec<String>,
    /// The KV bucket (default `CHORIA_PROVISIONER_RECORDS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    /// Records a node's key holds, 1 to 64 (default 5); later ones go to an
    /// overflow key, none is pushed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<i32>,
    /// Create the bucket when it is missing (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_bucket: Option<bool>,
    /// Servers that hold a copy of each bucket the pods create (records,
    /// revocations, instance bindings), 1 to 5 (default 1): 3 on a
    /// clustered JetStream keeps them through a lost server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// A NATS `.creds` file (user JWT and seed) in a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<SecretKeyRef>,
    /// NATS user name, with `passwordSecret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The NATS password of `user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<SecretKeyRef>,
    /// A NATS token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret: Option<SecretKeyRef>,
    /// A CA certificate that verifies the server's TLS certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca_secret: Option<SecretKeyRef>,
    /// A client certificate for mutual TLS, with `tlsKeySecret`: how the
    /// records reach a Choria broker's own Streams on an x509 network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert_secret: Option<SecretKeyRef>,
    /// The private key of `tlsCertSecret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key_secret: Option<SecretKeyRef>,
}

/// Renewal before expiry (`renewal:`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RenewalSpec {
    /// When a credential is due: this long before it expires (`30d`,
    /// `12h`: a positive duration) or when this share of its lifetime is
    /// left (`20%`: above 0% and below 100%).
    pub before: String,
    /// Due times move earlier by a stable share of this per node, so a
    /// fleet provisioned at once is not renewed at once (default `0s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
    /// Renewals (`reprovision` requests) per minute at most (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<i32>,
    /// The collective `reprovision` goes to when a record names none
    /// (default `mcollective`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<String>,
    /// How long a node may take to come back before it is asked again
    /// (default `10m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<String>,
    /// The broker and credentials that reach the provisioned nodes in
    /// their collective, as a caller their policies allow to call
    /// `choria_provision#reprovision`; unset: `spec.broker`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker: Option<BrokerSpec>,
}

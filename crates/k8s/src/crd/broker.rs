//! How the pods reach the Choria broker, and the Secret keys that carry
//! credentials to them as files.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The broker the provisioner connects to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BrokerSpec {
    /// Broker URLs, such as `nats://broker.example.net:4222`.
    pub urls: Vec<String>,
    /// Our Choria identity (default: this resource's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// A `kubernetes.io/tls` Secret with `tls.crt`, `tls.key` and `ca.crt`:
    /// the `file` security provider (x509, protocol v1). With
    /// `clientJwtSecret`, its CA verifies the broker and its certificate is
    /// the TLS client certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_secret: Option<String>,
    /// A Secret with `token` (client JWT) and `seed` (hex ed25519 seed): the
    /// `choria` security provider (protocol v2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_jwt_secret: Option<String>,
    /// With `clientJwtSecret` and no `tlsSecret`, nothing verifies the
    /// broker's TLS certificate: the token and the key exchange would cross
    /// an unauthenticated channel. That is refused unless this is `true`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_skip_verify: bool,
}

/// A key of a Secret in this resource's namespace; it reaches the pods as a
/// file, never as configuration text.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub struct SecretKeyRef {
    /// The Secret's name.
    pub name: String,
    /// The key in the Secret.
    pub key: String,
}

//! `spec.election`: how the replicas decide who provisions (`election:`
//! of `provisioner.yaml`).

use super::enums::also_lower_case;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which election decides the provisioning replica (`election.backend` of
/// `provisioner.yaml`). Spelt as Kubernetes spells enum values (`Lease`,
/// `Streams`, `None`, like `mode`'s `Leader` and `Shards`); the lower-case
/// spelling of earlier versions is still accepted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = also_lower_case)]
pub enum ElectionBackend {
    /// A Kubernetes Lease named like this resource.
    #[default]
    #[serde(alias = "lease")]
    Lease,
    /// The Choria Streams KV bucket Go provisioners use.
    #[serde(alias = "streams")]
    Streams,
    /// No election: every replica provisions.
    #[serde(alias = "none")]
    None,
}

impl ElectionBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            ElectionBackend::Lease => "lease",
            ElectionBackend::Streams => "streams",
            ElectionBackend::None => "none",
        }
    }
}

/// How the replicas share the work (`election.mode` of `provisioner.yaml`),
/// spelt `Leader` and `Shards` here.
pub use choria_config::election::ElectionMode;

/// Leader election settings; durations are strings such as `15s`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElectionSpec {
    /// `Leader` (one replica works) or `Shards` (every replica works its
    /// share; needs the `lease` or `streams` backend). With `Shards`, the
    /// Lease timings are the membership's on both backends.
    #[serde(default)]
    pub mode: ElectionMode,
    /// `Lease` (a Kubernetes Lease), `Streams` (Choria Streams, compatible
    /// with Go provisioners) or `None` (the lower-case spelling of earlier
    /// versions is still accepted).
    #[serde(default)]
    pub backend: ElectionBackend,
    /// Lease: how long a leader's record is valid (default `15s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration: Option<String>,
    /// Lease: the leader steps down when it could not renew for this long
    /// (default `10s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_deadline: Option<String>,
    /// Lease: time between attempts (default `2s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_period: Option<String>,
    /// Streams: the KV bucket (default `CHORIA_LEADER_ELECTION`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    /// Streams: the election name, the KV key (default `provisioner`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Streams: the JetStream API prefix (default `choria.streams`; empty for
    /// the account's own `$JS.API`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_prefix: Option<String>,
}

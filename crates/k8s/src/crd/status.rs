//! The `Provisioner`'s observed state: the operator's conditions and the
//! pods' own fields (leader, counts, shard members), each under its own
//! field manager.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// The field manager the provisioner pods write their status fields with
/// (`leader`, the counts, in shards mode each member's entry under
/// `<this>.<member>`): the operator leaves what it owns alone.
pub const POD_FIELD_MANAGER: &str = "choria-provisioner-pod";
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProvisionerStatus {
    /// `Ready`, `Progressing`, `LeaderElected`, `Paused` and `Degraded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` the operator last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The pod that leads, as written by that pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// Ready provisioner pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Nodes the pods of this Provisioner provisioned, added up across
    /// replicas and failovers: each pod adds what it provisioned since its
    /// own last write (in `Shards` mode every member adds its share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<i64>,
    /// Pods of the Deployment (the `scale` subresource's count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// The pods' label selector (the `scale` subresource's, for an HPA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// `spec.election.mode: Shards`: the live members, each written by
    /// itself, and pruned by the members when one leaves the membership.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "members_schema")]
    pub members: Vec<Member>,
    /// Nodes on record whose credentials expire (with `renewal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<i64>,
    /// Nodes whose credentials are inside their renewal window and not
    /// renewed yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewals_due: Option<i64>,
    /// Identities revoked now, from the list and from `choria-provisioner
    /// revoke` alike (with `records`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked: Option<i64>,
    /// Refusals of nodes that answered (the admission policy, evidence,
    /// revocations, held credentials, tokens, CSRs, conflicting replies:
    /// what the audit stream records as denied or refused), added up
    /// across replicas like `provisioned`; a node refused again at a later
    /// discovery counts again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<i64>,
}

/// One replica of a sharded Provisioner.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    /// Its member name (the pod's name and a suffix), the provisioning
    /// lock's caller.
    pub name: String,
    /// The pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Nodes it provisioned since it started.
    #[serde(default)]
    pub provisioned: i64,
}

/// Members as a map keyed by `name`: each pod applies its own entry.
fn members_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<Member>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["name"]),
    );
    schema
}

/// Conditions as a map keyed by `type`, so server-side apply merges each
/// condition instead of replacing the list.
fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    schema
}

impl ProvisionerStatus {
    /// The condition of this type, if set.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

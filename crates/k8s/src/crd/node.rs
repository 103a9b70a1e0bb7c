//! What is done for each node: `spec.features`, the helper program and
//! the node configuration templates.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `features:` of `provisioner.yaml`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Features {
    /// Fetch a CSR from each node for the helper to sign (not with `ed25519`).
    #[serde(default)]
    pub pki: bool,
    /// Fetch and verify each node's provisioning JWT.
    #[serde(default)]
    pub jwt: bool,
    /// Organization Issuer networks: sign a server JWT for each node (turns
    /// `jwt` on).
    #[serde(default)]
    pub ed25519: bool,
    /// Honour the helper's `upgrade` version.
    #[serde(default)]
    pub upgrades: bool,
}

/// The helper program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HelperSpec {
    /// The command line run for each node, e.g.
    /// `/etc/choria-provisioner/helper/helper.sh`.
    pub command: String,
    /// A ConfigMap mounted read-only (mode 0755) at
    /// `/etc/choria-provisioner/helper`, e.g. holding `helper.sh`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<String>,
}

/// Node configuration templates (minijinja); each value is a template
/// rendered per node from `identity`, `inventory`, `jwt`, `csr`,
/// `ed25519`, `site` and `values`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfigurationSpec {
    /// Your own values, `{{ values.NAME }}` in the templates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub values: BTreeMap<String, String>,
    /// Choria setting → template of its value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub configuration: BTreeMap<String, String>,
    /// Policy file name (`<agent>.policy`) → template of its text.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub action_policies: BTreeMap<String, String>,
    /// Rego file name (`<agent>.rego`, `default.rego`) → template of its text.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub opa_policies: BTreeMap<String, String>,
    /// Claims the server JWTs are based on (`features.ed25519`), as the
    /// helper's `server_claims`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_object_schema")]
    pub server_claims: Option<serde_json::Value>,
    /// Template of the version to upgrade nodes to (`features.upgrades`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<String>,
}

/// An object whose fields the API server keeps as given.
fn free_object_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

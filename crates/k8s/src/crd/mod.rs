//! The `Provisioner` custom resource (`provisioning.choria.io/v1alpha1`):
//! the one place its Rust types, names and CRD live. The operator builds
//! from it and the provisioner pods follow it (`provision::kube`,
//! `provision::signing::certmanager`), both through these types.
//!
//! The spec mirrors `provisioner.yaml` in camelCase, plus what a Deployment
//! needs (image, replicas, resources, pod placement) and references to the
//! Secrets the provisioner reads as mounted files. Doc comments become the
//! schema's descriptions, so `kubectl explain provisioner.spec` documents it.
//!
//! Status is shared by field managers: the operator owns `conditions`,
//! `observedGeneration`, `readyReplicas`, `replicas` and `selector`; the
//! provisioner pods write `leader`, `provisioned`, `records` and
//! `renewalsDue`, and in shards mode each member its own entry of `members`.

mod attested;
mod broker;
mod election;
mod enums;
mod node;
mod pki;
pub mod pod;
mod records;
mod reference;
mod status;
pub mod status_patch;
mod telemetry;
pub mod validation;

pub use attested::{
    is_instance, AdmissionSpec, AuditSpec, BoundNode, ConfigMapKeyRef, EvidenceSpec, RevokedNode,
    INSTANCE, MAX_BINDINGS, MAX_REVOCATIONS,
};
pub use broker::{BrokerSpec, SecretKeyRef};
pub use election::{ElectionBackend, ElectionMode, ElectionSpec};
pub use enums::{ImagePullPolicy, LogLevel};
pub use node::{Features, HelperSpec, NodeConfigurationSpec};
pub use pki::{CaSpec, CertManagerSpec, IssuerRef, PkiSpec, CA_CERTIFICATE_KEY, CA_KEY_KEY};
pub use pod::{
    PodOverrides, PodVolume, VolumeType, OPERATOR_MOUNT_ROOTS, RESERVED_ENV, RESERVED_ENV_PREFIX,
    RESERVED_VOLUMES,
};
pub use records::{RecordsSpec, RenewalSpec};
pub use reference::{owner_reference, ResourceRef};
pub use status::{Member, ProvisionerStatus, POD_FIELD_MANAGER};
pub use telemetry::TelemetrySpec;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "provisioning.choria.io";
/// The served and stored version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of the resource.
pub const API_VERSION: &str = "provisioning.choria.io/v1alpha1";
/// `kind` of the resource.
pub const KIND: &str = "Provisioner";
/// `spec.monitorPort` when unset.
pub const DEFAULT_MONITOR_PORT: i32 = 8080;
/// `spec.replicas` when unset: one leader and one standby.
pub const DEFAULT_REPLICAS: i32 = 2;

/// A Choria provisioner: a Deployment of leader-elected `choria-provisioner run`
/// replicas configured from this spec.
// clippy takes the repeated `printcolumn(type_ = ...)` for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "provisioning.choria.io",
    version = "v1alpha1",
    kind = "Provisioner",
    namespaced,
    status = "ProvisionerStatus",
    shortname = "prov",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    doc = "A Choria provisioner: leader-elected replicas that provision Choria Servers waiting in provisioning mode.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#
    ),
    printcolumn(name = "Leader", type_ = "string", json_path = ".status.leader"),
    printcolumn(name = "Paused", type_ = "boolean", json_path = ".spec.paused"),
    printcolumn(
        name = "Provisioned",
        type_ = "integer",
        json_path = ".status.provisioned"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ProvisionerSpec {
    /// Provisioner pods. In `Leader` mode only the leader provisions and the
    /// others stand by to take over; in `Shards` mode each works its share.
    /// With two or more, a PodDisruptionBudget bounds node drains: it keeps
    /// one pod running in `Leader` mode (`minAvailable: 1`) and lets one go
    /// at a time in `Shards` mode (`maxUnavailable: 1`).
    #[serde(default = "default_replicas")]
    pub replicas: i32,

    /// The container image with the `choria-provisioner` binary (default:
    /// the operator's own image). The cluster admin decides which images a
    /// Provisioner may name (the operator's `--allowed-image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,

    /// When the kubelet pulls the image (Kubernetes' default when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,

    /// CPU and memory requests and limits of the provisioner container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Stops provisioning without restarting the pods: the pods read it from
    /// this resource and pause or resume.
    #[serde(default)]
    pub paused: bool,

    /// Leader election among the replicas.
    #[serde(default)]
    pub election: ElectionSpec,

    /// Nodes provisioned at once (default: the pod's CPU count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<i32>,

    /// Discovery interval, at least `1m` (default `1m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,

    /// Lifecycle component whose `startup` events mean "needs provisioning"
    /// (default `provision_mode_server`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle_component: Option<String>,

    /// The `site` label on every metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,

    /// Speak protocol v1 without TLS or signatures (test networks only).
    #[serde(default)]
    pub choria_insecure: bool,

    /// What is done for each node.
    #[serde(default)]
    pub features: Features,

    /// Regular expressions refused in CSR names (default: the Go
    /// provisioner's list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cert_deny_list: Vec<String>,

    /// Validity of the server JWTs issued with `features.ed25519`, a Choria
    /// duration such as `1y` or `90d` (default `1y`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_jwt_validity: Option<String>,

    /// Where nodes download upgrades from (`features.upgrades`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrades_repository: Option<String>,

    /// Provision a node even when its upgrade fails.
    #[serde(default)]
    pub upgrades_optional: bool,

    /// Log level of the provisioner: `Debug`, `Info`, `Warn` (the default,
    /// as in Go), `Error` or `Fatal` (lower case is still accepted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<LogLevel>,

    /// The longest one broadcast discovery may take (default `10s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_timeout: Option<String>,

    /// Discovery ends after this long without a reply (default `1s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_window: Option<String>,

    /// How long the helper may run per node (default `10s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helper_timeout: Option<String>,

    /// How long one RPC attempt waits for its reply (default: Go's 2s plus
    /// the agent's timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpc_timeout: Option<String>,

    /// Port of `/metrics`, `/healthz` and `/readyz` in the pods, and of the
    /// `<name>-metrics` Service.
    #[serde(default = "default_monitor_port")]
    pub monitor_port: i32,

    /// The Choria broker and how to log in to it.
    pub broker: BrokerSpec,

    /// The provisioning token sent to nodes (their `provisioning.jwt`'s
    /// `cht` claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret: Option<SecretKeyRef>,

    /// Password of the broker user `provisioner`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker_password_secret: Option<SecretKeyRef>,

    /// Public key or certificate (PEM, or a hex ed25519 key) that verifies the
    /// nodes' `provisioning.jwt`; required with `features.jwt` or
    /// `features.ed25519`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt_verify_key_secret: Option<SecretKeyRef>,

    /// Key that signs server JWTs (hex ed25519 seed); required with
    /// `features.ed25519`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt_signing_key_secret: Option<SecretKeyRef>,

    /// Our chain-issuer client JWT, adding chain-issuer data to server JWTs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt_signing_token_secret: Option<SecretKeyRef>,

    /// The ed25519 seed (64 hex characters) the replicas seal what they
    /// write to the bus and read back with: records (`spec.records`) and,
    /// in shards mode, their membership. Unset: the operator makes a
    /// Secret `<name>-signing-key` (key `seed`) once, owned by this
    /// Provisioner, and keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_key_secret: Option<SecretKeyRef>,

    /// Public keys (64 hex characters each) whose seals the pods trust
    /// besides their signing key's: the previous key's, while records and
    /// replicas sealed with it remain (a key rotation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signing_verify_keys: Vec<String>,

    /// The helper that decides each node's configuration; optional when
    /// `nodeConfiguration` configures the nodes (then its answer is merged
    /// over the templates').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helper: Option<HelperSpec>,

    /// Each node's configuration as templates (`configuration_template` of
    /// `provisioner.yaml`): no process per node for the common case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_configuration: Option<NodeConfigurationSpec>,

    /// Who signs the nodes' certificates with `features.pki` when the
    /// helper does not: cert-manager or the built-in CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pki: Option<PkiSpec>,
    /// A record of every provisioning in a Choria Streams (JetStream) KV
    /// bucket (`records:` of `provisioner.yaml`). The provisioning account
    /// of a Choria broker has no KV access: point this at an account or a
    /// server that has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<RecordsSpec>,
    /// Renew credentials before they expire (`renewal:`): needs `records`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewal: Option<RenewalSpec>,
    /// The admission policy (`admission:`): a Rego file every node must
    /// pass before anything is signed or configured for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionSpec>,
    /// The cloud instance identity evidence every node must present
    /// (`evidence:`); one identity per instance (the default) needs
    /// `records`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<EvidenceSpec>,
    /// Every decision about a node as a sealed event on a JetStream stream
    /// (`audit:`): needs `records`, whose connection and key it uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditSpec>,
    /// Identities never to provision or renew again, as `choria-provisioner
    /// revoke` does: the pods write each as a sealed revocation in the
    /// records' revocations bucket, and lift it again when it leaves this
    /// list (only those this list revoked). Needs `records`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "attested::revocations_schema")]
    pub revocations: Vec<RevokedNode>,
    /// Names bound to a cloud instance, as `choria-provisioner rebind
    /// --instance` binds them (a replaced machine's successor): while a
    /// name is listed the pods hold it to its instance, whoever binds it
    /// elsewhere meanwhile; out of the list it stays where it is. Needs
    /// `records` and `evidence` with one identity per instance.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "attested::bindings_schema")]
    pub bindings: Vec<BoundNode>,
    /// A trace per node sequence, posted over OTLP/HTTP to a collector
    /// (`telemetry:`): where each node spent its time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<TelemetrySpec>,

    /// Placement, metadata, pull secrets, environment, volumes and priority
    /// of the provisioner pods, within what the cluster admin allows.
    #[serde(default, skip_serializing_if = "PodOverrides::is_empty")]
    pub pod: PodOverrides,
}

fn default_replicas() -> i32 {
    DEFAULT_REPLICAS
}

/// The image of this build, as `scripts/build-image.sh` tags it: the
/// operator's own image when nothing says otherwise.
pub fn default_image() -> String {
    format!("choria-provisioner:{}", env!("CARGO_PKG_VERSION"))
}

fn default_monitor_port() -> i32 {
    DEFAULT_MONITOR_PORT
}

/// The CRD: the schema derived from the types, with the admission rules of
/// [`validation`].
pub fn crd() -> CustomResourceDefinition {
    use kube::CustomResourceExt;
    let mut crd = serde_json::to_value(Provisioner::crd()).expect("the CRD is plain data");
    for version in crd["spec"]["versions"].as_array_mut().into_iter().flatten() {
        validation::add_to(&mut version["schema"]["openAPIV3Schema"]);
    }
    serde_json::from_value(crd).expect("still a CRD")
}

/// The CRD as YAML, as `choria-provisioner crd` prints it.
pub fn crd_yaml() -> String {
    // Serializing a CRD cannot fail: it is plain data.
    serde_norway::to_string(&crd()).expect("the CRD serializes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn one_api_version_for_every_use() {
        use kube::Resource;
        assert_eq!(Provisioner::api_version(&()), API_VERSION);
        assert_eq!(API_VERSION, format!("{GROUP}/{VERSION}"));
        assert_eq!(Provisioner::kind(&()), KIND);
    }

    #[test]
    fn committed_crd_matches_the_code() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../crds/provisioner.yaml");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == crd_yaml(),
            "crds/provisioner.yaml differs from the CRD the code generates; \
             run `choria-provisioner crd > crds/provisioner.yaml` and commit it"
        );
    }

    /// The rules a CRD's schema must follow to be structural
    /// (apiextensions' "Specifying a structural schema").
    fn structural_problems(node: &Value, path: &str, in_junctor: bool, out: &mut Vec<String>) {
        let Some(obj) = node.as_object() else {
            out.push(format!("{path}: not an object"));
            return;
        };
        let flag = |k: &str| obj.get(k).and_then(Value::as_bool) == Some(true);
        if in_junctor {
            // Only `required` and nested structure are allowed inside
            // anyOf/oneOf/allOf/not.
            for k in obj.keys() {
                if !matches!(
                    k.as_str(),
                    "required" | "properties" | "items" | "anyOf" | "oneOf" | "allOf" | "not"
                ) {
                    out.push(format!("{path}: {k} inside a junctor"));
                }
            }
        } else if !obj.contains_key("type")
            && !flag("x-kubernetes-int-or-string")
            && !flag("x-kubernetes-preserve-unknown-fields")
        {
            out.push(format!("{path}: no type"));
        }
        if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
            out.push(format!("{path}: both properties and additionalProperties"));
        }
        if let Some(props) = obj.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                structural_problems(v, &format!("{path}.{k}"), in_junctor, out);
            }
        }
        if let Some(items) = obj.get("items") {
            structural_problems(items, &format!("{path}[]"), in_junctor, out);
        }
        if let Some(ap) = obj.get("additionalProperties").filter(|v| v.is_object()) {
            structural_problems(ap, &format!("{path}{{}}"), in_junctor, out);
        }
        for junctor in ["anyOf", "oneOf", "allOf"] {
            for (i, v) in obj
                .get(junctor)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                structural_problems(v, &format!("{path}.{junctor}[{i}]"), true, out);
            }
        }
        if let Some(not) = obj.get("not") {
            structural_problems(not, &format!("{path}.not"), true, out);
        }
    }

    fn schema() -> Value {
        let crd = serde_json::to_value(crd()).unwrap();
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
    }

    #[test]
    fn schema_is_structural() {
        let mut problems = Vec::new();
        structural_problems(&schema(), "", false, &mut problems);
        assert!(
            problems.is_empty(),
            "not structural:\n{}",
            problems.join("\n")
        );
    }

    #[test]
    fn the_walker_catches_what_is_not_structural() {
        let bad = serde_json::json!({
            "type": "object",
            "properties": {
                "free": {},
                "both": {"type": "object", "properties": {}, "additionalProperties": {"type": "string"}},
                "alt": {"type": "object", "anyOf": [{"type": "string"}]},
                "ok": {"x-kubernetes-int-or-string": true}
            }
        });
        let mut problems = Vec::new();
        structural_problems(&bad, "", false, &mut problems);
        assert_eq!(
            problems,
            [
                ".alt.anyOf[0]: type inside a junctor",
                ".both: both properties and additionalProperties",
                ".free: no type",
            ]
        );
    }

    #[test]
    fn names_columns_defaults_and_descriptions() {
        let crd = serde_json::to_value(crd()).unwrap();
        let spec = &crd["spec"];
        assert_eq!(
            crd["metadata"]["name"],
            "provisioners.provisioning.choria.io"
        );
        assert_eq!(spec["scope"], "Namespaced");
        assert_eq!(spec["names"]["shortNames"], serde_json::json!(["prov"]));
        let version = &spec["versions"][0];
        assert_eq!(version["name"], VERSION);
        assert_eq!(version["subresources"]["status"], serde_json::json!({}));
        let columns: Vec<(&str, &str, &str)> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap(),
                    c["type"].as_str().unwrap(),
                    c["jsonPath"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            columns,
            [
                (
                    "Ready",
                    "string",
                    r#".status.conditions[?(@.type=="Ready")].status"#
                ),
                ("Leader", "string", ".status.leader"),
                ("Paused", "boolean", ".spec.paused"),
                ("Provisioned", "integer", ".status.provisioned"),
                ("Age", "date", ".metadata.creationTimestamp"),
            ]
        );

        let s = schema();
        let props = &s["properties"]["spec"]["properties"];
        assert_eq!(props["replicas"]["default"], 2);
        assert_eq!(props["monitorPort"]["default"], 8080);
        assert!(
            props["image"].get("default").is_none(),
            "unset: the operator's own"
        );
        assert_eq!(
            props["election"]["properties"]["backend"]["default"],
            "Lease"
        );
        assert_eq!(
            props["election"]["properties"]["backend"]["enum"],
            serde_json::json!(["Lease", "Streams", "None", "lease", "streams", "none"])
        );
        let required = s["properties"]["spec"]["required"].as_array().unwrap();
        assert!(required.contains(&"broker".into()) && !required.contains(&"helper".into()));
        assert_eq!(
            props["broker"]["required"],
            serde_json::json!(["urls"]),
            "{}",
            props["broker"]
        );
        // Every spec field is documented.
        fn undocumented(node: &Value, path: &str, out: &mut Vec<String>) {
            if let Some(p) = node.get("properties").and_then(Value::as_object) {
                for (k, v) in p {
                    let here = format!("{path}.{k}");
                    if v.get("description").is_none() {
                        out.push(here.clone());
                    }
                    undocumented(v, &here, out);
                }
            }
        }
        let mut missing = Vec::new();
        undocumented(&s["properties"]["spec"], "spec", &mut missing);
        assert!(missing.is_empty(), "no description: {missing:?}");

        let conditions = &s["properties"]["status"]["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map");
        assert_eq!(
            conditions["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"])
        );
        assert_eq!(conditions["items"]["type"], "object");
    }

    #[test]
    fn enum_values_are_spelt_as_kubernetes_spells_them_and_the_old_spelling_still_reads() {
        for (new, old, want) in [
            ("Lease", "lease", ElectionBackend::Lease),
            ("Streams", "streams", ElectionBackend::Streams),
            ("None", "none", ElectionBackend::None),
        ] {
            for spelt in [new, old] {
                let got: ElectionBackend =
                    serde_json::from_value(serde_json::json!(spelt)).unwrap();
                assert_eq!(got, want, "{spelt}");
            }
            assert_eq!(serde_json::to_value(want).unwrap(), serde_json::json!(new));
        }
        for (spelt, want) in [
            ("Warn", LogLevel::Warn),
            ("warn", LogLevel::Warn),
            ("Debug", LogLevel::Debug),
        ] {
            let got: LogLevel = serde_json::from_value(serde_json::json!(spelt)).unwrap();
            assert_eq!(got, want, "{spelt}");
        }
        assert_eq!(
            LogLevel::Info.as_str(),
            "info",
            "provisioner.yaml keeps Go's spelling"
        );
        assert!(serde_json::from_value::<LogLevel>(serde_json::json!("verbose")).is_err());
    }

    #[test]
    fn a_minimal_resource_gets_the_defaults() {
        let p: Provisioner = serde_json::from_value(serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": "prov", "namespace": "choria"},
            "spec": {
                "broker": {"urls": ["nats://broker:4222"]},
                "helper": {"command": "/bin/helper"}
            }
        }))
        .unwrap();
        assert_eq!(p.spec.replicas, 2);
        assert_eq!(p.spec.monitor_port, 8080);
        assert_eq!(p.spec.election.backend, ElectionBackend::Lease);
        assert!(!p.spec.paused);
        assert_eq!(p.spec.image, None);
        assert!(p.status.is_none());
    }
}

//! `spec.pod`: what a `Provisioner` may add to its pods beyond the
//! provisioner's own settings — placement, metadata, pull secrets,
//! environment, volumes, priority.
//!
//! Whoever may create a `Provisioner` is less trusted than the cluster
//! admin, and the operator makes the pods with its own rights. So what
//! reaches beyond the namespace is the admin's choice (the operator's
//! policy flags), and what can be ruled out here is ruled out by the types:
//! a volume can only be one of the sources [`PodVolume`] has (no
//! `hostPath`, no inline CSI or ephemeral claim); environment variables and
//! mounts that would override what the operator sets itself are refused
//! (the names and paths below, checked by the CRD's rules and again by the
//! operator).

use k8s_openapi::api::core::v1::{
    Affinity, ConfigMapVolumeSource, DownwardAPIVolumeSource, EmptyDirVolumeSource, EnvVar,
    PersistentVolumeClaimVolumeSource, ProjectedVolumeSource, SecretVolumeSource, Toleration,
    Volume, VolumeMount,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Environment variables `spec.pod.env` may not set: the pod's name and
/// namespace (the operator sets them: the provisioner names its Lease
/// holder and status entries with them), what `choria-provisioner` reads
/// for its Choria identity and certificate name (`USER`, `HOME`,
/// `HOSTNAME`, `MCOLLECTIVE_CERTNAME`) and what its Kubernetes client reads
/// to find the API server (`KUBECONFIG`, `KUBERNETES_SERVICE_*`).
pub const RESERVED_ENV: [&str; 9] = [
    "POD_NAME",
    "POD_NAMESPACE",
    "USER",
    "HOME",
    "HOSTNAME",
    "MCOLLECTIVE_CERTNAME",
    "KUBECONFIG",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
];
/// The prefix of `choria-provisioner`'s own variables (its flags' `env`,
/// such as the resource it runs as and its log filter): refused too.
pub const RESERVED_ENV_PREFIX: &str = "CHORIA_PROVISIONER_";
/// Where the operator mounts what the pods need: the configuration,
/// Secrets and helper under the first, scratch space at the second. A
/// mount of `spec.pod` may not be at, in or above either.
pub const OPERATOR_MOUNT_ROOTS: [&str; 2] = ["/etc/choria-provisioner", "/tmp"];
/// Names of the operator's own volumes, besides `secret-<n>`.
pub const RESERVED_VOLUMES: [&str; 4] = ["config", "tmp", "helper", "admission"];

/// Whether `spec.pod.env` may not set `name`.
pub fn is_reserved_env(name: &str) -> bool {
    RESERVED_ENV.contains(&name) || name.starts_with(RESERVED_ENV_PREFIX)
}

/// Whether the operator may name a volume `name` itself: one of
/// [`RESERVED_VOLUMES`] or `secret-<n>` (a mounted Secret).
pub fn is_reserved_volume(name: &str) -> bool {
    let secret = name
        .strip_prefix("secret-")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    secret || RESERVED_VOLUMES.contains(&name)
}

/// Whether a mount at `path` (absolute, without `.` or `..` segments or a
/// trailing `/`) would be at, in or above one of [`OPERATOR_MOUNT_ROOTS`]:
/// it would hide what the operator mounts there, or be hidden by it.
pub fn shadows_operator_mount(path: &str) -> bool {
    path == "/"
        || OPERATOR_MOUNT_ROOTS.iter().any(|root| {
            path == *root
                || path.starts_with(&format!("{root}/"))
                || root.starts_with(&format!("{path}/"))
        })
}

/// Pod placement, metadata and additions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodOverrides {
    /// Node labels the pods must run on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Node and pod (anti-)affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Extra pod annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Extra pod labels (the operator's selector labels win).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Secrets of this namespace (`kubernetes.io/dockerconfigjson`), by
    /// name, that the kubelet pulls the image with: how the pods pull from
    /// a private registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "name_set_schema")]
    pub image_pull_secrets: Vec<String>,
    /// Extra environment variables of the provisioner container, and so of
    /// its helper: a `value`, or `valueFrom` a key of a Secret or ConfigMap
    /// of this namespace, a field of the pod (`fieldRef`) or a resource of
    /// the container (`resourceFieldRef`). Names the operator sets or the
    /// provisioner reads itself are refused: `POD_NAME`, `POD_NAMESPACE`,
    /// `USER`, `HOME`, `HOSTNAME`, `MCOLLECTIVE_CERTNAME`, `KUBECONFIG`,
    /// `KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT` and
    /// `CHORIA_PROVISIONER_*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "env_schema")]
    pub env: Vec<EnvVar>,
    /// Extra volumes of the pods, for `volumeMounts`. Each has one source
    /// of those listed here, as far as the cluster admin allows (the
    /// operator's `--allowed-volume-type`; by default every one but
    /// `persistentVolumeClaim`); others, such as `hostPath`, cannot be
    /// asked for. The operator's own names (`config`, `tmp`, `helper`,
    /// `admission`, `secret-<n>`) are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "volumes_schema")]
    pub volumes: Vec<PodVolume>,
    /// Where `volumes` are mounted in the provisioner container: not at, in
    /// or above `/etc/choria-provisioner` or `/tmp`, where the operator
    /// mounts the configuration, Secrets, helper and scratch space. Secret,
    /// ConfigMap, projected and downward API volumes are mounted read-only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "mounts_schema")]
    pub volume_mounts: Vec<VolumeMount>,
    /// The pods' PriorityClass: only one the cluster admin allows (the
    /// operator's `--allowed-priority-class`; none by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

impl PodOverrides {
    pub(super) fn is_empty(&self) -> bool {
        *self == PodOverrides::default()
    }

    /// The volume `name` of `volumes`, if any.
    pub fn volume(&self, name: &str) -> Option<&PodVolume> {
        self.volumes.iter().find(|v| v.name == name)
    }
}

/// A volume of the pods, with one of the sources the operator may mount.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodVolume {
    /// The volume's name, which `volumeMounts` refer to: a DNS label.
    pub name: String,
    /// A Secret of this namespace, as files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretVolumeSource>,
    /// A ConfigMap of this namespace, as files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapVolumeSource>,
    /// A scratch directory that lives as long as the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<EmptyDirVolumeSource>,
    /// Secrets, ConfigMaps and fields of the pod in one directory (not
    /// `serviceAccountToken` or `clusterTrustBundle`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projected: Option<ProjectedVolumeSource>,
    /// Fields of the pod as files.
    #[serde(
        default,
        rename = "downwardAPI",
        skip_serializing_if = "Option::is_none"
    )]
    pub downward_api: Option<DownwardAPIVolumeSource>,
    /// A PersistentVolumeClaim of this namespace: only when the cluster
    /// admin allows it (`--allowed-volume-type=persistentVolumeClaim`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
}

impl PodVolume {
    /// The sources it sets: exactly one in a valid spec.
    pub fn types(&self) -> Vec<VolumeType> {
        let set = [
            self.secret.is_some(),
            self.config_map.is_some(),
            self.empty_dir.is_some(),
            self.projected.is_some(),
            self.downward_api.is_some(),
            self.persistent_volume_claim.is_some(),
        ];
        VolumeType::ALL
            .into_iter()
            .zip(set)
            .filter_map(|(t, set)| set.then_some(t))
            .collect()
    }

    /// The pod's volume.
    pub fn to_volume(&self) -> Volume {
        Volume {
            name: self.name.clone(),
            secret: self.secret.clone(),
            config_map: self.config_map.clone(),
            empty_dir: self.empty_dir.clone(),
            projected: self.projected.clone(),
            downward_api: self.downward_api.clone(),
            persistent_volume_claim: self.persistent_volume_claim.clone(),
            ..Volume::default()
        }
    }
}

/// A source a [`PodVolume`] may have, named as its field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum VolumeType {
    Secret,
    ConfigMap,
    EmptyDir,
    Projected,
    DownwardApi,
    PersistentVolumeClaim,
}

impl VolumeType {
    /// Every one, in the order of [`PodVolume`]'s fields.
    pub const ALL: [VolumeType; 6] = [
        VolumeType::Secret,
        VolumeType::ConfigMap,
        VolumeType::EmptyDir,
        VolumeType::Projected,
        VolumeType::DownwardApi,
        VolumeType::PersistentVolumeClaim,
    ];
    /// What the operator allows unless told otherwise: everything but a
    /// claim, whose data outlives the pod and may be shared with others.
    pub const DEFAULT_ALLOWED: [VolumeType; 5] = [
        VolumeType::Secret,
        VolumeType::ConfigMap,
        VolumeType::EmptyDir,
        VolumeType::Projected,
        VolumeType::DownwardApi,
    ];

    /// Its field name in a volume.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeType::Secret => "secret",
            VolumeType::ConfigMap => "configMap",
            VolumeType::EmptyDir => "emptyDir",
            VolumeType::Projected => "projected",
            VolumeType::DownwardApi => "downwardAPI",
            VolumeType::PersistentVolumeClaim => "persistentVolumeClaim",
        }
    }

    /// Whether the kubelet writes its files and the pod only reads them:
    /// such a volume is mounted read-only.
    pub fn read_only(self) -> bool {
        !matches!(
            self,
            VolumeType::EmptyDir | VolumeType::PersistentVolumeClaim
        )
    }
}

impl std::fmt::Display for VolumeType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for VolumeType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        VolumeType::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<&str> = VolumeType::ALL.iter().map(|t| t.as_str()).collect();
                format!(
                    "{s:?} is not a volume type a Provisioner may use; use one of: {} (others, such as hostPath, are never allowed)",
                    all.join(", ")
                )
            })
    }
}

/// A list the API server keeps as a map keyed by `key`: each entry unique,
/// and merged by key under server-side apply.
pub(super) fn keyed<T: JsonSchema>(
    generator: &mut schemars::SchemaGenerator,
    key: &str,
) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<T>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!([key]),
    );
    schema
}

fn env_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    keyed::<EnvVar>(generator, "name")
}

fn volumes_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    keyed::<PodVolume>(generator, "name")
}

fn mounts_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    keyed::<VolumeMount>(generator, "mountPath")
}

/// Names, each once.
fn name_set_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<String>>();
    schema.insert("x-kubernetes-list-type".into(), "set".into());
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_names_and_paths() {
        for name in ["POD_NAME", "KUBECONFIG", "CHORIA_PROVISIONER_LOG", "USER"] {
            assert!(is_reserved_env(name), "{name}");
        }
        for name in ["HELPER_CA", "PATH", "CHORIA_PROVISIONER", "pod_name"] {
            assert!(!is_reserved_env(name), "{name}");
        }
        for name in ["config", "tmp", "helper", "secret-0", "secret-12"] {
            assert!(is_reserved_volume(name), "{name}");
        }
        for name in ["secret-", "secret-ca", "ca", "configs"] {
            assert!(!is_reserved_volume(name), "{name}");
        }
        for path in [
            "/",
            "/etc",
            "/etc/choria-provisioner",
            "/etc/choria-provisioner/helper/ca",
            "/tmp",
            "/tmp/x",
        ] {
            assert!(shadows_operator_mount(path), "{path}");
        }
        for path in [
            "/etc/ca",
            "/etc/choria-provisioner-ca",
            "/tmpfs",
            "/var/tmp",
        ] {
            assert!(!shadows_operator_mount(path), "{path}");
        }
    }

    #[test]
    fn volume_types_parse_and_name_their_field() {
        for t in VolumeType::ALL {
            assert_eq!(t.as_str().parse::<VolumeType>(), Ok(t));
            assert_eq!(t.to_string(), t.as_str());
        }
        let e = "hostPath".parse::<VolumeType>().unwrap_err();
        assert!(e.contains("never allowed"), "{e}");
        let v: PodVolume = serde_json::from_value(serde_json::json!({
            "name": "ca", "downwardAPI": {"items": []}
        }))
        .unwrap();
        assert_eq!(v.types(), [VolumeType::DownwardApi]);
        let volume = serde_json::to_value(v.to_volume()).unwrap();
        assert_eq!(
            volume,
            serde_json::json!({"name": "ca", "downwardAPI": {"items": []}})
        );
    }
}

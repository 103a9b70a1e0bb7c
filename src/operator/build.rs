//! The objects a `Provisioner` stands for, built without a cluster: the
//! reconciler applies exactly these, so tests of these functions are tests of
//! what lands in the cluster.
//!
//! Secrets never appear in what is built here: the spec only names Secret
//! keys, which reach the pods as files under
//! `/etc/choria-provisioner/secrets/<secret>/<key>`, and the configuration
//! only holds those paths.

use super::crd::{ElectionBackend, Provisioner, ProvisionerSpec, SecretKeyRef};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, HTTPGetAction, KeyToPath, ObjectFieldSelector, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, SeccompProfile, SecretVolumeSource, SecurityContext, Service,
    ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

/// Where the ConfigMap is mounted.
pub const CONFIG_DIR: &str = "/etc/choria-provisioner/config";
/// Where each referenced Secret is mounted, one directory per Secret.
pub const SECRETS_DIR: &str = "/etc/choria-provisioner/secrets";
/// Where `spec.helper.configMap` is mounted.
pub const HELPER_DIR: &str = "/etc/choria-provisioner/helper";
/// The ConfigMap key of the provisioner's configuration.
pub const PROVISIONER_YAML: &str = "provisioner.yaml";
/// The ConfigMap key of the Choria client configuration.
pub const CHORIA_CFG: &str = "choria.cfg";
/// Pod template annotation: sha256 of the ConfigMap data, so a configuration
/// change rolls the pods (they read it once, at start).
pub const CHECKSUM_ANNOTATION: &str = "provisioning.choria.io/config-checksum";
/// The label every owned object carries; the operator watches only these.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "choria-provisioner-operator";
/// The provisioner container and its monitoring port's name.
pub const CONTAINER: &str = "provisioner";
pub const MONITOR_PORT_NAME: &str = "monitor";
/// A non-root user and group; `fsGroup` makes mounted Secrets readable to it.
pub const RUN_AS: i64 = 65532;

/// Keys of `spec.broker.tlsSecret` (a `kubernetes.io/tls` Secret).
pub const TLS_KEYS: [&str; 3] = ["tls.crt", "tls.key", "ca.crt"];
/// Keys of `spec.broker.clientJwtSecret`.
pub const CLIENT_JWT_KEYS: [&str; 2] = ["token", "seed"];

/// Why nothing can be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The resource as read from the API always has these.
    #[error("the Provisioner has no {0} (not read from the API server?)")]
    Missing(&'static str),
    #[error("could not write {what}: {message}")]
    Serialize { what: &'static str, message: String },
}

/// Everything one `Provisioner` owns.
#[derive(Clone, Debug)]
pub struct Owned {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub config_map: ConfigMap,
    pub service: Service,
    pub deployment: Deployment,
    /// Only with two replicas or more; otherwise the reconciler deletes it.
    pub pdb: Option<PodDisruptionBudget>,
}

/// Builds every owned object.
pub fn owned(p: &Provisioner) -> Result<Owned, BuildError> {
    let config_map = config_map(p)?;
    Ok(Owned {
        service_account: service_account(p)?,
        role: role(p)?,
        role_binding: role_binding(p)?,
        deployment: deployment(p, &checksum(&config_map))?,
        config_map,
        service: service(p)?,
        pdb: pdb(p)?,
    })
}

/// Path of a Secret key inside the pods.
pub fn secret_path(secret: &str, key: &str) -> String {
    format!("{SECRETS_DIR}/{secret}/{key}")
}

fn ref_path(r: &SecretKeyRef) -> String {
    secret_path(&r.name, &r.key)
}

pub fn config_map_name(name: &str) -> String {
    format!("{name}-config")
}

pub fn service_name(name: &str) -> String {
    format!("{name}-metrics")
}

/// Labels that select this Provisioner's pods.
pub fn selector_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "choria-provisioner".into()),
        ("app.kubernetes.io/instance".into(), name.into()),
    ])
}

/// Labels of every owned object.
pub fn labels(name: &str) -> BTreeMap<String, String> {
    let mut l = selector_labels(name);
    l.insert("app.kubernetes.io/component".into(), "provisioner".into());
    l.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    l
}

/// Name, namespace, labels and the controller owner reference.
fn meta(p: &Provisioner, name: String) -> Result<ObjectMeta, BuildError> {
    Ok(ObjectMeta {
        name: Some(name),
        namespace: Some(namespace(p)?),
        labels: Some(labels(&p.name_any())),
        owner_references: Some(vec![owner_ref(p)?]),
        ..ObjectMeta::default()
    })
}

fn namespace(p: &Provisioner) -> Result<String, BuildError> {
    p.namespace().ok_or(BuildError::Missing("namespace"))
}

fn owner_ref(p: &Provisioner) -> Result<OwnerReference, BuildError> {
    p.controller_owner_ref(&())
        .ok_or(BuildError::Missing("uid"))
}

/// Every Secret the pods need and which of its keys, in a stable order.
pub fn secret_mounts(spec: &ProvisionerSpec) -> BTreeMap<String, BTreeSet<String>> {
    let mut mounts: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let refs = [
        &spec.token_secret,
        &spec.broker_password_secret,
        &spec.jwt_verify_key_secret,
        &spec.jwt_signing_key_secret,
        &spec.jwt_signing_token_secret,
    ];
    for r in refs.into_iter().flatten() {
        mounts
            .entry(r.name.clone())
            .or_default()
            .insert(r.key.clone());
    }
    for (secret, keys) in [
        (&spec.broker.tls_secret, &TLS_KEYS[..]),
        (&spec.broker.client_jwt_secret, &CLIENT_JWT_KEYS[..]),
    ] {
        if let Some(secret) = secret {
            let entry = mounts.entry(secret.clone()).or_default();
            entry.extend(keys.iter().map(|k| k.to_string()));
        }
    }
    mounts
}

/// `provisioner.yaml` as the pods read it.
#[derive(Serialize)]
struct ProvisionerYaml<'a> {
    helper: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    workers: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    interval: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    loglevel: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    broker_provisioning_password_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lifecycle_component: Option<&'a str>,
    choria_insecure: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    site: Option<&'a str>,
    monitor_port: i32,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    cert_deny_list: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    jwt_verify_cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    jwt_signing_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    jwt_signing_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_jwt_validity: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upgrades_repository: Option<&'a str>,
    upgrades_optional: bool,
    features: super::crd::Features,
    #[serde(skip_serializing_if = "Option::is_none")]
    discovery_timeout: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    discovery_window: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    helper_timeout: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rpc_timeout: Option<&'a str>,
    election: ElectionYaml<'a>,
}

#[derive(Serialize)]
struct ElectionYaml<'a> {
    backend: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_duration: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    renew_deadline: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_period: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bucket: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_prefix: Option<&'a str>,
}

/// The pods' `provisioner.yaml`. Keys of the other election backend are left
/// out, so the provisioner has nothing to warn about.
pub fn provisioner_yaml(p: &Provisioner) -> Result<String, BuildError> {
    let s = &p.spec;
    let e = &s.election;
    let lease = e.backend == ElectionBackend::Lease;
    let streams = e.backend == ElectionBackend::Streams;
    let doc = ProvisionerYaml {
        helper: &s.helper.command,
        workers: s.workers,
        interval: s.interval.as_deref(),
        loglevel: s.log_level.map(|l| l.as_str()),
        token_file: s.token_secret.as_ref().map(ref_path),
        broker_provisioning_password_file: s.broker_password_secret.as_ref().map(ref_path),
        lifecycle_component: s.lifecycle_component.as_deref(),
        choria_insecure: s.choria_insecure,
        site: s.site.as_deref(),
        monitor_port: s.monitor_port,
        cert_deny_list: &s.cert_deny_list,
        jwt_verify_cert: s.jwt_verify_key_secret.as_ref().map(ref_path),
        jwt_signing_key: s.jwt_signing_key_secret.as_ref().map(ref_path),
        jwt_signing_token: s.jwt_signing_token_secret.as_ref().map(ref_path),
        server_jwt_validity: s.server_jwt_validity.as_deref(),
        upgrades_repository: s.upgrades_repository.as_deref(),
        upgrades_optional: s.upgrades_optional,
        features: s.features,
        discovery_timeout: s.discovery_timeout.as_deref(),
        discovery_window: s.discovery_window.as_deref(),
        helper_timeout: s.helper_timeout.as_deref(),
        rpc_timeout: s.rpc_timeout.as_deref(),
        election: ElectionYaml {
            backend: e.backend.as_str(),
            lease_name: lease.then(|| p.name_any()),
            lease_namespace: if lease { Some(namespace(p)?) } else { None },
            lease_duration: e.lease_duration.as_deref().filter(|_| lease),
            renew_deadline: e.renew_deadline.as_deref().filter(|_| lease),
            retry_period: e.retry_period.as_deref().filter(|_| lease),
            bucket: e.bucket.as_deref().filter(|_| streams),
            name: e.name.as_deref().filter(|_| streams),
            api_prefix: e.api_prefix.as_deref().filter(|_| streams),
        },
    };
    let body = serde_norway::to_string(&doc).map_err(|e| BuildError::Serialize {
        what: PROVISIONER_YAML,
        message: e.to_string(),
    })?;
    Ok(format!(
        "# Written by the choria-provisioner operator from Provisioner {}/{}; edit the resource, not this.\n{body}",
        namespace(p)?,
        p.name_any()
    ))
}

/// The pods' Choria client configuration: the `choria` security provider with
/// `clientJwtSecret`, otherwise `file` (x509 from `tlsSecret`, or nothing
/// with `choriaInsecure`).
pub fn choria_cfg(p: &Provisioner) -> Result<String, BuildError> {
    let b = &p.spec.broker;
    let identity = b.identity.clone().unwrap_or_else(|| p.name_any());
    let mut lines = vec![
        format!(
            "# Written by the choria-provisioner operator from Provisioner {}/{}.",
            namespace(p)?,
            p.name_any()
        ),
        format!("identity = {identity}"),
        format!("plugin.choria.middleware_hosts = {}", b.urls.join(",")),
    ];
    let tls = |key: &str| b.tls_secret.as_ref().map(|s| secret_path(s, key));
    match &b.client_jwt_secret {
        Some(jwt) => {
            lines.push("plugin.security.provider = choria".into());
            lines.push(format!(
                "plugin.security.choria.token_file = {}",
                secret_path(jwt, "token")
            ));
            lines.push(format!(
                "plugin.security.choria.seed_file = {}",
                secret_path(jwt, "seed")
            ));
            if let (Some(ca), Some(cert), Some(key)) =
                (tls("ca.crt"), tls("tls.crt"), tls("tls.key"))
            {
                lines.push(format!("plugin.security.choria.ca = {ca}"));
                lines.push(format!("plugin.security.choria.certificate = {cert}"));
                lines.push(format!("plugin.security.choria.key = {key}"));
            }
        }
        None => {
            lines.push("plugin.security.provider = file".into());
            if let (Some(ca), Some(cert), Some(key)) =
                (tls("ca.crt"), tls("tls.crt"), tls("tls.key"))
            {
                lines.push(format!("plugin.security.file.certificate = {cert}"));
                lines.push(format!("plugin.security.file.key = {key}"));
                lines.push(format!("plugin.security.file.ca = {ca}"));
            }
        }
    }
    let mut text = lines.join("\n");
    text.push('\n');
    Ok(text)
}

/// `<name>-config` with `provisioner.yaml` and `choria.cfg`.
pub fn config_map(p: &Provisioner) -> Result<ConfigMap, BuildError> {
    Ok(ConfigMap {
        metadata: meta(p, config_map_name(&p.name_any()))?,
        data: Some(BTreeMap::from([
            (PROVISIONER_YAML.to_string(), provisioner_yaml(p)?),
            (CHORIA_CFG.to_string(), choria_cfg(p)?),
        ])),
        ..ConfigMap::default()
    })
}

/// sha256 (hex) of the ConfigMap's data: keys and values, each ended by NUL
/// so no two different maps hash alike.
pub fn checksum(cm: &ConfigMap) -> String {
    let mut h = Sha256::new();
    for (k, v) in cm.data.iter().flatten() {
        h.update(k.as_bytes());
        h.update([0]);
        h.update(v.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())
}

/// The Deployment `<name>`; `checksum` is the ConfigMap's.
pub fn deployment(p: &Provisioner, checksum: &str) -> Result<Deployment, BuildError> {
    let name = p.name_any();
    let ns = namespace(p)?;
    let s = &p.spec;
    let read_only = |name: &str, path: &str| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    };

    let mut volumes = vec![
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: config_map_name(&name),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume {
            name: "tmp".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
    ];
    let mut mounts = vec![
        read_only("config", CONFIG_DIR),
        VolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..VolumeMount::default()
        },
    ];
    for (i, (secret, keys)) in secret_mounts(s).into_iter().enumerate() {
        let volume = format!("secret-{i}");
        mounts.push(read_only(&volume, &format!("{SECRETS_DIR}/{secret}")));
        volumes.push(Volume {
            name: volume,
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret),
                // Only the keys in use; group-readable for fsGroup.
                items: Some(
                    keys.into_iter()
                        .map(|k| KeyToPath {
                            key: k.clone(),
                            path: k,
                            mode: None,
                        })
                        .collect(),
                ),
                default_mode: Some(0o440),
                optional: None,
            }),
            ..Volume::default()
        });
    }
    if let Some(cm) = &s.helper.config_map {
        mounts.push(read_only("helper", HELPER_DIR));
        volumes.push(Volume {
            name: "helper".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: cm.clone(),
                default_mode: Some(0o755),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
    }

    let field_env = |var: &str, path: &str| EnvVar {
        name: var.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    let probe = |path: &str, period: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String(MONITOR_PORT_NAME.into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(3),
        ..Probe::default()
    };
    let container = Container {
        name: CONTAINER.into(),
        image: Some(s.image.clone()),
        image_pull_policy: s.image_pull_policy.map(|p| p.as_str().to_string()),
        args: Some(vec![
            "run".into(),
            "--config".into(),
            format!("{CONFIG_DIR}/{PROVISIONER_YAML}"),
            "--choria-config".into(),
            format!("{CONFIG_DIR}/{CHORIA_CFG}"),
            "--provisioner".into(),
            format!("{ns}/{name}"),
        ]),
        env: Some(vec![
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some(MONITOR_PORT_NAME.into()),
            container_port: s.monitor_port,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(probe("/healthz", 10)),
        readiness_probe: Some(probe("/readyz", 5)),
        resources: s.resources.clone(),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(mounts),
        ..Container::default()
    };

    // The user's labels and annotations first: ours win.
    let mut pod_labels = s.pod.labels.clone();
    pod_labels.extend(labels(&name));
    let mut annotations = s.pod.annotations.clone();
    annotations.insert(CHECKSUM_ANNOTATION.into(), checksum.into());
    let non_empty = |m: &BTreeMap<String, String>| (!m.is_empty()).then(|| m.clone());

    Ok(Deployment {
        metadata: meta(p, name.clone())?,
        spec: Some(DeploymentSpec {
            replicas: Some(s.replicas),
            selector: LabelSelector {
                match_labels: Some(selector_labels(&name)),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(name.clone()),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(RUN_AS),
                        run_as_group: Some(RUN_AS),
                        fs_group: Some(RUN_AS),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            localhost_profile: None,
                        }),
                        ..PodSecurityContext::default()
                    }),
                    containers: vec![container],
                    volumes: Some(volumes),
                    node_selector: non_empty(&s.pod.node_selector),
                    tolerations: (!s.pod.tolerations.is_empty()).then(|| s.pod.tolerations.clone()),
                    affinity: s.pod.affinity.clone(),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    })
}

/// `<name>-metrics`: the monitoring port of every replica.
pub fn service(p: &Provisioner) -> Result<Service, BuildError> {
    let name = p.name_any();
    Ok(Service {
        metadata: meta(p, service_name(&name))?,
        spec: Some(ServiceSpec {
            selector: Some(selector_labels(&name)),
            ports: Some(vec![ServicePort {
                name: Some("metrics".into()),
                port: p.spec.monitor_port,
                target_port: Some(IntOrString::String(MONITOR_PORT_NAME.into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

pub fn service_account(p: &Provisioner) -> Result<ServiceAccount, BuildError> {
    Ok(ServiceAccount {
        metadata: meta(p, p.name_any())?,
        ..ServiceAccount::default()
    })
}

fn rule(group: &str, resource: &str, names: Option<&str>, verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        resource_names: names.map(|n| vec![n.to_string()]),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        non_resource_urls: None,
    }
}

/// What the pods may do: follow their own Provisioner (a watch restricted by
/// name needs a `metadata.name` field selector), write its status, and —
/// with the lease backend — hold the Lease named like it. `create` cannot be
/// restricted to a name, so it is a rule of its own.
pub fn role(p: &Provisioner) -> Result<Role, BuildError> {
    let name = p.name_any();
    let group = super::crd::GROUP;
    let mut rules = vec![
        rule(
            group,
            "provisioners",
            Some(&name),
            &["get", "watch", "list"],
        ),
        rule(
            group,
            "provisioners/status",
            Some(&name),
            &["get", "patch", "update"],
        ),
    ];
    if p.spec.election.backend == ElectionBackend::Lease {
        rules.push(rule("coordination.k8s.io", "leases", None, &["create"]));
        rules.push(rule(
            "coordination.k8s.io",
            "leases",
            Some(&name),
            &["get", "update"],
        ));
    }
    Ok(Role {
        metadata: meta(p, name)?,
        rules: Some(rules),
    })
}

pub fn role_binding(p: &Provisioner) -> Result<RoleBinding, BuildError> {
    let name = p.name_any();
    Ok(RoleBinding {
        metadata: meta(p, name.clone())?,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: Some(namespace(p)?),
            api_group: None,
        }]),
    })
}

/// Keeps one replica through voluntary disruptions; `None` below two
/// replicas, where it would block node drains.
pub fn pdb(p: &Provisioner) -> Result<Option<PodDisruptionBudget>, BuildError> {
    if p.spec.replicas < 2 {
        return Ok(None);
    }
    let name = p.name_any();
    Ok(Some(PodDisruptionBudget {
        metadata: meta(p, name.clone())?,
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(&name)),
                match_expressions: None,
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }))
}

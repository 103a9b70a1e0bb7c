//! The objects a `Provisioner` stands for, built without a cluster: the
//! reconciler applies exactly these, so tests of these functions are tests of
//! what lands in the cluster.
//!
//! Secrets never appear in what is built here: the spec only names Secret
//! keys, which reach the pods as files under
//! `/etc/choria-provisioner/secrets/<secret>/<key>`, and the configuration
//! only holds those paths.

use super::crd::{ElectionBackend, Provisioner, ProvisionerSpec, SecretKeyRef};
use crate::config::schema::{ElectionFile, FeaturesFile, ProvisionerFile};
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

/// The pods' `provisioner.yaml`. Keys of the other election backend are left
/// out, so the provisioner has nothing to warn about.
pub fn provisioner_yaml(p: &Provisioner) -> Result<String, BuildError> {
    let s = &p.spec;
    let e = &s.election;
    let lease = e.backend == ElectionBackend::Lease;
    let streams = e.backend == ElectionBackend::Streams;
    let owned = |v: Option<&String>| v.cloned();
    let doc = ProvisionerFile {
        helper: Some(s.helper.command.clone()),
        workers: s.workers.map(i64::from),
        interval: owned(s.interval.as_ref()),
        loglevel: s.log_level.map(|l| l.as_str().to_string()),
        token_file: s.token_secret.as_ref().map(ref_path),
        broker_provisioning_password_file: s.broker_password_secret.as_ref().map(ref_path),
        lifecycle_component: owned(s.lifecycle_component.as_ref()),
        choria_insecure: Some(s.choria_insecure),
        site: owned(s.site.as_ref()),
        monitor_port: Some(i64::from(s.monitor_port)),
        cert_deny_list: (!s.cert_deny_list.is_empty()).then(|| s.cert_deny_list.clone()),
        jwt_verify_cert: s.jwt_verify_key_secret.as_ref().map(ref_path),
        jwt_signing_key: s.jwt_signing_key_secret.as_ref().map(ref_path),
        jwt_signing_token: s.jwt_signing_token_secret.as_ref().map(ref_path),
        server_jwt_validity: owned(s.server_jwt_validity.as_ref()),
        upgrades_repository: owned(s.upgrades_repository.as_ref()),
        upgrades_optional: Some(s.upgrades_optional),
        features: Some(FeaturesFile {
            pki: Some(s.features.pki),
            jwt: Some(s.features.jwt),
            ed25519: Some(s.features.ed25519),
            upgrades: Some(s.features.upgrades),
        }),
        discovery_timeout: owned(s.discovery_timeout.as_ref()),
        discovery_window: owned(s.discovery_window.as_ref()),
        helper_timeout: owned(s.helper_timeout.as_ref()),
        rpc_timeout: owned(s.rpc_timeout.as_ref()),
        election: Some(ElectionFile {
            backend: Some(e.backend.as_str().to_string()),
            lease_name: lease.then(|| p.name_any()),
            lease_namespace: if lease { Some(namespace(p)?) } else { None },
            lease_duration: owned(e.lease_duration.as_ref()).filter(|_| lease),
            renew_deadline: owned(e.renew_deadline.as_ref()).filter(|_| lease),
            retry_period: owned(e.retry_period.as_ref()).filter(|_| lease),
            bucket: owned(e.bucket.as_ref()).filter(|_| streams),
            name: owned(e.name.as_ref()).filter(|_| streams),
            api_prefix: owned(e.api_prefix.as_ref()).filter(|_| streams),
            ..Default::default()
        }),
        ..Default::default()
    };
    let body = doc.to_yaml().map_err(|e| BuildError::Serialize {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ChoriaClientConfig, Environment, ProvisionerConfig, SecurityProvider};
    use crate::operator::fixtures::{provisioner, NS, UID};
    use serde_json::json;
    use std::path::PathBuf;

    fn config(p: &Provisioner) -> ProvisionerConfig {
        let text = provisioner_yaml(p).unwrap();
        ProvisionerConfig::parse(&text, PROVISIONER_YAML)
            .unwrap_or_else(|e| panic!("the provisioner refuses\n{text}\n{e}"))
    }

    fn choria(p: &Provisioner) -> ChoriaClientConfig {
        ChoriaClientConfig::parse(&choria_cfg(p).unwrap(), CHORIA_CFG, &Environment::default())
            .unwrap()
    }

    fn jwt_spec() -> Provisioner {
        provisioner(json!({
            "features": {"jwt": true},
            "tokenSecret": {"name": "prov-secrets", "key": "token"},
            "brokerPasswordSecret": {"name": "prov-secrets", "key": "broker-password"},
            "jwtVerifyKeySecret": {"name": "prov-signer", "key": "signer.pem"},
            "workers": 4,
            "interval": "5m",
            "site": "lab",
            "logLevel": "info",
            "certDenyList": ["^bad"],
            "election": {"leaseDuration": "20s"},
        }))
    }

    #[test]
    fn provisioner_yaml_is_what_the_provisioner_reads() {
        let cfg = config(&jwt_spec());
        let path = |s: &str| Some(PathBuf::from(s));
        assert_eq!(cfg.helper, "/etc/choria-provisioner/helper/helper.sh");
        assert_eq!(cfg.workers, 4);
        assert_eq!(cfg.interval_text, "5m");
        assert_eq!(cfg.site, "lab");
        assert_eq!(cfg.loglevel.as_deref(), Some("info"));
        assert_eq!(cfg.monitor_port, Some(8080));
        assert_eq!(cfg.cert_deny_list, ["^bad"]);
        assert!(cfg.features.jwt && !cfg.features.pki && !cfg.features.ed25519);
        assert_eq!(
            cfg.token_file,
            path("/etc/choria-provisioner/secrets/prov-secrets/token")
        );
        assert_eq!(
            cfg.broker_provisioning_password_file,
            path("/etc/choria-provisioner/secrets/prov-secrets/broker-password")
        );
        assert_eq!(
            cfg.jwt_verify_cert.as_deref(),
            Some("/etc/choria-provisioner/secrets/prov-signer/signer.pem")
        );
        assert_eq!(cfg.election.backend, crate::config::ElectionBackend::Lease);
        assert_eq!(cfg.election.lease_name, "prov");
        assert_eq!(cfg.election.lease_namespace.as_deref(), Some(NS));
        assert_eq!(
            cfg.election.lease_duration,
            std::time::Duration::from_secs(20)
        );
        assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
    }

    #[test]
    fn secrets_appear_only_as_paths() {
        let p = jwt_spec();
        let cm = config_map(&p).unwrap();
        let yaml = &cm.data.as_ref().unwrap()[PROVISIONER_YAML];
        // The parsed configuration holds no secret, only where to read it.
        let cfg = config(&p);
        assert!(cfg.token.is_empty());
        assert!(cfg.broker_provisioning_password.is_none());
        for line in yaml.lines().filter(|l| l.contains("secret")) {
            assert!(line.contains(SECRETS_DIR), "{line}");
        }
        for key in ["token:", "broker_provisioning_password:"] {
            assert!(
                !yaml.lines().any(|l| l.starts_with(key)),
                "{key} in\n{yaml}"
            );
        }
    }

    #[test]
    fn x509_login_uses_the_file_provider() {
        let c = choria(&jwt_spec());
        assert_eq!(c.identity, "prov");
        assert_eq!(c.middleware_hosts, ["nats://broker.example.net:4222"]);
        assert_eq!(c.security_provider(false).unwrap(), SecurityProvider::File);
        let p = |k: &str| {
            Some(PathBuf::from(format!(
                "/etc/choria-provisioner/secrets/prov-tls/{k}"
            )))
        };
        assert_eq!(c.file_certificate, p("tls.crt"));
        assert_eq!(c.file_key, p("tls.key"));
        assert_eq!(c.file_ca, p("ca.crt"));
    }

    #[test]
    fn ed25519_with_a_client_jwt_uses_the_choria_provider_and_streams() {
        let p = provisioner(json!({
            "broker": {"tlsSecret": null, "clientJwtSecret": "prov-jwt", "identity": "provisioner.example.net",
                       "urls": ["tls://b1:4222", "tls://b2:4222"]},
            "features": {"ed25519": true},
            "jwtVerifyKeySecret": {"name": "prov-keys", "key": "verify"},
            "jwtSigningKeySecret": {"name": "prov-keys", "key": "signer.seed"},
            "jwtSigningTokenSecret": {"name": "prov-keys", "key": "signer.jwt"},
            "election": {"backend": "streams", "bucket": "ELECTIONS", "leaseDuration": "20s"},
        }));
        let cfg = config(&p);
        assert!(cfg.features.ed25519 && cfg.features.jwt);
        assert_eq!(
            cfg.jwt_signing_key,
            Some(PathBuf::from(
                "/etc/choria-provisioner/secrets/prov-keys/signer.seed"
            ))
        );
        assert_eq!(
            cfg.jwt_signing_token,
            Some(PathBuf::from(
                "/etc/choria-provisioner/secrets/prov-keys/signer.jwt"
            ))
        );
        assert_eq!(
            cfg.election.backend,
            crate::config::ElectionBackend::Streams
        );
        assert_eq!(cfg.election.bucket, "ELECTIONS");
        let yaml = provisioner_yaml(&p).unwrap();
        assert!(!yaml.contains("lease"), "lease keys with streams:\n{yaml}");

        let c = choria(&p);
        assert_eq!(c.identity, "provisioner.example.net");
        assert_eq!(c.middleware_hosts, ["tls://b1:4222", "tls://b2:4222"]);
        assert_eq!(
            c.security_provider(false).unwrap(),
            SecurityProvider::Choria
        );
        assert_eq!(
            c.choria_token_file,
            Some(PathBuf::from(
                "/etc/choria-provisioner/secrets/prov-jwt/token"
            ))
        );
        assert_eq!(
            c.choria_seed_file,
            Some(PathBuf::from(
                "/etc/choria-provisioner/secrets/prov-jwt/seed"
            ))
        );
        assert_eq!(c.choria_ca, None);
    }

    #[test]
    fn insecure_needs_no_credentials() {
        let p = provisioner(json!({"broker": {"tlsSecret": null}, "choriaInsecure": true}));
        assert!(config(&p).choria_insecure);
        let cfg = choria_cfg(&p).unwrap();
        assert!(!cfg.contains("plugin.security.file"), "{cfg}");
        assert!(secret_mounts(&p.spec).is_empty());
    }

    fn deployment_of(p: &Provisioner) -> Deployment {
        owned(p).unwrap().deployment
    }

    fn pod(d: &Deployment) -> &PodSpec {
        d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
    }

    fn annotation(d: &Deployment) -> String {
        d.spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap()[CHECKSUM_ANNOTATION]
            .clone()
    }

    #[test]
    fn deployment_runs_the_provisioner_restricted() {
        let p = jwt_spec();
        let o = owned(&p).unwrap();
        let d = &o.deployment;
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(
            spec.selector.match_labels.as_ref(),
            Some(&selector_labels("prov"))
        );
        let pod = pod(d);
        assert_eq!(pod.service_account_name.as_deref(), Some("prov"));
        let c = &pod.containers[0];
        assert_eq!(
            c.image.as_deref(),
            Some(crate::operator::crd::default_image().as_str())
        );
        assert_eq!(
            c.args.as_ref().unwrap(),
            &[
                "run",
                "--config",
                "/etc/choria-provisioner/config/provisioner.yaml",
                "--choria-config",
                "/etc/choria-provisioner/config/choria.cfg",
                "--provisioner",
                "choria/prov"
            ]
        );
        let env: Vec<(&str, &str)> = c
            .env
            .iter()
            .flatten()
            .map(|e| {
                let f = e.value_from.as_ref().unwrap().field_ref.as_ref().unwrap();
                (e.name.as_str(), f.field_path.as_str())
            })
            .collect();
        assert_eq!(
            env,
            [
                ("POD_NAME", "metadata.name"),
                ("POD_NAMESPACE", "metadata.namespace")
            ]
        );
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 8080);
        for (probe, path) in [
            (&c.liveness_probe, "/healthz"),
            (&c.readiness_probe, "/readyz"),
        ] {
            let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
            assert_eq!(get.path.as_deref(), Some(path));
            assert_eq!(get.port, IntOrString::String("monitor".into()));
        }

        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.fs_group, Some(RUN_AS));
        assert_eq!(
            psc.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault"
        );
        let csc = c.security_context.as_ref().unwrap();
        assert_eq!(csc.allow_privilege_escalation, Some(false));
        assert_eq!(csc.read_only_root_filesystem, Some(true));
        assert_eq!(
            csc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );

        // Volumes: config, /tmp, only the referenced Secrets (only their
        // keys), the helper ConfigMap.
        let volumes: Vec<(String, String, Vec<String>)> = pod
            .volumes
            .iter()
            .flatten()
            .map(|v| {
                let (source, keys) = if let Some(s) = &v.secret {
                    let keys = s.items.iter().flatten().map(|i| i.key.clone()).collect();
                    (
                        format!("secret {}", s.secret_name.as_deref().unwrap()),
                        keys,
                    )
                } else if let Some(cm) = &v.config_map {
                    (
                        format!("configMap {} {:?}", cm.name, cm.default_mode),
                        vec![],
                    )
                } else {
                    ("emptyDir".to_string(), vec![])
                };
                (v.name.clone(), source, keys)
            })
            .collect();
        let owned_strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            volumes,
            [
                ("config".into(), "configMap prov-config None".into(), vec![]),
                ("tmp".into(), "emptyDir".into(), vec![]),
                (
                    "secret-0".into(),
                    "secret prov-secrets".into(),
                    owned_strings(&["broker-password", "token"])
                ),
                (
                    "secret-1".into(),
                    "secret prov-signer".into(),
                    owned_strings(&["signer.pem"])
                ),
                (
                    "secret-2".into(),
                    "secret prov-tls".into(),
                    owned_strings(&["ca.crt", "tls.crt", "tls.key"])
                ),
                (
                    "helper".into(),
                    format!("configMap prov-helper {:?}", Some(0o755)),
                    vec![]
                ),
            ]
        );
        let mounts: Vec<(&str, &str, Option<bool>)> = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only))
            .collect();
        assert_eq!(
            mounts,
            [
                ("config", "/etc/choria-provisioner/config", Some(true)),
                ("tmp", "/tmp", None),
                (
                    "secret-0",
                    "/etc/choria-provisioner/secrets/prov-secrets",
                    Some(true)
                ),
                (
                    "secret-1",
                    "/etc/choria-provisioner/secrets/prov-signer",
                    Some(true)
                ),
                (
                    "secret-2",
                    "/etc/choria-provisioner/secrets/prov-tls",
                    Some(true)
                ),
                ("helper", "/etc/choria-provisioner/helper", Some(true)),
            ]
        );
        assert_eq!(annotation(d), checksum(&o.config_map));
        assert_eq!(annotation(d).len(), 64);
    }

    #[test]
    fn pod_overrides_and_image_settings() {
        let p = provisioner(json!({
            "image": "registry.example.net/choria-provisioner:1.2.3",
            "imagePullPolicy": "Always",
            "replicas": 3,
            "monitorPort": 9100,
            "resources": {"limits": {"memory": "256Mi"}},
            "pod": {
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "choria", "effect": "NoSchedule"}],
                "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}},
                "annotations": {"example.net/team": "ops", CHECKSUM_ANNOTATION: "mine"},
                "labels": {"team": "ops", "app.kubernetes.io/instance": "other"},
            },
        }));
        let o = owned(&p).unwrap();
        let d = &o.deployment;
        let template = &d.spec.as_ref().unwrap().template;
        let meta = template.metadata.as_ref().unwrap();
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(labels["team"], "ops");
        assert_eq!(
            labels["app.kubernetes.io/instance"], "prov",
            "selector labels win"
        );
        let annotations = meta.annotations.as_ref().unwrap();
        assert_eq!(annotations["example.net/team"], "ops");
        assert_eq!(
            annotations[CHECKSUM_ANNOTATION],
            checksum(&o.config_map),
            "ours wins"
        );
        let pod = pod(d);
        assert_eq!(
            pod.node_selector.as_ref().unwrap()["kubernetes.io/os"],
            "linux"
        );
        assert_eq!(
            pod.tolerations.as_ref().unwrap()[0].key.as_deref(),
            Some("dedicated")
        );
        assert!(pod.affinity.as_ref().unwrap().pod_anti_affinity.is_some());
        let c = &pod.containers[0];
        assert_eq!(
            c.image.as_deref(),
            Some("registry.example.net/choria-provisioner:1.2.3")
        );
        assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 9100);
        assert!(c
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()
            .contains_key("memory"));
        assert_eq!(d.spec.as_ref().unwrap().replicas, Some(3));
        let svc = o.service.spec.as_ref().unwrap();
        assert_eq!(o.service.metadata.name.as_deref(), Some("prov-metrics"));
        assert_eq!(svc.ports.as_ref().unwrap()[0].port, 9100);
        assert_eq!(svc.selector.as_ref(), Some(&selector_labels("prov")));
    }

    #[test]
    fn checksum_follows_the_configuration_not_the_pause() {
        let base = annotation(&deployment_of(&provisioner(json!({"workers": 2}))));
        let paused = annotation(&deployment_of(&provisioner(
            json!({"workers": 2, "paused": true}),
        )));
        let more = annotation(&deployment_of(&provisioner(json!({"workers": 4}))));
        let again = annotation(&deployment_of(&provisioner(json!({"workers": 2}))));
        assert_eq!(base, paused, "pausing must not roll the pods");
        assert_eq!(base, again, "stable");
        assert_ne!(base, more, "a configuration change rolls the pods");
    }

    /// (apiGroups, resources, resourceNames, verbs)
    type Rule = (String, String, Option<Vec<String>>, Vec<String>);

    fn rules(p: &Provisioner) -> Vec<Rule> {
        role(p)
            .unwrap()
            .rules
            .unwrap()
            .into_iter()
            .map(|r| {
                (
                    r.api_groups.unwrap().join(","),
                    r.resources.unwrap().join(","),
                    r.resource_names,
                    r.verbs,
                )
            })
            .collect()
    }

    #[test]
    fn role_grants_exactly_what_the_pods_need() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let name = Some(s(&["prov"]));
        let group = "provisioning.choria.io".to_string();
        let own = vec![
            (
                group.clone(),
                "provisioners".into(),
                name.clone(),
                s(&["get", "watch", "list"]),
            ),
            (
                group,
                "provisioners/status".into(),
                name.clone(),
                s(&["get", "patch", "update"]),
            ),
        ];
        let mut with_lease = own.clone();
        with_lease.push((
            "coordination.k8s.io".into(),
            "leases".into(),
            None,
            s(&["create"]),
        ));
        with_lease.push((
            "coordination.k8s.io".into(),
            "leases".into(),
            name,
            s(&["get", "update"]),
        ));
        assert_eq!(rules(&provisioner(json!({}))), with_lease);
        assert_eq!(
            rules(&provisioner(json!({"election": {"backend": "streams"}}))),
            own
        );
        assert_eq!(
            rules(&provisioner(json!({"election": {"backend": "none"}}))),
            own
        );

        let rb = role_binding(&provisioner(json!({}))).unwrap();
        assert_eq!(rb.role_ref.kind, "Role");
        assert_eq!(rb.role_ref.name, "prov");
        let subject = &rb.subjects.unwrap()[0];
        assert_eq!(
            (subject.kind.as_str(), subject.name.as_str()),
            ("ServiceAccount", "prov")
        );
        assert_eq!(subject.namespace.as_deref(), Some(NS));
    }

    #[test]
    fn pdb_only_with_two_replicas_or_more() {
        assert!(pdb(&provisioner(json!({"replicas": 1}))).unwrap().is_none());
        assert!(pdb(&provisioner(json!({"replicas": 0}))).unwrap().is_none());
        let p = pdb(&provisioner(json!({})))
            .unwrap()
            .expect("a PDB with the default 2");
        let spec = p.spec.unwrap();
        assert_eq!(spec.min_available, Some(IntOrString::Int(1)));
        assert_eq!(
            spec.selector.unwrap().match_labels,
            Some(selector_labels("prov"))
        );
    }

    #[test]
    fn every_object_is_owned_by_its_provisioner() {
        let o = owned(&provisioner(json!({}))).unwrap();
        let metas = [
            &o.service_account.metadata,
            &o.role.metadata,
            &o.role_binding.metadata,
            &o.config_map.metadata,
            &o.service.metadata,
            &o.deployment.metadata,
            &o.pdb.as_ref().unwrap().metadata,
        ];
        for m in metas {
            let refs = m.owner_references.as_ref().unwrap();
            assert_eq!(refs.len(), 1);
            let r = &refs[0];
            assert_eq!(
                (r.kind.as_str(), r.name.as_str(), r.uid.as_str()),
                ("Provisioner", "prov", UID)
            );
            assert_eq!(r.api_version, "provisioning.choria.io/v1alpha1");
            assert_eq!(r.controller, Some(true));
            assert_eq!(m.namespace.as_deref(), Some(NS));
            assert_eq!(m.labels.as_ref().unwrap()[MANAGED_BY_LABEL], MANAGED_BY);
        }
    }

    #[test]
    fn without_uid_nothing_is_built() {
        let mut p = provisioner(json!({}));
        p.metadata.uid = None;
        assert!(matches!(owned(&p), Err(BuildError::Missing("uid"))));
    }
}

//! What runs: the Deployment of provisioner pods and the metrics Service.

use super::*;
use choria_k8s::crd::ConfigMapKeyRef;

/// The Deployment `<name>` running `image`; `checksum` is the ConfigMap's.
pub fn deployment(p: &Provisioner, image: &str, checksum: &str) -> Result<Deployment, BuildError> {
    let name = p.name_any();
    let s = &p.spec;
    let (volumes, mounts) = volumes(p);
    let container = container(p, image, mounts)?;

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
                    priority_class_name: s.pod.priority_class_name.clone(),
                    image_pull_secrets: pull_secrets(&s.pod),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    })
}

fn read_only(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

/// The pod's volumes and the container's mounts: the ConfigMap, a writable
/// `/tmp`, the Secret keys in use, the helper's ConfigMap.
fn volumes(p: &Provisioner) -> (Vec<Volume>, Vec<VolumeMount>) {
    let name = p.name_any();
    let s = &p.spec;
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
    for (i, (secret, keys)) in secret_mounts(&name, s).into_iter().enumerate() {
        let volume = format!("secret-{i}");
        mounts.push(read_only(&volume, &format!("{SECRETS_DIR}/{secret}")));
        volumes.push(secret_volume(volume, secret, keys));
    }
    if let Some(cm) = s.helper.as_ref().and_then(|h| h.config_map.as_ref()) {
        mounts.push(read_only("helper", HELPER_DIR));
        volumes.push(helper_volume(cm));
    }
    if let Some(a) = &s.admission {
        mounts.push(read_only("admission", ADMISSION_DIR));
        volumes.push(admission_volume(&a.policy));
    }
    // The spec's own after ours; validation keeps their names and paths
    // apart from ours.
    volumes.extend(s.pod.volumes.iter().map(PodVolume::to_volume));
    mounts.extend(s.pod.volume_mounts.iter().map(|m| pod_mount(&s.pod, m)));

    (volumes, mounts)
}

/// One Secret's volume: only the keys in use, group-readable for fsGroup.
fn secret_volume(volume: String, secret: String, keys: BTreeSet<String>) -> Volume {
    Volume {
        name: volume,
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret),
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
    }
}

/// The helper's ConfigMap, its files executable.
fn helper_volume(config_map: &str) -> Volume {
    Volume {
        name: "helper".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map.to_string(),
            default_mode: Some(0o755),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// The admission policy: the one key of its ConfigMap, read-only.
fn admission_volume(policy: &ConfigMapKeyRef) -> Volume {
    Volume {
        name: "admission".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: policy.name.clone(),
            items: Some(vec![KeyToPath {
                key: policy.key.clone(),
                path: policy.key.clone(),
                mode: None,
            }]),
            default_mode: Some(0o444),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// A mount of `spec.pod`: read-only when the kubelet writes its volume
/// (Secret, ConfigMap, projected, downward API), whatever it says.
fn pod_mount(pod: &PodOverrides, m: &VolumeMount) -> VolumeMount {
    let kubelet_written = pod
        .volume(&m.name)
        .is_some_and(|v| v.types().iter().any(|t| t.read_only()));
    let mut m = m.clone();
    if kubelet_written {
        m.read_only = Some(true);
    }
    m
}

/// `spec.pod.imagePullSecrets` as the pod wants them; none when empty, so
/// a spec without them builds the pod template it always did.
fn pull_secrets(pod: &PodOverrides) -> Option<Vec<LocalObjectReference>> {
    let refs = pod
        .image_pull_secrets
        .iter()
        .map(|name| LocalObjectReference { name: name.clone() });
    (!pod.image_pull_secrets.is_empty()).then(|| refs.collect())
}

/// The `provisioner` container: `run` with the mounted files, the pod's
/// name and namespace in its environment, probes on the monitor port, and
/// the restricted security context.
fn container(
    p: &Provisioner,
    image: &str,
    mounts: Vec<VolumeMount>,
) -> Result<Container, BuildError> {
    let name = p.name_any();
    let ns = namespace(p)?;
    let s = &p.spec;
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
    Ok(Container {
        name: CONTAINER.into(),
        image: Some(image.to_string()),
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
        // Ours first; validation keeps the spec's names apart from ours.
        env: Some(
            [
                field_env("POD_NAME", "metadata.name"),
                field_env("POD_NAMESPACE", "metadata.namespace"),
            ]
            .into_iter()
            .chain(s.pod.env.iter().cloned())
            .collect(),
        ),
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

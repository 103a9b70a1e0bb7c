use super::*;
use crate::fixtures::{provisioner, settings, NS, UID};
use choria_config::{ChoriaClientConfig, Environment, ProvisionerConfig, SecurityProvider};
use serde_json::json;
use std::path::PathBuf;

fn config(p: &Provisioner) -> ProvisionerConfig {
    let text = provisioner_yaml(p).unwrap();
    ProvisionerConfig::parse(&text, PROVISIONER_YAML)
        .unwrap_or_else(|e| panic!("the provisioner refuses\n{text}\n{e}"))
}

fn choria(p: &Provisioner) -> ChoriaClientConfig {
    ChoriaClientConfig::parse(&choria_cfg(p).unwrap(), CHORIA_CFG, &Environment::default()).unwrap()
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
    assert_eq!(cfg.election.backend, choria_config::ElectionBackend::Lease);
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
        Some(choria_config::ca::KeyRef::File(PathBuf::from(
            "/etc/choria-provisioner/secrets/prov-keys/signer.seed"
        )))
    );
    assert_eq!(
        cfg.jwt_signing_token,
        Some(PathBuf::from(
            "/etc/choria-provisioner/secrets/prov-keys/signer.jwt"
        ))
    );
    assert_eq!(
        cfg.election.backend,
        choria_config::ElectionBackend::Streams
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
    assert!(secret_mounts(&p.name_any(), &p.spec).is_empty());
}

fn deployment_of(p: &Provisioner) -> Deployment {
    owned(p, &settings()).unwrap().deployment
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
    let o = owned(&p, &settings()).unwrap();
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
        Some(choria_k8s::crd::default_image().as_str())
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
    let o = owned(&p, &settings()).unwrap();
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
fn pod_additions_land_in_the_deployment() {
    let p = provisioner(json!({"pod": {
        "imagePullSecrets": ["registry-login"],
        "priorityClassName": "choria-high",
        "env": [
            {"name": "HELPER_CA", "value": "/etc/helper-ca/ca.crt"},
            {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
        ],
        "volumes": [
            {"name": "helper-ca", "secret": {"secretName": "helper-ca"}},
            {"name": "scratch", "emptyDir": {"sizeLimit": "64Mi"}},
        ],
        "volumeMounts": [
            {"name": "helper-ca", "mountPath": "/etc/helper-ca"},
            {"name": "scratch", "mountPath": "/var/helper", "readOnly": false},
        ],
    }}));
    assert_eq!(crate::validate::validate(&p), Vec::<String>::new());
    let d = deployment_of(&p);
    let pod = pod(&d);
    let v = serde_json::to_value(pod).unwrap();
    assert_eq!(v["imagePullSecrets"], json!([{"name": "registry-login"}]));
    assert_eq!(v["priorityClassName"], "choria-high");
    let volumes = v["volumes"].as_array().unwrap();
    assert_eq!(
        volumes[volumes.len() - 2..],
        [
            json!({"name": "helper-ca", "secret": {"secretName": "helper-ca"}}),
            json!({"name": "scratch", "emptyDir": {"sizeLimit": "64Mi"}}),
        ],
        "the spec's after ours"
    );
    let c = &v["containers"][0];
    let env: Vec<&str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(env, ["POD_NAME", "POD_NAMESPACE", "HELPER_CA", "API_TOKEN"]);
    assert_eq!(
        c["env"][3]["valueFrom"],
        json!({"secretKeyRef": {"name": "api", "key": "token"}})
    );
    let mounts = c["volumeMounts"].as_array().unwrap();
    assert_eq!(
        mounts[mounts.len() - 2..],
        [
            json!({"name": "helper-ca", "mountPath": "/etc/helper-ca", "readOnly": true}),
            json!({"name": "scratch", "mountPath": "/var/helper", "readOnly": false}),
        ],
        "a Secret is mounted read-only even when the mount does not say so"
    );
}

#[test]
fn without_additions_the_pod_template_is_what_it_was() {
    // An upgraded operator must not roll pods whose spec asks for none of
    // the additions: nothing new appears in their template.
    let v = serde_json::to_value(pod(&deployment_of(&provisioner(json!({}))))).unwrap();
    for absent in ["imagePullSecrets", "priorityClassName"] {
        assert!(v.get(absent).is_none(), "{absent}: {v}");
    }
    assert_eq!(v["containers"][0]["env"].as_array().unwrap().len(), 2);
}

#[test]
fn what_the_operator_mounts_and_sets_is_reserved_from_the_spec() {
    use choria_k8s::crd::pod::{is_reserved_env, is_reserved_volume, shadows_operator_mount};
    // Every Secret in use, the helper's ConfigMap, the signing key.
    let mut p = jwt_spec();
    p.spec.jwt_signing_token_secret = Some(SecretKeyRef {
        name: "chain".into(),
        key: "token".into(),
    });
    p.spec.records = Some(RecordsSpec {
        urls: vec!["nats://records:4222".into()],
        ..RecordsSpec::default()
    });
    let v = serde_json::to_value(pod(&deployment_of(&p))).unwrap();
    let names = |list: &serde_json::Value, key: &str| -> Vec<String> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|e| e[key].as_str().unwrap().to_string())
            .collect()
    };
    let volumes = names(&v["volumes"], "name");
    assert!(volumes.len() >= 6, "{volumes:?}");
    for name in volumes {
        assert!(is_reserved_volume(&name), "{name} is not reserved");
    }
    let c = &v["containers"][0];
    for path in names(&c["volumeMounts"], "mountPath") {
        assert!(shadows_operator_mount(&path), "{path} is not reserved");
    }
    for name in names(&c["env"], "name") {
        assert!(is_reserved_env(&name), "{name} is not reserved");
    }
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
        (group, "provisioners/status".into(), name, s(&["patch"])),
    ];
    for backend in ["lease", "streams", "none"] {
        let p = provisioner(json!({"election": {"backend": backend}}));
        assert_eq!(rules(&p), own, "{backend}");
    }

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

/// (binding name, ClusterRole, whether it names the pods' account)
fn bindings(p: &Provisioner) -> Vec<(String, String, bool)> {
    let o = owned(p, &settings()).unwrap();
    [o.lease_binding, o.cert_manager_binding]
        .into_iter()
        .map(|b| {
            assert_eq!(b.role_ref.kind, "ClusterRole");
            let subjects = b.subjects.unwrap();
            if let Some(s) = subjects.first() {
                assert_eq!(
                    (s.kind.as_str(), s.name.as_str()),
                    ("ServiceAccount", "prov")
                );
                assert_eq!(s.namespace.as_deref(), Some(NS));
            }
            (
                b.metadata.name.unwrap(),
                b.role_ref.name,
                !subjects.is_empty(),
            )
        })
        .collect()
}

#[test]
fn leases_and_certificate_requests_come_from_the_shipped_cluster_roles() {
    let b = |lease: bool, cm: bool| {
        vec![
            (
                "prov-leases".to_string(),
                DEFAULT_LEASE_CLUSTER_ROLE.to_string(),
                lease,
            ),
            (
                "prov-certificaterequests".to_string(),
                DEFAULT_CERT_MANAGER_CLUSTER_ROLE.to_string(),
                cm,
            ),
        ]
    };
    assert_eq!(bindings(&provisioner(json!({}))), b(true, false));
    let streams = provisioner(json!({"election": {"backend": "streams"}}));
    assert_eq!(bindings(&streams), b(false, false), "bound to nobody");
    let cm = provisioner(json!({
        "election": {"backend": "none"},
        "features": {"pki": true},
        "pki": {"certManager": {"issuerRef": {"name": "ca"}}},
    }));
    assert_eq!(bindings(&cm), b(false, true));
    let mut custom = settings();
    custom.lease_cluster_role = "my-leases".into();
    let o = owned(&provisioner(json!({})), &custom).unwrap();
    assert_eq!(o.lease_binding.role_ref.name, "my-leases");
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
        spec.unhealthy_pod_eviction_policy.as_deref(),
        Some("AlwaysAllow"),
        "NotReady pods (broker down) never block a drain"
    );
    assert_eq!(
        spec.selector.unwrap().match_labels,
        Some(selector_labels("prov"))
    );
}

#[test]
fn every_object_is_owned_by_its_provisioner() {
    let o = owned(&provisioner(json!({})), &settings()).unwrap();
    let metas = [
        &o.service_account.metadata,
        &o.role.metadata,
        &o.role_binding.metadata,
        &o.lease_binding.metadata,
        &o.cert_manager_binding.metadata,
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
    assert!(matches!(
        owned(&p, &settings()),
        Err(BuildError::Missing("uid"))
    ));
}

#[test]
fn node_configuration_and_cert_manager_reach_the_provisioner_and_the_role() {
    let p = provisioner(json!({
        "helper": null,
        "features": {"pki": true},
        "nodeConfiguration": {
            "values": {"broker": "nats://b.example.net:4222"},
            "configuration": {"identity": "{{ identity }}", "plugin.choria.middleware_hosts": "{{ values.broker }}"},
            "serverClaims": {"ou": "ops"},
            "upgrade": "0.31.0",
        },
        "pki": {"certManager": {"issuerRef": {"name": "choria-ca", "kind": "ClusterIssuer"}, "duration": "2160h"}},
    }));
    assert_eq!(crate::validate::validate(&p), Vec::<String>::new());
    let cfg = config(&p);
    assert_eq!(cfg.helper, "", "no helper at all");
    let t = cfg.configuration_template.as_ref().unwrap();
    assert_eq!(t.configuration["identity"], "{{ identity }}");
    assert_eq!(t.values["broker"], "nats://b.example.net:4222");
    assert_eq!(t.server_claims.as_ref().unwrap().organization_unit, "ops");
    assert_eq!(t.upgrade.as_deref(), Some("0.31.0"));
    let cm = cfg.cert_manager.as_ref().unwrap();
    assert_eq!(
        (
            cm.issuer.as_str(),
            cm.issuer_kind.as_str(),
            cm.namespace.as_str()
        ),
        ("choria-ca", "ClusterIssuer", NS),
        "requests are made in the Provisioner's own namespace"
    );
    assert_eq!(
        cm.duration,
        Some(std::time::Duration::from_secs(2160 * 3600))
    );
    // No helper: no helper volume either.
    let d = deployment(&p, "img", "sum").unwrap();
    let volumes = d
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .volumes
        .unwrap_or_default();
    assert!(!volumes.iter().any(|v| v.name == "helper"));
}

#[test]
fn shards_mode_reaches_the_provisioner_with_its_membership_timings_on_both_backends() {
    for backend in ["lease", "streams"] {
        let p = provisioner(json!({"election": {"mode": "Shards", "backend": backend,
            "leaseDuration": "9s", "renewDeadline": "6s", "retryPeriod": "2s"}}));
        let cfg = config(&p);
        assert!(cfg.election.sharded(), "{backend}");
        assert_eq!(
            cfg.election.lease_duration,
            std::time::Duration::from_secs(9),
            "{backend}"
        );
        assert_eq!(
            cfg.election.renew_deadline,
            std::time::Duration::from_secs(6),
            "{backend}"
        );
        assert_eq!(
            cfg.election.retry_period,
            std::time::Duration::from_secs(2),
            "{backend}"
        );
        // The Lease ClusterRole is bound only where Leases are the membership.
        let leases = bindings(&p)
            .into_iter()
            .find(|(n, _, _)| n == "prov-leases")
            .expect("the lease binding");
        assert_eq!(leases.2, backend == "lease", "{backend}: {leases:?}");
    }
    // Leader mode leaves `mode` out (the default) and, on streams, the
    // Lease timings too.
    let leader = provisioner_yaml(&provisioner(
        json!({"election": {"backend": "streams", "leaseDuration": "9s"}}),
    ))
    .unwrap();
    assert!(
        !leader.contains("mode:") && !leader.contains("lease_duration"),
        "{leader}"
    );
}

#[test]
fn shards_let_one_replica_go_at_a_time_and_leaders_keep_one() {
    let spec = |p: Provisioner| pdb(&p).unwrap().expect("a PDB").spec.unwrap();
    let sharded = spec(provisioner(
        json!({"replicas": 3, "election": {"mode": "Shards"}}),
    ));
    assert_eq!(sharded.max_unavailable, Some(IntOrString::Int(1)));
    assert_eq!(sharded.min_available, None);
    let leader = spec(provisioner(json!({"replicas": 3})));
    assert_eq!(leader.min_available, Some(IntOrString::Int(1)));
    assert_eq!(leader.max_unavailable, None);
}

fn day_two_spec(renewal_broker: bool) -> Provisioner {
    let mut renewal =
        json!({"before": "20%", "jitter": "1h", "rate": 30, "collective": "lon", "retry": "5m"});
    if renewal_broker {
        renewal["broker"] = json!({"urls": ["nats://choria.example.net:4222"], "identity": "renewer",
                                   "clientJwtSecret": "renewer-jwt", "tlsSecret": "renewer-tls"});
    }
    provisioner(json!({
        "tokenSecret": {"name": "prov-secrets", "key": "token"},
        "records": {"urls": ["nats://records-a:4222", "nats://records-b:4222"], "bucket": "RECS", "history": 9,
                    "createBucket": false, "credentialsSecret": {"name": "records", "key": "records.creds"},
                    "tlsCaSecret": {"name": "records", "key": "ca.pem"}},
        "renewal": renewal,
    }))
}

#[test]
fn records_and_renewal_reach_the_provisioner_with_secrets_as_mounted_files() {
    use choria_config::day_two::Before;
    for own_broker in [false, true] {
        let p = day_two_spec(own_broker);
        let cfg = config(&p);
        let r = cfg.records.as_ref().expect("records");
        assert_eq!(r.urls, ["nats://records-a:4222", "nats://records-b:4222"]);
        assert_eq!(
            (r.bucket.as_str(), r.history, r.create_bucket),
            ("RECS", 9, false)
        );
        assert_eq!(
            r.credentials_file.as_deref(),
            Some(std::path::Path::new(
                "/etc/choria-provisioner/secrets/records/records.creds"
            ))
        );
        assert_eq!(
            r.tls_ca.as_deref(),
            Some(std::path::Path::new(
                "/etc/choria-provisioner/secrets/records/ca.pem"
            ))
        );
        let n = cfg.renewal.as_ref().expect("renewal");
        assert!(
            matches!(n.before, Before::Share(s) if (s - 0.2).abs() < 1e-9),
            "{:?}",
            n.before
        );
        assert_eq!((n.rate, n.collective.as_str()), (30, "lon"));
        assert_eq!(n.retry, std::time::Duration::from_secs(300));
        let cm = config_map(&p).unwrap();
        let data = cm.data.unwrap();
        let file = if own_broker { RENEWAL_CFG } else { CHORIA_CFG };
        assert_eq!(
            n.choria_config,
            PathBuf::from(format!("{CONFIG_DIR}/{file}"))
        );
        assert_eq!(data.contains_key(RENEWAL_CFG), own_broker);
        let mounts = secret_mounts(&p.name_any(), &p.spec);
        assert_eq!(
            mounts
                .get("records")
                .map(|k| k.iter().map(String::as_str).collect::<Vec<_>>()),
            Some(vec!["ca.pem", "records.creds"])
        );
        if own_broker {
            let text = &data[RENEWAL_CFG];
            let c = ChoriaClientConfig::parse(text, RENEWAL_CFG, &Environment::default()).unwrap();
            assert!(text.contains("identity = renewer"), "{text}");
            assert!(
                text.contains("middleware_hosts = nats://choria.example.net:4222"),
                "{text}"
            );
            assert!(matches!(
                c.security_provider(false),
                Ok(SecurityProvider::Choria)
            ));
            assert!(mounts.contains_key("renewer-jwt") && mounts.contains_key("renewer-tls"));
        }
    }
}

#[test]
fn a_signing_key_is_made_once_for_records_and_shards_and_mounted() {
    // Records: the operator's own Secret, mounted, named in records:.
    let p = day_two_spec(false);
    let name = p.name_any();
    let secret = signing_key_secret(&p).unwrap().expect("a Secret to make");
    assert_eq!(
        secret.metadata.name.as_deref(),
        Some(signing_key_secret_name(&name).as_str())
    );
    assert_eq!(
        secret.metadata.owner_references.as_ref().unwrap()[0].uid,
        UID
    );
    let seed = &secret.string_data.as_ref().unwrap()[SIGNING_KEY];
    choria_wire::security::seal::SealKey::from_seed_hex(seed).expect("a seed");
    assert_ne!(
        signing_key_secret(&p)
            .unwrap()
            .unwrap()
            .string_data
            .unwrap()[SIGNING_KEY],
        *seed,
        "each is fresh: it is made once, never re-applied"
    );
    let path = PathBuf::from(secret_path(&signing_key_secret_name(&name), SIGNING_KEY));
    assert_eq!(config(&p).records.unwrap().signing_key, path);
    assert!(secret_mounts(&name, &p.spec)[&signing_key_secret_name(&name)].contains(SIGNING_KEY));
    // The seed never reaches the ConfigMap or the Deployment.
    let owned = owned(&p, &settings()).unwrap();
    let text = serde_json::to_string(&(&owned.config_map, &owned.deployment)).unwrap();
    assert!(!text.contains(seed.as_str()));

    // Shards: the same key seals the membership.
    let previous = "58".to_string() + &"66".repeat(31);
    let shards = provisioner(json!({
        "replicas": 2,
        "election": {"mode": "Shards", "backend": "lease"},
        "signingKeySecret": {"name": "mine", "key": "k"},
        "signingVerifyKeys": [previous],
    }));
    assert_eq!(
        config(&shards).election.verify_keys,
        vec![previous.clone()],
        "a rotation's old key"
    );
    assert!(
        signing_key_secret(&shards).unwrap().is_none(),
        "the spec names its own"
    );
    assert_eq!(
        config(&shards).election.signing_key,
        Some(PathBuf::from(secret_path("mine", "k")))
    );
    assert!(secret_mounts(&shards.name_any(), &shards.spec)["mine"].contains("k"));

    // Nothing sealed, nothing made.
    assert!(signing_key_secret(&jwt_spec()).unwrap().is_none());
    assert!(config(&jwt_spec()).election.signing_key.is_none());
}

/// `spec.admission`, `spec.evidence` and `spec.audit` become the
/// provisioner's `admission:`, `evidence:` and `audit:`, the policy's
/// ConfigMap key and the evidence Secrets mounted where those point.
#[test]
fn admission_evidence_and_audit_reach_the_pods() {
    let p = provisioner(json!({
        "helper": null,
        "nodeConfiguration": {"configuration": {"identity": "{{ identity }}"}},
        "records": {"urls": ["nats://records:4222"]},
        "admission": {"policy": {"name": "fleet-policy", "key": "admission.rego"}, "regoV0": true},
        "evidence": {
            "awsCertificates": {"name": "cloud-roots", "key": "aws.pem"},
            "awsAccounts": ["123456789012"],
            "azureCertificates": {"name": "cloud-roots", "key": "azure.pem"},
            "azureSubscriptions": ["8d10da13-8125-4ba9-a717-bf7490507b3d"],
            "maxAge": "2h",
            "nodeName": "instance_id",
        },
        "audit": {"maxAge": "30d", "maxBytes": 2097152},
    }));
    let cfg = config(&p);
    let a = cfg.admission.as_ref().expect("admission");
    assert_eq!(
        a.policy,
        PathBuf::from("/etc/choria-provisioner/admission/admission.rego")
    );
    assert!(a.rego_v0);
    let e = cfg.evidence.as_ref().expect("evidence");
    assert_eq!(
        e.aws_certificates,
        Some(PathBuf::from(
            "/etc/choria-provisioner/secrets/cloud-roots/aws.pem"
        ))
    );
    assert_eq!(e.aws_accounts, ["123456789012"]);
    assert_eq!(
        e.azure_certificates,
        Some(PathBuf::from(
            "/etc/choria-provisioner/secrets/cloud-roots/azure.pem"
        ))
    );
    assert_eq!(
        e.azure_subscriptions,
        ["8d10da13-8125-4ba9-a717-bf7490507b3d"]
    );
    assert_eq!(e.max_age, Some(std::time::Duration::from_secs(7200)));
    assert!(e.one_identity_per_instance);
    let audit = cfg.audit.as_ref().expect("audit");
    assert_eq!(audit.max_bytes, 2_097_152);

    let d = deployment_of(&p);
    let spec = pod(&d);
    let admission = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "admission")
        .expect("the policy's volume");
    let cm = admission.config_map.as_ref().unwrap();
    assert_eq!(cm.name, "fleet-policy");
    assert_eq!(cm.items.as_ref().unwrap()[0].key, "admission.rego");
    let secrets: Vec<&str> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.secret.as_ref()?.secret_name.as_deref())
        .collect();
    assert!(secrets.contains(&"cloud-roots"), "{secrets:?}");
    let mounts: Vec<&str> = spec.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(
        mounts.contains(&"/etc/choria-provisioner/admission"),
        "{mounts:?}"
    );
}

/// A Provisioner whose nodes the built-in CA signs, from the Secret
/// `fleet-ca` with `ca` merged into `spec.pki.ca`.
fn ca_provisioner(ca: serde_json::Value) -> Provisioner {
    let mut spec = json!({
        "helper": null,
        "nodeConfiguration": {"configuration": {"identity": "{{ identity }}"}},
        "features": {"pki": true},
        "pki": {"ca": {"secretName": "fleet-ca"}},
    });
    crate::fixtures::merge(&mut spec["pki"]["ca"], ca);
    provisioner(spec)
}

/// `spec.pki.ca` becomes the provisioner's `ca:`, naming the files its
/// Secret's keys are mounted as, and its lifetime when the spec sets one.
#[test]
fn the_ca_secret_reaches_the_provisioner_as_ca_with_mounted_paths() {
    use choria_config::ca::{KeyRef, DEFAULT_CA_VALIDITY};
    let day = 24 * 3600;
    for (extra, cert, key, validity) in [
        (json!({}), "tls.crt", "tls.key", DEFAULT_CA_VALIDITY),
        (
            json!({"certificateKey": "ca.pem", "keyKey": "ca.key", "validity": "30d"}),
            "ca.pem",
            "ca.key",
            std::time::Duration::from_secs(30 * day),
        ),
    ] {
        let p = ca_provisioner(extra.clone());
        assert_eq!(crate::validate::validate(&p), Vec::<String>::new());
        let ca = config(&p).ca.unwrap_or_else(|| panic!("{extra}: no ca:"));
        assert_eq!(
            ca.certificate,
            PathBuf::from(secret_path("fleet-ca", cert)),
            "{extra}"
        );
        assert_eq!(
            ca.key,
            KeyRef::File(secret_path("fleet-ca", key).into()),
            "{extra}"
        );
        assert_eq!(ca.validity, validity, "{extra}");
        let yaml = provisioner_yaml(&p).unwrap();
        assert_eq!(
            yaml.contains("validity:"),
            extra.get("validity").is_some(),
            "unset, the provisioner's default applies:\n{yaml}"
        );
    }
    // Without it, no ca: at all.
    assert!(config(&jwt_spec()).ca.is_none());
    assert!(!provisioner_yaml(&jwt_spec()).unwrap().contains("\nca:"));
}

/// The pods get the CA's certificate and key, read-only and readable by
/// their group only, and nothing else of its Secret.
#[test]
fn only_the_ca_secrets_two_keys_are_mounted_read_only() {
    let p = ca_provisioner(json!({"certificateKey": "ca.pem", "keyKey": "ca.key"}));
    let d = deployment_of(&p);
    let spec = pod(&d);
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| {
            v.secret
                .as_ref()
                .is_some_and(|s| s.secret_name.as_deref() == Some("fleet-ca"))
        })
        .expect("a volume of the CA Secret");
    let source = volume.secret.as_ref().unwrap();
    let items: Vec<(&str, &str, Option<i32>)> = source
        .items
        .iter()
        .flatten()
        .map(|i| (i.key.as_str(), i.path.as_str(), i.mode))
        .collect();
    assert_eq!(
        items,
        [("ca.key", "ca.key", None), ("ca.pem", "ca.pem", None)]
    );
    assert_eq!(
        source.default_mode,
        Some(0o440),
        "as every Secret key: the pod's fsGroup reads it, nobody else"
    );
    let mount = spec.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume.name)
        .expect("its mount");
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        ("/etc/choria-provisioner/secrets/fleet-ca", Some(true))
    );
}

#[test]
fn telemetry_reaches_the_provisioner_as_its_telemetry_section() {
    let off = jwt_spec();
    assert!(!provisioner_yaml(&off).unwrap().contains("telemetry"));
    assert_eq!(config(&off).telemetry, None);

    let p = provisioner(json!({
        "tokenSecret": {"name": "prov-secrets", "key": "token"},
        "telemetry": {
            "otlpEndpoint": "http://otel-collector.monitoring:4318",
            "serviceName": "site-a",
            "samplePercent": 5,
        },
    }));
    let yaml = provisioner_yaml(&p).unwrap();
    assert!(
        yaml.contains("telemetry:\n  otlp_endpoint: http://otel-collector.monitoring:4318\n"),
        "{yaml}"
    );
    let cfg = config(&p);
    let t = cfg.telemetry.as_ref().expect("telemetry");
    assert_eq!(t.otlp_endpoint, "http://otel-collector.monitoring:4318");
    assert_eq!(
        t.traces_url,
        "http://otel-collector.monitoring:4318/v1/traces"
    );
    assert_eq!((t.service_name.as_str(), t.sample_percent), ("site-a", 5));
    assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);

    // Unset values keep the provisioner's defaults.
    let p = provisioner(json!({"telemetry": {"otlpEndpoint": "http://jaeger:4318/custom"}}));
    let t = config(&p).telemetry.expect("telemetry");
    assert_eq!(t.traces_url, "http://jaeger:4318/custom");
    assert_eq!(
        (t.service_name.as_str(), t.sample_percent),
        (choria_config::telemetry::DEFAULT_SERVICE_NAME, 100)
    );

    // The pods read their configuration once: turning traces on rolls them.
    let on = checksum(&config_map(&p).unwrap());
    assert_ne!(on, checksum(&config_map(&provisioner(json!({}))).unwrap()));
}

//! `spec.pod`'s additions: the CRD's rules again (for objects stored before
//! them), each problem naming the entry by its index. Values of environment
//! variables are never repeated: they may be secrets.

use super::{check_key_ref, check_object_name};
use choria_config::names::is_dns_label;
use choria_k8s::crd::pod::{is_reserved_env, is_reserved_volume, shadows_operator_mount};
use choria_k8s::crd::validation::{MAX_ENV, MAX_ENV_VALUE, MAX_MOUNTS, MAX_VOLUMES};
use choria_k8s::crd::{PodOverrides, PodVolume, RESERVED_ENV, RESERVED_ENV_PREFIX};
use k8s_openapi::api::core::v1::{EnvVar, VolumeMount};

/// Every problem of `pod`'s pull secrets, priority, environment, volumes
/// and mounts.
pub(super) fn check(pod: &PodOverrides, problem: &mut dyn FnMut(String)) {
    for (i, name) in pod.image_pull_secrets.iter().enumerate() {
        check_object_name(&format!("spec.pod.imagePullSecrets[{i}]"), name, problem);
    }
    if let Some(name) = &pod.priority_class_name {
        check_object_name("spec.pod.priorityClassName", name, problem);
    }
    too_many("spec.pod.env", pod.env.len(), MAX_ENV, problem);
    for (i, e) in pod.env.iter().enumerate() {
        env_var(&format!("spec.pod.env[{i}]"), e, problem);
    }
    too_many("spec.pod.volumes", pod.volumes.len(), MAX_VOLUMES, problem);
    for (i, v) in pod.volumes.iter().enumerate() {
        volume(&format!("spec.pod.volumes[{i}]"), v, problem);
    }
    too_many(
        "spec.pod.volumeMounts",
        pod.volume_mounts.len(),
        MAX_MOUNTS,
        problem,
    );
    for (i, m) in pod.volume_mounts.iter().enumerate() {
        mount(&format!("spec.pod.volumeMounts[{i}]"), m, pod, problem);
    }
}

fn too_many(field: &str, n: usize, max: i64, problem: &mut dyn FnMut(String)) {
    if n as i64 > max {
        problem(format!(
            "{field} has {n} entries; at most {max} are allowed"
        ));
    }
}

/// Whether `name` is an environment variable name a shell can read
/// (`validation::ENV_NAME`).
fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 128
}

fn env_var(field: &str, e: &EnvVar, problem: &mut dyn FnMut(String)) {
    let name = &e.name;
    if !is_env_name(name) {
        problem(format!(
            "{field}.name {name:?} is not a variable name; use letters, digits and '_', not starting with a digit"
        ));
    } else if is_reserved_env(name) {
        problem(format!(
            "{field}.name {name:?} is set by the operator or read by the provisioner itself ({}, {RESERVED_ENV_PREFIX}*); choose another name",
            RESERVED_ENV.join(", ")
        ));
    }
    if e.value
        .as_ref()
        .is_some_and(|v| v.len() as i64 > MAX_ENV_VALUE)
    {
        problem(format!(
            "{field}.value is longer than {MAX_ENV_VALUE} characters; put it in a ConfigMap or Secret and mount it"
        ));
    }
    let Some(from) = &e.value_from else {
        return;
    };
    if e.value.is_some() {
        problem(format!("{field} has both value and valueFrom; keep one"));
    }
    let sources = [
        from.secret_key_ref.is_some(),
        from.config_map_key_ref.is_some(),
        from.field_ref.is_some(),
        from.resource_field_ref.is_some(),
    ];
    if sources.iter().filter(|s| **s).count() != 1 {
        problem(format!(
            "{field}.valueFrom needs exactly one of secretKeyRef, configMapKeyRef, fieldRef and resourceFieldRef"
        ));
    }
    if let Some(r) = &from.secret_key_ref {
        let field = format!("{field}.valueFrom.secretKeyRef");
        check_key_ref(&field, "Secret", &r.name, &r.key, problem);
    }
    if let Some(r) = &from.config_map_key_ref {
        let field = format!("{field}.valueFrom.configMapKeyRef");
        check_key_ref(&field, "ConfigMap", &r.name, &r.key, problem);
    }
}

fn volume(field: &str, v: &PodVolume, problem: &mut dyn FnMut(String)) {
    let name = &v.name;
    if !is_dns_label(name) {
        problem(format!(
            "{field}.name {name:?} is not a DNS label; use at most 63 lower case letters, digits and '-'"
        ));
    } else if is_reserved_volume(name) {
        problem(format!(
            "{field}.name {name:?} is one of the operator's own volumes (config, tmp, helper, admission, secret-<n>); choose another name"
        ));
    }
    if v.types().len() != 1 {
        problem(format!(
            "{field} needs exactly one source: secret, configMap, emptyDir, projected, downwardAPI or persistentVolumeClaim"
        ));
    }
    if let Some(s) = &v.secret {
        let secret = s.secret_name.as_deref().unwrap_or_default();
        check_object_name(&format!("{field}.secret.secretName"), secret, problem);
    }
    if let Some(c) = &v.config_map {
        check_object_name(&format!("{field}.configMap.name"), &c.name, problem);
    }
    if let Some(c) = &v.persistent_volume_claim {
        let at = format!("{field}.persistentVolumeClaim.claimName");
        check_object_name(&at, &c.claim_name, problem);
    }
    let projections = v.projected.iter().flat_map(|p| p.sources.iter().flatten());
    for (j, s) in projections.enumerate() {
        if s.service_account_token.is_some() || s.cluster_trust_bundle.is_some() {
            problem(format!(
                "{field}.projected.sources[{j}] may only project secret, configMap and downwardAPI: a serviceAccountToken or clusterTrustBundle is never allowed"
            ));
        }
    }
}

/// Whether `path` is absolute, without `//`, a trailing `/` or `.` and
/// `..` segments (what `shadows_operator_mount` compares).
fn is_clean_absolute(path: &str) -> bool {
    path.len() <= 1024
        && path.strip_prefix('/').is_some_and(|rest| {
            rest.split('/')
                .all(|s| !s.is_empty() && s != "." && s != "..")
        })
}

fn mount(field: &str, m: &VolumeMount, pod: &PodOverrides, problem: &mut dyn FnMut(String)) {
    let path = &m.mount_path;
    if !is_clean_absolute(path) {
        problem(format!(
            "{field}.mountPath {path:?} is not an absolute path without '.' or '..' segments, '//' or a trailing '/'"
        ));
    } else if shadows_operator_mount(path) {
        problem(format!(
            "{field}.mountPath {path:?} is at, in or above {}: the operator mounts the configuration, Secrets, helper and scratch space there",
            choria_k8s::crd::OPERATOR_MOUNT_ROOTS.join(" or ")
        ));
    }
    if m.mount_propagation.as_deref().is_some_and(|p| p != "None") {
        problem(format!("{field}.mountPropagation may only be None"));
    }
    let escapes = |p: &str| p.starts_with('/') || p.split('/').any(|s| s == "..");
    if m.sub_path.as_deref().is_some_and(escapes) {
        problem(format!(
            "{field}.subPath must be a relative path without '..' segments"
        ));
    }
    match pod.volume(&m.name) {
        None => problem(format!(
            "{field}.name {:?} is not a volume of spec.pod.volumes",
            m.name
        )),
        Some(v) if m.read_only == Some(false) && v.types().iter().any(|t| t.read_only()) => {
            problem(format!(
                "{field}.readOnly cannot be false for a secret, configMap, projected or downwardAPI volume: they are mounted read-only"
            ))
        }
        Some(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::validate;
    use crate::fixtures::provisioner;
    use serde_json::json;

    fn problems(pod: serde_json::Value) -> Vec<String> {
        validate(&provisioner(json!({ "pod": pod })))
    }

    #[test]
    fn pull_secrets_env_volumes_and_mounts_within_the_rules_pass() {
        let pod = json!({
            "imagePullSecrets": ["registry-login"],
            "priorityClassName": "choria-high",
            "env": [
                {"name": "HELPER_CA", "value": "/etc/helper-ca/ca.crt"},
                {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
                {"name": "SITE", "valueFrom": {"configMapKeyRef": {"name": "site", "key": "name"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "MEMORY", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}},
            ],
            "volumes": [
                {"name": "helper-ca", "secret": {"secretName": "helper-ca"}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "both", "projected": {"sources": [{"secret": {"name": "a"}}, {"configMap": {"name": "b"}}]}},
            ],
            "volumeMounts": [
                {"name": "helper-ca", "mountPath": "/etc/helper-ca"},
                {"name": "scratch", "mountPath": "/var/helper", "readOnly": false},
                {"name": "both", "mountPath": "/etc/both", "subPath": "a/b"},
            ],
        });
        assert_eq!(problems(pod), Vec::<String>::new());
    }

    #[test]
    fn what_the_operator_keeps_for_itself_is_refused() {
        let found = problems(json!({
            "env": [
                {"name": "POD_NAME", "value": "x"},
                {"name": "CHORIA_PROVISIONER_LOG", "value": "debug"},
                {"name": "1X", "value": "x"},
            ],
            "volumes": [
                {"name": "config", "emptyDir": {}},
                {"name": "secret-0", "emptyDir": {}},
            ],
            "volumeMounts": [
                {"name": "config", "mountPath": "/etc/choria-provisioner/secrets"},
                {"name": "secret-0", "mountPath": "/etc"},
                {"name": "secret-0", "mountPath": "/tmp"},
            ],
        }));
        let expected = [
            "spec.pod.env[0].name \"POD_NAME\" is set by the operator or read by the provisioner itself (POD_NAME, POD_NAMESPACE, USER, HOME, HOSTNAME, MCOLLECTIVE_CERTNAME, KUBECONFIG, KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT, CHORIA_PROVISIONER_*); choose another name",
            "spec.pod.env[1].name \"CHORIA_PROVISIONER_LOG\" is set by the operator",
            "spec.pod.env[2].name \"1X\" is not a variable name",
            "spec.pod.volumes[0].name \"config\" is one of the operator's own volumes",
            "spec.pod.volumes[1].name \"secret-0\" is one of the operator's own volumes",
            "spec.pod.volumeMounts[0].mountPath \"/etc/choria-provisioner/secrets\" is at, in or above /etc/choria-provisioner or /tmp",
            "spec.pod.volumeMounts[1].mountPath \"/etc\" is at, in or above",
            "spec.pod.volumeMounts[2].mountPath \"/tmp\" is at, in or above",
        ];
        assert_eq!(found.len(), expected.len(), "{found:#?}");
        for (f, e) in found.iter().zip(expected) {
            assert!(f.starts_with(e), "{f:?} does not start with {e:?}");
        }
    }

    #[test]
    fn sources_references_and_paths_are_checked() {
        let long = "x".repeat(4097);
        let found = problems(json!({
            "imagePullSecrets": ["Registry"],
            "priorityClassName": "High Priority",
            "env": [
                {"name": "BIG", "value": long},
                {"name": "BOTH", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NONE", "valueFrom": {}},
                {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "../x"}}},
            ],
            "volumes": [
                {"name": "none"},
                {"name": "two", "secret": {"secretName": "s"}, "emptyDir": {}},
                {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": "vault"}}]}},
                {"name": "ca", "secret": {}},
            ],
            "volumeMounts": [
                {"name": "ca", "mountPath": "relative"},
                {"name": "ca", "mountPath": "/a/../etc/choria-provisioner"},
                {"name": "ca", "mountPath": "/ca", "readOnly": false, "subPath": "../x", "mountPropagation": "Bidirectional"},
                {"name": "missing", "mountPath": "/missing"},
            ],
        }));
        let expected = [
            "spec.pod.imagePullSecrets[0] \"Registry\" is not an object name",
            "spec.pod.priorityClassName \"High Priority\" is not an object name",
            "spec.pod.env[0].value is longer than 4096 characters",
            "spec.pod.env[1] has both value and valueFrom",
            "spec.pod.env[2].valueFrom needs exactly one of",
            "spec.pod.env[3].valueFrom.secretKeyRef.key \"../x\" is not a Secret key",
            "spec.pod.volumes[0] needs exactly one source",
            "spec.pod.volumes[1] needs exactly one source",
            "spec.pod.volumes[2].projected.sources[0] may only project secret, configMap and downwardAPI",
            "spec.pod.volumes[3].secret.secretName \"\" is not an object name",
            "spec.pod.volumeMounts[0].mountPath \"relative\" is not an absolute path",
            "spec.pod.volumeMounts[1].mountPath \"/a/../etc/choria-provisioner\" is not an absolute path",
            "spec.pod.volumeMounts[2].mountPropagation may only be None",
            "spec.pod.volumeMounts[2].subPath must be a relative path",
            "spec.pod.volumeMounts[2].readOnly cannot be false for a secret",
            "spec.pod.volumeMounts[3].name \"missing\" is not a volume of spec.pod.volumes",
        ];
        assert_eq!(found.len(), expected.len(), "{found:#?}");
        for (f, e) in found.iter().zip(expected) {
            assert!(f.starts_with(e), "{f:?} does not start with {e:?}");
        }
        assert!(
            !found.iter().any(|f| f.contains("xxxx")),
            "a value is never repeated"
        );
    }

    #[test]
    fn counts_are_bounded() {
        let env: Vec<_> = (0..65)
            .map(|i| json!({"name": format!("V{i}"), "value": "x"}))
            .collect();
        let found = problems(json!({ "env": env }));
        assert_eq!(
            found,
            ["spec.pod.env has 65 entries; at most 64 are allowed"]
        );
    }
}

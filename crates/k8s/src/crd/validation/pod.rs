//! The rules of `spec.pod`'s additions: names and their formats, what the
//! operator keeps for itself (environment variables, volume names, mount
//! paths), one source per volume, and bounds on counts and sizes. What
//! depends on the cluster admin's policy (priority classes, which volume
//! types) is not here: the operator's own admission policy and its checks
//! hold it.

use super::{about, object_name, rule, Rule, OBJECT_NAME, SECRET_KEY};
use crate::crd::pod::{OPERATOR_MOUNT_ROOTS, RESERVED_ENV, RESERVED_ENV_PREFIX, RESERVED_VOLUMES};

/// An environment variable's name as a shell can read it.
pub const ENV_NAME: &str = "^[A-Za-z_][A-Za-z0-9_]*$";
/// A volume's name (a DNS label).
const VOLUME_NAME: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// An absolute path of one or more segments, without `//` or a trailing `/`.
const ABSOLUTE_PATH: &str = "^(/[^/]+)+$";
/// A `.` or `..` segment.
const DOT_SEGMENT: &str = "(^|/)[.][.]?(/|$)";

/// The most environment variables, volumes and mounts `spec.pod` may add.
pub const MAX_ENV: i64 = 64;
pub const MAX_VOLUMES: i64 = 16;
pub const MAX_MOUNTS: i64 = 32;
/// The longest environment variable value.
pub const MAX_ENV_VALUE: i64 = 4096;

fn quoted_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    items
        .into_iter()
        .map(|s| format!("'{s}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The rules, in the order of `spec.pod`'s fields.
pub(super) fn rules() -> Vec<Rule> {
    let mut all = vec![
        rule(
            "spec.pod.imagePullSecrets",
            format!("self.all(n, n.matches('{OBJECT_NAME}'))"),
            "spec.pod.imagePullSecrets must be Secrets' names: lower case letters, digits, '-' and '.'",
        ),
        object_name("spec.pod.priorityClassName", "a PriorityClass's name"),
    ];
    all.extend(env_rules());
    all.extend(volume_rules());
    all.extend(mount_rules());
    all
}

fn env_rules() -> Vec<Rule> {
    let reserved = RESERVED_ENV.join(", ");
    vec![
        rule(
            "spec.pod.env[]",
            format!("self.name.matches('{ENV_NAME}')"),
            "spec.pod.env[].name must be letters, digits and '_', not starting with a digit",
        ),
        rule(
            "spec.pod.env[]",
            format!(
                "!(self.name in [{}]) && !self.name.startsWith('{RESERVED_ENV_PREFIX}')",
                quoted_list(RESERVED_ENV)
            ),
            format!(
                "spec.pod.env[].name is set by the operator or read by the provisioner itself ({reserved}, {RESERVED_ENV_PREFIX}*); choose another name"
            ),
        ),
        rule(
            "spec.pod.env[]",
            "!(has(self.value) && has(self.valueFrom))",
            "spec.pod.env[] has both value and valueFrom; keep one",
        ),
        rule(
            "spec.pod.env[].valueFrom",
            "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), has(self.resourceFieldRef)].filter(b, b).size() == 1",
            "spec.pod.env[].valueFrom needs exactly one of secretKeyRef, configMapKeyRef, fieldRef and resourceFieldRef",
        ),
        rule(
            "spec.pod.env[].valueFrom.secretKeyRef",
            format!("self.name.matches('{OBJECT_NAME}') && self.key.matches('{SECRET_KEY}')"),
            "spec.pod.env[].valueFrom.secretKeyRef must name a Secret of this namespace and one of its keys",
        ),
        rule(
            "spec.pod.env[].valueFrom.configMapKeyRef",
            format!("self.name.matches('{OBJECT_NAME}') && self.key.matches('{SECRET_KEY}')"),
            "spec.pod.env[].valueFrom.configMapKeyRef must name a ConfigMap of this namespace and one of its keys",
        ),
    ]
}

fn volume_rules() -> Vec<Rule> {
    vec![
        rule(
            "spec.pod.volumes[]",
            format!("self.name.matches('{VOLUME_NAME}')"),
            "spec.pod.volumes[].name must be a DNS label: lower case letters, digits and '-'",
        ),
        rule(
            "spec.pod.volumes[]",
            format!(
                "!(self.name in [{}]) && !self.name.matches('^secret-[0-9]+$')",
                quoted_list(RESERVED_VOLUMES)
            ),
            "spec.pod.volumes[].name is one of the operator's own volumes (config, tmp, helper, admission, secret-<n>); choose another name",
        ),
        rule(
            "spec.pod.volumes[]",
            "[has(self.secret), has(self.configMap), has(self.emptyDir), has(self.projected), has(self.downwardAPI), has(self.persistentVolumeClaim)].filter(b, b).size() == 1",
            "spec.pod.volumes[] needs exactly one source: secret, configMap, emptyDir, projected, downwardAPI or persistentVolumeClaim (hostPath and the other sources are never allowed)",
        ),
        rule(
            "spec.pod.volumes[].secret",
            format!("has(self.secretName) && self.secretName.matches('{OBJECT_NAME}')"),
            "spec.pod.volumes[].secret.secretName must be a Secret's name: lower case letters, digits, '-' and '.'",
        ),
        object_name("spec.pod.volumes[].configMap.name", "a ConfigMap's name"),
        object_name(
            "spec.pod.volumes[].persistentVolumeClaim.claimName",
            "a PersistentVolumeClaim's name",
        ),
        rule(
            "spec.pod.volumes[].projected",
            "!has(self.sources) || self.sources.all(s, !has(s.serviceAccountToken) && !has(s.clusterTrustBundle))",
            "spec.pod.volumes[].projected may only project secret, configMap and downwardAPI: a serviceAccountToken or clusterTrustBundle is never allowed",
        ),
    ]
}

fn mount_rules() -> Vec<Rule> {
    let shadows = OPERATOR_MOUNT_ROOTS
        .iter()
        .map(|r| {
            format!(
                "!(self.mountPath == '{r}' || self.mountPath.startsWith('{r}/') || '{r}'.startsWith(self.mountPath + '/'))"
            )
        })
        .collect::<Vec<_>>()
        .join(" && ");
    vec![
        rule(
            "spec.pod.volumeMounts[]",
            format!(
                "self.mountPath.matches('{ABSOLUTE_PATH}') && !self.mountPath.matches('{DOT_SEGMENT}')"
            ),
            "spec.pod.volumeMounts[].mountPath must be an absolute path without '.' or '..' segments, '//' or a trailing '/'",
        ),
        rule(
            "spec.pod.volumeMounts[]",
            shadows,
            format!(
                "spec.pod.volumeMounts[].mountPath must not be at, in or above {}: the operator mounts the configuration, Secrets, helper and scratch space there",
                OPERATOR_MOUNT_ROOTS.join(" or ")
            ),
        ),
        rule(
            "spec.pod.volumeMounts[]",
            "!has(self.mountPropagation) || self.mountPropagation == 'None'",
            "spec.pod.volumeMounts[].mountPropagation may only be None",
        ),
        rule(
            "spec.pod.volumeMounts[]",
            "!has(self.subPath) || (!self.subPath.startsWith('/') && !self.subPath.matches('(^|/)[.][.](/|$)'))",
            "spec.pod.volumeMounts[].subPath must be a relative path without '..' segments",
        ),
        about(
            "spec.pod",
            ".volumeMounts",
            "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
            "spec.pod.volumeMounts[].name must name a volume of spec.pod.volumes",
        ),
        about(
            "spec.pod",
            ".volumeMounts",
            "!has(self.volumeMounts) || !has(self.volumes) || self.volumeMounts.all(m, !has(m.readOnly) || m.readOnly || self.volumes.all(v, v.name != m.name || has(v.emptyDir) || has(v.persistentVolumeClaim)))",
            "spec.pod.volumeMounts[].readOnly cannot be false for a secret, configMap, projected or downwardAPI volume: they are mounted read-only",
        ),
    ]
}

/// Bounds on counts and sizes, which also keep the rules' cost in budget.
pub(super) fn bounds() -> Vec<(&'static str, &'static str, i64)> {
    vec![
        ("spec.pod.imagePullSecrets", "maxItems", 16),
        ("spec.pod.imagePullSecrets[]", "maxLength", 253),
        ("spec.pod.priorityClassName", "maxLength", 253),
        ("spec.pod.env", "maxItems", MAX_ENV),
        ("spec.pod.env[].name", "maxLength", 128),
        ("spec.pod.env[].value", "maxLength", MAX_ENV_VALUE),
        (
            "spec.pod.env[].valueFrom.secretKeyRef.name",
            "maxLength",
            253,
        ),
        (
            "spec.pod.env[].valueFrom.secretKeyRef.key",
            "maxLength",
            253,
        ),
        (
            "spec.pod.env[].valueFrom.configMapKeyRef.name",
            "maxLength",
            253,
        ),
        (
            "spec.pod.env[].valueFrom.configMapKeyRef.key",
            "maxLength",
            253,
        ),
        (
            "spec.pod.env[].valueFrom.fieldRef.fieldPath",
            "maxLength",
            256,
        ),
        ("spec.pod.volumes", "maxItems", MAX_VOLUMES),
        ("spec.pod.volumes[].name", "maxLength", 63),
        ("spec.pod.volumes[].secret.secretName", "maxLength", 253),
        ("spec.pod.volumes[].configMap.name", "maxLength", 253),
        (
            "spec.pod.volumes[].persistentVolumeClaim.claimName",
            "maxLength",
            253,
        ),
        ("spec.pod.volumes[].projected.sources", "maxItems", 16),
        ("spec.pod.volumeMounts", "maxItems", MAX_MOUNTS),
        ("spec.pod.volumeMounts[].name", "maxLength", 63),
        ("spec.pod.volumeMounts[].mountPath", "maxLength", 1024),
        ("spec.pod.volumeMounts[].subPath", "maxLength", 1024),
        ("spec.pod.volumeMounts[].mountPropagation", "maxLength", 32),
    ]
}

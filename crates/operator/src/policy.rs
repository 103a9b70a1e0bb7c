//! What a `Provisioner` may ask for: the cluster admin's choice, set with
//! the operator's command line (and so the chart's `policy` values).
//!
//! Whoever may create a `Provisioner` is less trusted than the cluster
//! admin, yet the operator acts for them with its own rights: it runs the
//! image they name and has cert-manager sign node certificates through the
//! issuer they name. So the admin decides
//!
//! * which images may run (default: the operator's own, which is also what
//!   runs when `spec.image` is unset);
//! * which cluster-scoped issuers may sign (default: none; a namespaced
//!   cert-manager `Issuer` lives in the Provisioner's own namespace, whose
//!   users control it anyway);
//! * which key usages a certificate may carry (default: a Choria server's
//!   four: digital signature, key encipherment, server auth, client auth);
//! * which PriorityClass the pods may have (default: none; a priority
//!   decides whose pods are preempted cluster-wide);
//! * which volume types `spec.pod.volumes` may use (default: all but
//!   `persistentVolumeClaim`; a claim's data outlives the pod and may be
//!   another workload's).
//!
//! A `Provisioner` outside them is refused before anything is applied, with
//! a message that says what was asked and what is allowed.
//!
//! The Secrets a `Provisioner` names, the built-in CA's (`spec.pki.ca`)
//! among them, are not the admin's to bound: each is one of its own
//! namespace, mounted by the kubelet, which its writers can read anyway.
//!
//! Where the pods send their traces (`spec.telemetry.otlpEndpoint`) is not
//! bounded either, by decision. No setting of the operator bounds what a
//! Provisioner's pods reach on the network: `spec.broker.urls`,
//! `spec.records.urls` and `spec.renewal.broker` already name any host, so
//! a bound on this one host would close nothing. What goes there is the
//! Provisioner's own nodes' traces (identities, step names, error texts,
//! never a secret), posted as JSON over plain HTTP with none of the pods'
//! credentials, and nothing of the answer is kept but its status, in the
//! pods' log. Egress is the cluster admin's to bound, with a NetworkPolicy
//! on the Provisioner's namespace.

use choria_config::provisioner::DEFAULT_CERT_MANAGER_USAGES;
use choria_k8s::crd::{CertManagerSpec, PodOverrides, Provisioner, VolumeType};

/// cert-manager's API group: its `Issuer` is namespaced, its
/// `ClusterIssuer` cluster-wide.
pub const CERT_MANAGER_GROUP: &str = "cert-manager.io";

/// An allowed value: exact, or with `*` standing for any run of characters
/// (`registry.example.net/choria-provisioner:*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    pub fn new(p: impl Into<String>) -> Self {
        Pattern(p.into())
    }

    pub fn matches(&self, value: &str) -> bool {
        glob(self.0.as_bytes(), value.as_bytes())
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `*`-only glob matching, iterative (no backtracking blow-up on many stars).
fn glob(pattern: &[u8], value: &[u8]) -> bool {
    let (mut p, mut v) = (0, 0);
    // Where the last star was, and the value position it matched up to.
    let mut star: Option<(usize, usize)> = None;
    while v < value.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, v));
            p += 1;
        } else if p < pattern.len() && pattern[p] == value[v] {
            p += 1;
            v += 1;
        } else if let Some((sp, sv)) = star {
            // Let the star swallow one more character.
            p = sp + 1;
            v = sv + 1;
            star = Some((sp, sv + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// An issuer outside the namespace that may sign: `KIND.GROUP/NAME`, or a
/// plain `NAME` for a cert-manager `ClusterIssuer`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuerPattern {
    kind: String,
    group: String,
    name: Pattern,
}

impl std::str::FromStr for IssuerPattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, group, name) = match s.split_once('/') {
            None => ("ClusterIssuer", CERT_MANAGER_GROUP, s),
            Some((kind_group, name)) => match kind_group.split_once('.') {
                Some((kind, group)) if !kind.is_empty() && !group.is_empty() => (kind, group, name),
                _ => {
                    return Err(format!(
                        "{s:?}: write NAME for a cert-manager ClusterIssuer or KIND.GROUP/NAME for another issuer"
                    ))
                }
            },
        };
        if name.is_empty() || name.contains('/') {
            return Err(format!("{s:?}: no issuer name"));
        }
        Ok(IssuerPattern {
            kind: kind.into(),
            group: group.into(),
            name: Pattern::new(name),
        })
    }
}

impl IssuerPattern {
    /// Kind, group, and the name's `*` pattern.
    pub fn parts(&self) -> (&str, &str, &str) {
        (&self.kind, &self.group, &self.name.0)
    }
}

impl std::fmt::Display for IssuerPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.kind == "ClusterIssuer" && self.group == CERT_MANAGER_GROUP {
            write!(f, "{}", self.name)
        } else {
            write!(f, "{}.{}/{}", self.kind, self.group, self.name)
        }
    }
}

/// The admin's choices.
#[derive(Clone, Debug)]
pub struct Policy {
    /// What runs when `spec.image` is unset: the operator's own image.
    pub default_image: String,
    /// Images `spec.image` may name; empty: only `default_image`.
    pub images: Vec<Pattern>,
    /// Issuers outside the Provisioner's namespace that may sign.
    pub cluster_issuers: Vec<IssuerPattern>,
    /// Key usages a certificate may carry.
    pub usages: Vec<String>,
    /// PriorityClasses `spec.pod.priorityClassName` may name; empty: none.
    pub priority_classes: Vec<Pattern>,
    /// Volume types `spec.pod.volumes` may use.
    pub volume_types: Vec<VolumeType>,
}

impl Policy {
    /// The defaults: only `own_image`, no cluster issuer, a server's usages.
    pub fn new(own_image: impl Into<String>) -> Self {
        Policy {
            default_image: own_image.into(),
            images: Vec::new(),
            cluster_issuers: Vec::new(),
            usages: DEFAULT_CERT_MANAGER_USAGES.map(String::from).to_vec(),
            priority_classes: Vec::new(),
            volume_types: VolumeType::DEFAULT_ALLOWED.to_vec(),
        }
    }

    /// Whether `spec.pod.priorityClassName` may be `name`.
    pub fn priority_class_allowed(&self, name: &str) -> bool {
        self.priority_classes.iter().any(|p| p.matches(name))
    }

    /// The image the pods run.
    pub fn image<'a>(&'a self, p: &'a Provisioner) -> &'a str {
        p.spec.image.as_deref().unwrap_or(&self.default_image)
    }

    fn image_allowed(&self, image: &str) -> bool {
        if self.images.is_empty() {
            image == self.default_image
        } else {
            self.images.iter().any(|i| i.matches(image))
        }
    }

    fn allowed_images(&self) -> String {
        if self.images.is_empty() {
            format!("only the operator's own image {}", self.default_image)
        } else {
            list(&self.images)
        }
    }

    /// Every way `p` asks for more than allowed, each saying what it asked
    /// and what is allowed; empty when it stays within the policy.
    pub fn check(&self, p: &Provisioner) -> Vec<String> {
        let mut problems = Vec::new();
        let image = self.image(p);
        if !self.image_allowed(image) {
            let asked = match &p.spec.image {
                Some(i) => format!("spec.image {i:?} is"),
                None => format!("spec.image is unset, so the operator's own image {image:?} would run, which is"),
            };
            problems.push(format!(
                "{asked} not an image this operator may run; allowed: {} (the cluster admin's --allowed-image)",
                self.allowed_images()
            ));
        }
        if let Some(cm) = p.spec.pki.as_ref().and_then(|k| k.cert_manager.as_ref()) {
            problems.extend(self.check_issuer(cm));
            problems.extend(self.check_usages(cm));
        }
        problems.extend(self.check_pod(&p.spec.pod));
        problems
    }

    /// `spec.pod`'s priority and volume types.
    fn check_pod(&self, pod: &PodOverrides) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(name) = &pod.priority_class_name {
            if !self.priority_class_allowed(name) {
                let allowed = if self.priority_classes.is_empty() {
                    "none".to_string()
                } else {
                    list(&self.priority_classes)
                };
                problems.push(format!(
                    "spec.pod.priorityClassName {name:?} is not a PriorityClass this operator lets Provisioners use; allowed: {allowed} (the cluster admin's --allowed-priority-class)"
                ));
            }
        }
        for (i, v) in pod.volumes.iter().enumerate() {
            for t in v.types() {
                if !self.volume_types.contains(&t) {
                    problems.push(format!(
                        "spec.pod.volumes[{i}] ({:?}) uses the volume type {t}, which this operator does not allow; allowed: {} (the cluster admin's --allowed-volume-type)",
                        v.name,
                        self.allowed_volume_types()
                    ));
                }
            }
        }
        problems
    }

    /// The allowed volume types, for a message.
    pub fn allowed_volume_types(&self) -> String {
        if self.volume_types.is_empty() {
            "none".into()
        } else {
            list(&self.volume_types)
        }
    }

    fn check_issuer(&self, cm: &CertManagerSpec) -> Option<String> {
        let r = &cm.issuer_ref;
        let kind = r.kind.as_deref().unwrap_or("Issuer");
        let group = r.group.as_deref().unwrap_or(CERT_MANAGER_GROUP);
        if kind == "Issuer" && group == CERT_MANAGER_GROUP {
            return None;
        }
        let listed = self
            .cluster_issuers
            .iter()
            .any(|i| i.kind == kind && i.group == group && i.name.matches(&r.name));
        if listed {
            return None;
        }
        let allowed = if self.cluster_issuers.is_empty() {
            "none".to_string()
        } else {
            list(&self.cluster_issuers)
        };
        let what = if group == CERT_MANAGER_GROUP {
            format!("{kind} {:?}", r.name)
        } else {
            format!(
                "{kind}.{group} {:?} (outside cert-manager.io, so possibly cluster-wide)",
                r.name
            )
        };
        Some(format!(
            "spec.pki.certManager.issuerRef names {what}, which this operator does not let Provisioners use; allowed beyond an Issuer in the Provisioner's namespace: {allowed} (the cluster admin's --allowed-cluster-issuer)"
        ))
    }

    fn check_usages(&self, cm: &CertManagerSpec) -> Option<String> {
        let asked: Vec<&str> = if cm.usages.is_empty() {
            DEFAULT_CERT_MANAGER_USAGES.to_vec()
        } else {
            cm.usages.iter().map(String::as_str).collect()
        };
        let refused: Vec<String> = asked
            .iter()
            .filter(|u| !self.usages.iter().any(|a| a == *u))
            .map(|u| format!("{u:?}"))
            .collect();
        if refused.is_empty() {
            return None;
        }
        let field = if cm.usages.is_empty() {
            "spec.pki.certManager.usages is unset, so the default usages are requested, and"
        } else {
            "spec.pki.certManager.usages"
        };
        Some(format!(
            "{field} asks for {}, which this operator does not allow; allowed: {} (the cluster admin's --allowed-usage)",
            refused.join(", "),
            self.usages.join(", ")
        ))
    }
}

fn list<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(T::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::provisioner;
    use serde_json::json;

    fn policy() -> Policy {
        Policy::new("registry.example.net/choria-provisioner:0.1.0")
    }

    #[test]
    fn globs_match_whole_values() {
        let p = Pattern::new("registry.example.net/choria-provisioner:*");
        assert!(p.matches("registry.example.net/choria-provisioner:0.2.0"));
        assert!(p.matches("registry.example.net/choria-provisioner:"));
        assert!(!p.matches("evil.example.net/registry.example.net/choria-provisioner:1"));
        assert!(!p.matches("registry.example.net/choria-provisioner"));
        assert!(Pattern::new("a*b*c").matches("aXXbYYc"));
        assert!(!Pattern::new("a*b*c").matches("aXXbYYcd"));
        assert!(Pattern::new("*").matches(""));
        assert!(!Pattern::new("exact").matches("exactly"));
        assert!(!Pattern::new("*a".repeat(30)).matches(&"a".repeat(29)));
    }

    #[test]
    fn only_the_operators_own_image_by_default() {
        let pol = policy();
        assert!(
            pol.check(&provisioner(json!({}))).is_empty(),
            "unset: the operator's own"
        );
        assert_eq!(pol.image(&provisioner(json!({}))), pol.default_image);
        let own = json!({"image": "registry.example.net/choria-provisioner:0.1.0"});
        assert!(pol.check(&provisioner(own)).is_empty());
        let found = pol.check(&provisioner(json!({"image": "busybox:latest"})));
        assert_eq!(
            found,
            ["spec.image \"busybox:latest\" is not an image this operator may run; allowed: only the operator's own image registry.example.net/choria-provisioner:0.1.0 (the cluster admin's --allowed-image)"]
        );
    }

    #[test]
    fn listed_images_replace_the_default() {
        let mut pol = policy();
        pol.images = vec![Pattern::new(
            "registry.example.net/choria-provisioner@sha256:*",
        )];
        let pinned = json!({"image": "registry.example.net/choria-provisioner@sha256:abc"});
        assert!(pol.check(&provisioner(pinned)).is_empty());
        let found = pol.check(&provisioner(json!({})));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("spec.image is unset, so the operator's own image")
                && found[0].contains("allowed: registry.example.net/choria-provisioner@sha256:*"),
            "{found:?}"
        );
    }

    fn with_issuer(issuer: serde_json::Value, usages: serde_json::Value) -> Provisioner {
        provisioner(json!({
            "features": {"pki": true},
            "pki": {"certManager": {"issuerRef": issuer, "usages": usages}},
        }))
    }

    #[test]
    fn cluster_issuers_only_when_listed() {
        let mut pol = policy();
        let namespaced = with_issuer(json!({"name": "ca"}), json!([]));
        assert!(pol.check(&namespaced).is_empty());
        let cluster = with_issuer(
            json!({"name": "corp-ca", "kind": "ClusterIssuer"}),
            json!([]),
        );
        let found = pol.check(&cluster);
        assert_eq!(
            found,
            ["spec.pki.certManager.issuerRef names ClusterIssuer \"corp-ca\", which this operator does not let Provisioners use; allowed beyond an Issuer in the Provisioner's namespace: none (the cluster admin's --allowed-cluster-issuer)"]
        );
        let external = with_issuer(
            json!({"name": "pca", "kind": "AWSPCAIssuer", "group": "awspca.cert-manager.io"}),
            json!([]),
        );
        assert!(pol.check(&external)[0].contains("AWSPCAIssuer.awspca.cert-manager.io \"pca\""));

        pol.cluster_issuers = vec![
            "corp-*".parse().unwrap(),
            "AWSPCAIssuer.awspca.cert-manager.io/pca".parse().unwrap(),
        ];
        assert!(pol.check(&cluster).is_empty());
        assert!(pol.check(&external).is_empty());
        let other = with_issuer(json!({"name": "root", "kind": "ClusterIssuer"}), json!([]));
        assert!(pol.check(&other)[0]
            .contains("allowed beyond an Issuer in the Provisioner's namespace: corp-*, AWSPCAIssuer.awspca.cert-manager.io/pca"));
    }

    #[test]
    fn issuer_patterns_parse() {
        for bad in ["", "Kind/", ".group/x", "Kind./x", "a/b/c"] {
            assert!(bad.parse::<IssuerPattern>().is_err(), "{bad:?}");
        }
        let p: IssuerPattern = "ca".parse().unwrap();
        assert_eq!(p.to_string(), "ca");
        let p: IssuerPattern = "X.example.com/ca".parse().unwrap();
        assert_eq!(p.to_string(), "X.example.com/ca");
    }

    #[test]
    fn priority_classes_only_when_listed() {
        let mut pol = policy();
        assert!(pol.check(&provisioner(json!({"pod": {}}))).is_empty());
        let asks = provisioner(json!({"pod": {"priorityClassName": "system-node-critical"}}));
        assert_eq!(
            pol.check(&asks),
            ["spec.pod.priorityClassName \"system-node-critical\" is not a PriorityClass this operator lets Provisioners use; allowed: none (the cluster admin's --allowed-priority-class)"]
        );
        pol.priority_classes = vec![Pattern::new("choria-*")];
        assert!(pol.check(&asks)[0].contains("allowed: choria-* ("));
        let listed = provisioner(json!({"pod": {"priorityClassName": "choria-high"}}));
        assert!(pol.check(&listed).is_empty());
    }

    #[test]
    fn volume_types_beyond_the_allowed_are_refused() {
        let mut pol = policy();
        let volumes = provisioner(json!({"pod": {"volumes": [
            {"name": "ca", "secret": {"secretName": "ca"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
        ]}}));
        assert_eq!(
            pol.check(&volumes),
            ["spec.pod.volumes[2] (\"data\") uses the volume type persistentVolumeClaim, which this operator does not allow; allowed: secret, configMap, emptyDir, projected, downwardAPI (the cluster admin's --allowed-volume-type)"]
        );
        pol.volume_types.push(VolumeType::PersistentVolumeClaim);
        assert!(pol.check(&volumes).is_empty());
        pol.volume_types = vec![VolumeType::Secret];
        let found = pol.check(&volumes);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("spec.pod.volumes[1] (\"scratch\") uses the volume type emptyDir")
        );
    }

    #[test]
    fn usages_beyond_the_allowed_are_refused() {
        let mut pol = policy();
        let asks = with_issuer(
            json!({"name": "ca"}),
            json!(["client auth", "cert sign", "any"]),
        );
        assert_eq!(
            pol.check(&asks),
            ["spec.pki.certManager.usages asks for \"cert sign\", \"any\", which this operator does not allow; allowed: digital signature, key encipherment, server auth, client auth (the cluster admin's --allowed-usage)"]
        );
        pol.usages = vec!["client auth".into()];
        let defaults = with_issuer(json!({"name": "ca"}), json!([]));
        let found = pol.check(&defaults);
        assert!(
            found[0].starts_with("spec.pki.certManager.usages is unset, so the default usages are requested, and asks for \"digital signature\", \"key encipherment\", \"server auth\""),
            "{found:?}"
        );
    }
}

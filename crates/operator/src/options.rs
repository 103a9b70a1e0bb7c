//! What `choria-provisioner operator` is told, and what it makes of it: the
//! election of its replicas and the settings every reconciliation applies.

use super::{admission, build, policy, OperatorError, LEASE_NAME};
use choria_config::{ElectionBackend as ConfigBackend, ElectionConfig};
use choria_k8s::crd::{self, VolumeType};
use std::time::Duration;

/// What `choria-provisioner operator` can be told (`cmd::operator` in the
/// binary turns its command line into these).
#[derive(Clone, Debug, PartialEq)]
pub struct OperatorOptions {
    /// Watch Provisioners only in this namespace and hold the operator's
    /// Lease there (`None`: all namespaces; the Lease in the pod's namespace).
    pub namespace: Option<String>,
    /// Port of `/metrics`, `/healthz` and `/readyz`; 0 disables them.
    pub metrics_port: u16,
    /// Campaign for the Lease before reconciling; off only with a single
    /// operator replica.
    pub leader_election: bool,
    /// The operator's own image: what a Provisioner without `spec.image`
    /// runs, and the only image allowed unless `allowed_images` says
    /// otherwise (`None`: this build's `choria-provisioner:<version>`).
    pub image: Option<String>,
    /// Images a Provisioner may run; `*` stands for any run of characters
    /// (`registry.example.net/choria-provisioner:*`). Empty: only `image`.
    pub allowed_images: Vec<String>,
    /// Issuers outside a Provisioner's namespace that may sign its nodes'
    /// certificates.
    pub allowed_cluster_issuers: Vec<policy::IssuerPattern>,
    /// Key usages the nodes' certificates may carry (cert-manager's names).
    pub allowed_usages: Vec<String>,
    /// PriorityClasses a Provisioner's pods may have; `*` stands for any
    /// run of characters. Empty: none.
    pub allowed_priority_classes: Vec<String>,
    /// Volume types `spec.pod.volumes` may use.
    pub allowed_volume_types: Vec<VolumeType>,
    /// The ValidatingAdmissionPolicy (and binding) bounding the
    /// CertificateRequests a Provisioner's pods may make, applied when the
    /// operator leads; empty: none (then only the spec is bounded).
    pub admission_policy: String,
    /// The ValidatingAdmissionPolicy (and binding) bounding what a
    /// Provisioner's `spec.pod` may ask for beyond the CRD's rules (its
    /// priority class, volume types), applied when the operator leads;
    /// empty: none (then the operator refuses such a spec once stored).
    pub provisioner_admission_policy: String,
    /// The ClusterRole granting Leases, bound in a Provisioner's namespace to
    /// its pods when they elect through a Lease.
    pub lease_cluster_role: String,
    /// The ClusterRole granting CertificateRequests, bound to the pods of a
    /// Provisioner with `spec.pki.certManager`.
    pub cert_manager_cluster_role: String,
    /// The operator's Lease: how long a leader's record is valid.
    pub lease_duration: Duration,
    /// The operator's Lease: a leader that could not renew for this long
    /// stops its controller at once (before `lease_duration` has passed, so
    /// the next leader never reconciles beside it).
    pub renew_deadline: Duration,
    /// The operator's Lease: time between attempts.
    pub retry_period: Duration,
}

impl Default for OperatorOptions {
    /// The command line's defaults (a test of `cmd::operator` keeps them
    /// equal): all namespaces, leader-elected, only its own image, no
    /// issuer beyond a Provisioner's namespace, no priority class, every
    /// volume type but a claim.
    fn default() -> Self {
        OperatorOptions {
            namespace: None,
            metrics_port: 8080,
            leader_election: true,
            image: None,
            allowed_images: Vec::new(),
            allowed_cluster_issuers: Vec::new(),
            allowed_usages: choria_config::provisioner::DEFAULT_CERT_MANAGER_USAGES
                .map(String::from)
                .to_vec(),
            allowed_priority_classes: Vec::new(),
            allowed_volume_types: VolumeType::DEFAULT_ALLOWED.to_vec(),
            admission_policy: admission::DEFAULT_POLICY_NAME.into(),
            provisioner_admission_policy: admission::DEFAULT_PROVISIONER_POLICY_NAME.into(),
            lease_cluster_role: build::DEFAULT_LEASE_CLUSTER_ROLE.into(),
            cert_manager_cluster_role: build::DEFAULT_CERT_MANAGER_CLUSTER_ROLE.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl OperatorOptions {
    /// The operator's election, with client-go's rule on its timings.
    pub fn election(&self, namespace: &str) -> Result<ElectionConfig, OperatorError> {
        let (lease, renew, retry) = (self.lease_duration, self.renew_deadline, self.retry_period);
        if lease <= renew || renew.as_secs_f64() <= 1.2 * retry.as_secs_f64() {
            return Err(OperatorError::Usage(format!(
                "--lease-duration ({lease:?}) > --renew-deadline ({renew:?}) > 1.2 × --retry-period ({retry:?}) does not hold"
            )));
        }
        Ok(ElectionConfig {
            backend: ConfigBackend::Lease,
            lease_name: LEASE_NAME.into(),
            lease_namespace: Some(namespace.to_string()),
            lease_duration: lease,
            renew_deadline: renew,
            retry_period: retry,
            ..ElectionConfig::default()
        })
    }

    /// The policy and roles every reconciliation applies; refuses usages
    /// cert-manager does not know.
    pub fn settings(&self) -> Result<build::Settings, OperatorError> {
        use choria_config::provisioner::CERT_MANAGER_USAGES;
        if let Some(u) = self
            .allowed_usages
            .iter()
            .find(|u| !CERT_MANAGER_USAGES.contains(&u.as_str()))
        {
            return Err(OperatorError::Usage(format!(
                "--allowed-usage {u:?} is not a cert-manager key usage; use one of: {}",
                CERT_MANAGER_USAGES.join(", ")
            )));
        }
        let own = self.image.clone().unwrap_or_else(crd::default_image);
        let mut settings = build::Settings::new(own);
        settings.policy.images = self
            .allowed_images
            .iter()
            .map(policy::Pattern::new)
            .collect();
        settings.policy.cluster_issuers = self.allowed_cluster_issuers.clone();
        settings.policy.usages = self.allowed_usages.clone();
        settings.policy.priority_classes = self
            .allowed_priority_classes
            .iter()
            .map(policy::Pattern::new)
            .collect();
        settings.policy.volume_types = self.allowed_volume_types.clone();
        settings.lease_cluster_role = self.lease_cluster_role.clone();
        settings.cert_manager_cluster_role = self.cert_manager_cluster_role.clone();
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // What the command line turns into these options is tested with it, in
    // the binary's `cmd::operator`.

    #[test]
    fn the_policy_comes_from_the_command_line() {
        let s = OperatorOptions::default().settings().unwrap();
        assert_eq!(s.policy.default_image, crd::default_image());
        assert!(s.policy.images.is_empty() && s.policy.cluster_issuers.is_empty());
        assert!(s.policy.priority_classes.is_empty());
        assert_eq!(s.policy.volume_types, VolumeType::DEFAULT_ALLOWED);
        assert_eq!(
            s.policy.usages,
            choria_config::provisioner::DEFAULT_CERT_MANAGER_USAGES
        );
        assert_eq!(s.lease_cluster_role, build::DEFAULT_LEASE_CLUSTER_ROLE);
        let s = OperatorOptions {
            image: Some("r.example.net/cp:1".into()),
            allowed_images: vec![
                "r.example.net/cp:*".into(),
                "r.example.net/cp@sha256:*".into(),
            ],
            allowed_cluster_issuers: vec![
                "corp-ca".parse().unwrap(),
                "X.example.net/y".parse().unwrap(),
            ],
            allowed_usages: vec!["client auth".into()],
            allowed_priority_classes: vec!["choria-*".into()],
            allowed_volume_types: vec![VolumeType::Secret],
            ..Default::default()
        }
        .settings()
        .unwrap();
        assert!(s.policy.priority_class_allowed("choria-high"));
        assert_eq!(s.policy.volume_types, [VolumeType::Secret]);
        assert_eq!(s.policy.default_image, "r.example.net/cp:1");
        assert_eq!(s.policy.images.len(), 2);
        assert_eq!(s.policy.cluster_issuers.len(), 2);
        assert_eq!(s.policy.usages, ["client auth"]);
        let e = OperatorOptions {
            allowed_usages: vec!["everything".into()],
            ..Default::default()
        }
        .settings()
        .unwrap_err();
        assert!(
            e.to_string().contains("not a cert-manager key usage"),
            "{e}"
        );
    }
}

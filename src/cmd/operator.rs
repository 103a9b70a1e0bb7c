//! `choria-provisioner operator`: the Kubernetes operator.

use anyhow::Result;
use choria_k8s::crd::VolumeType;
use choria_operator::{admission, build, policy::IssuerPattern, OperatorOptions};
use std::time::Duration;

/// The command line of [`OperatorOptions`]; the defaults here and in
/// `OperatorOptions::default()` are kept equal by a test.
#[derive(clap::Args, Debug)]
pub struct OperatorArgs {
    /// Watch Provisioners only in this namespace and hold the operator's
    /// Lease there (default: all namespaces; the Lease in the pod's namespace).
    #[arg(long, env = "CHORIA_PROVISIONER_OPERATOR_NAMESPACE")]
    pub namespace: Option<String>,
    /// Port of `/metrics`, `/healthz` and `/readyz`; 0 disables them.
    #[arg(long, default_value_t = 8080)]
    pub metrics_port: u16,
    /// Campaign for the Lease before reconciling; `--leader-election=false`
    /// only with a single operator replica.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// The operator's own image: what a Provisioner without `spec.image`
    /// runs, and the only image allowed unless `--allowed-image` says
    /// otherwise (default: this build's `choria-provisioner:<version>`).
    #[arg(long, env = "CHORIA_PROVISIONER_OPERATOR_IMAGE")]
    pub image: Option<String>,
    /// An image a Provisioner may run; `*` stands for any run of
    /// characters (`registry.example.net/choria-provisioner:*`). Repeat it,
    /// or separate with commas. Default: only `--image`.
    #[arg(long = "allowed-image", value_delimiter = ',')]
    pub allowed_images: Vec<String>,
    /// An issuer outside a Provisioner's namespace that may sign its nodes'
    /// certificates: NAME for a cert-manager ClusterIssuer, KIND.GROUP/NAME
    /// for another issuer (`*` allowed in NAME). Default: none.
    #[arg(long = "allowed-cluster-issuer", value_delimiter = ',')]
    pub allowed_cluster_issuers: Vec<IssuerPattern>,
    /// A key usage the nodes' certificates may carry (cert-manager's names).
    #[arg(
        long = "allowed-usage",
        value_delimiter = ',',
        default_values_t = choria_config::provisioner::DEFAULT_CERT_MANAGER_USAGES.map(String::from)
    )]
    pub allowed_usages: Vec<String>,
    /// A PriorityClass a Provisioner's pods may have (`spec.pod.priorityClassName`);
    /// `*` stands for any run of characters. Repeat it, or separate with
    /// commas. Default: none.
    #[arg(long = "allowed-priority-class", value_delimiter = ',')]
    pub allowed_priority_classes: Vec<String>,
    /// A volume type `spec.pod.volumes` may use: secret, configMap,
    /// emptyDir, projected, downwardAPI or persistentVolumeClaim (others,
    /// such as hostPath, never). Repeat it, or separate with commas.
    #[arg(
        long = "allowed-volume-type",
        value_delimiter = ',',
        default_values_t = VolumeType::DEFAULT_ALLOWED
    )]
    pub allowed_volume_types: Vec<VolumeType>,
    /// The ValidatingAdmissionPolicy (and binding) bounding the
    /// CertificateRequests a Provisioner's pods may make, applied when the
    /// operator leads; empty: none (then only the spec is bounded).
    #[arg(long, default_value = admission::DEFAULT_POLICY_NAME)]
    pub admission_policy: String,
    /// The ValidatingAdmissionPolicy (and binding) refusing, when a
    /// Provisioner is written, a `spec.pod` priority class or volume type
    /// beyond `--allowed-priority-class` and `--allowed-volume-type`;
    /// applied when the operator leads; empty: none (then the operator
    /// refuses such a Provisioner once it is stored).
    #[arg(long, default_value = admission::DEFAULT_PROVISIONER_POLICY_NAME)]
    pub provisioner_admission_policy: String,
    /// The ClusterRole granting Leases, bound in a Provisioner's namespace to
    /// its pods when they elect through a Lease.
    #[arg(long, default_value = build::DEFAULT_LEASE_CLUSTER_ROLE)]
    pub lease_cluster_role: String,
    /// The ClusterRole granting CertificateRequests, bound to the pods of a
    /// Provisioner with `spec.pki.certManager`.
    #[arg(long, default_value = build::DEFAULT_CERT_MANAGER_CLUSTER_ROLE)]
    pub cert_manager_cluster_role: String,
    /// The operator's Lease: how long a leader's record is valid.
    #[arg(long, default_value = "15s", value_parser = duration_arg)]
    pub lease_duration: Duration,
    /// The operator's Lease: a leader that could not renew for this long
    /// stops its controller at once (before lease-duration has passed, so
    /// the next leader never reconciles beside it).
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    pub renew_deadline: Duration,
    /// The operator's Lease: time between attempts.
    #[arg(long, default_value = "2s", value_parser = duration_arg)]
    pub retry_period: Duration,
}

/// A Choria duration (`15s`, `1m`), as the provisioner's configuration writes them.
fn duration_arg(s: &str) -> Result<Duration, String> {
    choria_config::parse_duration(s).map_err(|e| e.to_string())
}

impl From<OperatorArgs> for OperatorOptions {
    fn from(args: OperatorArgs) -> Self {
        // Destructured so that a new flag cannot be left out of the options.
        let OperatorArgs {
            namespace,
            metrics_port,
            leader_election,
            image,
            allowed_images,
            allowed_cluster_issuers,
            allowed_usages,
            allowed_priority_classes,
            allowed_volume_types,
            admission_policy,
            provisioner_admission_policy,
            lease_cluster_role,
            cert_manager_cluster_role,
            lease_duration,
            renew_deadline,
            retry_period,
        } = args;
        OperatorOptions {
            namespace,
            metrics_port,
            leader_election,
            image,
            allowed_images,
            allowed_cluster_issuers,
            allowed_usages,
            allowed_priority_classes,
            allowed_volume_types,
            admission_policy,
            provisioner_admission_policy,
            lease_cluster_role,
            cert_manager_cluster_role,
            lease_duration,
            renew_deadline,
            retry_period,
        }
    }
}

pub async fn run(args: OperatorArgs) -> Result<()> {
    // The process's one Kubernetes client, for the controller, the Lease
    // and the admission policy alike.
    let kube = choria_k8s::Kube::from_environment().await;
    Ok(choria_operator::run(args.into(), &kube, super::shutdown_signal()).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: OperatorArgs,
    }

    /// `choria-provisioner operator LINE...` as the library receives it.
    fn options(line: &[&str]) -> OperatorOptions {
        let argv = std::iter::once("operator").chain(line.iter().copied());
        Cli::try_parse_from(argv).unwrap().args.into()
    }

    #[test]
    fn the_empty_command_line_is_the_default() {
        assert_eq!(options(&[]), OperatorOptions::default());
    }

    #[test]
    fn a_volume_type_a_provisioner_may_never_use_is_refused() {
        let argv = ["operator", "--allowed-volume-type=hostPath"];
        let e = Cli::try_parse_from(argv).err().unwrap().to_string();
        assert!(e.contains("never allowed"), "{e}");
    }

    #[test]
    fn lists_repeat_or_are_separated_with_commas() {
        let o = options(&[
            "--image=r.example.net/cp:1",
            "--allowed-image=r.example.net/cp:*,r.example.net/cp@sha256:*",
            "--allowed-cluster-issuer=corp-ca",
            "--allowed-cluster-issuer=X.example.net/y",
            "--allowed-usage=client auth",
            "--allowed-priority-class=choria-*,fleet-high",
            "--allowed-volume-type=secret",
            "--allowed-volume-type=persistentVolumeClaim",
            "--leader-election=false",
            "--lease-duration=1m",
        ]);
        assert_eq!(o.image.as_deref(), Some("r.example.net/cp:1"));
        assert_eq!(
            o.allowed_images,
            ["r.example.net/cp:*", "r.example.net/cp@sha256:*"]
        );
        assert_eq!(
            o.allowed_cluster_issuers,
            [
                "corp-ca".parse::<IssuerPattern>().unwrap(),
                "X.example.net/y".parse().unwrap()
            ]
        );
        assert_eq!(o.allowed_usages, ["client auth"]);
        assert_eq!(o.allowed_priority_classes, ["choria-*", "fleet-high"]);
        assert_eq!(
            o.allowed_volume_types,
            [VolumeType::Secret, VolumeType::PersistentVolumeClaim]
        );
        assert!(!o.leader_election);
        assert_eq!(o.lease_duration, Duration::from_secs(60));
    }
}

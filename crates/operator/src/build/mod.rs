//! The objects a `Provisioner` stands for, built without a cluster: the
//! reconciler applies exactly these, so tests of these functions are tests of
//! what lands in the cluster.
//!
//! Secrets never appear in what is built here: the spec only names Secret
//! keys, which reach the pods as files under
//! `/etc/choria-provisioner/secrets/<secret>/<key>`, and the configuration
//! only holds those paths. The one exception is the signing key the
//! operator makes when the spec names none ([`signing_key_secret`]): a
//! fresh seed, created once as a Secret and never read back, logged or
//! shown.

use super::policy::Policy;
use choria_config::schema::{
    AdmissionFile, AuditFile, CaFile, CertManagerFile, ConfigurationTemplateFile, ElectionFile,
    EvidenceFile, FeaturesFile, ProvisionerFile, RecordsFile, RenewalFile, TelemetryFile,
};
use choria_k8s::crd::{
    AuditSpec, BrokerSpec, CaSpec, ElectionBackend, ElectionMode, EvidenceSpec, PodOverrides,
    PodVolume, Provisioner, ProvisionerSpec, RecordsSpec, RenewalSpec, SecretKeyRef, TelemetrySpec,
};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, HTTPGetAction, KeyToPath, LocalObjectReference, ObjectFieldSelector,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SeccompProfile, Secret,
    SecretVolumeSource, SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec, Volume,
    VolumeMount,
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
/// Where `spec.admission.policy`'s ConfigMap key is mounted.
pub const ADMISSION_DIR: &str = "/etc/choria-provisioner/admission";
/// The ConfigMap key of the provisioner's configuration.
pub const PROVISIONER_YAML: &str = "provisioner.yaml";
/// The ConfigMap key of the Choria client configuration.
pub const CHORIA_CFG: &str = "choria.cfg";
/// The ConfigMap key of the Choria client configuration renewal uses when
/// `spec.renewal.broker` is set.
pub const RENEWAL_CFG: &str = "renewal.cfg";
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

/// The ClusterRole the chart ships for the pods' Leases.
pub const DEFAULT_LEASE_CLUSTER_ROLE: &str = "choria-provisioner-operator-leases";
/// The ClusterRole the chart ships for the pods' CertificateRequests.
pub const DEFAULT_CERT_MANAGER_CLUSTER_ROLE: &str =
    "choria-provisioner-operator-certificaterequests";

/// What the operator's command line adds to every spec: the admin's policy
/// (and so the image that runs) and the ClusterRoles the pods are bound to.
#[derive(Clone, Debug)]
pub struct Settings {
    pub policy: Policy,
    pub lease_cluster_role: String,
    pub cert_manager_cluster_role: String,
}

impl Settings {
    /// The defaults, with `own_image` as the operator's image.
    pub fn new(own_image: impl Into<String>) -> Self {
        Settings {
            policy: Policy::new(own_image),
            lease_cluster_role: DEFAULT_LEASE_CLUSTER_ROLE.into(),
            cert_manager_cluster_role: DEFAULT_CERT_MANAGER_CLUSTER_ROLE.into(),
        }
    }
}

/// Everything one `Provisioner` owns.
#[derive(Clone, Debug)]
pub struct Owned {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    /// To the Lease ClusterRole; without subjects unless the election is
    /// `lease`.
    pub lease_binding: RoleBinding,
    /// To the CertificateRequest ClusterRole; without subjects unless
    /// `spec.pki.certManager` is set.
    pub cert_manager_binding: RoleBinding,
    pub config_map: ConfigMap,
    pub service: Service,
    pub deployment: Deployment,
    /// Only with two replicas or more; otherwise the reconciler deletes it.
    pub pdb: Option<PodDisruptionBudget>,
}

/// Builds every owned object.
pub fn owned(p: &Provisioner, settings: &Settings) -> Result<Owned, BuildError> {
    let config_map = config_map(p)?;
    Ok(Owned {
        service_account: service_account(p)?,
        role: role(p)?,
        role_binding: role_binding(p)?,
        lease_binding: lease_binding(p, &settings.lease_cluster_role)?,
        cert_manager_binding: cert_manager_binding(p, &settings.cert_manager_cluster_role)?,
        deployment: deployment(p, settings.policy.image(p), &checksum(&config_map))?,
        config_map,
        service: service(p)?,
        pdb: pdb(p)?,
    })
}

/// The key of the Secret the operator makes for a Provisioner's seals.
pub const SIGNING_KEY: &str = "seed";

/// The Secret the operator makes when `spec.signingKeySecret` is unset.
pub fn signing_key_secret_name(name: &str) -> String {
    format!("{name}-signing-key")
}

/// Whether the pods seal anything: records, or a shards membership.
pub fn needs_signing_key(spec: &ProvisionerSpec) -> bool {
    spec.records.is_some() || spec.election.mode == ElectionMode::Shards
}

/// The seed the pods seal with: the spec's, or the one the operator
/// makes; `None` when nothing is sealed.
pub fn signing_key_ref(name: &str, spec: &ProvisionerSpec) -> Option<SecretKeyRef> {
    if !needs_signing_key(spec) {
        return None;
    }
    Some(
        spec.signing_key_secret
            .clone()
            .unwrap_or_else(|| SecretKeyRef {
                name: signing_key_secret_name(name),
                key: SIGNING_KEY.into(),
            }),
    )
}

/// The Secret the operator makes for a Provisioner that needs a seed and
/// names none: a fresh one, owned by it. Made once (create only: it is
/// never read back or replaced, so the operator needs no access to
/// Secrets beyond create).
pub fn signing_key_secret(p: &Provisioner) -> Result<Option<Secret>, BuildError> {
    if p.spec.signing_key_secret.is_some() || !needs_signing_key(&p.spec) {
        return Ok(None);
    }
    let seed = choria_wire::security::seal::SealKey::generate().seed_hex();
    Ok(Some(Secret {
        metadata: meta(p, signing_key_secret_name(&p.name_any()))?,
        string_data: Some(BTreeMap::from([(SIGNING_KEY.to_string(), seed)])),
        type_: Some("Opaque".into()),
        ..Secret::default()
    }))
}

/// Path of a Secret key inside the pods.
pub fn secret_path(secret: &str, key: &str) -> String {
    format!("{SECRETS_DIR}/{secret}/{key}")
}

fn ref_path(r: &SecretKeyRef) -> String {
    secret_path(&r.name, &r.key)
}

/// `spec.pki.ca`, when the built-in CA signs.
pub fn ca_spec(spec: &ProvisionerSpec) -> Option<&CaSpec> {
    spec.pki.as_ref().and_then(|p| p.ca.as_ref())
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

/// Every Secret the pods need and which of its keys, in a stable order;
/// `name` is the Provisioner's (it names the signing key it may be given).
pub fn secret_mounts(name: &str, spec: &ProvisionerSpec) -> BTreeMap<String, BTreeSet<String>> {
    let mut mounts: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let records = spec.records.as_ref();
    let signing = signing_key_ref(name, spec);
    // The CA's certificate and key, and nothing else of its Secret.
    let ca = ca_spec(spec).map(|c| [c.certificate_ref(), c.key_ref()]);
    let evidence = spec.evidence.as_ref();
    let refs = [
        &spec.token_secret,
        &spec.broker_password_secret,
        &spec.jwt_verify_key_secret,
        &spec.jwt_signing_key_secret,
        &spec.jwt_signing_token_secret,
    ];
    let evidence_refs = evidence.into_iter().flat_map(|e| {
        [
            &e.aws_certificates,
            &e.gcp_certificates,
            &e.azure_certificates,
        ]
    });
    let record_refs = records.into_iter().flat_map(|r| {
        [
            &r.credentials_secret,
            &r.password_secret,
            &r.token_secret,
            &r.tls_ca_secret,
            &r.tls_cert_secret,
            &r.tls_key_secret,
        ]
    });
    for r in refs
        .into_iter()
        .chain(record_refs)
        .chain(evidence_refs)
        .flatten()
        .chain(signing.as_ref())
        .chain(ca.iter().flatten())
    {
        mounts
            .entry(r.name.clone())
            .or_default()
            .insert(r.key.clone());
    }
    let renewal_broker = spec.renewal.as_ref().and_then(|r| r.broker.as_ref());
    let brokers = std::iter::once(&spec.broker).chain(renewal_broker);
    for (secret, keys) in brokers.flat_map(|b| {
        [
            (&b.tls_secret, &TLS_KEYS[..]),
            (&b.client_jwt_secret, &CLIENT_JWT_KEYS[..]),
        ]
    }) {
        if let Some(secret) = secret {
            let entry = mounts.entry(secret.clone()).or_default();
            entry.extend(keys.iter().map(|k| k.to_string()));
        }
    }
    mounts
}

mod config;
mod disruption;
mod rbac;
mod workload;
pub use config::*;
pub use disruption::*;
pub use rbac::*;
pub use workload::*;

#[cfg(test)]
mod tests;

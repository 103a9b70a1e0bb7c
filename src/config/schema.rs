//! The one definition of `provisioner.yaml`'s keys: the reader
//! ([`super::provisioner`], [`super::election`]) takes its list of known keys
//! from here, and writers (the operator's ConfigMap, tests) build these
//! structs and serialize them. A key added here is known to both; a key the
//! reader reads but the struct lacks fails the round-trip test in
//! `provisioner/tests.rs` (every setting written from a parsed file parses
//! back to the same settings).
//!
//! Values are as written in the file (durations as text such as `10m`),
//! before defaults and checks: that is the reader's job.

use serde::Serialize;
use std::collections::BTreeMap;

/// Declares a file section: a struct of optional fields named exactly as the
/// YAML keys, serialized without the unset ones, and `KEYS`, the key list.
macro_rules! file_section {
    ($(#[$meta:meta])* pub struct $name:ident { $( $(#[$fmeta:meta])* $key:ident : $ty:ty ),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, PartialEq, Serialize)]
        pub struct $name {
            $(
                $(#[$fmeta])*
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $key: Option<$ty>,
            )*
        }

        impl $name {
            /// Every key of this section, as written in the file.
            pub const KEYS: &'static [&'static str] = &[$(stringify!($key)),*];
        }
    };
}

file_section! {
    /// The top level of `provisioner.yaml`: the Go provisioner's keys, then ours.
    pub struct ProvisionerFile {
        workers: i64,
        interval: String,
        logfile: String,
        loglevel: String,
        helper: String,
        token: String,
        /// Ours: read `token` from this file (a mounted Secret).
        token_file: String,
        /// Ours: read `broker_provisioning_password` from this file.
        broker_provisioning_password_file: String,
        lifecycle_component: String,
        choria_insecure: bool,
        site: String,
        monitor_port: i64,
        /// Accepted and ignored, as in Go.
        broker_port: i64,
        broker_provisioning_password: String,
        cert_deny_list: Vec<String>,
        jwt_verify_cert: String,
        jwt_signing_key: String,
        jwt_signing_token: String,
        server_jwt_validity: String,
        /// Accepted and ignored, as in Go.
        rego_policy: String,
        leader_election: bool,
        upgrades_repository: String,
        upgrades_optional: bool,
        features: FeaturesFile,
        /// Ours: the election backend and its timing.
        election: ElectionFile,
        discovery_timeout: String,
        discovery_window: String,
        helper_timeout: String,
        rpc_timeout: String,
        /// Ours: how long a trusted answer's reply subject stays watched.
        reply_window: String,
        /// Ours: DNS names besides the identity a CSR may ask for (regexes).
        csr_allowed_dns_names: Vec<String>,
        /// Ours: the node's configuration as templates (`config::template`).
        configuration_template: ConfigurationTemplateFile,
        /// Ours: cert-manager signs the nodes' CSRs (`features.pki`).
        cert_manager: CertManagerFile,
    }
}

file_section! {
    /// `cert_manager:` (ours).
    pub struct CertManagerFile {
        issuer: String,
        issuer_kind: String,
        issuer_group: String,
        namespace: String,
        duration: String,
        usages: Vec<String>,
        timeout: String,
        keep: String,
    }
}

file_section! {
    /// `configuration_template:` (ours).
    pub struct ConfigurationTemplateFile {
        values: BTreeMap<String, serde_json::Value>,
        configuration: BTreeMap<String, String>,
        action_policies: BTreeMap<String, String>,
        opa_policies: BTreeMap<String, String>,
        server_claims: serde_json::Value,
        upgrade: String,
    }
}

file_section! {
    /// `features:`.
    pub struct FeaturesFile {
        pki: bool,
        jwt: bool,
        ed25519: bool,
        upgrades: bool,
    }
}

file_section! {
    /// `election:` (ours; the Go provisioner only has `leader_election`).
    pub struct ElectionFile {
        mode: String,
        backend: String,
        bucket: String,
        name: String,
        api_prefix: String,
        create_bucket: bool,
        bucket_ttl: String,
        lease_name: String,
        lease_namespace: String,
        lease_duration: String,
        renew_deadline: String,
        retry_period: String,
    }
}

impl ProvisionerFile {
    /// The YAML text of this file.
    pub fn to_yaml(&self) -> Result<String, serde_norway::Error> {
        serde_norway::to_string(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_serialized_names() {
        let f = ProvisionerFile {
            workers: Some(1),
            features: Some(FeaturesFile {
                pki: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        let yaml = f.to_yaml().unwrap();
        assert_eq!(yaml, "workers: 1\nfeatures:\n  pki: true\n");
        assert!(ProvisionerFile::KEYS.contains(&"broker_provisioning_password_file"));
        assert_eq!(FeaturesFile::KEYS, ["pki", "jwt", "ed25519", "upgrades"]);
        assert_eq!(ElectionFile::KEYS.len(), 12);
        assert_eq!(ElectionFile::KEYS[0], "mode");
    }
}

//! The settings written back as a `provisioner.yaml`.

use super::{CertManagerConfig, ConfigurationTemplate, ProvisionerConfig};
use crate::ca::KeyRef;
use crate::duration::format_duration;
use crate::schema::{CertManagerFile, ConfigurationTemplateFile, FeaturesFile, ProvisionerFile};
use std::path::PathBuf;
use std::time::Duration;

impl ProvisionerConfig {
    /// The settings as a `provisioner.yaml` that parses back to them
    /// (defaults written out). It holds the secrets themselves: for writing
    /// files, never for logs.
    pub fn to_file(&self) -> ProvisionerFile {
        let d = |d: Duration| Some(format_duration(d));
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        ProvisionerFile {
            workers: Some(self.workers as i64),
            interval: Some(self.interval_text.clone()),
            logfile: self.logfile.clone(),
            loglevel: self.loglevel.clone(),
            helper: (!self.helper.is_empty()).then(|| self.helper.clone()),
            token: (!self.token.is_empty()).then(|| self.token.expose().to_string()),
            token_file: path(&self.token_file),
            broker_provisioning_password_file: path(&self.broker_provisioning_password_file),
            lifecycle_component: Some(self.lifecycle_component.clone()),
            choria_insecure: Some(self.choria_insecure),
            site: Some(self.site.clone()),
            monitor_port: Some(self.monitor_port.map_or(0, i64::from)),
            broker_port: self.broker_port,
            broker_provisioning_password: self
                .broker_provisioning_password
                .as_ref()
                .map(|p| p.expose().to_string()),
            cert_deny_list: Some(self.cert_deny_list.clone()),
            jwt_verify_cert: self.jwt_verify_cert.clone(),
            jwt_signing_key: self.jwt_signing_key.as_ref().map(KeyRef::to_file_text),
            jwt_signing_token: path(&self.jwt_signing_token),
            server_jwt_validity: d(self.server_jwt_validity),
            rego_policy: self.rego_policy.clone(),
            leader_election: Some(self.leader_election),
            upgrades_repository: self.upgrades_repository.clone(),
            upgrades_optional: Some(self.upgrades_optional),
            features: Some(FeaturesFile {
                pki: Some(self.features.pki),
                jwt: Some(self.features.jwt),
                ed25519: Some(self.features.ed25519),
                upgrades: Some(self.features.upgrades),
            }),
            election: Some(self.election.to_file()),
            discovery_timeout: d(self.discovery_timeout),
            discovery_window: d(self.discovery_window),
            helper_timeout: d(self.helper_timeout),
            rpc_timeout: self.rpc_timeout.and_then(d),
            reply_window: Some(if self.reply_window.is_zero() {
                "0s".to_string()
            } else {
                format_duration(self.reply_window)
            }),
            request_batch_window: Some(if self.request_batch_window.is_zero() {
                "0s".to_string()
            } else {
                format_duration(self.request_batch_window)
            }),
            csr_allowed_dns_names: Some(self.csr_allowed_dns_names.clone()),
            configuration_template: self.configuration_template.as_ref().map(template_file),
            records: self.records.as_ref().map(|r| r.to_file()),
            renewal: self.renewal.as_ref().map(|r| r.to_file()),
            admission: self.admission.as_ref().map(|a| a.to_file()),
            audit: self.audit.as_ref().map(|a| a.to_file()),
            evidence: self.evidence.as_ref().map(|e| e.to_file()),
            telemetry: self.telemetry.as_ref().map(|t| t.to_file()),
            ca: self.ca.as_ref().map(|c| c.to_file()),
            cert_manager: self.cert_manager.as_ref().map(cert_manager_file),
        }
    }
}

/// `configuration_template:` as written.
fn template_file(t: &ConfigurationTemplate) -> ConfigurationTemplateFile {
    ConfigurationTemplateFile {
        values: Some(t.values.clone()),
        configuration: Some(t.configuration.clone()),
        action_policies: Some(t.action_policies.clone()),
        opa_policies: Some(t.opa_policies.clone()),
        server_claims: t
            .server_claims
            .as_ref()
            .map(|c| serde_json::to_value(c).expect("claims serialize")),
        upgrade: t.upgrade.clone(),
    }
}

/// `cert_manager:` as written, its durations in the files' spelling.
fn cert_manager_file(c: &CertManagerConfig) -> CertManagerFile {
    CertManagerFile {
        issuer: Some(c.issuer.clone()),
        issuer_kind: Some(c.issuer_kind.clone()),
        issuer_group: Some(c.issuer_group.clone()),
        namespace: Some(c.namespace.clone()),
        duration: c.duration.map(format_duration),
        usages: Some(c.usages.clone()),
        timeout: Some(format_duration(c.timeout)),
        keep: Some(if c.keep.is_zero() {
            "0s".to_string()
        } else {
            format_duration(c.keep)
        }),
    }
}

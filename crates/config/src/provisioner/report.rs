//! `run --check`'s report: every setting as it takes effect.

use super::{CertManagerConfig, LogTarget, ProvisionerConfig};
use crate::ca::KeyRef;
use crate::duration::format_duration;
use crate::election::ElectionBackend;
use crate::template::ConfigurationTemplate;
use crate::Secret;
use std::path::PathBuf;

/// One line of the report: the key as in the file, the value in effect.
type Setting = (String, String);

impl ProvisionerConfig {
    /// Every setting as it takes effect (defaults filled in), keyed as in the
    /// file, for `run --check`. Secrets show only whether they are set.
    pub fn effective_settings(&self) -> Vec<(String, String)> {
        // The order is part of the output: `run --check` prints the
        // settings as they come, in the file reference's order of concerns.
        [
            self.general_settings(),
            self.trust_settings(),
            self.feature_settings(),
            self.election_settings(),
            self.exchange_settings(),
            self.section_settings(),
        ]
        .concat()
    }

    /// How the provisioner runs, what it sends and where it reports.
    fn general_settings(&self) -> Vec<Setting> {
        vec![
            ("workers".into(), self.workers.to_string()),
            ("interval".into(), self.interval_text.clone()),
            (
                "logfile".into(),
                match self.log_target() {
                    LogTarget::Stdout => "stdout".into(),
                    LogTarget::Stderr => "stderr".into(),
                    LogTarget::Discard => "discard".into(),
                    LogTarget::File(f) => f.display().to_string(),
                },
            ),
            ("loglevel".into(), self.log_level().as_filter().into()),
            ("helper".into(), self.helper.clone()),
            ("token".into(), secret(Some(&self.token))),
            ("token_file".into(), path(self.token_file.as_ref())),
            (
                "lifecycle_component".into(),
                self.lifecycle_component.clone(),
            ),
            ("choria_insecure".into(), self.choria_insecure.to_string()),
            ("site".into(), self.site.clone()),
            (
                "monitor_port".into(),
                self.monitor_port
                    .map_or_else(|| "(off)".into(), |p| p.to_string()),
            ),
        ]
    }

    /// The broker password, what a CSR may not be for, and the keys that
    /// verify the nodes' JWTs and sign theirs.
    fn trust_settings(&self) -> Vec<Setting> {
        vec![
            (
                "broker_provisioning_password".into(),
                secret(self.broker_provisioning_password.as_ref()),
            ),
            (
                "broker_provisioning_password_file".into(),
                path(self.broker_provisioning_password_file.as_ref()),
            ),
            ("cert_deny_list".into(), self.cert_deny_list.join(" ")),
            (
                "jwt_verify_cert".into(),
                unset_or(self.jwt_verify_cert.as_deref()),
            ),
            (
                "jwt_signing_key".into(),
                // A URI's PIN is redacted.
                unset_or(
                    self.jwt_signing_key
                        .as_ref()
                        .map(KeyRef::to_string)
                        .as_deref(),
                ),
            ),
            (
                "jwt_signing_token".into(),
                path(self.jwt_signing_token.as_ref()),
            ),
            (
                "server_jwt_validity".into(),
                self.server_jwt_validity_text(),
            ),
        ]
    }

    /// `features.*`, after the upgrade settings the upgrades feature uses.
    fn feature_settings(&self) -> Vec<Setting> {
        vec![
            (
                "upgrades_repository".into(),
                unset_or(self.upgrades_repository.as_deref()),
            ),
            (
                "upgrades_optional".into(),
                self.upgrades_optional.to_string(),
            ),
            ("features.pki".into(), self.features.pki.to_string()),
            ("features.jwt".into(), self.features.jwt.to_string()),
            ("features.ed25519".into(), self.features.ed25519.to_string()),
            (
                "features.upgrades".into(),
                self.features.upgrades.to_string(),
            ),
        ]
    }

    /// `election.*`: the backend, the keys of the backend in use (the other
    /// backend's keep defaults nobody uses), the shards' signing key.
    fn election_settings(&self) -> Vec<Setting> {
        let e = &self.election;
        let mut out: Vec<Setting> = vec![("election.backend".into(), e.backend.as_str().into())];
        match e.backend {
            ElectionBackend::None => {}
            ElectionBackend::Streams => out.extend([
                ("election.bucket".into(), e.bucket.clone()),
                ("election.name".into(), e.name.clone()),
                ("election.api_prefix".into(), e.api_prefix.clone()),
                ("election.create_bucket".into(), e.create_bucket.to_string()),
                ("election.bucket_ttl".into(), format_duration(e.bucket_ttl)),
                ("election.replicas".into(), e.replicas.to_string()),
            ]),
            ElectionBackend::Lease => out.extend([
                ("election.lease_name".into(), e.lease_name.clone()),
                (
                    "election.lease_namespace".into(),
                    unset_or(e.lease_namespace.as_deref()).replace("(unset)", "(the pod's)"),
                ),
                (
                    "election.lease_duration".into(),
                    format_duration(e.lease_duration),
                ),
                (
                    "election.renew_deadline".into(),
                    format_duration(e.renew_deadline),
                ),
                (
                    "election.retry_period".into(),
                    format_duration(e.retry_period),
                ),
            ]),
        }
        if let Some(k) = &e.signing_key {
            out.push(("election.signing_key".into(), k.display().to_string()));
        }
        out
    }

    /// Ours, fixed in Go: how long discovery, the helper and an RPC may
    /// take, how long a reply subject is watched, the names a CSR may ask for.
    fn exchange_settings(&self) -> Vec<Setting> {
        vec![
            (
                "discovery_timeout".into(),
                format_duration(self.discovery_timeout),
            ),
            (
                "discovery_window".into(),
                format_duration(self.discovery_window),
            ),
            (
                "helper_timeout".into(),
                format_duration(self.helper_timeout),
            ),
            (
                "rpc_timeout".into(),
                self.rpc_timeout.map_or_else(
                    || "(Go's: 2s + the agent's timeout)".into(),
                    format_duration,
                ),
            ),
            ("reply_window".into(), format_duration(self.reply_window)),
            (
                "request_batch_window".into(),
                format_duration(self.request_batch_window),
            ),
            (
                "csr_allowed_dns_names".into(),
                self.csr_allowed_dns_names.join(" "),
            ),
        ]
    }

    /// The optional sections (ours), one line each, only when present.
    fn section_settings(&self) -> Vec<Setting> {
        let mut out = Vec::new();
        if let Some(r) = &self.records {
            out.push(("records".into(), r.effective()));
            let mut buckets = vec![r.bucket.clone(), format!("{}_REVOCATIONS", r.bucket)];
            if self.evidence.is_some() {
                buckets.push(format!("{}_INSTANCES", r.bucket));
            }
            let what = if r.create_bucket {
                format!(
                    "created when missing with {} replica(s), or protected when an earlier version made them",
                    r.replicas
                )
            } else {
                "must exist and be protected (records.create_bucket is false)".into()
            };
            out.push((
                "records.buckets".into(),
                format!(
                    "{}: {what}; protected: no delete, purge or roll-up, and a key's values are never pushed out",
                    buckets.join(", ")
                ),
            ));
        }
        if let Some(r) = &self.renewal {
            out.push(("renewal".into(), r.effective()));
        }
        if let Some(a) = &self.admission {
            out.push((
                "admission".into(),
                format!(
                    "policy {}{}",
                    a.policy.display(),
                    if a.rego_v0 { " (Rego v0)" } else { "" }
                ),
            ));
        }
        if let Some(a) = &self.audit {
            out.push((
                "audit".into(),
                format!(
                    "stream {} on {}.>, kept {} or {} bytes, {} replica(s), each event stored once (its id as the message id)",
                    a.stream,
                    a.subject,
                    crate::duration::format_duration(a.max_age),
                    a.max_bytes,
                    a.replicas
                ),
            ));
        }
        if let Some(e) = &self.evidence {
            out.push(("evidence".into(), e.effective()));
        }
        if let Some(t) = &self.telemetry {
            out.push(("telemetry".into(), t.effective()));
        }
        if let Some(c) = &self.cert_manager {
            out.push(("cert_manager".into(), cert_manager_summary(c)));
        }
        if let Some(c) = &self.ca {
            out.push(("ca".into(), c.effective()));
        }
        if let Some(t) = &self.configuration_template {
            out.push((
                "configuration_template".into(),
                configuration_template_summary(t),
            ));
        }
        out
    }
}

/// `cert_manager:` on one line.
fn cert_manager_summary(c: &CertManagerConfig) -> String {
    format!(
        "{} {}.{} in {}, duration {}, usages {}, timeout {}, keep {}",
        c.issuer_kind,
        c.issuer,
        c.issuer_group,
        c.namespace,
        c.duration
            .map_or("(issuer default)".into(), format_duration),
        c.usages.join(", "),
        format_duration(c.timeout),
        format_duration(c.keep)
    )
}

/// `configuration_template:` on one line. Templates may hold secrets the
/// operator wrote in: only names.
fn configuration_template_summary(t: &ConfigurationTemplate) -> String {
    format!(
        "{} settings ({}), {} action and {} OPA policies{}{}",
        t.configuration.len(),
        t.configuration
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join(" "),
        t.action_policies.len(),
        t.opa_policies.len(),
        if t.server_claims.is_some() {
            ", server claims"
        } else {
            ""
        },
        if t.upgrade.is_some() { ", upgrade" } else { "" },
    )
}

fn unset_or(v: Option<&str>) -> String {
    v.map_or_else(|| "(unset)".to_string(), str::to_string)
}

fn path(p: Option<&PathBuf>) -> String {
    unset_or(p.map(|p| p.to_string_lossy()).as_deref())
}

/// Only whether it is set: the report goes to logs and terminals.
fn secret(s: Option<&Secret>) -> String {
    match s {
        Some(s) if !s.is_empty() => "(set, redacted)".to_string(),
        _ => "(unset)".to_string(),
    }
}

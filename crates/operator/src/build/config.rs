//! The pods' configuration: `provisioner.yaml` (in the provisioner's own schema), `choria.cfg`, the ConfigMap holding both, and its checksum.

use super::*;

/// The pods' `provisioner.yaml`. Keys of the other election backend are left
/// out, so the provisioner has nothing to warn about.
pub fn provisioner_yaml(p: &Provisioner) -> Result<String, BuildError> {
    let s = &p.spec;
    let e = &s.election;
    let lease = e.backend == ElectionBackend::Lease;
    let streams = e.backend == ElectionBackend::Streams;
    let shards = e.mode == ElectionMode::Shards;
    // The Lease timings are the membership's in shards mode, on both backends.
    let timed = lease || shards;
    let owned = |v: Option<&String>| v.cloned();
    let doc = ProvisionerFile {
        helper: s.helper.as_ref().map(|h| h.command.clone()),
        workers: s.workers.map(i64::from),
        interval: owned(s.interval.as_ref()),
        loglevel: s.log_level.map(|l| l.as_str().to_string()),
        token_file: s.token_secret.as_ref().map(ref_path),
        broker_provisioning_password_file: s.broker_password_secret.as_ref().map(ref_path),
        lifecycle_component: owned(s.lifecycle_component.as_ref()),
        choria_insecure: Some(s.choria_insecure),
        site: owned(s.site.as_ref()),
        monitor_port: Some(i64::from(s.monitor_port)),
        cert_deny_list: (!s.cert_deny_list.is_empty()).then(|| s.cert_deny_list.clone()),
        jwt_verify_cert: s.jwt_verify_key_secret.as_ref().map(ref_path),
        jwt_signing_key: s.jwt_signing_key_secret.as_ref().map(ref_path),
        jwt_signing_token: s.jwt_signing_token_secret.as_ref().map(ref_path),
        server_jwt_validity: owned(s.server_jwt_validity.as_ref()),
        upgrades_repository: owned(s.upgrades_repository.as_ref()),
        upgrades_optional: Some(s.upgrades_optional),
        features: Some(FeaturesFile {
            pki: Some(s.features.pki),
            jwt: Some(s.features.jwt),
            ed25519: Some(s.features.ed25519),
            upgrades: Some(s.features.upgrades),
        }),
        discovery_timeout: owned(s.discovery_timeout.as_ref()),
        discovery_window: owned(s.discovery_window.as_ref()),
        helper_timeout: owned(s.helper_timeout.as_ref()),
        rpc_timeout: owned(s.rpc_timeout.as_ref()),
        election: Some(ElectionFile {
            mode: shards.then(|| e.mode.as_str().to_string()),
            backend: Some(e.backend.as_str().to_string()),
            lease_name: lease.then(|| p.name_any()),
            lease_namespace: if lease { Some(namespace(p)?) } else { None },
            lease_duration: owned(e.lease_duration.as_ref()).filter(|_| timed),
            renew_deadline: owned(e.renew_deadline.as_ref()).filter(|_| timed),
            retry_period: owned(e.retry_period.as_ref()).filter(|_| timed),
            bucket: owned(e.bucket.as_ref()).filter(|_| streams),
            name: owned(e.name.as_ref()).filter(|_| streams),
            api_prefix: owned(e.api_prefix.as_ref()).filter(|_| streams),
            signing_key: signing_key_ref(&p.name_any(), s)
                .filter(|_| shards)
                .map(|r| ref_path(&r)),
            verify_keys: (shards && !s.signing_verify_keys.is_empty())
                .then(|| s.signing_verify_keys.clone()),
            ..Default::default()
        }),
        configuration_template: s
            .node_configuration
            .as_ref()
            .map(|n| ConfigurationTemplateFile {
                values: Some(
                    n.values
                        .iter()
                        .map(|(k, v)| (k.clone(), serde_json::Value::from(v.clone())))
                        .collect(),
                ),
                configuration: Some(n.configuration.clone()),
                action_policies: Some(n.action_policies.clone()),
                opa_policies: Some(n.opa_policies.clone()),
                server_claims: n.server_claims.clone(),
                upgrade: n.upgrade.clone(),
            }),
        cert_manager: match s.pki.as_ref().and_then(|p| p.cert_manager.as_ref()) {
            Some(c) => Some(CertManagerFile {
                issuer: Some(c.issuer_ref.name.clone()),
                issuer_kind: c.issuer_ref.kind.clone(),
                issuer_group: c.issuer_ref.group.clone(),
                namespace: Some(namespace(p)?),
                duration: c.duration.clone(),
                usages: (!c.usages.is_empty()).then(|| c.usages.clone()),
                timeout: c.timeout.clone(),
                keep: c.keep.clone(),
            }),
            None => None,
        },
        ca: ca_spec(s).map(|c| CaFile {
            certificate: Some(ref_path(&c.certificate_ref())),
            key: Some(ref_path(&c.key_ref())),
            validity: c.validity.clone(),
        }),
        records: s.records.as_ref().map(|r| {
            let mut file = records_file(r, signing_key_ref(&p.name_any(), s));
            file.verify_keys =
                (!s.signing_verify_keys.is_empty()).then(|| s.signing_verify_keys.clone());
            file
        }),
        renewal: s.renewal.as_ref().map(renewal_file),
        admission: s.admission.as_ref().map(|a| AdmissionFile {
            policy: Some(format!("{ADMISSION_DIR}/{}", a.policy.key)),
            rego_v0: a.rego_v0,
        }),
        evidence: s.evidence.as_ref().map(evidence_file),
        audit: s.audit.as_ref().map(audit_file),
        telemetry: s.telemetry.as_ref().map(telemetry_file),
        ..Default::default()
    };
    let body = doc.to_yaml().map_err(|e| BuildError::Serialize {
        what: PROVISIONER_YAML,
        message: e.to_string(),
    })?;
    Ok(format!(
        "# Written by the choria-provisioner operator from Provisioner {}/{}; edit the resource, not this.\n{body}",
        namespace(p)?,
        p.name_any()
    ))
}

/// `records:`: the credentials and the signing key are the mounted Secret
/// files.
fn records_file(r: &RecordsSpec, signing_key: Option<SecretKeyRef>) -> RecordsFile {
    RecordsFile {
        url: Some(r.urls.join(",")),
        bucket: r.bucket.clone(),
        history: r.history.map(i64::from),
        create_bucket: r.create_bucket,
        replicas: r.replicas.map(i64::from),
        user: r.user.clone(),
        password_file: r.password_secret.as_ref().map(ref_path),
        token_file: r.token_secret.as_ref().map(ref_path),
        credentials_file: r.credentials_secret.as_ref().map(ref_path),
        tls_ca: r.tls_ca_secret.as_ref().map(ref_path),
        tls_cert: r.tls_cert_secret.as_ref().map(ref_path),
        tls_key: r.tls_key_secret.as_ref().map(ref_path),
        signing_key: signing_key.as_ref().map(ref_path),
        ..Default::default()
    }
}

/// `evidence:`: the certificates are the mounted Secret files.
fn evidence_file(e: &EvidenceSpec) -> EvidenceFile {
    let list = |l: &Vec<String>| (!l.is_empty()).then(|| l.clone());
    EvidenceFile {
        aws_certificates: e.aws_certificates.as_ref().map(ref_path),
        aws_accounts: list(&e.aws_accounts),
        gcp_certificates: e.gcp_certificates.as_ref().map(ref_path),
        gcp_audience: e.gcp_audience.clone(),
        gcp_projects: list(&e.gcp_projects),
        azure_certificates: e.azure_certificates.as_ref().map(ref_path),
        azure_subscriptions: list(&e.azure_subscriptions),
        max_age: e.max_age.clone(),
        node_name: e.node_name.clone(),
        one_identity_per_instance: e.one_identity_per_instance,
        rebind_after_expiry: e.rebind_after_expiry,
    }
}

/// `audit:`: the stream is created by the pods when it is missing.
fn audit_file(a: &AuditSpec) -> AuditFile {
    AuditFile {
        stream: a.stream.clone(),
        subject: a.subject.clone(),
        max_age: a.max_age.clone(),
        max_bytes: a.max_bytes,
        create_stream: None,
        replicas: a.replicas.map(i64::from),
    }
}

/// `telemetry:`: the pods post their traces to the endpoint as written;
/// unset values keep the provisioner's defaults.
fn telemetry_file(t: &TelemetrySpec) -> TelemetryFile {
    TelemetryFile {
        otlp_endpoint: Some(t.otlp_endpoint.clone()),
        service_name: t.service_name.clone(),
        sample_percent: t.sample_percent.map(i64::from),
    }
}

/// `renewal:`: `reprovision` goes through `renewal.cfg` when the spec names
/// a broker for it, otherwise through the provisioner's own `choria.cfg`.
fn renewal_file(r: &RenewalSpec) -> RenewalFile {
    let cfg = if r.broker.is_some() {
        RENEWAL_CFG
    } else {
        CHORIA_CFG
    };
    RenewalFile {
        before: Some(r.before.clone()),
        jitter: r.jitter.clone(),
        rate: r.rate.map(i64::from),
        choria_config: Some(format!("{CONFIG_DIR}/{cfg}")),
        collective: r.collective.clone(),
        retry: r.retry.clone(),
    }
}

/// The pods' Choria client configuration: the `choria` security provider with
/// `clientJwtSecret`, otherwise `file` (x509 from `tlsSecret`, or nothing
/// with `choriaInsecure`).
pub fn choria_cfg(p: &Provisioner) -> Result<String, BuildError> {
    client_cfg(p, &p.spec.broker, "")
}

/// The Choria client configuration renewal reaches the provisioned nodes
/// with (`spec.renewal.broker`), if the spec names one.
pub fn renewal_cfg(p: &Provisioner) -> Result<Option<String>, BuildError> {
    match p.spec.renewal.as_ref().and_then(|r| r.broker.as_ref()) {
        Some(b) => client_cfg(p, b, " for renewal").map(Some),
        None => Ok(None),
    }
}

fn client_cfg(p: &Provisioner, b: &BrokerSpec, purpose: &str) -> Result<String, BuildError> {
    let identity = b.identity.clone().unwrap_or_else(|| p.name_any());
    let mut lines = vec![
        format!(
            "# Written by the choria-provisioner operator from Provisioner {}/{}{purpose}.",
            namespace(p)?,
            p.name_any()
        ),
        format!("identity = {identity}"),
        format!("plugin.choria.middleware_hosts = {}", b.urls.join(",")),
    ];
    let tls = |key: &str| b.tls_secret.as_ref().map(|s| secret_path(s, key));
    match &b.client_jwt_secret {
        Some(jwt) => {
            lines.push("plugin.security.provider = choria".into());
            lines.push(format!(
                "plugin.security.choria.token_file = {}",
                secret_path(jwt, "token")
            ));
            lines.push(format!(
                "plugin.security.choria.seed_file = {}",
                secret_path(jwt, "seed")
            ));
            if let (Some(ca), Some(cert), Some(key)) =
                (tls("ca.crt"), tls("tls.crt"), tls("tls.key"))
            {
                lines.push(format!("plugin.security.choria.ca = {ca}"));
                lines.push(format!("plugin.security.choria.certificate = {cert}"));
                lines.push(format!("plugin.security.choria.key = {key}"));
            }
        }
        None => {
            lines.push("plugin.security.provider = file".into());
            if let (Some(ca), Some(cert), Some(key)) =
                (tls("ca.crt"), tls("tls.crt"), tls("tls.key"))
            {
                lines.push(format!("plugin.security.file.certificate = {cert}"));
                lines.push(format!("plugin.security.file.key = {key}"));
                lines.push(format!("plugin.security.file.ca = {ca}"));
            }
        }
    }
    let mut text = lines.join("\n");
    text.push('\n');
    Ok(text)
}

/// `<name>-config` with `provisioner.yaml`, `choria.cfg` and, when renewal
/// has a broker of its own, `renewal.cfg`.
pub fn config_map(p: &Provisioner) -> Result<ConfigMap, BuildError> {
    let mut data = BTreeMap::from([
        (PROVISIONER_YAML.to_string(), provisioner_yaml(p)?),
        (CHORIA_CFG.to_string(), choria_cfg(p)?),
    ]);
    if let Some(cfg) = renewal_cfg(p)? {
        data.insert(RENEWAL_CFG.to_string(), cfg);
    }
    Ok(ConfigMap {
        metadata: meta(p, config_map_name(&p.name_any()))?,
        data: Some(data),
        ..ConfigMap::default()
    })
}

/// sha256 (hex) of the ConfigMap's data: keys and values, each ended by NUL
/// so no two different maps hash alike.
pub fn checksum(cm: &ConfigMap) -> String {
    let mut h = Sha256::new();
    for (k, v) in cm.data.iter().flatten() {
        h.update(k.as_bytes());
        h.update([0]);
        h.update(v.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())
}

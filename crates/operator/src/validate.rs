//! Checks of a `Provisioner` spec before anything is applied, so a mistake
//! shows up as `Degraded` with a message saying what to fix instead of as
//! crash-looping pods.
//!
//! First the spec's own rules (each message names the field), then the
//! generated `provisioner.yaml` and `choria.cfg` go through the provisioner's
//! own parsers, so every rule the pods would apply at start is applied here
//! too.

use super::build;

mod pod;
use choria_config::ca::MIN_CA_VALIDITY;
use choria_config::names::is_dns_label;
use choria_config::provisioner::MIN_INTERVAL;
use choria_config::{parse_duration, ChoriaClientConfig, Environment, ProvisionerConfig};
use choria_k8s::crd::{ElectionBackend, ElectionMode, Provisioner, ProvisionerSpec, SecretKeyRef};
use kube::ResourceExt;
use std::time::Duration;

/// The longest Provisioner name: `<name>-metrics` must be a DNS label.
pub const MAX_NAME_LEN: usize = 63 - "-metrics".len();

/// Every problem found, each saying what to fix; empty when the spec is valid.
///
/// The stages run in the order of the spec's parts and report in that order
/// (the book and the tests quote the messages).
pub fn validate(p: &Provisioner) -> Vec<String> {
    let mut problems = Vec::new();
    let s = &p.spec;
    let problem = &mut |m: String| problems.push(m);
    name(p, problem);
    pods(s, problem);
    broker(s, problem);
    secret_refs(s, problem);
    features(s, problem);
    ca(s, problem);
    durations(s, problem);
    election(s, problem);
    records_and_renewal(s, problem);
    revocations(s, problem);
    bindings(s, problem);
    telemetry(s, problem);
    helper(s, problem);
    pod::check(&s.pod, problem);

    // The provisioner's own rules, applied to what the pods will read. Only
    // when the spec passed, so one mistake is not reported twice.
    if problems.is_empty() {
        problems.extend(check_generated(p));
    }
    problems
}

/// `metadata.name`: it names every owned object, the metrics Service too.
fn name(p: &Provisioner, problem: &mut dyn FnMut(String)) {
    let name = p.name_any();
    if !is_dns_label(&name)
        || !name.starts_with(|c: char| c.is_ascii_lowercase())
        || name.len() > MAX_NAME_LEN
    {
        problem(format!(
            "metadata.name {name:?} cannot name the Service {name}-metrics: use at most {MAX_NAME_LEN} lower case letters, digits and '-', starting with a letter"
        ));
    }
}

/// What the Deployment's pods are: how many, their port, workers and image.
fn pods(s: &ProvisionerSpec, problem: &mut dyn FnMut(String)) {
    if s.replicas < 0 {
        problem(format!("spec.replicas is {}; use 0 or more", s.replicas));
    }
    if !(1..=65535).contains(&s.monitor_port) {
        problem(format!(
            "spec.monitorPort {} is not a port; use 1-65535 (default 8080)",
            s.monitor_port
        ));
    }
    if matches!(s.workers, Some(w) if w < 0) {
        problem(
            "spec.workers is negative; use a positive number, or leave it out for one per CPU"
                .into(),
        );
    }
    if s.image.as_deref().is_some_and(|i| i.trim().is_empty()) {
        problem("spec.image is empty; name the choria-provisioner image, or leave it out for the operator's own".into());
    }
}

/// `spec.broker` and its security.
fn broker(s: &ProvisionerSpec, problem: &mut dyn FnMut(String)) {
    let b = &s.broker;
    if b.urls.is_empty() {
        problem("spec.broker.urls is empty; list at least one broker, e.g. nats://broker.example.net:4222".into());
    }
    for (i, url) in b.urls.iter().enumerate() {
        // A password in a URL would land in the ConfigMap; the URL is not
        // repeated here, as it would put it in the status and events.
        let authority = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
        if authority.split('/').next().is_some_and(|a| a.contains('@')) {
            problem(format!(
                "spec.broker.urls[{i}] carries credentials; remove them and use spec.brokerPasswordSecret (user provisioner) or the broker Secrets"
            ));
            continue;
        }
        if url.trim().is_empty() || url.contains(char::is_whitespace) || url.contains(',') {
            problem(format!(
                "spec.broker.urls[{i}] {url:?} is not a broker address; use host:port or nats://host:port"
            ));
        }
    }
    if let Some(id) = &b.identity {
        if id.trim().is_empty() || id.contains(char::is_whitespace) {
            problem(format!(
                "spec.broker.identity {id:?} is not a Choria identity; leave it out to use the resource name"
            ));
        }
    }
    match (&b.tls_secret, &b.client_jwt_secret, s.choria_insecure) {
        (None, None, false) => problem(
            "no broker credentials: set spec.broker.tlsSecret (x509, the file security provider), spec.broker.clientJwtSecret (the choria security provider), or spec.choriaInsecure: true for test networks".into(),
        ),
        (_, Some(_), true) => problem(
            "spec.choriaInsecure: true contradicts spec.broker.clientJwtSecret (protocol v2 is always signed); remove one of them".into(),
        ),
        (None, Some(_), false) if !b.insecure_skip_verify => problem(
            "spec.broker.clientJwtSecret without spec.broker.tlsSecret leaves the broker's TLS certificate unverified, so the client token and the key exchange would cross an unauthenticated channel; add spec.broker.tlsSecret (its ca.crt verifies the broker), or set spec.broker.insecureSkipVerify: true to accept that".into(),
        ),
        _ => {}
    }
    for (field, secret) in [
        ("spec.broker.tlsSecret", &b.tls_secret),
        ("spec.broker.clientJwtSecret", &b.client_jwt_secret),
    ] {
        if let Some(secret) = secret {
            check_object_name(field, secret, problem);
        }
    }
}

/// The Secret keys the pods read their token, password and JWT keys from.
fn secret_refs(s: &ProvisionerSpec, problem: &mut dyn FnMut(String)) {
    for (field, r) in [
        ("spec.tokenSecret", &s.token_secret),
        ("spec.brokerPasswordSecret", &s.broker_password_secret),
        ("spec.jwtVerifyKeySecret", &s.jwt_verify_key_secret),
        ("spec.jwtSigningKeySecret", &s.jwt_signing_key_secret),
        ("spec.jwtSigningTokenSecret", &s.jwt_signing_token_secret),
    ] {
        if let Some(r) = r {
            check_secret_ref(field, r, problem);
        }
    }
}

/// `spec.features` and the keys they need.
fn features(s: &ProvisionerSpec, problem: &mut dyn FnMut(String)) {
    let f = &s.features;
    if f.pki && f.ed25519 {
        problem("spec.features: pki and ed25519 cannot both be enabled; enable only one".into());
    }
    if f.ed25519 && s.jwt_signing_key_secret.is_none() {
        problem("spec.features.ed25519 needs spec.jwtSigningKeySecret: the Secret key holding the ed25519 seed that signs server JWTs".into());
    }
    if (f.jwt || f.ed25519) && s.jwt_verify_key_secret.is_none() {
        let feature = if f.ed25519 { "ed25519" } else { "jwt" };
        problem(format!(
            "spec.features.{feature} needs spec.jwtVerifyKeySecret: the Secret key holding the public key or certificate that verifies the nodes' provisioning.jwt"
        ));
    }
}

/// `spec.pki.ca`: a signer for `features.pki`, cert-manager's alternative,
/// its Secret's name and keys, and a lifetime renewal has time to act in.
fn ca(s: &ProvisionerSpec, problem: &mut dyn FnMut(String)) {
    let Some(ca) = build::ca_spec(s) else {
        return;
    };
    if !s.features.pki {
        problem("spec.pki.ca signs the nodes' CSRs, which are fetched only with spec.features.pki: true; enable it or remove spec.pki".into());
    }
    if s.pki.as_ref().is_some_and(|p| p.cert_manager.is_some()) {
        problem(
            "spec.pki.certManager and spec.pki.ca both sign the nodes' CSRs; keep one of them"
                .into(),
        );
    }
    check_object_name("spec.pki.ca.secretName", &ca.secret_name, problem);
    check_key(
        "spec.pki.ca.certificateKey",
        "Secret",
        &ca.certificate_key,
        problem,
    );
    check_key("spec.pki.ca.keyKey", "Secret", &ca.key_key, problem);
    if let Some(d) = positive_duration("pki.ca.validity", &ca.validity, problem) {
        if d < MIN_CA_VALIDITY {
            problem(format!(
                "spec.pki.ca.validity {:?} is shorter than 1h: renewal would have no time to act",
                ca.validity.as_deref().unwrap_or_default()
            ));
        }
    }
}

/// The spec's durations outside `spec.election`; `spec.interval` has a floor.
fn durations(s: &ProvisionerSpec, problem: &mut dyn FnMut(String)) {
    if let Some(d) = positive_duration("interval", &s.interval, problem) {
        if d < MIN_INTERVAL {
            problem(format!(
                "spec.interval {:?} is below the minimum of 1m; use for example 10m or 1h",
                s.interval.as_deref().unwrap_or_default()
            ));
        }
    }
    for (field, value) in [
        ("serverJwtValidity", &s.server_jwt_validity),
        ("discoveryTimeout", &s.discovery_timeout),
        ("discoveryWindow", &s.discovery_window),
        ("helperTimeout", &s.helper_timeout),
        ("rpcTimeout", &s.rpc_timeout),
    ] {
        positive_duration(field, value, problem);
    }
}

/// `spec.election`: shards need a membership, and a Lease's timings follow
/// client-go's rule (unset ones count with their defaults). Timings of
/// other backends are not checked: they are not used.
fn election(s: &ProvisionerSpec, problem: &mut dyn FnMut(String)) {
    let e = &s.election;
    let shards = e.mode == ElectionMode::Shards;
    if shards && e.backend == ElectionBackend::None {
        problem("spec.election.mode: Shards needs a membership: set spec.election.backend to Lease or Streams".into());
    }
    if e.backend != ElectionBackend::Lease && !shards {
        return;
    }
    let lease = positive_duration("election.leaseDuration", &e.lease_duration, problem);
    let renew = positive_duration("election.renewDeadline", &e.renew_deadline, problem);
    let retry = positive_duration("election.retryPeriod", &e.retry_period, problem);
    let defaults = choria_config::ElectionConfig::default();
    let (lease, renew, retry) = (
        lease.unwrap_or(defaults.lease_duration),
        renew.unwrap_or(defaults.renew_deadline),
        retry.unwrap_or(defaults.retry_period),
    );
    if lease <= renew {
        problem(format!(
            "spec.election.leaseDuration ({lease:?}) must be longer than renewDeadline ({renew:?})"
        ));
    }
    if renew.as_secs_f64() <= 1.2 * retry.as_secs_f64() {
        problem(format!(
            "spec.election.renewDeadline ({renew:?}) must be longer than 1.2 × retryPeriod ({retry:?})"
        ));
    }
}

/// `spec.<field>` parsed, when set; `None` (and a problem) when it does not
/// parse or is zero.
fn positive_duration(
    field: &str,
    value: &Option<String>,
    problem: &mut dyn FnMut(String),
) -> Option<Duration> {
    let raw = value.as_deref()?;
    match parse_duration(raw) {
        Ok(d) if d.is_zero() => {
            problem(format!(
                "spec.{field} {raw:?} is zero; use a positive duration such as 10s"
            ));
            None
        }
        Ok(d) => Some(d),
        Err(e) => {
            problem(format!("spec.{field}: {e}"));
            None
        }
    }
}

/// `spec.records` and `spec.renewal`: what the API server's rules check,
/// for objects stored before them (their values reach the parsers below).
fn records_and_renewal(s: &ProvisionerSpec, problem: &mut dyn FnMut(String)) {
    if s.renewal.is_some() && s.records.is_none() {
        problem(
            "spec.renewal works from the records of what was issued: set spec.records too".into(),
        );
    }
    if s.renewal.is_some() && s.token_secret.is_none() {
        problem("spec.renewal asks nodes to reprovision with their provisioning token: set spec.tokenSecret".into());
    }
    let urls = |field: &str, urls: &[String], problem: &mut dyn FnMut(String)| {
        if urls.is_empty() {
            problem(format!("{field} is empty; list at least one server"));
        }
        for (i, url) in urls.iter().enumerate() {
            // Never repeated: it may carry a password.
            if url.trim().is_empty() || url.contains([' ', '\t', ',', '@']) {
                problem(format!(
                    "{field}[{i}] is not an address without spaces, commas or credentials"
                ));
            }
        }
    };
    if let Some(r) = &s.records {
        urls("spec.records.urls", &r.urls, problem);
        for (field, r) in [
            ("spec.records.credentialsSecret", &r.credentials_secret),
            ("spec.records.passwordSecret", &r.password_secret),
            ("spec.records.tokenSecret", &r.token_secret),
            ("spec.records.tlsCaSecret", &r.tls_ca_secret),
            ("spec.records.tlsCertSecret", &r.tls_cert_secret),
            ("spec.records.tlsKeySecret", &r.tls_key_secret),
        ] {
            if let Some(r) = r {
                check_secret_ref(field, r, problem);
            }
        }
        if r.user.is_some() != r.password_secret.is_some() {
            problem("spec.records.user and spec.records.passwordSecret go together".into());
        }
        if r.tls_cert_secret.is_some() != r.tls_key_secret.is_some() {
            problem("spec.records.tlsCertSecret and spec.records.tlsKeySecret go together".into());
        }
    }
    if let Some(b) = s.renewal.as_ref().and_then(|r| r.broker.as_ref()) {
        urls("spec.renewal.broker.urls", &b.urls, problem);
        if b.tls_secret.is_none() && b.client_jwt_secret.is_none() {
            problem("spec.renewal.broker needs credentials the nodes' policies allow: tlsSecret (x509) or clientJwtSecret (protocol v2)".into());
        }
        for (field, secret) in [
            ("spec.renewal.broker.tlsSecret", &b.tls_secret),
            ("spec.renewal.broker.clientJwtSecret", &b.client_jwt_secret),
        ] {
            if let Some(secret) = secret {
                check_object_name(field, secret, problem);
            }
        }
    }
}

/// `spec.revocations`: what the API server's rules check, and what the
/// pods would refuse to write.
fn revocations(s: &ProvisionerSpec, problem: &mut dyn FnMut(String)) {
    if s.revocations.is_empty() {
        return;
    }
    if s.records.is_none() {
        problem("spec.revocations are written beside the records and sealed with their key: set spec.records too".into());
    }
    if s.revocations.len() > choria_k8s::crd::MAX_REVOCATIONS as usize {
        problem(format!(
            "spec.revocations lists {} identities, more than {}: revoke the rest with choria-provisioner revoke",
            s.revocations.len(),
            choria_k8s::crd::MAX_REVOCATIONS
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, r) in s.revocations.iter().enumerate() {
        if let Err(e) = choria_wire::identity::validate(&r.identity) {
            problem(format!("spec.revocations[{i}].identity: {e}"));
        } else if !seen.insert(r.identity.as_str()) {
            problem(format!("spec.revocations[{i}].identity is listed twice"));
        }
        if r.reason.trim().is_empty()
            || r.reason.contains(['\n', '\r'])
            || r.reason.chars().count() > 500
        {
            problem(format!(
                "spec.revocations[{i}].reason must be one line of text, not empty, at most 500 characters"
            ));
        }
    }
}

/// `spec.bindings`: what the API server's rules check, and what the pods
/// would refuse to write.
fn bindings(s: &ProvisionerSpec, problem: &mut dyn FnMut(String)) {
    if s.bindings.is_empty() {
        return;
    }
    let one_per_instance = s
        .evidence
        .as_ref()
        .is_some_and(|e| e.one_identity_per_instance != Some(false));
    if s.records.is_none() || !one_per_instance {
        problem("spec.bindings bind names beside the records, for evidence with one identity per instance: set spec.records and spec.evidence too".into());
    }
    if s.bindings.len() > choria_k8s::crd::MAX_BINDINGS as usize {
        problem(format!(
            "spec.bindings lists {} names, more than {}: bind the rest with choria-provisioner rebind",
            s.bindings.len(),
            choria_k8s::crd::MAX_BINDINGS
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, b) in s.bindings.iter().enumerate() {
        if let Err(e) = choria_wire::identity::validate(&b.identity) {
            problem(format!("spec.bindings[{i}].identity: {e}"));
        } else if !seen.insert(b.identity.as_str()) {
            problem(format!("spec.bindings[{i}].identity is listed twice"));
        }
        if !choria_k8s::crd::is_instance(&b.instance) {
            problem(format!(
                "spec.bindings[{i}].instance must name an instance as the provisioner does: aws.<account>.<id>, gcp.<project>.<id> or azure.<subscription>.<vm id>"
            ));
        }
        if b.reason.trim().is_empty()
            || b.reason.contains(['\n', '\r'])
            || b.reason.chars().count() > 500
        {
            problem(format!(
                "spec.bindings[{i}].reason must be one line of text, not empty, at most 500 characters"
            ));
        }
    }
}

/// `spec.telemetry`: what the provisioner's `telemetry:` refuses, with its
/// own rules. The endpoint is not bounded by the operator's policy: see
/// `policy`'s doc for why.
fn telemetry(s: &ProvisionerSpec, problem: &mut dyn FnMut(String)) {
    use choria_config::telemetry::{service_name_ok, traces_url, SAMPLE_PERCENTS};
    let Some(t) = &s.telemetry else {
        return;
    };
    // The endpoint is not repeated: a refused one may carry credentials.
    if traces_url(&t.otlp_endpoint).is_err() {
        problem(if t.otlp_endpoint.starts_with("https://") {
            "spec.telemetry.otlpEndpoint: only http:// is supported; send traces to a collector in the cluster, which may forward them over TLS".into()
        } else {
            "spec.telemetry.otlpEndpoint must be a plain http:// URL such as http://otel-collector.monitoring:4318, without user information, query or fragment".into()
        });
    }
    if t.service_name
        .as_deref()
        .is_some_and(|n| !service_name_ok(n))
    {
        problem(
            "spec.telemetry.serviceName must be at most 128 characters, without control characters"
                .into(),
        );
    }
    if let Some(p) = t
        .sample_percent
        .filter(|p| !SAMPLE_PERCENTS.contains(&i64::from(*p)))
    {
        problem(format!(
            "spec.telemetry.samplePercent {p} is not 1 to 100 (default 100); to trace nothing, remove spec.telemetry"
        ));
    }
}

/// `spec.helper`, or else `spec.nodeConfiguration`: what configures the nodes.
fn helper(s: &ProvisionerSpec, problem: &mut dyn FnMut(String)) {
    match &s.helper {
        Some(h) => {
            if h.command.trim().is_empty() {
                problem("spec.helper.command is empty; give the helper's command line, e.g. /etc/choria-provisioner/helper/helper.sh".into());
            }
            if let Some(cm) = &h.config_map {
                check_object_name("spec.helper.configMap", cm, problem);
            }
        }
        None if s.node_configuration.is_none() => problem(
            "neither spec.helper nor spec.nodeConfiguration is set; one of them has to configure the nodes".into(),
        ),
        None => {}
    }
}

/// Runs the generated files through the provisioner's parsers.
fn check_generated(p: &Provisioner) -> Vec<String> {
    let mut problems = Vec::new();
    match build::provisioner_yaml(p) {
        Ok(text) => {
            if let Err(e) = ProvisionerConfig::parse(&text, build::PROVISIONER_YAML) {
                problems.push(format!(
                    "the provisioner would refuse its configuration: {e}"
                ));
            }
        }
        Err(e) => problems.push(e.to_string()),
    }
    let renewal = build::renewal_cfg(p).transpose();
    for (file, built) in [
        (build::CHORIA_CFG, Some(build::choria_cfg(p))),
        (build::RENEWAL_CFG, renewal),
    ] {
        match built {
            Some(Ok(text)) => {
                let checked = ChoriaClientConfig::parse(&text, file, &Environment::default())
                    .and_then(|c| {
                        c.middleware_servers()?;
                        c.security_provider(p.spec.choria_insecure)
                    });
                if let Err(e) = checked {
                    problems.push(format!(
                        "the provisioner would refuse its Choria configuration {file}: {e}"
                    ));
                }
            }
            Some(Err(e)) => problems.push(e.to_string()),
            None => {}
        }
    }
    problems
}

fn check_secret_ref(field: &str, r: &SecretKeyRef, problem: &mut dyn FnMut(String)) {
    check_key_ref(field, "Secret", &r.name, &r.key, problem);
}

/// `name` and `key` of a Secret's or ConfigMap's key (`what`).
fn check_key_ref(field: &str, what: &str, name: &str, key: &str, problem: &mut dyn FnMut(String)) {
    check_object_name(&format!("{field}.name"), name, problem);
    check_key(&format!("{field}.key"), what, key, problem);
}

/// A Secret's or ConfigMap's key (`what`) at `field`.
fn check_key(field: &str, what: &str, key: &str, problem: &mut dyn FnMut(String)) {
    // A key becomes a file name in the Secret's directory.
    let valid_key = !key.is_empty()
        && key.len() <= 253
        && key != "."
        && key != ".."
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
    if !valid_key {
        problem(format!(
            "{field} {key:?} is not a {what} key; use letters, digits, '-', '_' and '.'"
        ));
    }
}

fn check_object_name(field: &str, name: &str, problem: &mut dyn FnMut(String)) {
    let valid = !name.is_empty() && name.len() <= 253 && name.split('.').all(is_dns_label);
    if !valid {
        problem(format!(
            "{field} {name:?} is not an object name; use lower case letters, digits, '-' and '.'"
        ));
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod examples {
    use super::*;

    /// Every Provisioner shipped in deploy/ and shown in the book
    /// (docs/src/examples/) passes what the operator checks, the
    /// provisioner's own parsers included (not just the CRD schema), and
    /// the operator's default policy whatever image the operator was
    /// installed with (the chart's `image.repository` is the installer's):
    /// so none may name an image.
    #[test]
    fn the_shipped_example_provisioners_are_valid() {
        let policies = [
            crate::policy::Policy::new(choria_k8s::crd::default_image()),
            crate::policy::Policy::new(
                "registry.example.net/choria-provisioner:0.1.0-5f0c1e2a9b3d",
            ),
        ];
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
        let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(root.join("deploy"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("example-")
            })
            .collect();
        let mut dirs = vec![root.join("docs/src/examples")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "yaml") {
                    files.push(path);
                }
            }
        }
        let mut seen = 0;
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            for doc in serde_norway::Deserializer::from_str(&text) {
                let v = <serde_json::Value as serde::Deserialize>::deserialize(doc).unwrap();
                if v["kind"] != "Provisioner" {
                    continue;
                }
                let mut v = v;
                v["metadata"]["uid"] = "u".into();
                let p: Provisioner = serde_json::from_value(v).unwrap();
                assert_eq!(validate(&p), Vec::<String>::new(), "{}", path.display());
                for policy in &policies {
                    assert_eq!(
                        policy.check(&p),
                        Vec::<String>::new(),
                        "{}: refused by the operator's default policy with its own image {}",
                        path.display(),
                        policy.default_image
                    );
                }
                seen += 1;
            }
        }
        assert!(seen >= 3, "{seen} example Provisioners");
    }
}

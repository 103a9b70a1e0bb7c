//! Validation at admission: CEL rules (`x-kubernetes-validations`) the API
//! server applies to every create and update, each with a message saying
//! what to fix, so `kubectl apply` refuses a mistake instead of the
//! operator reporting it as `Degraded` later.
//!
//! They cover every static rule of the spec: exclusive features, a helper or
//! templates, what `features` need, broker credentials, names and keys,
//! duration formats and their minimums, ranges, the signer's fields
//! (`validation/pki.rs`) and `spec.pod`'s additions (`validation/pod.rs`:
//! names, what the operator keeps for itself, bounds).
//! What the API server cannot see (Secrets, issuers, the provisioner's own
//! parsers over the generated files, the cluster admin's policy) stays with
//! the operator, which also still checks everything here: objects stored
//! before a rule existed are not checked again until they change.
//!
//! Strings a rule matches get a `maxLength`, which keeps each rule's
//! estimated cost inside the API server's budget.

use serde_json::{json, Value};

mod attested;
mod pki;
mod pod;
pub use pod::{ENV_NAME, MAX_ENV, MAX_ENV_VALUE, MAX_MOUNTS, MAX_VOLUMES};

/// A Go duration (`time.ParseDuration`): combinable s, m, h and smaller
/// units. Written without backslashes, which CEL strings would need escaped.
const GO_DURATION: &str = "^(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+$";
/// A Choria long duration: one number of weeks, days, 30-day months or
/// 365-day years (`config::duration`), truncated to whole hours.
const LONG_DURATION: &str = "^([0-9]+([.][0-9]*)?|[.][0-9]+)[wWdDMyY]$";
/// An object name (RFC 1123 subdomain).
const OBJECT_NAME: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A node's identity (`choria_wire::identity::validate`).
const IDENTITY: &str = "^[A-Za-z0-9_-]+([.][A-Za-z0-9_-]+)*$";
/// A Secret key: a file name of letters, digits, `-`, `_` and `.`.
const SECRET_KEY: &str = "^[-._a-zA-Z0-9]+$";
/// The longest duration string considered.
const DURATION_MAX_LENGTH: i64 = 32;
/// Durations that must be above zero.
const POSITIVE_DURATIONS: [&str; 6] = [
    "spec.serverJwtValidity",
    "spec.discoveryTimeout",
    "spec.discoveryWindow",
    "spec.helperTimeout",
    "spec.rpcTimeout",
    "spec.pki.certManager.timeout",
];
/// The Lease timings (Go durations) and their defaults.
const LEASE_TIMINGS: [(&str, &str); 3] = [
    ("spec.election.leaseDuration", "15s"),
    ("spec.election.renewDeadline", "10s"),
    ("spec.election.retryPeriod", "2s"),
];
/// The references to Secret keys.
const SECRET_REFS: [&str; 14] = [
    "spec.tokenSecret",
    "spec.brokerPasswordSecret",
    "spec.jwtVerifyKeySecret",
    "spec.jwtSigningKeySecret",
    "spec.jwtSigningTokenSecret",
    "spec.records.credentialsSecret",
    "spec.records.passwordSecret",
    "spec.records.tokenSecret",
    "spec.records.tlsCaSecret",
    "spec.records.tlsCertSecret",
    "spec.records.tlsKeySecret",
    "spec.evidence.awsCertificates",
    "spec.evidence.gcpCertificates",
    "spec.evidence.azureCertificates",
];
/// An OTLP/HTTP endpoint as `telemetry.otlp_endpoint` takes it
/// (`choria_config::telemetry::traces_url`): plain HTTP, a host and port
/// without user information, a path without query, fragment or spaces.
const OTLP_ENDPOINT: &str = "^http://[]a-zA-Z0-9[.:_-]+(/[^?#[:space:][:cntrl:]]*)?$";
/// A share of a lifetime, as `renewal.before` takes it.
const PERCENT: &str = "^([0-9]+([.][0-9]*)?|[.][0-9]+)%$";

/// One rule: where it sits in the schema (dotted, `[]` for list items, ``
/// for the root), the CEL expression, the message, and the field it is
/// about when that is not where it sits.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub at: &'static str,
    pub rule: String,
    pub message: String,
    pub field_path: Option<&'static str>,
}

fn rule(at: &'static str, rule: impl Into<String>, message: impl Into<String>) -> Rule {
    Rule {
        at,
        rule: rule.into(),
        message: message.into(),
        field_path: None,
    }
}

/// A rule about `field` that sits at `at` (it reads other fields too).
fn about(
    at: &'static str,
    field: &'static str,
    rule: impl Into<String>,
    message: impl Into<String>,
) -> Rule {
    Rule {
        at,
        rule: rule.into(),
        message: message.into(),
        field_path: Some(field),
    }
}

/// `s` in hours when it is a long duration (the caller checked that).
fn long_hours(s: &str) -> String {
    let ends = |units: &str| {
        units
            .chars()
            .map(|u| format!("{s}.endsWith('{u}')"))
            .collect::<Vec<_>>()
            .join(" || ")
    };
    format!(
        "double({s}.substring(0, {s}.size() - 1)) * ({} ? 168.0 : ({} ? 24.0 : ({} ? 720.0 : 8760.0)))",
        ends("wW"),
        ends("dD"),
        ends("M")
    )
}

/// `s` is a Choria duration of at least `go_min` (a Go duration; a long
/// duration is truncated to whole hours, so it needs one).
fn at_least(s: &str, go_min: &str) -> String {
    format!(
        "{s}.matches('{GO_DURATION}') ? duration({s}) >= duration('{go_min}') : (!{s}.matches('{LONG_DURATION}') || {} >= 1.0)",
        long_hours(s)
    )
}

/// Format, and a minimum (`Some`) or any (`None`) duration.
fn duration_rules(at: &'static str, min: Option<(&str, &str)>) -> Vec<Rule> {
    let field = at;
    let mut rules = vec![rule(
        at,
        format!("self.matches('{GO_DURATION}') || self.matches('{LONG_DURATION}')"),
        format!("{field} must be a duration such as 30s, 1h30m, 10d or 1y"),
    )];
    match min {
        Some(("0s", _)) => rules.push(rule(
            at,
            format!(
                "self.matches('{GO_DURATION}') ? duration(self) > duration('0s') : (!self.matches('{LONG_DURATION}') || {} >= 1.0)",
                long_hours("self")
            ),
            format!("{field} is zero; use a positive duration such as 10s"),
        )),
        Some((min, message)) => rules.push(rule(at, at_least("self", min), format!("{field} {message}"))),
        None => {}
    }
    rules
}

/// A Lease timing: a Go duration, positive.
fn lease_timing(at: &'static str, default: &str) -> Vec<Rule> {
    vec![rule(
        at,
        format!("self.matches('{GO_DURATION}') && duration(self) > duration('0s')"),
        format!("{at} must be a positive duration in h, m and s, such as {default}"),
    )]
}

/// `self.FIELD` as a duration, or `default` when unset (or malformed: the
/// field's own rule reports that).
fn lease_value(field: &str, default: &str) -> String {
    format!(
        "(has(self.{field}) && self.{field}.matches('{GO_DURATION}') ? duration(self.{field}) : duration('{default}'))"
    )
}

fn secret_ref(at: &'static str) -> Vec<Rule> {
    let field = at;
    vec![
        rule(
            at,
            format!("self.name.size() <= 253 && self.name.matches('{OBJECT_NAME}')"),
            format!("{field}.name must be a Secret's name: lower case letters, digits, '-' and '.'"),
        ),
        rule(
            at,
            format!("self.key.size() <= 253 && self.key.matches('{SECRET_KEY}') && self.key != '.' && self.key != '..'"),
            format!("{field}.key must be a Secret key: letters, digits, '-', '_' and '.'"),
        ),
    ]
}

fn object_name(at: &'static str, what: &str) -> Rule {
    rule(
        at,
        format!("self.size() <= 253 && self.matches('{OBJECT_NAME}')"),
        format!("{at} must be {what}: lower case letters, digits, '-' and '.'"),
    )
}

/// Every rule, in the order they are documented.
pub fn rules() -> Vec<Rule> {
    let mut all = vec![
        rule(
            "",
            "self.metadata.name.size() <= 55 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
            "metadata.name must be at most 55 lower case letters, digits and '-', starting with a letter: it also names the Service <name>-metrics",
        ),
        // What the spec as a whole needs.
        about(
            "spec",
            ".features",
            "!(self.features.pki && self.features.ed25519)",
            "spec.features: pki and ed25519 cannot both be enabled; enable only one",
        ),
        rule(
            "spec",
            "has(self.helper) || has(self.nodeConfiguration)",
            "neither spec.helper nor spec.nodeConfiguration is set; one of them has to configure the nodes",
        ),
        about(
            "spec",
            ".pki",
            "!has(self.pki) || !has(self.pki.certManager) || self.features.pki",
            "spec.pki.certManager signs the nodes' CSRs, which are fetched only with spec.features.pki: true; enable it or remove spec.pki",
        ),
        about(
            "spec",
            ".pki",
            "!has(self.pki) || !has(self.pki.ca) || self.features.pki",
            "spec.pki.ca signs the nodes' CSRs, which are fetched only with spec.features.pki: true; enable it or remove spec.pki",
        ),
        about(
            "spec",
            ".features",
            "!self.features.pki || has(self.helper) || (has(self.pki) && (has(self.pki.certManager) || has(self.pki.ca)))",
            "spec.features.pki needs a signer for the nodes' CSRs: spec.helper, spec.pki.certManager or spec.pki.ca",
        ),
        about(
            "spec",
            ".jwtSigningKeySecret",
            "!self.features.ed25519 || has(self.jwtSigningKeySecret)",
            "spec.features.ed25519 needs spec.jwtSigningKeySecret: the Secret key holding the ed25519 seed that signs server JWTs",
        ),
        about(
            "spec",
            ".jwtVerifyKeySecret",
            "!(self.features.jwt || self.features.ed25519) || has(self.jwtVerifyKeySecret)",
            "spec.features.jwt and spec.features.ed25519 need spec.jwtVerifyKeySecret: the Secret key holding the public key or certificate that verifies the nodes' provisioning.jwt",
        ),
        about(
            "spec",
            ".broker",
            "has(self.broker.tlsSecret) || has(self.broker.clientJwtSecret) || self.choriaInsecure",
            "no broker credentials: set spec.broker.tlsSecret (x509, the file security provider), spec.broker.clientJwtSecret (the choria security provider), or spec.choriaInsecure: true for test networks",
        ),
        about(
            "spec",
            ".choriaInsecure",
            "!(has(self.broker.clientJwtSecret) && self.choriaInsecure)",
            "spec.choriaInsecure: true contradicts spec.broker.clientJwtSecret (protocol v2 is always signed); remove one of them",
        ),
        about(
            "spec",
            ".broker",
            "!has(self.broker.clientJwtSecret) || has(self.broker.tlsSecret) || self.choriaInsecure || (has(self.broker.insecureSkipVerify) && self.broker.insecureSkipVerify)",
            "spec.broker.clientJwtSecret without spec.broker.tlsSecret leaves the broker's TLS certificate unverified; add spec.broker.tlsSecret (its ca.crt verifies the broker), or set spec.broker.insecureSkipVerify: true to accept that",
        ),
        // Ranges.
        rule("spec.replicas", "self >= 0", "spec.replicas must be 0 or more"),
        rule(
            "spec.workers",
            "self >= 0",
            "spec.workers must be 0 or more (leave it out for one per CPU)",
        ),
        rule(
            "spec.monitorPort",
            "self >= 1 && self <= 65535",
            "spec.monitorPort must be a port, 1-65535 (default 8080)",
        ),
        // Names and texts.
        rule(
            "spec.image",
            "self.matches('^[^[:space:]]+$')",
            "spec.image must be an image reference without spaces; leave it out for the operator's own image",
        ),
        rule(
            "spec.lifecycleComponent",
            "self.matches('^[^.*>[:space:]]+$')",
            "spec.lifecycleComponent goes into NATS subjects: it must not be empty or contain '.', '*', '>' or spaces",
        ),
        // The broker.
        rule(
            "spec.broker",
            "self.urls.size() > 0",
            "spec.broker.urls is empty; list at least one broker, e.g. nats://broker.example.net:4222",
        ),
        about(
            "spec.broker",
            ".urls",
            "self.urls.all(u, !u.matches('^([a-zA-Z][-a-zA-Z0-9+.]*://)?[^/]*@'))",
            "spec.broker.urls carry credentials; remove them and use spec.brokerPasswordSecret (user provisioner) or the broker Secrets",
        ),
        about(
            "spec.broker",
            ".urls",
            "self.urls.all(u, u.matches('^[^[:space:],]+$'))",
            "spec.broker.urls must be broker addresses, host:port or nats://host:port, without spaces or commas",
        ),
        rule(
            "spec.broker.identity",
            "self.matches('^[^[:space:]]+$')",
            "spec.broker.identity must be a Choria identity without spaces; leave it out to use the resource name",
        ),
        object_name("spec.broker.tlsSecret", "a Secret's name"),
        object_name("spec.broker.clientJwtSecret", "a Secret's name"),
        // The helper.
        rule(
            "spec.helper",
            "self.command.matches('[^[:space:]]')",
            "spec.helper.command is empty; give the helper's command line, e.g. /etc/choria-provisioner/helper/helper.sh",
        ),
        object_name("spec.helper.configMap", "a ConfigMap's name"),
        // Shards.
        about(
            "spec.election",
            ".mode",
            "!(self.mode == 'Shards' && self.backend in ['None', 'none'])",
            "spec.election.mode: Shards needs a membership: set spec.election.backend to Lease or Streams",
        ),
        // The Lease election, and the membership of shards on both backends.
        about(
            "spec.election",
            ".leaseDuration",
            format!(
                "(!(self.backend in ['Lease', 'lease']) && self.mode != 'Shards') || {} > {}",
                lease_value("leaseDuration", "15s"),
                lease_value("renewDeadline", "10s")
            ),
            "spec.election.leaseDuration must be longer than renewDeadline (defaults 15s and 10s)",
        ),
        about(
            "spec.election",
            ".renewDeadline",
            format!(
                "(!(self.backend in ['Lease', 'lease']) && self.mode != 'Shards') || {}.getMilliseconds() * 5 > {}.getMilliseconds() * 6",
                lease_value("renewDeadline", "10s"),
                lease_value("retryPeriod", "2s")
            ),
            "spec.election.renewDeadline must be longer than 1.2 × retryPeriod (defaults 10s and 2s)",
        ),
        // Records and renewal.
        about(
            "spec",
            ".renewal",
            "!has(self.renewal) || has(self.records)",
            "spec.renewal works from the records of what was issued: set spec.records too",
        ),
        about(
            "spec",
            ".tokenSecret",
            "!has(self.renewal) || has(self.tokenSecret)",
            "spec.renewal asks nodes to reprovision with their provisioning token: set spec.tokenSecret",
        ),
        rule(
            "spec.records",
            "self.urls.size() > 0",
            "spec.records.urls is empty; list the NATS server(s) whose JetStream keeps the records",
        ),
        about(
            "spec.records",
            ".urls",
            "self.urls.all(u, u.matches('^[^[:space:],@]+$'))",
            "spec.records.urls must be NATS addresses without spaces, commas or credentials (credentials go in the records Secrets)",
        ),
        rule(
            "spec.records.history",
            "self >= 1 && self <= 64",
            "spec.records.history must be 1 to 64 revisions per node (default 5)",
        ),
        rule(
            "spec.records.replicas",
            "self >= 1 && self <= 5",
            "spec.records.replicas must be 1 to 5 servers holding a copy (default 1)",
        ),
        rule(
            "spec.records.bucket",
            "self.matches('^[-_a-zA-Z0-9]+$')",
            "spec.records.bucket must be a KV bucket name: letters, digits, '-' and '_'",
        ),
        about(
            "spec.records",
            ".passwordSecret",
            "has(self.user) == has(self.passwordSecret)",
            "spec.records.user and spec.records.passwordSecret go together",
        ),
        about(
            "spec.records",
            ".tlsKeySecret",
            "has(self.tlsCertSecret) == has(self.tlsKeySecret)",
            "spec.records.tlsCertSecret and spec.records.tlsKeySecret go together",
        ),
        // The provisioner's `renewal.before` takes exactly these
        // (`choria_config::day_two::Before::parse`).
        rule(
            "spec.renewal.before",
            format!(
                "(self.matches('{GO_DURATION}') && duration(self) > duration('0s')) || (self.matches('{LONG_DURATION}') && {} >= 1.0) || (self.matches('{PERCENT}') && double(self.substring(0, self.size() - 1)) > 0.0 && double(self.substring(0, self.size() - 1)) < 100.0)",
                long_hours("self")
            ),
            "spec.renewal.before must be a positive duration before expiry (30d, 12h) or a share of the lifetime left (20%, above 0 and below 100)",
        ),
        rule(
            "spec.renewal.rate",
            "self >= 1",
            "spec.renewal.rate must be at least 1 renewal per minute (default 100)",
        ),
        rule(
            "spec.renewal.collective",
            "self.matches('^[A-Za-z0-9_-]+$')",
            "spec.renewal.collective must be a collective name: letters, digits, '_' and '-'",
        ),
        rule(
            "spec.renewal.broker",
            "self.urls.size() > 0",
            "spec.renewal.broker.urls is empty; list the broker that reaches the provisioned nodes",
        ),
        about(
            "spec.renewal.broker",
            ".urls",
            "self.urls.all(u, u.matches('^[^[:space:],@]+$'))",
            "spec.renewal.broker.urls must be broker addresses without spaces, commas or credentials",
        ),
        about(
            "spec.renewal.broker",
            ".tlsSecret",
            "has(self.tlsSecret) || has(self.clientJwtSecret)",
            "spec.renewal.broker needs credentials the nodes' policies allow: tlsSecret (x509) or clientJwtSecret (protocol v2)",
        ),
        object_name("spec.renewal.broker.tlsSecret", "a Secret's name"),
        object_name("spec.renewal.broker.clientJwtSecret", "a Secret's name"),
        // Telemetry: what the provisioner's `telemetry:` refuses.
        rule(
            "spec.telemetry.otlpEndpoint",
            format!("self.matches('{OTLP_ENDPOINT}')"),
            "spec.telemetry.otlpEndpoint must be a plain http:// URL such as http://otel-collector.monitoring:4318, without user information, query or fragment",
        ),
        rule(
            "spec.telemetry.serviceName",
            "!self.matches('[[:cntrl:]]')",
            "spec.telemetry.serviceName must be at most 128 characters, without control characters",
        ),
        rule(
            "spec.telemetry.samplePercent",
            "self >= 1 && self <= 100",
            "spec.telemetry.samplePercent must be 1 to 100 (default 100); to trace nothing, remove spec.telemetry",
        ),
    ];
    all.extend(pki::rules());
    all.extend(duration_rules(
        "spec.interval",
        Some((
            "1m",
            "is below the minimum of 1m; use for example 10m or 1h",
        )),
    ));
    for at in POSITIVE_DURATIONS {
        all.extend(duration_rules(at, Some(("0s", ""))));
    }
    all.extend(duration_rules("spec.renewal.jitter", None));
    all.extend(duration_rules("spec.renewal.retry", Some(("0s", ""))));
    all.extend(duration_rules("spec.evidence.maxAge", Some(("0s", ""))));
    all.extend(duration_rules("spec.audit.maxAge", Some(("0s", ""))));
    all.extend(attested::rules());
    for (at, default) in LEASE_TIMINGS {
        all.extend(lease_timing(at, default));
    }
    for at in SECRET_REFS {
        all.extend(secret_ref(at));
    }
    all.extend(pod::rules());
    all
}

/// Bounds on what the rules read, so that their estimated cost stays in
/// the API server's budget: (where, `maxLength` or `maxItems`, bound).
fn bounds() -> Vec<(&'static str, &'static str, i64)> {
    let mut b = vec![
        ("spec.image", "maxLength", 1024),
        ("spec.lifecycleComponent", "maxLength", 253),
        ("spec.broker.urls", "maxItems", 64),
        ("spec.broker.urls[]", "maxLength", 1024),
        ("spec.broker.identity", "maxLength", 253),
        ("spec.broker.tlsSecret", "maxLength", 253),
        ("spec.broker.clientJwtSecret", "maxLength", 253),
        ("spec.helper.command", "maxLength", 4096),
        ("spec.helper.configMap", "maxLength", 253),
        ("spec.records.urls", "maxItems", 64),
        ("spec.records.urls[]", "maxLength", 1024),
        ("spec.records.bucket", "maxLength", 64),
        ("spec.renewal.before", "maxLength", DURATION_MAX_LENGTH),
        ("spec.renewal.collective", "maxLength", 253),
        ("spec.renewal.broker.urls", "maxItems", 64),
        ("spec.renewal.broker.urls[]", "maxLength", 1024),
        ("spec.renewal.broker.identity", "maxLength", 253),
        ("spec.renewal.broker.tlsSecret", "maxLength", 253),
        ("spec.renewal.broker.clientJwtSecret", "maxLength", 253),
        ("spec.telemetry.otlpEndpoint", "maxLength", 1024),
        ("spec.telemetry.serviceName", "maxLength", 128),
    ];
    let durations = ["spec.interval", "spec.renewal.jitter", "spec.renewal.retry"];
    let leases = LEASE_TIMINGS.map(|(at, _)| at);
    for at in durations
        .into_iter()
        .chain(POSITIVE_DURATIONS)
        .chain(leases)
    {
        b.push((at, "maxLength", DURATION_MAX_LENGTH));
    }
    for at in SECRET_REFS {
        b.push((at, "name", 253));
        b.push((at, "key", 253));
    }
    b.extend(attested::bounds());
    b.extend(pki::bounds());
    b.extend(pod::bounds());
    b
}

/// The schema node at `at`; panics on a path the schema lacks (a test
/// runs every rule through here).
fn node<'a>(schema: &'a mut Value, at: &str) -> &'a mut Value {
    let mut n = schema;
    if at.is_empty() {
        return n;
    }
    for part in at.split('.') {
        let (name, items) = match part.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (part, false),
        };
        n = n
            .get_mut("properties")
            .and_then(|p| p.get_mut(name))
            .unwrap_or_else(|| panic!("the schema has no {at} ({name})"));
        if items {
            n = n
                .get_mut("items")
                .unwrap_or_else(|| panic!("{at}: not a list"));
        }
    }
    n
}

/// Adds the rules and the bounds they need to the CRD's `openAPIV3Schema`.
pub fn add_to(schema: &mut Value) {
    for (at, key, bound) in bounds() {
        match key {
            // A SecretKeyRef's two strings.
            "name" | "key" => {
                node(schema, at)["properties"][key]["maxLength"] = json!(bound);
            }
            _ => node(schema, at)[key] = json!(bound),
        }
    }
    for r in rules() {
        let mut v = json!({"rule": r.rule, "message": r.message});
        if let Some(f) = r.field_path {
            v["fieldPath"] = json!(f);
        }
        let n = node(schema, r.at);
        match n.get_mut("x-kubernetes-validations") {
            Some(Value::Array(list)) => list.push(v),
            _ => n["x-kubernetes-validations"] = json!([v]),
        }
    }
}

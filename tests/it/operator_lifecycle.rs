//! The operator's day two on one real control plane (tests/support/kube.rs:
//! etcd + kube-apiserver, no kubelet or controller-manager), stage after
//! stage so that they share one start-up; each stage names the behaviour it
//! proves (Installing on Kubernetes, "Operator capability levels"):
//!
//! * validation at admission: `kubectl apply` accepts the shipped examples and
//!   refuses each invalid variant with its message (the CRD's CEL rules);
//! * spec.pod at admission: no `hostPath`, the operator's admission policy
//!   refuses a priority class or volume type beyond its flags (but lets an
//!   edit of what was stored by), and what is allowed lands in the Deployment;
//! * idle cost: an idle Provisioner with three replicas, measured from the
//!   API server's own `apiserver_request_total`;
//! * busy cost: status writes carrying the provisioned count never set off
//!   a reconciliation of the owned objects;
//! * drift repair: an owned object deleted or edited by hand is restored
//!   within 5 s;
//! * nothing leaks: everything a deleted Provisioner leaves (owned objects,
//!   its pods' Lease) is owned by it, for the garbage collector;
//! * operator hand-over: the old controller stops before the new one starts,
//!   when the old one is cut off from its Lease and on SIGTERM (measured);
//! * upgrades: objects as the previous release applied them are taken over
//!   without touching the pods' template, and a restarted operator writes
//!   nothing.
//!
//! NOT RUN (with a loud banner) when scripts/build-kube-peers.sh has not
//! built the binaries.

use crate::support::kube::ControlPlane;
use crate::support::operator::*;
use crate::support::{NatsServer, RunningFleet};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A minimal valid Provisioner `name` with `spec` merged over its spec.
fn provisioner_with(name: &str, spec: Value) -> Value {
    let mut p = json!({
        "apiVersion": "provisioning.choria.io/v1alpha1",
        "kind": "Provisioner",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "choriaInsecure": true,
            "broker": {"urls": ["nats://broker.example.net:4222"]},
            "helper": {"command": "/bin/true"},
        },
    });
    merge(&mut p["spec"], spec);
    p
}

/// Merges `extra` into `base`, objects key by key; `null` removes a key.
fn merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                if v.is_null() {
                    b.remove(&k);
                } else {
                    merge(b.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (b, e) => *b = e,
    }
}

/// `kubectl apply --dry-run=server` of `object`: the API server's answer.
fn dry_run(c: &Cluster, object: &str) -> Result<String, String> {
    let args = ["apply", "--dry-run=server", "-f", "-"];
    let out = c.cp.kubectl_stdin(&args, object);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    if out.status.success() {
        Ok(text(&out.stdout))
    } else {
        Err(text(&out.stderr))
    }
}

/// The CRD's rules at admission: the shipped examples and valid variants
/// pass `kubectl apply`; each invalid variant is refused with the message
/// of its rule, which names the field and says what to fix (and never
/// repeats the value: a URL with a password is not echoed).
fn validation_at_admission(c: &Cluster) -> Vec<(String, String)> {
    the_shipped_examples_pass(c);
    for (i, spec) in valid_specs().into_iter().enumerate() {
        let p = provisioner_with(&format!("valid-{i}"), spec.clone());
        dry_run(c, &p.to_string()).unwrap_or_else(|e| panic!("valid variant {spec} refused: {e}"));
    }
    let invalid = [invalid_specs(), invalid_day_two_specs()].concat();
    let mut seen = Vec::new();
    for (i, (spec, message)) in invalid.into_iter().enumerate() {
        let p = provisioner_with(&format!("invalid-{i}"), spec.clone());
        let refused = dry_run(c, &p.to_string())
            .err()
            .unwrap_or_else(|| panic!("{spec} was accepted; want {message:?}"));
        assert!(refused.contains(message), "{spec}: {refused}");
        assert!(
            !refused.contains("hunter2"),
            "the value is echoed: {refused}"
        );
        seen.push((spec.to_string(), message.to_string()));
    }
    a_name_too_long_for_its_service_is_refused(c);
    seen
}

/// Every Provisioner the repository and the book ship passes admission.
fn the_shipped_examples_pass(c: &Cluster) {
    for file in [
        "deploy/example-provisioner.yaml",
        "deploy/example-provisioner-cert-manager.yaml",
        // The book's quick start on Kubernetes.
        "docs/src/examples/kubernetes/provisioner.yaml",
        "docs/src/examples/kubernetes/provisioner-day-two.yaml",
        "docs/src/examples/kubernetes/private-registry.yaml",
        // The built-in CA from a Secret.
        "docs/src/examples/kubernetes/provisioner-ca.yaml",
        // The production guide's part two.
        "docs/src/examples/kubernetes/provisioner-production.yaml",
        // The attested provisioning guide.
        "docs/src/examples/kubernetes/provisioner-attested.yaml",
        // Following a slow node: traces on Kubernetes.
        "docs/src/examples/kubernetes/provisioner-traces.yaml",
    ] {
        let text = repo_file(file);
        for doc in text.split("\n---") {
            if doc.contains("kind: Provisioner") {
                let doc = doc.replace("namespace: choria\n", &format!("namespace: {NS}\n"));
                dry_run(c, &doc).unwrap_or_else(|e| panic!("{file} refused: {e}"));
            }
        }
    }
}

/// Specs admission must take, each merged into a minimal valid Provisioner.
fn valid_specs() -> Vec<Value> {
    vec![
        json!({}),
        json!({"interval": "1h", "serverJwtValidity": "1y", "rpcTimeout": "1500ms", "discoveryTimeout": "1m30s"}),
        json!({"interval": "1.5d", "helperTimeout": "0.5s"}),
        json!({"election": {"leaseDuration": "4s", "renewDeadline": "3s", "retryPeriod": "1s"}}),
        json!({"election": {"backend": "streams", "retryPeriod": "9s"}}),
        json!({"helper": null, "features": {"pki": true}, "nodeConfiguration": {"configuration": {"identity": "{{ identity }}"}},
               "pki": {"certManager": {"issuerRef": {"name": "ca"}, "duration": "2160h", "keep": "0s", "usages": ["client auth"]}}}),
        json!({"helper": null, "features": {"pki": true}, "nodeConfiguration": {"configuration": {"identity": "{{ identity }}"}},
               "pki": {"ca": {"secretName": "choria-ca"}}}),
        json!({"features": {"pki": true},
               "pki": {"ca": {"secretName": "fleet.ca", "certificateKey": "ca.pem", "keyKey": "ca_key.pem", "validity": "1h"}}}),
        json!({"features": {"pki": true}, "pki": {"ca": {"secretName": "choria-ca", "validity": "1y"}}}),
        json!({"choriaInsecure": false, "broker": {"clientJwtSecret": "jwt", "insecureSkipVerify": true}}),
        json!({"features": {"ed25519": true}, "jwtVerifyKeySecret": {"name": "k", "key": "verify.pem"},
               "jwtSigningKeySecret": {"name": "k", "key": "seed"}}),
        json!({"replicas": 0, "workers": 0, "monitorPort": 65535}),
        json!({"election": {"mode": "Shards", "backend": "streams", "leaseDuration": "9s", "renewDeadline": "6s", "retryPeriod": "2s"}}),
        json!({"tokenSecret": {"name": "t", "key": "token"},
               "records": {"urls": ["nats://records:4222"], "history": 64, "credentialsSecret": {"name": "rec", "key": "records.creds"}},
               "renewal": {"before": "20%", "jitter": "1h", "rate": 1, "retry": "10m",
                           "broker": {"urls": ["nats://choria:4222"], "tlsSecret": "renewal-tls"}}}),
        json!({"tokenSecret": {"name": "t", "key": "token"},
               "records": {"urls": ["nats://records:4222"], "user": "rec", "passwordSecret": {"name": "rec", "key": "password"}},
               "renewal": {"before": "30d"}}),
        json!({"tokenSecret": {"name": "t", "key": "token"}, "records": {"urls": ["nats://records:4222"]},
               "renewal": {"before": "99.5%"}}),
        json!({"tokenSecret": {"name": "t", "key": "token"}, "records": {"urls": ["nats://records:4222"]},
               "renewal": {"before": "1h30m"}}),
        json!({"pod": pod_additions()}),
        json!({"records": {"urls": ["nats://records:4222"]},
               "admission": {"policy": {"name": "fleet-policy", "key": "admission.rego"}, "regoV0": true},
               "evidence": {"gcpCertificates": {"name": "roots", "key": "google.json"}, "gcpAudience": "fleet:{identity}",
                            "gcpProjects": ["fleet-prod"], "maxAge": "2h", "nodeName": "instance_name"},
               "audit": {"stream": "AUDIT", "subject": "fleet.audit", "maxAge": "30d", "maxBytes": 1048576},
               "revocations": [{"identity": "n1.example.net", "reason": "stolen laptop"}, {"identity": "web_2", "reason": "decommissioned"}]}),
        json!({"evidence": {"awsCertificates": {"name": "roots", "key": "aws.pem"}, "oneIdentityPerInstance": false}}),
        json!({"evidence": {"azureCertificates": {"name": "roots", "key": "azure.pem"}, "oneIdentityPerInstance": false,
                            "azureSubscriptions": ["8d10da13-8125-4ba9-a717-bf7490507b3d"]}}),
        json!({"telemetry": {"otlpEndpoint": "http://otel-collector.monitoring:4318", "serviceName": "site-a", "samplePercent": 1}}),
        json!({"telemetry": {"otlpEndpoint": "http://[::1]:4318/v1/traces", "samplePercent": 100}}),
    ]
}

/// Specs admission must refuse, with the message it must give: the
/// provisioner's own settings.
fn invalid_specs() -> Vec<(Value, &'static str)> {
    vec![
        (json!({"features": {"pki": true, "ed25519": true}, "jwtVerifyKeySecret": {"name": "k", "key": "v"}, "jwtSigningKeySecret": {"name": "k", "key": "s"}}),
         "spec.features: Invalid value: \"object\": spec.features: pki and ed25519 cannot both be enabled; enable only one"),
        (json!({"helper": null}),
         "spec: Invalid value: \"object\": neither spec.helper nor spec.nodeConfiguration is set; one of them has to configure the nodes"),
        (json!({"pki": {"certManager": {"issuerRef": {"name": "ca"}}}}),
         "spec.pki: Invalid value: \"object\": spec.pki.certManager signs the nodes' CSRs, which are fetched only with spec.features.pki: true; enable it or remove spec.pki"),
        (json!({"helper": null, "nodeConfiguration": {"configuration": {"a": "b"}}, "features": {"pki": true}}),
         "spec.features: Invalid value: \"object\": spec.features.pki needs a signer for the nodes' CSRs: spec.helper, spec.pki.certManager or spec.pki.ca"),
        (json!({"pki": {"ca": {"secretName": "ca"}}}),
         "spec.pki: Invalid value: \"object\": spec.pki.ca signs the nodes' CSRs, which are fetched only with spec.features.pki: true; enable it or remove spec.pki"),
        (json!({"features": {"pki": true}, "pki": {"certManager": {"issuerRef": {"name": "ca"}}, "ca": {"secretName": "ca"}}}),
         "spec.pki: Invalid value: \"object\": spec.pki.certManager and spec.pki.ca both sign the nodes' CSRs; keep one of them"),
        (json!({"features": {"ed25519": true}, "jwtVerifyKeySecret": {"name": "k", "key": "v"}}),
         "spec.jwtSigningKeySecret: Invalid value: \"object\": spec.features.ed25519 needs spec.jwtSigningKeySecret: the Secret key holding the ed25519 seed that signs server JWTs"),
        (json!({"features": {"jwt": true}}),
         "spec.jwtVerifyKeySecret: Invalid value: \"object\": spec.features.jwt and spec.features.ed25519 need spec.jwtVerifyKeySecret: the Secret key holding the public key or certificate that verifies the nodes' provisioning.jwt"),
        (json!({"choriaInsecure": false}),
         "spec.broker: Invalid value: \"object\": no broker credentials: set spec.broker.tlsSecret (x509, the file security provider), spec.broker.clientJwtSecret (the choria security provider), or spec.choriaInsecure: true for test networks"),
        (json!({"broker": {"clientJwtSecret": "jwt"}}),
         "spec.choriaInsecure: Invalid value: \"object\": spec.choriaInsecure: true contradicts spec.broker.clientJwtSecret (protocol v2 is always signed); remove one of them"),
        (json!({"choriaInsecure": false, "broker": {"clientJwtSecret": "jwt"}}),
         "spec.broker: Invalid value: \"object\": spec.broker.clientJwtSecret without spec.broker.tlsSecret leaves the broker's TLS certificate unverified; add spec.broker.tlsSecret (its ca.crt verifies the broker), or set spec.broker.insecureSkipVerify: true to accept that"),
        (json!({"replicas": -1}), "spec.replicas: Invalid value: \"integer\": spec.replicas must be 0 or more"),
        (json!({"workers": -2}), "spec.workers: Invalid value: \"integer\": spec.workers must be 0 or more (leave it out for one per CPU)"),
        (json!({"monitorPort": 0}), "spec.monitorPort: Invalid value: \"integer\": spec.monitorPort must be a port, 1-65535 (default 8080)"),
        (json!({"image": "has space"}), "spec.image: Invalid value: \"string\": spec.image must be an image reference without spaces; leave it out for the operator's own image"),
        (json!({"lifecycleComponent": "a.b"}), "spec.lifecycleComponent: Invalid value: \"string\": spec.lifecycleComponent goes into NATS subjects: it must not be empty or contain '.', '*', '>' or spaces"),
        (json!({"broker": {"urls": []}}), "spec.broker: Invalid value: \"object\": spec.broker.urls is empty; list at least one broker, e.g. nats://broker.example.net:4222"),
        (json!({"broker": {"urls": ["nats://provisioner:hunter2-cel@b:4222"]}}),
         "spec.broker.urls: Invalid value: \"object\": spec.broker.urls carry credentials; remove them and use spec.brokerPasswordSecret (user provisioner) or the broker Secrets"),
        (json!({"broker": {"urls": ["a:4222", "b c"]}}),
         "spec.broker.urls: Invalid value: \"object\": spec.broker.urls must be broker addresses, host:port or nats://host:port, without spaces or commas"),
        (json!({"broker": {"identity": "a b"}}),
         "spec.broker.identity: Invalid value: \"string\": spec.broker.identity must be a Choria identity without spaces; leave it out to use the resource name"),
        (json!({"broker": {"tlsSecret": "Bad_Name"}}),
         "spec.broker.tlsSecret: Invalid value: \"string\": spec.broker.tlsSecret must be a Secret's name: lower case letters, digits, '-' and '.'"),
        (json!({"helper": {"command": " "}}),
         "spec.helper: Invalid value: \"object\": spec.helper.command is empty; give the helper's command line, e.g. /etc/choria-provisioner/helper/helper.sh"),
        (json!({"helper": {"configMap": "x/y"}}),
         "spec.helper.configMap: Invalid value: \"string\": spec.helper.configMap must be a ConfigMap's name: lower case letters, digits, '-' and '.'"),
        (json!({"tokenSecret": {"name": "s", "key": "../etc/passwd"}}),
         "spec.tokenSecret: Invalid value: \"object\": spec.tokenSecret.key must be a Secret key: letters, digits, '-', '_' and '.'"),
        (json!({"brokerPasswordSecret": {"name": "", "key": "p"}}),
         "spec.brokerPasswordSecret: Invalid value: \"object\": spec.brokerPasswordSecret.name must be a Secret's name: lower case letters, digits, '-' and '.'"),
        (json!({"interval": "30s"}), "spec.interval: Invalid value: \"string\": spec.interval is below the minimum of 1m; use for example 10m or 1h"),
        (json!({"interval": "10"}), "spec.interval: Invalid value: \"string\": spec.interval must be a duration such as 30s, 1h30m, 10d or 1y"),
        (json!({"helperTimeout": "0s"}), "spec.helperTimeout: Invalid value: \"string\": spec.helperTimeout is zero; use a positive duration such as 10s"),
        (json!({"serverJwtValidity": "0.01d"}), "spec.serverJwtValidity: Invalid value: \"string\": spec.serverJwtValidity is zero; use a positive duration such as 10s"),
        (json!({"discoveryTimeout": "soon"}), "spec.discoveryTimeout: Invalid value: \"string\": spec.discoveryTimeout must be a duration such as 30s, 1h30m, 10d or 1y"),
        (json!({"election": {"leaseDuration": "1d"}}),
         "spec.election.leaseDuration: Invalid value: \"string\": spec.election.leaseDuration must be a positive duration in h, m and s, such as 15s"),
        (json!({"election": {"leaseDuration": "10s", "renewDeadline": "10s"}}),
         "spec.election.leaseDuration: Invalid value: \"object\": spec.election.leaseDuration must be longer than renewDeadline (defaults 15s and 10s)"),
        (json!({"election": {"retryPeriod": "9s"}}),
         "spec.election.renewDeadline: Invalid value: \"object\": spec.election.renewDeadline must be longer than 1.2 × retryPeriod (defaults 10s and 2s)"),
        (json!({"features": {"pki": true}, "pki": {"certManager": {"issuerRef": {"name": "ca"}, "duration": "30m"}}}),
         "spec.pki.certManager.duration: Invalid value: \"string\": spec.pki.certManager.duration is shorter than cert-manager's minimum of 1h"),
        (json!({"features": {"pki": true}, "pki": {"certManager": {"issuerRef": {"name": "ca"}, "usages": ["everything"]}}}),
         "spec.pki.certManager.usages: Invalid value: \"array\": spec.pki.certManager.usages must be cert-manager key usages: signing, digital signature"),
        (json!({"features": {"pki": true}, "pki": {"certManager": {"issuerRef": {"name": "ca", "kind": "Cluster Issuer"}}}}),
         "spec.pki.certManager.issuerRef.kind: Invalid value: \"string\": spec.pki.certManager.issuerRef.kind must be a kind such as Issuer or ClusterIssuer"),
        (json!({"features": {"pki": true}, "pki": {"certManager": {"issuerRef": {"name": "ca"}, "timeout": "0s"}}}),
         "spec.pki.certManager.timeout: Invalid value: \"string\": spec.pki.certManager.timeout is zero; use a positive duration such as 10s"),
        (json!({"features": {"pki": true}, "pki": {"ca": {"secretName": "Fleet_CA"}}}),
         "spec.pki.ca.secretName: Invalid value: \"string\": spec.pki.ca.secretName must be a Secret's name: lower case letters, digits, '-' and '.'"),
        (json!({"features": {"pki": true}, "pki": {"ca": {"secretName": "ca", "keyKey": "../ca.key"}}}),
         "spec.pki.ca.keyKey: Invalid value: \"string\": spec.pki.ca.keyKey must be a Secret key: letters, digits, '-', '_' and '.'"),
        (json!({"features": {"pki": true}, "pki": {"ca": {"secretName": "ca", "certificateKey": ".."}}}),
         "spec.pki.ca.certificateKey: Invalid value: \"string\": spec.pki.ca.certificateKey must be a Secret key: letters, digits, '-', '_' and '.'"),
        (json!({"features": {"pki": true}, "pki": {"ca": {"secretName": "ca", "validity": "30m"}}}),
         "spec.pki.ca.validity: Invalid value: \"string\": spec.pki.ca.validity is shorter than 1h: renewal would have no time to act"),
        (json!({"features": {"pki": true}, "pki": {"ca": {"secretName": "ca", "validity": "0.01d"}}}),
         "spec.pki.ca.validity: Invalid value: \"string\": spec.pki.ca.validity is shorter than 1h: renewal would have no time to act"),
        (json!({"features": {"pki": true}, "pki": {"ca": {"secretName": "ca", "validity": "90 days"}}}),
         "spec.pki.ca.validity: Invalid value: \"string\": spec.pki.ca.validity must be a duration such as 30s, 1h30m, 10d or 1y"),
        (json!({"features": {"pki": true}, "pki": {"ca": {"validity": "90d"}}}),
         "spec.pki.ca.secretName: Required value"),
        (json!({"election": {"mode": "Shards", "backend": "none"}}),
         "spec.election.mode: Invalid value: \"object\": spec.election.mode: Shards needs a membership: set spec.election.backend to Lease or Streams"),
        // The spelling of this version, as the old one above.
        (json!({"election": {"mode": "Shards", "backend": "None"}}),
         "spec.election.mode: Invalid value: \"object\": spec.election.mode: Shards needs a membership: set spec.election.backend to Lease or Streams"),
        (json!({"election": {"backend": "Lease", "leaseDuration": "5s", "renewDeadline": "5s"}}),
         "spec.election.leaseDuration: Invalid value: \"object\": spec.election.leaseDuration must be longer than renewDeadline"),
        (json!({"logLevel": "Verbose"}),
         "spec.logLevel: Unsupported value: \"Verbose\""),
        (json!({"election": {"mode": "Shards", "backend": "streams", "retryPeriod": "9s"}}),
         "spec.election.renewDeadline: Invalid value: \"object\": spec.election.renewDeadline must be longer than 1.2 × retryPeriod (defaults 10s and 2s)"),
    ]
}

/// As `invalid_specs`, for day two: renewal, records, the pod's additions,
/// evidence, audit, admission policy, revocations and bindings.
fn invalid_day_two_specs() -> Vec<(Value, &'static str)> {
    vec![
        (json!({"renewal": {"before": "30d"}, "tokenSecret": {"name": "t", "key": "token"}}),
         "spec.renewal: Invalid value: \"object\": spec.renewal works from the records of what was issued: set spec.records too"),
        (json!({"records": {"urls": []}}),
         "spec.records: Invalid value: \"object\": spec.records.urls is empty; list the NATS server(s) whose JetStream keeps the records"),
        (json!({"records": {"urls": ["nats://rec:hunter2@records:4222"]}}),
         "spec.records.urls: Invalid value: \"object\": spec.records.urls must be NATS addresses without spaces, commas or credentials (credentials go in the records Secrets)"),
        (json!({"records": {"urls": ["nats://records:4222"], "history": 65}}),
         "spec.records.history: Invalid value: \"integer\": spec.records.history must be 1 to 64 revisions per node (default 5)"),
        (json!({"records": {"urls": ["nats://records:4222"], "user": "rec"}}),
         "spec.records.passwordSecret: Invalid value: \"object\": spec.records.user and spec.records.passwordSecret go together"),
        (json!({"records": {"urls": ["nats://records:4222"], "tlsCertSecret": {"name": "rec", "key": "tls.crt"}}}),
         "spec.records.tlsKeySecret: Invalid value: \"object\": spec.records.tlsCertSecret and spec.records.tlsKeySecret go together"),
        (json!({"records": {"urls": ["nats://records:4222"]}, "renewal": {"before": "30d"}}),
         "spec.tokenSecret: Invalid value: \"object\": spec.renewal asks nodes to reprovision with their provisioning token: set spec.tokenSecret"),
        (json!({"records": {"urls": ["nats://records:4222"]}, "renewal": {"before": "100%"}}),
         "spec.renewal.before: Invalid value: \"string\": spec.renewal.before must be a positive duration before expiry (30d, 12h) or a share of the lifetime left (20%, above 0 and below 100)"),
        // The provisioner's renewal.before refuses these too
        // (choria_config::day_two::Before::parse).
        (json!({"records": {"urls": ["nats://records:4222"]}, "renewal": {"before": "0s"}}),
         "spec.renewal.before: Invalid value: \"string\": spec.renewal.before must be a positive duration before expiry (30d, 12h) or a share of the lifetime left (20%, above 0 and below 100)"),
        (json!({"records": {"urls": ["nats://records:4222"]}, "renewal": {"before": "0.01d"}}),
         "spec.renewal.before: Invalid value: \"string\": spec.renewal.before must be a positive duration before expiry (30d, 12h) or a share of the lifetime left (20%, above 0 and below 100)"),
        (json!({"records": {"urls": ["nats://records:4222"]}, "renewal": {"before": "1e1%"}}),
         "spec.renewal.before: Invalid value: \"string\": spec.renewal.before must be a positive duration before expiry (30d, 12h) or a share of the lifetime left (20%, above 0 and below 100)"),
        (json!({"records": {"urls": ["nats://records:4222"]}, "renewal": {"before": "30d", "rate": 0}}),
         "spec.renewal.rate: Invalid value: \"integer\": spec.renewal.rate must be at least 1 renewal per minute (default 100)"),
        (json!({"records": {"urls": ["nats://records:4222"]}, "renewal": {"before": "30d", "broker": {"urls": ["nats://choria:4222"]}}}),
         "spec.renewal.broker.tlsSecret: Invalid value: \"object\": spec.renewal.broker needs credentials the nodes' policies allow: tlsSecret (x509) or clientJwtSecret (protocol v2)"),
        (json!({"pod": {"imagePullSecrets": ["Registry Login"]}}),
         "spec.pod.imagePullSecrets: Invalid value: \"array\": spec.pod.imagePullSecrets must be Secrets' names"),
        (json!({"pod": {"priorityClassName": "High"}}),
         "spec.pod.priorityClassName: Invalid value: \"string\": spec.pod.priorityClassName must be a PriorityClass's name"),
        (json!({"pod": {"env": [{"name": "POD_NAME", "value": "x"}]}}),
         "spec.pod.env[0]: Invalid value: \"object\": spec.pod.env[].name is set by the operator or read by the provisioner itself (POD_NAME, POD_NAMESPACE"),
        (json!({"pod": {"env": [{"name": "CHORIA_PROVISIONER_LOG", "value": "trace"}]}}),
         "spec.pod.env[0]: Invalid value: \"object\": spec.pod.env[].name is set by the operator"),
        (json!({"pod": {"env": [{"name": "HELPER", "valueFrom": {"secretKeyRef": {"name": "s", "key": "../k"}}}]}}),
         "spec.pod.env[0].valueFrom.secretKeyRef: Invalid value: \"object\": spec.pod.env[].valueFrom.secretKeyRef must name a Secret of this namespace and one of its keys"),
        (json!({"pod": {"volumes": [{"name": "secret-0", "emptyDir": {}}]}}),
         "spec.pod.volumes[0]: Invalid value: \"object\": spec.pod.volumes[].name is one of the operator's own volumes"),
        (json!({"pod": {"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": "vault"}}]}}]}}),
         "spec.pod.volumes[0].projected: Invalid value: \"object\": spec.pod.volumes[].projected may only project secret, configMap and downwardAPI"),
        (json!({"pod": {"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/etc/choria-provisioner/extra"}]}}),
         "spec.pod.volumeMounts[0]: Invalid value: \"object\": spec.pod.volumeMounts[].mountPath must not be at, in or above /etc/choria-provisioner or /tmp"),
        (json!({"pod": {"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/var/../etc"}]}}),
         "spec.pod.volumeMounts[0]: Invalid value: \"object\": spec.pod.volumeMounts[].mountPath must be an absolute path"),
        (json!({"pod": {"volumeMounts": [{"name": "missing", "mountPath": "/missing"}]}}),
         "spec.pod.volumeMounts: Invalid value: \"object\": spec.pod.volumeMounts[].name must name a volume of spec.pod.volumes"),
        (json!({"pod": {"volumes": [{"name": "ca", "secret": {"secretName": "ca"}}], "volumeMounts": [{"name": "ca", "mountPath": "/etc/ca", "readOnly": false}]}}),
         "spec.pod.volumeMounts: Invalid value: \"object\": spec.pod.volumeMounts[].readOnly cannot be false"),
        (json!({"evidence": {"awsCertificates": {"name": "roots", "key": "aws.pem"}}}),
         "spec.evidence: Invalid value: \"object\": spec.evidence keeps one identity per instance beside the records: set spec.records too (or spec.evidence.oneIdentityPerInstance: false)"),
        (json!({"evidence": {"oneIdentityPerInstance": false}}),
         "spec.evidence: Invalid value: \"object\": spec.evidence needs awsCertificates, gcpCertificates or azureCertificates"),
        (json!({"evidence": {"awsCertificates": {"name": "roots", "key": "aws.pem"}, "oneIdentityPerInstance": false, "awsAccounts": ["1234"]}}),
         "spec.evidence.awsAccounts: Invalid value: \"array\": spec.evidence.awsAccounts must be AWS account ids: 12 digits each"),
        (json!({"evidence": {"gcpCertificates": {"name": "roots", "key": "g.json"}, "oneIdentityPerInstance": false, "gcpAudience": "choria"}}),
         "spec.evidence.gcpAudience: Invalid value: \"string\": spec.evidence.gcpAudience must hold {identity}"),
        (json!({"evidence": {"awsCertificates": {"name": "roots", "key": "aws.pem"}, "oneIdentityPerInstance": false, "nodeName": "hostname"}}),
         "spec.evidence.nodeName: Invalid value: \"string\": spec.evidence.nodeName must be instance_id or instance_name"),
        (json!({"evidence": {"azureCertificates": {"name": "roots", "key": "azure.pem"}, "oneIdentityPerInstance": false, "azureSubscriptions": ["prod"]}}),
         "spec.evidence.azureSubscriptions: Invalid value: \"array\": spec.evidence.azureSubscriptions must be Azure subscription ids"),
        (json!({"audit": {}}),
         "spec.audit: Invalid value: \"object\": spec.audit goes through the records' connection"),
        (json!({"records": {"urls": ["nats://records:4222"]}, "audit": {"maxBytes": 10}}),
         "spec.audit.maxBytes: Invalid value: \"integer\": spec.audit.maxBytes must be at least 1 MiB"),
        (json!({"admission": {"policy": {"name": "Fleet_Policy", "key": "a.rego"}}}),
         "spec.admission.policy: Invalid value: \"object\": spec.admission.policy.name must be a ConfigMap's name"),
        (json!({"revocations": [{"identity": "n1", "reason": "stolen"}]}),
         "spec.revocations: Invalid value: \"object\": spec.revocations are written beside the records"),
        (json!({"records": {"urls": ["nats://records:4222"]}, "revocations": [{"identity": "n1.*", "reason": "stolen"}]}),
         "spec.revocations[0]: Invalid value: \"object\": spec.revocations[].identity must be a node's identity"),
        (json!({"records": {"urls": ["nats://records:4222"]}, "revocations": [{"identity": "n1", "reason": "two\nlines"}]}),
         "spec.revocations[0]: Invalid value: \"object\": spec.revocations[].reason must be one line of text"),
        (json!({"records": {"urls": ["nats://records:4222"]}, "revocations": [{"identity": "n1", "reason": "   "}]}),
         "spec.revocations[0]: Invalid value: \"object\": spec.revocations[].reason must be one line of text"),
        (json!({"records": {"urls": ["nats://records:4222"]}, "revocations": [{"identity": "n1", "reason": "a"}, {"identity": "n1", "reason": "b"}]}),
         "spec.revocations[1]: Duplicate value"),
        (json!({"records": {"urls": ["nats://records:4222"]}, "bindings": [{"identity": "web-1", "instance": "aws.123456789012.i-0b", "reason": "replaced"}]}),
         "spec.bindings: Invalid value: \"object\": spec.bindings bind names beside the records, for evidence with one identity per instance"),
        (json!({"records": {"urls": ["nats://records:4222"]}, "evidence": {"awsCertificates": {"name": "roots", "key": "aws.pem"}},
                "bindings": [{"identity": "web-1", "instance": "i-0b", "reason": "replaced"}]}),
         "spec.bindings[0]: Invalid value: \"object\": spec.bindings[].instance must name an instance as the provisioner does"),
        (json!({"records": {"urls": ["nats://records:4222"]}, "evidence": {"awsCertificates": {"name": "roots", "key": "aws.pem"}},
                "bindings": [{"identity": "web-1", "instance": "gcp.p.1", "reason": "a"}, {"identity": "web-1", "instance": "gcp.p.2", "reason": "b"}]}),
         "spec.bindings[1]: Duplicate value"),
        // What the provisioner's telemetry: refuses (choria_config::telemetry).
        (json!({"telemetry": {"samplePercent": 5}}),
         "spec.telemetry.otlpEndpoint: Required value"),
        (json!({"telemetry": {"otlpEndpoint": "https://collector:4318"}}),
         "spec.telemetry.otlpEndpoint: Invalid value: \"string\": spec.telemetry.otlpEndpoint must be a plain http:// URL"),
        (json!({"telemetry": {"otlpEndpoint": "http://trace:hunter2@collector:4318"}}),
         "spec.telemetry.otlpEndpoint: Invalid value: \"string\": spec.telemetry.otlpEndpoint must be a plain http:// URL"),
        (json!({"telemetry": {"otlpEndpoint": "http://collector:4318/v1/traces?x=1"}}),
         "spec.telemetry.otlpEndpoint: Invalid value: \"string\": spec.telemetry.otlpEndpoint must be a plain http:// URL"),
        (json!({"telemetry": {"otlpEndpoint": "http://collector:4318", "samplePercent": 0}}),
         "spec.telemetry.samplePercent: Invalid value: \"integer\": spec.telemetry.samplePercent must be 1 to 100"),
        (json!({"telemetry": {"otlpEndpoint": "http://collector:4318", "samplePercent": 101}}),
         "spec.telemetry.samplePercent: Invalid value: \"integer\": spec.telemetry.samplePercent must be 1 to 100"),
        (json!({"telemetry": {"otlpEndpoint": "http://collector:4318", "serviceName": "a\tb"}}),
         "spec.telemetry.serviceName: Invalid value: \"string\": spec.telemetry.serviceName must be at most 128 characters, without control characters"),
    ]
}

/// A name too long for <name>-metrics, at the root.
fn a_name_too_long_for_its_service_is_refused(c: &Cluster) {
    let mut long = provisioner_with("x", json!({}));
    long["metadata"]["name"] = json!("a".repeat(56));
    let refused = dry_run(c, &long.to_string()).unwrap_err();
    assert!(
        refused.contains("metadata.name must be at most 55 lower case letters, digits and '-', starting with a letter: it also names the Service <name>-metrics"),
        "{refused}"
    );
}

/// `kubectl scale provisioner` (what an HPA does too) sets spec.replicas
/// through the `scale` subresource, the operator follows it into the
/// Deployment, and the subresource reads the pods' selector from the status.
fn scale(c: &Cluster, name: &str) {
    let cp = &c.cp;
    for replicas in [3, 2] {
        cp.kubectl_ok(&[
            "scale",
            "provisioner",
            name,
            "-n",
            NS,
            &format!("--replicas={replicas}"),
        ]);
        wait_for(
            &format!("the Deployment follows a scale to {replicas}"),
            Duration::from_secs(10),
            || (get(cp, "deployment", NS, name)["spec"]["replicas"] == replicas).then_some(()),
        );
        let scale: Value = serde_json::from_str(&cp.kubectl_ok(&[
            "get",
            "provisioner",
            name,
            "-n",
            NS,
            "--subresource=scale",
            "-o",
            "json",
        ]))
        .unwrap();
        assert_eq!(scale["kind"], "Scale", "{scale}");
        assert_eq!(scale["spec"]["replicas"], replicas, "{scale}");
        assert_eq!(
            scale["status"]["selector"],
            format!("app.kubernetes.io/instance={name},app.kubernetes.io/name=choria-provisioner"),
            "{scale}"
        );
    }
}

/// The API server's write requests so far, by `verb resource[/subresource]`.
fn apiserver_writes(c: &Cluster) -> BTreeMap<String, f64> {
    apiserver_requests(&c.cp)
        .into_iter()
        .filter(|(k, _)| {
            let verb = k.split(' ').next().unwrap_or_default();
            matches!(
                verb,
                "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE" | "DELETECOLLECTION"
            )
        })
        .collect()
}

/// What changed between two [`apiserver_writes`] samples (non-zero only).
fn writes_between(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

/// An idle Provisioner with three replicas (one leads through its Lease,
/// all Ready, nothing to provision) costs the API server at most 12 writes
/// a minute besides Lease renewals.
fn idle_cost(c: &Cluster, nats: &NatsServer) -> Vec<Proc> {
    const WINDOW: Duration = Duration::from_secs(30);
    fleet_provisioner(c, "idle", nats, 3, 4, "0", "2s");
    let deployment = get(&c.cp, "deployment", NS, "idle");
    let kubeconfig = pod_kubeconfig(c, "idle");
    let pods: Vec<Proc> = (0..3)
        .map(|i| {
            start_pod(
                c,
                &deployment,
                &format!("idle-5f7c9d8b6-{i:05}"),
                &kubeconfig,
            )
        })
        .collect();
    sole_leader(&pods, Duration::from_secs(20));
    // Stand in for the deployment controller: three ready replicas.
    set_deployment_status(c, "idle", 3, 3, 3);
    wait_for(
        "the idle Provisioner to be Ready",
        Duration::from_secs(20),
        || {
            let p = c.provisioner("idle");
            (cond(&p, "Ready").0 == "True" && p["status"]["leader"].is_string()).then_some(())
        },
    );
    // Let what a start-up writes settle first.
    std::thread::sleep(Duration::from_secs(5));
    let before = apiserver_writes(c);
    let t = Instant::now();
    std::thread::sleep(WINDOW);
    let after = apiserver_writes(c);
    let per_minute = 60.0 / t.elapsed().as_secs_f64();
    let all = writes_between(&before, &after);
    let (leases, others): (BTreeMap<_, _>, BTreeMap<_, _>) =
        all.into_iter().partition(|(k, _)| k.ends_with(" leases"));
    // 0.0 + : an empty sum is -0.0.
    let total: f64 = 0.0 + others.values().sum::<f64>();
    println!(
        "idle, 3 replicas, {:.1?}: {:.1} writes/min besides Lease renewals {others:?}; Lease renewals {leases:?}",
        t.elapsed(),
        total * per_minute
    );
    assert!(
        total * per_minute <= 12.0,
        "an idle Provisioner costs {:.1} writes a minute besides Lease renewals: {others:?}",
        total * per_minute
    );
    pods
}

/// While nodes are provisioned the leader's count changes, and the status
/// writes that carry it never set off a reconciliation of the owned
/// objects: no apply of any of them while a fleet is provisioned.
async fn busy_cost(c: &Cluster, nats: &NatsServer, leader: &Proc) {
    const NODES: usize = 200;
    let before = apiserver_writes(c);
    let t = Instant::now();
    let journal = c.dir.path().join("busy.jsonl");
    let fleet = RunningFleet::start(fleet_options(nats, NODES, &journal)).await;
    wait_for(
        "the fleet to be provisioned",
        Duration::from_secs(120),
        || {
            (crate::support::server_startups(&crate::support::read_journal_so_far(&journal))
                >= NODES)
                .then_some(())
        },
    );
    wait_for("the count in the status", Duration::from_secs(20), || {
        (c.provisioner("idle")["status"]["provisioned"].as_u64() >= Some(NODES as u64))
            .then_some(())
    });
    let after = apiserver_writes(c);
    let took = t.elapsed();
    let writes = writes_between(&before, &after);
    println!(
        "busy, {NODES} nodes provisioned in {took:.1?} by {}: writes {writes:?}",
        leader.name
    );
    let owned: Vec<_> = writes
        .iter()
        .filter(|(k, _)| {
            k.starts_with("APPLY ")
                && !k.ends_with("provisioners/status")
                && !k.ends_with(" events")
        })
        .collect();
    assert!(
        owned.is_empty(),
        "count updates set off reconciliations of the owned objects: {owned:?}"
    );
    drop(fleet);
}

/// Owned objects of Provisioner `name` deleted or edited by hand are put
/// back within 5 s each. Returns how long each took.
fn drift_repair(c: &Cluster, name: &str) -> Vec<(String, Duration)> {
    const BOUND: Duration = Duration::from_secs(5);
    let cp = &c.cp;
    let cm = format!("{name}-config");
    let leases = format!("{name}-leases");
    let mut took = Vec::new();
    let mut timed = |what: &str, done: &dyn Fn() -> bool| {
        let t = Instant::now();
        wait_for(what, BOUND, || done().then_some(()));
        took.push((what.to_string(), t.elapsed()));
    };

    let data = get(cp, "configmap", NS, &cm)["data"].clone();
    cp.kubectl_ok(&["delete", "configmap", &cm, "-n", NS]);
    timed("a deleted ConfigMap comes back", &|| {
        try_get(cp, "configmap", NS, &cm).is_some_and(|o| o["data"] == data)
    });

    let image = get(cp, "deployment", NS, name)["spec"]["template"]["spec"]["containers"][0]
        ["image"]
        .clone();
    let edit = json!([{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "evil:latest"}]);
    cp.kubectl_ok(&[
        "patch",
        "deployment",
        name,
        "-n",
        NS,
        "--type=json",
        "-p",
        &edit.to_string(),
    ]);
    timed("an edited Deployment image is put back", &|| {
        get(cp, "deployment", NS, name)["spec"]["template"]["spec"]["containers"][0]["image"]
            == image
    });

    let rules = get(cp, "role", NS, name)["rules"].clone();
    let wider = json!({"rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]});
    cp.kubectl_ok(&[
        "patch",
        "role",
        name,
        "-n",
        NS,
        "--type=merge",
        "-p",
        &wider.to_string(),
    ]);
    timed("a widened Role is narrowed again", &|| {
        get(cp, "role", NS, name)["rules"] == rules
    });

    cp.kubectl_ok(&["delete", "rolebinding", &leases, "-n", NS]);
    timed("a deleted RoleBinding comes back", &|| {
        try_get(cp, "rolebinding", NS, &leases).is_some()
    });

    let labels = json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": null}}});
    cp.kubectl_ok(&[
        "patch",
        "service",
        &format!("{name}-metrics"),
        "-n",
        NS,
        "--type=merge",
        "-p",
        &labels.to_string(),
    ]);
    timed("a Service that lost our label gets it back", &|| {
        get(cp, "service", NS, &format!("{name}-metrics"))["metadata"]["labels"]
            ["app.kubernetes.io/managed-by"]
            == "choria-provisioner-operator"
    });
    println!("drift repaired: {took:?}");
    took
}

/// Deletes Provisioner `name` and finds that whatever is left of it in the
/// namespace — owned objects and the Lease its pods made — is owned by it,
/// so a cluster's garbage collector removes it (this control plane has no
/// controller-manager to do so). Its CertificateRequests are deleted by its
/// pods themselves (operator_e2e).
fn nothing_leaks(c: &Cluster, name: &str) {
    let cp = &c.cp;
    let uid = get(cp, PROV, NS, name)["metadata"]["uid"].clone();
    cp.kubectl_ok(&["delete", PROV, name, "-n", NS, "--wait=true"]);
    let kinds = "configmaps,deployments,services,serviceaccounts,roles,rolebindings,poddisruptionbudgets,leases";
    let left: Value =
        serde_json::from_str(&cp.kubectl_ok(&["get", kinds, "-n", NS, "-o", "json"])).unwrap();
    let of_it: Vec<&Value> = left["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| {
            o["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n == name || n.starts_with(&format!("{name}-")))
        })
        .collect();
    let kinds_left: std::collections::BTreeSet<&str> =
        of_it.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds_left.into_iter().collect::<Vec<_>>(),
        [
            "ConfigMap",
            "Deployment",
            "Lease",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount"
        ]
    );
    for o in of_it {
        let owned = o["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|refs| {
                refs.iter()
                    .any(|r| r["uid"] == uid && r["kind"] == "Provisioner")
            });
        assert!(
            owned,
            "{} {} outlives its Provisioner: {}",
            o["kind"], o["metadata"]["name"], o["metadata"]
        );
    }
}

/// The time of the first line of `log` from `from` on that contains `what`
/// (a line starts with its RFC 3339 time), and where it is.
fn logged(log: &str, what: &str, from: usize) -> Option<(k8s_openapi::jiff::Timestamp, usize)> {
    log.lines().enumerate().skip(from).find_map(|(i, l)| {
        l.contains(what)
            .then(|| l.split_whitespace().next()?.parse().ok())
            .flatten()
            .map(|t| (t, i))
    })
}

/// From the end of one operator's controller (`stopped`, the first such
/// line from `from`) to the start of the next one's (its first `controller
/// started` from `next_from`): positive when they did not overlap.
fn handover_gap(
    old: &Proc,
    stopped: &str,
    from: usize,
    new: &Proc,
    next_from: usize,
) -> (f64, usize) {
    // Each line is waited for: the leader gauge turns before the new
    // controller logs its start (CI read the log in between once).
    let (end, line) = wait_for(
        &format!("{} to log {stopped:?}", old.name),
        Duration::from_secs(10),
        || logged(&old.logs(), stopped, from),
    );
    let (start, next) = wait_for(
        &format!("{} to start its controller", new.name),
        Duration::from_secs(10),
        || logged(&new.logs(), "controller started", next_from),
    );
    let applied_after = old
        .logs()
        .lines()
        .skip(line)
        .take_while(|l| !l.contains("controller started"))
        .any(|l| l.contains(" applied "));
    assert!(
        !applied_after,
        "{} applied after its controller stopped",
        old.name
    );
    (
        (start - end)
            .total(k8s_openapi::jiff::Unit::Millisecond)
            .unwrap()
            / 1000.0,
        next,
    )
}

/// Two operators hand the Lease over while a Provisioner's spec changes
/// five times a second: the old controller stops before the new one starts
/// — when the old operator is cut off from its Lease (it cannot renew, so
/// it stops at the renew deadline, before the Lease expires for the other)
/// and when it is stopped (it drains, then releases). Returns both gaps in
/// seconds (the overlap is their negative).
fn operator_handover(c: &mut Cluster) -> (f64, f64) {
    const TIMINGS: [&str; 3] = [
        "--lease-duration=4s",
        "--renew-deadline=3s",
        "--retry-period=1s",
    ];
    let cp = &c.cp;
    let lease = "leases.coordination.k8s.io/choria-provisioner-operator";
    let lease_binding = |verb: &str| {
        let mut args = vec![verb, "rolebinding", "handover-a-lease", "-n", OPERATOR_NS];
        if verb == "create" {
            args.extend([
                "--role=choria-provisioner-operator-leader-election",
                "--user=operator",
            ]);
        }
        cp.kubectl_ok(&args);
    };
    // Operator a logs in as user "operator" with the chart's rights and its
    // own binding to the Lease Role, which this stage takes away.
    cp.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "handover-a",
        "--clusterrole=choria-provisioner-operator",
        "--user=operator",
    ]);
    lease_binding("create");
    let a_config = cp.kubeconfig(cp.operator_token());
    wait_allowed(cp, &a_config, &["update", lease, "-n", OPERATOR_NS]);

    let mut first = std::mem::replace(
        &mut c.operator,
        spawn_operator(
            c.dir.path(),
            "operator-a",
            "operator-a-6f9c8d7b5-aaaaa",
            &a_config,
            &TIMINGS,
        ),
    );
    first.signal("TERM");
    assert!(first.wait_exit(Duration::from_secs(20)).success());
    let a = &c.operator;
    wait_for("operator a to lead", Duration::from_secs(20), || {
        (a.metric("choria_provisioner_operator_leader") == 1.0).then_some(())
    });
    let b = spawn_operator(
        c.dir.path(),
        "operator-b",
        "operator-b-6f9c8d7b5-bbbbb",
        &c.operator_kubeconfig,
        &TIMINGS,
    );

    // A Provisioner whose spec keeps changing, so there is always work.
    let applied = c.cp.kubectl_stdin(
        &["apply", "-f", "-"],
        &provisioner_with("churn", json!({})).to_string(),
    );
    assert!(
        applied.status.success(),
        "the churn Provisioner was refused: {}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let churning = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let churn = {
        let (config, kubectl, churning) = (
            c.cp.kubeconfig(c.cp.admin_token()),
            std::env::var("KUBECTL_BIN").unwrap_or_else(|_| "kubectl".into()),
            churning.clone(),
        );
        std::thread::spawn(move || {
            let mut n = 0;
            while churning.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let patch = json!({"spec": {"workers": n % 7 + 1}}).to_string();
                let _ = std::process::Command::new(&kubectl)
                    .arg("--kubeconfig")
                    .arg(&config)
                    .args([
                        "patch",
                        PROV,
                        "churn",
                        "-n",
                        NS,
                        "--type=merge",
                        "-p",
                        &patch,
                    ])
                    .output();
                // Slower than the controller's debounce: a trigger within
                // it postpones the reconciliation, so patches closer than
                // that (a quick kubectl on a quiet machine took ~80 ms, so
                // 200 ms apart was ~280 ms) starve it of any reconcile.
                std::thread::sleep(2 * choria_operator::DEBOUNCE);
            }
        })
    };
    std::thread::sleep(Duration::from_secs(2));

    // Cut a off its Lease: it cannot renew, b takes over.
    lease_binding("delete");
    wait_for("operator b to lead", Duration::from_secs(30), || {
        (b.metric("choria_provisioner_operator_leader") == 1.0).then_some(())
    });
    let (cut, b_from) = handover_gap(a, "controller stopped: leadership lost", 0, &b, 0);
    wait_for(
        "operator b to apply the churn",
        Duration::from_secs(10),
        || b.logs().contains(" applied ").then_some(()),
    );

    // Graceful: a gets its Lease back, b is stopped, a takes over.
    lease_binding("create");
    wait_allowed(cp, &a_config, &["update", lease, "-n", OPERATOR_NS]);
    let a_from = a.logs().lines().count();
    let mut b = b;
    b.signal("TERM");
    assert!(b.wait_exit(Duration::from_secs(20)).success());
    wait_for("operator a to lead again", Duration::from_secs(20), || {
        (a.metric("choria_provisioner_operator_leader") == 1.0).then_some(())
    });
    let (graceful, _) = handover_gap(&b, "controller stopped: shutting down", b_from, a, a_from);
    churning.store(false, std::sync::atomic::Ordering::Relaxed);
    churn.join().unwrap();
    println!("operator hand-over: cut off from its Lease: the next controller started {cut:.3} s after the old one stopped; on SIGTERM: {graceful:.3} s after");
    assert!(cut > 0.0, "the controllers overlapped by {:.3} s", -cut);
    assert!(
        graceful > 0.0,
        "the controllers overlapped by {:.3} s",
        -graceful
    );
    cp.kubectl_ok(&["delete", PROV, "churn", "-n", NS]);
    (cut, graceful)
}

/// The objects the previous release's operator applied for a Provisioner
/// (tests/fixtures/operator-0.1.0-owned.json), applied as it did, are taken
/// over by this operator: what changed between the releases is applied (the
/// pods' Role narrowed, the Lease binding, the PDB's eviction policy), the
/// pods' template is not touched (the Deployment's generation stays, so no
/// pod restarts). Then a restarted operator writes nothing at all.
fn upgrade(c: &mut Cluster) {
    let cp = &c.cp;
    let fixture: Value =
        serde_json::from_str(&repo_file("tests/fixtures/operator-0.1.0-owned.json")).unwrap();
    // The previous release's operator: gone while it is replaced.
    c.operator.signal("TERM");
    assert!(c.operator.wait_exit(Duration::from_secs(20)).success());
    let p = json!({
        "apiVersion": "provisioning.choria.io/v1alpha1",
        "kind": "Provisioner",
        "metadata": {"name": "upgraded", "namespace": NS},
        "spec": fixture["spec"],
    });
    apply(cp, &p.to_string());
    let uid = get(cp, PROV, NS, "upgraded")["metadata"]["uid"].clone();
    for o in fixture["objects"].as_array().unwrap() {
        let text = o.to_string().replace("\"UID\"", &uid.to_string());
        let args = [
            "apply",
            "--server-side",
            "--field-manager=choria-provisioner-operator",
            "--force-conflicts",
            "-f",
            "-",
        ];
        let out = cp.kubectl_stdin(&args, &text);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let before = get(cp, "deployment", NS, "upgraded");
    set_deployment_status(c, "upgraded", 2, 2, 2);

    c.operator = spawn_operator(
        c.dir.path(),
        "operator-upgraded",
        OPERATOR_POD,
        &c.operator_kubeconfig,
        &[],
    );
    let p = c.observed("upgraded");
    // The pods' template is what the previous release made: the Deployment
    // controller starts no new ReplicaSet, no pod restarts. (Our hash
    // annotation on the Deployment moves its generation: Kubernetes counts
    // a Deployment's annotations as its spec.)
    let after = get(&c.cp, "deployment", NS, "upgraded");
    assert_eq!(
        after["spec"], before["spec"],
        "the upgrade changed the Deployment"
    );
    assert_eq!(
        cond(&p, "Degraded"),
        pair("False", "AsExpected"),
        "{}",
        p["status"]
    );
    set_deployment_status(c, "upgraded", 2, 2, 2);
    wait_for("Ready after the upgrade", Duration::from_secs(10), || {
        (cond(&c.provisioner("upgraded"), "Ready") == pair("True", "Available")).then_some(())
    });
    let role = get(&c.cp, "role", NS, "upgraded");
    assert_eq!(
        role["rules"].as_array().unwrap().len(),
        2,
        "narrowed: {role}"
    );
    assert!(try_get(&c.cp, "rolebinding", NS, "upgraded-leases").is_some());
    let pdb = get(&c.cp, "poddisruptionbudget", NS, "upgraded");
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");

    // The same build started again: nothing to write.
    let writes = apiserver_writes(c);
    c.operator.signal("TERM");
    assert!(c.operator.wait_exit(Duration::from_secs(20)).success());
    c.operator = spawn_operator(
        c.dir.path(),
        "operator-restarted",
        OPERATOR_POD,
        &c.operator_kubeconfig,
        &[],
    );
    let op = &c.operator;
    wait_for(
        "the restarted operator to reconcile",
        Duration::from_secs(30),
        || (op.metric("choria_provisioner_operator_reconciliations_total") >= 1.0).then_some(()),
    );
    std::thread::sleep(Duration::from_secs(2));
    let written: BTreeMap<String, f64> = writes_between(&writes, &apiserver_writes(c))
        .into_iter()
        .filter(|(k, _)| !k.ends_with(" leases"))
        .collect();
    assert!(written.is_empty(), "a restarted operator wrote {written:?}");
    let again = get(&c.cp, "deployment", NS, "upgraded");
    assert_eq!(
        again["metadata"]["generation"],
        after["metadata"]["generation"]
    );
    assert_eq!(again["spec"], before["spec"]);
}

/// A CertificateRequest for `issuer` (`kind` `Issuer` or `ClusterIssuer`)
/// with `usages` and `is_ca`, as YAML.
fn certificate_request(
    name: &str,
    issuer: &str,
    kind: &str,
    usages: &[&str],
    is_ca: bool,
) -> String {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "CertificateRequest",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "issuerRef": {"name": issuer, "kind": kind, "group": "cert-manager.io"},
            "usages": usages,
            "isCA": is_ca,
            "request": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURSBSRVFVRVNULS0tLS0K",
        },
    })
    .to_string()
}

/// What `spec.pod` adds to the pods: a private registry's login, the
/// helper's environment and CA material, scratch space.
fn pod_additions() -> Value {
    json!({
        "imagePullSecrets": ["registry-login"],
        "env": [
            {"name": "HELPER_CA", "value": "/etc/helper-ca/ca.crt"},
            {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "helper-api", "key": "token"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
        "volumes": [
            {"name": "helper-ca", "secret": {"secretName": "helper-ca"}},
            {"name": "scratch", "emptyDir": {}},
        ],
        "volumeMounts": [
            {"name": "helper-ca", "mountPath": "/etc/helper-ca"},
            {"name": "scratch", "mountPath": "/var/helper"},
        ],
    })
}

/// `spec.pod` bounded when a Provisioner is written: a `hostPath` volume
/// cannot be asked for (kubectl's strict validation names the unknown
/// field; without it the API server prunes it and the CRD's rule finds a
/// volume without a source), and the operator's admission policy refuses a
/// priority class or a claim the shipped policy does not allow. What is
/// allowed lands in the Deployment.
fn pod_additions_bounded(c: &Cluster) {
    wait_for(
        "the operator's admission policy for Provisioners",
        Duration::from_secs(30),
        || {
            (c.operator
                .metric("choria_provisioner_operator_provisioner_admission_policy")
                == 1.0)
                .then_some(())
        },
    );
    let host_path = provisioner_with(
        "host-path",
        json!({"pod": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                       "volumeMounts": [{"name": "root", "mountPath": "/host"}]}}),
    )
    .to_string();
    let e = dry_run(c, &host_path).expect_err("a hostPath volume");
    assert!(e.contains("hostPath"), "{e}");
    let out = c.cp.kubectl_stdin(
        &["apply", "--dry-run=server", "--validate=false", "-f", "-"],
        &host_path,
    );
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && e.contains("spec.pod.volumes[] needs exactly one source")
            && e.contains("hostPath and the other sources are never allowed"),
        "{e}"
    );
    for (spec, message) in [
        (
            json!({"pod": {"priorityClassName": "system-cluster-critical"}}),
            "spec.pod.priorityClassName must be a PriorityClass the cluster admin lets Provisioners use (--allowed-priority-class): none",
        ),
        (
            json!({"pod": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}}),
            "spec.pod.volumes may only use the volume types the cluster admin allows (--allowed-volume-type): secret, configMap, emptyDir, projected, downwardAPI",
        ),
    ] {
        let e = dry_run(c, &provisioner_with("beyond", spec.clone()).to_string())
            .expect_err("beyond the policy");
        println!("  refused when written: {}", e.trim());
        assert!(e.contains(message) && e.contains("ValidatingAdmissionPolicy"), "{spec}: {e}");
    }

    apply(
        &c.cp,
        &provisioner_with("additions", json!({"pod": pod_additions()})).to_string(),
    );
    let d = wait_for(
        "the Deployment with the additions",
        Duration::from_secs(30),
        || try_get(&c.cp, "deployment", NS, "additions"),
    );
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "registry-login"}]));
    assert!(pod.get("priorityClassName").is_none(), "{pod}");
    let container = &pod["containers"][0];
    let names = |list: &Value, key: &str| -> Vec<String> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|e| e[key].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(&container["env"], "name"),
        [
            "POD_NAME",
            "POD_NAMESPACE",
            "HELPER_CA",
            "API_TOKEN",
            "NODE"
        ]
    );
    let volumes = names(&pod["volumes"], "name");
    assert_eq!(volumes[volumes.len() - 2..], ["helper-ca", "scratch"]);
    let mounts = container["volumeMounts"].as_array().unwrap();
    assert_eq!(
        mounts[mounts.len() - 2..],
        [
            json!({"name": "helper-ca", "mountPath": "/etc/helper-ca", "readOnly": true}),
            json!({"name": "scratch", "mountPath": "/var/helper"}),
        ]
    );
    c.cp.kubectl_ok(&[
        "delete",
        "provisioner",
        "additions",
        "-n",
        NS,
        "--wait=false",
    ]);
    stored_before_the_policy(c);
}

/// A Provisioner stored before the policy forbade what it asks for (here:
/// while the policy's binding was away) may still be edited, paused, given
/// labels; only a change of what the policy bounds is refused.
fn stored_before_the_policy(c: &Cluster) {
    let flag = "--provisioner-admission-policy=";
    let name = shipped_operator_args(0)
        .into_iter()
        .find_map(|a| a.strip_prefix(flag).map(str::to_string))
        .expect("the shipped operator is told its policy");
    let kind = "validatingadmissionpolicybinding";
    let mut binding: Value =
        serde_json::from_str(&c.cp.kubectl_ok(&["get", kind, &name, "-o", "json"])).unwrap();
    c.cp.kubectl_ok(&["delete", kind, &name]);
    let claim = json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}});
    let stored = provisioner_with(
        "stored",
        json!({"pod": {"priorityClassName": "system-cluster-critical", "volumes": [claim]}}),
    )
    .to_string();
    let apply_stored = || c.cp.kubectl_stdin(&["apply", "-f", "-"], &stored);
    wait_for(
        "the Provisioner admitted without the binding",
        Duration::from_secs(10),
        || apply_stored().status.success().then_some(()),
    );
    for field in [
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "generation",
        "managedFields",
    ] {
        binding["metadata"].as_object_mut().unwrap().remove(field);
    }
    let out =
        c.cp.kubectl_stdin(&["create", "-f", "-"], &binding.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A new Provisioner asking for it is refused once the binding is seen.
    let probe = provisioner_with(
        "probe",
        json!({"pod": {"priorityClassName": "system-cluster-critical"}}),
    )
    .to_string();
    wait_for("the binding back", Duration::from_secs(10), || {
        dry_run(c, &probe).err()
    });
    // A change of what the policy bounds is refused, naming the flag.
    let refused = |pod: Value, flag: &str| {
        let patch = json!({"spec": {"pod": pod}}).to_string();
        let args = [
            "patch",
            PROV,
            "stored",
            "-n",
            NS,
            "--type=merge",
            "-p",
            &patch,
        ];
        let out = c.cp.kubectl(&args);
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && e.contains(flag), "{pod}: {e}");
    };
    refused(
        json!({"priorityClassName": "system-node-critical"}),
        "--allowed-priority-class",
    );
    let another = json!({"name": "more", "persistentVolumeClaim": {"claimName": "more"}});
    refused(
        json!({"volumes": [claim, another]}),
        "--allowed-volume-type",
    );
    // What was stored is let by.
    patch_spec(&c.cp, "stored", json!({"paused": true}));
    patch_spec(&c.cp, "stored", json!({"pod": {"labels": {"team": "ops"}}}));
    c.cp.kubectl_ok(&["delete", "provisioner", "stored", "-n", NS, "--wait=false"]);
}

/// What a Provisioner's pods may ask cert-manager for is bounded at the API
/// server, not only in its spec: with its ServiceAccount's token (which a
/// helper in the pod can read), a CertificateRequest is refused for another
/// issuer, a usage the spec or the admin does not allow, `isCA`, and an
/// issuer the admin does not allow even when the spec names it (a spec the
/// operator refused leaves the old pods running under their ServiceAccount).
/// Before the policy, each of these was admitted.
fn pods_bounded_at_admission(c: &Cluster) {
    let Some(cm) = crate::support::certmanager::available() else {
        return;
    };
    wait_for(
        "the operator's admission policy",
        Duration::from_secs(30),
        || {
            (c.operator
                .metric("choria_provisioner_operator_admission_policy")
                == 1.0)
                .then_some(())
        },
    );
    let out = c.cp.kubectl(&[
        "apply",
        "--server-side",
        "-f",
        &cm.crds.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.cp.wait_established(&["certificaterequests.cert-manager.io"]);
    let spec = json!({"helper": null, "features": {"pki": true},
                      "nodeConfiguration": {"configuration": {"identity": "{{ identity }}"}},
                      "pki": {"certManager": {"issuerRef": {"name": "fleet-ca"}, "usages": ["client auth", "server auth"]}}});
    apply(&c.cp, &provisioner_with("bounded", spec).to_string());
    let token = wait_for("the pods' ServiceAccount", Duration::from_secs(30), || {
        try_get(&c.cp, "serviceaccount", NS, "bounded")?;
        Some(create_token(&c.cp, NS, "bounded"))
    });
    let pod = c.cp.kubeconfig(&token);
    wait_allowed(
        &c.cp,
        &pod,
        &["create", "certificaterequests.cert-manager.io", "-n", NS],
    );
    let create = |name: &str, yaml: String| -> Result<(), String> {
        let out = c.cp.kubectl_with(&pod, &["create", "-f", "-"], Some(&yaml));
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
        .map_err(|e| format!("{name}: {e}"))
    };
    create(
        "allowed",
        certificate_request("ok", "fleet-ca", "Issuer", &["client auth"], false),
    )
    .expect("its own issuer and usages are admitted");
    for (name, yaml, why) in [
        (
            "ca",
            certificate_request("ca", "fleet-ca", "Issuer", &["client auth"], true),
            "isCA",
        ),
        (
            "other-issuer",
            certificate_request("other", "other-ca", "Issuer", &["client auth"], false),
            "may only name the issuer of its spec",
        ),
        (
            "cluster-issuer",
            certificate_request(
                "cluster",
                "fleet-ca",
                "ClusterIssuer",
                &["client auth"],
                false,
            ),
            "may only name the issuer of its spec",
        ),
        (
            "usage",
            certificate_request("usage", "fleet-ca", "Issuer", &["code signing"], false),
            "key usages",
        ),
        (
            "spec-usage",
            certificate_request(
                "spec-usage",
                "fleet-ca",
                "Issuer",
                &["digital signature"],
                false,
            ),
            "key usages",
        ),
    ] {
        let e = create(name, yaml).expect_err(name);
        assert!(
            e.contains("CertificateRequests of Provisioner bounded") && e.contains(why),
            "{name}: {e}"
        );
    }
    // The spec changed to a ClusterIssuer the admin does not allow: refused
    // by the operator, and its old pods' account by the policy.
    patch_spec(
        &c.cp,
        "bounded",
        json!({"pki": {"certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}}),
    );
    let e = wait_for(
        "the policy to follow the spec",
        Duration::from_secs(10),
        || {
            create(
                "corp",
                certificate_request("corp", "corp-ca", "ClusterIssuer", &["client auth"], false),
            )
            .err()
            .filter(|e| e.contains("--allowed-cluster-issuer"))
        },
    );
    assert!(
        e.contains("CertificateRequests of Provisioner bounded"),
        "{e}"
    );
    // Anyone else is left alone (the admin here).
    let out = c.cp.kubectl_stdin(
        &["create", "-f", "-"],
        &certificate_request(
            "admin",
            "anything",
            "ClusterIssuer",
            &["code signing"],
            true,
        ),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.cp.kubectl_ok(&["delete", "provisioner", "bounded", "-n", NS, "--wait=false"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_lifecycle_on_a_real_apiserver() {
    let Some(bins) = ControlPlane::available() else {
        return;
    };
    let t0 = Instant::now();
    let mut c = Cluster::start(&bins);
    c.create_namespace();
    let nats = NatsServer::start();
    let stage = |name: &str, since: Instant| {
        println!("stage done: {name} in {:.1?}", since.elapsed());
    };

    let t = Instant::now();
    let messages = validation_at_admission(&c);
    stage("validation at admission", t);
    println!("{} invalid variants refused; the messages:", messages.len());
    for (spec, message) in &messages {
        println!("  {spec}\n    {message}");
    }

    let t = Instant::now();
    pods_bounded_at_admission(&c);
    stage("pods bounded at admission", t);

    let t = Instant::now();
    pod_additions_bounded(&c);
    stage("spec.pod additions bounded and applied", t);

    let t = Instant::now();
    let idle_pods = idle_cost(&c, &nats);
    stage("idle cost", t);
    let t = Instant::now();
    let leader = sole_leader(&idle_pods, Duration::from_secs(20));
    busy_cost(&c, &nats, &idle_pods[leader]).await;
    stage("busy cost", t);

    let t = Instant::now();
    drift_repair(&c, "idle");
    stage("drift repair", t);

    let t = Instant::now();
    scale(&c, "idle");
    stage("scale subresource", t);
    drop(idle_pods);

    let t = Instant::now();
    nothing_leaks(&c, "idle");
    stage("nothing leaks", t);

    let t = Instant::now();
    operator_handover(&mut c);
    stage("operator hand-over", t);

    let t = Instant::now();
    upgrade(&mut c);
    stage("upgrade", t);

    println!("operator lifecycle: {:.1?} in all", t0.elapsed());
}

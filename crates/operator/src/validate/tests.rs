use super::*;
use crate::fixtures::provisioner;
use serde_json::json;

fn problems(spec: serde_json::Value) -> Vec<String> {
    validate(&provisioner(spec))
}

/// Exactly one problem, containing every fragment.
fn one(spec: serde_json::Value, fragments: &[&str]) {
    let found = problems(spec.clone());
    assert_eq!(found.len(), 1, "{spec}: {found:#?}");
    for f in fragments {
        assert!(found[0].contains(f), "{spec}: {:?} lacks {f:?}", found[0]);
    }
}

#[test]
fn revocations_need_records_identities_and_one_line_reasons() {
    let records = json!({"urls": ["nats://r:4222"]});
    one(
        json!({"revocations": [{"identity": "n1", "reason": "stolen"}]}),
        &["spec.revocations are written beside the records"],
    );
    one(
        json!({"records": records, "revocations": [{"identity": "n1.*", "reason": "x"}]}),
        &["spec.revocations[0].identity"],
    );
    one(
        json!({"records": records, "revocations": [{"identity": "n1", "reason": "a"}, {"identity": "n1", "reason": "b"}]}),
        &["spec.revocations[1].identity is listed twice"],
    );
    one(
        json!({"records": records, "revocations": [{"identity": "n1", "reason": "two\nlines"}]}),
        &["spec.revocations[0].reason must be one line"],
    );
    assert!(problems(
        json!({"records": records, "revocations": [{"identity": "n1.example", "reason": "stolen"}]})
    )
    .is_empty());
}

#[test]
fn bindings_need_records_evidence_instances_and_one_line_reasons() {
    let records = json!({"urls": ["nats://r:4222"]});
    let evidence = json!({"awsCertificates": {"name": "roots", "key": "aws.pem"}});
    let pin =
        json!([{"identity": "web-1", "instance": "aws.123456789012.i-0b", "reason": "replaced"}]);
    one(
        json!({"records": records, "bindings": pin}),
        &["spec.bindings bind names beside the records"],
    );
    one(
        json!({"records": records, "evidence": {"awsCertificates": {"name": "roots", "key": "aws.pem"}, "oneIdentityPerInstance": false}, "bindings": pin}),
        &["spec.bindings bind names beside the records"],
    );
    for bad in [
        "i-0b",
        "ec2.1.i-0b",
        "aws.1.i-0b.x",
        "aws..i-0b",
        "aws.1.i 0b",
        "aws.1.>",
    ] {
        one(
            json!({"records": records, "evidence": evidence, "bindings": [{"identity": "web-1", "instance": bad, "reason": "r"}]}),
            &["spec.bindings[0].instance must name an instance"],
        );
    }
    one(
        json!({"records": records, "evidence": evidence, "bindings": [{"identity": "web-1", "instance": "gcp.p.1", "reason": "a"}, {"identity": "web-1", "instance": "gcp.p.2", "reason": "b"}]}),
        &["spec.bindings[1].identity is listed twice"],
    );
    one(
        json!({"records": records, "evidence": evidence, "bindings": [{"identity": "web-1", "instance": "gcp.p.1", "reason": " "}]}),
        &["spec.bindings[0].reason must be one line"],
    );
    assert!(
        problems(json!({"records": records, "evidence": evidence, "bindings": pin})).is_empty()
    );
}

#[test]
fn the_fixture_is_valid() {
    assert_eq!(problems(json!({})), Vec::<String>::new());
}

#[test]
fn an_unverified_v2_broker_needs_the_explicit_opt_in() {
    let v2 = |extra: serde_json::Value| {
        let mut broker = json!({"tlsSecret": null, "clientJwtSecret": "jwt"});
        broker
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        problems(json!({"broker": broker, "features": {"ed25519": false}}))
    };
    assert_eq!(v2(json!({})).len(), 1);
    assert_eq!(
        v2(json!({"insecureSkipVerify": true})),
        Vec::<String>::new()
    );
    // With the broker's CA nothing needs accepting.
    assert_eq!(
        problems(json!({"broker": {"tlsSecret": "tls", "clientJwtSecret": "jwt"}})),
        Vec::<String>::new()
    );
}

#[test]
fn feature_rules() {
    let keys = json!({
        "jwtVerifyKeySecret": {"name": "k", "key": "verify"},
        "jwtSigningKeySecret": {"name": "k", "key": "seed"},
    });
    let mut both = keys.clone();
    crate::fixtures::merge(
        &mut both,
        json!({"features": {"pki": true, "ed25519": true}}),
    );
    one(
        both,
        &["spec.features", "pki and ed25519", "enable only one"],
    );
    one(
        json!({"features": {"ed25519": true}, "jwtVerifyKeySecret": {"name": "k", "key": "verify"}}),
        &[
            "spec.features.ed25519 needs spec.jwtSigningKeySecret",
            "ed25519 seed",
        ],
    );
    one(
        json!({"features": {"jwt": true}}),
        &["spec.features.jwt needs spec.jwtVerifyKeySecret"],
    );
    let mut ok = keys;
    crate::fixtures::merge(&mut ok, json!({"features": {"ed25519": true}}));
    assert!(problems(ok).is_empty());
}

#[test]
fn a_helper_or_node_configuration_is_needed_and_templates_must_compile() {
    one(
        json!({"helper": null}),
        &["neither spec.helper nor spec.nodeConfiguration"],
    );
    one(
        json!({"helper": null, "nodeConfiguration": {"configuration": {"identity": "{{ identity"}}}),
        &[
            "configuration_template.configuration.identity",
            "not a valid template",
        ],
    );
    one(
        json!({"helper": null, "features": {"pki": true}, "nodeConfiguration": {"configuration": {"a": "b"}}}),
        &["helper", "cert_manager"],
    );
    assert!(problems(json!({
        "helper": null,
        "features": {"pki": true},
        "nodeConfiguration": {"configuration": {"a": "b"}},
        "pki": {"certManager": {"issuerRef": {"name": "ca"}}},
    }))
    .is_empty());
}

#[test]
fn durations() {
    one(
        json!({"interval": "30s"}),
        &["spec.interval", "below the minimum of 1m", "10m"],
    );
    one(json!({"interval": "10"}), &["spec.interval", "unit"]);
    one(
        json!({"helperTimeout": "0s"}),
        &["spec.helperTimeout", "zero"],
    );
    one(
        json!({"discoveryTimeout": "soon"}),
        &["spec.discoveryTimeout"],
    );
    one(
        json!({"election": {"leaseDuration": "10s", "renewDeadline": "10s"}}),
        &["spec.election.leaseDuration", "longer than renewDeadline"],
    );
    one(
        json!({"election": {"retryPeriod": "9s"}}),
        &["spec.election.renewDeadline", "1.2 × retryPeriod"],
    );
    // Lease timing is not checked for other backends (it is not used).
    assert!(problems(json!({"election": {"backend": "streams", "retryPeriod": "9s"}})).is_empty());
    assert!(problems(json!({"interval": "1h", "serverJwtValidity": "90d"})).is_empty());
}

#[test]
fn broker_rules() {
    one(
        json!({"broker": {"urls": []}}),
        &["spec.broker.urls is empty", "nats://"],
    );
    one(
        json!({"broker": {"urls": ["a:4222", "b c"]}}),
        &["spec.broker.urls[1]"],
    );
    one(
        json!({"broker": {"tlsSecret": null}}),
        &[
            "no broker credentials",
            "tlsSecret",
            "clientJwtSecret",
            "choriaInsecure",
        ],
    );
    one(
        json!({"broker": {"clientJwtSecret": "jwt"}, "choriaInsecure": true}),
        &["spec.choriaInsecure", "contradicts"],
    );
    one(
        json!({"broker": {"tlsSecret": null, "clientJwtSecret": "jwt"}}),
        &[
            "unverified",
            "spec.broker.tlsSecret",
            "insecureSkipVerify: true",
        ],
    );
    one(
        json!({"broker": {"tlsSecret": "Bad_Name"}}),
        &["spec.broker.tlsSecret", "not an object name"],
    );
    one(
        json!({"broker": {"identity": "a b"}}),
        &["spec.broker.identity"],
    );
    let found = problems(json!({"broker": {"urls": ["nats://provisioner:hunter2@b:4222"]}}));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("spec.broker.urls[0] carries credentials"),
        "{found:?}"
    );
    assert!(
        !found[0].contains("hunter2"),
        "the password is not repeated: {found:?}"
    );
}

#[test]
fn names_and_references() {
    one(
        json!({"tokenSecret": {"name": "s", "key": "../etc/passwd"}}),
        &["spec.tokenSecret.key", "not a Secret key"],
    );
    one(
        json!({"brokerPasswordSecret": {"name": "", "key": "p"}}),
        &["spec.brokerPasswordSecret.name"],
    );
    one(
        json!({"helper": {"command": " "}}),
        &["spec.helper.command is empty"],
    );
    one(
        json!({"helper": {"configMap": "x/y"}}),
        &["spec.helper.configMap"],
    );
    one(json!({"monitorPort": 0}), &["spec.monitorPort"]);
    one(json!({"replicas": -1}), &["spec.replicas"]);
    let mut p = provisioner(json!({}));
    p.metadata.name = Some("a".repeat(MAX_NAME_LEN + 1));
    let found = validate(&p);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("metadata.name") && found[0].contains("-metrics"),
        "{found:?}"
    );
    p.metadata.name = Some("a".repeat(MAX_NAME_LEN));
    assert!(validate(&p).is_empty());
}

#[test]
fn the_provisioners_own_rules_apply_too() {
    one(
        json!({"lifecycleComponent": "a.b"}),
        &[
            "the provisioner would refuse its configuration",
            "lifecycle_component",
        ],
    );
    one(
        json!({"certDenyList": ["("]}),
        &[
            "the provisioner would refuse its configuration",
            "cert_deny_list",
        ],
    );
    one(
        json!({"election": {"backend": "streams", "bucket": "no spaces"}}),
        &["election.bucket"],
    );
}
#[test]
fn shards_need_a_membership_and_renewal_needs_records() {
    one(
        json!({"election": {"mode": "Shards", "backend": "none"}}),
        &["spec.election.mode: Shards needs a membership"],
    );
    one(
        json!({"election": {"mode": "Shards", "backend": "streams", "retryPeriod": "9s"}}),
        &["renewDeadline", "1.2 × retryPeriod"],
    );
    one(
        json!({"renewal": {"before": "30d"}, "tokenSecret": {"name": "t", "key": "token"}}),
        &["spec.renewal works from the records"],
    );
    one(
        json!({"records": {"urls": ["nats://u:hunter2@r:4222"]}}),
        &["spec.records.urls[0] is not an address"],
    );
    one(
        json!({"records": {"urls": ["nats://r:4222"]}, "renewal": {"before": "30d", "broker": {"urls": ["nats://c:4222"]}}, "tokenSecret": {"name": "t", "key": "token"}}),
        &["spec.renewal.broker needs credentials"],
    );
    for before in ["soon", "0s", "100%", "1e1%"] {
        one(
            json!({"records": {"urls": ["nats://r:4222"]}, "renewal": {"before": before}, "tokenSecret": {"name": "t", "key": "token"}}),
            &["the provisioner would refuse its configuration", "before"],
        );
    }
    assert!(problems(json!({"election": {"mode": "Shards", "backend": "streams"}})).is_empty());
    one(
        json!({"records": {"urls": ["nats://r:4222"]}, "renewal": {"before": "30d"}}),
        &["set spec.tokenSecret"],
    );
    assert!(problems(json!({"records": {"urls": ["nats://r:4222"]}, "tokenSecret": {"name": "t", "key": "token"}, "renewal": {"before": "20%",
        "broker": {"urls": ["nats://c:4222"], "tlsSecret": "renew-tls"}}})).is_empty());
}

#[test]
fn the_built_in_ca_needs_pki_no_cert_manager_a_secret_and_an_hour() {
    let ca = |extra: serde_json::Value| {
        let mut ca = json!({"secretName": "fleet-ca"});
        crate::fixtures::merge(&mut ca, extra);
        ca
    };
    let pki = |ca: serde_json::Value| json!({"features": {"pki": true}, "pki": {"ca": ca}});
    // A CA Secret with its defaults, or with keys and a lifetime of its own.
    assert_eq!(problems(pki(ca(json!({})))), Vec::<String>::new());
    assert_eq!(
        problems(pki(ca(
            json!({"certificateKey": "ca.pem", "keyKey": "ca_key.pem", "validity": "1y"})
        ))),
        Vec::<String>::new()
    );
    // Without features.pki no CSR reaches it.
    one(
        json!({"pki": {"ca": ca(json!({}))}}),
        &[
            "spec.pki.ca signs the nodes' CSRs",
            "spec.features.pki: true",
        ],
    );
    // One signer of ours at a time.
    one(
        json!({"features": {"pki": true},
               "pki": {"ca": ca(json!({})), "certManager": {"issuerRef": {"name": "fleet-ca"}}}}),
        &["spec.pki.certManager and spec.pki.ca both sign", "keep one"],
    );
    // Its Secret's name and keys, and a lifetime renewal can act in.
    for (bad, fragments) in [
        (
            json!({"secretName": "Fleet_CA"}),
            ["spec.pki.ca.secretName \"Fleet_CA\"", "not an object name"],
        ),
        (
            json!({"certificateKey": ".."}),
            ["spec.pki.ca.certificateKey \"..\"", "not a Secret key"],
        ),
        (
            json!({"keyKey": "../ca.key"}),
            ["spec.pki.ca.keyKey \"../ca.key\"", "not a Secret key"],
        ),
        (
            json!({"validity": "30m"}),
            ["spec.pki.ca.validity \"30m\"", "shorter than 1h"],
        ),
        (
            json!({"validity": "soon"}),
            ["spec.pki.ca.validity", "soon"],
        ),
    ] {
        one(pki(ca(bad)), &fragments);
    }
}

#[test]
fn telemetry_is_refused_where_the_provisioner_would_refuse_it() {
    let with = |t: serde_json::Value| json!({"telemetry": t});
    for endpoint in [
        "http://otel-collector.monitoring:4318",
        "http://[::1]:4318/",
        "http://jaeger:4318/custom/traces",
    ] {
        let spec =
            with(json!({"otlpEndpoint": endpoint, "serviceName": "site-a", "samplePercent": 1}));
        assert_eq!(problems(spec), Vec::<String>::new(), "{endpoint}");
    }
    assert!(problems(with(
        json!({"otlpEndpoint": "http://j:4318", "samplePercent": 100})
    ))
    .is_empty());
    one(
        with(json!({"otlpEndpoint": "https://collector:4318"})),
        &["spec.telemetry.otlpEndpoint: only http:// is supported"],
    );
    for bad in [
        "",
        "collector:4318",
        "http://",
        "http://collector:4318/v1/traces?x=1",
        "http://coll ector:4318",
        " http://collector:4318",
    ] {
        one(
            with(json!({"otlpEndpoint": bad})),
            &["spec.telemetry.otlpEndpoint must be a plain http:// URL"],
        );
    }
    // A refused endpoint is not repeated: it may carry credentials.
    let found = problems(with(
        json!({"otlpEndpoint": "http://user:hunter2@collector:4318"}),
    ));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(!found[0].contains("hunter2"), "{found:?}");
    for percent in [0, 101, -5] {
        one(
            with(json!({"otlpEndpoint": "http://j:4318", "samplePercent": percent})),
            &[
                &format!("spec.telemetry.samplePercent {percent} is not 1 to 100"),
                "remove spec.telemetry",
            ],
        );
    }
    for name in ["a\tb".to_string(), "x".repeat(129)] {
        one(
            with(json!({"otlpEndpoint": "http://j:4318", "serviceName": name})),
            &["spec.telemetry.serviceName must be at most 128 characters"],
        );
    }
}

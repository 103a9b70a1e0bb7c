//! What the admission policy costs a node: building its input document
//! and evaluating a policy of the kind the book's guide shows (a role
//! fact, the agents, the provisioning JWT's claims, a reason), on the
//! compiled policy the provisioner shares between its workers.
//!
//! The target: at most 50 µs a node (`cargo bench --bench admission`).

use choria_core::admission::input::NodeInput;
use choria_core::admission::{Decision, Policy};
use choria_wire::security::tokens::ProvisioningClaims;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::path::Path;

const POLICY: &str = r#"package choria.provisioner

default allow := false

allowed_roles := {"web", "db", "cache"}

allow if {
    input.facts.role in allowed_roles
    "choria_provision" in input.agents
    startswith(input.identity, "node-")
    endswith(input.identity, ".fleet.example.net")
    input.jwt.chpd == true
}

defer if input.facts.maintenance == true

deny_reason := sprintf("role %v is not provisioned here", [input.facts.role]) if not allow
"#;

/// An inventory like a provisioning-mode go-choria server's, with twenty
/// facts.
fn inventory(role: &str) -> String {
    let mut facts = serde_json::Map::new();
    for i in 0..20 {
        facts.insert(format!("fact_{i}"), format!("value {i}").into());
    }
    facts.insert("role".into(), role.into());
    serde_json::json!({
        "agents": ["choria_provision", "choria_util", "discovery", "rpcutil"],
        "classes": [], "collectives": ["provisioning"], "data_plugins": [],
        "facts": facts, "machines": [], "main_collective": "provisioning",
        "version": "0.30.2", "upgradable": false,
    })
    .to_string()
}

fn admission(c: &mut Criterion) {
    let policy = Policy::compile(Path::new("bench.rego"), POLICY, false).unwrap();
    let claims: ProvisioningClaims = serde_json::from_value(serde_json::json!({
        "cht": "s3cret", "chs": false, "chu": "nats://broker.bench.example.net:4222",
        "chpd": true, "exp": 2_000_000_000_i64, "iss": "choria", "sub": "provisioning",
    }))
    .unwrap();
    let web = inventory("web");
    let mail = inventory("mail");
    let node = |inventory| NodeInput {
        identity: "node-0042.fleet.example.net",
        protocol: "v1",
        site: "bench",
        inventory,
        csr: None,
        jwt: Some(&claims),
        ed25519_public_key: None,
        record: None,
        evidence: None,
    };
    assert_eq!(
        policy.evaluate(&node(&web).document().unwrap()).unwrap(),
        Decision::Allowed
    );
    assert_eq!(
        policy
            .evaluate(&node(&mail).document().unwrap())
            .unwrap()
            .label(),
        "denied"
    );

    let mut g = c.benchmark_group("admission");
    g.throughput(Throughput::Elements(1));
    g.bench_function("input_document", |b| {
        b.iter(|| black_box(node(black_box(&web)).value().unwrap()))
    });
    g.bench_function("allowed_node", |b| {
        b.iter(|| {
            let doc = node(black_box(&web)).value().unwrap();
            black_box(policy.evaluate_owned(doc).unwrap())
        })
    });
    g.bench_function("denied_node", |b| {
        b.iter(|| {
            let doc = node(black_box(&mail)).value().unwrap();
            black_box(policy.evaluate_owned(doc).unwrap())
        })
    });
    g.finish();
}

criterion_group!(benches, admission);
criterion_main!(benches);

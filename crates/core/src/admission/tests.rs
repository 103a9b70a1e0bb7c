use super::input::NodeInput;
use super::*;
use serde_json::json;

fn policy(text: &str) -> Policy {
    Policy::compile(Path::new("test.rego"), text, false).expect("compiles")
}

const BY_FACT: &str = r#"package choria.provisioner

default allow := false

allow if input.facts.role == "web"

deny_reason := sprintf("role %v is not provisioned here", [input.facts.role]) if not allow

defer if input.facts.maintenance == true
"#;

#[test]
fn the_policy_allows_denies_with_its_reason_and_defers() {
    let p = policy(BY_FACT);
    assert_eq!(
        p.evaluate(&json!({"facts": {"role": "web"}})).unwrap(),
        Decision::Allowed
    );
    assert_eq!(
        p.evaluate(&json!({"facts": {"role": "db"}})).unwrap(),
        Decision::Denied("role db is not provisioned here".into())
    );
    // `defer` wins over `allow`.
    let d = p
        .evaluate(&json!({"facts": {"role": "web", "maintenance": true}}))
        .unwrap();
    assert_eq!(d.label(), "deferred");
}

#[test]
fn an_undefined_allow_denies_with_the_default_reason() {
    let p = policy("package choria.provisioner\n\nallow if input.identity == \"x\"\n");
    assert_eq!(
        p.evaluate(&json!({"identity": "y"})).unwrap(),
        Decision::Denied(DEFAULT_DENY_REASON.into())
    );
    assert_eq!(
        p.evaluate(&json!({"identity": "x"})).unwrap(),
        Decision::Allowed
    );
}

#[test]
fn a_rule_of_the_wrong_type_is_an_error_not_a_decision() {
    let p = policy("package choria.provisioner\n\nallow := \"yes\"\n");
    let e = p.evaluate(&json!({})).unwrap_err();
    assert!(matches!(e, PolicyError::Type { rule: "allow", .. }), "{e}");
    // deny_reason is read for a node that is not allowed (an allowed one
    // has no use for it, and is spared its cost).
    let p = policy("package choria.provisioner\n\nallow := input.ok\ndeny_reason := 3\n");
    assert!(matches!(
        p.evaluate(&json!({"ok": false})).unwrap_err(),
        PolicyError::Type {
            rule: "deny_reason",
            ..
        }
    ));
    assert_eq!(p.evaluate(&json!({"ok": true})).unwrap(), Decision::Allowed);
}

#[test]
fn a_policy_that_fails_at_run_time_is_an_error() {
    // Fails only for some inputs, so it compiles.
    let p = policy("package choria.provisioner\n\nallow if to_number(input.facts.rack) > 3\n");
    assert_eq!(
        p.evaluate(&json!({"facts": {"rack": "7"}})).unwrap(),
        Decision::Allowed
    );
    let e = p
        .evaluate(&json!({"facts": {"rack": "seven"}}))
        .unwrap_err();
    assert!(matches!(e, PolicyError::Evaluate(_)), "{e}");
}

#[test]
fn compile_errors_and_a_wrong_package_are_refused_at_load() {
    let e = Policy::compile(
        Path::new("p.rego"),
        "package choria.provisioner\nallow if {",
        false,
    )
    .unwrap_err();
    assert!(matches!(e, PolicyError::Compile { .. }), "{e}");
    assert!(e.to_string().contains("p.rego"), "{e}");
    let e = Policy::compile(
        Path::new("p.rego"),
        "package choria\n\nallow := true\n",
        false,
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("no package choria.provisioner (it has data.choria)"),
        "{e}"
    );
    let e = Policy::compile(
        Path::new("p.rego"),
        "package choria.provisioner\n\ndefer := true\n",
        false,
    )
    .unwrap_err();
    assert!(matches!(e, PolicyError::NoAllow { .. }), "{e}");
}

#[test]
fn rego_v0_policies_load_when_the_setting_says_so() {
    let v0 = "package choria.provisioner\n\ndefault allow = false\n\nallow { input.identity == \"a\" }\n";
    assert!(Policy::compile(Path::new("v0.rego"), v0, false).is_err());
    let p = Policy::compile(Path::new("v0.rego"), v0, true).unwrap();
    assert_eq!(
        p.evaluate(&json!({"identity": "a"})).unwrap(),
        Decision::Allowed
    );
}

#[test]
fn a_policy_running_past_its_limit_refuses() {
    let p = policy(
        "package choria.provisioner\n\nallow if count([x | some x in numbers.range(1, input.n)]) > 0\n",
    );
    assert_eq!(p.evaluate(&json!({"n": 10})).unwrap(), Decision::Allowed);
    let started = std::time::Instant::now();
    let e = p.evaluate(&json!({"n": 100_000_000})).unwrap_err();
    assert!(matches!(e, PolicyError::Evaluate(_)), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "stopped after {:?}",
        started.elapsed()
    );
}

#[test]
fn the_input_holds_the_nodes_facts_and_names_but_not_its_token() {
    let claims: choria_wire::security::tokens::ProvisioningClaims = serde_json::from_value(json!({
        "cht": "s3cret-token", "chpwd": "s3cret-password", "chs": true,
        "chu": "nats://b:4222", "chpd": true, "exp": 2_000_000_000_i64,
        "extensions": {"identity": "n1.example.net"}
    }))
    .unwrap();
    let inventory = json!({
        "version": "0.30.2",
        "facts": {"role": "web"},
        "agents": ["choria_provision", "rpcutil"],
        "collectives": ["provisioning"],
        "classes": [],
    })
    .to_string();
    let input = NodeInput {
        identity: "n1.example.net",
        protocol: "v2",
        site: "dc1",
        inventory: &inventory,
        csr: None,
        jwt: Some(&claims),
        ed25519_public_key: Some("abcd"),
        record: None,
        evidence: None,
    };
    // What the provisioner hands the engine (built in its own values) is
    // what `document` shows and `policy eval --input` reads.
    let p = policy(
        "package choria.provisioner\n\nallow if {\n input.jwt.exp == 2000000000\n input.facts.role == \"web\"\n input.site == \"dc1\"\n input.ed25519_public_key == \"abcd\"\n not input.jwt.cht\n}\n",
    );
    assert_eq!(
        p.evaluate_owned(input.value().unwrap()).unwrap(),
        Decision::Allowed
    );
    let doc = input.document().unwrap();
    assert_eq!(p.evaluate(&doc).unwrap(), Decision::Allowed);
    assert_eq!(doc["jwt"]["exp"], 2_000_000_000_i64);
    assert_eq!(doc["facts"]["role"], "web");
    assert_eq!(doc["agents"][1], "rpcutil");
    assert_eq!(doc["version"], "0.30.2");
    assert_eq!(doc["jwt"]["chu"], "nats://b:4222");
    assert_eq!(doc["jwt"]["extensions"]["identity"], "n1.example.net");
    assert_eq!(doc["csr"], serde_json::Value::Null);
    let text = doc.to_string();
    assert!(!text.contains("s3cret"), "{text}");
    assert!(doc["jwt"].get("cht").is_none() && doc["jwt"].get("chpwd").is_none());
}

#[test]
fn the_input_names_what_the_csr_asks_for() {
    let key = choria_wire::security::csr::generate_rsa_key(1024).unwrap();
    let pem = choria_wire::security::csr::make_csr(
        &key,
        &choria_wire::security::csr::CsrSubject::new("n1.example.net"),
    )
    .unwrap();
    let doc = NodeInput {
        identity: "n1.example.net",
        inventory: "{}",
        csr: Some(&pem),
        ..Default::default()
    }
    .document()
    .unwrap();
    assert_eq!(doc["csr"]["common_name"], "n1.example.net");
    assert_eq!(doc["csr"]["dns_names"], json!([]));
}

/// A policy that walks a 100,000-element fact again and again, until its
/// time limit, for every node: the runtime that runs the sequences (and
/// renews the lease) goes on ticking beside it. One worker thread, as a
/// loaded machine leaves the runtime; evaluated on it, each node would
/// hold it for a rule's whole limit.
#[tokio::test(flavor = "current_thread")]
async fn a_policy_that_walks_a_large_fact_does_not_stall_the_runtime() {
    let p = Arc::new(policy(
        "package choria.provisioner\nimport rego.v1\n\
         default allow := false\n\
         allow if count([x | some x in input.facts.big; some y in input.facts.big; x < y]) > 0\n",
    ));
    let big: Vec<u32> = (0..100_000).collect();
    let input = || regorus::Value::from(json!({"facts": {"big": big}}));
    // The lease's renewal, as a ticker that must keep its pace.
    let ticker = tokio::spawn(async {
        let mut longest = std::time::Duration::ZERO;
        let mut last = std::time::Instant::now();
        for _ in 0..100 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            longest = longest.max(last.elapsed());
            last = std::time::Instant::now();
        }
        longest
    });
    let started = std::time::Instant::now();
    let nodes: Vec<_> = (0..4)
        .map(|_| {
            let (p, input) = (p.clone(), input());
            tokio::spawn(async move { p.decide(input).await })
        })
        .collect();
    for n in nodes {
        let e = n.await.unwrap().expect_err("stopped at its time limit");
        assert!(e.to_string().contains("could not be evaluated"), "{e}");
    }
    // Four nodes on as many engines as cores: each bounded by its limit.
    assert!(
        started.elapsed() < EVALUATION_LIMIT * 4 * 3,
        "{:?}",
        started.elapsed()
    );
    let longest = ticker.await.unwrap();
    // On the runtime's thread each node held it for at least one rule's
    // limit (1 s was seen); off it, a tick is late only by scheduling.
    assert!(
        longest < EVALUATION_LIMIT,
        "the runtime stalled for {longest:?} while the policy ran"
    );
}

//! Tracing end to end: `choria-provisioner run` with
//! `telemetry.otlp_endpoint` pointing at a real Jaeger provisions simulated
//! nodes, and each node's sequence is found through Jaeger's query API as
//! one trace: its root span with the identity, mode and outcome, a child
//! span per step, no secret anywhere; and the histograms' exemplars on
//! `/metrics` (OpenMetrics) lead to those traces.

use crate::support::jaeger::{tag, Jaeger};
use crate::support::provisioner::{binary, http_get, http_get_with, ProvisionerProcess};
use crate::support::{NatsServer, RunningFleet};
use choria_fleet::FleetOptions;
use choria_wire::client::BrokerOptions;
use choria_wire::security::ed25519::Ed25519KeyPair;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

const TOKEN: &str = "tr4ce-t0ken-s3cret";
const NODES: usize = 12;
const SERVICE: &str = "provisioner-traces-e2e";
const POLICY: &str = "package choria.provisioner\n\nallow := true\n";

/// The steps every provisioned node's trace holds, as span names.
const STEPS: [&str; 8] = [
    "discovery",
    "choria_provision#jwt",
    "rpcutil#inventory",
    "policy",
    "wait for a worker",
    "helper",
    "choria_provision#configure",
    "choria_provision#restart",
];

struct Fixture {
    _jaeger_dir: tempfile::TempDir,
    jaeger: Jaeger,
    _nats: NatsServer,
    fleet: RunningFleet,
    provisioner: ProvisionerProcess,
    secrets: Vec<String>,
    _dir: tempfile::TempDir,
}

async fn start(test: &str) -> Option<Fixture> {
    let jaeger_dir = tempfile::tempdir().unwrap();
    let jaeger = Jaeger::start(test, jaeger_dir.path())?;
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    let issuer = Ed25519KeyPair::generate();
    let seed = dir.path().join("issuer.seed");
    std::fs::write(&seed, issuer.seed_hex()).unwrap();
    let fleet = RunningFleet::start(FleetOptions {
        broker: BrokerOptions::at([nats.url()]),
        nodes: NODES,
        token: TOKEN.into(),
        jwt_signer: Some(seed),
        journal: Some(dir.path().join("journal.jsonl")),
        ..Default::default()
    })
    .await;
    let policy = dir.path().join("admission.rego");
    std::fs::write(&policy, POLICY).unwrap();
    let helper = format!(
        "{} fleet-helper --broker nats://broker.traces.example.net:4222",
        binary()
    );
    let yaml = format!(
        "workers: 4\ninterval: 1m\ntoken: {TOKEN}\nsite: traces\nhelper: {helper:?}\nchoria_insecure: true\n\
         rpc_timeout: 10s\ndiscovery_window: 500ms\njwt_verify_cert: {}\nfeatures:\n  jwt: true\n\
         admission:\n  policy: {}\ntelemetry:\n  otlp_endpoint: {}\n  service_name: {SERVICE}\n",
        issuer.public_hex(),
        policy.display(),
        jaeger.otlp_endpoint(),
    );
    let choria_cfg = format!(
        "identity = provisioner.traces\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
        nats.url()
    );
    let provisioner = ProvisionerProcess::start(dir.path(), &yaml, &choria_cfg, &["--debug"]);
    Some(Fixture {
        _jaeger_dir: jaeger_dir,
        jaeger,
        _nats: nats,
        fleet,
        provisioner,
        secrets: vec![TOKEN.to_string(), issuer.seed_hex()],
        _dir: dir,
    })
}

/// The root span of a trace (the one without a parent reference).
fn root(trace: &Value) -> &Value {
    let spans = trace["spans"].as_array().unwrap();
    let roots: Vec<&Value> = spans
        .iter()
        .filter(|s| s["references"].as_array().is_none_or(|r| r.is_empty()))
        .collect();
    assert_eq!(roots.len(), 1, "one root per trace: {trace}");
    roots[0]
}

/// The traces of provisioned nodes, by identity (the last of each).
fn provisioned(traces: &[Value]) -> BTreeMap<String, Value> {
    traces
        .iter()
        .filter(|t| tag(root(t), "choria.outcome").and_then(Value::as_str) == Some("provisioned"))
        .map(|t| {
            let node = tag(root(t), "choria.identity")
                .and_then(Value::as_str)
                .unwrap();
            (node.to_string(), t.clone())
        })
        .collect()
}

/// One trace: the root names the node, its mode and outcome; each step of
/// [`STEPS`] is a child of the root; the RPCs say what they called and in
/// how many attempts.
fn check_trace(node: &str, trace: &Value) {
    let root = root(trace);
    assert_eq!(root["operationName"], "provision node");
    assert_eq!(tag(root, "choria.mode").unwrap(), "helper", "{root}");
    let spans = trace["spans"].as_array().unwrap();
    let root_id = root["spanID"].as_str().unwrap();
    for step in STEPS {
        let span = spans
            .iter()
            .find(|s| s["operationName"] == step)
            .unwrap_or_else(|| panic!("{node}: no {step} span in {trace}"));
        let parent = &span["references"][0];
        assert_eq!(parent["refType"], "CHILD_OF");
        assert_eq!(
            parent["spanID"], root_id,
            "{node}: {step} is not the root's child"
        );
        assert!(span["duration"].as_u64().is_some());
        if step.contains('#') {
            let (agent, action) = step.split_once('#').unwrap();
            assert_eq!(tag(span, "rpc.service").unwrap(), agent);
            assert_eq!(tag(span, "rpc.method").unwrap(), action);
            assert!(tag(span, "choria.attempts").unwrap().as_i64().unwrap() >= 1);
            assert_eq!(tag(span, "span.kind").unwrap(), "client");
        }
    }
    // The root spans the node's whole time, from its discovery.
    let discovery = spans
        .iter()
        .find(|s| s["operationName"] == "discovery")
        .unwrap();
    assert_eq!(discovery["startTime"], root["startTime"]);
    assert_eq!(tag(discovery, "choria.source").unwrap(), "discovery");
    let process = &trace["processes"][root["processID"].as_str().unwrap()];
    assert_eq!(process["serviceName"], SERVICE);
}

/// The trace ids of the exemplars of `family`'s buckets in an OpenMetrics
/// text: `<family>_bucket{...} N # {trace_id="..."} value timestamp`.
fn exemplar_traces(text: &str, family: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}_bucket{{")))
        .filter_map(|l| l.split_once(" # {trace_id=\"")?.1.split_once('"'))
        .map(|(id, _)| id.to_string())
        .collect()
}

/// `/metrics` in OpenMetrics: the sequence and RPC histograms carry
/// exemplars, and each one's trace id is a trace Jaeger holds.
fn check_exemplars(f: &Fixture) {
    let accept = ("Accept", "application/openmetrics-text; version=1.0.0");
    let (status, head, text) = http_get_with(f.provisioner.monitor_port, "/metrics", &[accept]);
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert!(text.ends_with("# EOF\n"));
    // The Go provisioner's counters keep their names.
    assert!(
        text.contains(&format!(
            "\nchoria_provisioner_provisioned{{site=\"traces\"}} {NODES}\n"
        )),
        "{text}"
    );
    let sequences = exemplar_traces(&text, "choria_provisioner_sequence_seconds");
    let rpcs = exemplar_traces(&text, "choria_provisioner_rpc_seconds");
    assert!(
        !sequences.is_empty() && !rpcs.is_empty(),
        "no exemplars:\n{text}"
    );
    for id in sequences.iter().chain(&rpcs) {
        assert_eq!(id.len(), 32, "{id}");
        let (status, body) = http_get(f.jaeger.query_port, &format!("/api/traces/{id}"));
        assert_eq!(status, 200, "exemplar {id} is no trace in Jaeger: {body}");
        let doc: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(doc["data"][0]["traceID"], id.as_str());
    }
    // The Prometheus text is unchanged for a scraper that does not ask.
    let (_, plain) = f.provisioner.get("/metrics");
    assert!(!plain.contains("trace_id") && !plain.contains("# EOF"));
}

/// Every node provisioned is one trace in Jaeger, with its steps, and no
/// secret is in any of them; the exemplars lead to traces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_is_one_trace_in_jaeger_with_a_span_per_step() {
    let test = "traces::each_node_is_one_trace_in_jaeger_with_a_span_per_step";
    let Some(mut f) = start(test).await else {
        return;
    };
    // 12 nodes took ~3 s on the loaded two-core machine; the limit is for
    // a machine under a full test run.
    f.provisioner
        .wait_for_metric(
            "choria_provisioner_provisioned",
            NODES as f64,
            Duration::from_secs(120),
        )
        .await;
    // Traces leave in batches every 500 ms; Jaeger answers queries at once.
    let traces = f
        .jaeger
        .wait_traces(SERVICE, Duration::from_secs(60), |t| {
            provisioned(t).len() >= NODES
        })
        .await;
    let by_node = provisioned(&traces);
    let expected: Vec<&String> = f.fleet.identities.iter().collect();
    assert_eq!(by_node.keys().collect::<Vec<_>>(), expected);
    for (node, trace) in &by_node {
        check_trace(node, trace);
    }
    let text = serde_json::to_string(&traces).unwrap();
    for secret in &f.secrets {
        assert!(!text.contains(secret.as_str()), "a secret is in a trace");
    }
    check_exemplars(&f);
}

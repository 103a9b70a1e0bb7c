//! Sign once for many (`request_batch_window`) against REAL go-choria 0.30.2
//! v1 servers through the real Choria broker on an x509 network, where
//! every request we send is signed with the provisioner's RSA key.
//!
//! Three servers wait in provisioning mode before the provisioner starts,
//! so one discovery finds them together. Their `jwt`, `inventory` and
//! `restart` requests are the same for every node: each goes out as one
//! signed message published to each server's own subject, as go-choria's
//! direct mode sends, and the real servers answer it. A tap in the
//! provisioning account sees every request on `provisioning.node.>`: each
//! server got exactly one `configure`, its own, and what went to more than
//! one server names none of them.
//!
//! Needs `$CHORIA_BIN` and root, like tests/broker.rs.

use crate::support::broker::{Network, PROVISIONER_PASSWORD};
use crate::support::gopeers::s;
use crate::support::provisioner::ProvisionerProcess;
use crate::support::realnodes::*;
use choria_wire::client::{self, ConnectOptions};
use choria_wire::protocol::{self, Version};
use futures::StreamExt;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The servers, all found by the first discovery.
const NODES: [&str; 3] = [
    "batch-1.example.net",
    "batch-2.example.net",
    "batch-3.example.net",
];

/// Wide enough that requests of sequences started by one discovery on a
/// loaded machine always meet in one batch (they start within
/// milliseconds; the default is 20 ms).
const WINDOW: &str = "2s";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_servers_answer_one_signed_request_sent_to_all_of_them() {
    let Some(mut bench) = Bench::start_on_choria(
        "real_servers_answer_one_signed_request_sent_to_all_of_them",
        Network::X509,
        Duration::from_secs(5),
    )
    .await
    else {
        return;
    };
    let mut servers = Vec::new();
    for id in NODES {
        servers.push(bench.server(id, Version::V1).await);
    }
    let tap = Tap::start(&bench).await;
    let mut p = given_a_provisioner_that_batches(&bench);

    p.wait_for_metric(
        "choria_provisioner_provisioned",
        NODES.len() as f64,
        PROVISION_TIMEOUT,
    )
    .await;
    for server in &mut servers {
        bench.wait_back_as_server(server).await;
        bench.assert_connected_in(&server.identity, "mcollective");
    }

    then_each_shared_request_was_signed_once(&p);
    then_no_server_saw_a_request_meant_for_another(&tap.requests());
    bench.stop_and_check_log(p);
}

/// Template mode with the built-in CA (the broker's own CA file), so each
/// server's settings (its ssldir) come from its own CSR; signed requests,
/// not `choria_insecure`.
fn given_a_provisioner_that_batches(bench: &Bench) -> ProvisionerProcess {
    let template = serde_json::json!({ "configuration": file_provider_template(&bench.url()) });
    let ca = bench.broker.ca();
    let yaml = format!(
        "workers: 2\ninterval: 1m\ntoken: {TOKEN}\nsite: batches\ndiscovery_timeout: 2s\n\
         request_batch_window: {WINDOW}\nbroker_provisioning_password: {PROVISIONER_PASSWORD}\n\
         jwt_verify_cert: {}\nfeatures:\n  jwt: true\n  pki: true\nconfiguration_template: {template}\n\
         ca:\n  certificate: {}\n  key: {}\n",
        s(&bench.signers.rsa_public),
        s(&ca.cert),
        s(&ca.key),
    );
    let broker = bench.broker.choria();
    let cert = broker.client_cert("provisioner", PROVISIONER);
    let choria_cfg = x509_client_config(&broker.url(), PROVISIONER, &cert, &broker.ca.cert);
    let dir = bench.path("provisioner");
    std::fs::create_dir_all(&dir).unwrap();
    ProvisionerProcess::start_with_env(&dir, "provisioner", &yaml, &choria_cfg, &["--debug"], &[])
}

/// `jwt`, `inventory` and `restart` went to all three servers in fewer
/// signed messages than servers (one each when every sequence met in one
/// batch); `configure`, different for each, was signed for each.
fn then_each_shared_request_was_signed_once(p: &ProvisionerProcess) {
    let metrics = p.get("/metrics").1;
    let value = |name: &str, rpc: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("rpc=\"{rpc}\"")))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name}{{rpc={rpc}}}:\n{metrics}"))
    };
    let n = NODES.len() as f64;
    for rpc in [
        "choria_provision#jwt",
        "rpcutil#inventory",
        "choria_provision#restart",
    ] {
        let (signed, targets) = (
            value("choria_provisioner_signed_requests", rpc),
            value("choria_provisioner_request_targets", rpc),
        );
        assert_eq!(targets, n, "{rpc} went to every server once");
        assert!(signed < n, "{rpc}: {signed} signatures for {n} servers");
    }
    assert_eq!(
        value(
            "choria_provisioner_request_targets",
            "choria_provision#configure"
        ),
        n
    );
    assert_eq!(
        value(
            "choria_provisioner_signed_requests",
            "choria_provision#configure"
        ),
        n,
        "each configure is its own message"
    );
}

/// From the tap: each server got one `configure`, carrying its own name;
/// a message that went to several servers (one request id on several
/// subjects) is one of the shared requests and names none of them.
fn then_no_server_saw_a_request_meant_for_another(seen: &[(String, protocol::Request)]) {
    let mut subjects_of: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut configured: BTreeMap<&str, usize> = BTreeMap::new();
    for (subject, request) in seen.iter().filter(|(_, r)| r.agent != "discovery") {
        let node = subject.strip_prefix("provisioning.node.").unwrap();
        subjects_of.entry(&request.id).or_default().insert(node);
        let body: Value = serde_json::from_slice(&request.payload()).unwrap();
        if body["action"] == "configure" {
            let config: Value =
                serde_json::from_str(body["data"]["config"].as_str().unwrap()).unwrap();
            assert_eq!(config["identity"], node, "a configure for another node");
            *configured.entry(node).or_default() += 1;
        }
    }
    assert_eq!(
        configured,
        NODES.iter().map(|n| (*n, 1)).collect(),
        "one configure per server"
    );
    let shared: Vec<_> = seen
        .iter()
        .filter(|(_, r)| r.agent != "discovery" && subjects_of[r.id.as_str()].len() > 1)
        .collect();
    assert!(!shared.is_empty(), "no request went to several servers");
    for (subject, request) in shared {
        let body = String::from_utf8_lossy(&request.payload()).into_owned();
        let action = serde_json::from_str::<Value>(&body).unwrap()["action"].clone();
        assert!(
            ["jwt", "inventory", "restart"].contains(&action.as_str().unwrap()),
            "{action} went to several servers ({subject})"
        );
        assert!(
            NODES.iter().all(|n| !body.contains(n)),
            "a shared request names a server: {body}"
        );
    }
}

/// Every request on `provisioning.node.>`, seen from the provisioning
/// account (logged in as the provisioner is: password and certificate).
struct Tap {
    seen: Arc<Mutex<Vec<(String, protocol::Request)>>>,
}

impl Tap {
    async fn start(bench: &Bench) -> Tap {
        let broker = bench.broker.choria();
        let opts = ConnectOptions {
            servers: vec![broker.url()],
            name: "tap".into(),
            tls: broker.tls(Some(broker.client_cert("tap", PROVISIONER))),
            user: Some(("provisioner".into(), PROVISIONER_PASSWORD.into())),
            ..Default::default()
        };
        let nats = client::connect(&opts).await.expect("the tap connects");
        let mut sub = nats.subscribe("provisioning.node.>").await.unwrap();
        nats.flush().await.unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        tokio::spawn(async move {
            let _keep = nats;
            while let Some(m) = sub.next().await {
                let request = protocol::decode_request(&m.payload, Version::V1)
                    .unwrap_or_else(|e| panic!("the tap could not decode a request: {e}"));
                into.lock().unwrap().push((m.subject.to_string(), request));
            }
        });
        Tap { seen }
    }

    fn requests(&self) -> Vec<(String, protocol::Request)> {
        self.seen.lock().unwrap().clone()
    }
}

//! `spec.bindings` (issue 42): a name held to a cloud instance through the
//! `Provisioner` resource, as `choria-provisioner rebind --instance` holds
//! it. The pods write the binding (the operator holds no key to seal it);
//! a node presenting another instance's valid evidence under the name is
//! refused while the list names the first, and provisioned once the list
//! names its own instance.

use crate::operator_e2e::SERIAL;
use crate::support::evidence::AwsRegion;
use crate::support::kube::ControlPlane;
use crate::support::operator::*;
use crate::support::{read_journal_so_far, NatsServer, RunningFleet};
use serde_json::json;
use std::time::Duration;

const FIRST: &str = "aws.123456789012.i-0aaaaaaaaaaaaaaaa";
const SECOND: &str = "aws.123456789012.i-0bbbbbbbbbbbbbbbb";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_bindings_hold_a_name_to_the_listed_instance() {
    let Some(bins) = ControlPlane::available() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(&bins);
    let cp = &c.cp;
    c.create_namespace();
    let nats = NatsServer::start_jetstream();
    let region = AwsRegion::create(c.dir.path());
    cp.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "roots",
        "-n",
        NS,
        &format!("--from-file=aws.pem={}", region.cert.display()),
    ]);
    let node = "web-000.fleet.example.net";
    let pin = |instance: &str| json!([{"identity": node, "instance": instance, "reason": "replaced machine"}]);
    fleet_provisioner_with(
        &c,
        "binding",
        &nats,
        (1, 4),
        "0",
        "2s",
        json!({
            "records": {"urls": [nats.url()]},
            "evidence": {"awsCertificates": {"name": "roots", "key": "aws.pem"}},
            "bindings": pin(FIRST),
        }),
    );
    let deployment = get(cp, "deployment", NS, "binding");
    let kubeconfig = pod_kubeconfig(&c, "binding");
    let pod = start_pod(&c, &deployment, "binding-6c9d8b7f5-k2x4p", &kubeconfig);
    wait_for(
        "the name bound by the list",
        Duration::from_secs(60),
        || pod.logs().contains("bound by spec.bindings").then_some(()),
    );

    // The machine that replaced the first one: valid evidence of its own
    // instance, refused under the name the list holds to the first.
    let journal = c.dir.path().join("journal.jsonl");
    let facts = region.facts("second", &AwsRegion::document("i-0bbbbbbbbbbbbbbbb"));
    let fleet = RunningFleet::start(choria_fleet::FleetOptions {
        nodes: 1,
        identity_prefix: "web-".into(),
        facts,
        ..fleet_options(&nats, 1, &journal)
    })
    .await;
    assert_eq!(fleet.identities, [node]);
    wait_for(
        "the second instance refused",
        Duration::from_secs(60),
        || {
            (pod.metric("choria_provisioner_evidence{outcome=\"bound_elsewhere\"") >= 1.0)
                .then_some(())
        },
    );
    let configured = || {
        read_journal_so_far(&journal)
            .iter()
            .filter(|e| e["kind"] == "action" && e["action"] == "configure" && e["outcome"] == "ok")
            .count()
    };
    assert_eq!(configured(), 0, "{}", pod.tail(20));

    // The list names the new instance: the pod moves the name, and looks
    // for the refused node at once (the interval is a minute).
    patch_spec(cp, "binding", json!({"bindings": pin(SECOND)}));
    wait_for(
        "the second instance provisioned",
        Duration::from_secs(60),
        || (configured() >= 1).then_some(()),
    );
    assert_eq!(
        pod.logs().matches("bound by spec.bindings").count(),
        2,
        "{}",
        pod.tail(20)
    );
    drop(pod);
    fleet.finish().await;
}

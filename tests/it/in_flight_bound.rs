//! The lanes' in-flight bounds follow the broker and the nodes: a lane
//! whose answers come mostly slowly, or a lost broker connection, cuts
//! them (`choria_provisioner_in_flight_bound{lane}` and a log line say to
//! what), and nothing is lost on the way. The real binary, a real
//! nats-server, the simulated fleet.

use crate::support::provisioner::ProvisionerProcess;
use crate::support::{small_fleet as fleet_options, NatsServer, RunningFleet};
use choria_fleet::FleetOptions;
use std::path::Path;
use std::time::Duration;

const DISCOVERY: &str = "choria_provisioner_in_flight_bound{lane=\"discovery\"";
const EVENTS: &str = "choria_provisioner_in_flight_bound{lane=\"events\"";
/// The discovery lane's ceiling (`lanes::IN_FLIGHT`).
const DISCOVERY_CEILING: f64 = 512.0;

/// Template mode (no helper), every request answered within 10 s.
fn start(dir: &Path, nats: &NatsServer) -> ProvisionerProcess {
    let yaml = "workers: 16\ninterval: 1m\nsite: bound\nchoria_insecure: true\nloglevel: info\n\
                rpc_timeout: 10s\ndiscovery_window: 500ms\n\
                configuration_template:\n  configuration:\n    identity: '{{ identity }}'\n";
    let choria_cfg = format!(
        "identity = provisioner.bound\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
        nats.url()
    );
    ProvisionerProcess::start(dir, yaml, &choria_cfg, &[])
}

/// 600 nodes that answer every request 2.2 s late (slow, past the 2 s the
/// rules call slow, well inside the 10 s timeout), found by one discovery:
/// 512 of them go out at once, their answers all come slowly, the round
/// ends mostly slow and the discovery lane's bound is cut; every node is
/// still provisioned, and the bound the lanes ended at is logged at
/// shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_whose_answers_come_slowly_has_its_bound_cut_and_loses_no_node() {
    const NODES: usize = 600;
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    let fleet = RunningFleet::start(FleetOptions {
        slow_nodes: NODES,
        slow_delay_ms: 2200,
        ..fleet_options(&nats, dir.path(), NODES)
    })
    .await;
    let mut p = start(dir.path(), &nats);
    p.wait_for_metric(DISCOVERY, DISCOVERY_CEILING, Duration::from_secs(60))
        .await;
    p.wait_for_metric_at_most(DISCOVERY, DISCOVERY_CEILING * 0.7, Duration::from_secs(120))
        .await;
    assert!(
        p.logs().contains("in-flight bound cut"),
        "the cut is logged:\n{}",
        p.logs_tail(40)
    );
    p.wait_for_metric(
        "choria_provisioner_provisioned",
        NODES as f64,
        Duration::from_secs(300),
    )
    .await;
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(30)).success());
    let logs = p.logs();
    let bounds = logs
        .lines()
        .find(|l| l.contains("stopping the node sequences in flight"))
        .expect("the stop is logged");
    assert!(bounds.contains("discovery="), "{bounds}");
    let (_, journal) = fleet.finish().await;
    let configured = journal
        .iter()
        .filter(|e| e["kind"] == "action" && e["action"] == "configure")
        .count();
    assert_eq!(configured, NODES, "each node configured once");
}

/// A broker that goes away cuts every lane, the events lane too (no
/// answer of it was slow): what the broker cannot take, we do not send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_broker_connection_cuts_every_lane() {
    let dir = tempfile::tempdir().unwrap();
    let mut nats = NatsServer::start();
    let fleet = RunningFleet::start(fleet_options(&nats, dir.path(), 5)).await;
    let mut p = start(dir.path(), &nats);
    p.wait_for_metric(
        "choria_provisioner_provisioned",
        5.0,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(p.metric(EVENTS), 256.0, "the events lane at its ceiling");
    nats.restart(Duration::from_secs(1));
    p.wait_for_metric_at_most(EVENTS, 179.0, Duration::from_secs(60))
        .await;
    p.wait_for_metric_at_most(DISCOVERY, 358.0, Duration::from_secs(5))
        .await;
    drop(fleet);
}

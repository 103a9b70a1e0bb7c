//! The provisioner in-process against the simulated fleet: the pause gate as
//! seen from the nodes, and discovery at scale.

use crate::support::provisioner::binary;
use crate::support::{small_fleet as fleet_options, NatsServer, RunningFleet};
use choria_config::{ChoriaClientConfig, Environment, ProvisionerConfig};
use choria_core::monitor::Exposition;
use choria_core::provision::gate::PauseReason;
use choria_core::provision::{Options, Provisioner, Steering};
use choria_fleet::FleetOptions;
use choria_wire::client::{self, EventFormat};
use choria_wire::lifecycle::{Event, EventType};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

struct Running {
    steering: Arc<Steering>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the provisioner stops within 5 s")
            .unwrap();
    }

    fn metric(&self, name: &str) -> f64 {
        self.steering.metrics().value(name).unwrap_or(0.0)
    }

    /// Waits until every metric in `names` is 0 (each must exist).
    async fn wait_for_zero(&self, names: &[&str], timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let value = |n: &str| self.steering.metrics().value(n).expect(n);
        while names.iter().any(|n| value(n) != 0.0) {
            assert!(
                Instant::now() < deadline,
                "after {timeout:?}: {:?}",
                names.iter().map(|n| (n, value(n))).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn wait_for(&self, name: &str, at_least: f64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.metric(name) < at_least {
            assert!(
                Instant::now() < deadline,
                "{name} is {} after {timeout:?}, expected >= {at_least}",
                self.metric(name)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Starts the provisioner in this process; `before` runs on its steering
/// before it starts (e.g. to start paused).
fn start(dir: &Path, nats: &NatsServer, yaml: &str, before: impl FnOnce(&Steering)) -> Running {
    let yaml_path = dir.join("provisioner.yaml");
    std::fs::write(
        &yaml_path,
        format!("interval: 1m\nchoria_insecure: true\nsite: pipeline\nrpc_timeout: 3s\ndiscovery_window: 500ms\n{yaml}"),
    )
    .unwrap();
    let ccfg_path = dir.join("choria.cfg");
    std::fs::write(
        &ccfg_path,
        format!(
            "identity = provisioner.pipeline\nplugin.choria.middleware_hosts = {}\n",
            nats.url()
        ),
    )
    .unwrap();
    let cfg = ProvisionerConfig::load(&yaml_path).unwrap();
    let env = Environment::from_process();
    let setup = ChoriaClientConfig::load_with(&ccfg_path, &env)
        .unwrap()
        .client_setup(&cfg, &env)
        .unwrap();
    let provisioner = Provisioner::new(cfg, setup, Options::new("test")).unwrap();
    let steering = provisioner.steering();
    before(&steering);
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let task = tokio::spawn(async move {
        provisioner.run(stop).await.expect("the provisioner runs");
    });
    Running {
        steering,
        shutdown,
        task,
    }
}

async fn fleet(nats: &NatsServer, dir: &Path, nodes: usize) -> RunningFleet {
    RunningFleet::start(fleet_options(nats, dir, nodes)).await
}

/// A fleet whose every node takes 1.5 s to answer each directed request
/// (the scenes' rpc_timeout is 3 s): each sequence has a request in flight
/// for a long, known while.
async fn slow_fleet(nats: &NatsServer, dir: &Path, nodes: usize) -> RunningFleet {
    RunningFleet::start(FleetOptions {
        connections: 2,
        slow_nodes: nodes,
        slow_delay_ms: 1500,
        ..fleet_options(nats, dir, nodes)
    })
    .await
}

/// Waits until the fleet's journal holds `n` answered `action` requests;
/// fails after `within`, saying `why` and how far it got.
async fn wait_actions(dir: &Path, action: &str, n: usize, within: Duration, why: &str) {
    let path = dir.join("journal.jsonl");
    let deadline = Instant::now() + within;
    loop {
        let journal = crate::support::read_journal_so_far(&path);
        let got = actions(&journal, action).count();
        if got >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{why}: {got} of {n} answered {action} after {within:?} ({} configured)",
            actions(&journal, "configure").count()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn actions<'a>(journal: &'a [Value], action: &'a str) -> impl Iterator<Item = &'a Value> {
    journal
        .iter()
        .filter(move |e| e["kind"] == "action" && e["action"] == action)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_provisioner_ignores_discovery_and_events_and_resuming_discovers_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    let fleet = fleet(&nats, dir.path(), 100).await;
    let helper = format!("helper: {} fleet-helper\nworkers: 8\n", binary());
    let p = start(dir.path(), &nats, &helper, |h| {
        h.pause(PauseReason::Requested, true)
    });
    // Paused from the start: no discovery, and a startup event is ignored.
    let nats_client = nats.connect("event-sender").await;
    let event = Event::new(
        EventType::Startup,
        &fleet.identities[0],
        "provision_mode_server",
        Some("0.30.2"),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    client::publish_event(
        &nats_client,
        EventType::Startup,
        &event,
        EventFormat::CloudEvent,
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(p.metric("choria_provisioner_paused"), 1.0);
    assert_eq!(p.metric("choria_provisioner_discover_cycles"), 0.0);
    assert_eq!(p.metric("choria_provisioner_event_discovered"), 0.0);
    assert_eq!(p.steering.registry().len(), 0);

    // Resuming discovers at once (the interval is a minute away).
    let resumed = Instant::now();
    p.steering.resume(PauseReason::Requested);
    assert_eq!(p.metric("choria_provisioner_paused"), 0.0);
    p.wait_for(
        "choria_provisioner_provisioned",
        100.0,
        Duration::from_secs(50),
    )
    .await;
    // The fleet was found by the discovery the resume triggered, not by
    // the interval's (a minute after start): exactly one round ran.
    assert_eq!(
        p.metric("choria_provisioner_discover_cycles"),
        1.0,
        "resuming discovered at once"
    );
    p.stop().await;
    let (_, journal) = fleet.finish().await;
    let first_request = journal
        .iter()
        .filter(|e| e["kind"] == "action")
        .map(|e| e["time_us"].as_i64().unwrap())
        .min()
        .unwrap();
    let resumed_at_us =
        chrono::Utc::now().timestamp_micros() - resumed.elapsed().as_micros() as i64;
    assert!(
        first_request >= resumed_at_us - 100_000,
        "a node was contacted before resume ({first_request} < {resumed_at_us})"
    );
    assert_eq!(actions(&journal, "configure").count(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_mid_sequence_stops_each_node_at_its_next_attempt_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    let fleet = fleet(&nats, dir.path(), 20).await;
    // A slow helper: every node is inside it when the pause comes.
    let helper = format!(
        "helper: sh -c 'sleep 2; exec {} fleet-helper'\nworkers: 20\n",
        binary()
    );
    let p = start(dir.path(), &nats, &helper, |_| {});
    p.wait_for(
        "choria_provisioner_busy_workers",
        20.0,
        Duration::from_secs(20),
    )
    .await;
    let journal_path = dir.path().join("journal.jsonl");
    // All 20 have fetched their inventory and sit in the helper.
    wait_actions(
        dir.path(),
        "inventory",
        20,
        Duration::from_secs(10),
        "inventory not fetched by all",
    )
    .await;
    p.steering.pause(PauseReason::Requested, false);
    // The helpers finish (20 of them started at once: not a fixed time on a
    // loaded machine), but configure must not be sent: once no sequence is
    // left, none was.
    p.wait_for_zero(
        &[
            "choria_provisioner_busy_workers",
            "choria_provisioner_sequences",
        ],
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(p.metric("choria_provisioner_provisioned"), 0.0);
    assert_eq!(
        p.metric("choria_provisioner_provision_errors"),
        0.0,
        "a pause is not a provisioning error"
    );
    let so_far = crate::support::read_journal_so_far(&journal_path);
    assert_eq!(
        actions(&so_far, "configure").count(),
        0,
        "configure was sent while paused"
    );
    // Resuming rediscovers them and finishes the job.
    p.steering.resume(PauseReason::Requested);
    p.wait_for(
        "choria_provisioner_provisioned",
        20.0,
        Duration::from_secs(30),
    )
    .await;
    p.stop().await;
    let (_, journal) = fleet.finish().await;
    assert_eq!(actions(&journal, "configure").count(), 20);
}

/// A pause asks that nothing more be configured. A node whose `configure`
/// was already on its way when the pause came is restarted while paused,
/// not left configured (holding our provisioning lock) to be configured
/// again after the resume: the node tier saw 8 of 1,000 nodes configured
/// twice so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_lets_configured_nodes_restart_and_configures_none_twice() {
    restarts_go_out_through(PauseReason::Requested, 1500).await;
}

/// The same for a lost leadership term: a leader whose broker went away
/// between a node's `configure` and its `restart` left it configured for
/// the next leader to configure again (the cluster tier saw it). Its
/// restarts go out within the grace after the loss (the configures are
/// answered 400 ms late, inside it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_term_lets_configured_nodes_restart_and_configures_none_twice() {
    restarts_go_out_through(PauseReason::Election, 400).await;
}

/// Waits until `n` configure requests went out to the nodes, as seen on
/// the broker (before any is answered, where the fleet's journal is).
async fn configure_requests_seen(nats: &NatsServer, n: usize, within: Duration) {
    use futures::StreamExt;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut requests = client.subscribe("provisioning.node.>").await.unwrap();
    let deadline = tokio::time::Instant::now() + within;
    let mut seen = std::collections::HashSet::new();
    while seen.len() < n {
        let msg = tokio::time::timeout_at(deadline, requests.next())
            .await
            .unwrap_or_else(|_| panic!("{} of {n} configure requests seen", seen.len()))
            .expect("the subscription goes on");
        let Ok(req) =
            choria_wire::protocol::decode_request(&msg.payload, choria_wire::protocol::Version::V1)
        else {
            continue;
        };
        let body: Value = serde_json::from_slice(&req.payload()).unwrap_or(Value::Null);
        if body["action"] == "configure" {
            seen.insert(msg.subject.to_string());
        }
    }
}

/// Closes the gate for `reason` while every node's `configure` is in
/// flight: each is restarted while it is closed, and none is configured
/// again after it opens.
async fn restarts_go_out_through(reason: PauseReason, slow_ms: u64) {
    const N: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    // A node answers each request `slow_ms` late: its configure is in
    // flight that long, and the gate closes inside it.
    let fleet = RunningFleet::start(FleetOptions {
        connections: 2,
        slow_nodes: N,
        slow_delay_ms: slow_ms,
        ..fleet_options(&nats, dir.path(), N)
    })
    .await;
    let template =
        "workers: 16\nconfiguration_template:\n  configuration:\n    identity: '{{ identity }}'\n";
    // An elected replica starts paused for the election until it wins.
    let p = start(dir.path(), &nats, template, |h| {
        if reason == PauseReason::Election {
            h.pause(PauseReason::Election, true)
        }
    });
    if reason == PauseReason::Election {
        p.steering.resume(PauseReason::Election);
    }
    let journal_path = dir.path().join("journal.jsonl");
    let count =
        |action: &str| actions(&crate::support::read_journal_so_far(&journal_path), action).count();
    // Every configure request on its way (each is answered 1.5 s later):
    // the gate closes with all of them in flight.
    configure_requests_seen(&nats, N, Duration::from_secs(60)).await;
    assert_eq!(count("configure"), 0, "paused after configure was answered");
    p.steering.pause(reason, reason == PauseReason::Election);
    wait_actions(
        dir.path(),
        "restart",
        N,
        Duration::from_secs(20),
        "paused with their configure in flight, not all were restarted",
    )
    .await;
    p.steering.resume(reason);
    p.wait_for(
        "choria_provisioner_provisioned",
        N as f64,
        Duration::from_secs(30),
    )
    .await;
    // The resume discovers at once (the start's discovery was the first
    // round); through its window it finds nobody left in provisioning mode.
    p.wait_for(
        "choria_provisioner_discover_cycles",
        2.0,
        Duration::from_secs(10),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    p.stop().await;
    let (_, journal) = fleet.finish().await;
    assert_eq!(
        actions(&journal, "configure").count(),
        N,
        "configured once each"
    );
    assert_eq!(actions(&journal, "restart").count(), N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_from_a_lost_term_sends_nothing_more_even_after_an_immediate_rewin() {
    const N: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    // Each sequence has its first RPC in flight when leadership blips.
    let fleet = slow_fleet(&nats, dir.path(), N).await;
    let template = format!(
        "workers: {N}\nconfiguration_template:\n  configuration:\n    identity: \"{{{{ identity }}}}\"\n    plugin.choria.server.provision: \"false\"\n"
    );
    // An elected replica: paused for the election until it wins.
    let p = start(dir.path(), &nats, &template, |h| {
        h.pause(PauseReason::Election, true)
    });
    p.steering.resume(PauseReason::Election);
    p.wait_for(
        "choria_provisioner_sequences",
        N as f64,
        Duration::from_secs(20),
    )
    .await;
    // Lost and won again at once (a Lease blip, an expired Streams key we
    // take back) while every node's inventory request is in flight.
    let journal_path = dir.path().join("journal.jsonl");
    assert_eq!(
        actions(
            &crate::support::read_journal_so_far(&journal_path),
            "inventory"
        )
        .count(),
        0,
        "the blip comes while the first requests are still in flight"
    );
    p.steering.pause(PauseReason::Election, true);
    p.steering.resume(PauseReason::Election);
    p.wait_for(
        "choria_provisioner_provisioned",
        N as f64,
        Duration::from_secs(60),
    )
    .await;
    // Give an old sequence that wrongly carried on time to send its
    // configure (one more slow request).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let errors = p.metric("choria_provisioner_provision_errors");
    p.stop().await;
    let (_, journal) = fleet.finish().await;
    for node in &fleet_identities(&journal) {
        let of = |action: &str| {
            actions(&journal, action)
                .filter(|e| e["node"] == node.as_str())
                .count()
        };
        assert_eq!(
            of("inventory"),
            2,
            "{node}: one inventory from each term's sequence"
        );
        assert_eq!(
            of("configure"),
            1,
            "{node}: configured by the new term's sequence only"
        );
        assert_eq!(of("restart"), 1, "{node}: restarted once");
    }
    assert_eq!(
        errors, 0.0,
        "the old term's sequences stopped as a pause, not an error"
    );
}

/// Every node that appears in the journal's actions.
fn fleet_identities(journal: &[Value]) -> std::collections::BTreeSet<String> {
    journal
        .iter()
        .filter(|e| e["kind"] == "action")
        .filter_map(|e| e["node"].as_str().map(str::to_string))
        .collect()
}

/// The tests of this tier that want the machine to themselves: they load
/// both cores, and their bounds were measured without other tests beside
/// them. `scripts/test.sh` runs them after the rest, one at a time.
mod alone {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_discovery_round_finds_a_ten_thousand_node_fleet() {
        const N: usize = 10_000;
        let dir = tempfile::tempdir().unwrap();
        let nats = NatsServer::start();
        let fleet = fleet(&nats, dir.path(), N).await;
        // Default discovery timing; two workers keep the work that follows cheap.
        let helper = format!("helper: {} fleet-helper\nworkers: 2\n", binary());
        let started = Instant::now();
        let p = start(dir.path(), &nats, &helper, |_| {});
        p.wait_for(
            "choria_provisioner_discover_cycles",
            1.0,
            Duration::from_secs(10),
        )
        .await;
        // Every name of the one round is registered (waiting in its lane, being
        // worked, or held after it was provisioned): with two workers their
        // sequences take minutes, the round does not.
        p.wait_for(
            "choria_provisioner_waiting_nodes",
            N as f64,
            Duration::from_secs(30),
        )
        .await;
        let took = started.elapsed();
        assert_eq!(p.metric("choria_provisioner_discover_cycles"), 1.0);
        assert_eq!(p.metric("choria_provisioner_event_discovered"), 0.0);
        println!("first discovery found {N} nodes; {took:?} after start");
        p.stop().await;
        drop(fleet);
    }
}

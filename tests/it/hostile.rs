//! The hostile-node tier: misbehaving machines in the provisioning
//! collective (tests/support/hostile.rs) beside a healthy simulated fleet,
//! against the real `choria-provisioner run`. In every case the process
//! stays up and connected, every healthy node is provisioned exactly once
//! (from the fleet's journal), each hostile class is counted in its metric,
//! and no key material or certificate goes to a node that did not ask.

use crate::support::hostile::{self, Actor, Mode};
use crate::support::provisioner::{binary, ProvisionerProcess};
use crate::support::{NatsServer, RunningFleet};
use choria_core::provision::pipeline::lanes::IN_FLIGHT;
use choria_core::provision::pipeline::registry::{Lane, EVENT_QUEUE};
use choria_core::provision::suspects::NODE_LOG_BURST;
use choria_fleet::ca::CertificateAuthority;
use choria_fleet::FleetOptions;
use choria_wire::client::BrokerOptions;
use choria_wire::protocol::Version;
use choria_wire::security::ed25519::Ed25519KeyPair;
use choria_wire::security::tokens::{ProvisioningClaims, TokenSigningKey};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const TOKEN: &str = "h0stile-t0ken";

/// A provisioner (jwt + pki, the reference helper signing with a CA and
/// shipping a key) and a healthy fleet on one broker.
struct Scene {
    dir: tempfile::TempDir,
    nats: NatsServer,
    fleet: Option<RunningFleet>,
    /// The hostile actors of `Setup::actors`, in order.
    actors: Vec<Actor>,
    p: ProvisionerProcess,
    /// When the provisioner was started.
    started: Instant,
}

/// What the actors of a scene may know before the provisioner starts.
struct Prelude<'a> {
    /// The healthy fleet's identities.
    identities: &'a [String],
    /// A provisioning JWT signed by the organisation, as a node would hold
    /// (an impostor that copied one from a real node has this much).
    stolen_jwt: String,
}

type Actors = Box<dyn FnOnce(&Prelude) -> Vec<(Version, Mode)>>;

struct Setup {
    nodes: usize,
    yaml: String,
    helper: Option<String>,
    fleet: Box<dyn FnOnce(&mut FleetOptions)>,
    /// Hostile actors, subscribed before the provisioner starts: one that
    /// joined later would miss the first requests of some node's sequence
    /// and see the rest of it, which is not the attack under test (CI saw a
    /// victim's configure this way).
    actors: Actors,
    /// Start the healthy fleet this long after the provisioner (its nodes
    /// then announce themselves with startup events) instead of before it.
    fleet_after: Option<Duration>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            nodes: 200,
            yaml: "features:\n  jwt: true\n  pki: true\n".into(),
            helper: None,
            fleet: Box::new(|_| {}),
            actors: Box::new(|_| Vec::new()),
            fleet_after: None,
        }
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// A provisioning JWT for the broker at `url`, signed by `issuer`.
fn stolen_jwt(issuer: &Ed25519KeyPair, url: &str) -> String {
    let claims = ProvisioningClaims::new_at(
        TOKEN,
        url,
        "",
        Duration::from_secs(3600),
        chrono::Utc::now().timestamp(),
    )
    .unwrap();
    TokenSigningKey::Ed25519(issuer.signing_key().clone())
        .sign(&claims)
        .unwrap()
}

impl Scene {
    async fn start(setup: Setup) -> Scene {
        let dir = tempfile::tempdir().unwrap();
        let nats = NatsServer::start();
        let issuer = Ed25519KeyPair::generate();
        let seed = dir.path().join("issuer.seed");
        std::fs::write(&seed, issuer.seed_hex()).unwrap();
        let ca = CertificateAuthority::generate("hostile test CA").unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.cert_pem()).unwrap();
        std::fs::write(dir.path().join("ca.key"), ca.key_pem()).unwrap();
        let key = choria_wire::security::csr::generate_rsa_key(1024).unwrap();
        std::fs::write(
            dir.path().join("node.key"),
            choria_wire::security::csr::private_key_pkcs1_pem(&key).unwrap(),
        )
        .unwrap();
        let mut opts = FleetOptions {
            broker: BrokerOptions::at([nats.url()]),
            nodes: setup.nodes,
            token: TOKEN.into(),
            jwt_signer: Some(seed),
            journal: Some(dir.path().join("journal.jsonl")),
            key_pool_size: 4,
            ..Default::default()
        };
        (setup.fleet)(&mut opts);
        let identities: Vec<String> = (0..opts.nodes)
            .map(|i| choria_fleet::identity_for(&opts, i))
            .collect();
        let fleet = match setup.fleet_after {
            None => Some(RunningFleet::start(opts.clone()).await),
            Some(_) => None,
        };
        let prelude = Prelude {
            identities: &identities,
            stolen_jwt: stolen_jwt(&issuer, &nats.url()),
        };
        let mut actors = Vec::new();
        for (version, mode) in (setup.actors)(&prelude) {
            actors.push(Actor::start(&nats.url(), version, mode).await);
        }
        let helper = setup.helper.unwrap_or_else(|| {
            format!(
                "{} fleet-helper --ca-cert {} --ca-key {} --key-file {}",
                binary(),
                s(&dir.path().join("ca.pem")),
                s(&dir.path().join("ca.key")),
                s(&dir.path().join("node.key"))
            )
        });
        let yaml = format!(
            "workers: 16\ntoken: {TOKEN}\nsite: hostile\nhelper: {helper:?}\nchoria_insecure: true\nloglevel: info\n\
             rpc_timeout: 3s\ndiscovery_window: 500ms\njwt_verify_cert: {}\n{}",
            issuer.public_hex(),
            setup.yaml
        );
        let choria = format!(
            "identity = provisioner.hostile\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
            nats.url()
        );
        let p = ProvisionerProcess::start(dir.path(), &yaml, &choria, &[]);
        let started = Instant::now();
        let fleet = match (fleet, setup.fleet_after) {
            (Some(f), _) => f,
            (None, after) => {
                tokio::time::sleep(after.unwrap_or_default()).await;
                RunningFleet::start(opts).await
            }
        };
        Scene {
            dir,
            nats,
            fleet: Some(fleet),
            actors,
            p,
            started,
        }
    }

    fn journal_path(&self) -> PathBuf {
        self.dir.path().join("journal.jsonl")
    }

    /// Waits until every node in `nodes` came back as a provisioned server.
    async fn wait_servers(&mut self, nodes: &HashSet<String>, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let back: HashSet<String> = crate::support::read_journal_so_far(&self.journal_path())
                .iter()
                .filter(|e| {
                    e["kind"] == "event" && e["event"] == "startup" && e["component"] == "server"
                })
                .map(|e| e["node"].as_str().unwrap().to_string())
                .collect();
            let missing = nodes.difference(&back).count();
            if missing == 0 {
                return;
            }
            assert!(
                self.p.is_running(),
                "the provisioner exited; log:\n{}",
                self.p.logs_tail(40)
            );
            assert!(
                Instant::now() < deadline,
                "{missing} of {} nodes not provisioned within {timeout:?}; log tail:\n{}",
                nodes.len(),
                self.p.logs_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    fn metric(&self, name: &str, labels: &str) -> f64 {
        let (_, body) = self.p.get("/metrics");
        body.lines()
            .filter(|l| l.starts_with(name) && l.contains(labels))
            .filter(|l| l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Stops everything; the journal and the log.
    async fn finish(mut self) -> (Vec<Value>, String) {
        self.p.signal("TERM");
        let status = self.p.wait_exit(Duration::from_secs(10));
        assert!(status.success(), "exit status {status}");
        let logs = self.p.logs();
        let (_, journal) = self.fleet.take().unwrap().finish().await;
        (journal, logs)
    }
}

/// OK answers to `action`, per node, from the journal.
fn ok_counts(journal: &[Value], action: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for e in journal {
        if e["kind"] == "action" && e["action"] == action && e["outcome"] == "ok" {
            *counts
                .entry(e["node"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
    }
    counts
}

/// Every node in `nodes` was configured and restarted exactly once.
fn assert_provisioned_once(journal: &[Value], nodes: &HashSet<String>) {
    let configured = ok_counts(journal, "configure");
    let restarted = ok_counts(journal, "restart");
    for n in nodes {
        assert_eq!(configured.get(n), Some(&1), "{n} configure count");
        assert_eq!(restarted.get(n), Some(&1), "{n} restart count");
    }
}

/// The process stayed connected the whole time.
fn assert_never_disconnected(logs: &str) {
    assert!(
        !logs.contains("disconnected from the broker"),
        "the provisioner lost its broker connection:\n{}",
        logs.lines()
            .filter(|l| l.contains("disconnect") || l.contains("control line"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let longest = logs.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 4096, "a log line of {longest} bytes");
}

fn all(fleet: &RunningFleet) -> HashSet<String> {
    fleet.identities.iter().cloned().collect()
}

/// The first `n` of a fleet's identities: the nodes an actor preys on.
fn victims_of(identities: &[String], n: usize) -> HashSet<String> {
    identities.iter().take(n).cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impostor_answering_for_others_under_its_own_name_is_ignored() {
    // The count below is of impostor replies that arrived while the
    // provisioner waited for the node's own. With nodes that answer at once
    // a node could finish its sequence before the impostor's replies to it
    // landed (a fresh machine's run counted 185 of 200), so every node
    // answers each request 600 ms late: the impostor, which answers at
    // once, is always heard first, and what is counted is what is ignored.
    let mut scene = Scene::start(Setup {
        actors: Box::new(|_| vec![(Version::V1, Mode::OwnName("impostor.example.net".into()))]),
        fleet: Box::new(|o| {
            o.slow_nodes = o.nodes;
            o.slow_delay_ms = 600;
        }),
        ..Setup::default()
    })
    .await;
    let nodes = all(scene.fleet.as_ref().unwrap());
    scene.wait_servers(&nodes, Duration::from_secs(120)).await;
    let ignored = scene.metric(
        "choria_provisioner_ignored_replies",
        "reason=\"other_sender\"",
    );
    assert!(ignored >= nodes.len() as f64, "other_sender {ignored}");
    assert_eq!(scene.metric("choria_provisioner_provision_errors", ""), 0.0);
    assert!(
        scene.actors[0]
            .published
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    let (journal, logs) = scene.finish().await;
    assert_provisioned_once(&journal, &nodes);
    assert_never_disconnected(&logs);
    assert!(
        logs.contains("impostor.example.net"),
        "the ignored replies are logged with their sender"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impostor_in_a_victims_name_is_caught_and_gets_no_key_or_certificate() {
    // The window must outlast the skew between the two answers: beside the
    // flood test on 2 cores the victim's or the impostor's reply came more
    // than the default 500 ms after the other (CI, twice), and a second
    // answer after the window is, by design, not seen (Security, "What remains":
    // the trust-on-first-use limit).
    let mut scene = Scene::start(Setup {
        yaml: "features:\n  jwt: true\n  pki: true\nreply_window: 3s\n".into(),
        actors: Box::new(|p| {
            vec![(
                Version::V1,
                Mode::VictimName {
                    victims: victims_of(p.identities, 15),
                    jwt: p.stolen_jwt.clone(),
                },
            )]
        }),
        ..Setup::default()
    })
    .await;
    let fleet = scene.fleet.as_ref().unwrap();
    let victims = victims_of(&fleet.identities, 15);
    let healthy: HashSet<String> = all(fleet).difference(&victims).cloned().collect();
    scene.wait_servers(&healthy, Duration::from_secs(120)).await;
    // Each victim was aborted at least once as a security event.
    let deadline = Instant::now() + Duration::from_secs(60);
    while scene.metric("choria_provisioner_conflicting_replies", "") < victims.len() as f64 {
        assert!(
            Instant::now() < deadline,
            "{} conflicts counted for {} victims",
            scene.metric("choria_provisioner_conflicting_replies", ""),
            victims.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing of value went out for a victim while two parties claim it.
    for v in &victims {
        assert_eq!(
            scene.actors[0].seen_for(v, "configure"),
            0,
            "configure sent to {v}"
        );
    }
    let (journal, logs) = scene.finish().await;
    assert_provisioned_once(&journal, &healthy);
    let configured = ok_counts(&journal, "configure");
    for v in &victims {
        assert_eq!(configured.get(v), None, "{v} was configured");
    }
    assert!(
        logs.lines()
            .any(|l| l.contains("SECURITY") && victims.iter().any(|v| l.contains(v))),
        "the conflict is logged naming the node"
    );
    assert_never_disconnected(&logs);
}

/// The inventory carries the facts (and any instance evidence) a node's
/// configuration and admission are decided on. With nothing else asked of
/// the node (no JWT, no CSR), an impostor answering it in a victim's name
/// is caught as any trusted answer is: its name is not provisioned this
/// cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impostor_answering_the_inventory_in_a_victims_name_is_caught() {
    let mut scene = Scene::start(Setup {
        yaml: "features:\n  jwt: false\n  pki: false\nreply_window: 3s\n".into(),
        // Configuration only: no key or certificate to send.
        helper: Some(format!("{} fleet-helper", binary())),
        actors: Box::new(|p| {
            vec![(
                Version::V1,
                Mode::VictimName {
                    victims: victims_of(p.identities, 10),
                    jwt: p.stolen_jwt.clone(),
                },
            )]
        }),
        ..Setup::default()
    })
    .await;
    let fleet = scene.fleet.as_ref().unwrap();
    let victims = victims_of(&fleet.identities, 10);
    let healthy: HashSet<String> = all(fleet).difference(&victims).cloned().collect();
    scene.wait_servers(&healthy, Duration::from_secs(120)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while scene.metric("choria_provisioner_conflicting_replies", "") < victims.len() as f64 {
        assert!(
            Instant::now() < deadline,
            "{} conflicts counted for {} victims",
            scene.metric("choria_provisioner_conflicting_replies", ""),
            victims.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (journal, logs) = scene.finish().await;
    assert_provisioned_once(&journal, &healthy);
    let configured = ok_counts(&journal, "configure");
    for v in &victims {
        assert_eq!(configured.get(v), None, "{v} was configured");
    }
    assert!(
        logs.lines()
            .any(|l| l.contains("SECURITY") && l.contains("rpcutil#inventory")),
        "the conflict names the inventory"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlong_and_malformed_identities_are_refused_and_the_connection_holds() {
    let bad: Vec<String> = vec![
        "x".repeat(8192),
        "node.*".into(),
        "node.>".into(),
        "node with spaces".into(),
        "a..b".into(),
        String::new(),
        "evil\u{1b}[31m.example.net".into(),
    ];
    let names = bad.clone();
    let mut scene = Scene::start(Setup {
        actors: Box::new(move |_| vec![(Version::V1, Mode::BadDiscoveryNames(names))]),
        ..Setup::default()
    })
    .await;
    hostile::bad_startup_events(&scene.nats.url(), &bad, 20).await;
    let nodes = all(scene.fleet.as_ref().unwrap());
    scene.wait_servers(&nodes, Duration::from_secs(120)).await;
    // Every event is refused, counted once the provisioner has read it
    // (with other tests beside it, not always by the time the nodes are).
    let sent = (bad.len() * 20) as f64;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = scene.metric("choria_provisioner_rejected_identities", "source=\"event\"");
        if events >= sent {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "events refused: {events} of {sent}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A reply without any sender says nothing of who sent it: that one
    // counts as undecodable instead.
    let named = bad.iter().filter(|n| !n.is_empty()).count() as f64;
    let deadline = Instant::now() + Duration::from_secs(90);
    while scene.metric(
        "choria_provisioner_rejected_identities",
        "source=\"discovery\"",
    ) < named
        || scene.metric(
            "choria_provisioner_ignored_replies",
            "reason=\"undecodable\"",
        ) < 1.0
    {
        assert!(
            Instant::now() < deadline,
            "discovery replies with bad names not refused"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (journal, logs) = scene.finish().await;
    assert_provisioned_once(&journal, &nodes);
    assert_never_disconnected(&logs);
    assert!(
        !logs.contains(&"x".repeat(100)),
        "a raw long name was logged"
    );
    assert!(
        !logs.contains('\u{1b}'),
        "an escape sequence reached the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_replies_and_replies_to_other_requests_are_ignored() {
    // A wrong-id reply is counted only while the provisioner still waits on
    // that request. Victims that answer at once could finish first (as in
    // the impostor test, 185 of 200), so the 30 victims answer each
    // request 600 ms late and the actor's reply lands inside that wait.
    let mut scene = Scene::start(Setup {
        fleet: Box::new(|o| {
            o.slow_nodes = 30;
            o.slow_delay_ms = 600;
        }),
        actors: Box::new(|p| {
            vec![
                (Version::V1, Mode::Echo),
                (
                    Version::V1,
                    Mode::WrongRequestId {
                        victims: victims_of(p.identities, 30),
                    },
                ),
            ]
        }),
        ..Setup::default()
    })
    .await;
    let victims = victims_of(&scene.fleet.as_ref().unwrap().identities, 30);
    let nodes = all(scene.fleet.as_ref().unwrap());
    scene.wait_servers(&nodes, Duration::from_secs(120)).await;
    assert!(scene.metric("choria_provisioner_ignored_replies", "reason=\"duplicate\"") > 0.0);
    assert!(
        scene.metric(
            "choria_provisioner_ignored_replies",
            "reason=\"wrong_request\""
        ) >= victims.len() as f64
    );
    assert_eq!(
        scene.metric("choria_provisioner_conflicting_replies", ""),
        0.0
    );
    let (journal, logs) = scene.finish().await;
    assert_provisioned_once(&journal, &nodes);
    assert_never_disconnected(&logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_slower_than_the_interval_is_never_worked_twice_at_once() {
    // Three directed requests of 25 s each: inventory, configure, restart.
    // The sequence outlasts the 1 m interval, so the second discovery finds
    // the slow nodes still in provisioning mode while they are being worked.
    let mut scene = Scene::start(Setup {
        nodes: 40,
        yaml: "interval: 1m\nrpc_timeout: 40s\n".into(),
        helper: Some(format!("{} fleet-helper", binary())),
        fleet: Box::new(|o| {
            o.slow_nodes = 4;
            o.slow_delay_ms = 25_000;
        }),
        ..Setup::default()
    })
    .await;
    let nodes = all(scene.fleet.as_ref().unwrap());
    let slow: Vec<String> = scene.fleet.as_ref().unwrap().identities[..4].to_vec();
    scene.wait_servers(&nodes, Duration::from_secs(200)).await;
    assert!(scene.metric("choria_provisioner_discover_cycles", "") >= 2.0);
    assert_eq!(
        scene.metric("choria_provisioner_provision_errors", ""),
        0.0,
        "a second sequence on a node being worked fails once the node has left provisioning"
    );
    let (journal, logs) = scene.finish().await;
    assert_provisioned_once(&journal, &nodes);
    for slow in &slow {
        let sequences = logs
            .lines()
            .filter(|l| l.contains(": provisioning ") && l.contains(slow.as_str()))
            .count();
        assert_eq!(sequences, 1, "{slow} was worked by {sequences} sequences");
        assert_eq!(
            ok_counts(&journal, "inventory").get(slow),
            Some(&1),
            "{slow} inventory count"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_that_forks_and_hangs_is_killed_with_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    std::fs::create_dir(&pids).unwrap();
    // For nodes 000-004 the helper leaves a child behind and hangs; the
    // others get the reference helper's answer.
    let script = dir.path().join("helper.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ninput=$(cat)\ncase \"$input\" in\n  *node-00[0-4].*) sleep 300 & echo $! > {p}/$$.tmp && mv {p}/$$.tmp {p}/$$; sleep 300 ;;\n  *) printf '%s' \"$input\" | exec {bin} fleet-helper ;;\nesac\n",
            p = s(&pids),
            bin = binary()
        ),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .args(["+x", &s(&script)])
        .status()
        .unwrap();
    let mut scene = Scene::start(Setup {
        nodes: 60,
        yaml: "helper_timeout: 2s\n".into(),
        helper: Some(s(&script)),
        ..Default::default()
    })
    .await;
    let nodes = all(scene.fleet.as_ref().unwrap());
    let healthy: HashSet<String> = nodes
        .iter()
        .filter(|n| !(0..5).any(|i| n.contains(&format!("node-00{i}."))))
        .cloned()
        .collect();
    scene.wait_servers(&healthy, Duration::from_secs(120)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while scene.metric("choria_provisioner_helper_errors", "") < 5.0 {
        assert!(
            Instant::now() < deadline,
            "the hanging helpers did not time out"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every child the hanging helpers left behind is gone (the group kill
    // follows the timeout at once, but is not instant: poll for it). A pid
    // file is written under a temporary name and renamed, so one that is
    // there is whole.
    let recorded: Vec<u32> = std::fs::read_dir(&pids)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_none())
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            text.trim()
                .parse()
                .unwrap_or_else(|e| panic!("{}: {text:?} is not a pid: {e}", f.display()))
        })
        .collect();
    assert!(recorded.len() >= 5, "{recorded:?}");
    let alive = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    for pid in recorded {
        while alive(pid) {
            assert!(
                Instant::now() < deadline,
                "the hanging helper's child {pid} still runs 10 s after the helpers timed out"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let (journal, logs) = scene.finish().await;
    assert_provisioned_once(&journal, &healthy);
    assert_never_disconnected(&logs);
}

#[derive(Clone, Copy)]
enum Pick {
    First,
    Last,
}

/// A scene of `nodes` with a forger publishing shutdowns for 20 of them
/// twice a second; returns when the others and when the victims were all
/// provisioned, after asserting the bound (one discovery interval after
/// the others), that repeats are counted, and that each was provisioned once.
async fn forged_shutdowns(nodes: usize, pick: Pick) -> (Duration, Duration) {
    const INTERVAL: Duration = Duration::from_secs(60);
    let choose = move |ids: &[String]| -> HashSet<String> {
        match pick {
            Pick::First => victims_of(ids, 20),
            Pick::Last => ids.iter().rev().take(20).cloned().collect(),
        }
    };
    let choose2 = choose;
    let mut scene = Scene::start(Setup {
        nodes,
        actors: Box::new(move |p| {
            vec![(
                Version::V1,
                Mode::ForgedShutdowns {
                    victims: choose2(p.identities).into_iter().collect(),
                    per_second: 2,
                },
            )]
        }),
        ..Setup::default()
    })
    .await;
    let started = Instant::now();
    let fleet = scene.fleet.as_ref().unwrap();
    let victims = choose(&fleet.identities);
    let others: HashSet<String> = all(fleet).difference(&victims).cloned().collect();
    scene.wait_servers(&others, Duration::from_secs(120)).await;
    let others_took = started.elapsed();
    // The bound: one interval after the others, and the 20 s a discovery
    // and their sequences take on this machine at most (measured: ~2 s).
    scene
        .wait_servers(&victims, others_took + INTERVAL + Duration::from_secs(20))
        .await;
    let victims_took = started.elapsed();
    let ignored = scene.metric("choria_provisioner_ignored_shutdowns", "");
    let sent = scene.actors[0]
        .published
        .load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "forged shutdowns ({sent} sent, {ignored} ignored): {} nodes provisioned after {others_took:.1?}, \
         the 20 victims after {victims_took:.1?} (delayed {:.1?}; interval {INTERVAL:?})",
        others.len(),
        victims_took.saturating_sub(others_took)
    );
    assert!(ignored > 0.0, "repeated hints are ignored and counted");
    let (journal, logs) = scene.finish().await;
    assert_provisioned_once(&journal, &victims);
    assert_provisioned_once(&journal, &others);
    assert_never_disconnected(&logs);
    (others_took, victims_took)
}

/// The tests of this tier that want the machine to themselves: they load
/// both cores, and their bounds were measured without other tests beside
/// them. `scripts/test.sh` runs them after the rest, one at a time.
mod alone {
    use super::*;

    /// Starvation is measured, not assumed: the same 500 real nodes are first
    /// provisioned without the flood, then with it, in this test, on this
    /// machine as loaded as it is now; flooded, they must take at most twice as
    /// long or 10 s longer, whichever is more. The flood lasts through that whole
    /// allowance (at least 20 s), so a provisioner starved for longer fails.
    /// The floor is measured: flooded runs took 1.03–1.12 times the calm one
    /// (about 5 s), but twice a 5 s run left one stall of a loaded machine
    /// (a node's retry after the scene's 3 s `rpc_timeout`, a CI neighbour)
    /// enough to fail a provisioner that was never starved.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_startup_events_for_made_up_nodes_does_not_starve_real_ones() {
        const NODES: usize = 500;
        let calm = {
            let mut scene = Scene::start(Setup {
                nodes: NODES,
                ..Default::default()
            })
            .await;
            let nodes = all(scene.fleet.as_ref().unwrap());
            let t = Instant::now();
            scene.wait_servers(&nodes, Duration::from_secs(180)).await;
            let took = t.elapsed();
            let (journal, logs) = scene.finish().await;
            assert_provisioned_once(&journal, &nodes);
            assert_never_disconnected(&logs);
            took
        };
        let allowed = (calm * 2).max(calm + Duration::from_secs(10));
        let flood_for = (allowed + Duration::from_secs(2)).max(Duration::from_secs(20));
        let mut scene = Scene::start(Setup {
            nodes: NODES,
            ..Default::default()
        })
        .await;
        let url = scene.nats.url();
        // CHORIA_HOSTILE_FLOOD_RATE measures other rates (Contributing: the worst case).
        let per_second: u64 = std::env::var("CHORIA_HOSTILE_FLOOD_RATE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5_000);
        let flood = tokio::spawn(async move {
            hostile::flood_startup_events(&url, per_second, flood_for).await
        });
        let nodes = all(scene.fleet.as_ref().unwrap());
        let t = Instant::now();
        // Waits no longer than the allowance (plus one poll of the journal).
        scene
            .wait_servers(&nodes, allowed + Duration::from_secs(1))
            .await;
        let took = t.elapsed();
        let sent = flood.await.unwrap();
        // Let the confirmation stage drain.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let unconfirmed = scene.metric("choria_provisioner_unconfirmed_events", "");
        let dropped = scene.metric("choria_provisioner_dropped_events", "");
        let queued_by_events = scene.metric("choria_provisioner_event_discovered", "");
        println!(
            "flood: {sent} fake startup events in {flood_for:.1?} ({per_second}/s); {unconfirmed} unconfirmed, {dropped} dropped; \
             {NODES} real nodes provisioned in {took:.1?} flooded, {calm:.1?} calm ({:.2}x)",
            took.as_secs_f64() / calm.as_secs_f64()
        );
        assert!(
            took <= allowed,
            "flooded, the real nodes took {took:.1?}: more than the {allowed:.1?} allowed (twice the {calm:.1?} they took without the flood, at least 10 s more)"
        );
        // Every fake event was dropped, refused after its ping, or is still
        // waiting in the bounded confirmation stage: none reached the queue.
        let in_flight = |lane: Lane| IN_FLIGHT.iter().find(|(l, _)| *l == lane).unwrap().1;
        let in_stage = (EVENT_QUEUE + in_flight(Lane::Events) + in_flight(Lane::Suspect)) as f64;
        assert!(
            unconfirmed + dropped + in_stage >= sent as f64,
            "fake events accounted for: {unconfirmed} + {dropped} (+ at most {in_stage} pending) of {sent}"
        );
        assert!(
            dropped > 0.0,
            "a flood this size overflows the bounded stage"
        );
        assert!(
            queued_by_events <= nodes.len() as f64,
            "only real nodes are queued from events: {queued_by_events}"
        );
        let (journal, logs) = scene.finish().await;
        assert_provisioned_once(&journal, &nodes);
        assert_never_disconnected(&logs);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forged_discovery_names_cannot_stall_real_nodes_that_start_after_them() {
        // One connection answers every broadcast discovery with 20,000 made-up
        // (well-formed) names; 500 real nodes start 5 s later and announce
        // themselves. Before the confirmation stage 0 of them were provisioned
        // in 100 s: the made-up names held every worker for 3 x rpc_timeout.
        const FORGED: usize = 20_000;
        let forged: Vec<String> = (0..FORGED)
            .map(|i| format!("forged-{i:05}.example.net"))
            .collect();
        // The scene's 3 s rpc_timeout is no margin here: answering 20,000
        // names a discovery keeps both cores busy, and a CI run saw one real
        // node's configure answered after 3 s and sent again (provisioned
        // twice, though never stalled). A reply 10 s late is a stall.
        let mut scene = Scene::start(Setup {
            nodes: 500,
            yaml: format!("{}rpc_timeout: 10s\n", Setup::default().yaml),
            fleet_after: Some(Duration::from_secs(5)),
            actors: Box::new(move |_| vec![(Version::V1, Mode::BadDiscoveryNames(forged))]),
            ..Setup::default()
        })
        .await;
        // Scene::start returns once every real node announced itself.
        let started = Instant::now();
        let nodes = all(scene.fleet.as_ref().unwrap());
        scene.wait_servers(&nodes, Duration::from_secs(60)).await;
        let took = started.elapsed();
        // Each forged name is refused when its first request times out:
        // wait for a lane's worth of them, however fast the real nodes were.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut unconfirmed = 0.0;
        while unconfirmed < 512.0 && Instant::now() < deadline {
            unconfirmed = scene.metric("choria_provisioner_unconfirmed_discoveries", "");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let queued = scene.metric("choria_provisioner_discovered", "")
            + scene.metric("choria_provisioner_event_discovered", "");
        println!(
            "forged discovery: {FORGED} names per discovery; 500 real nodes provisioned {took:.1?} after they started; {unconfirmed} forged names unconfirmed so far"
        );
        // At least a discovery lane's worth (512) asked and refused, each
        // after the 10 s timeout: the forged names were pinged, not queued.
        assert!(
            unconfirmed >= 512.0,
            "the forged names were pinged and refused: {unconfirmed}"
        );
        assert!(
            queued <= nodes.len() as f64,
            "only real nodes reached the work queue: {queued}"
        );
        assert_eq!(
            scene.metric("choria_provisioner_provision_errors", ""),
            0.0,
            "no forged name ever held a worker"
        );
        let (journal, logs) = scene.finish().await;
        assert_provisioned_once(&journal, &nodes);
        assert_never_disconnected(&logs);
        let forged_lines: Vec<&str> = logs.lines().filter(|l| l.contains("forged-")).collect();
        assert!(
            forged_lines.len() < 50,
            "{} log lines name forged nodes, such as\n{}",
            forged_lines.len(),
            forged_lines[..3.min(forged_lines.len())].join("\n")
        );
    }

    /// Made-up names that look alive and then stall: they answer discovery and
    /// every directed ping, half of them the `jwt` request too (with the
    /// fleet's provisioning JWT, which proves the fleet, not the node), and
    /// nothing after that. Before, a name that answered its confirmation ping
    /// held a worker for every timeout and retry of its first request: with
    /// 2,000 such names, 500 real nodes started after them were not provisioned
    /// at all in 100 s. Now a wait is a timer, a name that fails is retried
    /// behind names that have not, and no made-up name gets as far as the
    /// helper.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn made_up_names_that_answer_and_then_stall_cannot_hold_up_real_nodes() {
        const FORGED: usize = 20_000;
        const REAL: usize = 500;
        let names = |prefix: &str| -> std::sync::Arc<HashSet<String>> {
            std::sync::Arc::new(
                (0..FORGED / 2)
                    .map(|i| format!("{prefix}-{i:05}.example.net"))
                    .collect(),
            )
        };
        let mut scene = Scene::start(Setup {
            nodes: REAL,
            fleet_after: Some(Duration::from_secs(5)),
            actors: Box::new(move |p| {
                vec![
                    (
                        Version::V1,
                        Mode::Stalling {
                            names: names("pinged"),
                            answers: vec![],
                            jwt: p.stolen_jwt.clone(),
                        },
                    ),
                    (
                        Version::V1,
                        Mode::Stalling {
                            names: names("replayed"),
                            answers: vec!["choria_provision#jwt"],
                            jwt: p.stolen_jwt.clone(),
                        },
                    ),
                ]
            }),
            ..Setup::default()
        })
        .await;
        // Scene::start returns once every real node announced itself.
        let started = Instant::now();
        let nodes = all(scene.fleet.as_ref().unwrap());
        scene.wait_servers(&nodes, Duration::from_secs(60)).await;
        let took = started.elapsed();
        let helper_runs = scene.metric("choria_provisioner_helper_time_count", "");
        let unconfirmed = scene.metric("choria_provisioner_unconfirmed_discoveries", "");
        let asked_jwt = scene.actors[1]
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.action == "jwt")
            .count();
        println!(
            "{FORGED} made-up names answering discovery and pings (half the jwt request too): \
             {REAL} real nodes provisioned {took:.1?} after they started; {unconfirmed} made-up names unconfirmed so far, \
             {asked_jwt} jwt requests to the replaying half, {helper_runs} helper runs"
        );
        assert!(
            helper_runs <= REAL as f64,
            "the helper ran {helper_runs} times for {REAL} real nodes: a made-up name reached it"
        );
        assert!(asked_jwt > 0, "the replaying names were asked and answered");
        let ran = scene.started.elapsed();
        let (journal, logs) = scene.finish().await;
        assert_provisioned_once(&journal, &nodes);
        assert_never_disconnected(&logs);
        // A name that never answered costs no log line; one that answered
        // `jwt` is a node like any other until it stalls (its steps are info
        // lines), but its failures are warned about at a bounded rate.
        let pinged: Vec<&str> = logs.lines().filter(|l| l.contains("pinged-")).collect();
        assert!(
            pinged.len() < 50,
            "{} log lines name never-confirmed nodes, such as\n{}",
            pinged.len(),
            pinged[..3.min(pinged.len())].join("\n")
        );
        let warned = logs
            .lines()
            .filter(|l| l.contains("replayed-") && (l.contains("WARN") || l.contains("ERROR")))
            .count();
        // Two kinds (attempts, failures), each NODE_LOG_BURST per ten seconds.
        let allowed = 2 * NODE_LOG_BURST as usize * (ran.as_secs() as usize / 10 + 1);
        assert!(
            warned <= allowed,
            "{warned} warnings and errors name made-up nodes in {ran:?}, more than the limit's {allowed}"
        );
    }

    /// Anyone may publish a `shutdown` event in any node's name. Before, one
    /// twice a second for 20 of 200 waiting nodes kept all 20 unprovisioned
    /// past a whole discovery interval (97 s), while the other 180 were
    /// provisioned. Now 200 nodes are all in their sequences at once (a lane
    /// holds 512 in flight) and a shutdown for a node being worked changes
    /// nothing: the victims are not delayed, and the repeats are counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forged_shutdown_events_delay_waiting_nodes_by_one_discovery_interval_at_most() {
        let (others, victims) = forged_shutdowns(200, Pick::First).await;
        // Not delayed at all (measured: 10-18 ms); the margin is the one
        // interval the bound allows.
        assert!(
            victims < others + Duration::from_secs(60),
            "victims after {victims:?}, the others after {others:?}"
        );
    }

    /// The same forger, with nodes that really wait in a lane: 700 nodes, so
    /// 188 wait behind the 512 in flight, and the victims are the last 20 the
    /// fleet answers with. A shutdown drops a waiting victim and holds it; the
    /// next discovery provisions it, one interval later at most.
    ///
    /// Whether a forgery (twice a second) lands while the victims wait is
    /// up to timing: on a quick run they may wait less than that (CI saw it
    /// once in seven runs: delayed 46 ms, the bound untested). A scene in
    /// which none was found waiting proves nothing, so it is played again,
    /// three times at most; every scene asserts the bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forged_shutdowns_for_nodes_waiting_in_a_lane_delay_them_one_interval_at_most() {
        let mut missed = Vec::new();
        for _ in 0..3 {
            let (others, victims) = forged_shutdowns(700, Pick::Last).await;
            if victims > others + Duration::from_secs(5) {
                return;
            }
            println!(
                "the forgeries did not find the victims waiting (after {victims:?}, the others \
                 after {others:?}); playing the scene again"
            );
            missed.push((others, victims));
        }
        panic!(
            "in three scenes the victims were never delayed (others, victims: {missed:?}): \
             the forgeries never found them waiting, and this test proved nothing"
        );
    }
}

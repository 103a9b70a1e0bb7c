//! Active-active (`election.mode: shards`) over the broker: replicas of
//! `choria-provisioner run` on a nats-server whose provisioning account
//! reproduces a stock Choria broker's (only the two election imports; the
//! heartbeats use a core subject of the account), a simulated fleet whose
//! journal records the sender (each replica's own member id) of every
//! request. Every node is configured exactly once; each replica works its
//! share; a replica killed (-9) or joining moves only its share.
//!
//! The same on the Lease backend against the real kube-apiserver is in
//! `tests/shards_lease.rs`.

use crate::support::election::choria_like_broker;
use crate::support::provisioner::{binary, ProvisionerProcess};
use crate::support::{NatsServer, RunningFleet};
use choria_fleet::FleetOptions;
use choria_wire::client::BrokerOptions;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// Membership timings of these tests: a member counts 6 s without
/// renewing, stops working after 4 s without, renews every second.
const TTL: Duration = Duration::from_secs(6);

/// The election block of the streams tests: heartbeats on a core subject.
const STREAMS: &str = "election:\n  mode: shards\n  backend: streams\n  name: shards-test\n  \
     lease_duration: 6s\n  renew_deadline: 4s\n  retry_period: 1s\n";

/// [`STREAMS`] on the default timings (15 s, 10 s, 2 s).
const STREAMS_DEFAULT_TIMINGS: &str =
    "election:\n  mode: shards\n  backend: streams\n  name: shards-test\n  \
     lease_duration: 15s\n  renew_deadline: 10s\n  retry_period: 2s\n";

/// The election block of the Lease test: a Lease per member.
const LEASES: &str = "election:\n  mode: shards\n  backend: lease\n  lease_name: shards-test\n  \
     lease_namespace: default\n  lease_duration: 6s\n  renew_deadline: 4s\n  retry_period: 1s\n";

/// A reply later than `rpc_timeout` is asked for again: a second
/// `configure` for one node, which the tests count as twice. On a loaded
/// machine replies took over 3 s (seen twice in one session); 10 s, as the provision
/// tier found, leaves them room.
fn yaml(workers: usize, election: &str) -> String {
    format!(
        "workers: {workers}\ninterval: 1m\nsite: shards\nchoria_insecure: true\nrpc_timeout: 10s\n\
         discovery_timeout: 2s\ndiscovery_window: 500ms\n{election}\
         configuration_template:\n  configuration:\n    identity: '{{{{ identity }}}}'\n    \
         plugin.choria.server.provision: 'false'\n"
    )
}

pub struct Replicas<'a> {
    dir: &'a Path,
    nats: &'a NatsServer,
    pub running: Vec<(String, ProvisionerProcess)>,
    started: usize,
    workers: usize,
    election: &'static str,
    env: Vec<(String, String)>,
    /// Extra command-line arguments of every replica.
    args: Vec<String>,
    /// Extra lines of every replica's provisioner.yaml.
    extra: String,
}

impl<'a> Replicas<'a> {
    fn new(dir: &'a Path, nats: &'a NatsServer, workers: usize) -> Self {
        crate::support::signing_key(dir);
        Replicas {
            dir,
            nats,
            running: Vec::new(),
            started: 0,
            workers,
            election: STREAMS,
            env: Vec::new(),
            args: Vec::new(),
            extra: String::new(),
        }
    }

    /// Starts a replica; all share one Choria identity, as replicas of one
    /// Deployment do.
    fn start(&mut self) {
        self.started += 1;
        let name = format!("r{}", self.started);
        // Each replica is a pod of its own, as in a Deployment.
        let mut env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        env.push(("POD_NAME", name.as_str()));
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let p = ProvisionerProcess::start_with_env(
            self.dir,
            &name,
            &format!(
                "{}{}",
                yaml(
                    self.workers,
                    &format!(
                        "{}  signing_key: {}\n",
                        self.election,
                        self.dir.join("signing.seed").display()
                    ),
                ),
                self.extra
            ),
            &format!(
                "identity = provisioner.shards.example.net\nplugin.choria.middleware_hosts = {}\n",
                self.nats.url()
            ),
            &args,
            &env,
        );
        self.running.push((name, p));
    }

    /// Waits until every running replica is working and sees `n` members.
    async fn settled(&mut self, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let ok = self.running.iter().all(|(_, p)| {
                p.metric("choria_provisioner_shard_members") == n as f64
                    && p.metric("choria_provisioner_paused") == 0.0
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the shards did not settle on {n} members within {timeout:?}:\n{}",
                self.running
                    .iter()
                    .map(|(n, p)| format!("--- {n}\n{}", p.logs_tail(10)))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn fleet_options(nats: &NatsServer, dir: &Path, prefix: &str, nodes: usize) -> FleetOptions {
    // Simulated servers send their provisioning JWT as a token, which an
    // account-based server would refuse; they log in as the provisioning user.
    FleetOptions {
        broker: BrokerOptions::at([nats.url().replace("nats://", "nats://prov:prov@")]),
        nodes,
        identity_prefix: prefix.into(),
        journal: Some(dir.join(format!("{prefix}journal.jsonl"))),
        key_pool_size: 2,
        connections: 4,
        ..Default::default()
    }
}

async fn fleet(nats: &NatsServer, dir: &Path, prefix: &str, nodes: usize) -> RunningFleet {
    RunningFleet::start(fleet_options(nats, dir, prefix, nodes)).await
}

/// Waits until every node of the journal at `path` came back as a server.
async fn wait_provisioned(path: &Path, nodes: usize, timeout: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let back = crate::support::server_startups(&crate::support::read_journal_so_far(path));
        if back >= nodes {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < timeout,
            "{back} of {nodes} provisioned within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Successful configures per node, and per sender (each replica's member id).
fn configures(journal: &[Value]) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let mut per_node = BTreeMap::new();
    let mut per_sender = BTreeMap::new();
    for e in journal
        .iter()
        .filter(|e| e["kind"] == "action" && e["action"] == "configure" && e["outcome"] == "ok")
    {
        *per_node
            .entry(e["node"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
        *per_sender
            .entry(e["sender"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    (per_node, per_sender)
}

fn assert_configured_once(journal: &[Value], nodes: usize) -> BTreeMap<String, usize> {
    let (per_node, per_sender) = configures(journal);
    assert_eq!(per_node.len(), nodes, "every node configured");
    let twice: Vec<_> = per_node.iter().filter(|(_, c)| **c != 1).collect();
    assert!(twice.is_empty(), "configured more than once: {twice:?}");
    per_sender
}

fn lock_refusals(r: &Replicas) -> f64 {
    r.running
        .iter()
        .map(|(_, p)| p.metric("choria_provisioner_lock_refusals"))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_the_fleet_and_survivors_take_over_a_killed_ones_share() {
    let dir = tempfile::tempdir().unwrap();
    let nats = choria_like_broker();
    let mut r = Replicas::new(dir.path(), &nats, 8);
    share_then_kill(dir.path(), &nats, &mut r, 3000, 1500).await;
}

/// The same on Kubernetes: a Lease per member on the real kube-apiserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_members_share_the_fleet_and_survivors_take_over_a_killed_ones_share() {
    let Some(bins) = crate::support::kube::ControlPlane::available() else {
        return;
    };
    let cp = crate::support::kube::ControlPlane::start(&bins);
    let kubeconfig = cp.kubeconfig(cp.admin_token());
    let dir = tempfile::tempdir().unwrap();
    let nats = choria_like_broker();
    // The replicas follow a Provisioner, as the operator's pods do, and
    // report themselves in its status.members.
    let crd = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/provisioner.yaml");
    cp.kubectl_ok(&["apply", "-f", crd]);
    cp.kubectl_ok(&[
        "wait",
        "--for",
        "condition=established",
        "crd/provisioners.provisioning.choria.io",
    ]);
    let resource = serde_json::json!({
        "apiVersion": "provisioning.choria.io/v1alpha1", "kind": "Provisioner",
        "metadata": {"name": "shards-test", "namespace": "default"},
        "spec": {"broker": {"urls": [nats.url()]}, "choriaInsecure": true,
                 "election": {"mode": "Shards"},
                 "nodeConfiguration": {"configuration": {"identity": "{{ identity }}"}}},
    });
    let out = cp.kubectl_stdin(&["apply", "-f", "-"], &resource.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut r = Replicas::new(dir.path(), &nats, 8);
    r.election = LEASES;
    r.env
        .push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
    r.args = vec!["--provisioner".into(), "default/shards-test".into()];
    share_then_kill(dir.path(), &nats, &mut r, 1500, 600).await;
    // status.members: the two survivors, each with what it provisioned (the
    // killed one's entry pruned once it left the membership).
    let members = |cp: &crate::support::kube::ControlPlane| {
        let p: Value = serde_json::from_str(&cp.kubectl_ok(&[
            "get",
            "provisioner",
            "shards-test",
            "-n",
            "default",
            "-o",
            "json",
        ]))
        .unwrap();
        p["status"]["members"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|m| {
                (
                    m["pod"].as_str().unwrap_or("?").to_string(),
                    m["provisioned"].as_f64().unwrap_or(-1.0),
                )
            })
            .collect::<BTreeMap<String, f64>>()
    };
    // The resource with who wrote what, for failure messages.
    let resource_yaml = |cp: &crate::support::kube::ControlPlane| {
        cp.kubectl_ok(&[
            "get",
            "provisioner",
            "shards-test",
            "-n",
            "default",
            "-o",
            "yaml",
            "--show-managed-fields",
        ])
    };
    let want = || -> BTreeMap<String, f64> {
        r.running
            .iter()
            .map(|(n, p)| (n.clone(), p.metric("choria_provisioner_provisioned")))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (seen, want) = (members(&cp), want());
        if seen == want {
            println!("status.members: {seen:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "status.members {seen:?}, want {want:?}\n{}\n{}",
            resource_yaml(&cp),
            r.running
                .iter()
                .map(|(n, p)| format!("--- {n}\n{}", p.logs_tail(15)))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Every member holds a Lease of its own, labelled with the group; the
    // killed one's stays until someone deletes it, the others leave theirs.
    let leases = cp.kubectl_ok(&[
        "get",
        "leases",
        "-n",
        "default",
        "-l",
        "provisioning.choria.io/shard-group=shards-test",
        "-o",
        "name",
    ]);
    assert_eq!(leases.lines().count(), 3, "{leases}");
    let mut logs = String::new();
    for (name, mut p) in r.running.drain(..) {
        p.signal("TERM");
        assert!(p.wait_exit(Duration::from_secs(5)).success());
        logs.push_str(&format!("--- {name}\n{}\n", p.logs_tail(8)));
    }
    let leases = cp.kubectl_ok(&[
        "get",
        "leases",
        "-n",
        "default",
        "-l",
        "provisioning.choria.io/shard-group=shards-test",
        "-o",
        "name",
    ]);
    assert_eq!(
        leases.lines().count(),
        1,
        "only the killed member's: {leases}"
    );
    // Members that stop take their entries with them.
    let left = members(&cp);
    assert!(
        left.is_empty(),
        "status.members after every replica stopped: {left:?}\n{}\n{logs}",
        resource_yaml(&cp)
    );
}

/// How long after a kill -9 both survivors may take to count 2 members.
/// The dead one's last renewal expires one TTL after a survivor saw it,
/// which can be up to a retry period (1 s) after the kill (the Lease
/// backend reads once a period), and it notices on its next pass: TTL + 2 s
/// by design. Measured 5.3-6.5 s (streams) and 5.5-7.4 s (Lease), idle and
/// at a load average of 8 on 2 cores; 2 s more for a slower moment.
const TAKEOVER: Duration = Duration::from_secs(TTL.as_secs() + 4);

/// How often a replica logged that its share grew (and discovered).
fn share_grew(p: &ProvisionerProcess) -> usize {
    p.logs().matches("our share grew; discovering").count()
}

/// Three replicas share `first` nodes; one is killed; the survivors count
/// it gone within [`TAKEOVER`], discover their grown shares at once, and
/// provision all of `late` new nodes (only they).
async fn share_then_kill(
    dir: &Path,
    nats: &NatsServer,
    r: &mut Replicas<'_>,
    first: usize,
    late: usize,
) {
    // For the "our share grew; discovering" line.
    r.extra.push_str("loglevel: info\n");
    for _ in 0..3 {
        r.start();
    }
    r.settled(3, Duration::from_secs(30)).await;
    let nodes = first;
    let first = fleet(nats, dir, "node-", nodes).await;
    let took = wait_provisioned(
        &dir.join("node-journal.jsonl"),
        nodes,
        Duration::from_secs(180),
    )
    .await;
    let (_, journal) = first.finish().await;
    let shares = assert_configured_once(&journal, nodes);
    println!("{nodes} nodes by 3 replicas in {took:.1?}: {shares:?}");
    assert_eq!(shares.len(), 3, "every replica worked: {shares:?}");
    for (sender, n) in &shares {
        let share = *n as f64 / nodes as f64;
        assert!(
            (0.25..=0.42).contains(&share),
            "{sender} configured {n} of {nodes}"
        );
    }

    // One replica dies; 1,500 new nodes start. The survivors take its
    // share once its membership expires (one TTL) and provision them all.
    let (name, mut dead) = r.running.remove(0);
    let grew: Vec<usize> = r.running.iter().map(|(_, p)| share_grew(p)).collect();
    dead.signal("KILL");
    dead.wait_exit(Duration::from_secs(10));
    let killed = Instant::now();
    // Watched while the fleet starts: on a loaded machine starting it can
    // take longer than the TTL.
    let starting = tokio::spawn(RunningFleet::start(fleet_options(nats, dir, "late-", late)));
    let takeover = loop {
        let members: Vec<f64> = r
            .running
            .iter()
            .map(|(_, p)| p.metric("choria_provisioner_shard_members"))
            .collect();
        if members == [2.0, 2.0] {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() <= TAKEOVER,
            "{name} killed; the survivors count {members:?} members after {TAKEOVER:?}:\n{}",
            r.running
                .iter()
                .map(|(n, p)| format!("--- {n}\n{}", p.logs_tail(10)))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let late_fleet = starting.await.unwrap();
    // How soon is throughput, not the takeover (8.6 s after the kill when
    // idle; under load a request can time out, and its node waits for the
    // next discovery, a minute): a deadline for liveness only.
    let took = wait_provisioned(
        &dir.join("late-journal.jsonl"),
        late,
        Duration::from_secs(90),
    )
    .await;
    println!(
        "{name} killed; the survivors took over {takeover:.1?} and provisioned {late} new nodes {:.1?} after the kill",
        killed.elapsed()
    );
    // Each discovered as its share grew: the interval's discovery (a
    // minute) would find the killed one's share too, but late.
    for ((n, p), before) in r.running.iter().zip(grew) {
        assert!(
            share_grew(p) > before,
            "{n} did not discover its grown share:\n{}",
            p.logs_tail(20)
        );
    }
    let (_, journal) = late_fleet.finish().await;
    let shares = assert_configured_once(&journal, late);
    assert!(shares.len() <= 2, "only survivors worked: {shares:?}");
    println!(
        "late nodes: {shares:?} in {took:.1?}; lock refusals {}",
        lock_refusals(r)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_joining_mid_run_takes_a_share_without_a_double_configure() {
    let dir = tempfile::tempdir().unwrap();
    let nats = choria_like_broker();
    // Two workers each and a helper that takes 50 ms, so the run is still
    // going when the third replica joins (slow nodes no longer slow a run
    // down: their replies are waited for without a worker).
    let mut r = Replicas::new(dir.path(), &nats, 2);
    r.extra = format!(
        "helper: sh -c 'sleep 0.05; exec {} fleet-helper'\n",
        binary()
    );
    r.start();
    r.start();
    r.settled(2, Duration::from_secs(30)).await;
    let nodes = 2000;
    let f = RunningFleet::start(FleetOptions {
        broker: BrokerOptions::at([nats.url().replace("nats://", "nats://prov:prov@")]),
        nodes,
        journal: Some(dir.path().join("journal.jsonl")),
        key_pool_size: 2,
        connections: 4,
        slow_nodes: nodes,
        slow_delay_ms: 20,
        ..Default::default()
    })
    .await;
    let path = dir.path().join("journal.jsonl");
    // Join once about a fifth is done.
    let deadline = Instant::now() + Duration::from_secs(120);
    while crate::support::server_startups(&crate::support::read_journal_so_far(&path)) < nodes / 5 {
        assert!(Instant::now() < deadline, "the run did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = crate::support::server_startups(&crate::support::read_journal_so_far(&path));
    r.start();
    let took = wait_provisioned(&path, nodes, Duration::from_secs(240)).await;
    println!("the rest provisioned {took:.1?} after the join");
    let (_, journal) = f.finish().await;
    let shares = assert_configured_once(&journal, nodes);
    println!(
        "joined after {before} of {nodes}; shares {shares:?}; lock refusals {}",
        lock_refusals(&r)
    );
    assert_eq!(shares.len(), 3, "the newcomer took a share: {shares:?}");
    let mut logs = String::new();
    for (name, mut p) in r.running.drain(..) {
        p.signal("TERM");
        assert!(p.wait_exit(Duration::from_secs(5)).success());
        logs.push_str(&format!("--- {name}\n{}\n", p.logs_tail(8)));
    }
}

/// Anyone who may publish on the membership subject can send heartbeats.
/// Before they were sealed, a forged `leaving` for a working member made
/// the others drop it and take its nodes while it went on working them: two
/// owners, and with jwt, ed25519 and pki off nothing before `configure`
/// stops the helper running twice (the provisioning lock does not cover
/// `rpcutil#inventory`). Here forged leaves for each member, unsealed and
/// sealed with a key of the forger's own, go out every 200 ms for a minute
/// while 300 nodes arrive: each is configured once and the helper runs once
/// for each, the forgeries are counted, and the membership never changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_leaves_change_no_membership_and_no_node_is_worked_twice() {
    use choria_wire::security::seal::{Purpose, SealKey};
    use futures::StreamExt;
    const WAVES: usize = 6;
    const PER_WAVE: usize = 50;
    let dir = tempfile::tempdir().unwrap();
    let nats = choria_like_broker();
    // Each helper run keeps its input in a file of its own (concurrent
    // appends to one file could interleave).
    let runs = dir.path().join("helper-runs");
    std::fs::create_dir(&runs).unwrap();
    let mut r = Replicas::new(dir.path(), &nats, 8);
    // The test fails if a replica pauses. One that misses its renewals
    // for `renew_deadline` does, and on 6 s/4 s/1 s a loaded machine made
    // that happen (renewal.rs, CI): so the default timings. A forged leave
    // that got through would drop a member at once on any timings.
    r.election = STREAMS_DEFAULT_TIMINGS;
    r.extra = format!(
        "helper: sh -c 'tee \"$(mktemp -p {} run.XXXXXXXX)\" | exec {} fleet-helper'\n",
        runs.display(),
        binary()
    );
    r.start();
    r.start();
    r.settled(2, Duration::from_secs(30)).await;
    let transitions = |r: &Replicas| -> Vec<f64> {
        r.running
            .iter()
            .map(|(_, p)| p.metric("choria_provisioner_leadership_transitions"))
            .collect()
    };
    let before = transitions(&r);

    // The forger learns the members from their own heartbeats.
    let subject = "choria.provisioner.shards.shards-test";
    let forger = async_nats::connect(nats.url().replace("nats://", "nats://prov:prov@"))
        .await
        .unwrap();
    let mut heard = forger.subscribe(subject).await.unwrap();
    let mut members = std::collections::BTreeSet::new();
    while members.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(10), heard.next())
            .await
            .expect("heartbeats")
            .unwrap();
        let envelope: Value = serde_json::from_slice(&m.payload).unwrap();
        let beat: Value = serde_json::from_str(envelope["beat"].as_str().unwrap()).unwrap();
        members.insert(beat["member"].as_str().unwrap().to_string());
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let forging = tokio::spawn({
        let (stop, members, forger) = (stop.clone(), members.clone(), forger.clone());
        async move {
            let key = SealKey::generate();
            let mut sent = 0u64;
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            while !stop.is_cancelled() {
                tick.tick().await;
                for m in &members {
                    sent += 1;
                    let beat = serde_json::json!({"member": m, "seq": 1_000_000 + sent, "view": [], "leaving": true}).to_string();
                    let seal = key.seal(
                        Purpose::Heartbeat,
                        &[subject.as_bytes(), m.as_bytes(), beat.as_bytes()],
                    );
                    let sealed = serde_json::json!({"beat": beat, "seal": seal}).to_string();
                    for body in [beat.clone(), sealed] {
                        let _ = forger.publish(subject, body.into()).await;
                    }
                }
            }
            sent
        }
    });
    // Nodes keep arriving while the forgery goes on (a minute).
    let mut fleets = Vec::new();
    for wave in 0..WAVES {
        fleets.push(fleet(&nats, dir.path(), &format!("w{wave}-"), PER_WAVE).await);
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    for wave in 0..WAVES {
        wait_provisioned(
            &dir.path().join(format!("w{wave}-journal.jsonl")),
            PER_WAVE,
            Duration::from_secs(60),
        )
        .await;
    }
    stop.cancel();
    let sent = forging.await.unwrap();
    let refused: f64 = r
        .running
        .iter()
        .map(|(_, p)| p.metric("choria_provisioner_shard_records_refused"))
        .sum();
    let members_seen: Vec<f64> = r
        .running
        .iter()
        .map(|(_, p)| p.metric("choria_provisioner_shard_members"))
        .collect();
    let after = transitions(&r);
    let mut journal = Vec::new();
    for f in fleets {
        journal.extend(f.finish().await.1);
    }
    let helper_runs: Vec<String> = std::fs::read_dir(&runs)
        .unwrap()
        .map(|e| {
            let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
            serde_json::from_str::<Value>(&text).unwrap()["identity"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for id in &helper_runs {
        *per_node.entry(id).or_default() += 1;
    }
    println!(
        "forged leaves: {sent} sent (each unsealed and sealed with another key), {refused} refused; \
         {} nodes, {} helper runs, members seen {members_seen:?}",
        WAVES * PER_WAVE,
        helper_runs.len()
    );
    assert_configured_once(&journal, WAVES * PER_WAVE);
    let twice: Vec<_> = per_node.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "the helper ran more than once for {twice:?}"
    );
    assert_eq!(
        per_node.len(),
        WAVES * PER_WAVE,
        "the helper ran for every node"
    );
    assert!(
        refused >= sent as f64,
        "every forgery refused by each replica: {refused} of {sent}"
    );
    assert_eq!(members_seen, [2.0, 2.0]);
    assert_eq!(before, after, "no replica stopped or started working");
}

//! The real Choria broker as a test peer (`choria broker run` from go-choria
//! 0.30.2, tests/support/broker.rs): what users run between provisioners and
//! their fleets, instead of the nats-server accounts that emulate it in the
//! other tiers.
//!
//! * A real v1 server on an x509 network and a real v2 server on an
//!   Organization Issuer network are provisioned through it, our provisioner
//!   logged in as `provisioner` (with a verified client certificate, or a
//!   client JWT with the provisioner permission); the v2 server is renewed
//!   twice through it.
//! * The election runs on the bucket the broker's Streams made, through the
//!   two imports its provisioning account has: ours hand over gracefully,
//!   the real Go provisioner takes over from a killed leader of ours.
//! * Sharded replicas provision a simulated fleet through it, each node once.
//! * What the broker refuses is refused, and our errors say why.
//!
//! Needs `$CHORIA_BIN` (and `$CHORIA_GO_PROVISIONER_BIN` for the election);
//! under CI a missing peer fails the test (tests/support/peers.rs).

use crate::support::broker::{ChoriaBroker, Network, PROVISIONER_PASSWORD};
use crate::support::election::{
    assert_no_overlap, bucket_config, read_key_entry, KeyEntry, KeyHistory,
};
use crate::support::gopeers::{
    choria_bin, choria_tool, go_provisioner_bin, make_signers, s, Signers,
};
use crate::support::provisioner::{binary, ProvisionerProcess};
use crate::support::realnodes::*;
use crate::support::RunningFleet;
use choria_fleet::FleetOptions;
use choria_wire::client::{self, BrokerOptions, ConnectOptions};
use choria_wire::security::ed25519::Ed25519KeyPair;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;
use std::time::{Duration, Instant};

/// The election bucket's TTL on the test brokers: the shortest go-choria's
/// election accepts is 4 s (a renewal every 0.75 TTL, at least 1 s apart).
const TTL: Duration = Duration::from_secs(5);

/// Our Choria client configuration on an x509 network: the file provider
/// with a client certificate the broker's CA signed for `identity`.
fn x509_choria_cfg(broker: &ChoriaBroker, name: &str, identity: &str) -> String {
    let cert = broker.client_cert(name, identity);
    x509_client_config(&broker.url(), identity, &cert, &broker.ca.cert)
}

/// A fresh x509 broker for `test`: (the choria binary, the work
/// directory, the signers the broker trusts, the broker); `None` when the
/// binary is missing (see tests/support/peers.rs).
fn x509_broker(
    test: &str,
) -> Option<(std::path::PathBuf, tempfile::TempDir, Signers, ChoriaBroker)> {
    let bin = choria_bin(test)?;
    let work = tempfile::tempdir().unwrap();
    let signers = make_signers(&bin, work.path());
    let broker = ChoriaBroker::start(
        &bin,
        &work.path().join("broker"),
        Network::X509,
        &signers,
        TTL,
    );
    Some((bin, work, signers, broker))
}

/// A simulated fleet of `nodes` provisioning-mode servers admitted by the
/// broker as real ones are: TLS, provisioning JWTs signed by the broker's
/// signer, and a journal.
async fn fleet(
    broker: &ChoriaBroker,
    signers: &Signers,
    prefix: &str,
    nodes: usize,
    journal: &Path,
) -> RunningFleet {
    RunningFleet::start(FleetOptions {
        broker: BrokerOptions {
            nats: vec![broker.url()],
            tls_ca: Some(broker.ca.cert.clone()),
            tls_required: true,
        },
        nodes,
        token: TOKEN.into(),
        jwt_signer: Some(signers.rsa_key.clone()),
        journal: Some(journal.to_path_buf()),
        identity_prefix: prefix.into(),
        key_pool_size: 2,
        ..Default::default()
    })
    .await
}

/// Successful `configure` requests per node, with their senders.
fn configured_by(journal: &Path) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in crate::support::read_journal_so_far(journal)
        .iter()
        .filter(|e| e["kind"] == "action" && e["action"] == "configure" && e["outcome"] == "ok")
    {
        out.entry(e["node"].as_str().unwrap().to_string())
            .or_default()
            .push(e["sender"].as_str().unwrap().to_string());
    }
    out
}

/// Waits until `nodes` nodes of `journal` were configured; the senders.
async fn wait_configured(
    journal: &Path,
    nodes: usize,
    timeout: Duration,
    broker: &ChoriaBroker,
) -> BTreeMap<String, Vec<String>> {
    let deadline = Instant::now() + timeout;
    loop {
        let by = configured_by(journal);
        if by.len() >= nodes {
            return by;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {nodes} nodes configured within {timeout:?}; broker log tail:\n{}",
            by.len(),
            tail(&broker.log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The broker admitted `user` into `account` (its debug log says so).
fn assert_registered(broker: &ChoriaBroker, user: &str, account: &str) {
    let line = format!("Registering user '{user}' in account '{account}'");
    assert!(
        !broker.log_lines(&line).is_empty(),
        "the broker never logged {line:?}"
    );
}

/// No connection of the simulated fleet or ours tripped the broker's
/// permissions: what they subscribe and publish is what the broker allows
/// provisioning-mode servers and the provisioner.
fn assert_no_violation(broker: &ChoriaBroker) {
    let violations = broker.log_lines("Violation");
    assert!(
        violations.is_empty(),
        "the broker refused subjects: {violations:#?}"
    );
}

// ---------------------------------------------------------------------------
// Real servers through the real broker.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_v1_server_is_provisioned_through_the_broker_on_an_x509_network() {
    let Some(mut bench) = Bench::start_on_choria(
        "a_real_v1_server_is_provisioned_through_the_broker_on_an_x509_network",
        Network::X509,
        TTL,
    )
    .await
    else {
        return;
    };
    let id = "real-v1.broker.example.net";
    let ssl = bench.path(id).join("ssl");
    let settings = file_provider_settings(&ssl);
    // Not `choria_insecure`: the broker admits `provisioner` only with a
    // client certificate it verifies.
    let choria_cfg = x509_choria_cfg(bench.broker.choria(), "provisioner", PROVISIONER);
    // Records in the broker's own Streams: its `choria` account admits a
    // client whose certificate its CA signed, JetStream included.
    let (records_cert, records_key) = bench
        .broker
        .choria()
        .client_cert("records", "records.example.net");
    let records = format!(
        "records:\n  url: {}\n  bucket: BROKER_RECORDS\n  tls_ca: {}\n  tls_cert: {}\n  tls_key: {}\n  signing_key: {}\n",
        bench.url(),
        s(&bench.broker.ca().cert),
        s(&records_cert),
        s(&records_key),
        s(&crate::support::signing_key(&bench.path("")))
    );
    let (mut p, _server, _) = bench
        .provision_v1(
            id,
            (&records, &choria_cfg),
            &settings,
            "choria=admin.mcollective",
        )
        .await;
    p.wait_for_metric(
        "choria_provisioner_records_written",
        1.0,
        Duration::from_secs(10),
    )
    .await;
    let out = std::process::Command::new(binary())
        .args(["nodes", "--json", "--config"])
        .arg(bench.path("provisioner/provisioner.yaml"))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && listed.lines().count() == 1 && listed.contains(id),
        "the record, read back from the broker's Streams: {listed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let broker = bench.broker.choria();
    assert_registered(broker, "provisioner", "provisioning");
    assert_no_violation(broker);
    forged_record_through_the_broker(&bench, id).await;

    // Back with its new certificate in the broker's choria account, serving
    // mcollective; a real client whose certificate the CA signed is served.
    bench.assert_connected_in(id, "mcollective");
    let client_cfg = bench.x509_admin_config();
    assert_serves_cli(&bench, &client_cfg, id, "mcollective").await;
    bench.stop_and_check_log(p);
}

/// What the broker lets a holder of any certificate its CA signed (every
/// node we provisioned has one) do to the records bucket: write it. The
/// forger rewrites the node's record unsealed (provisioned an hour ago,
/// expiring in 30 s) and adds one for a made-up node in collective `evil`
/// sealed with its own key; the broker takes both, and neither is taken
/// for ours: `nodes` still shows the node's own sealed record and the
/// made-up one unverified (renewal reads through the same check:
/// tests/renewal.rs).
async fn forged_record_through_the_broker(bench: &Bench, id: &str) {
    use choria_core::records::sealed::Sealer;
    use choria_wire::security::seal::SealKey;
    use serde_json::Value;
    let broker = bench.broker.choria();
    let opts = ConnectOptions {
        servers: vec![broker.url()],
        name: "forger".into(),
        tls: broker.tls(Some(broker.client_cert("forger", "forger.example.net"))),
        ..Default::default()
    };
    let writer = client::connect(&opts)
        .await
        .expect("the broker admits the forger");
    let kv = async_nats::jetstream::new(writer)
        .get_key_value("BROKER_RECORDS")
        .await
        .expect("the forger opens the records bucket");
    let sealed: Value = serde_json::from_slice(&kv.get(id).await.unwrap().unwrap()).unwrap();
    let mut record: Value = serde_json::from_str(sealed["record"].as_str().unwrap()).unwrap();
    let now = chrono::Utc::now().timestamp();
    record["time_unix"] = (now - 3600).into();
    record["certificate"]["not_before_unix"] = (now - 3600).into();
    record["certificate"]["not_after_unix"] = (now + 30).into();
    kv.put(id, serde_json::to_vec(&record).unwrap().into())
        .await
        .expect("the broker lets the forger write a record");
    let mut ghost = record.clone();
    ghost["identity"] = "ghost.example.net".into();
    ghost["certificate"] = Value::Null;
    ghost["server_jwt"] = serde_json::json!({
        "jti": "x", "issued_unix": now - 3600, "expires_unix": now + 30, "collectives": ["evil"]
    });
    let theirs = SealKey::generate();
    let site = record["site"].as_str().unwrap_or_default().to_string();
    let forged = Sealer::new(theirs.clone(), theirs.verifier(), "BROKER_RECORDS", &site)
        .seal(&serde_json::from_value(ghost).unwrap())
        .unwrap();
    kv.put("ghost.example.net", forged.into()).await.unwrap();
    let out = std::process::Command::new(binary())
        .args(["nodes", "--json", "--config"])
        .arg(bench.path("provisioner/provisioner.yaml"))
        .output()
        .unwrap();
    let listed: BTreeMap<String, Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| (v["identity"].as_str().unwrap().to_string(), v))
        .collect();
    assert!(
        out.status.success() && listed.len() == 2,
        "{listed:?}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(listed[id]["verified"], true, "{:?}", listed[id]);
    assert_eq!(
        listed[id]["time_unix"],
        sealed_time(&sealed),
        "{:?}",
        listed[id]
    );
    assert_eq!(listed["ghost.example.net"]["verified"], false);
}

/// The provisioning time inside a sealed record's value.
fn sealed_time(sealed: &serde_json::Value) -> serde_json::Value {
    let record: serde_json::Value =
        serde_json::from_str(sealed["record"].as_str().unwrap()).unwrap();
    record["time_unix"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_v2_server_is_provisioned_and_renewed_twice_through_the_broker_on_an_issuer_network()
{
    let Some(mut bench) = Bench::start_on_choria(
        "a_real_v2_server_is_provisioned_and_renewed_twice_through_the_broker_on_an_issuer_network",
        Network::Issuer,
        TTL,
    )
    .await
    else {
        return;
    };
    // The provisioner logs in as `provisioner` with its client JWT (the
    // provisioner permission), reaches the renewed node in the choria
    // account with the same JWT, and the node comes back each time with a
    // server JWT the broker verifies against the issuer.
    // Records in the broker's own Streams: on an issuer network that has a
    // CA, a client with a certificate it verifies gets pub-sub access to
    // the choria account, JetStream and KV included.
    let broker = bench.broker.choria();
    let (cert, key) = broker.client_cert("records", "records.example.net");
    let records = format!(
        "  url: {}\n  tls_ca: {}\n  tls_cert: {}\n  tls_key: {}\n",
        broker.url(),
        s(&broker.ca.cert),
        s(&cert),
        s(&key)
    );
    renew_a_v2_server_twice(
        &mut bench,
        "renewed-v2.broker.example.net",
        Some(records),
        None,
    )
    .await;
    let log = bench.broker.choria().log();
    for line in [
        "Registering user 'provisioner' in account 'provisioning' from claims",
        "Allowing a provisioning server from using issuer 'choria'",
    ] {
        assert!(log.contains(line), "the broker never logged {line:?}");
    }
    assert!(
        !log.contains("Violation"),
        "the broker refused subjects:\n{}",
        log.lines()
            .filter(|l| l.contains("Violation"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

// ---------------------------------------------------------------------------
// The election on the broker's own bucket.
// ---------------------------------------------------------------------------

/// Waits until the election key names someone other than `not` (a PUT);
/// the entry.
async fn wait_leader(
    admin: &async_nats::Client,
    not: Option<&str>,
    timeout: Duration,
    broker: &ChoriaBroker,
) -> KeyEntry {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(e) = read_key_entry(admin).await {
            if e.op == "PUT" && Some(e.value.as_str()) != not {
                return e;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader other than {not:?} within {timeout:?}; broker log tail:\n{}",
            tail(&broker.log(), 20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The shared election's fixture: a broker on an x509 network, its
/// election bucket read from its choria account as `admin`, the work
/// directory and the signers its fleets' JWTs are made with.
struct SharedElection {
    // Fields drop in order: what started last stops first.
    admin: async_nats::Client,
    broker: ChoriaBroker,
    signers: Signers,
    work: tempfile::TempDir,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_and_the_go_provisioner_share_the_brokers_election_and_hand_over() {
    const TEST: &str = "ours_and_the_go_provisioner_share_the_brokers_election_and_hand_over";
    let Some(go_bin) = go_provisioner_bin(TEST) else {
        return;
    };
    let Some((_, work, signers, broker)) = x509_broker(TEST) else {
        return;
    };
    let e = SharedElection::given_the_brokers_bucket(work, signers, broker).await;
    e.then_the_emulated_bucket_is_the_brokers().await;
    let (mut replicas, fleet_a) = e
        .when_two_of_ours_start_one_leads_and_provisions_fleet_a()
        .await;
    let second = e
        .when_the_leader_stops_the_standby_leads_at_once(&mut replicas)
        .await;
    let go = e
        .when_the_go_provisioner_joins_it_stands_by(&go_bin, &second)
        .await;
    let fleet_b = e
        .when_ours_die_the_go_provisioner_leads_after_the_ttl(replicas, &second)
        .await;
    drop(go);
    fleet_a.finish().await;
    fleet_b.finish().await;
}

impl SharedElection {
    async fn given_the_brokers_bucket(
        work: tempfile::TempDir,
        signers: Signers,
        broker: ChoriaBroker,
    ) -> SharedElection {
        // The bucket as the broker holds it, read from its choria account.
        let admin = client::connect(&ConnectOptions {
            servers: vec![broker.url()],
            name: "admin".into(),
            tls: broker.tls(Some(broker.client_cert("admin", "admin.example.net"))),
            ..Default::default()
        })
        .await
        .unwrap();
        SharedElection {
            work,
            signers,
            broker,
            admin,
        }
    }

    async fn then_the_emulated_bucket_is_the_brokers(&self) {
        let admin = &self.admin;
        // The emulation's bucket (tests/support/election.rs) is the broker's.
        let info = admin
            .request("$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION", "".into())
            .await
            .unwrap();
        let info: serde_json::Value = serde_json::from_slice(&info.payload).unwrap();
        let emulated = bucket_config(TTL);
        for (field, want) in emulated.as_object().unwrap() {
            assert_eq!(
                &info["config"][field], want,
                "the emulated bucket's {field} differs from the real broker's: {}",
                info["config"]
            );
        }
    }

    /// Our two replicas, started after the history begins; fleet A, provisioned.
    async fn when_two_of_ours_start_one_leads_and_provisions_fleet_a(
        &self,
    ) -> ([ProvisionerProcess; 2], RunningFleet) {
        let (work, signers, broker, admin) = (&self.work, &self.signers, &self.broker, &self.admin);
        let journal = work.path().join("journal.jsonl");
        let fleet_a = fleet(broker, signers, "a", 60, &journal).await;
        let yaml = format!(
            "workers: 2\ninterval: 1m\ntoken: {TOKEN}\nsite: election\nhelper: {} fleet-helper\n\
         rpc_timeout: 2s\ndiscovery_timeout: 2s\ndiscovery_window: 500ms\nleader_election: true\n\
         broker_provisioning_password: {PROVISIONER_PASSWORD}\n",
            binary()
        );
        let ours = |name: &str| {
            let identity = format!("{name}.provisioners.example.net");
            ProvisionerProcess::start_named(
                work.path(),
                name,
                &yaml,
                &x509_choria_cfg(broker, name, &identity),
                &[],
            )
        };
        // Every entry the election key holds from before either of ours starts.
        let history = KeyHistory::start_with(admin.clone());
        let r1 = ours("r1");
        let r2 = ours("r2");

        // One of ours leads on the broker's bucket and provisions fleet A alone.
        // (A wait for a condition: the bound only ends a run that never gets
        // there, two debug builds starting beside other tiers.)
        wait_leader(admin, None, TTL * 6, broker).await;
        let by = wait_configured(&journal, 60, Duration::from_secs(90), broker).await;
        let senders: std::collections::BTreeSet<&String> = by.values().flatten().collect();
        // Only a replica the bucket named configures. On a machine starved for
        // long enough, a leader may miss its renewals and the other take over:
        // that is the election working, so both may then appear, each as one
        // the bucket named; a standby that never led never does.
        let leaders: std::collections::BTreeSet<String> = history
            .finish()
            .await
            .into_iter()
            .filter(|e| e.op == "PUT")
            .map(|e| e.value)
            .collect();
        assert!(
            !senders.is_empty()
                && senders.iter().all(|s| {
                    let replica = s.split('.').next().unwrap();
                    leaders
                        .iter()
                        .any(|l| l.starts_with(&format!("{replica}.")))
                }),
            "fleet A configured by {senders:?}, the bucket named {leaders:?}"
        );
        if leaders.len() > 1 {
            println!("the lead moved while fleet A was provisioned: {leaders:?}");
        }
        // Whoever led, no node was worked by two of them at once.
        assert_no_overlap(&crate::support::read_journal_so_far(&journal));

        ([r1, r2], fleet_a)
    }

    /// The entry of the standby that took over.
    async fn when_the_leader_stops_the_standby_leads_at_once(
        &self,
        replicas: &mut [ProvisionerProcess; 2],
    ) -> KeyEntry {
        let (broker, admin) = (&self.broker, &self.admin);
        // A graceful stop hands over through the broker's imports at once: the
        // stopped leader releases its entry before it exits, and the standby
        // leads well before that entry would have expired.
        let current = wait_leader(admin, None, TTL, broker).await;
        let [r1, r2] = replicas;
        let (leader, standby) = if current.value.starts_with("r1.") {
            (r1, r2)
        } else {
            (r2, r1)
        };
        let over_the_stop = KeyHistory::start_with(admin.clone());
        let stopped = Instant::now();
        leader.signal("TERM");
        assert!(leader.wait_exit(Duration::from_secs(10)).success());
        let after = read_key_entry(admin).await;
        assert!(
            after
                .as_ref()
                .is_none_or(|e| e.op != "PUT" || e.value != current.value),
            "the stopped leader's entry was not released: {after:?}"
        );
        let second = wait_leader(admin, Some(&current.value), TTL * 2, broker).await;
        let took = stopped.elapsed();
        println!(
            "graceful hand-over {} -> {} in {took:.2?}",
            current.value, second.value
        );
        // Both times are the broker's own: the standby's claim (its first
        // entry, not a later renewal `wait_leader` may have read) was stored
        // before the stopped leader's last renewal could have expired.
        let seen = over_the_stop.finish().await;
        let last_renewal = seen
            .iter()
            .filter(|e| e.op == "PUT" && e.value == current.value)
            .map(|e| e.stored)
            .fold(current.stored, SystemTime::max);
        let claimed = seen
            .iter()
            .filter(|e| e.op == "PUT" && e.value == second.value)
            .map(|e| e.stored)
            .min()
            .unwrap_or(second.stored);
        assert!(
        claimed < last_renewal + TTL,
        "the standby led {:?} after the stopped leader's last renewal: it waited for the entry to expire",
        claimed.duration_since(last_renewal).unwrap_or_default()
    );
        let deadline = Instant::now() + TTL * 2;
        while standby.metric("choria_provisioner_paused") != 0.0 {
            assert!(
                Instant::now() < deadline,
                "the bucket names {} but it does not work:\n{}",
                second.value,
                standby.logs_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        second
    }

    /// The Go provisioner, standing by while `second` (ours) leads.
    async fn when_the_go_provisioner_joins_it_stands_by(
        &self,
        go_bin: &Path,
        second: &KeyEntry,
    ) -> ProvisionerProcess {
        let (work, broker, admin) = (&self.work, &self.broker, &self.admin);
        // The real Go provisioner joins: a standby while ours lives.
        let go_dir = work.path().join("go");
        std::fs::create_dir_all(&go_dir).unwrap();
        let go_yaml = format!(
        "workers: 2\ninterval: 1m\ntoken: {TOKEN}\nsite: election\nhelper: {}\nleader_election: true\n\
         broker_provisioning_password: {PROVISIONER_PASSWORD}\nlogfile: /dev/stderr\nloglevel: debug\n",
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/helper.sh")
            .display()
    );
        let go = ProvisionerProcess::start_program(
            go_bin,
            &go_dir,
            "go",
            &go_yaml,
            &x509_choria_cfg(broker, "go", "go.provisioners.example.net"),
            &[],
            &[],
        );
        let until = Instant::now() + TTL * 2;
        while Instant::now() < until {
            let e = read_key_entry(admin).await;
            assert_eq!(
                e.as_ref().map(|e| e.value.as_str()),
                Some(second.value.as_str()),
                "our leader kept the lead; Go provisioner:\n{}",
                go.logs_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        go
    }

    /// Fleet B, provisioned by the Go provisioner alone.
    async fn when_ours_die_the_go_provisioner_leads_after_the_ttl(
        &self,
        replicas: [ProvisionerProcess; 2],
        second: &KeyEntry,
    ) -> RunningFleet {
        let (work, signers, broker, admin) = (&self.work, &self.signers, &self.broker, &self.admin);
        // Our leader dies (kill -9: nothing released): the Go provisioner takes
        // over once the entry expired, and provisions fleet B alone.
        drop(replicas);
        let killed = Instant::now();
        // What the bucket holds now is our leader's last renewal: nothing of
        // ours runs to write another.
        let last = read_key_entry(admin).await.expect("our leader's entry");
        assert_eq!((last.op.as_str(), &last.value), ("PUT", &second.value));
        // Its candidate retries back off to at most ~30 s (backoff.TwentySec).
        let third = wait_leader(
            admin,
            Some(&second.value),
            TTL + Duration::from_secs(45),
            broker,
        )
        .await;
        println!(
            "kill -9 {} -> {} after {:.2?}",
            second.value,
            third.value,
            killed.elapsed()
        );
        assert_eq!(third.value, "go.provisioners.example.net");
        // The broker's own times: the Go provisioner took the key only once our
        // entry had expired, a TTL after its last renewal (what the broker's
        // clock stamped, so no load on this machine moves it).
        let waited = third.stored.duration_since(last.stored).unwrap_or_default();
        assert!(
        waited >= TTL,
        "the Go provisioner led {waited:?} after our last renewal, before our entry could expire"
    );
        let journal_b = work.path().join("journal-b.jsonl");
        let fleet_b = fleet(broker, signers, "b", 20, &journal_b).await;
        let by = wait_configured(&journal_b, 20, Duration::from_secs(90), broker).await;
        let senders: std::collections::BTreeSet<&String> = by.values().flatten().collect();
        assert_eq!(
            senders.into_iter().collect::<Vec<_>>(),
            ["go.provisioners.example.net"],
            "fleet B configured by the Go provisioner alone"
        );
        assert_registered(broker, "provisioner", "provisioning");
        assert_no_violation(broker);
        fleet_b
    }
}

// ---------------------------------------------------------------------------
// Shards through the broker.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_provision_each_node_once_through_the_broker() {
    const TEST: &str = "sharded_replicas_provision_each_node_once_through_the_broker";
    const NODES: usize = 300;
    let Some((_, work, signers, broker)) = x509_broker(TEST) else {
        return;
    };
    let journal = work.path().join("journal.jsonl");
    let fleet = fleet(&broker, &signers, "s", NODES, &journal).await;
    // Membership by heartbeats on a core subject of the provisioning
    // account: a stock broker allows it, nothing to configure there.
    let yaml = format!(
        "workers: 4\ninterval: 1m\ntoken: {TOKEN}\nsite: shards\nhelper: {} fleet-helper\n\
         rpc_timeout: 3s\ndiscovery_timeout: 2s\ndiscovery_window: 500ms\n\
         broker_provisioning_password: {PROVISIONER_PASSWORD}\n\
         election:\n  mode: shards\n  backend: streams\n  name: broker\n  lease_duration: 6s\n  renew_deadline: 4s\n  retry_period: 1s\n  signing_key: {}\n",
        binary(),
        crate::support::signing_key(work.path()).display()
    );
    let replicas: Vec<ProvisionerProcess> = ["s1", "s2"]
        .iter()
        .map(|n| {
            let identity = format!("{n}.provisioners.example.net");
            ProvisionerProcess::start_named(
                work.path(),
                n,
                &yaml,
                &x509_choria_cfg(&broker, n, &identity),
                &[],
            )
        })
        .collect();
    let by = wait_configured(&journal, NODES, Duration::from_secs(120), &broker).await;
    let twice: Vec<_> = by.iter().filter(|(_, s)| s.len() > 1).collect();
    assert!(twice.is_empty(), "configured more than once: {twice:?}");
    let mut shares: BTreeMap<&str, usize> = BTreeMap::new();
    for s in by.values().flatten() {
        *shares.entry(s.as_str()).or_default() += 1;
    }
    println!("{NODES} nodes through the broker, by replica: {shares:?}");
    assert_eq!(shares.len(), 2, "both replicas worked: {shares:?}");
    for p in &replicas {
        assert_eq!(p.metric("choria_provisioner_lock_refusals"), 0.0);
    }
    assert_no_violation(&broker);
    drop(replicas);
    fleet.finish().await;
}

// ---------------------------------------------------------------------------
// What the broker refuses.
// ---------------------------------------------------------------------------

/// Connects as `opts` and returns the error text; panics if admitted.
async fn refused(opts: ConnectOptions, what: &str) -> String {
    match client::connect(&opts).await {
        Ok(_) => panic!("the broker admitted {what}"),
        Err(e) => {
            let text = e.to_string();
            println!("{what}: {text}");
            text
        }
    }
}

/// A provisioning JWT made by the real `choria jwt prov`, signed by `key`.
fn provisioning_jwt(bin: &Path, dir: &Path, key: &Path, url: &str, v2: bool) -> String {
    let file = dir.join(format!("prov-{}.jwt", if v2 { "v2" } else { "v1" }));
    let mut args = vec!["jwt", "prov", s(&file), s(key)];
    args.extend(["--token", TOKEN, "--urls", url, "--default"]);
    if v2 {
        args.push("--protocol-v2");
    }
    choria_tool(bin, dir, &args);
    std::fs::read_to_string(file).unwrap().trim().to_string()
}

/// The refusals' fixture: an x509 and an issuer broker trusting `signers`,
/// and `other` signers (made in `other_dir`) that neither trusts.
struct Refusals {
    // Fields drop in order: what started last stops first.
    issuer: ChoriaBroker,
    other: Signers,
    other_dir: std::path::PathBuf,
    x509: ChoriaBroker,
    signers: Signers,
    work: tempfile::TempDir,
    bin: std::path::PathBuf,
}

/// A provisioning-mode server connecting to `broker` with the provisioning JWT `jwt`.
fn provisioning_node(broker: &ChoriaBroker, jwt: String) -> ConnectOptions {
    ConnectOptions {
        servers: vec![broker.url()],
        name: "node".into(),
        tls: BrokerOptions {
            nats: vec![],
            tls_ca: None,
            tls_required: true,
        }
        .tls(),
        token: Some(jwt),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_broker_refuses_is_refused_and_our_errors_say_why() {
    const TEST: &str = "what_the_broker_refuses_is_refused_and_our_errors_say_why";
    let Some((bin, work, signers, x509)) = x509_broker(TEST) else {
        return;
    };
    let r = Refusals::given_another_signer_and_an_issuer_broker(bin, work, signers, x509);
    r.then_the_signers_own_jwts_are_admitted().await;
    r.then_jwts_of_another_signer_or_issuer_are_refused().await;
    r.then_provisioner_needs_a_verified_certificate_and_its_password()
        .await;
    r.then_a_client_jwt_without_the_provisioner_permission_is_refused()
        .await;
    r.then_a_ca_signed_client_is_admitted_where_the_ca_is_trusted()
        .await;
    r.then_run_keeps_retrying_and_says_why().await;
}

impl Refusals {
    fn given_another_signer_and_an_issuer_broker(
        bin: std::path::PathBuf,
        work: tempfile::TempDir,
        signers: Signers,
        x509: ChoriaBroker,
    ) -> Refusals {
        // Another signer and another issuer, which the brokers do not trust.
        let other_dir = work.path().join("other");
        std::fs::create_dir_all(&other_dir).unwrap();
        let other = make_signers(&bin, &other_dir);
        let issuer = ChoriaBroker::start(
            &bin,
            &work.path().join("issuer"),
            Network::Issuer,
            &signers,
            TTL,
        );
        Refusals {
            bin,
            work,
            signers,
            x509,
            issuer,
            other_dir,
            other,
        }
    }

    async fn then_the_signers_own_jwts_are_admitted(&self) {
        let (bin, work, signers, x509, issuer) = (
            &self.bin,
            &self.work,
            &self.signers,
            &self.x509,
            &self.issuer,
        );
        // The signer's own JWTs are admitted (so what follows is refused for
        // its signer, nothing else).
        let good = provisioning_jwt(bin, work.path(), &signers.rsa_key, &x509.url(), false);
        client::connect(&provisioning_node(x509, good))
            .await
            .expect("a provisioning JWT from the broker's signer is admitted");
        let good_v2 = provisioning_jwt(bin, work.path(), &signers.issuer_seed, &issuer.url(), true);
        client::connect(&provisioning_node(issuer, good_v2))
            .await
            .expect("an ed25519 provisioning JWT from the broker's issuer is admitted");
    }

    async fn then_jwts_of_another_signer_or_issuer_are_refused(&self) {
        let (bin, x509, issuer) = (&self.bin, &self.x509, &self.issuer);
        let (other_dir, other) = (&self.other_dir, &self.other);
        // 1. A provisioning JWT from another signer (RSA) and another issuer.
        for (broker, key, v2, what) in [
            (
                x509,
                &other.rsa_key,
                false,
                "a v1 provisioning JWT from another signer",
            ),
            (
                issuer,
                &other.issuer_seed,
                true,
                "a v2 provisioning JWT from another issuer",
            ),
        ] {
            let jwt = provisioning_jwt(bin, other_dir, key, &broker.url(), v2);
            let text = refused(provisioning_node(broker, jwt), what).await;
            assert!(
                text.contains("refused the provisioning JWT") && text.contains("signer_cert"),
                "{what}: {text}"
            );
        }
        assert!(
            !x509.log_lines("crypto/rsa: verification error").is_empty(),
            "the x509 broker says why it refused:\n{}",
            tail(&x509.log(), 10)
        );
    }

    async fn then_provisioner_needs_a_verified_certificate_and_its_password(&self) {
        let x509 = &self.x509;
        // 2. `provisioner` on the x509 network: the password alone is not
        // enough, a verified client certificate is needed; a wrong password
        // is refused even with one.
        let (cert, key) = x509.client_cert("prov", PROVISIONER);
        let provisioner = |tls, password: &str| ConnectOptions {
            servers: vec![x509.url()],
            name: "provisioner".into(),
            tls,
            user: Some(("provisioner".into(), password.into())),
            ..Default::default()
        };
        for (opts, what, broker_says) in [
            (
                provisioner(x509.tls(None), PROVISIONER_PASSWORD),
                "provisioner without a client certificate",
                "provisioning user is only allowed over verified TLS connections",
            ),
            (
                provisioner(x509.tls(Some((cert.clone(), key.clone()))), "wr0ng-pa55"),
                "provisioner with a wrong password",
                "invalid provisioner password supplied",
            ),
        ] {
            let text = refused(opts, what).await;
            assert!(
                text.contains("refused user provisioner")
                    && text.contains("client certificate")
                    && text.contains("client_password"),
                "{what}: {text}"
            );
            assert!(
                !x509.log_lines(broker_says).is_empty(),
                "the broker logs {broker_says:?} for {what}"
            );
            assert!(
                x509.log_lines("wr0ng-pa55").is_empty() && !text.contains(PROVISIONER_PASSWORD),
                "a password in the broker's log or our error"
            );
        }
        client::connect(&provisioner(
            x509.tls(Some((cert, key))),
            PROVISIONER_PASSWORD,
        ))
        .await
        .expect("with the certificate and the password, provisioner is admitted");
    }

    async fn then_a_client_jwt_without_the_provisioner_permission_is_refused(&self) {
        let issuer = &self.issuer;
        // 3. `provisioner` on the issuer network with a client JWT that lacks
        // the provisioner permission.
        let (jwt, seed) = issuer.issue_client("plain", "plain", &[]);
        let jwt = std::fs::read_to_string(jwt).unwrap().trim().to_string();
        let key =
            Ed25519KeyPair::from_seed_hex(std::fs::read_to_string(seed).unwrap().trim()).unwrap();
        let text = refused(
            ConnectOptions {
                servers: vec![issuer.url()],
                name: "provisioner".into(),
                tls: issuer.tls(None),
                user: Some(("provisioner".into(), PROVISIONER_PASSWORD.into())),
                token: Some(jwt.clone()),
                nats_jwt: Some((jwt, key.signing_key().clone())),
                ..Default::default()
            },
            "provisioner with a client JWT without the provisioner permission",
        )
        .await;
        assert!(text.contains("--server-provisioner"), "{text}");
        assert!(
            !issuer
                .log_lines("provisioner claim is false in token with caller id 'plain'")
                .is_empty(),
            "the issuer broker says why"
        );
    }

    async fn then_a_ca_signed_client_is_admitted_where_the_ca_is_trusted(&self) {
        let (bin, work, signers, x509, issuer) = (
            &self.bin,
            &self.work,
            &self.signers,
            &self.x509,
            &self.issuer,
        );
        // 4. A client with a certificate the CA signed (as `records:` connects
        // to the broker's Streams) in the `choria` account: admitted on an x509
        // network, and on an issuer network only with plugin.security.choria.ca.
        let bare = ChoriaBroker::start_with(
            bin,
            &work.path().join("issuer-bare"),
            Network::Issuer,
            signers,
            TTL,
            false,
        );
        for (broker, admitted) in [(x509, true), (issuer, true), (&bare, false)] {
            let opts = ConnectOptions {
                servers: vec![broker.url()],
                name: "records".into(),
                tls: broker.tls(Some(broker.client_cert("records", "records.example.net"))),
                ..Default::default()
            };
            let connected = client::connect(&opts).await;
            assert_eq!(
                connected.is_ok(),
                admitted,
                "{:?} network{}: {:?}",
                broker.network,
                if admitted {
                    ""
                } else {
                    " without plugin.security.choria.ca"
                },
                connected.err()
            );
        }
    }

    async fn then_run_keeps_retrying_and_says_why(&self) {
        let (work, x509) = (&self.work, &self.x509);
        // 5. `run` itself: it keeps retrying, and its log and /readyz say why.
        let run_dir = work.path().join("run");
        std::fs::create_dir_all(&run_dir).unwrap();
        let yaml = format!(
            "workers: 2\ninterval: 1m\ntoken: {TOKEN}\nsite: refused\nhelper: {} fleet-helper\n\
         broker_provisioning_password: wr0ng\n",
            binary()
        );
        let p = ProvisionerProcess::start(
            &run_dir,
            &yaml,
            &x509_choria_cfg(x509, "run", PROVISIONER),
            &[],
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        let (status, body) = loop {
            let (status, body) = p.get("/readyz");
            if body.contains("refused user provisioner") || Instant::now() > deadline {
                break (status, body);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("refused user provisioner"), "/readyz: {body}");
        // The log is written by its own task: /readyz can say it first.
        let logged = |logs: &str| {
            logs.contains("could not connect to the broker; retrying")
                && logs.contains("client_password")
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !logged(&p.logs()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let logs = p.logs();
        assert!(
            logs.contains("could not connect to the broker; retrying")
                && logs.contains("client_password"),
            "{logs}"
        );
        assert!(!logs.contains("wr0ng"), "the password is in the log");
    }
}

//! The provisioner on a real JetStream cluster (three `nats-server`
//! processes on loopback): its records, revocations, audit stream and
//! election bucket with three replicas, and, in the middle of a 2,000-node
//! run, the server that leads the records stream — and that the leading
//! provisioner is connected to — killed with -9 and its disk wiped, then
//! started again empty. What was remembered before is all there and
//! verifies, nodes provisioned during the loss are recorded, the audit
//! stream holds each decision once, one provisioner leads (a new one within
//! the bucket's TTL + 2 s), renewal goes on and no node is configured twice.

mod alone {
    use crate::support::cluster::JetStreamCluster;
    use crate::support::provisioner::{binary, ProvisionerProcess};
    use crate::support::RunningFleet;
    use choria_config::audit::AuditConfig;
    use choria_config::day_two::RecordsConfig;
    use choria_core::records::sealed::{Read, Sealer};
    use choria_core::records::store::RecordStore;
    use choria_fleet::FleetOptions;
    use choria_wire::client::BrokerOptions;
    use choria_wire::security::seal::SealKey;
    use serde_json::Value;
    use std::collections::{BTreeMap, HashMap, HashSet};
    use std::path::Path;
    use std::time::{Duration, Instant};

    const TOKEN: &str = "clust3r-t0ken";
    const NODES: usize = 2000;
    const BUCKET: &str = "CLUSTER_RECORDS";
    const TTL: Duration = Duration::from_secs(10);

    fn records_cfg(urls: &str, seed: &Path) -> RecordsConfig {
        RecordsConfig {
            urls: urls.split(',').map(str::to_string).collect(),
            bucket: BUCKET.into(),
            history: 5,
            create_bucket: false,
            replicas: 3,
            user: None,
            password: None,
            password_file: None,
            token: None,
            token_file: None,
            credentials_file: None,
            tls_ca: None,
            tls_client: None,
            signing_key: seed.to_path_buf(),
            verify_keys: Vec::new(),
            exclusive: false,
        }
    }

    /// OK answers to `action` per node, with their times (µs).
    fn answered(journal: &[Value], action: &str) -> BTreeMap<String, Vec<i64>> {
        let mut out: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for e in journal
            .iter()
            .filter(|e| e["kind"] == "action" && e["action"] == action && e["outcome"] == "ok")
        {
            out.entry(e["node"].as_str().unwrap().to_string())
                .or_default()
                .push(e["time_us"].as_i64().unwrap());
        }
        out
    }

    /// Which of the replicas leads now (by their `/metrics`); `None` for
    /// none, and a panic for two.
    fn leader(replicas: &[ProvisionerProcess]) -> Option<usize> {
        let leading: Vec<usize> = (0..replicas.len())
            .filter(|&i| replicas[i].metric("choria_provisioner_leader") == 1.0)
            .collect();
        assert!(leading.len() <= 1, "two replicas lead at once: {leading:?}");
        leading.first().copied()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_server_loses_nothing_the_provisioner_remembers() {
        let mut cluster = JetStreamCluster::start().await;
        let dir = tempfile::tempdir().unwrap();
        let ca = choria_fleet::ca::CertificateAuthority::generate("cluster CA").unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.cert_pem()).unwrap();
        std::fs::write(dir.path().join("ca.key"), ca.key_pem()).unwrap();
        let seed = crate::support::signing_key(dir.path());
        let journal = dir.path().join("journal.jsonl");
        let renewal_cfg = dir.path().join("renewal.cfg");
        std::fs::write(
            &renewal_cfg,
            crate::support::plain_client_cfg("renewal.cluster", &cluster.url(0)),
        )
        .unwrap();
        // Certificates of 4 minutes, due with 75 % left: renewal begins a
        // minute after a node's provisioning, past the loss.
        let yaml = format!(
            "workers: 8\ntoken: {TOKEN}\nsite: cluster\nchoria_insecure: true\nrpc_timeout: 5s\n\
             discovery_window: 1s\nhelper: {bin} fleet-helper --ca-cert {ca} --ca-key {key} --validity 4m\n\
             features:\n  pki: true\n\
             records:\n  url: {urls}\n  bucket: {BUCKET}\n  replicas: 3\n  signing_key: {seed}\n\
             audit:\n  replicas: 3\n\
             renewal:\n  before: 75%\n  rate: 6000\n  retry: 60s\n  choria_config: {renewal}\n\
             election:\n  backend: streams\n  bucket: CLUSTER_ELECTION\n  name: provisioner\n  api_prefix: \"\"\n  \
             create_bucket: true\n  bucket_ttl: {ttl}s\n  replicas: 3\n",
            bin = binary(),
            ca = dir.path().join("ca.pem").display(),
            key = dir.path().join("ca.key").display(),
            urls = cluster.urls(),
            seed = seed.display(),
            renewal = renewal_cfg.display(),
            ttl = TTL.as_secs(),
        );
        // Replica i talks to server i + 1; the fleet to server 0.
        let mut replicas: Vec<ProvisionerProcess> = (0..2)
            .map(|i| {
                let choria = crate::support::plain_client_cfg(
                    &format!("provisioner-{i}.cluster"),
                    &cluster.url(i + 1),
                );
                ProvisionerProcess::start_named(dir.path(), &format!("p{i}"), &yaml, &choria, &[])
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        let first = loop {
            if let Some(l) = leader(&replicas) {
                break l;
            }
            assert!(Instant::now() < deadline, "no leader within 60 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        // The leader's server leads the records stream too: one kill takes
        // both.
        let doomed = first + 1;
        let records_stream = format!("KV_{BUCKET}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while cluster.leader_of(&records_stream, 0).await.is_none() {
            assert!(
                Instant::now() < deadline,
                "the records stream was never made"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        cluster.move_leader_to(&records_stream, doomed, 0).await;

        let fleet = RunningFleet::start(FleetOptions {
            broker: BrokerOptions::at([cluster.url(0)]),
            nodes: NODES,
            token: TOKEN.into(),
            journal: Some(journal.clone()),
            key_pool_size: 4,
            serve_provisioned: true,
            slow_nodes: NODES,
            slow_delay_ms: 300,
            ..Default::default()
        })
        .await;
        let leading = &replicas[first];
        let deadline = Instant::now() + Duration::from_secs(120);
        while leading.metric("choria_provisioner_records_written") < (NODES / 4) as f64 {
            assert!(Instant::now() < deadline, "{}", leading.logs_tail(20));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let key = SealKey::from_file(&seed).unwrap();
        let cfg = records_cfg(&cluster.urls(), &seed);
        let sealer = || Sealer::new(key.clone(), key.verifier(), BUCKET, "cluster");
        let before: Vec<Read> = RecordStore::connect_read_only(&cfg, sealer(), "t")
            .await
            .unwrap()
            .all()
            .await
            .unwrap();

        // The loss.
        let killed = Instant::now();
        let killed_us = chrono::Utc::now().timestamp_micros();
        cluster.kill_and_wipe(doomed);
        // The leader's server is gone: it reconnects to another server and
        // keeps leading if it can renew in time, or the other replica takes
        // over once the key expires. Either way there is never more than
        // one leader, and never none for longer than the TTL and 2 s.
        let mut none_since = None::<Instant>;
        let mut longest_without = Duration::ZERO;
        let watch_until = killed + Duration::from_secs(15);
        while Instant::now() < watch_until {
            match leader(&replicas) {
                Some(_) => none_since = None,
                None => {
                    let since = *none_since.get_or_insert_with(Instant::now);
                    longest_without = longest_without.max(since.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let restarted_us = chrono::Utc::now().timestamp_micros();
        cluster.restart(doomed);
        let deadline = Instant::now() + Duration::from_secs(60);
        let other = loop {
            match leader(&replicas) {
                Some(l) => break l,
                None => {
                    let since = *none_since.get_or_insert_with(Instant::now);
                    longest_without = longest_without.max(since.elapsed());
                }
            }
            assert!(
                Instant::now() < deadline,
                "no leader after the server came back"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let new_leader = longest_without;

        // Every node provisioned.
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            let j = crate::support::read_journal_so_far(&journal);
            let done = answered(&j, "restart").len();
            if done == NODES {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{done} of {NODES} provisioned; leader's log:\n{}",
                replicas[other].logs_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // Renewal goes on: some nodes asked and back since the loss.
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let j = crate::support::read_journal_so_far(&journal);
            let renewed = answered(&j, "reprovision")
                .values()
                .filter(|t| t.iter().any(|&t| t > killed_us))
                .count();
            if renewed >= 50 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{renewed} nodes renewed since the loss; leader's log:\n{}",
                replicas[other].logs_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // Every node's record is written, however long the loss held the
        // writes back (retried, not dropped).
        let store = RecordStore::connect_read_only(&cfg, sealer(), "t")
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let after: HashMap<String, i64> = loop {
            let after: HashMap<String, i64> = store
                .all()
                .await
                .unwrap()
                .into_iter()
                .filter_map(|r| match r {
                    Read::Verified(r) => Some((r.identity, r.time_unix)),
                    Read::Refused { .. } => None,
                })
                .collect();
            if after.len() == NODES || Instant::now() > deadline {
                break after;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        // And every node's provisioning on the audit stream.
        let audit = AuditConfig {
            stream: choria_config::audit::DEFAULT_AUDIT_STREAM.into(),
            subject: choria_config::audit::DEFAULT_AUDIT_SUBJECT.into(),
            max_age: choria_config::audit::DEFAULT_AUDIT_MAX_AGE,
            max_bytes: choria_config::audit::DEFAULT_AUDIT_MAX_BYTES,
            create_stream: false,
            replicas: 3,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let events = loop {
            let events =
                choria_core::audit::reader::read(&cfg, &audit, &key.verifier(), None, usize::MAX)
                    .await
                    .unwrap();
            let nodes: HashSet<&str> = events
                .iter()
                .filter(|e| e.event.short_kind() == "provisioned")
                .map(|e| e.event.subject.as_str())
                .collect();
            if nodes.len() == NODES || Instant::now() > deadline {
                break events;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let dropped: f64 = replicas
            .iter()
            .map(|p| p.metric("choria_provisioner_records_dropped"))
            .sum();
        let written_by_new = replicas[other].metric("choria_provisioner_records_written");
        for p in &mut replicas {
            p.signal("TERM");
            p.wait_exit(Duration::from_secs(10));
        }
        let (_, j) = fleet.finish().await;

        // No node provisioned twice: after its restart, a node is configured
        // again only when renewal asked it back. (A `configure` retried
        // before the restart, its first answer lost with the leader's
        // server, is the same provisioning delivered again.)
        let configured = answered(&j, "configure");
        let mut steps: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
        for e in j
            .iter()
            .filter(|e| e["kind"] == "action" && e["outcome"] == "ok")
        {
            let action = e["action"].as_str().unwrap_or("");
            if ["configure", "restart", "reprovision"].contains(&action) {
                steps
                    .entry(e["node"].as_str().unwrap().to_string())
                    .or_default()
                    .push((e["time_us"].as_i64().unwrap(), action.to_string()));
            }
        }
        for (node, mut seq) in steps {
            seq.sort();
            let mut restarted = false;
            for (t, action) in &seq {
                match action.as_str() {
                    "restart" => restarted = true,
                    "reprovision" => restarted = false,
                    _ => assert!(
                        !restarted,
                        "{node} configured again at {t} after its restart, not asked back:\n{seq:?}"
                    ),
                }
            }
        }
        assert_eq!(configured.len(), NODES);

        // Every record written before is there and verifies; every node
        // has a verified record.
        let mut kept = 0;
        for r in &before {
            if let Read::Verified(r) = r {
                assert!(
                    after.get(&r.identity).is_some_and(|t| *t >= r.time_unix),
                    "{}'s record was lost",
                    r.identity
                );
                kept += 1;
            }
        }
        assert_eq!(dropped, 0.0, "records dropped");
        assert_eq!(after.len(), NODES, "a verified record for every node");

        // The audit stream: each event once, a provisioning of every node.
        let mut ids = HashSet::new();
        let mut provisioned: HashMap<String, usize> = HashMap::new();
        for e in &events {
            assert!(e.unverified.is_none(), "{:?}", e.unverified);
            assert!(ids.insert(e.event.id.clone()), "event {} twice", e.event.id);
            if e.event.short_kind() == "provisioned" {
                *provisioned.entry(e.event.subject.clone()).or_default() += 1;
            }
        }
        assert_eq!(
            provisioned.len(),
            NODES,
            "a provisioned event for every node"
        );

        // What it cost: the longest gap between configured nodes while the
        // server was lost, and the rate while it was down.
        let mut times: Vec<i64> = configured.values().flatten().copied().collect();
        times.sort_unstable();
        let pause = times
            .windows(2)
            .filter(|w| w[1] > killed_us && w[0] < restarted_us)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0);
        let during = times
            .iter()
            .filter(|&&t| t > killed_us && t < restarted_us)
            .count();
        let down_s = (restarted_us - killed_us) as f64 / 1e6;
        println!(
            "cluster: {kept} records before the loss, all kept; {} verified after; {} audit events, none twice; \
             no leader for {new_leader:?} at most after its server went (replica {first} led, then {other}); \
             longest pause {:.2} s; {during} nodes configured in the {down_s:.1} s the server was down ({:.0}/min); \
             {} records written by the new leader",
            after.len(),
            events.len(),
            pause as f64 / 1e6,
            during as f64 / down_s * 60.0,
            written_by_new,
        );
        assert!(
            new_leader <= TTL + Duration::from_secs(2),
            "no leader for {new_leader:?} after the leader's server went"
        );
    }
}

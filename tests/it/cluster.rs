//! The provisioner on a real cluster of three servers: three `nats-server`
//! processes (in every run), or three real Choria brokers (`choria broker
//! run` with cluster peers, behind `CHORIA_BROKER_CLUSTER=1`). Its records,
//! revocations, audit stream and election bucket have three replicas, and,
//! in the middle of a 2,000-node run, the server that leads the records
//! stream — and that the leading provisioner is connected to — is killed
//! with -9 and its disk wiped, then started again empty. What was
//! remembered before is all there and verifies, nodes provisioned during
//! the loss are recorded, the audit stream holds each decision once, one
//! provisioner leads (never none for longer than the bucket's TTL + 2 s),
//! renewal goes on (nats-server) and no node is provisioned twice.

mod alone {
    use crate::support::broker::{ChoriaBroker, Network, PROVISIONER_PASSWORD};
    use crate::support::cluster::JetStreamCluster;
    use crate::support::gopeers::{choria_bin, make_signers, s, Signers};
    use crate::support::provisioner::{binary, ProvisionerProcess};
    use crate::support::realnodes::x509_client_config;
    use crate::support::RunningFleet;
    use async_nats::jetstream;
    use choria_config::audit::AuditConfig;
    use choria_config::day_two::RecordsConfig;
    use choria_core::audit::event::Opened;
    use choria_core::records::sealed::{Read, Sealer};
    use choria_core::records::store::RecordStore;
    use choria_fleet::FleetOptions;
    use choria_wire::client::BrokerOptions;
    use choria_wire::security::seal::SealKey;
    use serde_json::Value;
    use std::collections::{BTreeMap, HashMap, HashSet};
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    const TOKEN: &str = "clust3r-t0ken";
    const NODES: usize = 2000;
    const BUCKET: &str = "CLUSTER_RECORDS";
    /// The election bucket's TTL.
    const TTL: Duration = Duration::from_secs(10);

    /// Three servers: the fleet on the first, replica `i` of the
    /// provisioner on server `i + 1`.
    trait Site {
        /// `provisioner.yaml`'s lines that say how to reach this site: the
        /// records' connection, the election, the broker login.
        fn yaml(&self, seed: &Path) -> String;
        /// The Choria client configuration of replica `i`.
        fn choria_cfg(&self, i: usize) -> String;
        /// The fleet's broker and provisioning JWT signer.
        fn fleet(&self, opts: FleetOptions) -> FleetOptions;
        fn records(&self, seed: &Path) -> RecordsConfig;
        /// A client that may look at streams and move their leaders.
        async fn admin(&self) -> jetstream::Context;
        fn server_name(&self, i: usize) -> String;
        fn kill_and_wipe(&mut self, i: usize);
        fn restart(&mut self, i: usize);
        /// Whether the fleet's nodes answer `reprovision` once provisioned
        /// (the Choria broker admits a provisioning-mode server to its
        /// provisioning account only).
        fn renews(&self) -> bool;
    }

    fn records_cfg(urls: &str, seed: &Path) -> RecordsConfig {
        let urls: Vec<String> = urls.split(',').map(str::to_string).collect();
        RecordsConfig {
            create_bucket: false,
            replicas: 3,
            ..crate::support::records_config(&urls, BUCKET, seed)
        }
    }

    // -----------------------------------------------------------------------
    // nats-server

    struct Nats {
        cluster: JetStreamCluster,
        renewal_cfg: PathBuf,
    }

    impl Site for Nats {
        fn yaml(&self, seed: &Path) -> String {
            format!(
                "choria_insecure: true\n\
                 records:\n  url: {urls}\n  bucket: {BUCKET}\n  replicas: 3\n  signing_key: {seed}\n\
                 renewal:\n  before: 75%\n  rate: 6000\n  retry: 60s\n  choria_config: {renewal}\n\
                 election:\n  backend: streams\n  bucket: CLUSTER_ELECTION\n  name: provisioner\n  \
                 api_prefix: \"\"\n  create_bucket: true\n  bucket_ttl: {ttl}s\n  replicas: 3\n",
                urls = self.cluster.urls(),
                seed = seed.display(),
                renewal = self.renewal_cfg.display(),
                ttl = TTL.as_secs(),
            )
        }
        fn choria_cfg(&self, i: usize) -> String {
            crate::support::plain_client_cfg(
                &format!("provisioner-{i}.cluster"),
                &self.cluster.url(i + 1),
            )
        }
        fn fleet(&self, opts: FleetOptions) -> FleetOptions {
            FleetOptions {
                broker: BrokerOptions::at([self.cluster.url(0)]),
                serve_provisioned: true,
                ..opts
            }
        }
        fn records(&self, seed: &Path) -> RecordsConfig {
            records_cfg(&self.cluster.urls(), seed)
        }
        async fn admin(&self) -> jetstream::Context {
            jetstream::new(async_nats::connect(self.cluster.url(0)).await.unwrap())
        }
        fn server_name(&self, i: usize) -> String {
            format!("js-{i}")
        }
        fn kill_and_wipe(&mut self, i: usize) {
            self.cluster.kill_and_wipe(i);
        }
        fn restart(&mut self, i: usize) {
            self.cluster.restart(i);
        }
        fn renews(&self) -> bool {
            true
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_server_loses_nothing_the_provisioner_remembers() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = JetStreamCluster::start().await;
        let renewal_cfg = dir.path().join("renewal.cfg");
        std::fs::write(
            &renewal_cfg,
            crate::support::plain_client_cfg("renewal.cluster", &cluster.url(0)),
        )
        .unwrap();
        let mut site = Nats {
            cluster,
            renewal_cfg,
        };
        lose_a_server(&mut site, dir.path(), "nats-server cluster").await;
    }

    // -----------------------------------------------------------------------
    // The Choria broker

    struct Brokers {
        brokers: Vec<ChoriaBroker>,
        signers: Signers,
        /// The records' (and the test's admin) client certificate.
        records_cert: (PathBuf, PathBuf),
    }

    impl Brokers {
        fn urls(&self) -> String {
            let urls: Vec<String> = self.brokers.iter().map(ChoriaBroker::url).collect();
            urls.join(",")
        }
    }

    impl Site for Brokers {
        fn yaml(&self, seed: &Path) -> String {
            format!(
                "broker_provisioning_password: {PROVISIONER_PASSWORD}\nleader_election: true\n\
                 records:\n  url: {urls}\n  bucket: {BUCKET}\n  replicas: 3\n  tls_ca: {ca}\n  \
                 tls_cert: {cert}\n  tls_key: {key}\n  signing_key: {seed}\n",
                urls = self.urls(),
                ca = s(&self.brokers[0].ca.cert),
                cert = s(&self.records_cert.0),
                key = s(&self.records_cert.1),
                seed = seed.display(),
            )
        }
        fn choria_cfg(&self, i: usize) -> String {
            let b = &self.brokers[i + 1];
            let identity = format!("provisioner-{i}.cluster");
            let cert = b.client_cert(&format!("provisioner-{i}"), &identity);
            x509_client_config(&b.url(), &identity, &cert, &b.ca.cert)
        }
        fn fleet(&self, opts: FleetOptions) -> FleetOptions {
            FleetOptions {
                broker: BrokerOptions {
                    nats: vec![self.brokers[0].url()],
                    tls_ca: Some(self.brokers[0].ca.cert.clone()),
                    tls_required: true,
                },
                jwt_signer: Some(self.signers.rsa_key.clone()),
                ..opts
            }
        }
        fn records(&self, seed: &Path) -> RecordsConfig {
            RecordsConfig {
                tls_ca: Some(self.brokers[0].ca.cert.clone()),
                tls_client: Some(self.records_cert.clone()),
                ..records_cfg(&self.urls(), seed)
            }
        }
        async fn admin(&self) -> jetstream::Context {
            let b = &self.brokers[0];
            let client = async_nats::ConnectOptions::new()
                .add_root_certificates(b.ca.cert.clone())
                .add_client_certificate(self.records_cert.0.clone(), self.records_cert.1.clone())
                .require_tls(true)
                .connect(b.url())
                .await
                .unwrap();
            jetstream::new(client)
        }
        fn server_name(&self, i: usize) -> String {
            format!("broker-{i}.example.net")
        }
        fn kill_and_wipe(&mut self, i: usize) {
            self.brokers[i].kill_and_wipe();
        }
        fn restart(&mut self, i: usize) {
            self.brokers[i].start_again();
        }
        fn renews(&self) -> bool {
            false
        }
    }

    /// Behind `CHORIA_BROKER_CLUSTER=1` (README: what it costs): three real
    /// Choria brokers, the provisioners logged in as `provisioner`, the
    /// election on the brokers' own bucket, the records in their Streams.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_broker_of_a_choria_cluster_loses_nothing_the_provisioner_remembers() {
        const TEST: &str =
            "a_lost_broker_of_a_choria_cluster_loses_nothing_the_provisioner_remembers";
        if std::env::var("CHORIA_BROKER_CLUSTER").as_deref() != Ok("1") {
            println!("{TEST}: set CHORIA_BROKER_CLUSTER=1 to run it");
            return;
        }
        let Some(bin) = choria_bin(TEST) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let signers = make_signers(&bin, dir.path());
        let brokers = ChoriaBroker::start_cluster(
            &bin,
            &dir.path().join("brokers"),
            Network::X509,
            &signers,
            TTL,
            3,
        );
        let records_cert = brokers[0].client_cert("records", "records.example.net");
        let mut site = Brokers {
            brokers,
            signers,
            records_cert,
        };
        lose_a_server(&mut site, dir.path(), "Choria broker cluster").await;
    }

    // -----------------------------------------------------------------------
    // The scenario

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

    async fn stream_leader(js: &jetstream::Context, stream: &str) -> Option<String> {
        let mut s = js.get_stream(stream).await.ok()?;
        s.info().await.ok()?.cluster.clone()?.leader
    }

    /// Steps `stream`'s leader down until `name` leads it.
    async fn move_leader_to(js: &jetstream::Context, stream: &str, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match stream_leader(js, stream).await {
                Some(l) if l == name => return,
                // Mid-election: ask again in a moment.
                None => {}
                Some(_) => {
                    let subject = format!("STREAM.LEADER.STEPDOWN.{stream}");
                    let _ = js
                        .request::<_, Value, Value>(subject, &serde_json::json!({}))
                        .await;
                }
            }
            assert!(Instant::now() < deadline, "{stream} never led by {name}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// What a run measured and read back.
    struct Run {
        first: usize,
        killed_us: i64,
        restarted_us: i64,
        longest_without_leader: Duration,
        before: Vec<Read>,
        after: HashMap<String, i64>,
        events: Vec<Opened>,
        dropped: f64,
        journal: Vec<Value>,
    }

    async fn lose_a_server<S: Site>(site: &mut S, dir: &Path, what: &str) {
        let seed = crate::support::signing_key(dir);
        let ca = choria_fleet::ca::CertificateAuthority::generate("cluster CA").unwrap();
        std::fs::write(dir.join("ca.pem"), ca.cert_pem()).unwrap();
        std::fs::write(dir.join("ca.key"), ca.key_pem()).unwrap();
        // Certificates of 4 minutes (the CA backdates them a minute), due
        // with 75 % left: renewal begins during the loss.
        let yaml = format!(
            "workers: 8\ntoken: {TOKEN}\nsite: cluster\nrpc_timeout: 5s\ndiscovery_window: 1s\n\
             helper: {bin} fleet-helper --ca-cert {ca} --ca-key {key} --validity 4m\n\
             features:\n  pki: true\naudit:\n  replicas: 3\n{site}",
            bin = binary(),
            ca = dir.join("ca.pem").display(),
            key = dir.join("ca.key").display(),
            site = site.yaml(&seed),
        );
        let mut replicas: Vec<ProvisionerProcess> = (0..2)
            .map(|i| {
                let name = format!("p{i}");
                ProvisionerProcess::start_named(dir, &name, &yaml, &site.choria_cfg(i), &[])
            })
            .collect();
        let run = provision_through_the_loss(site, dir, &seed, &mut replicas).await;
        for p in &mut replicas {
            p.signal("TERM");
            p.wait_exit(Duration::from_secs(10));
        }
        check(&run);
        report(&run, what);
    }

    /// Waits for a leader and moves the records stream's leadership onto
    /// its server; the server's index.
    async fn doomed_server<S: Site>(site: &S, replicas: &[ProvisionerProcess]) -> usize {
        let deadline = Instant::now() + Duration::from_secs(60);
        let first = loop {
            if let Some(l) = leader(replicas) {
                break l;
            }
            assert!(Instant::now() < deadline, "no leader within 60 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let js = site.admin().await;
        let stream = format!("KV_{BUCKET}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while stream_leader(&js, &stream).await.is_none() {
            assert!(
                Instant::now() < deadline,
                "the records stream was never made"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        move_leader_to(&js, &stream, &site.server_name(first + 1)).await;
        first
    }

    async fn provision_through_the_loss<S: Site>(
        site: &mut S,
        dir: &Path,
        seed: &Path,
        replicas: &mut [ProvisionerProcess],
    ) -> Run {
        let first = doomed_server(site, replicas).await;
        let journal = dir.join("journal.jsonl");
        let fleet = RunningFleet::start(site.fleet(FleetOptions {
            nodes: NODES,
            token: TOKEN.into(),
            journal: Some(journal.clone()),
            key_pool_size: 4,
            slow_nodes: NODES,
            slow_delay_ms: 300,
            ..Default::default()
        }))
        .await;
        let deadline = Instant::now() + Duration::from_secs(120);
        while replicas[first].metric("choria_provisioner_records_written") < (NODES / 4) as f64 {
            assert!(
                Instant::now() < deadline,
                "{}",
                replicas[first].logs_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let cfg = site.records(seed);
        let key = SealKey::from_file(seed).unwrap();
        let sealer = Sealer::new(key.clone(), key.verifier(), BUCKET, "cluster");
        let store = RecordStore::connect_read_only(&cfg, sealer, "t")
            .await
            .unwrap();
        let before = store.all().await.unwrap();

        let killed_us = chrono::Utc::now().timestamp_micros();
        site.kill_and_wipe(first + 1);
        let mut gaps = LeaderGaps::default();
        gaps.watch(replicas, Duration::from_secs(15)).await;
        let restarted_us = chrono::Utc::now().timestamp_micros();
        site.restart(first + 1);
        gaps.until_led(replicas).await;

        wait_provisioned(&journal, replicas).await;
        if site.renews() {
            wait_renewed(&journal, killed_us, replicas).await;
        }
        let after = wait_records(&store).await;
        let events = wait_audit(&cfg, &key).await;
        let dropped = replicas
            .iter()
            .map(|p| p.metric("choria_provisioner_records_dropped"))
            .sum();
        let (_, journal) = fleet.finish().await;
        Run {
            first,
            killed_us,
            restarted_us,
            longest_without_leader: gaps.longest,
            before,
            after,
            events,
            dropped,
            journal,
        }
    }

    /// The longest time no replica led.
    #[derive(Default)]
    struct LeaderGaps {
        since: Option<Instant>,
        longest: Duration,
    }

    impl LeaderGaps {
        fn sample(&mut self, replicas: &[ProvisionerProcess]) -> Option<usize> {
            let l = leader(replicas);
            match l {
                Some(_) => self.since = None,
                None => {
                    let since = *self.since.get_or_insert_with(Instant::now);
                    self.longest = self.longest.max(since.elapsed());
                }
            }
            l
        }

        /// The leader's server is gone: it reconnects to another server and
        /// keeps leading if it renews in time, or the other replica takes
        /// over once the key expires.
        async fn watch(&mut self, replicas: &[ProvisionerProcess], for_: Duration) {
            let until = Instant::now() + for_;
            while Instant::now() < until {
                self.sample(replicas);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }

        async fn until_led(&mut self, replicas: &[ProvisionerProcess]) {
            let deadline = Instant::now() + Duration::from_secs(60);
            while self.sample(replicas).is_none() {
                assert!(
                    Instant::now() < deadline,
                    "no leader after the server came back"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    async fn wait_provisioned(journal: &Path, replicas: &[ProvisionerProcess]) {
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            let done = answered(&crate::support::read_journal_so_far(journal), "restart").len();
            if done == NODES {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{done} of {NODES} provisioned; logs:\n{}\n{}",
                replicas[0].logs_tail(20),
                replicas[1].logs_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Renewal goes on: nodes asked back since the loss.
    async fn wait_renewed(journal: &Path, killed_us: i64, replicas: &[ProvisionerProcess]) {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let renewed = answered(&crate::support::read_journal_so_far(journal), "reprovision")
                .values()
                .filter(|t| t.iter().any(|&t| t > killed_us))
                .count();
            if renewed >= 50 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{renewed} nodes renewed since the loss; logs:\n{}\n{}",
                replicas[0].logs_tail(20),
                replicas[1].logs_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Every node's newest verified record, once all are written (retried
    /// through the loss, not dropped) or a minute passed.
    async fn wait_records(store: &RecordStore) -> HashMap<String, i64> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
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
                return after;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The audit stream, once every node's provisioning is on it or a
    /// minute passed.
    async fn wait_audit(cfg: &RecordsConfig, key: &SealKey) -> Vec<Opened> {
        let audit = AuditConfig {
            stream: choria_config::audit::DEFAULT_AUDIT_STREAM.into(),
            subject: choria_config::audit::DEFAULT_AUDIT_SUBJECT.into(),
            max_age: choria_config::audit::DEFAULT_AUDIT_MAX_AGE,
            max_bytes: choria_config::audit::DEFAULT_AUDIT_MAX_BYTES,
            create_stream: false,
            replicas: 3,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let events =
                choria_core::audit::reader::read(cfg, &audit, &key.verifier(), None, usize::MAX)
                    .await
                    .unwrap();
            let nodes: HashSet<&str> = events
                .iter()
                .filter(|e| e.event.short_kind() == "provisioned")
                .map(|e| e.event.subject.as_str())
                .collect();
            if nodes.len() == NODES || Instant::now() > deadline {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    fn check(run: &Run) {
        provisioned_once(&run.journal);
        for r in &run.before {
            if let Read::Verified(r) = r {
                assert!(
                    run.after
                        .get(&r.identity)
                        .is_some_and(|t| *t >= r.time_unix),
                    "{}'s record was lost",
                    r.identity
                );
            }
        }
        assert_eq!(run.dropped, 0.0, "records dropped");
        assert_eq!(run.after.len(), NODES, "a verified record for every node");
        let mut ids = HashSet::new();
        let mut provisioned = HashSet::new();
        for e in &run.events {
            assert!(e.unverified.is_none(), "{:?}", e.unverified);
            assert!(ids.insert(e.event.id.clone()), "event {} twice", e.event.id);
            if e.event.short_kind() == "provisioned" {
                provisioned.insert(e.event.subject.clone());
            }
        }
        assert_eq!(
            provisioned.len(),
            NODES,
            "a provisioned event for every node"
        );
        assert!(
            run.longest_without_leader <= TTL + Duration::from_secs(2),
            "no leader for {:?} after the leader's server went",
            run.longest_without_leader
        );
    }

    /// After its restart a node is configured again only when renewal asked
    /// it back. (A `configure` retried before the restart, its first answer
    /// lost with the leader's server, is the same provisioning delivered
    /// again.)
    fn provisioned_once(journal: &[Value]) {
        let mut steps: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
        for e in journal
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
        assert_eq!(steps.len(), NODES);
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
    }

    /// What the loss cost: the longest gap between configured nodes while
    /// the server was down, and the rate then.
    fn report(run: &Run, what: &str) {
        let mut times: Vec<i64> = answered(&run.journal, "configure")
            .into_values()
            .flatten()
            .collect();
        times.sort_unstable();
        let (killed, back) = (run.killed_us, run.restarted_us);
        let pause = times
            .windows(2)
            .filter(|w| w[1] > killed && w[0] < back)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0);
        let during = times.iter().filter(|&&t| t > killed && t < back).count();
        let down_s = (back - killed) as f64 / 1e6;
        let verified_before = run
            .before
            .iter()
            .filter(|r| matches!(r, Read::Verified(_)))
            .count();
        println!(
            "{what}: {verified_before} records before the loss, all kept; {} verified after; \
             {} audit events, none twice; no leader for {:?} at most (replica {} led when its \
             server went); longest pause {:.2} s; {during} nodes configured in the {down_s:.1} s \
             the server was down ({:.0}/min)",
            run.after.len(),
            run.events.len(),
            run.longest_without_leader,
            run.first,
            pause as f64 / 1e6,
            during as f64 / down_s * 60.0,
        );
    }
}

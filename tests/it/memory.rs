//! What the provisioner remembers — revocations, instance bindings, records
//! — survives every other writer of its buckets, and a restart: a delete, a
//! purge, a value that is not ours, an old value of ours put back again and
//! a flood of puts each leave a revocation in force, an instance bound to
//! its first identity and renewal on the newest record, both for a reader
//! that was following while it happened and for one that starts after
//! (what a restarted replica is). Against a real nats-server with JetStream.

use crate::support::NatsServer;
use async_nats::jetstream::{self, kv};
use choria_config::day_two::{Before, RecordsConfig, RenewalConfig};
use choria_core::bindings::{Bindings, Bound};
use choria_core::provision::day_two::renewal::Schedule;
use choria_core::records::sealed::{Read, Sealer};
use choria_core::records::store::{RecordStore, RecordsError};
use choria_core::records::Record;
use choria_core::revocations::{Revocation, RevocationStore, Revoked};
use choria_wire::security::seal::SealKey;
use futures::StreamExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SITE: &str = "memory";
const NODE: &str = "web-1.example.net";

/// What someone who may write a bucket (any holder of a CA-signed
/// certificate on an x509 Choria network) does to one key.
#[derive(Clone, Copy, Debug)]
enum Attack {
    /// `kv del`, and a delete of its messages through the JetStream API.
    Delete,
    /// `kv purge`, and a purge of the stream's subject.
    Purge,
    /// A value of its own (not sealed by us) over ours.
    Junk,
    /// An older value of ours, taken from the key's history, put back.
    OldSealed,
    /// More puts than the key's history holds.
    Flood,
}

const ATTACKS: [Attack; 5] = [
    Attack::Delete,
    Attack::Purge,
    Attack::Junk,
    Attack::OldSealed,
    Attack::Flood,
];

struct Bench {
    nats: NatsServer,
    _store: tempfile::TempDir,
    key: SealKey,
}

impl Bench {
    fn start() -> Self {
        let store = tempfile::tempdir().unwrap();
        let nats = NatsServer::start_with(&format!(
            "jetstream {{ store_dir: \"{}\" }}\n",
            store.path().display()
        ));
        Bench {
            nats,
            _store: store,
            key: SealKey::generate(),
        }
    }

    fn records(&self, bucket: &str) -> RecordsConfig {
        crate::support::records_config(&[self.nats.url()], bucket, Path::new("unused"))
    }

    async fn js(&self) -> jetstream::Context {
        jetstream::new(async_nats::connect(self.nats.url()).await.unwrap())
    }

    async fn revocations(&self, cfg: &RecordsConfig) -> RevocationStore {
        RevocationStore::connect(cfg, self.key.clone(), self.key.verifier(), SITE, "test")
            .await
            .unwrap()
    }

    /// The attacker's doing, on `key` of `bucket`; `old` is an older value
    /// of ours there. What the server refuses is what it refuses.
    async fn attack(&self, bucket: &str, key: &str, attack: Attack, old: &[u8]) {
        let js = self.js().await;
        let store = js.get_key_value(bucket).await.unwrap();
        match attack {
            Attack::Delete => {
                let _ = store.delete(key).await;
                if let Ok(stream) = js.get_stream(format!("KV_{bucket}")).await {
                    for seq in 1..=stream.cached_info().state.last_sequence {
                        let _ = stream.delete_message(seq).await;
                    }
                }
            }
            Attack::Purge => {
                let _ = store.purge(key).await;
                if let Ok(stream) = js.get_stream(format!("KV_{bucket}")).await {
                    let _ = stream.purge().filter(format!("$KV.{bucket}.{key}")).await;
                }
            }
            Attack::Junk => {
                let _ = store
                    .put(key, br#"{"revoked":false,"identity":"x"}"#.to_vec().into())
                    .await;
            }
            Attack::OldSealed => {
                let _ = store.put(key, old.to_vec().into()).await;
            }
            Attack::Flood => {
                for i in 0..100 {
                    let _ = store
                        .put(key, format!("flood {i}").into_bytes().into())
                        .await;
                }
            }
        }
    }
}

fn word(identity: &str, revoked: bool, reason: &str) -> Revocation {
    let now = chrono::Utc::now();
    Revocation {
        identity: identity.into(),
        revoked,
        reason: reason.into(),
        time: now.to_rfc3339(),
        time_unix: now.timestamp(),
        by: "test".into(),
        site: SITE.into(),
        n: 0,
    }
}

/// The value of `key` in `bucket` whose sealed text contains `needle`.
async fn stored_value(js: &jetstream::Context, bucket: &str, key: &str, needle: &str) -> Vec<u8> {
    let store = js.get_key_value(bucket).await.unwrap();
    let mut h = store.history(key).await.unwrap();
    while let Some(e) = h.next().await {
        let e = e.unwrap();
        if String::from_utf8_lossy(&e.value).contains(needle) {
            return e.value.to_vec();
        }
    }
    panic!("no value of {key} in {bucket} holds {needle:?}");
}

/// A replica's follower of the revocations, running until dropped.
struct Follower {
    revoked: Revoked,
    refused: Arc<AtomicUsize>,
    stop: tokio_util::sync::CancellationToken,
}

impl Follower {
    async fn start(bench: &Bench, cfg: &RecordsConfig) -> Self {
        let store = bench.revocations(cfg).await;
        let revoked = Revoked::default();
        let refused = Arc::new(AtomicUsize::new(0));
        let stop = tokio_util::sync::CancellationToken::new();
        let (r, n, s) = (revoked.clone(), refused.clone(), stop.clone());
        tokio::spawn(async move {
            let _ = store
                .follow(&r, || _ = n.fetch_add(1, Ordering::Relaxed), s)
                .await;
        });
        assert!(
            revoked.wait_loaded(Duration::from_secs(10)).await,
            "the follower read the bucket to its end"
        );
        Follower {
            revoked,
            refused,
            stop,
        }
    }

    /// Waits until the follower saw `identity` revoked: whatever was
    /// written before it was read too.
    async fn wait_for(&self, identity: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.revoked.of(identity).is_none() {
            assert!(Instant::now() < deadline, "{identity} never read");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_survives_every_bucket_writer_attack_running_and_after_a_restart() {
    let bench = Bench::start();
    for attack in ATTACKS {
        let cfg = bench.records(&format!("REV_{attack:?}").to_uppercase());
        let store = bench.revocations(&cfg).await;
        // Revoked, lifted, revoked again: the lifting is an older value of
        // ours an attacker can put back.
        store.put(&word(NODE, true, "stolen")).await.unwrap();
        store.put(&word(NODE, false, "found")).await.unwrap();
        store.put(&word(NODE, true, "stolen again")).await.unwrap();
        let lifting = stored_value(
            &bench.js().await,
            &format!("{}_REVOCATIONS", cfg.bucket),
            NODE,
            r#"\"revoked\":false"#,
        )
        .await;
        let running = Follower::start(&bench, &cfg).await;
        assert!(running.revoked.of(NODE).is_some());

        bench
            .attack(
                &format!("{}_REVOCATIONS", cfg.bucket),
                NODE,
                attack,
                &lifting,
            )
            .await;
        // A revocation written after the attack: once the running replica
        // read it, it read the attack too.
        store
            .put(&word("sentinel.example.net", true, "sentinel"))
            .await
            .unwrap();
        running.wait_for("sentinel.example.net").await;
        let held = running.revoked.of(NODE).map(|r| r.reason);
        assert_eq!(
            held.as_deref(),
            Some("stolen again"),
            "{attack:?}: a running replica"
        );

        let restarted = Follower::start(&bench, &cfg).await;
        let held = restarted.revoked.of(NODE).map(|r| r.reason);
        assert_eq!(
            held.as_deref(),
            Some("stolen again"),
            "{attack:?}: after a restart"
        );
        let (current, _) = store.current(NODE).await.unwrap();
        assert!(
            current.is_some_and(|r| r.revoked),
            "{attack:?}: what revoke reads"
        );
        let listed: Vec<String> = store
            .revoked()
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.identity)
            .collect();
        assert!(
            listed.contains(&NODE.to_string()),
            "{attack:?}: what nodes lists"
        );
        if matches!(attack, Attack::Junk | Attack::Flood) {
            assert!(
                restarted.refused.load(Ordering::Relaxed) > 0,
                "{attack:?}: the foreign values were counted"
            );
        }
        // And the operator's word still moves it: lifted, and revoked
        // again, over whatever the attacker left in the key.
        store.put(&word(NODE, false, "cleared")).await.unwrap();
        let after = Follower::start(&bench, &cfg).await;
        assert!(
            after.revoked.of(NODE).is_none(),
            "{attack:?}: unrevoke still works"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flooded_before_its_first_revocation_still_takes_one() {
    let bench = Bench::start();
    let cfg = bench.records("REV_PREFLOOD");
    let store = bench.revocations(&cfg).await;
    // The node itself, expecting to be revoked, fills its key first.
    bench
        .attack(
            &format!("{}_REVOCATIONS", cfg.bucket),
            NODE,
            Attack::Flood,
            b"",
        )
        .await;
    store.put(&word(NODE, true, "stolen")).await.unwrap();
    let restarted = Follower::start(&bench, &cfg).await;
    assert_eq!(
        restarted.revoked.of(NODE).map(|r| r.reason).as_deref(),
        Some("stolen")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_binding_survives_every_bucket_writer_attack() {
    const INSTANCE: &str = "aws.i-0123456789abcdef0";
    let bench = Bench::start();
    for attack in ATTACKS {
        let cfg = bench.records(&format!("BIND_{attack:?}").to_uppercase());
        let bindings = Bindings::connect(&cfg, bench.key.clone(), bench.key.verifier(), SITE, "t")
            .await
            .unwrap();
        assert_eq!(
            bindings
                .bind(INSTANCE, NODE, false, 1_800_000_000)
                .await
                .unwrap(),
            Bound::New
        );
        let ours = stored_value(
            &bench.js().await,
            &format!("{}_INSTANCES", cfg.bucket),
            INSTANCE,
            NODE,
        )
        .await;
        bench
            .attack(
                &format!("{}_INSTANCES", cfg.bucket),
                INSTANCE,
                attack,
                &ours,
            )
            .await;
        // Bindings are read from the bucket at each node: a replica
        // started now reads what a running one does.
        let fresh = Bindings::connect(&cfg, bench.key.clone(), bench.key.verifier(), SITE, "t")
            .await
            .unwrap();
        assert_eq!(
            fresh
                .bind(INSTANCE, "web-2.example.net", false, 1_800_000_100)
                .await
                .unwrap(),
            Bound::Other(NODE.into()),
            "{attack:?}: another name is still refused"
        );
        assert_eq!(
            fresh
                .bind(INSTANCE, NODE, false, 1_800_000_100)
                .await
                .unwrap(),
            Bound::Same,
            "{attack:?}: the bound name is still the one"
        );
    }
}

fn record(identity: &str, time_unix: i64, expires_unix: i64) -> Record {
    Record {
        identity: identity.into(),
        time: String::new(),
        time_unix,
        replica: "r1".into(),
        site: SITE.into(),
        protocol: "v2".into(),
        mode: "template".into(),
        signer: None,
        certificate: None,
        server_jwt: Some(choria_core::records::ServerJwtRecord {
            jti: format!("j{time_unix}"),
            issued_unix: time_unix,
            expires_unix,
            collectives: vec!["choria".into()],
        }),
        config_sha256: "00".into(),
        provisioning_jwt_expires_unix: None,
    }
}

fn renewal() -> RenewalConfig {
    RenewalConfig {
        before: Before::parse("20%").unwrap(),
        jitter: Duration::ZERO,
        rate: 100,
        choria_config: "unused".into(),
        collective: "choria".into(),
        retry: Duration::from_secs(600),
    }
}

/// What renewal makes of the records a fresh watch reads up to the
/// sentinel node's record.
async fn schedule_from_watch(store: &RecordStore) -> Schedule {
    let mut schedule = Schedule::default();
    let mut watch = store.watch().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let read = tokio::time::timeout_at(deadline.into(), watch.next())
            .await
            .expect("the sentinel's record was read")
            .expect("the watch goes on");
        if let Read::Verified(r) = read {
            schedule.upsert(&r, &renewal());
            if r.identity == "sentinel.example.net" {
                return schedule;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_acts_on_the_newest_sealed_record_whatever_is_written_after_it() {
    let bench = Bench::start();
    let now = chrono::Utc::now().timestamp();
    for attack in ATTACKS {
        let cfg = bench.records(&format!("REC_{attack:?}").to_uppercase());
        let sealer = Sealer::new(bench.key.clone(), bench.key.verifier(), &cfg.bucket, SITE);
        let store = RecordStore::connect(&cfg, sealer, "t").await.unwrap();
        // Its first credential ran out long ago; its newest lasts a year.
        let old = record(NODE, now - 86_400, now - 3_600);
        let newest = record(NODE, now - 60, now + 365 * 86_400);
        store.put(&old).await.unwrap();
        let old_value = stored_value(
            &bench.js().await,
            &cfg.bucket,
            NODE,
            &format!("j{}", now - 86_400),
        )
        .await;
        store.put(&newest).await.unwrap();
        let running = store.watch().await.unwrap();

        bench.attack(&cfg.bucket, NODE, attack, &old_value).await;
        store
            .put(&record("sentinel.example.net", now, now + 86_400))
            .await
            .unwrap();

        // A running reader (fed before the attack) and one started after.
        let mut schedule = Schedule::default();
        let mut running = running;
        loop {
            match running.next().await.unwrap() {
                Read::Verified(r) if r.identity == "sentinel.example.net" => break,
                Read::Verified(r) => _ = schedule.upsert(&r, &renewal()),
                Read::Refused { .. } => {}
            }
        }
        for (who, s) in [
            ("a running replica", schedule),
            ("after a restart", schedule_from_watch(&store).await),
        ] {
            let due: Vec<String> = s.due(now, 10).into_iter().map(|d| d.identity).collect();
            assert!(
                !due.contains(&NODE.to_string()),
                "{attack:?}, {who}: renewal took an old record and asks the node now"
            );
            assert!(
                !s.is_empty(),
                "{attack:?}, {who}: the node is still scheduled"
            );
        }
        let all = store.all().await.unwrap();
        let listed = all.iter().find_map(|r| match r {
            Read::Verified(r) if r.identity == NODE => Some(r.time_unix),
            _ => None,
        });
        assert_eq!(
            listed,
            Some(newest.time_unix),
            "{attack:?}: nodes lists the newest"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_go_on_past_a_keys_history() {
    let bench = Bench::start();
    let cfg = RecordsConfig {
        history: 2,
        ..bench.records("REC_HISTORY")
    };
    let sealer = Sealer::new(bench.key.clone(), bench.key.verifier(), &cfg.bucket, SITE);
    let store = RecordStore::connect(&cfg, sealer, "t").await.unwrap();
    let now = chrono::Utc::now().timestamp();
    for i in 0..5 {
        store
            .put(&record(NODE, now + i, now + 1000 + i))
            .await
            .unwrap();
    }
    let all = store.all().await.unwrap();
    assert_eq!(all.len(), 1, "one node, whatever keys it took: {all:?}");
    assert!(matches!(&all[0], Read::Verified(r) if r.time_unix == now + 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_an_earlier_version_made_is_protected_or_its_fix_named() {
    let bench = Bench::start();
    let js = bench.js().await;
    for bucket in ["OLD_A", "OLD_B"] {
        js.create_key_value(kv::Config {
            bucket: bucket.into(),
            history: 5,
            ..Default::default()
        })
        .await
        .unwrap();
    }
    // Ours to make: protected in place, its values kept.
    let sealer = |b: &str| Sealer::new(bench.key.clone(), bench.key.verifier(), b, SITE);
    let cfg = bench.records("OLD_A");
    let store = RecordStore::connect(&cfg, sealer("OLD_A"), "t")
        .await
        .unwrap();
    store.put(&record(NODE, 1, 2)).await.unwrap();
    let info = js
        .get_stream("KV_OLD_A")
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone();
    assert!(info.deny_purge && !info.allow_rollup && info.discard_new_per_subject);
    // Someone else's (create_bucket: false): refused, saying what to change.
    let cfg = RecordsConfig {
        create_bucket: false,
        ..bench.records("OLD_B")
    };
    let e = RecordStore::connect(&cfg, sealer("OLD_B"), "t")
        .await
        .err()
        .expect("an unprotected bucket is refused");
    assert!(matches!(e, RecordsError::Unprotected { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("deny_purge: true")
            && text.contains("nats stream edit KV_OLD_B")
            && text.contains("--discard-per-subject"),
        "{text}"
    );
    // `nodes` still reads it.
    assert!(RecordStore::connect_read_only(&cfg, sealer("OLD_B"), "t")
        .await
        .is_ok());
}

// ---------------------------------------------------------------------------
// The real `choria-provisioner run`: a revocation made with the command holds
// through every attack and a restart; revocations that cannot be read hold
// every node.

mod process {
    use super::*;
    use crate::support::provisioner::{binary, ProvisionerProcess};
    use crate::support::RunningFleet;
    use choria_fleet::FleetOptions;
    use choria_wire::client::BrokerOptions;

    const TOKEN: &str = "mem0ry-t0ken";
    const NODES: usize = 3;
    const REVOKED: &str = "node-001.fleet.example.net";

    fn yaml(url: &str, bucket: &str, records_extra: &str, seed: &std::path::Path) -> String {
        format!(
            "workers: 4\ntoken: {TOKEN}\nsite: {SITE}\nchoria_insecure: true\nrpc_timeout: 3s\n\
             discovery_window: 500ms\nloglevel: info\nconfiguration_template:\n  configuration:\n    identity: '{{{{ identity }}}}'\n    plugin.choria.server.provision: 'false'\n\
             records:\n  url: {url}\n  bucket: {bucket}\n  signing_key: {seed}\n{records_extra}",
            seed = seed.display()
        )
    }

    async fn fleet(url: &str, journal: &std::path::Path) -> RunningFleet {
        RunningFleet::start(FleetOptions {
            broker: BrokerOptions::at([url.to_string()]),
            nodes: NODES,
            token: TOKEN.into(),
            journal: Some(journal.to_path_buf()),
            ..Default::default()
        })
        .await
    }

    fn configured(journal: &std::path::Path, node: &str) -> usize {
        crate::support::read_journal_so_far(journal)
            .iter()
            .filter(|e| {
                e["kind"] == "action"
                    && e["action"] == "configure"
                    && e["outcome"] == "ok"
                    && e["node"] == node
            })
            .count()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_revoked_node_stays_out_through_every_attack_and_a_restart() {
        let bench = Bench::start();
        let dir = tempfile::tempdir().unwrap();
        let seed = crate::support::signing_key(dir.path());
        let journal = dir.path().join("journal.jsonl");
        let yaml = yaml(&bench.nats.url(), "MEM_E2E", "", &seed);
        let cli_yaml = dir.path().join("cli.yaml");
        std::fs::write(&cli_yaml, &yaml).unwrap();
        let cli = |args: &[&str]| {
            crate::support::stdout_of(
                std::process::Command::new(binary())
                    .args(args)
                    .arg("--config")
                    .arg(&cli_yaml),
            )
        };
        // Revoked, lifted, revoked: the lifting is there to be put back.
        cli(&["revoke", REVOKED, "--reason", "stolen", "--force"]);
        cli(&["unrevoke", REVOKED]);
        cli(&["revoke", REVOKED, "--reason", "stolen again", "--force"]);
        let lifting = stored_value(
            &bench.js().await,
            "MEM_E2E_REVOCATIONS",
            REVOKED,
            r#"\"revoked\":false"#,
        )
        .await;

        let _fleet = fleet(&bench.nats.url(), &journal).await;
        let choria = crate::support::plain_client_cfg("provisioner.memory", &bench.nats.url());
        let mut p = ProvisionerProcess::start(dir.path(), &yaml, &choria, &[]);
        p.wait_for_metric(
            "choria_provisioner_provisioned",
            (NODES - 1) as f64,
            Duration::from_secs(60),
        )
        .await;
        p.wait_for_metric(
            "choria_provisioner_revoked_refusals{action=\"provision\"",
            1.0,
            Duration::from_secs(30),
        )
        .await;

        for attack in ATTACKS {
            bench
                .attack("MEM_E2E_REVOCATIONS", REVOKED, attack, &lifting)
                .await;
        }
        // The running replica read them all (a revocation written after
        // them is counted), then a restart.
        cli(&[
            "revoke",
            "sentinel.example.net",
            "--reason",
            "sentinel",
            "--force",
        ]);
        p.wait_for_metric(
            "choria_provisioner_revocations",
            2.0,
            Duration::from_secs(15),
        )
        .await;
        p.signal("TERM");
        p.wait_exit(Duration::from_secs(10));
        let mut p = ProvisionerProcess::start(dir.path(), &yaml, &choria, &[]);
        // The node still waits in provisioning mode: the new process finds
        // it at its first discovery and refuses it again.
        p.wait_for_metric(
            "choria_provisioner_revoked_refusals{action=\"provision\"",
            1.0,
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(configured(&journal, REVOKED), 0, "{}", p.logs_tail(30));
        assert!(
            cli(&["nodes"])
                .lines()
                .any(|l| l.starts_with(REVOKED) && l.contains("stolen again")),
            "nodes still shows the revocation"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn revocations_that_cannot_be_read_hold_every_node() {
        // The records' user may not touch the revocations' stream: every
        // read of it fails (no answer), as a permission, a timeout or
        // JetStream away would. The records live on a server of their own
        // (the fleet's JWT tokens are no users of this one).
        let broker = NatsServer::start();
        let store = tempfile::tempdir().unwrap();
        let nats = NatsServer::start_with(&format!(
            "jetstream {{ store_dir: \"{}\" }}\n\
             accounts {{ A {{ jetstream: enabled, users: [\n\
               {{ user: fleet, password: fleet }}\n\
               {{ user: prov, password: prov, permissions: {{ publish: {{ deny: [\n\
                 \"$JS.API.*.*.KV_HELD_REVOCATIONS\", \"$JS.API.*.*.KV_HELD_REVOCATIONS.>\" ] }} }} }}\n\
             ] }} }}\nno_auth_user: fleet\n",
            store.path().display()
        ));
        let dir = tempfile::tempdir().unwrap();
        let seed = crate::support::signing_key(dir.path());
        let journal = dir.path().join("journal.jsonl");
        // The buckets exist (made by someone who may), and are not ours to make.
        let key = SealKey::from_file(&seed).unwrap();
        let made = crate::support::records_config(&[nats.url()], "HELD", &seed);
        let sealer = Sealer::new(key.clone(), key.verifier(), "HELD", SITE);
        RecordStore::connect(&made, sealer, "t").await.unwrap();
        RevocationStore::connect(&made, key.clone(), key.verifier(), SITE, "t")
            .await
            .unwrap();

        let yaml = yaml(
            &nats.url(),
            "HELD",
            "  create_bucket: false\n  user: prov\n  password: prov\n",
            &seed,
        );
        let _fleet = fleet(&broker.url(), &journal).await;
        let choria = crate::support::plain_client_cfg("provisioner.held", &broker.url());
        let mut p = ProvisionerProcess::start(dir.path(), &yaml, &choria, &[]);
        p.wait_for_metric(
            "choria_provisioner_memory_read_errors{bucket=\"revocations\"",
            1.0,
            Duration::from_secs(60),
        )
        .await;
        p.wait_for_metric(
            "choria_provisioner_sequences",
            NODES as f64,
            Duration::from_secs(30),
        )
        .await;
        // Every node is in its sequence and waits for the revocations; with
        // them read as "none" each was configured within a second (3 s here).
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            p.metric("choria_provisioner_provisioned"),
            0.0,
            "{}",
            p.logs_tail(30)
        );
        let (status, body) = p.get("/readyz");
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("revocations"), "/readyz says why: {body}");
        assert!(p.logs().contains("cannot read the revocations"));
    }

    /// What no stream setting can stop — a client allowed the JetStream
    /// API deleting a bucket — is seen and said: a SECURITY line, the
    /// metric, and `/readyz`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bucket_deleted_through_the_api_is_reported() {
        let bench = Bench::start();
        let dir = tempfile::tempdir().unwrap();
        let seed = crate::support::signing_key(dir.path());
        let yaml = yaml(&bench.nats.url(), "MEM_GUARD", "", &seed);
        let choria = crate::support::plain_client_cfg("provisioner.guard", &bench.nats.url());
        let p = ProvisionerProcess::start(dir.path(), &yaml, &choria, &[]);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !p
            .logs()
            .lines()
            .any(|l| l.contains("watching the bucket") && l.contains("MEM_GUARD_REVOCATIONS"))
        {
            assert!(Instant::now() < deadline, "{}", p.logs_tail(20));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bench
            .js()
            .await
            .delete_stream("KV_MEM_GUARD_REVOCATIONS")
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while p.metric("choria_provisioner_memory_erased{bucket=\"revocations\"") < 1.0 {
            assert!(Instant::now() < deadline, "not seen: {}", p.logs_tail(20));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (status, body) = p.get("/readyz");
        assert_eq!(status, 503, "{body}");
        assert!(
            body.contains("memory") && body.contains("MEM_GUARD_REVOCATIONS"),
            "{body}"
        );
        assert!(p
            .logs()
            .contains("SECURITY: what the provisioner remembers was erased"));
    }
}

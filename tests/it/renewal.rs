//! Day two against the simulated fleet on a real nats-server with
//! JetStream: every provisioning is on record in a KV bucket, and
//! certificates are renewed before they expire — `reprovision` to the node
//! in its collective, the node back through provisioning, a new record —
//! by the replica that owns the node (two replicas in shards mode).
//! `choria-provisioner nodes` lists the records.

use crate::support::provisioner::{binary, ProvisionerProcess};
use crate::support::{NatsServer, RunningFleet};
use choria_fleet::FleetOptions;
use choria_wire::client::BrokerOptions;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const TOKEN: &str = "ren3wal-t0ken";
const NODES: usize = 40;

/// A run directory holding `ca.pem` and `ca.key` (a CA named `name`), and
/// a nats-server with JetStream (its store in the second directory).
fn jetstream_and_ca(name: &str) -> (tempfile::TempDir, tempfile::TempDir, NatsServer) {
    let dir = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let nats = NatsServer::start_with(&format!(
        "jetstream {{ store_dir: \"{}\" }}\n",
        store.path().display()
    ));
    let ca = choria_fleet::ca::CertificateAuthority::generate(name).unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.cert_pem()).unwrap();
    std::fs::write(dir.path().join("ca.key"), ca.key_pem()).unwrap();
    (dir, store, nats)
}

/// `nodes` simulated servers that keep serving once provisioned (they
/// answer `reprovision`), journaling into `journal`.
async fn serving_fleet(nats: &NatsServer, nodes: usize, journal: &std::path::Path) -> RunningFleet {
    RunningFleet::start(FleetOptions {
        broker: BrokerOptions::at([nats.url()]),
        nodes,
        token: TOKEN.into(),
        journal: Some(journal.to_path_buf()),
        key_pool_size: 2,
        serve_provisioned: true,
        ..Default::default()
    })
    .await
}

/// The renewal client's Choria configuration in `dir`, on `nats`: its path.
fn renewal_client_cfg(dir: &std::path::Path, nats: &NatsServer) -> std::path::PathBuf {
    let renewal_cfg = dir.join("renewal.cfg");
    std::fs::write(
        &renewal_cfg,
        crate::support::plain_client_cfg("renewal.example.net", &nats.url()),
    )
    .unwrap();
    renewal_cfg
}

/// Requests of `action` per node, with their senders.
fn senders(journal: &[Value], action: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in journal
        .iter()
        .filter(|e| e["kind"] == "action" && e["action"] == action && e["outcome"] == "ok")
    {
        out.entry(e["node"].as_str().unwrap().to_string())
            .or_default()
            .push(e["sender"].as_str().unwrap().to_string());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_kept_and_certificates_renewed_twice_by_their_owner() {
    let (dir, _store, nats) = jetstream_and_ca("renewal CA");
    let journal = dir.path().join("journal.jsonl");
    let fleet = serving_fleet(&nats, NODES, &journal).await;
    let mut replicas = given_two_replicas_renewing_in_shards(dir.path(), &nats);
    when_every_node_is_configured_three_times(&journal, &replicas).await;
    let Counts {
        sent,
        written,
        on_record,
        transitions,
    } = what_the_replicas_counted(&replicas);
    let (listed, table) = what_nodes_lists(dir.path());
    for mut p in replicas.drain(..) {
        p.signal("TERM");
        assert!(p.wait_exit(Duration::from_secs(5)).success());
    }
    let (_, j) = fleet.finish().await;

    println!(
        "{NODES} nodes renewed twice each: {sent} reprovision requests sent, {written} records written, {on_record} on record"
    );
    then_nodes_lists_one_verified_record_per_node(&listed, &table);
    then_each_node_was_renewed_by_its_owner(&j, &transitions, sent, written);
}

/// Two replicas in shards keeping records and renewing certificates that
/// are valid 2 minutes.
fn given_two_replicas_renewing_in_shards(
    dir: &std::path::Path,
    nats: &NatsServer,
) -> Vec<ProvisionerProcess> {
    let renewal_cfg = renewal_client_cfg(dir, nats);
    // Certificates valid 2 minutes, due with 90 % of that left: 12 s after
    // issue. The renewal client speaks to the nodes' collective.
    let yaml = format!(
        "workers: 8\ninterval: 1m\ntoken: {TOKEN}\nsite: renewal\nchoria_insecure: true\nrpc_timeout: 3s\n\
         discovery_window: 500ms\nhelper: {bin} fleet-helper --ca-cert {ca} --ca-key {key} --validity 2m\n\
         features:\n  pki: true\n\
         records:\n  url: {url}\n  bucket: RENEWAL_TEST\n  history: 10\n  signing_key: {seed}\n\
         renewal:\n  before: 90%\n  rate: 6000\n  retry: 30s\n  choria_config: {renewal}\n\
         election:\n  mode: shards\n  backend: streams\n  name: renewal\n  signing_key: {seed}\n",
        bin = binary(),
        ca = dir.join("ca.pem").display(),
        key = dir.join("ca.key").display(),
        url = nats.url(),
        seed = crate::support::signing_key(dir).display(),
        renewal = renewal_cfg.display(),
    );
    let choria = format!(
        "identity = provisioner.renewal.example.net\nplugin.choria.middleware_hosts = {}\n",
        nats.url()
    );
    ["r1", "r2"]
        .iter()
        .map(|n| ProvisionerProcess::start_named(dir, n, &yaml, &choria, &[]))
        .collect()
}

/// Every node configured three times: provisioned, renewed, renewed.
async fn when_every_node_is_configured_three_times(
    journal: &std::path::Path,
    replicas: &[ProvisionerProcess],
) {
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        let j = crate::support::read_journal_so_far(journal);
        let configured = senders(&j, "configure");
        let done = configured.values().filter(|s| s.len() >= 3).count();
        if done == NODES {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {NODES} nodes renewed twice within 150 s; r1:\n{}",
            replicas[0].logs_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the replicas counted, read before they stop.
struct Counts {
    /// The `sent` series of the replicas' renewals counters, summed.
    sent: f64,
    written: f64,
    on_record: f64,
    /// Each replica's working transitions.
    transitions: Vec<f64>,
}

fn what_the_replicas_counted(replicas: &[ProvisionerProcess]) -> Counts {
    // The `sent` series of each replica's renewals counter.
    let sent: f64 = replicas
        .iter()
        .map(|p| {
            let (_, body) = p.get("/metrics");
            body.lines()
                .filter(|l| {
                    l.starts_with("choria_provisioner_renewals{") && l.contains("outcome=\"sent\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        })
        .sum();
    let written: f64 = replicas
        .iter()
        .map(|p| p.metric("choria_provisioner_records_written"))
        .sum();
    let on_record = replicas[0].metric("choria_provisioner_records");
    // Each replica's working transitions: 1 when it worked from its start
    // to the end, never pausing, so the membership never changed.
    let transitions: Vec<f64> = replicas
        .iter()
        .map(|p| p.metric("choria_provisioner_leadership_transitions"))
        .collect();

    Counts {
        sent,
        written,
        on_record,
        transitions,
    }
}

/// What `nodes --json` and `nodes --expiring 1h` print.
fn what_nodes_lists(dir: &std::path::Path) -> (Vec<Value>, String) {
    // `nodes` lists every node's latest record.
    let out = std::process::Command::new(binary())
        .args(["nodes", "--json", "--config"])
        .arg(dir.join("r1.yaml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let table = std::process::Command::new(binary())
        .args(["nodes", "--expiring", "1h", "--config"])
        .arg(dir.join("r1.yaml"))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout).to_string();

    (listed, table)
}

fn then_nodes_lists_one_verified_record_per_node(listed: &[Value], table: &str) {
    assert_eq!(listed.len(), NODES, "one record per node");
    // The headers, a line a node, and the count.
    assert_eq!(table.lines().count(), NODES + 2, "{table}");
    assert_eq!(
        table.lines().last(),
        Some(format!("{NODES} nodes expiring within 1h").as_str()),
        "{table}"
    );
    for r in listed {
        assert_eq!(r["verified"], true, "{r}");
        let cert = &r["certificate"];
        assert!(
            cert["serial"].as_str().is_some_and(|s| !s.is_empty()),
            "{r}"
        );
        // Valid two minutes from issue (the CA backdates not_before).
        let left = cert["not_after_unix"].as_i64().unwrap() - r["time_unix"].as_i64().unwrap();
        assert!((115..=121).contains(&left), "{r}");
        let text = r.to_string();
        assert!(
            !text.contains(TOKEN) && !text.contains("PRIVATE KEY"),
            "a secret in {text}"
        );
    }
}

fn then_each_node_was_renewed_by_its_owner(
    j: &[Value],
    transitions: &[f64],
    sent: f64,
    written: f64,
) {
    // Renewed by the owner: each node's reprovision requests came from the
    // replica that configured it (its shard), never from the other — while
    // the membership held. A replica that misses its own heartbeats for
    // `renew_deadline` pauses, and the other then owns (and renews) its
    // nodes by design; seen once in CI with 6 s/4 s/1 s timings on a loaded
    // machine, so this runs on the default 15 s/10 s/2 s, and a run where a
    // replica paused says so instead of failing on a legitimate hand-over.
    let configured = senders(j, "configure");
    let reprovisioned = senders(j, "reprovision");
    let membership_held = transitions.iter().all(|&t| t == 1.0);
    if !membership_held {
        println!("a replica paused during the run (working transitions {transitions:?}): ownership moved, not checked");
    }
    for (node, by) in reprovisioned.iter().filter(|_| membership_held) {
        let owners: BTreeSet<&String> = configured[node].iter().collect();
        assert_eq!(owners.len(), 1, "{node} configured by {owners:?}");
        assert!(
            by.iter().all(|s| owners.contains(s)),
            "{node} asked to reprovision by {by:?}, configured by {owners:?}"
        );
    }
    assert!(reprovisioned.values().all(|s| s.len() >= 2));
    assert!(sent >= (2 * NODES) as f64);
    assert!(written >= (3 * NODES) as f64);
}

/// The `reason` series of `choria_provisioner_records_refused`.
fn refused(p: &ProvisionerProcess, reason: &str) -> f64 {
    let (_, body) = p.get("/metrics");
    body.lines()
        .filter(|l| {
            l.starts_with("choria_provisioner_records_refused{")
                && l.contains(&format!("reason=\"{reason}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Anyone who may write the records bucket (on an x509 network every node
/// we provisioned: its certificate reaches the broker's `choria` account,
/// `$KV` included) wrote there. Before records were sealed, a record made
/// the provisioner send `reprovision` within seconds — to a real node whose
/// credentials were good for another hour, or, token included, into a
/// collective the writer listened on. Now none of it is acted on: each is
/// refused, counted by reason, and `nodes` still shows each node's newest
/// sealed record; a deleted key changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_records_in_the_bucket_drive_no_renewal() {
    use futures::StreamExt;
    const FLEET: usize = 12;
    let (dir, _store, nats) = jetstream_and_ca("forged CA");
    let journal = dir.path().join("journal.jsonl");
    let fleet = serving_fleet(&nats, FLEET, &journal).await;
    let renewal_cfg = renewal_client_cfg(dir.path(), &nats);
    // Certificates valid an hour, due with 10 % of that left: nothing is
    // due for 54 minutes unless a record says otherwise.
    let yaml = format!(
        "workers: 8\ntoken: {TOKEN}\nsite: forged\nchoria_insecure: true\nrpc_timeout: 3s\n\
         discovery_window: 500ms\nhelper: {bin} fleet-helper --ca-cert {ca} --ca-key {key} --validity 1h\n\
         features:\n  pki: true\n\
         records:\n  url: {url}\n  bucket: FORGED\n  signing_key: {seed}\n\
         renewal:\n  before: 10%\n  rate: 6000\n  choria_config: {renewal}\n",
        bin = binary(),
        ca = dir.path().join("ca.pem").display(),
        key = dir.path().join("ca.key").display(),
        url = nats.url(),
        seed = crate::support::signing_key(dir.path()).display(),
        renewal = renewal_cfg.display(),
    );
    let choria = format!(
        "identity = provisioner.forged.example.net\nplugin.choria.middleware_hosts = {}\n",
        nats.url()
    );
    let mut p = ProvisionerProcess::start(dir.path(), &yaml, &choria, &[]);
    p.wait_for_metric(
        "choria_provisioner_records_written",
        FLEET as f64,
        Duration::from_secs(60),
    )
    .await;
    p.wait_for_metric(
        "choria_provisioner_records",
        FLEET as f64,
        Duration::from_secs(15),
    )
    .await;

    let ids = &fleet.identities;
    let (_writer, mut evil) = when_the_bucket_is_written_over(&nats, ids).await;

    let deadline = Instant::now() + Duration::from_secs(20);
    while (refused(&p, "unsigned") < 1.0
        || refused(&p, "signature") < 2.0
        || refused(&p, "deleted") < 1.0)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A forged record would have been sent within a tick; wait out several
    // seconds more, and the settle time a record gets.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let asked = senders(
        &crate::support::read_journal_so_far(&journal),
        "reprovision",
    );
    assert!(asked.is_empty(), "reprovision sent: {asked:?}");
    let heard = tokio::time::timeout(Duration::from_millis(100), evil.next()).await;
    assert_eq!(refused(&p, "unsigned"), 1.0, "the unsealed record");
    assert_eq!(
        refused(&p, "signature"),
        2.0,
        "the foreign seal and the edited record"
    );
    assert_eq!(refused(&p, "deleted"), 1.0);
    assert!(
        heard.is_err(),
        "a request reached the writer's collective: {heard:?}"
    );
    assert_eq!(
        p.metric("choria_provisioner_records"),
        FLEET as f64,
        "on record: every real node, the deleted one kept"
    );
    assert_eq!(p.metric("choria_provisioner_renewals_due"), 0.0);

    then_nodes_lists_the_sealed_records(dir.path(), ids);
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(5)).success());
    fleet.finish().await;
}

/// Writes over the bucket FORGED as a plain client of its JetStream could:
/// the victim's record unsealed, a made-up node sealed with a foreign key,
/// another's record edited and a third's deleted (`ids` are the fleet's
/// nodes). The writer, and its subscription to the collective the
/// made-up node is in.
async fn when_the_bucket_is_written_over(
    nats: &NatsServer,
    ids: &[String],
) -> (async_nats::Client, async_nats::Subscriber) {
    use choria_core::records::sealed::Sealer;
    use choria_wire::security::seal::SealKey;
    // The writer: a plain client of the same JetStream.
    let writer = async_nats::connect(nats.url()).await.unwrap();
    let evil = writer.subscribe("evil.>").await.unwrap();
    let kv = async_nats::jetstream::new(writer.clone())
        .get_key_value("FORGED")
        .await
        .unwrap();
    let now = chrono::Utc::now().timestamp();
    let sealed: Value = serde_json::from_slice(&kv.get(&ids[0]).await.unwrap().unwrap()).unwrap();
    let mut record: Value = serde_json::from_str(sealed["record"].as_str().unwrap()).unwrap();
    // 1. The victim's own record, unsealed, due now: provisioned an hour
    // ago, its certificate expiring in 30 s.
    record["time_unix"] = (now - 3600).into();
    record["certificate"]["not_before_unix"] = (now - 3600).into();
    record["certificate"]["not_after_unix"] = (now + 30).into();
    kv.put(&ids[0], serde_json::to_vec(&record).unwrap().into())
        .await
        .unwrap();
    // 2. A node nobody provisioned, in a collective the writer listens on,
    // sealed with a key of the writer's own.
    let mut ghost = record.clone();
    ghost["identity"] = "ghost.example.net".into();
    ghost["certificate"] = Value::Null;
    ghost["server_jwt"] = serde_json::json!({
        "jti": "x", "issued_unix": now - 3600, "expires_unix": now + 30, "collectives": ["evil"]
    });
    let theirs = SealKey::generate();
    let forged = Sealer::new(theirs.clone(), theirs.verifier(), "FORGED", "forged")
        .seal(&serde_json::from_value(ghost).unwrap())
        .unwrap();
    kv.put("ghost.example.net", forged.into()).await.unwrap();
    // 3. Another node's sealed record with its expiry edited.
    let mut edited: Value =
        serde_json::from_slice(&kv.get(&ids[1]).await.unwrap().unwrap()).unwrap();
    let mut inner: Value = serde_json::from_str(edited["record"].as_str().unwrap()).unwrap();
    inner["time_unix"] = (now - 3600).into();
    inner["certificate"]["not_after_unix"] = (now + 30).into();
    edited["record"] = inner.to_string().into();
    kv.put(&ids[1], serde_json::to_vec(&edited).unwrap().into())
        .await
        .unwrap();
    // 4. A third node's record deleted.
    kv.delete(&ids[2]).await.unwrap();

    (writer, evil)
}

/// What `nodes` lists after the bucket was written over: each real node's
/// newest sealed record, the made-up one unverified.
fn then_nodes_lists_the_sealed_records(dir: &std::path::Path, ids: &[String]) {
    let out = std::process::Command::new(binary())
        .args(["nodes", "--json", "--config"])
        .arg(dir.join("provisioner.yaml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: BTreeMap<String, Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| (v["identity"].as_str().unwrap().to_string(), v))
        .collect();
    // What was written over the real records hides none of them: each
    // node's newest sealed record is what `nodes` lists, as renewal acts
    // on it; the made-up node has nothing sealed and shows as unverified.
    for id in &ids[0..3] {
        assert_eq!(listed[id]["verified"], true, "{:?}", listed[id]);
    }
    assert_eq!(listed["ghost.example.net"]["verified"], false);
    assert_eq!(listed[&ids[3]]["verified"], true, "{:?}", listed[&ids[3]]);
    assert!(
        listed[&ids[3]]["state"]
            .as_str()
            .unwrap()
            .starts_with("due in "),
        "{:?}",
        listed[&ids[3]]
    );
}

/// Every node's decision on the audit stream, sealed, and `audit` reads it
/// back: the provisioned with what they were issued, the one the admission
/// policy denied with its reason, and an event someone else published
/// shown as unverified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_is_on_the_audit_stream_and_audit_reads_it_back() {
    const FLEET: usize = 6;
    let (dir, _store, nats) = jetstream_and_ca("audit CA");
    let _fleet = RunningFleet::start(FleetOptions {
        broker: BrokerOptions::at([nats.url()]),
        nodes: FLEET,
        token: TOKEN.into(),
        key_pool_size: 2,
        journal: Some(dir.path().join("journal.jsonl")),
        ..Default::default()
    })
    .await;
    std::fs::write(
        dir.path().join("admission.rego"),
        "package choria.provisioner\n\nallow if not startswith(input.identity, \"node-000.\")\n\n\
         deny_reason := \"node 0 is retired\" if not allow\n",
    )
    .unwrap();
    let yaml = format!(
        "workers: 4\ntoken: {TOKEN}\nsite: audit\nchoria_insecure: true\nrpc_timeout: 3s\n\
         discovery_window: 500ms\nhelper: {bin} fleet-helper --ca-cert {ca} --ca-key {key} --validity 1h\n\
         features:\n  pki: true\nrego_policy: {policy}\n\
         records:\n  url: {url}\n  bucket: AUDITED\n  signing_key: {seed}\n\
         audit:\n  stream: AUDIT_TEST\n  max_age: 1d\n",
        bin = binary(),
        ca = dir.path().join("ca.pem").display(),
        key = dir.path().join("ca.key").display(),
        policy = dir.path().join("admission.rego").display(),
        url = nats.url(),
        seed = crate::support::signing_key(dir.path()).display(),
    );
    let choria = crate::support::plain_client_cfg("provisioner.audit.example.net", &nats.url());
    let mut p = ProvisionerProcess::start(dir.path(), &yaml, &choria, &[]);
    p.wait_for_metric(
        "choria_provisioner_audit_events{outcome=\"written\"",
        FLEET as f64,
        Duration::from_secs(60),
    )
    .await;
    // Someone else publishes on the audit subjects.
    let other = async_nats::connect(nats.url()).await.unwrap();
    let forged = serde_json::json!({
        "specversion": "1.0", "id": "x", "source": "choria-provisioner/audit/evil",
        "type": "io.choria.provisioner.v1.provisioned", "subject": "node-000.fleet.example.net",
        "time": "2026-01-01T00:00:00Z", "datacontenttype": "application/json",
        "data": {"mode": "helper"}, "choriasealkey": "00", "choriasealsig": "AA=="
    });
    async_nats::jetstream::new(other)
        .publish(
            "choria.provisioner.audit.audit.provisioned",
            forged.to_string().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();

    let audit = |args: &[&str]| {
        crate::support::stdout_of(
            std::process::Command::new(binary())
                .arg("audit")
                .args(args)
                .arg("--config")
                .arg(dir.path().join("provisioner.yaml")),
        )
    };
    let events: Vec<Value> = audit(&["--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |kind: &str, verified: bool| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["type"] == format!("io.choria.provisioner.v1.{kind}"))
            .filter(|e| e["verified"] == verified)
            .collect()
    };
    let provisioned = of("provisioned", true);
    assert_eq!(provisioned.len(), FLEET - 1, "{events:#?}");
    for e in &provisioned {
        assert_eq!(e["data"]["mode"], "helper", "{e}");
        assert!(e["data"]["certificate"]["serial"].is_string(), "{e}");
        // The replica's name: its identity and a suffix of its own.
        assert!(
            e["source"]
                .as_str()
                .unwrap()
                .starts_with("choria-provisioner/audit/provisioner.audit.example.net"),
            "{e}"
        );
    }
    let denied = of("denied", true);
    assert!(!denied.is_empty(), "{events:#?}");
    assert_eq!(denied[0]["subject"], "node-000.fleet.example.net");
    assert_eq!(denied[0]["data"]["step"], "admission");
    assert!(
        denied[0]["data"]["reason"]
            .as_str()
            .unwrap()
            .contains("node 0 is retired"),
        "{}",
        denied[0]
    );
    assert_eq!(
        of("provisioned", false).len(),
        1,
        "the forged event is unverified"
    );
    let table = audit(&["--node", "node-000.fleet.example.net"]);
    assert!(
        table.contains("admission: refused by the admission policy: node 0 is retired"),
        "{table}"
    );
    assert!(table.contains("UNVERIFIED"), "{table}");
    let all = events.iter().map(Value::to_string).collect::<String>();
    assert!(!all.contains(TOKEN), "no token on the audit stream");
    drop(p);
}

/// `revoke` before a node is provisioned keeps it out; after, keeps it from
/// being renewed while the others are; `unrevoke` lifts it. Revocations are
/// sealed values every replica follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_identity_is_neither_provisioned_nor_renewed() {
    const FLEET: usize = 4;
    let (dir, _store, nats) = jetstream_and_ca("revocation CA");
    let journal = dir.path().join("journal.jsonl");
    let renewal_cfg = renewal_client_cfg(dir.path(), &nats);
    // Certificates valid 2 minutes, due with 90 % left: renewed 15 s after
    // they are issued (the settling time after a provisioning).
    let yaml = format!(
        "workers: 4\ntoken: {TOKEN}\nsite: revoked\nchoria_insecure: true\nrpc_timeout: 3s\n\
         discovery_window: 500ms\nhelper: {bin} fleet-helper --ca-cert {ca} --ca-key {key} --validity 2m\n\
         features:\n  pki: true\n\
         records:\n  url: {url}\n  bucket: REVOKED_TEST\n  signing_key: {seed}\n\
         renewal:\n  before: 90%\n  rate: 6000\n  retry: 30s\n  choria_config: {renewal}\n",
        bin = binary(),
        ca = dir.path().join("ca.pem").display(),
        key = dir.path().join("ca.key").display(),
        url = nats.url(),
        seed = crate::support::signing_key(dir.path()).display(),
        renewal = renewal_cfg.display(),
    );
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
    let (kept_out, cut_off) = ("node-001.fleet.example.net", "node-002.fleet.example.net");
    // Not provisioned yet: refused as a likely typo unless forced.
    let unforced = std::process::Command::new(binary())
        .args([
            "revoke",
            kept_out,
            "--reason",
            "lost in transit",
            "--config",
        ])
        .arg(&cli_yaml)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&unforced.stderr);
    assert!(
        !unforced.status.success()
            && stderr.contains("has no record")
            && stderr.contains("--force"),
        "{stderr}"
    );
    cli(&["revoke", kept_out, "--reason", "lost in transit", "--force"]);

    let _fleet = serving_fleet(&nats, FLEET, &journal).await;
    let choria = crate::support::plain_client_cfg("provisioner.revoked.example.net", &nats.url());
    let mut p = ProvisionerProcess::start(dir.path(), &yaml, &choria, &[]);
    p.wait_for_metric(
        "choria_provisioner_provisioned",
        (FLEET - 1) as f64,
        Duration::from_secs(60),
    )
    .await;
    p.wait_for_metric(
        "choria_provisioner_revoked_refusals{action=\"provision\"",
        1.0,
        Duration::from_secs(30),
    )
    .await;
    cli(&["revoke", cut_off, "--reason", "decommissioned"]);
    p.wait_for_metric(
        "choria_provisioner_revocations",
        2.0,
        Duration::from_secs(15),
    )
    .await;

    // The two others are renewed; the one revoked after its provisioning is not.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let configured = senders(&crate::support::read_journal_so_far(&journal), "configure");
        let renewed = ["node-000.fleet.example.net", "node-003.fleet.example.net"]
            .iter()
            .all(|n| configured.get(*n).is_some_and(|s| s.len() >= 2));
        if renewed {
            assert_eq!(
                configured.get(cut_off).map(Vec::len),
                Some(1),
                "{configured:?}"
            );
            assert_eq!(configured.get(kept_out), None, "{configured:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the others were not renewed within 90 s: {configured:?}\n{}",
            p.logs_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    p.wait_for_metric(
        "choria_provisioner_revoked_refusals{action=\"renewal\"",
        1.0,
        Duration::from_secs(30),
    )
    .await;
    assert!(
        p.logs()
            .contains("the identity is revoked: lost in transit"),
        "the refusal names the revocation's reason"
    );
    then_nodes_lists_the_revocations_and_their_reasons(&cli(&["nodes"]), kept_out, cut_off);
    cli(&["unrevoke", kept_out]);
    p.wait_for_metric_at_most(
        "choria_provisioner_revocations",
        1.0,
        Duration::from_secs(15),
    )
    .await;
    then_a_forged_lifting_lifts_nothing(&nats, &mut p, cut_off).await;
}

/// `nodes` (its output `listed`) marks `cut_off` revoked with its reason,
/// and `kept_out` with its own.
fn then_nodes_lists_the_revocations_and_their_reasons(listed: &str, kept_out: &str, cut_off: &str) {
    let line = |node: &str| {
        listed
            .lines()
            .find(|l| l.starts_with(node))
            .unwrap_or_else(|| panic!("{node} not listed:\n{listed}"))
            .to_string()
    };
    assert!(
        line(cut_off).contains("REVOKED") && line(cut_off).contains("decommissioned"),
        "{listed}"
    );
    assert!(line(kept_out).contains("lost in transit"), "{listed}");
    assert!(
        !line("node-000.fleet.example.net").contains("REVOKED"),
        "{listed}"
    );
}

/// A forged value in the revocations' bucket (unsealed) lifts nothing:
/// it is counted as refused, and the revocation of `cut_off` holds.
async fn then_a_forged_lifting_lifts_nothing(
    nats: &NatsServer,
    p: &mut ProvisionerProcess,
    cut_off: &str,
) {
    let other = async_nats::connect(nats.url()).await.unwrap();
    async_nats::jetstream::new(other)
        .get_key_value("REVOKED_TEST_REVOCATIONS")
        .await
        .unwrap()
        .put(
            cut_off,
            format!(r#"{{"identity":"{cut_off}","revoked":false}}"#)
                .into_bytes()
                .into(),
        )
        .await
        .unwrap();
    p.wait_for_metric(
        "choria_provisioner_records_refused{reason=\"signature\"",
        1.0,
        Duration::from_secs(15),
    )
    .await;
    // The gauge is refreshed every second.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(p.metric("choria_provisioner_revocations"), 1.0);
}

/// Nodes that come back into provisioning while they hold valid
/// credentials renewal did not ask them to replace (here: a second fleet
/// under the same names, as a reinstall or an impostor would) are refused
/// with `records.exclusive`, and flagged but provisioned without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_back_while_its_credentials_are_good_is_flagged_or_refused() {
    const FLEET: usize = 3;
    let (dir, _store, nats) = jetstream_and_ca("held CA");
    let yaml = |exclusive: bool| {
        format!(
            "workers: 4\ntoken: {TOKEN}\nsite: held\nchoria_insecure: true\nrpc_timeout: 3s\n\
             discovery_window: 500ms\nhelper: {bin} fleet-helper --ca-cert {ca} --ca-key {key} --validity 1h\n\
             features:\n  pki: true\n\
             records:\n  url: {url}\n  bucket: HELD_TEST\n  signing_key: {seed}\n  exclusive: {exclusive}\n",
            bin = binary(),
            ca = dir.path().join("ca.pem").display(),
            key = dir.path().join("ca.key").display(),
            url = nats.url(),
            seed = dir.path().join("records.seed").display(),
        )
    };
    std::fs::copy(
        crate::support::signing_key(dir.path()),
        dir.path().join("records.seed"),
    )
    .unwrap();
    let choria = crate::support::plain_client_cfg("provisioner.held.example.net", &nats.url());
    let first = serving_fleet(&nats, FLEET, &dir.path().join("first.jsonl")).await;
    let mut p = ProvisionerProcess::start_named(dir.path(), "a", &yaml(true), &choria, &[]);
    p.wait_for_metric(
        "choria_provisioner_records_written",
        FLEET as f64,
        Duration::from_secs(60),
    )
    .await;
    drop(p);
    first.finish().await;
    // The same names again, from other machines, to a provisioner that
    // knows them only from the records (one that just provisioned them
    // would ignore them for a minute).
    let second_journal = dir.path().join("second.jsonl");
    let _second = serving_fleet(&nats, FLEET, &second_journal).await;
    let mut p = ProvisionerProcess::start_named(dir.path(), "b", &yaml(true), &choria, &[]);
    p.wait_for_metric(
        "choria_provisioner_held_reprovisions{outcome=\"refused\"",
        FLEET as f64,
        Duration::from_secs(60),
    )
    .await;
    let configured = senders(
        &crate::support::read_journal_so_far(&second_journal),
        "configure",
    );
    assert!(
        configured.is_empty(),
        "refused, not configured: {configured:?}"
    );
    assert!(p.logs().contains("refused as records.exclusive is set"));
    drop(p);

    // Without exclusive: provisioned, and flagged.
    let mut p = ProvisionerProcess::start_named(dir.path(), "c", &yaml(false), &choria, &[]);
    p.wait_for_metric(
        "choria_provisioner_held_reprovisions{outcome=\"flagged\"",
        FLEET as f64,
        Duration::from_secs(60),
    )
    .await;
    p.wait_for_metric(
        "choria_provisioner_provisioned",
        FLEET as f64,
        Duration::from_secs(60),
    )
    .await;
    assert!(p
        .logs()
        .contains("still holds valid credentials renewal did not ask it to replace"));
}

/// Renewal asks a node back; it comes back and is provisioned. Another
/// arrival under its name within the hour (here: a second machine, once
/// the real node left provisioning) used to pass as "asked for" and be
/// provisioned; the ask is answered by the first return, so the second is
/// held like any other: refused with `records.exclusive`, and audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_arrival_after_a_renewal_is_held_not_waved_through() {
    const NODE: &str = "node-000.fleet.example.net";
    let (dir, _store, nats) = jetstream_and_ca("window CA");
    let renewal_cfg = renewal_client_cfg(dir.path(), &nats);
    // Certificates valid 2 minutes, due 12 s after issue.
    let yaml = format!(
        "workers: 4\ninterval: 1m\ntoken: {TOKEN}\nsite: window\nchoria_insecure: true\nrpc_timeout: 3s\n\
         discovery_window: 500ms\nhelper: {bin} fleet-helper --ca-cert {ca} --ca-key {key} --validity 2m\n\
         features:\n  pki: true\n\
         records:\n  url: {url}\n  bucket: WINDOW\n  signing_key: {seed}\n  exclusive: true\n\
         audit: {{}}\n\
         renewal:\n  before: 90%\n  rate: 6000\n  retry: 30s\n  choria_config: {renewal}\n",
        bin = binary(),
        ca = dir.path().join("ca.pem").display(),
        key = dir.path().join("ca.key").display(),
        url = nats.url(),
        seed = crate::support::signing_key(dir.path()).display(),
        renewal = renewal_cfg.display(),
    );
    let choria = crate::support::plain_client_cfg("provisioner.window.example.net", &nats.url());
    let first_journal = dir.path().join("first.jsonl");
    let first = serving_fleet(&nats, 1, &first_journal).await;
    let p = ProvisionerProcess::start(dir.path(), &yaml, &choria, &[]);
    // Provisioned, asked back by renewal, and provisioned again.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let j = crate::support::read_journal_so_far(&first_journal);
        let restarted = j
            .iter()
            .filter(|e| e["kind"] == "action" && e["action"] == "restart" && e["outcome"] == "ok")
            .count();
        if restarted >= 2 && senders(&j, "reprovision").contains_key(NODE) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not renewed within 90 s:\n{}",
            p.logs_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The real node goes away; another machine answers under its name.
    first.finish().await;
    let second_journal = dir.path().join("second.jsonl");
    let _second = serving_fleet(&nats, 1, &second_journal).await;
    let deadline = Instant::now() + Duration::from_secs(150);
    while p.metric("choria_provisioner_held_reprovisions{outcome=\"refused\"") < 1.0 {
        let configured = senders(
            &crate::support::read_journal_so_far(&second_journal),
            "configure",
        );
        assert!(
            configured.is_empty(),
            "the second arrival was provisioned inside the renewal's hour: {configured:?}"
        );
        assert!(Instant::now() < deadline, "{}", p.logs_tail(20));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let events = crate::support::stdout_of(
        std::process::Command::new(binary())
            .args(["audit", "--config"])
            .arg(dir.path().join("provisioner.yaml")),
    );
    assert!(
        events
            .lines()
            .any(|l| l.contains("held") && l.contains(NODE)),
        "a held event for it:\n{events}"
    );
}

//! The behaviour-diff tier: each scenario runs twice against identical
//! simulated fleets, once with the real Go provisioner
//! (`$CHORIA_GO_PROVISIONER_BIN`, built from ../shared/peers/go-provisioner)
//! and once with ours, with the same `provisioner.yaml` and the same
//! recording helper. Per node it compares what the fleet's journal saw (the
//! sequence of `agent#action` calls with their outcome, so tries count), the
//! exact bytes given to the helper (volatile values such as CSRs and JWT
//! times replaced by placeholders), and what ended on the node (state,
//! configuration keys, certificate, key, server JWT, restarts).
//!
//! Every difference found is either a bug to fix or listed, with its reason,
//! in the book's "Deliberate differences" (docs/src/migrating.md): the test
//! classifies each difference by the ids in [`KNOWN`], fails on one it cannot
//! classify, and checks that the book lists exactly the ids of [`KNOWN`] and
//! that each was seen (a difference that went away must leave the list).

use crate::support::gopeers::go_provisioner_bin;
use crate::support::provisioner::{binary, ProvisionerProcess};
use crate::support::{read_journal_so_far, NatsServer, RunningFleet};
use choria_fleet::FleetOptions;
use choria_wire::client::BrokerOptions;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const TOKEN: &str = "s3cret";

/// Differences we keep on purpose, by id. docs/src/migrating.md lists the
/// same ids in its "Deliberate differences" table with the reasons.
const KNOWN: &[(&str, &str)] = &[
    (
        "zero-series",
        "ours exports every series (each rpc label) at 0 from the start; Go's appear at their first observation",
    ),
    (
        "queue-gauge",
        "Go's work_queue_entries changes only when a node is added or removed, so it stays up once workers drained the queue; ours is the queue's length",
    ),
    (
        "provisioned-counts-nodes",
        "Go counts a node the helper shut down, and a node upgraded before being provisioned, in provisioned; ours counts nodes configured and restarted, once",
    ),
    (
        "unconfirmed-names",
        "a node whose first request gets no answer it can read in its own name is asked once a cycle, not three times, and counted as unconfirmed, not discovered or failed",
    ),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Impl {
    Go,
    Ours,
}

struct Scenario {
    name: &'static str,
    nodes: usize,
    /// Extra provisioner.yaml lines (features and their settings).
    yaml: &'static str,
    /// Extra `fleet-helper` arguments.
    helper: Vec<String>,
    fleet: fn(&mut FleetOptions),
    /// How many nodes end up provisioned (back as servers).
    provisioned: usize,
    /// Run this long in any case (scenarios that need a second discovery
    /// cycle, `interval` being at least a minute for both).
    run_for: Option<Duration>,
}

/// What one implementation did to the fleet.
#[derive(Debug, Default)]
struct Outcome {
    /// Per node: `agent#action:outcome`, in order (broadcast pings left out:
    /// they are per cycle, not per node).
    calls: BTreeMap<String, Vec<String>>,
    /// Per node: the helper's stdin, normalised, in call order.
    helper: BTreeMap<String, Vec<String>>,
    /// Per node: what the journal's final entry says ended on it.
    finals: BTreeMap<String, Value>,
    /// The Go provisioner's metrics at the end, by series (`name{labels}`).
    metrics: BTreeMap<String, f64>,
}

/// The Go provisioner's own metrics, compared series by series at the end
/// of each run (a summary by its count). Timing-dependent ones
/// (busy_workers, discover_cycles, the time sums) are left out.
const METRICS: &[&str] = &[
    "choria_provisioner_provisioned",
    "choria_provisioner_discovered",
    "choria_provisioner_event_discovered",
    "choria_provisioner_discovery_errors",
    "choria_provisioner_provision_errors",
    "choria_provisioner_helper_errors",
    "choria_provisioner_rpc_errors",
    "choria_provisioner_rpc_time_count",
    "choria_provisioner_helper_time_count",
    "choria_provisioner_work_queue_entries",
    "choria_provisioner_waiting_nodes",
];

/// RSA signer for the provisioning JWTs (Go's `jwt_verify_cert` takes a PEM
/// public key): (private key file, public key file).
fn jwt_signer(dir: &Path) -> (PathBuf, PathBuf) {
    use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
    let key = choria_wire::security::csr::generate_rsa_key(2048).unwrap();
    let private = dir.join("signer.key");
    let public = dir.join("signer.pub");
    std::fs::write(
        &private,
        key.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes(),
    )
    .unwrap();
    std::fs::write(
        &public,
        key.to_public_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap(),
    )
    .unwrap();
    (private, public)
}

/// A CA for the pki scenario, as PEM files: (cert, key).
fn ca_files(dir: &Path) -> (PathBuf, PathBuf) {
    let ca = choria_fleet::ca::CertificateAuthority::generate("Diff CA").unwrap();
    let cert = dir.join("ca.pem");
    let key = dir.join("ca.key");
    std::fs::write(&cert, ca.cert_pem()).unwrap();
    std::fs::write(&key, ca.key_pem().as_bytes()).unwrap();
    (cert, key)
}

/// A helper that keeps its stdin (one file per call, named by the time so
/// they sort in call order) and then runs `fleet-helper` on it.
fn recording_helper(dir: &Path, args: &[String]) -> PathBuf {
    let inputs = dir.join("helper-inputs");
    std::fs::create_dir_all(&inputs).unwrap();
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let script = dir.join("helper.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nf=\"{}/$(date +%s%N).$$\"\ncat >\"$f\"\nexec '{}' fleet-helper {} <\"$f\"\n",
            inputs.display(),
            binary(),
            quoted.join(" ")
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// Replaces every volatile value of a helper input (fresh per fleet: CSRs,
/// keys, JWT times and ids) by a placeholder in the raw bytes, leaving the
/// rest (field order, escaping, layout) to compare byte for byte.
fn normalise_helper_input(raw: &str) -> String {
    let v: Value = serde_json::from_str(raw)
        .unwrap_or_else(|e| panic!("the helper was given invalid JSON ({e}): {raw}"));
    let mut volatile: Vec<(String, String)> = Vec::new();
    let mut string = |path: &str, s: Option<&str>| {
        if let Some(s) = s.filter(|s| !s.is_empty()) {
            for encoded in [
                serde_json::to_string(s).unwrap(),
                go_escape(&serde_json::to_string(s).unwrap()),
            ] {
                volatile.push((encoded, format!("\"<{path}>\"")));
            }
        }
    };
    string("csr.csr", v["csr"]["csr"].as_str());
    string("csr.public_key", v["csr"]["public_key"].as_str());
    string(
        "ed25519.public_key",
        v["ed25519_pubkey"]["public_key"].as_str(),
    );
    string(
        "ed25519.signature",
        v["ed25519_pubkey"]["signature"].as_str(),
    );
    string("jwt.jti", v["jwt"]["jti"].as_str());
    // The broker URL the fleet put in its JWT: a fresh port per run.
    string("jwt.chu", v["jwt"]["chu"].as_str());
    for claim in ["iat", "exp", "nbf"] {
        if let Some(n) = v["jwt"][claim].as_i64() {
            volatile.push((
                format!("\"{claim}\":{n}"),
                format!("\"{claim}\":\"<{claim}>\""),
            ));
        }
    }
    let mut out = raw.to_string();
    for (from, to) in volatile {
        out = out.replace(&from, &to);
    }
    out
}

/// Go's `json.Marshal` escapes <, > and & inside strings.
fn go_escape(s: &str) -> String {
    s.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// The final-entry fields that say what ended on a node.
fn final_fields(e: &Value) -> Value {
    let keep = [
        "state",
        "configured",
        "restarts",
        "provision_disabled",
        "config_keys",
        "has_certificate",
        "has_private_key",
        "has_server_jwt",
        "version",
    ];
    Value::Object(
        keep.iter()
            .filter_map(|k| e.get(*k).map(|v| (k.to_string(), v.clone())))
            .collect(),
    )
}

async fn run(which: Impl, bin: &Path, sc: &Scenario, root: &Path) -> Outcome {
    let dir = root.join(format!("{}-{which:?}", sc.name).to_lowercase());
    std::fs::create_dir_all(&dir).unwrap();
    let nats = NatsServer::start();
    let (signer, signer_pub) = jwt_signer(&dir);
    let journal = dir.join("journal.jsonl");
    let mut fopts = FleetOptions {
        broker: BrokerOptions::at([nats.url()]),
        nodes: sc.nodes,
        token: TOKEN.into(),
        jwt_signer: Some(signer),
        journal: Some(journal.clone()),
        key_pool_size: 4,
        connections: 2,
        ..Default::default()
    };
    (sc.fleet)(&mut fopts);
    let fleet = RunningFleet::start(fopts).await;

    let mut helper_args = vec![
        "--broker".to_string(),
        "nats://broker.example.net:4222".into(),
    ];
    let own = dir.join("helper-state");
    std::fs::create_dir_all(&own).unwrap();
    helper_args.extend(sc.helper.iter().map(|a| {
        if a == RUN_DIR {
            own.display().to_string()
        } else {
            a.clone()
        }
    }));
    if sc.yaml.contains("pki: true") {
        let (cert, key) = ca_files(&dir);
        helper_args.extend([
            "--ca-cert".into(),
            cert.display().to_string(),
            "--ca-key".into(),
            key.display().to_string(),
        ]);
    }
    let helper = recording_helper(&dir, &helper_args);
    let mut features = sc.yaml.to_string();
    if sc.yaml.contains("ed25519: true") {
        // Both read a hex ed25519 seed file as the server JWT signer.
        let seed = dir.join("server-signer.seed");
        std::fs::write(
            &seed,
            choria_wire::security::ed25519::Ed25519KeyPair::generate().seed_hex(),
        )
        .unwrap();
        features.push_str(&format!("jwt_signing_key: {}\n", seed.display()));
    }
    // The same file for both; Go needs `logfile` (its default is a file
    // named "info" in the working directory), ours logs there as well.
    let yaml = format!(
        "workers: 4\ninterval: 1m\ntoken: {TOKEN}\nsite: diff\nhelper: {}\nchoria_insecure: true\njwt_verify_cert: {}\nloglevel: debug\nlogfile: /dev/stderr\n{}",
        helper.display(),
        signer_pub.display(),
        features
    );
    let ccfg = format!(
        "identity = provisioner.diff.example.net\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
        nats.url()
    );
    let mut p = ProvisionerProcess::start_program(bin, &dir, "provisioner", &yaml, &ccfg, &[], &[]);

    // Done when the nodes that will be provisioned came back as servers
    // (and, for scenarios with a second cycle, after `run_for`).
    let started = Instant::now();
    let deadline = started + sc.run_for.unwrap_or_default() + Duration::from_secs(120);
    loop {
        let j = read_journal_so_far(&journal);
        let servers = crate::support::server_startups(&j);
        if servers >= sc.provisioned && started.elapsed() >= sc.run_for.unwrap_or_default() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} with {which:?}: {servers} of {} provisioned; log:\n{}",
            sc.name,
            sc.provisioned,
            p.logs_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (_, text) = p.get("/metrics");
    std::fs::write(dir.join("metrics.txt"), &text).unwrap();
    let metrics = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let name = series.split('{').next()?;
            METRICS
                .contains(&name)
                .then(|| (series.to_string(), value.parse::<f64>().ok()))
                .and_then(|(s, v)| Some((s, v?)))
        })
        .collect();
    p.signal("TERM");
    p.wait_exit(Duration::from_secs(15));
    let (_, journal) = fleet.finish().await;
    drop(nats);

    let mut out = Outcome {
        metrics,
        ..Default::default()
    };
    for e in &journal {
        let node = e["node"].as_str().unwrap_or_default().to_string();
        match e["kind"].as_str() {
            Some("action") if !(e["agent"] == "discovery" && e["action"] == "ping") => {
                out.calls.entry(node).or_default().push(format!(
                    "{}#{}:{}",
                    e["agent"].as_str().unwrap_or_default(),
                    e["action"].as_str().unwrap_or_default(),
                    e["outcome"].as_str().unwrap_or_default()
                ));
            }
            Some("final") => {
                out.finals.insert(node, final_fields(e));
            }
            _ => {}
        }
    }
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(dir.join("helper-inputs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    inputs.sort();
    for f in inputs {
        let raw = std::fs::read_to_string(&f).unwrap();
        let v: Value = serde_json::from_str(&raw).unwrap();
        let node = v["identity"].as_str().unwrap_or_default().to_string();
        out.helper
            .entry(node)
            .or_default()
            .push(normalise_helper_input(&raw));
    }
    out
}

/// One difference: (scenario, what, node, Go's, ours).
#[derive(Debug, Clone)]
struct Difference {
    scenario: &'static str,
    what: &'static str,
    node: String,
    go: String,
    ours: String,
}

fn compare(sc: &Scenario, go: &Outcome, ours: &Outcome) -> Vec<Difference> {
    let mut found = Vec::new();
    let series: BTreeSet<&String> = go.metrics.keys().chain(ours.metrics.keys()).collect();
    for m in series {
        let (g, o) = (go.metrics.get(m), ours.metrics.get(m));
        // -0 and 0 are one value.
        if g.map(|v| v + 0.0) != o.map(|v| v + 0.0) {
            found.push(Difference {
                scenario: sc.name,
                what: "metric",
                node: m.clone(),
                go: format!("{g:?}"),
                ours: format!("{o:?}"),
            });
        }
    }
    let nodes: BTreeSet<&String> = go
        .finals
        .keys()
        .chain(ours.finals.keys())
        .chain(go.calls.keys())
        .chain(ours.calls.keys())
        .collect();
    for node in nodes {
        let mut differ = |what: &'static str, g: String, o: String| {
            if g != o {
                found.push(Difference {
                    scenario: sc.name,
                    what,
                    node: node.clone(),
                    go: g,
                    ours: o,
                });
            }
        };
        let show = |v: Option<&Vec<String>>| v.map(|v| v.join(" ")).unwrap_or_default();
        differ(
            "calls",
            show(go.calls.get(node)),
            show(ours.calls.get(node)),
        );
        differ(
            "helper input",
            show(go.helper.get(node)),
            show(ours.helper.get(node)),
        );
        differ(
            "final",
            go.finals
                .get(node)
                .map(|v| v.to_string())
                .unwrap_or_default(),
            ours.finals
                .get(node)
                .map(|v| v.to_string())
                .unwrap_or_default(),
        );
    }
    found
}

/// The id of a known difference, if `d` is one.
fn classify(d: &Difference) -> Option<&'static str> {
    // Nodes whose first request gets no answer our codec reads in their
    // own name (the scenario's malformed replies) are unconfirmed: one
    // request a cycle instead of Go's three, never counted as discovered or
    // as provisioning errors, and again at the next discovery.
    let unconfirmed = d.scenario == "failing-nodes";
    if d.what == "calls" && unconfirmed {
        let (go, ours): (Vec<&str>, Vec<&str>) = (
            d.go.split_whitespace().collect(),
            d.ours.split_whitespace().collect(),
        );
        let failed = |c: &&str| c.starts_with("choria_provision#jwt:") && !c.ends_with(":ok");
        if !ours.is_empty()
            && ours.len() < go.len()
            && go.iter().all(failed)
            && ours.iter().all(failed)
        {
            return Some("unconfirmed-names");
        }
    }
    if d.what != "metric" {
        return None;
    }
    let value = |s: &str| {
        s.strip_prefix("Some(")
            .and_then(|v| v.strip_suffix(')'))
            .and_then(|v| v.parse::<f64>().ok())
    };
    let (go, ours) = (value(&d.go), value(&d.ours));
    let name = d.node.split('{').next().unwrap_or_default();
    match (name, go, ours) {
        (_, None, Some(0.0)) => Some("zero-series"),
        ("choria_provisioner_work_queue_entries", Some(g), Some(0.0)) if g > 0.0 => {
            Some("queue-gauge")
        }
        ("choria_provisioner_provisioned", Some(g), Some(o))
            if o < g && matches!(d.scenario, "upgrades" | "shutdown-and-failing-helper") =>
        {
            Some("provisioned-counts-nodes")
        }
        (
            "choria_provisioner_discovered"
            | "choria_provisioner_provision_errors"
            | "choria_provisioner_rpc_time_count"
            | "choria_provisioner_rpc_time_sum"
            | "choria_provisioner_rpc_errors"
            | "choria_provisioner_waiting_nodes",
            _,
            _,
        ) if unconfirmed => Some("unconfirmed-names"),
        _ => None,
    }
}

/// The ids the book's "Deliberate differences" table lists
/// (docs/src/migrating.md, the page a user switching from Go reads).
fn documented_ids() -> BTreeSet<String> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/migrating.md"),
    )
    .unwrap();
    let Some(start) = text.find("## Deliberate differences") else {
        return BTreeSet::new();
    };
    text[start..]
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

/// Stands for a directory of the run's own in a scenario's helper arguments.
const RUN_DIR: &str = "@run-dir";

fn scenarios() -> Vec<Scenario> {
    let jwt = "features:\n  jwt: true\n";
    vec![
        Scenario {
            name: "jwt",
            nodes: 12,
            yaml: jwt,
            helper: Vec::new(),
            fleet: |_| {},
            provisioned: 12,
            run_for: None,
        },
        Scenario {
            name: "pki",
            nodes: 12,
            yaml: "features:\n  jwt: true\n  pki: true\n",
            helper: Vec::new(),
            fleet: |_| {},
            provisioned: 12,
            run_for: None,
        },
        Scenario {
            name: "upgrades",
            nodes: 6,
            yaml: "features:\n  jwt: true\n  upgrades: true\nupgrades_repository: https://repo.example.net/choria\n",
            helper: vec!["--upgrade".into(), "0.31.0".into()],
            fleet: |o| o.upgradable = true,
            provisioned: 6,
            run_for: None,
        },
        // Organisation-issuer networks: each node's ed25519 key is fetched
        // (nonce signature checked) and a server JWT signed for it with
        // `jwt_signing_key` (written per run, see `run`).
        Scenario {
            name: "ed25519",
            nodes: 8,
            yaml: "features:\n  ed25519: true\n",
            helper: Vec::new(),
            fleet: |_| {},
            provisioned: 8,
            run_for: None,
        },
        // Every node deferred once by the helper: provisioned on the next
        // cycle, a minute later.
        Scenario {
            name: "defer",
            nodes: 6,
            yaml: jwt,
            helper: vec!["--defer-once-dir".into(), RUN_DIR.into()],
            fleet: |_| {},
            provisioned: 6,
            run_for: Some(Duration::from_secs(70)),
        },
        // Two nodes shut down by the helper, two whose helper crashes (tried
        // again on the next cycle), the rest provisioned.
        Scenario {
            name: "shutdown-and-failing-helper",
            nodes: 8,
            yaml: jwt,
            helper: vec![
                "--shutdown-match".into(),
                "^node-00[01]\\.".into(),
                "--fail".into(),
                "crash".into(),
                "--fail-match".into(),
                "^node-00[23]\\.".into(),
            ],
            fleet: |_| {},
            provisioned: 4,
            run_for: Some(Duration::from_secs(70)),
        },
        // Nodes that answer with an error status or with a reply that does
        // not verify, beside healthy ones; retried on the next cycle.
        Scenario {
            name: "failing-nodes",
            nodes: 12,
            yaml: jwt,
            helper: Vec::new(),
            fleet: |o| {
                o.fail_error = 0.25;
                o.fail_malformed = 0.25;
            },
            provisioned: 6,
            run_for: Some(Duration::from_secs(75)),
        },
    ]
}

/// The tests of this tier that want the machine to themselves: they load
/// both cores, and their bounds were measured without other tests beside
/// them. `scripts/test.sh` runs them after the rest, one at a time.
mod alone {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn go_and_ours_treat_identical_fleets_alike_or_differ_as_documented() {
        let Some(go_bin) =
            go_provisioner_bin("go_and_ours_treat_identical_fleets_alike_or_differ_as_documented")
        else {
            return;
        };
        let root = tempfile::tempdir().unwrap();
        let root_dir = root.path().to_path_buf();
        if std::env::var_os("CHORIA_BEHAVIOUR_KEEP").is_some() {
            // Journals, helper inputs, logs and metrics of every run, to read.
            println!("runs kept in {}", root_dir.display());
            std::mem::forget(root);
        }
        let mut seen: BTreeSet<&'static str> = BTreeSet::new();
        let mut unexplained = Vec::new();
        // Every scenario and implementation at once (each on its own broker):
        // the slow ones wait a discovery interval, not the machine.
        let all = scenarios();
        let runs = all.iter().flat_map(|sc| {
            [
                run(Impl::Go, &go_bin, sc, &root_dir),
                run(Impl::Ours, Path::new(binary()), sc, &root_dir),
            ]
        });
        let mut outcomes = futures::future::join_all(runs).await.into_iter();
        for sc in &all {
            let (go, ours) = (outcomes.next().unwrap(), outcomes.next().unwrap());
            for (which, o) in [(Impl::Go, &go), (Impl::Ours, &ours)] {
                let mut states: BTreeMap<String, usize> = BTreeMap::new();
                for f in o.finals.values() {
                    *states
                        .entry(f["state"].as_str().unwrap_or("?").to_string())
                        .or_default() += 1;
                }
                println!(
                    "{} {which:?}: {} calls, {} helper runs, final states {states:?}",
                    sc.name,
                    o.calls.values().map(Vec::len).sum::<usize>(),
                    o.helper.values().map(Vec::len).sum::<usize>(),
                );
                // A comparison of nothing proves nothing.
                assert_eq!(
                    o.finals.len(),
                    sc.nodes,
                    "{} {which:?}: a final entry per node",
                    sc.name
                );
                assert!(
                    !o.helper.is_empty(),
                    "{} {which:?}: the helper never ran",
                    sc.name
                );
                if sc.name == "ed25519" {
                    // Alike must mean "issued", not "both failed the same way".
                    for (node, f) in &o.finals {
                        assert_eq!(f["has_server_jwt"], true, "ed25519 {which:?}: {node}: {f}");
                    }
                }
            }
            let diffs = compare(sc, &go, &ours);
            println!(
                "{}: {} nodes, {} differences",
                sc.name,
                sc.nodes,
                diffs.len()
            );
            for d in diffs {
                match classify(&d) {
                    Some(id) => {
                        seen.insert(id);
                    }
                    None => unexplained.push(d),
                }
            }
        }
        let report = Path::new(env!("CARGO_TARGET_TMPDIR")).join("behaviour-diff.txt");
        std::fs::write(
            &report,
            unexplained
                .iter()
                .map(|d| {
                    format!(
                        "[{}] {} of {}:\n    Go:   {}\n    ours: {}\n",
                        d.scenario, d.what, d.node, d.go, d.ours
                    )
                })
                .collect::<String>(),
        )
        .unwrap();
        println!("unexplained differences written to {}", report.display());
        assert!(
            unexplained.is_empty(),
            "{} differences from the Go provisioner that are neither fixed nor listed:\n{}",
            unexplained.len(),
            unexplained
                .iter()
                .take(12)
                .map(|d| format!(
                    "[{}] {} of {}:\n    Go:   {}\n    ours: {}",
                    d.scenario, d.what, d.node, d.go, d.ours
                ))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let known: BTreeSet<String> = KNOWN.iter().map(|(id, _)| id.to_string()).collect();
        assert_eq!(
            documented_ids(),
            known,
            "docs/src/migrating.md's list and the test's disagree"
        );
        for (id, _) in KNOWN {
            assert!(
                seen.contains(id),
                "{id} was not seen any more: take it off the list"
            );
        }
    }
}

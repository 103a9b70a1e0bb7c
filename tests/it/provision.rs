//! `choria-provisioner run` end to end: the real binary provisions the
//! simulated fleet over a real nats-server, with `fleet-helper` as its helper.
//! Every scenario asserts from the fleet's journal that each node was
//! provisioned exactly once, and every run logs at debug level and is scanned
//! for secrets.

use crate::support::provisioner::{binary, ProvisionerProcess};
use crate::support::{NatsServer, RunningFleet};
use choria_fleet::ca as pki;
use choria_fleet::FleetOptions;
use choria_wire::client::BrokerOptions;
use choria_wire::protocol::Version;
use choria_wire::security::csr;
use choria_wire::security::ed25519::Ed25519KeyPair;
use choria_wire::security::tokens::{self, ClientIdClaims, TokenSigningKey};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

const TOKEN: &str = "pr0v-t0ken-s3cret";
const BROKER_PASSWORD: &str = "br0ker-pa55w0rd-s3cret";
const NODES: usize = 2000;
/// How long one request waits for its reply. Shorter than Go's default
/// (22 s for `choria_provision`), so silent nodes fail fast, but with a
/// margin: at 3 s a reply to `restart` came back late on a loaded 2-core
/// machine, the retry restarted the node a second time, and the run failed
/// its exactly-once check.
const RPC_TIMEOUT: &str = "10s";

/// Writes files into a run directory before the provisioner starts; returns
/// more secrets.
type Prepare = Box<dyn FnOnce(&Path, &Ed25519KeyPair) -> Vec<String>>;

/// One end-to-end run: keys, fleet, provisioner.
struct Run {
    dir: tempfile::TempDir,
    nats: NatsServer,
    issuer: Ed25519KeyPair,
    fleet: Option<RunningFleet>,
    provisioner: Option<ProvisionerProcess>,
    /// Secret strings that must never appear in logs.
    secrets: Vec<String>,
}

struct Options {
    nodes: usize,
    protocol: Version,
    /// `features:` block and other provisioner.yaml lines.
    yaml: String,
    /// Extra `fleet-helper` arguments.
    helper: Vec<String>,
    /// No `helper:` line at all (a `configuration_template` in `yaml`).
    without_helper: bool,
    fleet: Box<dyn FnOnce(&mut FleetOptions)>,
    /// Writes extra files into the run directory before the provisioner
    /// starts (`{dir}` in `yaml` and `helper` names it); returns more secrets.
    prepare: Prepare,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: NODES,
            protocol: Version::V1,
            yaml: "features:\n  jwt: true\n".into(),
            helper: Vec::new(),
            without_helper: false,
            fleet: Box::new(|_| {}),
            prepare: Box::new(|_, _| Vec::new()),
        }
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

impl Run {
    async fn start(opts: Options) -> Run {
        let dir = tempfile::Builder::new()
            .prefix("provision-run-")
            .disable_cleanup(std::env::var_os("PROVISION_KEEP").is_some())
            .tempdir()
            .unwrap();
        let nats = if opts.protocol == Version::V2 {
            NatsServer::start_tls_available()
        } else {
            NatsServer::start()
        };
        let issuer = Ed25519KeyPair::generate();
        let issuer_seed = dir.path().join("issuer.seed");
        std::fs::write(&issuer_seed, issuer.seed_hex()).unwrap();

        let mut fopts = FleetOptions {
            broker: BrokerOptions::at([nats.url()]),
            nodes: opts.nodes,
            token: TOKEN.into(),
            jwt_signer: Some(issuer_seed.clone()),
            protocol: opts.protocol,
            journal: Some(dir.path().join("journal.jsonl")),
            key_pool_size: 16,
            connections: 4,
            ..Default::default()
        };
        (opts.fleet)(&mut fopts);
        let fleet = RunningFleet::start(fopts).await;

        let mut secrets = vec![
            TOKEN.to_string(),
            BROKER_PASSWORD.to_string(),
            issuer.seed_hex(),
        ];
        secrets.extend((opts.prepare)(dir.path(), &issuer));
        let here = s(dir.path());
        let choria_cfg = match opts.protocol {
            Version::V1 => format!(
                "identity = provisioner.e2e\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
                nats.url()
            ),
            Version::V2 => {
                // The provisioner's own v2 identity: a seed and a client JWT
                // issued by the organisation issuer.
                let me = Ed25519KeyPair::generate();
                let seed = dir.path().join("provisioner.seed");
                std::fs::write(&seed, me.seed_hex()).unwrap();
                let now = chrono::Utc::now().timestamp();
                let mut claims = ClientIdClaims::new_at(
                    now,
                    "provisioner=e2e",
                    Some(&me.public_hex()),
                    "",
                    Duration::from_secs(3600),
                )
                .unwrap();
                claims.standard.add_org_issuer_data(issuer.signing_key()).unwrap();
                let jwt = TokenSigningKey::Ed25519(issuer.signing_key().clone())
                    .sign(&claims)
                    .unwrap();
                let token = dir.path().join("provisioner.jwt");
                std::fs::write(&token, &jwt).unwrap();
                secrets.push(me.seed_hex());
                format!(
                    "identity = provisioner.e2e\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = choria\nplugin.security.choria.token_file = {}\nplugin.security.choria.seed_file = {}\n",
                    nats.url(),
                    s(&token),
                    s(&seed)
                )
            }
        };
        let mut helper = format!(
            "{} fleet-helper --broker nats://broker.e2e.example.net:4222",
            binary()
        );
        for a in &opts.helper {
            helper.push(' ');
            helper.push_str(&shell_words::quote(&a.replace("{dir}", &here)));
        }
        let helper = if opts.without_helper {
            String::new()
        } else {
            format!("helper: {helper:?}\n")
        };
        let yaml = format!(
            "workers: 32\ninterval: 1m\ntoken: {TOKEN}\nsite: e2e\n{helper}choria_insecure: {}\nbroker_provisioning_password: {BROKER_PASSWORD}\nrpc_timeout: {RPC_TIMEOUT}\ndiscovery_window: 500ms\njwt_verify_cert: {}\n{}",
            opts.protocol == Version::V1,
            issuer.public_hex(),
            opts.yaml.replace("{dir}", &here)
        );
        let provisioner = ProvisionerProcess::start(dir.path(), &yaml, &choria_cfg, &["--debug"]);
        Run {
            dir,
            nats,
            issuer,
            fleet: Some(fleet),
            provisioner: Some(provisioner),
            secrets,
        }
    }

    fn provisioner(&mut self) -> &mut ProvisionerProcess {
        self.provisioner.as_mut().unwrap()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Waits for `provisioned` to reach `n`, then for the restarts to land.
    async fn wait_provisioned(&mut self, n: usize, timeout: Duration) {
        self.provisioner()
            .wait_for_metric("choria_provisioner_provisioned", n as f64, timeout)
            .await;
        // A node restarts 2 s after its restart reply: wait for the `n`
        // to come back as servers, not for a fixed margin past the last.
        self.wait_servers_back(n, Duration::from_secs(30)).await;
    }

    /// Waits until `n` nodes have come back as provisioned servers (their
    /// `startup` event for component `server`), whoever provisioned them.
    async fn wait_servers_back(&mut self, n: usize, timeout: Duration) {
        let journal = self.path("journal.jsonl");
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let entries = crate::support::read_journal_so_far(&journal);
            let back: std::collections::BTreeSet<&str> = entries
                .iter()
                .filter(|e| {
                    e["kind"] == "event" && e["event"] == "startup" && e["component"] == "server"
                })
                .filter_map(|e| e["node"].as_str())
                .collect();
            if back.len() >= n {
                return;
            }
            if std::time::Instant::now() >= deadline {
                panic!(
                    "only {} of {n} nodes came back provisioned within {timeout:?}\n{}",
                    back.len(),
                    self.missing_history(&entries, &back)
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// For a failure: the nodes that did not come back, with what the
    /// journal and the provisioner's log say about each (at most 3 nodes).
    fn missing_history(
        &mut self,
        entries: &[serde_json::Value],
        back: &std::collections::BTreeSet<&str>,
    ) -> String {
        let missing: std::collections::BTreeSet<&str> = entries
            .iter()
            .filter_map(|e| e["node"].as_str())
            .filter(|n| !back.contains(n))
            .collect();
        let logs = self.provisioner().logs();
        let mut out = format!("missing: {missing:?}\n");
        for node in missing.iter().take(3) {
            let needle = format!("node={node}");
            let journal: Vec<String> = entries
                .iter()
                .filter(|e| e["node"].as_str() == Some(node))
                .map(|e| e.to_string())
                .collect();
            let lines: Vec<&str> = logs.lines().filter(|l| l.contains(&needle)).collect();
            out += &format!(
                "--- {node}: journal (last 15)\n{}\n--- {node}: provisioner log (last 40)\n{}\n",
                journal[journal.len().saturating_sub(15)..].join("\n"),
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
        out + "--- log tail\n" + &self.provisioner().logs_tail(20)
    }

    /// Stops the provisioner (SIGTERM, must exit 0) and the fleet; returns
    /// the journal and checks the logs for secrets.
    async fn finish(mut self) -> Finished {
        let mut p = self.provisioner.take().unwrap();
        p.signal("TERM");
        let status = p.wait_exit(Duration::from_secs(10));
        assert!(status.success(), "the provisioner exited with {status}");
        let logs = p.logs();
        assert!(
            logs.lines().any(|l| l.contains("DEBUG")),
            "the run must log at debug level for the secrets check"
        );
        for secret in &self.secrets {
            if let Some(line) = logs.lines().find(|l| l.contains(secret.as_str())) {
                panic!("a secret appears in the provisioner's log: {line}");
            }
        }
        assert!(
            !logs.contains("PRIVATE KEY"),
            "private key material appears in the provisioner's log"
        );
        let (_, journal) = self.fleet.take().unwrap().finish().await;
        Finished {
            journal,
            logs,
            run: self,
        }
    }
}

struct Finished {
    journal: Vec<Value>,
    logs: String,
    run: Run,
}

impl Finished {
    fn finals(&self) -> BTreeMap<String, &Value> {
        self.journal
            .iter()
            .filter(|e| e["kind"] == "final")
            .map(|e| (e["node"].as_str().unwrap().to_string(), e))
            .collect()
    }

    /// OK replies to `action`, per node.
    fn ok_actions(&self, action: &str) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for e in &self.journal {
            if e["kind"] == "action" && e["action"] == action && e["outcome"] == "ok" {
                *counts
                    .entry(e["node"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
        }
        counts
    }

    /// Every node in `nodes` left provisioning exactly once: configured once,
    /// restarted once, and no provisioning request after its restart.
    fn assert_provisioned_once<'a>(&self, nodes: impl IntoIterator<Item = &'a String>) {
        self.assert_provisioned_once_after(nodes, 0)
    }

    /// [`Finished::assert_provisioned_once`] for nodes that restarted
    /// `earlier` times before (an upgrade restarts a node).
    fn assert_provisioned_once_after<'a>(
        &self,
        nodes: impl IntoIterator<Item = &'a String>,
        earlier: u64,
    ) {
        let finals = self.finals();
        let configured = self.ok_actions("configure");
        let restarted = self.ok_actions("restart");
        let mut count = 0;
        for node in nodes {
            count += 1;
            let f = finals
                .get(node)
                .unwrap_or_else(|| panic!("{node} has no final state"));
            assert_eq!(f["state"], "provisioned", "{node}: {f}");
            assert_eq!(
                f["restarts"].as_u64(),
                Some(earlier + 1),
                "{node} restart count: {f}"
            );
            assert_eq!(configured.get(node), Some(&1), "{node} configure count");
            assert_eq!(restarted.get(node), Some(&1), "{node} restart count");
        }
        assert!(count > 0);
    }
}

fn all_nodes(f: &Finished) -> Vec<String> {
    f.finals().keys().cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_feature_provisions_every_node_exactly_once() {
    let mut run = Run::start(Options::default()).await;
    run.wait_provisioned(NODES, Duration::from_secs(240)).await;
    let f = run.finish().await;
    let nodes = all_nodes(&f);
    assert_eq!(nodes.len(), NODES);
    f.assert_provisioned_once(&nodes);
    let finals = f.finals();
    let node = finals.values().next().unwrap();
    let keys: BTreeSet<&str> = node["config_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert!(
        keys.contains("plugin.choria.middleware_hosts") && keys.contains("identity"),
        "the helper's configuration reached the node: {keys:?}"
    );
    assert!(f.logs.contains("provisioned"), "success is logged");
}

/// A `configuration_template` and no helper: every node gets its own
/// rendered settings (identity, a fact, the site, the operator's values), and
/// no helper process ran (its timing summary stays empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_template_alone_provisions_every_node_with_no_helper_process() {
    const KEYS: [&str; 3] = [
        "identity",
        "plugin.choria.middleware_hosts",
        "plugin.choria.srv_domain",
    ];
    let mut run = Run::start(Options {
        nodes: 500,
        yaml: "features:\n  jwt: true\nconfiguration_template:\n  values:\n    broker: nats://broker.e2e.example.net:4222\n  configuration:\n\
               \x20   identity: '{{ identity }}'\n    plugin.choria.middleware_hosts: '{{ values.broker }}'\n\
               \x20   plugin.choria.srv_domain: '{{ inventory.facts.dc }}.{{ site }}.example.net'\n    plugin.choria.server.provision: false\n"
            .into(),
        without_helper: true,
        fleet: Box::new(|o| {
            o.facts = serde_json::json!({"dc": "ams1"});
            o.journal_config_keys = KEYS.iter().map(|k| k.to_string()).collect();
        }),
        ..Default::default()
    })
    .await;
    run.wait_provisioned(500, Duration::from_secs(180)).await;
    let (_, metrics) = run.provisioner().get("/metrics");
    let helper_runs = metrics
        .lines()
        .find(|l| l.starts_with("choria_provisioner_helper_time_count"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(helper_runs.unwrap_or(0.0), 0.0, "a helper ran:\n{metrics}");
    let f = run.finish().await;
    let nodes = all_nodes(&f);
    assert_eq!(nodes.len(), 500);
    f.assert_provisioned_once(&nodes);
    for (node, state) in f.finals() {
        let values = &state["config_values"];
        assert_eq!(values["identity"], node.as_str(), "{state}");
        assert_eq!(
            values["plugin.choria.middleware_hosts"],
            "nats://broker.e2e.example.net:4222"
        );
        assert_eq!(values["plugin.choria.srv_domain"], "ams1.e2e.example.net");
    }
}

/// A template that does not render for a node fails that node alone, with
/// the setting's name, and counts it; the process stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_that_does_not_render_fails_its_nodes_naming_the_setting() {
    let mut run = Run::start(Options {
        nodes: 50,
        yaml: "features:\n  jwt: true\nconfiguration_template:\n  configuration:\n    identity: '{{ identity }}'\n\
               \x20   plugin.choria.srv_domain: '{{ inventory.facts.dc }}.example.net'\n    plugin.choria.server.provision: false\n"
            .into(),
        without_helper: true,
        ..Default::default()
    })
    .await;
    run.provisioner()
        .wait_for_metric(
            "choria_provisioner_template_errors",
            50.0,
            Duration::from_secs(60),
        )
        .await;
    let f = run.finish().await;
    assert!(
        f.logs.lines().any(|l| l
            .contains("configuration_template.configuration.plugin.choria.srv_domain")
            && l.contains("undefined")),
        "the failure names the setting"
    );
    assert_eq!(f.ok_actions("configure").len(), 0, "nothing was configured");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pki_feature_delivers_certificates_signed_by_the_helper_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = pki::CertificateAuthority::generate("e2e test CA").unwrap();
    let ca_cert = dir.path().join("ca.pem");
    let ca_key = dir.path().join("ca.key");
    std::fs::write(&ca_cert, ca.cert_pem()).unwrap();
    std::fs::write(&ca_key, ca.key_pem()).unwrap();
    // The helper also ships a private key, which the node must decrypt: that
    // needs the jwt feature (its reply starts the key exchange).
    let node_key = csr::generate_rsa_key(2048).unwrap();
    let node_key_pem = csr::private_key_pkcs1_pem(&node_key).unwrap();
    let key_file = dir.path().join("node.key");
    std::fs::write(&key_file, &node_key_pem).unwrap();
    let expected_key_sha = {
        use sha2::Digest;
        let der = pem::parse(&node_key_pem).unwrap().into_contents();
        hex::encode(sha2::Sha256::digest(der))
    };

    let mut run = Run::start(Options {
        yaml: "features:\n  jwt: true\n  pki: true\n".into(),
        helper: vec![
            "--ca-cert".into(),
            s(&ca_cert),
            "--ca-key".into(),
            s(&ca_key),
            "--key-file".into(),
            s(&key_file),
        ],
        ..Default::default()
    })
    .await;
    run.secrets.push(
        node_key_pem
            .lines()
            .nth(5)
            .expect("a key body line")
            .to_string(),
    );
    run.wait_provisioned(NODES, Duration::from_secs(300)).await;
    let f = run.finish().await;
    let nodes = all_nodes(&f);
    assert_eq!(nodes.len(), NODES);
    f.assert_provisioned_once(&nodes);
    for (node, state) in f.finals() {
        let cert = state["certificate"]
            .as_str()
            .unwrap_or_else(|| panic!("{node} received no certificate: {state}"));
        pki::verify_issued_by(cert, &ca.cert_pem())
            .unwrap_or_else(|e| panic!("{node}'s certificate is not from the CA: {e}"));
        assert_eq!(pki::certificate_common_name(cert).unwrap(), node);
        assert_eq!(state["ca"].as_str(), Some(ca.cert_pem().as_str()), "{node}");
        assert_eq!(
            state["private_key_sha256"].as_str(),
            Some(expected_key_sha.as_str()),
            "{node} did not decrypt the private key the helper returned"
        );
    }
    drop(dir);
}

/// The built-in CA (`ca:`, an ECDSA P-256 key file) signs every node's CSR
/// that a helper which only configures (`fleet-helper` without a CA) left
/// unsigned: each node gets a certificate for its name from that CA, and
/// the CA to trust. (A template instead of a helper: tests/it/builtin_ca.rs
/// and the guide's test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_built_in_ca_signs_what_a_helper_that_only_configures_leaves_unsigned() {
    let dir = tempfile::tempdir().unwrap();
    let ca = pki::CertificateAuthority::generate_p256("built-in CA").unwrap();
    let ca_cert = dir.path().join("ca.pem");
    let ca_key = dir.path().join("ca.key");
    std::fs::write(&ca_cert, ca.cert_pem()).unwrap();
    std::fs::write(&ca_key, ca.key_pem()).unwrap();
    // A helper process per node: fewer nodes than the other scenarios.
    const NODES: usize = 500;
    let mut run = Run::start(Options {
        yaml: format!(
            "features:\n  jwt: true\n  pki: true\nca:\n  certificate: {}\n  key: {}\n  validity: 30d\n",
            s(&ca_cert),
            s(&ca_key)
        ),
        nodes: NODES,
        ..Default::default()
    })
    .await;
    run.secrets.push(
        ca.key_pem()
            .lines()
            .nth(1)
            .expect("a key body line")
            .to_string(),
    );
    run.wait_provisioned(NODES, Duration::from_secs(300)).await;
    assert_eq!(
        run.provisioner().metric("choria_provisioner_ca_signatures"),
        NODES as f64
    );
    let f = run.finish().await;
    let nodes = all_nodes(&f);
    assert_eq!(nodes.len(), NODES);
    f.assert_provisioned_once(&nodes);
    for (node, state) in f.finals() {
        let cert = state["certificate"]
            .as_str()
            .unwrap_or_else(|| panic!("{node} received no certificate: {state}"));
        pki::verify_issued_by(cert, &ca.cert_pem())
            .unwrap_or_else(|e| panic!("{node}'s certificate is not from the CA: {e}"));
        assert_eq!(pki::certificate_common_name(cert).unwrap(), node);
        assert_eq!(state["ca"].as_str(), Some(ca.cert_pem().as_str()), "{node}");
    }
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ed25519_feature_issues_chain_signed_server_jwts() {
    let run = Run::start(Options {
        protocol: Version::V2,
        yaml: "features:\n  ed25519: true\njwt_signing_key: {dir}/signer.seed\njwt_signing_token: {dir}/signer.jwt\n".into(),
        helper: vec![
            "--set".into(),
            "plugin.security.provider=choria".into(),
            "--collectives".into(),
            "choria,eu".into(),
        ],
        prepare: Box::new(|dir, issuer| {
            // The provisioner signs server JWTs with its own key, chained to
            // the organisation issuer through jwt_signing_token.
            let signer = Ed25519KeyPair::generate();
            std::fs::write(dir.join("signer.seed"), signer.seed_hex()).unwrap();
            let now = chrono::Utc::now().timestamp();
            let mut claims = ClientIdClaims::new_at(
                now,
                "provisioner-signer",
                Some(&signer.public_hex()),
                "",
                Duration::from_secs(86400),
            )
            .unwrap();
            claims.standard.add_org_issuer_data(issuer.signing_key()).unwrap();
            let jwt = TokenSigningKey::Ed25519(issuer.signing_key().clone())
                .sign(&claims)
                .unwrap();
            std::fs::write(dir.join("signer.jwt"), jwt).unwrap();
            vec![signer.seed_hex()]
        }),
        ..Default::default()
    })
    .await;
    let mut run = run;
    run.wait_provisioned(NODES, Duration::from_secs(300)).await;
    let issuer_public = run.issuer.verifying_key();
    let f = run.finish().await;
    let nodes = all_nodes(&f);
    assert_eq!(nodes.len(), NODES);
    f.assert_provisioned_once(&nodes);
    for (node, state) in f.finals() {
        let jwt = state["server_jwt"]
            .as_str()
            .unwrap_or_else(|| panic!("{node} received no server JWT: {state}"));
        let claims =
            tokens::verify_chain_issued_server_token(jwt, &issuer_public).unwrap_or_else(|e| {
                panic!("{node}'s server JWT does not verify through the chain: {e}")
            });
        assert_eq!(claims.identity, node);
        assert_eq!(claims.collectives, vec!["choria", "eu"], "{node}");
        assert_eq!(
            Some(claims.standard.public_key.as_str()),
            state["ed25519_public_key"].as_str(),
            "{node}: the JWT is for the key the node generated"
        );
        assert_eq!(state["protocol"], "v2", "{node}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_update_nodes_then_provision_them_after_their_restart() {
    let mut run = Run::start(Options {
        yaml: "features:\n  jwt: true\n  upgrades: true\nupgrades_repository: https://repo.example.net/choria\n".into(),
        helper: vec!["--upgrade".into(), "0.31.0".into()],
        fleet: Box::new(|o| {
            o.upgradable = true;
            o.server_version = "0.30.2".into();
        }),
        ..Default::default()
    })
    .await;
    run.wait_provisioned(NODES, Duration::from_secs(300)).await;
    let f = run.finish().await;
    let nodes = all_nodes(&f);
    // One restart onto the new version, one after configure.
    f.assert_provisioned_once_after(&nodes, 1);
    let updates = f.ok_actions("release_update");
    for (node, state) in f.finals() {
        assert_eq!(state["version"], "0.31.0", "{node}: {state}");
        assert_eq!(updates.get(&node), Some(&1), "{node} release_update count");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_nodes_are_provisioned_on_a_later_cycle() {
    let mut run = Run::start(Options {
        nodes: 200,
        helper: vec!["--defer-once-dir".into(), "{dir}/deferred".into()],
        prepare: Box::new(|dir, _| {
            std::fs::create_dir(dir.join("deferred")).unwrap();
            Vec::new()
        }),
        ..Default::default()
    })
    .await;
    // Every node is deferred on the first cycle...
    run.provisioner()
        .wait_for_metric(
            "choria_provisioner_provision_errors",
            200.0,
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(
        run.provisioner().metric("choria_provisioner_provisioned"),
        0.0
    );
    // ...and provisioned by the discovery one interval later.
    run.wait_provisioned(200, Duration::from_secs(120)).await;
    let f = run.finish().await;
    let nodes = all_nodes(&f);
    f.assert_provisioned_once(&nodes);
    assert!(
        f.logs.contains("deferred once by fleet-helper"),
        "the helper's defer message is logged"
    );
    assert_eq!(
        std::fs::read_dir(f.run.path("deferred")).unwrap().count(),
        200
    );
}

/// Nodes 0–4 denied, 5–9 deferred, 10–19 allowed, by their number.
const ADMISSION_POLICY: &str = r#"package choria.provisioner

digits := trim_left(regex.find_n(`[0-9]+`, input.identity, 1)[0], "0")

n := 0 if digits == ""

n := to_number(digits) if digits != ""

allow if {
    n >= 10
    input.protocol == "v1"
    "choria_provision" in input.agents
}

defer if {
    n >= 5
    n < 10
}

deny_reason := sprintf("node %d is in the retired rack", [n]) if n < 5
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_policy_refuses_and_defers_nodes_before_the_helper_sees_them() {
    let mut run = Run::start(Options {
        nodes: 20,
        yaml: "features:\n  jwt: true\nadmission:\n  policy: {dir}/admission.rego\n".into(),
        // The helper would shut nodes 0–9 down: any `shutdown` in the
        // journal means it saw a node the policy stopped.
        helper: vec!["--shutdown-match".into(), "^node-0*[0-9]\\.".into()],
        prepare: Box::new(|dir, _| {
            std::fs::write(dir.join("admission.rego"), ADMISSION_POLICY).unwrap();
            Vec::new()
        }),
        ..Default::default()
    })
    .await;
    run.wait_provisioned(10, Duration::from_secs(60)).await;
    let p = run.provisioner();
    p.wait_for_metric(
        "choria_provisioner_admission{decision=\"denied\"",
        5.0,
        Duration::from_secs(30),
    )
    .await;
    p.wait_for_metric(
        "choria_provisioner_admission{decision=\"deferred\"",
        5.0,
        Duration::from_secs(30),
    )
    .await;
    let f = run.finish().await;
    let number = |node: &str| -> u32 {
        let digits: String = node.chars().filter(char::is_ascii_digit).collect();
        digits.parse().unwrap()
    };
    let allowed: Vec<String> = all_nodes(&f)
        .into_iter()
        .filter(|n| number(n) >= 10)
        .collect();
    assert_eq!(allowed.len(), 10, "{allowed:?}");
    f.assert_provisioned_once(&allowed);
    let configured = f.ok_actions("configure");
    assert_eq!(
        configured.len(),
        10,
        "only allowed nodes configured: {configured:?}"
    );
    assert!(
        f.ok_actions("shutdown").is_empty(),
        "the helper saw a node the policy stopped"
    );
    assert!(
        f.logs
            .contains("refused by the admission policy: node 3 is in the retired rack"),
        "the policy's reason is logged"
    );
    assert!(f.logs.contains("deferred by the admission policy"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helper_can_shut_nodes_down() {
    let mut run = Run::start(Options {
        // `=`: the pattern starts with '-', which would read as a flag.
        helper: vec!["--shutdown-match=-00[0-4][0-9]\\.".into()],
        ..Default::default()
    })
    .await;
    // 50 nodes (0000-0049) are shut down, the rest provisioned.
    run.wait_provisioned(NODES - 50, Duration::from_secs(300))
        .await;
    run.provisioner()
        .wait_for_metric(
            "choria_provisioner_helper_shutdown_requests",
            50.0,
            Duration::from_secs(30),
        )
        .await;
    // A node shuts down up to 10 s after acknowledging (go-choria's splay).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let f = run.finish().await;
    let finals = f.finals();
    let (down, up): (Vec<String>, Vec<String>) = finals
        .keys()
        .cloned()
        .partition(|n| n.as_str() < "node-0050");
    assert_eq!(down.len(), 50);
    for node in &down {
        assert_eq!(finals[node]["state"], "shutdown", "{node}");
        assert_eq!(finals[node]["configured"], 0, "{node}");
    }
    f.assert_provisioned_once(&up);
}

/// Journal `jwt` requests per node, as Unix microseconds.
fn jwt_request_times(journal: &[Value]) -> BTreeMap<String, Vec<i64>> {
    let mut times: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for e in journal {
        if e["kind"] == "action" && e["action"] == "jwt" {
            times
                .entry(e["node"].as_str().unwrap().to_string())
                .or_default()
                .push(e["time_us"].as_i64().unwrap());
        }
    }
    times
}

/// The nodes of `failing_nodes_and_helpers_are_logged_counted_and_retried`
/// the journal does not yet show retried on a second cycle (a crashing
/// helper's, node-000 to 009, asked for its JWT again over 50 s later, a
/// node answering with errors 6 times: 3 tries a cycle, a malformed one
/// twice), and how many nodes crash the helper. Injected failures are told
/// by the outcomes of a node's requests.
fn not_retried(journal: &[Value]) -> (Vec<String>, usize) {
    let mut injected: BTreeMap<&str, &str> = BTreeMap::new();
    for e in journal.iter().filter(|e| e["kind"] == "action") {
        if let ("error" | "malformed" | "silent", Some(node)) =
            (e["outcome"].as_str().unwrap_or(""), e["node"].as_str())
        {
            injected.insert(node, e["outcome"].as_str().unwrap());
        }
    }
    let times = jwt_request_times(journal);
    let crashing: Vec<String> = (0..10)
        .map(|i| format!("node-{i:03}.fleet.example.net"))
        .filter(|n| !injected.contains_key(n.as_str()))
        .collect();
    let mut missing: Vec<String> = crashing
        .iter()
        .filter(|n| {
            let t = times.get(n.as_str()).map(Vec::as_slice).unwrap_or_default();
            t.len() < 2 || t.iter().max().unwrap() - t.iter().min().unwrap() <= 50_000_000
        })
        .cloned()
        .collect();
    for (node, kind) in injected {
        let want = match kind {
            "error" => 6,
            "malformed" => 2,
            _ => continue,
        };
        if times.get(node).map(Vec::len).unwrap_or(0) < want {
            missing.push(node.to_string());
        }
    }
    (missing, crashing.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_nodes_and_helpers_are_logged_counted_and_retried() {
    const N: usize = 500;
    let mut run = Run::start(Options {
        nodes: N,
        // nodes 000-009 make the helper crash
        helper: vec![
            "--fail".into(),
            "crash".into(),
            "--fail-match=-00[0-9]\\.".into(),
        ],
        fleet: Box::new(|o| {
            o.fail_error = 0.02;
            o.fail_malformed = 0.02;
            o.fail_silent = 0.02;
            o.seed = 7;
        }),
        ..Default::default()
    })
    .await;
    // Failed nodes are retried by the second discovery (interval 1m):
    // wait for it, for its retries in the journal, then for every sequence
    // to end, so that the counters read below are final.
    run.provisioner()
        .wait_for_metric(
            "choria_provisioner_discover_cycles",
            2.0,
            Duration::from_secs(120),
        )
        .await;
    let journal = run.path("journal.jsonl");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (missing, crashing) = not_retried(&crate::support::read_journal_so_far(&journal));
        let helper_errors = run.provisioner().metric("choria_provisioner_helper_errors");
        if missing.is_empty() && helper_errors >= 2.0 * crashing as f64 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not retried on the second cycle: {missing:?}; helper_errors {helper_errors}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let p = run.provisioner();
    p.wait_for_metric_at_most("choria_provisioner_sequences", 0.0, Duration::from_secs(30))
        .await;
    assert!(p.is_running(), "the provisioner stays up");
    let cycles = p.metric("choria_provisioner_discover_cycles");
    assert!(cycles >= 2.0, "discover_cycles {cycles}");
    let provisioned = p.metric("choria_provisioner_provisioned");
    let helper_errors = p.metric("choria_provisioner_helper_errors");
    let rpc_errors = p.metric("choria_provisioner_rpc_errors");
    let provision_errors = p.metric("choria_provisioner_provision_errors");
    let unconfirmed = p.metric("choria_provisioner_unconfirmed_discoveries");
    let f = run.finish().await;

    let finals = f.finals();
    let injected: BTreeSet<&String> = finals
        .iter()
        .filter(|(_, v)| v.get("injected_failure").is_some())
        .map(|(k, _)| k)
        .collect();
    let helper_crash: BTreeSet<String> = finals
        .keys()
        .filter(|n| n.as_str() < "node-010")
        .cloned()
        .collect();
    assert!(injected.len() >= 15, "{} injected failures", injected.len());
    let healthy: Vec<String> = finals
        .keys()
        .filter(|n| !injected.contains(n) && !helper_crash.contains(*n))
        .cloned()
        .collect();
    f.assert_provisioned_once(&healthy);
    assert_eq!(provisioned as usize, healthy.len(), "provisioned counter");

    // Helper crashes: counted, logged with node and step, retried next cycle.
    let crashed = helper_crash
        .iter()
        .filter(|n| !injected.contains(n))
        .count();
    assert!(
        helper_errors >= 2.0 * crashed as f64,
        "helper_errors {helper_errors} for {crashed} crashing nodes over 2 cycles"
    );
    let times = jwt_request_times(&f.journal);
    for node in helper_crash.iter().filter(|n| !injected.contains(n)) {
        let line = f
            .logs
            .lines()
            .find(|l| l.contains(node.as_str()) && l.contains("step=helper"))
            .unwrap_or_else(|| panic!("no helper failure logged for {node}"));
        assert!(line.contains("exited with status 3"), "{line}");
        let t = &times[node];
        assert!(
            t.len() >= 2 && t.iter().max().unwrap() - t.iter().min().unwrap() > 50_000_000,
            "{node} was not retried on a later cycle: jwt at {t:?}"
        );
    }
    // Nodes answering with errors: RPC errors, 3 tries per cycle, retried
    // next cycle, logged.
    let injected_as = |kind: &str| {
        finals
            .iter()
            .filter(|(_, v)| v["injected_failure"] == kind)
            .map(|(k, _)| k.clone())
            .collect::<Vec<String>>()
    };
    for node in injected_as("error") {
        assert_ne!(finals[&node]["state"], "provisioned", "{node}");
        let t = times.get(&node).map(Vec::len).unwrap_or(0);
        assert!(t >= 6, "{node} saw {t} jwt requests");
        assert!(
            f.logs
                .lines()
                .any(|l| l.contains(node.as_str()) && l.contains("step=choria_provision#jwt")),
            "no jwt failure logged for {node}"
        );
    }
    // Nodes whose replies do not verify (anyone could have sent those):
    // unconfirmed, one request a cycle, retried next cycle.
    for node in injected_as("malformed") {
        assert_ne!(finals[&node]["state"], "provisioned", "{node}");
        let t = times.get(&node).map(Vec::len).unwrap_or(0);
        assert!(t >= 2, "{node} saw {t} jwt requests");
    }
    assert!(
        unconfirmed >= injected_as("malformed").len() as f64,
        "unconfirmed_discoveries {unconfirmed}"
    );
    assert!(
        rpc_errors >= 2.0 * 0.04 * N as f64 * 0.5,
        "rpc_errors {rpc_errors}"
    );
    // Every failed RPC ended its node: a provisioning error, or (never
    // answered) an unconfirmed name.
    assert!(
        provision_errors + unconfirmed >= rpc_errors,
        "provision_errors {provision_errors} + unconfirmed {unconfirmed} < rpc_errors {rpc_errors}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_or_garbage_printing_helpers_fail_only_their_nodes() {
    for mode in ["hang", "garbage", "empty", "exit1"] {
        const N: usize = 60;
        let mut run = Run::start(Options {
            nodes: N,
            yaml: "features:\n  jwt: true\nhelper_timeout: 1s\n".into(),
            helper: vec![
                "--fail".into(),
                mode.into(),
                "--fail-match=-00[0-9]\\.".into(),
            ],
            ..Default::default()
        })
        .await;
        run.wait_provisioned(N - 10, Duration::from_secs(120)).await;
        run.provisioner()
            .wait_for_metric(
                "choria_provisioner_helper_errors",
                10.0,
                Duration::from_secs(30),
            )
            .await;
        let f = run.finish().await;
        let finals = f.finals();
        let (bad, good): (Vec<String>, Vec<String>) = finals
            .keys()
            .cloned()
            .partition(|n| n.as_str() < "node-010");
        f.assert_provisioned_once(&good);
        for node in &bad {
            assert_eq!(finals[node]["state"], "provisioning", "{mode}: {node}");
            assert!(
                f.logs
                    .lines()
                    .any(|l| l.contains(node.as_str()) && l.contains("step=helper")),
                "{mode}: no helper failure logged for {node}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_run_loses_no_node() {
    let mut run = Run::start(Options::default()).await;
    run.provisioner()
        .wait_for_metric(
            "choria_provisioner_provisioned",
            300.0,
            Duration::from_secs(120),
        )
        .await;
    run.nats.restart(Duration::from_secs(1));
    // Wait on the nodes, not on our counter: a node whose restart reply was
    // lost in the outage did restart, but its sequence counts as failed.
    run.wait_servers_back(NODES, Duration::from_secs(300)).await;
    let f = run.finish().await;
    assert!(
        f.logs.contains("disconnected from the broker"),
        "the disconnect is logged"
    );
    let finals = f.finals();
    assert_eq!(finals.len(), NODES);
    for (node, state) in &finals {
        // A configure whose reply was lost is repeated; what matters is that
        // every node left provisioning, once.
        assert_eq!(state["state"], "provisioned", "{node}: {state}");
        assert_eq!(state["restarts"], 1, "{node}: {state}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_within_the_grace_period_and_the_next_instance_finishes() {
    let mut run = Run::start(Options::default()).await;
    run.provisioner()
        .wait_for_metric(
            "choria_provisioner_provisioned",
            200.0,
            Duration::from_secs(120),
        )
        .await;
    let p = run.provisioner();
    let started = std::time::Instant::now();
    p.signal("TERM");
    let status = p.wait_exit(Duration::from_secs(5));
    let took = started.elapsed();
    println!("stopped {took:?} after SIGTERM");
    assert!(status.success(), "exit status {status}");
    // The process bounds its shutdown at 1.5 s (SHUTDOWN_LIMIT); measured
    // here with a load average of 8 on 2 cores: 0.26 s for this test, at
    // most 0.65 s in tests/shutdown.rs.
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    assert!(p.logs().contains("shutting down"));
    // A second instance (as the next leader would) provisions the rest.
    let yaml = std::fs::read_to_string(run.path("provisioner.yaml")).unwrap();
    let yaml: String = yaml
        .lines()
        .filter(|l| !l.starts_with("monitor_port"))
        .map(|l| format!("{l}\n"))
        .collect();
    let ccfg = std::fs::read_to_string(run.path("provisioner-choria.cfg")).unwrap();
    let next = ProvisionerProcess::start_named(run.dir.path(), "next", &yaml, &ccfg, &["--debug"]);
    run.provisioner = Some(next);
    // Wait until every node has come back as a provisioned server (its
    // `startup` event for component `server`), whichever instance did it:
    // the first one kept provisioning until its shutdown took effect.
    run.wait_servers_back(NODES, Duration::from_secs(300)).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let f = run.finish().await;
    for (node, state) in f.finals() {
        assert_eq!(state["state"], "provisioned", "{node}: {state}");
        assert_eq!(state["restarts"], 1, "{node}: {state}");
    }
}

/// Log lines go through a writer thread with a bounded buffer: a stdout
/// that nobody reads (a stuck log collector, a full pipe) must not stall
/// the workers. At debug level a few hundred nodes write far more than a
/// pipe's 64 KiB; with a blocking writer the first worker to log after the
/// pipe filled would wait for ever, and with it the provisioning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stdout_does_not_stall_provisioning() {
    const N: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    let fleet = RunningFleet::start(FleetOptions {
        broker: BrokerOptions::at([nats.url()]),
        nodes: N,
        journal: Some(dir.path().join("journal.jsonl")),
        key_pool_size: 2,
        ..Default::default()
    })
    .await;
    let monitor = crate::support::free_port();
    let yaml = dir.path().join("provisioner.yaml");
    std::fs::write(
        &yaml,
        format!(
            "workers: 16\nchoria_insecure: true\nloglevel: debug\nmonitor_port: {monitor}\nsite: stalled\n\
             configuration_template:\n  configuration:\n    identity: '{{{{ identity }}}}'\n    plugin.choria.server.provision: 'false'\n"
        ),
    )
    .unwrap();
    let ccfg = dir.path().join("choria.cfg");
    std::fs::write(
        &ccfg,
        format!(
            "identity = provisioner.stalled\nplugin.choria.middleware_hosts = {}\n",
            nats.url()
        ),
    )
    .unwrap();
    // stdout and stderr are a pipe this test holds and never reads.
    let mut child = std::process::Command::new(binary())
        .args(["run", "--config"])
        .arg(&yaml)
        .arg("--choria-config")
        .arg(&ccfg)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let provisioned = || -> f64 {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", monitor)) else {
            return 0.0;
        };
        // A provisioner stalled by its logs does not answer either.
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        use std::io::{Read, Write};
        let _ = write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        crate::support::provisioner::metric_sum(&text, "choria_provisioner_provisioned")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while provisioned() < N as f64 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {N} provisioned in 120 s with a stdout nobody reads",
            provisioned()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    let (_, journal) = fleet.finish().await;
    let configured = journal
        .iter()
        .filter(|e| e["kind"] == "action" && e["action"] == "configure" && e["outcome"] == "ok")
        .count();
    assert_eq!(configured, N);
}

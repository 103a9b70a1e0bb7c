//! `choria-provisioner run` provisions REAL go-choria 0.30.2 servers end to end:
//!
//! * v1: x509 with `pki`: the provisioner speaks insecure v1, our `fleet-helper`
//!   signs the node's CSR with the CA that also signed the broker's certificate;
//! * v2: an ed25519 Organization Issuer: the provisioner speaks v2 with a client
//!   JWT from the issuer and signs the node's server JWT with a chain-issuer key.
//!
//! After `restart` each server must come back (same PID, re-exec) with the
//! helper's configuration, connect with verified TLS, announce itself as a
//! normal `server` and answer a real `choria` client in its new collective, but
//! no longer in `provisioning`. The provisioner runs with `--debug` and its log
//! must hold no token, seed or private key.
//!
//! Needs `$CHORIA_BIN` and root, like tests/interop_go.rs (see
//! tests/gopeers/RECIPE.md); without the binary each test says so loudly and
//! returns.

mod support;

use choria_provisioner::choria::client::{ChoriaClient, Identity};
use choria_provisioner::choria::lifecycle::{self, Event, EventType};
use choria_provisioner::choria::protocol::{RequestSigner, Version};
use choria_provisioner::choria::security::ed25519::{self, Ed25519KeyPair};
use choria_provisioner::choria::security::tokens;
use choria_provisioner::fleet::ca as pki;
use futures::StreamExt;
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use support::gopeers::{choria_bin, choria_tool, make_signers, s, CaNats, GoServer, Signers};
use support::provisioner::{binary, ProvisionerProcess};
use support::{discover_provisionable, NatsServer};

const TOKEN: &str = "r3al-g0-pr0visioning-t0ken";
const PROVISIONER: &str = "provisioner.example.net";
const VERSION: &str = "0.30.2";
/// Real servers start in about a second; generous for a loaded machine.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);
/// From the provisioner's start to `provisioned`: discovery or the startup
/// event, five RPCs and the helper.
const PROVISION_TIMEOUT: Duration = Duration::from_secs(30);
/// From `provisioned` to the re-exec'd server's startup: 2 s splay plus boot.
const RESTART_TIMEOUT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// What both tests share.
// ---------------------------------------------------------------------------

/// One lifecycle event as it came off the wire.
#[derive(Clone, Debug)]
struct Seen {
    subject: String,
    kind: EventType,
    event: Event,
}

/// Every lifecycle event on the broker, in arrival order.
struct EventLog {
    sub: async_nats::Subscriber,
    seen: Vec<Seen>,
}

impl EventLog {
    /// Waits for `identity`'s `kind` event from `component`; fails with what
    /// did arrive and `server`'s log.
    async fn wait_for(
        &mut self,
        identity: &str,
        kind: EventType,
        component: &str,
        timeout: Duration,
        server: Option<&GoServer>,
    ) -> Seen {
        let matches = |e: &Seen| {
            e.kind == kind && e.event.identity == identity && e.event.component == component
        };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.seen.iter().find(|e| matches(e)) {
                return e.clone();
            }
            let Ok(Some(msg)) = tokio::time::timeout_at(deadline, self.sub.next()).await else {
                panic!(
                    "no {} event from {identity} ({component}) within {timeout:?}; seen: {:#?}\n--- server.log:\n{}",
                    kind.name(),
                    self.seen
                        .iter()
                        .map(|e| format!("{} {}", e.subject, e.event.identity))
                        .collect::<Vec<_>>(),
                    server.map(GoServer::log).unwrap_or_default()
                );
            };
            let (kind, event) = lifecycle::parse(&msg.payload).unwrap_or_else(|e| {
                panic!(
                    "not a lifecycle event on {} ({e}): {}",
                    msg.subject,
                    String::from_utf8_lossy(&msg.payload)
                )
            });
            self.seen.push(Seen {
                subject: msg.subject.to_string(),
                kind,
                event,
            });
        }
    }

    /// Waits until `identity` sent `n` `kind` events from `component`.
    async fn wait_count(
        &mut self,
        identity: &str,
        (kind, component): (EventType, &str),
        n: usize,
        timeout: Duration,
        server: &GoServer,
    ) {
        let deadline = tokio::time::Instant::now() + timeout;
        let count = |seen: &[Seen]| {
            seen.iter()
                .filter(|e| {
                    e.kind == kind && e.event.identity == identity && e.event.component == component
                })
                .count()
        };
        while count(&self.seen) < n {
            let Ok(Some(msg)) = tokio::time::timeout_at(deadline, self.sub.next()).await else {
                panic!(
                    "{} of {n} {} events from {identity} ({component}) within {timeout:?}; history {:?}\n--- server.log:\n{}",
                    count(&self.seen),
                    kind.name(),
                    self.history(identity),
                    server.log()
                );
            };
            if let Ok((kind, event)) = lifecycle::parse(&msg.payload) {
                self.seen.push(Seen {
                    subject: msg.subject.to_string(),
                    kind,
                    event,
                });
            }
        }
    }

    /// `identity`'s events so far as `kind.component` subjects' last two
    /// words, without `alive`: a heartbeat servers publish at a random moment.
    fn history(&self, identity: &str) -> Vec<String> {
        self.seen
            .iter()
            .filter(|e| e.event.identity == identity && e.kind != EventType::Alive)
            .map(|e| format!("{}.{}", e.kind.name(), e.event.component))
            .collect()
    }
}

/// A broker whose TLS certificate the test CA signed, the provisioning-JWT
/// signers, and a watcher subscribed to every lifecycle event.
struct Bench {
    bin: PathBuf,
    work: tempfile::TempDir,
    broker: CaNats,
    signers: Signers,
    watcher: async_nats::Client,
    events: EventLog,
    /// Strings that must never appear in the provisioner's log.
    secrets: Vec<(&'static str, String)>,
}

impl Bench {
    /// `None` (having said why, loudly) when the real binary is not available.
    async fn start(test: &str) -> Option<Bench> {
        let bin = choria_bin(test)?;
        let work = tempfile::tempdir().unwrap();
        let broker = CaNats::start(work.path());
        let signers = make_signers(&bin, work.path());
        let watcher = broker.nats.connect("watcher").await;
        let sub = watcher.subscribe("choria.lifecycle.event.>").await.unwrap();
        watcher.flush().await.unwrap();
        let secrets = vec![
            ("the provisioning token", TOKEN.to_string()),
            (
                "the issuer seed",
                std::fs::read_to_string(&signers.issuer_seed).unwrap(),
            ),
            ("a line of the CA key", pem_body_line(&broker.ca.key)),
        ];
        Some(Bench {
            bin,
            work,
            broker,
            signers,
            watcher,
            events: EventLog {
                sub,
                seen: Vec::new(),
            },
            secrets,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.work.path().join(name)
    }

    fn url(&self) -> String {
        self.broker.nats.url()
    }

    /// A real server of `version` in provisioning mode, in `<work>/<identity>`,
    /// once it announced itself.
    async fn server(&mut self, identity: &str, version: Version) -> GoServer {
        let server = GoServer::start(
            &self.bin,
            &self.signers,
            &self.path(identity),
            identity,
            &self.url(),
            version,
            TOKEN,
        );
        let e = self
            .events
            .wait_for(
                identity,
                EventType::Startup,
                "provision_mode_server",
                STARTUP_TIMEOUT,
                Some(&server),
            )
            .await;
        assert_eq!(e.event.version.as_deref(), Some(VERSION), "{identity}");
        server
    }

    /// The helper: `fleet-helper` sending nodes to our broker with `settings`
    /// on top and signing CSRs with the test CA, its reply extended with
    /// `action_policies` (fleet-helper has no option for them), all in a
    /// POSIX sh script.
    fn helper(&self, settings: &[(&str, String)], policies: &Value) -> PathBuf {
        let mut args = vec![
            binary().to_string(),
            "fleet-helper".into(),
            "--broker".into(),
            self.url(),
            "--ca-cert".into(),
            s(&self.broker.ca.cert).into(),
            "--ca-key".into(),
            s(&self.broker.ca.key).into(),
        ];
        for (k, v) in settings {
            args.push("--set".into());
            args.push(format!("{k}={v}"));
        }
        let script = self.path("helper.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\n# fleet-helper answers with one JSON object on one line.\n\
                 reply=$({}) || exit $?\nprintf '%s,\"action_policies\":%s}}\\n' \"${{reply%\\}}}}\" {}\n",
                shell_words::join(args),
                shell_words::quote(&policies.to_string())
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        script
    }

    /// The settings `helper` gives every node: fleet-helper's own four and `settings`.
    fn expected_config(
        &self,
        identity: &str,
        settings: &[(&str, String)],
    ) -> BTreeMap<String, String> {
        [
            ("identity", identity.to_string()),
            ("plugin.choria.server.provision", "false".into()),
            ("plugin.choria.middleware_hosts", self.url()),
            ("loglevel", "info".into()),
        ]
        .into_iter()
        .chain(settings.iter().cloned())
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Runs our provisioner with `--debug`; `yaml` gets the common keys.
    fn provisioner(
        &self,
        site: &str,
        yaml: &str,
        choria_cfg: &str,
        helper: &Path,
    ) -> ProvisionerProcess {
        // discovery_timeout: Go's fixed 2 s. With our 10 s default a discovery
        // that finds nobody (here: every one after the node left provisioning)
        // holds up SIGTERM for its whole length, as `run` waits for it.
        let yaml = format!(
            "workers: 2\ninterval: 1m\ntoken: {TOKEN}\nsite: {site}\nhelper: {}\ndiscovery_timeout: 2s\n{yaml}",
            serde_json::to_string(s(helper)).unwrap()
        );
        let dir = self.path("provisioner");
        std::fs::create_dir_all(&dir).unwrap();
        ProvisionerProcess::start(&dir, &yaml, choria_cfg, &["--debug"])
    }

    /// Waits until `server` was provisioned by `p`, restarted (re-exec, same
    /// PID) and announced itself as a normal server; checks the events on the
    /// way and the provisioner's counters.
    async fn wait_provisioned_and_restarted(
        &mut self,
        p: &mut ProvisionerProcess,
        server: &mut GoServer,
    ) {
        let id = server.identity.clone();
        let pid = server.pid();
        p.wait_for_metric("choria_provisioner_provisioned", 1.0, PROVISION_TIMEOUT)
            .await;
        let startup = self
            .events
            .wait_for(
                &id,
                EventType::Startup,
                "server",
                RESTART_TIMEOUT,
                Some(server),
            )
            .await;
        assert_eq!(startup.subject, "choria.lifecycle.event.startup.server");
        assert_eq!(startup.event.version.as_deref(), Some(VERSION));
        assert_eq!(
            self.events.history(&id),
            [
                "startup.provision_mode_server",
                "provisioned.provision_mode_server",
                "shutdown.provision_mode_server",
                "startup.server",
            ],
            "{id}: configure publishes provisioned, restart a shutdown, and the server \
             comes back as a normal server, never again in provisioning mode"
        );
        assert!(
            server.exit_status().is_none(),
            "{id} exited instead of re-executing itself:\n{}",
            server.log()
        );
        assert_eq!(server.pid(), pid);
        let log = server.log();
        assert!(
            log.contains("Initiating Choria Server restart using"),
            "{id} restarted by re-exec:\n{log}"
        );
        assert_eq!(p.metric("choria_provisioner_provisioned"), 1.0);
        for failures in [
            "choria_provisioner_provision_errors",
            "choria_provisioner_helper_errors",
            "choria_provisioner_rpc_errors",
        ] {
            assert_eq!(p.metric(failures), 0.0, "{failures}; log:\n{}", p.logs());
        }
    }

    /// The restarted server's one open connection: TLS, and subscribed to
    /// `collective` only, no longer to `provisioning`.
    fn assert_connected_in(&self, identity: &str, collective: &str) {
        let conns = self.broker.connections(identity);
        assert_eq!(conns.len(), 1, "{identity}'s connections: {conns:#?}");
        let c = &conns[0];
        assert_eq!(c["tls_version"], "1.3", "{identity} connects with TLS: {c}");
        let subs: Vec<&str> = c["subscriptions_list"]
            .as_array()
            .unwrap_or_else(|| panic!("no subscriptions: {c}"))
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            subs.contains(&format!("{collective}.node.{identity}").as_str())
                && subs.contains(&format!("{collective}.broadcast.agent.rpcutil").as_str()),
            "{identity} serves the {collective} collective: {subs:?}"
        );
        assert!(
            subs.iter().all(|s| !s.starts_with("provisioning.")),
            "{identity} left the provisioning collective: {subs:?}"
        );
    }

    /// Stops the provisioner (SIGTERM, exit 0) and checks that its debug log
    /// holds none of `secrets` and no private key.
    fn stop_and_check_log(&self, mut p: ProvisionerProcess) -> String {
        p.signal("TERM");
        let status = p.wait_exit(Duration::from_secs(10));
        assert!(status.success(), "the provisioner exited with {status}");
        let logs = p.logs();
        assert!(
            logs.lines().any(|l| l.contains("DEBUG")),
            "the run must log at debug level for the secrets check:\n{logs}"
        );
        for (what, secret) in &self.secrets {
            assert!(!secret.trim().is_empty(), "{what} is empty");
            if let Some(line) = logs.lines().find(|l| l.contains(secret.trim())) {
                panic!("{what} appears in the provisioner's log: {line}");
            }
        }
        assert!(
            !logs.contains("PRIVATE KEY"),
            "private key material appears in the provisioner's log"
        );
        logs
    }
}

/// An action policy for `rpcutil` that denies everything but `inventory`, and
/// that only to `caller`: go-choria's default authorization (action_policy,
/// unconfigured agents denied) serves a request only once it is in place.
fn rpcutil_policy(caller: &str) -> String {
    format!("policy default deny\nallow\t{caller}\tinventory\t*\t*\n")
}

/// The settings that point go-choria's file security provider at what
/// `configure` writes into the node's ssldir (the certificate, the key the
/// node made for its CSR, the CA), without SRV lookups.
fn file_provider_settings(ssl: &Path) -> [(&'static str, String); 5] {
    [
        ("plugin.choria.use_srv", "false".to_string()),
        ("plugin.security.provider", "file".to_string()),
        (
            "plugin.security.file.certificate",
            s(&ssl.join("certificate.pem")).to_string(),
        ),
        (
            "plugin.security.file.key",
            s(&ssl.join("private.pem")).to_string(),
        ),
        (
            "plugin.security.file.ca",
            s(&ssl.join("ca.pem")).to_string(),
        ),
    ]
}

/// Checks the action policies configure wrote next to the configuration.
fn assert_policy_written(node_dir: &Path, policy: &str) {
    let file = node_dir.join("policies").join("rpcutil.policy");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), policy);
    assert_eq!(mode(&file), 0o400);
}

/// A line from the middle of a PEM file's body: if it is in a log, the key is.
fn pem_body_line(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .nth(5)
        .unwrap_or_else(|| panic!("{} is too short for a PEM key", path.display()))
        .to_string()
}

/// The `key=value` lines of a configuration file go-choria wrote (each key
/// once), after its `# configuration file written in request ...` comment.
fn read_written_config(path: &Path) -> (String, BTreeMap<String, String>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default().to_string();
    let mut settings = BTreeMap::new();
    for l in lines {
        let (k, v) = l
            .split_once('=')
            .unwrap_or_else(|| panic!("{}: not key=value: {l:?}", path.display()));
        let old = settings.insert(k.to_string(), v.to_string());
        assert!(old.is_none(), "{}: {k} twice:\n{text}", path.display());
    }
    (header, settings)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Runs the real `choria` CLI with `--config config` and returns stdout; fails
/// with stderr on a non-zero exit.
async fn choria_cli(bin: &Path, dir: &Path, config: &Path, args: &[&str]) -> String {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(args)
        .arg("--config")
        .arg(config)
        .current_dir(dir)
        .env("HOME", dir)
        // The choria provider needs a client user name; nothing here may
        // switch security off.
        .env("USER", "root")
        .env_remove("INSECURE_YES_REALLY")
        .env_remove("INSECURE_DISABLE_TLS")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("choria {args:?} did not finish within 30 s"))
        .unwrap_or_else(|e| panic!("could not run choria {args:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "choria {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `choria req rpcutil <action> -I node` in the CLI's collective: the one reply.
async fn cli_rpcutil(bin: &Path, dir: &Path, config: &Path, action: &str, node: &str) -> Value {
    let out = choria_cli(
        bin,
        dir,
        config,
        &["req", "rpcutil", action, "-I", node, "--json"],
    )
    .await;
    let doc: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"));
    let replies = doc["replies"].as_array().unwrap_or_else(|| panic!("{doc}"));
    assert_eq!(replies.len(), 1, "{doc}");
    assert_eq!(replies[0]["sender"], node, "{doc}");
    replies[0].clone()
}

/// The provisioned server serves the real CLI's `rpcutil#inventory` in
/// `collective` (its request verified with the new security settings, the
/// helper's policy allowing it) and refuses `rpcutil#ping`, which the policy
/// denies.
async fn assert_serves_cli(bench: &Bench, config: &Path, node: &str, collective: &str) {
    let (bin, dir) = (&bench.bin, bench.work.path());
    let inv = cli_rpcutil(bin, dir, config, "inventory", node).await;
    assert_eq!(inv["statuscode"], 0, "{inv}");
    assert_eq!(inv["data"]["main_collective"], collective, "{inv}");
    assert_eq!(inv["data"]["version"], VERSION, "{inv}");
    let ping = cli_rpcutil(bin, dir, config, "ping", node).await;
    assert_eq!(
        (&ping["statuscode"], &ping["statusmsg"]),
        (
            &Value::from(1),
            &Value::from("You are not authorized to call this agent or action")
        ),
        "{ping}"
    );
}

// ---------------------------------------------------------------------------
// 1. v1, x509 with the pki feature.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_v1_server_is_provisioned_with_pki() {
    let Some(mut bench) = Bench::start("real_v1_server_is_provisioned_with_pki").await else {
        return;
    };
    let id = "real-v1.provision.example.net";
    let node_dir = bench.path(id);
    let ssl = node_dir.join("ssl");
    // The file provider pointed at what configure writes into the node's
    // ssldir: the certificate our helper signs, the key the node made for its
    // CSR, and the CA, which also signed the broker's certificate.
    let settings = file_provider_settings(&ssl);
    let policy = rpcutil_policy("choria=admin.mcollective");
    let helper = bench.helper(&settings, &serde_json::json!({ "rpcutil.policy": policy }));
    let choria_cfg = format!(
        "identity = {PROVISIONER}\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
        bench.url()
    );
    let yaml = format!(
        "choria_insecure: true\njwt_verify_cert: {}\nfeatures:\n  jwt: true\n  pki: true\n",
        s(&bench.signers.rsa_public)
    );
    let mut p = bench.provisioner("real-v1", &yaml, &choria_cfg, &helper);
    // The server starts once the provisioner is listening: it is found through
    // its startup event, not the start-up discovery.
    p.wait_for_metric("choria_provisioner_discover_cycles", 1.0, STARTUP_TIMEOUT)
        .await;
    let mut server = bench.server(id, Version::V1).await;

    bench
        .wait_provisioned_and_restarted(&mut p, &mut server)
        .await;
    assert_eq!(
        (
            p.metric("choria_provisioner_event_discovered"),
            p.metric("choria_provisioner_discovered")
        ),
        (1.0, 0.0),
        "found once, by its startup event"
    );

    // The configuration file: exactly the helper's settings.
    let (header, written) = read_written_config(&node_dir.join("server.conf"));
    assert!(
        header.starts_with("# configuration file written in request ")
            && header.contains(&format!(" from choria={PROVISIONER} ({PROVISIONER}) at ")),
        "written by our provisioner's configure request: {header}"
    );
    assert_eq!(written, bench.expected_config(id, &settings));
    assert_policy_written(&node_dir, &policy);

    // The certificate is the one fleet-helper signed for the node's own key.
    let cert = std::fs::read_to_string(ssl.join("certificate.pem")).unwrap();
    let ca_pem = bench.broker.ca.cert_pem();
    pki::verify_issued_by(&cert, &ca_pem)
        .unwrap_or_else(|e| panic!("the node's certificate is not from the test CA: {e}"));
    assert_eq!(pki::certificate_common_name(&cert).unwrap(), id);
    assert_eq!(std::fs::read_to_string(ssl.join("ca.pem")).unwrap(), ca_pem);
    let public_of = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let private = ssl.join("private.pem");
    assert_eq!(
        public_of(&[
            "x509",
            "-noout",
            "-pubkey",
            "-in",
            s(&ssl.join("certificate.pem"))
        ]),
        public_of(&["pkey", "-pubout", "-in", s(&private)]),
        "the certificate is for the key the node generated for its CSR"
    );
    assert_eq!(mode(&private), 0o600);

    // Back in the default collective, out of provisioning, over TLS that the
    // file provider verifies with the CA configure delivered.
    bench.assert_connected_in(id, "mcollective");
    let v1 = ChoriaClient::new(
        bench.watcher.clone(),
        Identity {
            identity: PROVISIONER.into(),
            caller: format!("choria={PROVISIONER}"),
            signer: RequestSigner::V1Insecure,
        },
    );
    assert!(
        discover_provisionable(&v1).await.is_empty(),
        "{id} no longer answers in the provisioning collective"
    );

    // A real x509 client whose certificate the same CA signed is served.
    let (admin_cert, admin_key) =
        bench
            .broker
            .ca
            .issue(bench.work.path(), "admin", "admin.mcollective", &[]);
    let client_cfg = bench.path("client-v1.conf");
    std::fs::write(
        &client_cfg,
        format!(
            "plugin.choria.middleware_hosts = {}\nplugin.choria.use_srv = false\nidentity = admin.mcollective\n\
             plugin.security.provider = file\nplugin.security.file.certificate = {}\n\
             plugin.security.file.key = {}\nplugin.security.file.ca = {}\n",
            bench.url(),
            s(&admin_cert),
            s(&admin_key),
            s(&bench.broker.ca.cert)
        ),
    )
    .unwrap();
    assert_serves_cli(&bench, &client_cfg, id, "mcollective").await;

    bench
        .secrets
        .push(("a line of the node's private key", pem_body_line(&private)));
    let logs = bench.stop_and_check_log(p);
    assert!(logs.contains(id), "the node is named in the log");
}

// ---------------------------------------------------------------------------
// 2. v2, ed25519 Organization Issuer.
// ---------------------------------------------------------------------------

/// A v2 organisation for real servers: the provisioner's client JWT (with
/// fleet management), the chain issuer it signs server JWTs as, and an admin
/// client, all issued by the organisation issuer with the real `choria jwt`
/// tooling (RECIPE.md §3.d).
struct V2Org {
    issuer_hex: String,
    ca: String,
    client_jwt: PathBuf,
    client_seed: PathBuf,
    signer_jwt: PathBuf,
    signer_seed: PathBuf,
    admin_jwt: PathBuf,
    admin_seed: PathBuf,
}

impl V2Org {
    fn issue(bench: &mut Bench) -> V2Org {
        let bin = bench.bin.clone();
        let work = bench.work.path().to_path_buf();
        let issuer_seed = s(&bench.signers.issuer_seed).to_string();
        let issue = |name: &str, caller: &str, flags: &[&str]| -> (PathBuf, PathBuf) {
            let (seed, public) = (format!("{name}.seed"), format!("{name}.public"));
            choria_tool(&bin, &work, &["jwt", "keys", &seed, &public]);
            let public_hex = std::fs::read_to_string(work.join(&public)).unwrap();
            let jwt = format!("{name}.jwt");
            let mut args = vec![
                "jwt",
                "client",
                &jwt,
                caller,
                &issuer_seed,
                "--validity",
                "1h",
            ];
            let pk = format!("--public-key={public_hex}");
            args.push(&pk);
            args.extend_from_slice(flags);
            choria_tool(&bin, &work, &args);
            (work.join(jwt), work.join(seed))
        };
        let (client_jwt, client_seed) =
            issue("provisioner", "provisioner", &["--server-provisioner"]);
        let (signer_jwt, signer_seed) = issue("signer", "provisioner-signer", &["--issuer"]);
        let (admin_jwt, admin_seed) = issue("admin", "admin", &[]);
        for (what, seed) in [
            ("the provisioner's seed", &client_seed),
            ("the chain signer's seed", &signer_seed),
        ] {
            bench
                .secrets
                .push((what, std::fs::read_to_string(seed).unwrap()));
        }
        V2Org {
            issuer_hex: bench.signers.issuer_public_hex.clone(),
            ca: s(&bench.broker.ca.cert).to_string(),
            client_jwt,
            client_seed,
            signer_jwt,
            signer_seed,
            admin_jwt,
            admin_seed,
        }
    }

    /// What a v2 server in `node_dir` runs with after provisioning.
    fn server_settings(&self, node_dir: &Path) -> [(&'static str, String); 7] {
        [
            ("plugin.choria.use_srv", "false".to_string()),
            ("plugin.security.provider", "choria".to_string()),
            (
                "plugin.security.choria.token_file",
                s(&node_dir.join("server.jwt")).to_string(),
            ),
            (
                "plugin.security.choria.seed_file",
                s(&node_dir.join("server.seed")).to_string(),
            ),
            ("plugin.security.issuer.names", "choria".to_string()),
            (
                "plugin.security.issuer.choria.public",
                self.issuer_hex.clone(),
            ),
            // Optional for the choria provider; with it TLS to the broker is verified.
            ("plugin.security.choria.ca", self.ca.clone()),
        ]
    }

    /// The provisioner's Choria client configuration (v2, its client JWT).
    fn choria_cfg(&self, bench: &Bench) -> String {
        format!(
            "identity = {PROVISIONER}\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = choria\n\
             plugin.security.choria.token_file = {}\nplugin.security.choria.seed_file = {}\n\
             plugin.security.choria.ca = {}\n",
            bench.url(),
            s(&self.client_jwt),
            s(&self.client_seed),
            self.ca
        )
    }

    /// The provisioner's settings for v2 servers: verify with the issuer,
    /// sign server JWTs as the chain issuer.
    fn yaml(&self) -> String {
        format!(
            "jwt_verify_cert: {}\njwt_signing_key: {}\njwt_signing_token: {}\nfeatures:\n  ed25519: true\n",
            self.issuer_hex,
            s(&self.signer_seed),
            s(&self.signer_jwt)
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_v2_server_is_provisioned_with_ed25519_org_issuer() {
    let Some(mut bench) =
        Bench::start("real_v2_server_is_provisioned_with_ed25519_org_issuer").await
    else {
        return;
    };
    let org = V2Org::issue(&mut bench);
    let (issuer_hex, ca) = (org.issuer_hex.clone(), org.ca.clone());
    let (client_jwt, client_seed, signer_jwt) = (
        org.client_jwt.clone(),
        org.client_seed.clone(),
        org.signer_jwt.clone(),
    );
    let (admin_jwt, admin_seed) = (org.admin_jwt.clone(), org.admin_seed.clone());

    // This server is up before the provisioner: found by its start-up discovery.
    let id = "real-v2.provision.example.net";
    let mut server = bench.server(id, Version::V2).await;
    let node_dir = bench.path(id);
    let settings = org.server_settings(&node_dir);
    let policy = rpcutil_policy("admin");
    let helper = bench.helper(&settings, &serde_json::json!({ "rpcutil.policy": policy }));
    let choria_cfg = org.choria_cfg(&bench);
    let yaml = org.yaml();
    let mut p = bench.provisioner("real-v2", &yaml, &choria_cfg, &helper);

    bench
        .wait_provisioned_and_restarted(&mut p, &mut server)
        .await;
    assert_eq!(
        (
            p.metric("choria_provisioner_event_discovered"),
            p.metric("choria_provisioner_discovered")
        ),
        (0.0, 1.0),
        "found once, by discovery"
    );

    // The configuration file: exactly the helper's settings.
    let (header, written) = read_written_config(&node_dir.join("server.conf"));
    assert!(
        header.contains(" from provisioner (provisioner.example.net) at "),
        "written by our provisioner's configure request, caller from its JWT: {header}"
    );
    assert_eq!(written, bench.expected_config(id, &settings));
    assert_policy_written(&node_dir, &policy);

    // server.jwt: chain-issued for the key gen25519 made, and the real Go
    // token code validates it with the issuer's public key.
    let jwt_path = node_dir.join("server.jwt");
    let jwt = std::fs::read_to_string(&jwt_path).unwrap();
    assert_eq!(mode(&jwt_path), 0o600);
    let issuer_key = ed25519::parse_public_key_hex(&issuer_hex).unwrap();
    let claims = tokens::verify_chain_issued_server_token(&jwt, &issuer_key)
        .unwrap_or_else(|e| panic!("server.jwt does not verify through the chain: {e}\n{jwt}"));
    assert_eq!(claims.identity, id);
    assert_eq!(
        claims.collectives,
        ["choria"],
        "the choria provider's collective"
    );
    let seed_text = std::fs::read_to_string(node_dir.join("server.seed")).unwrap();
    bench.secrets.push(("the node's seed", seed_text.clone()));
    let node_key = Ed25519KeyPair::from_seed_hex(seed_text.trim()).unwrap();
    assert_eq!(
        claims.standard.public_key,
        node_key.public_hex(),
        "the JWT is for the node's own server.seed"
    );
    // Signed by the chain issuer, whose expiry caps the year the provisioner
    // asks for, exactly as go-choria's tokens.SetChainIssuer does.
    let signer = tokens::parse_client_id_token_unverified(
        std::fs::read_to_string(&signer_jwt).unwrap().trim(),
    )
    .unwrap();
    assert_eq!(
        claims.standard.issuer,
        format!("C-{}.{}", signer.standard.id, signer.standard.public_key)
    );
    assert_eq!(
        claims.standard.issuer_expires_at,
        signer.standard.expires_at
    );
    assert_eq!(claims.standard.expires_at, signer.standard.expires_at);
    let view = choria_tool(
        &bench.bin,
        bench.work.path(),
        &["jwt", "view", s(&jwt_path), s(&bench.signers.issuer_public)],
    );
    assert!(
        view.contains(&format!("Validated Server Token {}", s(&jwt_path))) && view.contains(id),
        "choria jwt view:\n{view}"
    );

    // The restarted server runs on that JWT and seed, with the CA: it
    // re-enters provisioning mode instead when the JWT's key is not the
    // seed's (cmd/server_run.go shouldProvisionTokenAndSeed).
    let log = server.log();
    let restarted = &log[log.find("Initiating Choria Server restart").unwrap()..];
    for line in [
        format!(
            "mTLS=true security=choria seed={} token={}",
            s(&node_dir.join("server.seed")),
            s(&jwt_path)
        ),
        // logrus escapes the quotes in its msg="..." field.
        format!(r#"Setting JWT token and unique reply queues based on JWT for \"{id}\""#),
    ] {
        assert!(
            restarted.contains(&line),
            "{id} after its restart logs {line:?}:\n{restarted}"
        );
    }

    // Back in the choria collective (the choria provider's default), out of
    // provisioning, over TLS verified with plugin.security.choria.ca.
    bench.assert_connected_in(id, "choria");
    let v2 = ChoriaClient::new(
        bench.watcher.clone(),
        Identity {
            identity: PROVISIONER.into(),
            caller: "provisioner".into(),
            signer: RequestSigner::V2 {
                seed: Box::new(
                    Ed25519KeyPair::from_seed_hex(
                        std::fs::read_to_string(&client_seed).unwrap().trim(),
                    )
                    .unwrap()
                    .signing_key()
                    .clone(),
                ),
                jwt: std::fs::read_to_string(&client_jwt)
                    .unwrap()
                    .trim()
                    .to_string(),
            },
        },
    );
    assert!(
        discover_provisionable(&v2).await.is_empty(),
        "{id} no longer answers in the provisioning collective"
    );

    // A real v2 client holding an issuer-issued JWT is served: the server
    // runs with the issuer configuration.
    let client_cfg = bench.path("client-v2.conf");
    std::fs::write(
        &client_cfg,
        format!(
            "plugin.choria.middleware_hosts = {}\nplugin.choria.use_srv = false\nidentity = admin.example.net\n\
             plugin.security.provider = choria\nplugin.security.choria.token_file = {}\n\
             plugin.security.choria.seed_file = {}\nplugin.security.choria.ca = {ca}\n\
             plugin.security.issuer.names = choria\nplugin.security.issuer.choria.public = {issuer_hex}\n",
            bench.url(),
            s(&admin_jwt),
            s(&admin_seed)
        ),
    )
    .unwrap();
    assert_serves_cli(&bench, &client_cfg, id, "choria").await;

    let logs = bench.stop_and_check_log(p);
    assert!(logs.contains(id), "the node is named in the log");
}

// ---------------------------------------------------------------------------
// 3. v1, no helper: a configuration template and the real cert-manager.
// ---------------------------------------------------------------------------

/// The certificate's key usages and extended key usages, as openssl names them.
fn usages(cert: &Path) -> String {
    let out = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-ext", "keyUsage,extendedKeyUsage", "-in"])
        .arg(cert)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_v1_server_is_configured_by_a_template_and_signed_by_cert_manager() {
    const TEST: &str = "real_v1_server_is_configured_by_a_template_and_signed_by_cert_manager";
    let Some(kube) = support::kube::ControlPlane::available() else {
        return;
    };
    let Some(cm_bins) = support::certmanager::available() else {
        return;
    };
    let Some(mut bench) = Bench::start(TEST).await else {
        return;
    };
    let cp = support::kube::ControlPlane::start(&kube);
    cp.kubectl_ok(&["create", "namespace", "choria"]);
    // The Issuer signs with the CA that signed the broker's certificate, so
    // the provisioned server's TLS verifies.
    let _cm = support::certmanager::CertManager::start_with_ca(
        &cp,
        &cm_bins,
        "choria",
        "choria-ca",
        &bench.broker.ca.cert,
        &bench.broker.ca.key,
        bench.work.path(),
    );
    let id = "real-cm.provision.example.net";
    let node_dir = bench.path(id);
    let ssl = node_dir.join("ssl");
    let policy = rpcutil_policy("choria=admin.mcollective");
    let template = serde_json::json!({
        "configuration": {
            "identity": "{{ identity }}",
            "plugin.choria.server.provision": "false",
            "plugin.choria.middleware_hosts": bench.url(),
            "loglevel": "info",
            "plugin.choria.use_srv": "false",
            "plugin.security.provider": "file",
            "plugin.security.file.certificate": "{{ csr.ssldir }}/certificate.pem",
            "plugin.security.file.key": "{{ csr.ssldir }}/private.pem",
            "plugin.security.file.ca": "{{ csr.ssldir }}/ca.pem",
        },
        "action_policies": {"rpcutil.policy": policy},
    });
    let yaml = format!(
        "workers: 2\ninterval: 1m\ntoken: {TOKEN}\nsite: real-cm\ndiscovery_timeout: 2s\nchoria_insecure: true\n\
         jwt_verify_cert: {}\nfeatures:\n  jwt: true\n  pki: true\nconfiguration_template: {template}\n\
         cert_manager:\n  issuer: choria-ca\n  namespace: choria\n",
        s(&bench.signers.rsa_public)
    );
    let choria_cfg = format!(
        "identity = {PROVISIONER}\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
        bench.url()
    );
    let dir = bench.path("provisioner");
    std::fs::create_dir_all(&dir).unwrap();
    let admin = cp.kubeconfig(cp.admin_token());
    let mut p = ProvisionerProcess::start_with_env(
        &dir,
        "provisioner",
        &yaml,
        &choria_cfg,
        &["--debug"],
        &[("KUBECONFIG", s(&admin))],
    );
    p.wait_for_metric("choria_provisioner_discover_cycles", 1.0, STARTUP_TIMEOUT)
        .await;
    let mut server = bench.server(id, Version::V1).await;
    bench
        .wait_provisioned_and_restarted(&mut p, &mut server)
        .await;
    // One request, issued.
    assert_eq!(p.metric("choria_provisioner_cert_manager_requests"), 1.0);
    let (_, metrics) = p.get("/metrics");
    assert!(
        metrics.lines().any(
            |l| l.starts_with("choria_provisioner_cert_manager_requests{")
                && l.contains("outcome=\"issued\"")
                && l.ends_with(" 1")
        ),
        "{metrics}"
    );
    assert_eq!(
        p.metric("choria_provisioner_helper_time_count"),
        0.0,
        "no helper ran"
    );

    // Exactly the template's settings, rendered for this node.
    let (_, written) = read_written_config(&node_dir.join("server.conf"));
    let settings = file_provider_settings(&ssl);
    assert_eq!(written, bench.expected_config(id, &settings));
    assert_policy_written(&node_dir, &policy);

    // cert-manager's certificate, from the Issuer's CA, for the node's name
    // and key, for TLS server and client use.
    let cert_path = ssl.join("certificate.pem");
    let cert = std::fs::read_to_string(&cert_path).unwrap();
    let ca_pem = bench.broker.ca.cert_pem();
    pki::verify_issued_by(&cert, &ca_pem)
        .unwrap_or_else(|e| panic!("the node's certificate is not from the Issuer's CA: {e}"));
    assert_eq!(pki::certificate_common_name(&cert).unwrap(), id);
    assert_eq!(
        std::fs::read_to_string(ssl.join("ca.pem")).unwrap().trim(),
        ca_pem.trim(),
        "status.ca is the CA"
    );
    let u = usages(&cert_path);
    for usage in [
        "Digital Signature",
        "Key Encipherment",
        "TLS Web Server Authentication",
        "TLS Web Client Authentication",
    ] {
        assert!(u.contains(usage), "{usage} missing: {u}");
    }
    bench.assert_connected_in(id, "mcollective");
    bench.secrets.push((
        "a line of the node's private key",
        pem_body_line(&ssl.join("private.pem")),
    ));
    bench.stop_and_check_log(p);
}

// ---------------------------------------------------------------------------
// 4. Day two: a real server's credentials renewed before they expire.
// ---------------------------------------------------------------------------

/// A real go-choria 0.30.2 server (v2, org issuer) provisioned with a server
/// JWT valid one hour and `renewal.before: 99%`: due 36 s after issue. The
/// provisioner sends `reprovision` to it in its collective (`choria`), as the
/// caller the policy it shipped allows; the server re-enters provisioning,
/// is provisioned again and is back in its collective with a new `jti` and a
/// later expiry — twice, with no manual step. Records in a JetStream of
/// their own hold each provisioning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_v2_server_is_renewed_twice_before_its_credentials_expire() {
    let Some(mut bench) =
        Bench::start("a_real_v2_server_is_renewed_twice_before_its_credentials_expire").await
    else {
        return;
    };
    let org = V2Org::issue(&mut bench);
    let store = tempfile::tempdir().unwrap();
    let records = NatsServer::start_with(&format!(
        "jetstream {{ store_dir: \"{}\" }}\n",
        store.path().display()
    ));
    let id = "renewed-v2.provision.example.net";
    let server = bench.server(id, Version::V2).await;
    let node_dir = bench.path(id);
    let settings = org.server_settings(&node_dir);
    // The provisioner ships the policy that lets its own caller (the
    // callerid of its client JWT) ask for `reprovision`.
    let policies = serde_json::json!({
        "rpcutil.policy": rpcutil_policy("admin"),
        "choria_provision.policy": "policy default deny\nallow\tprovisioner\treprovision\t*\t*\n",
    });
    let helper = bench.helper(&settings, &policies);
    let choria_cfg = org.choria_cfg(&bench);
    // Renewal reaches the node through the same broker as the same client.
    let renewal_cfg = bench.path("renewal.cfg");
    std::fs::write(&renewal_cfg, &choria_cfg).unwrap();
    let yaml = format!(
        "{}records:\n  url: {}\n  bucket: RENEWED\n  history: 10\n\
         renewal:\n  before: 99%\n  retry: 2m\n  choria_config: {}\n",
        org.yaml(),
        records.url(),
        s(&renewal_cfg)
    );
    let mut p = bench.provisioner("renewed", &yaml, &choria_cfg, &helper);
    let started = std::time::Instant::now();
    let mut jtis = Vec::new();
    let mut expiries = Vec::new();
    for round in 1..=3 {
        bench
            .events
            .wait_count(
                id,
                (EventType::Startup, "server"),
                round,
                Duration::from_secs(120),
                &server,
            )
            .await;
        let jwt = std::fs::read_to_string(node_dir.join("server.jwt")).unwrap();
        let issuer_key = ed25519::parse_public_key_hex(&org.issuer_hex).unwrap();
        let claims = tokens::verify_chain_issued_server_token(&jwt, &issuer_key)
            .unwrap_or_else(|e| panic!("round {round}: server.jwt does not verify: {e}"));
        println!(
            "round {round}: back as a server {:.1?} after the provisioner started, jti {}",
            started.elapsed(),
            claims.standard.id
        );
        jtis.push(claims.standard.id.clone());
        expiries.push(claims.standard.expires_at);
        // Back in its collective each time.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while bench.broker.connections(id).len() != 1 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bench.assert_connected_in(id, "choria");
    }
    let history = bench.events.history(id);
    let reprovisioned = history
        .windows(2)
        .filter(|w| w[0] == "shutdown.server" && w[1] == "startup.provision_mode_server")
        .count();
    assert_eq!(
        reprovisioned, 2,
        "twice from its collective back into provisioning: {history:?}"
    );
    assert_eq!(
        jtis.iter().collect::<std::collections::BTreeSet<_>>().len(),
        3,
        "a new server JWT each time: {jtis:?}"
    );
    assert!(
        expiries.windows(2).all(|w| w[0] <= w[1]),
        "expiry never moves earlier: {expiries:?}"
    );
    let sent = p.get("/metrics").1;
    assert!(
        sent.lines()
            .any(|l| l.starts_with("choria_provisioner_renewals{")
                && l.contains("outcome=\"sent\"")
                && l.ends_with(" 2")),
        "two renewals sent:\n{}",
        sent.lines()
            .filter(|l| l.contains("renewals"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    p.wait_for_metric(
        "choria_provisioner_provisioned",
        3.0,
        Duration::from_secs(10),
    )
    .await;
    let logs = bench.stop_and_check_log(p);
    assert!(
        logs.contains("asked the node to renew its credentials"),
        "{}",
        logs.len()
    );
    drop(server);
}

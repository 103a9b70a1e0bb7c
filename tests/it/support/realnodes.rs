//! Real go-choria servers provisioned by `choria-provisioner run`, as
//! tests/provision_go.rs (on a nats-server) and tests/broker.rs (on the real
//! Choria broker) run them: the broker, the provisioning-JWT signers, a
//! watcher of every lifecycle event, the helper, and the checks on what a
//! provisioned server wrote, how it came back and whom it serves.

use super::broker::{ChoriaBroker, Network, PROVISIONER_PASSWORD};
use super::gopeers::{choria_bin, choria_tool, make_signers, s, CaNats, GoServer, Signers, TestCa};
use super::provisioner::{binary, ProvisionerProcess};
use super::NatsServer;
use choria_wire::lifecycle::{self, Event, EventType};
use choria_wire::protocol::Version;
use choria_wire::security::{ed25519, tokens};
use futures::StreamExt;
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// The broker a [`Bench`] runs on.
pub enum BenchBroker {
    /// A nats-server offering TLS (tests/support/gopeers.rs).
    Nats(CaNats),
    /// The real Choria broker (tests/support/broker.rs).
    Choria(ChoriaBroker),
}

impl BenchBroker {
    pub fn url(&self) -> String {
        match self {
            BenchBroker::Nats(b) => b.nats.url(),
            BenchBroker::Choria(b) => b.url(),
        }
    }

    /// The CA that signed the broker's certificate.
    pub fn ca(&self) -> &TestCa {
        match self {
            BenchBroker::Nats(b) => &b.ca,
            BenchBroker::Choria(b) => &b.ca,
        }
    }

    pub fn connections(&self, name: &str) -> Vec<Value> {
        match self {
            BenchBroker::Nats(b) => b.connections(name),
            BenchBroker::Choria(b) => b.connections(name),
        }
    }

    /// The real Choria broker; panics on a nats-server.
    pub fn choria(&self) -> &ChoriaBroker {
        match self {
            BenchBroker::Choria(b) => b,
            BenchBroker::Nats(_) => panic!("this bench runs on a nats-server"),
        }
    }
}

pub const TOKEN: &str = "r3al-g0-pr0visioning-t0ken";
pub const PROVISIONER: &str = "provisioner.example.net";
pub const VERSION: &str = "0.30.2";
/// Real servers start in about a second; generous for a loaded machine.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);
/// From the provisioner's start to `provisioned`: discovery or the startup
/// event, five RPCs and the helper.
pub const PROVISION_TIMEOUT: Duration = Duration::from_secs(30);
/// From `provisioned` to the re-exec'd server's startup: 2 s splay plus boot.
pub const RESTART_TIMEOUT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// What both tests share.
// ---------------------------------------------------------------------------

/// One lifecycle event as it came off the wire.
#[derive(Clone, Debug)]
pub struct Seen {
    pub subject: String,
    pub kind: EventType,
    pub event: Event,
}

/// Every lifecycle event on the broker, in arrival order.
pub struct EventLog {
    pub sub: async_nats::Subscriber,
    pub seen: Vec<Seen>,
}

impl EventLog {
    /// Waits for `identity`'s `kind` event from `component`; fails with what
    /// did arrive and `server`'s log.
    pub async fn wait_for(
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
    pub async fn wait_count(
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
    pub fn history(&self, identity: &str) -> Vec<String> {
        self.seen
            .iter()
            .filter(|e| e.event.identity == identity && e.kind != EventType::Alive)
            .map(|e| format!("{}.{}", e.kind.name(), e.event.component))
            .collect()
    }
}

/// A broker whose TLS certificate the test CA signed, the provisioning-JWT
/// signers, and a watcher subscribed to every lifecycle event.
pub struct Bench {
    pub bin: PathBuf,
    pub work: tempfile::TempDir,
    pub broker: BenchBroker,
    pub signers: Signers,
    pub watcher: async_nats::Client,
    pub events: EventLog,
    /// Strings that must never appear in the provisioner's log.
    pub secrets: Vec<(&'static str, String)>,
}

impl Bench {
    /// `None` (having said why, loudly) when the real binary is not available.
    /// The broker is a nats-server whose certificate the test CA signed.
    pub async fn start(test: &str) -> Option<Bench> {
        let bin = choria_bin(test)?;
        let work = tempfile::tempdir().unwrap();
        let broker = CaNats::start(work.path());
        let signers = make_signers(&bin, work.path());
        let watcher = broker.nats.connect("watcher").await;
        Some(Bench::with(bin, work, BenchBroker::Nats(broker), signers, watcher).await)
    }

    /// [`Bench::start`] on the real Choria broker of `network` (election
    /// TTL `ttl`), watching its `choria` account.
    pub async fn start_on_choria(test: &str, network: Network, ttl: Duration) -> Option<Bench> {
        let bin = choria_bin(test)?;
        let work = tempfile::tempdir().unwrap();
        let signers = make_signers(&bin, work.path());
        let broker = ChoriaBroker::start(&bin, &work.path().join("broker"), network, &signers, ttl);
        let watcher = broker.watcher().await;
        let mut bench = Bench::with(bin, work, BenchBroker::Choria(broker), signers, watcher).await;
        bench.secrets.push((
            "the broker's provisioner password",
            PROVISIONER_PASSWORD.into(),
        ));
        Some(bench)
    }

    async fn with(
        bin: PathBuf,
        work: tempfile::TempDir,
        broker: BenchBroker,
        signers: Signers,
        watcher: async_nats::Client,
    ) -> Bench {
        let sub = watcher.subscribe("choria.lifecycle.event.>").await.unwrap();
        watcher.flush().await.unwrap();
        let secrets = vec![
            ("the provisioning token", TOKEN.to_string()),
            (
                "the issuer seed",
                std::fs::read_to_string(&signers.issuer_seed).unwrap(),
            ),
            ("a line of the CA key", pem_body_line(&broker.ca().key)),
        ];
        Bench {
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
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.work.path().join(name)
    }

    pub fn url(&self) -> String {
        self.broker.url()
    }

    /// A v1 client as the provisioner, unsigned: what asks who is still in
    /// provisioning mode.
    pub fn insecure_v1_client(&self) -> choria_wire::client::ChoriaClient {
        choria_wire::client::ChoriaClient::new(
            self.watcher.clone(),
            choria_wire::client::Identity {
                identity: PROVISIONER.into(),
                caller: format!("choria={PROVISIONER}"),
                signer: choria_wire::protocol::RequestSigner::V1Insecure,
            },
        )
    }

    /// A real server of `version` in provisioning mode, in `<work>/<identity>`,
    /// once it announced itself.
    pub async fn server(&mut self, identity: &str, version: Version) -> GoServer {
        let server = GoServer::start(
            &self.bin,
            &self.signers,
            &self.path(identity),
            identity,
            &self.url(),
            version,
            TOKEN,
        );
        self.announced(server).await
    }

    /// A real server started with `jwt` as its `provisioning.jwt`, once it
    /// announced itself.
    pub async fn server_with_jwt(&mut self, identity: &str, jwt: &str) -> GoServer {
        let dir = self.path(identity);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("provisioning.jwt"), jwt).unwrap();
        let server = GoServer::start_in(&self.bin, &dir, identity);
        self.announced(server).await
    }

    async fn announced(&mut self, server: GoServer) -> GoServer {
        let identity = server.identity.clone();
        let identity = identity.as_str();
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
    pub fn helper(&self, settings: &[(&str, String)], policies: &Value) -> PathBuf {
        let mut args = vec![
            binary().to_string(),
            "fleet-helper".into(),
            "--broker".into(),
            self.url(),
            "--ca-cert".into(),
            s(&self.broker.ca().cert).into(),
            "--ca-key".into(),
            s(&self.broker.ca().key).into(),
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
    pub fn expected_config(
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
    pub fn provisioner(
        &self,
        site: &str,
        yaml: &str,
        choria_cfg: &str,
        helper: &Path,
    ) -> ProvisionerProcess {
        self.provisioner_with_env(site, yaml, choria_cfg, helper, &[])
    }

    /// [`Bench::provisioner`] with extra environment variables.
    pub fn provisioner_with_env(
        &self,
        site: &str,
        yaml: &str,
        choria_cfg: &str,
        helper: &Path,
        env: &[(&str, &str)],
    ) -> ProvisionerProcess {
        // discovery_timeout: Go's fixed 2 s. With our 10 s default a discovery
        // that finds nobody (here: every one after the node left provisioning)
        // holds up SIGTERM for its whole length, as `run` waits for it.
        let mut yaml = format!(
            "workers: 2\ninterval: 1m\ntoken: {TOKEN}\nsite: {site}\nhelper: {}\ndiscovery_timeout: 2s\n{yaml}",
            serde_json::to_string(s(helper)).unwrap()
        );
        // The real broker admits `provisioner` only with its password.
        if let BenchBroker::Choria(_) = self.broker {
            yaml.push_str(&format!(
                "\nbroker_provisioning_password: {PROVISIONER_PASSWORD}\n"
            ));
        }
        let dir = self.path("provisioner");
        std::fs::create_dir_all(&dir).unwrap();
        ProvisionerProcess::start_with_env(
            &dir,
            "provisioner",
            &yaml,
            choria_cfg,
            &["--debug"],
            env,
        )
    }

    /// A configuration for a real x509 client `admin.mcollective`, its
    /// certificate signed by the broker's CA: `<work>/client-v1.conf`.
    pub fn x509_admin_config(&self) -> PathBuf {
        let ca = self.broker.ca();
        let cert = ca.issue(self.work.path(), "admin", "admin.mcollective", &[]);
        let path = self.path("client-v1.conf");
        let text = x509_client_config(&self.url(), "admin.mcollective", &cert, &ca.cert);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A real v1 server provisioned with `pki` by our provisioner (started
    /// first with `yaml` and `choria_cfg`, so the server is found through
    /// its startup event), its helper giving `settings` and an `rpcutil`
    /// policy for `admin`; returns once the server came back restarted.
    pub async fn provision_v1(
        &mut self,
        id: &str,
        (yaml, choria_cfg): (&str, &str),
        settings: &[(&str, String)],
        admin: &str,
    ) -> (ProvisionerProcess, GoServer, String) {
        let policy = rpcutil_policy(admin);
        let helper = self.helper(settings, &serde_json::json!({ "rpcutil.policy": policy }));
        let yaml = format!(
            "jwt_verify_cert: {}\nfeatures:\n  jwt: true\n  pki: true\n{yaml}",
            s(&self.signers.rsa_public)
        );
        let mut p = self.provisioner(id.split('.').next().unwrap(), &yaml, choria_cfg, &helper);
        // The server starts once the provisioner is listening: it is found
        // through its startup event, not the start-up discovery.
        p.wait_for_metric("choria_provisioner_discover_cycles", 1.0, STARTUP_TIMEOUT)
            .await;
        let mut server = self.server(id, Version::V1).await;
        self.wait_provisioned_and_restarted(&mut p, &mut server)
            .await;
        (p, server, policy)
    }

    /// Waits until `server` announced itself as a normal server (back from
    /// its restart); its startup event.
    pub async fn wait_back_as_server(&mut self, server: &mut GoServer) -> Seen {
        let id = server.identity.clone();
        self.events
            .wait_for(
                &id,
                EventType::Startup,
                "server",
                RESTART_TIMEOUT,
                Some(server),
            )
            .await
    }

    /// Waits until `server` was provisioned by `p`, restarted (re-exec, same
    /// PID) and announced itself as a normal server; checks the events on the
    /// way and the provisioner's counters.
    pub async fn wait_provisioned_and_restarted(
        &mut self,
        p: &mut ProvisionerProcess,
        server: &mut GoServer,
    ) {
        let id = server.identity.clone();
        let pid = server.pid();
        p.wait_for_metric("choria_provisioner_provisioned", 1.0, PROVISION_TIMEOUT)
            .await;
        let startup = self.wait_back_as_server(server).await;
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
    pub fn assert_connected_in(&self, identity: &str, collective: &str) {
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
    pub fn stop_and_check_log(&self, mut p: ProvisionerProcess) -> String {
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
pub fn rpcutil_policy(caller: &str) -> String {
    format!("policy default deny\nallow\t{caller}\tinventory\t*\t*\n")
}

/// A template's `configuration` for a real v1 server on `url` signed by
/// our CA: the file security provider pointed at what `configure` writes
/// into the ssldir of the node's CSR, out of provisioning mode.
pub fn file_provider_template(url: &str) -> Value {
    serde_json::json!({
        "identity": "{{ identity }}",
        "plugin.choria.server.provision": "false",
        "plugin.choria.middleware_hosts": url,
        "loglevel": "info",
        "plugin.choria.use_srv": "false",
        "plugin.security.provider": "file",
        "plugin.security.file.certificate": "{{ csr.ssldir }}/certificate.pem",
        "plugin.security.file.key": "{{ csr.ssldir }}/private.pem",
        "plugin.security.file.ca": "{{ csr.ssldir }}/ca.pem",
    })
}

/// The settings that point go-choria's file security provider at what
/// `configure` writes into the node's ssldir (the certificate, the key the
/// node made for its CSR, the CA), without SRV lookups.
pub fn file_provider_settings(ssl: &Path) -> [(&'static str, String); 5] {
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
pub fn assert_policy_written(node_dir: &Path, policy: &str) {
    let file = node_dir.join("policies").join("rpcutil.policy");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), policy);
    assert_eq!(mode(&file), 0o400);
}

/// A line from the middle of a PEM file's body: if it is in a log, the key is.
pub fn pem_body_line(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .nth(5)
        .unwrap_or_else(|| panic!("{} is too short for a PEM key", path.display()))
        .to_string()
}

/// The `key=value` lines of a configuration file go-choria wrote (each key
/// once), after its `# configuration file written in request ...` comment.
pub fn read_written_config(path: &Path) -> (String, BTreeMap<String, String>) {
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

pub fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Runs the real `choria` CLI with `--config config` and returns stdout; fails
/// with stderr on a non-zero exit.
pub async fn choria_cli(bin: &Path, dir: &Path, config: &Path, args: &[&str]) -> String {
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
pub async fn cli_rpcutil(bin: &Path, dir: &Path, config: &Path, action: &str, node: &str) -> Value {
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
pub async fn assert_serves_cli(bench: &Bench, config: &Path, node: &str, collective: &str) {
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

/// A v2 organisation for real servers: the provisioner's client JWT (with
/// fleet management), the chain issuer it signs server JWTs as, and an admin
/// client, all issued by the organisation issuer with the real `choria jwt`
/// tooling (RECIPE.md §3.d).
pub struct V2Org {
    pub issuer_hex: String,
    pub ca: String,
    pub client_jwt: PathBuf,
    pub client_seed: PathBuf,
    pub signer_jwt: PathBuf,
    pub signer_seed: PathBuf,
    pub admin_jwt: PathBuf,
    pub admin_seed: PathBuf,
}

impl V2Org {
    pub fn issue(bench: &mut Bench) -> V2Org {
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
                // Server JWTs the chain signer issues expire with it: with
                // `before: 99%` a renewed node is due 12 s after its issue.
                "--validity",
                "20m",
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
            ca: s(&bench.broker.ca().cert).to_string(),
            client_jwt,
            client_seed,
            signer_jwt,
            signer_seed,
            admin_jwt,
            admin_seed,
        }
    }

    /// What a v2 server in `node_dir` runs with after provisioning.
    pub fn server_settings(&self, node_dir: &Path) -> [(&'static str, String); 7] {
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
    pub fn choria_cfg(&self, bench: &Bench) -> String {
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

    /// A real v2 client configuration for the admin, its JWT issued by the
    /// issuer, for a provisioned server: `<work>/client-v2.conf`.
    pub fn admin_client_config(&self, bench: &Bench) -> PathBuf {
        let client_cfg = bench.path("client-v2.conf");
        std::fs::write(
            &client_cfg,
            format!(
                "plugin.choria.middleware_hosts = {}\nplugin.choria.use_srv = false\nidentity = admin.example.net\n\
                 plugin.security.provider = choria\nplugin.security.choria.token_file = {}\n\
                 plugin.security.choria.seed_file = {}\nplugin.security.choria.ca = {}\n\
                 plugin.security.issuer.names = choria\nplugin.security.issuer.choria.public = {}\n",
                bench.url(),
                s(&self.admin_jwt),
                s(&self.admin_seed),
                self.ca,
                self.issuer_hex,
            ),
        )
        .unwrap();
        client_cfg
    }

    /// The provisioner's settings for v2 servers: verify with the issuer,
    /// sign server JWTs as the chain issuer.
    pub fn yaml(&self) -> String {
        format!(
            "jwt_verify_cert: {}\njwt_signing_key: {}\njwt_signing_token: {}\nfeatures:\n  ed25519: true\n",
            self.issuer_hex,
            s(&self.signer_seed),
            s(&self.signer_jwt)
        )
    }
}

/// Day two on `bench`: a real v2 server provisioned with a server JWT that is
/// due for renewal at once (`before: 99%`), asked by the provisioner to
/// `reprovision` through the broker, back in its collective with a new JWT,
/// twice; every provisioning on record in a KV bucket: reached with
/// `records` (the `url` and credential keys of `records:`), or by default
/// on a nats-server of its own.
pub async fn renew_a_v2_server_twice(
    bench: &mut Bench,
    id: &str,
    records: Option<String>,
    join_token: Option<String>,
) {
    let org = V2Org::issue(bench);
    let store = tempfile::tempdir().unwrap();
    let own = records.is_none().then(|| {
        NatsServer::start_with(&format!(
            "jetstream {{ store_dir: \"{}\" }}\n",
            store.path().display()
        ))
    });
    let records = records.unwrap_or_else(|| format!("  url: {}\n", own.as_ref().unwrap().url()));
    // The node comes back each time with the provisioning JWT it started
    // with: one `choria jwt prov` made, or a join token `token issue` made.
    let server = match &join_token {
        Some(jwt) => bench.server_with_jwt(id, jwt).await,
        None => bench.server(id, Version::V2).await,
    };
    let node_dir = bench.path(id);
    let settings = org.server_settings(&node_dir);
    // The provisioner ships the policy that lets its own caller (the
    // callerid of its client JWT) ask for `reprovision`.
    let policies = serde_json::json!({
        "rpcutil.policy": rpcutil_policy("admin"),
        "choria_provision.policy": "policy default deny\nallow\tprovisioner\treprovision\t*\t*\n",
    });
    let helper = bench.helper(&settings, &policies);
    let choria_cfg = org.choria_cfg(bench);
    // Renewal reaches the node through the same broker as the same client.
    let renewal_cfg = bench.path("renewal.cfg");
    std::fs::write(&renewal_cfg, &choria_cfg).unwrap();
    let yaml = format!(
        "{}records:\n{records}  bucket: RENEWED\n  history: 10\n  signing_key: {}\n\
         renewal:\n  before: 99%\n  retry: 2m\n  choria_config: {}\n",
        org.yaml(),
        s(&super::signing_key(&bench.path(""))),
        s(&renewal_cfg)
    );
    let mut p = bench.provisioner("renewed", &yaml, &choria_cfg, &helper);
    let started = std::time::Instant::now();
    // Renewal works from the records: the first must be written.
    p.wait_for_metric(
        "choria_provisioner_records_written",
        1.0,
        Duration::from_secs(30),
    )
    .await;
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

/// A Choria client configuration with the file security provider: the
/// broker at `url`, `identity`, its certificate and key, the CA.
pub fn x509_client_config(
    url: &str,
    identity: &str,
    (cert, key): &(PathBuf, PathBuf),
    ca: &Path,
) -> String {
    format!(
        "identity = {identity}\nplugin.choria.middleware_hosts = {url}\nplugin.choria.use_srv = false\n\
         plugin.security.provider = file\nplugin.security.file.certificate = {}\n\
         plugin.security.file.key = {}\nplugin.security.file.ca = {}\n",
        s(cert),
        s(key),
        s(ca)
    )
}

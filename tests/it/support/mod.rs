//! Shared test support: a real nats-server on a free loopback port, the
//! simulated fleet in-process, and RPC helpers that say what failed.

use choria_fleet::{self as fleet, FleetOptions, FleetSummary};
use choria_wire::client::{self, ChoriaClient, ConnectOptions, DiscoveryOptions, RpcResult};
use choria_wire::filter::Filter;
use choria_wire::mcorpc::StatusCode;
use choria_wire::security::csr::{self, CsrInfo};
use serde_json::Value;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod broker;
pub mod certmanager;
pub mod cluster;
pub mod election;
pub mod evidence;
pub mod faults;
pub mod gopeers;
pub mod hostile;
pub mod jaeger;
pub mod kube;
pub mod operator;
pub mod page;
pub mod peers;
pub mod promql;
pub mod provisioner;
pub mod realnodes;

/// Finds the nats-server binary: `$NATS_SERVER_BIN`, the project cache, or `$PATH`.
pub fn nats_server_bin() -> PathBuf {
    if let Ok(p) = std::env::var("NATS_SERVER_BIN") {
        return PathBuf::from(p);
    }
    if let Ok(home) = std::env::var("HOME") {
        let cached = Path::new(&home).join(".cache/choria-provisioner-rs/bin/nats-server");
        if cached.exists() {
            return cached;
        }
    }
    PathBuf::from("nats-server")
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running nats-server, killed on drop.
pub struct NatsServer {
    child: Child,
    pub port: u16,
    /// Its configuration and store, removed once it is killed.
    _dir: tempfile::TempDir,
    conf: PathBuf,
}

impl NatsServer {
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Plain server, no TLS.
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// Plain server with JetStream, its store in the server's own
    /// directory.
    pub fn start_jetstream() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let extra = format!(
            "jetstream {{ store_dir: \"{}\" }}\n",
            dir.path().join("jetstream").display()
        );
        Self::start_in(dir, &extra)
    }

    /// Server offering TLS (optional for clients, as in the Choria test recipe),
    /// with a self-signed certificate made by openssl.
    pub fn start_tls_available() -> Self {
        let dir = tempfile::tempdir().unwrap();
        make_self_signed(dir.path());
        let extra = format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\nallow_non_tls: true\n",
            dir.path().join("cert.pem").display(),
            dir.path().join("key.pem").display()
        );
        Self::start_in(dir, &extra)
    }

    pub fn start_with(extra: &str) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), extra)
    }

    fn start_in(dir: tempfile::TempDir, extra: &str) -> Self {
        let port = free_port();
        let conf = dir.path().join("nats.conf");
        let mut f = std::fs::File::create(&conf).unwrap();
        writeln!(f, "listen: 127.0.0.1:{port}\nmax_payload: 1048576\n{extra}").unwrap();
        let child = Self::spawn(&conf, port);
        NatsServer {
            child,
            port,
            _dir: dir,
            conf,
        }
    }

    /// Kills the server, as a crash or a lost network would, and leaves it down.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kills the server (as a crash would) and starts it again on the same
    /// port with the same configuration after `down` has passed.
    pub fn restart(&mut self, down: Duration) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(down);
        self.child = Self::spawn(&self.conf, self.port);
    }

    fn spawn(conf: &Path, port: u16) -> Child {
        // setpriv --pdeathsig: the server dies with the test process even when
        // that is killed outright and Drop never runs.
        let mut cmd = if Path::new("/usr/bin/setpriv").exists() {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args(["--pdeathsig", "KILL"]).arg(nats_server_bin());
            c
        } else {
            Command::new(nats_server_bin())
        };
        let child = cmd
            .arg("-c")
            .arg(conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "could not start nats-server ({}): {e}; run scripts/test.sh, which installs it",
                    nats_server_bin().display()
                )
            });
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not start on port {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A self-signed certificate for 127.0.0.1/localhost in `dir` (cert.pem, key.pem).
pub fn make_self_signed(dir: &Path) {
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
        ])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl is needed to make test certificates");
    assert!(status.success(), "openssl could not make a certificate");
}

impl NatsServer {
    /// A NATS connection to this server, made the way the provisioner makes one.
    pub async fn connect(&self, name: &str) -> async_nats::Client {
        client::connect(&ConnectOptions {
            servers: vec![self.url()],
            name: name.into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("could not connect to {}: {e}", self.url()))
    }
}

/// A fresh signing key for `records.signing_key` (and shard heartbeats),
/// written into `dir`; its path.
pub fn signing_key(dir: &Path) -> PathBuf {
    let path = dir.join("signing.seed");
    let key = choria_wire::security::seal::SealKey::generate();
    std::fs::write(&path, key.seed_hex()).unwrap();
    path
}

/// Reads a finished fleet's journal into JSON values: every line must be complete.
pub fn read_journal(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("could not read the journal {}: {e}", path.display()));
    parse_journal(&text)
}

/// The complete lines of a journal the fleet may still be writing: none while
/// the file does not exist yet, and not a last line still being written.
/// How many nodes in `journal` came back as servers (their `startup`
/// event in normal mode, after a provisioning restart).
pub fn server_startups(journal: &[Value]) -> usize {
    journal
        .iter()
        .filter(|e| e["kind"] == "event" && e["component"] == "server" && e["event"] == "startup")
        .count()
}

pub fn read_journal_so_far(path: &Path) -> Vec<Value> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => panic!("could not read the journal {}: {e}", path.display()),
    };
    let complete = text.rfind('\n').map_or("", |end| &text[..=end]);
    parse_journal(complete)
}

fn parse_journal(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad journal line {l:?}: {e}")))
        .collect()
}

/// The simulated fleet (`fleet::run`) running on a tokio task of the test.
/// Dropping it without `finish` stops the fleet too.
/// A small fleet's options: `nodes` nodes on `nats`, journal in `dir`,
/// two pooled keys, four connections.
pub fn small_fleet(nats: &NatsServer, dir: &Path, nodes: usize) -> choria_fleet::FleetOptions {
    choria_fleet::FleetOptions {
        broker: choria_wire::client::BrokerOptions::at([nats.url()]),
        nodes,
        journal: Some(dir.join("journal.jsonl")),
        key_pool_size: 2,
        connections: 4,
        ..Default::default()
    }
}

pub struct RunningFleet {
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<FleetSummary>,
    journal: PathBuf,
    /// Every node's identity, in node order.
    pub identities: Vec<String>,
}

impl RunningFleet {
    /// How long the fleet may take until every node has announced itself.
    pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

    /// Starts the fleet and returns once every node has journaled its startup
    /// event. `opts.journal` must be set: that is how readiness is seen.
    pub async fn start(opts: FleetOptions) -> Self {
        let journal = opts
            .journal
            .clone()
            .expect("RunningFleet::start needs FleetOptions::journal to see the fleet start");
        let identities: Vec<String> = (0..opts.nodes)
            .map(|i| fleet::identity_for(&opts, i))
            .collect();
        let expected = opts.nodes;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut handle = tokio::spawn(async move {
            fleet::run(opts, async {
                let _ = stopped.await;
            })
            .await
            .unwrap_or_else(|e| panic!("the fleet failed: {e}"))
        });
        let deadline = Instant::now() + Self::STARTUP_TIMEOUT;
        loop {
            let started = read_journal_so_far(&journal)
                .iter()
                .filter(|e| e["kind"] == "event" && e["event"] == "startup")
                .count();
            if started >= expected {
                break;
            }
            if handle.is_finished() {
                let end = (&mut handle).await;
                panic!("the fleet stopped during startup ({started}/{expected} startup events): {end:?}");
            }
            assert!(
                Instant::now() < deadline,
                "the fleet did not start within {:?} ({started}/{expected} startup events in {})",
                Self::STARTUP_TIMEOUT,
                journal.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        RunningFleet {
            stop,
            handle,
            journal,
            identities,
        }
    }

    /// Stops the fleet and returns its summary and its whole journal.
    pub async fn finish(self) -> (FleetSummary, Vec<Value>) {
        let _ = self.stop.send(());
        let summary = self
            .handle
            .await
            .unwrap_or_else(|e| panic!("the fleet task failed: {e}"));
        (summary, read_journal(&self.journal))
    }
}

/// Broadcast discovery of the nodes that have the `choria_provision` agent.
pub async fn discover_provisionable(c: &ChoriaClient) -> Vec<String> {
    c.discover(
        &Filter::with_agent("choria_provision"),
        DiscoveryOptions::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("discovery of provisionable nodes failed: {e}"))
}

/// `agent#action` on `node`; panics, naming the call, when no valid reply comes.
pub async fn rpc(
    c: &ChoriaClient,
    node: &str,
    agent: &str,
    action: &str,
    data: &Value,
) -> RpcResult {
    c.rpc(node, agent, action, data)
        .await
        .unwrap_or_else(|e| panic!("{node} {agent}#{action} {data}: {e}"))
}

/// `agent#action` on `node`, whose reply must have status OK.
pub async fn rpc_ok(
    c: &ChoriaClient,
    node: &str,
    agent: &str,
    action: &str,
    data: &Value,
) -> RpcResult {
    let r = rpc(c, node, agent, action, data).await;
    assert_eq!(
        r.body.statuscode,
        StatusCode::Ok,
        "{node} {agent}#{action} {data} failed: {}",
        String::from_utf8_lossy(&r.reply.message)
    );
    r
}

/// Asserts that `node` does not answer `agent#action` within `wait`.
pub async fn assert_no_reply(
    c: &ChoriaClient,
    node: &str,
    agent: &str,
    action: &str,
    wait: Duration,
) {
    let r = c
        .rpc_with_timeout(node, agent, action, &serde_json::json!({}), wait)
        .await;
    assert!(
        matches!(r, Err(client::ClientError::Timeout { .. })),
        "{node} must not answer {agent}#{action}: {r:?}"
    );
}

/// Checks a `choria_provision#gencsr` reply of `node`: a CSR our parser reads and
/// whose signature verifies, and a PEM public key. Returns the parsed CSR.
pub fn check_gencsr_reply(node: &str, r: &RpcResult) -> CsrInfo {
    let info =
        csr::parse_csr(r.body.data["csr"].as_str().unwrap_or_default()).unwrap_or_else(|e| {
            panic!(
                "{node}: our CSR parser refuses the gencsr CSR ({e}): {:?}",
                r.body
            )
        });
    info.verify_signature()
        .unwrap_or_else(|e| panic!("{node}: the gencsr CSR's signature does not verify: {e}"));
    assert!(
        r.body.data["public_key"]
            .as_str()
            .unwrap_or_default()
            .starts_with("-----BEGIN PUBLIC KEY-----"),
        "{node}: gencsr public_key: {:?}",
        r.body
    );
    info
}

/// Runs `cmd`, asserts that it succeeded (with its stderr if not), and
/// returns its stdout.
pub fn stdout_of(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A Choria client configuration for `identity` on a plain NATS server at
/// `url` (v1, insecure: the test networks of the day-two tiers).
pub fn plain_client_cfg(identity: &str, url: &str) -> String {
    format!("identity = {identity}\nplugin.choria.middleware_hosts = {url}\n")
}

/// `records:` as a test's own clients read it: `bucket` on `urls`, sealed
/// with the seed in `signing_key`, created when missing, nothing else set.
pub fn records_config(
    urls: &[String],
    bucket: &str,
    signing_key: &Path,
) -> choria_config::day_two::RecordsConfig {
    choria_config::day_two::RecordsConfig {
        urls: urls.to_vec(),
        bucket: bucket.into(),
        history: 5,
        create_bucket: true,
        replicas: 1,
        user: None,
        password: None,
        password_file: None,
        token: None,
        token_file: None,
        credentials_file: None,
        tls_ca: None,
        tls_client: None,
        signing_key: signing_key.to_path_buf(),
        verify_keys: Vec::new(),
        exclusive: false,
    }
}

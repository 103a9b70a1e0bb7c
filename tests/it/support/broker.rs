//! The real Choria broker (`choria broker run`, in the go-choria binary the
//! interop tiers build) as a test peer: its own provisioning account, the
//! `provisioner` user, the election bucket its Streams create, on free
//! loopback ports with a throwaway CA. Users run this broker; the tiers that
//! use a plain nats-server only emulate it (tests/support/election.rs).
//!
//! Two networks, as go-choria has them (broker/network/choria_auth.go):
//! * [`Network::X509`]: `provisioner` needs a client certificate the broker
//!   verifies; provisioning-mode servers need a provisioning JWT signed by
//!   `plugin.choria.network.provisioning.signer_cert` (RSA, v1).
//! * [`Network::Issuer`]: an Organization Issuer; `provisioner` needs a client
//!   JWT with the provisioner permission; ed25519 provisioning JWTs must be
//!   signed by the issuer, RSA ones still by the signer certificate.

use super::gopeers::{choria_tool, s, Signers, TestCa};
use choria_wire::client::{self, ConnectOptions};
use choria_wire::security::ed25519::Ed25519KeyPair;
use choria_wire::tls::TlsSettings;
use serde_json::Value;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `plugin.choria.network.provisioning.client_password`: what provisioners
/// give as `broker_provisioning_password`.
pub const PROVISIONER_PASSWORD: &str = "br0ker-pr0visioner-pa55";
/// The broker's identity and the CN of its certificate.
pub const BROKER_IDENTITY: &str = "broker.example.net";
/// The broker starts, opens its port and creates its streams well within
/// a second here; generous for a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    X509,
    Issuer,
}

/// One broker's place in a cluster: its index and every member's peer
/// port (`plugin.choria.network.peer_port`).
struct Member {
    index: usize,
    peer_ports: Vec<u16>,
}

/// A running `choria broker run`, killed (with its process group) on drop.
pub struct ChoriaBroker {
    child: Child,
    bin: PathBuf,
    pub network: Network,
    pub port: u16,
    /// `plugin.choria.stats_port`: nats-server's monitoring (`/connz`).
    pub stats_port: u16,
    /// Where its configuration, certificates, log and store live.
    pub dir: PathBuf,
    pub ca: TestCa,
    conf: PathBuf,
    /// The issuer's seed (issuer networks): signs client JWTs.
    issuer_seed: PathBuf,
}

impl ChoriaBroker {
    /// Makes a CA and the broker's certificate in `dir` and starts the
    /// broker with Streams (election TTL `election_ttl`, every stream one
    /// replica so they are made at once) and the provisioning account;
    /// returns once the election bucket exists.
    pub fn start(
        bin: &Path,
        dir: &Path,
        network: Network,
        signers: &Signers,
        election_ttl: Duration,
    ) -> ChoriaBroker {
        Self::start_with(bin, dir, network, signers, election_ttl, true)
    }

    /// [`ChoriaBroker::start`]; on an issuer network without
    /// `plugin.security.choria.ca` unless `issuer_mtls_access`.
    pub fn start_with(
        bin: &Path,
        dir: &Path,
        network: Network,
        signers: &Signers,
        election_ttl: Duration,
        issuer_mtls_access: bool,
    ) -> ChoriaBroker {
        std::fs::create_dir_all(dir).unwrap();
        let ca = TestCa::create(dir);
        let broker = Self::spawn_member(
            bin,
            dir,
            ca,
            network,
            signers,
            election_ttl,
            issuer_mtls_access,
            None,
        );
        broker.wait_ready();
        broker
    }

    /// `n` brokers clustered with each other (`plugin.choria.network.peers`),
    /// one CA, every Stream with `n` replicas; each in `dir/broker-<i>`
    /// with identity `broker-<i>.example.net`. Returns once all listen and
    /// the election bucket was made.
    pub fn start_cluster(
        bin: &Path,
        dir: &Path,
        network: Network,
        signers: &Signers,
        election_ttl: Duration,
        n: usize,
    ) -> Vec<ChoriaBroker> {
        std::fs::create_dir_all(dir).unwrap();
        TestCa::create(dir);
        let peer_ports: Vec<u16> = (0..n).map(|_| super::free_port()).collect();
        let brokers: Vec<ChoriaBroker> = (0..n)
            .map(|index| {
                let member = dir.join(format!("broker-{index}"));
                std::fs::create_dir_all(&member).unwrap();
                let ca = TestCa {
                    cert: dir.join("ca.pem"),
                    key: dir.join("ca-key.pem"),
                };
                Self::spawn_member(
                    bin,
                    &member,
                    ca,
                    network,
                    signers,
                    election_ttl,
                    true,
                    Some(Member {
                        index,
                        peer_ports: peer_ports.clone(),
                    }),
                )
            })
            .collect();
        let deadline = Instant::now() + START_TIMEOUT * 2;
        loop {
            let listening = brokers
                .iter()
                .all(|b| std::net::TcpStream::connect(("127.0.0.1", b.port)).is_ok());
            let made = brokers
                .iter()
                .any(|b| b.log().contains("Created stream KV_CHORIA_LEADER_ELECTION"));
            if listening && made {
                return brokers;
            }
            assert!(
                Instant::now() < deadline,
                "the broker cluster did not start (listening: {listening}); first log:\n{}",
                brokers[0].log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Writes one broker's configuration into `dir` and starts it.
    #[allow(clippy::too_many_arguments)]
    fn spawn_member(
        bin: &Path,
        dir: &Path,
        ca: TestCa,
        network: Network,
        signers: &Signers,
        election_ttl: Duration,
        issuer_mtls_access: bool,
        member: Option<Member>,
    ) -> ChoriaBroker {
        let identity = match &member {
            Some(m) => format!("broker-{}.example.net", m.index),
            None => BROKER_IDENTITY.to_string(),
        };
        let (cert, key) = ca.issue(dir, "broker", &identity, &["DNS:localhost", "IP:127.0.0.1"]);
        let (port, stats_port) = (super::free_port(), super::free_port());
        // One replica per stream when alone, so they are made at once; in a
        // cluster each stream on every member (-1 would wait 10-69 s).
        let replicas = member.as_ref().map_or(1, |m| m.peer_ports.len());
        let mut conf_text = format!(
            "identity = {identity}\n\
             logfile = {log}\n\
             loglevel = debug\n\
             plugin.choria.broker_network = true\n\
             plugin.choria.network.listen_address = 127.0.0.1\n\
             plugin.choria.network.client_port = {port}\n\
             plugin.choria.stats_address = 127.0.0.1\n\
             plugin.choria.stats_port = {stats_port}\n\
             plugin.choria.use_srv = false\n\
             plugin.security.provider = file\n\
             plugin.security.file.certificate = {cert}\n\
             plugin.security.file.key = {key}\n\
             plugin.security.file.ca = {ca}\n\
             plugin.choria.network.system.user = system\n\
             plugin.choria.network.system.password = syst3m-pa55\n\
             plugin.choria.network.provisioning.client_password = {PROVISIONER_PASSWORD}\n\
             plugin.choria.network.provisioning.signer_cert = {signer}\n\
             plugin.choria.network.stream.store = {store}\n\
             plugin.choria.network.stream.leader_election_ttl = {ttl}s\n\
             plugin.choria.network.stream.leader_election_replicas = {replicas}\n\
             plugin.choria.network.stream.event_replicas = {replicas}\n\
             plugin.choria.network.stream.machine_replicas = {replicas}\n\
             plugin.choria.network.stream.advisory_replicas = {replicas}\n\
             plugin.choria.network.stream.executor_replicas = {replicas}\n",
            log = s(&dir.join("broker.log")),
            cert = s(&cert),
            key = s(&key),
            ca = s(&ca.cert),
            signer = s(&signers.rsa_public),
            store = s(&dir.join("streams")),
            ttl = election_ttl.as_secs(),
        );
        if let Some(m) = &member {
            let peers: Vec<String> = m
                .peer_ports
                .iter()
                .map(|p| format!("nats://127.0.0.1:{p}"))
                .collect();
            conf_text.push_str(&format!(
                "plugin.choria.network.peer_port = {}\nplugin.choria.network.peers = {}\n",
                m.peer_ports[m.index],
                peers.join(",")
            ));
        }
        if network == Network::Issuer {
            // `plugin.security.choria.ca` is what lets clients with a
            // certificate its CA signed use the `choria` account (pub-sub and
            // Streams, not fleet subjects) on an issuer network; without it
            // they are refused (go-choria `allowIssuerBasedTLSAccess`).
            conf_text.push_str(&format!(
                "plugin.security.issuer.names = choria\nplugin.security.issuer.choria.public = {}\n",
                signers.issuer_public_hex,
            ));
            if issuer_mtls_access {
                conf_text.push_str(&format!("plugin.security.choria.ca = {}\n", s(&ca.cert)));
            }
        }
        let conf = dir.join("broker.conf");
        std::fs::write(&conf, conf_text).unwrap();
        let child = spawn(bin, &conf, dir);
        ChoriaBroker {
            child,
            bin: bin.to_path_buf(),
            network,
            port,
            stats_port,
            dir: dir.to_path_buf(),
            ca,
            conf,
            issuer_seed: signers.issuer_seed.clone(),
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The broker's own log (JSON lines at debug level).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("broker.log")).unwrap_or_default()
    }

    /// Its log lines that contain `text`.
    pub fn log_lines(&self, text: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains(text))
            .map(str::to_string)
            .collect()
    }

    /// Waits for the client port and for the Streams that hold the election
    /// bucket: the broker made it, as it does for users.
    fn wait_ready(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let listening = std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok();
            if listening
                && self
                    .log()
                    .contains("Created stream KV_CHORIA_LEADER_ELECTION")
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Choria broker did not start within {START_TIMEOUT:?} (listening: {listening}); log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the broker as a crash would and wipes its Streams store, as
    /// when a machine of a cluster is replaced; [`ChoriaBroker::start_again`]
    /// brings it back empty.
    pub fn kill_and_wipe(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(self.dir.join("streams"));
    }

    /// Starts the broker again with its configuration (after
    /// [`ChoriaBroker::kill_and_wipe`]).
    pub fn start_again(&mut self) {
        self.child = spawn(&self.bin, &self.conf, &self.dir);
        let deadline = Instant::now() + START_TIMEOUT;
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "the broker did not come back");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill(&mut self) {
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", self.child.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `<name>-cert.pem`/`<name>-key.pem` in the broker's directory: a client
    /// certificate for `cn` that the broker verifies.
    pub fn client_cert(&self, name: &str, cn: &str) -> (PathBuf, PathBuf) {
        self.ca.issue(&self.dir, name, cn, &[])
    }

    /// TLS as a verified client: the broker's CA, and `cert` when given.
    pub fn tls(&self, cert: Option<(PathBuf, PathBuf)>) -> TlsSettings {
        TlsSettings {
            required: true,
            ca_file: Some(self.ca.cert.clone()),
            client_cert: cert,
            insecure_skip_verify: false,
        }
    }

    /// A client JWT for a new ed25519 key, issued by the organisation issuer
    /// with the real `choria jwt client` and `flags`: (jwt file, seed file).
    pub fn issue_client(&self, name: &str, caller: &str, flags: &[&str]) -> (PathBuf, PathBuf) {
        assert_eq!(self.network, Network::Issuer, "client JWTs need an issuer");
        let (seed, public, jwt) = (
            format!("{name}.seed"),
            format!("{name}.public"),
            format!("{name}.jwt"),
        );
        choria_tool(&self.bin, &self.dir, &["jwt", "keys", &seed, &public]);
        let public_hex = std::fs::read_to_string(self.dir.join(&public)).unwrap();
        let pk = format!("--public-key={public_hex}");
        let mut args = vec![
            "jwt",
            "client",
            &jwt,
            caller,
            s(&self.issuer_seed),
            "--validity",
            "1h",
            &pk,
        ];
        args.extend_from_slice(flags);
        choria_tool(&self.bin, &self.dir, &args);
        (self.dir.join(jwt), self.dir.join(seed))
    }

    /// A connection into the broker's `choria` account that sees every
    /// lifecycle event (the provisioning account's are imported there): on
    /// an x509 network with a verified client certificate (no subject
    /// limits), on an issuer network with a client JWT allowed to view
    /// events (mTLS alone may not subscribe `choria.lifecycle.>` there).
    pub async fn watcher(&self) -> async_nats::Client {
        let mut opts = ConnectOptions {
            servers: vec![self.url()],
            name: "watcher".into(),
            ..Default::default()
        };
        match self.network {
            Network::X509 => {
                opts.tls = self.tls(Some(self.client_cert("watcher", "watcher.example.net")));
            }
            Network::Issuer => {
                let (jwt, seed) = self.issue_client("watcher", "watcher", &["--event-viewer"]);
                let jwt = std::fs::read_to_string(jwt).unwrap().trim().to_string();
                let seed = std::fs::read_to_string(seed).unwrap();
                let key = Ed25519KeyPair::from_seed_hex(seed.trim()).unwrap();
                opts.tls = self.tls(None);
                opts.token = Some(jwt.clone());
                opts.nats_jwt = Some((jwt, key.signing_key().clone()));
            }
        }
        client::connect(&opts)
            .await
            .unwrap_or_else(|e| panic!("the watcher could not connect: {e}\n{}", self.log()))
    }

    /// The open client connections named `name` in the broker's `/connz`,
    /// with their subscriptions.
    pub fn connections(&self, name: &str) -> Vec<Value> {
        connz(self.stats_port, name)
    }
}

impl Drop for ChoriaBroker {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn(bin: &Path, conf: &Path, dir: &Path) -> Child {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("broker.out"))
        .unwrap();
    // setpriv --pdeathsig: the broker dies with the test process even when
    // that is killed outright and Drop never runs.
    Command::new("setpriv")
        .args(["--pdeathsig", "KILL"])
        .arg(bin)
        .args(["broker", "run", "--config"])
        .arg(conf)
        .current_dir(dir)
        .env("HOME", dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("could not start {} broker run: {e}", bin.display()))
}

/// The open client connections named `name` in nats-server's `/connz` on
/// `port`, with their subscriptions (`subscriptions_list`).
pub fn connz(port: u16, name: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    // The monitoring listener may open a moment after the client port.
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "monitoring port did not open");
        std::thread::sleep(Duration::from_millis(50));
    }
    // HTTP/1.0: nats-server then answers without chunked encoding.
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.write_all(b"GET /connz?subs=1&limit=4096 HTTP/1.0\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    assert!(head.starts_with("HTTP/1.0 200"), "/connz: {response}");
    let connz: Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("/connz is not JSON ({e}): {body}"));
    connz["connections"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["name"] == name)
        .cloned()
        .collect()
}

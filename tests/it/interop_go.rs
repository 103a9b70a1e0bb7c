//! Interoperability with the REAL go-choria (v0.30.2) on the other end of the wire.
//!
//! * our Choria client against real `choria server run` processes in provisioning
//!   mode (v1 and v2), each in its own UTS namespace so that its hostname — and so
//!   its identity — is its own;
//! * the real `choria` CLI as a client of our simulated fleet (v1 and v2), standing
//!   in for the Go provisioner, which the Go module proxy does not serve;
//! * our simulator's replies compared layer by layer, byte for byte, with a real
//!   server's replies to the same requests.
//!
//! Needs `$CHORIA_BIN` (scripts/test.sh builds it with `scripts/build-go-peers.sh
//! choria natstap` and exports it) and root (for `unshare --uts`). Without
//! `$CHORIA_BIN` every test fails under CI, and otherwise says NOT RUN loudly,
//! with the build error from `$CHORIA_GO_PEERS_UNAVAILABLE`, and returns
//! (tests/support/peers.rs); with it, everything really runs.
//! See tests/gopeers/RECIPE.md for the recipe these tests follow.

use crate::support::gopeers::{
    choria_bin, choria_tool, is_hex, issue_client_jwt, make_signers, s, GoServer, Signers,
};
use crate::support::{
    check_gencsr_reply, discover_provisionable, rpc, rpc_ok, NatsServer, RunningFleet,
};
use choria_fleet::FleetOptions;
use choria_wire::client::BrokerOptions;
use choria_wire::client::{self, ChoriaClient, DiscoveryOptions, Identity};
use choria_wire::filter::Filter;
use choria_wire::lifecycle::{self, EventType};
use choria_wire::mcorpc::{self, RpcRequest, StatusCode};
use choria_wire::protocol::{self, RequestSigner, RequestSpec, Version};
use choria_wire::security::{ed25519, tokens};
use choria_wire::{ids, subjects};
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

const TOKEN: &str = "s3cret";
const VERSION: &str = "0.30.2";
const PROVISIONER: &str = "provisioner.example.net";
const AGENTS: [&str; 4] = ["choria_provision", "choria_util", "discovery", "rpcutil"];
/// How long real servers get to connect and announce themselves.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(40);
/// How long the lifecycle events of `configure` and `restart` may take.
const LATER_EVENTS_TIMEOUT: Duration = Duration::from_secs(15);

/// A raw lifecycle event: the subject it came on and its payload.
type RawEvent = (String, Vec<u8>);

/// Collects raw lifecycle events until every `(kind, identity)` in `want` was
/// seen (the first of each kind and identity is kept). On timeout it fails with
/// what did arrive and the logs of `servers`.
async fn collect_events(
    sub: &mut async_nats::Subscriber,
    want: &[(EventType, &str)],
    servers: &[&GoServer],
    timeout: Duration,
) -> HashMap<(EventType, String), RawEvent> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut seen = HashMap::new();
    while !want
        .iter()
        .all(|(k, id)| seen.contains_key(&(*k, id.to_string())))
    {
        let Ok(Some(msg)) = tokio::time::timeout_at(deadline, sub.next()).await else {
            let logs: Vec<String> = servers
                .iter()
                .map(|s| format!("--- {} server.log:\n{}", s.identity, s.log()))
                .collect();
            panic!(
                "lifecycle events seen within {timeout:?}: {:?}, wanted {want:?}\n{}",
                seen.keys().collect::<Vec<_>>(),
                logs.join("\n")
            );
        };
        let (kind, event) = lifecycle::parse(&msg.payload).unwrap_or_else(|e| {
            panic!(
                "not a lifecycle event on {} ({e}): {}",
                msg.subject,
                String::from_utf8_lossy(&msg.payload)
            )
        });
        seen.entry((kind, event.identity))
            .or_insert_with(|| (msg.subject.to_string(), msg.payload.to_vec()));
    }
    seen
}

/// Waits until every identity published a `startup` lifecycle event on `sub`
/// (a startup subscription), and returns each one's raw event.
async fn wait_for_startups(
    sub: &mut async_nats::Subscriber,
    identities: &[&str],
    servers: &[&GoServer],
) -> BTreeMap<String, RawEvent> {
    let want: Vec<(EventType, &str)> = identities
        .iter()
        .map(|id| (EventType::Startup, *id))
        .collect();
    let mut startups = BTreeMap::new();
    for ((kind, id), (subject, raw)) in collect_events(sub, &want, servers, STARTUP_TIMEOUT).await {
        assert_eq!(kind, EventType::Startup, "{id}: an event on {subject}");
        if identities.contains(&id.as_str()) {
            startups.insert(id, (subject, raw));
        }
    }
    startups
}

/// What every test against real servers starts with: a nats-server offering TLS,
/// the signers, and a connection already subscribed to provisioning-mode startups.
struct RealPeers {
    bin: PathBuf,
    nats: NatsServer,
    work: tempfile::TempDir,
    signers: Signers,
    conn: async_nats::Client,
    startups: async_nats::Subscriber,
}

impl RealPeers {
    /// `None` (having said why, loudly) when the real binary is not available.
    async fn start(test: &str) -> Option<RealPeers> {
        let bin = choria_bin(test)?;
        let nats = NatsServer::start_tls_available();
        let work = tempfile::tempdir().unwrap();
        let signers = make_signers(&bin, work.path());
        let conn = nats.connect(PROVISIONER).await;
        let startups = client::subscribe_events(&conn, EventType::Startup, "provision_mode_server")
            .await
            .unwrap();
        conn.flush().await.unwrap();
        Some(RealPeers {
            bin,
            nats,
            work,
            signers,
            conn,
            startups,
        })
    }

    /// A real server of `version` named `identity`, working in its own directory.
    fn go_server(&self, identity: &str, version: Version) -> GoServer {
        GoServer::start(
            &self.bin,
            &self.signers,
            &self.work.path().join(identity),
            identity,
            &self.nats.url(),
            version,
            TOKEN,
        )
    }
}

fn v1_client(conn: async_nats::Client) -> ChoriaClient {
    ChoriaClient::new(
        conn,
        Identity {
            identity: PROVISIONER.into(),
            caller: format!("choria={PROVISIONER}"),
            signer: RequestSigner::V1Insecure,
        },
    )
}

/// A v2 caller: a fresh ed25519 seed and a client JWT for its public key, issued by
/// the real `choria jwt client ... --server-provisioner` with callerid `provisioner`.
fn v2_caller(bin: &Path, dir: &Path, signers: &Signers) -> (ed25519_dalek::SigningKey, String) {
    let seed = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
    let public = hex::encode(seed.verifying_key().to_bytes());
    let jwt_file = dir.join("client.jwt");
    issue_client_jwt(bin, dir, s(&jwt_file), &public, signers);
    let jwt = std::fs::read_to_string(jwt_file).unwrap();
    (seed, jwt.trim().to_string())
}

fn v2_client(
    conn: async_nats::Client,
    seed: ed25519_dalek::SigningKey,
    jwt: String,
) -> ChoriaClient {
    ChoriaClient::new(
        conn,
        Identity {
            identity: PROVISIONER.into(),
            caller: "provisioner".into(),
            signer: RequestSigner::V2 {
                seed: Box::new(seed),
                jwt,
            },
        },
    )
}

fn body_text(r: &client::RpcResult) -> String {
    String::from_utf8(r.reply.message.clone()).unwrap()
}

/// Checks a real server's `rpcutil#inventory` reply.
fn assert_real_inventory(node: &str, r: &client::RpcResult) {
    assert_eq!(
        r.body.statuscode,
        StatusCode::Ok,
        "{node}: {}",
        body_text(r)
    );
    assert_eq!(r.body.statusmsg, "OK", "{node}");
    assert_eq!(r.body.action, "inventory", "{node}");
    assert_eq!(r.reply.sender, node);
    assert_eq!(r.reply.transport_sender, node);
    assert_eq!(r.reply.agent, "rpcutil", "{node}");
    let d = &r.body.data;
    assert_eq!(d["version"], VERSION, "{node}");
    assert_eq!(d["agents"], json!(AGENTS), "{node}");
    assert_eq!(d["main_collective"], "provisioning", "{node}");
    assert_eq!(d["collectives"], json!(["provisioning"]), "{node}");
    assert_eq!(d["upgradable"], false, "{node}");
}

/// `choria_provision#jwt` with a wrong token: refused with the exact status, and
/// the exact body, our simulator answers with.
async fn check_wrong_token(c: &ChoriaClient, node: &str) {
    let r = rpc(
        c,
        node,
        "choria_provision",
        "jwt",
        &json!({"token": "wrong"}),
    )
    .await;
    assert_eq!(
        r.body.statuscode,
        StatusCode::Aborted,
        "{node}: {}",
        body_text(&r)
    );
    assert_eq!(
        r.body.statusmsg, "Incorrect provision token supplied",
        "{node}"
    );
    assert_eq!(
        body_text(&r),
        String::from_utf8(mcorpc::error_reply(
            "jwt",
            StatusCode::Aborted,
            "Incorrect provision token supplied"
        ))
        .unwrap(),
        "{node}: the real error body is byte-identical to what our simulator sends"
    );
}

/// `choria_provision#jwt` on a real server of `version`: its provisioning.jwt
/// verbatim, verifiable with the signer's public key, with the claims `choria jwt
/// prov` was given, and an ECDH public key.
async fn check_real_jwt(
    c: &ChoriaClient,
    server: &GoServer,
    signers: &Signers,
    version: Version,
    nats_url: &str,
) {
    let node = server.identity.as_str();
    let r = rpc_ok(c, node, "choria_provision", "jwt", &json!({"token": TOKEN})).await;
    let jwt = r.body.data["jwt"].as_str().unwrap_or_default();
    assert_eq!(jwt, server.provisioning_jwt(), "{node}");
    let key = match version {
        Version::V1 => tokens::TokenVerifyKey::from_setting(s(&signers.rsa_public)),
        Version::V2 => tokens::TokenVerifyKey::from_setting(&signers.issuer_public_hex),
    }
    .unwrap();
    let claims = tokens::parse_provisioning_token(jwt, &key).unwrap_or_else(|e| {
        panic!("{node}: the real {version} JWT does not verify with the signer's public key: {e}")
    });
    assert_eq!(claims.token, TOKEN, "{node}");
    assert!(claims.prov_default, "{node}: {claims:?}");
    assert_eq!(
        claims.proto_v2,
        version == Version::V2,
        "{node}: the v2 claim is set exactly for v2"
    );
    assert_eq!(claims.urls, nats_url, "{node}");
    let ecdh = r.body.data["ecdh_public"].as_str().unwrap_or_default();
    assert!(is_hex(ecdh, 64), "{node}: ecdh_public {ecdh:?}");
}

/// `choria_provision#gen25519` on a real server: the nonce signature verifies with
/// our ed25519 code, and the key lives in the server's directory.
async fn check_real_gen25519(c: &ChoriaClient, server: &GoServer) {
    let node = server.identity.as_str();
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let r = rpc_ok(
        c,
        node,
        "choria_provision",
        "gen25519",
        &json!({"nonce": nonce, "token": TOKEN}),
    )
    .await;
    let public_key = r.body.data["public_key"].as_str().unwrap_or_default();
    assert!(is_hex(public_key, 64), "{node}: public_key {public_key:?}");
    ed25519::verify_nonce(
        public_key,
        &nonce,
        r.body.data["signature"].as_str().unwrap_or_default(),
    )
    .unwrap_or_else(|e| panic!("{node}: real gen25519 signature does not verify: {e}"));
    assert_eq!(r.body.data["directory"], s(&server.dir), "{node}");
}

// ---------------------------------------------------------------------------
// 1. Our v1 client against real v1 servers.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_v1_client_discovers_and_queries_real_v1_servers() {
    let Some(mut peers) =
        RealPeers::start("our_v1_client_discovers_and_queries_real_v1_servers").await
    else {
        return;
    };
    let ids = ["go-v1-a.interop.example.net", "go-v1-b.interop.example.net"];
    let servers: Vec<GoServer> = ids
        .iter()
        .map(|id| peers.go_server(id, Version::V1))
        .collect();
    let refs: Vec<&GoServer> = servers.iter().collect();
    let events = wait_for_startups(&mut peers.startups, &ids, &refs).await;
    for (id, (_, raw)) in &events {
        let (_, e) = lifecycle::parse(raw).unwrap();
        assert_eq!(e.component, "provision_mode_server", "{id}");
        assert_eq!(e.version.as_deref(), Some(VERSION), "{id}");
    }

    let c = v1_client(peers.conn.clone());
    assert_eq!(
        discover_provisionable(&c).await,
        ids,
        "v1 discovery finds exactly both real servers"
    );
    let everyone = c
        .discover(&Filter::default(), DiscoveryOptions::default())
        .await
        .unwrap();
    assert_eq!(
        everyone, ids,
        "an empty filter (choria ping) finds them too"
    );

    for server in &servers {
        let node = server.identity.as_str();
        let r = rpc(&c, node, "rpcutil", "inventory", &json!({})).await;
        assert_real_inventory(node, &r);

        // A wrong token: the exact status our simulator answers with.
        check_wrong_token(&c, node).await;
        check_real_jwt(&c, server, &peers.signers, Version::V1, &peers.nats.url()).await;
        check_real_gen25519(&c, server).await;

        // gencsr: a CSR our parser reads, for the identity.
        let r = rpc_ok(
            &c,
            node,
            "choria_provision",
            "gencsr",
            &json!({"cn": node, "token": TOKEN}),
        )
        .await;
        let info = check_gencsr_reply(node, &r);
        assert_eq!(info.common_name, node);
        assert_eq!(r.body.data["ssldir"], s(&server.dir.join("ssl")), "{node}");
    }
}

// ---------------------------------------------------------------------------
// 2. Our v2 client against a real v2 server.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_v2_client_discovers_and_queries_real_v2_server() {
    let Some(mut peers) =
        RealPeers::start("our_v2_client_discovers_and_queries_real_v2_server").await
    else {
        return;
    };
    let id = "go-v2.interop.example.net";
    let server = peers.go_server(id, Version::V2);
    wait_for_startups(&mut peers.startups, &[id], &[&server]).await;

    let (seed, jwt) = v2_caller(&peers.bin, peers.work.path(), &peers.signers);
    let c = v2_client(peers.conn.clone(), seed, jwt);
    let v1 = v1_client(peers.conn.clone());
    let (found, found_by_v1) =
        tokio::join!(discover_provisionable(&c), discover_provisionable(&v1));
    assert_eq!(found, [id], "v2 discovery finds the real v2 server");
    assert!(
        found_by_v1.is_empty(),
        "a real v2 server must not answer v1: {found_by_v1:?}"
    );

    let r = rpc(&c, id, "rpcutil", "inventory", &json!({})).await;
    assert_eq!(r.reply.version, Version::V2);
    assert_real_inventory(id, &r);

    check_real_jwt(&c, &server, &peers.signers, Version::V2, &peers.nats.url()).await;
    check_real_gen25519(&c, &server).await;
    check_wrong_token(&c, id).await;
}

// ---------------------------------------------------------------------------
// 3. The real `choria` CLI against our simulated fleet.
// ---------------------------------------------------------------------------

/// The simulated fleet with the defaults of these tests, journaling into `dir`.
async fn start_fleet(
    nats: &NatsServer,
    dir: &Path,
    tweak: impl FnOnce(&mut FleetOptions),
) -> RunningFleet {
    let journal = dir.join(format!("journal-{}.jsonl", uuid::Uuid::new_v4().simple()));
    let mut opts = FleetOptions {
        broker: BrokerOptions::at([nats.url()]),
        nodes: 3,
        token: TOKEN.into(),
        journal: Some(journal),
        key_pool_size: 1,
        connections: 2,
        ..Default::default()
    };
    tweak(&mut opts);
    RunningFleet::start(opts).await
}

/// The real CLI as a client: its config file and environment (RECIPE.md §3.d).
struct Cli {
    bin: PathBuf,
    dir: PathBuf,
    config: PathBuf,
    env: Vec<(&'static str, String)>,
}

impl Cli {
    /// Writes `config_name` in `dir`: a client of the provisioning collective at
    /// `nats_url` whose security provider and files `security` sets.
    fn with_config(
        bin: &Path,
        dir: &Path,
        config_name: &str,
        nats_url: &str,
        security: &str,
        env: Vec<(&'static str, String)>,
    ) -> Cli {
        let config = dir.join(config_name);
        std::fs::write(
            &config,
            format!(
                "plugin.choria.middleware_hosts = {nats_url}\nplugin.choria.use_srv = false\n\
                 collectives = provisioning\nmain_collective = provisioning\nidentity = {PROVISIONER}\n\
                 {security}"
            ),
        )
        .unwrap();
        Cli {
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            config,
            env,
        }
    }

    fn v1(bin: &Path, dir: &Path, nats_url: &str) -> Cli {
        // The file provider wants these to exist; in insecure mode they are unused.
        crate::support::make_self_signed(dir);
        let security = format!(
            "plugin.security.provider = file\nplugin.security.file.certificate = {d}/cert.pem\n\
             plugin.security.file.key = {d}/key.pem\nplugin.security.file.ca = {d}/cert.pem\n",
            d = dir.display()
        );
        let env = vec![("INSECURE_YES_REALLY", "true".into())];
        Cli::with_config(bin, dir, "client-v1.conf", nats_url, &security, env)
    }

    fn v2(bin: &Path, dir: &Path, nats_url: &str, signers: &Signers) -> Cli {
        choria_tool(bin, dir, &["jwt", "keys", "client.seed", "client.public"]);
        let public = std::fs::read_to_string(dir.join("client.public")).unwrap();
        issue_client_jwt(bin, dir, "client.jwt", &public, signers);
        let security = format!(
            "plugin.security.provider = choria\nplugin.security.choria.token_file = {d}/client.jwt\n\
             plugin.security.choria.seed_file = {d}/client.seed\nplugin.security.issuer.names = choria\n\
             plugin.security.issuer.choria.public = {}\n",
            signers.issuer_public_hex,
            d = dir.display()
        );
        let env = vec![
            ("USER", "root".into()),
            ("INSECURE_DISABLE_TLS", "true".into()),
        ];
        Cli::with_config(bin, dir, "client-v2.conf", nats_url, &security, env)
    }

    /// Runs `choria <args> --config <conf>` and returns stdout; fails on a non-zero exit.
    async fn run(&self, args: &[&str]) -> String {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.args(args)
            .arg("--config")
            .arg(&self.config)
            .current_dir(&self.dir)
            .env("HOME", &self.dir)
            .env_remove("INSECURE_YES_REALLY")
            .env_remove("INSECURE_DISABLE_TLS")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .unwrap_or_else(|_| panic!("choria {args:?} did not finish within 60 s"))
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

    /// `choria req <agent> <action> <inputs> -I <node> --json`: the one reply.
    async fn req(&self, agent: &str, action: &str, inputs: &[&str], node: &str) -> Value {
        let mut args = vec!["req", agent, action];
        args.extend_from_slice(inputs);
        args.extend(["-I", node, "--json"]);
        let out = self.run(&args).await;
        let doc: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("choria {args:?}: not JSON ({e}):\n{out}"));
        assert_eq!(doc["agent"], agent, "{doc}");
        assert_eq!(doc["action"], action, "{doc}");
        let replies = doc["replies"]
            .as_array()
            .unwrap_or_else(|| panic!("no replies: {doc}"));
        assert_eq!(replies.len(), 1, "{doc}");
        assert_eq!(doc["request_stats"]["responses"], 1, "{doc}");
        assert_eq!(replies[0]["sender"], node, "{doc}");
        replies[0].clone()
    }
}

/// The real CLI's fixture: our simulated fleet of three on `nats`, and the
/// real `choria` CLI of `version` set up to call it as `caller`.
struct CliRun {
    // Fields drop in order: what started last stops first.
    cli: Cli,
    caller: String,
    fleet: RunningFleet,
    nodes: Vec<String>,
    signers: Signers,
    work: tempfile::TempDir,
    nats: NatsServer,
    bin: PathBuf,
    version: Version,
}

async fn real_cli_provisions_our_fleet(version: Version) {
    let test = format!("real_choria_cli_talks_to_our_simulated_fleet_{version}");
    let Some(bin) = choria_bin(&test) else {
        return;
    };
    let run = CliRun::given_our_fleet_and_the_real_cli(bin, version).await;
    run.then_choria_ping_reaches_every_node().await;
    // The node the CLI provisions; the other two stay in provisioning mode.
    let node = &run.nodes[1].clone();
    run.then_the_inventory_is_a_servers(node).await;
    let token_arg = format!("token={TOKEN}");
    run.then_its_jwt_validates_with_go_choria(node, &token_arg)
        .await;
    run.then_a_wrong_token_is_refused(node).await;
    run.when_configured_and_restarted_it_comes_back(node, &token_arg)
        .await;
    run.then_the_journal_holds_the_clis_requests_only(node)
        .await;
}

impl CliRun {
    async fn given_our_fleet_and_the_real_cli(bin: PathBuf, version: Version) -> CliRun {
        let nats = NatsServer::start();
        let work = tempfile::tempdir().unwrap();
        let signers = make_signers(&bin, work.path());
        let fleet = start_fleet(&nats, work.path(), |o| {
            o.protocol = version;
            o.jwt_signer = Some(signers.signing_key(version).to_path_buf());
            o.identity_suffix = format!(".{version}.fleet.example.net");
        })
        .await;
        let nodes = fleet.identities.clone();
        let (cli, caller) = match version {
            Version::V1 => (
                Cli::v1(&bin, work.path(), &nats.url()),
                format!("choria={PROVISIONER}"),
            ),
            Version::V2 => (
                Cli::v2(&bin, work.path(), &nats.url(), &signers),
                "provisioner".to_string(),
            ),
        };

        CliRun {
            cli,
            caller,
            fleet,
            nodes,
            signers,
            work,
            nats,
            bin,
            version,
        }
    }

    async fn then_choria_ping_reaches_every_node(&self) {
        let (cli, nodes) = (&self.cli, &self.nodes);
        // choria ping: broadcast discovery, every simulated node answers.
        let ping = cli.run(&["ping"]).await;
        let answered: BTreeSet<&str> = ping
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|w| w.ends_with(".fleet.example.net"))
            .collect();
        assert_eq!(
            answered,
            nodes.iter().map(String::as_str).collect(),
            "choria ping:\n{ping}"
        );
        assert!(ping.contains("3 replies"), "choria ping:\n{ping}");
    }

    async fn then_the_inventory_is_a_servers(&self, node: &str) {
        let cli = &self.cli;
        let inv = cli.req("rpcutil", "inventory", &[], node).await;
        assert_eq!(inv["statuscode"], 0, "{inv}");
        assert_eq!(inv["statusmsg"], "OK", "{inv}");
        assert_eq!(inv["data"]["version"], VERSION, "{inv}");
        assert_eq!(inv["data"]["agents"], json!(AGENTS), "{inv}");
        assert_eq!(inv["data"]["main_collective"], "provisioning", "{inv}");
    }

    async fn then_its_jwt_validates_with_go_choria(&self, node: &str, token_arg: &str) {
        let (cli, bin, work, signers, version) = (
            &self.cli,
            &self.bin,
            &self.work,
            &self.signers,
            self.version,
        );
        let r = cli.req("choria_provision", "jwt", &[token_arg], node).await;
        assert_eq!(r["statuscode"], 0, "{r}");
        let jwt = r["data"]["jwt"]
            .as_str()
            .unwrap_or_else(|| panic!("no jwt: {r}"));
        assert!(
            is_hex(r["data"]["ecdh_public"].as_str().unwrap_or_default(), 64),
            "{r}"
        );
        // The fleet's provisioning JWT validates with the REAL go-choria token code.
        std::fs::write(work.path().join("fleet.jwt"), jwt).unwrap();
        let view = choria_tool(
            bin,
            work.path(),
            &["jwt", "view", "fleet.jwt", s(signers.public_key(version))],
        );
        assert!(
            view.contains("Validated Provisioning Token"),
            "choria jwt view:\n{view}"
        );
        assert!(view.contains("Provisioning by default: true"), "{view}");
        assert_eq!(
            view.contains("Using version 2 Protocol: true"),
            version == Version::V2,
            "choria jwt view:\n{view}"
        );
    }

    async fn then_a_wrong_token_is_refused(&self, node: &str) {
        let cli = &self.cli;
        let r = cli
            .req("choria_provision", "jwt", &["token=wrong"], node)
            .await;
        assert_eq!(r["statuscode"], 1, "{r}");
        assert_eq!(r["statusmsg"], "Incorrect provision token supplied", "{r}");
    }

    async fn when_configured_and_restarted_it_comes_back(&self, node: &str, token_arg: &str) {
        let (cli, nats) = (&self.cli, &self.nats);
        let config = json!({
            "plugin.choria.server.provision": "false",
            "identity": node,
            "plugin.choria.middleware_hosts": nats.url(),
            "loglevel": "info",
        })
        .to_string();
        let config_arg = format!("config={config}");
        let r = cli
            .req(
                "choria_provision",
                "configure",
                &[token_arg, &config_arg],
                node,
            )
            .await;
        assert_eq!(r["statuscode"], 0, "{r}");
        assert_eq!(
            r["data"]["message"],
            format!("Wrote 5 lines to /etc/choria-fleet/{node}/server.conf"),
            "{r}"
        );

        let watcher = nats.connect("watcher").await;
        let mut restarted = client::subscribe_events(&watcher, EventType::Startup, "server")
            .await
            .unwrap();
        watcher.flush().await.unwrap();
        let r = cli
            .req("choria_provision", "restart", &[token_arg, "splay=1"], node)
            .await;
        assert_eq!(r["statuscode"], 0, "{r}");
        assert_eq!(
            r["data"]["message"], "Restarting Choria Server after 2s",
            "{r}"
        );
        let ev = tokio::time::timeout(Duration::from_secs(5), restarted.next())
            .await
            .expect("the node comes back as a provisioned server")
            .unwrap();
        assert_eq!(lifecycle::parse(&ev.payload).unwrap().1.identity, node);
    }

    async fn then_the_journal_holds_the_clis_requests_only(self, node: &str) {
        let (fleet, caller) = (self.fleet, self.caller);
        let (summary, journal) = fleet.finish().await;
        assert_eq!(summary.provisioned, 1, "{summary:?}");
        assert_eq!(summary.provisioning, 2, "{summary:?}");
        let fin = journal
            .iter()
            .find(|e| e["kind"] == "final" && e["node"] == node)
            .unwrap_or_else(|| panic!("no final state for {node} in the journal"));
        assert_eq!(fin["state"], "provisioned", "{fin}");
        assert_eq!(fin["provision_disabled"], true, "{fin}");
        assert_eq!(fin["restarts"], 1, "{fin}");
        let node_actions: Vec<&Value> = journal
            .iter()
            .filter(|e| e["kind"] == "action" && e["node"] == node)
            .collect();
        let actions: Vec<(&str, &str)> = node_actions
            .iter()
            .filter(|e| e["agent"] != "discovery")
            .map(|e| {
                (
                    e["agent"].as_str().unwrap_or_default(),
                    e["action"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            actions,
            [
                ("rpcutil", "inventory"),
                ("choria_provision", "jwt"),
                ("choria_provision", "jwt"),
                ("choria_provision", "configure"),
                ("choria_provision", "restart")
            ]
        );
        for e in node_actions {
            assert_eq!(
                e["caller"],
                caller.as_str(),
                "the real CLI's caller id: {e}"
            );
            assert_eq!(e["sender"], PROVISIONER, "{e}");
            assert_ne!(e["outcome"], "dropped", "{e}");
        }
        let no_drops: Vec<&Value> = journal
            .iter()
            .filter(|e| e["outcome"] == "dropped")
            .collect();
        assert!(
            no_drops.is_empty(),
            "the fleet dropped real CLI requests: {no_drops:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_choria_cli_talks_to_our_simulated_fleet_v1() {
    real_cli_provisions_our_fleet(Version::V1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_choria_cli_talks_to_our_simulated_fleet_v2() {
    real_cli_provisions_our_fleet(Version::V2).await;
}

// ---------------------------------------------------------------------------
// 4. Our simulator's replies against a real server's, byte for byte.
// ---------------------------------------------------------------------------

/// Sends one request with our encoder and returns its id and the raw reply payload.
async fn raw_request(
    conn: &async_nats::Client,
    signer: &RequestSigner,
    caller: &str,
    target: &str,
    agent: &str,
    payload: &[u8],
    url: &str,
) -> (String, Vec<u8>) {
    let id = match signer.version() {
        Version::V1 => ids::v1_request_id(),
        Version::V2 => ids::v2_request_id(),
    };
    let reply_to = subjects::reply(subjects::PROVISIONING_COLLECTIVE, caller, &id);
    // Discovery is a broadcast narrowed to one identity; RPC is directed.
    let (filter, subject) = if agent == "discovery" {
        (
            Filter {
                identity: vec![target.to_string()],
                ..Default::default()
            },
            subjects::broadcast_agent(subjects::PROVISIONING_COLLECTIVE, "discovery"),
        )
    } else {
        (
            Filter::with_agent(agent),
            subjects::node(subjects::PROVISIONING_COLLECTIVE, target),
        )
    };
    let msg = signer
        .encode_request(&RequestSpec {
            id: &id,
            sender: PROVISIONER,
            caller,
            collective: subjects::PROVISIONING_COLLECTIVE,
            agent,
            ttl: 60,
            time_nanos: client::now_nanos(),
            filter: &filter,
            payload,
            reply_to: &reply_to,
            connected_url: url,
        })
        .unwrap();
    let mut sub = conn.subscribe(reply_to).await.unwrap();
    conn.publish(subject, msg.into()).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .unwrap_or_else(|_| panic!("no reply from {target} to {agent} within 10 s"))
        .unwrap();
    (id, reply.payload.to_vec())
}

/// The layers of a reply, outermost first, as the exact bytes that were on the
/// wire (each nested layer taken from its base64 or JSON-string field).
fn reply_layers(raw: &[u8]) -> Vec<(&'static str, String)> {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    let b64 = |v: &Value| String::from_utf8(STANDARD.decode(v.as_str().unwrap()).unwrap()).unwrap();
    let transport_text = String::from_utf8(raw.to_vec()).unwrap();
    let transport: Value = serde_json::from_slice(raw).unwrap();
    let secure_text = b64(&transport["data"]);
    let secure: Value = serde_json::from_str(&secure_text).unwrap();
    let (reply_text, body_text) = match protocol::sniff_version(raw).unwrap() {
        Version::V1 => {
            let reply_text = secure["message"].as_str().unwrap().to_string();
            let reply: Value = serde_json::from_str(&reply_text).unwrap();
            (reply_text, reply["message"].as_str().unwrap().to_string())
        }
        Version::V2 => {
            let reply_text = b64(&secure["reply"]);
            let reply: Value = serde_json::from_str(&reply_text).unwrap();
            (reply_text.clone(), b64(&reply["message"]))
        }
    };
    vec![
        ("transport", transport_text),
        ("secure reply", secure_text),
        ("reply", reply_text),
        ("body", body_text),
    ]
}

/// What differs legitimately between two servers, per side: its identity, the
/// request id, and path prefixes (`(from, to)`, applied first).
struct Subst<'a> {
    identity: &'a str,
    request_id: &'a str,
    paths: &'a [(String, String)],
}

/// Keeps a value's length and punctuation, hides its random characters:
/// `3MpK1s+/...` -> `xxxxxx...`, `1796043060` -> `xxxxxxxxxx`, `12:50:59Z` -> `xx:xx:xxx`.
fn shape(v: &str) -> String {
    v.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '+' || c == '/' || c == '_' {
                'x'
            } else {
                c
            }
        })
        .collect()
}

/// Replaces what legitimately differs between two servers (identity, request id,
/// times, ids, hashes and generated keys keep only their shape; nested layers and
/// PEM/JWT blobs, which are compared on their own, become placeholders) and
/// leaves key order, escaping and every other byte intact.
fn normalize(text: &str, sub: &Subst<'_>, url: &str) -> String {
    let json_str = r#""((?:[^"\\]|\\.)*)""#;
    let mut t = text.to_string();
    for (from, to) in sub.paths {
        t = t.replace(from.as_str(), to);
    }
    t = t
        .replace(sub.identity, "<IDENTITY>")
        .replace(sub.request_id, "<REQUEST-ID>")
        .replace(url, "<NATS-URL>");
    // Nested layers, compared on their own (a `"message":"pong"` stays).
    for field in ["data", "message", "reply"] {
        let re = regex::Regex::new(&format!(r#""{field}":{json_str}"#)).unwrap();
        t = re
            .replace_all(&t, |c: &regex::Captures<'_>| {
                // A nested layer is escaped JSON or base64; prose such as
                // "Wrote 3 lines to ..." is compared as it is.
                let v = &c[1];
                if v.len() > 40 && (v.starts_with('{') || !v.contains(' ')) {
                    format!(r#""{field}":"<{field}>""#)
                } else {
                    c[0].to_string()
                }
            })
            .into_owned();
    }
    for field in [
        "jwt",
        "csr",
        "public_key",
        "hash",
        "id",
        "ecdh_public",
        "signature",
    ] {
        let re = regex::Regex::new(&format!(r#""{field}":{json_str}"#)).unwrap();
        t = re
            .replace_all(&t, |c: &regex::Captures<'_>| {
                let v = &c[1];
                if field == "jwt" || v.starts_with("-----BEGIN") {
                    format!(r#""{field}":"<{field}>""#)
                } else {
                    format!(r#""{field}":"{}""#, shape(v))
                }
            })
            .into_owned();
    }
    for field in ["time", "timestamp"] {
        let re = regex::Regex::new(&format!(r#""{field}":(\d+|"[^"]*")"#)).unwrap();
        t = re
            .replace_all(&t, |c: &regex::Captures<'_>| {
                format!(r#""{field}":{}"#, shape(&c[1]))
            })
            .into_owned();
    }
    t
}

/// A lifecycle event of `identity`, normalized (it belongs to no request).
fn normalize_event(raw: &[u8], identity: &str, url: &str) -> String {
    let text = std::str::from_utf8(raw)
        .unwrap_or_else(|e| panic!("{identity}: lifecycle event is not UTF-8: {e}"));
    normalize(
        text,
        &Subst {
            identity,
            request_id: NO_REQUEST,
            paths: &[],
        },
        url,
    )
}

/// Compares a real server's lifecycle event with our simulator's, subject and
/// normalized payload; returns the difference, if any.
fn event_diff(
    what: &str,
    (real, (real_subject, real_raw)): (&str, &RawEvent),
    (sim, (sim_subject, sim_raw)): (&str, &RawEvent),
    url: &str,
) -> Option<String> {
    let r = normalize_event(real_raw, real, url);
    let o = normalize_event(sim_raw, sim, url);
    eprintln!("{what} event:\n  real: {real_subject} {r}\n  ours: {sim_subject} {o}");
    (r != o || real_subject != sim_subject).then(|| {
        format!(
            "{what} event ({real} vs {sim}):\n  real: {real_subject} {}\n  ours: {sim_subject} {}",
            String::from_utf8_lossy(real_raw),
            String::from_utf8_lossy(sim_raw)
        )
    })
}

/// A PEM block's layout: armour lines, 64-column body lines, final newline.
fn pem_shape(pem: &str) -> String {
    let lines: Vec<&str> = pem.lines().collect();
    let body = lines
        .get(1..lines.len().saturating_sub(1))
        .unwrap_or_default();
    let full = body.iter().rev().skip(1).all(|l| l.len() == 64);
    format!(
        "{} | body lines 64 columns but the last: {full} | {} | trailing newline: {}",
        lines.first().unwrap_or(&""),
        lines.last().unwrap_or(&""),
        pem.ends_with('\n')
    )
}

/// Compares a real and a simulated reply layer by layer; returns the differences.
fn compare_replies(
    what: &str,
    real: (&Subst<'_>, &[u8]),
    ours: (&Subst<'_>, &[u8]),
    url: &str,
) -> Vec<String> {
    let mut diffs = Vec::new();
    let real_layers = reply_layers(real.1);
    let our_layers = reply_layers(ours.1);
    for ((layer, r), (_, o)) in real_layers.iter().zip(&our_layers) {
        let rn = normalize(r, real.0, url);
        let on = normalize(o, ours.0, url);
        eprintln!("{what} / {layer}:\n  real: {rn}\n  ours: {on}");
        if rn != on {
            diffs.push(format!(
                "{what} / {layer} layer differs:\n  real (normalized): {rn}\n  ours (normalized): {on}\n  real (raw): {r}\n  ours (raw): {o}"
            ));
        }
    }
    // PEM values in the bodies: same armour and layout. (Discovery's body is the
    // bare word `pong`, not JSON: it has none, and its layers were compared above.)
    let (rb, ob) = (&real_layers[3].1, &our_layers[3].1);
    if let (Ok(rv), Ok(ov)) = (
        serde_json::from_str::<Value>(rb),
        serde_json::from_str::<Value>(ob),
    ) {
        for field in ["csr", "public_key"] {
            if let (Some(rp), Some(op)) = (rv["data"][field].as_str(), ov["data"][field].as_str()) {
                if rp.starts_with("-----BEGIN") || op.starts_with("-----BEGIN") {
                    let (rs, os) = (pem_shape(rp), pem_shape(op));
                    eprintln!("{what} / data.{field} PEM:\n  real: {rs}\n  ours: {os}");
                    if rs != os {
                        diffs.push(format!(
                            "{what} / data.{field} PEM layout differs:\n  real: {rp:?}\n  ours: {op:?}"
                        ));
                    }
                }
            }
        }
    }
    diffs
}

/// One request sent, identically, to a real server and to a simulated node.
struct Case {
    what: &'static str,
    agent: &'static str,
    action: &'static str,
    data: Value,
}

impl Case {
    fn new(what: &'static str, agent: &'static str, action: &'static str, data: Value) -> Case {
        Case {
            what,
            agent,
            action,
            data,
        }
    }

    fn payload(&self, target: &str) -> Vec<u8> {
        if self.agent == "discovery" {
            return b"cGluZw==".to_vec();
        }
        // gencsr's cn is the node's own name, as a provisioner sends it.
        let mut data = self.data.clone();
        if self.action == "gencsr" {
            data["cn"] = json!(target);
        }
        choria_wire::json::to_vec(&RpcRequest {
            agent: self.agent,
            action: self.action,
            data: &data,
        })
        .unwrap()
    }
}

/// The real server and the simulated node compared, per protocol version.
const REAL_V1: &str = "real-v1.interop.example.net";
const REAL_V2: &str = "real-v2.interop.example.net";
const SIM_V1: &str = "sim-v1-000.interop.example.net";
const SIM_V2: &str = "sim-v2-000.interop.example.net";

/// Where a side keeps its files, and the placeholder that stands for it.
type Paths = Vec<(String, String)>;

/// The comparison's fixture: per protocol version a real go-choria server and
/// one simulated node, both in provisioning mode, and every difference found.
struct Twins {
    // Fields drop in order: what started last stops first.
    fleet_v1: RunningFleet,
    fleet_v2: RunningFleet,
    go_v2: GoServer,
    go_v1: GoServer,
    /// Subscribed before anything started: the events configure and restart publish.
    later_events: async_nats::Subscriber,
    url: String,
    diffs: Vec<String>,
    peers: RealPeers,
}

/// How one version's requests are signed and who sends them.
struct Caller<'a> {
    version: Version,
    signer: &'a RequestSigner,
    caller: &'a str,
    real: &'static str,
    sim: &'static str,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_simulator_replies_match_real_server_replies() {
    let Some(peers) = RealPeers::start("our_simulator_replies_match_real_server_replies").await
    else {
        return;
    };
    let (mut twins, startups) =
        Twins::given_a_real_server_and_a_simulated_node_per_version(peers).await;
    twins.then_their_startup_events_match(&startups);
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let jwt_bodies = twins.when_every_request_goes_to_both(&nonce).await;
    twins.then_the_events_of_configure_and_restart_match().await;
    twins.then_their_provisioning_jwts_match(&jwt_bodies);
    twins.then_nothing_differs().await;
}

impl Twins {
    /// Starts both pairs and waits for their startup events, returned raw.
    async fn given_a_real_server_and_a_simulated_node_per_version(
        mut peers: RealPeers,
    ) -> (Twins, BTreeMap<String, RawEvent>) {
        let later_events = peers
            .conn
            .subscribe("choria.lifecycle.event.*.provision_mode_server")
            .await
            .unwrap();
        peers.conn.flush().await.unwrap();

        let (real_v1, real_v2, sim_v1, sim_v2) = (REAL_V1, REAL_V2, SIM_V1, SIM_V2);
        let go_v1 = peers.go_server(real_v1, Version::V1);
        let go_v2 = peers.go_server(real_v2, Version::V2);
        let simulated = |version: Version| {
            let prefix = format!("sim-{version}-");
            let signer = peers.signers.signing_key(version).to_path_buf();
            move |o: &mut FleetOptions| {
                o.nodes = 1;
                o.connections = 1;
                o.protocol = version;
                o.identity_prefix = prefix;
                o.identity_suffix = ".interop.example.net".into();
                o.jwt_signer = Some(signer);
            }
        };
        let fleet_v1 = start_fleet(&peers.nats, peers.work.path(), simulated(Version::V1)).await;
        let fleet_v2 = start_fleet(&peers.nats, peers.work.path(), simulated(Version::V2)).await;
        assert_eq!(fleet_v1.identities, [sim_v1]);
        assert_eq!(fleet_v2.identities, [sim_v2]);
        let events = wait_for_startups(
            &mut peers.startups,
            &[real_v1, real_v2, sim_v1, sim_v2],
            &[&go_v1, &go_v2],
        )
        .await;

        let url = peers.nats.url();
        let twins = Twins {
            peers,
            go_v1,
            go_v2,
            fleet_v1,
            fleet_v2,
            later_events,
            url,
            diffs: Vec::new(),
        };
        (twins, events)
    }

    /// Where each side keeps its files: the real server next to its config, the
    /// simulator under /etc/choria-fleet/<identity>.
    fn paths_of(&self, real: &str, sim: &str) -> (Paths, Paths) {
        (
            vec![(
                self.peers.work.path().join(real).display().to_string(),
                "<CONFIG-DIR>".to_string(),
            )],
            vec![(
                format!("/etc/choria-fleet/{sim}"),
                "<CONFIG-DIR>".to_string(),
            )],
        )
    }

    fn then_their_startup_events_match(&mut self, events: &BTreeMap<String, RawEvent>) {
        let url = self.url.clone();
        let diffs = &mut self.diffs;
        let (real_v1, real_v2, sim_v1, sim_v2) = (REAL_V1, REAL_V2, SIM_V1, SIM_V2);
        // Startup events: the same CloudEvent, byte for byte, but for ids, times and names.
        for (real, sim) in [(real_v1, sim_v1), (real_v2, sim_v2)] {
            diffs.extend(event_diff(
                "startup",
                (real, &events[real]),
                (sim, &events[sim]),
                &url,
            ));
        }
    }

    /// Sends every request of `cases` to both sides of both versions; the
    /// bodies of the successful `jwt` replies, by sender.
    async fn when_every_request_goes_to_both(
        &mut self,
        nonce: &str,
    ) -> BTreeMap<&'static str, Value> {
        let peers = &self.peers;
        let (v2_seed, v2_jwt) = v2_caller(&peers.bin, peers.work.path(), &peers.signers);
        let v1_signer = RequestSigner::V1Insecure;
        let v2_signer = RequestSigner::V2 {
            seed: Box::new(v2_seed),
            jwt: v2_jwt,
        };
        let v1_caller = format!("choria={PROVISIONER}");
        let config =
            json!({"plugin.choria.server.provision": "false", "loglevel": "info"}).to_string();
        let cases = cases(nonce, &config);
        let mut jwt_bodies: BTreeMap<&'static str, Value> = BTreeMap::new();
        let (real_v1, real_v2, sim_v1, sim_v2) = (REAL_V1, REAL_V2, SIM_V1, SIM_V2);
        for (version, signer, caller, real, sim) in [
            (Version::V1, &v1_signer, v1_caller.as_str(), real_v1, sim_v1),
            (Version::V2, &v2_signer, "provisioner", real_v2, sim_v2),
        ] {
            let to = Caller {
                version,
                signer,
                caller,
                real,
                sim,
            };
            for case in &cases {
                self.send_to_both(&to, case, nonce, &mut jwt_bodies).await;
            }
        }
        jwt_bodies
    }

    /// One request to the real server and the simulated node of one version.
    async fn send_to_both(
        &mut self,
        to: &Caller<'_>,
        case: &Case,
        nonce: &str,
        jwt_bodies: &mut BTreeMap<&'static str, Value>,
    ) {
        let Caller {
            version,
            signer,
            caller,
            real,
            sim,
        } = *to;
        let (peers, url) = (&self.peers, self.url.clone());
        let (real_paths, sim_paths) = self.paths_of(real, sim);
        let (real_req, real_raw) = raw_request(
            &peers.conn,
            signer,
            caller,
            real,
            case.agent,
            &case.payload(real),
            &url,
        )
        .await;
        let (sim_req, sim_raw) = raw_request(
            &peers.conn,
            signer,
            caller,
            sim,
            case.agent,
            &case.payload(sim),
            &url,
        )
        .await;
        // Both decode with our decoder (hash verified) and come from the right sender.
        let rr = protocol::decode_reply(&real_raw).unwrap();
        let sr = protocol::decode_reply(&sim_raw).unwrap();
        assert_eq!(
            (rr.version, rr.sender.as_str(), rr.request_id.as_str()),
            (version, real, real_req.as_str())
        );
        assert_eq!(
            (sr.version, sr.sender.as_str(), sr.request_id.as_str()),
            (version, sim, sim_req.as_str())
        );
        if case.action == "inventory" {
            assert_eq!(
                rr.message,
                sr.message,
                "{version} inventory bodies must be byte-identical:\n real: {}\n ours: {}",
                String::from_utf8_lossy(&rr.message),
                String::from_utf8_lossy(&sr.message)
            );
        }
        if case.what == "choria_provision#jwt" {
            jwt_bodies.insert(real, serde_json::from_slice(&rr.message).unwrap());
            jwt_bodies.insert(sim, serde_json::from_slice(&sr.message).unwrap());
        }
        if case.action == "gen25519" {
            for m in [&rr.message, &sr.message] {
                let b: Value = serde_json::from_slice(m).unwrap();
                ed25519::verify_nonce(
                    b["data"]["public_key"].as_str().unwrap_or_default(),
                    nonce,
                    b["data"]["signature"].as_str().unwrap_or_default(),
                )
                .unwrap_or_else(|e| panic!("{version} gen25519: {e}: {b}"));
            }
        }
        self.diffs.extend(compare_replies(
            &format!("{version} {}", case.what),
            (
                &Subst {
                    identity: real,
                    request_id: &real_req,
                    paths: &real_paths,
                },
                &real_raw,
            ),
            (
                &Subst {
                    identity: sim,
                    request_id: &sim_req,
                    paths: &sim_paths,
                },
                &sim_raw,
            ),
            &url,
        ));
    }

    /// The lifecycle events configure and restart publish.
    async fn then_the_events_of_configure_and_restart_match(&mut self) {
        let (real_v1, real_v2, sim_v1, sim_v2) = (REAL_V1, REAL_V2, SIM_V1, SIM_V2);
        let (go_v1, go_v2, url) = (&self.go_v1, &self.go_v2, self.url.clone());
        let later_events = &mut self.later_events;
        let diffs = &mut self.diffs;
        let later = collect_events(
            later_events,
            &[
                (EventType::Provisioned, real_v1),
                (EventType::Provisioned, sim_v1),
                (EventType::Shutdown, real_v1),
                (EventType::Shutdown, sim_v1),
                (EventType::Provisioned, real_v2),
                (EventType::Provisioned, sim_v2),
                (EventType::Shutdown, real_v2),
                (EventType::Shutdown, sim_v2),
            ],
            &[go_v1, go_v2],
            LATER_EVENTS_TIMEOUT,
        )
        .await;
        for kind in [EventType::Provisioned, EventType::Shutdown] {
            for (real, sim) in [(real_v1, sim_v1), (real_v2, sim_v2)] {
                diffs.extend(event_diff(
                    kind.name(),
                    (real, &later[&(kind, real.to_string())]),
                    (sim, &later[&(kind, sim.to_string())]),
                    &url,
                ));
            }
        }
    }

    fn then_their_provisioning_jwts_match(&mut self, jwt_bodies: &BTreeMap<&'static str, Value>) {
        let (real_v1, real_v2, sim_v1, sim_v2) = (REAL_V1, REAL_V2, SIM_V1, SIM_V2);
        let diffs = &mut self.diffs;
        // The provisioning JWTs themselves: same header and claims, byte for byte,
        // but for the times (same validity) and the KSUID.
        let volatile_claims = regex::Regex::new(r#""(exp|nbf|iat|jti)":("[^"]*"|\d+)"#).unwrap();
        for (real, sim) in [(real_v1, sim_v1), (real_v2, sim_v2)] {
            use base64::engine::general_purpose::URL_SAFE_NO_PAD;
            use base64::Engine;
            let parts = |v: &Value| -> (String, String, Value) {
                let jwt = v["data"]["jwt"].as_str().unwrap();
                let mut it = jwt.split('.');
                let mut dec = || {
                    String::from_utf8(URL_SAFE_NO_PAD.decode(it.next().unwrap()).unwrap()).unwrap()
                };
                let (h, c) = (dec(), dec());
                let parsed = serde_json::from_str(&c).unwrap();
                (h, c, parsed)
            };
            let (rh, rc, rv) = parts(&jwt_bodies[real]);
            let (oh, oc, ov) = parts(&jwt_bodies[sim]);
            let strip = |c: &str| {
                volatile_claims
                    .replace_all(c, |m: &regex::Captures<'_>| {
                        format!(r#""{}":{}"#, &m[1], shape(&m[2]))
                    })
                    .into_owned()
            };
            let validity = |v: &Value| v["exp"].as_i64().unwrap() - v["iat"].as_i64().unwrap();
            eprintln!("provisioning JWT:\n  real: {rh} {rc}\n  ours: {oh} {oc}");
            if rh != oh || strip(&rc) != strip(&oc) || validity(&rv) != validity(&ov) {
                diffs.push(format!(
                "provisioning JWT ({real} vs {sim}):\n  real header {rh} claims {rc}\n  ours header {oh} claims {oc}"
            ));
            }
        }
    }

    async fn then_nothing_differs(self) {
        let (fleet_v1, fleet_v2, diffs) = (self.fleet_v1, self.fleet_v2, self.diffs);
        fleet_v1.finish().await;
        fleet_v2.finish().await;
        assert!(
            diffs.is_empty(),
            "{} difference(s) between real go-choria and our simulator:\n\n{}",
            diffs.len(),
            diffs.join("\n\n")
        );
    }
}

/// The requests, in the order a provisioner sends them; restart last (the
/// real server then leaves provisioning mode). `config` is what configure sends.
fn cases(nonce: &str, config: &str) -> [Case; 9] {
    [
        Case::new("discovery ping", "discovery", "", json!(null)),
        Case::new("rpcutil#inventory", "rpcutil", "inventory", json!({})),
        Case::new(
            "choria_provision#jwt, wrong token",
            "choria_provision",
            "jwt",
            json!({"token": "wrong"}),
        ),
        Case::new(
            "choria_provision#jwt",
            "choria_provision",
            "jwt",
            json!({"token": TOKEN}),
        ),
        Case::new(
            "choria_provision#bogus (unknown action)",
            "choria_provision",
            "bogus",
            json!({"token": TOKEN}),
        ),
        Case::new(
            "choria_provision#gen25519",
            "choria_provision",
            "gen25519",
            json!({"nonce": nonce, "token": TOKEN}),
        ),
        Case::new(
            "choria_provision#gencsr",
            "choria_provision",
            "gencsr",
            json!({"token": TOKEN}),
        ),
        Case::new(
            "choria_provision#configure",
            "choria_provision",
            "configure",
            json!({"config": config, "token": TOKEN}),
        ),
        Case::new(
            "choria_provision#restart",
            "choria_provision",
            "restart",
            json!({"splay": 1, "token": TOKEN}),
        ),
    ]
}

/// `normalize`'s request id for texts that belong to no request.
const NO_REQUEST: &str = "\u{1}";

#[test]
fn normalize_keeps_key_order_and_hides_only_volatile_values() {
    let paths = vec![("/srv/n1".to_string(), "<CONFIG-DIR>".to_string())];
    let sub = Subst {
        identity: "n1",
        request_id: "abc",
        paths: &paths,
    };
    let a = normalize(
        r#"{"protocol":"p","message":"pong","envelope":{"requestid":"abc","senderid":"n1","agent":"discovery","time":17}}"#,
        &sub,
        "nats://x",
    );
    assert_eq!(
        a,
        r#"{"protocol":"p","message":"pong","envelope":{"requestid":"<REQUEST-ID>","senderid":"<IDENTITY>","agent":"discovery","time":xx}}"#
    );
    // Key order and value lengths still count.
    assert_ne!(
        normalize(r#"{"protocol":"p","message":"pong"}"#, &sub, "nats://x"),
        normalize(r#"{"message":"pong","protocol":"p"}"#, &sub, "nats://x")
    );
    assert_ne!(
        normalize(r#"{"time":1796042984}"#, &sub, "nats://x"),
        normalize(r#"{"time":1796042984000000000}"#, &sub, "nats://x")
    );
    assert_eq!(
        normalize(
            r#"{"directory":"/srv/n1","hash":"kzk9+d/=","id":"3Mp"}"#,
            &sub,
            "u"
        ),
        r#"{"directory":"<CONFIG-DIR>","hash":"xxxxxxx=","id":"xxx"}"#
    );
    let prose = r#"{"message":"Wrote 3 lines to /srv/n1/server.conf, a long enough text"}"#;
    assert_eq!(
        normalize(prose, &sub, "nats://x"),
        r#"{"message":"Wrote 3 lines to <CONFIG-DIR>/server.conf, a long enough text"}"#
    );
    assert_eq!(
        pem_shape("-----BEGIN X-----\nabc\n-----END X-----\n"),
        "-----BEGIN X----- | body lines 64 columns but the last: true | -----END X----- | trailing newline: true"
    );
}

/// go-choria's provisioning lock as a real server keeps it, and our
/// simulator the same way: keyed on `<senderid>.<callerid>`, taken by the
/// five locked actions, checked before the token (a wrong token still
/// holds it), not taken by unlocked ones, refused with statuscode 1 "Could
/// not obtain provisioning lock".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_keeps_the_provisioning_lock_as_a_real_server_does() {
    let Some(mut peers) =
        RealPeers::start("the_simulator_keeps_the_provisioning_lock_as_a_real_server_does").await
    else {
        return;
    };
    let real = "real-lock.interop.example.net";
    let go = peers.go_server(real, Version::V1);
    let signer = peers.signers.signing_key(Version::V1).to_path_buf();
    let fleet = start_fleet(&peers.nats, peers.work.path(), |o| {
        o.nodes = 1;
        o.connections = 1;
        o.identity_prefix = "sim-lock-".into();
        o.identity_suffix = ".interop.example.net".into();
        o.jwt_signer = Some(signer);
    })
    .await;
    let sim = fleet.identities[0].clone();
    wait_for_startups(&mut peers.startups, &[real, &sim], &[&go]).await;
    let caller = |identity: &str, caller: &str| {
        ChoriaClient::new(
            peers.conn.clone(),
            Identity {
                identity: identity.into(),
                caller: caller.into(),
                signer: RequestSigner::V1Insecure,
            },
        )
    };
    let a = caller("replica-a.example.net", "choria=provisioner");
    let b = caller("replica-b.example.net", "choria=provisioner");
    let a_other_caller = caller("replica-a.example.net", "choria=someone-else");
    let good = json!({"token": TOKEN});
    let wrong = json!({"token": "wrong"});
    let none = json!({});
    let steps: Vec<(&str, &ChoriaClient, &str, &str, &Value)> = vec![
        ("a takes the lock", &a, "choria_provision", "jwt", &good),
        ("b is refused", &b, "choria_provision", "jwt", &good),
        (
            "b is refused before its token is checked",
            &b,
            "choria_provision",
            "jwt",
            &wrong,
        ),
        (
            "the key is sender and caller",
            &a_other_caller,
            "choria_provision",
            "jwt",
            &good,
        ),
        (
            "the holder gets the token error",
            &a,
            "choria_provision",
            "jwt",
            &wrong,
        ),
        ("unlocked actions pass", &b, "rpcutil", "inventory", &none),
        ("the holder keeps it", &a, "choria_provision", "jwt", &good),
    ];
    let mut outcomes = Vec::new();
    for node in [real, sim.as_str()] {
        let mut seen = Vec::new();
        for (what, c, agent, action, data) in &steps {
            let r = rpc(c, node, agent, action, data).await;
            seen.push((*what, r.body.statuscode, r.body.statusmsg.clone()));
        }
        outcomes.push(seen);
    }
    for (what, code, msg) in &outcomes[0] {
        println!("real: {what}: {code:?} {msg:?}");
    }
    assert_eq!(outcomes[0][1].2, "Could not obtain provisioning lock");
    assert_eq!(outcomes[0][1].1, StatusCode::Aborted);
    assert_eq!(outcomes[0][4].2, "Incorrect provision token supplied");
    assert_eq!(
        outcomes[0], outcomes[1],
        "the simulator answers every step as the real server does"
    );
    drop(fleet);
}

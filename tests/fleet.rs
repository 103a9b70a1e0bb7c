//! The fleet simulator against a real nats-server, driven by our Choria client.

mod support;

use choria_provisioner::choria::client::{
    self, ChoriaClient, ClientError, ConnectOptions, DiscoveryOptions, Identity,
};
use choria_provisioner::choria::filter::Filter;
use choria_provisioner::choria::lifecycle::{self, EventType};
use choria_provisioner::choria::mcorpc::StatusCode;
use choria_provisioner::choria::protocol::{RequestSigner, Version};
use choria_provisioner::choria::security::{csr, ecdh::EcdhKeyPair, ed25519, pem_crypt, tokens};
use choria_provisioner::fleet::{self, FleetOptions};
use futures::StreamExt;
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use support::{read_journal, NatsServer};

const TOKEN: &str = "s3cret";

struct Fleet {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<fleet::FleetSummary>,
    journal: PathBuf,
    signer_public: String,
    _dir: tempfile::TempDir,
}

impl Fleet {
    async fn finish(mut self) -> (fleet::FleetSummary, Vec<serde_json::Value>) {
        let _ = self.stop.take().unwrap().send(());
        let summary = self.handle.await.unwrap();
        (summary, read_journal(&self.journal))
    }
}

async fn start_fleet(nats: &NatsServer, tweak: impl FnOnce(&mut FleetOptions)) -> Fleet {
    let dir = tempfile::tempdir().unwrap();
    let signer = ed25519::Ed25519KeyPair::generate();
    let seed_path = dir.path().join("signer.seed");
    std::fs::write(&seed_path, signer.seed_hex()).unwrap();
    let journal = dir.path().join("journal.jsonl");
    let mut opts = FleetOptions {
        nats: vec![nats.url()],
        nodes: 5,
        token: TOKEN.into(),
        jwt_signer: Some(seed_path),
        journal: Some(journal.clone()),
        key_pool_size: 2,
        connections: 2,
        ..Default::default()
    };
    tweak(&mut opts);
    let expected = opts.nodes;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        fleet::run(opts, async {
            let _ = rx.await;
        })
        .await
        .expect("fleet runs")
    });
    // The fleet is ready once every node has announced itself.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let started = read_journal(&journal)
            .iter()
            .filter(|e| e["kind"] == "event" && e["event"] == "startup")
            .count();
        if started >= expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "fleet did not start ({started}/{expected} startup events)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Fleet {
        stop: Some(tx),
        handle,
        journal,
        signer_public: signer.public_hex(),
        _dir: dir,
    }
}

async fn client_for(nats: &NatsServer, version: Version, identity: &str) -> ChoriaClient {
    let conn = client::connect(&ConnectOptions {
        servers: vec![nats.url()],
        name: identity.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let (signer, caller) = match version {
        Version::V1 => (RequestSigner::V1Insecure, format!("choria={identity}")),
        Version::V2 => (
            RequestSigner::V2 {
                seed: Box::new(ed25519_dalek::SigningKey::from_bytes(&[9u8; 32])),
                jwt: "a.caller.jwt".into(),
            },
            "provisioner_signer".to_string(),
        ),
    };
    ChoriaClient::new(
        conn,
        Identity {
            identity: identity.into(),
            caller,
            signer,
        },
    )
}

async fn discover(c: &ChoriaClient) -> Vec<String> {
    c.discover(
        &Filter::with_agent("choria_provision"),
        DiscoveryOptions::default(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn discovery_finds_every_node_and_inventory_matches_go_choria() {
    for version in [Version::V1, Version::V2] {
        let nats = NatsServer::start();
        let fleet = start_fleet(&nats, |o| {
            o.nodes = 20;
            o.protocol = version;
        })
        .await;
        let c = client_for(&nats, version, "provisioner.example.net").await;
        let found = discover(&c).await;
        assert_eq!(found.len(), 20, "{version}: {found:?}");
        assert_eq!(found[0], "node-000.fleet.example.net");

        let inv = c
            .rpc(&found[3], "rpcutil", "inventory", &json!({}))
            .await
            .unwrap();
        assert_eq!(inv.body.statuscode, StatusCode::Ok);
        assert_eq!(inv.reply.sender, found[3]);
        assert_eq!(
            String::from_utf8(inv.reply.message.clone()).unwrap(),
            r#"{"action":"inventory","statuscode":0,"statusmsg":"OK","data":{"agents":["choria_provision","choria_util","discovery","rpcutil"],"classes":[],"collectives":["provisioning"],"data_plugins":[],"facts":{},"machines":[],"main_collective":"provisioning","version":"0.30.2","upgradable":false}}"#,
            "{version}: the inventory body is byte-identical to a real go-choria 0.30.2 reply"
        );

        // A client of the other protocol version finds nobody, as with real servers.
        let other = if version == Version::V1 {
            Version::V2
        } else {
            Version::V1
        };
        let c2 = client_for(&nats, other, "other.example.net").await;
        assert!(
            discover(&c2).await.is_empty(),
            "{other} client must not discover {version} nodes"
        );
        fleet.finish().await;
    }
}

#[tokio::test]
async fn every_node_announces_startup_in_cloudevents_format() {
    let nats = NatsServer::start();
    let conn = client::connect(&ConnectOptions {
        servers: vec![nats.url()],
        ..Default::default()
    })
    .await
    .unwrap();
    let mut sub = client::subscribe_events(&conn, EventType::Startup, "provision_mode_server")
        .await
        .unwrap();
    conn.flush().await.unwrap();
    let fleet = start_fleet(&nats, |o| o.nodes = 7).await;
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 7 {
        let msg = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .expect("startup events arrive")
            .unwrap();
        let raw: serde_json::Value = serde_json::from_slice(&msg.payload).unwrap();
        assert_eq!(raw["specversion"], "1.0");
        assert_eq!(raw["source"], "io.choria.lifecycle");
        let (kind, event) = lifecycle::parse(&msg.payload).unwrap();
        assert_eq!(kind, EventType::Startup);
        assert_eq!(event.version.as_deref(), Some("0.30.2"));
        seen.insert(event.identity);
    }
    fleet.finish().await;
}

/// Drives one node through the whole sequence the Go provisioner runs and checks
/// every reply the way the provisioner would.
async fn provision_one(version: Version) {
    let nats = NatsServer::start();
    let fleet = start_fleet(&nats, |o| {
        o.nodes = 3;
        o.protocol = version;
    })
    .await;
    let c = client_for(&nats, version, "provisioner.example.net").await;
    let node = "node-001.fleet.example.net";

    let conn = c.nats().clone();
    let mut server_startups = client::subscribe_events(&conn, EventType::Startup, "server")
        .await
        .unwrap();
    let mut shutdowns =
        client::subscribe_events(&conn, EventType::Shutdown, "provision_mode_server")
            .await
            .unwrap();
    conn.flush().await.unwrap();

    // jwt: a provisioning token signed by the fleet's signer, and an ECDH key.
    let r = c
        .rpc(node, "choria_provision", "jwt", &json!({"token": TOKEN}))
        .await
        .unwrap();
    assert!(r.body.is_ok(), "{:?}", r.body);
    let jwt = r.body.data["jwt"].as_str().unwrap();
    let key = tokens::TokenVerifyKey::from_setting(&fleet.signer_public).unwrap();
    let claims = tokens::parse_provisioning_token(jwt, &key).unwrap();
    assert_eq!(claims.token, TOKEN);
    assert!(claims.prov_default);
    assert_eq!(claims.proto_v2, version == Version::V2);
    let node_ecdh = r.body.data["ecdh_public"].as_str().unwrap().to_string();
    assert_eq!(node_ecdh.len(), 64);

    // gen25519: the nonce signature verifies with the returned key.
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let r = c
        .rpc(
            node,
            "choria_provision",
            "gen25519",
            &json!({"nonce": nonce, "token": TOKEN}),
        )
        .await
        .unwrap();
    assert!(r.body.is_ok(), "{:?}", r.body);
    ed25519::verify_nonce(
        r.body.data["public_key"].as_str().unwrap(),
        &nonce,
        r.body.data["signature"].as_str().unwrap(),
    )
    .unwrap();

    // gencsr: a real CSR for the identity that passes the provisioner's checks.
    let r = c
        .rpc(
            node,
            "choria_provision",
            "gencsr",
            &json!({"cn": node, "token": TOKEN}),
        )
        .await
        .unwrap();
    assert!(r.body.is_ok(), "{:?}", r.body);
    let info = csr::parse_csr(r.body.data["csr"].as_str().unwrap()).unwrap();
    info.verify_signature().unwrap();
    csr::validate_csr_names(&info, node, &csr::default_deny_list()).unwrap();
    assert!(r.body.data["public_key"]
        .as_str()
        .unwrap()
        .starts_with("-----BEGIN PUBLIC KEY-----"));

    // configure with a private key encrypted to the node's ECDH key.
    let ours = EcdhKeyPair::generate();
    let shared = ours.shared_secret(&node_ecdh).unwrap();
    let rsa_key = csr::generate_rsa_key(1024).unwrap();
    let key_pem = csr::private_key_pkcs1_pem(&rsa_key).unwrap();
    let encrypted = pem_crypt::encrypt_private_key(&key_pem, &shared).unwrap();
    let config = json!({"plugin.choria.server.provision": "false", "identity": node}).to_string();
    let r = c
        .rpc(
            node,
            "choria_provision",
            "configure",
            &json!({
                "action_policies": {}, "ca": "-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n",
                "certificate": "-----BEGIN CERTIFICATE-----\ncert\n-----END CERTIFICATE-----\n",
                "config": config, "ecdh_public": ours.public_hex(), "key": encrypted,
                "opa_policies": {}, "server_jwt": "", "ssldir": "/etc/choria/ssl", "token": TOKEN
            }),
        )
        .await
        .unwrap();
    assert!(r.body.is_ok(), "{:?}", r.body);
    assert_eq!(
        r.body.data["message"],
        "Wrote 3 lines to /etc/choria-fleet/node-001.fleet.example.net/server.conf"
    );

    // restart: the node leaves provisioning within the splay (2 s) plus one second.
    let r = c
        .rpc(
            node,
            "choria_provision",
            "restart",
            &json!({"splay": 1, "token": TOKEN}),
        )
        .await
        .unwrap();
    assert!(r.body.is_ok(), "{:?}", r.body);
    assert_eq!(r.body.data["message"], "Restarting Choria Server after 2s");
    let restarted_at = Instant::now();
    let shutdown = tokio::time::timeout(Duration::from_secs(2), shutdowns.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        lifecycle::parse(&shutdown.payload).unwrap().1.identity,
        node
    );
    let startup = tokio::time::timeout(Duration::from_secs(4), server_startups.next())
        .await
        .expect("a startup event for component server after the restart")
        .unwrap();
    assert_eq!(lifecycle::parse(&startup.payload).unwrap().1.identity, node);
    assert!(restarted_at.elapsed() < Duration::from_secs(3));
    let found = discover(&c).await;
    assert!(
        !found.contains(&node.to_string()),
        "provisioned node still answers: {found:?}"
    );
    assert_eq!(found.len(), 2);
    let gone = c
        .rpc_with_timeout(
            node,
            "rpcutil",
            "inventory",
            &json!({}),
            Duration::from_millis(500),
        )
        .await;
    assert!(matches!(gone, Err(ClientError::Timeout { .. })));

    let (summary, journal) = fleet.finish().await;
    assert_eq!(summary.provisioned, 1);
    let last = journal
        .iter()
        .rev()
        .find(|e| e["kind"] == "final" && e["node"] == node)
        .unwrap();
    assert_eq!(last["state"], "provisioned");
    assert_eq!(last["has_private_key"], true);
    assert_eq!(last["has_certificate"], true);
    assert_eq!(last["provision_disabled"], true);
    assert_eq!(last["restarts"], 1);
    let actions: Vec<&str> = journal
        .iter()
        .filter(|e| e["kind"] == "action" && e["node"] == node)
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["jwt", "gen25519", "gencsr", "configure", "restart"]
    );
    assert!(journal
        .iter()
        .filter(|e| e["kind"] == "action" && e["node"] == node)
        .all(|e| e["outcome"] == "ok" && e["caller"] == c.identity().caller.as_str()));
}

#[tokio::test]
async fn v1_node_is_provisioned_through_the_whole_sequence() {
    provision_one(Version::V1).await;
}

#[tokio::test]
async fn v2_node_is_provisioned_through_the_whole_sequence() {
    provision_one(Version::V2).await;
}

#[tokio::test]
async fn restart_without_provision_false_comes_back_into_provisioning() {
    let nats = NatsServer::start();
    let fleet = start_fleet(&nats, |o| o.nodes = 1).await;
    let c = client_for(&nats, Version::V1, "provisioner.example.net").await;
    let node = "node-000.fleet.example.net";
    let r = c
        .rpc(
            node,
            "choria_provision",
            "configure",
            &json!({"config": "{\"identity\":\"x\"}", "token": TOKEN}),
        )
        .await
        .unwrap();
    assert!(r.body.is_ok(), "{:?}", r.body);
    let r = c
        .rpc(
            node,
            "choria_provision",
            "restart",
            &json!({"splay": 1, "token": TOKEN}),
        )
        .await
        .unwrap();
    assert!(r.body.is_ok());
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(
        discover(&c).await,
        [node],
        "the node re-entered provisioning"
    );
    let (_, journal) = fleet.finish().await;
    let fin = journal.iter().find(|e| e["kind"] == "final").unwrap();
    assert_eq!(fin["state"], "provisioning");
    assert_eq!(fin["restarts"], 1);
}

#[tokio::test]
async fn bad_token_lock_and_invalid_data_get_go_choria_status_codes() {
    let nats = NatsServer::start();
    let fleet = start_fleet(&nats, |o| o.nodes = 1).await;
    let c = client_for(&nats, Version::V1, "provisioner.example.net").await;
    let node = "node-000.fleet.example.net";

    let r = c
        .rpc(node, "choria_provision", "jwt", &json!({"token": "wrong"}))
        .await
        .unwrap();
    assert_eq!(r.body.statuscode, StatusCode::Aborted);
    assert_eq!(r.body.statusmsg, "Incorrect provision token supplied");

    // The first caller now holds the provisioning lock; a second one is refused.
    let other = client_for(&nats, Version::V1, "other-provisioner.example.net").await;
    let r = other
        .rpc(node, "choria_provision", "jwt", &json!({"token": TOKEN}))
        .await
        .unwrap();
    assert_eq!(r.body.statuscode, StatusCode::Aborted);
    assert_eq!(r.body.statusmsg, "Could not obtain provisioning lock");
    // restart is not locked.
    let r = other
        .rpc(
            node,
            "choria_provision",
            "restart",
            &json!({"token": "wrong"}),
        )
        .await
        .unwrap();
    assert_eq!(r.body.statusmsg, "Incorrect provision token supplied");

    let r = c
        .rpc(node, "choria_provision", "jwt", &json!({"token": 42}))
        .await
        .unwrap();
    assert_eq!(r.body.statuscode, StatusCode::InvalidData);
    assert!(r
        .body
        .statusmsg
        .starts_with("Could not parse request data for choria_provision#jwt: "));

    let r = c
        .rpc(node, "choria_provision", "bogus", &json!({}))
        .await
        .unwrap();
    assert_eq!(r.body.statuscode, StatusCode::UnknownAction);
    assert_eq!(
        r.body.statusmsg,
        "Unknown action bogus for agent choria_provision"
    );

    let r = c
        .rpc(
            node,
            "choria_provision",
            "configure",
            &json!({"config": "not json", "token": TOKEN}),
        )
        .await
        .unwrap();
    assert_eq!(r.body.statuscode, StatusCode::Aborted);
    assert!(
        r.body
            .statusmsg
            .starts_with("Could not decode configuration data: "),
        "{}",
        r.body.statusmsg
    );

    // An agent the node does not have gets no reply at all.
    let r = c
        .rpc_with_timeout(
            node,
            "puppet",
            "status",
            &json!({}),
            Duration::from_millis(700),
        )
        .await;
    assert!(matches!(r, Err(ClientError::Timeout { .. })), "{r:?}");
    fleet.finish().await;
}

#[tokio::test]
async fn requests_outside_the_ttl_window_and_garbage_are_dropped_silently() {
    use choria_provisioner::choria::protocol::RequestSpec;
    use choria_provisioner::choria::subjects;
    let nats = NatsServer::start();
    let fleet = start_fleet(&nats, |o| o.nodes = 1).await;
    let conn = client::connect(&ConnectOptions {
        servers: vec![nats.url()],
        ..Default::default()
    })
    .await
    .unwrap();
    let node = "node-000.fleet.example.net";
    let id = choria_provisioner::choria::ids::v1_request_id();
    let reply_to = subjects::reply("provisioning", "choria=old", &id);
    let mut sub = conn.subscribe(reply_to.clone()).await.unwrap();
    let filter = Filter::with_agent("rpcutil");
    let old = client::now_nanos() - 61 * 1_000_000_000;
    let msg = RequestSigner::V1Insecure
        .encode_request(&RequestSpec {
            id: &id,
            sender: "old",
            caller: "choria=old",
            collective: "provisioning",
            agent: "rpcutil",
            ttl: 60,
            time_nanos: old,
            filter: &filter,
            payload: br#"{"agent":"rpcutil","action":"inventory","data":{}}"#,
            reply_to: &reply_to,
            connected_url: "",
        })
        .unwrap();
    let subject = subjects::node("provisioning", node);
    conn.publish(subject.clone(), msg.into()).await.unwrap();
    conn.publish(subject.clone(), "garbage".into())
        .await
        .unwrap();
    conn.publish(
        subject,
        r#"{"protocol":"choria:transport:1","data":"e30=","headers":{}}"#.into(),
    )
    .await
    .unwrap();
    conn.flush().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(800), sub.next())
            .await
            .is_err(),
        "a request older than its TTL must not be answered"
    );
    let (_, journal) = fleet.finish().await;
    let dropped: Vec<&serde_json::Value> = journal
        .iter()
        .filter(|e| e["outcome"] == "dropped")
        .collect();
    assert_eq!(dropped.len(), 3, "{dropped:?}");
    assert!(dropped
        .iter()
        .any(|e| e["statusmsg"].as_str().unwrap().contains("TTL")));
    assert!(dropped
        .iter()
        .any(|e| e["statusmsg"].as_str().unwrap().contains("not valid JSON")));
    assert!(dropped
        .iter()
        .any(|e| e["statusmsg"].as_str().unwrap().contains("secure request")));
}

#[tokio::test]
async fn failure_injection_makes_silent_erroring_and_malformed_nodes() {
    let nats = NatsServer::start();
    let fleet = start_fleet(&nats, |o| {
        o.nodes = 12;
        o.fail_silent = 0.25;
        o.fail_error = 0.25;
        o.fail_malformed = 0.25;
    })
    .await;
    let c = client_for(&nats, Version::V1, "provisioner.example.net").await;
    let found = discover(&c).await;
    assert_eq!(found.len(), 9, "silent nodes are not discovered: {found:?}");
    let (mut ok, mut errors, mut malformed) = (0, 0, 0);
    for node in &found {
        match c
            .rpc(node, "choria_provision", "jwt", &json!({"token": TOKEN}))
            .await
        {
            Ok(r) if r.body.is_ok() => ok += 1,
            Ok(r) => {
                assert_eq!(r.body.statuscode, StatusCode::Aborted);
                errors += 1
            }
            Err(ClientError::BadReply { reason, .. }) => {
                assert!(reason.contains("hash mismatch"), "{reason}");
                malformed += 1
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!((ok, errors, malformed), (3, 3, 3));
    let (_, journal) = fleet.finish().await;
    let injected = journal
        .iter()
        .filter(|e| e["kind"] == "final" && e.get("injected_failure").is_some())
        .count();
    assert_eq!(injected, 9);
}

#[tokio::test]
async fn fleet_connects_over_tls_when_the_url_asks_for_it() {
    let nats = NatsServer::start_tls_available();
    let tls_url = format!("tls://127.0.0.1:{}", nats.port);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("j.jsonl");
    let opts = FleetOptions {
        nats: vec![tls_url],
        nodes: 2,
        journal: Some(journal.clone()),
        key_pool_size: 1,
        duration: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    let summary = fleet::run(opts, std::future::pending()).await.unwrap();
    assert_eq!(summary.nodes, 2);
    let events = read_journal(&journal)
        .into_iter()
        .filter(|e| e["event"] == "startup")
        .count();
    assert_eq!(events, 2);
}

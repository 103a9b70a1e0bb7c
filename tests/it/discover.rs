//! `choria-provisioner discover` as a user runs it, against the simulated
//! fleet on a real nats-server: what it prints (every provisioning-mode
//! node once on stdout, the count on stderr, `--inventory N` replies), who
//! it says it is (`--identity`, `--caller`, a v2 client JWT's `callerid`, as
//! the nodes' journal records them) and how it refuses bad options.

use crate::support::provisioner::binary;
use crate::support::{NatsServer, RunningFleet};
use choria_fleet::FleetOptions;
use choria_wire::client::BrokerOptions;
use choria_wire::protocol::Version;
use choria_wire::security::ed25519::Ed25519KeyPair;
use choria_wire::security::tokens::TokenSigningKey;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn discover(args: &[&str]) -> Run {
    let out = tokio::process::Command::new(binary())
        .arg("discover")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn fleet(nats: &NatsServer, dir: &Path, nodes: usize, protocol: Version) -> RunningFleet {
    RunningFleet::start(FleetOptions {
        broker: BrokerOptions::at([nats.url()]),
        nodes,
        protocol,
        journal: Some(dir.join("journal.jsonl")),
        key_pool_size: 1,
        ..Default::default()
    })
    .await
}

/// The journal's requests of `action`: (node, sender, caller).
fn requests(journal: &[Value], action: &str) -> Vec<(String, String, String)> {
    journal
        .iter()
        .filter(|e| e["kind"] == "action" && e["action"] == action)
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("node"), s("sender"), s("caller"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_prints_every_node_once_and_the_inventory_asked_for() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let fleet = fleet(&nats, dir.path(), 25, Version::V1).await;
    let all: BTreeSet<String> = fleet.identities.iter().cloned().collect();
    let run = discover(&[
        "--nats",
        &nats.url(),
        "--identity",
        "disco.example.net",
        "--inventory",
        "3",
        "--timeout-ms",
        "10000",
    ])
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 25 + 3, "{}", run.stdout);
    let listed: Vec<&str> = lines[..25].to_vec();
    let unique: BTreeSet<String> = listed.iter().map(|s| s.to_string()).collect();
    assert_eq!(unique.len(), 25, "a node listed twice: {listed:?}");
    assert_eq!(unique, all, "the listed nodes are the fleet");
    assert!(
        run.stderr.contains("discovered 25 node(s)"),
        "{}",
        run.stderr
    );
    // `--inventory 3`: the first three listed nodes, each one line with
    // the node's rpcutil#inventory reply as JSON.
    for (line, node) in lines[25..].iter().zip(&listed) {
        let json = line
            .strip_prefix(&format!("{node} inventory (OK): "))
            .unwrap_or_else(|| panic!("not {node}'s inventory: {line}"));
        let inv: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
        assert_eq!(inv["main_collective"], "provisioning", "{inv}");
        assert!(
            inv["agents"]
                .as_array()
                .unwrap()
                .contains(&"choria_provision".into()),
            "{inv}"
        );
    }
    let (_, journal) = fleet.finish().await;
    // Every node got one discovery from the identity given, with the v1
    // caller made from it; exactly three got an inventory request.
    let pings = requests(&journal, "ping");
    let pinged: BTreeSet<String> = pings.iter().map(|p| p.0.clone()).collect();
    assert_eq!((pings.len(), pinged), (25, all));
    for (node, sender, caller) in &pings {
        assert_eq!(
            (sender.as_str(), caller.as_str()),
            ("disco.example.net", "choria=disco.example.net"),
            "{node}"
        );
    }
    let inventoried: Vec<String> = requests(&journal, "inventory")
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(inventoried.len(), 3, "{inventoried:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_speaks_v2_as_its_client_jwt_and_v1_as_the_caller_given() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    // A v2 client: a client JWT (its callerid is the caller) and the seed
    // that signs the requests. The simulator verifies neither, as a
    // provisioning-mode server does not.
    let key = Ed25519KeyPair::generate();
    let jwt = TokenSigningKey::Ed25519(key.signing_key().clone())
        .sign(&serde_json::json!({
            "purpose": "choria_client_id",
            "callerid": "up=discoverer",
            "public_key": key.public_hex(),
            "iss": "test",
        }))
        .unwrap();
    std::fs::write(dir.path().join("client.jwt"), format!("{jwt}\n")).unwrap();
    std::fs::write(dir.path().join("client.seed"), key.seed_hex()).unwrap();
    let v2 = fleet(&nats, dir.path(), 6, Version::V2).await;
    let token = dir.path().join("client.jwt");
    let seed = dir.path().join("client.seed");
    let run = discover(&[
        "--nats",
        &nats.url(),
        "--token-file",
        token.to_str().unwrap(),
        "--seed-file",
        seed.to_str().unwrap(),
        "--timeout-ms",
        "10000",
    ])
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let listed: BTreeSet<String> = run.stdout.lines().map(str::to_string).collect();
    assert_eq!(listed, v2.identities.iter().cloned().collect());
    let (_, journal) = v2.finish().await;
    let pings = requests(&journal, "ping");
    assert_eq!(pings.len(), 6);
    assert!(pings.iter().all(|p| p.2 == "up=discoverer"), "{pings:?}");

    let v1_dir = tempfile::tempdir().unwrap();
    let v1 = fleet(&nats, v1_dir.path(), 4, Version::V1).await;
    let run = discover(&["--nats", &nats.url(), "--caller", "choria=someone"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout.lines().count(), 4, "{}", run.stdout);
    let (_, journal) = v1.finish().await;
    let pings = requests(&journal, "ping");
    assert_eq!(pings.len(), 4);
    for (_, sender, caller) in &pings {
        assert_eq!(
            (sender.as_str(), caller.as_str()),
            ("provisioner.example.net", "choria=someone")
        );
    }
}

#[tokio::test]
async fn discover_refuses_half_v2_credentials_and_tokens_that_are_not_client_jwts() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("t.jwt");
    let seed = dir.path().join("s.seed");
    std::fs::write(&seed, Ed25519KeyPair::generate().seed_hex()).unwrap();
    let url = nats.url();
    // A JWT without the client purpose.
    let key = Ed25519KeyPair::generate();
    let server_jwt = TokenSigningKey::Ed25519(key.signing_key().clone())
        .sign(&serde_json::json!({"purpose": "choria_server", "identity": "x"}))
        .unwrap();
    std::fs::write(&token, server_jwt).unwrap();
    let (t, s) = (token.to_str().unwrap(), seed.to_str().unwrap());
    let half = discover(&["--nats", &url, "--token-file", t]).await;
    assert_eq!(half.code, 2, "a usage error: {}", half.stderr);
    assert!(half.stderr.contains("--seed-file"), "{}", half.stderr);
    let half = discover(&["--nats", &url, "--seed-file", s]).await;
    assert_eq!(half.code, 2, "a usage error: {}", half.stderr);
    assert!(half.stderr.contains("--token-file"), "{}", half.stderr);
    let not_client = discover(&["--nats", &url, "--token-file", t, "--seed-file", s]).await;
    assert_eq!(not_client.code, 1, "{}", not_client.stderr);
    assert!(
        not_client.stderr.contains("is not a Choria client JWT"),
        "{}",
        not_client.stderr
    );
    let missing = discover(&[
        "--nats",
        &url,
        "--token-file",
        "/nonexistent",
        "--seed-file",
        s,
    ])
    .await;
    assert_eq!(missing.code, 1);
    assert!(
        missing.stderr.contains("reading --token-file /nonexistent"),
        "{}",
        missing.stderr
    );
    // Nobody there: nothing listed, and a clean exit.
    let empty = discover(&["--nats", &url, "--timeout-ms", "500"]).await;
    assert_eq!(empty.code, 0, "{}", empty.stderr);
    assert_eq!(empty.stdout, "");
    assert!(
        empty.stderr.contains("discovered 0 node(s)"),
        "{}",
        empty.stderr
    );
}

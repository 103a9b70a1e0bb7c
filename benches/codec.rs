//! Codec and simulator micro-benchmarks: encode+decode time per message layer,
//! and how many replies per second one core of the simulator produces.

use choria_fleet::node::{FleetShared, Node, Response};
use choria_wire::filter::Filter;
use choria_wire::lifecycle::{self, Event, EventType};
use choria_wire::protocol::{self, ReplySpec, RequestSigner, RequestSpec, Version};
use choria_wire::security::csr::RsaKeyPool;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::sync::Arc;

const JWT_PAYLOAD: &[u8] =
    br#"{"agent":"choria_provision","action":"jwt","data":{"token":"s3cret"}}"#;
const INVENTORY_BODY: &[u8] = br#"{"action":"inventory","statuscode":0,"statusmsg":"OK","data":{"agents":["choria_provision","choria_util","discovery","rpcutil"],"classes":[],"collectives":["provisioning"],"data_plugins":[],"facts":{},"machines":[],"main_collective":"provisioning","version":"0.30.2","upgradable":false}}"#;

fn signer(version: Version) -> RequestSigner {
    match version {
        Version::V1 => RequestSigner::V1Insecure,
        Version::V2 => RequestSigner::V2 {
            seed: Box::new(ed25519_dalek::SigningKey::from_bytes(&[5; 32])),
            jwt: "eyJhbGciOiJFZERTQSJ9.eyJjYWxsZXJpZCI6InByb3Zpc2lvbmVyIn0.c2ln".into(),
        },
    }
}

fn request(version: Version, payload: &[u8], agent: &str, now: i64) -> Vec<u8> {
    let id = match version {
        Version::V1 => choria_wire::ids::v1_request_id(),
        Version::V2 => choria_wire::ids::v2_request_id(),
    };
    let filter = Filter::with_agent(agent);
    signer(version)
        .encode_request(&RequestSpec {
            id: &id,
            sender: "provisioner.example.net",
            caller: "choria=provisioner.example.net",
            collective: "provisioning",
            agent,
            ttl: 60,
            time_nanos: now,
            filter: &filter,
            payload,
            reply_to: "provisioning.reply.6079c8d10a2ceceb5904de01a22e9b41.6202b111866149f4a2d963c6f3f195eb",
            connected_url: "nats://127.0.0.1:4222",
        })
        .unwrap()
}

fn codec(c: &mut Criterion) {
    let now = choria_wire::client::now_nanos();
    for version in [Version::V1, Version::V2] {
        let mut g = c.benchmark_group(format!("codec_{version}"));
        g.throughput(Throughput::Elements(1));
        g.bench_function("request_encode", |b| {
            b.iter(|| black_box(request(version, JWT_PAYLOAD, "choria_provision", now)))
        });
        let req = request(version, JWT_PAYLOAD, "choria_provision", now);
        g.bench_function("request_decode", |b| {
            b.iter(|| black_box(protocol::decode_request(black_box(&req), version).unwrap()))
        });
        let spec = ReplySpec {
            request_id: "6202b111866149f4a2d963c6f3f195eb",
            sender: "node1.example.net",
            agent: "rpcutil",
            time_nanos: now,
            body: INVENTORY_BODY,
            connected_url: "nats://127.0.0.1:4222",
        };
        g.bench_function("reply_encode", |b| {
            b.iter(|| black_box(protocol::encode_reply(version, black_box(&spec)).unwrap()))
        });
        let reply = protocol::encode_reply(version, &spec).unwrap();
        g.bench_function("reply_decode_and_verify_hash", |b| {
            b.iter(|| black_box(protocol::decode_reply(black_box(&reply)).unwrap()))
        });
        g.bench_function("request_and_reply_round_trip", |b| {
            b.iter(|| {
                let r = request(version, JWT_PAYLOAD, "choria_provision", now);
                let d = protocol::decode_request(&r, version).unwrap();
                let out = protocol::encode_reply(version, &spec).unwrap();
                black_box((d, protocol::decode_reply(&out).unwrap()))
            })
        });
        g.finish();
    }
    let mut g = c.benchmark_group("lifecycle");
    let event = Event::new(
        EventType::Startup,
        "node1.example.net",
        "provision_mode_server",
        Some("0.30.2"),
    );
    let json = event.to_cloudevent_json();
    g.bench_function("cloudevent_encode", |b| {
        b.iter(|| black_box(event.to_cloudevent_json()))
    });
    g.bench_function("cloudevent_parse", |b| {
        b.iter(|| black_box(lifecycle::parse(&json).unwrap()))
    });
    g.finish();
}

/// One simulated node answering requests: decode, handle, encode the reply. The
/// throughput is the simulator's replies per second on one core (NATS excluded).
fn simulator(c: &mut Criterion) {
    let shared = Arc::new(FleetShared {
        protocol: Version::V1,
        server_version: "0.30.2".into(),
        token: "s3cret".into(),
        provisioning_jwt: Some("header.claims.signature".into()),
        upgradable: false,
        key_pool: Arc::new(RsaKeyPool::generate(1, 2048).unwrap()),
        presigned_csrs: Vec::new(),
        config_root: "/etc/choria-fleet".into(),
        facts: serde_json::json!({}),
        evidence: None,
        journal_config_keys: Vec::new(),
    });
    let mut node = Node::new("node1.example.net".into(), 0, None, shared);
    let mut g = c.benchmark_group("simulator_v1");
    g.throughput(Throughput::Elements(1));
    for (name, agent, payload) in [
        ("discovery_pong", "discovery", &b"cGluZw=="[..]),
        (
            "rpcutil_inventory",
            "rpcutil",
            &br#"{"agent":"rpcutil","action":"inventory","data":{}}"#[..],
        ),
        ("choria_provision_jwt", "choria_provision", JWT_PAYLOAD),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let now = choria_wire::client::now_nanos();
                let bytes = request(Version::V1, payload, agent, now);
                let req = protocol::decode_request(&bytes, Version::V1).unwrap();
                let handled = node.handle(&req, now);
                let Response::Reply(body) = handled.response else {
                    panic!("{name}: expected a reply")
                };
                black_box(
                    protocol::encode_reply(
                        Version::V1,
                        &ReplySpec {
                            request_id: &req.id,
                            sender: "node1.example.net",
                            agent: &req.agent,
                            time_nanos: now,
                            body: &body,
                            connected_url: "nats://127.0.0.1:4222",
                        },
                    )
                    .unwrap(),
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, codec, simulator);
criterion_main!(benches);

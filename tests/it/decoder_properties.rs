//! Property tests: no decoder panics on arbitrary input, every failure is a typed
//! error, and valid messages survive an encode/decode round trip.

use choria_wire::filter::Filter;
use choria_wire::lifecycle;
use choria_wire::mcorpc::RpcReply;
use choria_wire::protocol::{self, ReplySpec, RequestSigner, RequestSpec, Version};
use proptest::prelude::*;

fn arbitrary_json_like() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        // Near-misses: valid transport envelopes with random inner data.
        (
            "[a-zA-Z0-9+/=!]{0,200}",
            prop_oneof![
                Just("choria:transport:1"),
                Just("io.choria.protocol.v2.transport")
            ]
        )
            .prop_map(|(data, proto)| format!(
                r#"{{"protocol":"{proto}","data":"{data}","headers":{{}}}}"#
            )
            .into_bytes()),
        any::<String>().prop_map(|s| s.into_bytes()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn request_decoders_never_panic(data in arbitrary_json_like()) {
        let _ = protocol::decode_request(&data, Version::V1);
        let _ = protocol::decode_request(&data, Version::V2);
        let _ = protocol::v1::decode_request(&data);
        let _ = protocol::v2::decode_request(&data);
    }

    #[test]
    fn reply_decoders_never_panic(data in arbitrary_json_like()) {
        let _ = protocol::decode_reply(&data);
        let _ = protocol::transport_sender(&data);
        let _ = protocol::sniff_version(&data);
        let _ = serde_json::from_slice::<RpcReply>(&data);
    }

    #[test]
    fn lifecycle_parser_never_panics(data in arbitrary_json_like()) {
        let _ = lifecycle::parse(&data);
    }

    #[test]
    fn requests_round_trip(
        v2 in any::<bool>(),
        agent in "[a-z_]{1,20}",
        sender in "[a-z0-9.-]{1,40}",
        payload in "[ -~]{1,300}",
        identities in proptest::collection::vec("[a-z0-9.]{1,20}", 0..3),
        ttl in 30i64..3600,
        secs in 1_600_000_000i64..2_000_000_000,
    ) {
        let (signer, id) = if v2 {
            (RequestSigner::V2 { seed: Box::new(ed25519_dalek::SigningKey::from_bytes(&[3; 32])), jwt: "j.w.t".into() },
             choria_wire::ids::v2_request_id())
        } else {
            (RequestSigner::V1Insecure, choria_wire::ids::v1_request_id())
        };
        let filter = Filter { identity: identities, ..Filter::with_agent(&agent) };
        let time_nanos = secs * 1_000_000_000;
        let bytes = signer.encode_request(&RequestSpec {
            id: &id, sender: &sender, caller: "choria=c", collective: "provisioning", agent: &agent,
            ttl, time_nanos, filter: &filter, payload: payload.as_bytes(), reply_to: "r.s", connected_url: "",
        }).unwrap();
        let req = protocol::decode_request(&bytes, signer.version()).unwrap();
        prop_assert_eq!(req.id, id);
        prop_assert_eq!(req.agent, agent);
        prop_assert_eq!(req.sender, sender);
        prop_assert_eq!(req.message, payload.as_bytes());
        prop_assert_eq!(req.filter, filter);
        prop_assert_eq!(req.ttl, ttl);
        prop_assert_eq!(req.time_nanos, time_nanos);
    }

    #[test]
    fn replies_round_trip_and_any_bit_flip_in_the_body_is_caught(
        v2 in any::<bool>(),
        body in "[ -~]{1,300}",
        flip in any::<prop::sample::Index>(),
    ) {
        let version = if v2 { Version::V2 } else { Version::V1 };
        let bytes = protocol::encode_reply(version, &ReplySpec {
            request_id: "abc", sender: "node1", agent: "rpcutil", time_nanos: 1_700_000_000_000_000_000,
            body: body.as_bytes(), connected_url: "nats://127.0.0.1:4222",
        }).unwrap();
        let reply = protocol::decode_reply(&bytes).unwrap();
        prop_assert_eq!(&reply.message, body.as_bytes());

        // Change one body character and re-wrap with the original hash: the hash check must fail.
        let mut tampered = body.clone().into_bytes();
        let i = flip.index(tampered.len());
        tampered[i] = if tampered[i] == b'a' { b'b' } else { b'a' };
        let good = protocol::encode_reply(version, &ReplySpec {
            request_id: "abc", sender: "node1", agent: "rpcutil", time_nanos: 1_700_000_000_000_000_000,
            body: &tampered, connected_url: "",
        }).unwrap();
        let swapped = swap_hash(&good, &bytes);
        let caught = matches!(protocol::decode_reply(&swapped), Err(protocol::ProtocolError::HashMismatch { .. }));
        prop_assert!(caught, "a tampered body passed the hash check");
    }
}

/// Puts the hash of `hash_from` into the secure reply of `target`.
fn swap_hash(target: &[u8], hash_from: &[u8]) -> Vec<u8> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let secure = |t: &[u8]| -> serde_json::Value {
        let tv: serde_json::Value = serde_json::from_slice(t).unwrap();
        serde_json::from_slice(&b64.decode(tv["data"].as_str().unwrap()).unwrap()).unwrap()
    };
    let mut s = secure(target);
    s["hash"] = secure(hash_from)["hash"].clone();
    let mut tv: serde_json::Value = serde_json::from_slice(target).unwrap();
    tv["data"] = b64.encode(s.to_string()).into();
    tv.to_string().into_bytes()
}

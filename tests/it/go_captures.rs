//! Byte-compatibility against traffic captured from real go-choria 0.30.2 (the
//! `choria` CLI as client, real servers in provisioning mode, v1 and v2; see
//! tests/gopeers/RECIPE.md). Every message must decode with our codec, and what
//! we encode from the decoded fields must equal Go's bytes.

use choria_wire::lifecycle;
use choria_wire::protocol::{self, v1, v2, ReplySpec, RequestSigner, RequestSpec, Version};

struct Captured {
    subject: String,
    data: Vec<u8>,
}

/// Both captures: the first (v1 and v2, `provisioning-v1-v2.jsonl`) and
/// the v2 one whose client seed was kept ([`SIGNED_V2`]).
fn captures() -> Vec<Captured> {
    let mut all = read_capture("provisioning-v1-v2.jsonl");
    all.extend(read_capture(SIGNED_V2));
    all
}

/// The v2 half of a `tests/gopeers/demo.sh` run with `CLIENT_SEED_OUT`
/// set: the `choria` CLI's requests with the ed25519 seed that signed them
/// (`provisioning-v2-client.seed`, a throwaway key made for the capture).
const SIGNED_V2: &str = "provisioning-v2-signed.jsonl";

fn read_capture(name: &str) -> Vec<Captured> {
    let path = format!(
        "{}/tests/gopeers/captures/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            Captured {
                subject: v["subject"].as_str().unwrap().to_string(),
                data: v["data"].as_str().unwrap().as_bytes().to_vec(),
            }
        })
        .collect()
}

/// `req` encoded again by us, signed by `signer`, hopping through `url`.
fn re_encode(req: &protocol::Request, signer: &RequestSigner, url: &str) -> Vec<u8> {
    signer
        .encode_request(&RequestSpec {
            id: &req.id,
            sender: &req.sender,
            caller: &req.caller,
            collective: &req.collective,
            agent: &req.agent,
            ttl: req.ttl,
            time_nanos: req.time_nanos,
            filter: &req.filter,
            payload: &req.message,
            reply_to: &req.reply_to,
            connected_url: url,
        })
        .unwrap()
}

fn is_request(c: &Captured) -> bool {
    c.subject.starts_with("provisioning.node.") || c.subject.starts_with("provisioning.broadcast.")
}

/// The inner request bytes and the transport's hop URL of a captured request.
fn inner_request(data: &[u8], version: Version) -> (Vec<u8>, String) {
    match version {
        Version::V1 => {
            let t: v1::Transport = serde_json::from_slice(data).unwrap();
            let s: v1::SecureRequest = serde_json::from_slice(&t.data).unwrap();
            let url = t
                .headers
                .seen_by
                .first()
                .map(|h| h[0].clone())
                .unwrap_or_default();
            (s.message.into_bytes(), url)
        }
        Version::V2 => {
            let t: v2::Transport = serde_json::from_slice(data).unwrap();
            let s: v2::SecureRequest = serde_json::from_slice(&t.data).unwrap();
            let url = t
                .headers
                .and_then(|h| h.seen_by.first().map(|h| h[0].clone()))
                .unwrap_or_default();
            (s.request, url)
        }
    }
}

#[test]
fn real_requests_decode_and_re_encode_to_the_same_inner_bytes() {
    let mut checked = 0;
    for c in captures().iter().filter(|c| is_request(c)) {
        let version = protocol::sniff_version(&c.data).unwrap();
        let req = protocol::decode_request(&c.data, version)
            .unwrap_or_else(|e| panic!("{}: real request does not decode: {e}", c.subject));
        assert!(!req.reply_to.is_empty());
        assert_eq!(req.collective, "provisioning");
        let (go_inner, url) = inner_request(&c.data, version);
        let signer = match version {
            Version::V1 => RequestSigner::V1Insecure,
            Version::V2 => RequestSigner::V2 {
                seed: Box::new(ed25519_dalek::SigningKey::from_bytes(&[1; 32])),
                jwt: req.caller_jwt.clone(),
            },
        };
        let ours = re_encode(&req, &signer, &url);
        let (our_inner, _) = inner_request(&ours, version);
        assert_eq!(
            String::from_utf8_lossy(&our_inner),
            String::from_utf8_lossy(&go_inner),
            "{}: our {version} request layer differs from go-choria's",
            c.subject
        );
        if version == Version::V1 {
            // v1 insecure requests carry no signature, so the whole message is reproducible.
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&c.data),
                "{}",
                c.subject
            );
        }
        checked += 1;
    }
    assert_eq!(
        checked,
        12 + 6,
        "every captured v1 and v2 request is checked"
    );
}

#[test]
fn real_replies_verify_and_re_encode_byte_for_byte() {
    let mut checked = 0;
    for c in captures()
        .iter()
        .filter(|c| c.subject.starts_with("provisioning.reply."))
    {
        let reply = protocol::decode_reply(&c.data)
            .unwrap_or_else(|e| panic!("{}: real reply does not decode: {e}", c.subject));
        assert!(c.subject.ends_with(&reply.request_id), "{}", c.subject);
        let url = {
            let v: serde_json::Value = serde_json::from_slice(&c.data).unwrap();
            let hops = if reply.version == Version::V1 {
                &v["headers"]["seen-by"]
            } else {
                &v["headers"]["trace"]
            };
            hops[0][0].as_str().unwrap_or_default().to_string()
        };
        let ours = protocol::encode_reply(
            reply.version,
            &ReplySpec {
                request_id: &reply.request_id,
                sender: &reply.sender,
                agent: &reply.agent,
                time_nanos: reply.time_nanos,
                body: &reply.message,
                connected_url: &url,
            },
        )
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&ours),
            String::from_utf8_lossy(&c.data),
            "{}: our encoding of a go-choria reply differs",
            c.subject
        );
        checked += 1;
    }
    assert_eq!(checked, 12 + 6, "every captured reply is checked");
}

#[test]
fn real_lifecycle_events_parse_and_re_encode_byte_for_byte() {
    let mut checked = 0;
    for c in captures()
        .iter()
        .filter(|c| c.subject.starts_with("choria.lifecycle.event."))
    {
        let (kind, event) = lifecycle::parse(&c.data).unwrap();
        assert_eq!(
            c.subject,
            lifecycle::subject(kind, &event.component),
            "the subject follows from the event"
        );
        assert_eq!(
            String::from_utf8_lossy(&event.to_cloudevent_json()),
            String::from_utf8_lossy(&c.data)
        );
        checked += 1;
    }
    assert!(checked >= 8 + 4, "checked {checked}");
}

/// ed25519 signatures are deterministic: with the seed the `choria` CLI
/// signed with, our encoder must reproduce its whole v2 requests — the
/// transport with its headers, the secure request with the signature and
/// the caller's JWT, and the request — byte for byte.
#[test]
fn real_v2_requests_re_encode_byte_for_byte_with_the_callers_seed() {
    let seed_path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/gopeers/captures/provisioning-v2-client.seed"
    );
    let seed = choria_wire::security::ed25519::parse_seed_hex(
        std::fs::read_to_string(seed_path).unwrap().trim(),
    )
    .unwrap();
    let mut checked = 0;
    for c in read_capture(SIGNED_V2).iter().filter(|c| is_request(c)) {
        assert_eq!(protocol::sniff_version(&c.data).unwrap(), Version::V2);
        let req = protocol::decode_request(&c.data, Version::V2)
            .unwrap_or_else(|e| panic!("{}: real request does not decode: {e}", c.subject));
        let (_, url) = inner_request(&c.data, Version::V2);
        let signer = RequestSigner::V2 {
            seed: Box::new(ed25519_dalek::SigningKey::from_bytes(&seed)),
            jwt: req.caller_jwt.clone(),
        };
        let ours = re_encode(&req, &signer, &url);
        assert_eq!(
            String::from_utf8_lossy(&ours),
            String::from_utf8_lossy(&c.data),
            "{}: our v2 request differs from go-choria's",
            c.subject
        );
        checked += 1;
    }
    assert_eq!(
        checked, 6,
        "discovery, inventory, jwt, gen25519, configure, restart"
    );
}

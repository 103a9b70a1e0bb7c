//! Byte-compatibility against traffic captured from real go-choria 0.30.2 (the
//! `choria` CLI as client, real servers in provisioning mode, v1 and v2; see
//! tests/gopeers/RECIPE.md). Every message must decode with our codec, and what
//! we encode from the decoded fields must equal Go's bytes.

use choria_provisioner::choria::lifecycle;
use choria_provisioner::choria::protocol::{
    self, v1, v2, ReplySpec, RequestSigner, RequestSpec, Version,
};

struct Captured {
    subject: String,
    data: Vec<u8>,
}

fn captures() -> Vec<Captured> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/gopeers/captures/provisioning-v1-v2.jsonl"
    );
    std::fs::read_to_string(path)
        .unwrap()
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
    for c in captures().iter().filter(|c| {
        c.subject.starts_with("provisioning.node.")
            || c.subject.starts_with("provisioning.broadcast.")
    }) {
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
        let ours = signer
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
                connected_url: &url,
            })
            .unwrap();
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
    assert_eq!(checked, 12, "every captured v1 and v2 request is checked");
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
    assert_eq!(checked, 12, "every captured reply is checked");
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
    assert!(checked >= 8, "checked {checked}");
}

//! Protocol v1 (`choria:transport:1`, `choria:secure:request:1`, `choria:request:1`,
//! `choria:secure:reply:1`, `choria:reply:1`).
//!
//! Layering: the transport's `data` is base64 of the secure layer's JSON; the secure
//! layer's `message` is the inner JSON *as a string* (not base64); the inner
//! request's `message` is the payload as a string.

use super::{
    decode_b64, expect_protocol, hop, open_transport, parse_json, parse_layer, reply_hash,
    require_non_empty, to_json, validate_filter, Layer, ProtocolError, Reply, ReplySpec, Request,
    RequestSigner, RequestSpec, Version,
};
use crate::filter::Filter;
use crate::json::base64_bytes;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::{Deserialize, Serialize};

pub const TRANSPORT_PROTOCOL: &str = "choria:transport:1";
pub const SECURE_REQUEST_PROTOCOL: &str = "choria:secure:request:1";
pub const REQUEST_PROTOCOL: &str = "choria:request:1";
pub const SECURE_REPLY_PROTOCOL: &str = "choria:secure:reply:1";
pub const REPLY_PROTOCOL: &str = "choria:reply:1";

/// The literal a v1 secure request carries instead of a signature and certificate
/// when protocol security is off (always the case in provisioning mode).
pub const INSECURE: &str = "insecure";

/// Minimum TTL accepted by the v1 request schema.
pub const MIN_TTL: i64 = 30;
/// Exact request id length demanded by the v1 request schema.
pub const REQUEST_ID_LEN: usize = 32;

#[derive(Debug, Serialize, Deserialize)]
pub struct Transport {
    pub protocol: String,
    #[serde(with = "base64_bytes")]
    pub data: Vec<u8>,
    #[serde(default)]
    pub headers: TransportHeaders,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct TransportHeaders {
    #[serde(rename = "reply-to", default, skip_serializing_if = "String::is_empty")]
    pub reply_to: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mc_sender: String,
    #[serde(rename = "seen-by", default, skip_serializing_if = "Vec::is_empty")]
    pub seen_by: Vec<[String; 3]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub federation: Option<Federation>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Federation {
    #[serde(default, rename = "req")]
    pub request_id: String,
    #[serde(default, rename = "reply-to")]
    pub reply_to: String,
    #[serde(default)]
    pub target: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SecureRequest {
    pub protocol: String,
    pub message: String,
    pub signature: String,
    pub pubcert: String,
}

#[derive(Debug, Serialize)]
pub struct RequestOut<'a> {
    pub protocol: &'static str,
    pub message: &'a str,
    pub envelope: EnvelopeOut<'a>,
}

#[derive(Debug, Serialize)]
pub struct EnvelopeOut<'a> {
    pub requestid: &'a str,
    pub senderid: &'a str,
    pub callerid: &'a str,
    pub collective: &'a str,
    pub agent: &'a str,
    pub ttl: i64,
    pub time: i64,
    pub filter: &'a Filter,
}

#[derive(Debug, Deserialize)]
struct RequestIn {
    protocol: Option<String>,
    message: Option<String>,
    envelope: Option<EnvelopeIn>,
}

#[derive(Debug, Deserialize)]
struct EnvelopeIn {
    requestid: Option<String>,
    senderid: Option<String>,
    callerid: Option<String>,
    collective: Option<String>,
    agent: Option<String>,
    ttl: Option<i64>,
    time: Option<i64>,
    filter: Option<serde_json::Value>,
}

super::layered!(Transport, SecureRequest, SecureReply, ReplyDoc);

#[derive(Debug, Serialize, Deserialize)]
pub struct SecureReply {
    pub protocol: String,
    pub message: String,
    pub hash: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ReplyDoc {
    pub protocol: String,
    pub message: String,
    pub envelope: ReplyEnvelope,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ReplyEnvelope {
    pub requestid: String,
    pub senderid: String,
    pub agent: String,
    pub time: i64,
}

/// Builds the three request layers and returns the transport JSON.
pub fn encode_request(
    spec: &RequestSpec<'_>,
    signer: &RequestSigner,
) -> Result<Vec<u8>, ProtocolError> {
    let message = std::str::from_utf8(spec.payload).map_err(|_| {
        ProtocolError::schema(Layer::Request, "message", "v1 payloads must be UTF-8 text")
    })?;
    let inner = RequestOut {
        protocol: REQUEST_PROTOCOL,
        message,
        envelope: EnvelopeOut {
            requestid: spec.id,
            senderid: spec.sender,
            callerid: spec.caller,
            collective: spec.collective,
            agent: spec.agent,
            ttl: spec.ttl,
            time: spec.time_nanos.div_euclid(1_000_000_000),
            filter: spec.filter,
        },
    };
    let inner_json = to_json(Layer::Request, &inner)?;

    let (signature, pubcert) = match signer {
        RequestSigner::V1Insecure => (INSECURE.to_string(), INSECURE.to_string()),
        RequestSigner::V1Rsa { key, cert_pem } => {
            let sig = key
                .sign_sha256(&inner_json)
                .map_err(ProtocolError::Signing)?;
            (STANDARD.encode(sig), cert_pem.clone())
        }
        RequestSigner::V2 { .. } => {
            return Err(ProtocolError::VersionMismatch {
                found: Version::V2,
                expected: Version::V1,
            })
        }
    };

    let secure = SecureRequest {
        protocol: SECURE_REQUEST_PROTOCOL.to_string(),
        // serde_json only writes UTF-8
        message: String::from_utf8(inner_json).expect("JSON is UTF-8"),
        signature,
        pubcert,
    };
    let secure_json = to_json(Layer::SecureRequest, &secure)?;

    let transport = Transport {
        protocol: TRANSPORT_PROTOCOL.to_string(),
        data: secure_json,
        headers: TransportHeaders {
            reply_to: spec.reply_to.to_string(),
            mc_sender: spec.sender.to_string(),
            seen_by: hop(spec.connected_url, spec.sender),
            federation: None,
        },
    };
    to_json(Layer::Transport, &transport)
}

/// Decodes and schema-checks a v1 request as a provisioning-mode server does
/// (signatures are not verified in provisioning mode).
pub fn decode_request(data: &[u8]) -> Result<Request, ProtocolError> {
    let transport: Transport = open_transport(data, TRANSPORT_PROTOCOL)?;

    let secure = open_secure(&transport.data)?;

    let inner: RequestIn = parse_json(Layer::Request, secure.message.as_bytes())?;
    let l = Layer::Request;
    let protocol = inner
        .protocol
        .ok_or_else(|| ProtocolError::schema(l, "protocol", "is required"))?;
    expect_protocol(l, &protocol, REQUEST_PROTOCOL)?;
    let message = inner
        .message
        .ok_or_else(|| ProtocolError::schema(l, "message", "is required"))?;
    require_non_empty(l, "message", &message)?;
    let env = inner
        .envelope
        .ok_or_else(|| ProtocolError::schema(l, "envelope", "is required"))?;

    let id = request_id(l, env.requestid)?;
    let sender = env
        .senderid
        .ok_or_else(|| ProtocolError::schema(l, "envelope.senderid", "is required"))?;
    let caller = env
        .callerid
        .ok_or_else(|| ProtocolError::schema(l, "envelope.callerid", "is required"))?;
    require_non_empty(l, "envelope.callerid", &caller)?;
    let collective = env
        .collective
        .ok_or_else(|| ProtocolError::schema(l, "envelope.collective", "is required"))?;
    require_non_empty(l, "envelope.collective", &collective)?;
    let agent = env
        .agent
        .ok_or_else(|| ProtocolError::schema(l, "envelope.agent", "is required"))?;
    require_non_empty(l, "envelope.agent", &agent)?;
    let ttl = env
        .ttl
        .ok_or_else(|| ProtocolError::schema(l, "envelope.ttl", "is required"))?;
    if ttl < MIN_TTL {
        return Err(ProtocolError::schema(
            l,
            "envelope.ttl",
            format!("must be at least {MIN_TTL}, got {ttl}"),
        ));
    }
    let time = env
        .time
        .ok_or_else(|| ProtocolError::schema(l, "envelope.time", "is required"))?;
    let filter = decode_filter(l, env.filter)?;

    Ok(Request {
        version: Version::V1,
        id,
        sender,
        caller,
        collective,
        agent,
        ttl,
        time_nanos: time.saturating_mul(1_000_000_000),
        filter,
        message: message.into_bytes(),
        reply_to: transport.headers.reply_to,
        transport_sender: transport.headers.mc_sender,
        caller_jwt: String::new(),
    })
}

/// The secure layer, with what the schema requires of it: a provisioning-mode
/// server reads the signature and certificate without checking them, but
/// they must be there.
fn open_secure(data: &[u8]) -> Result<SecureRequest, ProtocolError> {
    let secure: SecureRequest = parse_layer(Layer::SecureRequest, data, SECURE_REQUEST_PROTOCOL)?;
    require_non_empty(Layer::SecureRequest, "message", &secure.message)?;
    require_non_empty(Layer::SecureRequest, "signature", &secure.signature)?;
    require_non_empty(Layer::SecureRequest, "pubcert", &secure.pubcert)?;
    Ok(secure)
}

/// The envelope's request id: required, and exactly as long as Choria's
/// (counted in characters, as the schema counts them).
fn request_id(layer: Layer, id: Option<String>) -> Result<String, ProtocolError> {
    let id = id.ok_or_else(|| ProtocolError::schema(layer, "envelope.requestid", "is required"))?;
    let len = id.chars().count();
    if len != REQUEST_ID_LEN {
        return Err(ProtocolError::schema(
            layer,
            "envelope.requestid",
            format!("must be exactly {REQUEST_ID_LEN} characters, got {len}"),
        ));
    }
    Ok(id)
}

/// The v1 schema requires a filter object with the `fact`, `cf_class`, `identity`
/// and `compound` arrays present (`agent` is optional).
fn decode_filter(layer: Layer, value: Option<serde_json::Value>) -> Result<Filter, ProtocolError> {
    let value =
        value.ok_or_else(|| ProtocolError::schema(layer, "envelope.filter", "is required"))?;
    let obj = value
        .as_object()
        .ok_or_else(|| ProtocolError::schema(layer, "envelope.filter", "must be an object"))?;
    for key in ["fact", "cf_class", "identity", "compound"] {
        match obj.get(key) {
            Some(serde_json::Value::Array(_)) => {}
            Some(_) => {
                return Err(ProtocolError::schema(
                    layer,
                    "envelope.filter",
                    format!("{key} must be an array"),
                ))
            }
            None => {
                return Err(ProtocolError::schema(
                    layer,
                    "envelope.filter",
                    format!("{key} is required"),
                ))
            }
        }
    }
    if let Some(agent) = obj.get("agent") {
        if !agent.is_array() {
            return Err(ProtocolError::schema(
                layer,
                "envelope.filter",
                "agent must be an array",
            ));
        }
    }
    let filter: Filter = serde_json::from_value(value)
        .map_err(|e| ProtocolError::schema(layer, "envelope.filter", e.to_string()))?;
    validate_filter(layer, &filter)?;
    Ok(filter)
}

/// Builds the reply layers; replies are never signed in v1, only hashed.
pub fn encode_reply(spec: &ReplySpec<'_>) -> Result<Vec<u8>, ProtocolError> {
    let body = std::str::from_utf8(spec.body).map_err(|_| {
        ProtocolError::schema(
            Layer::Reply,
            "message",
            "v1 reply bodies must be UTF-8 text",
        )
    })?;
    let reply = ReplyDoc {
        protocol: REPLY_PROTOCOL.to_string(),
        message: body.to_string(),
        envelope: ReplyEnvelope {
            requestid: spec.request_id.to_string(),
            senderid: spec.sender.to_string(),
            agent: spec.agent.to_string(),
            time: spec.time_nanos.div_euclid(1_000_000_000),
        },
    };
    let reply_json = to_json(Layer::Reply, &reply)?;
    let secure = SecureReply {
        protocol: SECURE_REPLY_PROTOCOL.to_string(),
        hash: reply_hash(&reply_json),
        message: String::from_utf8(reply_json).expect("JSON is UTF-8"),
    };
    let transport = Transport {
        protocol: TRANSPORT_PROTOCOL.to_string(),
        data: to_json(Layer::SecureReply, &secure)?,
        headers: TransportHeaders {
            reply_to: String::new(),
            mc_sender: spec.sender.to_string(),
            seen_by: hop(spec.connected_url, spec.sender),
            federation: None,
        },
    };
    to_json(Layer::Transport, &transport)
}

/// Decodes a v1 reply and checks its hash, as the Go RPC client does.
pub fn decode_reply(data: &[u8]) -> Result<Reply, ProtocolError> {
    let transport: Transport = open_transport(data, TRANSPORT_PROTOCOL)?;
    let secure: SecureReply =
        parse_layer(Layer::SecureReply, &transport.data, SECURE_REPLY_PROTOCOL)?;
    if reply_hash(secure.message.as_bytes()) != secure.hash {
        return Err(ProtocolError::HashMismatch {
            layer: Layer::SecureReply,
            claimed: secure.hash,
        });
    }
    let reply: ReplyDoc = parse_layer(Layer::Reply, secure.message.as_bytes(), REPLY_PROTOCOL)?;
    Ok(Reply {
        version: Version::V1,
        request_id: reply.envelope.requestid,
        sender: reply.envelope.senderid,
        agent: reply.envelope.agent,
        time_nanos: reply.envelope.time.saturating_mul(1_000_000_000),
        message: reply.message.into_bytes(),
        transport_sender: transport.headers.mc_sender,
    })
}

/// Discovery only reads `headers.mc_sender` and never looks at the secure layer.
pub fn transport_sender(data: &[u8]) -> Result<String, ProtocolError> {
    let transport: Transport = open_transport(data, TRANSPORT_PROTOCOL)?;
    if transport.headers.mc_sender.is_empty() {
        return Err(ProtocolError::schema(
            Layer::Transport,
            "headers.mc_sender",
            "must not be empty",
        ));
    }
    Ok(transport.headers.mc_sender)
}

/// Base64 helper for tests and tools that need the raw secure layer.
pub fn decode_transport_data(data: &[u8]) -> Result<Vec<u8>, ProtocolError> {
    #[derive(Deserialize)]
    struct Raw {
        data: String,
    }
    let raw: Raw = parse_json(Layer::Transport, data)?;
    decode_b64(Layer::Transport, "data", &raw.data)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALLER: &str = "choria=provisioner.mcollective";
    const ID: &str = "d4c5f9a2b1e34f6a8c7d9e0f1a2b3c4d";

    fn discovery_spec<'a>(filter: &'a Filter) -> RequestSpec<'a> {
        RequestSpec {
            id: ID,
            sender: "provisioner.example.net",
            caller: CALLER,
            collective: "provisioning",
            agent: "discovery",
            ttl: 60,
            time_nanos: 1_718_000_000 * 1_000_000_000,
            filter,
            payload: b"cGluZw==",
            reply_to: "provisioning.reply.344aa967e9f3339639bf1c959876175b.d4c5f9a2b1e34f6a8c7d9e0f1a2b3c4d",
            connected_url: "nats://127.0.0.1:4222",
        }
    }

    #[test]
    fn discovery_request_matches_the_protocol_doc_layers() {
        let filter = Filter::with_agent("choria_provision");
        let bytes = encode_request(&discovery_spec(&filter), &RequestSigner::V1Insecure).unwrap();
        let transport: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            transport["headers"],
            serde_json::json!({
                "reply-to": "provisioning.reply.344aa967e9f3339639bf1c959876175b.d4c5f9a2b1e34f6a8c7d9e0f1a2b3c4d",
                "mc_sender": "provisioner.example.net",
                "seen-by": [["nats://127.0.0.1:4222", "provisioner.example.net", "nats://127.0.0.1:4222"]]
            })
        );
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with(r#"{"protocol":"choria:transport:1","data":"eyJwcm90b2NvbCI6ImNob3JpYTpzZWN1cmU6cmVxdWVzdDoxIi"#));
        let secure = decode_transport_data(&bytes).unwrap();
        let secure: SecureRequest = serde_json::from_slice(&secure).unwrap();
        assert_eq!(
            secure.message,
            r#"{"protocol":"choria:request:1","message":"cGluZw==","envelope":{"requestid":"d4c5f9a2b1e34f6a8c7d9e0f1a2b3c4d","senderid":"provisioner.example.net","callerid":"choria=provisioner.mcollective","collective":"provisioning","agent":"discovery","ttl":60,"time":1718000000,"filter":{"fact":[],"cf_class":[],"agent":["choria_provision"],"identity":[],"compound":[]}}}"#
        );
        assert_eq!(secure.signature, "insecure");
        assert_eq!(secure.pubcert, "insecure");
    }

    #[test]
    fn request_round_trips_through_the_server_decoder() {
        let filter = Filter::with_agent("choria_provision");
        let bytes = encode_request(&discovery_spec(&filter), &RequestSigner::V1Insecure).unwrap();
        let req = decode_request(&bytes).unwrap();
        assert_eq!(req.id, ID);
        assert_eq!(req.caller, CALLER);
        assert_eq!(req.agent, "discovery");
        assert_eq!(req.time_nanos, 1_718_000_000 * 1_000_000_000);
        assert_eq!(req.payload(), b"ping");
        assert_eq!(req.filter, filter);
        assert!(req.reply_to.ends_with(ID));
    }

    #[test]
    fn reply_hash_matches_the_protocol_doc_vector() {
        let reply = r#"{"protocol":"choria:reply:1","message":"pong","envelope":{"requestid":"d4c5f9a2b1e34f6a8c7d9e0f1a2b3c4d","senderid":"node1.example.net","agent":"discovery","time":1718000001}}"#;
        assert_eq!(
            reply_hash(reply.as_bytes()),
            "O2Yuv+zE3R/Y3C7KGeoBeicgpi5CwxUL9RkrTxPSN+s="
        );
        let spec = ReplySpec {
            request_id: ID,
            sender: "node1.example.net",
            agent: "discovery",
            time_nanos: 1_718_000_001 * 1_000_000_000 + 999,
            body: b"pong",
            connected_url: "nats://127.0.0.1:4222",
        };
        let bytes = encode_reply(&spec).unwrap();
        let secure: SecureReply =
            serde_json::from_slice(&decode_transport_data(&bytes).unwrap()).unwrap();
        assert_eq!(
            secure.message, reply,
            "our encoder produces the doc's bytes"
        );
        assert_eq!(secure.hash, "O2Yuv+zE3R/Y3C7KGeoBeicgpi5CwxUL9RkrTxPSN+s=");
        let decoded = decode_reply(&bytes).unwrap();
        assert_eq!(decoded.message, b"pong");
        assert_eq!(decoded.sender, "node1.example.net");
        assert_eq!(transport_sender(&bytes).unwrap(), "node1.example.net");
    }

    #[test]
    fn tampered_reply_fails_the_hash_check() {
        let spec = ReplySpec {
            request_id: ID,
            sender: "node1",
            agent: "discovery",
            time_nanos: 0,
            body: b"pong",
            connected_url: "",
        };
        let bytes = encode_reply(&spec).unwrap();
        let mut secure: SecureReply =
            serde_json::from_slice(&decode_transport_data(&bytes).unwrap()).unwrap();
        secure.message = secure.message.replace("pong", "pwnd");
        let transport = Transport {
            protocol: TRANSPORT_PROTOCOL.into(),
            data: serde_json::to_vec(&secure).unwrap(),
            headers: TransportHeaders::default(),
        };
        let err = decode_reply(&serde_json::to_vec(&transport).unwrap()).unwrap_err();
        assert!(matches!(err, ProtocolError::HashMismatch { .. }), "{err}");
    }

    fn with_inner(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
        let filter = Filter::with_agent("choria_provision");
        let bytes = encode_request(&discovery_spec(&filter), &RequestSigner::V1Insecure).unwrap();
        let mut secure: serde_json::Value =
            serde_json::from_slice(&decode_transport_data(&bytes).unwrap()).unwrap();
        let mut inner: serde_json::Value =
            serde_json::from_str(secure["message"].as_str().unwrap()).unwrap();
        edit(&mut inner);
        secure["message"] = serde_json::Value::String(inner.to_string());
        let transport = serde_json::json!({
            "protocol": TRANSPORT_PROTOCOL,
            "data": STANDARD.encode(secure.to_string()),
            "headers": {"reply-to": "x", "mc_sender": "p"}
        });
        transport.to_string().into_bytes()
    }

    #[test]
    fn schema_rules_name_the_offending_field() {
        type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|v| v["envelope"]["requestid"] = "short".into()),
                "envelope.requestid",
            ),
            (
                Box::new(|v| v["envelope"]["ttl"] = 29.into()),
                "envelope.ttl",
            ),
            (
                Box::new(|v| v["envelope"]["callerid"] = "".into()),
                "envelope.callerid",
            ),
            (
                Box::new(|v| v["envelope"]["agent"] = "".into()),
                "envelope.agent",
            ),
            (
                Box::new(|v| {
                    v["envelope"]["filter"]
                        .as_object_mut()
                        .unwrap()
                        .remove("fact");
                }),
                "envelope.filter",
            ),
            (
                Box::new(|v| v["envelope"]["filter"]["identity"] = serde_json::Value::Null),
                "envelope.filter",
            ),
            (Box::new(|v| v["message"] = "".into()), "message"),
            (
                Box::new(|v| {
                    v.as_object_mut().unwrap().remove("envelope");
                }),
                "envelope",
            ),
        ];
        for (edit, field) in cases {
            let err = decode_request(&with_inner(edit)).unwrap_err();
            match err {
                ProtocolError::Schema { field: f, .. } => assert_eq!(f, field),
                other => panic!("expected a schema error on {field}, got {other}"),
            }
        }
    }

    #[test]
    fn wrong_inner_protocol_is_refused() {
        let err =
            decode_request(&with_inner(|v| v["protocol"] = "choria:request:2".into())).unwrap_err();
        assert!(matches!(
            err,
            ProtocolError::UnknownProtocol {
                layer: Layer::Request,
                ..
            }
        ));
    }

    #[test]
    fn bad_base64_in_transport_data_is_a_typed_error() {
        let bad = br#"{"protocol":"choria:transport:1","data":"!!!","headers":{}}"#;
        let err = decode_request(bad).unwrap_err();
        assert!(
            matches!(
                err,
                ProtocolError::Json {
                    layer: Layer::Transport,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("base64"), "{err}");
        let unpadded = br#"{"protocol":"choria:transport:1","data":"e30","headers":{}}"#;
        assert!(decode_request(unpadded)
            .unwrap_err()
            .to_string()
            .contains("base64"));
    }

    #[test]
    fn rsa_signed_requests_verify_with_the_public_key() {
        use rsa::signature::Verifier;
        let key = rsa::RsaPrivateKey::new(&mut rand::thread_rng(), 1024).unwrap();
        let signer = RequestSigner::V1Rsa {
            key: crate::security::rsa_signer::RsaSigningKey::new(key.clone()),
            cert_pem: "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n".into(),
        };
        let filter = Filter::with_agent("choria_provision");
        let bytes = encode_request(&discovery_spec(&filter), &signer).unwrap();
        let secure: SecureRequest =
            serde_json::from_slice(&decode_transport_data(&bytes).unwrap()).unwrap();
        let sig = rsa::pkcs1v15::Signature::try_from(
            STANDARD.decode(&secure.signature).unwrap().as_slice(),
        )
        .unwrap();
        let vk = rsa::pkcs1v15::VerifyingKey::<sha2::Sha256>::new(key.to_public_key());
        vk.verify(secure.message.as_bytes(), &sig).unwrap();
    }
}

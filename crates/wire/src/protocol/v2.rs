//! Protocol v2 (`io.choria.protocol.v2.*`).
//!
//! Every Go `[]byte` field is padded standard base64: the transport's `data`, the
//! secure request's `request` and `signature`, the request's `message`, the secure
//! reply's `reply` and the reply's `message`. Times are Unix nanoseconds.

use super::{
    expect_protocol, hop, open_transport, parse_json, parse_layer, reply_hash, require_non_empty,
    to_json, validate_filter, Layer, ProtocolError, Reply, ReplySpec, Request, RequestSigner,
    RequestSpec, Version,
};
use crate::filter::Filter;
use crate::json::base64_bytes;
use serde::{Deserialize, Serialize};

pub const TRANSPORT_PROTOCOL: &str = "io.choria.protocol.v2.transport";
pub const SECURE_REQUEST_PROTOCOL: &str = "io.choria.protocol.v2.secure_request";
pub const REQUEST_PROTOCOL: &str = "io.choria.protocol.v2.request";
pub const SECURE_REPLY_PROTOCOL: &str = "io.choria.protocol.v2.secure_reply";
pub const REPLY_PROTOCOL: &str = "io.choria.protocol.v2.reply";

#[derive(Debug, Serialize, Deserialize)]
pub struct Transport {
    pub protocol: String,
    #[serde(with = "base64_bytes")]
    pub data: Vec<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<TransportHeaders>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct TransportHeaders {
    #[serde(rename = "reply", default, skip_serializing_if = "String::is_empty")]
    pub reply_to: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sender: String,
    #[serde(rename = "trace", default, skip_serializing_if = "Vec::is_empty")]
    pub seen_by: Vec<[String; 3]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub federation: Option<Federation>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Federation {
    #[serde(rename = "request", default, skip_serializing_if = "String::is_empty")]
    pub request_id: String,
    #[serde(rename = "reply", default, skip_serializing_if = "String::is_empty")]
    pub reply_to: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SecureRequest {
    pub protocol: String,
    #[serde(rename = "request", with = "base64_bytes")]
    pub request: Vec<u8>,
    #[serde(with = "base64_bytes")]
    pub signature: Vec<u8>,
    pub caller: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signer: String,
}

#[derive(Debug, Serialize)]
struct RequestOut<'a> {
    protocol: &'static str,
    #[serde(with = "base64_bytes")]
    message: Vec<u8>,
    id: &'a str,
    sender: &'a str,
    caller: &'a str,
    collective: &'a str,
    agent: &'a str,
    ttl: i64,
    time: i64,
    filter: &'a Filter,
}

#[derive(Debug, Deserialize)]
struct RequestIn {
    protocol: Option<String>,
    message: Option<String>,
    id: Option<String>,
    sender: Option<String>,
    caller: Option<String>,
    collective: Option<String>,
    agent: Option<String>,
    ttl: Option<i64>,
    time: Option<i64>,
    /// `Some(Null)` for `"filter": null`, which Go's schema refuses; `None`
    /// only when the key is absent.
    #[serde(default, deserialize_with = "present")]
    filter: Option<serde_json::Value>,
}

/// Any value that is there, `null` included.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

super::layered!(Transport, SecureRequest, SecureReplyDoc, ReplyDoc);

#[derive(Debug, Serialize, Deserialize)]
struct SecureReplyDoc {
    protocol: String,
    #[serde(with = "base64_bytes")]
    reply: Vec<u8>,
    hash: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "base64_bytes")]
    signature: Vec<u8>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    sender: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct ReplyDoc {
    protocol: String,
    #[serde(with = "base64_bytes")]
    message: Vec<u8>,
    request: String,
    sender: String,
    agent: String,
    time: i64,
}

/// Builds the v2 request layers, signed with the caller's ed25519 seed.
pub fn encode_request(
    spec: &RequestSpec<'_>,
    signer: &RequestSigner,
) -> Result<Vec<u8>, ProtocolError> {
    let RequestSigner::V2 { seed, jwt } = signer else {
        return Err(ProtocolError::VersionMismatch {
            found: Version::V1,
            expected: Version::V2,
        });
    };
    let inner = RequestOut {
        protocol: REQUEST_PROTOCOL,
        message: spec.payload.to_vec(),
        id: spec.id,
        sender: spec.sender,
        caller: spec.caller,
        collective: spec.collective,
        agent: spec.agent,
        ttl: spec.ttl,
        time: spec.time_nanos,
        filter: spec.filter,
    };
    let inner_json = to_json(Layer::Request, &inner)?;
    use ed25519_dalek::Signer;
    let signature = seed.sign(&inner_json).to_bytes().to_vec();
    let secure = SecureRequest {
        protocol: SECURE_REQUEST_PROTOCOL.to_string(),
        request: inner_json,
        signature,
        caller: jwt.clone(),
        signer: String::new(),
    };
    let transport = Transport {
        protocol: TRANSPORT_PROTOCOL.to_string(),
        data: to_json(Layer::SecureRequest, &secure)?,
        headers: Some(TransportHeaders {
            reply_to: spec.reply_to.to_string(),
            sender: spec.sender.to_string(),
            seen_by: hop(spec.connected_url, spec.sender),
            federation: None,
        }),
    };
    to_json(Layer::Transport, &transport)
}

/// Decodes and schema-checks a v2 request as a provisioning-mode server does.
pub fn decode_request(data: &[u8]) -> Result<Request, ProtocolError> {
    let transport: Transport = open_transport(data, TRANSPORT_PROTOCOL)?;
    let headers = transport.headers.unwrap_or_default();

    let secure = open_secure(&transport.data)?;

    let l = Layer::Request;
    let inner: RequestIn = parse_json(l, &secure.request)?;
    let protocol = inner
        .protocol
        .ok_or_else(|| ProtocolError::schema(l, "protocol", "is required"))?;
    expect_protocol(l, &protocol, REQUEST_PROTOCOL)?;
    let message_b64 = inner
        .message
        .ok_or_else(|| ProtocolError::schema(l, "message", "is required"))?;
    require_non_empty(l, "message", &message_b64)?;
    let message = super::decode_b64(l, "message", &message_b64)?;
    let required = |v: Option<String>, field: &'static str| -> Result<String, ProtocolError> {
        let v = v.ok_or_else(|| ProtocolError::schema(l, field, "is required"))?;
        require_non_empty(l, field, &v)?;
        Ok(v)
    };
    let id = required(inner.id, "id")?;
    let sender = required(inner.sender, "sender")?;
    let caller = required(inner.caller, "caller")?;
    let collective = required(inner.collective, "collective")?;
    let agent = required(inner.agent, "agent")?;
    let ttl = inner
        .ttl
        .ok_or_else(|| ProtocolError::schema(l, "ttl", "is required"))?;
    if ttl < 1 {
        return Err(ProtocolError::schema(
            l,
            "ttl",
            format!("must be at least 1, got {ttl}"),
        ));
    }
    let time = inner
        .time
        .ok_or_else(|| ProtocolError::schema(l, "time", "is required"))?;
    if time < 1 {
        return Err(ProtocolError::schema(l, "time", "must be at least 1"));
    }
    let filter = decode_filter(l, inner.filter)?;

    Ok(Request {
        version: Version::V2,
        id,
        sender,
        caller,
        collective,
        agent,
        ttl,
        time_nanos: time,
        filter,
        message,
        reply_to: headers.reply_to,
        transport_sender: headers.sender,
        caller_jwt: secure.caller,
    })
}

/// The secure layer, with the request, signature and caller JWT the schema
/// requires of it.
fn open_secure(data: &[u8]) -> Result<SecureRequest, ProtocolError> {
    let ls = Layer::SecureRequest;
    let secure: SecureRequest = parse_layer(ls, data, SECURE_REQUEST_PROTOCOL)?;
    if secure.request.is_empty() {
        return Err(ProtocolError::schema(ls, "request", "must not be empty"));
    }
    if secure.signature.is_empty() {
        return Err(ProtocolError::schema(ls, "signature", "must not be empty"));
    }
    require_non_empty(ls, "caller", &secure.caller)?;
    Ok(secure)
}

/// The filter is optional in v2 (Go omits a nil one); when present it is an
/// object (so not null, as in Go's schema) with the required arrays.
fn decode_filter(l: Layer, filter: Option<serde_json::Value>) -> Result<Filter, ProtocolError> {
    let Some(value) = filter else {
        return Ok(Filter::default());
    };
    let obj = value
        .as_object()
        .ok_or_else(|| ProtocolError::schema(l, "filter", "must be an object"))?;
    for key in ["fact", "cf_class", "identity", "compound"] {
        if !obj.get(key).is_some_and(|v| v.is_array()) {
            return Err(ProtocolError::schema(
                l,
                "filter",
                format!("{key} must be an array"),
            ));
        }
    }
    let f: Filter = serde_json::from_value(value)
        .map_err(|e| ProtocolError::schema(l, "filter", e.to_string()))?;
    validate_filter(l, &f)?;
    Ok(f)
}

/// Builds v2 reply layers. Provisioning-mode servers do not sign replies, so the
/// optional `signature` and `sender` fields are left out.
pub fn encode_reply(spec: &ReplySpec<'_>) -> Result<Vec<u8>, ProtocolError> {
    let reply = ReplyDoc {
        protocol: REPLY_PROTOCOL.to_string(),
        message: spec.body.to_vec(),
        request: spec.request_id.to_string(),
        sender: spec.sender.to_string(),
        agent: spec.agent.to_string(),
        time: spec.time_nanos,
    };
    let reply_json = to_json(Layer::Reply, &reply)?;
    let secure = SecureReplyDoc {
        protocol: SECURE_REPLY_PROTOCOL.to_string(),
        hash: reply_hash(&reply_json),
        reply: reply_json,
        signature: Vec::new(),
        sender: String::new(),
    };
    let transport = Transport {
        protocol: TRANSPORT_PROTOCOL.to_string(),
        data: to_json(Layer::SecureReply, &secure)?,
        headers: Some(TransportHeaders {
            reply_to: String::new(),
            sender: spec.sender.to_string(),
            seen_by: hop(spec.connected_url, spec.sender),
            federation: None,
        }),
    };
    to_json(Layer::Transport, &transport)
}

/// Decodes a v2 reply and checks its hash.
pub fn decode_reply(data: &[u8]) -> Result<Reply, ProtocolError> {
    let transport: Transport = open_transport(data, TRANSPORT_PROTOCOL)?;
    let secure: SecureReplyDoc =
        parse_layer(Layer::SecureReply, &transport.data, SECURE_REPLY_PROTOCOL)?;
    if reply_hash(&secure.reply) != secure.hash {
        return Err(ProtocolError::HashMismatch {
            layer: Layer::SecureReply,
            claimed: secure.hash,
        });
    }
    let reply: ReplyDoc = parse_layer(Layer::Reply, &secure.reply, REPLY_PROTOCOL)?;
    Ok(Reply {
        version: Version::V2,
        request_id: reply.request,
        sender: reply.sender,
        agent: reply.agent,
        time_nanos: reply.time,
        message: reply.message,
        transport_sender: transport.headers.map(|h| h.sender).unwrap_or_default(),
    })
}

/// Discovery reads only `headers.sender`.
pub fn transport_sender(data: &[u8]) -> Result<String, ProtocolError> {
    let transport: Transport = open_transport(data, TRANSPORT_PROTOCOL)?;
    let sender = transport.headers.map(|h| h.sender).unwrap_or_default();
    if sender.is_empty() {
        return Err(ProtocolError::schema(
            Layer::Transport,
            "headers.sender",
            "must not be empty",
        ));
    }
    Ok(sender)
}

#[cfg(test)]
mod tests;

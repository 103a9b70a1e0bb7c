//! The Choria wire protocol: transport, secure and inner layers for v1
//! (`choria:*:1`) and v2 (`io.choria.protocol.v2.*`).
//!
//! The version-specific modules only know how to lay out bytes; this module holds
//! the version-independent view ([`Request`], [`Reply`]) that the client, the
//! simulator and the provisioner work with, and the typed errors that name
//! exactly which layer and field was wrong.

pub mod v1;
pub mod v2;

use crate::filter::Filter;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha2::{Digest, Sha256};
use std::fmt;

/// NATS refuses larger payloads by default; anything bigger is not Choria traffic.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// Which generation of the protocol a message belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    V1,
    V2,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        })
    }
}

impl std::str::FromStr for Version {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "v1" | "1" => Ok(Version::V1),
            "v2" | "2" => Ok(Version::V2),
            other => Err(format!(
                "unknown protocol version {other:?}, expected v1 or v2"
            )),
        }
    }
}

/// The protocol layer a decoding error happened in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    Transport,
    SecureRequest,
    Request,
    SecureReply,
    Reply,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layer::Transport => "transport",
            Layer::SecureRequest => "secure request",
            Layer::Request => "request",
            Layer::SecureReply => "secure reply",
            Layer::Reply => "reply",
        })
    }
}

/// Why a message could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("message of {size} bytes exceeds the {limit} byte limit")]
    TooLarge { size: usize, limit: usize },
    #[error("{layer}: not valid JSON: {source}")]
    Json {
        layer: Layer,
        #[source]
        source: serde_json::Error,
    },
    #[error("{layer}: unknown protocol {found:?}, expected {expected}")]
    UnknownProtocol {
        layer: Layer,
        found: String,
        expected: &'static str,
    },
    #[error("{layer}: field {field}: invalid base64: {reason}")]
    Base64 {
        layer: Layer,
        field: &'static str,
        reason: String,
    },
    #[error("{layer}: field {field}: {reason}")]
    Schema {
        layer: Layer,
        field: &'static str,
        reason: String,
    },
    #[error("{layer}: hash mismatch: the reply does not hash to {claimed}")]
    HashMismatch { layer: Layer, claimed: String },
    #[error("a {found} message reached a {expected} endpoint")]
    VersionMismatch { found: Version, expected: Version },
    #[error("could not sign the request: {0}")]
    Signing(String),
    #[error("could not encode {layer}: {source}")]
    Encode {
        layer: Layer,
        #[source]
        source: serde_json::Error,
    },
}

impl ProtocolError {
    pub(crate) fn schema(layer: Layer, field: &'static str, reason: impl Into<String>) -> Self {
        ProtocolError::Schema {
            layer,
            field,
            reason: reason.into(),
        }
    }
}

/// A request as a server sees it after every layer was decoded and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub version: Version,
    pub id: String,
    pub sender: String,
    pub caller: String,
    pub collective: String,
    pub agent: String,
    /// Seconds.
    pub ttl: i64,
    /// Unix nanoseconds (v1 carries whole seconds, widened here).
    pub time_nanos: i64,
    pub filter: Filter,
    /// The inner `message` exactly as carried (v1: the JSON string's bytes; v2: the
    /// base64-decoded bytes).
    pub message: Vec<u8>,
    /// Where replies go, from the transport headers.
    pub reply_to: String,
    /// The transport-level sender header (`mc_sender` / `sender`).
    pub transport_sender: String,
    /// The caller JWT of a v2 request (empty for v1).
    pub caller_jwt: String,
}

impl Request {
    /// The payload as go-choria hands it to an agent: the message is base64-decoded
    /// when it decodes, and used verbatim otherwise (`SetBase64Payload`, errors ignored).
    /// This is why discovery sends `cGluZw==` and RPC sends raw JSON.
    pub fn payload(&self) -> Vec<u8> {
        match STANDARD.decode(&self.message) {
            Ok(decoded) => decoded,
            Err(_) => self.message.clone(),
        }
    }

    /// go-choria's `ValidateTTL`: the creation time must lie strictly inside
    /// `(now - ttl, now + ttl)`.
    pub fn within_ttl(&self, now_nanos: i64) -> bool {
        let window = self.ttl.saturating_mul(1_000_000_000);
        self.time_nanos > now_nanos.saturating_sub(window)
            && self.time_nanos < now_nanos.saturating_add(window)
    }
}

/// What a client wants to send; the id, time and version decide the rest.
#[derive(Clone, Debug)]
pub struct RequestSpec<'a> {
    pub id: &'a str,
    pub sender: &'a str,
    pub caller: &'a str,
    pub collective: &'a str,
    pub agent: &'a str,
    pub ttl: i64,
    pub time_nanos: i64,
    pub filter: &'a Filter,
    pub payload: &'a [u8],
    pub reply_to: &'a str,
    /// The NATS URL the publisher is connected to, recorded as a network hop.
    pub connected_url: &'a str,
}

/// A reply as a client sees it after the hash was verified.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub version: Version,
    pub request_id: String,
    pub sender: String,
    pub agent: String,
    /// Unix nanoseconds.
    pub time_nanos: i64,
    /// The reply body (mcorpc JSON, or `pong` for discovery).
    pub message: Vec<u8>,
    pub transport_sender: String,
}

/// What a server wants to answer.
#[derive(Clone, Debug)]
pub struct ReplySpec<'a> {
    pub request_id: &'a str,
    pub sender: &'a str,
    pub agent: &'a str,
    pub time_nanos: i64,
    pub body: &'a [u8],
    pub connected_url: &'a str,
}

/// How requests are signed at the secure layer.
#[derive(Clone)]
pub enum RequestSigner {
    /// v1 with protocol security off: `signature` and `pubcert` are `"insecure"`.
    V1Insecure,
    /// v1 with an x509 identity: RSA PKCS#1 v1.5 SHA-256 over the request bytes.
    V1Rsa {
        key: crate::security::rsa_signer::RsaSigningKey,
        cert_pem: String,
    },
    /// v2: ed25519 over the request bytes and the caller JWT attached.
    V2 {
        seed: Box<ed25519_dalek::SigningKey>,
        jwt: String,
    },
}

impl fmt::Debug for RequestSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys never reach logs.
        match self {
            RequestSigner::V1Insecure => f.write_str("V1Insecure"),
            RequestSigner::V1Rsa { .. } => f.write_str("V1Rsa(<redacted>)"),
            RequestSigner::V2 { .. } => f.write_str("V2(<redacted>)"),
        }
    }
}

impl RequestSigner {
    pub fn version(&self) -> Version {
        match self {
            RequestSigner::V1Insecure | RequestSigner::V1Rsa { .. } => Version::V1,
            RequestSigner::V2 { .. } => Version::V2,
        }
    }

    /// Encodes a request into the bytes published on NATS.
    pub fn encode_request(&self, spec: &RequestSpec<'_>) -> Result<Vec<u8>, ProtocolError> {
        match self {
            RequestSigner::V1Insecure | RequestSigner::V1Rsa { .. } => {
                v1::encode_request(spec, self)
            }
            RequestSigner::V2 { .. } => v2::encode_request(spec, self),
        }
    }
}

/// Which protocol a transport says it is, without decoding further.
pub fn sniff_version(data: &[u8]) -> Result<Version, ProtocolError> {
    check_size(data)?;
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(default)]
        protocol: String,
    }
    let probe: Probe = serde_json::from_slice(data).map_err(|source| ProtocolError::Json {
        layer: Layer::Transport,
        source,
    })?;
    match probe.protocol.as_str() {
        v1::TRANSPORT_PROTOCOL => Ok(Version::V1),
        v2::TRANSPORT_PROTOCOL => Ok(Version::V2),
        other => Err(ProtocolError::UnknownProtocol {
            layer: Layer::Transport,
            found: other.to_string(),
            expected: "choria:transport:1 or io.choria.protocol.v2.transport",
        }),
    }
}

/// Decodes a request the way a server of protocol `server_version` does: a request
/// of the other version is refused, just as go-choria's security providers refuse
/// the other technology.
pub fn decode_request(data: &[u8], server_version: Version) -> Result<Request, ProtocolError> {
    let found = sniff_version(data)?;
    if found != server_version {
        return Err(ProtocolError::VersionMismatch {
            found,
            expected: server_version,
        });
    }
    match found {
        Version::V1 => v1::decode_request(data),
        Version::V2 => v2::decode_request(data),
    }
}

/// Encodes a reply in the version of the request it answers.
pub fn encode_reply(version: Version, spec: &ReplySpec<'_>) -> Result<Vec<u8>, ProtocolError> {
    match version {
        Version::V1 => v1::encode_reply(spec),
        Version::V2 => v2::encode_reply(spec),
    }
}

/// Decodes a reply of either version and verifies its hash.
pub fn decode_reply(data: &[u8]) -> Result<Reply, ProtocolError> {
    match sniff_version(data)? {
        Version::V1 => v1::decode_reply(data),
        Version::V2 => v2::decode_reply(data),
    }
}

/// The transport-level sender of a message, which is all discovery reads.
pub fn transport_sender(data: &[u8]) -> Result<String, ProtocolError> {
    match sniff_version(data)? {
        Version::V1 => v1::transport_sender(data),
        Version::V2 => v2::transport_sender(data),
    }
}

/// The `seen-by` hop a message records: `[url, identity, url]` for the
/// broker it was published through, nothing when that is unknown.
pub(crate) fn hop(url: &str, identity: &str) -> Vec<[String; 3]> {
    if url.is_empty() {
        return Vec::new();
    }
    vec![[url.to_string(), identity.to_string(), url.to_string()]]
}

/// A layer whose document names its protocol (`choria:transport:1`, …).
pub(crate) trait Layered {
    fn protocol(&self) -> &str;
}

/// Implements [`Layered`] for documents with a `protocol: String` field.
macro_rules! layered {
    ($($t:ty),* $(,)?) => {
        $(impl $crate::protocol::Layered for $t {
            fn protocol(&self) -> &str {
                &self.protocol
            }
        })*
    };
}
pub(crate) use layered;

/// A whole message's outer layer: within the size limit, valid JSON, and
/// naming the `want`ed transport protocol.
pub(crate) fn open_transport<'a, T>(data: &'a [u8], want: &'static str) -> Result<T, ProtocolError>
where
    T: serde::Deserialize<'a> + Layered,
{
    check_size(data)?;
    parse_layer(Layer::Transport, data, want)
}

/// One layer of a message: valid JSON naming the `want`ed protocol.
pub(crate) fn parse_layer<'a, T>(
    layer: Layer,
    data: &'a [u8],
    want: &'static str,
) -> Result<T, ProtocolError>
where
    T: serde::Deserialize<'a> + Layered,
{
    let doc: T = parse_json(layer, data)?;
    expect_protocol(layer, doc.protocol(), want)?;
    Ok(doc)
}

/// The protocol a layer names must be the one expected there.
pub(crate) fn expect_protocol(
    layer: Layer,
    found: &str,
    expected: &'static str,
) -> Result<(), ProtocolError> {
    if found != expected {
        return Err(ProtocolError::UnknownProtocol {
            layer,
            found: found.to_string(),
            expected,
        });
    }
    Ok(())
}

pub(crate) fn check_size(data: &[u8]) -> Result<(), ProtocolError> {
    if data.len() > MAX_MESSAGE_BYTES {
        return Err(ProtocolError::TooLarge {
            size: data.len(),
            limit: MAX_MESSAGE_BYTES,
        });
    }
    Ok(())
}

/// base64(std, padded) of SHA-256: the reply hash of both versions.
pub fn reply_hash(reply_json: &[u8]) -> String {
    STANDARD.encode(Sha256::digest(reply_json))
}

pub(crate) fn parse_json<'a, T: serde::Deserialize<'a>>(
    layer: Layer,
    data: &'a [u8],
) -> Result<T, ProtocolError> {
    serde_json::from_slice(data).map_err(|source| ProtocolError::Json { layer, source })
}

pub(crate) fn to_json<T: serde::Serialize>(
    layer: Layer,
    value: &T,
) -> Result<Vec<u8>, ProtocolError> {
    crate::json::to_vec(value).map_err(|source| ProtocolError::Encode { layer, source })
}

pub(crate) fn decode_b64(
    layer: Layer,
    field: &'static str,
    text: &str,
) -> Result<Vec<u8>, ProtocolError> {
    STANDARD
        .decode(text.as_bytes())
        .map_err(|e| ProtocolError::Base64 {
            layer,
            field,
            reason: e.to_string(),
        })
}

pub(crate) fn require_non_empty(
    layer: Layer,
    field: &'static str,
    value: &str,
) -> Result<(), ProtocolError> {
    if value.is_empty() {
        return Err(ProtocolError::schema(layer, field, "must not be empty"));
    }
    Ok(())
}

/// Checks the filter rules both request schemas share.
pub(crate) fn validate_filter(layer: Layer, filter: &Filter) -> Result<(), ProtocolError> {
    const OPERATORS: [&str; 7] = [">=", "<=", "<", ">", "!=", "==", "=~"];
    for fact in &filter.fact {
        if fact.fact.is_empty() {
            return Err(ProtocolError::schema(
                layer,
                "filter.fact",
                "fact name must not be empty",
            ));
        }
        if fact.value.is_empty() {
            return Err(ProtocolError::schema(
                layer,
                "filter.fact",
                "fact value must not be empty",
            ));
        }
        if !OPERATORS.contains(&fact.operator.as_str()) {
            return Err(ProtocolError::schema(
                layer,
                "filter.fact",
                format!("unknown operator {:?}", fact.operator),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v1 request with nothing set but a 60 s TTL, `time_nanos` and `message`.
    fn request(time_nanos: i64, message: &[u8]) -> Request {
        Request {
            version: Version::V1,
            id: String::new(),
            sender: String::new(),
            caller: String::new(),
            collective: String::new(),
            agent: String::new(),
            ttl: 60,
            time_nanos,
            filter: Filter::default(),
            message: message.to_vec(),
            reply_to: String::new(),
            transport_sender: String::new(),
            caller_jwt: String::new(),
        }
    }

    #[test]
    fn ttl_window_is_strict_on_both_sides() {
        let now = 1_718_000_000_000_000_000i64;
        let mut r = request(now, b"");
        assert!(r.within_ttl(now));
        r.time_nanos = now - 60_000_000_000;
        assert!(!r.within_ttl(now), "exactly ttl old is outside");
        r.time_nanos = now - 59_000_000_000;
        assert!(r.within_ttl(now));
        r.time_nanos = now + 60_000_000_000;
        assert!(!r.within_ttl(now), "exactly ttl in the future is outside");
        r.time_nanos = now + 59_000_000_000;
        assert!(r.within_ttl(now), "clock skew within ttl is tolerated");
    }

    #[test]
    fn payload_is_base64_decoded_only_when_it_decodes() {
        let mut r = request(0, b"cGluZw==");
        assert_eq!(r.payload(), b"ping");
        r.message = br#"{"agent":"rpcutil"}"#.to_vec();
        assert_eq!(r.payload(), br#"{"agent":"rpcutil"}"#);
        // raw "ping" is itself valid base64 and decodes to garbage, as in Go
        r.message = b"ping".to_vec();
        assert_ne!(r.payload(), b"ping");
    }

    #[test]
    fn sniffing_rejects_unknown_protocols_and_garbage() {
        assert!(matches!(
            sniff_version(br#"{"protocol":"choria:transport:9"}"#),
            Err(ProtocolError::UnknownProtocol { .. })
        ));
        assert!(matches!(
            sniff_version(b"not json"),
            Err(ProtocolError::Json { .. })
        ));
        let big = vec![b' '; MAX_MESSAGE_BYTES + 1];
        assert!(matches!(
            sniff_version(&big),
            Err(ProtocolError::TooLarge { .. })
        ));
    }
}

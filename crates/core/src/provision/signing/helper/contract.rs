//! The helper's JSON contract, as the Go provisioner has it: what it is
//! given ([`HelperInput`], byte-compatible with Go's `json.Marshal` of its
//! `Host`, with the node's replies) and what it answers
//! ([`HelperResponse`], decoded as leniently as Go's `json.Unmarshal`:
//! unknown keys ignored, keys matched case-insensitively, `null` leaves the
//! default).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use choria_wire::security::tokens::{ProvisioningClaims, ServerClaims};

/// The node's `choria_provision#gencsr` reply (go-choria `CSRReply`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CsrReply {
    /// PEM CSR made by the node.
    pub csr: String,
    /// PEM public key of the node's private key.
    pub public_key: String,
    /// Where the node keeps its key and will store the certificate.
    pub ssldir: String,
}

/// The node's `choria_provision#gen25519` reply (go-choria `ED25519Reply`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Ed25519Reply {
    /// Hex ed25519 public key.
    pub public_key: String,
    /// Where the node keeps its seed and will store its JWT.
    pub directory: String,
    /// Hex signature over the request nonce.
    pub signature: String,
}

/// What the helper reads on stdin. Field order and names are Go's `Host`.
#[derive(Debug, Serialize)]
pub struct HelperInput<'a> {
    /// The node's identity.
    pub identity: &'a str,
    /// Present with the `pki` feature.
    pub csr: Option<&'a CsrReply>,
    /// Present with the `ed25519` feature.
    pub ed25519_pubkey: Option<&'a Ed25519Reply>,
    /// The node's `rpcutil#inventory` reply as a JSON document, sent as a
    /// string (not an object) like Go does.
    pub inventory: &'a str,
    /// The verified provisioning token's claims, with the `jwt` feature.
    pub jwt: Option<&'a ProvisioningClaims>,
}

impl HelperInput<'_> {
    /// The exact bytes Go's `json.Marshal` would send to the helper.
    pub fn to_json(&self) -> Vec<u8> {
        // Only strings, bools, options and JSON values are serialized into a
        // Vec, none of which can fail.
        choria_wire::json::to_vec(self).expect("helper input always serializes")
    }
}

/// The helper's reply (Go `ConfigResponse`).
#[derive(Default, Clone)]
pub struct HelperResponse {
    /// Try the node again later.
    pub defer: bool,
    /// Tell the node to shut down instead of provisioning it.
    pub shutdown: bool,
    /// Why it was deferred or shut down.
    pub msg: String,
    /// Optional PEM private key for the node. Secret: never logged.
    pub key: String,
    /// PEM certificate for the node.
    pub certificate: String,
    /// PEM CA certificate(s).
    pub ca: String,
    /// Where the node should store key, certificate and CA.
    pub ssldir: String,
    /// Claims to base the node's server JWT on (ed25519 feature).
    pub server_claims: Option<ServerClaims>,
    /// Server configuration settings.
    pub configuration: BTreeMap<String, String>,
    /// Action policies by agent name.
    pub action_policies: BTreeMap<String, String>,
    /// Open Policy Agent policies by agent name (or `default`).
    pub opa_policies: BTreeMap<String, String>,
    /// Version to upgrade the node to before configuring it.
    pub upgrade: String,
}

impl fmt::Debug for HelperResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `key` is a private key; configuration values may hold passwords or
        // tokens, so only their names are shown.
        let key = if self.key.is_empty() {
            ""
        } else {
            "<redacted>"
        };
        f.debug_struct("HelperResponse")
            .field("defer", &self.defer)
            .field("shutdown", &self.shutdown)
            .field("msg", &self.msg)
            .field("key", &key)
            .field("certificate", &self.certificate)
            .field("ca", &self.ca)
            .field("ssldir", &self.ssldir)
            .field("server_claims", &self.server_claims)
            .field("configuration_keys", &self.configuration.keys())
            .field("action_policies", &self.action_policies)
            .field("opa_policies", &self.opa_policies)
            .field("upgrade", &self.upgrade)
            .finish()
    }
}

impl HelperResponse {
    /// Decodes a helper's output the way Go's `json.Unmarshal` fills a
    /// `ConfigResponse` (see the module docs).
    pub fn from_json(data: &[u8]) -> Result<Self, serde_json::Error> {
        // Go replaces invalid UTF-8 inside strings with U+FFFD instead of
        // failing; outside strings it is a syntax error either way.
        match std::str::from_utf8(data) {
            Ok(s) => serde_json::from_str(s),
            Err(_) => serde_json::from_str(&String::from_utf8_lossy(data)),
        }
    }
}

/// The response's keys, for Go-style case-insensitive matching.
#[derive(Clone, Copy)]
enum Field {
    Defer,
    Shutdown,
    Msg,
    Key,
    Certificate,
    Ca,
    Ssldir,
    ServerClaims,
    Configuration,
    ActionPolicies,
    OpaPolicies,
    Upgrade,
}

impl Field {
    /// Matches a key like Go's decoder: case-insensitively, where the
    /// Kelvin sign and long s also fold to `k` and `s`.
    fn lookup(key: &str) -> Option<Field> {
        let mut folded = String::with_capacity(key.len());
        for c in key.chars() {
            folded.push(match c {
                '\u{212A}' => 'k',
                '\u{017F}' => 's',
                c if c.is_ascii() => c.to_ascii_lowercase(),
                // No other character folds to the ASCII field names.
                _ => return None,
            });
        }
        Some(match folded.as_str() {
            "defer" => Field::Defer,
            "shutdown" => Field::Shutdown,
            "msg" => Field::Msg,
            "key" => Field::Key,
            "certificate" => Field::Certificate,
            "ca" => Field::Ca,
            "ssldir" => Field::Ssldir,
            "server_claims" => Field::ServerClaims,
            "configuration" => Field::Configuration,
            "action_policies" => Field::ActionPolicies,
            "opa_policies" => Field::OpaPolicies,
            "upgrade" => Field::Upgrade,
            _ => return None,
        })
    }
}

impl<'de> Deserialize<'de> for HelperResponse {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ResponseVisitor)
    }
}

struct ResponseVisitor;

impl<'de> Visitor<'de> for ResponseVisitor {
    type Value = HelperResponse;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    // Go accepts a bare `null` and leaves every field at its zero value.
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(HelperResponse::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut r = HelperResponse::default();
        // Keys are applied in order, so a repeated key wins like in Go.
        while let Some(key) = map.next_key::<String>()? {
            let Some(field) = Field::lookup(&key) else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            match field {
                Field::Defer => set(&mut r.defer, map.next_value()?),
                Field::Shutdown => set(&mut r.shutdown, map.next_value()?),
                Field::Msg => set(&mut r.msg, map.next_value()?),
                Field::Key => set(&mut r.key, map.next_value()?),
                Field::Certificate => set(&mut r.certificate, map.next_value()?),
                Field::Ca => set(&mut r.ca, map.next_value()?),
                Field::Ssldir => set(&mut r.ssldir, map.next_value()?),
                Field::Upgrade => set(&mut r.upgrade, map.next_value()?),
                // Go sets a pointer to nil on `null`.
                Field::ServerClaims => r.server_claims = map.next_value()?,
                Field::Configuration => map.next_value_seed(StringMap {
                    name: "configuration",
                    map: &mut r.configuration,
                })?,
                Field::ActionPolicies => map.next_value_seed(StringMap {
                    name: "action_policies",
                    map: &mut r.action_policies,
                })?,
                Field::OpaPolicies => map.next_value_seed(StringMap {
                    name: "opa_policies",
                    map: &mut r.opa_policies,
                })?,
            }
        }
        Ok(r)
    }
}

/// Go leaves a bool or string untouched when it reads `null`.
fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *slot = v;
    }
}

/// Decodes a Go `map[string]string` into an existing map: a repeated object
/// adds to it, `null` clears it, `null` values become `""`, and any other
/// non-string value is an error naming the key.
struct StringMap<'m> {
    name: &'static str,
    map: &'m mut BTreeMap<String, String>,
}

impl<'de> DeserializeSeed<'de> for StringMap<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StringMap<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} as an object of strings", self.name)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.map.clear();
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match map.next_value::<MapValue>()? {
                MapValue::Str(v) => {
                    self.map.insert(key, v);
                }
                MapValue::Null => {
                    self.map.insert(key, String::new());
                }
                MapValue::Other(kind) => {
                    return Err(de::Error::custom(format!(
                        "{}[{key:?}] must be a string, not {kind}",
                        self.name
                    )))
                }
            }
        }
        Ok(())
    }
}

/// A map value, classified without failing so the error can name its key.
enum MapValue {
    Str(String),
    Null,
    Other(&'static str),
}

impl<'de> Deserialize<'de> for MapValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MapValueVisitor)
    }
}

struct MapValueVisitor;

impl<'de> Visitor<'de> for MapValueVisitor {
    type Value = MapValue;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<MapValue, E> {
        Ok(MapValue::Str(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<MapValue, E> {
        Ok(MapValue::Str(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<MapValue, E> {
        Ok(MapValue::Null)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<MapValue, E> {
        Ok(MapValue::Other("a boolean"))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<MapValue, E> {
        Ok(MapValue::Other("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<MapValue, E> {
        Ok(MapValue::Other("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<MapValue, E> {
        Ok(MapValue::Other("a number"))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<MapValue, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(MapValue::Other("an array"))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MapValue, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(MapValue::Other("an object"))
    }
}

//! Choria JWTs (`choria-io/tokens` on golang-jwt v5): claim types, signing,
//! verification and Org Issuer trust chains.
//!
//! Three token kinds matter to a provisioner:
//!
//! * the **provisioning token** every unprovisioned server presents (fetched
//!   with the `jwt` action and verified against `jwt_verify_cert`);
//! * the **server token** the provisioner issues in ed25519 / Org Issuer
//!   networks, optionally chain-signed with a `jwt_signing_token`;
//! * the **client id token** used as `jwt_signing_token`, read unverified.
//!
//! Everything is built to produce byte-identical tokens to the Go code: claim
//! order follows Go's struct declaration order (own fields, then the embedded
//! `StandardClaims`, then golang-jwt's `RegisteredClaims`), omitempty rules
//! are copied field by field, strings are escaped like Go's `encoding/json`
//! (`<`, `>`, `&`, U+2028/2029 as `\u....`), and the JOSE header is Go's
//! sorted map `{"alg":…,"typ":"JWT"}`. RSA PKCS#1 v1.5 and Ed25519 signatures
//! are deterministic, so identical claims give identical tokens.
//!
//! Decoding follows Go's leniency where it is cheap: JSON `null` for a scalar
//! claim means "unset", time claims may be integers, floats or numeric
//! strings, `aud` may be a string or an array, unknown claims are ignored and
//! the base64url segments may contain CR/LF and non-canonical trailing bits.
//! Go's case-insensitive key matching is *not* copied (Go never emits such
//! keys).

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use ed25519_dalek::{Signature as EdSignature, Signer, SigningKey, Verifier, VerifyingKey};
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs1::DecodeRsaPublicKey;
use rsa::pkcs1v15;
use rsa::pkcs8::{DecodePrivateKey, DecodePublicKey};
use rsa::signature::{RandomizedSigner, SignatureEncoding};
use rsa::traits::PublicKeyParts;
use rsa::{RsaPrivateKey, RsaPublicKey};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Sha256, Sha384, Sha512};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use x509_cert::der::Decode;

use super::csr::OID_RSA_ENCRYPTION;
use super::ed25519::{decode_hex_array, describe_hex_error};
use super::ksuid::{ksuid_timestamp, new_ksuid_at};
use super::pem_crypt::pem_error_text;

/// `purpose` of provisioning tokens (also accepted in `sub`).
pub const PROVISIONING_PURPOSE: &str = "choria_provisioning";
/// `purpose` of server tokens.
pub const SERVER_PURPOSE: &str = "choria_server";
/// `purpose` of client id tokens.
pub const CLIENT_ID_PURPOSE: &str = "choria_client_id";
/// Issuer used by `tokens` when none is given.
pub const DEFAULT_ISSUER: &str = "Choria Tokens Package";
/// Issuer the Go provisioner puts in server tokens it signs directly.
pub const PROVISIONER_ISSUER: &str = "Choria Provisioner";
/// Default organization (`ou`).
pub const DEFAULT_ORG: &str = "choria";
/// `iss` prefix of tokens issued by a chain issuer.
pub const CHAIN_ISSUER_PREFIX: &str = "C-";
/// `iss` prefix of tokens issued directly by the Org Issuer.
pub const ORG_ISSUER_PREFIX: &str = "I-";
/// Algorithms accepted on verification (`tokens:tokens.go` `validMethods`).
pub const VALID_ALGORITHMS: [&str; 4] = ["RS256", "RS384", "RS512", "EdDSA"];

/// base64url as golang-jwt decodes it: no padding allowed, trailing bits not
/// checked (Go's non-strict decoder).
const JWT_B64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Errors loading signing or verification keys.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key file could not be read.
    #[error("could not read key file {path}: {source}")]
    Read {
        /// File that was read.
        path: PathBuf,
        /// Underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The signing key is neither an RSA PEM nor a hex ed25519 seed.
    #[error("unsupported signing key: expected a PEM block starting \"-----BEGIN RSA PRIVATE KEY\" or \"-----BEGIN PRIVATE KEY\", or a 64 character hex ed25519 seed; got {0} bytes that are neither")]
    UnsupportedSigningKey(usize),
    /// The RSA private key PEM did not parse.
    #[error("could not parse RSA signing key: {0}")]
    RsaPrivateKey(String),
    /// The ed25519 seed is not 32 bytes of hex.
    #[error("invalid ed25519 seed: {0}")]
    Ed25519Seed(String),
    /// The RSA public key / certificate did not parse or is not RSA.
    #[error("could not parse RSA verification key: {0}")]
    RsaPublicKey(String),
    /// The ed25519 public key is not 32 bytes of hex or not a curve point.
    #[error("invalid ed25519 public key: {0}")]
    Ed25519PublicKey(String),
    /// `jwt_verify_cert` is empty.
    #[error("no JWT verification certificate configured, cannot validate JWT")]
    EmptySetting,
}

/// Errors creating, signing, parsing or verifying tokens.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Not three base64url segments, bad base64, bad header JSON, no `alg`.
    #[error("token is malformed: {0}")]
    Malformed(String),
    /// The claims JSON does not fit the claim type.
    #[error("token claims could not be decoded: {0}")]
    Claims(String),
    /// `alg` is not RS256/RS384/RS512/EdDSA.
    #[error("token signing algorithm {0:?} is not allowed; expected one of RS256, RS384, RS512 or EdDSA")]
    UnsupportedAlgorithm(String),
    /// `alg` does not fit the verification key's type.
    #[error("token is signed with {alg}, which needs an {needed} public key, but the verification key is {have}")]
    KeyMismatch {
        /// Token `alg`.
        alg: &'static str,
        /// Key type `alg` needs.
        needed: &'static str,
        /// Key type supplied.
        have: &'static str,
    },
    /// The signature does not verify with the key.
    #[error("token signature is invalid")]
    InvalidSignature,
    /// `exp` has passed (no leeway).
    #[error("token is expired (exp {exp}, now {now})")]
    Expired {
        /// `exp` claim.
        exp: i64,
        /// Verification time.
        now: i64,
    },
    /// `nbf` is in the future (no leeway).
    #[error("token is not valid yet (nbf {nbf}, now {now})")]
    NotYetValid {
        /// `nbf` claim.
        nbf: i64,
        /// Verification time.
        now: i64,
    },
    /// Issuer expiry check failed (Go returns `jwt.ErrTokenExpired` for all of
    /// these; we say which rule failed).
    #[error("token is expired: {0}")]
    IssuerExpiry(&'static str),
    /// Neither `purpose` nor `sub` says `choria_provisioning`.
    #[error("not a provisioning token (purpose {purpose:?}, sub {subject:?})")]
    NotProvisioningToken {
        /// `purpose` claim (clipped).
        purpose: String,
        /// `sub` claim (clipped).
        subject: String,
    },
    /// `purpose` is not `choria_server`.
    #[error("not a server token (purpose {0:?})")]
    NotServerToken(String),
    /// `purpose` is not `choria_client_id`.
    #[error("not a client token (purpose {0:?})")]
    NotClientToken(String),
    /// The Org Issuer trust chain did not verify.
    #[error("not signed by issuer: {0}")]
    NotSignedByIssuer(String),
    /// A chain-issued token was required but `iss` has no `C-` prefix.
    #[error("token is not chain issued: issuer {0:?} does not start with \"C-\"")]
    NotChainIssued(String),
    /// Adding chain (or org) issuer data failed.
    #[error("cannot add issuer chain data: {0}")]
    ChainIssuer(String),
    /// Claims given to a constructor are invalid.
    #[error("invalid claims: {0}")]
    InvalidClaims(String),
    /// Claims could not be serialized.
    #[error("could not serialize claims: {0}")]
    Serialize(String),
    /// Key loading failed.
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// Shortens attacker-controlled text before it goes into an error message.
fn clip(s: &str) -> String {
    const MAX: usize = 64;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(MAX).collect();
        out.push('…');
        out
    }
}

/// Describes a claims decoding error without echoing claim values (which may
/// be secrets such as `cht` or `chpwd`).
fn describe_claims_error(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let pos = format!("line {}, column {}", e.line(), e.column());
    match e.classify() {
        Category::Syntax | Category::Eof => format!("claims are not valid JSON ({pos})"),
        Category::Io => "claims could not be read".to_string(),
        Category::Data => {
            let msg = e.to_string();
            let msg = msg.split(" at line ").next().unwrap_or_default();
            let safe_prefixes = ["missing field", "duplicate field", "invalid NumericDate"];
            if safe_prefixes.iter().any(|p| msg.starts_with(p)) {
                format!("{msg} ({pos})")
            } else if let Some(idx) = msg.find(", expected ") {
                let kind = if msg.starts_with("invalid type") {
                    "invalid type"
                } else {
                    "invalid value"
                };
                format!("{kind}{} ({pos})", &msg[idx..])
            } else {
                format!("a claim has an invalid value ({pos})")
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Go JSON compatibility helpers
// ---------------------------------------------------------------------------

mod go_serde {
    use serde::de::{self, Deserializer, SeqAccess, Visitor};
    use serde::{Deserialize, Serializer};
    use std::fmt;

    /// JSON `null` (or a missing key, with `#[serde(default)]`) becomes the
    /// type's default, as Go's decoder leaves the zero value in place.
    pub fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + Default,
    {
        Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
    }

    pub fn is_false(b: &bool) -> bool {
        !*b
    }

    /// golang-jwt `*NumericDate`: integer seconds on output; any JSON number
    /// (or numeric string, as Go's `json.Number` allows) on input, fractions
    /// floored like `time.Truncate(time.Second)`.
    pub mod numeric_date {
        use super::*;

        pub fn serialize<S: Serializer>(v: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(n) => s.serialize_i64(*n),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
            d.deserialize_any(NumericDateVisitor)
        }

        struct NumericDateVisitor;

        fn from_f64<E: de::Error>(f: f64) -> Result<Option<i64>, E> {
            // i64::MAX as f64 rounds up to 2^63, so use a strict bound
            if !f.is_finite() || f >= 9.2e18 || f <= -9.2e18 {
                return Err(E::custom("invalid NumericDate: number out of range"));
            }
            Ok(Some(f.floor() as i64))
        }

        impl<'de> Visitor<'de> for NumericDateVisitor {
            type Value = Option<i64>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a NumericDate (seconds since the Unix epoch)")
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Some(v))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i64::try_from(v)
                    .map(Some)
                    .map_err(|_| E::custom("invalid NumericDate: number out of range"))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                from_f64(v)
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                let n: serde_json::Number = serde_json::from_str(v)
                    .map_err(|_| E::custom("invalid NumericDate: string is not a JSON number"))?;
                if let Some(i) = n.as_i64() {
                    Ok(Some(i))
                } else if let Some(f) = n.as_f64() {
                    from_f64(f)
                } else {
                    Err(E::custom("invalid NumericDate: number out of range"))
                }
            }

            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }

            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(NumericDateVisitor)
            }
        }
    }

    /// golang-jwt `ClaimStrings`: a string or an array of strings on input,
    /// always an array on output (`MarshalSingleStringAsArray` defaults to
    /// true in v5).
    pub mod claim_strings {
        use super::*;

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
            d.deserialize_any(ClaimStringsVisitor)
        }

        struct ClaimStringsVisitor;

        impl<'de> Visitor<'de> for ClaimStringsVisitor {
            type Value = Vec<String>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of strings")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(vec![v.to_string()])
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(out)
            }

            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Vec::new())
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Vec::new())
            }

            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(ClaimStringsVisitor)
            }
        }
    }
}

use go_serde::{claim_strings, is_false, null_default, numeric_date};

/// Serializes a JSON value the way Go re-marshals an `interface{}` it
/// decoded: object keys sorted (even if serde_json's `preserve_order` is
/// enabled somewhere in the build), every number treated as a float64 (so
/// `2.0` becomes `2`, huge integers lose precision like in Go). Integral
/// numbers within 2^53 are emitted as integers so plain `serde_json` output
/// stays natural too.
struct GoValue<'a>(&'a serde_json::Value);

impl Serialize for GoValue<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde_json::Value;
        const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
        match self.0 {
            Value::Number(n) => {
                let f = n.as_f64().unwrap_or_default();
                if f.fract() == 0.0 && f.abs() <= EXACT && !(f == 0.0 && f.is_sign_negative()) {
                    s.serialize_i64(f as i64)
                } else {
                    s.serialize_f64(f)
                }
            }
            Value::Array(a) => s.collect_seq(a.iter().map(GoValue)),
            Value::Object(m) => serialize_go_map(m, s),
            other => other.serialize(s),
        }
    }
}

/// A JSON object as Go re-marshals a `map[string]any`: keys sorted, values
/// as [`GoValue`].
fn serialize_go_map<S: serde::Serializer>(
    m: &serde_json::Map<String, serde_json::Value>,
    s: S,
) -> Result<S::Ok, S::Error> {
    let mut entries: Vec<_> = m.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    s.collect_map(entries.into_iter().map(|(k, v)| (k, GoValue(v))))
}

fn serialize_extensions<S: serde::Serializer>(
    v: &Option<serde_json::Map<String, serde_json::Value>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        None => s.serialize_none(),
        Some(m) => serialize_go_map(m, s),
    }
}

/// Serializes `value` to compact JSON exactly as Go's `json.Marshal` would for
/// the equivalent struct (given matching field order).
pub fn to_go_json<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    crate::choria::json::to_vec(value)
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn validity_secs(validity: Duration) -> Result<i64, TokenError> {
    i64::try_from(validity.as_secs())
        .map_err(|_| TokenError::InvalidClaims("validity is too large".into()))
}

// ---------------------------------------------------------------------------
// Claims
// ---------------------------------------------------------------------------

/// `tokens.StandardClaims` with golang-jwt v5 `RegisteredClaims` inlined, in
/// Go's marshal order: `purpose`, `tcs`, `public_key`, `issexp`, `iss`, `sub`,
/// `aud`, `exp`, `nbf`, `iat`, `jti`. Only `purpose` is not omitempty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StandardClaims {
    /// Token kind, e.g. `choria_server`.
    #[serde(default, deserialize_with = "null_default")]
    pub purpose: String,
    /// Trust chain signature (hex, dot separated for chain-issued tokens).
    #[serde(
        rename = "tcs",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub trust_chain_signature: String,
    /// Hex ed25519 public key of the token's subject.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub public_key: String,
    /// Expiry of the issuer of a chain-issued token (Unix seconds).
    #[serde(
        rename = "issexp",
        default,
        skip_serializing_if = "Option::is_none",
        with = "numeric_date"
    )]
    pub issuer_expires_at: Option<i64>,
    /// `iss`.
    #[serde(
        rename = "iss",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub issuer: String,
    /// `sub`.
    #[serde(
        rename = "sub",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub subject: String,
    /// `aud` (string or array on input, array on output).
    #[serde(
        rename = "aud",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "claim_strings::deserialize"
    )]
    pub audience: Vec<String>,
    /// `exp` (Unix seconds).
    #[serde(
        rename = "exp",
        default,
        skip_serializing_if = "Option::is_none",
        with = "numeric_date"
    )]
    pub expires_at: Option<i64>,
    /// `nbf` (Unix seconds).
    #[serde(
        rename = "nbf",
        default,
        skip_serializing_if = "Option::is_none",
        with = "numeric_date"
    )]
    pub not_before: Option<i64>,
    /// `iat` (Unix seconds).
    #[serde(
        rename = "iat",
        default,
        skip_serializing_if = "Option::is_none",
        with = "numeric_date"
    )]
    pub issued_at: Option<i64>,
    /// `jti`, a KSUID for tokens made by `tokens`.
    #[serde(
        rename = "jti",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub id: String,
}

impl StandardClaims {
    /// `tokens.newStandardClaims`: `iat = nbf = now`, `exp = now + validity`
    /// (validity 0 ⇒ 1 hour), `jti` = KSUID at `now`, `iss` defaulted to
    /// [`DEFAULT_ISSUER`], `sub = purpose` when `set_subject`.
    pub fn new_at(
        issuer: &str,
        purpose: &str,
        validity: Duration,
        now: i64,
        set_subject: bool,
    ) -> Result<Self, TokenError> {
        let validity = if validity.is_zero() {
            Duration::from_secs(3600)
        } else {
            validity
        };
        let exp = now
            .checked_add(validity_secs(validity)?)
            .ok_or_else(|| TokenError::InvalidClaims("validity is too large".into()))?;
        let id = new_ksuid_at(now).map_err(|e| TokenError::InvalidClaims(e.to_string()))?;
        Ok(Self {
            purpose: purpose.to_string(),
            issuer: if issuer.is_empty() {
                DEFAULT_ISSUER.to_string()
            } else {
                issuer.to_string()
            },
            subject: if set_subject {
                purpose.to_string()
            } else {
                String::new()
            },
            issued_at: Some(now),
            not_before: Some(now),
            expires_at: Some(exp),
            id,
            ..Self::default()
        })
    }

    /// `ExpireTime`: the earlier of `exp` and `issexp`, whichever are set.
    pub fn expire_time(&self) -> Option<i64> {
        match (self.expires_at, self.issuer_expires_at) {
            (Some(e), Some(i)) => Some(e.min(i)),
            (e, i) => e.or(i),
        }
    }

    /// `IsExpired` at `now` (no expiry at all counts as expired, as in Go
    /// where the zero time is in the past).
    pub fn is_expired_at(&self, now: i64) -> bool {
        self.expire_time().is_none_or(|t| now >= t)
    }

    /// True when `sub` or `purpose` is `choria_provisioning`.
    pub fn is_provisioning(&self) -> bool {
        self.subject == PROVISIONING_PURPOSE || self.purpose == PROVISIONING_PURPOSE
    }

    /// `verifyIssuerExpiry(required)`. `required` is set when the token has a
    /// `tcs`; then the issuer must be a chain issuer with an `issexp` and
    /// neither `exp` nor `issexp` may have passed.
    pub fn verify_issuer_expiry_at(&self, required: bool, now: i64) -> Result<(), TokenError> {
        let fail = |reason| {
            if required {
                Err(TokenError::IssuerExpiry(reason))
            } else {
                Ok(())
            }
        };
        if !self.issuer.starts_with(CHAIN_ISSUER_PREFIX) {
            return fail("the token has a trust chain signature but its issuer is not a chain issuer (no \"C-\" prefix)");
        }
        if self.trust_chain_signature.is_empty() {
            return fail("the token has no trust chain signature");
        }
        if self.issuer_expires_at.is_none() {
            return fail("the token has a trust chain signature but no issuer expiry (issexp)");
        }
        if self.is_expired_at(now) {
            return Err(TokenError::IssuerExpiry(
                "the token or its chain issuer has expired",
            ));
        }
        Ok(())
    }

    /// `AddOrgIssuerData`: makes this token a chain issuer signed by the Org
    /// Issuer: `iss = "I-" + hex(org pub)`, `tcs = hex(sign(org, jti + "." +
    /// public_key))`.
    pub fn add_org_issuer_data(&mut self, org_issuer: &SigningKey) -> Result<(), TokenError> {
        if self.id.is_empty() {
            return Err(TokenError::ChainIssuer("no token id (jti) set".into()));
        }
        if self.public_key.is_empty() {
            return Err(TokenError::ChainIssuer("no public key set".into()));
        }
        let data = format!("{}.{}", self.id, self.public_key);
        let sig = org_issuer.sign(data.as_bytes());
        self.issuer = format!(
            "{ORG_ISSUER_PREFIX}{}",
            hex::encode(org_issuer.verifying_key().as_bytes())
        );
        self.trust_chain_signature = hex::encode(sig.to_bytes());
        Ok(())
    }

    /// `AddChainIssuerData` (`tokens:standard.go`), as the Go provisioner uses
    /// it for `jwt_signing_token`:
    ///
    /// * `iss = "C-" + signer.jti + "." + signer.public_key`
    /// * `issexp = signer.exp`, `exp = min(exp, signer.exp)`
    /// * `tcs = signer.tcs + "." + hex(ed25519(signer_key, jti + "." + signer.tcs))`
    ///
    /// Stricter than Go: the signer must have a `tcs` (the Go provisioner checks
    /// this separately: "no Trust Chain Signature claim in JWT Signing Token"),
    /// and `signer_key` must match `signer.public_key`, because any mismatch
    /// yields a token every broker rejects.
    pub fn add_chain_issuer_data(
        &mut self,
        signer: &StandardClaims,
        signer_key: &SigningKey,
    ) -> Result<(), TokenError> {
        let err = |m: &str| Err(TokenError::ChainIssuer(m.to_string()));
        if signer.id.is_empty() {
            return err("the signing token has no id (jti)");
        }
        if signer.public_key.is_empty() {
            return err("the signing token has no public_key");
        }
        let Some(signer_exp) = signer.expires_at else {
            return err("the signing token has no expiry (exp)");
        };
        if signer.trust_chain_signature.is_empty() {
            return err("no Trust Chain Signature claim in JWT Signing Token");
        }
        if signer.id.contains('.') || signer.public_key.contains('.') {
            return err(
                "the signing token's jti or public_key contains '.', the issuer would be ambiguous",
            );
        }
        if self.id.is_empty() {
            return err("the token has no id (jti)");
        }
        let signer_pub = decode_hex_array::<32>(&signer.public_key).map_err(|e| {
            TokenError::ChainIssuer(format!("the signing token's public_key is invalid: {e}"))
        })?;
        if signer_pub != signer_key.verifying_key().to_bytes() {
            return err("the signing key does not match the public_key of the signing token");
        }

        self.issuer = format!("{CHAIN_ISSUER_PREFIX}{}.{}", signer.id, signer.public_key);
        self.issuer_expires_at = Some(signer_exp);
        if self.expires_at.is_none_or(|e| signer_exp < e) {
            self.expires_at = Some(signer_exp);
        }
        let data = format!("{}.{}", self.id, signer.trust_chain_signature);
        let sig = signer_key.sign(data.as_bytes());
        self.trust_chain_signature = format!(
            "{}.{}",
            signer.trust_chain_signature,
            hex::encode(sig.to_bytes())
        );
        Ok(())
    }

    /// `verifyIssuerRequiredClaims`.
    fn verify_issuer_required_claims(&self) -> Result<(), String> {
        if self.issuer.is_empty() {
            return Err("no issuer set".into());
        }
        if self.public_key.is_empty() {
            return Err("no public key set".into());
        }
        if self.trust_chain_signature.is_empty() {
            return Err("no trust chain signature set".into());
        }
        if self.id.is_empty() {
            return Err("id not set".into());
        }
        let Some(iat) = self.issued_at else {
            return Err("no issued time set".into());
        };
        if self.expires_at.is_none() {
            return Err("no expires set".into());
        }
        let ts = ksuid_timestamp(&self.id).map_err(|_| "invalid ksuid format".to_string())?;
        if ts != iat {
            return Err("id is not based on issued time".into());
        }
        Ok(())
    }

    /// `IsSignedByIssuer` for `C-` issuers: checks the Org Issuer signed the
    /// chain issuer's `"<id>.<pubkey>"` and the chain issuer signed
    /// `"<jti>.<tcs part 1>"`; returns the chain issuer's key, which must then
    /// verify the JWS itself. `I-` issuers are checked against the org key and
    /// return it.
    pub fn signed_by_issuer_key(
        &self,
        org_issuer: &VerifyingKey,
    ) -> Result<VerifyingKey, TokenError> {
        let nsbi = |m: String| TokenError::NotSignedByIssuer(m);
        self.verify_issuer_required_claims().map_err(nsbi)?;

        if let Some(org_hex) = self.issuer.strip_prefix(ORG_ISSUER_PREFIX) {
            if org_hex != hex::encode(org_issuer.as_bytes()) {
                return Err(nsbi("public keys do not match".into()));
            }
            let sig = hex::decode(&self.trust_chain_signature).map_err(|e| {
                nsbi(format!(
                    "invalid trust chain signature: {}",
                    describe_hex_error(&e)
                ))
            })?;
            let data = format!("{}.{}", self.id, self.public_key);
            verify_ed25519(org_issuer, data.as_bytes(), &sig)
                .map_err(|_| nsbi("invalid trust chain signature".into()))?;
            return Ok(*org_issuer);
        }

        let Some(chain) = self.issuer.strip_prefix(CHAIN_ISSUER_PREFIX) else {
            return Err(nsbi("unsupported issuer format".into()));
        };
        if self.issuer_expires_at.is_none() {
            return Err(nsbi("no issuer expires set".into()));
        }
        let parts: Vec<&str> = chain.split('.').collect();
        let [id, pk_hex] = parts[..] else {
            return Err(nsbi("invalid issuer content".into()));
        };
        if id.is_empty() {
            return Err(nsbi("invalid id in issuer".into()));
        }
        if pk_hex.is_empty() {
            return Err(nsbi("invalid public key in issuer".into()));
        }
        let chain_pub =
            hex::decode(pk_hex).map_err(|_| nsbi("invalid public key in issuer data".into()))?;
        let tcs_parts: Vec<&str> = self.trust_chain_signature.split('.').collect();
        let [org_tcs, chain_sig_hex] = tcs_parts[..] else {
            return Err(nsbi("invalid trust chain signature".into()));
        };
        if org_tcs.is_empty() || chain_sig_hex.is_empty() {
            return Err(nsbi("invalid trust chain signature".into()));
        }
        let chain_sig = hex::decode(chain_sig_hex).map_err(|e| {
            nsbi(format!(
                "invalid signature in chain signature: {}",
                describe_hex_error(&e)
            ))
        })?;
        let org_sig = hex::decode(org_tcs).map_err(|e| {
            nsbi(format!(
                "invalid trust chain signature encoding: {}",
                describe_hex_error(&e)
            ))
        })?;
        let org_data = format!("{id}.{}", hex::encode(&chain_pub));
        verify_ed25519(org_issuer, org_data.as_bytes(), &org_sig)
            .map_err(|_| nsbi("chain issuer credentials not signed by org issuer".into()))?;

        let chain_pub: [u8; 32] = chain_pub.as_slice().try_into().map_err(|_| {
            nsbi("chain signature validation failed: invalid public key size".into())
        })?;
        let chain_key = VerifyingKey::from_bytes(&chain_pub)
            .map_err(|_| nsbi("chain signature validation failed: invalid public key".into()))?;
        let user_data = format!("{}.{org_tcs}", self.id);
        verify_ed25519(&chain_key, user_data.as_bytes(), &chain_sig)
            .map_err(|_| nsbi("invalid chain signature".into()))?;
        Ok(chain_key)
    }
}

fn verify_ed25519(key: &VerifyingKey, msg: &[u8], sig: &[u8]) -> Result<(), ()> {
    let sig = EdSignature::from_slice(sig).map_err(|_| ())?;
    key.verify(msg, &sig).map_err(|_| ())
}

/// Access to the embedded standard claims of a token type.
pub trait HasStandardClaims {
    /// The embedded standard claims.
    fn standard(&self) -> &StandardClaims;
}

impl HasStandardClaims for StandardClaims {
    fn standard(&self) -> &StandardClaims {
        self
    }
}

/// `tokens.ProvisioningClaims`. Field order is Go's marshal order. `Debug`
/// redacts `cht` and `chpwd`.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProvisioningClaims {
    /// `cht`: the shared secret sent as `token` in every provisioning RPC.
    #[serde(rename = "cht", default, deserialize_with = "null_default")]
    pub token: String,
    /// `chs`: protocol security during provisioning.
    #[serde(rename = "chs", default, deserialize_with = "null_default")]
    pub secure: bool,
    /// `chu`: comma separated broker URLs.
    #[serde(
        rename = "chu",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub urls: String,
    /// `chsrv`: SRV domain.
    #[serde(
        rename = "chsrv",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub srv_domain: String,
    /// `chpd`: provision by default (must be true for provisioning to happen).
    #[serde(rename = "chpd", default, deserialize_with = "null_default")]
    pub prov_default: bool,
    /// `chrd`: registration data file.
    #[serde(
        rename = "chrd",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub prov_reg_data: String,
    /// `chf`: facts file.
    #[serde(
        rename = "chf",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub prov_facts: String,
    /// `chusr`: broker user for the provisioning connection.
    #[serde(
        rename = "chusr",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub prov_nats_user: String,
    /// `chpwd`: broker password for the provisioning connection.
    #[serde(
        rename = "chpwd",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub prov_nats_pass: String,
    /// `extensions`: free-form object, **not** omitempty (`null` when unset,
    /// `{}` when an empty map was given, as in Go).
    #[serde(default, serialize_with = "serialize_extensions")]
    pub extensions: Option<serde_json::Map<String, serde_json::Value>>,
    /// `ou`: organization (parsers default it to `choria`).
    #[serde(
        rename = "ou",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub organization_unit: String,
    /// `v2`: provision with protocol v2 / choria security.
    #[serde(
        rename = "v2",
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub proto_v2: bool,
    /// `update`: allow `release_update`.
    #[serde(
        rename = "update",
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub allow_update: bool,
    /// Embedded standard claims.
    #[serde(flatten)]
    pub standard: StandardClaims,
}

impl fmt::Debug for ProvisioningClaims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redact = |s: &str| if s.is_empty() { "" } else { "<redacted>" };
        f.debug_struct("ProvisioningClaims")
            .field("token", &redact(&self.token))
            .field("secure", &self.secure)
            .field("urls", &self.urls)
            .field("srv_domain", &self.srv_domain)
            .field("prov_default", &self.prov_default)
            .field("prov_reg_data", &self.prov_reg_data)
            .field("prov_facts", &self.prov_facts)
            .field("prov_nats_user", &self.prov_nats_user)
            .field("prov_nats_pass", &redact(&self.prov_nats_pass))
            .field("extensions", &self.extensions)
            .field("organization_unit", &self.organization_unit)
            .field("proto_v2", &self.proto_v2)
            .field("allow_update", &self.allow_update)
            .field("standard", &self.standard)
            .finish()
    }
}

impl HasStandardClaims for ProvisioningClaims {
    fn standard(&self) -> &StandardClaims {
        &self.standard
    }
}

impl ProvisioningClaims {
    /// `tokens.NewProvisioningClaims` for tests and simulators: `chpd` true,
    /// `chs` false, `ou` `choria`, `purpose` and `sub` `choria_provisioning`,
    /// default issuer. Set other public fields afterwards as needed. One of
    /// `urls` / `srv_domain` is required, as in Go.
    pub fn new_at(
        token: &str,
        urls: &str,
        srv_domain: &str,
        validity: Duration,
        now: i64,
    ) -> Result<Self, TokenError> {
        if urls.is_empty() && srv_domain.is_empty() {
            return Err(TokenError::InvalidClaims(
                "srv domain or urls required".into(),
            ));
        }
        Ok(Self {
            token: token.to_string(),
            urls: urls.to_string(),
            srv_domain: srv_domain.to_string(),
            prov_default: true,
            organization_unit: DEFAULT_ORG.to_string(),
            standard: StandardClaims::new_at("", PROVISIONING_PURPOSE, validity, now, true)?,
            ..Self::default()
        })
    }
}

/// `tokens.ServerPermissions`; every flag is omitempty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerPermissions {
    /// Access to `<collective>.submission.in.>`.
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub submission: bool,
    /// Choria Streams access.
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub streams: bool,
    /// Governor access.
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub governor: bool,
    /// May host services.
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub service_host: bool,
}

/// `tokens.ServerClaims`. `collectives` is not omitempty; an empty list is
/// written as `[]` (Go writes `null` for a nil slice; issued tokens always
/// have at least one collective).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerClaims {
    /// Server identity.
    #[serde(default, deserialize_with = "null_default")]
    pub identity: String,
    /// Collectives the server belongs to.
    #[serde(default, deserialize_with = "null_default")]
    pub collectives: Vec<String>,
    /// Extra permissions (`{}` when present but all false, as in Go).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<ServerPermissions>,
    /// `ou`.
    #[serde(
        rename = "ou",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub organization_unit: String,
    /// `pub_subjects`.
    #[serde(
        rename = "pub_subjects",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub additional_publish_subjects: Vec<String>,
    /// Embedded standard claims.
    #[serde(flatten)]
    pub standard: StandardClaims,
}

impl HasStandardClaims for ServerClaims {
    fn standard(&self) -> &StandardClaims {
        &self.standard
    }
}

impl ServerClaims {
    /// `tokens.NewServerClaims` as called by the Go provisioner: `purpose`
    /// `choria_server`, no `sub`, `iat = nbf = now`, `exp = now + validity`,
    /// `jti` = KSUID(now), `public_key` = the server's ed25519 key from
    /// `gen25519` (normalised to lowercase hex), `ou` defaulted to `choria`,
    /// `iss` defaulted to [`DEFAULT_ISSUER`] (the provisioner passes
    /// [`PROVISIONER_ISSUER`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        identity: &str,
        collectives: Vec<String>,
        ou: &str,
        permissions: Option<ServerPermissions>,
        pub_subjects: Vec<String>,
        server_public_key_hex: &str,
        issuer: &str,
        validity: Duration,
    ) -> Result<Self, TokenError> {
        Self::new_at(
            unix_now(),
            identity,
            collectives,
            ou,
            permissions,
            pub_subjects,
            server_public_key_hex,
            issuer,
            validity,
        )
    }

    /// [`ServerClaims::new`] at a fixed time (Unix seconds).
    #[allow(clippy::too_many_arguments)]
    pub fn new_at(
        now: i64,
        identity: &str,
        collectives: Vec<String>,
        ou: &str,
        permissions: Option<ServerPermissions>,
        pub_subjects: Vec<String>,
        server_public_key_hex: &str,
        issuer: &str,
        validity: Duration,
    ) -> Result<Self, TokenError> {
        if identity.is_empty() {
            return Err(TokenError::InvalidClaims("identity is required".into()));
        }
        if collectives.is_empty() {
            return Err(TokenError::InvalidClaims(
                "at least one collective is required".into(),
            ));
        }
        if server_public_key_hex.is_empty() {
            return Err(TokenError::InvalidClaims("public key is required".into()));
        }
        let pk = decode_hex_array::<32>(server_public_key_hex).map_err(|e| {
            TokenError::InvalidClaims(format!("server public key is not a hex ed25519 key: {e}"))
        })?;
        if validity.is_zero() {
            return Err(TokenError::InvalidClaims("validity is required".into()));
        }
        let mut standard = StandardClaims::new_at(issuer, SERVER_PURPOSE, validity, now, false)?;
        standard.public_key = hex::encode(pk);
        Ok(Self {
            identity: identity.to_string(),
            collectives,
            permissions,
            organization_unit: if ou.is_empty() {
                DEFAULT_ORG.to_string()
            } else {
                ou.to_string()
            },
            additional_publish_subjects: pub_subjects,
            standard,
        })
    }

    /// Chain-signs this token with the provisioner's `jwt_signing_token` and
    /// `jwt_signing_key` (see [`StandardClaims::add_chain_issuer_data`]).
    pub fn add_chain_issuer_data(
        &mut self,
        signer_token: &ClientIdClaims,
        signer_key: &SigningKey,
    ) -> Result<(), TokenError> {
        self.standard
            .add_chain_issuer_data(&signer_token.standard, signer_key)
    }
}

/// `tokens.ClientPermissions`; every flag is omitempty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct ClientPermissions {
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub streams_admin: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub streams_user: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub events_viewer: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub election_user: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub system_user: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub governor: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub org_admin: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub fleet_management: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub signed_fleet_management: bool,
    /// `service`: extended service lifetime.
    #[serde(
        rename = "service",
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub extended_service_lifetime: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub authentication_delegator: bool,
    /// `provisioner`: may connect to the provisioning account.
    #[serde(
        rename = "provisioner",
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub server_provisioner: bool,
}

/// `tokens.ClientIDClaims`, used for the provisioner's `jwt_signing_token`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientIdClaims {
    /// `callerid` (not omitempty).
    #[serde(rename = "callerid", default, deserialize_with = "null_default")]
    pub caller_id: String,
    /// `agents`.
    #[serde(
        rename = "agents",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub allowed_agents: Vec<String>,
    /// `ou`.
    #[serde(
        rename = "ou",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub organization_unit: String,
    /// `user_properties` (sorted on output like a Go map).
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_default"
    )]
    pub user_properties: BTreeMap<String, String>,
    /// `opa_policy`.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub opa_policy: String,
    /// `permissions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<ClientPermissions>,
    /// `pub_subjects`.
    #[serde(
        rename = "pub_subjects",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub additional_publish_subjects: Vec<String>,
    /// `sub_subjects`.
    #[serde(
        rename = "sub_subjects",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub additional_subscribe_subjects: Vec<String>,
    /// Embedded standard claims.
    #[serde(flatten)]
    pub standard: StandardClaims,
}

impl HasStandardClaims for ClientIdClaims {
    fn standard(&self) -> &StandardClaims {
        &self.standard
    }
}

impl ClientIdClaims {
    /// `tokens.NewClientIDClaims` (subset) for tests: `purpose`
    /// `choria_client_id`, `ou` defaulted to `choria`.
    pub fn new_at(
        now: i64,
        caller_id: &str,
        public_key_hex: Option<&str>,
        issuer: &str,
        validity: Duration,
    ) -> Result<Self, TokenError> {
        if caller_id.is_empty() {
            return Err(TokenError::InvalidClaims("caller id is required".into()));
        }
        let mut standard = StandardClaims::new_at(issuer, CLIENT_ID_PURPOSE, validity, now, false)?;
        standard.public_key = public_key_hex.unwrap_or_default().to_string();
        Ok(Self {
            caller_id: caller_id.to_string(),
            organization_unit: DEFAULT_ORG.to_string(),
            standard,
            ..Self::default()
        })
    }
}

// ---------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------

const RSA_KEY_HEADER: &[u8] = b"-----BEGIN RSA PRIVATE KEY";
const PKCS8_KEY_HEADER: &[u8] = b"-----BEGIN PRIVATE KEY";
const CERT_HEADER: &[u8] = b"-----BEGIN CERTIFICATE";
const PK_HEADER: &[u8] = b"-----BEGIN PUBLIC KEY";
const RSA_PK_HEADER: &[u8] = b"-----BEGIN RSA PUBLIC KEY";

fn read_key_file(path: &Path) -> Result<Vec<u8>, KeyError> {
    std::fs::read(path).map_err(|source| KeyError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// A JWT signing key: RSA (⇒ RS256) or ed25519 (⇒ EdDSA). `Debug` redacts.
#[derive(Clone)]
pub enum TokenSigningKey {
    /// RSA private key, signs RS256.
    Rsa(RsaPrivateKey),
    /// Ed25519 key, signs EdDSA.
    Ed25519(SigningKey),
}

impl fmt::Debug for TokenSigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rsa(k) => write!(
                f,
                "TokenSigningKey::Rsa(<redacted {} bit key>)",
                k.n().bits()
            ),
            Self::Ed25519(k) => write!(
                f,
                "TokenSigningKey::Ed25519(<redacted>, public {})",
                hex::encode(k.verifying_key().as_bytes())
            ),
        }
    }
}

impl TokenSigningKey {
    /// Loads a key file like `tokens.SignTokenWithKeyFile` (`jwt_signing_key`).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, KeyError> {
        Self::from_bytes(&read_key_file(path.as_ref())?)
    }

    /// Interprets key bytes: a PEM starting `-----BEGIN RSA PRIVATE KEY`
    /// (PKCS#1) or `-----BEGIN PRIVATE KEY` (PKCS#8 RSA) ⇒ RS256; otherwise 64
    /// hex characters of ed25519 seed ⇒ EdDSA.
    ///
    /// Deliberately lenient: trailing whitespace after the hex seed (one
    /// newline from an editor or `echo`) is accepted, where Go's `len == 64`
    /// check rejects it.
    pub fn from_bytes(data: &[u8]) -> Result<Self, KeyError> {
        if data.starts_with(RSA_KEY_HEADER) || data.starts_with(PKCS8_KEY_HEADER) {
            let block =
                pem::parse(data).map_err(|e| KeyError::RsaPrivateKey(pem_error_text(&e).into()))?;
            let der = block.contents();
            let key = match RsaPrivateKey::from_pkcs1_der(der) {
                Ok(k) => k,
                Err(pkcs1_err) => RsaPrivateKey::from_pkcs8_der(der).map_err(|pkcs8_err| {
                    KeyError::RsaPrivateKey(format!(
                        "neither PKCS#1 ({pkcs1_err}) nor PKCS#8 RSA ({pkcs8_err})"
                    ))
                })?,
            };
            return Ok(Self::Rsa(key));
        }
        let text = std::str::from_utf8(data)
            .map_err(|_| KeyError::UnsupportedSigningKey(data.len()))?
            .trim_end();
        if text.len() != 64 {
            return Err(KeyError::UnsupportedSigningKey(data.len()));
        }
        let seed = decode_hex_array::<32>(text).map_err(KeyError::Ed25519Seed)?;
        Ok(Self::Ed25519(SigningKey::from_bytes(&seed)))
    }

    /// JWS `alg` this key signs with.
    pub fn algorithm(&self) -> &'static str {
        match self {
            Self::Rsa(_) => "RS256",
            Self::Ed25519(_) => "EdDSA",
        }
    }

    /// The ed25519 key, if this is one (the chain issuer signing key).
    pub fn as_ed25519(&self) -> Option<&SigningKey> {
        match self {
            Self::Ed25519(k) => Some(k),
            Self::Rsa(_) => None,
        }
    }

    /// The matching verification key.
    pub fn verify_key(&self) -> TokenVerifyKey {
        match self {
            Self::Rsa(k) => TokenVerifyKey::Rsa(k.to_public_key()),
            Self::Ed25519(k) => TokenVerifyKey::Ed25519(k.verifying_key()),
        }
    }

    /// Signs `claims` into a compact JWS with header
    /// `{"alg":"RS256"|"EdDSA","typ":"JWT"}`, claims in Go JSON.
    pub fn sign<T: Serialize + ?Sized>(&self, claims: &T) -> Result<String, TokenError> {
        let header = format!(r#"{{"alg":"{}","typ":"JWT"}}"#, self.algorithm());
        let payload = to_go_json(claims).map_err(|e| TokenError::Serialize(e.to_string()))?;
        let mut out = JWT_B64.encode(header.as_bytes());
        out.push('.');
        out.push_str(&JWT_B64.encode(payload));
        let sig = self.sign_input(out.as_bytes());
        out.push('.');
        out.push_str(&JWT_B64.encode(sig));
        Ok(out)
    }

    /// The raw JWS signature of a signing input (`<header>.<claims>`).
    fn sign_input(&self, input: &[u8]) -> Vec<u8> {
        match self {
            Self::Rsa(k) => pkcs1v15::SigningKey::<Sha256>::new(k.clone())
                .sign_with_rng(&mut rand::rngs::OsRng, input)
                .to_vec(),
            Self::Ed25519(k) => k.sign(input).to_bytes().to_vec(),
        }
    }
}

/// A JWT verification key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenVerifyKey {
    /// RSA public key for RS256/RS384/RS512.
    Rsa(RsaPublicKey),
    /// Ed25519 public key for EdDSA.
    Ed25519(VerifyingKey),
}

impl TokenVerifyKey {
    /// Resolves the provisioner's `jwt_verify_cert` setting like Go's
    /// `validateJWT`: when `setting` is not an existing path it must itself be
    /// a hex ed25519 public key; otherwise the file is read with
    /// [`TokenVerifyKey::from_pem_or_hex`].
    pub fn from_setting(setting: &str) -> Result<Self, KeyError> {
        if setting.is_empty() {
            return Err(KeyError::EmptySetting);
        }
        match std::fs::metadata(setting) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::from_ed25519_hex(setting),
            _ => Self::from_file(setting),
        }
    }

    /// Reads a verification key file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, KeyError> {
        Self::from_pem_or_hex(&read_key_file(path.as_ref())?)
    }

    /// `readRSAOrED25519PublicData`: data starting `-----BEGIN CERTIFICATE`
    /// or `-----BEGIN PUBLIC KEY` is an RSA key (SPKI, certificate or PKCS#1
    /// DER inside, like golang-jwt's `ParseRSAPublicKeyFromPEM`); we also
    /// accept `-----BEGIN RSA PUBLIC KEY`, which Go sends down the hex path
    /// and rejects. Anything else is a hex ed25519 public key (trailing
    /// whitespace tolerated, unlike Go).
    pub fn from_pem_or_hex(data: &[u8]) -> Result<Self, KeyError> {
        if data.starts_with(CERT_HEADER)
            || data.starts_with(PK_HEADER)
            || data.starts_with(RSA_PK_HEADER)
        {
            let block =
                pem::parse(data).map_err(|e| KeyError::RsaPublicKey(pem_error_text(&e).into()))?;
            return rsa_public_from_der(block.contents()).map(Self::Rsa);
        }
        let text =
            std::str::from_utf8(data).map_err(|_| KeyError::Ed25519PublicKey("not text".into()))?;
        Self::from_ed25519_hex(text.trim_end())
    }

    /// Parses a hex ed25519 public key.
    pub fn from_ed25519_hex(s: &str) -> Result<Self, KeyError> {
        let b = decode_hex_array::<32>(s).map_err(KeyError::Ed25519PublicKey)?;
        VerifyingKey::from_bytes(&b)
            .map(Self::Ed25519)
            .map_err(|_| KeyError::Ed25519PublicKey("not a valid ed25519 curve point".into()))
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::Rsa(_) => "rsa",
            Self::Ed25519(_) => "ed25519",
        }
    }
}

fn rsa_public_from_der(der: &[u8]) -> Result<RsaPublicKey, KeyError> {
    use x509_cert::spki::SubjectPublicKeyInfoRef;
    if let Ok(spki) = SubjectPublicKeyInfoRef::from_der(der) {
        return rsa_public_from_spki(&spki.algorithm.oid, der, "key");
    }
    if let Ok(cert) = x509_cert::Certificate::from_der(der) {
        let spki = &cert.tbs_certificate.subject_public_key_info;
        let spki_der = x509_cert::der::Encode::to_der(spki)
            .map_err(|e| KeyError::RsaPublicKey(e.to_string()))?;
        return rsa_public_from_spki(&spki.algorithm.oid, &spki_der, "certificate key");
    }
    RsaPublicKey::from_pkcs1_der(der).map_err(|e| {
        KeyError::RsaPublicKey(format!(
            "not a PKIX public key, certificate or PKCS#1 public key ({e})"
        ))
    })
}

/// An RSA key from SPKI DER whose algorithm is `oid`; `what` names the
/// source in the error for any other algorithm.
fn rsa_public_from_spki(
    oid: &x509_cert::spki::ObjectIdentifier,
    spki_der: &[u8],
    what: &str,
) -> Result<RsaPublicKey, KeyError> {
    if *oid != OID_RSA_ENCRYPTION {
        return Err(KeyError::RsaPublicKey(format!(
            "{what} is not a valid RSA public key (algorithm {oid})"
        )));
    }
    RsaPublicKey::from_public_key_der(spki_der).map_err(|e| KeyError::RsaPublicKey(e.to_string()))
}

// ---------------------------------------------------------------------------
// JWS decoding and verification
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alg {
    Rs256,
    Rs384,
    Rs512,
    EdDsa,
}

impl Alg {
    fn name(self) -> &'static str {
        match self {
            Alg::Rs256 => "RS256",
            Alg::Rs384 => "RS384",
            Alg::Rs512 => "RS512",
            Alg::EdDsa => "EdDSA",
        }
    }
}

struct DecodedJws<'a> {
    alg: String,
    signing_input: &'a str,
    claims: Vec<u8>,
    signature: Vec<u8>,
}

fn b64_segment(seg: &str, what: &str) -> Result<Vec<u8>, TokenError> {
    // Go's base64 decoder skips CR and LF anywhere in the input.
    let res = if seg.contains(['\r', '\n']) {
        let cleaned: String = seg.chars().filter(|c| *c != '\r' && *c != '\n').collect();
        JWT_B64.decode(cleaned)
    } else {
        JWT_B64.decode(seg)
    };
    res.map_err(|_| TokenError::Malformed(format!("could not base64 decode {what}")))
}

/// Splits and decodes a compact JWS in golang-jwt's order of checks.
fn decode_jws(token: &str) -> Result<DecodedJws<'_>, TokenError> {
    let mut parts = token.splitn(4, '.');
    let (Some(h), Some(c), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed(
            "token contains an invalid number of segments".into(),
        ));
    };
    let header = b64_segment(h, "header")?;
    let header: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|_| TokenError::Malformed("could not JSON decode header".into()))?;
    if !(header.is_object() || header.is_null()) {
        return Err(TokenError::Malformed("could not JSON decode header".into()));
    }
    let claims = b64_segment(c, "claims")?;
    let alg = header
        .get("alg")
        .and_then(|a| a.as_str())
        .ok_or_else(|| TokenError::Malformed("signing method (alg) is unspecified".into()))?
        .to_string();
    let signature = b64_segment(s, "signature")?;
    Ok(DecodedJws {
        alg,
        signing_input: &token[..h.len() + 1 + c.len()],
        claims,
        signature,
    })
}

fn decode_claims<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, TokenError> {
    serde_json::from_slice(bytes).map_err(|e| TokenError::Claims(describe_claims_error(&e)))
}

/// Parses a token's claims **without verifying anything** (Go's
/// `ParseUnverified`): any `alg` string is accepted. Use only where the token
/// will be verified elsewhere, e.g. a server reading its own provisioning JWT
/// or the provisioner reading its `jwt_signing_token`.
pub fn parse_unverified<T: DeserializeOwned>(token: &str) -> Result<T, TokenError> {
    let jws = decode_jws(token)?;
    decode_claims(&jws.claims)
}

/// The `alg` of a token, unverified (`tokens.TokenSigningAlgorithm`).
pub fn token_algorithm(token: &str) -> Result<String, TokenError> {
    Ok(decode_jws(token)?.alg)
}

fn parse_alg(alg: &str) -> Result<Alg, TokenError> {
    match alg {
        "RS256" => Ok(Alg::Rs256),
        "RS384" => Ok(Alg::Rs384),
        "RS512" => Ok(Alg::Rs512),
        "EdDSA" => Ok(Alg::EdDsa),
        other => Err(TokenError::UnsupportedAlgorithm(clip(other))),
    }
}

fn verify_rsa(alg: Alg, key: &RsaPublicKey, msg: &[u8], sig: &[u8]) -> Result<(), TokenError> {
    use rsa::traits::PublicKeyParts as _;
    // ring verifies about eight times faster than the rsa crate — it is the
    // provisioner's biggest per-node cost — but only keys of 2048 bits and
    // more, so smaller keys (which Go accepts) take the rsa crate.
    if key.size() * 8 >= 2048 {
        let params = match alg {
            Alg::Rs256 => &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            Alg::Rs384 => &ring::signature::RSA_PKCS1_2048_8192_SHA384,
            Alg::Rs512 => &ring::signature::RSA_PKCS1_2048_8192_SHA512,
            Alg::EdDsa => return Err(TokenError::InvalidSignature),
        };
        let (n, e) = (key.n().to_bytes_be(), key.e().to_bytes_be());
        return ring::signature::RsaPublicKeyComponents { n: &n, e: &e }
            .verify(params, msg, sig)
            .map_err(|_| TokenError::InvalidSignature);
    }
    use rsa::signature::Verifier as _;
    let sig = pkcs1v15::Signature::try_from(sig).map_err(|_| TokenError::InvalidSignature)?;
    let res = match alg {
        Alg::Rs256 => pkcs1v15::VerifyingKey::<Sha256>::new(key.clone()).verify(msg, &sig),
        Alg::Rs384 => pkcs1v15::VerifyingKey::<Sha384>::new(key.clone()).verify(msg, &sig),
        Alg::Rs512 => pkcs1v15::VerifyingKey::<Sha512>::new(key.clone()).verify(msg, &sig),
        Alg::EdDsa => return Err(TokenError::InvalidSignature),
    };
    res.map_err(|_| TokenError::InvalidSignature)
}

/// Checks `exp` and `nbf` with no leeway, like golang-jwt v5's default
/// validator: `exp` is optional; valid while `now < exp`; valid from
/// `now >= nbf`. `iat` is not checked.
fn validate_times(std: &StandardClaims, now: i64) -> Result<(), TokenError> {
    if let Some(exp) = std.expires_at {
        if now >= exp {
            return Err(TokenError::Expired { exp, now });
        }
    }
    if let Some(nbf) = std.not_before {
        if now < nbf {
            return Err(TokenError::NotYetValid { nbf, now });
        }
    }
    Ok(())
}

/// `tokens.ParseToken`: decode, check `alg` against the allowed list and the
/// key type, resolve the chain issuer key for chain-aware token types
/// (server and client tokens with a `C-` issuer), verify the signature, then
/// validate `exp`/`nbf`.
fn parse_verified<T: DeserializeOwned + HasStandardClaims>(
    token: &str,
    key: &TokenVerifyKey,
    now: i64,
    chain_aware: bool,
) -> Result<T, TokenError> {
    let jws = decode_jws(token)?;
    let claims: T = decode_claims(&jws.claims)?;
    let alg = parse_alg(&jws.alg)?;
    let input = jws.signing_input.as_bytes();
    match (alg, key) {
        (Alg::EdDsa, TokenVerifyKey::Ed25519(k)) => {
            let std = claims.standard();
            let k = if chain_aware && std.issuer.starts_with(CHAIN_ISSUER_PREFIX) {
                std.signed_by_issuer_key(k)?
            } else {
                *k
            };
            verify_ed25519(&k, input, &jws.signature).map_err(|_| TokenError::InvalidSignature)?;
        }
        (Alg::EdDsa, other) => {
            return Err(TokenError::KeyMismatch {
                alg: alg.name(),
                needed: "ed25519",
                have: other.kind(),
            })
        }
        (_, TokenVerifyKey::Rsa(k)) => verify_rsa(alg, k, input, &jws.signature)?,
        (_, other) => {
            return Err(TokenError::KeyMismatch {
                alg: alg.name(),
                needed: "rsa",
                have: other.kind(),
            })
        }
    }
    validate_times(claims.standard(), now)?;
    Ok(claims)
}

/// Verifies a provisioning token like `tokens.ParseProvisioningToken` as the
/// Go provisioner calls it from `validateJWT`: allowed algorithm matching the
/// key, valid signature, `exp`/`nbf` with no leeway (`exp` optional),
/// `purpose` or `sub` = `choria_provisioning`, `ou` defaulted to `choria`,
/// and — only when `tcs` is present — the issuer expiry rules. Provisioning
/// tokens are never chain-verified.
pub fn parse_provisioning_token(
    token: &str,
    key: &TokenVerifyKey,
) -> Result<ProvisioningClaims, TokenError> {
    parse_provisioning_token_at(token, key, unix_now())
}

/// [`parse_provisioning_token`] at a given time (Unix seconds).
pub fn parse_provisioning_token_at(
    token: &str,
    key: &TokenVerifyKey,
    now: i64,
) -> Result<ProvisioningClaims, TokenError> {
    let mut claims: ProvisioningClaims = parse_verified(token, key, now, false)?;
    finish_provisioning(&mut claims)?;
    let required = !claims.standard.trust_chain_signature.is_empty();
    claims.standard.verify_issuer_expiry_at(required, now)?;
    Ok(claims)
}

fn finish_provisioning(claims: &mut ProvisioningClaims) -> Result<(), TokenError> {
    if !claims.standard.is_provisioning() {
        return Err(TokenError::NotProvisioningToken {
            purpose: clip(&claims.standard.purpose),
            subject: clip(&claims.standard.subject),
        });
    }
    if claims.organization_unit.is_empty() {
        claims.organization_unit = DEFAULT_ORG.to_string();
    }
    Ok(())
}

/// `tokens.ParseProvisionTokenUnverified`: what a server does with its own
/// provisioning JWT (purpose check and `ou` default, no signature check).
pub fn parse_provisioning_token_unverified(token: &str) -> Result<ProvisioningClaims, TokenError> {
    let mut claims: ProvisioningClaims = parse_unverified(token)?;
    finish_provisioning(&mut claims)?;
    Ok(claims)
}

/// `tokens.ParseServerToken`: verifies a server token with `key`; for EdDSA
/// tokens whose `iss` starts `C-`, `key` must be the Org Issuer key and the
/// whole chain is verified. Then `purpose` must be `choria_server` and, when
/// `tcs` is set, the issuer expiry rules apply.
pub fn parse_server_token(token: &str, key: &TokenVerifyKey) -> Result<ServerClaims, TokenError> {
    parse_server_token_at(token, key, unix_now())
}

/// [`parse_server_token`] at a given time (Unix seconds).
pub fn parse_server_token_at(
    token: &str,
    key: &TokenVerifyKey,
    now: i64,
) -> Result<ServerClaims, TokenError> {
    let claims: ServerClaims = parse_verified(token, key, now, true)?;
    if claims.standard.purpose != SERVER_PURPOSE {
        return Err(TokenError::NotServerToken(clip(&claims.standard.purpose)));
    }
    if !claims.standard.trust_chain_signature.is_empty() {
        claims.standard.verify_issuer_expiry_at(true, now)?;
    }
    Ok(claims)
}

/// Verifies a chain-issued server token the way brokers and servers do
/// (protocol doc §10.3 "Verification"): `iss` must start `C-`; the Org Issuer
/// must have signed `"<chain id>.<chain pubkey>"` (tcs part 1); the chain key
/// must have signed `"<jti>.<tcs part 1>"` (tcs part 2); the JWS must verify
/// with the chain key; `jti` must be a KSUID whose time equals `iat`; `exp`,
/// `nbf` and `issexp` must be current.
pub fn verify_chain_issued_server_token(
    token: &str,
    org_issuer: &VerifyingKey,
) -> Result<ServerClaims, TokenError> {
    verify_chain_issued_server_token_at(token, org_issuer, unix_now())
}

/// [`verify_chain_issued_server_token`] at a given time (Unix seconds).
pub fn verify_chain_issued_server_token_at(
    token: &str,
    org_issuer: &VerifyingKey,
    now: i64,
) -> Result<ServerClaims, TokenError> {
    let peek: StandardClaims = parse_unverified(token)?;
    if !peek.issuer.starts_with(CHAIN_ISSUER_PREFIX) {
        return Err(TokenError::NotChainIssued(clip(&peek.issuer)));
    }
    parse_server_token_at(token, &TokenVerifyKey::Ed25519(*org_issuer), now)
}

/// `tokens.ParseClientIDTokenUnverified`, as the provisioner reads its
/// `jwt_signing_token`: no verification, but `purpose` must be
/// `choria_client_id`.
pub fn parse_client_id_token_unverified(token: &str) -> Result<ClientIdClaims, TokenError> {
    require_client_purpose(parse_unverified(token)?)
}

fn require_client_purpose(claims: ClientIdClaims) -> Result<ClientIdClaims, TokenError> {
    if claims.standard.purpose != CLIENT_ID_PURPOSE {
        return Err(TokenError::NotClientToken(clip(&claims.standard.purpose)));
    }
    Ok(claims)
}

/// `tokens.ParseClientIDToken(token, key, true)`: like
/// [`parse_server_token_at`] for client tokens.
pub fn parse_client_id_token_at(
    token: &str,
    key: &TokenVerifyKey,
    now: i64,
) -> Result<ClientIdClaims, TokenError> {
    let claims = require_client_purpose(parse_verified(token, key, now, true)?)?;
    if !claims.standard.trust_chain_signature.is_empty()
        && claims.standard.issuer.starts_with(CHAIN_ISSUER_PREFIX)
    {
        claims.standard.verify_issuer_expiry_at(true, now)?;
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::super::csr::tests::test_key;
    use super::super::ed25519::Ed25519KeyPair;
    use super::super::openssl_cli::{openssl, run_ok, skip_without_openssl};
    use super::*;
    use crate::choria::json;
    use proptest::prelude::*;

    const NOW: i64 = 1_700_000_000;
    const SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    const PUB: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

    fn ed_key() -> TokenSigningKey {
        TokenSigningKey::from_bytes(SEED.as_bytes()).unwrap()
    }

    fn rsa_key() -> TokenSigningKey {
        TokenSigningKey::Rsa(test_key().clone())
    }

    fn b64(s: &str) -> String {
        JWT_B64.encode(s)
    }

    /// Builds a token with arbitrary header and claims JSON, signed by `key`.
    fn raw_token(header: &str, claims: &str, key: &TokenSigningKey) -> String {
        let input = format!("{}.{}", b64(header), b64(claims));
        format!(
            "{input}.{}",
            JWT_B64.encode(key.sign_input(input.as_bytes()))
        )
    }

    /// [`raw_token`] with the standard EdDSA header, signed by [`ed_key`].
    fn ed_token(claims: &str) -> String {
        raw_token(r#"{"alg":"EdDSA","typ":"JWT"}"#, claims, &ed_key())
    }

    fn prov_claims() -> ProvisioningClaims {
        let mut c = ProvisioningClaims::new_at(
            "s3cret",
            "nats://broker:4222",
            "",
            Duration::from_secs(3600),
            NOW,
        )
        .unwrap();
        c.prov_nats_pass = "hunter2".into();
        c
    }

    #[test]
    fn provisioning_claims_json_order_matches_go() {
        let mut c = prov_claims();
        c.standard.id = "2Y7pSdJ2mF3FZuG8N0ZP6kYbC7D".into();
        let json = json::to_string(&c).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"cht":"s3cret","chs":false,"chu":"nats://broker:4222","chpd":true,"#,
                r#""chpwd":"hunter2","extensions":null,"ou":"choria","#,
                r#""purpose":"choria_provisioning","iss":"Choria Tokens Package","#,
                r#""sub":"choria_provisioning","exp":1700003600,"nbf":1700000000,"#,
                r#""iat":1700000000,"jti":"2Y7pSdJ2mF3FZuG8N0ZP6kYbC7D"}"#
            )
        );
        c.extensions = Some(serde_json::Map::new());
        c.proto_v2 = true;
        c.allow_update = true;
        c.standard.audience = vec!["x".into()];
        c.standard.trust_chain_signature = "ab".into();
        c.standard.public_key = "cd".into();
        c.standard.issuer_expires_at = Some(5);
        let json = json::to_string(&c).unwrap();
        assert!(
            json.contains(r#""extensions":{},"ou":"choria","v2":true,"update":true,"purpose":"choria_provisioning","tcs":"ab","public_key":"cd","issexp":5,"iss":"Choria Tokens Package","sub":"choria_provisioning","aud":["x"],"exp""#),
            "{json}"
        );
    }

    #[test]
    fn server_claims_new_and_json_order() {
        let kp = Ed25519KeyPair::generate();
        let c = ServerClaims::new_at(
            NOW,
            "node1.example.net",
            vec!["choria".into()],
            "",
            Some(ServerPermissions {
                submission: true,
                ..Default::default()
            }),
            vec!["x.>".into()],
            &kp.public_hex().to_uppercase(),
            PROVISIONER_ISSUER,
            Duration::from_secs(365 * 24 * 3600),
        )
        .unwrap();
        assert_eq!(c.standard.public_key, kp.public_hex());
        assert_eq!(c.organization_unit, "choria");
        assert_eq!(c.standard.issued_at, Some(NOW));
        assert_eq!(c.standard.not_before, Some(NOW));
        assert_eq!(c.standard.expires_at, Some(NOW + 365 * 24 * 3600));
        assert_eq!(ksuid_timestamp(&c.standard.id).unwrap(), NOW);
        assert!(c.standard.subject.is_empty());
        let json = json::to_string(&c).unwrap();
        let expected_prefix = format!(
            r#"{{"identity":"node1.example.net","collectives":["choria"],"permissions":{{"submission":true}},"ou":"choria","pub_subjects":["x.>"],"purpose":"choria_server","public_key":"{}","iss":"Choria Provisioner","exp":{},"nbf":{NOW},"iat":{NOW},"jti":""#,
            kp.public_hex(),
            NOW + 365 * 24 * 3600
        )
        .replace("x.>", "x.\\u003e");
        assert!(
            json.starts_with(&expected_prefix),
            "{json}\n{expected_prefix}"
        );

        let err = |r: Result<ServerClaims, TokenError>| r.unwrap_err().to_string();
        let pk = kp.public_hex();
        let day = Duration::from_secs(86400);
        assert_eq!(
            err(plain_server_claims("", &["c"], &pk, day)),
            "invalid claims: identity is required"
        );
        assert_eq!(
            err(plain_server_claims("n", &[], &pk, day)),
            "invalid claims: at least one collective is required"
        );
        assert!(err(plain_server_claims("n", &["c"], "abc", day))
            .contains("server public key is not a hex ed25519 key"));
        assert_eq!(
            err(plain_server_claims("n", &["c"], &pk, Duration::ZERO)),
            "invalid claims: validity is required"
        );
        let d = plain_server_claims("n", &["c"], &pk, day).unwrap();
        assert_eq!(d.standard.issuer, DEFAULT_ISSUER);
        // wall clock variant
        let w = ServerClaims::new("n", vec!["c".into()], "o", None, vec![], &pk, "", day).unwrap();
        assert!(w.standard.issued_at.unwrap() > NOW);
    }

    #[test]
    fn extensions_marshal_like_go() {
        // EXT vector: Go json.Unmarshal of this JSON into MapClaims, then
        // json.Marshal of ProvisioningClaims{Extensions: ext}.
        let input = r#"{"z":{"y":[1,2.0,-0.0],"x":null},"f":1.5,"big":1e21,"small":1e-7,"small2":1.5e-10,"int":12345678901234567890,"neg":-3,"s":"<&>","t":true,"mid":0.000001,"e20":1e20}"#;
        let go = r#"{"cht":"","chs":false,"chpd":false,"extensions":{"big":1e+21,"e20":100000000000000000000,"f":1.5,"int":12345678901234567000,"mid":0.000001,"neg":-3,"s":"\u003c\u0026\u003e","small":1e-7,"small2":1.5e-10,"t":true,"z":{"x":null,"y":[1,2,-0]}},"purpose":""}"#;
        let c = ProvisioningClaims {
            extensions: Some(serde_json::from_str(input).unwrap()),
            ..Default::default()
        };
        assert_eq!(json::to_string(&c).unwrap(), go);
        // Go's formatting of a big float; the JSON literal is kept out of the
        // vector above because serde_json's default (non `float_roundtrip`)
        // parser rounds 123456789012345678901234 one ulp differently.
        assert_eq!(
            json::go_float(1.234_567_890_123_456_9e23),
            "1.2345678901234569e+23"
        );
        assert_eq!(json::go_float(-2.5e-8), "-2.5e-8");
        // plain serde_json keeps integers natural
        let plain = serde_json::to_string(&c).unwrap();
        assert!(
            plain.contains(r#""neg":-3"#) && plain.contains(r#""y":[1,2,-0.0]"#),
            "{plain}"
        );
    }

    #[test]
    fn go_string_escaping() {
        let v = serde_json::json!({"a": "<b>&\u{2028}\u{2029}\n\"é"});
        assert_eq!(
            json::to_string(&v).unwrap(),
            r#"{"a":"\u003cb\u003e\u0026\u2028\u2029\n\"é"}"#
        );
    }

    #[test]
    fn header_is_go_byte_identical() {
        let t = ed_key().sign(&prov_claims()).unwrap();
        assert!(
            t.starts_with("eyJhbGciOiJFZERTQSIsInR5cCI6IkpXVCJ9."),
            "{t}"
        );
        let t = rsa_key().sign(&prov_claims()).unwrap();
        assert!(
            t.starts_with("eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9."),
            "{t}"
        );
        assert_eq!(token_algorithm(&t).unwrap(), "RS256");
    }

    #[test]
    fn round_trip_ed25519_and_rsa() {
        for key in [ed_key(), rsa_key()] {
            let claims = prov_claims();
            let token = key.sign(&claims).unwrap();
            let parsed = parse_provisioning_token_at(&token, &key.verify_key(), NOW + 10).unwrap();
            assert_eq!(parsed, claims);
            // a token with a trailing newline (as read from a file) still parses
            let parsed =
                parse_provisioning_token_at(&format!("{token}\n"), &key.verify_key(), NOW).unwrap();
            assert_eq!(parsed.token, "s3cret");
        }
    }

    #[test]
    fn rs384_and_rs512_accepted() {
        /// A token with header `alg`, signed by [`test_key`] over digest `D`.
        fn rsa_token<D>(alg: &str, claims: &str) -> String
        where
            D: sha2::Digest + sha2::digest::const_oid::AssociatedOid,
        {
            let input = format!(
                "{}.{}",
                b64(&format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#)),
                b64(claims)
            );
            let sig = pkcs1v15::SigningKey::<D>::new(test_key().clone())
                .sign_with_rng(&mut rand::rngs::OsRng, input.as_bytes())
                .to_vec();
            format!("{input}.{}", JWT_B64.encode(sig))
        }
        let claims = json::to_string(&prov_claims()).unwrap();
        for token in [
            rsa_token::<Sha384>("RS384", &claims),
            rsa_token::<Sha512>("RS512", &claims),
        ] {
            parse_provisioning_token_at(&token, &rsa_key().verify_key(), NOW).unwrap();
        }
    }

    #[test]
    fn verification_failures() {
        let ed = ed_key();
        let token = ed.sign(&prov_claims()).unwrap();

        // wrong key type
        let e = parse_provisioning_token_at(&token, &rsa_key().verify_key(), NOW).unwrap_err();
        assert!(
            matches!(
                e,
                TokenError::KeyMismatch {
                    needed: "ed25519",
                    have: "rsa",
                    ..
                }
            ),
            "{e}"
        );
        let rt = rsa_key().sign(&prov_claims()).unwrap();
        let e = parse_provisioning_token_at(&rt, &ed.verify_key(), NOW).unwrap_err();
        assert_eq!(
            e.to_string(),
            "token is signed with RS256, which needs an rsa public key, but the verification key is ed25519"
        );

        // wrong key
        let other = TokenSigningKey::Ed25519(SigningKey::from_bytes(&[7u8; 32]));
        let e = parse_provisioning_token_at(&token, &other.verify_key(), NOW).unwrap_err();
        assert!(matches!(e, TokenError::InvalidSignature));

        // tampered claims
        let parts: Vec<&str> = token.split('.').collect();
        let mut c = prov_claims();
        c.token = "other".into();
        let forged = format!(
            "{}.{}.{}",
            parts[0],
            JWT_B64.encode(to_go_json(&c).unwrap()),
            parts[2]
        );
        assert!(matches!(
            parse_provisioning_token_at(&forged, &ed.verify_key(), NOW),
            Err(TokenError::InvalidSignature)
        ));

        // time checks: exp is exclusive, nbf inclusive, no leeway
        let vk = ed.verify_key();
        assert!(parse_provisioning_token_at(&token, &vk, NOW + 3599).is_ok());
        assert!(matches!(
            parse_provisioning_token_at(&token, &vk, NOW + 3600),
            Err(TokenError::Expired { exp, now }) if exp == NOW + 3600 && now == NOW + 3600
        ));
        assert!(parse_provisioning_token_at(&token, &vk, NOW).is_ok());
        assert!(matches!(
            parse_provisioning_token_at(&token, &vk, NOW - 1),
            Err(TokenError::NotYetValid { .. })
        ));

        // unsupported algorithms, including "none"
        for alg in ["HS256", "none", "ES256", "PS256"] {
            let t = raw_token(
                &format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#),
                r#"{"purpose":"choria_provisioning"}"#,
                &ed,
            );
            assert!(
                matches!(parse_provisioning_token_at(&t, &vk, NOW), Err(TokenError::UnsupportedAlgorithm(ref a)) if a == alg),
                "{alg}"
            );
        }

        // malformed
        for bad in ["", "a.b", "a.b.c.d", "!!!.e30.", "e30.e30.sig"] {
            assert!(
                matches!(
                    parse_provisioning_token_at(bad, &vk, NOW),
                    Err(TokenError::Malformed(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn purpose_and_optional_exp() {
        let vk = ed_key().verify_key();
        let parse = |claims: &str| parse_provisioning_token_at(&ed_token(claims), &vk, NOW);
        // sub alone is enough, exp is optional, ou defaults
        let c = parse(r#"{"cht":"x","sub":"choria_provisioning"}"#).unwrap();
        assert_eq!(c.organization_unit, "choria");
        assert!(c.standard.expires_at.is_none());
        // wrong purpose
        assert_eq!(
            parse(r#"{"purpose":"choria_server"}"#)
                .unwrap_err()
                .to_string(),
            "not a provisioning token (purpose \"choria_server\", sub \"\")"
        );
        for claims in [
            // tcs present but not chain issued => expired, like Go's ErrTokenExpired
            r#"{"purpose":"choria_provisioning","tcs":"aa","iss":"I-00","exp":1800000000}"#,
            // tcs with chain issuer but no issexp
            r#"{"purpose":"choria_provisioning","tcs":"aa","iss":"C-x.y","exp":1800000000}"#,
            // tcs with chain issuer and issexp in the past
            r#"{"purpose":"choria_provisioning","tcs":"aa","iss":"C-x.y","exp":1800000000,"issexp":1600000000}"#,
        ] {
            assert!(
                matches!(parse(claims), Err(TokenError::IssuerExpiry(_))),
                "{claims}"
            );
        }
        assert!(parse(
            r#"{"purpose":"choria_provisioning","tcs":"aa","iss":"C-x.y","exp":1800000000,"issexp":1800000000}"#
        )
        .is_ok());
    }

    #[test]
    fn lenient_decoding_like_go() {
        let c: ProvisioningClaims = serde_json::from_str(
            r#"{"cht":null,"chs":null,"extensions":{"a":1},"aud":"one","exp":1.7e9,"nbf":"1600000000","iat":1600000000.9,"unknown":[1,2]}"#,
        )
        .unwrap();
        assert_eq!(c.token, "");
        assert_eq!(c.standard.audience, vec!["one"]);
        assert_eq!(c.standard.expires_at, Some(1_700_000_000));
        assert_eq!(c.standard.not_before, Some(1_600_000_000));
        assert_eq!(c.standard.issued_at, Some(1_600_000_000));
        assert_eq!(c.extensions.as_ref().unwrap()["a"], 1);
        let c: StandardClaims = serde_json::from_str(r#"{"aud":["a","b"],"exp":null}"#).unwrap();
        assert_eq!(c.audience, vec!["a", "b"]);
        assert_eq!(c.expires_at, None);
        assert!(serde_json::from_str::<StandardClaims>(r#"{"aud":[1]}"#).is_err());
        assert!(serde_json::from_str::<StandardClaims>(r#"{"exp":"soon"}"#).is_err());
        assert!(serde_json::from_str::<StandardClaims>(r#"{"exp":1e300}"#).is_err());
        assert!(serde_json::from_str::<ProvisioningClaims>(r#"{"extensions":"x"}"#).is_err());
    }

    #[test]
    fn claims_errors_do_not_echo_values() {
        let ed = ed_key();
        let t = ed_token(r#"{"purpose":"choria_provisioning","cht":987654321,"chpwd":true}"#);
        let e = parse_provisioning_token_at(&t, &ed.verify_key(), NOW)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("token claims could not be decoded: invalid type, expected a string"),
            "{e}"
        );
        assert!(!e.contains("987654321"), "{e}");
        let t = raw_token(r#"{"alg":"EdDSA"}"#, r#"{"exp":"nope"}"#, &ed);
        let e = parse_provisioning_token_at(&t, &ed.verify_key(), NOW)
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid NumericDate"), "{e}");
        assert!(!e.contains("nope"), "{e}");
    }

    #[test]
    fn debug_redacts_secrets() {
        let c = prov_claims();
        let d = format!("{c:?}");
        assert!(!d.contains("s3cret") && !d.contains("hunter2"), "{d}");
        assert!(d.contains("<redacted>"));
        let d = format!("{:?}", ed_key());
        assert!(!d.contains(SEED) && d.contains(PUB), "{d}");
        let d = format!("{:?}", rsa_key());
        assert!(d.contains("redacted 1024 bit key"), "{d}");
    }

    #[test]
    fn signing_key_loading() {
        use rsa::pkcs1::EncodeRsaPrivateKey;
        use rsa::pkcs8::EncodePrivateKey;
        let key = test_key();
        let pkcs1 = key.to_pkcs1_pem(rsa::pkcs8::LineEnding::LF).unwrap();
        let pkcs8 = key.to_pkcs8_pem(rsa::pkcs8::LineEnding::LF).unwrap();
        for pem_text in [pkcs1.as_str(), pkcs8.as_str()] {
            let k = TokenSigningKey::from_bytes(pem_text.as_bytes()).unwrap();
            assert_eq!(k.algorithm(), "RS256");
            assert_eq!(k.verify_key(), TokenVerifyKey::Rsa(key.to_public_key()));
        }
        let k = TokenSigningKey::from_bytes(SEED.as_bytes()).unwrap();
        assert_eq!(k.algorithm(), "EdDSA");
        assert_eq!(
            k.verify_key(),
            TokenVerifyKey::from_ed25519_hex(PUB).unwrap()
        );
        assert!(k.as_ed25519().is_some());
        // lenient: trailing newline
        assert!(TokenSigningKey::from_bytes(format!("{SEED}\n").as_bytes()).is_ok());
        assert!(TokenSigningKey::from_bytes(format!("{SEED}\r\n").as_bytes()).is_ok());
        // errors
        assert!(matches!(
            TokenSigningKey::from_bytes(b"hello"),
            Err(KeyError::UnsupportedSigningKey(5))
        ));
        let bad_seed = format!("{}zz", &SEED[..62]);
        let e = TokenSigningKey::from_bytes(bad_seed.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("invalid ed25519 seed"), "{e}");
        assert!(!e.contains(&SEED[..20]), "{e}");
        assert!(matches!(
            TokenSigningKey::from_bytes(
                b"-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n"
            ),
            Err(KeyError::RsaPrivateKey(_))
        ));
        // from file
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seed");
        std::fs::write(&p, SEED).unwrap();
        assert_eq!(TokenSigningKey::from_file(&p).unwrap().algorithm(), "EdDSA");
        assert!(matches!(
            TokenSigningKey::from_file(dir.path().join("missing")),
            Err(KeyError::Read { .. })
        ));
    }

    #[test]
    fn verify_key_from_setting() {
        use rsa::pkcs1::EncodeRsaPublicKey;
        use rsa::pkcs8::EncodePublicKey;
        let key = test_key().to_public_key();
        let want = TokenVerifyKey::Rsa(key.clone());
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, data: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, data).unwrap();
            p.to_str().unwrap().to_string()
        };
        let spki = write(
            "spki.pem",
            &key.to_public_key_pem(rsa::pkcs8::LineEnding::LF).unwrap(),
        );
        let pkcs1 = write(
            "pkcs1.pem",
            &key.to_pkcs1_pem(rsa::pkcs8::LineEnding::LF).unwrap(),
        );
        let go_style = write(
            "go.pem",
            &super::super::csr::public_key_pem_go_style(&key).unwrap(),
        );
        for p in [&spki, &pkcs1, &go_style] {
            assert_eq!(TokenVerifyKey::from_setting(p).unwrap(), want, "{p}");
        }
        let hexf = write("pub.hex", &format!("{PUB}\n"));
        let ed = TokenVerifyKey::from_ed25519_hex(PUB).unwrap();
        assert_eq!(TokenVerifyKey::from_setting(&hexf).unwrap(), ed);
        assert_eq!(TokenVerifyKey::from_setting(PUB).unwrap(), ed);
        assert_eq!(
            TokenVerifyKey::from_setting(&PUB.to_uppercase()).unwrap(),
            ed
        );
        assert!(matches!(
            TokenVerifyKey::from_setting(""),
            Err(KeyError::EmptySetting)
        ));
        assert!(matches!(
            TokenVerifyKey::from_setting("/no/such/file.pem"),
            Err(KeyError::Ed25519PublicKey(_))
        ));
        // a directory exists but cannot be read as a file
        assert!(matches!(
            TokenVerifyKey::from_setting(dir.path().to_str().unwrap()),
            Err(KeyError::Read { .. })
        ));
        // ed25519 SPKI is not accepted on the PEM path (Go: not an RSA key)
        let ed_spki = ed25519_dalek::pkcs8::EncodePublicKey::to_public_key_pem(
            &SigningKey::from_bytes(&[1u8; 32]).verifying_key(),
            ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF,
        )
        .unwrap();
        let edp = write("ed.pem", &ed_spki);
        let e = TokenVerifyKey::from_setting(&edp).unwrap_err().to_string();
        assert!(e.contains("not a valid RSA public key"), "{e}");

        // certificate via openssl when available
        if !skip_without_openssl("certificate check") {
            use rsa::pkcs1::EncodeRsaPrivateKey;
            let kp = dir.path().join("k.pem");
            std::fs::write(
                &kp,
                test_key()
                    .to_pkcs1_pem(rsa::pkcs8::LineEnding::LF)
                    .unwrap()
                    .as_bytes(),
            )
            .unwrap();
            let cp = dir.path().join("cert.pem");
            run_ok(
                openssl()
                    .args(["req", "-new", "-x509", "-days", "1", "-subj", "/CN=signer"])
                    .arg("-key")
                    .arg(&kp)
                    .arg("-out")
                    .arg(&cp),
            );
            assert_eq!(
                TokenVerifyKey::from_setting(cp.to_str().unwrap()).unwrap(),
                want
            );
        }
    }

    /// Builds an Org Issuer → chain issuer (client token) → server token chain.
    struct Chain {
        org: SigningKey,
        signer_key: SigningKey,
        signer: ClientIdClaims,
        signer_token: String,
    }

    fn chain(signer_validity: Duration) -> Chain {
        let org = SigningKey::from_bytes(&[1u8; 32]);
        let signer_key = SigningKey::from_bytes(&[2u8; 32]);
        let mut signer = ClientIdClaims::new_at(
            NOW - 100,
            "provisioner",
            Some(&hex::encode(signer_key.verifying_key().as_bytes())),
            "",
            signer_validity,
        )
        .unwrap();
        signer.standard.add_org_issuer_data(&org).unwrap();
        assert!(signer.standard.issuer.starts_with("I-"));
        let signer_token = TokenSigningKey::Ed25519(org.clone()).sign(&signer).unwrap();
        Chain {
            org,
            signer_key,
            signer,
            signer_token,
        }
    }

    fn chain_server_token(c: &Chain, now: i64) -> (ServerClaims, String) {
        let node = Ed25519KeyPair::generate();
        let mut claims = ServerClaims::new_at(
            now,
            "node1.example.net",
            vec!["choria".into()],
            "choria",
            None,
            vec![],
            &node.public_hex(),
            PROVISIONER_ISSUER,
            Duration::from_secs(365 * 86400),
        )
        .unwrap();
        let signer = parse_client_id_token_unverified(&c.signer_token).unwrap();
        claims
            .add_chain_issuer_data(&signer, &c.signer_key)
            .unwrap();
        let token = TokenSigningKey::Ed25519(c.signer_key.clone())
            .sign(&claims)
            .unwrap();
        (claims, token)
    }

    #[test]
    fn chain_issued_server_token_verifies() {
        let c = chain(Duration::from_secs(30 * 86400));
        let (claims, token) = chain_server_token(&c, NOW);
        let signer = &c.signer.standard;
        assert_eq!(
            claims.standard.issuer,
            format!("C-{}.{}", signer.id, signer.public_key)
        );
        assert_eq!(claims.standard.issuer_expires_at, signer.expires_at);
        // exp = min(own exp, signer exp)
        assert_eq!(claims.standard.expires_at, signer.expires_at);
        let parts: Vec<&str> = claims.standard.trust_chain_signature.split('.').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], signer.trust_chain_signature);

        let org_pub = c.org.verifying_key();
        let v = verify_chain_issued_server_token_at(&token, &org_pub, NOW + 1).unwrap();
        assert_eq!(v, claims);
        // the generic parser does the same with the org key
        parse_server_token_at(&token, &TokenVerifyKey::Ed25519(org_pub), NOW + 1).unwrap();
        // the org issuer's token verifies as an I- issuer
        assert_eq!(
            c.signer.standard.signed_by_issuer_key(&org_pub).unwrap(),
            org_pub
        );

        // wrong org key
        let other = SigningKey::from_bytes(&[9u8; 32]).verifying_key();
        let e = verify_chain_issued_server_token_at(&token, &other, NOW).unwrap_err();
        assert_eq!(
            e.to_string(),
            "not signed by issuer: chain issuer credentials not signed by org issuer"
        );
        // after the signer expired
        let after = signer.expires_at.unwrap();
        assert!(matches!(
            verify_chain_issued_server_token_at(&token, &org_pub, after),
            Err(TokenError::Expired { .. })
        ));
        // a directly signed token is not chain issued
        let direct = TokenSigningKey::Ed25519(c.org.clone())
            .sign(&claims_without_chain())
            .unwrap();
        assert!(matches!(
            verify_chain_issued_server_token_at(&direct, &org_pub, NOW),
            Err(TokenError::NotChainIssued(_))
        ));
    }

    /// [`ServerClaims::new_at`] at [`NOW`] without `ou`, permissions, extra
    /// subjects or issuer.
    fn plain_server_claims(
        identity: &str,
        collectives: &[&str],
        public_key_hex: &str,
        validity: Duration,
    ) -> Result<ServerClaims, TokenError> {
        let collectives = collectives.iter().map(|c| c.to_string()).collect();
        ServerClaims::new_at(
            NOW,
            identity,
            collectives,
            "",
            None,
            vec![],
            public_key_hex,
            "",
            validity,
        )
    }

    fn claims_without_chain() -> ServerClaims {
        plain_server_claims("n", &["c"], PUB, Duration::from_secs(3600)).unwrap()
    }

    #[test]
    fn chain_tampering_detected() {
        let c = chain(Duration::from_secs(30 * 86400));
        let org_pub = c.org.verifying_key();
        let (claims, _) = chain_server_token(&c, NOW);
        // The verification error for the chain-signed claims after `tamper`,
        // re-signed with the chain signer's key, at `now`.
        let tampered = |tamper: fn(&mut ServerClaims), now: i64| {
            let mut bad = claims.clone();
            tamper(&mut bad);
            let token = TokenSigningKey::Ed25519(c.signer_key.clone())
                .sign(&bad)
                .unwrap();
            verify_chain_issued_server_token_at(&token, &org_pub, now).unwrap_err()
        };

        // jti not based on iat
        let e = tampered(|c| c.standard.issued_at = Some(NOW + 1), NOW + 2);
        assert_eq!(
            e.to_string(),
            "not signed by issuer: id is not based on issued time"
        );

        // jti changed => chain signature no longer matches
        let e = tampered(|c| c.standard.id = new_ksuid_at(NOW).unwrap(), NOW);
        assert_eq!(
            e.to_string(),
            "not signed by issuer: invalid chain signature"
        );

        // issexp missing
        let e = tampered(|c| c.standard.issuer_expires_at = None, NOW);
        assert_eq!(e.to_string(), "not signed by issuer: no issuer expires set");

        // issexp passed although exp is later
        let e = tampered(
            |c| {
                c.standard.issuer_expires_at = Some(NOW + 5);
                c.standard.expires_at = Some(NOW + 100);
            },
            NOW + 10,
        );
        assert!(matches!(e, TokenError::IssuerExpiry(_)), "{e}");

        // JWS signed by some other key
        let rogue = TokenSigningKey::Ed25519(SigningKey::from_bytes(&[5u8; 32]));
        let e = verify_chain_issued_server_token_at(&rogue.sign(&claims).unwrap(), &org_pub, NOW)
            .unwrap_err();
        assert!(matches!(e, TokenError::InvalidSignature), "{e}");

        // malformed tcs / issuer
        let e = tampered(|c| c.standard.trust_chain_signature = "abc".into(), NOW);
        assert_eq!(
            e.to_string(),
            "not signed by issuer: invalid trust chain signature"
        );
        let e = tampered(|c| c.standard.issuer = "C-onlyone".into(), NOW);
        assert_eq!(
            e.to_string(),
            "not signed by issuer: invalid issuer content"
        );

        // wrong purpose
        let e = tampered(|c| c.standard.purpose = CLIENT_ID_PURPOSE.into(), NOW);
        assert!(matches!(e, TokenError::NotServerToken(_)), "{e}");
    }

    #[test]
    fn chain_issuer_data_preconditions() {
        let c = chain(Duration::from_secs(86400));
        let mut s = claims_without_chain();
        // key mismatch
        let e = s
            .add_chain_issuer_data(&c.signer, &SigningKey::from_bytes(&[3u8; 32]))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot add issuer chain data: the signing key does not match the public_key of the signing token"
        );
        // no tcs
        let mut signer = c.signer.clone();
        signer.standard.trust_chain_signature.clear();
        let e = s.add_chain_issuer_data(&signer, &c.signer_key).unwrap_err();
        assert!(e
            .to_string()
            .contains("no Trust Chain Signature claim in JWT Signing Token"));
        // no exp
        let mut signer = c.signer.clone();
        signer.standard.expires_at = None;
        assert!(s.add_chain_issuer_data(&signer, &c.signer_key).is_err());
        // exp kept when earlier than the signer's
        let mut s = claims_without_chain();
        s.add_chain_issuer_data(&c.signer, &c.signer_key).unwrap();
        assert_eq!(s.standard.expires_at, Some(NOW + 3600));
        assert_eq!(s.standard.issuer_expires_at, c.signer.standard.expires_at);
    }

    #[test]
    fn client_id_token_parsing() {
        let c = chain(Duration::from_secs(86400));
        let parsed = parse_client_id_token_unverified(&c.signer_token).unwrap();
        assert_eq!(parsed, c.signer);
        assert_eq!(parsed.caller_id, "provisioner");
        parse_client_id_token_at(
            &c.signer_token,
            &TokenVerifyKey::Ed25519(c.org.verifying_key()),
            NOW,
        )
        .unwrap();
        let server = ed_key().sign(&claims_without_chain()).unwrap();
        assert!(matches!(
            parse_client_id_token_unverified(&server),
            Err(TokenError::NotClientToken(_))
        ));
        let perms: ClientIdClaims = serde_json::from_str(
            r#"{"callerid":"x","permissions":{"provisioner":true,"service":true},"purpose":"choria_client_id"}"#,
        )
        .unwrap();
        let p = perms.permissions.unwrap();
        assert!(p.server_provisioner && p.extended_service_lifetime && !p.org_admin);
    }

    #[test]
    fn provisioning_unverified() {
        let t = ed_key().sign(&prov_claims()).unwrap();
        let c = parse_provisioning_token_unverified(&t).unwrap();
        assert_eq!(c.token, "s3cret");
        let st: StandardClaims = parse_unverified(&t).unwrap();
        assert!(st.is_provisioning());
        let t = ed_key().sign(&claims_without_chain()).unwrap();
        assert!(parse_provisioning_token_unverified(&t).is_err());
    }

    /// KSUID with a fixed payload, as the Go vector generator made them.
    fn fixed_ksuid(ts: i64, p: u8) -> String {
        svix_ksuid::Ksuid::new_raw(
            u32::try_from(ts - super::super::ksuid::KSUID_EPOCH).unwrap(),
            Some(&[p; 16]),
        )
        .to_string()
    }

    fn seed_key(b: u8) -> SigningKey {
        SigningKey::from_bytes(&[b; 32])
    }

    fn go_vector_prov_claims() -> ProvisioningClaims {
        let serde_json::Value::Object(ext) = serde_json::json!({"b": 1, "a": "x<"}) else {
            unreachable!()
        };
        ProvisioningClaims {
            token: "s3cret".into(),
            secure: true,
            urls: "nats://a:4222,nats://b:4222".into(),
            prov_default: true,
            prov_reg_data: "/r".into(),
            prov_facts: "/f".into(),
            prov_nats_user: "u".into(),
            prov_nats_pass: "p<&>".into(),
            extensions: Some(ext),
            organization_unit: "choria".into(),
            proto_v2: true,
            allow_update: true,
            srv_domain: String::new(),
            standard: StandardClaims {
                purpose: PROVISIONING_PURPOSE.into(),
                issuer: DEFAULT_ISSUER.into(),
                subject: PROVISIONING_PURPOSE.into(),
                audience: vec!["aud1".into()],
                expires_at: Some(4_000_000_000),
                not_before: Some(NOW),
                issued_at: Some(NOW),
                id: fixed_ksuid(NOW, 7),
                ..Default::default()
            },
        }
    }

    #[test]
    fn provisioning_tokens_byte_identical_to_go() {
        use super::super::go_vectors::*;
        let claims = go_vector_prov_claims();
        let ed = TokenSigningKey::Ed25519(seed_key(3));
        assert_eq!(ed.sign(&claims).unwrap(), GO_PROV_ED);
        let rsa = TokenSigningKey::from_bytes(RSA_KEY_PEM.as_bytes()).unwrap();
        assert_eq!(rsa.sign(&claims).unwrap(), GO_PROV_RSA);
        let minimal = ProvisioningClaims {
            token: "x".into(),
            urls: "nats://a:4222".into(),
            standard: StandardClaims {
                purpose: PROVISIONING_PURPOSE.into(),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(ed.sign(&minimal).unwrap(), GO_PROV_MIN);

        // and Go's tokens parse back into the same claims
        assert_eq!(
            parse_provisioning_token_at(GO_PROV_ED, &ed.verify_key(), NOW).unwrap(),
            claims
        );
        assert_eq!(
            parse_provisioning_token_at(GO_PROV_RSA, &rsa.verify_key(), NOW).unwrap(),
            claims
        );
        let mut min = parse_provisioning_token_at(GO_PROV_MIN, &ed.verify_key(), NOW).unwrap();
        assert_eq!(min.organization_unit, "choria");
        min.organization_unit.clear();
        assert_eq!(min, minimal);
    }

    #[test]
    fn chain_tokens_byte_identical_to_go() {
        use super::super::go_vectors::*;
        let (org, signer_key, node) = (seed_key(1), seed_key(2), seed_key(4));
        let mut signer = ClientIdClaims {
            caller_id: "provisioner".into(),
            organization_unit: "choria".into(),
            permissions: Some(ClientPermissions {
                server_provisioner: true,
                ..Default::default()
            }),
            standard: StandardClaims {
                purpose: CLIENT_ID_PURPOSE.into(),
                public_key: hex::encode(signer_key.verifying_key().as_bytes()),
                issuer: "x".into(),
                expires_at: Some(3_900_000_000),
                not_before: Some(1_690_000_000),
                issued_at: Some(1_690_000_000),
                id: fixed_ksuid(1_690_000_000, 8),
                ..Default::default()
            },
            ..Default::default()
        };
        signer.standard.add_org_issuer_data(&org).unwrap();
        let signer_token = TokenSigningKey::Ed25519(org.clone()).sign(&signer).unwrap();
        assert_eq!(signer_token, GO_SIGNER);

        let mut server = ServerClaims {
            identity: "node1.example.net".into(),
            collectives: vec!["choria".into(), "x".into()],
            permissions: Some(ServerPermissions {
                submission: true,
                service_host: true,
                ..Default::default()
            }),
            organization_unit: "choria".into(),
            additional_publish_subjects: vec!["a.>".into()],
            standard: StandardClaims {
                purpose: SERVER_PURPOSE.into(),
                public_key: hex::encode(node.verifying_key().as_bytes()),
                issuer: PROVISIONER_ISSUER.into(),
                expires_at: Some(4_000_000_000),
                not_before: Some(NOW),
                issued_at: Some(NOW),
                id: fixed_ksuid(NOW, 9),
                ..Default::default()
            },
        };
        let parsed_signer = parse_client_id_token_unverified(GO_SIGNER).unwrap();
        server
            .add_chain_issuer_data(&parsed_signer, &signer_key)
            .unwrap();
        let token = TokenSigningKey::Ed25519(signer_key).sign(&server).unwrap();
        assert_eq!(token, GO_SERVER);
        let v = verify_chain_issued_server_token_at(GO_SERVER, &org.verifying_key(), NOW).unwrap();
        assert_eq!(v, server);
        assert_eq!(v.standard.expires_at, Some(3_900_000_000));
    }

    proptest! {
        #[test]
        fn parse_provisioning_token_never_panics(s in ".{0,200}") {
            let vk = ed_key().verify_key();
            let _ = parse_provisioning_token_at(&s, &vk, NOW);
            let _ = parse_unverified::<ProvisioningClaims>(&s);
            let _ = parse_server_token_at(&s, &vk, NOW);
        }

        #[test]
        fn parse_structured_tokens_never_panic(
            header in prop_oneof![
                Just(r#"{"alg":"EdDSA","typ":"JWT"}"#.to_string()),
                Just(r#"{"alg":"RS256"}"#.to_string()),
                ".{0,30}",
            ],
            claims in prop_oneof![
                Just(r#"{"purpose":"choria_provisioning"}"#.to_string()),
                r#"\{"(cht|chs|exp|nbf|aud|tcs|iss|jti|extensions|purpose|sub|issexp)":(null|true|1|-1|1\.5e9|"x"|\[\]|\{\})\}"#,
                ".{0,60}",
            ],
            sig in proptest::collection::vec(any::<u8>(), 0..80),
        ) {
            let t = format!("{}.{}.{}", b64(&header), b64(&claims), JWT_B64.encode(sig));
            let ed = ed_key().verify_key();
            let _ = parse_provisioning_token_at(&t, &ed, NOW);
            let _ = parse_server_token_at(&t, &ed, NOW);
            let _ = verify_chain_issued_server_token_at(&t, &SigningKey::from_bytes(&[1u8; 32]).verifying_key(), NOW);
            let _ = parse_provisioning_token_at(&t, &rsa_key().verify_key(), NOW);
        }

        #[test]
        fn chain_claims_never_panic(
            iss in r"(C-|I-)?[0-9a-f.]{0,70}",
            tcs in r"[0-9a-f.]{0,140}",
            jti in r"[0-9A-Za-z]{0,28}",
            iat in proptest::option::of(0i64..2_000_000_000),
        ) {
            let st = StandardClaims {
                issuer: iss,
                trust_chain_signature: tcs,
                id: jti,
                issued_at: iat,
                expires_at: Some(NOW + 10),
                issuer_expires_at: Some(NOW + 10),
                public_key: PUB.into(),
                purpose: SERVER_PURPOSE.into(),
                ..Default::default()
            };
            let _ = st.signed_by_issuer_key(&SigningKey::from_bytes(&[1u8; 32]).verifying_key());
        }

        #[test]
        fn from_setting_never_panics(s in ".{0,100}") {
            let _ = TokenVerifyKey::from_setting(&s);
        }

        #[test]
        fn from_pem_or_hex_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = TokenVerifyKey::from_pem_or_hex(&b);
            let _ = TokenSigningKey::from_bytes(&b);
            let mut pem_like = b"-----BEGIN PUBLIC KEY-----\n".to_vec();
            pem_like.extend_from_slice(&b);
            let _ = TokenVerifyKey::from_pem_or_hex(&pem_like);
        }
    }
}

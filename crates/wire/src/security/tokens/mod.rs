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
use rsa::pkcs8::{DecodePrivateKey, DecodePublicKey};
use rsa::traits::PublicKeyParts;
use rsa::{RsaPrivateKey, RsaPublicKey};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
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
    /// The private-key operation failed.
    #[error("signing the token failed: {0}")]
    Signing(String),
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

mod claims;
mod go_json;
mod jws;
mod keys;
mod standard;
mod verify;
pub use claims::*;
pub use go_json::*;
pub use jws::*;
pub use keys::*;
pub use standard::*;
pub use verify::*;

#[cfg(test)]
mod tests;

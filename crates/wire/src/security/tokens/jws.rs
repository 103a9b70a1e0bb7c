//! JWS compact serialization: decoding, `alg` checks, RSA/EdDSA signature checks, time validation.

use super::*;
use crate::security::rsa_signer::{verify_pkcs1v15, RsaDigest};

// JWS decoding and verification
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Alg {
    Rs256,
    Rs384,
    Rs512,
    EdDsa,
}

impl Alg {
    pub(super) fn name(self) -> &'static str {
        match self {
            Alg::Rs256 => "RS256",
            Alg::Rs384 => "RS384",
            Alg::Rs512 => "RS512",
            Alg::EdDsa => "EdDSA",
        }
    }
}

pub(super) struct DecodedJws<'a> {
    pub(super) alg: String,
    pub(super) signing_input: &'a str,
    pub(super) claims: Vec<u8>,
    pub(super) signature: Vec<u8>,
}

pub(super) fn b64_segment(seg: &str, what: &str) -> Result<Vec<u8>, TokenError> {
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
pub(super) fn decode_jws(token: &str) -> Result<DecodedJws<'_>, TokenError> {
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

pub(super) fn decode_claims<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, TokenError> {
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

pub(super) fn parse_alg(alg: &str) -> Result<Alg, TokenError> {
    match alg {
        "RS256" => Ok(Alg::Rs256),
        "RS384" => Ok(Alg::Rs384),
        "RS512" => Ok(Alg::Rs512),
        "EdDSA" => Ok(Alg::EdDsa),
        other => Err(TokenError::UnsupportedAlgorithm(clip(other))),
    }
}

pub(super) fn verify_rsa(
    alg: Alg,
    key: &RsaPublicKey,
    msg: &[u8],
    sig: &[u8],
) -> Result<(), TokenError> {
    let digest = match alg {
        Alg::Rs256 => RsaDigest::Sha256,
        Alg::Rs384 => RsaDigest::Sha384,
        Alg::Rs512 => RsaDigest::Sha512,
        Alg::EdDsa => return Err(TokenError::InvalidSignature),
    };
    if verify_pkcs1v15(key, digest, msg, sig) {
        Ok(())
    } else {
        Err(TokenError::InvalidSignature)
    }
}

/// Checks `exp` and `nbf` with no leeway, like golang-jwt v5's default
/// validator: `exp` is optional; valid while `now < exp`; valid from
/// `now >= nbf`. `iat` is not checked.
pub(super) fn validate_times(std: &StandardClaims, now: i64) -> Result<(), TokenError> {
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

/// Verifies an RSA PKCS#1 v1.5 signature with SHA-256 of `msg` (what RS256
/// signs, and the `signature` of an AWS instance identity document).
pub fn verify_rsa_sha256(key: &RsaPublicKey, msg: &[u8], sig: &[u8]) -> Result<(), TokenError> {
    verify_rsa(Alg::Rs256, key, msg, sig)
}

/// A compact RS256 JWS verified with the one of `keys` its header's `kid`
/// names (keys with an empty id are tried for any token, and every key for
/// a token without a `kid`): its claims, not yet checked for anything but
/// their signature. For tokens of other issuers (a cloud's instance
/// identity token), whose claims the caller checks itself.
pub fn verify_rs256_jws(
    token: &str,
    keys: &[(String, RsaPublicKey)],
) -> Result<serde_json::Value, TokenError> {
    let d = decode_jws(token)?;
    if d.alg != "RS256" {
        return Err(TokenError::UnsupportedAlgorithm(clip(&d.alg)));
    }
    let header = b64_segment(token.split('.').next().unwrap_or_default(), "header")?;
    let kid = serde_json::from_slice::<serde_json::Value>(&header)
        .ok()
        .and_then(|h| h.get("kid").and_then(|k| k.as_str()).map(str::to_string));
    let candidates = keys
        .iter()
        .filter(|(id, _)| id.is_empty() || kid.as_deref().is_none_or(|k| k == id));
    let mut tried = false;
    for (_, key) in candidates {
        tried = true;
        if verify_rsa(Alg::Rs256, key, d.signing_input.as_bytes(), &d.signature).is_ok() {
            return decode_claims(&d.claims);
        }
    }
    match tried {
        true => Err(TokenError::InvalidSignature),
        false => Err(TokenError::Malformed(format!(
            "signed with key {}, which none of the given keys is",
            clip(kid.as_deref().unwrap_or_default())
        ))),
    }
}

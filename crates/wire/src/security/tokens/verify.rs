//! Parsing tokens with verification (and unverified where Go does), per token kind.

use super::*;

/// `tokens.ParseToken`: decode, check `alg` against the allowed list and the
/// key type, resolve the chain issuer key for chain-aware token types
/// (server and client tokens with a `C-` issuer), verify the signature, then
/// validate `exp`/`nbf`.
pub(super) fn parse_verified<T: DeserializeOwned + HasStandardClaims>(
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

pub(super) fn finish_provisioning(claims: &mut ProvisioningClaims) -> Result<(), TokenError> {
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

pub(super) fn require_client_purpose(claims: ClientIdClaims) -> Result<ClientIdClaims, TokenError> {
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

//! `tokens.StandardClaims`: the registered claims and the chain-issuer (trust chain) data every Choria token embeds.

use super::*;

pub(super) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub(super) fn validity_secs(validity: Duration) -> Result<i64, TokenError> {
    i64::try_from(validity.as_secs())
        .map_err(|_| TokenError::InvalidClaims("validity is too large".into()))
}

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
    ///
    /// `signer_key` is in memory or in a PKCS#11 token ([`Ed25519Signer`]).
    pub fn add_chain_issuer_data<K: Ed25519Signer + ?Sized>(
        &mut self,
        signer: &StandardClaims,
        signer_key: &K,
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
        if signer_pub != signer_key.public_key_bytes() {
            return err("the signing key does not match the public_key of the signing token");
        }

        // Signed first: a token that cannot sign leaves the claims as they were.
        let data = format!("{}.{}", self.id, signer.trust_chain_signature);
        let sig = signer_key.sign_ed25519(data.as_bytes())?;
        self.issuer = format!("{CHAIN_ISSUER_PREFIX}{}.{}", signer.id, signer.public_key);
        self.issuer_expires_at = Some(signer_exp);
        if self.expires_at.is_none_or(|e| signer_exp < e) {
            self.expires_at = Some(signer_exp);
        }
        self.trust_chain_signature =
            format!("{}.{}", signer.trust_chain_signature, hex::encode(sig));
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

pub(super) fn verify_ed25519(key: &VerifyingKey, msg: &[u8], sig: &[u8]) -> Result<(), ()> {
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

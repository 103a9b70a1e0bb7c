//! Signing and verification keys: RSA PEM (PKCS#1/PKCS#8, certificates, public keys), hex ed25519,
//! and an ed25519 key in a PKCS#11 token.

use super::*;
use crate::security::pkcs11::Pkcs11Ed25519Key;
use crate::security::rsa_signer::RsaSigningKey;
use std::sync::Arc;

// Keys
// ---------------------------------------------------------------------------

pub(super) const RSA_KEY_HEADER: &[u8] = b"-----BEGIN RSA PRIVATE KEY";
pub(super) const PKCS8_KEY_HEADER: &[u8] = b"-----BEGIN PRIVATE KEY";
pub(super) const CERT_HEADER: &[u8] = b"-----BEGIN CERTIFICATE";
pub(super) const PK_HEADER: &[u8] = b"-----BEGIN PUBLIC KEY";
pub(super) const RSA_PK_HEADER: &[u8] = b"-----BEGIN RSA PUBLIC KEY";

pub(super) fn read_key_file(path: &Path) -> Result<Vec<u8>, KeyError> {
    std::fs::read(path).map_err(|source| KeyError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// An ed25519 key that signs bytes: one in memory ([`SigningKey`]) or one
/// that stays in a PKCS#11 token ([`Pkcs11Ed25519Key`]). What chain-issuer
/// data needs of the key (see [`StandardClaims::add_chain_issuer_data`]).
pub trait Ed25519Signer {
    /// The 32-byte public key.
    fn public_key_bytes(&self) -> [u8; 32];

    /// The 64-byte signature over `data`. A key in a token makes a blocking
    /// call into it: async callers go through `spawn_blocking`.
    fn sign_ed25519(&self, data: &[u8]) -> Result<[u8; 64], TokenError>;
}

impl Ed25519Signer for SigningKey {
    fn public_key_bytes(&self) -> [u8; 32] {
        self.verifying_key().to_bytes()
    }

    fn sign_ed25519(&self, data: &[u8]) -> Result<[u8; 64], TokenError> {
        Ok(self.sign(data).to_bytes())
    }
}

impl Ed25519Signer for Pkcs11Ed25519Key {
    fn public_key_bytes(&self) -> [u8; 32] {
        self.public_key()
    }

    fn sign_ed25519(&self, data: &[u8]) -> Result<[u8; 64], TokenError> {
        // The token's errors never hold its PIN.
        self.sign(data)
            .map_err(|e| TokenError::Signing(e.to_string()))
    }
}

/// A JWT signing key: RSA (⇒ RS256) or ed25519 (⇒ EdDSA), the ed25519 key
/// in memory or in a PKCS#11 token. `Debug` redacts.
// One per process (the issuer key), never in a collection: its size does
// not matter, and boxing the seed would only add a pointer to every use.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum TokenSigningKey {
    /// RSA private key, signs RS256 (through `ring`, see
    /// [`crate::security::rsa_signer`]).
    Rsa(RsaSigningKey),
    /// Ed25519 key, signs EdDSA.
    Ed25519(SigningKey),
    /// Ed25519 key that stays in a PKCS#11 token, signs EdDSA with the
    /// token's CKM_EDDSA (the same signatures: Ed25519 is deterministic).
    /// Each signature is a blocking call into the token.
    Ed25519Token(Arc<Pkcs11Ed25519Key>),
}

impl fmt::Debug for TokenSigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rsa(k) => write!(
                f,
                "TokenSigningKey::Rsa(<redacted {} bit key>)",
                k.key().n().bits()
            ),
            Self::Ed25519(k) => write!(
                f,
                "TokenSigningKey::Ed25519(<redacted>, public {})",
                hex::encode(k.verifying_key().as_bytes())
            ),
            // The URI without its PIN, and the public key.
            Self::Ed25519Token(k) => write!(f, "TokenSigningKey::Ed25519Token({k:?})"),
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
            return Ok(Self::Rsa(RsaSigningKey::new(key)));
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
            Self::Ed25519(_) | Self::Ed25519Token(_) => "EdDSA",
        }
    }

    /// The ed25519 key, if this is one (the chain issuer signing key).
    pub fn as_ed25519(&self) -> Option<&dyn Ed25519Signer> {
        match self {
            Self::Ed25519(k) => Some(k),
            Self::Ed25519Token(k) => Some(k.as_ref()),
            Self::Rsa(_) => None,
        }
    }

    /// True when signing is a blocking call into a PKCS#11 token (async
    /// callers then sign in `spawn_blocking`); false when the key is in
    /// memory and signing is cheap CPU work.
    pub fn in_token(&self) -> bool {
        matches!(self, Self::Ed25519Token(_))
    }

    /// The matching verification key.
    pub fn verify_key(&self) -> TokenVerifyKey {
        match self {
            Self::Rsa(k) => TokenVerifyKey::Rsa(k.key().to_public_key()),
            Self::Ed25519(k) => TokenVerifyKey::Ed25519(k.verifying_key()),
            Self::Ed25519Token(k) => TokenVerifyKey::Ed25519(k.verifying_key()),
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
        let sig = self.sign_input(out.as_bytes())?;
        out.push('.');
        out.push_str(&JWT_B64.encode(sig));
        Ok(out)
    }

    /// The raw JWS signature of a signing input (`<header>.<claims>`).
    pub(super) fn sign_input(&self, input: &[u8]) -> Result<Vec<u8>, TokenError> {
        match self {
            Self::Rsa(k) => k.sign_sha256(input).map_err(TokenError::Signing),
            Self::Ed25519(k) => Ok(k.sign(input).to_bytes().to_vec()),
            Self::Ed25519Token(k) => k.sign_ed25519(input).map(|sig| sig.to_vec()),
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

    pub(super) fn kind(&self) -> &'static str {
        match self {
            Self::Rsa(_) => "rsa",
            Self::Ed25519(_) => "ed25519",
        }
    }
}

pub(super) fn rsa_public_from_der(der: &[u8]) -> Result<RsaPublicKey, KeyError> {
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
pub(super) fn rsa_public_from_spki(
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

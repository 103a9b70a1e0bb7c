//! Ed25519 keys for the `gen25519` provisioning step and for Org Issuer chains.
//!
//! During `gen25519` the server creates a fresh key pair, stores the seed as 64
//! lowercase hex characters in `server.seed`, signs the provisioner's nonce
//! (its ASCII text, not hex-decoded) and replies with hex public key and
//! signature. The provisioner verifies that signature before it trusts the
//! public key enough to put it into the server JWT
//! (`provisioner:host/rpc.go` `fetchEd25519PubKey`).

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use rand::rngs::OsRng;
use std::fmt;

/// Errors from Ed25519 key handling and nonce verification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ed25519Error {
    /// A seed was not 32 bytes of hex.
    #[error("invalid ed25519 seed: {0}")]
    InvalidSeed(String),
    /// A public key was not 32 bytes of hex or not a valid curve point.
    #[error("invalid public key received: {0}")]
    InvalidPublicKey(String),
    /// A signature was not hex (Go reports this as "invalid signature").
    #[error("invalid signature: {0}")]
    InvalidSignatureEncoding(String),
    /// The signature did not verify (or had the wrong length, which Go's
    /// `ed25519.Verify` also treats as a plain verification failure).
    #[error("invalid nonce signature")]
    InvalidNonceSignature,
}

/// Describes a hex decoding problem without echoing the offending character,
/// because the input may be secret (a seed).
pub(crate) fn describe_hex_error(e: &hex::FromHexError) -> String {
    match e {
        hex::FromHexError::InvalidHexCharacter { index, .. } => {
            format!("not hex: invalid character at position {index}")
        }
        hex::FromHexError::OddLength => "not hex: odd number of characters".to_string(),
        hex::FromHexError::InvalidStringLength => "not hex: wrong length".to_string(),
    }
}

/// Decodes exactly `N` bytes of hex (either case), describing failures without
/// echoing the input.
pub(crate) fn decode_hex_array<const N: usize>(s: &str) -> Result<[u8; N], String> {
    if s.len() != N * 2 {
        return Err(format!(
            "expected {} hex characters ({N} bytes), got {}",
            N * 2,
            s.len()
        ));
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).map_err(|e| describe_hex_error(&e))?;
    Ok(out)
}

/// An Ed25519 key pair. `Debug` never shows the seed.
#[derive(Clone)]
pub struct Ed25519KeyPair {
    signing: SigningKey,
}

impl fmt::Debug for Ed25519KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ed25519KeyPair")
            .field("public_key", &self.public_hex())
            .field("seed", &"<redacted>")
            .finish()
    }
}

impl Ed25519KeyPair {
    /// Generates a new key pair from the operating system's CSPRNG.
    pub fn generate() -> Self {
        Self {
            signing: SigningKey::generate(&mut OsRng),
        }
    }

    /// Builds the key pair from a 32 byte seed (Go's `ed25519.NewKeyFromSeed`).
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        Self {
            signing: SigningKey::from_bytes(seed),
        }
    }

    /// Builds the key pair from a hex seed as stored in `server.seed` or a
    /// provisioner `jwt_signing_key` file.
    ///
    /// Trailing whitespace (e.g. the newline an editor adds) is tolerated. Go
    /// rejects it (`SignTokenWithKeyFile` wants exactly 64 bytes and
    /// `hex.DecodeString` fails on `\n`); being lenient here costs nothing and
    /// avoids a confusing failure mode.
    pub fn from_seed_hex(s: &str) -> Result<Self, Ed25519Error> {
        let seed = parse_seed_hex(s)?;
        Ok(Self::from_seed(&seed))
    }

    /// Wraps an existing signing key.
    pub fn from_signing_key(signing: SigningKey) -> Self {
        Self { signing }
    }

    /// The 32 byte seed. Handle with care: this is the private key.
    pub fn seed(&self) -> [u8; 32] {
        self.signing.to_bytes()
    }

    /// The seed as 64 lowercase hex characters, the `server.seed` file format.
    pub fn seed_hex(&self) -> String {
        seed_hex(&self.signing.to_bytes())
    }

    /// The public key.
    pub fn verifying_key(&self) -> VerifyingKey {
        self.signing.verifying_key()
    }

    /// The public key as 64 lowercase hex characters, as sent in `gen25519`
    /// replies and put into JWT `public_key` claims.
    pub fn public_hex(&self) -> String {
        hex::encode(self.signing.verifying_key().as_bytes())
    }

    /// The underlying signing key.
    pub fn signing_key(&self) -> &SigningKey {
        &self.signing
    }

    /// Signs arbitrary bytes.
    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        self.signing.sign(msg).to_bytes()
    }

    /// Signs the nonce's UTF-8 bytes and returns the signature as lowercase
    /// hex, exactly like go-choria's `gen25519` action.
    pub fn sign_nonce_hex(&self, nonce: &str) -> String {
        hex::encode(self.sign(nonce.as_bytes()))
    }
}

/// Generates a fresh Ed25519 key pair.
pub fn generate_keypair() -> Ed25519KeyPair {
    Ed25519KeyPair::generate()
}

/// Hex encodes a seed (lowercase), the on-disk format of `server.seed`.
pub fn seed_hex(seed: &[u8; 32]) -> String {
    hex::encode(seed)
}

/// Parses a hex seed, tolerating trailing whitespace (see
/// [`Ed25519KeyPair::from_seed_hex`]). Errors never include the seed text.
pub fn parse_seed_hex(s: &str) -> Result<[u8; 32], Ed25519Error> {
    decode_hex_array::<32>(s.trim_end()).map_err(Ed25519Error::InvalidSeed)
}

/// Parses a hex Ed25519 public key (either case). Surrounding whitespace is
/// not accepted here because public keys travel inside JSON replies where Go
/// would reject it too.
pub fn parse_public_key_hex(s: &str) -> Result<VerifyingKey, Ed25519Error> {
    let bytes = decode_hex_array::<32>(s).map_err(Ed25519Error::InvalidPublicKey)?;
    VerifyingKey::from_bytes(&bytes)
        .map_err(|_| Ed25519Error::InvalidPublicKey("not a valid ed25519 curve point".into()))
}

/// Signs a nonce with the key derived from `seed`, returning hex.
pub fn sign_nonce_hex(seed: &[u8; 32], nonce: &str) -> String {
    Ed25519KeyPair::from_seed(seed).sign_nonce_hex(nonce)
}

/// Verifies a `gen25519` reply: `sig_hex` must be the Ed25519 signature of the
/// nonce's UTF-8 bytes by `public_hex`.
///
/// Mirrors the Go provisioner's checks and messages, except that a public key
/// of the wrong length is an error here where Go's `ed25519.Verify` panics.
/// Verification is Go-compatible (cofactorless, canonical `S` required).
pub fn verify_nonce(public_hex: &str, nonce: &str, sig_hex: &str) -> Result<(), Ed25519Error> {
    let pk = parse_public_key_hex(public_hex)?;
    let sig = hex::decode(sig_hex)
        .map_err(|e| Ed25519Error::InvalidSignatureEncoding(describe_hex_error(&e)))?;
    let sig = Signature::from_slice(&sig).map_err(|_| Ed25519Error::InvalidNonceSignature)?;
    // Strict: a small-order (weak) public key or a non-canonical signature
    // is refused. With plain `verify`, the identity point as the key and
    // as R with s = 0 "signs" every nonce, so a node could pass the check
    // without holding any private key.
    pk.verify_strict(nonce.as_bytes(), &sig)
        .map_err(|_| Ed25519Error::InvalidNonceSignature)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::Verifier;
    use proptest::prelude::*;

    // RFC 8032 test 1.
    const RFC_SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    const RFC_PUB: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
    const RFC_SIG_EMPTY: &str = "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b";

    #[test]
    fn rfc8032_vector() {
        let kp = Ed25519KeyPair::from_seed_hex(RFC_SEED).unwrap();
        assert_eq!(kp.public_hex(), RFC_PUB);
        assert_eq!(kp.sign_nonce_hex(""), RFC_SIG_EMPTY);
        assert_eq!(kp.seed_hex(), RFC_SEED);
        verify_nonce(RFC_PUB, "", RFC_SIG_EMPTY).unwrap();
    }

    #[test]
    fn a_weak_key_signature_that_fits_every_nonce_is_refused() {
        // The identity point (encoded as 1 followed by zeros) as the public
        // key and as R, with s = 0: lax verification accepts it for any message.
        let identity = format!("01{}", "00".repeat(31));
        let sig = format!("{identity}{}", "00".repeat(32));
        let pk = parse_public_key_hex(&identity).unwrap();
        let raw = Signature::from_slice(&hex::decode(&sig).unwrap()).unwrap();
        assert!(
            pk.verify(b"any nonce", &raw).is_ok(),
            "the lax check accepts it (what verify_strict guards against)"
        );
        for nonce in ["any nonce", "another"] {
            assert!(matches!(
                verify_nonce(&identity, nonce, &sig),
                Err(Ed25519Error::InvalidNonceSignature)
            ));
        }
    }

    #[test]
    fn nonce_round_trip_and_failures() {
        let kp = generate_keypair();
        let nonce = "0123456789abcdef0123456789abcdef";
        let sig = kp.sign_nonce_hex(nonce);
        assert_eq!(sig.len(), 128);
        verify_nonce(&kp.public_hex(), nonce, &sig).unwrap();
        // uppercase hex is accepted like Go's hex.DecodeString
        verify_nonce(&kp.public_hex().to_uppercase(), nonce, &sig.to_uppercase()).unwrap();
        assert_eq!(sign_nonce_hex(&kp.seed(), nonce), sig);

        assert_eq!(
            verify_nonce(&kp.public_hex(), "other", &sig),
            Err(Ed25519Error::InvalidNonceSignature)
        );
        assert_eq!(
            verify_nonce(&kp.public_hex(), nonce, &sig[..126]),
            Err(Ed25519Error::InvalidNonceSignature)
        );
        assert!(matches!(
            verify_nonce(&kp.public_hex(), nonce, "zz"),
            Err(Ed25519Error::InvalidSignatureEncoding(_))
        ));
        assert!(matches!(
            verify_nonce("abcd", nonce, &sig),
            Err(Ed25519Error::InvalidPublicKey(_))
        ));
        let other = generate_keypair();
        assert_eq!(
            verify_nonce(&other.public_hex(), nonce, &sig),
            Err(Ed25519Error::InvalidNonceSignature)
        );
        assert_eq!(
            Ed25519Error::InvalidNonceSignature.to_string(),
            "invalid nonce signature"
        );
    }

    #[test]
    fn seed_parsing_is_lenient_on_trailing_newline_only() {
        assert!(Ed25519KeyPair::from_seed_hex(&format!("{RFC_SEED}\n")).is_ok());
        assert!(Ed25519KeyPair::from_seed_hex(&format!(" {RFC_SEED}")).is_err());
        assert!(Ed25519KeyPair::from_seed_hex(&RFC_SEED[..62]).is_err());
    }

    #[test]
    fn errors_and_debug_do_not_leak_seed() {
        let bad = format!("{}q", &RFC_SEED[..63]);
        let e = Ed25519KeyPair::from_seed_hex(&bad).unwrap_err().to_string();
        assert!(!e.contains('q'), "{e}");
        assert!(!e.contains(&RFC_SEED[..16]), "{e}");
        let kp = Ed25519KeyPair::from_seed_hex(RFC_SEED).unwrap();
        let dbg = format!("{kp:?}");
        assert!(!dbg.contains(RFC_SEED), "{dbg}");
        assert!(dbg.contains("redacted"));
    }

    proptest! {
        #[test]
        fn verify_nonce_never_panics(pk in ".{0,80}", nonce in ".{0,40}", sig in ".{0,140}") {
            let _ = verify_nonce(&pk, &nonce, &sig);
        }

        #[test]
        fn verify_nonce_never_panics_hexish(pk in "[0-9a-fA-F]{62,66}", sig in "[0-9a-f]{126,130}") {
            let _ = verify_nonce(&pk, "n", &sig);
        }

        #[test]
        fn seed_parse_never_panics(s in ".{0,80}") {
            let _ = parse_seed_hex(&s);
        }
    }
}

//! X25519 key agreement used to ship a private key to a server safely.
//!
//! The server makes a fresh pair on every `jwt` action and returns its public
//! key as `ecdh_public`. When the helper hands the provisioner a private key,
//! the provisioner makes its own pair, derives the shared secret, encrypts the
//! key with it (see [`super::pem_crypt`]) and sends its public key in the
//! `configure` request (`choria/ecdh.go`, `provisioner:host/host.go`
//! `encryptPrivateKey`). Public keys travel as 64 lowercase hex characters.

use rand::rngs::OsRng;
use std::fmt;
use x25519_dalek::{PublicKey, StaticSecret};

use super::ed25519::{decode_hex_array, describe_hex_error};

/// Errors from X25519 key agreement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EcdhError {
    /// The remote public key was not hex.
    #[error("remote X25519 public key is not valid hex: {0}")]
    RemoteKeyHex(String),
    /// The remote public key decoded to the wrong number of bytes.
    #[error("remote X25519 public key must be 32 bytes, got {0}")]
    RemoteKeyLength(usize),
    /// The remote key is a low-order point: the result would be all zeros,
    /// which Go's `curve25519.X25519` refuses as well.
    #[error("remote X25519 public key is a low order point, refusing an all-zero shared secret")]
    LowOrderPoint,
    /// A private key was not 32 bytes of hex.
    #[error("invalid X25519 private key: {0}")]
    InvalidPrivateKey(String),
}

/// An X25519 key pair. `Debug` never shows the private scalar.
#[derive(Clone)]
pub struct EcdhKeyPair {
    secret: StaticSecret,
    public: PublicKey,
}

impl fmt::Debug for EcdhKeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EcdhKeyPair")
            .field("public", &self.public_hex())
            .field("private", &"<redacted>")
            .finish()
    }
}

impl EcdhKeyPair {
    /// Generates a pair from 32 random bytes (clamping happens inside X25519,
    /// exactly like Go's `ScalarBaseMult`).
    pub fn generate() -> Self {
        Self::from_secret(StaticSecret::random_from_rng(OsRng))
    }

    /// Builds the pair from raw private bytes (for test vectors and for a
    /// simulator that must persist its key).
    pub fn from_private_bytes(private: [u8; 32]) -> Self {
        Self::from_secret(StaticSecret::from(private))
    }

    /// Builds the pair from 64 hex characters of private key.
    pub fn from_private_hex(s: &str) -> Result<Self, EcdhError> {
        let b = decode_hex_array::<32>(s).map_err(EcdhError::InvalidPrivateKey)?;
        Ok(Self::from_private_bytes(b))
    }

    fn from_secret(secret: StaticSecret) -> Self {
        let public = PublicKey::from(&secret);
        Self { secret, public }
    }

    /// The raw private bytes. Handle with care.
    pub fn private_bytes(&self) -> [u8; 32] {
        self.secret.to_bytes()
    }

    /// The public key bytes.
    pub fn public_bytes(&self) -> [u8; 32] {
        self.public.to_bytes()
    }

    /// The public key as 64 lowercase hex characters (`ecdh_public`).
    pub fn public_hex(&self) -> String {
        hex::encode(self.public.as_bytes())
    }

    /// Derives the shared secret with a peer whose public key is given as hex
    /// (either case, like Go's `hex.DecodeString`).
    pub fn shared_secret(&self, remote_public_hex: &str) -> Result<[u8; 32], EcdhError> {
        let bytes = hex::decode(remote_public_hex)
            .map_err(|e| EcdhError::RemoteKeyHex(describe_hex_error(&e)))?;
        let arr: [u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| EcdhError::RemoteKeyLength(bytes.len()))?;
        self.shared_secret_bytes(&arr)
    }

    /// Derives the shared secret with a peer's raw public key.
    pub fn shared_secret_bytes(&self, remote_public: &[u8; 32]) -> Result<[u8; 32], EcdhError> {
        let shared = self.secret.diffie_hellman(&PublicKey::from(*remote_public));
        if !shared.was_contributory() {
            return Err(EcdhError::LowOrderPoint);
        }
        Ok(shared.to_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Test vector table from choria-protocol.md section 11.
    const SERVER_PRIV: &str = "0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20";
    const SERVER_PUB: &str = "07a37cbc142093c8b755dc1b10e86cb426374ad16aa853ed0bdfc0b2b86d1c7c";
    const PROV_PRIV: &str = "65666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f8081828384";
    const PROV_PUB: &str = "5714769d116bf76436ae74bc793d2c30ad1903c59ac5273805c7e2698b410c36";
    const SHARED: &str = "c9ea6a3f79a000b60b076d4afc990b272f3f0b5aaa3f0b8713c209273e363863";

    #[test]
    fn protocol_doc_vector() {
        let server = EcdhKeyPair::from_private_hex(SERVER_PRIV).unwrap();
        let prov = EcdhKeyPair::from_private_hex(PROV_PRIV).unwrap();
        assert_eq!(server.public_hex(), SERVER_PUB);
        assert_eq!(prov.public_hex(), PROV_PUB);
        assert_eq!(hex::encode(server.shared_secret(PROV_PUB).unwrap()), SHARED);
        assert_eq!(hex::encode(prov.shared_secret(SERVER_PUB).unwrap()), SHARED);
        assert_eq!(
            hex::encode(prov.shared_secret(&SERVER_PUB.to_uppercase()).unwrap()),
            SHARED
        );
    }

    #[test]
    fn rfc7748_vector() {
        // RFC 7748 section 6.1
        let alice = EcdhKeyPair::from_private_hex(
            "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
        )
        .unwrap();
        assert_eq!(
            alice.public_hex(),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
        );
        let shared = alice
            .shared_secret("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
            .unwrap();
        assert_eq!(
            hex::encode(shared),
            "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"
        );
    }

    #[test]
    fn generated_pairs_agree() {
        let a = EcdhKeyPair::generate();
        let b = EcdhKeyPair::generate();
        assert_eq!(a.public_hex().len(), 64);
        assert_eq!(
            a.shared_secret(&b.public_hex()).unwrap(),
            b.shared_secret(&a.public_hex()).unwrap()
        );
        assert_eq!(
            EcdhKeyPair::from_private_bytes(a.private_bytes()).public_bytes(),
            a.public_bytes()
        );
    }

    #[test]
    fn rejects_bad_remote_keys() {
        let a = EcdhKeyPair::generate();
        assert!(matches!(
            a.shared_secret("xyz"),
            Err(EcdhError::RemoteKeyHex(_))
        ));
        assert_eq!(a.shared_secret("abcd"), Err(EcdhError::RemoteKeyLength(2)));
        assert_eq!(
            a.shared_secret(&"00".repeat(32)),
            Err(EcdhError::LowOrderPoint)
        );
        let mut one = [0u8; 32];
        one[0] = 1;
        assert_eq!(a.shared_secret_bytes(&one), Err(EcdhError::LowOrderPoint));
    }

    #[test]
    fn debug_redacts_private() {
        let kp = EcdhKeyPair::from_private_hex(SERVER_PRIV).unwrap();
        let d = format!("{kp:?}");
        assert!(!d.contains(SERVER_PRIV));
        assert!(d.contains(SERVER_PUB));
    }

    proptest! {
        #[test]
        fn shared_secret_never_panics(s in ".{0,80}") {
            let kp = EcdhKeyPair::from_private_hex(SERVER_PRIV).unwrap();
            let _ = kp.shared_secret(&s);
        }

        #[test]
        fn shared_secret_any_32_bytes(b in proptest::array::uniform32(any::<u8>())) {
            let kp = EcdhKeyPair::from_private_hex(SERVER_PRIV).unwrap();
            let _ = kp.shared_secret(&hex::encode(b));
        }
    }
}

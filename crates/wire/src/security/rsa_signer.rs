//! RSA PKCS#1 v1.5 SHA-256 signatures (v1 requests, RS256 JWTs) made by
//! `ring`: constant-time, with blinding, and about eight times faster than
//! the `rsa` crate on this machine (whose private-key operations carry a
//! timing advisory, RUSTSEC-2023-0071, where anyone on the provisioning
//! network sees thousands of signatures a minute). PKCS#1 v1.5 is
//! deterministic, so the bytes are the same whichever signs.
//!
//! `ring` signs with keys of 2048 to 4096 bits; a smaller one (which Go
//! accepts, and which no Choria CA issues by default) is signed with the
//! `rsa` crate, as before.
//!
//! [`verify_pkcs1v15`] checks such signatures (RS256/384/512 JWTs, node
//! CSRs) the same way: `ring` for keys of 2048 bits and more, the `rsa`
//! crate for smaller ones.

use rsa::pkcs1::EncodeRsaPrivateKey;
use rsa::{RsaPrivateKey, RsaPublicKey};
use std::sync::Arc;

/// An RSA private key ready to sign.
#[derive(Clone)]
pub struct RsaSigningKey {
    key: Arc<RsaPrivateKey>,
    ring: Option<Arc<ring::signature::RsaKeyPair>>,
}

impl std::fmt::Debug for RsaSigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use rsa::traits::PublicKeyParts as _;
        write!(
            f,
            "RsaSigningKey(<redacted {} bit key>)",
            self.key.size() * 8
        )
    }
}

impl PartialEq for RsaSigningKey {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl RsaSigningKey {
    pub fn new(key: RsaPrivateKey) -> Self {
        let ring = key
            .to_pkcs1_der()
            .ok()
            .and_then(|der| ring::signature::RsaKeyPair::from_der(der.as_bytes()).ok())
            .map(Arc::new);
        RsaSigningKey {
            key: Arc::new(key),
            ring,
        }
    }

    /// The key, for its public half and size.
    pub fn key(&self) -> &RsaPrivateKey {
        &self.key
    }

    /// Whether `ring` signs with it (2048 to 4096 bits).
    pub fn in_ring(&self) -> bool {
        self.ring.is_some()
    }

    /// The PKCS#1 v1.5 signature of SHA-256(`msg`).
    pub fn sign_sha256(&self, msg: &[u8]) -> Result<Vec<u8>, String> {
        match &self.ring {
            Some(pair) => {
                let mut sig = vec![0; pair.public().modulus_len()];
                pair.sign(
                    &ring::signature::RSA_PKCS1_SHA256,
                    &ring::rand::SystemRandom::new(),
                    msg,
                    &mut sig,
                )
                .map_err(|_| "RSA signing failed".to_string())?;
                Ok(sig)
            }
            None => {
                use rsa::signature::{RandomizedSigner as _, SignatureEncoding as _};
                rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new((*self.key).clone())
                    .try_sign_with_rng(&mut rand::rngs::OsRng, msg)
                    .map(|s| s.to_vec())
                    .map_err(|e| e.to_string())
            }
        }
    }
}

/// The digest a PKCS#1 v1.5 signature is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RsaDigest {
    Sha256,
    Sha384,
    Sha512,
}

/// Whether `sig` is `key`'s PKCS#1 v1.5 signature over `digest(msg)`.
///
/// ring verifies about eight times faster than the rsa crate (a node's
/// provisioning JWT, its CSR's signature for the built-in CA), but only
/// keys of 2048 bits and more: smaller keys (which Go accepts) take the
/// rsa crate. Both want the signature exactly as long as the modulus.
pub(crate) fn verify_pkcs1v15(
    key: &RsaPublicKey,
    digest: RsaDigest,
    msg: &[u8],
    sig: &[u8],
) -> bool {
    use rsa::traits::PublicKeyParts as _;
    if key.size() * 8 >= 2048 {
        let params = match digest {
            RsaDigest::Sha256 => &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            RsaDigest::Sha384 => &ring::signature::RSA_PKCS1_2048_8192_SHA384,
            RsaDigest::Sha512 => &ring::signature::RSA_PKCS1_2048_8192_SHA512,
        };
        let (n, e) = (key.n().to_bytes_be(), key.e().to_bytes_be());
        return ring::signature::RsaPublicKeyComponents { n: &n, e: &e }
            .verify(params, msg, sig)
            .is_ok();
    }
    use rsa::pkcs1v15::{Signature, VerifyingKey};
    use rsa::signature::Verifier as _;
    let Ok(sig) = Signature::try_from(sig) else {
        return false;
    };
    let key = key.clone();
    match digest {
        RsaDigest::Sha256 => VerifyingKey::<sha2::Sha256>::new(key).verify(msg, &sig),
        RsaDigest::Sha384 => VerifyingKey::<sha2::Sha384>::new(key).verify(msg, &sig),
        RsaDigest::Sha512 => VerifyingKey::<sha2::Sha512>::new(key).verify(msg, &sig),
    }
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_signs_the_same_bytes_as_the_rsa_crate_and_faster() {
        use rsa::signature::{SignatureEncoding as _, Signer as _};
        let key = crate::security::csr::generate_rsa_key(2048).unwrap();
        let ours = RsaSigningKey::new(key.clone());
        assert!(ours.in_ring());
        let msg = b"{\"agent\":\"choria_provision\"}";
        let by_ring = ours.sign_sha256(msg).unwrap();
        let by_crate = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key)
            .try_sign(msg)
            .unwrap()
            .to_vec();
        assert_eq!(by_ring, by_crate, "PKCS#1 v1.5 is deterministic");
    }

    #[test]
    fn a_key_ring_refuses_still_signs() {
        let key = crate::security::csr::generate_rsa_key(1024).unwrap();
        let ours = RsaSigningKey::new(key.clone());
        assert!(!ours.in_ring());
        let sig = ours.sign_sha256(b"m").unwrap();
        assert_eq!(sig.len(), 128);
        assert!(format!("{ours:?}").contains("1024 bit"));
    }
}

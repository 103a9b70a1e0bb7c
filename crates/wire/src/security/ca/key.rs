//! The CA's private key as the CA uses it: the algorithm it signs with,
//! its public key, and a signature over the bytes of a certificate. A file
//! key is RSA (SHA256WithRSA, through `ring`) or ECDSA P-256
//! (ecdsa-with-SHA256, through `ring`); a key held elsewhere (a PKCS#11
//! token) implements [`CaKey`] too and never enters this process.

use super::{enc_err, parse_err, PkiError};
use crate::security::rsa_signer::RsaSigningKey;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use rsa::pkcs1::der::zeroize::Zeroizing;
use rsa::pkcs1::{EncodeRsaPrivateKey, LineEnding};
use rsa::pkcs8::EncodePublicKey;
use rsa::RsaPublicKey;
use x509_cert::der::asn1::{Any, BitString, ObjectIdentifier};
use x509_cert::der::Decode;
use x509_cert::spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};

pub(crate) const OID_SHA256_RSA: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.11");
pub(crate) const OID_EC_PUBLIC_KEY: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
pub(crate) const OID_P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
pub(crate) const OID_ECDSA_SHA256: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.2");

/// sha256WithRSAEncryption, NULL parameters (RFC 4055), as every RSA CA key
/// signs, a file's or a token's.
pub(crate) fn sha256_with_rsa() -> AlgorithmIdentifierOwned {
    AlgorithmIdentifierOwned {
        oid: OID_SHA256_RSA,
        parameters: Some(Any::null()),
    }
}

/// ecdsa-with-SHA256, parameters absent (RFC 5758), as every P-256 CA key
/// signs.
pub(crate) fn ecdsa_with_sha256() -> AlgorithmIdentifierOwned {
    AlgorithmIdentifierOwned {
        oid: OID_ECDSA_SHA256,
        parameters: None,
    }
}

/// An RSA public key as a certificate carries it (rsaEncryption, NULL
/// parameters), encoded by the `rsa` crate for file and token keys alike.
pub(crate) fn rsa_spki(key: &RsaPublicKey) -> Result<SubjectPublicKeyInfoOwned, PkiError> {
    let der = key.to_public_key_der().map_err(enc_err("public key"))?;
    SubjectPublicKeyInfoOwned::from_der(der.as_bytes()).map_err(enc_err("public key"))
}

/// A P-256 public key (the uncompressed SEC1 point) as a certificate
/// carries it: id-ecPublicKey with the named curve prime256v1.
pub(crate) fn p256_spki(point: &[u8]) -> Result<SubjectPublicKeyInfoOwned, PkiError> {
    Ok(SubjectPublicKeyInfoOwned {
        algorithm: AlgorithmIdentifierOwned {
            oid: OID_EC_PUBLIC_KEY,
            parameters: Some(Any::from(OID_P256)),
        },
        subject_public_key: BitString::from_bytes(point).map_err(enc_err("public key"))?,
    })
}

/// What a CA needs of its private key.
pub trait CaKey: Send + Sync {
    /// The signature algorithm of what it signs (the certificate's
    /// `signatureAlgorithm`).
    fn algorithm(&self) -> AlgorithmIdentifierOwned;
    /// Its public key, as a certificate carries it.
    fn public_key(&self) -> Result<SubjectPublicKeyInfoOwned, PkiError>;
    /// A signature over `data` in [`CaKey::algorithm`]'s encoding.
    fn sign(&self, data: &[u8]) -> Result<Vec<u8>, PkiError>;
    /// The key as PEM, for the CA's own files; `None` for a key that never
    /// leaves where it is kept. Secret.
    fn pem(&self) -> Option<Zeroizing<String>>;
}

/// An RSA key read from a file or made here.
pub struct RsaCaKey(pub(super) RsaSigningKey);

impl CaKey for RsaCaKey {
    fn algorithm(&self) -> AlgorithmIdentifierOwned {
        sha256_with_rsa()
    }

    fn public_key(&self) -> Result<SubjectPublicKeyInfoOwned, PkiError> {
        rsa_spki(&self.0.key().to_public_key())
    }

    fn sign(&self, data: &[u8]) -> Result<Vec<u8>, PkiError> {
        self.0
            .sign_sha256(data)
            .map_err(|e| PkiError::KeyFailed(e.to_string()))
    }

    fn pem(&self) -> Option<Zeroizing<String>> {
        self.0.key().to_pkcs1_pem(LineEnding::LF).ok()
    }
}

/// An ECDSA P-256 key read from a PKCS#8 file or made here.
pub struct EcdsaP256CaKey {
    pair: EcdsaKeyPair,
    /// The PKCS#8 document it was read from, for [`CaKey::pem`].
    pkcs8: Zeroizing<Vec<u8>>,
}

impl EcdsaP256CaKey {
    /// A new key.
    pub fn generate() -> Result<Self, PkiError> {
        let rng = SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .map_err(enc_err("ECDSA P-256 key"))?;
        Self::from_pkcs8(doc.as_ref())
    }

    /// The key in a PKCS#8 `PRIVATE KEY` document.
    pub fn from_pkcs8(der: &[u8]) -> Result<Self, PkiError> {
        let rng = SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, der, &rng)
            .map_err(parse_err("CA private key (ECDSA P-256, PKCS#8)"))?;
        Ok(EcdsaP256CaKey {
            pair,
            pkcs8: Zeroizing::new(der.to_vec()),
        })
    }
}

impl CaKey for EcdsaP256CaKey {
    fn algorithm(&self) -> AlgorithmIdentifierOwned {
        ecdsa_with_sha256()
    }

    fn public_key(&self) -> Result<SubjectPublicKeyInfoOwned, PkiError> {
        p256_spki(self.pair.public_key().as_ref())
    }

    fn sign(&self, data: &[u8]) -> Result<Vec<u8>, PkiError> {
        let sig = self
            .pair
            .sign(&SystemRandom::new(), data)
            .map_err(|e| PkiError::KeyFailed(e.to_string()))?;
        Ok(sig.as_ref().to_vec())
    }

    fn pem(&self) -> Option<Zeroizing<String>> {
        let block = pem::Pem::new("PRIVATE KEY", self.pkcs8.to_vec());
        Some(Zeroizing::new(pem::encode(&block)))
    }
}

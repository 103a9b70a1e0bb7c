//! A CA from its files: the certificate file (the CA first, then the chain
//! above it when it is an intermediate) and the key file, RSA (PKCS#1 or
//! PKCS#8) or ECDSA P-256 (SEC1 as `openssl ecparam -genkey` writes it, or
//! PKCS#8). A key kept in a token comes in through
//! [`CertificateAuthority::load`] with its own [`CaKey`].

use super::key::{OID_EC_PUBLIC_KEY, OID_P256};
use super::{
    is_self_signed, parse_err, CaKey, CertificateAuthority, EcdsaP256CaKey, PkiError, RsaCaKey,
};
use crate::security::csr::OID_RSA_ENCRYPTION;
use crate::security::pem_crypt::{go_pem_encode, pem_error_text};
use crate::security::rsa_signer::RsaSigningKey;
use rsa::pkcs1::der::zeroize::Zeroizing;
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs8::DecodePrivateKey;
use rsa::pkcs8::PrivateKeyInfo;
use rsa::traits::PublicKeyParts;
use rsa::RsaPrivateKey;
use x509_cert::der::asn1::AnyRef;
use x509_cert::der::{Decode, Encode};
use x509_cert::spki::{AlgorithmIdentifierRef, SubjectPublicKeyInfoOwned};
use x509_cert::Certificate;

const KEY: &str = "CA private key";

impl CertificateAuthority {
    /// Loads a CA from its certificate file and its unencrypted key file.
    /// The certificate file's first certificate is the CA; any after it are
    /// its chain. The key is the first block with a key's label.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        let chain = parse_chain(cert_pem)?;
        let key = file_key(key_pem, &chain[0].tbs_certificate.subject_public_key_info)?;
        Self::with_chain(chain, key)
    }

    /// Loads a CA from its certificate file (the CA, then its chain) and a
    /// key held elsewhere, which must be the CA certificate's.
    pub fn load(cert_pem: &str, key: Box<dyn CaKey>) -> Result<Self, PkiError> {
        Self::with_chain(parse_chain(cert_pem)?, key)
    }

    fn with_chain(chain: Vec<Certificate>, key: Box<dyn CaKey>) -> Result<Self, PkiError> {
        let mut chain = chain.into_iter();
        let ca = chain.next().ok_or(PkiError::MissingPemBlock {
            what: "CA certificate",
            expected: "CERTIFICATE",
        })?;
        let mut loaded = Self::from_certificate(ca, key)?;
        for cert in chain {
            let der = cert.to_der().map_err(parse_err("CA chain"))?;
            let pem = go_pem_encode("CERTIFICATE", &[], &der);
            if !is_self_signed(&cert) {
                loaded.chain_pem.push_str(&pem);
            }
            loaded.trust_pem.push_str(&pem);
        }
        Ok(loaded)
    }
}

/// Every certificate in the CA's file, in order; at least one.
pub(super) fn parse_chain(text: &str) -> Result<Vec<Certificate>, PkiError> {
    const WHAT: &str = "CA certificate";
    let blocks = pem::parse_many(text).map_err(|e| PkiError::BadPem {
        what: WHAT,
        reason: pem_error_text(&e),
    })?;
    let chain = blocks
        .iter()
        .filter(|b| b.tag() == "CERTIFICATE")
        .map(|b| Certificate::from_der(b.contents()).map_err(parse_err(WHAT)))
        .collect::<Result<Vec<_>, _>>()?;
    if chain.is_empty() {
        return Err(PkiError::MissingPemBlock {
            what: WHAT,
            expected: "CERTIFICATE",
        });
    }
    Ok(chain)
}

/// The key in a key file, of the kind the CA certificate's key is.
pub(super) fn file_key(
    key_pem: &str,
    spki: &SubjectPublicKeyInfoOwned,
) -> Result<Box<dyn CaKey>, PkiError> {
    match spki.algorithm.oid {
        OID_RSA_ENCRYPTION => Ok(Box::new(RsaCaKey(RsaSigningKey::new(parse_private_key(
            key_pem,
        )?)))),
        OID_EC_PUBLIC_KEY => Ok(Box::new(ec_private_key(key_pem)?)),
        other => Err(PkiError::UnsupportedPublicKey(other.to_string())),
    }
}

/// The first key block of `text`, refusing encrypted ones.
fn key_block(text: &str, labels: &[&str], expected: &'static str) -> Result<pem::Pem, PkiError> {
    let block = pem::parse_many(text)
        .map_err(|e| PkiError::BadPem {
            what: KEY,
            reason: pem_error_text(&e),
        })?
        .into_iter()
        .find(|b| labels.contains(&b.tag()) || b.tag() == "ENCRYPTED PRIVATE KEY")
        .ok_or(PkiError::MissingPemBlock {
            what: KEY,
            expected,
        })?;
    if block.tag() == "ENCRYPTED PRIVATE KEY" || block.headers().get("Proc-Type").is_some() {
        return Err(PkiError::EncryptedKey);
    }
    Ok(block)
}

pub(super) fn parse_private_key(text: &str) -> Result<RsaPrivateKey, PkiError> {
    let block = key_block(
        text,
        &["RSA PRIVATE KEY", "PRIVATE KEY"],
        "RSA PRIVATE KEY or PRIVATE KEY",
    )?;
    // The rsa crate's errors describe the structure, never the key bytes.
    let key = if block.tag() == "RSA PRIVATE KEY" {
        RsaPrivateKey::from_pkcs1_der(block.contents()).map_err(parse_err(KEY))?
    } else {
        RsaPrivateKey::from_pkcs8_der(block.contents()).map_err(parse_err(KEY))?
    };
    if key.n().bits() < 1024 {
        return Err(PkiError::Parse {
            what: KEY,
            reason: format!("a {} bit RSA key is too small", key.n().bits()),
        });
    }
    Ok(key)
}

/// A P-256 key, PKCS#8 or SEC1. `ring` reads PKCS#8 only, so a SEC1 key
/// (which carries its public point, as OpenSSL writes it) is wrapped in
/// the PKCS#8 envelope first.
fn ec_private_key(text: &str) -> Result<EcdsaP256CaKey, PkiError> {
    let block = key_block(
        text,
        &["EC PRIVATE KEY", "PRIVATE KEY"],
        "EC PRIVATE KEY or PRIVATE KEY",
    )?;
    if block.tag() == "PRIVATE KEY" {
        return EcdsaP256CaKey::from_pkcs8(block.contents());
    }
    let info = PrivateKeyInfo {
        algorithm: AlgorithmIdentifierRef {
            oid: OID_EC_PUBLIC_KEY,
            parameters: Some(AnyRef::from(&OID_P256)),
        },
        private_key: block.contents(),
        public_key: None,
    };
    let pkcs8 = Zeroizing::new(info.to_der().map_err(parse_err(KEY))?);
    EcdsaP256CaKey::from_pkcs8(&pkcs8)
}

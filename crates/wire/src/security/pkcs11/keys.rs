//! The kinds of key a token holds for us: the CA's (RSA or ECDSA P-256,
//! signing certificates) and an ed25519 key (signing JWTs), and the DER
//! around what the token gives back: public keys from its attributes, and
//! ECDSA signatures as X.509 wants them.

use super::token::TokenKey;
use super::{Pkcs11Error, Pkcs11Uri};
use crate::security::ca::{
    ecdsa_with_sha256, p256_spki, rsa_spki, sha256_with_rsa, CaKey, PkiError, OID_P256,
};
use cryptoki::mechanism::eddsa::{EddsaParams, EddsaSignatureScheme};
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass};
use rsa::pkcs1::der::zeroize::Zeroizing;
use sha2::{Digest, Sha256};
use std::fmt;
use x509_cert::der::asn1::{ObjectIdentifier, OctetString, SequenceOf, UintRef};
use x509_cert::der::{Decode, Encode};
use x509_cert::spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};

/// The DER prefix of a PKCS#1 v1.5 DigestInfo for SHA-256 (RFC 8017 §9.2,
/// note 1): with the 32-byte hash after it, what CKM_RSA_PKCS signs to make
/// a SHA256WithRSA signature. Hashing here rather than asking for
/// CKM_SHA256_RSA_PKCS works with tokens that offer only the raw mechanism
/// and sends a network HSM 51 bytes instead of the whole certificate.
const DIGEST_INFO_SHA256: [u8; 19] = [
    0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05,
    0x00, 0x04, 0x20,
];

/// CKA_EC_PARAMS of an Ed25519 key, either form PKCS#11 3.0 allows: the
/// OID 1.3.101.112, or the curve name as a PrintableString (what SoftHSM
/// 2.6 stores).
const ED25519_PARAMS_OID: &[u8] = &[0x06, 0x03, 0x2b, 0x65, 0x70];
const ED25519_PARAMS_NAME: &[u8] = b"\x13\x0cedwards25519";

/// The public-key attributes a key kind is built from.
const PUBLIC_ATTRIBUTES: [AttributeType; 4] = [
    AttributeType::Modulus,
    AttributeType::PublicExponent,
    AttributeType::EcParams,
    AttributeType::EcPoint,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CaKind {
    Rsa,
    P256,
}

/// A CA key (RSA or ECDSA P-256) that stays in a PKCS#11 token.
///
/// Signing is a blocking call into the token: call it from
/// `spawn_blocking` in async code. `Debug` shows the URI, PIN redacted.
pub struct Pkcs11CaKey {
    token: TokenKey,
    kind: CaKind,
    /// Read once at open: the public half does not change while the
    /// private half is in use.
    spki: SubjectPublicKeyInfoOwned,
    uri: String,
}

impl Pkcs11CaKey {
    /// Finds the URI's private key in its token, logs in, and reads the
    /// public key (from the public key object with the same label/id, or
    /// from the private key's own attributes when the token keeps none).
    pub fn open(uri: &Pkcs11Uri) -> Result<Self, Pkcs11Error> {
        let token = TokenKey::open(uri)?;
        let (key_type, public) = read_public(&token)?;
        let (kind, spki) = if key_type == KeyType::RSA {
            let n = attribute(&public, "CKA_MODULUS", |a| match a {
                Attribute::Modulus(v) => Some(v),
                _ => None,
            })?;
            let e = attribute(&public, "CKA_PUBLIC_EXPONENT", |a| match a {
                Attribute::PublicExponent(v) => Some(v),
                _ => None,
            })?;
            (CaKind::Rsa, rsa_public(n, e)?)
        } else if key_type == KeyType::EC {
            check_p256(ec_params(&public)?)?;
            let point = ec_point(ec_point_attribute(&public)?, 65)?;
            let spki = p256_spki(&point).map_err(|e| malformed("CKA_EC_POINT", e))?;
            (CaKind::P256, spki)
        } else {
            return Err(Pkcs11Error::UnsupportedKey(format!(
                "a CA key must be RSA or EC P-256, this one is {key_type}"
            )));
        };
        Ok(Pkcs11CaKey {
            token,
            kind,
            spki,
            uri: uri.to_string(),
        })
    }

    /// A signature over `data` as [`CaKey::algorithm`] says: SHA256WithRSA,
    /// or ecdsa-with-SHA256 in DER.
    pub fn sign_bytes(&self, data: &[u8]) -> Result<Vec<u8>, Pkcs11Error> {
        let digest = Sha256::digest(data);
        match self.kind {
            CaKind::Rsa => {
                let mut info = DIGEST_INFO_SHA256.to_vec();
                info.extend_from_slice(&digest);
                self.token
                    .with_key("sign", |s, key| s.sign(&Mechanism::RsaPkcs, key, &info))
            }
            CaKind::P256 => {
                // SoftHSM 2.6 has no CKM_ECDSA_SHA256: hash here, sign the
                // digest with plain CKM_ECDSA.
                let raw = self
                    .token
                    .with_key("sign", |s, key| s.sign(&Mechanism::Ecdsa, key, &digest))?;
                ecdsa_der(&raw)
            }
        }
    }
}

impl fmt::Debug for Pkcs11CaKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pkcs11CaKey")
            .field("uri", &self.uri)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl CaKey for Pkcs11CaKey {
    fn algorithm(&self) -> AlgorithmIdentifierOwned {
        match self.kind {
            CaKind::Rsa => sha256_with_rsa(),
            CaKind::P256 => ecdsa_with_sha256(),
        }
    }

    fn public_key(&self) -> Result<SubjectPublicKeyInfoOwned, PkiError> {
        Ok(self.spki.clone())
    }

    fn sign(&self, data: &[u8]) -> Result<Vec<u8>, PkiError> {
        self.sign_bytes(data)
            .map_err(|e| PkiError::KeyFailed(e.to_string()))
    }

    /// `None`: the key never leaves its token.
    fn pem(&self) -> Option<Zeroizing<String>> {
        None
    }
}

/// An ed25519 key that stays in a PKCS#11 token (CKK_EC_EDWARDS), signing
/// with pure EdDSA (CKM_EDDSA): the same signatures `ed25519-dalek` makes
/// with the same key.
pub struct Pkcs11Ed25519Key {
    token: TokenKey,
    /// Checked at open to be a point on the curve.
    public: ed25519_dalek::VerifyingKey,
    uri: String,
}

impl Pkcs11Ed25519Key {
    /// Finds the URI's private key in its token, logs in, and reads the
    /// public key.
    pub fn open(uri: &Pkcs11Uri) -> Result<Self, Pkcs11Error> {
        let token = TokenKey::open(uri)?;
        let (key_type, public) = read_public(&token)?;
        if key_type != KeyType::EC_EDWARDS {
            return Err(Pkcs11Error::UnsupportedKey(format!(
                "an ed25519 key must be EC_EDWARDS, this one is {key_type}"
            )));
        }
        let params = ec_params(&public)?;
        if params != ED25519_PARAMS_OID && params != ED25519_PARAMS_NAME {
            return Err(Pkcs11Error::UnsupportedKey(
                "an EC_EDWARDS key on another curve than edwards25519".into(),
            ));
        }
        let point = ec_point(ec_point_attribute(&public)?, 32)?;
        let point: [u8; 32] = point.try_into().map_err(|_| Pkcs11Error::Attribute {
            attribute: "CKA_EC_POINT",
            reason: "not 32 bytes".into(),
        })?;
        let public = ed25519_dalek::VerifyingKey::from_bytes(&point).map_err(|_| {
            Pkcs11Error::Attribute {
                attribute: "CKA_EC_POINT",
                reason: "not a point on edwards25519".into(),
            }
        })?;
        Ok(Pkcs11Ed25519Key {
            token,
            public,
            uri: uri.to_string(),
        })
    }

    /// The 64-byte ed25519 signature over `data`.
    pub fn sign(&self, data: &[u8]) -> Result<[u8; 64], Pkcs11Error> {
        let mechanism = Mechanism::Eddsa(EddsaParams::new(EddsaSignatureScheme::Pure));
        let sig = self
            .token
            .with_key("sign", |s, key| s.sign(&mechanism, key, data))?;
        sig.try_into()
            .map_err(|sig: Vec<u8>| Pkcs11Error::Attribute {
                attribute: "EdDSA signature",
                reason: format!("{} bytes, not 64", sig.len()),
            })
    }

    /// The 32-byte public key.
    pub fn public_key(&self) -> [u8; 32] {
        self.public.to_bytes()
    }

    /// The public key, to verify what the token signed.
    pub fn verifying_key(&self) -> ed25519_dalek::VerifyingKey {
        self.public
    }
}

impl fmt::Debug for Pkcs11Ed25519Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pkcs11Ed25519Key")
            .field("uri", &self.uri)
            .field("public", &hex::encode(self.public.as_bytes()))
            .finish_non_exhaustive()
    }
}

/// The private key's type and the public key's attributes (the public key
/// object with the same label/id, or the private key when there is none).
fn read_public(token: &TokenKey) -> Result<(KeyType, Vec<Attribute>), Pkcs11Error> {
    let (key_type, public) = token.with_key("read the public key", |s, private| {
        let key_type = s.get_attributes(private, &[AttributeType::KeyType])?;
        let public = s.find_objects(&token.template(ObjectClass::PUBLIC_KEY))?;
        let source = match public.as_slice() {
            [one] => *one,
            // None, or several that the URI cannot tell apart: the private
            // key's own attributes are the ones that surely belong to it.
            _ => private,
        };
        Ok((key_type, s.get_attributes(source, &PUBLIC_ATTRIBUTES)?))
    })?;
    let key_type = key_type
        .into_iter()
        .find_map(|a| match a {
            Attribute::KeyType(t) => Some(t),
            _ => None,
        })
        .ok_or(Pkcs11Error::Attribute {
            attribute: "CKA_KEY_TYPE",
            reason: "missing".into(),
        })?;
    Ok((key_type, public))
}

fn attribute<'a>(
    attrs: &'a [Attribute],
    name: &'static str,
    pick: impl Fn(&'a Attribute) -> Option<&'a Vec<u8>>,
) -> Result<&'a [u8], Pkcs11Error> {
    attrs
        .iter()
        .find_map(pick)
        .map(Vec::as_slice)
        .ok_or(Pkcs11Error::Attribute {
            attribute: name,
            reason: "missing".into(),
        })
}

fn ec_params(attrs: &[Attribute]) -> Result<&[u8], Pkcs11Error> {
    attribute(attrs, "CKA_EC_PARAMS", |a| match a {
        Attribute::EcParams(v) => Some(v),
        _ => None,
    })
}

fn ec_point_attribute(attrs: &[Attribute]) -> Result<&[u8], Pkcs11Error> {
    attribute(attrs, "CKA_EC_POINT", |a| match a {
        Attribute::EcPoint(v) => Some(v),
        _ => None,
    })
}

fn malformed(attribute: &'static str, e: impl fmt::Display) -> Pkcs11Error {
    Pkcs11Error::Attribute {
        attribute,
        reason: e.to_string(),
    }
}

fn rsa_public(n: &[u8], e: &[u8]) -> Result<SubjectPublicKeyInfoOwned, Pkcs11Error> {
    let key = rsa::RsaPublicKey::new(
        rsa::BigUint::from_bytes_be(n),
        rsa::BigUint::from_bytes_be(e),
    )
    .map_err(|e| malformed("CKA_MODULUS", e))?;
    rsa_spki(&key).map_err(|e| malformed("CKA_MODULUS", e))
}

fn check_p256(params: &[u8]) -> Result<(), Pkcs11Error> {
    let curve = ObjectIdentifier::from_der(params).map_err(|_| {
        Pkcs11Error::UnsupportedKey("an EC key whose curve is not a named curve OID".into())
    })?;
    if curve != OID_P256 {
        return Err(Pkcs11Error::UnsupportedKey(format!(
            "an EC key on curve {curve}, not P-256 (1.2.840.10045.3.1.7)"
        )));
    }
    Ok(())
}

/// CKA_EC_POINT's point of `len` bytes. PKCS#11 says it is a DER OCTET
/// STRING around the point; some tokens store the point bare. The two
/// cannot be confused: the wrapping adds two bytes.
fn ec_point(raw: &[u8], len: usize) -> Result<Vec<u8>, Pkcs11Error> {
    if raw.len() == len {
        return Ok(raw.to_vec());
    }
    let point = OctetString::from_der(raw).map_err(|e| malformed("CKA_EC_POINT", e))?;
    if point.as_bytes().len() != len {
        return Err(Pkcs11Error::Attribute {
            attribute: "CKA_EC_POINT",
            reason: format!("{} bytes, not {len}", point.as_bytes().len()),
        });
    }
    Ok(point.into_bytes())
}

/// A PKCS#11 ECDSA signature (r and s, each padded to the curve size)
/// as X.509 carries it: DER `SEQUENCE { INTEGER r, INTEGER s }`, the
/// integers minimal and positive (`UintRef` strips and adds the zeros).
pub(super) fn ecdsa_der(raw: &[u8]) -> Result<Vec<u8>, Pkcs11Error> {
    let bad = |e: x509_cert::der::Error| malformed("ECDSA signature", e);
    if raw.is_empty() || !raw.len().is_multiple_of(2) {
        return Err(Pkcs11Error::Attribute {
            attribute: "ECDSA signature",
            reason: format!("{} bytes is not r||s", raw.len()),
        });
    }
    let (r, s) = raw.split_at(raw.len() / 2);
    let mut seq: SequenceOf<UintRef<'_>, 2> = SequenceOf::new();
    seq.add(UintRef::new(r).map_err(bad)?).map_err(bad)?;
    seq.add(UintRef::new(s).map_err(bad)?).map_err(bad)?;
    seq.to_der().map_err(bad)
}

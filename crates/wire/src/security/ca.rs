//! A certificate authority that signs node CSRs: the built-in CA of
//! `features.pki` (`ca:` in `provisioner.yaml`), and the one the simulator,
//! the reference helper (`choria-provisioner fleet-helper`), the tests and
//! the benchmarks sign with.
//!
//! It issues what a Choria deployment expects from its CA: node
//! certificates whose subject and key are the CSR's, whose SANs carry the
//! node's name, usable for both TLS server and client authentication, with a
//! random serial and a lifetime capped at the CA's own. The CA's key is RSA
//! or ECDSA P-256, a file's or one kept in a token ([`CaKey`]). There is no
//! revocation list and no persistence beyond [`CertificateAuthority::cert_pem`]
//! and [`CertificateAuthority::key_pem`].

use crate::security::rsa_signer::RsaSigningKey;
mod key;
mod load;
mod verify;
pub(crate) use key::{ecdsa_with_sha256, p256_spki, rsa_spki, sha256_with_rsa, OID_P256};
pub use key::{CaKey, EcdsaP256CaKey, RsaCaKey};
use rsa::pkcs8::DecodePublicKey;
use rsa::{RsaPrivateKey, RsaPublicKey};
use std::fmt;
use std::time::{Duration, SystemTime};
pub use verify::{certificate_common_name, verify_issued_by};
use x509_cert::attr::AttributeTypeAndValue;
use x509_cert::der::asn1::{
    Any, BitString, GeneralizedTime, Ia5String, ObjectIdentifier, OctetString, SetOfVec, UtcTime,
};
use x509_cert::der::referenced::OwnedToRef;
use x509_cert::der::{Decode, Encode, Tag};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, KeyUsages,
    SubjectAltName, SubjectKeyIdentifier,
};
use x509_cert::ext::{AsExtension, Extension};
use x509_cert::name::{Name, RdnSequence, RelativeDistinguishedName};
use x509_cert::request::CertReq;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::SubjectPublicKeyInfoOwned;
use x509_cert::time::{Time, Validity};
use x509_cert::{Certificate, TbsCertificate, Version};

use crate::security::csr::{self, CsrError};
use crate::security::pem_crypt::{go_pem_encode, pem_error_text};

const OID_CN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
const OID_SHA384_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.12");
const OID_SHA512_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.13");
const OID_KP_SERVER_AUTH: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.1");
const OID_KP_CLIENT_AUTH: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.2");

/// Size of the CA's RSA key.
pub const CA_KEY_BITS: usize = 2048;
/// How long a generated CA certificate is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Certificates start this long before they are issued, so that nodes whose
/// clocks are a little behind accept them straight away.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// Errors from the CA and certificate checks. Never contains key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PkiError {
    /// Key generation, CSR parsing or CSR signature problems.
    #[error(transparent)]
    Csr(#[from] CsrError),
    /// The text is not a well-formed PEM block.
    #[error("{what}: {reason}")]
    BadPem {
        /// What was being read.
        what: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// No PEM block with an acceptable label was found.
    #[error("{what}: no {expected} PEM block found")]
    MissingPemBlock {
        /// What was being read.
        what: &'static str,
        /// The labels that would have been accepted.
        expected: &'static str,
    },
    /// The CA key is encrypted; we only read plain keys.
    #[error("CA private key: encrypted keys are not supported, decrypt it first")]
    EncryptedKey,
    /// DER that does not parse.
    #[error("could not parse {what}: {reason}")]
    Parse {
        /// What was being parsed.
        what: &'static str,
        /// Library error text (never key bytes).
        reason: String,
    },
    /// The CA key does not match the CA certificate.
    #[error("the CA private key does not belong to the CA certificate")]
    KeyMismatch,
    /// DER encoding or signing failed.
    #[error("could not encode {what}: {reason}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// Library error text.
        reason: String,
    },
    /// The CA's key could not sign (a token gone, a module failing): the
    /// CA's trouble, not the request's. The text is the key's error, which
    /// never carries key material or a token's PIN.
    #[error("the CA key could not sign: {0}")]
    KeyFailed(String),
    /// A certificate signature algorithm we cannot verify.
    #[error("certificate signature algorithm {0} is not supported (only SHA256/384/512 with RSA)")]
    UnsupportedSignatureAlgorithm(String),
    /// A CA key that is not RSA.
    #[error("CA public key algorithm {0} is not supported (only RSA and ECDSA P-256)")]
    UnsupportedPublicKey(String),
    /// The certificate names another issuer.
    #[error("certificate was issued by {issuer:?}, not by the CA {ca:?}")]
    IssuerMismatch {
        /// The certificate's issuer.
        issuer: String,
        /// The CA's subject.
        ca: String,
    },
    /// The certificate signature does not verify with the CA's key.
    #[error("certificate signature does not verify with the CA's public key")]
    InvalidSignature,
    /// The certificate subject has no CN.
    #[error("certificate subject has no common name")]
    MissingCommonName,
}

fn enc_err<E: fmt::Display>(what: &'static str) -> impl Fn(E) -> PkiError {
    move |e| PkiError::Encode {
        what,
        reason: e.to_string(),
    }
}

fn parse_err<E: fmt::Display>(what: &'static str) -> impl Fn(E) -> PkiError {
    move |e| PkiError::Parse {
        what,
        reason: e.to_string(),
    }
}

/// A CA (RSA or ECDSA P-256) that signs node CSRs.
///
/// `Debug` shows the CA's subject only; the private key is available solely
/// through [`CertificateAuthority::key_pem`].
pub struct CertificateAuthority {
    cert: Certificate,
    cert_pem: String,
    signer: Box<dyn CaKey>,
    /// The PEM of the key, made once so `key_pem` cannot fail (empty for a
    /// key that never leaves its token); wiped from memory on drop.
    key_pem: rsa::pkcs1::der::zeroize::Zeroizing<String>,
    /// Put into issued certificates as their authority key id, so chain
    /// builders (OpenSSL, Go) find this CA even when it was made elsewhere.
    key_id: Vec<u8>,
    /// What follows an issued certificate in a node's `certificate.pem`:
    /// the CA itself when it is an intermediate, and the intermediates
    /// above it (never a self-signed root).
    chain_pem: String,
    /// What a node trusts (its `ca.pem`): every certificate of the CA's
    /// file, the root included.
    trust_pem: String,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("subject", &self.cert.tbs_certificate.subject.to_string())
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// Makes a new CA: a 2048 bit RSA key and a self-signed certificate for
    /// `CN=<common_name>`, valid for 10 years.
    pub fn generate(common_name: &str) -> Result<Self, PkiError> {
        Self::from_key(common_name, csr::generate_rsa_key(CA_KEY_BITS)?)
    }

    /// Like [`CertificateAuthority::generate`] with an existing key, for
    /// callers that pre-generate keys (RSA generation is the slow part).
    pub fn from_key(common_name: &str, key: RsaPrivateKey) -> Result<Self, PkiError> {
        Self::self_signed(common_name, Box::new(RsaCaKey(RsaSigningKey::new(key))))
    }

    /// Makes a new CA with an ECDSA P-256 key, like
    /// [`CertificateAuthority::generate`].
    pub fn generate_p256(common_name: &str) -> Result<Self, PkiError> {
        Self::self_signed(common_name, Box::new(EcdsaP256CaKey::generate()?))
    }

    /// A self-signed CA certificate for `CN=<common_name>` over `key`,
    /// valid for [`CA_VALIDITY`].
    pub fn self_signed(common_name: &str, key: Box<dyn CaKey>) -> Result<Self, PkiError> {
        if common_name.is_empty() {
            return Err(CsrError::MissingCommonName.into());
        }
        let subject = common_name_subject(common_name)?;
        let spki = key.public_key()?;
        let key_id = key_identifier(&spki)?;
        let now = SystemTime::now();
        let mut tbs = TbsCertificate {
            version: Version::V3,
            serial_number: random_serial()?,
            signature: key.algorithm(),
            issuer: subject.clone(),
            validity: validity(now - BACKDATE, now + CA_VALIDITY)?,
            subject,
            subject_public_key_info: spki,
            issuer_unique_id: None,
            subject_unique_id: None,
            extensions: None,
        };
        let extensions = vec![
            ext(
                &BasicConstraints {
                    ca: true,
                    path_len_constraint: None,
                },
                &tbs,
            )?,
            ext(
                &KeyUsage(
                    KeyUsages::KeyCertSign | KeyUsages::CRLSign | KeyUsages::DigitalSignature,
                ),
                &tbs,
            )?,
            ext(
                &SubjectKeyIdentifier(OctetString::new(key_id.clone()).map_err(enc_err("key id"))?),
                &tbs,
            )?,
        ];
        tbs.extensions = Some(extensions);
        let cert = sign_tbs(key.as_ref(), tbs)?;
        Self::assemble(cert, key, key_id)
    }

    /// A CA from its certificate and a key that must be the certificate's
    /// (a file's, or one in a token).
    pub fn from_certificate(cert: Certificate, key: Box<dyn CaKey>) -> Result<Self, PkiError> {
        let spki = &cert.tbs_certificate.subject_public_key_info;
        // The key's bits and kind decide; how the algorithm's parameters
        // are spelled (an RSA key's NULL present or not) does not.
        let public = key.public_key()?;
        if public.subject_public_key != spki.subject_public_key
            || public.algorithm.oid != spki.algorithm.oid
        {
            return Err(PkiError::KeyMismatch);
        }
        // Prefer the CA's own subject key id: issuers differ in how they
        // derive it, and the authority key id must match it exactly.
        let key_id = match cert.tbs_certificate.get::<SubjectKeyIdentifier>() {
            Ok(Some((_, ski))) => ski.0.as_bytes().to_vec(),
            Ok(None) => key_identifier(spki)?,
            Err(e) => return Err(parse_err("CA subject key identifier")(e)),
        };
        Self::assemble(cert, key, key_id)
    }

    fn assemble(
        cert: Certificate,
        signer: Box<dyn CaKey>,
        key_id: Vec<u8>,
    ) -> Result<Self, PkiError> {
        let der = cert.to_der().map_err(enc_err("CA certificate"))?;
        let key_pem = signer.pem().unwrap_or_default();
        let cert_pem = go_pem_encode("CERTIFICATE", &[], &der);
        let chain_pem = if is_self_signed(&cert) {
            String::new()
        } else {
            cert_pem.clone()
        };
        Ok(Self {
            trust_pem: cert_pem.clone(),
            cert,
            cert_pem,
            signer,
            key_pem,
            key_id,
            chain_pem,
        })
    }

    /// The CA certificate as PEM.
    pub fn cert_pem(&self) -> String {
        self.cert_pem.clone()
    }

    /// The CA's private key as PKCS#1 `RSA PRIVATE KEY` PEM. Secret: the
    /// caller decides where it goes and must not log it.
    pub fn key_pem(&self) -> String {
        self.key_pem.as_str().to_owned()
    }

    /// What follows an issued certificate in a node's `certificate.pem`
    /// (the intermediates, the CA itself if it is one); empty for a root.
    pub fn chain_pem(&self) -> &str {
        &self.chain_pem
    }

    /// What a node is told to trust (`ca` of the configure request): the
    /// CA's certificate file, its root included.
    pub fn trust_pem(&self) -> &str {
        &self.trust_pem
    }

    /// The CA's subject common name.
    pub fn common_name(&self) -> Option<String> {
        last_common_name(&self.cert.tbs_certificate.subject)
    }

    /// Issues a certificate for a PEM CSR, valid from now (less a few minutes
    /// for clock skew) for `validity`, but never beyond the CA's own expiry.
    ///
    /// The CSR's signature is checked first (proof that the requester holds
    /// the key). The certificate carries the CSR's subject and public key, the
    /// CN and the CSR's DNS names as DNS SANs, and is usable for TLS server
    /// and client authentication. Other CSR extensions are not copied.
    pub fn sign_csr(&self, csr_pem: &str, validity_period: Duration) -> Result<String, PkiError> {
        let info = csr::parse_csr(csr_pem)?;
        info.verify_signature()?;
        if info.common_name.is_empty() {
            return Err(CsrError::MissingCommonName.into());
        }
        let req = CertReq::from_der(info.der()).map_err(parse_err("CSR"))?;

        let mut names: Vec<&str> = vec![&info.common_name];
        for name in &info.dns_names {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
        let sans = names
            .into_iter()
            .map(|n| Ia5String::new(n).map(GeneralName::DnsName))
            .collect::<Result<Vec<_>, _>>()
            .map_err(enc_err("subjectAltName (DNS names must be ASCII)"))?;

        let now = SystemTime::now();
        let ca_expiry = self
            .cert
            .tbs_certificate
            .validity
            .not_after
            .to_system_time();
        let not_after = now
            .checked_add(validity_period)
            .map_or(ca_expiry, |t| t.min(ca_expiry));
        let leaf_key_id = key_identifier(&req.info.public_key)?;
        let mut tbs = TbsCertificate {
            version: Version::V3,
            serial_number: random_serial()?,
            signature: self.signer.algorithm(),
            issuer: self.cert.tbs_certificate.subject.clone(),
            validity: validity(now - BACKDATE, not_after)?,
            subject: req.info.subject,
            subject_public_key_info: req.info.public_key,
            issuer_unique_id: None,
            subject_unique_id: None,
            extensions: None,
        };
        let extensions = vec![
            ext(
                &BasicConstraints {
                    ca: false,
                    path_len_constraint: None,
                },
                &tbs,
            )?,
            ext(
                &KeyUsage(KeyUsages::DigitalSignature | KeyUsages::KeyEncipherment),
                &tbs,
            )?,
            ext(
                &ExtendedKeyUsage(vec![OID_KP_SERVER_AUTH, OID_KP_CLIENT_AUTH]),
                &tbs,
            )?,
            ext(&SubjectAltName(sans), &tbs)?,
            ext(
                &SubjectKeyIdentifier(OctetString::new(leaf_key_id).map_err(enc_err("key id"))?),
                &tbs,
            )?,
            ext(
                &AuthorityKeyIdentifier {
                    key_identifier: Some(
                        OctetString::new(self.key_id.clone()).map_err(enc_err("key id"))?,
                    ),
                    ..Default::default()
                },
                &tbs,
            )?,
        ];
        tbs.extensions = Some(extensions);
        let cert = sign_tbs(self.signer.as_ref(), tbs)?;
        let der = cert.to_der().map_err(enc_err("certificate"))?;
        Ok(go_pem_encode("CERTIFICATE", &[], &der))
    }
}

fn last_common_name(name: &Name) -> Option<String> {
    name.0
        .iter()
        .flat_map(|rdn| rdn.0.iter())
        .filter(|atv| atv.oid == OID_CN)
        .filter_map(|atv| String::from_utf8(atv.value.value().to_vec()).ok())
        .next_back()
}

fn common_name_subject(common_name: &str) -> Result<Name, PkiError> {
    let atv = AttributeTypeAndValue {
        oid: OID_CN,
        value: Any::new(Tag::Utf8String, common_name.as_bytes()).map_err(enc_err("subject"))?,
    };
    let set = SetOfVec::try_from(vec![atv]).map_err(enc_err("subject"))?;
    Ok(RdnSequence(vec![RelativeDistinguishedName(set)]))
}

/// 16 random bytes, top bit clear so the INTEGER stays positive without
/// padding, and a set bit below it so it is never zero or shortened.
fn random_serial() -> Result<SerialNumber, PkiError> {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    SerialNumber::new(&bytes).map_err(enc_err("serial number"))
}

/// RFC 5280: UTCTime through 2049, GeneralizedTime after.
fn x509_time(t: SystemTime) -> Result<Time, PkiError> {
    UtcTime::from_system_time(t)
        .map(Time::UtcTime)
        .or_else(|_| GeneralizedTime::from_system_time(t).map(Time::GeneralTime))
        .map_err(enc_err("validity"))
}

fn validity(not_before: SystemTime, not_after: SystemTime) -> Result<Validity, PkiError> {
    Ok(Validity {
        not_before: x509_time(not_before)?,
        not_after: x509_time(not_after)?,
    })
}

fn ext<E: AsExtension>(e: &E, tbs: &TbsCertificate) -> Result<Extension, PkiError> {
    // Criticality follows RFC 5280 as x509-cert encodes it (basic
    // constraints and key usage critical, SAN critical only for an empty
    // subject).
    e.to_extension(&tbs.subject, &[])
        .map_err(enc_err("extension"))
}

/// RFC 5280 method 1: SHA-1 of the subjectPublicKey bits, as OpenSSL and Go
/// compute it.
fn key_identifier(spki: &SubjectPublicKeyInfoOwned) -> Result<Vec<u8>, PkiError> {
    let ski = SubjectKeyIdentifier::try_from(spki.owned_to_ref()).map_err(enc_err("key id"))?;
    Ok(ski.0.as_bytes().to_vec())
}

fn rsa_public_key(spki: &SubjectPublicKeyInfoOwned) -> Result<RsaPublicKey, PkiError> {
    let der = spki.to_der().map_err(parse_err("CA public key"))?;
    RsaPublicKey::from_public_key_der(&der).map_err(parse_err("CA public key"))
}

fn sign_tbs(signer: &dyn CaKey, tbs: TbsCertificate) -> Result<Certificate, PkiError> {
    let der = tbs.to_der().map_err(enc_err("TBS certificate"))?;
    let sig = signer.sign(&der)?;
    Ok(Certificate {
        signature_algorithm: tbs.signature.clone(),
        tbs_certificate: tbs,
        signature: BitString::from_bytes(&sig).map_err(enc_err("signature"))?,
    })
}

/// The first PEM block in `text` whose label is one of `labels`.
fn pem_block(
    text: &str,
    what: &'static str,
    labels: &[&'static str],
) -> Result<pem::Pem, PkiError> {
    let blocks = pem::parse_many(text).map_err(|e| PkiError::BadPem {
        what,
        reason: pem_error_text(&e),
    })?;
    blocks
        .into_iter()
        .find(|b| labels.contains(&b.tag()))
        .ok_or(PkiError::MissingPemBlock {
            what,
            expected: labels[0],
        })
}

/// A certificate that names itself as its issuer: a root, which a node
/// trusts rather than is sent.
fn is_self_signed(cert: &Certificate) -> bool {
    cert.tbs_certificate.issuer == cert.tbs_certificate.subject
}

fn parse_certificate(text: &str, what: &'static str) -> Result<Certificate, PkiError> {
    let block = pem_block(text, what, &["CERTIFICATE"])?;
    Certificate::from_der(block.contents()).map_err(parse_err(what))
}

#[cfg(test)]
mod tests;

//! Checking what a CA issued: that a certificate's signature verifies
//! with the CA's key (RSA or ECDSA P-256) over the exact bytes it signed,
//! and reading its common name.

use super::key::OID_SHA256_RSA;
use super::key::{OID_ECDSA_SHA256, OID_EC_PUBLIC_KEY, OID_P256};
use super::{
    last_common_name, parse_certificate, parse_err, pem_block, rsa_public_key, PkiError,
    OID_SHA384_RSA, OID_SHA512_RSA,
};
use crate::security::csr::OID_RSA_ENCRYPTION;
use rsa::pkcs1v15::{Signature as RsaSignature, VerifyingKey};
use rsa::signature::Verifier;
use sha2::{Sha256, Sha384, Sha512};
use x509_cert::der::asn1::{Any, AnyRef};
use x509_cert::der::{Decode, Encode, SliceReader};
use x509_cert::spki::SubjectPublicKeyInfoOwned;
use x509_cert::Certificate;

/// Checks that `cert_pem` was issued by the CA in `ca_cert_pem`: the
/// certificate's issuer is the CA's subject and its signature over the TBS
/// certificate verifies with the CA's RSA key. Validity dates, key usages
/// and the CA's own trust are not checked.
pub fn verify_issued_by(cert_pem: &str, ca_cert_pem: &str) -> Result<(), PkiError> {
    let der = pem_block(cert_pem, "certificate", &["CERTIFICATE"])?.into_contents();
    let cert = Certificate::from_der(&der).map_err(parse_err("certificate"))?;
    let ca = parse_certificate(ca_cert_pem, "CA certificate")?;

    let issuer = &cert.tbs_certificate.issuer;
    let ca_subject = &ca.tbs_certificate.subject;
    if issuer != ca_subject {
        return Err(PkiError::IssuerMismatch {
            issuer: issuer.to_string(),
            ca: ca_subject.to_string(),
        });
    }

    let spki = &ca.tbs_certificate.subject_public_key_info;
    let sig_bytes = cert
        .signature
        .as_bytes()
        .ok_or(PkiError::InvalidSignature)?;
    if spki.algorithm.oid == OID_EC_PUBLIC_KEY {
        return verify_ecdsa_p256(&cert, spki, sig_bytes, raw_tbs(&der)?);
    }
    if spki.algorithm.oid != OID_RSA_ENCRYPTION {
        return Err(PkiError::UnsupportedPublicKey(
            spki.algorithm.oid.to_string(),
        ));
    }
    let key = rsa_public_key(spki)?;
    let sig = RsaSignature::try_from(sig_bytes).map_err(|_| PkiError::InvalidSignature)?;
    let tbs = raw_tbs(&der)?;
    let verified = match cert.signature_algorithm.oid {
        o if o == OID_SHA256_RSA => VerifyingKey::<Sha256>::new(key).verify(tbs, &sig),
        o if o == OID_SHA384_RSA => VerifyingKey::<Sha384>::new(key).verify(tbs, &sig),
        o if o == OID_SHA512_RSA => VerifyingKey::<Sha512>::new(key).verify(tbs, &sig),
        o => return Err(PkiError::UnsupportedSignatureAlgorithm(o.to_string())),
    };
    verified.map_err(|_| PkiError::InvalidSignature)
}

/// An ECDSA P-256 CA's signature (ecdsa-with-SHA256) over `tbs`.
fn verify_ecdsa_p256(
    cert: &Certificate,
    spki: &SubjectPublicKeyInfoOwned,
    sig: &[u8],
    tbs: &[u8],
) -> Result<(), PkiError> {
    if spki.algorithm.parameters != Some(Any::from(OID_P256)) {
        return Err(PkiError::UnsupportedPublicKey(
            "an EC curve other than P-256".into(),
        ));
    }
    if cert.signature_algorithm.oid != OID_ECDSA_SHA256 {
        return Err(PkiError::UnsupportedSignatureAlgorithm(
            cert.signature_algorithm.oid.to_string(),
        ));
    }
    let point = spki
        .subject_public_key
        .as_bytes()
        .ok_or(PkiError::InvalidSignature)?;
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_ASN1, point)
        .verify(tbs, sig)
        .map_err(|_| PkiError::InvalidSignature)
}

/// The (last, like Go) subject CN of a PEM certificate.
pub fn certificate_common_name(cert_pem: &str) -> Result<String, PkiError> {
    let cert = parse_certificate(cert_pem, "certificate")?;
    last_common_name(&cert.tbs_certificate.subject).ok_or(PkiError::MissingCommonName)
}

/// The signed bytes exactly as they appear in the certificate; re-encoding
/// the parsed structure could differ from what the issuer signed.
fn raw_tbs(cert_der: &[u8]) -> Result<&[u8], PkiError> {
    let body = AnyRef::from_der(cert_der)
        .map_err(parse_err("certificate"))?
        .value();
    let mut reader = SliceReader::new(body).map_err(parse_err("certificate"))?;
    let tbs = AnyRef::decode(&mut reader).map_err(parse_err("certificate"))?;
    let len = tbs
        .encoded_len()
        .and_then(usize::try_from)
        .map_err(parse_err("certificate"))?;
    Ok(&body[..len])
}

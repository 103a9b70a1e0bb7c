//! PKCS#7 SignedData, as clouds sign instance documents (RFC 2315, read
//! with the CMS types of RFC 5652, which it is a subset of):
//!
//! * AWS's `rsa2048` form: the identity document inside, signed with the
//!   region's RSA-2048 certificate, which is not inside (it is one of
//!   `evidence.aws_certificates`); written with indefinite lengths;
//! * Azure's attested document: the JSON inside, signed with a certificate
//!   for `metadata.azure.com` that is inside, issued by one of Microsoft's
//!   intermediates (`evidence.azure_certificates`).
//!
//! [`verify`] takes the anchors' keys and returns the content only when a
//! signature over it verifies: with an anchor's key, or with a certificate
//! inside that an anchor's key signed and that is valid at `now`. Only RSA
//! with SHA-256, SHA-384 or SHA-512 is taken; the content must be inside
//! (a detached signature proves nothing about a document we were not given
//! with it).

use der::asn1::{ObjectIdentifier, OctetString};
use der::{Decode, Encode};
use rsa::{Pkcs1v15Sign, RsaPublicKey};
use sha2::Digest;
use x509_cert::Certificate;

use const_oid::db::rfc5911::{
    ID_CONTENT_TYPE as CONTENT_TYPE, ID_DATA as DATA, ID_MESSAGE_DIGEST as MESSAGE_DIGEST,
    ID_SIGNED_DATA as SIGNED_DATA,
};
use const_oid::db::rfc5912::{
    ID_CE_SUBJECT_ALT_NAME as SUBJECT_ALT_NAME, ID_SHA_256, ID_SHA_384, ID_SHA_512,
    RSA_ENCRYPTION as RSA, SHA_256_WITH_RSA_ENCRYPTION, SHA_384_WITH_RSA_ENCRYPTION,
    SHA_512_WITH_RSA_ENCRYPTION,
};

/// The largest document taken (a cloud's is a few KiB).
pub(super) const MAX_SIZE: usize = 64 * 1024;

/// The most signers looked at (a cloud's document has one): each costs an
/// RSA verification per anchor.
const MAX_SIGNERS: usize = 4;

/// Why a document was not taken.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Pkcs7Error {
    /// Readable, but no signature over it verifies with what we trust.
    Signature(String),
    /// Not a SignedData we take.
    Malformed(String),
}

impl std::fmt::Display for Pkcs7Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pkcs7Error::Signature(m) | Pkcs7Error::Malformed(m) => f.write_str(m),
        }
    }
}

fn malformed(m: impl Into<String>) -> Pkcs7Error {
    Pkcs7Error::Malformed(m.into())
}

/// A digest the signatures may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hash {
    Sha256,
    Sha384,
    Sha512,
}

impl Hash {
    /// From a digest algorithm's OID, or an RSA signature algorithm's.
    fn of(oid: &ObjectIdentifier) -> Option<Hash> {
        const BY_OID: [(ObjectIdentifier, Hash); 6] = [
            (ID_SHA_256, Hash::Sha256),
            (SHA_256_WITH_RSA_ENCRYPTION, Hash::Sha256),
            (ID_SHA_384, Hash::Sha384),
            (SHA_384_WITH_RSA_ENCRYPTION, Hash::Sha384),
            (ID_SHA_512, Hash::Sha512),
            (SHA_512_WITH_RSA_ENCRYPTION, Hash::Sha512),
        ];
        BY_OID.iter().find(|(o, _)| o == oid).map(|(_, h)| *h)
    }

    fn digest(self, data: &[u8]) -> Vec<u8> {
        match self {
            Hash::Sha256 => sha2::Sha256::digest(data).to_vec(),
            Hash::Sha384 => sha2::Sha384::digest(data).to_vec(),
            Hash::Sha512 => sha2::Sha512::digest(data).to_vec(),
        }
    }

    /// Whether one of `keys` signed `digest` (made with `self`).
    fn signed_by(self, keys: &[RsaPublicKey], digest: &[u8], signature: &[u8]) -> bool {
        let scheme = || match self {
            Hash::Sha256 => Pkcs1v15Sign::new::<sha2::Sha256>(),
            Hash::Sha384 => Pkcs1v15Sign::new::<sha2::Sha384>(),
            Hash::Sha512 => Pkcs1v15Sign::new::<sha2::Sha512>(),
        };
        keys.iter()
            .any(|k| k.verify(scheme(), digest, signature).is_ok())
    }
}

/// What a verified SignedData holds.
#[derive(Debug)]
pub(super) struct Signed {
    pub content: Vec<u8>,
    /// The DNS names (subject alternative names, else the common name) of
    /// the certificate inside that signed it; empty when an anchor's key
    /// signed it directly.
    pub signer_names: Vec<String>,
}

/// Verifies `input` (BER or DER) with `anchors` at `now` (Unix seconds).
pub(super) fn verify(
    input: &[u8],
    anchors: &[RsaPublicKey],
    now: i64,
) -> Result<Signed, Pkcs7Error> {
    if input.len() > MAX_SIZE {
        return Err(malformed(format!(
            "{} bytes, more than {MAX_SIZE}",
            input.len()
        )));
    }
    // Bounded before the DER decoder sees it (ber.rs: sizes, depth, and
    // the number of parts of each element).
    let der = super::ber::to_der(input).map_err(Pkcs7Error::Malformed)?;
    let info = cms::content_info::ContentInfo::from_der(&der)
        .map_err(|e| malformed(format!("not PKCS#7: {e}")))?;
    if info.content_type != SIGNED_DATA {
        return Err(malformed(format!(
            "not SignedData but {}",
            info.content_type
        )));
    }
    let sd: cms::signed_data::SignedData = info
        .content
        .decode_as()
        .map_err(|e| malformed(format!("SignedData: {e}")))?;
    if sd.encap_content_info.econtent_type != DATA {
        return Err(malformed("the signed content is not data"));
    }
    let content = sd
        .encap_content_info
        .econtent
        .as_ref()
        .ok_or_else(|| malformed("the document is not inside (a detached signature)"))?
        .decode_as::<OctetString>()
        .map_err(|e| malformed(format!("the content: {e}")))?
        .as_bytes()
        .to_vec();
    let inside: Vec<&Certificate> = sd
        .certificates
        .iter()
        .flat_map(|set| set.0.iter())
        .filter_map(|c| match c {
            cms::cert::CertificateChoices::Certificate(c) => Some(c),
            _ => None,
        })
        .collect();
    if sd.signer_infos.0.len() > MAX_SIGNERS {
        return Err(malformed(format!("more than {MAX_SIGNERS} signers")));
    }
    let mut last = malformed("no signer");
    for signer in sd.signer_infos.0.iter() {
        match signer_verifies(signer, &content, &inside, anchors, now) {
            Ok(signer_names) => {
                return Ok(Signed {
                    content,
                    signer_names,
                })
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Whether `signer`'s signature over `content` verifies, and the names of
/// the certificate inside that made it (empty for an anchor's own key).
fn signer_verifies(
    signer: &cms::signed_data::SignerInfo,
    content: &[u8],
    inside: &[&Certificate],
    anchors: &[RsaPublicKey],
    now: i64,
) -> Result<Vec<String>, Pkcs7Error> {
    let hash = Hash::of(&signer.digest_alg.oid).ok_or_else(|| {
        malformed(format!(
            "digest {} is not SHA-256/384/512",
            signer.digest_alg.oid
        ))
    })?;
    let alg = &signer.signature_algorithm.oid;
    if *alg != RSA && Hash::of(alg) != Some(hash) {
        return Err(malformed(format!(
            "signature algorithm {alg} is not RSA with {hash:?}"
        )));
    }
    let signed = match &signer.signed_attrs {
        Some(attrs) => {
            let attr = |oid: ObjectIdentifier| {
                attrs
                    .iter()
                    .find(|a| a.oid == oid)
                    .and_then(|a| a.values.iter().next())
            };
            let digest = attr(MESSAGE_DIGEST)
                .ok_or_else(|| malformed("the signed attributes have no message digest"))?
                .decode_as::<OctetString>()
                .map_err(|e| malformed(format!("the message digest: {e}")))?;
            if digest.as_bytes() != hash.digest(content).as_slice() {
                return Err(Pkcs7Error::Signature(
                    "the content does not match its signed digest".into(),
                ));
            }
            let kind = attr(CONTENT_TYPE)
                .and_then(|v| v.decode_as::<ObjectIdentifier>().ok())
                .ok_or_else(|| malformed("the signed attributes have no content type"))?;
            if kind != DATA {
                return Err(malformed("the signed content type is not data"));
            }
            attrs
                .to_der()
                .map_err(|e| malformed(format!("signed attributes: {e}")))?
        }
        None => content.to_vec(),
    };
    let (digest, signature) = (hash.digest(&signed), signer.signature.as_bytes());
    // The certificate inside that the signer names, if any: it must be
    // valid now and issued by an anchor.
    if let Some(cert) = inside.iter().find(|c| names(&signer.sid, c)) {
        let key = cert_key(cert)?;
        if !hash.signed_by(&[key], &digest, signature) {
            return Err(Pkcs7Error::Signature(
                "the signature does not verify with its certificate".into(),
            ));
        }
        issued_by_anchor(cert, anchors, now)?;
        return Ok(dns_names(cert));
    }
    if hash.signed_by(anchors, &digest, signature) {
        return Ok(Vec::new());
    }
    Err(Pkcs7Error::Signature(
        "not signed by the configured certificates".into(),
    ))
}

/// Whether `sid` names `cert`.
fn names(sid: &cms::signed_data::SignerIdentifier, cert: &Certificate) -> bool {
    match sid {
        cms::signed_data::SignerIdentifier::IssuerAndSerialNumber(i) => {
            i.issuer == cert.tbs_certificate.issuer
                && i.serial_number == cert.tbs_certificate.serial_number
        }
        cms::signed_data::SignerIdentifier::SubjectKeyIdentifier(_) => false,
    }
}

fn cert_key(cert: &Certificate) -> Result<RsaPublicKey, Pkcs7Error> {
    let spki = cert
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| malformed(format!("the signer's key: {e}")))?;
    rsa::pkcs8::DecodePublicKey::from_public_key_der(&spki)
        .map_err(|e| malformed(format!("the signer's key is not RSA: {e}")))
}

/// `cert` is valid at `now` and signed by one of `anchors`.
fn issued_by_anchor(
    cert: &Certificate,
    anchors: &[RsaPublicKey],
    now: i64,
) -> Result<(), Pkcs7Error> {
    let validity = &cert.tbs_certificate.validity;
    let (from, until) = (
        validity.not_before.to_unix_duration().as_secs(),
        validity.not_after.to_unix_duration().as_secs(),
    );
    let now = u64::try_from(now).unwrap_or(0);
    if now < from || now > until {
        // Said plainly: a provider rotating its signing certificates looks
        // like this, and "does not verify" would send the operator looking
        // for a forgery.
        let date = |t: u64| {
            chrono::DateTime::from_timestamp(i64::try_from(t).unwrap_or(i64::MAX), 0)
                .map_or_else(|| t.to_string(), |d| d.to_rfc3339())
        };
        return Err(Pkcs7Error::Signature(format!(
            "the signing certificate inside is valid from {} until {}, not now",
            date(from),
            date(until)
        )));
    }
    let hash = Hash::of(&cert.signature_algorithm.oid).ok_or_else(|| {
        malformed(format!(
            "the signing certificate's signature algorithm {} is not RSA with SHA-256/384/512",
            cert.signature_algorithm.oid
        ))
    })?;
    let tbs = cert
        .tbs_certificate
        .to_der()
        .map_err(|e| malformed(format!("the signing certificate: {e}")))?;
    if hash.signed_by(anchors, &hash.digest(&tbs), cert.signature.raw_bytes()) {
        Ok(())
    } else {
        Err(Pkcs7Error::Signature(
            "the signing certificate is not issued by one of the configured certificates".into(),
        ))
    }
}

/// The certificate's DNS names, else its subject's common names.
fn dns_names(cert: &Certificate) -> Vec<String> {
    let sans: Vec<String> = cert
        .tbs_certificate
        .extensions
        .iter()
        .flatten()
        .filter(|e| e.extn_id == SUBJECT_ALT_NAME)
        .filter_map(|e| {
            x509_cert::ext::pkix::SubjectAltName::from_der(e.extn_value.as_bytes()).ok()
        })
        .flat_map(|san| san.0)
        .filter_map(|n| match n {
            x509_cert::ext::pkix::name::GeneralName::DnsName(d) => Some(d.to_string()),
            _ => None,
        })
        .collect();
    if !sans.is_empty() {
        return sans;
    }
    cert.tbs_certificate
        .subject
        .0
        .iter()
        .flat_map(|rdn| rdn.0.iter())
        .filter(|atv| atv.oid.to_string() == "2.5.4.3")
        .filter_map(|atv| {
            der::asn1::Utf8StringRef::try_from(&atv.value)
                .map(|s| s.to_string())
                .ok()
                .or_else(|| {
                    der::asn1::PrintableStringRef::try_from(&atv.value)
                        .map(|s| s.to_string())
                        .ok()
                })
        })
        .collect()
}

#[cfg(test)]
mod tests;

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

const SIGNED_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.2");
const DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.1");
const MESSAGE_DIGEST: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.4");
const CONTENT_TYPE: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.3");
const RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
const SUBJECT_ALT_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");

/// The largest document taken (a cloud's is a few KiB).
pub(super) const MAX_SIZE: usize = 64 * 1024;

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
        match oid.to_string().as_str() {
            "2.16.840.1.101.3.4.2.1" | "1.2.840.113549.1.1.11" => Some(Hash::Sha256),
            "2.16.840.1.101.3.4.2.2" | "1.2.840.113549.1.1.12" => Some(Hash::Sha384),
            "2.16.840.1.101.3.4.2.3" | "1.2.840.113549.1.1.13" => Some(Hash::Sha512),
            _ => None,
        }
    }

    fn digest(self, data: &[u8]) -> Vec<u8> {
        match self {
            Hash::Sha256 => sha2::Sha256::digest(data).to_vec(),
            Hash::Sha384 => sha2::Sha384::digest(data).to_vec(),
            Hash::Sha512 => sha2::Sha512::digest(data).to_vec(),
        }
    }

    fn verify(self, key: &RsaPublicKey, data: &[u8], signature: &[u8]) -> bool {
        let scheme = match self {
            Hash::Sha256 => Pkcs1v15Sign::new::<sha2::Sha256>(),
            Hash::Sha384 => Pkcs1v15Sign::new::<sha2::Sha384>(),
            Hash::Sha512 => Pkcs1v15Sign::new::<sha2::Sha512>(),
        };
        key.verify(scheme, &self.digest(data), signature).is_ok()
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
pub(super) fn verify(input: &[u8], anchors: &[RsaPublicKey], now: i64) -> Result<Signed, String> {
    if input.len() > MAX_SIZE {
        return Err(format!("{} bytes, more than {MAX_SIZE}", input.len()));
    }
    let der = super::ber::to_der(input)?;
    let info =
        cms::content_info::ContentInfo::from_der(&der).map_err(|e| format!("not PKCS#7: {e}"))?;
    if info.content_type != SIGNED_DATA {
        return Err(format!("not SignedData but {}", info.content_type));
    }
    let sd: cms::signed_data::SignedData = info
        .content
        .decode_as()
        .map_err(|e| format!("SignedData: {e}"))?;
    if sd.encap_content_info.econtent_type != DATA {
        return Err("the signed content is not data".into());
    }
    let content = sd
        .encap_content_info
        .econtent
        .as_ref()
        .ok_or("the document is not inside (a detached signature)")?
        .decode_as::<OctetString>()
        .map_err(|e| format!("the content: {e}"))?
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
    let mut last = String::from("no signer");
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
) -> Result<Vec<String>, String> {
    let hash = Hash::of(&signer.digest_alg.oid)
        .ok_or_else(|| format!("digest {} is not SHA-256/384/512", signer.digest_alg.oid))?;
    let alg = &signer.signature_algorithm.oid;
    if *alg != RSA && Hash::of(alg) != Some(hash) {
        return Err(format!(
            "signature algorithm {alg} is not RSA with {hash:?}"
        ));
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
                .ok_or("the signed attributes have no message digest")?
                .decode_as::<OctetString>()
                .map_err(|e| format!("the message digest: {e}"))?;
            if digest.as_bytes() != hash.digest(content).as_slice() {
                return Err("the content does not match its signed digest".into());
            }
            let kind = attr(CONTENT_TYPE)
                .and_then(|v| v.decode_as::<ObjectIdentifier>().ok())
                .ok_or("the signed attributes have no content type")?;
            if kind != DATA {
                return Err("the signed content type is not data".into());
            }
            attrs
                .to_der()
                .map_err(|e| format!("signed attributes: {e}"))?
        }
        None => content.to_vec(),
    };
    let signature = signer.signature.as_bytes();
    // The certificate inside that the signer names, if any: it must be
    // valid now and issued by an anchor.
    if let Some(cert) = inside.iter().find(|c| names(&signer.sid, c)) {
        let key = cert_key(cert)?;
        if !hash.verify(&key, &signed, signature) {
            return Err("the signature does not verify with its certificate".into());
        }
        issued_by_anchor(cert, anchors, now)?;
        return Ok(dns_names(cert));
    }
    if anchors.iter().any(|k| hash.verify(k, &signed, signature)) {
        return Ok(Vec::new());
    }
    Err("the signature does not verify with the configured certificates".into())
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

fn cert_key(cert: &Certificate) -> Result<RsaPublicKey, String> {
    let spki = cert
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| format!("the signer's key: {e}"))?;
    rsa::pkcs8::DecodePublicKey::from_public_key_der(&spki)
        .map_err(|e| format!("the signer's key is not RSA: {e}"))
}

/// `cert` is valid at `now` and signed by one of `anchors`.
fn issued_by_anchor(cert: &Certificate, anchors: &[RsaPublicKey], now: i64) -> Result<(), String> {
    let validity = &cert.tbs_certificate.validity;
    let (from, until) = (
        validity.not_before.to_unix_duration().as_secs(),
        validity.not_after.to_unix_duration().as_secs(),
    );
    let now = u64::try_from(now).unwrap_or(0);
    if now < from || now > until {
        return Err("the signing certificate is not valid now".into());
    }
    let hash = Hash::of(&cert.signature_algorithm.oid).ok_or_else(|| {
        format!(
            "the signing certificate's signature algorithm {} is not RSA with SHA-256/384/512",
            cert.signature_algorithm.oid
        )
    })?;
    let tbs = cert
        .tbs_certificate
        .to_der()
        .map_err(|e| format!("the signing certificate: {e}"))?;
    let signature = cert.signature.raw_bytes();
    if anchors.iter().any(|k| hash.verify(k, &tbs, signature)) {
        Ok(())
    } else {
        Err("the signing certificate is not issued by one of the configured certificates".into())
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

//! Reading a CSR: what the provisioner needs to know of it, taken from its
//! PEM or DER without trusting any of it yet.

use super::{CsrError, OID_CN, OID_EXTENSION_REQUEST, OID_RSA_ENCRYPTION, OID_SAN};
use crate::security::pem_crypt::pem_error_text;
use rsa::pkcs8::DecodePublicKey;
use rsa::traits::PublicKeyParts;
use rsa::RsaPublicKey;
use std::fmt;
use std::net::IpAddr;
use x509_cert::der::asn1::Any;
use x509_cert::der::{Decode, Encode, Tag, Tagged};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::ext::Extension;
use x509_cert::request::CertReq;

/// What the provisioner needs to know about a CSR.
#[derive(Clone, PartialEq, Eq)]
pub struct CsrInfo {
    /// Subject CN (the last one if several, like Go).
    pub common_name: String,
    /// How many CNs the subject holds.
    pub common_name_count: usize,
    /// subjectAltName kinds other than DNS, e-mail, URI and IP.
    pub other_san_kinds: Vec<&'static str>,
    /// SAN DNS names.
    pub dns_names: Vec<String>,
    /// SAN e-mail addresses.
    pub email_addresses: Vec<String>,
    /// SAN IP addresses.
    pub ip_addresses: Vec<IpAddr>,
    /// SAN URIs.
    pub uris: Vec<String>,
    /// The RSA public key, `None` when the CSR uses another algorithm.
    pub public_key: Option<RsaPublicKey>,
    /// OID of the public key algorithm.
    pub public_key_algorithm: String,
    /// OID of the signature algorithm.
    pub signature_algorithm: String,
    der: Vec<u8>,
}

impl fmt::Debug for CsrInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CsrInfo")
            .field("common_name", &self.common_name)
            .field("dns_names", &self.dns_names)
            .field("email_addresses", &self.email_addresses)
            .field("ip_addresses", &self.ip_addresses)
            .field("uris", &self.uris)
            .field(
                "public_key_bits",
                &self.public_key.as_ref().map(|k| k.n().bits()),
            )
            .field("public_key_algorithm", &self.public_key_algorithm)
            .field("signature_algorithm", &self.signature_algorithm)
            .finish()
    }
}

impl CsrInfo {
    /// The CSR's DER bytes.
    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// Files one subjectAltName entry under its kind.
    fn add_san(&mut self, name: GeneralName) -> Result<(), CsrError> {
        match name {
            GeneralName::DnsName(s) => self.dns_names.push(s.to_string()),
            GeneralName::Rfc822Name(s) => self.email_addresses.push(s.to_string()),
            GeneralName::UniformResourceIdentifier(s) => self.uris.push(s.to_string()),
            GeneralName::IpAddress(o) => {
                let b = o.as_bytes();
                let ip = match b.len() {
                    4 => <[u8; 4]>::try_from(b).map(IpAddr::from),
                    _ => <[u8; 16]>::try_from(b).map(IpAddr::from),
                }
                .map_err(|_| {
                    CsrError::Parse(format!(
                        "invalid IP address length {} in subjectAltName",
                        b.len()
                    ))
                })?;
                self.ip_addresses.push(ip);
            }
            GeneralName::OtherName(_) => self.other_san_kinds.push("otherName"),
            GeneralName::DirectoryName(_) => self.other_san_kinds.push("directoryName"),
            GeneralName::EdiPartyName(_) => self.other_san_kinds.push("ediPartyName"),
            GeneralName::RegisteredId(_) => self.other_san_kinds.push("registeredID"),
        }
        Ok(())
    }
}

/// Decodes a directory string value (PrintableString, UTF8String, IA5String,
/// T61String, NumericString, VisibleString or BMPString).
fn directory_string(value: &Any) -> Result<String, CsrError> {
    let bytes = value.value();
    match value.tag() {
        Tag::PrintableString
        | Tag::Utf8String
        | Tag::Ia5String
        | Tag::TeletexString
        | Tag::NumericString
        | Tag::VisibleString => String::from_utf8(bytes.to_vec())
            .map_err(|_| CsrError::Parse("subject string is not valid UTF-8".into())),
        Tag::BmpString => {
            if !bytes.len().is_multiple_of(2) {
                return Err(CsrError::Parse("BMPString has an odd length".into()));
            }
            let units: Vec<u16> = bytes
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units)
                .map_err(|_| CsrError::Parse("BMPString is not valid UTF-16".into()))
        }
        other => Err(CsrError::Parse(format!(
            "unsupported string type {other} in subject"
        ))),
    }
}

/// Parses the first PEM block of `pem_text` as a PKCS#10 CSR. Like Go's
/// `x509.ParseCertificateRequest` this does not check the signature (see
/// [`CsrInfo::verify_signature`]) nor the PEM label. Unlike the Go
/// provisioner, which dereferences a nil block and panics, text without a PEM
/// block is an error.
pub fn parse_csr(pem_text: &str) -> Result<CsrInfo, CsrError> {
    let block = pem::parse(pem_text).map_err(|e| CsrError::BadPem(pem_error_text(&e)))?;
    parse_csr_der(block.contents())
}

/// Parses a DER encoded PKCS#10 CSR.
pub fn parse_csr_der(der: &[u8]) -> Result<CsrInfo, CsrError> {
    let req = CertReq::from_der(der).map_err(|e| CsrError::Parse(e.to_string()))?;

    let mut common_name = String::new();
    let mut common_name_count = 0;
    for rdn in &req.info.subject.0 {
        for atv in rdn.0.iter() {
            if atv.oid == OID_CN {
                common_name = directory_string(&atv.value)?;
                common_name_count += 1;
            }
        }
    }

    let spki = &req.info.public_key;
    let public_key_algorithm = spki.algorithm.oid.to_string();
    let public_key = if spki.algorithm.oid == OID_RSA_ENCRYPTION {
        let spki_der = spki.to_der().map_err(|e| CsrError::Parse(e.to_string()))?;
        Some(
            RsaPublicKey::from_public_key_der(&spki_der)
                .map_err(|e| CsrError::Parse(format!("invalid RSA public key: {e}")))?,
        )
    } else {
        None
    };

    let mut info = CsrInfo {
        common_name,
        common_name_count,
        other_san_kinds: Vec::new(),
        dns_names: Vec::new(),
        email_addresses: Vec::new(),
        ip_addresses: Vec::new(),
        uris: Vec::new(),
        public_key,
        public_key_algorithm,
        signature_algorithm: req.algorithm.oid.to_string(),
        der: der.to_vec(),
    };

    let requests = req
        .info
        .attributes
        .iter()
        .filter(|attr| attr.oid == OID_EXTENSION_REQUEST);
    for value in requests.flat_map(|attr| attr.values.iter()) {
        let exts: Vec<Extension> = value
            .decode_as()
            .map_err(|e| CsrError::Parse(format!("invalid extension request: {e}")))?;
        for ext in exts.iter().filter(|e| e.extn_id == OID_SAN) {
            let san = SubjectAltName::from_der(ext.extn_value.as_bytes())
                .map_err(|e| CsrError::Parse(format!("invalid subjectAltName: {e}")))?;
            for name in san.0 {
                info.add_san(name)?;
            }
        }
    }
    Ok(info)
}

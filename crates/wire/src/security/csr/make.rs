//! Making a CSR as go-choria's `gencsr` does, down to Go's choice of
//! string types and the order of the subject's attributes.

use super::{enc_err, CsrError, OID_C, OID_CN, OID_L, OID_O, OID_OU, OID_SHA256_RSA, OID_ST};
use crate::security::pem_crypt::go_pem_encode;
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::EncodePublicKey;
use rsa::signature::{RandomizedSigner, SignatureEncoding};
use rsa::RsaPrivateKey;
use sha2::Sha256;
use x509_cert::attr::AttributeTypeAndValue;
use x509_cert::der::asn1::{Any, BitString, SetOfVec};
use x509_cert::der::{Decode, Encode, Tag};
use x509_cert::name::{Name, RdnSequence, RelativeDistinguishedName};
use x509_cert::request::{CertReq, CertReqInfo, Version};
use x509_cert::spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};

/// Subject fields of a CSR as accepted by the `gencsr` action.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CsrSubject {
    /// `cn` (required).
    pub common_name: String,
    /// `C`.
    pub country: Option<String>,
    /// `L`.
    pub locality: Option<String>,
    /// `O`.
    pub organization: Option<String>,
    /// `OU`.
    pub organizational_unit: Option<String>,
    /// `ST` (X.509 stateOrProvinceName). Note: go-choria's `gencsr` accepts
    /// but **ignores** `ST` (it never copies it into the subject); a faithful
    /// simulator passes `None`.
    pub state: Option<String>,
}

impl CsrSubject {
    /// A subject with only a common name, as the Go provisioner requests.
    pub fn new(common_name: impl Into<String>) -> Self {
        Self {
            common_name: common_name.into(),
            ..Self::default()
        }
    }
}

/// Go's `asn1` marshals a plain string as PrintableString when every byte is in
/// the PrintableString set (it rejects `*` and `&` when encoding), otherwise as
/// UTF8String.
fn go_directory_string(s: &str) -> Result<Any, CsrError> {
    let printable = s.bytes().all(|b| {
        b.is_ascii_alphanumeric()
            || (b'\''..=b')').contains(&b)
            || (b'+'..=b'/').contains(&b)
            || matches!(b, b' ' | b':' | b'=' | b'?')
    });
    let tag = if printable {
        Tag::PrintableString
    } else {
        Tag::Utf8String
    };
    Any::new(tag, s.as_bytes()).map_err(enc_err("subject attribute"))
}

/// Builds the subject in Go's `pkix.Name.ToRDNSequence` order:
/// C, ST, L, O, OU, CN, one attribute per RDN.
pub(super) fn go_subject(subject: &CsrSubject) -> Result<Name, CsrError> {
    let fields = [
        (OID_C, subject.country.as_deref()),
        (OID_ST, subject.state.as_deref()),
        (OID_L, subject.locality.as_deref()),
        (OID_O, subject.organization.as_deref()),
        (OID_OU, subject.organizational_unit.as_deref()),
        (OID_CN, Some(subject.common_name.as_str())),
    ];
    let mut rdns = Vec::new();
    for (oid, value) in fields {
        let Some(value) = value.filter(|v| !v.is_empty()) else {
            continue;
        };
        let atv = AttributeTypeAndValue {
            oid,
            value: go_directory_string(value)?,
        };
        let set = SetOfVec::try_from(vec![atv]).map_err(enc_err("subject RDN"))?;
        rdns.push(RelativeDistinguishedName(set));
    }
    Ok(RdnSequence(rdns))
}

/// Creates a PEM `CERTIFICATE REQUEST` signed with SHA256WithRSA, structured
/// like Go's `x509.CreateCertificateRequest` output for go-choria's template
/// (no attributes, no extensions).
pub fn make_csr(key: &RsaPrivateKey, subject: &CsrSubject) -> Result<String, CsrError> {
    if subject.common_name.is_empty() {
        return Err(CsrError::MissingCommonName);
    }
    let spki_der = key
        .to_public_key()
        .to_public_key_der()
        .map_err(enc_err("public key"))?;
    let public_key =
        SubjectPublicKeyInfoOwned::from_der(spki_der.as_bytes()).map_err(enc_err("public key"))?;
    let info = CertReqInfo {
        version: Version::V1,
        subject: go_subject(subject)?,
        public_key,
        attributes: SetOfVec::new(),
    };
    let tbs = info.to_der().map_err(enc_err("certificate request info"))?;
    let signer = SigningKey::<Sha256>::new(key.clone());
    let sig = signer.sign_with_rng(&mut rand::rngs::OsRng, &tbs).to_vec();
    let req = CertReq {
        info,
        algorithm: AlgorithmIdentifierOwned {
            oid: OID_SHA256_RSA,
            parameters: Some(Any::null()),
        },
        signature: BitString::from_bytes(&sig).map_err(enc_err("signature"))?,
    };
    let der = req.to_der().map_err(enc_err("certificate request"))?;
    Ok(go_pem_encode("CERTIFICATE REQUEST", &[], &der))
}

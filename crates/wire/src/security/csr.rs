//! RSA keys and PKCS#10 certificate requests for the `gencsr` step.
//!
//! A go-choria server answering `gencsr` makes a 2048 bit RSA key, writes it as
//! PKCS#1 `RSA PRIVATE KEY`, and returns a SHA256WithRSA CSR plus a
//! `PUBLIC KEY` PEM that (unusually) holds PKCS#1 DER
//! (`providers/agent/mcorpc/golang/provision/csr_action.go`). The provisioner
//! parses the CSR, requires its CN to equal the node identity and refuses
//! names matching `cert_deny_list` (`provisioner:host/host.go` `validateCSR`).
//!
//! RSA key generation is slow (hundreds of milliseconds for 2048 bits), so a
//! simulator starting thousands of nodes uses an [`RsaKeyPool`] of
//! pre-generated keys instead of one key per node.
//!
//! The parts: the errors and the object identifiers here; RSA keys in
//! `keys`; making a CSR in `make`; reading one in `parse`; checking a
//! node's CSR against its identity and the deny list in `check`.

use crate::identity::shown;
use std::fmt;
use std::net::IpAddr;
use x509_cert::der::asn1::ObjectIdentifier;

mod check;
mod keys;
mod make;
mod parse;

pub use check::{
    check_csr, compile_deny_list, compile_whole_name, default_deny_list, strip_regex_delimiters,
    validate_csr_names, DEFAULT_CERT_DENY_LIST,
};
pub use keys::{
    generate_rsa_key, private_key_pkcs1_pem, public_key_pem_go_style,
    rsa_public_key_from_pkcs1_der, RsaKeyPool, DEFAULT_RSA_BITS,
};
pub use make::{make_csr, CsrSubject};
pub use parse::{parse_csr, parse_csr_der, CsrInfo};

const OID_CN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
const OID_C: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.6");
const OID_L: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.7");
const OID_ST: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.8");
const OID_O: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.10");
const OID_OU: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.11");
pub const OID_RSA_ENCRYPTION: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
const OID_SHA256_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.11");
const OID_SHA384_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.12");
const OID_SHA512_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.13");
const OID_EXTENSION_REQUEST: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.14");
const OID_SAN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");

/// Errors from RSA key, CSR and name handling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    /// RSA key generation failed.
    #[error("could not generate a {bits} bit RSA key: {reason}")]
    KeyGeneration {
        /// Requested modulus size.
        bits: usize,
        /// Library error text.
        reason: String,
    },
    /// An empty key pool was requested.
    #[error("an RSA key pool needs at least one key")]
    EmptyPool,
    /// No common name was given for a CSR.
    #[error("a CSR needs a non-empty common name")]
    MissingCommonName,
    /// DER/PEM encoding failed.
    #[error("could not encode {what}: {reason}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// Library error text.
        reason: String,
    },
    /// The text is not a well-formed PEM block.
    #[error("could not parse CSR: {0}")]
    BadPem(&'static str),
    /// The DER did not parse as a PKCS#10 request.
    #[error("could not parse CSR: {0}")]
    Parse(String),
    /// The CSR's signature algorithm is not one we verify.
    #[error("CSR signature algorithm {0} is not supported (only SHA256/384/512 with RSA)")]
    UnsupportedSignatureAlgorithm(String),
    /// The CSR's key is not RSA.
    #[error("CSR public key algorithm {0} is not supported (only RSA)")]
    UnsupportedPublicKey(String),
    /// The CSR signature does not verify.
    #[error("CSR signature is invalid")]
    InvalidSignature,
    /// The CSR CN differs from the node identity (Go's message; the CN is
    /// the node's text, shown clipped and escaped).
    #[error("common name {} does not match identity {identity}", shown(.common_name))]
    CommonNameMismatch {
        /// CN found in the CSR.
        common_name: String,
        /// Identity of the node being provisioned.
        identity: String,
    },
    /// A CN or SAN matched the deny list (Go's message).
    #[error("{} matches denied certificate pattern", shown(.0))]
    DeniedName(String),
    /// The subject has no common name.
    #[error("the CSR's subject has no common name; it must be the node's identity")]
    NoCommonName,
    /// The subject names several common names (Go would take the last).
    #[error(
        "the CSR's subject has {0} common names; exactly one, the node's identity, is allowed"
    )]
    SeveralCommonNames(usize),
    /// A DNS subjectAltName other than the identity (and not allowed by
    /// `csr_allowed_dns_names`).
    #[error("the CSR asks for the DNS name {} besides the node's identity; only the identity (and names matching csr_allowed_dns_names) may be requested", shown(.0))]
    ForeignDnsName(String),
    /// An IP address subjectAltName.
    #[error("the CSR asks for the IP address {0}; IP subjectAltNames are not signed")]
    IpSan(IpAddr),
    /// A URI subjectAltName.
    #[error("the CSR asks for the URI {}; URI subjectAltNames are not signed", shown(.0))]
    UriSan(String),
    /// An e-mail subjectAltName.
    #[error("the CSR asks for the e-mail address {}; e-mail subjectAltNames are not signed", shown(.0))]
    EmailSan(String),
    /// Another kind of subjectAltName (otherName, directoryName, ...).
    #[error("the CSR asks for a {0} subjectAltName; only DNS names are signed")]
    OtherSan(&'static str),
    /// A deny-list entry is not a valid regular expression.
    #[error("invalid cert_deny_list pattern {pattern:?}: {reason}")]
    InvalidDenyPattern {
        /// Pattern as configured.
        pattern: String,
        /// Regex compile error.
        reason: String,
    },
}

impl CsrError {
    /// A short, fixed label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            CsrError::BadPem(_) | CsrError::Parse(_) => "unparsable",
            CsrError::UnsupportedSignatureAlgorithm(_) | CsrError::UnsupportedPublicKey(_) => {
                "unsupported_algorithm"
            }
            CsrError::InvalidSignature => "bad_signature",
            CsrError::NoCommonName | CsrError::SeveralCommonNames(_) => "common_name_count",
            CsrError::CommonNameMismatch { .. } => "common_name",
            CsrError::ForeignDnsName(_) => "foreign_dns_name",
            CsrError::IpSan(_)
            | CsrError::UriSan(_)
            | CsrError::EmailSan(_)
            | CsrError::OtherSan(_) => "non_dns_san",
            CsrError::DeniedName(_) => "denied_name",
            CsrError::KeyGeneration { .. }
            | CsrError::EmptyPool
            | CsrError::MissingCommonName
            | CsrError::Encode { .. }
            | CsrError::InvalidDenyPattern { .. } => "other",
        }
    }
}

fn enc_err<E: fmt::Display>(what: &'static str) -> impl Fn(E) -> CsrError {
    move |e| CsrError::Encode {
        what,
        reason: e.to_string(),
    }
}

#[cfg(test)]
pub(crate) mod tests;

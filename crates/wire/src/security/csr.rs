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

use crate::identity::shown;
use regex::Regex;
use rsa::pkcs1::{DecodeRsaPublicKey, EncodeRsaPrivateKey, EncodeRsaPublicKey};
use rsa::pkcs1v15::{Signature as RsaSignature, SigningKey, VerifyingKey};
use rsa::pkcs8::{DecodePublicKey, EncodePublicKey};
use rsa::signature::{RandomizedSigner, SignatureEncoding, Verifier};
use rsa::traits::PublicKeyParts;
use rsa::{RsaPrivateKey, RsaPublicKey};
use sha2::{Sha256, Sha384, Sha512};
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use x509_cert::attr::AttributeTypeAndValue;
use x509_cert::der::asn1::{Any, BitString, ObjectIdentifier, SetOfVec};
use x509_cert::der::{Decode, Encode, Tag, Tagged};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::ext::Extension;
use x509_cert::name::{Name, RdnSequence, RelativeDistinguishedName};
use x509_cert::request::{CertReq, CertReqInfo, Version};
use x509_cert::spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};

use super::pem_crypt::{go_pem_encode, pem_error_text};

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

/// Key size go-choria uses for `gencsr`.
pub const DEFAULT_RSA_BITS: usize = 2048;

/// The provisioner's default `cert_deny_list` (`provisioner:config/config.go`),
/// used by Go when the configured list is empty.
pub const DEFAULT_CERT_DENY_LIST: [&str; 4] = [
    r"\.privileged.mcollective$",
    r"\.privileged.choria$",
    r"\.mcollective$",
    r"\.choria$",
];

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

fn enc_err<E: fmt::Display>(what: &'static str) -> impl Fn(E) -> CsrError {
    move |e| CsrError::Encode {
        what,
        reason: e.to_string(),
    }
}

/// Generates an RSA private key of `bits` bits (public exponent 65537).
pub fn generate_rsa_key(bits: usize) -> Result<RsaPrivateKey, CsrError> {
    RsaPrivateKey::new(&mut rand::rngs::OsRng, bits).map_err(|e| CsrError::KeyGeneration {
        bits,
        reason: e.to_string(),
    })
}

/// A fixed set of pre-generated RSA keys handed out round-robin or by index.
///
/// Sharing keys between simulated nodes is fine for load and protocol tests
/// (each node still gets its own CSR and certificate) and turns minutes of key
/// generation into a one-off cost. `Debug` never prints key material.
pub struct RsaKeyPool {
    keys: Vec<Arc<RsaPrivateKey>>,
    next: AtomicUsize,
}

impl fmt::Debug for RsaKeyPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RsaKeyPool")
            .field("keys", &self.keys.len())
            .field("next", &self.next.load(Ordering::Relaxed))
            .finish()
    }
}

impl RsaKeyPool {
    /// Generates `count` keys of `bits` bits using one thread per available
    /// core.
    pub fn generate(count: usize, bits: usize) -> Result<Self, CsrError> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::generate_with_threads(count, bits, threads)
    }

    /// Generates `count` keys of `bits` bits on `threads` scoped threads.
    pub fn generate_with_threads(
        count: usize,
        bits: usize,
        threads: usize,
    ) -> Result<Self, CsrError> {
        if count == 0 {
            return Err(CsrError::EmptyPool);
        }
        let threads = threads.clamp(1, count);
        let results: Vec<Result<Vec<RsaPrivateKey>, CsrError>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    // spread the remainder over the first threads
                    let n = count / threads + usize::from(t < count % threads);
                    s.spawn(move || (0..n).map(|_| generate_rsa_key(bits)).collect())
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(CsrError::KeyGeneration {
                            bits,
                            reason: "key generation thread panicked".into(),
                        })
                    })
                })
                .collect()
        });
        let mut keys = Vec::with_capacity(count);
        for r in results {
            keys.extend(r?.into_iter().map(Arc::new));
        }
        Ok(Self {
            keys,
            next: AtomicUsize::new(0),
        })
    }

    /// Builds a pool from existing keys.
    pub fn from_keys(keys: Vec<RsaPrivateKey>) -> Result<Self, CsrError> {
        if keys.is_empty() {
            return Err(CsrError::EmptyPool);
        }
        Ok(Self {
            keys: keys.into_iter().map(Arc::new).collect(),
            next: AtomicUsize::new(0),
        })
    }

    /// Number of distinct keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Always false: a pool has at least one key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key for `index`, wrapping around (node N always gets the same key).
    pub fn get(&self, index: usize) -> Arc<RsaPrivateKey> {
        Arc::clone(&self.keys[index % self.keys.len()])
    }

    /// The next key in round-robin order (thread safe).
    pub fn next_key(&self) -> Arc<RsaPrivateKey> {
        self.get(self.next.fetch_add(1, Ordering::Relaxed))
    }
}

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
fn go_subject(subject: &CsrSubject) -> Result<Name, CsrError> {
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

/// PKCS#1 `RSA PRIVATE KEY` PEM, as written to `private.pem`.
pub fn private_key_pkcs1_pem(key: &RsaPrivateKey) -> Result<String, CsrError> {
    let der = key.to_pkcs1_der().map_err(enc_err("private key"))?;
    Ok(go_pem_encode("RSA PRIVATE KEY", &[], der.as_bytes()))
}

/// go-choria's `gencsr` `public_key`: a PEM block labelled `PUBLIC KEY` that
/// contains **PKCS#1** DER (`x509.MarshalPKCS1PublicKey`), not the SPKI that
/// the label normally implies. Kept byte-compatible on purpose.
pub fn public_key_pem_go_style(key: &RsaPublicKey) -> Result<String, CsrError> {
    let der = key.to_pkcs1_der().map_err(enc_err("public key"))?;
    Ok(go_pem_encode("PUBLIC KEY", &[], der.as_bytes()))
}

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

    /// Checks the CSR's self-signature (proof of possession). The Go
    /// provisioner does **not** do this in `validateCSR`; it is offered for
    /// stricter callers and tests.
    pub fn verify_signature(&self) -> Result<(), CsrError> {
        let req = CertReq::from_der(&self.der).map_err(|e| CsrError::Parse(e.to_string()))?;
        let key = self
            .public_key
            .clone()
            .ok_or_else(|| CsrError::UnsupportedPublicKey(self.public_key_algorithm.clone()))?;
        let tbs = req
            .info
            .to_der()
            .map_err(|e| CsrError::Parse(e.to_string()))?;
        let sig_bytes = req
            .signature
            .as_bytes()
            .ok_or_else(|| CsrError::Parse("signature BIT STRING has unused bits".into()))?;
        let sig = RsaSignature::try_from(sig_bytes).map_err(|_| CsrError::InvalidSignature)?;
        let ok = match req.algorithm.oid {
            o if o == OID_SHA256_RSA => VerifyingKey::<Sha256>::new(key).verify(&tbs, &sig),
            o if o == OID_SHA384_RSA => VerifyingKey::<Sha384>::new(key).verify(&tbs, &sig),
            o if o == OID_SHA512_RSA => VerifyingKey::<Sha512>::new(key).verify(&tbs, &sig),
            o => return Err(CsrError::UnsupportedSignatureAlgorithm(o.to_string())),
        };
        ok.map_err(|_| CsrError::InvalidSignature)
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

/// Removes `/re/` delimiters like Go's `matchAnyRegex`: only when the whole
/// entry matches `^/.+/$` (no newline inside), and then **all** leading and
/// trailing slashes are trimmed (Go uses `TrimLeft`/`TrimRight`).
pub fn strip_regex_delimiters(pattern: &str) -> &str {
    let delimited = pattern.len() >= 3
        && pattern.starts_with('/')
        && pattern.ends_with('/')
        && !pattern[1..pattern.len() - 1].contains('\n');
    if delimited {
        pattern.trim_start_matches('/').trim_end_matches('/')
    } else {
        pattern
    }
}

/// Compiles a `csr_allowed_dns_names` entry so that it matches whole names
/// only: `example\.net` admits `example.net`, not `example.net.evil.tld`
/// nor `evil-example.net`. (A deny list keeps Go's unanchored meaning:
/// there a match anywhere refuses, which errs on the safe side.)
pub fn compile_whole_name(pattern: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!("^(?:{})$", strip_regex_delimiters(pattern)))
}

/// Compiles a `cert_deny_list`. Go compiles each pattern at match time and
/// silently treats an invalid one as "no match"; we report it instead so a
/// typo in the config cannot quietly disable a deny rule. Go substitutes
/// [`DEFAULT_CERT_DENY_LIST`] when the configured list is empty; callers do the
/// same with [`default_deny_list`].
pub fn compile_deny_list<S: AsRef<str>>(patterns: &[S]) -> Result<Vec<Regex>, CsrError> {
    patterns
        .iter()
        .map(|p| {
            let p = p.as_ref();
            Regex::new(strip_regex_delimiters(p)).map_err(|e| CsrError::InvalidDenyPattern {
                pattern: p.to_string(),
                reason: e.to_string(),
            })
        })
        .collect()
}

/// The compiled default deny list.
pub fn default_deny_list() -> Vec<Regex> {
    DEFAULT_CERT_DENY_LIST
        .iter()
        .filter_map(|p| Regex::new(p).ok())
        .collect()
}

/// The provisioner's `validateCSR` name rules: the CN must equal `identity`
/// exactly, then neither the CN nor any SAN DNS name may match (unanchored
/// search, like Go's `regexp.MatchString`) any deny pattern.
pub fn validate_csr_names(
    info: &CsrInfo,
    identity: &str,
    deny_list: &[Regex],
) -> Result<(), CsrError> {
    if info.common_name != identity {
        return Err(CsrError::CommonNameMismatch {
            common_name: info.common_name.clone(),
            identity: identity.to_string(),
        });
    }
    for name in std::iter::once(&info.common_name).chain(info.dns_names.iter()) {
        if deny_list.iter().any(|re| re.is_match(name)) {
            return Err(CsrError::DeniedName(name.clone()));
        }
    }
    Ok(())
}

/// The provisioner's checks of a node's CSR, stricter than the Go
/// provisioner's `validateCSR` (which checks only the CN and the deny list,
/// and does not verify the signature):
///
/// 1. the CSR's own signature verifies (the node holds the key);
/// 2. the subject has exactly one common name, equal to `identity`;
/// 3. no IP, URI, e-mail or other non-DNS subjectAltName;
/// 4. every DNS subjectAltName is `identity` or matches an `allowed_dns`
///    pattern;
/// 5. neither the CN nor any DNS name matches the deny list.
///
/// Each refusal has its own [`CsrError`], with [`CsrError::reason`] as its
/// metric label.
pub fn check_csr(
    info: &CsrInfo,
    identity: &str,
    deny_list: &[Regex],
    allowed_dns: &[Regex],
) -> Result<(), CsrError> {
    info.verify_signature()?;
    match info.common_name_count {
        0 => return Err(CsrError::NoCommonName),
        1 => {}
        n => return Err(CsrError::SeveralCommonNames(n)),
    }
    if info.common_name != identity {
        return Err(CsrError::CommonNameMismatch {
            common_name: info.common_name.clone(),
            identity: identity.to_string(),
        });
    }
    if let Some(ip) = info.ip_addresses.first() {
        return Err(CsrError::IpSan(*ip));
    }
    if let Some(uri) = info.uris.first() {
        return Err(CsrError::UriSan(uri.clone()));
    }
    if let Some(mail) = info.email_addresses.first() {
        return Err(CsrError::EmailSan(mail.clone()));
    }
    if let Some(kind) = info.other_san_kinds.first() {
        return Err(CsrError::OtherSan(kind));
    }
    if let Some(foreign) = info
        .dns_names
        .iter()
        .find(|n| n.as_str() != identity && !allowed_dns.iter().any(|re| re.is_match(n)))
    {
        return Err(CsrError::ForeignDnsName(foreign.clone()));
    }
    validate_csr_names(info, identity, deny_list)
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

/// Parses an RSA public key from PKCS#1 DER (what
/// [`public_key_pem_go_style`] contains).
pub fn rsa_public_key_from_pkcs1_der(der: &[u8]) -> Result<RsaPublicKey, CsrError> {
    RsaPublicKey::from_pkcs1_der(der)
        .map_err(|e| CsrError::Parse(format!("invalid RSA public key: {e}")))
}

#[cfg(test)]
pub(crate) mod tests;

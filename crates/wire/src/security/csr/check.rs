//! Checking a node's CSR: its own signature, its names against the node's
//! identity, and the `cert_deny_list`.

use super::{CsrError, CsrInfo, OID_SHA256_RSA, OID_SHA384_RSA, OID_SHA512_RSA};
use crate::security::rsa_signer::{verify_pkcs1v15, RsaDigest};
use regex::Regex;
use x509_cert::der::{Decode, Encode};
use x509_cert::request::CertReq;

/// The provisioner's default `cert_deny_list` (`provisioner:config/config.go`),
/// used by Go when the configured list is empty.
pub const DEFAULT_CERT_DENY_LIST: [&str; 4] = [
    r"\.privileged.mcollective$",
    r"\.privileged.choria$",
    r"\.mcollective$",
    r"\.choria$",
];

impl CsrInfo {
    /// Checks the CSR's self-signature (proof of possession). The Go
    /// provisioner does **not** do this in `validateCSR`; it is offered for
    /// stricter callers and tests.
    pub fn verify_signature(&self) -> Result<(), CsrError> {
        let req = CertReq::from_der(self.der()).map_err(|e| CsrError::Parse(e.to_string()))?;
        let key = self
            .public_key
            .as_ref()
            .ok_or_else(|| CsrError::UnsupportedPublicKey(self.public_key_algorithm.clone()))?;
        let tbs = req
            .info
            .to_der()
            .map_err(|e| CsrError::Parse(e.to_string()))?;
        let sig_bytes = req
            .signature
            .as_bytes()
            .ok_or_else(|| CsrError::Parse("signature BIT STRING has unused bits".into()))?;
        let digest = match req.algorithm.oid {
            o if o == OID_SHA256_RSA => RsaDigest::Sha256,
            o if o == OID_SHA384_RSA => RsaDigest::Sha384,
            o if o == OID_SHA512_RSA => RsaDigest::Sha512,
            o => return Err(CsrError::UnsupportedSignatureAlgorithm(o.to_string())),
        };
        if verify_pkcs1v15(key, digest, &tbs, sig_bytes) {
            Ok(())
        } else {
            Err(CsrError::InvalidSignature)
        }
    }
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

//! `ca:` (ours): the built-in certificate authority that signs the nodes'
//! CSRs with `features.pki`, without a helper that signs and without
//! Kubernetes.
//!
//! ```yaml
//! ca:
//!   certificate: /etc/choria-provisioner/ca/ca.pem   # the CA, then its chain
//!   key: /etc/choria-provisioner/ca/ca.key           # or pkcs11:token=…;object=…?module-path=…&pin-source=file:…
//!   validity: 90d
//! ```
//!
//! The CA signs after every check that applies to a CSR (names, deny list,
//! allowed DNS names, admission, evidence); a certificate the helper signed
//! itself wins. [`CaConfig::load`] reads the CA's files or opens its key in
//! its token: `run --check` and the provisioner's start do, so a wrong key
//! fails there, not on the first node.

use super::duration::format_duration;
use super::schema::CaFile;
use super::yaml::{Node, Section};
use super::{ConfigError, ConfigWarning};
use choria_wire::security::ca::{CaKey, CertificateAuthority, PkiError};
use choria_wire::security::pkcs11::{Pkcs11CaKey, Pkcs11Error, Pkcs11Uri};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `ca.validity` when unset: cert-manager's default lifetime, so moving
/// between the two signers changes nothing about renewal.
pub const DEFAULT_CA_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);
/// The shortest `ca.validity`: renewal needs room to act before expiry.
pub const MIN_CA_VALIDITY: Duration = Duration::from_secs(3600);

/// `ca:`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaConfig {
    /// The CA certificate (PEM), followed by its chain when it is an
    /// intermediate.
    pub certificate: PathBuf,
    /// Where the CA's private key is.
    pub key: KeyRef,
    /// The lifetime of each certificate it signs (never past the CA's own).
    pub validity: Duration,
}

/// A private key: a file, or an object in a PKCS#11 token named by an RFC
/// 7512 URI (the key then never enters the provisioner's memory).
///
/// `Debug` and `Display` never show a `pin-value` (the URI may carry the
/// token's PIN itself).
#[derive(Clone, PartialEq, Eq)]
pub enum KeyRef {
    /// A PEM file.
    File(PathBuf),
    /// A `pkcs11:` URI, as written.
    Pkcs11(String),
}

impl KeyRef {
    /// A file path, or a `pkcs11:` URI (any letter case of the scheme).
    pub fn parse(text: &str) -> KeyRef {
        let text = text.trim();
        match text.get(..7) {
            Some(scheme) if scheme.eq_ignore_ascii_case("pkcs11:") => {
                KeyRef::Pkcs11(text.to_string())
            }
            _ => KeyRef::File(PathBuf::from(text)),
        }
    }

    /// As written in the file (with the PIN, if the URI holds one): for
    /// writing files, never for logs.
    pub fn to_file_text(&self) -> String {
        match self {
            KeyRef::File(p) => p.display().to_string(),
            KeyRef::Pkcs11(uri) => uri.clone(),
        }
    }
}

impl fmt::Display for KeyRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyRef::File(p) => write!(f, "{}", p.display()),
            KeyRef::Pkcs11(uri) => f.write_str(&redact_pin(uri)),
        }
    }
}

impl fmt::Debug for KeyRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyRef::File(p) => f.debug_tuple("File").field(p).finish(),
            KeyRef::Pkcs11(uri) => f.debug_tuple("Pkcs11").field(&redact_pin(uri)).finish(),
        }
    }
}

/// The URI with the value of each `pin-value` query attribute replaced.
fn redact_pin(uri: &str) -> String {
    let Some((path, query)) = uri.split_once('?') else {
        return uri.to_string();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|attr| match attr.split_once('=') {
            Some((name, _)) if name.eq_ignore_ascii_case("pin-value") => {
                format!("{name}=(redacted)")
            }
            _ => attr.to_string(),
        })
        .collect();
    format!("{path}?{}", query.join("&"))
}

impl CaConfig {
    pub fn to_file(&self) -> CaFile {
        CaFile {
            certificate: Some(self.certificate.display().to_string()),
            key: Some(self.key.to_file_text()),
            validity: Some(format_duration(self.validity)),
        }
    }

    /// On one line, for `run --check` (no PIN).
    pub fn effective(&self) -> String {
        format!(
            "certificate {}, key {}, validity {}",
            self.certificate.display(),
            self.key,
            format_duration(self.validity)
        )
    }
}

/// Why the CA could not be loaded: the setting at fault and what is wrong
/// (never key material).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaLoadError {
    /// `certificate` or `key`.
    pub key: &'static str,
    pub message: String,
}

impl CaConfig {
    /// The CA from its certificate file and its key: a file read here, or
    /// a key in a PKCS#11 token opened here (the token is asked for its
    /// public key, which must be the certificate's).
    pub fn load(&self) -> Result<CertificateAuthority, CaLoadError> {
        let key_path = match &self.key {
            KeyRef::File(path) => path,
            KeyRef::Pkcs11(uri) => return self.load_with(open_token_key(uri)?),
        };
        let cert = self.read_certificate()?;
        let key = std::fs::read_to_string(key_path).map_err(|e| CaLoadError {
            key: "key",
            message: format!("{}: {e}", key_path.display()),
        })?;
        CertificateAuthority::from_pem(&cert, &key).map_err(|e| self.pki_error(e))
    }

    /// The CA from its certificate file and a key held elsewhere.
    pub fn load_with(&self, key: Box<dyn CaKey>) -> Result<CertificateAuthority, CaLoadError> {
        CertificateAuthority::load(&self.read_certificate()?, key).map_err(|e| self.pki_error(e))
    }

    fn read_certificate(&self) -> Result<String, CaLoadError> {
        std::fs::read_to_string(&self.certificate).map_err(|e| CaLoadError {
            key: "certificate",
            message: format!("{}: {e}", self.certificate.display()),
        })
    }

    /// The setting a CA error is about: the key's problems are the key's.
    fn pki_error(&self, e: PkiError) -> CaLoadError {
        let about_key = match &e {
            PkiError::EncryptedKey | PkiError::KeyMismatch => true,
            PkiError::Parse { what, .. }
            | PkiError::BadPem { what, .. }
            | PkiError::MissingPemBlock { what, .. } => what.contains("key"),
            _ => false,
        };
        let (key, path) = if about_key {
            ("key", self.key.to_string())
        } else {
            ("certificate", self.certificate.display().to_string())
        };
        CaLoadError {
            key,
            message: format!("{path}: {e}"),
        }
    }
}

/// The CA key a `pkcs11:` URI names, opened in its token.
fn open_token_key(uri: &str) -> Result<Box<dyn CaKey>, CaLoadError> {
    let error = |e: Pkcs11Error| CaLoadError {
        key: "key",
        // The URI as shown (no PIN), and the token's error (never a PIN).
        message: format!("{}: {e}", KeyRef::Pkcs11(uri.to_string())),
    };
    let uri = Pkcs11Uri::parse(uri).map_err(error)?;
    Ok(Box::new(Pkcs11CaKey::open(&uri).map_err(error)?))
}

/// `ca:`, when set.
pub(crate) fn ca(
    file: &Path,
    sec: &Section,
    w: &mut Vec<ConfigWarning>,
) -> Result<Option<CaConfig>, ConfigError> {
    if !sec.is_set("ca") {
        return Ok(None);
    }
    let c = Section::new(
        file,
        &format!("{}.", sec.key("ca")),
        sec.node("ca").cloned().unwrap_or(Node::Null),
        CaFile::KEYS,
        w,
    )?;
    let text = |key: &str| -> Result<Option<String>, ConfigError> {
        Ok(c.string(key)?.filter(|v| !v.trim().is_empty()))
    };
    let Some(certificate) = text("certificate")? else {
        return Err(c.error(
            "certificate",
            "required: the CA certificate (PEM) that signs the nodes' CSRs, followed by its chain when it is an intermediate",
        ));
    };
    let Some(key) = text("key")? else {
        return Err(c.error(
            "key",
            "required: the CA's private key, a PEM file or a pkcs11: URI",
        ));
    };
    let validity = match c.duration("validity")? {
        Some((raw, d)) if !raw.trim().is_empty() => {
            if d < MIN_CA_VALIDITY {
                return Err(c.error(
                    "validity",
                    format!("{raw} is shorter than 1h: renewal would have no time to act"),
                ));
            }
            d
        }
        _ => DEFAULT_CA_VALIDITY,
    };
    let key = KeyRef::parse(&key);
    if let KeyRef::Pkcs11(uri) = &key {
        // The form is checked here; the token is opened by `load`.
        Pkcs11Uri::parse(uri).map_err(|e| c.error("key", e.to_string()))?;
    }
    Ok(Some(CaConfig {
        certificate: PathBuf::from(certificate.trim()),
        key,
        validity,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pkcs11_uri_is_told_from_a_file_and_its_pin_value_never_shows() {
        let uri = "PKCS11:token=fleet;object=ca?module-path=/m.so&pin-value=s3cret";
        let key = KeyRef::parse(uri);
        assert!(matches!(key, KeyRef::Pkcs11(_)));
        for shown in [key.to_string(), format!("{key:?}")] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("pin-value=(redacted)"), "{shown}");
            assert!(shown.contains("module-path=/m.so"), "{shown}");
        }
        assert_eq!(key.to_file_text(), uri);
        assert_eq!(
            KeyRef::parse(" /etc/ca.key "),
            KeyRef::File(PathBuf::from("/etc/ca.key"))
        );
    }

    fn parse(yaml: &str) -> Result<crate::ProvisionerConfig, ConfigError> {
        crate::ProvisionerConfig::parse(yaml, "provisioner.yaml")
    }

    fn error(yaml: &str) -> String {
        parse(yaml).expect_err(yaml).to_string()
    }

    const TEMPLATE: &str = "configuration_template: {configuration: {a: b}}\n";

    #[test]
    fn the_built_in_ca_signs_for_pki_without_a_helper() {
        let c = parse(&format!(
            "features: {{pki: true}}\n{TEMPLATE}ca: {{certificate: /ca.pem, key: /ca.key}}\n"
        ))
        .unwrap();
        let ca = c.ca.as_ref().expect("ca");
        assert_eq!(ca.certificate, PathBuf::from("/ca.pem"));
        assert_eq!(ca.key, KeyRef::File("/ca.key".into()));
        assert_eq!(ca.validity, DEFAULT_CA_VALIDITY);
        // Renewal counts with the certificates' lifetime.
        assert_eq!(
            c.issued_lifetime_longest().map(|l| (l.setting, l.lifetime)),
            Some(("ca.validity", DEFAULT_CA_VALIDITY))
        );
        // Without it, something else has to sign.
        let e = error(&format!("features: {{pki: true}}\n{TEMPLATE}"));
        assert!(e.contains("unless cert_manager or ca is set"), "{e}");
    }

    #[test]
    fn a_ca_without_its_files_or_with_a_short_validity_is_refused() {
        for (ca, wanted) in [
            ("{key: /k}", "ca.certificate: required"),
            ("{certificate: /c}", "ca.key: required"),
            ("{certificate: /c, key: ' '}", "ca.key: required"),
            (
                "{certificate: /c, key: 'pkcs11:object=ca?pin-value=s3cret'}",
                "ca.key: pkcs11: URI has no module-path",
            ),
            (
                "{certificate: /c, key: /k, validity: 30m}",
                "ca.validity: 30m is shorter than 1h",
            ),
        ] {
            let e = error(&format!("helper: h\nfeatures: {{pki: true}}\nca: {ca}\n"));
            assert!(e.contains(wanted), "{ca}: {e}");
            assert!(!e.contains("s3cret"), "{e}");
        }
    }

    #[test]
    fn one_signer_of_ours_at_a_time_and_none_without_pki() {
        let e = error(
            "helper: h\nfeatures: {pki: true}\ncert_manager: {issuer: i, namespace: n}\n\
             ca: {certificate: /c, key: /k}\n",
        );
        assert!(e.contains("ca: set together with cert_manager"), "{e}");
        let c = parse("helper: h\nca: {certificate: /c, key: /k}\n").unwrap();
        assert!(
            c.warnings
                .iter()
                .any(|w| w.to_string().contains("ca: set while features.pki is off")),
            "{:?}",
            c.warnings
        );
    }
}

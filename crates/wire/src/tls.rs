//! TLS settings for NATS connections.
//!
//! Provisioning-mode Choria Servers dial with TLS and do not verify the broker
//! (they have no CA yet), so the simulator must be able to do the same; the
//! provisioner verifies against a CA when it is given one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How a connection treats TLS.
#[derive(Clone, Debug, Default)]
pub struct TlsSettings {
    /// Use TLS even if the URL and the server do not ask for it.
    pub required: bool,
    /// Verify the server against this CA bundle.
    pub ca_file: Option<PathBuf>,
    /// Present this client certificate (mutual TLS).
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Accept any server certificate, as provisioning-mode servers do.
    pub insecure_skip_verify: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("could not read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

impl TlsSettings {
    /// True when a custom rustls configuration is needed.
    pub fn is_custom(&self) -> bool {
        self.ca_file.is_some() || self.client_cert.is_some() || self.insecure_skip_verify
    }

    /// Builds the rustls client configuration for these settings.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = if self.insecure_skip_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider.clone())))
        } else {
            let mut roots = rustls::RootCertStore::empty();
            if let Some(ca) = &self.ca_file {
                for cert in read_certs(ca)? {
                    roots.add(cert).map_err(|e| TlsError::Invalid {
                        path: ca.clone(),
                        reason: e.to_string(),
                    })?;
                }
            }
            builder.with_root_certificates(roots)
        };
        let config = match &self.client_cert {
            Some((cert, key)) => {
                builder.with_client_cert_resolver(Arc::new(client_identity(&provider, cert, key)?))
            }
            None => builder.with_no_client_auth(),
        };
        Ok(config)
    }
}

/// Our certificate and key for mutual TLS.
///
/// rustls' `with_client_auth_cert` parses the certificate with webpki to
/// check it against the key, and webpki refuses X.509 v1 certificates —
/// what `openssl x509 -req` makes without an extension file, and what Go
/// (and so go-choria and the broker) accepts. Whether our own certificate
/// is good enough is the broker's call, not ours: the key is matched to the
/// certificate here, with a parser that reads every X.509 version.
fn client_identity(
    provider: &rustls::crypto::CryptoProvider,
    cert: &Path,
    key: &Path,
) -> Result<ClientIdentity, TlsError> {
    let certs = read_certs(cert)?;
    let key_der = read_key(key)?;
    let signing_key = provider
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| TlsError::Invalid {
            path: key.to_path_buf(),
            reason: format!("not a usable private key: {e}"),
        })?;
    let cert_spki = certificate_spki(&certs[0]).map_err(|reason| TlsError::Invalid {
        path: cert.to_path_buf(),
        reason,
    })?;
    if let Some(key_spki) = signing_key.public_key() {
        if key_spki.as_ref() != cert_spki.as_slice() {
            return Err(TlsError::Invalid {
                path: key.to_path_buf(),
                reason: format!(
                    "is not the private key of the certificate {}",
                    cert.display()
                ),
            });
        }
    }
    Ok(ClientIdentity(Arc::new(rustls::sign::CertifiedKey::new(
        certs,
        signing_key,
    ))))
}

/// The DER SubjectPublicKeyInfo of a certificate of any X.509 version.
fn certificate_spki(der: &[u8]) -> Result<Vec<u8>, String> {
    use x509_cert::der::{Decode, Encode};
    let cert = x509_cert::Certificate::from_der(der)
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    cert.tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| format!("unreadable public key: {e}"))
}

/// Always offers our one certificate, whatever the broker hints.
#[derive(Debug)]
struct ClientIdentity(Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for ClientIdentity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        // Offer the certificate only when our key can sign with a scheme
        // the broker accepts; rustls then sends no certificate, as Go does.
        self.0
            .key
            .choose_scheme(sigschemes)
            .map(|_| Arc::clone(&self.0))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Plain words for TLS failures whose raw rustls text says little: `None`
/// when there is nothing to add.
pub fn explain(error_text: &str) -> Option<&'static str> {
    if error_text.contains("UnsupportedCertVersion") {
        Some(
            "the broker's certificate is an X.509 v1 certificate, which cannot carry the \
             subjectAltName a TLS client verifies the broker's name against; re-issue it as v3, \
             e.g. `openssl x509 -req ... -extfile <(printf 'subjectAltName=DNS:broker.example.net')`",
        )
    } else if error_text.contains("NotValidForName") {
        Some("the broker's certificate does not name the host in the broker URL (its subjectAltName)")
    } else if error_text.contains("UnknownIssuer") {
        Some("the broker's certificate is not signed by the configured CA")
    } else if error_text.contains("Expired") {
        Some("the broker's certificate has expired")
    } else {
        None
    }
}

fn read_certs(path: &Path) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, TlsError> {
    let data = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let certs: Result<Vec<_>, _> = rustls_pemfile::certs(&mut data.as_slice()).collect();
    let certs = certs.map_err(|e| TlsError::Invalid {
        path: path.to_path_buf(),
        reason: format!("not PEM certificates: {e}"),
    })?;
    if certs.is_empty() {
        return Err(TlsError::Invalid {
            path: path.to_path_buf(),
            reason: "holds no PEM certificate".into(),
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<rustls::pki_types::PrivateKeyDer<'static>, TlsError> {
    let data = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    rustls_pemfile::private_key(&mut data.as_slice())
        .map_err(|e| TlsError::Invalid {
            path: path.to_path_buf(),
            reason: format!("not a PEM private key: {e}"),
        })?
        .ok_or_else(|| TlsError::Invalid {
            path: path.to_path_buf(),
            reason: "holds no PEM private key".into(),
        })
}

/// Accepts any server certificate but still checks handshake signatures, which is
/// what Go's `InsecureSkipVerify` does.
#[derive(Debug)]
struct AcceptAnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{openssl, run_ok, skip_without_openssl};

    /// A CA and a client certificate signed by it with `openssl x509 -req`
    /// and no extension file: an X.509 v1 certificate.
    fn v1_client(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let p = |n: &str| dir.join(n);
        run_ok(
            openssl()
                .args([
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                ])
                .arg("-keyout")
                .arg(p("ca.key"))
                .arg("-out")
                .arg(p("ca.pem"))
                .args(["-subj", "/CN=ca"]),
        );
        run_ok(
            openssl()
                .args(["req", "-newkey", "rsa:2048", "-nodes"])
                .arg("-keyout")
                .arg(p("c.key"))
                .arg("-out")
                .arg(p("c.csr"))
                .args(["-subj", "/CN=client"]),
        );
        run_ok(
            openssl()
                .args(["x509", "-req", "-days", "2"])
                .arg("-in")
                .arg(p("c.csr"))
                .arg("-CA")
                .arg(p("ca.pem"))
                .arg("-CAkey")
                .arg(p("ca.key"))
                .args(["-set_serial", "7"])
                .arg("-out")
                .arg(p("c.pem")),
        );
        let text = run_ok(
            openssl()
                .args(["x509", "-noout", "-text", "-in"])
                .arg(p("c.pem")),
        );
        assert!(
            String::from_utf8_lossy(&text.stdout).contains("Version: 1 (0x0)"),
            "openssl made no v1 certificate"
        );
        (p("ca.pem"), p("c.pem"), p("c.key"))
    }

    #[test]
    fn a_v1_client_certificate_is_accepted_as_go_accepts_it() {
        if skip_without_openssl("the v1 certificate test") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = v1_client(dir.path());
        let settings = TlsSettings {
            required: true,
            ca_file: Some(ca),
            client_cert: Some((cert, key)),
            insecure_skip_verify: false,
        };
        // rustls' with_client_auth_cert refused this with
        // "invalid peer certificate: Other(OtherError(UnsupportedCertVersion))".
        let config = settings.client_config().expect("v1 client certificate");
        assert!(config.client_auth_cert_resolver.has_certs());
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused_with_both_names() {
        if skip_without_openssl("the key mismatch test") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, _) = v1_client(dir.path());
        let settings = TlsSettings {
            required: true,
            ca_file: Some(ca.clone()),
            // the CA's key does not belong to the client certificate
            client_cert: Some((cert.clone(), dir.path().join("ca.key"))),
            insecure_skip_verify: false,
        };
        let e = settings.client_config().unwrap_err().to_string();
        assert!(
            e.contains("ca.key")
                && e.contains("is not the private key of the certificate")
                && e.contains("c.pem"),
            "{e}"
        );
    }

    #[test]
    fn tls_failures_get_plain_words() {
        assert!(
            explain("invalid peer certificate: Other(OtherError(UnsupportedCertVersion))")
                .unwrap()
                .contains("v3")
        );
        assert!(explain("invalid peer certificate: UnknownIssuer")
            .unwrap()
            .contains("CA"));
        assert_eq!(explain("connection refused"), None);
    }
}

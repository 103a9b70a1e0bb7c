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
                .with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider)))
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
                let certs = read_certs(cert)?;
                let key_der = read_key(key)?;
                builder.with_client_auth_cert(certs, key_der)?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(config)
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

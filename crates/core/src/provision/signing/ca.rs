//! The built-in CA (`ca:`) as a signer: each node's CSR, already checked
//! for its names when it was fetched, signed here with the lifetime
//! `ca.validity`; the node is sent its certificate followed by the CA's
//! intermediates, and the CA's file as what it trusts.
//!
//! Signing runs on the blocking pool: a key in a PKCS#11 token is a
//! blocking call into its module (a network HSM may take milliseconds),
//! and an RSA signature is a quarter of a millisecond of CPU that the
//! async workers should not spend.

use choria_wire::security::ca::{CertificateAuthority, PkiError};
use std::sync::Arc;
use std::time::Duration;

/// The built-in CA and how long what it signs lives.
pub struct BuiltinCa {
    ca: CertificateAuthority,
    validity: Duration,
}

/// What the node is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// The node's certificate, then the intermediates above it.
    pub certificate: String,
    /// What the node trusts (its `ca.pem`).
    pub ca: String,
}

/// Why a CSR was not signed.
#[derive(Debug, thiserror::Error)]
pub enum CaSignError {
    /// The CSR itself: its signature, its key or its names (the node's
    /// doing).
    #[error("the CSR was refused: {0}")]
    Refused(#[source] PkiError),
    /// The CA could not sign (its key's doing: a token gone, a module
    /// failing).
    #[error("the CA could not sign: {0}")]
    Unavailable(#[source] PkiError),
    /// The signing task did not finish (the process is stopping).
    #[error("the signing task ended: {0}")]
    Task(String),
}

impl CaSignError {
    /// The `outcome` label of `choria_provisioner_ca_signatures`.
    pub fn outcome(&self) -> &'static str {
        match self {
            CaSignError::Refused(_) => "refused",
            CaSignError::Unavailable(_) | CaSignError::Task(_) => "unavailable",
        }
    }
}

impl BuiltinCa {
    pub fn new(ca: CertificateAuthority, validity: Duration) -> Self {
        BuiltinCa { ca, validity }
    }

    /// Signs `csr_pem` (PEM) on the blocking pool.
    pub async fn sign(self: &Arc<Self>, csr_pem: &str) -> Result<Issued, CaSignError> {
        let this = self.clone();
        let csr = csr_pem.to_string();
        tokio::task::spawn_blocking(move || this.sign_now(&csr))
            .await
            .map_err(|e| CaSignError::Task(e.to_string()))?
    }

    fn sign_now(&self, csr_pem: &str) -> Result<Issued, CaSignError> {
        let leaf = self
            .ca
            .sign_csr(csr_pem, self.validity)
            .map_err(|e| match e {
                // Only the key's own failures are the CA's; everything
                // else was wrong with what the node sent.
                PkiError::KeyFailed(_) => CaSignError::Unavailable(e),
                e => CaSignError::Refused(e),
            })?;
        Ok(Issued {
            certificate: leaf + self.ca.chain_pem(),
            ca: self.ca.trust_pem().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use choria_wire::security::ca::verify_issued_by;
    use choria_wire::security::csr::{generate_rsa_key, make_csr, CsrSubject};

    #[tokio::test]
    async fn a_csr_is_signed_for_the_validity_and_sent_with_what_to_trust() {
        let ca = CertificateAuthority::generate_p256("Fleet CA").unwrap();
        let trust = ca.cert_pem();
        let ca = Arc::new(BuiltinCa::new(ca, Duration::from_secs(3 * 3600)));
        let csr = make_csr(
            &generate_rsa_key(2048).unwrap(),
            &CsrSubject::new("n1.example.net"),
        )
        .unwrap();
        let issued = ca.sign(&csr).await.unwrap();
        verify_issued_by(&issued.certificate, &trust).unwrap();
        assert_eq!(issued.ca, trust);
        let pem = pem::parse(&issued.certificate).unwrap();
        let cert = <x509_cert::Certificate as der::Decode>::from_der(pem.contents()).unwrap();
        let validity = cert.tbs_certificate.validity;
        let lifetime =
            validity.not_after.to_unix_duration() - validity.not_before.to_unix_duration();
        // Backdated a few minutes for clock skew, no longer than asked.
        assert!(
            lifetime > Duration::from_secs(3 * 3600)
                && lifetime <= Duration::from_secs(3 * 3600 + 600),
            "{lifetime:?}"
        );
    }

    #[tokio::test]
    async fn a_csr_that_is_not_one_is_refused_not_blamed_on_the_ca() {
        let ca = CertificateAuthority::generate_p256("Fleet CA").unwrap();
        let ca = Arc::new(BuiltinCa::new(ca, Duration::from_secs(3600)));
        let err = ca.sign("not a CSR").await.unwrap_err();
        assert_eq!(err.outcome(), "refused", "{err}");
    }
}

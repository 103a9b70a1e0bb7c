//! Records: what was issued to which node, when, by which replica — one
//! JSON value per node in a JetStream KV bucket (key: the node's identity),
//! with history, so a node provisioned again keeps its earlier records.
//!
//! A record never holds a secret: certificates and server JWTs are public
//! material, and only their serial, issuer, expiry, `jti` and collectives
//! are kept; the configuration written is kept as a SHA-256 digest.
//!
//! Every replica writes only the nodes it provisioned, each a key of its
//! own, so replicas in either election mode never overwrite each other's
//! updates; a node provisioned again is a new revision of its key.
//!
//! Anyone who may write the bucket can write a value there, and renewal
//! acts on what it reads (it sends `reprovision`, token included). So each
//! record is sealed by the replica that writes it with the key the
//! Provisioner's replicas share (`records.signing_key`), bound to its
//! bucket, key and site ([`sealed`]); readers act only on records that
//! verify.

pub mod connection;
pub mod keys;
pub mod ledger;
pub mod sealed;
pub mod store;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What one provisioning issued and wrote, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub identity: String,
    /// When it was provisioned, RFC 3339, and as Unix seconds.
    pub time: String,
    pub time_unix: i64,
    /// The replica that provisioned it (its member or candidate name).
    pub replica: String,
    pub site: String,
    /// `v1` or `v2`.
    pub protocol: String,
    /// `helper`, `template` or `template+helper`.
    pub mode: String,
    /// Who signed the certificate: `helper`, `cert-manager`, or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<CertificateRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_jwt: Option<ServerJwtRecord>,
    /// SHA-256 of the configuration `configure` wrote (hex).
    pub config_sha256: String,
    /// When the node's provisioning JWT expires (Unix seconds), when it
    /// had one with an expiry: a node asked to reprovision after that
    /// cannot come back (the broker refuses its provisioning JWT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_jwt_expires_unix: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertificateRecord {
    /// Hex, as `openssl x509 -serial` shows it.
    pub serial: String,
    pub issuer: String,
    pub not_before_unix: i64,
    pub not_after_unix: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerJwtRecord {
    pub jti: String,
    pub issued_unix: i64,
    pub expires_unix: i64,
    pub collectives: Vec<String>,
}

impl Record {
    /// The earliest expiry of what was issued, with when that was issued:
    /// `(issued, expires)`; `None` when nothing expiring was issued.
    pub fn expiry(&self) -> Option<(i64, i64)> {
        let cert = self
            .certificate
            .as_ref()
            .map(|c| (c.not_before_unix, c.not_after_unix));
        let jwt = self
            .server_jwt
            .as_ref()
            .map(|j| (j.issued_unix, j.expires_unix));
        match (cert, jwt) {
            (Some(c), Some(j)) => Some(if c.1 <= j.1 { c } else { j }),
            (c, j) => c.or(j),
        }
    }

    /// The collective a renewal goes to: the first its server JWT names.
    pub fn collective(&self) -> Option<&str> {
        self.server_jwt
            .as_ref()
            .and_then(|j| j.collectives.first())
            .map(String::as_str)
    }
}

/// What went into one provisioning, from which a record is made.
pub struct Issued<'a> {
    pub identity: &'a str,
    pub replica: &'a str,
    pub site: &'a str,
    pub protocol: &'a str,
    pub mode: &'a str,
    pub signer: Option<&'a str>,
    /// PEM, empty when none was issued.
    pub certificate: &'a str,
    /// Compact JWS, empty when none was issued.
    pub server_jwt: &'a str,
    /// The configuration `configure` wrote.
    pub config: &'a str,
    /// The verified provisioning JWT's expiry, when it has one.
    pub provisioning_jwt_expires: Option<i64>,
    pub now: chrono::DateTime<chrono::Utc>,
}

#[derive(Debug, thiserror::Error)]
pub enum IssuedError {
    #[error("the certificate issued cannot be read: {0}")]
    Certificate(String),
    #[error("the server JWT issued cannot be read: {0}")]
    ServerJwt(String),
}

impl Issued<'_> {
    pub fn record(&self) -> Result<Record, IssuedError> {
        let certificate = (!self.certificate.trim().is_empty())
            .then(|| certificate(self.certificate))
            .transpose()?;
        let server_jwt = (!self.server_jwt.trim().is_empty())
            .then(|| server_jwt(self.server_jwt))
            .transpose()?;
        Ok(Record {
            identity: self.identity.to_string(),
            time: self.now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            time_unix: self.now.timestamp(),
            replica: self.replica.to_string(),
            site: self.site.to_string(),
            protocol: self.protocol.to_string(),
            mode: self.mode.to_string(),
            signer: self.signer.map(str::to_string),
            certificate,
            server_jwt,
            config_sha256: hex::encode(Sha256::digest(self.config.as_bytes())),
            provisioning_jwt_expires_unix: self.provisioning_jwt_expires,
        })
    }
}

/// Serial, issuer and validity of the first certificate in `pem`.
fn certificate(pem: &str) -> Result<CertificateRecord, IssuedError> {
    use x509_cert::der::DecodePem;
    let bad = |e: &dyn std::fmt::Display| IssuedError::Certificate(e.to_string());
    let begin = "-----BEGIN CERTIFICATE-----";
    let end = "-----END CERTIFICATE-----";
    let first = match (pem.find(begin), pem.find(end)) {
        (Some(a), Some(b)) if a < b => &pem[a..b + end.len()],
        _ => return Err(bad(&"no PEM certificate")),
    };
    let cert = x509_cert::Certificate::from_pem(first.as_bytes()).map_err(|e| bad(&e))?;
    let tbs = &cert.tbs_certificate;
    let unix = |t: x509_cert::time::Time| t.to_unix_duration().as_secs() as i64;
    Ok(CertificateRecord {
        serial: hex::encode_upper(tbs.serial_number.as_bytes()),
        issuer: tbs.issuer.to_string(),
        not_before_unix: unix(tbs.validity.not_before),
        not_after_unix: unix(tbs.validity.not_after),
    })
}

/// `jti`, `iat`, `exp` and collectives of a server JWT we just signed (its
/// signature is ours: only the claims are read).
fn server_jwt(jws: &str) -> Result<ServerJwtRecord, IssuedError> {
    use base64::Engine;
    let bad = |e: &dyn std::fmt::Display| IssuedError::ServerJwt(e.to_string());
    let payload = jws.split('.').nth(1).ok_or_else(|| bad(&"not a JWS"))?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|e| bad(&e))?;
    #[derive(Deserialize)]
    struct Claims {
        #[serde(default)]
        jti: String,
        #[serde(default)]
        iat: i64,
        #[serde(default)]
        exp: i64,
        #[serde(default)]
        collectives: Vec<String>,
    }
    let c: Claims = serde_json::from_slice(&json).map_err(|e| bad(&e))?;
    Ok(ServerJwtRecord {
        jti: c.jti,
        issued_unix: c.iat,
        expires_unix: c.exp,
        collectives: c.collectives,
    })
}

#[cfg(test)]
mod tests;

//! The connection to the records' JetStream (the revocations, instance
//! bindings and audit stream use it too), the keys what is stored there is
//! sealed with, and the one error every bucket of ours reports.

use super::sealed::Sealer;
use choria_config::day_two::RecordsConfig;
use choria_wire::security::seal::{SealKey, SealKeyError};

#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error("cannot read {what} {}: {source}", .path.display())]
    File {
        what: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to the records' JetStream at {urls}: {reason}")]
    Connect { urls: String, reason: String },
    #[error("the records' bucket {bucket}: {reason}")]
    Bucket { bucket: String, reason: String },
    /// Known to be missing (not an error reaching it), and not ours to make.
    #[error("the bucket {bucket} does not exist and records.create_bucket is false")]
    Missing { bucket: String },
    #[error(
        "the bucket {bucket} is not protected: anyone who may write it could erase or roll back \
         what it holds (it lacks {missing}); let the provisioner protect it (records.create_bucket: \
         true), or update its stream yourself: nats stream edit KV_{bucket} --deny-delete \
         --deny-purge --no-allow-rollup --discard new --discard-per-subject --max-age 0"
    )]
    Unprotected { bucket: String, missing: String },
    #[error("writing the record of {identity}: {reason}")]
    Put { identity: String, reason: String },
    #[error("reading the records: {0}")]
    Read(String),
    #[error("records.signing_key: {0}")]
    Key(#[source] SealKeyError),
}

/// The sealer `cfg` describes for `site`: its signing key (read now) and
/// the keys it trusts besides.
pub fn sealer(cfg: &RecordsConfig, site: &str) -> Result<Sealer, RecordsError> {
    let (key, verifier) = seal_keys(cfg)?;
    Ok(Sealer::new(key, verifier, &cfg.bucket, site))
}

/// `records.signing_key` (read now) and a verifier trusting it and
/// `records.verify_keys`: what records, revocations and audit events are
/// sealed and opened with.
pub fn seal_keys(
    cfg: &RecordsConfig,
) -> Result<(SealKey, choria_wire::security::seal::SealVerifier), RecordsError> {
    let key = SealKey::from_file(&cfg.signing_key).map_err(RecordsError::Key)?;
    let mut verifier = key.verifier();
    for k in &cfg.verify_keys {
        verifier = verifier.trusting(k).map_err(RecordsError::Key)?;
    }
    Ok((key, verifier))
}

/// A connection to the records' JetStream (the audit stream uses it too).
pub async fn connect(cfg: &RecordsConfig, name: &str) -> Result<async_nats::Client, RecordsError> {
    let read = |what: &'static str, path: &std::path::Path| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_string())
            .map_err(|source| RecordsError::File {
                what,
                path: path.to_path_buf(),
                source,
            })
    };
    let mut opts = async_nats::ConnectOptions::new().name(name);
    let password = match (&cfg.password, &cfg.password_file) {
        (Some(p), _) => Some(p.expose().to_string()),
        (None, Some(f)) => Some(read("records.password_file", f)?),
        (None, None) => None,
    };
    if let (Some(user), Some(password)) = (&cfg.user, password) {
        opts = opts.user_and_password(user.clone(), password);
    }
    let token = match (&cfg.token, &cfg.token_file) {
        (Some(t), _) => Some(t.expose().to_string()),
        (None, Some(f)) => Some(read("records.token_file", f)?),
        (None, None) => None,
    };
    if let Some(token) = token {
        opts = opts.token(token);
    }
    if let Some(creds) = &cfg.credentials_file {
        opts = opts
            .credentials_file(creds)
            .await
            .map_err(|e| RecordsError::Connect {
                urls: cfg.urls.join(","),
                reason: format!("credentials file {}: {e}", creds.display()),
            })?;
    }
    if let Some(ca) = &cfg.tls_ca {
        opts = opts.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let Some((cert, key)) = &cfg.tls_client {
        opts = opts
            .add_client_certificate(cert.clone(), key.clone())
            .require_tls(true);
    }
    let addrs: Vec<async_nats::ServerAddr> = cfg
        .urls
        .iter()
        .map(|u| u.parse())
        .collect::<Result<_, _>>()
        .map_err(|e: std::io::Error| RecordsError::Connect {
            urls: cfg.urls.join(","),
            reason: e.to_string(),
        })?;
    opts.connect(addrs)
        .await
        .map_err(|e| RecordsError::Connect {
            urls: cfg.urls.join(","),
            reason: if e.kind() == async_nats::ConnectErrorKind::AuthorizationViolation {
                format!(
                "{e} (the server refused the records' credentials; a Choria broker admits them to \
                 its choria account only with tls_cert/tls_key signed by its CA, and on an \
                 Organization Issuer network only when it sets plugin.security.choria.ca)"
            )
            } else {
                e.to_string()
            },
        })
}

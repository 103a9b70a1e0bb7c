//! The records' KV bucket, reached through a connection of its own. What
//! goes in is sealed and what comes out is opened ([`super::sealed`]).

use super::sealed::{Read, Refusal, Sealer};
use super::Record;
use async_nats::jetstream::kv;
use choria_config::day_two::RecordsConfig;
use choria_wire::security::seal::{SealKey, SealKeyError};
use futures::StreamExt;

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

/// The bucket, open.
#[derive(Clone)]
pub struct RecordStore {
    kv: kv::Store,
    bucket: String,
    sealer: Sealer,
}

impl RecordStore {
    /// Connects and opens the bucket (creating it when allowed); records
    /// are sealed and opened with `sealer`.
    pub async fn connect(
        cfg: &RecordsConfig,
        sealer: Sealer,
        name: &str,
    ) -> Result<Self, RecordsError> {
        let nats = connect(cfg, name).await?;
        let js = async_nats::jetstream::new(nats);
        let bucket_err = |reason: String| RecordsError::Bucket {
            bucket: cfg.bucket.clone(),
            reason,
        };
        let kv = match js.get_key_value(&cfg.bucket).await {
            Ok(kv) => kv,
            Err(e) if cfg.create_bucket => js
                .create_key_value(kv::Config {
                    bucket: cfg.bucket.clone(),
                    description: "choria-provisioner: one record per provisioned node".into(),
                    history: i64::from(cfg.history),
                    ..Default::default()
                })
                .await
                .map_err(|c| bad_bucket(&e, &c.to_string()))
                .map_err(bucket_err)?,
            Err(e) => return Err(bucket_err(e.to_string())),
        };
        Ok(RecordStore {
            kv,
            bucket: cfg.bucket.clone(),
            sealer,
        })
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// Writes `record`, sealed, under its node's key; its revision.
    pub async fn put(&self, record: &Record) -> Result<u64, RecordsError> {
        let body = self.sealer.seal(record).map_err(|e| RecordsError::Put {
            identity: record.identity.clone(),
            reason: e.to_string(),
        })?;
        self.kv
            .put(&record.identity, body.into())
            .await
            .map_err(|e| RecordsError::Put {
                identity: record.identity.clone(),
                reason: e.to_string(),
            })
    }

    /// Every node's current value, opened, by key.
    pub async fn all(&self) -> Result<Vec<Read>, RecordsError> {
        let read = |e: &dyn std::fmt::Display| RecordsError::Read(e.to_string());
        let mut keys = match self.kv.keys().await {
            Ok(k) => k,
            Err(e) => return Err(read(&e)),
        };
        let mut out = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| read(&e))?;
            if let Some(bytes) = self.kv.get(&key).await.map_err(|e| read(&e))? {
                out.push(self.sealer.open(&key, &bytes));
            }
        }
        out.sort_by(|a, b| a.key().cmp(b.key()));
        Ok(out)
    }

    /// Every node's current value, then every new one, as they are written
    /// (by any replica, or anyone else who may write the bucket), opened;
    /// a deleted or purged key is a [`Refusal::Deleted`].
    pub async fn watch(
        &self,
    ) -> Result<impl futures::Stream<Item = Read> + Send + Unpin + 'static, RecordsError> {
        let watch = self
            .kv
            .watch_with_history(">")
            .await
            .map_err(|e| RecordsError::Read(e.to_string()))?;
        let sealer = self.sealer.clone();
        Ok(watch.filter_map(move |entry| {
            let read = entry.ok().map(|e| match e.operation {
                kv::Operation::Put => sealer.open(&e.key, &e.value),
                kv::Operation::Delete | kv::Operation::Purge => Read::Refused {
                    key: e.key,
                    why: Refusal::Deleted,
                    record: None,
                },
            });
            futures::future::ready(read)
        }))
    }
}

/// The bucket could not be read nor made: both reasons.
fn bad_bucket(get: &dyn std::fmt::Display, create: &str) -> String {
    format!("not found ({get}) and not created ({create})")
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

/// A KV bucket of `cfg`'s JetStream beside the records (revocations,
/// instance bindings), created with `description` when it is missing and
/// `records.create_bucket` allows.
pub async fn open_bucket(
    cfg: &RecordsConfig,
    bucket: &str,
    description: &str,
    name: &str,
) -> Result<kv::Store, RecordsError> {
    let nats = connect(cfg, name).await?;
    let js = async_nats::jetstream::new(nats);
    let bucket_err = |reason: String| RecordsError::Bucket {
        bucket: bucket.to_string(),
        reason,
    };
    match js.get_key_value(bucket).await {
        Ok(kv) => Ok(kv),
        Err(e) if cfg.create_bucket => js
            .create_key_value(kv::Config {
                bucket: bucket.to_string(),
                description: description.into(),
                history: 5,
                ..Default::default()
            })
            .await
            .map_err(|c| bucket_err(format!("not found ({e}) and not created ({c})"))),
        Err(e) => Err(bucket_err(e.to_string())),
    }
}

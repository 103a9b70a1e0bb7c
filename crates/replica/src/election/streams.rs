//! The Choria Streams election: go-choria's algorithm on the JetStream KV
//! bucket `CHORIA_LEADER_ELECTION`, spoken with plain NATS requests so that
//! it works through the two subjects a Choria broker imports into the
//! provisioning account (`STREAM.INFO` of the bucket under the API prefix,
//! and the election key).
//!
//! * campaign: a put with `Nats-Expected-Last-Subject-Sequence: 0` (the key
//!   must be absent — an explicit expectation, never a fallback to an
//!   unconditional put);
//! * renew: a put expecting our last sequence;
//! * release: a delete marker expecting our last sequence. Standbys behind a
//!   Choria broker cannot read that marker, so the leader also announces its
//!   sequence on a plain subject and our standbys claim the key expecting it.
//!   Go standbys cannot, and wait for the marker to expire (the bucket TTL).
//!
//! Anyone who may publish on `choria.provisioner.election.>` can forge an
//! announcement naming the leader's *current* revision, and a standby's
//! claim on it then succeeds while the leader still works. Two rules keep
//! that from giving two working leaders: a leader that hears an
//! announcement of its own key it did not send renews at once (if a
//! standby took the key, that renewal fails and the leader stops within a
//! round trip), and a standby that won on an announcement holds off
//! [`ANNOUNCED_HOLD_OFF`] before working, longer than that reaction.
//!
//! The value is the candidate's identity, as Go candidates write it, so
//! `choria election view` shows who leads.

use super::machine::{Outcome, Timings};
use super::{Backend, ElectionError};
use async_nats::HeaderMap;
use choria_config::ElectionConfig;
use futures::StreamExt;
use serde::Deserialize;
use std::time::Duration;
use tracing::{debug, info};

const EXPECTED_SEQ: &str = "Nats-Expected-Last-Subject-Sequence";
const KV_OPERATION: &str = "KV-Operation";
/// JetStream's "wrong last sequence" error code.
const ERR_WRONG_LAST_SEQUENCE: u64 = 10071;
/// Go's limits on the bucket TTL.
const MIN_TTL: Duration = Duration::from_secs(4);
const MAX_TTL: Duration = Duration::from_secs(3600);
/// How far inside the TTL the leader steps down when it cannot renew.
const SAFETY_MARGIN_SHARE: u32 = 4;
/// How long a standby that claimed the key on a release announcement
/// waits before working: a leader whose release was forged hears the same
/// announcement, renews, fails and stops within this (a round trip to the
/// broker and a pause; measured on a loaded 2-core machine at well under
/// 100 ms, see the election tier's forged-announcement test).
pub const ANNOUNCED_HOLD_OFF: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum StreamsError {
    #[error("no responder on {subject}: is JetStream enabled and the election bucket reachable (API prefix {prefix:?})?")]
    NoResponders { subject: String, prefix: String },
    #[error("NATS request to {subject} failed: {reason}")]
    Request { subject: String, reason: String },
    #[error(
        "the election bucket {bucket} does not exist (create it, or set election.create_bucket)"
    )]
    NoBucket { bucket: String },
    #[error("JetStream error on {subject}: {description} (code {code}, err_code {err_code})")]
    Api {
        subject: String,
        code: u64,
        err_code: u64,
        description: String,
    },
    #[error("the election bucket's TTL {ttl:?} is outside {min:?}..{max:?}")]
    BadTtl {
        ttl: Duration,
        min: Duration,
        max: Duration,
    },
    #[error("unexpected reply on {subject}: {reason}")]
    BadReply { subject: String, reason: String },
}

#[derive(Deserialize)]
struct ApiError {
    #[serde(default)]
    code: u64,
    #[serde(default)]
    err_code: u64,
    #[serde(default)]
    description: String,
}

#[derive(Deserialize)]
struct PubAck {
    #[serde(default)]
    seq: u64,
    error: Option<ApiError>,
}

#[derive(Deserialize)]
struct StreamInfo {
    config: Option<StreamConfig>,
    error: Option<ApiError>,
}

#[derive(Deserialize)]
struct StreamConfig {
    /// Nanoseconds.
    #[serde(default)]
    max_age: u64,
}

/// The release announcement our standbys listen for.
#[derive(serde::Serialize, Deserialize)]
struct Released {
    bucket: String,
    key: String,
    /// Sequence of the delete marker.
    revision: u64,
    identity: String,
    /// Unique per process: replicas may share an identity.
    instance: String,
}

pub struct StreamsBackend {
    nats: async_nats::Client,
    bucket: String,
    key: String,
    identity: String,
    instance: String,
    /// Prefix for JetStream API subjects, e.g. `choria.streams` or `$JS.API`.
    api_prefix: String,
    /// The key's subject as we publish to it.
    put_subject: String,
    ttl: Duration,
    last_seq: u64,
    /// A released key's marker sequence, when announced.
    vacated: Option<u64>,
    /// How the last win was had, when its previous holder may still be
    /// working (see [`Backend::settle`]).
    claimed: Claimed,
    releases: async_nats::Subscriber,
    /// Servers holding a copy of a bucket we create.
    replicas: u8,
}

/// How a win took the key over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Claimed {
    /// From nobody (absent or expired): no one can still be working.
    Free,
    /// On a release announcement, which anyone could have forged.
    Announced,
    /// On a delete marker nobody announced (`choria election evict`).
    Marker,
}

/// The plain subject releases are announced on.
pub fn release_subject(bucket: &str, key: &str) -> String {
    format!("choria.provisioner.election.{bucket}.{key}.released")
}

impl StreamsBackend {
    /// Reads the bucket's TTL (creating the bucket when `create_ttl` is set
    /// and it is missing) and subscribes to release announcements.
    pub async fn connect(
        nats: async_nats::Client,
        cfg: &ElectionConfig,
        identity: &str,
        create_ttl: Option<Duration>,
    ) -> Result<Self, StreamsError> {
        let api_prefix = if cfg.api_prefix.is_empty() {
            "$JS.API".to_string()
        } else {
            cfg.api_prefix.trim_end_matches('.').to_string()
        };
        // nats.go puts through a custom API prefix by prepending it to the
        // key's subject; with the default API the plain subject is used.
        let key_subject = format!("$KV.{}.{}", cfg.bucket, cfg.name);
        let put_subject = if api_prefix == "$JS.API" {
            key_subject
        } else {
            format!("{api_prefix}.{key_subject}")
        };
        let releases = nats
            .subscribe(release_subject(&cfg.bucket, &cfg.name))
            .await
            .map_err(|e| StreamsError::Request {
                subject: release_subject(&cfg.bucket, &cfg.name),
                reason: e.to_string(),
            })?;
        let mut backend = StreamsBackend {
            nats,
            bucket: cfg.bucket.clone(),
            key: cfg.name.clone(),
            identity: identity.to_string(),
            instance: uuid::Uuid::new_v4().simple().to_string(),
            api_prefix,
            put_subject,
            ttl: Duration::ZERO,
            last_seq: 0,
            vacated: None,
            claimed: Claimed::Free,
            releases,
            replicas: cfg.replicas.max(1),
        };
        backend.ttl = match backend.bucket_ttl().await {
            Err(StreamsError::NoBucket { .. }) if create_ttl.is_some() => {
                backend
                    .create_bucket(create_ttl.unwrap_or_default())
                    .await?;
                backend.bucket_ttl().await?
            }
            other => other?,
        };
        if !(MIN_TTL..=MAX_TTL).contains(&backend.ttl) {
            return Err(StreamsError::BadTtl {
                ttl: backend.ttl,
                min: MIN_TTL,
                max: MAX_TTL,
            });
        }
        Ok(backend)
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn request(
        &self,
        subject: String,
        headers: Option<HeaderMap>,
        body: Vec<u8>,
    ) -> Result<async_nats::Message, StreamsError> {
        let result = match headers {
            Some(h) => {
                self.nats
                    .request_with_headers(subject.clone(), h, body.into())
                    .await
            }
            None => self.nats.request(subject.clone(), body.into()).await,
        };
        result.map_err(|e| match e.kind() {
            async_nats::RequestErrorKind::NoResponders => StreamsError::NoResponders {
                subject: subject.clone(),
                prefix: self.api_prefix.clone(),
            },
            _ => StreamsError::Request {
                subject,
                reason: e.to_string(),
            },
        })
    }

    async fn bucket_ttl(&self) -> Result<Duration, StreamsError> {
        let subject = format!("{}.STREAM.INFO.KV_{}", self.api_prefix, self.bucket);
        let reply = self.request(subject.clone(), None, Vec::new()).await?;
        let info: StreamInfo = parse_reply(&subject, &reply)?;
        if let Some(e) = info.error {
            if e.code == 404 {
                return Err(StreamsError::NoBucket {
                    bucket: self.bucket.clone(),
                });
            }
            return Err(api_error(subject, e));
        }
        let max_age = info.config.map(|c| c.max_age).unwrap_or(0);
        Ok(Duration::from_nanos(max_age))
    }

    /// Creates the bucket as the Choria broker would (history 1, TTL).
    async fn create_bucket(&self, ttl: Duration) -> Result<(), StreamsError> {
        let subject = format!("{}.STREAM.CREATE.KV_{}", self.api_prefix, self.bucket);
        let config = serde_json::json!({
            "name": format!("KV_{}", self.bucket),
            "subjects": [format!("$KV.{}.>", self.bucket)],
            "retention": "limits",
            "max_consumers": -1,
            "max_msgs_per_subject": 1,
            "max_msgs": -1,
            "max_bytes": -1,
            "max_age": ttl.as_nanos() as u64,
            "max_msg_size": 1024,
            "storage": "file",
            "discard": "new",
            "num_replicas": self.replicas,
            "deny_delete": true,
            "allow_rollup_hdrs": true,
            "allow_direct": true,
        });
        let reply = self
            .request(
                subject.clone(),
                None,
                serde_json::to_vec(&config).unwrap_or_default(),
            )
            .await?;
        let info: StreamInfo = parse_reply(&subject, &reply)?;
        if let Some(e) = info.error {
            return Err(api_error(subject, e));
        }
        info!(bucket = %self.bucket, ?ttl, "created the election bucket");
        Ok(())
    }

    /// A put of our identity expecting `expected` as the key's last sequence;
    /// `Ok(None)` when that expectation failed (someone else wrote).
    async fn put(&self, expected: u64, delete: bool) -> Result<Option<u64>, StreamsError> {
        let mut headers = HeaderMap::new();
        headers.insert(EXPECTED_SEQ, expected.to_string().as_str());
        let body = if delete {
            headers.insert(KV_OPERATION, "DEL");
            Vec::new()
        } else {
            self.identity.as_bytes().to_vec()
        };
        let reply = self
            .request(self.put_subject.clone(), Some(headers), body)
            .await?;
        let ack: PubAck =
            serde_json::from_slice(&reply.payload).map_err(|e| StreamsError::BadReply {
                subject: self.put_subject.clone(),
                reason: format!("{e}: {}", String::from_utf8_lossy(&reply.payload)),
            })?;
        match ack.error {
            None if ack.seq > 0 => Ok(Some(ack.seq)),
            None => Err(StreamsError::BadReply {
                subject: self.put_subject.clone(),
                reason: "publish acknowledgement without a sequence".into(),
            }),
            Some(e) if e.err_code == ERR_WRONG_LAST_SEQUENCE => Ok(None),
            Some(e) => Err(api_error(self.put_subject.clone(), e)),
        }
    }

    /// The key's last entry when it is a delete or purge marker, read with
    /// DIRECT.GET — only reachable on a plain server, not through a Choria
    /// broker's imports (then `None`).
    async fn deleted_marker(&self) -> Option<u64> {
        let subject = format!("{}.DIRECT.GET.KV_{}", self.api_prefix, self.bucket);
        let body =
            serde_json::json!({ "last_by_subj": format!("$KV.{}.{}", self.bucket, self.key) });
        let reply = self
            .request(subject, None, serde_json::to_vec(&body).ok()?)
            .await
            .ok()?;
        let headers = reply.headers.as_ref()?;
        let op = headers.get(KV_OPERATION)?.as_str();
        if op != "DEL" && op != "PURGE" {
            return None;
        }
        headers.get("Nats-Sequence")?.as_str().parse().ok()
    }
}

fn api_error(subject: String, e: ApiError) -> StreamsError {
    StreamsError::Api {
        subject,
        code: e.code,
        err_code: e.err_code,
        description: e.description,
    }
}

impl Backend for StreamsBackend {
    fn describe(&self) -> String {
        format!("streams {}/{}", self.bucket, self.key)
    }

    fn identity(&self) -> &str {
        &self.identity
    }

    /// Renew four times per TTL; step down a quarter TTL before the record
    /// expires for the others; campaign every quarter TTL (at most 1 s).
    fn timings(&self) -> Timings {
        let quarter = self.ttl / SAFETY_MARGIN_SHARE;
        Timings {
            retry_period: quarter.min(Duration::from_secs(1)),
            renew_period: quarter.min(Duration::from_secs(2)),
            renew_deadline: self.ttl - quarter,
        }
    }

    async fn campaign(&mut self) -> Result<Outcome, ElectionError> {
        // A release we were told about lets us claim the key on its marker.
        let announced = self.vacated.take();
        if let Some(seq) = self.put(announced.unwrap_or(0), false).await? {
            self.last_seq = seq;
            self.claimed = match announced {
                Some(_) => Claimed::Announced,
                None => Claimed::Free,
            };
            return Ok(Outcome::Leading);
        }
        // The key exists. When it is a delete marker we can read, claim it
        // on the marker's sequence, as nats.go's Create does.
        if let Some(marker) = self.deleted_marker().await {
            if let Some(seq) = self.put(marker, false).await? {
                self.last_seq = seq;
                self.claimed = Claimed::Marker;
                return Ok(Outcome::Leading);
            }
        }
        Ok(Outcome::Following(None))
    }

    /// After winning on an unannounced delete marker (an eviction), the
    /// evicted leader stops at its next renewal at the latest: wait that
    /// long. After winning on an announcement, which may be forged, the
    /// leader it named challenges at once: wait [`ANNOUNCED_HOLD_OFF`].
    fn settle(&mut self) -> Duration {
        match std::mem::replace(&mut self.claimed, Claimed::Free) {
            Claimed::Free => Duration::ZERO,
            Claimed::Announced => ANNOUNCED_HOLD_OFF,
            Claimed::Marker => self.timings().renew_period + Duration::from_millis(250),
        }
    }

    async fn renew(&mut self) -> Result<Outcome, ElectionError> {
        match self.put(self.last_seq, false).await? {
            Some(seq) => {
                self.last_seq = seq;
                Ok(Outcome::Leading)
            }
            // Evicted (`choria election evict`) or expired and taken.
            None => Ok(Outcome::Following(None)),
        }
    }

    async fn release(&mut self) -> Result<(), ElectionError> {
        let Some(marker) = self.put(self.last_seq, true).await? else {
            debug!("the key changed before we released it");
            return Ok(());
        };
        let announcement = Released {
            bucket: self.bucket.clone(),
            key: self.key.clone(),
            revision: marker,
            identity: self.identity.clone(),
            instance: self.instance.clone(),
        };
        let subject = release_subject(&self.bucket, &self.key);
        self.nats
            .publish(
                subject.clone(),
                serde_json::to_vec(&announcement).unwrap_or_default().into(),
            )
            .await
            .map_err(|e| StreamsError::Request {
                subject,
                reason: e.to_string(),
            })?;
        let _ = self.nats.flush().await;
        Ok(())
    }

    async fn announcement(&mut self, leading: bool) {
        let revision = self.next_foreign_release().await;
        if leading {
            debug!(
                revision,
                ours = self.last_seq,
                "a release of our key was announced by someone else"
            );
        } else {
            self.vacated = Some(revision);
        }
    }
}

impl StreamsBackend {
    /// The revision of the next release of our key that another instance
    /// announced; pending for ever once the subscription ends.
    async fn next_foreign_release(&mut self) -> u64 {
        while let Some(msg) = self.releases.next().await {
            match serde_json::from_slice::<Released>(&msg.payload) {
                Ok(r)
                    if r.bucket == self.bucket
                        && r.key == self.key
                        && r.instance != self.instance =>
                {
                    return r.revision;
                }
                Ok(_) => {}
                Err(e) => debug!(error = %e, "ignoring a malformed release announcement"),
            }
        }
        std::future::pending::<u64>().await
    }
}

/// A JetStream API reply, decoded; an undecodable one names its subject.
fn parse_reply<T: serde::de::DeserializeOwned>(
    subject: &str,
    reply: &async_nats::Message,
) -> Result<T, StreamsError> {
    serde_json::from_slice(&reply.payload).map_err(|e| StreamsError::BadReply {
        subject: subject.to_string(),
        reason: e.to_string(),
    })
}

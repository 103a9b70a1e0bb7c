//! One instance, one identity: the identity each cloud instance was first
//! provisioned as, one sealed value per instance in a KV bucket of their own
//! (`<records.bucket>_INSTANCES`), checked before a node is signed.
//!
//! The first identity an instance is provisioned as is kept (KV `create`:
//! of two replicas binding one instance at once, one wins and the other
//! reads its value). Evidence of that instance under any other name is
//! refused: a document copied off one node buys nothing under another
//! name. Revoking the bound identity (`choria-provisioner revoke`) so stops
//! the instance too.
//!
//! A value whose seal does not verify (anyone who may write the bucket can
//! write one) binds nothing: it is counted, logged and replaced by ours, so
//! a forgery can neither take an instance nor lock it out. A key deleted by
//! such a writer is not noticed: the binding holds against the fleet, not
//! against whoever may write the records' bucket.

use crate::records::store::RecordsError;
use async_nats::jetstream::kv;
use choria_config::day_two::RecordsConfig;
use choria_wire::security::seal::{Purpose, Seal, SealKey, SealVerifier};
use serde::{Deserialize, Serialize};

/// A value larger than this is not one of ours.
const MAX_VALUE: usize = 4 * 1024;

/// The bucket the bindings of `cfg`'s records live in.
pub fn bucket(cfg: &RecordsConfig) -> String {
    format!("{}_INSTANCES", cfg.bucket)
}

/// An instance's binding, as written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// [`super::Evidence::instance`].
    pub instance: String,
    pub identity: String,
    /// When it was bound, RFC 3339 and Unix seconds.
    pub time: String,
    pub time_unix: i64,
    pub site: String,
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    binding: String,
    seal: Seal,
}

/// What binding an instance found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Bound now, to this identity.
    New,
    /// Bound before, to this identity.
    Same,
    /// Bound before to another identity, named.
    Other(String),
    /// A value that was not ours was there; replaced by ours.
    ReplacedForgery,
}

/// The bindings' bucket, open.
pub struct Bindings {
    kv: kv::Store,
    bucket: String,
    key: SealKey,
    verifier: SealVerifier,
    site: String,
}

impl Bindings {
    pub async fn connect(
        cfg: &RecordsConfig,
        key: SealKey,
        verifier: SealVerifier,
        site: &str,
        name: &str,
    ) -> Result<Self, RecordsError> {
        let bucket = bucket(cfg);
        let kv = crate::records::store::open_bucket(
            cfg,
            &bucket,
            "choria-provisioner: the identity each cloud instance is bound to",
            name,
        )
        .await?;
        Ok(Bindings {
            kv,
            bucket,
            key,
            verifier,
            site: site.to_string(),
        })
    }

    fn parts<'a>(&'a self, instance: &'a str, text: &'a str) -> [&'a [u8]; 4] {
        [
            self.bucket.as_bytes(),
            instance.as_bytes(),
            self.site.as_bytes(),
            text.as_bytes(),
        ]
    }

    fn seal(&self, b: &Binding) -> Result<Vec<u8>, String> {
        let text = serde_json::to_string(b).map_err(|e| e.to_string())?;
        let seal = self
            .key
            .seal(Purpose::InstanceBinding, &self.parts(&b.instance, &text));
        serde_json::to_vec(&Envelope {
            binding: text,
            seal,
        })
        .map_err(|e| e.to_string())
    }

    /// The binding stored under `key`, when it is ours and for it.
    pub fn open(&self, key: &str, value: &[u8]) -> Option<Binding> {
        if value.len() > MAX_VALUE {
            return None;
        }
        let e: Envelope = serde_json::from_slice(value).ok()?;
        self.verifier
            .verify(
                Some(&e.seal),
                Purpose::InstanceBinding,
                &self.parts(key, &e.binding),
            )
            .ok()?;
        let b: Binding = serde_json::from_str(&e.binding).ok()?;
        (b.instance == key && b.site == self.site).then_some(b)
    }

    /// Binds `instance` to `identity` unless it is bound already; what it
    /// found. `now` is Unix seconds.
    pub async fn bind(
        &self,
        instance: &str,
        identity: &str,
        now: i64,
    ) -> Result<Bound, RecordsError> {
        let err = |reason: String| RecordsError::Bucket {
            bucket: self.bucket.clone(),
            reason: format!("binding {instance}: {reason}"),
        };
        let ours = Binding {
            instance: instance.to_string(),
            identity: identity.to_string(),
            time: chrono::DateTime::from_timestamp(now, 0)
                .map(|t| t.to_rfc3339())
                .unwrap_or_default(),
            time_unix: now,
            site: self.site.clone(),
        };
        let body = self.seal(&ours).map_err(&err)?;
        // Two rounds: a create that lost a race reads the winner's value.
        for _ in 0..2 {
            match self
                .kv
                .entry(instance)
                .await
                .map_err(|e| err(e.to_string()))?
            {
                Some(entry) if entry.operation == kv::Operation::Put => {
                    return match self.open(instance, &entry.value) {
                        Some(b) if b.identity == identity => Ok(Bound::Same),
                        Some(b) => Ok(Bound::Other(b.identity)),
                        None => {
                            self.kv
                                .update(instance, body.clone().into(), entry.revision)
                                .await
                                .map_err(|e| err(e.to_string()))?;
                            Ok(Bound::ReplacedForgery)
                        }
                    };
                }
                _ => {
                    if self.kv.create(instance, body.clone().into()).await.is_ok() {
                        return Ok(Bound::New);
                    }
                }
            }
        }
        Err(err("the key changed under us twice".into()))
    }
}

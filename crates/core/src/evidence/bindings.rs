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
//! write one) binds nothing: it is counted, logged and ours is written
//! after it, so a forgery can neither take an instance nor lock it out.
//! The bucket is a protected one ([`crate::records::ledger`]): the
//! instance's whole history is read, so a delete marker or a flood of puts
//! after a binding unbinds nothing. A key filled by someone else before
//! any binding of ours refuses the instance (fail closed) instead of
//! binding it somewhere no reader of this key would look.

use crate::records::ledger::{Appended, Ledger, Spec};
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
    /// The instance's binding number: 1 for its first; a later one (a
    /// rebinding by its operator) is one more than the newest before it.
    #[serde(default)]
    pub n: u64,
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
    ledger: Ledger,
    key: SealKey,
    verifier: SealVerifier,
    site: String,
}

/// Values an instance's key holds: its binding and whatever else anyone
/// put there.
const HISTORY: i64 = 16;
/// How often a binding is tried again when the key changed under it.
const TRIES: usize = 5;

impl Bindings {
    pub async fn connect(
        cfg: &RecordsConfig,
        key: SealKey,
        verifier: SealVerifier,
        site: &str,
        name: &str,
    ) -> Result<Self, RecordsError> {
        let bucket = bucket(cfg);
        let spec = Spec {
            bucket: &bucket,
            description: "choria-provisioner: the identity each cloud instance is bound to",
            history: HISTORY,
            replicas: usize::from(cfg.replicas),
        };
        let ledger = Ledger::open(cfg, &spec, name, false).await?;
        Ok(Bindings {
            ledger,
            key,
            verifier,
            site: site.to_string(),
        })
    }

    fn parts<'a>(&'a self, instance: &'a str, text: &'a str) -> [&'a [u8]; 4] {
        [
            self.ledger.bucket().as_bytes(),
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

    /// The binding that holds among `entries` of one instance's key: the
    /// highest number, and of two alike the first written; and whether a
    /// value not ours was among them.
    fn holding(&self, entries: &[kv::Entry]) -> (Option<Binding>, bool) {
        let mut best: Option<Binding> = None;
        let mut foreign = false;
        for e in entries.iter().filter(|e| e.operation == kv::Operation::Put) {
            match self.open(&e.key, &e.value) {
                Some(b) if best.as_ref().is_none_or(|old| b.n > old.n) => best = Some(b),
                Some(_) => {}
                None => foreign = true,
            }
        }
        (best, foreign)
    }

    /// What binding `instance` to `identity` would find, without writing:
    /// [`Bound::New`] when nothing binds it yet.
    pub async fn check(&self, instance: &str, identity: &str) -> Result<Bound, RecordsError> {
        let (entries, _) = self.ledger.history(instance).await?;
        Ok(match self.holding(&entries).0 {
            Some(b) if b.identity == identity => Bound::Same,
            Some(b) => Bound::Other(b.identity),
            None => Bound::New,
        })
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
            bucket: self.ledger.bucket().to_string(),
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
            n: 1,
        };
        // A write is conditional on the key as read: of two replicas
        // binding one instance at once, one writes and the other reads its
        // value on the next round.
        for _ in 0..TRIES {
            let (entries, last) = self.ledger.history(instance).await?;
            let (held, foreign) = self.holding(&entries);
            match held {
                Some(b) if b.identity == identity => return Ok(Bound::Same),
                Some(b) => return Ok(Bound::Other(b.identity)),
                None => {}
            }
            match self
                .ledger
                .put(instance, Some(last), |_| self.seal(&ours))
                .await
                .map_err(&err)?
            {
                Appended::Written { .. } if foreign => return Ok(Bound::ReplacedForgery),
                Appended::Written { .. } => return Ok(Bound::New),
                Appended::Moved => continue,
                Appended::Full => {
                    return Err(err(
                        "its key is full of values that are not ours (a flood before any binding): refusing the instance rather than binding it where this key's readers would not look".into(),
                    ))
                }
            }
        }
        Err(err("the key kept changing under us".into()))
    }
}

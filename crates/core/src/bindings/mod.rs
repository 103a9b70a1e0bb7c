//! One instance, one identity — and one identity, one instance: the
//! identity each cloud instance was first provisioned as, and the instance
//! each identity was first provisioned from, one sealed value per key in
//! two KV buckets of their own (`<records.bucket>_INSTANCES`, keyed by
//! instance, and `<records.bucket>_NAMES`, keyed by identity), checked
//! before the admission policy and written after it.
//!
//! The first pairing is kept (a write is conditional on the key as read:
//! of two replicas binding at once, one wins and the other reads its
//! value). Evidence of the instance under any other name is refused (a
//! document copied off one node buys nothing under another name), and so
//! is the name from any other instance (a VM of someone else's presenting
//! valid evidence of its own under a name we gave). A name moves to a new
//! instance only when its operator rebinds it (`choria-provisioner
//! rebind`: a newer, numbered word), or, with `rebind_after_expiry`, once
//! its credentials on record have expired.
//!
//! A value whose seal does not verify (anyone who may write the bucket can
//! write one) binds nothing: it is counted, logged and ours is written
//! after it, so a forgery can neither take a key nor lock it out. The
//! buckets are protected ([`crate::records::ledger`]): a key's whole history
//! is read and its newest sealed word holds, so a delete marker or a flood
//! of puts after a binding unbinds nothing. A key filled by someone else
//! before any binding of ours refuses the node (fail closed) instead of
//! binding it somewhere no reader of this key would look.
//!
//! Everything about bindings is here: this file holds the buckets and
//! their rules; [`listed`] plans what a `Provisioner`'s `spec.bindings`
//! writes (applied by `provision::kube::lists`). The evidence gate
//! ([`crate::evidence`]) checks and writes them for each node;
//! `choria-provisioner rebind` moves a name by hand.

pub mod listed;

use crate::records::ledger::{Appended, Ledger, Spec};
use crate::records::store::RecordsError;
use async_nats::jetstream::kv;
use choria_config::day_two::RecordsConfig;
use choria_wire::security::seal::{Purpose, Seal, SealKey, SealVerifier};
use serde::{Deserialize, Serialize};

/// A value larger than this is not one of ours.
const MAX_VALUE: usize = 4 * 1024;
/// Values a key holds: its words and whatever else anyone put there.
const HISTORY: i64 = 16;
/// How often a write is tried again when the key changed under it.
const TRIES: usize = 5;

/// Which way a bucket binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Keyed by instance; binds it to an identity.
    Instances,
    /// Keyed by identity; binds it to an instance.
    Names,
}

impl Side {
    pub fn bucket(self, cfg: &RecordsConfig) -> String {
        match self {
            Side::Instances => format!("{}_INSTANCES", cfg.bucket),
            Side::Names => format!("{}_NAMES", cfg.bucket),
        }
    }

    fn description(self) -> &'static str {
        match self {
            Side::Instances => "choria-provisioner: the identity each cloud instance is bound to",
            Side::Names => "choria-provisioner: the cloud instance each identity is bound to",
        }
    }

    /// What a binding is keyed by on this side.
    fn key(self, b: &Binding) -> &str {
        match self {
            Side::Instances => &b.instance,
            Side::Names => &b.identity,
        }
    }

    /// What a binding binds its key to on this side ("": free).
    fn bound(self, b: &Binding) -> &str {
        match self {
            Side::Instances => &b.identity,
            Side::Names => &b.instance,
        }
    }
}

/// The bucket the instance bindings of `cfg`'s records live in.
pub fn bucket(cfg: &RecordsConfig) -> String {
    Side::Instances.bucket(cfg)
}

/// A binding word, as written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// [`super::Evidence::instance`]; empty in a word that frees a name.
    pub instance: String,
    pub identity: String,
    /// When, RFC 3339 and Unix seconds.
    pub time: String,
    pub time_unix: i64,
    pub site: String,
    /// The key's word number: 1 for its first binding; a later word (a
    /// rebinding) is one more than the newest before it.
    #[serde(default)]
    pub n: u64,
    /// Who wrote a rebinding, and why (empty for a node's own binding).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub by: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    binding: String,
    seal: Seal,
}

/// What binding a key found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Bound now (or free to be), to this value.
    New,
    /// Bound before, to this value.
    Same,
    /// Bound before to another value, named.
    Other(String),
    /// A value that was not ours was there; ours is written after it.
    ReplacedForgery,
}

/// One bindings bucket, open.
pub struct Bindings {
    ledger: Ledger,
    key: SealKey,
    verifier: SealVerifier,
    site: String,
    side: Side,
}

impl Bindings {
    /// The instances' bucket.
    pub async fn connect(
        cfg: &RecordsConfig,
        key: SealKey,
        verifier: SealVerifier,
        site: &str,
        name: &str,
    ) -> Result<Self, RecordsError> {
        Self::connect_side(cfg, Side::Instances, key, verifier, site, name).await
    }

    pub async fn connect_side(
        cfg: &RecordsConfig,
        side: Side,
        key: SealKey,
        verifier: SealVerifier,
        site: &str,
        name: &str,
    ) -> Result<Self, RecordsError> {
        let bucket = side.bucket(cfg);
        let spec = Spec {
            bucket: &bucket,
            description: side.description(),
            history: HISTORY,
            replicas: usize::from(cfg.replicas),
        };
        let ledger = Ledger::open(cfg, &spec, name, false).await?;
        Ok(Bindings {
            ledger,
            key,
            verifier,
            site: site.to_string(),
            side,
        })
    }

    fn parts<'a>(&'a self, key: &'a str, text: &'a str) -> [&'a [u8]; 4] {
        [
            self.ledger.bucket().as_bytes(),
            key.as_bytes(),
            self.site.as_bytes(),
            text.as_bytes(),
        ]
    }

    fn seal(&self, b: &Binding) -> Result<Vec<u8>, String> {
        let text = serde_json::to_string(b).map_err(|e| e.to_string())?;
        let seal = self.key.seal(
            Purpose::InstanceBinding,
            &self.parts(self.side.key(b), &text),
        );
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
        (self.side.key(&b) == key && b.site == self.site).then_some(b)
    }

    /// The word that holds among `entries` of one key: the highest number,
    /// and of two alike the first written; and whether a value not ours
    /// was among them.
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

    /// The word that holds for `key` now, if any (a freed key's too).
    pub async fn word(&self, key: &str) -> Result<Option<Binding>, RecordsError> {
        let (entries, _) = self.ledger.history(key).await?;
        Ok(self.holding(&entries).0)
    }

    /// What binding `key` to `value` would find, without writing:
    /// [`Bound::New`] when nothing binds it (or it was freed).
    pub async fn check(&self, key: &str, value: &str) -> Result<Bound, RecordsError> {
        Ok(match self.word(key).await? {
            Some(b) if self.side.bound(&b) == value => Bound::Same,
            Some(b) if !self.side.bound(&b).is_empty() => {
                Bound::Other(self.side.bound(&b).to_string())
            }
            _ => Bound::New,
        })
    }

    /// The binding word of `key` to `value` (who wrote it, and why, for a
    /// rebinding), numbered `n`.
    fn word_for(&self, key: &str, value: &str, n: u64, now: i64) -> Binding {
        let (instance, identity) = match self.side {
            Side::Instances => (key, value),
            Side::Names => (value, key),
        };
        Binding {
            instance: instance.to_string(),
            identity: identity.to_string(),
            time: chrono::DateTime::from_timestamp(now, 0)
                .map(|t| t.to_rfc3339())
                .unwrap_or_default(),
            time_unix: now,
            site: self.site.clone(),
            n,
            by: String::new(),
            reason: String::new(),
        }
    }

    /// Binds `key` to `value` unless it is bound already (to another
    /// value: [`Bound::Other`], nothing written); what it found. With
    /// `take`, a binding to another value is replaced by a newer word (the
    /// caller decided the key may move). `now` is Unix seconds.
    pub async fn bind(
        &self,
        key: &str,
        value: &str,
        take: bool,
        now: i64,
    ) -> Result<Bound, RecordsError> {
        let err = |reason: String| RecordsError::Bucket {
            bucket: self.ledger.bucket().to_string(),
            reason: format!("binding {key}: {reason}"),
        };
        // A write is conditional on the key as read: of two replicas
        // binding one key at once, one writes and the other reads its value
        // on the next round.
        for _ in 0..TRIES {
            let (entries, last) = self.ledger.history(key).await?;
            let (held, foreign) = self.holding(&entries);
            let n = held.as_ref().map_or(0, |b| b.n) + 1;
            match held.as_ref().map(|b| self.side.bound(b)) {
                Some(v) if v == value => return Ok(Bound::Same),
                Some(v) if !v.is_empty() && !take => return Ok(Bound::Other(v.to_string())),
                _ => {}
            }
            let ours = self.word_for(key, value, n, now);
            match self
                .ledger
                .put(key, Some(last), |_| self.seal(&ours))
                .await
                .map_err(&err)?
            {
                Appended::Written { .. } if foreign => return Ok(Bound::ReplacedForgery),
                Appended::Written { .. } => return Ok(Bound::New),
                Appended::Moved => continue,
                Appended::Full => {
                    return Err(err(
                        "its key is full of values that are not ours (a flood before any binding): refusing the node rather than binding it where this key's readers would not look".into(),
                    ))
                }
            }
        }
        Err(err("the key kept changing under us".into()))
    }

    /// An operator's word on `key`: bound to `value` from now on, or freed
    /// (`value` empty) for the next to present valid evidence. The newest
    /// word holds whatever came before it.
    pub async fn rebind(
        &self,
        key: &str,
        value: &str,
        by: &str,
        reason: &str,
        now: i64,
    ) -> Result<Binding, RecordsError> {
        let err = |reason: String| RecordsError::Bucket {
            bucket: self.ledger.bucket().to_string(),
            reason: format!("rebinding {key}: {reason}"),
        };
        for _ in 0..TRIES {
            let (entries, last) = self.ledger.history(key).await?;
            let n = self.holding(&entries).0.map_or(0, |b| b.n) + 1;
            let word = Binding {
                by: by.to_string(),
                reason: reason.to_string(),
                ..self.word_for(key, value, n, now)
            };
            // A full key takes the word under an overflow key; its readers
            // read the key itself, so that would be lost: refused instead.
            match self
                .ledger
                .put(key, Some(last), |_| self.seal(&word))
                .await
                .map_err(&err)?
            {
                Appended::Written { .. } => return Ok(word),
                Appended::Moved => continue,
                Appended::Full => return Err(err("its key is full".into())),
            }
        }
        Err(err("the key kept changing under us".into()))
    }
}

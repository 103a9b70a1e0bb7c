//! Revocations: identities the provisioner must never provision or renew
//! again, one sealed value per identity in a KV bucket of their own
//! (`<records.bucket>_REVOCATIONS`), written by `choria-provisioner revoke`
//! and lifted by `unrevoke` (a sealed value saying so: a deleted key lifts
//! nothing, as anyone who may write the bucket could delete it).
//!
//! Every replica follows the bucket into a [`Revoked`] set; only values
//! sealed with the Provisioner's key count. Until the bucket was read once,
//! the set says so ([`Revoked::is_loaded`]) and sequences wait for it: a
//! revocation must hold from a replica's first node on.
//!
//! Everything about revocations is here: this file holds a revocation,
//! the bucket's store and the [`Revoked`] set; [`follow`] is the task that
//! keeps the set current; [`listed`] plans the writes that make the bucket
//! agree with a `Provisioner`'s `spec.revocations` (applied by
//! `provision::kube::lists`). Who reads the set: each node's sequence
//! (refused while revoked), renewal (never asks a revoked node back), the
//! pods' `status.revoked`.

pub mod follow;
pub mod listed;

use crate::records::connection::RecordsError;
use crate::records::ledger::{Appended, Ledger, Spec};
use async_nats::jetstream::kv;
use choria_config::day_two::RecordsConfig;
use choria_wire::security::seal::{Purpose, Seal, SealKey, SealVerifier};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// A value larger than this is not one of ours.
const MAX_VALUE: usize = 8 * 1024;
/// Values an identity's key holds before writes go to an overflow key.
const HISTORY: i64 = 16;
/// How often a write is tried again when someone wrote the key meanwhile.
const TRIES: usize = 5;

/// One identity's revocation state, as written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    pub identity: String,
    /// `false`: lifted by `unrevoke`.
    pub revoked: bool,
    pub reason: String,
    /// When, RFC 3339, and as Unix seconds.
    pub time: String,
    pub time_unix: i64,
    /// Who wrote it (the command's user and host).
    pub by: String,
    pub site: String,
    /// This identity's word number: one more than the newest before it, so
    /// an older word put back again is told from the newest whatever the
    /// clocks of its writers said (0: written before words were numbered).
    #[serde(default)]
    pub n: u64,
}

impl Revocation {
    /// Whether `self` is a later word on its identity than `other`: a
    /// higher number, then a later time; of two words alike, the one that
    /// revokes (two writers at once: the safe one holds).
    pub fn supersedes(&self, other: &Revocation) -> bool {
        (self.n, self.time_unix, self.revoked) > (other.n, other.time_unix, other.revoked)
    }
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    revocation: String,
    seal: Seal,
}

/// The bucket revocations of `cfg`'s records live in.
pub fn bucket(cfg: &RecordsConfig) -> String {
    format!("{}_REVOCATIONS", cfg.bucket)
}

/// Where a write on an identity must follow: the revision of its key and
/// the newest word's number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct At {
    pub revision: u64,
    pub n: u64,
}

/// The revocations' bucket, open, sealing with `key` for `site`.
pub struct RevocationStore {
    ledger: Ledger,
    key: SealKey,
    verifier: SealVerifier,
    site: String,
}

impl RevocationStore {
    /// Opens the bucket to write it (creating or protecting it when
    /// `records.create_bucket` allows).
    pub async fn connect(
        cfg: &RecordsConfig,
        key: SealKey,
        verifier: SealVerifier,
        site: &str,
        name: &str,
    ) -> Result<Self, RecordsError> {
        Self::open_bucket(cfg, key, verifier, site, name, false).await
    }

    /// Opens the bucket to read it only (`nodes`).
    pub async fn connect_read_only(
        cfg: &RecordsConfig,
        key: SealKey,
        verifier: SealVerifier,
        site: &str,
        name: &str,
    ) -> Result<Self, RecordsError> {
        Self::open_bucket(cfg, key, verifier, site, name, true).await
    }

    async fn open_bucket(
        cfg: &RecordsConfig,
        key: SealKey,
        verifier: SealVerifier,
        site: &str,
        name: &str,
        read_only: bool,
    ) -> Result<Self, RecordsError> {
        let bucket = bucket(cfg);
        let spec = Spec {
            bucket: &bucket,
            description: "choria-provisioner: revoked identities",
            history: HISTORY,
            replicas: usize::from(cfg.replicas),
        };
        let ledger = Ledger::open(cfg, &spec, name, read_only).await?;
        Ok(RevocationStore {
            ledger,
            key,
            verifier,
            site: site.to_string(),
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

    /// `r` sealed, as stored under `key`.
    fn sealed(&self, r: &Revocation, key: &str) -> Result<Vec<u8>, String> {
        let text = serde_json::to_string(r).map_err(|e| e.to_string())?;
        let seal = self.key.seal(Purpose::Revocation, &self.parts(key, &text));
        serde_json::to_vec(&Envelope {
            revocation: text,
            seal,
        })
        .map_err(|e| e.to_string())
    }

    /// Writes `r`, sealed, as the next word on its identity (retried when
    /// someone wrote the key meanwhile).
    pub async fn put(&self, r: &Revocation) -> Result<(), RecordsError> {
        for _ in 0..TRIES {
            let (_, at) = self.current(&r.identity).await?;
            if self.put_at(r, at).await?.is_some() {
                return Ok(());
            }
        }
        Err(put_error(r, "the key kept changing under the write".into()))
    }

    /// `identity`'s verified word now (`None`: none verifies) and where a
    /// write after it must follow. Every value of its key and its overflow
    /// keys is read: a delete, a foreign value or an old word put back
    /// again is not the newest.
    pub async fn current(&self, identity: &str) -> Result<(Option<Revocation>, At), RecordsError> {
        let mut newest: Option<Revocation> = None;
        let mut at = At::default();
        for e in self.ledger.entries().await? {
            if !crate::records::keys::is_key_of(identity, &e.key) {
                continue;
            }
            if e.key == identity {
                at.revision = e.revision;
            }
            if e.operation != kv::Operation::Put {
                continue;
            }
            if let Some(r) = self
                .open(&e.key, &e.value)
                .filter(|r| r.identity == identity)
            {
                at.n = at.n.max(r.n);
                if newest.as_ref().is_none_or(|old| r.supersedes(old)) {
                    newest = Some(r);
                }
            }
        }
        Ok((newest, at))
    }

    /// Writes `r` as the word after `at` only when its key is still at
    /// `at.revision` (0: no value): the word as written, or `None` when
    /// someone wrote the key since.
    pub async fn put_at(&self, r: &Revocation, at: At) -> Result<Option<Revocation>, RecordsError> {
        let r = Revocation {
            n: at.n + 1,
            ..r.clone()
        };
        match self
            .ledger
            .append(&r.identity, Some(at.revision), |key| self.sealed(&r, key))
            .await
            .map_err(|e| put_error(&r, e))?
        {
            Appended::Written { .. } => Ok(Some(r)),
            Appended::Moved | Appended::Full => Ok(None),
        }
    }

    /// The revocation stored under `key`, when it is ours and for it.
    pub fn open(&self, key: &str, value: &[u8]) -> Option<Revocation> {
        if value.len() > MAX_VALUE {
            return None;
        }
        let e: Envelope = serde_json::from_slice(value).ok()?;
        self.verifier
            .verify(
                Some(&e.seal),
                Purpose::Revocation,
                &self.parts(key, &e.revocation),
            )
            .ok()?;
        let r: Revocation = serde_json::from_str(&e.revocation).ok()?;
        (crate::records::keys::is_key_of(&r.identity, key) && r.site == self.site).then_some(r)
    }

    /// Every identity revoked now (verified values only, the newest word
    /// of each).
    pub async fn revoked(&self) -> Result<Vec<Revocation>, RecordsError> {
        let set = Revoked::default();
        for e in self.ledger.entries().await? {
            if e.operation == kv::Operation::Put {
                if let Some(r) = self.open(&e.key, &e.value) {
                    set.set(r);
                }
            }
        }
        let mut out: Vec<Revocation> = set.all().into_values().filter(|r| r.revoked).collect();
        out.sort_by(|a, b| a.identity.cmp(&b.identity));
        Ok(out)
    }

    /// Every value stored, oldest first, then each new one, into `into`
    /// (the newest word of each identity holds); values that do not verify
    /// are counted in `refused` and change nothing, nor do delete markers.
    /// `into` is marked read once the follow reached the present.
    pub async fn follow(
        &self,
        into: &Revoked,
        refused: impl Fn(),
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<(), RecordsError> {
        let mut follow = self.ledger.follow().await?;
        if follow.current {
            into.set_loaded();
        }
        loop {
            let entry = tokio::select! {
                e = follow.next() => e,
                _ = stop.cancelled() => return Ok(()),
            };
            let Some(entry) = entry else {
                return Err(RecordsError::Read("the revocations' watch ended".into()));
            };
            let entry = entry?;
            if entry.operation == kv::Operation::Put {
                match self.open(&entry.key, &entry.value) {
                    Some(r) => into.set(r),
                    None => refused(),
                }
            }
            if entry.delta == 0 {
                into.set_loaded();
            }
        }
    }
}

fn put_error(r: &Revocation, reason: String) -> RecordsError {
    RecordsError::Put {
        identity: r.identity.clone(),
        reason,
    }
}

/// The identities revoked now, as every replica knows them.
#[derive(Clone, Default)]
pub struct Revoked {
    inner: Arc<RwLock<State>>,
    loaded: Arc<tokio::sync::Notify>,
}

#[derive(Default)]
struct State {
    by_identity: HashMap<String, Revocation>,
    /// What the `Provisioner` resource lists (`spec.revocations`), by
    /// identity, with its reason: revoked from the moment the pod reads
    /// the list, before its sealed revocation is written and read back.
    listed: HashMap<String, String>,
    loaded: bool,
}

impl Revoked {
    /// Whether the bucket was read to its end once.
    pub fn is_loaded(&self) -> bool {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).loaded
    }

    /// Marks the revocations as read (also: there is no bucket to read).
    pub fn set_loaded(&self) {
        self.inner.write().unwrap_or_else(|e| e.into_inner()).loaded = true;
        self.loaded.notify_waiters();
    }

    /// Marks the revocations as not known now (a read failed): sequences
    /// wait for them again rather than take what was read as all there is.
    pub fn set_unknown(&self) {
        self.inner.write().unwrap_or_else(|e| e.into_inner()).loaded = false;
    }

    /// Waits until [`Revoked::is_loaded`] (or `limit` passed); whether it is.
    pub async fn wait_loaded(&self, limit: std::time::Duration) -> bool {
        let notified = self.loaded.notified();
        if self.is_loaded() {
            return true;
        }
        let _ = tokio::time::timeout(limit, notified).await;
        self.is_loaded()
    }

    /// Takes a newer revocation (or its lifting) of its identity.
    pub fn set(&self, r: Revocation) {
        let mut s = self.inner.write().unwrap_or_else(|e| e.into_inner());
        match s.by_identity.get(&r.identity) {
            Some(old) if !r.supersedes(old) => {}
            _ => {
                s.by_identity.insert(r.identity.clone(), r);
            }
        }
    }

    /// Takes the resource's list (identity, reason) in place of the last.
    pub fn set_listed(&self, listed: impl IntoIterator<Item = (String, String)>) {
        let mut s = self.inner.write().unwrap_or_else(|e| e.into_inner());
        s.listed = listed.into_iter().collect();
    }

    /// The revocation of `identity`, if it is revoked now (in the bucket,
    /// or listed by the resource).
    pub fn of(&self, identity: &str) -> Option<Revocation> {
        let s = self.inner.read().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = s.by_identity.get(identity).filter(|r| r.revoked) {
            return Some(r.clone());
        }
        s.listed.get(identity).map(|reason| Revocation {
            identity: identity.to_string(),
            revoked: true,
            reason: reason.clone(),
            time: String::new(),
            time_unix: 0,
            by: "spec.revocations".into(),
            site: String::new(),
            n: 0,
        })
    }

    /// Every identity's latest value, lifted ones too.
    pub fn all(&self) -> HashMap<String, Revocation> {
        let s = self.inner.read().unwrap_or_else(|e| e.into_inner());
        s.by_identity.clone()
    }

    /// How many identities are revoked now (in the bucket, or listed).
    pub fn count(&self) -> usize {
        let s = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let stored = s.by_identity.values().filter(|r| r.revoked).count();
        let listed_only = s
            .listed
            .keys()
            .filter(|i| !s.by_identity.get(*i).is_some_and(|r| r.revoked))
            .count();
        stored + listed_only
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(identity: &str, revoked: bool, t: i64) -> Revocation {
        Revocation {
            identity: identity.into(),
            revoked,
            reason: "stolen".into(),
            time: String::new(),
            time_unix: t,
            by: "admin".into(),
            site: "s".into(),
            n: 0,
        }
    }

    #[test]
    fn a_listed_identity_is_revoked_before_its_revocation_is_read_back() {
        let set = Revoked::default();
        set.set_listed([("n1".to_string(), "stolen".to_string())]);
        assert_eq!(set.of("n1").map(|r| r.reason), Some("stolen".into()));
        assert_eq!(set.count(), 1);
        set.set(r("n1", true, 5));
        assert_eq!(set.count(), 1, "counted once when both say so");
        set.set_listed([]);
        assert!(set.of("n1").is_some(), "the stored revocation holds");
        set.set(r("n1", false, 6));
        assert_eq!((set.of("n1"), set.count()), (None, 0));
    }

    #[test]
    fn the_newest_word_on_an_identity_holds() {
        let set = Revoked::default();
        set.set(r("n1", true, 10));
        assert_eq!(set.of("n1").unwrap().reason, "stolen");
        assert_eq!(set.count(), 1);
        // An older lifting (a replayed revision) changes nothing.
        set.set(r("n1", false, 5));
        assert!(set.of("n1").is_some());
        set.set(r("n1", false, 20));
        assert!(set.of("n1").is_none());
        assert_eq!(set.count(), 0);
    }

    #[tokio::test]
    async fn waiting_for_the_first_read_ends_when_it_is_done() {
        let set = Revoked::default();
        assert!(!set.wait_loaded(std::time::Duration::from_millis(20)).await);
        let s2 = set.clone();
        let waiter =
            tokio::spawn(async move { s2.wait_loaded(std::time::Duration::from_secs(10)).await });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        set.set_loaded();
        assert!(waiter.await.unwrap());
    }
}

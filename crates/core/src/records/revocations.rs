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

use super::store::RecordsError;
use async_nats::jetstream::kv;
use choria_config::day_two::RecordsConfig;
use choria_wire::security::seal::{Purpose, Seal, SealKey, SealVerifier};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// A value larger than this is not one of ours.
const MAX_VALUE: usize = 8 * 1024;

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

/// The revocations' bucket, open, sealing with `key` for `site`.
pub struct RevocationStore {
    kv: kv::Store,
    bucket: String,
    key: SealKey,
    verifier: SealVerifier,
    site: String,
}

impl RevocationStore {
    pub async fn connect(
        cfg: &RecordsConfig,
        key: SealKey,
        verifier: SealVerifier,
        site: &str,
        name: &str,
    ) -> Result<Self, RecordsError> {
        let bucket = bucket(cfg);
        let kv =
            super::store::open_bucket(cfg, &bucket, "choria-provisioner: revoked identities", name)
                .await?;
        Ok(RevocationStore {
            kv,
            bucket,
            key,
            verifier,
            site: site.to_string(),
        })
    }

    fn parts<'a>(&'a self, identity: &'a str, text: &'a str) -> [&'a [u8]; 4] {
        [
            self.bucket.as_bytes(),
            identity.as_bytes(),
            self.site.as_bytes(),
            text.as_bytes(),
        ]
    }

    /// `r` sealed, as stored.
    fn sealed(&self, r: &Revocation) -> Result<Vec<u8>, RecordsError> {
        let text = serde_json::to_string(r).map_err(|e| put_error(r, e.to_string()))?;
        let seal = self
            .key
            .seal(Purpose::Revocation, &self.parts(&r.identity, &text));
        serde_json::to_vec(&Envelope {
            revocation: text,
            seal,
        })
        .map_err(|e| put_error(r, e.to_string()))
    }

    /// Writes `r`, sealed, under its identity.
    pub async fn put(&self, r: &Revocation) -> Result<(), RecordsError> {
        let body = self.sealed(r)?;
        self.kv
            .put(&r.identity, body.into())
            .await
            .map_err(|e| put_error(r, e.to_string()))?;
        Ok(())
    }

    /// `identity`'s verified value now (`None`: none, or one that does not
    /// verify) and the revision a write after it must follow (0: no key).
    pub async fn current(&self, identity: &str) -> Result<(Option<Revocation>, u64), RecordsError> {
        let entry = self
            .kv
            .entry(identity)
            .await
            .map_err(|e| RecordsError::Read(e.to_string()))?;
        Ok(match entry {
            Some(e) if e.operation == kv::Operation::Put => {
                (self.open(identity, &e.value), e.revision)
            }
            Some(e) => (None, e.revision),
            None => (None, 0),
        })
    }

    /// Writes `r` only when its key is still at `revision` (0: no key):
    /// `false` when someone wrote it since.
    pub async fn put_at(&self, r: &Revocation, revision: u64) -> Result<bool, RecordsError> {
        let body = self.sealed(r)?;
        // Someone wrote the key since we read it: not an error, a skip.
        let result = if revision == 0 {
            match self.kv.create(&r.identity, body.into()).await {
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => return Ok(false),
                other => other.map(|_| ()).map_err(|e| e.to_string()),
            }
        } else {
            match self.kv.update(&r.identity, body.into(), revision).await {
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => return Ok(false),
                other => other.map(|_| ()).map_err(|e| e.to_string()),
            }
        };
        result.map(|()| true).map_err(|e| put_error(r, e))
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
        (r.identity == key && r.site == self.site).then_some(r)
    }

    /// Every identity revoked now (verified values only).
    pub async fn revoked(&self) -> Result<Vec<Revocation>, RecordsError> {
        let read = |e: &dyn std::fmt::Display| RecordsError::Read(e.to_string());
        let mut keys = self.kv.keys().await.map_err(|e| read(&e))?;
        let mut out = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| read(&e))?;
            if let Some(bytes) = self.kv.get(&key).await.map_err(|e| read(&e))? {
                out.extend(self.open(&key, &bytes).filter(|r| r.revoked));
            }
        }
        Ok(out)
    }

    /// Every verified value now, then each new one, into `into`; values
    /// that do not verify are counted in `refused` and change nothing.
    pub async fn follow(
        &self,
        into: &Revoked,
        refused: impl Fn(),
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<(), RecordsError> {
        let mut watch = self
            .kv
            .watch_with_history(">")
            .await
            .map_err(|e| RecordsError::Read(e.to_string()))?;
        // The watch delivers what is stored first; `pending` counts down to
        // the present.
        let mut loaded = false;
        if self
            .kv
            .status()
            .await
            .map(|s| s.values() == 0)
            .unwrap_or(false)
        {
            into.set_loaded();
            loaded = true;
        }
        loop {
            let entry = tokio::select! {
                e = watch.next() => e,
                _ = stop.cancelled() => return Ok(()),
            };
            let Some(entry) = entry else {
                return Err(RecordsError::Read("the revocations' watch ended".into()));
            };
            let entry = entry.map_err(|e| RecordsError::Read(e.to_string()))?;
            if entry.operation == kv::Operation::Put {
                match self.open(&entry.key, &entry.value) {
                    Some(r) => into.set(r),
                    None => refused(),
                }
            }
            if !loaded && entry.delta == 0 {
                into.set_loaded();
                loaded = true;
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
            Some(old) if old.time_unix > r.time_unix => {}
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

//! The records' KV bucket, reached through a connection of its own. What
//! goes in is sealed and what comes out is opened ([`super::sealed`]).

pub use super::connection::{connect, seal_keys, sealer, RecordsError};
use super::sealed::{Read, Refusal, Sealer};
use super::Record;
use async_nats::jetstream::kv;
use choria_config::day_two::RecordsConfig;

/// The bucket, open.
#[derive(Clone)]
pub struct RecordStore {
    ledger: super::ledger::Ledger,
    sealer: Sealer,
}

/// The records' bucket as the ledger makes it.
pub fn spec(cfg: &RecordsConfig) -> super::ledger::Spec<'_> {
    super::ledger::Spec {
        bucket: &cfg.bucket,
        description: "choria-provisioner: one record per provisioned node",
        history: i64::from(cfg.history),
        replicas: usize::from(cfg.replicas),
    }
}

impl RecordStore {
    /// Connects and opens the bucket (creating or protecting it when
    /// allowed); records are sealed and opened with `sealer`.
    pub async fn connect(
        cfg: &RecordsConfig,
        sealer: Sealer,
        name: &str,
    ) -> Result<Self, RecordsError> {
        Self::open(cfg, sealer, name, false).await
    }

    /// Opens the bucket to read it (`nodes`): never creates or changes it,
    /// and reads one that is not protected, with a warning.
    pub async fn connect_read_only(
        cfg: &RecordsConfig,
        sealer: Sealer,
        name: &str,
    ) -> Result<Self, RecordsError> {
        Self::open(cfg, sealer, name, true).await
    }

    async fn open(
        cfg: &RecordsConfig,
        sealer: Sealer,
        name: &str,
        read_only: bool,
    ) -> Result<Self, RecordsError> {
        let ledger = super::ledger::Ledger::open(cfg, &spec(cfg), name, read_only).await?;
        Ok(RecordStore { ledger, sealer })
    }

    pub fn bucket(&self) -> &str {
        self.ledger.bucket()
    }

    /// Whether anything was ever written under `identity`'s key. A record
    /// goes under an overflow key only when the key itself is full, so a
    /// key with no values has no record anywhere.
    pub async fn ever_written(&self, identity: &str) -> Result<bool, RecordsError> {
        Ok(!self.ledger.history(identity).await?.0.is_empty())
    }

    /// Writes `record`, sealed, under its node's key (or an overflow key of
    /// it when that key holds all it may); its revision.
    pub async fn put(&self, record: &Record) -> Result<u64, RecordsError> {
        let put = |reason: String| RecordsError::Put {
            identity: record.identity.clone(),
            reason,
        };
        match self
            .ledger
            .append(&record.identity, None, |key| {
                self.sealer.seal_at(record, key).map_err(|e| e.to_string())
            })
            .await
            .map_err(put)?
        {
            super::ledger::Appended::Written { revision, .. } => Ok(revision),
            // Not asked for a revision, so never moved; append overflows.
            super::ledger::Appended::Moved | super::ledger::Appended::Full => {
                Err(put("the key moved".into()))
            }
        }
    }

    /// Every node's newest verified record (or, for a node with none, the
    /// last value refused), by identity: read from every value the bucket
    /// holds, so a delete, a foreign value or an old value put back again
    /// hides nothing and brings nothing back.
    pub async fn all(&self) -> Result<Vec<Read>, RecordsError> {
        let mut newest = Newest::default();
        self.ledger.each(|e| newest.take(self.read(e))).await?;
        Ok(newest.into_reads())
    }

    fn read(&self, e: kv::Entry) -> Read {
        match e.operation {
            kv::Operation::Put => self.sealer.open(&e.key, &e.value),
            kv::Operation::Delete | kv::Operation::Purge => Read::Refused {
                key: e.key,
                why: Refusal::Deleted,
                record: None,
            },
        }
    }

    /// Every value the bucket holds, oldest first, then every new one, as
    /// they are written (by any replica, or anyone else who may write the
    /// bucket), opened; a delete marker is a [`Refusal::Deleted`]. Readers
    /// keep the newest verified record of each node.
    pub async fn watch(
        &self,
    ) -> Result<impl futures::Stream<Item = Read> + Send + Unpin + 'static, RecordsError> {
        let follow = self.ledger.follow().await?;
        let store = self.clone();
        Ok(Box::pin(futures::stream::unfold(
            (follow, store),
            |(mut follow, store)| async move {
                loop {
                    match follow.next().await {
                        Some(Ok(e)) => return Some((store.read(e), (follow, store))),
                        // A message that could not be read is skipped, as
                        // the watch goes on past it.
                        Some(Err(_)) => continue,
                        None => return None,
                    }
                }
            },
        )))
    }
}

/// The newest verified record of each node among values read in stream
/// order, and the last refusal of a key with none.
#[derive(Default)]
struct Newest {
    verified: std::collections::HashMap<String, Record>,
    refused: std::collections::HashMap<String, Read>,
}

impl Newest {
    fn take(&mut self, read: Read) {
        match read {
            Read::Verified(r) => {
                let newer = self
                    .verified
                    .get(&r.identity)
                    .is_none_or(|old| old.time_unix <= r.time_unix);
                if newer {
                    self.verified.insert(r.identity.clone(), *r);
                }
            }
            Read::Refused { ref key, .. } => {
                self.refused.insert(key.clone(), read);
            }
        }
    }

    fn into_reads(mut self) -> Vec<Read> {
        let mut out: Vec<Read> = Vec::new();
        for (_, r) in self.verified.drain() {
            self.refused
                .retain(|k, _| !super::keys::is_key_of(&r.identity, k));
            out.push(Read::Verified(Box::new(r)));
        }
        out.extend(self.refused.into_values());
        out.sort_by(|a, b| a.key().cmp(b.key()));
        out
    }
}

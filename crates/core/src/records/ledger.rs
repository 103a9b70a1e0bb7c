//! The buckets the provisioner remembers in — records, revocations,
//! instance bindings — made so that no other writer of the bus can erase or
//! roll back what it wrote.
//!
//! Each is a KV bucket (any KV client reads it) whose stream refuses what
//! would erase a value, settings a stream update cannot take back once set:
//!
//! - `deny_delete`: no message is deleted through the JetStream API;
//! - `deny_purge` and `allow_rollup_hdrs: false`: no purge of the stream,
//!   and no KV purge (a purge is a roll-up: it would drop a key's history);
//! - `discard: new` with `discard_new_per_subject`: a key holds at most its
//!   history; a put past that is refused instead of pushing the oldest value
//!   out, so no number of puts rolls one of ours out of the key.
//!
//! A KV delete is only a marker put after the values: readers read a key's
//! whole history and take the newest value *sealed by us* by the value's
//! own order (each kind says which), so a delete marker, a value that is not
//! ours and an old value of ours put back again change nothing.
//!
//! A key already holding all it may (ours over time, or someone's flood) is
//! not a dead end: the value goes under an overflow key, the key followed by
//! `.` and 16 random hex digits, which no one can fill before it exists.
//! The seal covers the key it was written under, and readers accept a value
//! under its own key or an overflow key of it.

use super::connection::RecordsError;
pub use super::keys::{is_key_of, overflow_key};
use async_nats::jetstream::{self, kv, stream};
use choria_config::day_two::RecordsConfig;
use futures::StreamExt;
use std::time::Duration;
use tracing::{info, warn};

/// How often a write is tried again when the key changed under it.
const CONDITIONAL_TRIES: usize = 5;

/// What a bucket is for and how much of each key's history it keeps.
pub struct Spec<'a> {
    pub bucket: &'a str,
    pub description: &'a str,
    /// Values a key holds before writes go to an overflow key.
    pub history: i64,
    /// Servers holding a copy (`records.replicas`).
    pub replicas: usize,
}

/// The stream a protected bucket is made of.
pub fn stream_config(spec: &Spec) -> stream::Config {
    stream::Config {
        name: format!("KV_{}", spec.bucket),
        description: Some(spec.description.to_string()),
        subjects: vec![format!("$KV.{}.>", spec.bucket)],
        max_messages_per_subject: spec.history,
        discard: stream::DiscardPolicy::New,
        discard_new_per_subject: true,
        deny_delete: true,
        deny_purge: true,
        allow_rollup: false,
        allow_direct: true,
        storage: stream::StorageType::File,
        num_replicas: spec.replicas.max(1),
        ..Default::default()
    }
}

/// The protections `have` lacks, by their stream setting.
pub fn missing_protection(have: &stream::Config) -> Vec<&'static str> {
    let mut missing = Vec::new();
    if !have.deny_delete {
        missing.push("deny_delete: true");
    }
    if !have.deny_purge {
        missing.push("deny_purge: true");
    }
    if have.allow_rollup {
        missing.push("allow_rollup_hdrs: false");
    }
    if have.discard != stream::DiscardPolicy::New || !have.discard_new_per_subject {
        missing.push("discard: new with discard_new_per_subject: true");
    }
    if have.max_age > Duration::ZERO {
        missing.push("max_age: 0 (values must not expire)");
    }
    missing
}

/// `have` with the protections added (what an existing bucket is updated
/// to); everything else, its history and replicas included, kept.
pub fn protected(have: &stream::Config) -> stream::Config {
    stream::Config {
        deny_delete: true,
        deny_purge: true,
        allow_rollup: false,
        discard: stream::DiscardPolicy::New,
        discard_new_per_subject: true,
        max_age: Duration::ZERO,
        ..have.clone()
    }
}

/// One protected bucket, open.
#[derive(Clone)]
pub struct Ledger {
    js: jetstream::Context,
    kv: kv::Store,
    bucket: String,
}

/// How a conditional write ended.
#[derive(Debug)]
pub enum Appended {
    /// Written under `key` at `revision`.
    Written { key: String, revision: u64 },
    /// The key moved on from the revision the write expected.
    Moved,
    /// The key holds all the values it may ([`Ledger::put`] only).
    Full,
}

impl Ledger {
    /// Opens `spec`'s bucket over `cfg`'s connection: makes it when it is
    /// missing and `records.create_bucket` allows, and protects one that an
    /// earlier version made (with `create_bucket`; otherwise says exactly
    /// what to change and refuses it, unless `read_only`).
    pub async fn open(
        cfg: &RecordsConfig,
        spec: &Spec<'_>,
        name: &str,
        read_only: bool,
    ) -> Result<Self, RecordsError> {
        let nats = super::connection::connect(cfg, name).await?;
        let js = jetstream::new(nats);
        Self::open_with(js, cfg.create_bucket && !read_only, spec, read_only).await
    }

    /// [`Ledger::open`] on a JetStream context already made.
    pub async fn open_with(
        js: jetstream::Context,
        create: bool,
        spec: &Spec<'_>,
        read_only: bool,
    ) -> Result<Self, RecordsError> {
        let bucket = spec.bucket.to_string();
        let err = |reason: String| RecordsError::Bucket {
            bucket: bucket.clone(),
            reason,
        };
        let stream_name = format!("KV_{bucket}");
        match js.get_stream(&stream_name).await {
            Ok(mut s) => {
                let have = s
                    .info()
                    .await
                    .map_err(|e| err(e.to_string()))?
                    .config
                    .clone();
                let missing = missing_protection(&have);
                if !missing.is_empty() {
                    if create {
                        js.update_stream(protected(&have)).await.map_err(|e| {
                            err(format!("protecting it ({}): {e}", missing.join(", ")))
                        })?;
                        info!(bucket = %bucket, added = %missing.join(", "), "protected the bucket an earlier version made: nobody can erase or roll back its values now");
                    } else if read_only {
                        warn!(bucket = %bucket, missing = %missing.join(", "), "the bucket is not protected: anyone who may write it can erase what it holds");
                    } else {
                        return Err(RecordsError::Unprotected {
                            bucket: bucket.clone(),
                            missing: missing.join(", "),
                        });
                    }
                }
            }
            Err(e) if is_not_found(&e) => {
                if !create {
                    return Err(RecordsError::Missing { bucket });
                }
                js.create_stream(stream_config(spec))
                    .await
                    .map_err(|c| err(format!("not found and not created ({c})")))?;
            }
            Err(e) => return Err(err(e.to_string())),
        }
        let kv = js
            .get_key_value(&bucket)
            .await
            .map_err(|e| err(e.to_string()))?;
        Ok(Ledger { js, kv, bucket })
    }

    /// Opens a bucket that exists, as it is (to look at it).
    pub async fn existing(
        cfg: &RecordsConfig,
        bucket: &str,
        name: &str,
    ) -> Result<Self, RecordsError> {
        let nats = super::connection::connect(cfg, name).await?;
        let js = jetstream::new(nats);
        let kv = js
            .get_key_value(bucket)
            .await
            .map_err(|e| RecordsError::Bucket {
                bucket: bucket.to_string(),
                reason: e.to_string(),
            })?;
        Ok(Ledger {
            js,
            kv,
            bucket: bucket.to_string(),
        })
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn kv(&self) -> &kv::Store {
        &self.kv
    }

    fn subject(&self, key: &str) -> String {
        format!("$KV.{}.{key}", self.bucket)
    }

    /// Writes `value(key)` under `natural`, or under a fresh overflow key
    /// of it when `natural` holds all it may. `expect`: the revision
    /// `natural` must still be at (0: no value yet), checked only there.
    pub async fn append(
        &self,
        natural: &str,
        expect: Option<u64>,
        value: impl Fn(&str) -> Result<Vec<u8>, String>,
    ) -> Result<Appended, String> {
        match self.put(natural, expect, &value).await? {
            Appended::Full => {}
            other => return Ok(other),
        }
        // Full: of our own values over time, or of someone's flood. An
        // overflow key is new, so no one filled it.
        for _ in 0..CONDITIONAL_TRIES {
            let key = overflow_key(natural);
            match self.put(&key, None, &value).await? {
                Appended::Full | Appended::Moved => continue,
                written => return Ok(written),
            }
        }
        Err(format!("{natural}: every overflow key tried was full"))
    }

    /// Writes `value(key)` under `key` itself: [`Appended::Full`] when it
    /// holds all it may.
    pub async fn put(
        &self,
        key: &str,
        expect: Option<u64>,
        value: impl Fn(&str) -> Result<Vec<u8>, String>,
    ) -> Result<Appended, String> {
        match self.publish(key, value(key)?, expect).await {
            Err(Publish::Full) => Ok(Appended::Full),
            Err(Publish::Moved) => Ok(Appended::Moved),
            Err(Publish::Failed(e)) => Err(e),
            Ok(revision) => Ok(Appended::Written {
                key: key.to_string(),
                revision,
            }),
        }
    }

    async fn publish(
        &self,
        key: &str,
        value: Vec<u8>,
        expect: Option<u64>,
    ) -> Result<u64, Publish> {
        let mut msg = jetstream::message::PublishMessage::build().payload(value.into());
        if let Some(revision) = expect {
            msg = msg.expected_last_subject_sequence(revision);
        }
        let ack = self
            .js
            .send_publish(self.subject(key), msg)
            .await
            .map_err(|e| Publish::Failed(e.to_string()))?
            .await;
        match ack {
            Ok(ack) => Ok(ack.sequence),
            Err(e) if e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence => {
                Err(Publish::Moved)
            }
            Err(e) if error_code(&e) == Some(MAX_PER_SUBJECT) => Err(Publish::Full),
            Err(e) => Err(Publish::Failed(e.to_string())),
        }
    }

    /// The history of `natural` itself (not its overflow keys): every
    /// entry, oldest first, and the revision a conditional write follows.
    pub async fn history(&self, natural: &str) -> Result<(Vec<kv::Entry>, u64), RecordsError> {
        let read = |e: &dyn std::fmt::Display| RecordsError::Read(e.to_string());
        let mut h = self.kv.history(natural).await.map_err(|e| read(&e))?;
        let mut out = Vec::new();
        while let Some(e) = h.next().await {
            out.push(e.map_err(|e| read(&e))?);
        }
        let last = out.last().map_or(0, |e| e.revision);
        Ok((out, last))
    }

    /// The stream as it is now; `None` when it is not there at all.
    pub async fn view(&self) -> Result<Option<View>, RecordsError> {
        let read = |e: &dyn std::fmt::Display| RecordsError::Read(e.to_string());
        let mut stream = match self.js.get_stream(format!("KV_{}", self.bucket)).await {
            Ok(s) => s,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(read(&e)),
        };
        let info = stream.info().await.map_err(|e| read(&e))?.clone();
        Ok(Some(View {
            created: info.created.unix_timestamp_nanos(),
            messages: info.state.messages,
            first_sequence: info.state.first_sequence,
            history: info.config.max_messages_per_subject,
            missing: missing_protection(&info.config),
        }))
    }

    /// Every entry the bucket holds, oldest first, read to its end.
    pub async fn entries(&self) -> Result<Vec<kv::Entry>, RecordsError> {
        let mut out = Vec::new();
        self.each(|e| out.push(e)).await?;
        Ok(out)
    }

    /// Every entry the bucket holds, oldest first, handed to `take` as it
    /// is read (a large bucket is never held whole), to its end.
    pub async fn each(&self, mut take: impl FnMut(kv::Entry)) -> Result<(), RecordsError> {
        let mut follow = self.follow().await?;
        if follow.current {
            return Ok(());
        }
        while let Some(e) = follow.next().await {
            let e = e?;
            let current = e.delta == 0;
            take(e);
            if current {
                break;
            }
        }
        Ok(())
    }

    /// Every entry the bucket holds, oldest first, then each new one.
    /// `current` is set when there was nothing to read.
    pub async fn follow(&self) -> Result<Follow, RecordsError> {
        let read = |e: &dyn std::fmt::Display| RecordsError::Read(e.to_string());
        // Asked now: the KV's own status is what the stream held when the
        // bucket was opened.
        let empty = self
            .js
            .get_stream(format!("KV_{}", self.bucket))
            .await
            .map_err(|e| read(&e))?
            .info()
            .await
            .map(|i| i.state.messages == 0)
            .map_err(|e| read(&e))?;
        let watch = self
            .kv
            .watch_all_from_revision(1)
            .await
            .map_err(|e| read(&e))?;
        Ok(Follow {
            watch,
            current: empty,
        })
    }
}

/// What a bucket's stream looked like, to tell when someone with more than
/// write access (the JetStream API: a stream deleted and made again, its
/// protection or history changed, values removed) erased part of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// When the stream was made (Unix nanoseconds).
    pub created: i128,
    pub messages: u64,
    pub first_sequence: u64,
    pub history: i64,
    pub missing: Vec<&'static str>,
}

impl View {
    /// What happened between `before` and `self` that only erasing does;
    /// `None` when nothing did. A protected stream only grows.
    pub fn erased_since(&self, before: &View) -> Option<String> {
        if self.created != before.created {
            return Some(
                "the stream was deleted and made again: everything it held is gone".into(),
            );
        }
        if !self.missing.is_empty() && before.missing.is_empty() {
            return Some(format!(
                "its protection was removed ({})",
                self.missing.join(", ")
            ));
        }
        if self.history < before.history {
            return Some(format!(
                "its history was lowered from {} to {} (older values of each key were trimmed)",
                before.history, self.history
            ));
        }
        // A stream that never held anything reports its first sequence as
        // 0; the first value written is #1 all the same.
        let first = |v: &View| v.first_sequence.max(1);
        if self.messages < before.messages || first(self) > first(before) {
            return Some(format!(
                "values were removed ({} held before, {} now; the first is now #{})",
                before.messages, self.messages, self.first_sequence
            ));
        }
        None
    }
}

/// What [`Ledger::follow`] yields.
pub struct Follow {
    watch: kv::Watch,
    /// There was nothing stored when the follow began.
    pub current: bool,
}

impl Follow {
    /// The next entry; `None` when the watch ended.
    pub async fn next(&mut self) -> Option<Result<kv::Entry, RecordsError>> {
        self.watch
            .next()
            .await
            .map(|e| e.map_err(|e| RecordsError::Read(e.to_string())))
    }
}

enum Publish {
    Full,
    Moved,
    Failed(String),
}

/// `maximum messages per subject exceeded` (a key at its history, with
/// `discard_new_per_subject`).
const MAX_PER_SUBJECT: jetstream::ErrorCode = jetstream::ErrorCode(10077);

fn error_code(e: &jetstream::context::PublishError) -> Option<jetstream::ErrorCode> {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .map(|j| j.error_code())
}

fn is_not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j)
        if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nats-server reports a new, empty stream's first sequence as 0: the
    /// first record written to it (#1) erases nothing.
    #[test]
    fn the_first_value_in_a_new_bucket_is_not_an_erasure() {
        let empty = View {
            created: 1,
            messages: 0,
            first_sequence: 0,
            history: 5,
            missing: Vec::new(),
        };
        let first = View {
            messages: 1,
            first_sequence: 1,
            ..empty.clone()
        };
        assert_eq!(first.erased_since(&empty), None);
        let second_only = View {
            messages: 1,
            first_sequence: 2,
            ..empty.clone()
        };
        assert!(second_only.erased_since(&empty).is_some(), "#1 was removed");
    }

    #[test]
    fn only_what_erases_reads_as_erased() {
        let before = View {
            created: 1,
            messages: 10,
            first_sequence: 1,
            history: 5,
            missing: Vec::new(),
        };
        let grown = View {
            messages: 12,
            ..before.clone()
        };
        assert_eq!(grown.erased_since(&before), None);
        for (after, says) in [
            (
                View {
                    created: 2,
                    ..grown.clone()
                },
                "made again",
            ),
            (
                View {
                    messages: 9,
                    ..before.clone()
                },
                "removed",
            ),
            (
                View {
                    first_sequence: 3,
                    ..grown.clone()
                },
                "removed",
            ),
            (
                View {
                    history: 1,
                    ..grown.clone()
                },
                "lowered from 5 to 1",
            ),
            (
                View {
                    missing: vec!["deny_purge: true"],
                    ..grown.clone()
                },
                "protection",
            ),
        ] {
            let why = after.erased_since(&before).expect("erased");
            assert!(why.contains(says), "{why}");
        }
    }

    #[test]
    fn what_a_bucket_made_by_an_earlier_version_lacks_is_named_and_added() {
        let mut old = stream_config(&Spec {
            bucket: "B",
            description: "d",
            history: 5,
            replicas: 3,
        });
        assert!(missing_protection(&old).is_empty());
        old.deny_purge = false;
        old.allow_rollup = true;
        old.discard_new_per_subject = false;
        assert_eq!(
            missing_protection(&old),
            [
                "deny_purge: true",
                "allow_rollup_hdrs: false",
                "discard: new with discard_new_per_subject: true"
            ]
        );
        let fixed = protected(&old);
        assert!(missing_protection(&fixed).is_empty());
        assert_eq!((fixed.max_messages_per_subject, fixed.num_replicas), (5, 3));
    }
}

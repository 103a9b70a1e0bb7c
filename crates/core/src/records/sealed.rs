//! Records as they are stored: each one sealed (see
//! [`choria_wire::security::seal`]) by the replica that wrote it, bound to
//! the bucket, its key and the site, and opened only when the seal is ours.
//!
//! ```json
//! {"record":"{\"identity\":\"n1.example.net\",...}","seal":{"key":"<hex>","sig":"<base64>"}}
//! ```
//!
//! The record is kept as the exact text that was sealed, so a reader
//! verifies the bytes the writer signed, whatever serializer either used.
//! Values written before seals (a bare record) read as
//! [`Refusal::Unsigned`]: shown, never acted on, sealed again at the node's
//! next provisioning.

use super::Record;
use choria_wire::security::seal::{Purpose, Seal, SealError, SealKey, SealVerifier};
use serde::{Deserialize, Serialize};

/// A value larger than this is not one of ours (a record is ~1 KiB).
pub const MAX_VALUE: usize = 16 * 1024;

#[derive(Serialize, Deserialize)]
struct Envelope {
    record: String,
    seal: Seal,
}

/// Why a value in the bucket is not acted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A record without a seal (written before seals, or by someone else).
    Unsigned,
    /// The seal is not ours, or does not match what it seals.
    Signature,
    /// Sealed by us, but for another key (its identity is not the key).
    Mismatch,
    /// Sealed for another site.
    Site,
    /// Older than a record of the same node already seen (an old revision
    /// written again).
    Replayed,
    /// Not a record at all, or larger than [`MAX_VALUE`].
    Undecodable,
    /// The key was deleted or purged; the schedule keeps what it knew.
    Deleted,
}

impl Refusal {
    /// The `reason` label of `choria_provisioner_records_refused`.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Unsigned => "unsigned",
            Refusal::Signature => "signature",
            Refusal::Mismatch => "mismatch",
            Refusal::Site => "site",
            Refusal::Replayed => "replayed",
            Refusal::Undecodable => "undecodable",
            Refusal::Deleted => "deleted",
        }
    }

    pub const ALL: [Refusal; 7] = [
        Refusal::Unsigned,
        Refusal::Signature,
        Refusal::Mismatch,
        Refusal::Site,
        Refusal::Replayed,
        Refusal::Undecodable,
        Refusal::Deleted,
    ];

    /// For `nodes`: why a record is not trusted.
    pub fn describe(self) -> &'static str {
        match self {
            Refusal::Unsigned => {
                "unverified: no seal (written before records were sealed, or by someone else)"
            }
            Refusal::Signature => "unverified: the seal is not ours",
            Refusal::Mismatch => "unverified: sealed for another key",
            Refusal::Site => "unverified: sealed for another site",
            Refusal::Replayed => "unverified: older than a record already seen",
            Refusal::Undecodable => "unverified: not a record",
            Refusal::Deleted => "deleted",
        }
    }
}

/// One value of the bucket, opened.
#[derive(Clone, Debug, PartialEq)]
pub enum Read {
    Verified(Box<Record>),
    /// Not acted on; `record` when it could still be read (for `nodes`).
    Refused {
        key: String,
        why: Refusal,
        record: Option<Box<Record>>,
    },
}

impl Read {
    pub fn key(&self) -> &str {
        match self {
            Read::Verified(r) => &r.identity,
            Read::Refused { key, .. } => key,
        }
    }
}

/// Seals records for one bucket and site, and opens them.
#[derive(Clone, Debug)]
pub struct Sealer {
    key: SealKey,
    verifier: SealVerifier,
    bucket: String,
    site: String,
}

impl Sealer {
    /// `verifier` should trust `key` (and may trust older keys too).
    pub fn new(key: SealKey, verifier: SealVerifier, bucket: &str, site: &str) -> Self {
        Sealer {
            key,
            verifier,
            bucket: bucket.to_string(),
            site: site.to_string(),
        }
    }

    pub fn site(&self) -> &str {
        &self.site
    }

    fn parts<'a>(&'a self, key: &'a str, record: &'a str) -> [&'a [u8]; 4] {
        [
            self.bucket.as_bytes(),
            key.as_bytes(),
            self.site.as_bytes(),
            record.as_bytes(),
        ]
    }

    /// The stored value of `record` under its identity.
    pub fn seal(&self, record: &Record) -> Result<Vec<u8>, serde_json::Error> {
        self.seal_at(record, &record.identity)
    }

    /// The stored value of `record` under `key` (its identity, or an
    /// overflow key of it: [`super::ledger`]).
    pub fn seal_at(&self, record: &Record, key: &str) -> Result<Vec<u8>, serde_json::Error> {
        let text = serde_json::to_string(record)?;
        let seal = self.key.seal(Purpose::Record, &self.parts(key, &text));
        serde_json::to_vec(&Envelope { record: text, seal })
    }

    /// Opens the value stored under `key`.
    pub fn open(&self, key: &str, value: &[u8]) -> Read {
        let refused = |why, record: Option<Record>| Read::Refused {
            key: key.to_string(),
            why,
            record: record.map(Box::new),
        };
        if value.len() > MAX_VALUE {
            return refused(Refusal::Undecodable, None);
        }
        let envelope = match serde_json::from_slice::<Envelope>(value) {
            Ok(e) => e,
            Err(_) => {
                return match serde_json::from_slice::<Record>(value) {
                    Ok(r) => refused(Refusal::Unsigned, Some(r)),
                    Err(_) => refused(Refusal::Undecodable, None),
                }
            }
        };
        let record = serde_json::from_str::<Record>(&envelope.record).ok();
        // The seal covers our site: one sealed for another site fails here
        // as a signature; tell the two apart for the operator's sake.
        match self.verifier.verify(
            Some(&envelope.seal),
            Purpose::Record,
            &self.parts(key, &envelope.record),
        ) {
            Ok(()) => {}
            Err(SealError::Mismatch) if record.as_ref().is_some_and(|r| r.site != self.site) => {
                return refused(Refusal::Site, record)
            }
            Err(_) => return refused(Refusal::Signature, record),
        }
        match record {
            Some(r) if super::keys::is_key_of(&r.identity, key) && r.site == self.site => {
                Read::Verified(Box::new(r))
            }
            Some(r) => refused(Refusal::Mismatch, Some(r)),
            None => refused(Refusal::Undecodable, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(identity: &str, site: &str) -> Record {
        Record {
            identity: identity.into(),
            time: "2027-01-15T08:00:00Z".into(),
            time_unix: 1_800_000_000,
            replica: "prov-1".into(),
            site: site.into(),
            protocol: "v2".into(),
            mode: "template".into(),
            signer: None,
            certificate: None,
            server_jwt: Some(super::super::ServerJwtRecord {
                jti: "j".into(),
                issued_unix: 1_800_000_000,
                expires_unix: 1_800_003_600,
                collectives: vec!["choria".into()],
            }),
            config_sha256: "00".into(),
            provisioning_jwt_expires_unix: None,
        }
    }

    fn why(read: Read) -> Refusal {
        match read {
            Read::Refused { why, .. } => why,
            Read::Verified(r) => panic!("verified {r:?}"),
        }
    }

    #[test]
    fn a_sealed_record_opens_only_under_its_key_bucket_and_site() {
        let key = SealKey::generate();
        let ours = Sealer::new(key.clone(), key.verifier(), "B", "lon");
        let r = record("n1.example.net", "lon");
        let value = ours.seal(&r).unwrap();
        assert_eq!(
            ours.open("n1.example.net", &value),
            Read::Verified(Box::new(r.clone()))
        );
        // Copied under another node's key, into another bucket, or read by
        // another site: not ours to act on.
        assert_eq!(why(ours.open("n2.example.net", &value)), Refusal::Signature);
        let other_bucket = Sealer::new(key.clone(), key.verifier(), "C", "lon");
        assert_eq!(
            why(other_bucket.open("n1.example.net", &value)),
            Refusal::Signature
        );
        let other_site = Sealer::new(key.clone(), key.verifier(), "B", "ams");
        assert_eq!(
            why(other_site.open("n1.example.net", &value)),
            Refusal::Site
        );
        // Sealed by someone else's key, though it names ours.
        let forger = SealKey::generate();
        let theirs = Sealer::new(forger.clone(), forger.verifier(), "B", "lon");
        let mut forged: serde_json::Value =
            serde_json::from_slice(&theirs.seal(&r).unwrap()).unwrap();
        forged["seal"]["key"] = key.public_hex().into();
        let forged = serde_json::to_vec(&forged).unwrap();
        assert_eq!(
            why(ours.open("n1.example.net", &forged)),
            Refusal::Signature
        );
        // The sealed text edited (a collective changed).
        let mut edited: serde_json::Value = serde_json::from_slice(&value).unwrap();
        let text = edited["record"].as_str().unwrap().replace("choria", "evil");
        edited["record"] = text.into();
        let edited = serde_json::to_vec(&edited).unwrap();
        assert_eq!(
            why(ours.open("n1.example.net", &edited)),
            Refusal::Signature
        );
    }

    #[test]
    fn old_bare_records_and_garbage_are_refused_with_their_reason() {
        let key = SealKey::generate();
        let ours = Sealer::new(key.clone(), key.verifier(), "B", "lon");
        let bare = serde_json::to_vec(&record("n1.example.net", "lon")).unwrap();
        match ours.open("n1.example.net", &bare) {
            Read::Refused {
                why: Refusal::Unsigned,
                record: Some(r),
                ..
            } => {
                assert_eq!(r.identity, "n1.example.net")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(why(ours.open("n1", b"not json")), Refusal::Undecodable);
        let huge = vec![b' '; MAX_VALUE + 1];
        assert_eq!(why(ours.open("n1", &huge)), Refusal::Undecodable);
    }

    #[test]
    fn a_record_sealed_under_a_key_it_does_not_name_is_a_mismatch() {
        // Only a writer holding our key can make this; we never do, but a
        // reader must not act on it.
        let key = SealKey::generate();
        let ours = Sealer::new(key.clone(), key.verifier(), "B", "lon");
        let r = record("n1.example.net", "lon");
        let text = serde_json::to_string(&r).unwrap();
        let seal = key.seal(Purpose::Record, &ours.parts("n2.example.net", &text));
        let value = serde_json::to_vec(&Envelope { record: text, seal }).unwrap();
        assert_eq!(why(ours.open("n2.example.net", &value)), Refusal::Mismatch);
    }

    #[test]
    fn records_sealed_by_a_previous_key_verify_while_it_is_trusted() {
        let old = SealKey::generate();
        let new = SealKey::generate();
        let value = Sealer::new(old.clone(), old.verifier(), "B", "lon")
            .seal(&record("n1", "lon"))
            .unwrap();
        let rotated = Sealer::new(
            new.clone(),
            new.verifier().trusting(&old.public_hex()).unwrap(),
            "B",
            "lon",
        );
        assert!(matches!(rotated.open("n1", &value), Read::Verified(_)));
        let forgot = Sealer::new(new.clone(), new.verifier(), "B", "lon");
        assert_eq!(why(forgot.open("n1", &value)), Refusal::Signature);
    }
}

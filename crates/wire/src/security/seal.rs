//! Seals: ed25519 signatures over what the provisioner writes to the bus and
//! reads back (records, shard heartbeats), with the key a Provisioner's
//! replicas share.
//!
//! Anyone who may write a records bucket or publish on a heartbeat subject
//! can forge what is there; a seal makes what we act on ours. Each use has a
//! purpose string of its own, and every part of the signed message is
//! length-prefixed, so a seal made for one purpose, bucket, key or member
//! never verifies for another (a record moved to another key, a heartbeat
//! copied to another shard group).
//!
//! The key file holds the 32-byte seed as 64 hex characters (what
//! `openssl rand -hex 32` writes); the operator makes one per Provisioner
//! and mounts it as a Secret.

use super::ed25519::{parse_public_key_hex, Ed25519KeyPair};
use base64::Engine;
use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use std::fmt;
use std::path::{Path, PathBuf};

/// What a seal is for: each purpose signs a different message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// A record in the records bucket (parts: bucket, key, site, record).
    Record,
    /// A shard membership heartbeat (parts: subject, member, heartbeat).
    Heartbeat,
    /// A member's Lease in shards mode (parts: Lease, holder, view,
    /// `<sequence>@<time>`).
    MemberLease,
    /// An event on the audit stream (parts: stream, the event's text
    /// without its seal).
    Audit,
    /// A revocation (parts: bucket, key, site, the revocation's text).
    Revocation,
    /// The identity a cloud instance was first provisioned as (parts:
    /// bucket, key, site, the binding's text).
    InstanceBinding,
}

impl Purpose {
    fn tag(self) -> &'static [u8] {
        match self {
            Purpose::Record => b"choria-provisioner record v1",
            Purpose::Heartbeat => b"choria-provisioner heartbeat v1",
            Purpose::MemberLease => b"choria-provisioner member lease v1",
            Purpose::Audit => b"choria-provisioner audit event v1",
            Purpose::Revocation => b"choria-provisioner revocation v1",
            Purpose::InstanceBinding => b"choria-provisioner instance binding v1",
        }
    }
}

/// The message a seal signs: the purpose, then each part, every one
/// preceded by its length (8 bytes, big-endian).
fn message(purpose: Purpose, parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + parts.iter().map(|p| p.len() + 8).sum::<usize>());
    for p in std::iter::once(purpose.tag()).chain(parts.iter().copied()) {
        out.extend_from_slice(&(p.len() as u64).to_be_bytes());
        out.extend_from_slice(p);
    }
    out
}

#[derive(Debug, thiserror::Error)]
pub enum SealKeyError {
    #[error("cannot read the signing key {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the signing key {} is not an ed25519 seed (64 hex characters, as `openssl rand -hex 32` writes): {reason}", .path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("{key:?} is not an ed25519 public key (64 hex characters): {reason}")]
    PublicKey { key: String, reason: String },
}

/// Why a seal did not verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("no seal")]
    Missing,
    #[error("the seal is not a signature (base64 of 64 bytes)")]
    Malformed,
    #[error("the seal was made with a key we do not trust")]
    UnknownKey,
    #[error("the seal does not match what it seals")]
    Mismatch,
}

impl SealError {
    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            SealError::Missing => "unsigned",
            SealError::Malformed | SealError::UnknownKey | SealError::Mismatch => "signature",
        }
    }
}

/// A seal: which key made it (hex public key) and the signature (base64).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Seal {
    pub key: String,
    pub sig: String,
}

/// The key seals are made with. `Debug` never shows the seed.
#[derive(Clone)]
pub struct SealKey {
    pair: Ed25519KeyPair,
}

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealKey")
            .field("public_key", &self.pair.public_hex())
            .finish_non_exhaustive()
    }
}

impl SealKey {
    pub fn generate() -> Self {
        SealKey {
            pair: Ed25519KeyPair::generate(),
        }
    }

    /// Reads a seed file (64 hex characters; surrounding whitespace is
    /// tolerated). Errors never show the file's content.
    pub fn from_file(path: &Path) -> Result<Self, SealKeyError> {
        let text = std::fs::read_to_string(path).map_err(|source| SealKeyError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_seed_hex(text.trim()).map_err(|reason| SealKeyError::Invalid {
            path: path.to_path_buf(),
            reason,
        })
    }

    pub fn from_seed_hex(hex: &str) -> Result<Self, String> {
        Ed25519KeyPair::from_seed_hex(hex)
            .map(|pair| SealKey { pair })
            .map_err(|e| e.to_string())
    }

    /// The seed, hex (for writing a key file; it is the secret).
    pub fn seed_hex(&self) -> String {
        self.pair.seed_hex()
    }

    pub fn public_hex(&self) -> String {
        self.pair.public_hex()
    }

    /// The verifier that trusts this key.
    pub fn verifier(&self) -> SealVerifier {
        SealVerifier {
            keys: vec![(self.public_hex(), self.pair.verifying_key())],
        }
    }

    pub fn seal(&self, purpose: Purpose, parts: &[&[u8]]) -> Seal {
        let sig = self.pair.sign(&message(purpose, parts));
        Seal {
            key: self.public_hex(),
            sig: base64::engine::general_purpose::STANDARD.encode(sig),
        }
    }
}

/// The keys whose seals we accept: our own, and others named for a key
/// rotation.
#[derive(Clone, Debug, Default)]
pub struct SealVerifier {
    keys: Vec<(String, VerifyingKey)>,
}

impl SealVerifier {
    /// Also trusts `public_hex` (64 hex characters).
    pub fn trusting(mut self, public_hex: &str) -> Result<Self, SealKeyError> {
        let key = parse_public_key_hex(public_hex).map_err(|e| SealKeyError::PublicKey {
            key: public_hex.chars().take(80).collect(),
            reason: e.to_string(),
        })?;
        let hex = hex::encode(key.as_bytes());
        if !self.keys.iter().any(|(k, _)| *k == hex) {
            self.keys.push((hex, key));
        }
        Ok(self)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether `seal` is one of our keys' signature over these parts.
    pub fn verify(
        &self,
        seal: Option<&Seal>,
        purpose: Purpose,
        parts: &[&[u8]],
    ) -> Result<(), SealError> {
        let seal = seal.ok_or(SealError::Missing)?;
        let key = self
            .keys
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(&seal.key))
            .map(|(_, k)| k)
            .ok_or(SealError::UnknownKey)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&seal.sig)
            .map_err(|_| SealError::Malformed)?;
        let sig = Signature::from_slice(&bytes).map_err(|_| SealError::Malformed)?;
        key.verify(&message(purpose, parts), &sig)
            .map_err(|_| SealError::Mismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seal_verifies_only_for_its_purpose_parts_and_key() {
        let key = SealKey::generate();
        let v = key.verifier();
        let seal = key.seal(Purpose::Record, &[b"B", b"n1", b"{}"]);
        assert_eq!(
            v.verify(Some(&seal), Purpose::Record, &[b"B", b"n1", b"{}"]),
            Ok(())
        );
        for (purpose, parts) in [
            (Purpose::Heartbeat, [&b"B"[..], b"n1", b"{}"]),
            (Purpose::Record, [b"B", b"n2", b"{}"]),
            (Purpose::Record, [b"C", b"n1", b"{}"]),
            (Purpose::Record, [b"B", b"n1", b"{ }"]),
            // Lengths are part of the message: moving a byte between parts fails.
            (Purpose::Record, [b"Bn", b"1", b"{}"]),
        ] {
            assert_eq!(
                v.verify(Some(&seal), purpose, &parts),
                Err(SealError::Mismatch),
                "{purpose:?} {parts:?}"
            );
        }
        let other = SealKey::generate();
        assert_eq!(
            other
                .verifier()
                .verify(Some(&seal), Purpose::Record, &[b"B", b"n1", b"{}"]),
            Err(SealError::UnknownKey)
        );
        let rotated = other.verifier().trusting(&key.public_hex()).unwrap();
        assert_eq!(
            rotated.verify(Some(&seal), Purpose::Record, &[b"B", b"n1", b"{}"]),
            Ok(())
        );
        // A seal naming our key with another key's signature.
        let mut forged = other.seal(Purpose::Record, &[b"B", b"n1", b"{}"]);
        forged.key = key.public_hex();
        assert_eq!(
            v.verify(Some(&forged), Purpose::Record, &[b"B", b"n1", b"{}"]),
            Err(SealError::Mismatch)
        );
        assert_eq!(
            v.verify(None, Purpose::Record, &[]),
            Err(SealError::Missing)
        );
        let garbled = Seal {
            key: key.public_hex(),
            sig: "!!".into(),
        };
        assert_eq!(
            v.verify(Some(&garbled), Purpose::Record, &[]),
            Err(SealError::Malformed)
        );
    }

    #[test]
    fn key_files_are_hex_seeds_and_errors_hide_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = SealKey::generate();
        std::fs::write(&path, format!("{}\n", key.seed_hex())).unwrap();
        assert_eq!(
            SealKey::from_file(&path).unwrap().public_hex(),
            key.public_hex()
        );
        let secretish = "zz".repeat(32);
        std::fs::write(&path, &secretish).unwrap();
        let e = SealKey::from_file(&path).unwrap_err().to_string();
        assert!(
            e.contains("not an ed25519 seed") && !e.contains(&secretish),
            "{e}"
        );
        assert!(format!("{key:?}").contains(&key.public_hex()));
        assert!(!format!("{key:?}").contains(&key.seed_hex()));
    }
}

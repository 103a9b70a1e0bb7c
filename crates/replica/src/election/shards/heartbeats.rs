//! Membership over the broker with core NATS only: what a stock Choria
//! broker's provisioning account allows (it imports nothing but the two
//! election subjects, and shards need no KV).
//!
//! Every member publishes a heartbeat on `choria.provisioner.shards.<name>`
//! each `retry_period` — its member id, a sequence number that grows with
//! every heartbeat, and its view of the members — and subscribes to the
//! subject to see the others. A renewal counts once our own heartbeat came
//! back through the subscription: that proves the broker carried it both
//! ways. A broker that refuses either (a permission it does not grant) makes
//! the renewal fail, loudly, and a member that cannot renew stops working,
//! instead of working a fleet nobody else knows it works. Leaving is one
//! more heartbeat that says so.
//!
//! Anyone who may publish on the subject could otherwise forge a member:
//! a made-up one takes the nodes rendezvous hashing gives it (they are not
//! worked while it seems alive), a forged leave of a working member gives
//! its nodes to a second owner. So every heartbeat is sealed with the key
//! the replicas share ([`choria_wire::security::seal`]), bound to the
//! subject and the member, with the time it was sent; one that is not,
//! whose sequence does not grow, or that is older than `lease_duration`
//! and [`MAX_CLOCK_SKEW`] (a recording sent again) is ignored and counted.
//! So the members' clocks must agree within [`MAX_CLOCK_SKEW`]; a recording
//! of a member that stopped keeps it alive for a member that never saw it
//! no longer than that.

use super::{Membership, Sighting, MAX_MEMBERS};
use crate::election::ElectionError;
use choria_wire::security::seal::{Purpose, Seal, SealKey, SealVerifier};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Duration;

/// The subject the members of `name` heartbeat on.
pub fn subject(name: &str) -> String {
    format!("choria.provisioner.shards.{name}")
}

/// One heartbeat, as sealed.
#[derive(Serialize, Deserialize)]
struct Beat {
    member: String,
    seq: u64,
    /// When it was sent (Unix milliseconds, the sender's clock).
    #[serde(default)]
    time_ms: i64,
    #[serde(default)]
    view: Vec<String>,
    #[serde(default)]
    leaving: bool,
}

/// How far apart the members' clocks may be: a sealed heartbeat older than
/// `lease_duration` and this, by our clock, is refused as `stale` (a
/// recording sent again), as is one from further in the future.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(30);

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// What goes on the wire: the heartbeat's exact text and its seal.
#[derive(Serialize, Deserialize)]
struct Envelope {
    beat: String,
    seal: Seal,
}

/// A heartbeat larger than this is not ours (a view of [`MAX_MEMBERS`]
/// members of the longest ids fits).
const MAX_HEARTBEAT: usize = 64 * 1024;
/// Members whose last sequence is remembered, at most (ids are new with
/// every process; past this the memory starts again).
const REMEMBERED: usize = 10_000;

/// Why a heartbeat was ignored (the `reason` label).
pub const REFUSED_REASONS: [&str; 5] = ["unsigned", "signature", "invalid", "replayed", "stale"];

pub struct Heartbeats {
    nats: async_nats::Client,
    me: String,
    seq: u64,
    sub: async_nats::Subscriber,
    key: SealKey,
    /// How long a renewal waits for our own heartbeat to come back.
    echo_wait: Duration,
    reader: Reader,
    /// Heartbeats received and not yet handed out.
    pending: Vec<Sighting>,
    /// Reasons of heartbeats ignored since the last call to `refused`.
    refused: Vec<&'static str>,
}

/// Opens heartbeats as they arrive: what is sealed, valid and newer.
struct Reader {
    subject: String,
    me: String,
    verifier: SealVerifier,
    /// How old a heartbeat may be: `lease_duration` and [`MAX_CLOCK_SKEW`].
    max_age_ms: i64,
    /// Our own highest sequence seen back.
    echoed: u64,
    /// Each member's highest sequence seen.
    last_seq: HashMap<String, u64>,
}

/// One heartbeat of `me` on `subject`, sealed with `key`.
fn seal_beat(
    key: &SealKey,
    subject: &str,
    me: &str,
    seq: u64,
    view: &[String],
    leaving: bool,
) -> Vec<u8> {
    let beat = serde_json::to_string(&Beat {
        member: me.to_string(),
        seq,
        time_ms: now_ms(),
        view: view.to_vec(),
        leaving,
    })
    .unwrap_or_default();
    let seal = key.seal(
        Purpose::Heartbeat,
        &[subject.as_bytes(), me.as_bytes(), beat.as_bytes()],
    );
    serde_json::to_vec(&Envelope { beat, seal }).unwrap_or_default()
}

impl Reader {
    /// Opens one message; a sighting when it is another member's sealed,
    /// valid, newer heartbeat; `None` for our own (its echo is noted).
    fn open(&mut self, payload: &[u8]) -> Result<Option<Sighting>, &'static str> {
        if payload.len() > MAX_HEARTBEAT {
            return Err("invalid");
        }
        let Ok(envelope) = serde_json::from_slice::<Envelope>(payload) else {
            // A heartbeat of the unsealed kind earlier versions sent.
            return Err(if serde_json::from_slice::<Beat>(payload).is_ok() {
                "unsigned"
            } else {
                "invalid"
            });
        };
        let beat: Beat = serde_json::from_str(&envelope.beat).map_err(|_| "invalid")?;
        self.verifier
            .verify(
                Some(&envelope.seal),
                Purpose::Heartbeat,
                &[
                    self.subject.as_bytes(),
                    beat.member.as_bytes(),
                    envelope.beat.as_bytes(),
                ],
            )
            .map_err(|_| "signature")?;
        if !is_member_id(&beat.member)
            || beat.view.len() > MAX_MEMBERS
            || !beat.view.iter().all(|m| is_member_id(m))
        {
            return Err("invalid");
        }
        if beat.member == self.me {
            self.echoed = self.echoed.max(beat.seq);
            return Ok(None);
        }
        // A recording of a member that stopped, sent to a member that never
        // saw it, must not keep it alive past its lease.
        let skew = MAX_CLOCK_SKEW.as_millis() as i64;
        let age = now_ms() - beat.time_ms;
        if age > self.max_age_ms || age < -skew {
            return Err("stale");
        }
        if self
            .last_seq
            .get(&beat.member)
            .is_some_and(|last| *last >= beat.seq)
        {
            return Err("replayed");
        }
        if self.last_seq.len() >= REMEMBERED {
            self.last_seq.clear();
        }
        self.last_seq.insert(beat.member.clone(), beat.seq);
        Ok(Some(Sighting {
            member: beat.member,
            stamp: beat.seq.to_string(),
            view: beat.view,
            leaving: beat.leaving,
        }))
    }
}

impl Heartbeats {
    /// Subscribes to `name`'s subject as member `me`; heartbeats are
    /// sealed with `key` and trusted when `verifier` opens them and they
    /// are younger than `ttl` (plus [`MAX_CLOCK_SKEW`]); a renewal waits
    /// `echo_wait` for our own heartbeat to come back.
    pub async fn connect(
        nats: async_nats::Client,
        name: &str,
        me: &str,
        key: SealKey,
        verifier: SealVerifier,
        ttl: Duration,
        echo_wait: Duration,
    ) -> Result<Self, ElectionError> {
        let subject = subject(name);
        let sub = nats
            .subscribe(subject.clone())
            .await
            .map_err(|e| ElectionError::Other(format!("subscribing to {subject}: {e}")))?;
        Ok(Heartbeats {
            nats,
            me: me.to_string(),
            seq: 0,
            sub,
            key,
            echo_wait,
            reader: Reader {
                subject,
                me: me.to_string(),
                verifier,
                max_age_ms: (ttl + MAX_CLOCK_SKEW).as_millis() as i64,
                echoed: 0,
                last_seq: HashMap::new(),
            },
            pending: Vec::new(),
            refused: Vec::new(),
        })
    }

    fn subject(&self) -> &str {
        &self.reader.subject
    }

    async fn publish(&mut self, view: &[String], leaving: bool) -> Result<(), ElectionError> {
        self.seq += 1;
        let body = seal_beat(&self.key, self.subject(), &self.me, self.seq, view, leaving);
        let subject = self.subject().to_string();
        let fail = |e: &dyn std::fmt::Display| {
            ElectionError::Other(format!("heartbeat on {subject}: {e}"))
        };
        self.nats
            .publish(subject.clone(), body.into())
            .await
            .map_err(|e| fail(&e))?;
        self.nats.flush().await.map_err(|e| fail(&e))
    }

    fn take(&mut self, msg: async_nats::Message) {
        match self.reader.open(&msg.payload) {
            Ok(Some(s)) => self.pending.push(s),
            Ok(None) => {}
            Err(reason) => self.refused.push(reason),
        }
    }
}

/// A member id as we make them: a Choria identity or pod name with a
/// suffix (letters, digits, `.`, `-`, `_`), at most 253 characters.
pub fn is_member_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

impl Membership for Heartbeats {
    fn describe(&self) -> String {
        format!("heartbeats on {}", self.subject())
    }

    fn me(&self) -> &str {
        &self.me
    }

    async fn renew(&mut self, view: &[String]) -> Result<(), ElectionError> {
        self.publish(view, false).await?;
        // Counts once it came back: the broker carried it both ways.
        let deadline = tokio::time::Instant::now() + self.echo_wait;
        while self.reader.echoed < self.seq {
            match tokio::time::timeout_at(deadline, self.sub.next()).await {
                Ok(Some(msg)) => self.take(msg),
                Ok(None) => {
                    return Err(ElectionError::Other(format!(
                        "the subscription to {} ended",
                        self.subject()
                    )))
                }
                Err(_) => {
                    return Err(ElectionError::Other(format!(
                        "our heartbeat did not come back on {} within {:?}: the broker does not carry it (may this account publish and subscribe there?)",
                        self.subject(), self.echo_wait
                    )))
                }
            }
        }
        Ok(())
    }

    async fn sightings(&mut self) -> Result<Vec<Sighting>, ElectionError> {
        // Everything already received, without waiting for more.
        while let Some(Some(msg)) = futures::FutureExt::now_or_never(self.sub.next()) {
            self.take(msg);
        }
        Ok(std::mem::take(&mut self.pending))
    }

    async fn changed(&mut self) {
        match self.sub.next().await {
            Some(msg) => self.take(msg),
            None => std::future::pending::<()>().await,
        }
    }

    fn refused(&mut self) -> Vec<&'static str> {
        std::mem::take(&mut self.refused)
    }

    async fn leave(&mut self) -> Result<(), ElectionError> {
        self.publish(&[], true).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(me: &str, key: &SealKey) -> Reader {
        Reader {
            subject: subject("g"),
            me: me.into(),
            verifier: key.verifier(),
            max_age_ms: 10_000,
            echoed: 0,
            last_seq: HashMap::new(),
        }
    }

    fn beat(key: &SealKey, member: &str, seq: u64, leaving: bool) -> Vec<u8> {
        seal_beat(key, &subject("g"), member, seq, &[], leaving)
    }

    #[test]
    fn only_sealed_newer_heartbeats_of_our_group_count() {
        let key = SealKey::generate();
        let mut r = reader("me-1", &key);
        assert!(r.open(&beat(&key, "m-2", 1, false)).unwrap().is_some());
        assert_eq!(
            r.open(&beat(&key, "m-2", 1, false)).unwrap_err(),
            "replayed"
        );
        let leave = r.open(&beat(&key, "m-2", 2, true)).unwrap().unwrap();
        assert!(leave.leaving);
        // A forged leave: someone else's key, or no seal at all.
        let forger = SealKey::generate();
        assert_eq!(
            r.open(&beat(&forger, "m-3", 1, true)).unwrap_err(),
            "signature"
        );
        let bare = br#"{"member":"m-3","seq":9,"view":[],"leaving":true}"#;
        assert_eq!(r.open(bare).unwrap_err(), "unsigned");
        assert_eq!(r.open(b"{}").unwrap_err(), "invalid");
        // A sealed heartbeat of one member passed off as another's, or
        // sealed for another group.
        let mut moved: serde_json::Value =
            serde_json::from_slice(&beat(&key, "m-2", 3, true)).unwrap();
        moved["beat"] = moved["beat"].as_str().unwrap().replace("m-2", "m-4").into();
        assert_eq!(
            r.open(&serde_json::to_vec(&moved).unwrap()).unwrap_err(),
            "signature"
        );
        let other_group = seal_beat(&key, &subject("h"), "m-5", 1, &[], true);
        assert_eq!(r.open(&other_group).unwrap_err(), "signature");
        // Our own heartbeat is the echo, not a sighting.
        assert!(r.open(&beat(&key, "me-1", 5, false)).unwrap().is_none());
        assert_eq!(r.echoed, 5);
    }

    #[test]
    fn a_recording_older_than_the_lease_is_stale() {
        let key = SealKey::generate();
        let mut r = reader("me-1", &key);
        let at = |member: &str, seq: u64, time_ms: i64| {
            let beat = serde_json::to_string(&Beat {
                member: member.into(),
                seq,
                time_ms,
                view: vec![],
                leaving: false,
            })
            .unwrap();
            let seal = key.seal(
                Purpose::Heartbeat,
                &[subject("g").as_bytes(), member.as_bytes(), beat.as_bytes()],
            );
            serde_json::to_vec(&Envelope { beat, seal }).unwrap()
        };
        let now = now_ms();
        assert!(r.open(&at("m-2", 1, now - 5_000)).unwrap().is_some());
        assert_eq!(r.open(&at("m-3", 1, now - 11_000)).unwrap_err(), "stale");
        let future = now + MAX_CLOCK_SKEW.as_millis() as i64 + 5_000;
        assert_eq!(r.open(&at("m-4", 1, future)).unwrap_err(), "stale");
    }

    #[test]
    fn member_ids_and_views_are_bounded() {
        let key = SealKey::generate();
        let mut r = reader("me-1", &key);
        let long = "x".repeat(254);
        assert_eq!(r.open(&beat(&key, &long, 1, false)).unwrap_err(), "invalid");
        let crowd: Vec<String> = (0..=MAX_MEMBERS).map(|i| format!("m-{i}")).collect();
        let big = seal_beat(&key, &subject("g"), "m-1", 1, &crowd, false);
        assert_eq!(r.open(&big).unwrap_err(), "invalid");
        let fits = seal_beat(&key, &subject("g"), "m-1", 1, &crowd[..MAX_MEMBERS], false);
        assert!(fits.len() < MAX_HEARTBEAT);
        assert!(r.open(&fits).unwrap().is_some());
    }
}

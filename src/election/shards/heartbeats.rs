//! Membership over the broker with core NATS only: what a stock Choria
//! broker's provisioning account allows (it imports nothing but the two
//! election subjects, and shards need no KV).
//!
//! Every member publishes a heartbeat on `choria.provisioner.shards.<name>`
//! each `retry_period` — its member id, a sequence number that changes with
//! every heartbeat, and its view of the members — and subscribes to the
//! subject to see the others. A renewal counts once the broker acknowledged
//! it (a flush, which waits for the server's PONG). Leaving is one more
//! heartbeat that says so.
//!
//! Anyone who may publish on `choria.provisioner.shards.>` can forge a
//! member: the nodes rendezvous hashing gives it are then not worked until
//! its heartbeats stop (`lease_duration` after the last). That costs
//! liveness, never safety: no node is configured twice, as every real
//! member still checks ownership at each step and the provisioning lock
//! refuses overlaps. Keep the provisioning account to provisioners and
//! provisioning-mode servers, as for the election.

use super::{Membership, Sighting};
use crate::election::ElectionError;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tracing::debug;

/// The subject the members of `name` heartbeat on.
pub fn subject(name: &str) -> String {
    format!("choria.provisioner.shards.{name}")
}

/// One heartbeat.
#[derive(Serialize, Deserialize)]
struct Heartbeat {
    member: String,
    seq: u64,
    #[serde(default)]
    view: Vec<String>,
    #[serde(default)]
    leaving: bool,
}

/// A heartbeat larger than this is not ours (a view of 1,000 members fits).
const MAX_HEARTBEAT: usize = 64 * 1024;

pub struct Heartbeats {
    nats: async_nats::Client,
    subject: String,
    me: String,
    seq: u64,
    sub: async_nats::Subscriber,
    /// Heartbeats received and not yet handed out.
    pending: Vec<Sighting>,
}

impl Heartbeats {
    pub async fn connect(
        nats: async_nats::Client,
        name: &str,
        me: &str,
    ) -> Result<Self, ElectionError> {
        let subject = subject(name);
        let sub = nats
            .subscribe(subject.clone())
            .await
            .map_err(|e| ElectionError::Other(format!("subscribing to {subject}: {e}")))?;
        Ok(Heartbeats {
            nats,
            subject,
            me: me.to_string(),
            seq: 0,
            sub,
            pending: Vec::new(),
        })
    }

    async fn publish(&mut self, view: &[String], leaving: bool) -> Result<(), ElectionError> {
        self.seq += 1;
        let beat = Heartbeat {
            member: self.me.clone(),
            seq: self.seq,
            view: view.to_vec(),
            leaving,
        };
        let body = serde_json::to_vec(&beat).unwrap_or_default();
        self.nats
            .publish(self.subject.clone(), body.into())
            .await
            .map_err(|e| ElectionError::Other(format!("heartbeat on {}: {e}", self.subject)))?;
        self.nats
            .flush()
            .await
            .map_err(|e| ElectionError::Other(format!("heartbeat on {}: {e}", self.subject)))
    }

    fn take(&mut self, msg: async_nats::Message) {
        if msg.payload.len() > MAX_HEARTBEAT {
            return;
        }
        match serde_json::from_slice::<Heartbeat>(&msg.payload) {
            Ok(h) if crate::k8s::is_dns_subdomain(&h.member) || is_member_id(&h.member) => {
                self.pending.push(Sighting {
                    member: h.member,
                    stamp: h.seq.to_string(),
                    view: h.view,
                    leaving: h.leaving,
                })
            }
            Ok(_) => debug!("ignoring a heartbeat with an invalid member id"),
            Err(e) => debug!(error = %e, "ignoring an undecodable heartbeat"),
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
        format!("heartbeats on {}", self.subject)
    }

    fn me(&self) -> &str {
        &self.me
    }

    async fn renew(&mut self, view: &[String]) -> Result<(), ElectionError> {
        self.publish(view, false).await
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

    async fn leave(&mut self) -> Result<(), ElectionError> {
        self.publish(&[], true).await
    }
}

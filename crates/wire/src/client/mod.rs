//! A Choria client over async-nats: directed RPC, broadcast discovery and
//! lifecycle events in the `provisioning` collective.
//!
//! The parts: [`ChoriaClient`] and its errors here; dialling the broker in
//! `connect`; encoding and sending a request in `send`; the directed request
//! path in `directed`; the same request to many nodes signed once in
//! `batch`; broadcast discovery in `discovery`; lifecycle events
//! in `events`.

use crate::identity::{self, IdentityError};
use crate::protocol::{ProtocolError, RequestSigner, Version};
use crate::replies::{Ignored, IgnoredTally, ReplyObserver};
use crate::subjects;
use crate::tls::TlsError;
use std::sync::Arc;
use std::time::Duration;
use tracing::debug;

mod batch;
mod connect;
mod directed;
mod discovery;
mod events;
mod send;

pub use batch::MAX_TARGETS as MAX_BATCH_TARGETS;
pub use connect::{
    connect, connect_observed, connected_url, BrokerOptions, ConnectOptions, DEFAULT_NATS,
};
pub use directed::{RpcOptions, RpcResult};
pub use discovery::{Discovered, DiscoveryOptions};
pub use events::{publish_event, subscribe_events, EventFormat};
pub use send::{now_nanos, request_ttl};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no NATS servers configured")]
    NoServers,
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("could not connect to {servers}: {source} ({hint})")]
    Connect {
        servers: String,
        #[source]
        source: async_nats::ConnectError,
        /// What to check, in plain words.
        hint: &'static str,
    },
    #[error("NATS subscribe to {subject} failed: {source}")]
    Subscribe {
        subject: String,
        #[source]
        source: async_nats::SubscribeError,
    },
    #[error("NATS publish to {subject} failed: {source}")]
    Publish {
        subject: String,
        #[source]
        source: async_nats::PublishError,
    },
    #[error("not connected to the broker: the request to {subject} was not sent (it is tried again once the connection is back)")]
    NotConnected { subject: String },
    #[error("the request was not sent: {reason}")]
    NotSent { reason: String },
    #[error("could not encode the request: {0}")]
    Encode(#[from] ProtocolError),
    #[error("no reply from {identity} to {agent}#{action} within {timeout:?}{ignored}")]
    Timeout {
        identity: String,
        agent: String,
        action: String,
        timeout: Duration,
        /// What arrived on the reply subject and was not taken as the
        /// answer, e.g. `"; ignored 1 message (undecodable)"`, or empty.
        ignored: IgnoredTally,
    },
    #[error("invalid reply from {identity}: {reason}")]
    BadReply { identity: String, reason: String },
    #[error("NATS flush failed: {0}")]
    Flush(#[from] async_nats::client::FlushError),
}

/// Who we are on the Choria network and how we sign.
#[derive(Clone, Debug)]
pub struct Identity {
    /// `Config.Identity`: `senderid` in requests and the transport sender.
    pub identity: String,
    /// The caller id (`choria=<certname>` for x509, the JWT's callerid for v2).
    pub caller: String,
    pub signer: RequestSigner,
}

/// The Choria client.
#[derive(Clone)]
pub struct ChoriaClient {
    nats: async_nats::Client,
    me: Identity,
    collective: String,
    ttl: i64,
    /// go-choria's `discovery_timeout`, added to every RPC's agent timeout.
    pub discovery_timeout: Duration,
    /// Told about replies that were not the answer and identities refused.
    observer: Option<Arc<dyn ReplyObserver>>,
    /// Told the TTL of every request (see [`crate::fence`]).
    fence: Option<crate::fence::Fence>,
    /// Gathers the same request to many nodes into one signed message
    /// (see `batch`); `None`: every request is signed and sent alone.
    batcher: Option<Arc<batch::Batcher>>,
}

impl ChoriaClient {
    pub fn new(nats: async_nats::Client, me: Identity) -> Self {
        ChoriaClient {
            nats,
            me,
            collective: subjects::PROVISIONING_COLLECTIVE.to_string(),
            ttl: 60,
            discovery_timeout: Duration::from_secs(2),
            observer: None,
            fence: None,
            batcher: None,
        }
    }

    /// Sends the same directed request to many nodes as one signed message
    /// when they come within `window` of each other (see `batch`); a zero
    /// window sends each alone. Clones share the batches.
    pub fn with_batching(mut self, window: Duration) -> Self {
        self.batcher = (!window.is_zero()).then(|| Arc::new(batch::Batcher::new(window)));
        self
    }

    /// Tells `fence` the TTL of every request sent (the connection must
    /// have been made with the same fence, see [`connect_observed`]).
    pub fn with_fence(mut self, fence: crate::fence::Fence) -> Self {
        self.fence = Some(fence);
        self
    }

    /// The same client speaking in `collective` (the provisioning collective
    /// unless told: provisioned nodes live in their own).
    pub fn in_collective(&self, collective: &str) -> Self {
        ChoriaClient {
            collective: collective.to_string(),
            ..self.clone()
        }
    }

    /// Reports ignored replies and refused identities to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn ReplyObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    fn rejected_identity(&self, source: &str, e: &IdentityError, raw: &str) {
        match &self.observer {
            Some(o) => o.rejected_identity(source, e, raw),
            None => {
                debug!(source, error = %e, identity = %identity::preview(raw), "refused an identity")
            }
        }
    }

    fn ignored(&self, node: &str, rpc: &str, why: Ignored, claimed: Option<&str>) {
        if let Some(o) = &self.observer {
            o.ignored(node, rpc, why, claimed);
        } else {
            debug!(
                node,
                rpc,
                reason = why.reason(),
                "ignored a message on the reply subject"
            );
        }
    }

    pub fn nats(&self) -> &async_nats::Client {
        &self.nats
    }

    pub fn identity(&self) -> &Identity {
        &self.me
    }

    pub fn version(&self) -> Version {
        self.me.signer.version()
    }

    fn new_request_id(&self) -> String {
        match self.version() {
            Version::V1 => crate::ids::v1_request_id(),
            Version::V2 => crate::ids::v2_request_id(),
        }
    }
}

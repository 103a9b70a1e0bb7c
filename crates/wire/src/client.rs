//! A Choria client over async-nats: directed RPC, broadcast discovery and
//! lifecycle events in the `provisioning` collective.

use crate::filter::Filter;
use crate::identity::{self, IdentityError};
use crate::lifecycle::{self, Event, EventType};
use crate::mcorpc::{self, RpcReply, RpcRequest};
use crate::protocol::{self, ProtocolError, Reply, RequestSigner, RequestSpec, Version};
use crate::replies::{self, Confirmation, Ignored, IgnoredTally, ReplyObserver, Verdict};
use crate::subjects;
use crate::tls::{TlsError, TlsSettings};
use futures::StreamExt;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::debug;

/// The broker dialled unless told otherwise: NATS on this machine, on its
/// default port.
pub const DEFAULT_NATS: &str = "nats://127.0.0.1:4222";

/// The broker options of the commands that dial like a provisioning-mode
/// server (`fleet`, `discover`): URLs and TLS, no credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerOptions {
    /// NATS server URLs.
    pub nats: Vec<String>,
    /// Verify the broker's TLS certificate against this CA (otherwise TLS, when
    /// used, does not verify, like a provisioning-mode server).
    pub tls_ca: Option<std::path::PathBuf>,
    /// Always use TLS.
    pub tls_required: bool,
}

impl Default for BrokerOptions {
    /// The command line's defaults (a test of `cmd::broker` in the binary
    /// keeps them equal): a local broker, TLS only if it asks, unverified.
    fn default() -> Self {
        BrokerOptions::at([DEFAULT_NATS])
    }
}

impl BrokerOptions {
    /// Brokers at `urls` with the defaults otherwise.
    pub fn at(urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        BrokerOptions {
            nats: urls.into_iter().map(Into::into).collect(),
            tls_ca: None,
            tls_required: false,
        }
    }

    /// TLS as a provisioning-mode server does it: unverified unless a CA is given.
    pub fn tls(&self) -> TlsSettings {
        TlsSettings {
            required: self.tls_required,
            insecure_skip_verify: self.tls_ca.is_none(),
            ca_file: self.tls_ca.clone(),
            client_cert: None,
        }
    }
}

/// How to reach and authenticate to the broker.
#[derive(Clone, Default)]
pub struct ConnectOptions {
    pub servers: Vec<String>,
    pub name: String,
    pub tls: TlsSettings,
    pub token: Option<String>,
    pub user: Option<(String, String)>,
    /// NATS user-JWT auth: the JWT and the ed25519 seed that signs the server nonce.
    pub nats_jwt: Option<(String, ed25519_dalek::SigningKey)>,
    pub inbox_prefix: Option<String>,
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Credentials never reach logs.
        f.debug_struct("ConnectOptions")
            .field("servers", &self.servers)
            .field("name", &self.name)
            .field("tls", &self.tls)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("nats_jwt", &self.nats_jwt.as_ref().map(|_| "<redacted>"))
            .field("inbox_prefix", &self.inbox_prefix)
            .finish()
    }
}

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

/// How long after the connection was last seen up a directed request may
/// still be handed to the NATS client (see `publish_awaiting`): well inside
/// the margin between a cut-off leader's pause and a standby's first
/// request (1.2 s and more in tests/faults.rs), far above what a send takes
/// when the client keeps up (microseconds).
const SEND_WITHIN: Duration = Duration::from_millis(500);

/// Opens a NATS connection the way a Choria client or server does.
pub async fn connect(opts: &ConnectOptions) -> Result<async_nats::Client, ClientError> {
    connect_observed(opts, None, None).await
}

/// [`connect`], handing connection events (disconnected, connected again, slow
/// consumer...) to `events` so the caller can react, e.g. rediscover after the
/// broker came back.
///
/// With a `fence`, reconnects wait as it says (see [`crate::fence`])
/// and it follows whether the connection is up.
pub async fn connect_observed(
    opts: &ConnectOptions,
    events: Option<tokio::sync::mpsc::UnboundedSender<async_nats::Event>>,
    fence: Option<crate::fence::Fence>,
) -> Result<async_nats::Client, ClientError> {
    if opts.servers.is_empty() {
        return Err(ClientError::NoServers);
    }
    let mut o = async_nats::ConnectOptions::new()
        .name(if opts.name.is_empty() {
            "choria-provisioner"
        } else {
            &opts.name
        })
        .connection_timeout(Duration::from_secs(5))
        .max_reconnects(None::<usize>);
    if opts.tls.is_custom() {
        o = o.tls_client_config(opts.tls.client_config()?);
    }
    if opts.tls.required {
        o = o.require_tls(true);
    }
    if let Some(token) = &opts.token {
        o = o.token(token.clone());
    }
    if let Some((user, pass)) = &opts.user {
        o = o.user_and_password(user.clone(), pass.clone());
    }
    if let Some((jwt, seed)) = &opts.nats_jwt {
        let seed = seed.clone();
        o = o.jwt(jwt.clone(), move |nonce| {
            let seed = seed.clone();
            async move {
                use ed25519_dalek::Signer;
                Ok(seed.sign(&nonce).to_bytes().to_vec())
            }
        });
    }
    if let Some(prefix) = &opts.inbox_prefix {
        o = o.custom_inbox_prefix(prefix);
    }
    if let Some(fence) = &fence {
        let f = fence.clone();
        o = o
            .reconnect_delay_callback(move |attempts| f.delay(attempts, std::time::Instant::now()));
    }
    if events.is_some() || fence.is_some() {
        o = o.event_callback(move |event| {
            let tx = events.clone();
            let fence = fence.clone();
            async move {
                if let Some(f) = &fence {
                    match event {
                        async_nats::Event::Disconnected => f.set_connected(false),
                        async_nats::Event::Connected => f.set_connected(true),
                        _ => {}
                    }
                }
                if let Some(tx) = tx {
                    let _ = tx.send(event);
                }
            }
        });
    }
    let servers: Vec<async_nats::ServerAddr> = opts
        .servers
        .iter()
        .map(|s| s.parse())
        .collect::<Result<_, _>>()
        .map_err(|e: std::io::Error| {
            connect_error(
                opts,
                async_nats::ConnectError::with_source(async_nats::ConnectErrorKind::ServerParse, e),
            )
        })?;
    // The first connection is made before connect() returns, so a bad address is
    // an error here and the server's INFO (its URL for network hops) is known;
    // later disconnects are retried for ever.
    let client = o
        .connect(servers)
        .await
        .map_err(|source| connect_error(opts, source))?;
    Ok(client)
}

fn connect_error(opts: &ConnectOptions, source: async_nats::ConnectError) -> ClientError {
    let text = format!("{source:?} {source}");
    let hint = if source.kind() == async_nats::ConnectErrorKind::AuthorizationViolation {
        refusal_hint(opts)
    } else {
        crate::tls::explain(&text).unwrap_or("check the broker URL and that the broker is running")
    };
    ClientError::Connect {
        servers: opts.servers.join(","),
        source,
        hint,
    }
}

/// Why a broker refuses these credentials, as a Choria broker decides
/// (go-choria `broker/network/choria_auth.go`): it gives no reason on the
/// wire, so the hint names what it checks for this kind of connection.
fn refusal_hint(opts: &ConnectOptions) -> &'static str {
    match (&opts.user, &opts.token) {
        (Some((user, _)), _) if user == "provisioner" => {
            "the broker refused user provisioner: a Choria broker admits it only over TLS, with \
             broker_provisioning_password equal to its plugin.choria.network.provisioning.client_password, \
             and with a client certificate it verifies (x509 networks: plugin.security.file.certificate \
             and .key in the Choria configuration) or, on an Organization Issuer network, a client JWT \
             with the provisioner permission (`choria jwt client ... --server-provisioner`)"
        }
        (None, Some(_)) if opts.nats_jwt.is_none() => {
            "the broker refused the provisioning JWT: a Choria broker admits a provisioning-mode \
             server only over TLS, with a provisioning JWT signed by the key whose public half is its \
             plugin.choria.network.provisioning.signer_cert (RSA) or by the Organization Issuer named \
             in the JWT's ou (ed25519), and only when the broker has a provisioning password set"
        }
        (_, Some(_)) => {
            "the broker refused the client JWT: it must be issued by an issuer (or signer) the broker \
             trusts, unexpired, and signed for with the seed of its public key"
        }
        _ => "the broker refused the credentials (authorization violation): check the user, \
              password or certificate the broker expects",
    }
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

/// What one discovery round found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Discovered {
    /// Distinct valid names (at most `max_nodes`).
    pub nodes: usize,
    /// Replies were still arriving when the round's `timeout` ended it:
    /// there may be more nodes than it found.
    pub cut_short: bool,
}

fn name_hash(name: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // Fixed keys: stable within the process, no per-map randomness needed.
    let mut h =
        std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .build_hasher();
    h.write(name.as_bytes());
    h.finish()
}

/// A decoded RPC reply.
#[derive(Clone, Debug)]
pub struct RpcResult {
    pub reply: Reply,
    pub body: RpcReply,
}

/// Timing of broadcast discovery.
#[derive(Clone, Copy, Debug)]
pub struct DiscoveryOptions {
    /// The longest a discovery may take.
    pub timeout: Duration,
    /// End early once no reply arrived for this long (Go: 300 ms).
    pub sliding_window: Option<Duration>,
    /// Stop taking new nodes after this many (what the work queue can hold):
    /// a flood of made-up names must not grow the result without bound.
    pub max_nodes: usize,
}

impl Default for DiscoveryOptions {
    fn default() -> Self {
        // go-choria's broadcast discovery: 2 s overall, 300 ms after the last reply.
        DiscoveryOptions {
            timeout: Duration::from_secs(2),
            sliding_window: Some(Duration::from_millis(300)),
            max_nodes: 50_000,
        }
    }
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
}

/// How one directed request waits for its answer.
#[derive(Clone, Copy, Debug)]
pub struct RpcOptions {
    /// How long to wait for the answer.
    pub timeout: Duration,
    /// Keep watching the reply subject this long after the answer for a
    /// second, different one (see [`crate::replies`]).
    pub confirm: Option<Duration>,
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
        }
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

    /// The TTL of a request we wait `timeout` for: that long (rounded up),
    /// within what the protocol allows (v1's schema wants at least 30 s) and
    /// Go's 60 s. A node must not act on a request after we stopped waiting
    /// for it: a request buffered across a reconnect would otherwise reach a
    /// node up to 60 s late, after another leader started on it. Clocks of
    /// nodes and provisioner may differ by up to the TTL.
    pub fn ttl_for(&self, timeout: Duration) -> i64 {
        request_ttl(self.version(), timeout, self.ttl)
    }

    fn encode(
        &self,
        id: &str,
        agent: &str,
        filter: &Filter,
        payload: &[u8],
        reply_to: &str,
        timeout: Duration,
    ) -> Result<Vec<u8>, ClientError> {
        let url = connected_url(&self.nats);
        let spec = RequestSpec {
            id,
            sender: &self.me.identity,
            caller: &self.me.caller,
            collective: &self.collective,
            agent,
            ttl: {
                let ttl = self.ttl_for(timeout);
                if let Some(f) = &self.fence {
                    f.sent(ttl);
                }
                ttl
            },
            time_nanos: now_nanos(),
            filter,
            payload,
            reply_to,
            connected_url: &url,
        };
        Ok(self.me.signer.encode_request(&spec)?)
    }

    /// A directed request to one node, as the Go generated clients make it: the
    /// agent is in the filter, the reply comes on the caller's reply subject, and
    /// the wait is the discovery timeout plus the agent's DDL timeout.
    pub async fn rpc<T: Serialize>(
        &self,
        identity: &str,
        agent: &str,
        action: &str,
        data: &T,
    ) -> Result<RpcResult, ClientError> {
        self.rpc_with_timeout(identity, agent, action, data, self.rpc_timeout(agent))
            .await
    }

    /// go-choria's wait for a directed request to `agent`: the discovery
    /// timeout plus the agent's DDL timeout.
    pub fn rpc_timeout(&self, agent: &str) -> Duration {
        self.discovery_timeout + Duration::from_secs(mcorpc::agent_timeout_secs(agent))
    }

    pub async fn rpc_with_timeout<T: Serialize>(
        &self,
        identity: &str,
        agent: &str,
        action: &str,
        data: &T,
        timeout: Duration,
    ) -> Result<RpcResult, ClientError> {
        let opts = RpcOptions {
            timeout,
            confirm: None,
        };
        let (result, _) = self.request(identity, agent, action, data, opts).await?;
        Ok(result)
    }

    /// A directed request; its answer is the first reply that passes
    /// [`replies::classify`], every other message is ignored and reported.
    /// With `opts.confirm`, the reply subject stays watched after the answer
    /// and the [`Confirmation`] tells whether a different answer followed.
    pub async fn request<T: Serialize>(
        &self,
        identity: &str,
        agent: &str,
        action: &str,
        data: &T,
        opts: RpcOptions,
    ) -> Result<(RpcResult, Option<Confirmation>), ClientError> {
        let id = self.new_request_id();
        let reply_to = subjects::reply(&self.collective, &self.me.caller, &id);
        let body = crate::json::to_vec(&RpcRequest {
            agent,
            action,
            data,
        })
        .map_err(|source| ProtocolError::Encode {
            layer: protocol::Layer::Request,
            source,
        })?;
        let filter = Filter::with_agent(agent);
        let msg = self.encode(&id, agent, &filter, &body, &reply_to, opts.timeout)?;
        let target = subjects::node(&self.collective, identity);
        let mut sub = self.publish_awaiting(&reply_to, target, msg).await?;

        let rpc = format!("{agent}#{action}");
        let deadline = tokio::time::Instant::now() + opts.timeout;
        let mut tally = IgnoredTally::default();
        loop {
            let next = tokio::time::timeout_at(deadline, sub.next()).await;
            let Ok(Some(m)) = next else {
                let _ = sub.unsubscribe().await;
                return Err(ClientError::Timeout {
                    identity: identity.to_string(),
                    agent: agent.to_string(),
                    action: action.to_string(),
                    timeout: opts.timeout,
                    ignored: tally,
                });
            };
            let reply = match replies::classify(&m.payload, &id, identity) {
                Verdict::Answer(reply) => reply,
                Verdict::Ignore { why, claimed } => {
                    self.ignored(identity, &rpc, why, claimed.as_deref());
                    tally.add(why);
                    continue;
                }
            };
            // The node's own answer: a body that is not an RPC reply is its
            // failure, not a reason to wait on.
            let body: RpcReply = match serde_json::from_slice(&reply.message) {
                Ok(b) => b,
                Err(e) => {
                    let _ = sub.unsubscribe().await;
                    return Err(ClientError::BadReply {
                        identity: identity.to_string(),
                        reason: format!("reply body is not an RPC reply: {e}"),
                    });
                }
            };
            let confirmation = match opts.confirm {
                Some(window) if !window.is_zero() => Some(Confirmation::watch(
                    sub,
                    reply.clone(),
                    id,
                    identity.to_string(),
                    rpc,
                    window,
                    self.observer.clone(),
                )),
                _ => {
                    let _ = sub.unsubscribe().await;
                    None
                }
            };
            return Ok((RpcResult { reply, body }, confirmation));
        }
    }

    /// A directed `ping` to the node's discovery agent: `Ok` once the node
    /// answers in its own name (see [`replies::classify`]), as go-choria's
    /// discovery agent does for a ping sent to one node.
    pub async fn ping(&self, identity: &str, timeout: Duration) -> Result<(), ClientError> {
        let id = self.new_request_id();
        let reply_to = subjects::reply(&self.collective, &self.me.caller, &id);
        let filter = Filter::default();
        let msg = self.encode(&id, "discovery", &filter, b"cGluZw==", &reply_to, timeout)?;
        let target = subjects::node(&self.collective, identity);
        let mut sub = self.publish_awaiting(&reply_to, target, msg).await?;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut tally = IgnoredTally::default();
        let result = loop {
            match tokio::time::timeout_at(deadline, sub.next()).await {
                Ok(Some(m)) => match replies::classify(&m.payload, &id, identity) {
                    Verdict::Answer(_) => break Ok(()),
                    Verdict::Ignore { why, claimed } => {
                        self.ignored(identity, "discovery#ping", why, claimed.as_deref());
                        tally.add(why);
                    }
                },
                _ => {
                    break Err(ClientError::Timeout {
                        identity: identity.to_string(),
                        agent: "discovery".into(),
                        action: "ping".into(),
                        timeout,
                        ignored: tally,
                    })
                }
            }
        };
        let _ = sub.unsubscribe().await;
        result
    }

    /// Subscribes to `reply_to`, then publishes `msg` to `target`.
    async fn publish_awaiting(
        &self,
        reply_to: &str,
        target: String,
        msg: Vec<u8>,
    ) -> Result<async_nats::Subscriber, ClientError> {
        // While disconnected the NATS client buffers publishes and sends
        // them on reconnect: a request queued during an outage would reach
        // the node seconds later, possibly after this replica paused and
        // another took the node over. A request that cannot go now fails now
        // (an attempt failure, retried behind the pause gate).
        //
        // The check and the send are apart, and the client queues what it is
        // handed while it has not yet noticed a connection is gone: with
        // hundreds of sequences in flight the queue can be full, and a send
        // waiting for room can outlast the outage. So the request goes only
        // if it can within SEND_WITHIN of the check, on the same connection
        // (no reconnect in between); otherwise it is not sent at all (a send
        // not yet queued is dropped with its future), and the attempt fails.
        let connects = || {
            self.nats
                .statistics()
                .connects
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let connected = || self.nats.connection_state() == async_nats::connection::State::Connected;
        let before = connects();
        if !connected() {
            return Err(ClientError::NotConnected { subject: target });
        }
        let deadline = tokio::time::Instant::now() + SEND_WITHIN;
        let not_sent = |target: String| ClientError::NotConnected { subject: target };
        let sub = match tokio::time::timeout_at(deadline, self.nats.subscribe(reply_to.to_string()))
            .await
        {
            Ok(sub) => sub.map_err(|source| ClientError::Subscribe {
                subject: reply_to.to_string(),
                source,
            })?,
            Err(_) => return Err(not_sent(target)),
        };
        if !connected() || connects() != before {
            // Dropping the subscriber unsubscribes it.
            return Err(not_sent(target));
        }
        match tokio::time::timeout_at(deadline, self.nats.publish(target.clone(), msg.into())).await
        {
            Ok(sent) => sent.map_err(|source| ClientError::Publish {
                subject: target,
                source,
            })?,
            Err(_) => return Err(not_sent(target)),
        }
        Ok(sub)
    }

    /// Broadcast discovery of nodes matching `filter` (go-choria's broadcast
    /// discovery: a `ping` to the discovery agent, identities taken from the
    /// transport sender of each reply). Duplicates are removed.
    pub async fn discover(
        &self,
        filter: &Filter,
        opts: DiscoveryOptions,
    ) -> Result<Vec<String>, ClientError> {
        let mut found = Vec::new();
        self.discover_each(filter, opts, |n| found.push(n.to_string()))
            .await?;
        found.sort();
        Ok(found)
    }

    /// [`ChoriaClient::discover`], calling `on_found` once for each node as
    /// its reply arrives, so work can start before the discovery window
    /// closes. Names are told apart by a 64-bit hash (8 bytes per node
    /// instead of a copy of each name: a fleet of a million costs 8 MB); a
    /// collision would hide one node until the next round.
    pub async fn discover_each(
        &self,
        filter: &Filter,
        opts: DiscoveryOptions,
        mut on_found: impl FnMut(&str),
    ) -> Result<Discovered, ClientError> {
        let id = self.new_request_id();
        let reply_to = subjects::reply(&self.collective, &self.me.caller, &id);
        let msg = self.encode(
            &id,
            "discovery",
            filter,
            b"cGluZw==",
            &reply_to,
            opts.timeout,
        )?;
        let target = subjects::broadcast_agent(&self.collective, "discovery");
        let mut sub = self.publish_awaiting(&reply_to, target, msg).await?;

        let started = Instant::now();
        let hard_deadline = tokio::time::Instant::now() + opts.timeout;
        let mut window_deadline = hard_deadline;
        let mut found = std::collections::HashSet::new();
        let mut cut_short = false;
        loop {
            let deadline = window_deadline.min(hard_deadline);
            match tokio::time::timeout_at(deadline, sub.next()).await {
                Ok(Some(m)) => match protocol::transport_sender(&m.payload) {
                    Ok(sender) => {
                        if let Err(e) = identity::validate(&sender) {
                            self.rejected_identity("discovery", &e, &sender);
                        } else if !found.contains(&name_hash(&sender)) {
                            if found.len() >= opts.max_nodes {
                                self.ignored(&sender, "discovery", Ignored::Overflow, None);
                            } else {
                                on_found(&sender);
                                found.insert(name_hash(&sender));
                            }
                        }
                        if let Some(w) = opts.sliding_window {
                            window_deadline = tokio::time::Instant::now() + w;
                        }
                    }
                    Err(_) => self.ignored("", "discovery", Ignored::Undecodable, None),
                },
                Ok(None) => break,
                Err(_) => {
                    // The hard deadline came while replies still arrived
                    // (the sliding window had not closed).
                    cut_short = opts.sliding_window.is_some() && window_deadline > hard_deadline;
                    break;
                }
            }
        }
        let _ = sub.unsubscribe().await;
        debug!(found = found.len(), elapsed = ?started.elapsed(), cut_short, "discovery finished");
        Ok(Discovered {
            nodes: found.len(),
            cut_short,
        })
    }

    /// Publishes a lifecycle event in the Choria format (as the Go provisioner does
    /// for itself).
    pub async fn publish_event(&self, kind: EventType, event: &Event) -> Result<(), ClientError> {
        publish_event(&self.nats, kind, event, EventFormat::Choria).await
    }
}

/// The two lifecycle encodings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventFormat {
    Choria,
    CloudEvent,
}

pub async fn publish_event(
    nats: &async_nats::Client,
    kind: EventType,
    event: &Event,
    format: EventFormat,
) -> Result<(), ClientError> {
    let subject = lifecycle::subject(kind, &event.component);
    let payload = match format {
        EventFormat::Choria => event.to_choria_json(),
        EventFormat::CloudEvent => event.to_cloudevent_json(),
    };
    nats.publish(subject.clone(), payload.into())
        .await
        .map_err(|source| ClientError::Publish { subject, source })
}

/// Subscribes to lifecycle events of one type and component (no queue group, so
/// every replica sees every event).
pub async fn subscribe_events(
    nats: &async_nats::Client,
    kind: EventType,
    component: &str,
) -> Result<async_nats::Subscriber, ClientError> {
    let subject = lifecycle::subject(kind, component);
    nats.subscribe(subject.clone())
        .await
        .map_err(|source| ClientError::Subscribe { subject, source })
}

/// The URL of the server a connection is on, as Go records it in network hops
/// (`seen-by` / `trace`); empty before the first connection.
pub fn connected_url(nats: &async_nats::Client) -> String {
    let info = nats.server_info();
    if info.host.is_empty() {
        String::new()
    } else {
        format!("nats://{}:{}", info.host, info.port)
    }
}

pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// See [`ChoriaClient::ttl_for`]: `timeout` rounded up to whole seconds,
/// at least the version's minimum, at most `max` (Go's 60 s).
pub fn request_ttl(version: Version, timeout: Duration, max: i64) -> i64 {
    let wanted = i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX)
        + i64::from(timeout.subsec_nanos() > 0);
    let min = match version {
        Version::V1 => protocol::v1::MIN_TTL,
        Version::V2 => 1,
    };
    wanted.clamp(min, max.max(min))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_live_as_long_as_we_wait_for_them() {
        let s = Duration::from_secs;
        // Go's default wait for choria_provision: 2 s + 20 s.
        assert_eq!(request_ttl(Version::V2, s(22), 60), 22);
        assert_eq!(request_ttl(Version::V2, Duration::from_millis(2500), 60), 3);
        assert_eq!(request_ttl(Version::V2, Duration::ZERO, 60), 1);
        assert_eq!(request_ttl(Version::V2, s(300), 60), 60);
        // v1 servers refuse a TTL under 30.
        assert_eq!(request_ttl(Version::V1, s(3), 60), 30);
        assert_eq!(request_ttl(Version::V1, s(45), 60), 45);
    }

    #[test]
    fn a_refusal_names_what_a_choria_broker_checks_for_that_kind_of_login() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let provisioner = ConnectOptions {
            user: Some(("provisioner".into(), "secret".into())),
            ..Default::default()
        };
        let hint = refusal_hint(&provisioner);
        assert!(hint.contains("client_password") && hint.contains("client certificate"));
        assert!(!hint.contains("secret"), "never the password");
        let v2_provisioner = ConnectOptions {
            token: Some("jwt".into()),
            nats_jwt: Some(("jwt".into(), key.clone())),
            ..provisioner
        };
        assert_eq!(refusal_hint(&v2_provisioner), hint);
        let node = ConnectOptions {
            token: Some("jwt".into()),
            ..Default::default()
        };
        assert!(refusal_hint(&node).contains("signer_cert"));
        let client = ConnectOptions {
            token: Some("jwt".into()),
            nats_jwt: Some(("jwt".into(), key)),
            ..Default::default()
        };
        assert!(refusal_hint(&client).contains("client JWT"));
        assert!(refusal_hint(&ConnectOptions::default()).contains("authorization violation"));
    }
}

//! Sign once for many: the same directed request to many nodes goes out as
//! one signed message published to each node's own subject, as go-choria's
//! direct mode does (one request id, one reply subject, every target gets
//! the same bytes).
//!
//! Why: on protocol v1 every request is signed with our RSA key, ~0.5 ms of
//! CPU each, and most of a node's requests (`inventory`, `jwt`, `restart`)
//! are the same for every node. Requests with the same agent, action,
//! body, collective and wait that arrive within the batch window share one
//! signature.
//!
//! What stays as it was: each node gets the message on its own subject only
//! (a node sees nothing it would not have seen alone: the bytes are those
//! any node of the batch gets), and each request's answer is still the one
//! [`crate::replies::classify`] accepts for that node, with its own timeout
//! and confirmation window. The shared reply subject is read once and each
//! message handed to the request of the node it names as its transport
//! sender; what names no node of the batch is reported as ignored. Reply
//! subjects are no secret in the provisioning collective (anyone may
//! subscribe to `provisioning.node.>`), so sharing one gives a forger
//! nothing it did not have.

use super::{ChoriaClient, ClientError};
use crate::filter::Filter;
use crate::replies::{self, Ignored, ReplyObserver, ReplyStream, Verdict};
use crate::subjects;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Notify};

/// The most nodes one signed message goes to: a batch this full goes out
/// at once instead of waiting out the window.
pub const MAX_TARGETS: usize = 1024;

/// Messages queued for one node's request on a batch's reply subject: its
/// answer, and room for a duplicate or a forger's to be seen by the
/// confirmation window; past that they are dropped and counted.
const PER_NODE_QUEUE: usize = 8;

/// How long a batch's reply subject is kept after its requests' wait, at
/// most, for the confirmation windows of answers that came late (the
/// subscription normally ends as soon as every request let go of it).
const LINGER: Duration = Duration::from_secs(120);

/// What makes two requests the same message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    collective: String,
    agent: String,
    action: String,
    body: Vec<u8>,
    timeout: Duration,
}

/// A request waiting for its batch to go out.
struct Member {
    identity: String,
    ready: oneshot::Sender<Result<Ticket, ClientError>>,
}

/// The batch being gathered for one key.
struct Open {
    members: Vec<Member>,
    full: Arc<Notify>,
}

/// A request's place in a batch that went out.
pub(super) struct Ticket {
    pub(super) id: String,
    pub(super) replies: ReplyStream,
}

/// The batches being gathered, shared by a client and its clones.
pub(super) struct Batcher {
    window: Duration,
    open: Mutex<HashMap<Key, Open>>,
}

impl Batcher {
    pub(super) fn new(window: Duration) -> Self {
        Batcher {
            window,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Joins (or opens) the batch of requests like this one and waits for it
    /// to go out: the request id and this node's share of the replies.
    pub(super) async fn join(
        self: &Arc<Self>,
        client: &ChoriaClient,
        identity: &str,
        agent: &str,
        action: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Ticket, ClientError> {
        let key = Key {
            collective: client.collective.clone(),
            agent: agent.to_string(),
            action: action.to_string(),
            body,
            timeout,
        };
        let (ready, ticket) = oneshot::channel();
        let member = Member {
            identity: identity.to_string(),
            ready,
        };
        let opened = {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            match open.get_mut(&key) {
                // The same node twice in one batch would share an answer:
                // the second request goes alone.
                Some(batch) if batch.members.iter().any(|m| m.identity == identity) => Err(member),
                Some(batch) => {
                    batch.members.push(member);
                    if batch.members.len() >= MAX_TARGETS {
                        batch.full.notify_one();
                    }
                    Ok(None)
                }
                None => {
                    let full = Arc::new(Notify::new());
                    open.insert(
                        key.clone(),
                        Open {
                            members: vec![member],
                            full: full.clone(),
                        },
                    );
                    Ok(Some(full))
                }
            }
        };
        match opened {
            Err(alone) => client.send_batch(&key, vec![alone]).await,
            Ok(Some(full)) => self.send_when_due(client.clone(), key, full),
            Ok(None) => {}
        }
        ticket.await.unwrap_or_else(|_| {
            Err(ClientError::NotConnected {
                subject: subjects::node(&client.collective, identity),
            })
        })
    }

    /// Sends the batch under `key` once the window is over or it is full.
    fn send_when_due(self: &Arc<Self>, client: ChoriaClient, key: Key, full: Arc<Notify>) {
        let this = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(this.window) => {}
                _ = full.notified() => {}
            }
            let batch = this
                .open
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
            if let Some(batch) = batch {
                client.send_batch(&key, batch.members).await;
            }
        });
    }
}

impl ChoriaClient {
    /// One signed message for every member, published to each member's
    /// subject; each member gets its ticket (or why its request did not go).
    async fn send_batch(&self, key: &Key, members: Vec<Member>) {
        let id = self.new_request_id();
        let reply_to = subjects::reply(&self.collective, &self.me.caller, &id);
        let filter = Filter::with_agent(&key.agent);
        let first = subjects::node(&self.collective, &members[0].identity);
        let sent = match self.encode(&id, &key.agent, &filter, &key.body, &reply_to, key.timeout) {
            Ok(msg) => self
                .subscribe_to_send(&reply_to, &first)
                .await
                .map(|s| (msg, s)),
            Err(e) => Err(e),
        };
        let (msg, (sub, window)) = match sent {
            Ok(sent) => sent,
            Err(e) => {
                let reason = e.to_string();
                for m in members {
                    let _ = m.ready.send(Err(ClientError::NotSent {
                        reason: reason.clone(),
                    }));
                }
                return;
            }
        };
        let msg = bytes::Bytes::from(msg);
        let mut routes = HashMap::with_capacity(members.len());
        for m in members {
            if m.ready.is_closed() {
                continue; // the request was given up while its batch gathered
            }
            let target = subjects::node(&self.collective, &m.identity);
            if let Err(e) = self.publish_next(&window, target, msg.clone()).await {
                let _ = m.ready.send(Err(e));
                continue;
            }
            let (tx, rx) = mpsc::channel(PER_NODE_QUEUE);
            let ticket = Ticket {
                id: id.clone(),
                replies: ReplyStream::Shared(rx),
            };
            if m.ready.send(Ok(ticket)).is_ok() {
                routes.insert(m.identity, tx);
            }
        }
        let rpc = format!("{}#{}", key.agent, key.action);
        if let Some(o) = self.observer.as_ref().filter(|_| !routes.is_empty()) {
            o.batched(&rpc, routes.len());
        }
        let until = tokio::time::Instant::now() + key.timeout + LINGER;
        tokio::spawn(route_replies(
            sub,
            id,
            rpc,
            routes,
            until,
            self.observer.clone(),
        ));
    }
}

/// Reads a batch's reply subject until every request let go of its share
/// (or `until`), handing each message to the request of the node it names.
async fn route_replies(
    mut sub: async_nats::Subscriber,
    id: String,
    rpc: String,
    routes: HashMap<String, mpsc::Sender<async_nats::Message>>,
    until: tokio::time::Instant,
    observer: Option<Arc<dyn ReplyObserver>>,
) {
    let senders: Vec<_> = routes.values().cloned().collect();
    let all_done = futures::future::join_all(senders.iter().map(|tx| tx.closed()));
    tokio::pin!(all_done);
    loop {
        let m = tokio::select! {
            _ = &mut all_done => break,
            _ = tokio::time::sleep_until(until) => break,
            m = sub.next() => match m {
                Some(m) => m,
                None => break,
            },
        };
        let node = crate::protocol::transport_sender(&m.payload).ok();
        match node
            .as_deref()
            .and_then(|n| routes.get(n).map(|tx| (n, tx)))
        {
            Some((node, tx)) => match tx.try_send(m) {
                Err(mpsc::error::TrySendError::Full(_)) => {
                    report(&observer, node, &rpc, Ignored::Overflow, Some(node));
                }
                // Its request is over (answered, or given up): as for a
                // request of its own, what comes later is not read.
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            },
            None => {
                // Names no node of the batch: whatever it is, it is no
                // request's answer (classified only to say why).
                let (why, claimed) = match replies::classify(&m.payload, &id, "") {
                    Verdict::Ignore { why, claimed } => (why, claimed),
                    Verdict::Answer(r) => (Ignored::OtherSender, Some(r.sender)),
                };
                report(&observer, "", &rpc, why, claimed.as_deref());
            }
        }
    }
    let _ = sub.unsubscribe().await;
}

fn report(
    observer: &Option<Arc<dyn ReplyObserver>>,
    node: &str,
    rpc: &str,
    why: Ignored,
    claimed: Option<&str>,
) {
    if let Some(o) = observer {
        o.ignored(node, rpc, why, claimed);
    }
}

//! The directed request path: one request to one node, its answer told
//! apart from whatever else arrives on the reply subject.

use super::{ChoriaClient, ClientError};
use crate::filter::Filter;
use crate::mcorpc::{self, RpcReply, RpcRequest};
use crate::protocol::{self, ProtocolError, Reply};
use crate::replies::{self, Confirmation, IgnoredTally, ReplyStream, Verdict};
use crate::subjects;
use futures::StreamExt;
use serde::Serialize;
use std::time::Duration;

/// A decoded RPC reply.
#[derive(Clone, Debug)]
pub struct RpcResult {
    pub reply: Reply,
    pub body: RpcReply,
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
        let body = crate::json::to_vec(&RpcRequest {
            agent,
            action,
            data,
        })
        .map_err(|source| ProtocolError::Encode {
            layer: protocol::Layer::Request,
            source,
        })?;
        let (id, mut sub) = self
            .send(identity, (agent, action), body, opts.timeout)
            .await?;
        let rpc = format!("{agent}#{action}");
        let deadline = tokio::time::Instant::now() + opts.timeout;
        let mut tally = IgnoredTally::default();
        loop {
            let next = tokio::time::timeout_at(deadline, sub.next()).await;
            let Ok(Some(m)) = next else {
                sub.close().await;
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
                    sub.close().await;
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
                    sub.close().await;
                    None
                }
            };
            return Ok((RpcResult { reply, body }, confirmation));
        }
    }

    /// Sends the request, alone or in a batch: its id and where its
    /// replies arrive.
    async fn send(
        &self,
        identity: &str,
        (agent, action): (&str, &str),
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(String, ReplyStream), ClientError> {
        if let Some(batcher) = &self.batcher {
            let t = batcher
                .join(self, identity, agent, action, body, timeout)
                .await?;
            return Ok((t.id, t.replies));
        }
        let id = self.new_request_id();
        let reply_to = subjects::reply(&self.collective, &self.me.caller, &id);
        let filter = Filter::with_agent(agent);
        let msg = self.encode(&id, agent, &filter, &body, &reply_to, timeout)?;
        let target = subjects::node(&self.collective, identity);
        let sub = self.publish_awaiting(&reply_to, target, msg).await?;
        if let Some(o) = &self.observer {
            o.batched(&format!("{agent}#{action}"), 1);
        }
        Ok((id, ReplyStream::Own(sub)))
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
}

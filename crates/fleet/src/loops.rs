//! The tasks that take requests off a connection's subscriptions and hand
//! each to the node it is for: directed requests (one subscription per node,
//! or one shared by all), requests to provisioned nodes, and broadcasts.

use crate::context::{Ctx, Link, NodeRef};
use crate::journal::{Entry, Outcome};
use crate::node::Mode;
use crate::serve::serve;
use choria_wire::protocol::{self, Request};
use choria_wire::subjects;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::debug;

pub(crate) async fn directed_loop(
    node: NodeRef,
    mut sub: async_nats::Subscriber,
    link: Link,
    ctx: Ctx,
) {
    while let Some(msg) = sub.next().await {
        // A node that left the collective is no longer subscribed in go-choria;
        // whatever was still in flight is simply never received.
        if node.lock().expect("node lock").mode != Mode::Provisioning {
            break;
        }
        let Some(req) = decode_directed(&node, &msg, &ctx) else {
            continue;
        };
        if is_slow(&node, &ctx) {
            // go-choria serialises a node's provisioning actions: a slow
            // node is slow for each request in turn.
            tokio::time::sleep(ctx.slow_delay).await;
        }
        serve(&node, &req, &link, &ctx).await;
    }
}

/// `--directed shared`: one subscription per connection for every node's
/// subject; each request goes to its node. A request for a name no node
/// has, or for a node that left provisioning, is dropped, as the broker
/// would not have delivered it to anyone.
pub(crate) async fn shared_directed_loop(
    by_name: Arc<HashMap<String, NodeRef>>,
    turns: Arc<SlowTurns>,
    mut sub: async_nats::Subscriber,
    link: Link,
    ctx: Ctx,
) {
    let prefix = subjects::node(subjects::PROVISIONING_COLLECTIVE, "");
    while let Some(msg) = sub.next().await {
        let Some(node) = msg
            .subject
            .strip_prefix(prefix.as_str())
            .and_then(|name| by_name.get(name))
        else {
            continue;
        };
        if node.lock().expect("node lock").mode != Mode::Provisioning {
            continue;
        }
        let Some(req) = decode_directed(node, &msg, &ctx) else {
            continue;
        };
        if !is_slow(node, &ctx) {
            serve(node, &req, &link, &ctx).await;
            continue;
        }
        // A slow node answers its requests in turn, each after the delay;
        // the others on this connection do not wait for it.
        let (node, link, ctx, turns) = (node.clone(), link.clone(), ctx.clone(), turns.clone());
        tokio::spawn(async move {
            let index = node.lock().expect("node lock").index;
            let _turn = turns.take(index).await;
            tokio::time::sleep(ctx.slow_delay).await;
            serve(&node, &req, &link, &ctx).await;
        });
    }
}

/// `--serve-provisioned`: requests in any collective but the provisioning
/// one, to provisioned nodes (which answer in their own collective).
pub(crate) async fn provisioned_loop(
    by_name: Arc<HashMap<String, NodeRef>>,
    mut sub: async_nats::Subscriber,
    link: Link,
    ctx: Ctx,
) {
    let provisioning = format!("{}.", subjects::PROVISIONING_COLLECTIVE);
    while let Some(msg) = sub.next().await {
        if msg.subject.starts_with(provisioning.as_str()) {
            continue;
        }
        let Some(node) = msg
            .subject
            .split_once(".node.")
            .and_then(|(_, name)| by_name.get(name))
        else {
            continue;
        };
        if node.lock().expect("node lock").mode != Mode::Provisioned {
            continue;
        }
        if let Some(req) = decode_directed(node, &msg, &ctx) {
            serve(node, &req, &link, &ctx).await;
        }
    }
}

/// One lock per slow node, so its requests are answered in turn.
pub(crate) struct SlowTurns(Vec<tokio::sync::Mutex<()>>);

impl SlowTurns {
    pub(crate) fn new(slow_nodes: usize) -> Self {
        SlowTurns(
            (0..slow_nodes)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
        )
    }

    async fn take(&self, index: usize) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        Some(self.0.get(index)?.lock().await)
    }
}

fn is_slow(node: &NodeRef, ctx: &Ctx) -> bool {
    ctx.slow_delay > Duration::ZERO && node.lock().expect("node lock").index < ctx.slow_nodes
}

/// The request in `msg`, or `None` (journaled) when a real server would
/// drop it as undecodable.
fn decode_directed(node: &NodeRef, msg: &async_nats::Message, ctx: &Ctx) -> Option<Request> {
    match protocol::decode_request(&msg.payload, ctx.protocol) {
        Ok(r) => Some(r),
        Err(e) => {
            // A real server logs and drops what it cannot decode.
            let identity = node.lock().expect("node lock").identity.clone();
            debug!(node = %identity, error = %e, "dropping undecodable request");
            record_drop(ctx, &identity, &e.to_string());
            None
        }
    }
}

pub(crate) async fn broadcast_loop(
    nodes: Vec<NodeRef>,
    mut subs: futures::stream::SelectAll<async_nats::Subscriber>,
    link: Link,
    ctx: Ctx,
) {
    while let Some(msg) = subs.next().await {
        let req = match protocol::decode_request(&msg.payload, ctx.protocol) {
            Ok(r) => r,
            Err(e) => {
                debug!(error = %e, subject = %msg.subject, "dropping undecodable broadcast");
                record_drop(&ctx, "*", &e.to_string());
                continue;
            }
        };
        for node in &nodes {
            let interested = node.lock().expect("node lock").accepts(&req);
            if interested {
                serve(node, &req, &link, &ctx).await;
            }
        }
    }
}

fn record_drop(ctx: &Ctx, node: &str, reason: &str) {
    ctx.journal.record(Entry::action(
        node,
        None,
        "",
        Outcome::Dropped,
        None,
        reason,
    ));
}

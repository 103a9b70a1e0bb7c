//! One request on one node: its reply (or the lack of one), the journal
//! entry, and the effects that follow (lifecycle events, a restart or a
//! shutdown after the splay).

use crate::context::{Ctx, Link, NodeRef};
use crate::journal::{self, Entry, Outcome};
use crate::node::{Failure, Handled, Mode, Response};
use crate::{PROVISION_MODE_COMPONENT, SERVER_COMPONENT};
use choria_wire::client::{self, EventFormat};
use choria_wire::lifecycle::{Event, EventType};
use choria_wire::protocol::{self, ReplySpec, Request, Version};
use rand::Rng;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tracing::{debug, warn};

/// Handles one request on one node, replies, journals, and carries out effects.
pub(crate) async fn serve(node: &NodeRef, req: &Request, link: &Link, ctx: &Ctx) {
    ctx.counters.requests.fetch_add(1, Ordering::Relaxed);
    let (handled, identity, failure, version, component) = {
        let mut n = node.lock().expect("node lock");
        // A provisioned node's events name the `server` component.
        let component = if n.mode == Mode::Provisioned {
            SERVER_COMPONENT
        } else {
            PROVISION_MODE_COMPONENT
        };
        let h = n.handle(req, client::now_nanos());
        (
            h,
            n.identity.clone(),
            n.failure,
            n.version.clone(),
            component,
        )
    };
    let outcome = respond(req, &handled, &identity, failure, link, ctx).await;
    let statusmsg = match &handled.response {
        Response::NoReply(reason) => reason,
        _ => &handled.statusmsg,
    };
    ctx.journal.record(Entry::action(
        &identity,
        Some(req),
        &handled.action,
        outcome,
        handled.statuscode.map(u8::from),
        statusmsg,
    ));

    for event in &handled.effects.events {
        let v = matches!(event, EventType::Upgraded).then_some(version.as_str());
        publish_event(&link.nats, ctx, &identity, *event, component, v).await;
    }
    if let Some(delay) = handled.effects.restart_after {
        tokio::spawn(restart_later(
            node.clone(),
            link.nats.clone(),
            ctx.clone(),
            delay,
        ));
    }
    if let Some(delay) = handled.effects.shutdown_after {
        tokio::spawn(shutdown_later(node.clone(), ctx.clone(), delay));
    }
}

/// Sends what the node made of `req` (its reply, a malformed one, or
/// nothing) and says how that goes in the journal.
async fn respond(
    req: &Request,
    handled: &Handled,
    identity: &str,
    failure: Option<Failure>,
    link: &Link,
    ctx: &Ctx,
) -> Outcome {
    let nats = &link.nats;
    match &handled.response {
        Response::Reply(body) => {
            let spec = ReplySpec {
                request_id: &req.id,
                sender: identity,
                agent: &req.agent,
                time_nanos: client::now_nanos(),
                body,
                connected_url: &link.url,
            };
            match protocol::encode_reply(req.version, &spec) {
                Ok(bytes) => {
                    if let Err(e) = nats.publish(req.reply_to.clone(), bytes.into()).await {
                        warn!(node = %identity, error = %e, "could not publish reply");
                    }
                    ctx.counters.replies.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => warn!(node = %identity, error = %e, "could not encode reply"),
            }
            match handled.statuscode {
                Some(code) if code != choria_wire::mcorpc::StatusCode::Ok => Outcome::Error,
                _ => Outcome::Ok,
            }
        }
        Response::Malformed => {
            let garbage = malformed_reply(req.version, identity);
            let _ = nats.publish(req.reply_to.clone(), garbage.into()).await;
            Outcome::Malformed
        }
        Response::NoReply(reason) => {
            debug!(node = %identity, %reason, agent = %req.agent, "not replying");
            if failure == Some(Failure::Silent) {
                Outcome::Silent
            } else {
                Outcome::Dropped
            }
        }
    }
}

/// The end of the `shutdown` action's splay: the node stops.
async fn shutdown_later(node: NodeRef, ctx: Ctx, delay: Duration) {
    tokio::time::sleep(delay).await;
    let (was, failure) = {
        let mut n = node.lock().expect("node lock");
        let was = n.mode;
        n.complete_shutdown();
        (was, n.failure)
    };
    if was == Mode::Provisioning {
        ctx.node_left(failure);
    }
}

/// The re-exec: after the splay the node either leaves provisioning (and
/// announces itself as a normal server) or comes back into it.
async fn restart_later(node: NodeRef, nats: async_nats::Client, ctx: Ctx, delay: Duration) {
    tokio::time::sleep(delay).await;
    let (identity, version, was, mode, failure) = {
        let mut n = node.lock().expect("node lock");
        let was = n.mode;
        n.complete_restart();
        (
            n.identity.clone(),
            n.version.clone(),
            was,
            n.mode,
            n.failure,
        )
    };
    let component = if mode == Mode::Provisioned {
        SERVER_COMPONENT
    } else {
        PROVISION_MODE_COMPONENT
    };
    publish_event(
        &nats,
        &ctx,
        &identity,
        EventType::Startup,
        component,
        Some(&version),
    )
    .await;
    if was == Mode::Provisioning && mode != Mode::Provisioning {
        ctx.node_left(failure);
    }
}

pub(crate) async fn publish_event(
    nats: &async_nats::Client,
    ctx: &Ctx,
    identity: &str,
    kind: EventType,
    component: &str,
    version: Option<&str>,
) {
    let event = Event::new(kind, identity, component, version);
    if let Err(e) = client::publish_event(nats, kind, &event, EventFormat::CloudEvent).await {
        warn!(node = %identity, error = %e, "could not publish lifecycle event");
    }
    let (time, time_us) = journal::timestamp();
    ctx.journal.record(Entry::Event {
        node: identity.to_string(),
        event: kind.name().to_string(),
        component: component.to_string(),
        time,
        time_us,
    });
}

/// A reply whose transport is well-formed enough to be routed and attributed,
/// but whose secure layer fails the hash check.
fn malformed_reply(version: Version, identity: &str) -> Vec<u8> {
    let random: u32 = rand::thread_rng().gen();
    match version {
        Version::V1 => serde_json::json!({
            "protocol": protocol::v1::TRANSPORT_PROTOCOL,
            "data": base64_of(&format!(r#"{{"protocol":"choria:secure:reply:1","message":"{{}}","hash":"bogus{random}"}}"#)),
            "headers": {"mc_sender": identity}
        }),
        Version::V2 => serde_json::json!({
            "protocol": protocol::v2::TRANSPORT_PROTOCOL,
            "data": base64_of(&format!(r#"{{"protocol":"io.choria.protocol.v2.secure_reply","reply":"e30=","hash":"bogus{random}"}}"#)),
            "headers": {"sender": identity}
        }),
    }
    .to_string()
    .into_bytes()
}

fn base64_of(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

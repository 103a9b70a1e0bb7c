//! The dispatcher: takes offered nodes off their lane and runs each one's
//! [`HostSequence`] in a task of its own, then records how it ended.
//!
//! Waiting costs nothing but a timer. A sequence spends most of its life
//! waiting for a node's replies (and the reply windows after them); only
//! its work — the template, the helper, signing — takes one of the
//! `workers` slots, so thousands of waits in flight never hold up the
//! work. What bounds the waits is each lane's in-flight budget
//! ([`IN_FLIGHT`]): names from events and from discovery have their own, so
//! a flood of one cannot delay the other, and names that failed before (the
//! suspect lane) have one of their own, so they are retried behind names
//! that have not failed. A sequence whose attempt fails gives its lane's
//! place up and finishes its retries in the suspect lane's, or, when that
//! is full, ends there and is offered again at the
//! next discovery (behind the names that have not failed): a made-up name
//! that answers a discovery (or a ping, or the `jwt` request, with the
//! fleet's shared provisioning JWT) and then stalls costs its timeouts in
//! timers and one attempt in the budget of the names that came with it,
//! never a worker, and the sequences alive at once are bounded by the
//! lanes' budgets.
//!
//! There is no separate confirmation round trip: a sequence's first
//! request is what confirms the name (it must answer in its own name, see
//! [`choria_wire::replies`]); until it does, nothing about the name is
//! logged above debug, and a first request nobody answers is not retried:
//! the name is offered again at the next discovery, in the suspect lane.

use crate::provision::pipeline::context::Context;
use crate::provision::pipeline::lanes::{LanePlace, Pool};
use crate::provision::pipeline::registry;
use crate::provision::pipeline::registry::{Lane, Ticket};
use crate::provision::sequence::{HostSequence, Outcome, ProvisionError};
use crate::provision::traces::{NodeTrace, Value};
use choria_wire::client::ChoriaClient;
use std::sync::Arc;
use tracing::{debug, error, info, warn};

/// Takes `lane`'s tickets until the lanes close, and starts each one's
/// sequence once the lane has room for it.
pub(crate) async fn run(lane: Lane, ctx: Arc<Context>, client: Arc<ChoriaClient>, pool: Pool) {
    debug!(?lane, "dispatcher starting");
    while let Some(ticket) = ctx.registry.next(lane).await {
        let Ok(permit) = pool.lane(lane).acquire().await else {
            break;
        };
        // The term first, then whether the ticket is current: a loss
        // between the two leaves the sequence in a term that is over.
        let term = ctx.gate.term();
        // A lane can hold registrations since replaced or dropped (lost
        // leadership, a shutdown), or nodes no longer ours: skip those.
        if !ctx.ownership.owns(&ticket.identity) {
            ctx.registry.remove(&ticket);
            continue;
        }
        if !ctx.registry.start(&ticket) {
            debug!(node = %ticket.identity, "skipping a stale entry");
            continue;
        }
        let place = LanePlace::new(
            permit,
            lane,
            pool.lane(lane).clone(),
            pool.lane(Lane::Suspect).clone(),
        );
        let (ctx, client) = (ctx.clone(), client.clone());
        pool.tracker.spawn(async move {
            let _in_flight = ctx.metrics.sequence();
            // A sequence that never ends (a panic, an abort at shutdown)
            // must not leave its node registered as worked for ever.
            let lost = Lost {
                ctx: ctx.clone(),
                ticket: Some(ticket.clone()),
            };
            let identity = Arc::from(ticket.identity.as_str());
            let waiting = ticket.added.elapsed();
            let trace = ctx
                .sequences
                .tracer
                .node(&ticket.identity, source(ticket.source), waiting);
            let trace = trace.map(Arc::new);
            let seq = HostSequence::new(ctx.sequences.clone(), client, identity, term)
                .in_lane(place, ticket.source)
                .traced(trace.clone());
            let result = seq.run(waiting).await;
            lost.defuse();
            let trace_id = trace.as_deref().map(NodeTrace::trace_id);
            ctx.metrics
                .observe_sequence(ticket.added.elapsed(), trace_id);
            if let Some(trace) = &trace {
                finish_trace(&ctx, trace, &result);
            }
            record(&ctx, ticket, result);
        });
    }
    debug!(?lane, "dispatcher stopped");
}

/// Where a node's name came from, as its trace says it.
fn source(s: registry::Source) -> &'static str {
    match s {
        registry::Source::Discovery => "discovery",
        registry::Source::Event => "startup event",
    }
}

/// Ends a node's trace with what configured it and how its sequence
/// ended (the error as the log prints it; never a secret).
fn finish_trace(ctx: &Context, trace: &NodeTrace, result: &Result<Outcome, ProvisionError>) {
    let outcome = match result {
        Ok(Outcome::Provisioned(_)) => "provisioned",
        Ok(Outcome::Shutdown) => "shutdown",
        Ok(Outcome::Upgrading { .. }) => "upgrading",
        Err(e) if e.is_pause() => "paused",
        Err(ProvisionError::Unconfirmed { .. }) => "unconfirmed",
        Err(ProvisionError::Deferred(_) | ProvisionError::PolicyDeferred(_)) => "deferred",
        Err(_) => "failed",
    };
    let mut attributes: Vec<(&'static str, Value)> = vec![
        ("choria.mode", ctx.sequences.mode().into()),
        ("choria.outcome", outcome.into()),
    ];
    if let Err(e) = result {
        attributes.push(("choria.failed_step", e.step().into()));
    }
    let error = result.as_ref().err().map(|e| e as &dyn std::fmt::Display);
    trace.finish(attributes, error);
}

/// The admission policy's own decision (or its fail-closed refusal), for
/// a node that answered: a warning or an info line, at a bounded rate, as
/// whoever holds the fleet's provisioning JWT can offer names the policy
/// refuses; the node waits in the suspect lane like any failed one.
fn not_admitted(ctx: &Context, ticket: &Ticket, e: &ProvisionError) {
    ctx.metrics.provision_error();
    let deferred = matches!(e, ProvisionError::PolicyDeferred(_));
    let kind = if deferred {
        "admission deferred"
    } else {
        "admission refused"
    };
    if let crate::provision::suspects::Allow::Yes { suppressed } =
        ctx.logs.check(kind, std::time::Instant::now())
    {
        if deferred {
            info!(node = %ticket.identity, reason = %e, suppressed_before = suppressed, "not provisioning the node this cycle");
        } else {
            warn!(node = %ticket.identity, reason = %e, suppressed_before = suppressed, "not provisioning the node");
        }
    }
    ctx.registry.failed(ticket);
}

/// The audit event of a sequence's end, when it was a decision about a node
/// that answered: provisioned, shut down, refused by a check, denied by the
/// policy, or deferred. Pauses, lost locks and names that never answered
/// are not decisions (and anyone can make up names).
fn audit(ctx: &Context, node: &str, result: &Result<Outcome, ProvisionError>) {
    use crate::audit::event::Kind;
    let because = |e: &ProvisionError| {
        serde_json::json!({
            "step": e.step(),
            "reason": crate::provision::text::one_line(&e.to_string(), 500),
        })
    };
    let (kind, data) = match result {
        // Audited by the sequence when the node was configured.
        Ok(Outcome::Provisioned(_)) => return,
        Ok(Outcome::Shutdown) => (Kind::Shutdown, serde_json::json!({})),
        Ok(Outcome::Upgrading { .. }) => return,
        Err(e) => match e {
            ProvisionError::PolicyDenied(_)
            | ProvisionError::Policy(_)
            | ProvisionError::Evidence(_)
            | ProvisionError::InstanceBound { .. }
            | ProvisionError::NameBound { .. } => (Kind::Denied, because(e)),
            ProvisionError::PolicyDeferred(_) | ProvisionError::Deferred(_) => {
                (Kind::Deferred, because(e))
            }
            ProvisionError::Jwt(_)
            | ProvisionError::TokenMismatch
            | ProvisionError::IdentityBound { .. }
            | ProvisionError::Revoked { .. }
            | ProvisionError::HeldElsewhere { .. }
            | ProvisionError::Ed25519(_)
            | ProvisionError::Csr(_)
            | ProvisionError::NoCsr
            | ProvisionError::Refused(_)
            | ProvisionError::Conflict(_) => (Kind::Refused, because(e)),
            _ => return,
        },
    };
    if matches!(kind, Kind::Denied | Kind::Refused) {
        ctx.metrics.refused_node();
    }
    ctx.auditor.event(kind, node, data);
}

/// Forgets its node when dropped before [`Lost::defuse`].
struct Lost {
    ctx: Arc<Context>,
    ticket: Option<Arc<Ticket>>,
}

impl Lost {
    fn defuse(mut self) {
        self.ticket = None;
    }
}

impl Drop for Lost {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            error!(node = %ticket.identity, "a node's sequence ended without an outcome; forgetting the node so a later discovery retries it");
            self.ctx.registry.remove(&ticket);
        }
    }
}

/// What a node's sequence ended with: metrics, the log line, and what the
/// registry does with the node.
fn record(ctx: &Context, ticket: Arc<Ticket>, result: Result<Outcome, ProvisionError>) {
    audit(ctx, &ticket.identity, &result);
    match result {
        // Its record went to the recorder when it was configured.
        Ok(Outcome::Provisioned(_)) => {
            ctx.metrics.provisioned();
            info!(node = %ticket.identity, "provisioned");
            ctx.registry
                .remove_later(ticket, registry::HOLD_AFTER_SUCCESS);
        }
        Ok(Outcome::Shutdown) => {
            ctx.registry
                .remove_later(ticket, registry::HOLD_AFTER_SUCCESS);
        }
        Ok(Outcome::Upgrading { to }) => {
            info!(node = %ticket.identity, version = %to, "node is upgrading; it is provisioned after its next startup");
            ctx.registry.remove(&ticket);
        }
        Err(e) if e.is_pause() => {
            // Thousands may be in flight (waiting): one line each would
            // bury the pause's own.
            debug!(node = %ticket.identity, reason = %e, "stopped provisioning the node");
            ctx.registry.remove(&ticket);
        }
        Err(e @ ProvisionError::Locked { .. }) => {
            // Not ours to work now; a later discovery finds it again if
            // its holder does not finish it (the lock lasts two minutes).
            info!(node = %ticket.identity, reason = %e, "left the node to the provisioner holding it");
            ctx.registry.remove(&ticket);
        }
        Err(e @ ProvisionError::Stale(_)) => {
            // It waited too long before its sequence started: nothing is
            // known of it, not even that it exists.
            debug!(node = %ticket.identity, reason = %e, "not provisioning the node");
            ctx.registry.remove(&ticket);
        }
        Err(e) => failed(ctx, ticket, e),
    }
}

/// A sequence that failed for its node: counted, logged (at a bounded rate
/// where anyone could cause it), and the name remembered as failed so it
/// is retried behind the names that have not failed.
fn failed(ctx: &Context, ticket: Arc<Ticket>, e: ProvisionError) {
    match e {
        e @ ProvisionError::DeniedIdentity(_) => {
            // Anyone can offer names that match the deny list.
            ctx.metrics.provision_error();
            if let crate::provision::suspects::Allow::Yes { suppressed } =
                ctx.logs.check("denied identity", std::time::Instant::now())
            {
                warn!(node = %ticket.identity, error = %e, suppressed_before = suppressed, "not provisioning the node");
            }
            ctx.registry.failed(&ticket);
        }
        e @ (ProvisionError::PolicyDenied(_)
        | ProvisionError::Policy(_)
        | ProvisionError::PolicyDeferred(_)
        | ProvisionError::Revoked { .. }
        | ProvisionError::HeldElsewhere { .. }
        | ProvisionError::Evidence(_)
        | ProvisionError::InstanceBound { .. }
        | ProvisionError::NameBound { .. }) => not_admitted(ctx, &ticket, &e),
        ProvisionError::Unconfirmed { rpc, tries, last } => {
            // Nobody answered in its name: a made-up name, or a node gone.
            match ticket.source {
                registry::Source::Discovery => ctx.metrics.unconfirmed_discovery(),
                registry::Source::Event => ctx.metrics.unconfirmed_event(),
            }
            debug!(node = %ticket.identity, rpc, tries, last = %last, "the node never answered; not provisioned");
            ctx.registry.failed(&ticket);
        }
        e @ ProvisionError::Rpc { .. } => {
            // A node that answered and then stopped answering: whoever has
            // the fleet's provisioning JWT can make up any number of those,
            // so these lines come at a bounded rate (the metric counts all).
            ctx.metrics.provision_error();
            if let crate::provision::suspects::Allow::Yes { suppressed } =
                ctx.logs.check("provision error", std::time::Instant::now())
            {
                error!(node = %ticket.identity, step = %e.step(), error = %e, suppressed_before = suppressed, "could not provision the node");
            }
            ctx.registry.failed(&ticket);
        }
        e => {
            ctx.metrics.provision_error();
            error!(node = %ticket.identity, step = %e.step(), error = %e, "could not provision the node");
            ctx.registry.failed(&ticket);
        }
    }
}

//! Wiring the nodes to the broker: the connections they are spread over, the
//! subscriptions that feed each connection's tasks, the start-up
//! announcements, and letting go of it all when the fleet stops.

use crate::context::{Ctx, Link, NodeRef};
use crate::loops::{
    broadcast_loop, directed_loop, provisioned_loop, shared_directed_loop, SlowTurns,
};
use crate::serve::publish_event;
use crate::{node, Directed, FleetError, FleetOptions, PROVISION_MODE_COMPONENT};
use choria_wire::client::{self, ClientError, ConnectOptions};
use choria_wire::lifecycle::EventType;
use choria_wire::subjects;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// The longest the fleet waits to flush its connections when it stops.
const FLUSH_AT_STOP: Duration = Duration::from_millis(500);

/// The queue group of `--directed shared`, with [`queue_group`]'s suffix.
const SHARED_QUEUE: &str = "choria-fleet";

/// This fleet's own queue group: its connections share the work, and
/// another fleet on the same broker (a second prefix, a later wave) must not
/// take its messages, which it would drop as addressed to nodes it lacks.
fn queue_group(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{SHARED_QUEUE}{what}-{}-{nanos}", std::process::id())
}

/// The fleet's connections and the tasks serving their subscriptions. Kept
/// apart from [`Wiring::start`] so that a fleet stopped half-way through
/// start-up still lets go of what it had made.
pub(crate) struct Wiring {
    /// How many connections the nodes are spread over.
    pub(crate) connections: usize,
    /// The token the connections present, if any.
    token: Option<String>,
    conns: Vec<async_nats::Client>,
    tasks: Vec<JoinHandle<()>>,
}

/// What the shared subscriptions of every connection route by.
struct Routes {
    /// `--directed shared` and `--serve-provisioned`: every node by name.
    by_name: Arc<HashMap<String, NodeRef>>,
    turns: Arc<SlowTurns>,
    directed_group: String,
    provisioned_group: String,
}

impl Wiring {
    pub(crate) fn new(opts: &FleetOptions, jwt: &str) -> Self {
        // Connect like provisioning-mode servers: the provisioning JWT as the
        // token — unless the URL carries a user, as when a test broker with
        // accounts (which would refuse the token) stands in for a Choria broker.
        let url_has_user = opts.broker.nats.iter().any(|u| {
            u.split_once("://")
                .map_or(u.as_str(), |(_, rest)| rest)
                .split('/')
                .next()
                .is_some_and(|authority| authority.contains('@'))
        });
        let connections = opts.connections.min(opts.nodes);
        Wiring {
            connections,
            token: (!url_has_user).then(|| jwt.to_string()),
            conns: Vec::with_capacity(connections),
            tasks: Vec::new(),
        }
    }

    /// Connects, subscribes every node, then announces each as go-choria
    /// does once subscribed.
    pub(crate) async fn start(
        &mut self,
        opts: &FleetOptions,
        nodes: &[NodeRef],
        ctx: &Ctx,
    ) -> Result<(), FleetError> {
        self.connect(opts).await?;
        let routes = Routes {
            by_name: Arc::new(match opts.directed {
                Directed::PerNode if !opts.serve_provisioned => HashMap::new(),
                _ => nodes
                    .iter()
                    .map(|n| (n.lock().expect("node lock").identity.clone(), n.clone()))
                    .collect(),
            }),
            turns: Arc::new(SlowTurns::new(opts.slow_nodes)),
            directed_group: queue_group(""),
            provisioned_group: queue_group("-provisioned"),
        };
        for (c, nats) in self.conns.iter().enumerate() {
            let mine: Vec<NodeRef> = nodes
                .iter()
                .skip(c)
                .step_by(self.connections)
                .cloned()
                .collect();
            subscribe_connection(nats, mine, opts, &routes, ctx, &mut self.tasks).await?;
        }
        for nats in &self.conns {
            nats.flush().await.map_err(ClientError::from)?;
        }
        self.announce(nodes, ctx).await;
        Ok(())
    }

    async fn connect(&mut self, opts: &FleetOptions) -> Result<(), FleetError> {
        for c in 0..self.connections {
            let nats = client::connect(&ConnectOptions {
                servers: opts.broker.nats.clone(),
                name: format!("choria-fleet-{c}"),
                tls: opts.broker.tls(),
                token: self.token.clone(),
                ..Default::default()
            })
            .await?;
            self.conns.push(nats);
        }
        Ok(())
    }

    /// Subscribed: now announce ourselves as go-choria does.
    async fn announce(&self, nodes: &[NodeRef], ctx: &Ctx) {
        for (i, node) in nodes.iter().enumerate() {
            let (identity, version) = {
                let n = node.lock().expect("node lock");
                (n.identity.clone(), n.version.clone())
            };
            publish_event(
                &self.conns[i % self.connections],
                ctx,
                &identity,
                EventType::Startup,
                PROVISION_MODE_COMPONENT,
                Some(&version),
            )
            .await;
        }
        for nats in &self.conns {
            let _ = nats.flush().await;
        }
    }

    /// Stops every task and flushes what they published.
    pub(crate) async fn stop(&self) {
        for t in &self.tasks {
            t.abort();
        }
        // Replies and events already published go out if the broker is there;
        // a broker that is gone must not hold the fleet (async-nats would wait
        // for a reconnect for ever).
        let _ = tokio::time::timeout(
            FLUSH_AT_STOP,
            futures::future::join_all(self.conns.iter().map(|n| n.flush())),
        )
        .await;
    }
}

/// Subscribes what one connection serves (directed requests to `mine` or,
/// shared, to any node; provisioned nodes; broadcasts to `mine`) and spawns
/// a task for each subscription.
async fn subscribe_connection(
    nats: &async_nats::Client,
    mine: Vec<NodeRef>,
    opts: &FleetOptions,
    routes: &Routes,
    ctx: &Ctx,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<(), FleetError> {
    // The hop URL recorded in replies: one server per connection, looked up once.
    let link = Link {
        nats: nats.clone(),
        url: client::connected_url(nats).into(),
    };
    subscribe_directed(&link, &mine, opts.directed, routes, ctx, tasks).await?;
    if opts.serve_provisioned {
        let subject = "*.node.>".to_string();
        let sub = subscribe(nats, subject, Some(&routes.provisioned_group)).await?;
        tasks.push(tokio::spawn(provisioned_loop(
            routes.by_name.clone(),
            sub,
            link.clone(),
            ctx.clone(),
        )));
    }
    let mut subs = Vec::new();
    for agent in node::AGENTS {
        let subject = subjects::broadcast_agent(subjects::PROVISIONING_COLLECTIVE, agent);
        subs.push(subscribe(nats, subject, None).await?);
    }
    tasks.push(tokio::spawn(broadcast_loop(
        mine,
        futures::stream::select_all(subs),
        link,
        ctx.clone(),
    )));
    Ok(())
}

/// Directed requests on one connection: a subscription for each node of
/// `mine`, or one for every node in the fleet's queue group.
async fn subscribe_directed(
    link: &Link,
    mine: &[NodeRef],
    directed: Directed,
    routes: &Routes,
    ctx: &Ctx,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<(), FleetError> {
    match directed {
        Directed::PerNode => {
            for node in mine {
                let identity = node.lock().expect("node lock").identity.clone();
                let subject = subjects::node(subjects::PROVISIONING_COLLECTIVE, &identity);
                let sub = subscribe(&link.nats, subject, None).await?;
                tasks.push(tokio::spawn(directed_loop(
                    node.clone(),
                    sub,
                    link.clone(),
                    ctx.clone(),
                )));
            }
        }
        Directed::Shared => {
            // Identities hold dots: `>`, not `*`.
            let subject = subjects::node(subjects::PROVISIONING_COLLECTIVE, ">");
            let sub = subscribe(&link.nats, subject, Some(&routes.directed_group)).await?;
            tasks.push(tokio::spawn(shared_directed_loop(
                routes.by_name.clone(),
                routes.turns.clone(),
                sub,
                link.clone(),
                ctx.clone(),
            )));
        }
    }
    Ok(())
}

/// Subscribes `subject`, in the queue group `queue` when one is given.
async fn subscribe(
    nats: &async_nats::Client,
    subject: String,
    queue: Option<&str>,
) -> Result<async_nats::Subscriber, ClientError> {
    let sub = match queue {
        Some(group) => {
            nats.queue_subscribe(subject.clone(), group.to_string())
                .await
        }
        None => nats.subscribe(subject.clone()).await,
    };
    sub.map_err(|source| ClientError::Subscribe { subject, source })
}

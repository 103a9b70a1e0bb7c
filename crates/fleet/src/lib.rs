//! `choria-provisioner fleet`: many simulated Choria Servers in provisioning mode
//! in one process.
//!
//! Layout: nodes are spread over a few NATS connections. Each node subscribes to
//! its own `provisioning.node.<identity>` subject and handles its requests in its
//! own task (go-choria serialises the provisioning agent's actions, so one at a
//! time per node is faithful). Broadcasts arrive once per connection and are
//! decoded once, then offered to every node on that connection.
//!
//! The parts: what the fleet can be told in `options`; what it makes before
//! it connects in `setup`; the connections and subscriptions in `wiring`;
//! the tasks reading them in `loops`; one request on one node in `serve`;
//! what every task shares in `context`; the tally at the end in `summary`.
//! Each node itself is a state machine in [`node`]. Beside the run: the
//! [`journal`] writer, the reference [`helper`] (`fleet-helper`) and the
//! small [`ca`] it signs with, [`evidence`] (instance documents the nodes
//! present, `--evidence-key`) and the terminal's [`progress`] line.

/// The CA the reference helper signs with: the wire's, re-exported.
pub use choria_wire::security::ca;
pub mod evidence;
pub mod helper;
pub mod journal;
pub mod node;
pub mod progress;

mod context;
mod loops;
mod options;
mod serve;
mod setup;
mod summary;
mod wiring;

pub use options::{identity_for, Directed, FleetOptions};
pub use summary::FleetSummary;

use choria_wire::client;
use context::Ctx;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use tracing::info;
use wiring::Wiring;

/// The component provisioning-mode servers publish lifecycle events as.
pub const PROVISION_MODE_COMPONENT: &str = "provision_mode_server";
/// The component of a server after provisioning.
pub const SERVER_COMPONENT: &str = "server";

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("invalid fleet option: {0}")]
    Options(String),
    #[error("--jwt-signer {path}: {reason}")]
    Signer { path: PathBuf, reason: String },
    #[error("{0}")]
    Evidence(String),
    #[error("could not generate the RSA key pool: {0}")]
    KeyPool(String),
    #[error("could not open the journal {path}: {source}")]
    Journal {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Client(#[from] client::ClientError),
}

/// Runs the fleet until `stop` resolves, `--duration` passes or (with
/// `--exit-when-done`) every healthy node has left provisioning.
pub async fn run(
    opts: FleetOptions,
    stop: impl std::future::Future<Output = ()>,
) -> Result<FleetSummary, FleetError> {
    opts.validate()?;
    let jwt = setup::provisioning_jwt(&opts)?;
    let shared = setup::fleet_shared(&opts, &jwt).await?;
    let (journal, writer) = setup::open_journal(&opts)?;
    let failures = setup::assign_failures(&opts);
    let ctx = Ctx::new(journal, &opts, &failures);
    let nodes = setup::make_nodes(&opts, &failures, &shared);

    let mut wiring = Wiring::new(&opts, &jwt);
    // A signal during start-up (the broker may be gone: flushes and
    // publishes would wait for it) stops the fleet too.
    tokio::pin!(stop);
    let stopped_early = tokio::select! {
        r = wiring.start(&opts, &nodes, &ctx) => { r?; false }
        _ = &mut stop => { info!("stopping fleet during start-up"); true }
    };
    if !stopped_early {
        let connections = wiring.connections;
        info!(nodes = opts.nodes, protocol = %opts.protocol, connections, "fleet started");
        let shown = (opts.progress == progress::Progress::InPlace).then(|| {
            let healthy = failures.iter().filter(|f| f.is_none()).count();
            tokio::spawn(progress::show(ctx.clone(), healthy))
        });
        until_stopped(&opts, &ctx, stop).await;
        if let Some(task) = shown {
            task.abort();
            progress::finish();
        }
    }

    wiring.stop().await;
    Ok(summary::summarise(&opts, &nodes, ctx, writer).await)
}

/// Waits for `stop`, `--duration`, or (with `--exit-when-done`) the last
/// healthy node leaving provisioning, whichever comes first.
async fn until_stopped(
    opts: &FleetOptions,
    ctx: &Ctx,
    stop: impl std::future::Future<Output = ()>,
) {
    let done = async {
        if !opts.exit_when_done {
            return std::future::pending::<()>().await;
        }
        loop {
            let notified = ctx.changed.notified();
            if ctx.remaining.load(Ordering::Relaxed) == 0 {
                return;
            }
            notified.await;
        }
    };
    let limit = async {
        match opts.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = stop => info!("stopping fleet"),
        _ = done => info!("every node has left provisioning"),
        _ = limit => info!("fleet duration reached"),
    }
}

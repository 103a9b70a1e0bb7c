//! What the fleet did, told when it stops: the nodes counted by mode, each
//! one's final state journaled, and the journal closed.

use crate::context::{Ctx, NodeRef};
use crate::journal::Entry;
use crate::node::Mode;
use crate::setup::JournalWriter;
use crate::FleetOptions;
use std::sync::atomic::Ordering;
use tracing::warn;

/// What the fleet did, printed when it stops.
#[derive(Debug, Default, serde::Serialize)]
pub struct FleetSummary {
    pub nodes: usize,
    pub provisioned: usize,
    pub provisioning: usize,
    pub shutdown: usize,
    pub requests: u64,
    pub replies: u64,
}

/// Tallies the stopped fleet and closes the journal, waiting for its writer
/// to finish.
pub(crate) async fn summarise(
    opts: &FleetOptions,
    nodes: &[NodeRef],
    ctx: Ctx,
    writer: Option<JournalWriter>,
) -> FleetSummary {
    let mut summary = FleetSummary {
        nodes: opts.nodes,
        requests: ctx.counters.requests.load(Ordering::Relaxed),
        replies: ctx.counters.replies.load(Ordering::Relaxed),
        ..Default::default()
    };
    for node in nodes {
        let n = node.lock().expect("node lock");
        match n.mode {
            Mode::Provisioning => summary.provisioning += 1,
            Mode::Provisioned => summary.provisioned += 1,
            Mode::Shutdown => summary.shutdown += 1,
        }
        ctx.journal.record(Entry::Final(n.final_state()));
    }
    let mut journal = ctx.journal.clone();
    drop(ctx);
    journal.close();
    if let Some(w) = writer {
        match w.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "journal write failed"),
            Err(e) => warn!(error = %e, "journal writer failed"),
        }
    }
    summary
}

//! `choria-provisioner fleet`: simulated provisioning-mode servers.

use anyhow::Result;
use choria_fleet::{self as fleet, FleetOptions};

#[derive(clap::Args, Debug)]
pub struct FleetArgs {
    #[command(flatten)]
    pub options: FleetOptions,
}

/// Runs the fleet until SIGTERM/SIGINT (or its own end) and prints the
/// summary as one JSON line.
pub async fn run(args: FleetArgs) -> Result<()> {
    let summary = fleet::run(args.options, super::shutdown_signal()).await?;
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}

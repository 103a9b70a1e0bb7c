//! choria-provisioner: the command line over the workspace's crates. Each
//! subcommand is a file in [`cmd`] that owns its `clap` options and turns
//! them into one call into a library crate: `choria-core` (the provisioner),
//! `choria-operator`, `choria-fleet` (the simulator). [`telemetry`] sets up
//! where log lines go and in which format.

pub mod cmd;
pub mod telemetry;

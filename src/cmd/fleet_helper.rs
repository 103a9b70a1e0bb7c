//! `choria-provisioner fleet-helper`: the reference helper, run once per node
//! (no async runtime, nothing logged on stdout).

pub use choria_fleet::helper::FleetHelperArgs;
use std::process::ExitCode;

pub fn run(args: &FleetHelperArgs) -> ExitCode {
    choria_fleet::helper::main_with_stdio(args)
}

//! `choria-provisioner crd`: the `Provisioner` CustomResourceDefinition.

use std::process::ExitCode;

pub fn run() -> ExitCode {
    print!("{}", crate::crd::crd_yaml());
    ExitCode::SUCCESS
}

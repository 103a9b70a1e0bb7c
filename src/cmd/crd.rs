//! `choria-provisioner crd`: the `Provisioner` CustomResourceDefinition.

use std::process::ExitCode;

pub fn run() -> ExitCode {
    print!("{}", crate::operator::crd::crd_yaml());
    ExitCode::SUCCESS
}

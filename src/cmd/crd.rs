//! `choria-provisioner crd`: the `Provisioner` CustomResourceDefinition.

use std::process::ExitCode;

pub fn run() -> ExitCode {
    print!("{}", choria_k8s::crd::crd_yaml());
    ExitCode::SUCCESS
}

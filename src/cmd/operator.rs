//! `choria-provisioner operator`: the Kubernetes operator.

pub use crate::operator::OperatorArgs;
use anyhow::Result;

pub async fn run(args: OperatorArgs) -> Result<()> {
    Ok(crate::operator::run(args, super::shutdown_signal()).await?)
}

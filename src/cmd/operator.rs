//! `choria-provisioner operator`: the Kubernetes operator.

use anyhow::Result;
pub use choria_operator::OperatorArgs;

pub async fn run(args: OperatorArgs) -> Result<()> {
    Ok(choria_operator::run(args, super::shutdown_signal()).await?)
}

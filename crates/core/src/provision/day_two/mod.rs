//! Day two: what happens after a node is provisioned. `recorder` writes a
//! sealed record of what each provisioning issued; `renewal` reads the
//! records back (verified ones only) and asks nodes to `reprovision` before
//! their credentials expire.

pub mod guard;
pub mod recorder;
pub mod renewal;

//! Everything needed to speak Choria: the wire protocol, the client, and the
//! crypto that provisioning needs.

pub mod client;
pub mod fence;
pub mod filter;
pub mod identity;
pub mod ids;
pub mod json;
pub mod lifecycle;
pub mod mcorpc;
pub mod protocol;
pub mod replies;
pub mod security;
pub mod subjects;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;

//! Everything needed to speak Choria: the wire protocol, the client, and the
//! crypto that provisioning needs.
//!
//! * [`protocol`]: the v1 and v2 message layers, byte for byte as go-choria;
//!   [`json`] the Go-compatible JSON they are written in; [`mcorpc`] the
//!   SimpleRPC bodies; [`filter`] filters and their matching; [`ids`] request
//!   ids; [`subjects`] subject names; [`lifecycle`] lifecycle events.
//! * [`client`]: connecting, directed requests, discovery, events; [`tls`] the
//!   rustls settings; [`fence`] the reconnect fence; [`replies`] which reply
//!   is a request's answer; [`identity`] node names checked where they enter.
//! * [`security`]: JWTs, RSA and ed25519 keys, CSRs, key exchange, seals.
//! * `testing`: helpers for other crates' tests.

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

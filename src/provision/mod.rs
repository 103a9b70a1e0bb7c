//! The provisioner: discovery and events feed a registry and work queue,
//! workers run each node's host sequence.

pub mod helper;
pub mod version;

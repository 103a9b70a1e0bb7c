//! Kubernetes status: a pod's link to its own `Provisioner` resource
//! (`run --provisioner`): it follows `spec.paused` and keeps the pods'
//! status fields (leader, provisioned, refused, renewal and revocation
//! counts, shard members) true, and writes `spec.revocations`.

pub mod resource;
pub mod revocations;

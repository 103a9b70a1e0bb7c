//! Kubernetes status: a pod's link to its own `Provisioner` resource
//! (`run --provisioner`): it follows `spec.paused` and keeps the pods'
//! status fields (leader, provisioned, renewal counts, shard members) true.

pub mod resource;

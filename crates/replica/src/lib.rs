//! What one replica of a long-running service needs, whichever service it
//! is (the provisioner's pods, the operator): the leader election and the
//! shards' membership ([`election`], on Choria Streams or a Kubernetes
//! Lease), retrying with [`backoff`], and the monitoring endpoint
//! ([`monitor`]: `/metrics`, `/healthz`, `/readyz`). The operator uses it
//! without the provisioner's core.

pub mod backoff;
pub mod election;
pub mod monitor;

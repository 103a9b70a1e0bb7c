//! choria-provisioner: provisioning service, Kubernetes operator and
//! provisioning-mode fleet simulator for Choria.

pub mod backoff;
pub mod choria;
pub mod cmd;
pub mod config;
pub mod crd;
pub mod election;
pub mod fleet;
pub mod k8s;
pub mod monitor;
pub mod operator;
pub mod provision;
pub mod records;
pub mod telemetry;

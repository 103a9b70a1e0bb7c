//! The provisioner core: the pipeline that finds nodes and works each
//! one's sequence ([`provision`]), the leader election and shards
//! ([`election`]), the records of what was issued ([`records`]), and the
//! small parts they share: [`backoff`] and the monitoring endpoint
//! ([`monitor`]).

pub mod admission;
pub mod audit;
pub mod backoff;
pub mod election;
pub mod evidence;
pub mod monitor;
pub mod provision;
pub mod records;

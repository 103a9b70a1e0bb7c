//! The provisioner core: the pipeline that finds nodes and works each
//! one's sequence ([`provision`]), the records of what was issued
//! ([`records`]), the admission policy ([`admission`]), instance evidence
//! ([`evidence`]) and the audit stream ([`audit`]). Three things the
//! provisioner remembers each have a room of their own: the
//! [`revocations`], what each identity [`held`] on record, and the
//! instance [`bindings`] of names. The leader election and
//! shards, backoff and the monitoring endpoint are `choria-replica`'s,
//! re-exported here under their old paths.

pub mod admission;
pub mod audit;
pub mod bindings;
pub use choria_replica::{backoff, election, monitor};
pub mod evidence;
pub mod held;
pub mod provision;
pub mod records;
pub mod revocations;

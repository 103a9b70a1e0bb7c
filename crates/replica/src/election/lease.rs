//! The Kubernetes election: a `coordination.k8s.io/v1` Lease spoken the way
//! client-go's `leaderelection` package speaks it, so our replicas and any
//! client-go tooling reading the Lease agree on who leads.
//!
//! * every campaign and renewal GETs the Lease (creating it with us as holder
//!   when it does not exist);
//! * a Lease held by someone else counts as expired only once
//!   `leaseDurationSeconds` have passed on *our* clock since we first saw
//!   its current record — the holder's `renewTime` is never compared with
//!   our clock, so clock skew between nodes does not matter;
//! * every write is a PUT of the object we read, so its `resourceVersion`
//!   makes it conditional: of two candidates racing for an expired Lease only
//!   one wins, the other gets 409 Conflict;
//! * release clears the holder and sets `leaseDurationSeconds: 1`, so
//!   standbys take over on their next attempt.
//!
//! The renew deadline is enforced by the driver ([`super::run`]).

use super::machine::{Outcome, Timings};
use super::{Backend, ElectionError};
use choria_config::ElectionConfig;
use choria_k8s::{describe_error, resolve_namespace, Kube, POD_NAMESPACE_FILE};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info};

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("cannot build a Kubernetes client (in-cluster service account or KUBECONFIG): {0}")]
    Client(String),
    #[error("{action} of lease {lease} failed: {reason}")]
    Api {
        action: &'static str,
        lease: String,
        reason: String,
    },
}

impl From<LeaseError> for ElectionError {
    fn from(e: LeaseError) -> Self {
        ElectionError::Other(e.to_string())
    }
}

/// Time as the election needs it; injected so tests control it.
pub trait Clock: Send + Sync {
    /// Monotonic time, for judging expiry from local observation.
    fn now(&self) -> Instant;
    /// Wall-clock time, written to `renewTime` and `acquireTime`.
    fn wall(&self) -> Timestamp;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn wall(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// The fields client-go compares to notice that the holder did something.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    /// Empty when nobody holds the Lease.
    holder: String,
    duration_seconds: Option<i32>,
    acquire_time: Option<MicroTime>,
    renew_time: Option<MicroTime>,
    transitions: Option<i32>,
}

impl Record {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Record {
            holder: spec.holder_identity.unwrap_or_default(),
            duration_seconds: spec.lease_duration_seconds,
            acquire_time: spec.acquire_time,
            renew_time: spec.renew_time,
            transitions: spec.lease_transitions,
        }
    }

    fn duration(&self) -> Duration {
        Duration::from_secs(self.duration_seconds.unwrap_or(0).max(0) as u64)
    }
}

pub struct LeaseBackend {
    api: Api<Lease>,
    name: String,
    namespace: String,
    identity: String,
    /// What we write as `leaseDurationSeconds`.
    duration_seconds: i32,
    timings: Timings,
    clock: Arc<dyn Clock>,
    /// The record last seen and when we first saw it.
    observed: Option<(Record, Instant)>,
    /// The object last read or written: release writes over it.
    last: Option<Lease>,
    /// What owns the Lease (the Provisioner of a pod), so it is collected
    /// with it; added to a Lease made before it had one.
    owner: Option<OwnerReference>,
}

impl LeaseBackend {
    pub fn new(
        client: kube::Client,
        cfg: &ElectionConfig,
        identity: &str,
        namespace: &str,
    ) -> Self {
        LeaseBackend {
            api: Api::namespaced(client, namespace),
            name: cfg.lease_name.clone(),
            namespace: namespace.to_string(),
            identity: identity.to_string(),
            // client-go truncates to whole seconds; zero would mean "expired".
            duration_seconds: (cfg.lease_duration.as_secs().min(i32::MAX as u64) as i32).max(1),
            timings: Timings {
                retry_period: cfg.retry_period,
                renew_period: cfg.retry_period,
                renew_deadline: cfg.renew_deadline,
            },
            clock: Arc::new(SystemClock),
            observed: None,
            last: None,
            owner: None,
        }
    }

    /// With the process's client, in the namespace configured, else the
    /// pod's, else the client's default.
    pub fn connect(kube: &Kube, cfg: &ElectionConfig, identity: &str) -> Result<Self, LeaseError> {
        let client = kube.client().map_err(LeaseError::Client)?;
        let namespace = resolve_namespace(
            cfg.lease_namespace.as_deref(),
            Path::new(POD_NAMESPACE_FILE),
            client.default_namespace(),
        );
        Ok(Self::new(client, cfg, identity, &namespace))
    }

    /// The Lease is owned by `owner` (it must live in the Lease's namespace).
    pub fn with_owner(mut self, owner: OwnerReference) -> Self {
        self.owner = Some(owner);
        self
    }

    /// `lease` with our owner among its owners, when we have one.
    fn owned(&self, mut meta: ObjectMeta) -> ObjectMeta {
        if let Some(o) = &self.owner {
            let refs = meta.owner_references.get_or_insert_with(Vec::new);
            if !refs.iter().any(|r| r.uid == o.uid) {
                refs.push(o.clone());
            }
        }
        meta
    }

    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn lease(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn api_error(&self, action: &'static str, e: kube::Error) -> LeaseError {
        LeaseError::Api {
            action,
            lease: self.lease(),
            reason: describe_error(&e),
        }
    }

    /// The API server stores microseconds; writing exactly that keeps the
    /// record we remember equal to the one we read back.
    fn wall_now(&self) -> MicroTime {
        let t = self.clock.wall();
        MicroTime(Timestamp::from_microsecond(t.as_microsecond()).unwrap_or(t))
    }

    fn remember(&mut self, written: Lease) {
        self.observed = Some((Record::of(&written), self.clock.now()));
        self.last = Some(written);
    }

    /// client-go's `tryAcquireOrRenew`.
    async fn try_acquire_or_renew(&mut self) -> Result<Outcome, LeaseError> {
        let got = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.api_error("get", e))?;
        let Some(mut lease) = got else {
            return self.create().await;
        };

        let record = Record::of(&lease);
        let now = self.clock.now();
        let observed_at = match &self.observed {
            Some((seen, at)) if *seen == record => *at,
            _ => {
                self.observed = Some((record.clone(), now));
                now
            }
        };
        self.last = Some(lease.clone());
        let ours = record.holder == self.identity;
        // Compared this way round so a huge leaseDurationSeconds cannot overflow.
        let unexpired = now.saturating_duration_since(observed_at) < record.duration();
        if !record.holder.is_empty() && !ours && unexpired {
            debug!(lease = %self.lease(), holder = %record.holder, "the lease is held and has not expired");
            return Ok(Outcome::Following(Some(record.holder)));
        }

        let stamp = self.wall_now();
        lease.metadata = self.owned(lease.metadata);
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(self.duration_seconds);
        spec.renew_time = Some(stamp.clone());
        if !ours {
            spec.acquire_time = Some(stamp);
            spec.lease_transitions = Some(record.transitions.unwrap_or(0).saturating_add(1));
        }
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                if !ours {
                    info!(lease = %self.lease(), previous = %record.holder, "acquired the lease");
                }
                self.remember(written);
                Ok(Outcome::Leading)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Someone wrote since our GET; the next attempt reads who.
                debug!(lease = %self.lease(), "lost a race to write the lease");
                Ok(Outcome::Following(None))
            }
            Err(e) => Err(self.api_error("update", e)),
        }
    }

    async fn create(&mut self) -> Result<Outcome, LeaseError> {
        let stamp = self.wall_now();
        let lease = Lease {
            metadata: self.owned(ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            }),
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.duration_seconds),
                acquire_time: Some(stamp.clone()),
                renew_time: Some(stamp),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(written) => {
                info!(lease = %self.lease(), "created the lease");
                self.remember(written);
                Ok(Outcome::Leading)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                debug!(lease = %self.lease(), "another candidate created the lease first");
                Ok(Outcome::Following(None))
            }
            Err(e) => Err(self.api_error("create", e)),
        }
    }

    async fn give_up(&mut self) -> Result<(), LeaseError> {
        let held = matches!(&self.observed, Some((r, _)) if r.holder == self.identity);
        let Some(mut lease) = self.last.clone().filter(|_| held) else {
            return Ok(());
        };
        let stamp = self.wall_now();
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        // As client-go: an empty holder with a one second duration, so
        // candidates take over on their next attempt.
        spec.holder_identity = Some(String::new());
        spec.lease_duration_seconds = Some(1);
        spec.acquire_time = Some(stamp.clone());
        spec.renew_time = Some(stamp);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.remember(written);
                Ok(())
            }
            Err(e) => Err(self.api_error("release", e)),
        }
    }
}

impl Backend for LeaseBackend {
    fn describe(&self) -> String {
        format!("lease {}", self.lease())
    }

    fn identity(&self) -> &str {
        &self.identity
    }

    fn timings(&self) -> Timings {
        self.timings
    }

    async fn campaign(&mut self) -> Result<Outcome, ElectionError> {
        Ok(self.try_acquire_or_renew().await?)
    }

    async fn renew(&mut self) -> Result<Outcome, ElectionError> {
        Ok(self.try_acquire_or_renew().await?)
    }

    async fn release(&mut self) -> Result<(), ElectionError> {
        Ok(self.give_up().await?)
    }
}

#[cfg(test)]
mod tests;

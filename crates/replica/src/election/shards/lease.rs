//! Membership on Kubernetes: every member holds a `coordination.k8s.io/v1`
//! Lease of its own, labelled with the group (`election.lease_name`), and
//! the members are the group's Leases whose record we saw change within
//! their `leaseDurationSeconds`.
//!
//! * renew: GET our Lease and PUT it back with a new `renewTime` and our
//!   view of the members in an annotation (create it the first time);
//! * read: LIST the group's Leases by label; a record's sealed sequence is
//!   its stamp, so expiry is judged from when we saw it grow (the sealed
//!   time only refuses recordings older than the lease and the clock skew
//!   allowed);
//! * leave: DELETE our Lease.
//!
//! Pods need `get`, `list`, `create`, `update` and `delete` on Leases in
//! their namespace (the operator's Role grants them in shards mode).
//!
//! Whoever else may write Leases there could make up a member or keep a
//! stopped one alive, so each record is sealed with the key the replicas
//! share ([`choria_wire::security::seal`]) over its Lease name, holder,
//! view, a sequence that grows with each renewal and the time; a record
//! that is not ours, whose sequence went back, or that is stale is ignored
//! and counted, and one whose sequence did not grow is no renewal.

use super::{Membership, Sighting, MAX_MEMBERS};
use crate::election::ElectionError;
use choria_config::ElectionConfig;
use choria_k8s::{describe_error, resolve_namespace, Kube, POD_NAMESPACE_FILE};
use choria_wire::security::seal::{Purpose, Seal, SealKey, SealVerifier};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use std::collections::BTreeMap;
use std::path::Path;

/// The label naming a member Lease's group.
pub const GROUP_LABEL: &str = "provisioning.choria.io/shard-group";
/// The annotation holding a member's view of the members.
pub const VIEW_ANNOTATION: &str = "provisioning.choria.io/members";
/// The annotation holding a member record's sequence and seal.
pub const SEAL_ANNOTATION: &str = "provisioning.choria.io/member-seal";

/// [`SEAL_ANNOTATION`]'s value.
#[derive(serde::Serialize, serde::Deserialize)]
struct Sealed {
    seq: u64,
    /// When it was renewed (Unix milliseconds, the member's clock).
    #[serde(default)]
    time_ms: i64,
    seal: Seal,
}

pub struct LeaseMembership {
    api: Api<Lease>,
    namespace: String,
    group: String,
    name: String,
    me: String,
    duration_seconds: i32,
    key: SealKey,
    verifier: SealVerifier,
    seq: u64,
    /// Each member's highest sequence seen.
    last_seq: std::collections::HashMap<String, u64>,
    refused: Vec<&'static str>,
    /// How old a record may be: `lease_duration` and the clock skew allowed.
    max_age_ms: i64,
}

/// The parts a member record's seal covers: its Lease, holder, view, and
/// `<sequence>@<time>`.
fn sealed_parts<'a>(
    lease: &'a str,
    holder: &'a str,
    view: &'a str,
    stamp: &'a str,
) -> [&'a [u8]; 4] {
    [
        lease.as_bytes(),
        holder.as_bytes(),
        view.as_bytes(),
        stamp.as_bytes(),
    ]
}

fn now_ms() -> i64 {
    Timestamp::now().as_millisecond()
}

impl LeaseMembership {
    pub fn new(
        client: kube::Client,
        cfg: &ElectionConfig,
        me: &str,
        namespace: &str,
        key: SealKey,
        verifier: SealVerifier,
    ) -> Self {
        LeaseMembership {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            group: cfg.lease_name.clone(),
            name: lease_name(&cfg.lease_name, me),
            me: me.to_string(),
            duration_seconds: (cfg.lease_duration.as_secs().min(i32::MAX as u64) as i32).max(1),
            key,
            verifier,
            // Sequences start from the clock, so a restarted process never
            // repeats one (member ids are new per process anyway).
            seq: Timestamp::now().as_millisecond().max(0) as u64,
            last_seq: Default::default(),
            refused: Vec::new(),
            max_age_ms: (cfg.lease_duration + super::heartbeats::MAX_CLOCK_SKEW).as_millis() as i64,
        }
    }

    /// With the process's client, in the namespace configured, else the
    /// pod's, else the client's default.
    pub fn connect(
        kube: &Kube,
        cfg: &ElectionConfig,
        me: &str,
        key: SealKey,
        verifier: SealVerifier,
    ) -> Result<Self, ElectionError> {
        let client = kube
            .client()
            .map_err(|e| ElectionError::Other(format!("no Kubernetes client: {e}")))?;
        let namespace = resolve_namespace(
            cfg.lease_namespace.as_deref(),
            Path::new(POD_NAMESPACE_FILE),
            client.default_namespace(),
        );
        Ok(Self::new(client, cfg, me, &namespace, key, verifier))
    }

    /// A member record read back: the sighting it is, when it is sealed by
    /// us, valid and newer than the last one seen of its member.
    fn open(&mut self, lease: Lease) -> Result<Option<Sighting>, &'static str> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default();
        let annotations = lease.metadata.annotations.unwrap_or_default();
        let view_text = annotations
            .get(VIEW_ANNOTATION)
            .cloned()
            .unwrap_or_default();
        let Some(sealed) = annotations.get(SEAL_ANNOTATION) else {
            return Err("unsigned");
        };
        let sealed: Sealed = serde_json::from_str(sealed).map_err(|_| "invalid")?;
        let seq = sealed.seq.to_string();
        let stamp = format!("{}@{}", sealed.seq, sealed.time_ms);
        self.verifier
            .verify(
                Some(&sealed.seal),
                Purpose::MemberLease,
                &sealed_parts(&name, &holder, &view_text, &stamp),
            )
            .map_err(|_| "signature")?;
        let view: Vec<String> = view_text
            .split(',')
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .collect();
        if !super::heartbeats::is_member_id(&holder)
            || name != lease_name(&self.group, &holder)
            || view.len() > MAX_MEMBERS
            || !view.iter().all(|m| super::heartbeats::is_member_id(m))
        {
            return Err("invalid");
        }
        if holder == self.me {
            return Ok(None);
        }
        let age = now_ms() - sealed.time_ms;
        let skew = super::heartbeats::MAX_CLOCK_SKEW.as_millis() as i64;
        if age > self.max_age_ms || age < -skew {
            return Err("stale");
        }
        match self.last_seq.get(&holder) {
            Some(last) if *last > sealed.seq => return Err("replayed"),
            // Seen already (a list between two renewals): nothing new, and
            // no renewal, even for a member the roster forgot.
            Some(last) if *last == sealed.seq => return Ok(None),
            _ => {}
        }
        self.last_seq.insert(holder.clone(), sealed.seq);
        Ok(Some(Sighting {
            member: holder,
            stamp: seq,
            view,
            leaving: false,
        }))
    }

    fn error(&self, action: &str, e: kube::Error) -> ElectionError {
        ElectionError::Other(format!(
            "{action} of lease {}/{} failed: {}",
            self.namespace,
            self.name,
            describe_error(&e)
        ))
    }

    fn record(&mut self, view: &[String]) -> (ObjectMeta, LeaseSpec) {
        self.seq += 1;
        let view_text = view.join(",");
        let time_ms = now_ms();
        let stamp = format!("{}@{time_ms}", self.seq);
        let seal = self.key.seal(
            Purpose::MemberLease,
            &sealed_parts(&self.name, &self.me, &view_text, &stamp),
        );
        let sealed = serde_json::to_string(&Sealed {
            seq: self.seq,
            time_ms,
            seal,
        })
        .unwrap_or_default();
        let now = Timestamp::now();
        let stamp = MicroTime(Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now));
        let meta = ObjectMeta {
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            labels: Some(BTreeMap::from([
                (GROUP_LABEL.to_string(), self.group.clone()),
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    "choria-provisioner".to_string(),
                ),
            ])),
            annotations: Some(BTreeMap::from([
                (VIEW_ANNOTATION.to_string(), view_text),
                (SEAL_ANNOTATION.to_string(), sealed),
            ])),
            ..ObjectMeta::default()
        };
        let spec = LeaseSpec {
            holder_identity: Some(self.me.clone()),
            lease_duration_seconds: Some(self.duration_seconds),
            renew_time: Some(stamp),
            ..LeaseSpec::default()
        };
        (meta, spec)
    }
}

/// Our Lease's name: the group, then a hash of the member id (member ids
/// are free text; Lease names are DNS subdomains of at most 253).
pub fn lease_name(group: &str, member: &str) -> String {
    format!("{group}-{:016x}", super::weight("lease", member))
}

impl Membership for LeaseMembership {
    fn describe(&self) -> String {
        format!("leases {}/{}-*", self.namespace, self.group)
    }

    fn me(&self) -> &str {
        &self.me
    }

    async fn renew(&mut self, view: &[String]) -> Result<(), ElectionError> {
        let (meta, spec) = self.record(view);
        match self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.error("get", e))?
        {
            None => {
                let lease = Lease {
                    metadata: meta,
                    spec: Some(LeaseSpec {
                        acquire_time: spec.renew_time.clone(),
                        ..spec
                    }),
                };
                self.api
                    .create(&PostParams::default(), &lease)
                    .await
                    .map_err(|e| self.error("create", e))?;
            }
            Some(mut lease) => {
                lease.metadata.labels = meta.labels;
                lease.metadata.annotations = meta.annotations;
                let acquired = lease.spec.as_ref().and_then(|s| s.acquire_time.clone());
                lease.spec = Some(LeaseSpec {
                    acquire_time: acquired,
                    ..spec
                });
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                    .map_err(|e| self.error("update", e))?;
            }
        }
        Ok(())
    }

    async fn sightings(&mut self) -> Result<Vec<Sighting>, ElectionError> {
        let leases = self
            .api
            .list(&ListParams::default().labels(&format!("{GROUP_LABEL}={}", self.group)))
            .await
            .map_err(|e| self.error("list", e))?;
        let mut seen = Vec::new();
        for lease in leases.items {
            // A replayed record is as good as one not renewed: its member
            // ages out; it is not counted as forged while it repeats the
            // last one seen (a list between two renewals sees it again).
            match self.open(lease) {
                Ok(Some(s)) => seen.push(s),
                Ok(None) => {}
                Err(reason) => self.refused.push(reason),
            }
        }
        Ok(seen)
    }

    fn refused(&mut self) -> Vec<&'static str> {
        std::mem::take(&mut self.refused)
    }

    async fn leave(&mut self) -> Result<(), ElectionError> {
        match self.api.delete(&self.name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.error("delete", e)),
        }
    }
}

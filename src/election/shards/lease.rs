//! Membership on Kubernetes: every member holds a `coordination.k8s.io/v1`
//! Lease of its own, labelled with the group (`election.lease_name`), and
//! the members are the group's Leases whose record we saw change within
//! their `leaseDurationSeconds`.
//!
//! * renew: GET our Lease and PUT it back with a new `renewTime` and our
//!   view of the members in an annotation (create it the first time);
//! * read: LIST the group's Leases by label; a Lease's `resourceVersion` is
//!   its stamp, so expiry is judged from when we saw it change, never from
//!   the holder's clock;
//! * leave: DELETE our Lease.
//!
//! Pods need `get`, `list`, `create`, `update` and `delete` on Leases in
//! their namespace (the operator's Role grants them in shards mode).

use super::{Membership, Sighting};
use crate::config::ElectionConfig;
use crate::election::ElectionError;
use crate::k8s::{describe_error, resolve_namespace, POD_NAMESPACE_FILE};
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

pub struct LeaseMembership {
    api: Api<Lease>,
    namespace: String,
    group: String,
    name: String,
    me: String,
    duration_seconds: i32,
}

impl LeaseMembership {
    pub fn new(client: kube::Client, cfg: &ElectionConfig, me: &str, namespace: &str) -> Self {
        LeaseMembership {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            group: cfg.lease_name.clone(),
            name: lease_name(&cfg.lease_name, me),
            me: me.to_string(),
            duration_seconds: (cfg.lease_duration.as_secs().min(i32::MAX as u64) as i32).max(1),
        }
    }

    /// Builds the client from the service account (or KUBECONFIG), in the
    /// configured namespace, else the pod's, else the client's default.
    pub async fn connect(cfg: &ElectionConfig, me: &str) -> Result<Self, ElectionError> {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| ElectionError::Other(format!("cannot build a Kubernetes client: {e}")))?;
        let namespace = resolve_namespace(
            cfg.lease_namespace.as_deref(),
            Path::new(POD_NAMESPACE_FILE),
            client.default_namespace(),
        );
        Ok(Self::new(client, cfg, me, &namespace))
    }

    fn error(&self, action: &str, e: kube::Error) -> ElectionError {
        ElectionError::Other(format!(
            "{action} of lease {}/{} failed: {}",
            self.namespace,
            self.name,
            describe_error(&e)
        ))
    }

    fn record(&self, view: &[String]) -> (ObjectMeta, LeaseSpec) {
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
            annotations: Some(BTreeMap::from([(
                VIEW_ANNOTATION.to_string(),
                view.join(","),
            )])),
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
        Ok(leases
            .items
            .into_iter()
            .filter_map(|l| {
                let holder = l.spec.as_ref()?.holder_identity.clone().unwrap_or_default();
                let view = l
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(VIEW_ANNOTATION))
                    .map(|v| {
                        v.split(',')
                            .filter(|m| !m.is_empty())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                Some(Sighting {
                    leaving: holder.is_empty(),
                    member: holder,
                    stamp: l.metadata.resource_version.unwrap_or_default(),
                    view,
                })
            })
            .collect())
    }

    async fn leave(&mut self) -> Result<(), ElectionError> {
        match self.api.delete(&self.name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.error("delete", e)),
        }
    }
}

//! The pod's link to its own `Provisioner` resource when the operator runs it
//! (`run --provisioner NAMESPACE/NAME`):
//!
//! * it watches the resource and follows `spec.paused` — the operator never
//!   restarts pods for a pause, and a mounted ConfigMap would take a minute
//!   to change — pausing and resuming through the gate (a resume discovers
//!   at once);
//! * while it leads, it writes `status.leader` and `status.provisioned` with
//!   its own field manager, next to the operator's fields, so `kubectl get
//!   prov` shows the leader for either election backend.
//!
//! Kubernetes trouble is logged, counted nowhere else and retried: it never
//! stops provisioning.

use super::gate::PauseReason;
use super::Handle;
use crate::backoff::Backoff;
use crate::crd::{Provisioner, API_VERSION, KIND};
use crate::monitor::Exposition;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The field manager of the pods' status writes.
pub const FIELD_MANAGER: &str = "choria-provisioner-pod";
/// How often the leader refreshes its status fields.
pub const STATUS_REFRESH: Duration = Duration::from_secs(5);

/// `NAMESPACE/NAME` of a Provisioner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceRef {
    pub namespace: String,
    pub name: String,
}

impl std::str::FromStr for ResourceRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(ResourceRef {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
        }
    }
}

impl std::fmt::Display for ResourceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl ResourceRef {
    /// The Provisioners of its namespace.
    pub fn api(&self, client: kube::Client) -> Api<Provisioner> {
        Api::namespaced(client, &self.namespace)
    }
}

/// The status patch the leader applies.
pub fn status_patch(leader: Option<&str>, provisioned: u64) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "status": { "leader": leader, "provisioned": provisioned },
    })
}

/// Who this replica is: `candidate` is the name it campaigns under (what
/// `handle.leader` reports when it leads), `shown` the name status.leader
/// gives it (the pod's, which `kubectl logs` takes).
#[derive(Clone, Debug)]
pub struct Me {
    pub candidate: String,
    pub shown: String,
}

/// Runs both duties until `stop`; builds its kube client first, retrying.
pub async fn run(resource: ResourceRef, me: Me, handle: Handle, stop: CancellationToken) {
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    let client = loop {
        match crate::k8s::client().await {
            Ok(c) => break c,
            Err(e) => {
                warn!(error = %crate::k8s::describe_error(&e), "cannot reach Kubernetes to follow {resource}; retrying");
                if !backoff.wait(&stop).await {
                    return;
                }
            }
        }
    };
    let api = resource.api(client);
    tokio::join!(
        follow_pause(api.clone(), resource.clone(), handle.clone(), stop.clone()),
        report_leadership(api, resource, me, handle, stop),
    );
}

/// Mirrors `spec.paused` into the pause gate.
pub async fn follow_pause(
    api: Api<Provisioner>,
    resource: ResourceRef,
    handle: Handle,
    stop: CancellationToken,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={}", resource.name));
    let mut events = watcher(api, config).boxed();
    let mut paused: Option<bool> = None;
    loop {
        let event = tokio::select! {
            e = events.next() => e,
            _ = stop.cancelled() => return,
        };
        let obj = match event {
            Some(Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj))) => obj,
            Some(Ok(watcher::Event::Delete(_))) => {
                warn!(%resource, "the Provisioner was deleted; keeping the current pause state");
                continue;
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => {
                // The watcher retries by itself; say why it is not watching.
                warn!(%resource, error = %e, "watching the Provisioner failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            None => return,
        };
        let want = obj.spec.paused;
        if paused == Some(want) {
            continue;
        }
        paused = Some(want);
        if want {
            info!(%resource, "paused by spec.paused");
            handle.pause(PauseReason::Requested, false);
        } else {
            info!(%resource, "resumed by spec.paused");
            handle.resume(PauseReason::Requested);
        }
    }
}

/// While we lead, keeps `status.leader` (us) and `status.provisioned` current.
async fn report_leadership(
    api: Api<Provisioner>,
    resource: ResourceRef,
    me: Me,
    handle: Handle,
    stop: CancellationToken,
) {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut leader = handle.leader.clone();
    let mut tick = tokio::time::interval(STATUS_REFRESH);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = leader.changed() => if r.is_err() { return },
            _ = stop.cancelled() => return,
        }
        // Only the leader writes: a replica that lost leadership does not
        // clear the name, which would race with the next leader's write
        // (both use one field manager); the next leader overwrites it.
        if leader.borrow().as_deref() != Some(me.candidate.as_str()) {
            continue;
        }
        let provisioned = handle
            .metrics
            .value("choria_provisioner_provisioned")
            .unwrap_or(0.0) as u64;
        let patch = status_patch(Some(me.shown.as_str()), provisioned);
        match api
            .patch_status(&resource.name, &params, &Patch::Apply(&patch))
            .await
        {
            Ok(_) => debug!(%resource, provisioned, "status updated"),
            Err(e) => warn!(%resource, error = %e, "could not update the Provisioner's status"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_refs_parse_namespace_and_name() {
        let r: ResourceRef = "choria/prov-a".parse().unwrap();
        assert_eq!(r.namespace, "choria");
        assert_eq!(r.name, "prov-a");
        assert_eq!(r.to_string(), "choria/prov-a");
        for bad in ["", "x", "/x", "x/", "a/b/c"] {
            assert!(bad.parse::<ResourceRef>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_status_patch_carries_only_the_pods_fields() {
        let p = status_patch(Some("pod-a"), 42);
        assert_eq!(
            p["status"],
            serde_json::json!({"leader": "pod-a", "provisioned": 42})
        );
        assert_eq!(p["kind"], "Provisioner");
        assert_eq!(p["apiVersion"], "provisioning.choria.io/v1alpha1");
        assert_eq!(
            status_patch(None, 0)["status"]["leader"],
            serde_json::Value::Null
        );
    }
}

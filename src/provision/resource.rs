//! The pod's link to its own `Provisioner` resource when the operator runs it
//! (`run --provisioner NAMESPACE/NAME`):
//!
//! * it watches the resource and follows `spec.paused` — the operator never
//!   restarts pods for a pause, and a mounted ConfigMap would take a minute
//!   to change — pausing and resuming through the gate (a resume discovers
//!   at once);
//! * it keeps `status.leader` and `status.provisioned` true, with the pods'
//!   own field manager next to the operator's fields (see [`Reporter`]).
//!
//! Kubernetes trouble is logged, counted nowhere else and retried: it never
//! stops provisioning.

use super::gate::PauseReason;
use super::Handle;
use crate::backoff::Backoff;
use crate::crd::{Provisioner, API_VERSION, KIND};
use crate::monitor::Exposition;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The field manager of the pods' status writes.
pub const FIELD_MANAGER: &str = "choria-provisioner-pod";
/// The most often the provisioned count is written: a busy leader writes
/// it at most this often, an idle one never.
pub const STATUS_REFRESH: Duration = Duration::from_secs(5);
/// How long a replica that is not named waits, seeing `status.leader` name
/// someone other than the election's holder, before it corrects it: the
/// holder writes its own name at once when it is one of ours, so a wrong
/// name that lasts means the holder is not (a Go candidate, say) or it is
/// gone.
pub const SETTLE: Duration = Duration::from_secs(10);

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

    /// The Provisioner as the owner of what its pods make (their Lease,
    /// their CertificateRequests), so deleting it collects them.
    pub async fn owner(&self, client: kube::Client) -> Result<OwnerReference, String> {
        let p = self.api(client).get(&self.name).await.map_err(|e| {
            format!(
                "reading Provisioner {self}: {}",
                crate::k8s::describe_error(&e)
            )
        })?;
        owner_reference(&p).ok_or_else(|| format!("Provisioner {self} has no uid"))
    }
}

/// Not its controller (the operator's objects have that), and not blocking
/// its deletion (which would need `provisioners/finalizers` under the
/// OwnerReferencesPermissionEnforcement admission plugin).
pub fn owner_reference(p: &Provisioner) -> Option<OwnerReference> {
    use kube::Resource;
    let mut o = p.controller_owner_ref(&())?;
    o.controller = Some(false);
    o.block_owner_deletion = Some(false);
    Some(o)
}

/// Who this replica is: `candidate` is the name it campaigns under (what
/// `handle.leader` reports when it leads), `shown` the name status.leader
/// gives it (the pod's, which `kubectl logs` takes).
#[derive(Clone, Debug)]
pub struct Me {
    pub candidate: String,
    pub shown: String,
}

/// Whether `shown` (status.leader) names the election's holder `holder`:
/// the same name, or a pod's name and the holder its candidate name (the
/// pod's name and six hex digits).
pub fn names(shown: &str, holder: &str) -> bool {
    shown == holder
        || holder
            .strip_prefix(shown)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|h| h.len() == 6 && h.chars().all(|c| c.is_ascii_hexdigit()))
}

/// One status write of the pods' fields.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    pub leader: Option<String>,
    pub provisioned: u64,
    /// This replica's own count the write includes.
    pub counted: u64,
    /// The resourceVersion it was computed from: the write is conditional
    /// on it, so two replicas never lose each other's counts.
    pub resource_version: Option<String>,
}

impl Write {
    /// The server-side apply body. A field left out is removed (the pods'
    /// field manager owns it), which is how a leader is cleared.
    pub fn body(&self, name: &str) -> serde_json::Value {
        let mut status = serde_json::json!({ "provisioned": self.provisioned });
        if let Some(l) = &self.leader {
            status["leader"] = l.clone().into();
        }
        let mut body = serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name},
            "status": status,
        });
        if let Some(rv) = &self.resource_version {
            body["metadata"]["resourceVersion"] = rv.clone().into();
        }
        body
    }
}

/// Decides this replica's status writes, from the resource as last seen,
/// the election's holder and its own provisioned count:
///
/// * `status.leader` names the pod that leads: the leader writes its name
///   when it is not there; a replica that stops leading while named
///   replaces it at once by the election's holder (or removes it); any other
///   replica corrects a name that is not the holder's after [`SETTLE`] (a
///   Go candidate leads, or `choria election evict` left nobody);
/// * `status.provisioned` counts every node the Provisioner's pods
///   provisioned: each replica adds what it provisioned since its last
///   write to what the status says, conditionally on the version it read,
///   so a failover loses nothing a replica wrote; a replica writes its
///   count at most every [`STATUS_REFRESH`], and at once when it stops
///   leading;
/// * nothing changed, nothing written: an idle Provisioner costs no write.
#[derive(Debug)]
pub struct Reporter {
    me: Me,
    /// Our count as of our last successful write.
    reported: u64,
    last_count_write: Option<Instant>,
    /// Since when the status has not named the holder.
    wrong_since: Option<Instant>,
    leading: bool,
    /// Our term ended with a count not written yet.
    flush: bool,
}

impl Reporter {
    pub fn new(me: Me) -> Self {
        Reporter {
            me,
            reported: 0,
            last_count_write: None,
            wrong_since: None,
            leading: false,
            flush: false,
        }
    }

    /// The write due now, if any.
    pub fn decide(
        &mut self,
        p: &Provisioner,
        holder: Option<&str>,
        counted: u64,
        now: Instant,
    ) -> Option<Write> {
        let leading = holder == Some(self.me.candidate.as_str());
        if self.leading && !leading {
            self.flush = true;
        }
        self.leading = leading;
        let status = p.status.clone().unwrap_or_default();
        let shown = status.leader.clone();
        let want = if leading {
            Some(self.me.shown.clone())
        } else {
            match holder {
                Some(h) if shown.as_deref().is_some_and(|s| names(s, h)) => shown.clone(),
                Some(h) => Some(h.to_string()),
                None => None,
            }
        };
        if want == shown {
            self.wrong_since = None;
        }
        let correct = want != shown
            && (leading
                || shown.as_deref() == Some(self.me.shown.as_str())
                || now.duration_since(*self.wrong_since.get_or_insert(now)) >= SETTLE);
        let delta = counted.saturating_sub(self.reported);
        let count_due = delta > 0
            && (self.flush
                || self
                    .last_count_write
                    .is_none_or(|t| now.duration_since(t) >= STATUS_REFRESH));
        if !correct && !count_due {
            return None;
        }
        Some(Write {
            leader: if correct { want } else { shown },
            provisioned: status.provisioned.unwrap_or(0).max(0) as u64 + delta,
            counted,
            resource_version: p.metadata.resource_version.clone(),
        })
    }

    /// `w` was written.
    pub fn written(&mut self, w: &Write, now: Instant) {
        if w.counted != self.reported {
            self.last_count_write = Some(now);
        }
        self.reported = w.counted;
        self.flush = false;
        self.wrong_since = None;
    }
}

/// Runs both duties until `stop`; gets the process's kube client first,
/// retrying.
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
    let (seen_tx, seen) = watch::channel(None);
    tokio::join!(
        follow(
            api.clone(),
            resource.clone(),
            handle.clone(),
            seen_tx,
            stop.clone()
        ),
        report(api, resource, me, handle, seen, stop),
    );
}

/// Watches the resource: mirrors `spec.paused` into the pause gate and
/// passes every version on to [`report`].
async fn follow(
    api: Api<Provisioner>,
    resource: ResourceRef,
    handle: Handle,
    seen: watch::Sender<Option<Arc<Provisioner>>>,
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
        seen.send_replace(Some(Arc::new(obj)));
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

/// Keeps the pods' status fields true (see [`Reporter`]), looking again on
/// every version of the resource, every leadership change and every
/// [`STATUS_REFRESH`].
async fn report(
    api: Api<Provisioner>,
    resource: ResourceRef,
    me: Me,
    handle: Handle,
    mut seen: watch::Receiver<Option<Arc<Provisioner>>>,
    stop: CancellationToken,
) {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut holder = handle.leader.clone();
    let mut reporter = Reporter::new(me);
    let mut tick = tokio::time::interval(STATUS_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // A leadership change first: at shutdown the election releases
            // before the tasks are stopped, and the release is written.
            biased;
            r = holder.changed() => if r.is_err() { return },
            r = seen.changed() => if r.is_err() { return },
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let Some(p) = seen.borrow().clone() else {
            continue;
        };
        let counted = handle
            .metrics
            .value("choria_provisioner_provisioned")
            .unwrap_or(0.0) as u64;
        let who = holder.borrow().clone();
        let Some(write) = reporter.decide(&p, who.as_deref(), counted, Instant::now()) else {
            continue;
        };
        match api
            .patch_status(
                &resource.name,
                &params,
                &Patch::Apply(write.body(&resource.name)),
            )
            .await
        {
            Ok(_) => {
                debug!(%resource, leader = ?write.leader, provisioned = write.provisioned, "status updated");
                reporter.written(&write, Instant::now());
            }
            // Someone wrote since we read: the watch brings that version,
            // and the write is decided again from it.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                debug!(%resource, "the status changed under us; deciding again")
            }
            Err(e) => {
                warn!(%resource, error = %crate::k8s::describe_error(&e), "could not update the Provisioner's status")
            }
        }
    }
}

#[cfg(test)]
mod tests;

//! The pod's link to its own `Provisioner` resource when the operator runs it
//! (`run --provisioner NAMESPACE/NAME`):
//!
//! * it watches the resource and follows `spec.paused` — the operator never
//!   restarts pods for a pause, and a mounted ConfigMap would take a minute
//!   to change — pausing and resuming through the gate (a resume discovers
//!   at once);
//! * it keeps `status.leader`, `status.provisioned` and, with renewal,
//!   `status.records` and `status.renewalsDue` true, with the pods' own
//!   field manager next to the operator's fields (see [`Reporter`]);
//! * in shards mode, each member keeps its own entry of `status.members`
//!   under a field manager of its own, and the first member prunes the
//!   entries of members that left (see [`Members`]).
//!
//! Kubernetes trouble is logged, counted nowhere else and retried: it never
//! stops provisioning.

use super::Link;

mod members;
use crate::monitor::Exposition;
use crate::provision::gate::PauseReason;
use choria_k8s::crd::status_patch::StatusApply;
use choria_k8s::crd::{Provisioner, ProvisionerStatus, ResourceRef};
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use members::{leave, write_members};
pub use members::{member_manager, MemberPatch, MemberWrite, Members, Standing};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// The field manager of the pods' status writes (one definition, which
/// the operator reads too).
pub use choria_k8s::crd::POD_FIELD_MANAGER as FIELD_MANAGER;
/// The most often the provisioned count is written: a busy leader writes
/// it at most this often, an idle one never.
pub const STATUS_REFRESH: Duration = Duration::from_secs(5);
/// How long a replica that is not named waits, seeing `status.leader` name
/// someone other than the election's holder, before it corrects it: the
/// holder writes its own name at once when it is one of ours, so a wrong
/// name that lasts means the holder is not (a Go candidate, say) or it is
/// gone.
pub const SETTLE: Duration = Duration::from_secs(10);

/// Who this replica is: `candidate` is the name it campaigns under (what
/// `Steering::leader` reports when it leads), `shown` the name status.leader
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
    /// With renewal: nodes on record and nodes due, as this replica sees
    /// the records (every replica follows all of them).
    pub renewal: Option<RenewalCounts>,
    /// Refusals of nodes, added up like `provisioned`.
    pub refused: u64,
    /// With records: identities revoked now, as this replica sees them.
    pub revoked: Option<u64>,
    /// This replica's own count the write includes.
    pub counted: u64,
    /// This replica's own count of refusals the write includes.
    pub refused_counted: u64,
    /// The resourceVersion it was computed from: the write is conditional
    /// on it, so two replicas never lose each other's counts.
    pub resource_version: Option<String>,
}

impl Write {
    /// The server-side apply body. A field left out is removed (the pods'
    /// field manager owns it), which is how a leader is cleared.
    pub fn body(&self, name: &str) -> StatusApply {
        let status = ProvisionerStatus {
            leader: self.leader.clone(),
            provisioned: Some(self.provisioned as i64),
            records: self.renewal.map(|c| c.records as i64),
            renewals_due: self.renewal.map(|c| c.due as i64),
            refused: Some(self.refused as i64),
            revoked: self.revoked.map(|n| n as i64),
            ..ProvisionerStatus::default()
        };
        StatusApply::new(status)
            .named(name)
            .conditional_on(self.resource_version.clone())
    }
}

/// `status.records` and `status.renewalsDue`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenewalCounts {
    pub records: u64,
    pub due: u64,
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
/// * `status.refused` counts refusals of nodes the same way;
/// * with records, a working replica keeps `status.revoked` as it sees the
///   revocations, like the renewal counts below;
/// * with renewal, a working replica (the leader, or a member in shards
///   mode) writes the counts of records and of renewals due when the status
///   shows others, at most every [`STATUS_REFRESH`]; every write carries
///   them, as the field manager's writes replace each other;
/// * nothing changed, nothing written: an idle Provisioner costs no write.
#[derive(Debug)]
pub struct Reporter {
    me: Me,
    /// With renewal: the counts as this replica sees them now.
    pub renewal: Option<RenewalCounts>,
    /// With records: identities revoked now, as this replica sees them.
    pub revoked: Option<u64>,
    /// Refusals of nodes this replica counted since it started.
    pub refused: u64,
    /// This replica provisions now (leads, or works its shard).
    pub working: bool,
    last_renewal_write: Option<Instant>,
    /// Our count as of our last successful write.
    reported: u64,
    /// Our count of refusals as of our last successful write.
    reported_refused: u64,
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
            renewal: None,
            revoked: None,
            refused: 0,
            working: false,
            last_renewal_write: None,
            reported: 0,
            reported_refused: 0,
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
        let refused_delta = self.refused.saturating_sub(self.reported_refused);
        let count_due = (delta > 0 || refused_delta > 0)
            && (self.flush
                || self
                    .last_count_write
                    .is_none_or(|t| now.duration_since(t) >= STATUS_REFRESH));
        let shows = status
            .records
            .zip(status.renewals_due)
            .map(|(r, d)| RenewalCounts {
                records: r.max(0) as u64,
                due: d.max(0) as u64,
            });
        let shows_revoked = status.revoked.map(|n| n.max(0) as u64);
        let gauges_differ = (self.renewal.is_some() && self.renewal != shows)
            || (self.revoked.is_some() && self.revoked != shows_revoked);
        let renewal_due = self.working
            && gauges_differ
            && self
                .last_renewal_write
                .is_none_or(|t| now.duration_since(t) >= STATUS_REFRESH);
        if !correct && !count_due && !renewal_due {
            return None;
        }
        Some(Write {
            leader: if correct { want } else { shown },
            provisioned: status.provisioned.unwrap_or(0).max(0) as u64 + delta,
            renewal: self.renewal,
            refused: status.refused.unwrap_or(0).max(0) as u64 + refused_delta,
            // Not read yet here: what the status shows stands (a write
            // leaving it out would remove it).
            revoked: self.revoked.or(shows_revoked),
            counted,
            refused_counted: self.refused,
            resource_version: p.metadata.resource_version.clone(),
        })
    }

    /// `w` was written.
    pub fn written(&mut self, w: &Write, now: Instant) {
        if w.counted != self.reported || w.refused_counted != self.reported_refused {
            self.last_count_write = Some(now);
        }
        if w.renewal.is_some() || w.revoked.is_some() {
            self.last_renewal_write = Some(now);
        }
        self.reported = w.counted;
        self.reported_refused = w.refused_counted;
        self.flush = false;
        self.wrong_since = None;
    }
}

/// Runs both duties until `stop`; gets the process's kube client first,
/// retrying.
pub async fn run(
    resource: ResourceRef,
    me: Me,
    link: Arc<Link>,
    renewal: bool,
    stop: CancellationToken,
) {
    // `run` refuses to start as a resource without a client, so this is
    // for callers that did not check: the pod stays paused.
    let client = match link.kube.client() {
        Ok(c) => c,
        Err(e) => {
            error!(error = %e, "cannot follow {resource} without a Kubernetes client; staying paused");
            return;
        }
    };
    let api = resource.api(client);
    let (seen_tx, seen) = watch::channel(None);
    let revocations = async {
        if let Some(records) = link.records.clone() {
            super::lists::revocations(
                resource.clone(),
                records,
                link.clone(),
                seen.clone(),
                stop.clone(),
            )
            .await
        }
    };
    let bindings =
        super::lists::bindings(resource.clone(), link.clone(), seen.clone(), stop.clone());
    tokio::join!(
        follow(
            api.clone(),
            resource.clone(),
            link.clone(),
            seen_tx,
            stop.clone()
        ),
        revocations,
        bindings,
        report(
            api,
            resource.clone(),
            me,
            link.clone(),
            renewal,
            seen.clone(),
            stop.clone()
        ),
    );
}

/// Watches the resource: mirrors `spec.paused` into the pause gate and
/// passes every version on to [`report`].
async fn follow(
    api: Api<Provisioner>,
    resource: ResourceRef,
    link: Arc<Link>,
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
        // Before the first version opens the gate: a listed identity is
        // refused from the pod's first node on, not once its revocation
        // was written and read back.
        if let Some(revoked) = &link.revoked {
            revoked.set_listed(
                obj.spec
                    .revocations
                    .iter()
                    .filter(|n| choria_wire::identity::validate(&n.identity).is_ok())
                    .map(|n| {
                        let reason = crate::provision::text::one_line(&n.reason, 500);
                        (n.identity.clone(), reason)
                    }),
            );
        }
        seen.send_replace(Some(Arc::new(obj)));
        if paused == Some(want) {
            continue;
        }
        paused = Some(want);
        if want {
            info!(%resource, "paused by spec.paused");
            link.steering.pause(PauseReason::Requested, false);
        } else {
            info!(%resource, "resumed by spec.paused");
            link.steering.resume(PauseReason::Requested);
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
    link: Arc<Link>,
    renewal: bool,
    mut seen: watch::Receiver<Option<Arc<Provisioner>>>,
    stop: CancellationToken,
) {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let member_params = PatchParams::apply(&member_manager(&me.candidate)).force();
    let mut holder = link.steering.leader.clone();
    let mut holder_open = true;
    let mut members = Members::default();
    let mut reporter = Reporter::new(me.clone());
    let mut tick = tokio::time::interval(STATUS_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // A leadership change first: at shutdown the election releases
            // before the tasks are stopped, and the release is written.
            biased;
            // In shards mode nobody sends leaders: the sender is gone
            // from the start, which ends only this arm.
            r = holder.changed(), if holder_open => holder_open = r.is_ok(),
            // Before the watch: the watch ends with the same stop, and its
            // end must not skip our leaving.
            _ = stop.cancelled() => {
                leave(&api, &resource, &me, &member_params, &link).await;
                return;
            }
            r = seen.changed() => if r.is_err() {
                leave(&api, &resource, &me, &member_params, &link).await;
                return;
            },
            _ = tick.tick() => {}
        }
        let Some(p) = seen.borrow().clone() else {
            continue;
        };
        let value = |name: &str| link.steering.metrics.value(name).unwrap_or(0.0).max(0.0) as u64;
        let counted = value("choria_provisioner_provisioned");
        let working = value("choria_provisioner_leader") == 1;
        let sharded = link.steering.ownership.sharded();
        let roster = link.steering.ownership.members();
        let standing = Standing {
            members: &roster,
            sharded,
            working,
            counted,
        };
        if let Some(w) = members.decide(&p, &me, standing, Instant::now()) {
            if write_members(&api, &resource, &w, &member_params).await {
                members.written(Instant::now());
            }
        }
        observe(&mut reporter, &link, renewal, working);
        let who = holder.borrow().clone();
        let Some(write) = reporter.decide(&p, who.as_deref(), counted, Instant::now()) else {
            continue;
        };
        if write_status(&api, &resource, &params, &write).await {
            reporter.written(&write, Instant::now());
        }
    }
}

/// What the reporter reports besides the leader and the provisioned
/// count, read from this replica's metrics and revoked set.
fn observe(reporter: &mut Reporter, link: &Link, renewal: bool, working: bool) {
    let value = |name: &str| link.steering.metrics.value(name).unwrap_or(0.0).max(0.0) as u64;
    reporter.working = working;
    reporter.renewal = renewal.then(|| RenewalCounts {
        records: value("choria_provisioner_records"),
        due: value("choria_provisioner_renewals_due"),
    });
    reporter.refused = value("choria_provisioner_refused_nodes");
    reporter.revoked = link
        .revoked
        .as_ref()
        .filter(|r| r.is_loaded())
        .map(|r| r.count() as u64);
}

/// Applies `write` to the status; whether it landed.
async fn write_status(
    api: &Api<Provisioner>,
    resource: &ResourceRef,
    params: &PatchParams,
    write: &Write,
) -> bool {
    let body = Patch::Apply(write.body(&resource.name));
    match api.patch_status(&resource.name, params, &body).await {
        Ok(_) => {
            debug!(%resource, leader = ?write.leader, provisioned = write.provisioned, "status updated");
            true
        }
        // Someone wrote since we read: the watch brings that version,
        // and the write is decided again from it.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            debug!(%resource, "the status changed under us; deciding again");
            false
        }
        Err(e) => {
            warn!(%resource, error = %choria_k8s::describe_error(&e), "could not update the Provisioner's status");
            false
        }
    }
}

#[cfg(test)]
mod tests;

//! `status.members` in shards mode: each member owns its own entry (its
//! own field manager), the first member by name prunes the entries of
//! members gone, and a member stopping removes its own.

use super::{Link, Me, FIELD_MANAGER, STATUS_REFRESH};
use choria_k8s::crd::status_patch::{MembersMerge, StatusApply};
use choria_k8s::crd::{Member, Provisioner, ProvisionerStatus, ResourceRef};
use kube::api::{Api, Patch, PatchParams};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// The field manager of one member's entry in `status.members`: each
/// member owns its entry, so one member's write never removes another's.
pub fn member_manager(member: &str) -> String {
    format!("{FIELD_MANAGER}.{member}")
}

/// What a member writes of `status.members`.
#[derive(Clone, Debug, PartialEq)]
pub enum MemberWrite {
    /// Apply our own entry (under [`member_manager`]).
    Entry(Member),
    /// Keep only these entries, conditionally on the version read: the
    /// others' members left the membership.
    Prune {
        kept: Vec<Member>,
        resource_version: Option<String>,
    },
}

impl MemberWrite {
    /// The patch: a server-side apply of our entry, or a merge patch of the
    /// kept list (a merge patch replaces a list whole).
    pub fn patch(&self, name: &str) -> MemberPatch {
        match self {
            MemberWrite::Entry(m) => MemberPatch::Apply(Box::new(
                StatusApply::new(ProvisionerStatus {
                    members: vec![m.clone()],
                    ..ProvisionerStatus::default()
                })
                .named(name),
            )),
            MemberWrite::Prune {
                kept,
                resource_version,
            } => MemberPatch::Merge(MembersMerge::keep(kept.clone(), resource_version.clone())),
        }
    }
}

/// What [`MemberWrite::patch`] sends.
#[derive(Clone, Debug, PartialEq)]
pub enum MemberPatch {
    /// Boxed: a whole status is much larger than a list of members.
    Apply(Box<StatusApply>),
    Merge(MembersMerge),
}

/// Decides a member's writes of `status.members` (shards mode), from the
/// resource as last seen, the membership as this replica sees it and its
/// own provisioned count:
///
/// * while it is a member, its entry is there with its count: written when
///   missing (a prune by a member that had not seen it join yet removes it,
///   and it comes back) or behind, at most every [`STATUS_REFRESH`];
/// * the first member (by name) prunes entries whose members left (a
///   `kill -9`, a lost membership): a member that stops cleanly removes its
///   own entry, the others leave it behind;
/// * in leader mode, the leader prunes them all (the mode changed).
#[derive(Debug, Default)]
pub struct Members {
    last_write: Option<Instant>,
}

/// Where this replica stands now, for [`Members::decide`].
#[derive(Clone, Copy, Debug)]
pub struct Standing<'a> {
    /// The membership as it sees it (empty in leader mode).
    pub members: &'a [String],
    pub sharded: bool,
    /// Leads, or works its shard.
    pub working: bool,
    /// Nodes it provisioned since it started.
    pub counted: u64,
}

impl Members {
    pub fn decide(
        &mut self,
        p: &Provisioner,
        me: &Me,
        standing: Standing<'_>,
        now: Instant,
    ) -> Option<MemberWrite> {
        let Standing {
            members,
            sharded,
            working,
            counted,
        } = standing;
        let entries = p
            .status
            .as_ref()
            .map(|s| s.members.as_slice())
            .unwrap_or(&[]);
        let pruner = if sharded {
            members.iter().min() == Some(&me.candidate)
        } else {
            working
        };
        let kept: Vec<Member> = entries
            .iter()
            .filter(|e| sharded && members.contains(&e.name))
            .cloned()
            .collect();
        if pruner && kept.len() < entries.len() {
            return Some(MemberWrite::Prune {
                kept,
                resource_version: p.metadata.resource_version.clone(),
            });
        }
        if !sharded || !members.contains(&me.candidate) {
            return None;
        }
        let mine = entries.iter().find(|e| e.name == me.candidate);
        let behind = mine.is_none_or(|e| e.provisioned != counted as i64);
        let missing = mine.is_none();
        let rested = self
            .last_write
            .is_none_or(|t| now.duration_since(t) >= STATUS_REFRESH);
        (missing || (behind && rested)).then(|| {
            MemberWrite::Entry(Member {
                name: me.candidate.clone(),
                pod: Some(me.shown.clone()),
                provisioned: counted as i64,
            })
        })
    }

    pub fn written(&mut self, now: Instant) {
        self.last_write = Some(now);
    }
}

/// Writes `w`; whether it landed.
pub(super) async fn write_members(
    api: &Api<Provisioner>,
    resource: &ResourceRef,
    w: &MemberWrite,
    apply: &PatchParams,
) -> bool {
    let result = match w.patch(&resource.name) {
        MemberPatch::Apply(body) => {
            api.patch_status(&resource.name, apply, &Patch::Apply(*body))
                .await
        }
        MemberPatch::Merge(body) => {
            api.patch_status(&resource.name, &PatchParams::default(), &Patch::Merge(body))
                .await
        }
    };
    match result {
        Ok(_) => {
            debug!(%resource, write = ?w, "status.members updated");
            true
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {
            debug!(%resource, "the status changed under us; deciding the members again");
            false
        }
        Err(e) => {
            warn!(%resource, error = %choria_k8s::describe_error(&e), "could not update status.members");
            false
        }
    }
}

/// A member stopping removes its own entry: an apply of nothing under its
/// manager drops what that manager owned. Bounded, as the pod is stopping.
pub(super) async fn leave(
    api: &Api<Provisioner>,
    resource: &ResourceRef,
    me: &Me,
    apply: &PatchParams,
    link: &Link,
) {
    if !link.steering.ownership.sharded() {
        return;
    }
    let patch = Patch::Apply(StatusApply::new(ProvisionerStatus::default()).named(&resource.name));
    let write = api.patch_status(&resource.name, apply, &patch);
    match tokio::time::timeout(Duration::from_secs(2), write).await {
        Ok(Ok(_)) => debug!(%resource, member = %me.candidate, "left status.members"),
        Ok(Err(e)) => {
            warn!(%resource, error = %choria_k8s::describe_error(&e), "could not remove our status.members entry")
        }
        Err(_) => warn!(%resource, "removing our status.members entry timed out"),
    }
}

//! The operator's part of a Provisioner's status, computed without I/O:
//! conditions that say only what is true, and the Events their changes
//! deserve.

use choria_k8s::crd::{ElectionBackend, ElectionMode, Provisioner, ProvisionerStatus};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use kube::ResourceExt;

/// Condition types.
pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";
pub const LEADER_ELECTED: &str = "LeaderElected";
pub const PAUSED: &str = "Paused";
pub const DEGRADED: &str = "Degraded";

/// Why nothing was applied: a Degraded reason and the problems found.
pub struct Refusal<'a> {
    pub reason: &'a str,
    pub problems: &'a [String],
}

/// Ready, from the Deployment as `kubectl rollout status` reads it: the
/// controller has seen the current spec, and every replica is updated and
/// available with no old one left.
fn readiness(d: Option<&Deployment>, replicas: i32) -> (bool, &'static str, String) {
    let Some(d) = d else {
        return (
            false,
            "NoDeployment",
            "the Deployment does not exist yet".into(),
        );
    };
    let st = d.status.clone().unwrap_or_default();
    let generation = d.metadata.generation.unwrap_or(0);
    let observed = st.observed_generation.unwrap_or(0);
    let (updated, total, available) = (
        st.updated_replicas.unwrap_or(0),
        st.replicas.unwrap_or(0),
        st.available_replicas.unwrap_or(0),
    );
    if observed < generation {
        return (
            false,
            "RolloutPending",
            format!("the Deployment controller has not seen generation {generation} of the Deployment yet (it saw {observed})"),
        );
    }
    if replicas == 0 {
        return (false, "ScaledToZero", "spec.replicas is 0".into());
    }
    if updated < replicas {
        return (
            false,
            "RolloutInProgress",
            format!("{updated} of {replicas} pods run the current spec"),
        );
    }
    if total > updated {
        return (
            false,
            "RolloutInProgress",
            format!("{} old pods are still running", total - updated),
        );
    }
    if available < updated {
        return (
            false,
            "RolloutInProgress",
            format!("{available} of {replicas} updated pods are available"),
        );
    }
    (
        true,
        "Available",
        format!("{replicas} of {replicas} pods updated and available"),
    )
}

/// The Deployment's own Progressing condition, as it says it.
fn progressing(d: Option<&Deployment>) -> (&'static str, String, String) {
    let found = d
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == PROGRESSING));
    match found {
        Some(c) => {
            let status = match c.status.as_str() {
                "True" => "True",
                "False" => "False",
                _ => "Unknown",
            };
            (
                status,
                c.reason.clone().unwrap_or_else(|| "Unknown".into()),
                c.message.clone().unwrap_or_default(),
            )
        }
        None => (
            "Unknown",
            "NoDeploymentStatus".into(),
            "the Deployment controller has not reported progress yet".into(),
        ),
    }
}

/// The operator's fields of the status: conditions, `observedGeneration` and
/// `readyReplicas`. `leader` and `provisioned` belong to the pods and are
/// left out, so the apply neither sets nor removes them.
pub fn operator_status(
    p: &Provisioner,
    refused: Option<&Refusal>,
    deployment: Option<&Deployment>,
    now: Timestamp,
) -> ProvisionerStatus {
    let generation = p.metadata.generation;
    let previous = p.status.clone().unwrap_or_default();
    let s = &p.spec;
    let ready_pods = pod_count(deployment, |st| st.ready_replicas);
    let available = pod_count(deployment, |st| st.available_replicas);

    let (ready, ready_reason, ready_message) = ready(refused, deployment, s.replicas);
    let (progress, progress_reason, progress_message) = progressing(deployment);
    let (elected, elected_reason, elected_message) = leader_elected(p, &previous, available);
    let (paused_reason, paused_message) = paused(s.paused);
    let (degraded_reason, degraded_message) = degraded(refused);

    let condition = |type_: &str, status: &str, reason: &str, message: String| {
        // The transition time moves only when the status does.
        let since = previous
            .condition(type_)
            .filter(|c| c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: since,
        }
    };
    let bool_status = |b: bool| if b { "True" } else { "False" };
    ProvisionerStatus {
        conditions: vec![
            condition(READY, bool_status(ready), &ready_reason, ready_message),
            condition(PROGRESSING, progress, &progress_reason, progress_message),
            condition(
                LEADER_ELECTED,
                bool_status(elected),
                elected_reason,
                elected_message,
            ),
            condition(
                PAUSED,
                bool_status(s.paused),
                paused_reason,
                paused_message.into(),
            ),
            condition(
                DEGRADED,
                bool_status(refused.is_some()),
                degraded_reason,
                degraded_message,
            ),
        ],
        observed_generation: generation,
        ready_replicas: Some(ready_pods),
        replicas: Some(pod_count(deployment, |st| st.replicas)),
        selector: Some(selector(&p.name_any())),
        ..ProvisionerStatus::default()
    }
}

/// One of the Deployment's pod counts, 0 before it reports any.
fn pod_count(
    deployment: Option<&Deployment>,
    count: impl Fn(&DeploymentStatus) -> Option<i32>,
) -> i32 {
    deployment
        .and_then(|d| d.status.as_ref())
        .and_then(count)
        .unwrap_or(0)
}

/// The Ready condition: never while the spec is refused, else the
/// Deployment's rollout.
fn ready(
    refused: Option<&Refusal>,
    deployment: Option<&Deployment>,
    replicas: i32,
) -> (bool, String, String) {
    match refused {
        Some(r) => (
            false,
            r.reason.to_string(),
            "the owned objects were not applied; see the Degraded condition".to_string(),
        ),
        None => {
            let (ok, reason, message) = readiness(deployment, replicas);
            (ok, reason.to_string(), message)
        }
    }
}

/// The Paused condition's reason and message.
fn paused(paused: bool) -> (&'static str, &'static str) {
    if paused {
        (
            "PausedBySpec",
            "spec.paused is true: the pods do not provision",
        )
    } else {
        ("NotPaused", "spec.paused is false")
    }
}

/// The Degraded condition's reason and message: the refusal's problems.
fn degraded<'a>(refused: Option<&Refusal<'a>>) -> (&'a str, String) {
    match refused {
        Some(r) => (r.reason, r.problems.join("; ")),
        None => ("AsExpected", "the spec is valid".to_string()),
    }
}

/// The LeaderElected condition: shards have no leader, no election means
/// every replica works, and a reported leader leads only while a pod is
/// available.
fn leader_elected(
    p: &Provisioner,
    previous: &ProvisionerStatus,
    available: i32,
) -> (bool, &'static str, String) {
    let s = &p.spec;
    let leader = previous.leader.as_deref().filter(|l| !l.is_empty());
    match (s.election.backend, leader) {
        _ if s.election.mode == ElectionMode::Shards => (
            false,
            "Sharded",
            format!(
                "spec.election.mode is Shards: no leader, {} member(s) each provisioning its share",
                previous.members.len()
            ),
        ),
        (ElectionBackend::None, _) => (
            false,
            "ElectionDisabled",
            "spec.election.backend is none: every replica provisions".to_string(),
        ),
        (_, Some(l)) if available >= 1 => (true, "Elected", format!("{l} leads")),
        (_, Some(l)) => (
            false,
            "NoAvailableReplicas",
            format!("no pod is available, so {l} (the last reported leader) does not lead"),
        ),
        (_, None) => (false, "NoLeader", "no pod leads".to_string()),
    }
}

/// The pods' label selector as a string, for the `scale` subresource.
pub fn selector(name: &str) -> String {
    crate::build::selector_labels(name)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether `new` differs from the operator's fields of `old`.
pub fn changed(old: Option<&ProvisionerStatus>, new: &ProvisionerStatus) -> bool {
    let Some(old) = old else { return true };
    old.observed_generation != new.observed_generation
        || old.ready_replicas != new.ready_replicas
        || old.replicas != new.replicas
        || old.selector != new.selector
        || new
            .conditions
            .iter()
            .any(|c| old.condition(&c.type_) != Some(c))
}

/// An Event to publish: type, reason, note.
pub type Note = (EventType, &'static str, String);

/// The Events the change from `old` to `new` deserves: provisioning paused
/// or resumed, the spec fine again. (A refusal has its Warning from the
/// reconciler, which knows when one is new; a leader change, [`leader_changed`].)
pub fn events(old: Option<&ProvisionerStatus>, new: &ProvisionerStatus) -> Vec<Note> {
    let was = |t: &str| old.and_then(|o| o.condition(t));
    let now = |t: &str| new.condition(t);
    let flipped = |t: &str| matches!((was(t), now(t)), (Some(b), Some(a)) if b.status != a.status);
    let mut notes = Vec::new();
    if flipped(PAUSED) {
        notes.push(if now(PAUSED).is_some_and(|c| c.status == "True") {
            (
                EventType::Normal,
                "Paused",
                "spec.paused is true: provisioning stops".into(),
            )
        } else {
            (
                EventType::Normal,
                "Resumed",
                "spec.paused is false: provisioning resumes".into(),
            )
        });
    }
    if flipped(DEGRADED) && now(DEGRADED).is_some_and(|c| c.status == "False") {
        notes.push((
            EventType::Normal,
            "Recovered",
            "the spec is valid again and was applied".into(),
        ));
    }
    notes
}

/// The Event for `status.leader` going from `before` to `after`.
pub fn leader_changed(before: Option<&str>, after: Option<&str>) -> Option<Note> {
    let note = match (before, after) {
        (b, a) if b == a => return None,
        (Some(b), Some(a)) => format!("{a} leads (before: {b})"),
        (None, Some(a)) => format!("{a} leads"),
        (Some(b), None) => format!("no pod leads (before: {b})"),
        (None, None) => return None,
    };
    Some((EventType::Normal, "LeaderChanged", note))
}

#[cfg(test)]
mod tests;

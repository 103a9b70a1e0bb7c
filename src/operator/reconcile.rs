//! One reconciliation of a `Provisioner`: validate, apply every owned object
//! with server-side apply, then apply the operator's part of the status.
//!
//! Level-triggered and idempotent: each run applies the whole desired state,
//! whatever changed, and an unchanged apply is a no-op on the server (so the
//! status write does not wake the controller again). An invalid spec changes
//! nothing it owns: the last good Deployment keeps running while the status
//! and a Warning event say what to fix.

use super::build::{self, BuildError, Owned, Settings};
use super::metrics::Metrics;
use super::validate::validate;
use super::FIELD_MANAGER;
use crate::crd::{ElectionBackend, Provisioner, ProvisionerStatus, API_VERSION, KIND};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// Condition types.
pub const READY: &str = "Ready";
pub const LEADER_ELECTED: &str = "LeaderElected";
pub const PAUSED: &str = "Paused";
pub const DEGRADED: &str = "Degraded";

/// How often a Provisioner is reconciled without any change (drift repair).
pub const RESYNC: Duration = Duration::from_secs(300);
/// Retry delay after a failed reconciliation.
pub const RETRY: Duration = Duration::from_secs(30);
/// Longest event note the API accepts (1 kB).
const MAX_NOTE: usize = 1024;

/// What reconciliations share.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The admin's policy and the ClusterRoles the pods are bound to.
    pub settings: Settings,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The reason is rendered without exec-plugin output, which can hold
    /// credentials.
    #[error("{action} {kind} {name}: {reason}")]
    Api {
        action: &'static str,
        kind: String,
        name: String,
        reason: String,
    },
}

impl Error {
    /// A short label for the failure metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Build(_) => "build",
            Error::Api { action, .. } => action,
        }
    }
}

use crate::k8s::describe_error as describe;

fn api_error<K: Resource<DynamicType = ()>>(
    action: &'static str,
    name: &str,
    e: &kube::Error,
) -> Error {
    Error::Api {
        action,
        kind: K::kind(&()).into_owned(),
        name: name.to_string(),
        reason: describe(e),
    }
}

/// Reconciles one Provisioner.
pub async fn reconcile(p: Arc<Provisioner>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciled();
    let ns = p.namespace().ok_or(BuildError::Missing("namespace"))?;
    let name = p.name_any();
    let mut problems = validate(&p);
    let mut reason = INVALID_SPEC;
    if problems.is_empty() {
        problems = ctx.settings.policy.check(&p);
        reason = NOT_ALLOWED;
    }
    let owned = if problems.is_empty() {
        let owned = build::owned(&p, &ctx.settings)?;
        let uid = p.metadata.uid.clone().ok_or(BuildError::Missing("uid"))?;
        problems = foreign_objects(&ctx.client, &ns, &owned, &name, &uid).await?;
        reason = NOT_OWNED;
        Some(owned)
    } else {
        None
    };
    let ready_replicas = match owned {
        Some(owned) if problems.is_empty() => apply_owned(&ctx.client, &ns, owned).await?,
        _ => {
            match reason {
                NOT_OWNED => ctx.metrics.failed("not_owned"),
                // Invalid, or beyond the admin's policy: the spec's fault.
                _ => ctx.metrics.invalid_spec(),
            }
            report_invalid(&p, &ctx.recorder, reason, &problems).await?;
            // Keep what was observed: leaving the field out of the apply would
            // remove it.
            p.status.as_ref().and_then(|s| s.ready_replicas)
        }
    };
    let status = operator_status(&p, reason, &problems, ready_replicas, Timestamp::now());
    let api: Api<Provisioner> = Api::namespaced(ctx.client.clone(), &ns);
    let body = serde_json::json!({"apiVersion": API_VERSION, "kind": KIND, "status": status});
    api.patch_status(&name, &apply_params(), &Patch::Apply(&body))
        .await
        .map_err(|e| api_error::<Provisioner>("status", &name, &e))?;
    Ok(Action::requeue(RESYNC))
}

/// After a failure: count it, log it, retry soon.
pub fn error_policy(p: Arc<Provisioner>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed(error.metric_label());
    warn!(provisioner = %p.name_any(), namespace = ?p.namespace(), %error, "reconciliation failed; retrying");
    Action::requeue(RETRY)
}

fn apply_params() -> PatchParams {
    // Force: this operator owns these fields, even if someone edited them.
    PatchParams::apply(FIELD_MANAGER).force()
}

async fn apply<K>(client: &Client, ns: &str, obj: &K) -> Result<K, Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    Api::<K>::namespaced(client.clone(), ns)
        .patch(&name, &apply_params(), &Patch::Apply(obj))
        .await
        .map_err(|e| api_error::<K>("apply", &name, &e))
}

/// Degraded reasons: the spec is invalid, asks for more than the cluster
/// admin allows, or needs a name that is taken.
pub const INVALID_SPEC: &str = "InvalidSpec";
pub const NOT_ALLOWED: &str = "NotAllowed";
pub const NOT_OWNED: &str = "NotOwned";

/// Who owns an existing object, for messages: its owner references, else
/// the managers of its fields, else nobody named.
fn describe_owner(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    let owners: Vec<String> = meta
        .owner_references
        .iter()
        .flatten()
        .map(|o| format!("{} {}", o.kind, o.name))
        .collect();
    if !owners.is_empty() {
        return format!("owned by {}", owners.join(", "));
    }
    let managers: Vec<String> = meta
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    if managers.is_empty() {
        "not owned by this Provisioner".into()
    } else {
        format!(
            "not owned by this Provisioner (managed by {})",
            managers.join(", ")
        )
    }
}

/// The object `name` of kind `K`, when it exists and is not ours: a message.
async fn foreign<K>(
    client: &Client,
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<Option<String>, Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned,
{
    let existing = Api::<K>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| api_error::<K>("get", name, &e))?;
    let Some(obj) = existing else {
        return Ok(None);
    };
    let ours = obj
        .meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid);
    Ok((!ours).then(|| {
        format!(
            "{} {ns}/{name} exists and is {}; rename the Provisioner or remove that object (nothing was changed)",
            K::kind(&()),
            describe_owner(obj.meta())
        )
    }))
}

/// Every object the Provisioner needs a name for that exists and belongs
/// to someone else. The names are fixed (`<name>`, `<name>-config`,
/// `<name>-metrics`), so anyone allowed to create a Provisioner could
/// otherwise overwrite (and, through the owner reference, have garbage
/// collected) same-named objects of others; the PDB is checked even when it
/// would be deleted.
async fn foreign_objects(
    client: &Client,
    ns: &str,
    owned: &Owned,
    name: &str,
    uid: &str,
) -> Result<Vec<String>, Error> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let n = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.name.clone().unwrap_or_default()
    };
    let found = [
        foreign::<ServiceAccount>(client, ns, &n(&owned.service_account.metadata), uid).await?,
        foreign::<Role>(client, ns, &n(&owned.role.metadata), uid).await?,
        foreign::<RoleBinding>(client, ns, &n(&owned.role_binding.metadata), uid).await?,
        foreign::<RoleBinding>(client, ns, &n(&owned.lease_binding.metadata), uid).await?,
        foreign::<RoleBinding>(client, ns, &n(&owned.cert_manager_binding.metadata), uid).await?,
        foreign::<ConfigMap>(client, ns, &n(&owned.config_map.metadata), uid).await?,
        foreign::<Service>(client, ns, &n(&owned.service.metadata), uid).await?,
        foreign::<Deployment>(client, ns, &n(&owned.deployment.metadata), uid).await?,
        foreign::<PodDisruptionBudget>(client, ns, name, uid).await?,
    ];
    Ok(found.into_iter().flatten().collect())
}

/// Applies every owned object (the ones others depend on first) and returns
/// the Deployment's ready replicas.
async fn apply_owned(client: &Client, ns: &str, owned: Owned) -> Result<Option<i32>, Error> {
    apply(client, ns, &owned.service_account).await?;
    apply(client, ns, &owned.role).await?;
    apply(client, ns, &owned.role_binding).await?;
    apply(client, ns, &owned.lease_binding).await?;
    apply(client, ns, &owned.cert_manager_binding).await?;
    apply(client, ns, &owned.config_map).await?;
    apply(client, ns, &owned.service).await?;
    let deployment = apply(client, ns, &owned.deployment).await?;
    let name = deployment.name_any();
    match &owned.pdb {
        Some(pdb) => {
            apply(client, ns, pdb).await?;
        }
        None => {
            use k8s_openapi::api::policy::v1::PodDisruptionBudget;
            let api = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns);
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {
                    info!(namespace = ns, provisioner = %name, "deleted the PodDisruptionBudget: fewer than two replicas")
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => return Err(api_error::<PodDisruptionBudget>("delete", &name, &e)),
            }
        }
    }
    Ok(deployment.status.and_then(|s| s.ready_replicas))
}

/// A Warning event for an invalid spec, once per distinct message: the
/// Degraded condition already carrying this message means it was reported.
async fn report_invalid(
    p: &Provisioner,
    recorder: &Recorder,
    reason: &str,
    problems: &[String],
) -> Result<(), Error> {
    let message = problems.join("; ");
    let reported = p
        .status
        .as_ref()
        .and_then(|s| s.condition(DEGRADED))
        .is_some_and(|c| c.status == "True" && c.message == message);
    warn!(provisioner = %p.name_any(), namespace = ?p.namespace(), %message, reason, "owned objects left unchanged");
    if reported {
        return Ok(());
    }
    let mut note = message;
    if note.len() > MAX_NOTE {
        let mut cut = MAX_NOTE - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    recorder
        .publish(
            &Event {
                type_: EventType::Warning,
                reason: reason.into(),
                note: Some(note),
                action: "Validate".into(),
                secondary: None,
            },
            &p.object_ref(&()),
        )
        .await
        .map_err(|e| Error::Api {
            action: "event",
            kind: "Event".into(),
            name: p.name_any(),
            reason: describe(&e),
        })
}

/// The operator's fields of the status: conditions, `observedGeneration` and
/// `readyReplicas`. `leader` and `provisioned` belong to the leading pod and
/// are left out, so the apply neither sets nor removes them.
pub fn operator_status(
    p: &Provisioner,
    blocked: &str,
    problems: &[String],
    ready_replicas: Option<i32>,
    now: Timestamp,
) -> ProvisionerStatus {
    let generation = p.metadata.generation;
    let previous = p.status.clone().unwrap_or_default();
    let valid = problems.is_empty();
    let ready = ready_replicas.unwrap_or(0);
    let s = &p.spec;

    let (ready_status, ready_reason, ready_message) = if !valid {
        (
            false,
            blocked,
            "the owned objects were not applied; see the Degraded condition".to_string(),
        )
    } else if ready >= 1 {
        (
            true,
            "Available",
            format!("{ready} of {} pods ready", s.replicas),
        )
    } else if s.replicas == 0 {
        (false, "ScaledToZero", "spec.replicas is 0".to_string())
    } else {
        (
            false,
            "NoReadyReplicas",
            "no provisioner pod is ready yet".to_string(),
        )
    };
    let leader = previous.leader.as_deref().filter(|l| !l.is_empty());
    let (leader_status, leader_reason, leader_message) = match (s.election.backend, leader) {
        (ElectionBackend::None, _) => (
            false,
            "ElectionDisabled",
            "spec.election.backend is none: every replica provisions".to_string(),
        ),
        (_, Some(l)) if ready >= 1 => (true, "Elected", format!("{l} leads")),
        (_, Some(l)) => (
            false,
            "NoReadyReplicas",
            format!("no pod is ready, so {l} (the last reported leader) does not lead"),
        ),
        (_, None) => (
            false,
            "NoLeader",
            "no pod has reported leading yet".to_string(),
        ),
    };
    let (paused_reason, paused_message) = if s.paused {
        (
            "PausedBySpec",
            "spec.paused is true: the pods do not provision",
        )
    } else {
        ("NotPaused", "spec.paused is false")
    };
    let (degraded_reason, degraded_message) = if valid {
        ("AsExpected", "the spec is valid".to_string())
    } else {
        (blocked, problems.join("; "))
    };

    let condition = |type_: &str, status: bool, reason: &str, message: String| {
        let status = if status { "True" } else { "False" };
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
    ProvisionerStatus {
        conditions: vec![
            condition(READY, ready_status, ready_reason, ready_message),
            condition(LEADER_ELECTED, leader_status, leader_reason, leader_message),
            condition(PAUSED, s.paused, paused_reason, paused_message.into()),
            condition(DEGRADED, !valid, degraded_reason, degraded_message),
        ],
        observed_generation: generation,
        leader: None,
        ready_replicas: Some(ready),
        provisioned: None,
    }
}

#[cfg(test)]
mod tests;

//! One reconciliation of a `Provisioner`: validate it and check it against
//! the cluster admin's policy, bring the owned objects to what it asks for,
//! then write the operator's part of its status.
//!
//! Level-triggered and idempotent, but frugal: the owned objects are read
//! from the controller's caches and only what differs is written (see
//! [`owned`]), and the status only when it changed, so a reconciliation of
//! an unchanged Provisioner writes nothing. A refused spec changes nothing
//! it owns: the last good Deployment keeps running while the status and a
//! Warning Event say what to fix.

mod owned;
mod status;

pub(crate) use owned::OwnedKind;
pub use owned::{owned_selector, Stores, APPLIED_ANNOTATION};
pub use status::{
    changed, events, leader_changed, operator_status, Refusal, DEGRADED, LEADER_ELECTED, PAUSED,
    PROGRESSING, READY,
};

use super::build::{self, BuildError, Owned, Settings};
use super::metrics::Metrics;
use super::validate::validate;
use choria_k8s::crd::status_patch::StatusApply;
use choria_k8s::crd::{Provisioner, KIND};
use choria_k8s::describe_error as describe;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{info, warn};

/// How often a Provisioner is looked at without any change: the watches
/// bring every change, this is for one a broken watch missed.
pub const RESYNC: Duration = Duration::from_secs(300);
/// Retry delay after a failed reconciliation.
pub const RETRY: Duration = Duration::from_secs(30);
/// Longest event note the API accepts (1 kB).
const MAX_NOTE: usize = 1024;

/// Degraded reasons: the spec is invalid, asks for more than the cluster
/// admin allows, or needs a name that is taken.
pub const INVALID_SPEC: &str = "InvalidSpec";
pub const NOT_ALLOWED: &str = "NotAllowed";
pub const NOT_OWNED: &str = "NotOwned";

/// What reconciliations share.
pub struct Context {
    pub client: Client,
    /// Who the Events say reported them.
    pub reporter: Reporter,
    pub metrics: Arc<Metrics>,
    /// The admin's policy and the ClusterRoles the pods are bound to.
    pub settings: Settings,
    /// What the operator owns, as its watches last saw it.
    pub stores: Stores,
    /// The leader each Provisioner (by uid) named when this controller last
    /// looked: a change is an Event.
    pub leaders: Mutex<HashMap<String, Option<String>>>,
    /// Provisioners (by uid) whose signing key Secret this controller made
    /// or found: asked for once each, so an unchanged Provisioner costs no
    /// request.
    pub signing_keys: Mutex<std::collections::HashSet<String>>,
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

fn api_error(kind: &str, action: &'static str, name: &str, e: &dyn ErrorText) -> Error {
    Error::Api {
        action,
        kind: kind.to_string(),
        name: name.to_string(),
        reason: e.text(),
    }
}

/// How an error reads in [`Error::Api`]: a kube error without what an
/// exec plugin printed.
trait ErrorText {
    fn text(&self) -> String;
}

impl ErrorText for kube::Error {
    fn text(&self) -> String {
        describe(self)
    }
}

impl ErrorText for serde_json::Error {
    fn text(&self) -> String {
        self.to_string()
    }
}

/// Reconciles one Provisioner.
pub async fn reconcile(p: Arc<Provisioner>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciled();
    ctx.stores.ready().await;
    let ns = p.namespace().ok_or(BuildError::Missing("namespace"))?;
    let (refused, deployment) = match refusal(&p, &ctx.settings) {
        Some(refused) => (Some(refused), ctx.stores.deployment(&ns, &p.name_any())),
        None => {
            let owned = build::owned(&p, &ctx.settings)?;
            match sync_owned(&ctx, &p, &ns, &owned).await? {
                Synced::Done(deployment) => (None, deployment.map(|d| *d)),
                Synced::Taken(problems) => (
                    Some((NOT_OWNED, problems)),
                    ctx.stores.deployment(&ns, &p.name_any()),
                ),
            }
        }
    };
    if let Some((reason, problems)) = &refused {
        count_refusal(&ctx, reason);
        report_refusal(&p, &ctx, reason, problems).await?;
    }
    let refusal = refused
        .as_ref()
        .map(|(reason, problems)| Refusal { reason, problems });
    write_status(&p, &ctx, refusal.as_ref(), deployment.as_ref()).await?;
    report_leader(&p, &ctx).await?;
    Ok(Action::requeue(RESYNC))
}

/// After a failure: count it, log it, retry soon.
pub fn error_policy(p: Arc<Provisioner>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed(error.metric_label());
    warn!(provisioner = %p.name_any(), namespace = ?p.namespace(), %error, "reconciliation failed; retrying");
    Action::requeue(RETRY)
}

/// Why nothing may be applied, if so: the spec is invalid, or asks for
/// more than the admin allows.
fn refusal(p: &Provisioner, settings: &Settings) -> Option<(&'static str, Vec<String>)> {
    let invalid = validate(p);
    if !invalid.is_empty() {
        return Some((INVALID_SPEC, invalid));
    }
    let beyond = settings.policy.check(p);
    (!beyond.is_empty()).then_some((NOT_ALLOWED, beyond))
}

fn count_refusal(ctx: &Context, reason: &str) {
    match reason {
        NOT_OWNED => ctx.metrics.failed("not_owned"),
        // Invalid, or beyond the admin's policy: the spec's fault.
        _ => ctx.metrics.invalid_spec(),
    }
}

/// What [`sync_owned`] came to.
enum Synced {
    /// Everything is as wanted; the Deployment as it now is.
    Done(Option<Box<Deployment>>),
    /// Names we need are taken: nothing was written.
    Taken(Vec<String>),
}

/// Brings the owned objects to `owned`. Every name is checked first, and
/// nothing is written while one is taken by someone else: the names are
/// fixed (`<name>`, `<name>-config`, ...), so anyone allowed to create a
/// Provisioner could otherwise overwrite (and, through the owner reference,
/// have garbage collected) same-named objects of others.
async fn sync_owned(
    ctx: &Context,
    p: &Provisioner,
    ns: &str,
    owned: &Owned,
) -> Result<Synced, Error> {
    let name = p.name_any();
    let uid = p.metadata.uid.clone().ok_or(BuildError::Missing("uid"))?;
    let desired = owned::all_desired(owned);
    let mut steps = Vec::with_capacity(desired.len());
    for d in &desired {
        steps.push(owned::step(&ctx.stores, &ctx.client, ns, &uid, d).await?);
    }
    let taken: Vec<String> = steps
        .iter()
        .filter_map(|s| match s {
            owned::Step::Foreign(m) => Some(m.clone()),
            _ => None,
        })
        .collect();
    if !taken.is_empty() {
        return Ok(Synced::Taken(taken));
    }
    ensure_signing_key(ctx, p, ns, &uid).await?;
    let mut deployment = ctx.stores.deployment(ns, &name);
    for (d, step) in desired.iter().zip(&steps) {
        if !matches!(step, owned::Step::Apply) {
            continue;
        }
        let applied = owned::apply(&ctx.client, ns, d).await?;
        info!(namespace = ns, provisioner = %name, kind = %d.resource.kind, object = %d.name, "applied");
        if d.resource.kind == Deployment::kind(&()) {
            deployment = Some(
                serde_json::from_value(applied)
                    .map_err(|e| api_error("Deployment", "apply", &d.name, &e))?,
            );
        }
    }
    if owned.pdb.is_none() && owned::remove_pdb(&ctx.stores, &ctx.client, ns, &name, &uid).await? {
        info!(namespace = ns, provisioner = %name, "deleted the PodDisruptionBudget: fewer than two replicas");
    }
    Ok(Synced::Done(deployment.map(Box::new)))
}

/// Makes the Secret with the pods' signing key, when they need one and the
/// spec names none (see [`build::signing_key_secret`]): created once and
/// never replaced (a new seed would orphan every record sealed with the
/// old). The operator may only create Secrets, never read them: one that
/// exists under the name is kept as it is.
async fn ensure_signing_key(
    ctx: &Context,
    p: &Provisioner,
    ns: &str,
    uid: &str,
) -> Result<(), Error> {
    let known = |ctx: &Context| {
        ctx.signing_keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(uid)
    };
    if known(ctx) {
        return Ok(());
    }
    let Some(secret) = build::signing_key_secret(p)? else {
        return Ok(());
    };
    let name = secret.metadata.name.clone().unwrap_or_default();
    let api = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(ctx.client.clone(), ns);
    match api.create(&kube::api::PostParams::default(), &secret).await {
        Ok(_) => {
            info!(namespace = ns, provisioner = %p.name_any(), secret = %name, "made the signing key Secret")
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(api_error("Secret", "create", &name, &e)),
    }
    ctx.signing_keys
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(uid.to_string());
    Ok(())
}

/// Applies the operator's part of the status when it changed, then
/// publishes the Events its change deserves.
async fn write_status(
    p: &Provisioner,
    ctx: &Context,
    refused: Option<&Refusal<'_>>,
    deployment: Option<&Deployment>,
) -> Result<(), Error> {
    let status = operator_status(p, refused, deployment, Timestamp::now());
    let old = p.status.as_ref();
    if !changed(old, &status) {
        return Ok(());
    }
    let name = p.name_any();
    let ns = p.namespace().unwrap_or_default();
    let body = StatusApply::new(status.clone());
    let params = PatchParams::apply(super::FIELD_MANAGER).force();
    Api::<Provisioner>::namespaced(ctx.client.clone(), &ns)
        .patch_status(&name, &params, &Patch::Apply(&body))
        .await
        .map_err(|e| api_error(KIND, "status", &name, &e))?;
    for (type_, reason, note) in events(old, &status) {
        publish(p, ctx, type_, reason, "Reconcile", note).await?;
    }
    Ok(())
}

/// An Event when `status.leader` names another leader than when this
/// controller last looked (not on its first look: it cannot know).
async fn report_leader(p: &Provisioner, ctx: &Context) -> Result<(), Error> {
    let Some(uid) = p.metadata.uid.clone() else {
        return Ok(());
    };
    let now = p.status.as_ref().and_then(|s| s.leader.clone());
    let before = ctx
        .leaders
        .lock()
        .expect("the leaders map is never poisoned")
        .insert(uid, now.clone());
    if let Some((type_, reason, note)) =
        before.and_then(|b| leader_changed(b.as_deref(), now.as_deref()))
    {
        publish(p, ctx, type_, reason, "Elect", note).await?;
    }
    Ok(())
}

/// A Warning Event for a refused spec, once per distinct message: the
/// Degraded condition already carrying this message means it was reported.
async fn report_refusal(
    p: &Provisioner,
    ctx: &Context,
    reason: &'static str,
    problems: &[String],
) -> Result<(), Error> {
    let message = problems.join("; ");
    let reported = p
        .status
        .as_ref()
        .and_then(|s| s.condition(DEGRADED))
        .is_some_and(|c| c.status == "True" && c.message == message);
    if reported {
        return Ok(());
    }
    warn!(provisioner = %p.name_any(), namespace = ?p.namespace(), %message, reason, "owned objects left unchanged");
    publish(p, ctx, EventType::Warning, reason, "Validate", message).await
}

/// Publishes one Event. Each through a Recorder of its own: kube's
/// Recorder folds an Event with the reason of one it published in the last
/// minutes into a series of that one, keeping the first one's note, and
/// ours are published only on a change, each saying what changed.
async fn publish(
    p: &Provisioner,
    ctx: &Context,
    type_: EventType,
    reason: &'static str,
    action: &str,
    mut note: String,
) -> Result<(), Error> {
    if note.len() > MAX_NOTE {
        let mut cut = MAX_NOTE - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    Recorder::new(ctx.client.clone(), ctx.reporter.clone())
        .publish(
            &Event {
                type_,
                reason: reason.into(),
                note: Some(note),
                action: action.into(),
                secondary: None,
            },
            &p.object_ref(&()),
        )
        .await
        .map_err(|e| api_error("Event", "event", &p.name_any(), &e))
}

#[cfg(test)]
mod tests;

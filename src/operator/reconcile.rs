//! One reconciliation of a `Provisioner`: validate, apply every owned object
//! with server-side apply, then apply the operator's part of the status.
//!
//! Level-triggered and idempotent: each run applies the whole desired state,
//! whatever changed, and an unchanged apply is a no-op on the server (so the
//! status write does not wake the controller again). An invalid spec changes
//! nothing it owns: the last good Deployment keeps running while the status
//! and a Warning event say what to fix.

use super::build::{self, BuildError, Owned};
use super::crd::{ElectionBackend, Provisioner, ProvisionerStatus, API_VERSION, KIND};
use super::metrics::Metrics;
use super::validate::validate;
use super::FIELD_MANAGER;
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
    let problems = validate(&p);
    let ready_replicas = if problems.is_empty() {
        apply_owned(&ctx.client, &ns, build::owned(&p)?).await?
    } else {
        ctx.metrics.invalid_spec();
        report_invalid(&p, &ctx.recorder, &problems).await?;
        // Keep what was observed: leaving the field out of the apply would
        // remove it.
        p.status.as_ref().and_then(|s| s.ready_replicas)
    };
    let status = operator_status(&p, &problems, ready_replicas, Timestamp::now());
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

/// Applies every owned object (the ones others depend on first) and returns
/// the Deployment's ready replicas.
async fn apply_owned(client: &Client, ns: &str, owned: Owned) -> Result<Option<i32>, Error> {
    apply(client, ns, &owned.service_account).await?;
    apply(client, ns, &owned.role).await?;
    apply(client, ns, &owned.role_binding).await?;
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
    problems: &[String],
) -> Result<(), Error> {
    let message = problems.join("; ");
    let reported = p
        .status
        .as_ref()
        .and_then(|s| s.condition(DEGRADED))
        .is_some_and(|c| c.status == "True" && c.message == message);
    warn!(provisioner = %p.name_any(), namespace = ?p.namespace(), %message, "invalid Provisioner spec; owned objects left unchanged");
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
                reason: "InvalidSpec".into(),
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
            "InvalidSpec",
            "the spec is invalid; see the Degraded condition".to_string(),
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
        ("InvalidSpec", problems.join("; "))
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
mod tests {
    use super::*;
    use crate::operator::build::CHECKSUM_ANNOTATION;
    use crate::operator::fixtures::{api_server, resource_json, Scenario, Seen, UID};
    use kube::runtime::events::Reporter;
    use serde_json::{json, Value};

    const WAIT: Duration = Duration::from_secs(5);

    struct Run {
        result: Result<Action, Error>,
        seen: Vec<Seen>,
        metrics: Arc<Metrics>,
    }

    impl Run {
        fn lines(&self) -> Vec<String> {
            self.seen.iter().map(Seen::line).collect()
        }

        fn find(&self, path_part: &str) -> &Seen {
            self.seen
                .iter()
                .find(|s| s.path.contains(path_part))
                .unwrap_or_else(|| panic!("no request to {path_part}: {:#?}", self.lines()))
        }

        fn status(&self) -> ProvisionerStatus {
            serde_json::from_value(self.find("/status").body["status"].clone()).unwrap()
        }

        fn checksum(&self) -> String {
            self.find("/deployments/").body["spec"]["template"]["metadata"]["annotations"]
                [CHECKSUM_ANNOTATION]
                .as_str()
                .unwrap()
                .to_string()
        }
    }

    async fn reconcile_with(resource: Value, scenario: Scenario) -> Run {
        let (client, server) = api_server(scenario);
        let metrics = Arc::new(Metrics::new());
        let ctx = Arc::new(Context {
            client: client.clone(),
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: FIELD_MANAGER.into(),
                    instance: Some("operator-0".into()),
                },
            ),
            metrics: metrics.clone(),
        });
        let p: Arc<Provisioner> = Arc::new(serde_json::from_value(resource).unwrap());
        let result = tokio::time::timeout(WAIT, reconcile(p.clone(), ctx.clone()))
            .await
            .expect("reconcile finishes");
        if let Err(e) = &result {
            error_policy(p, e, ctx.clone());
        }
        drop(ctx);
        let seen = tokio::time::timeout(WAIT, server)
            .await
            .expect("the mocked API server sees the client go")
            .unwrap();
        Run {
            result,
            seen,
            metrics,
        }
    }

    async fn run(resource: Value, ready_replicas: Option<i32>) -> Run {
        let scenario = Scenario {
            ready_replicas,
            resource: resource.clone(),
            fail: None,
        };
        reconcile_with(resource, scenario).await
    }

    fn condition<'a>(status: &'a ProvisionerStatus, type_: &str) -> &'a Condition {
        status
            .condition(type_)
            .unwrap_or_else(|| panic!("no {type_} condition in {status:?}"))
    }

    const OWNED: [&str; 7] = [
        "PATCH /api/v1/namespaces/choria/serviceaccounts/prov",
        "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/choria/roles/prov",
        "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/choria/rolebindings/prov",
        "PATCH /api/v1/namespaces/choria/configmaps/prov-config",
        "PATCH /api/v1/namespaces/choria/services/prov-metrics",
        "PATCH /apis/apps/v1/namespaces/choria/deployments/prov",
        "PATCH /apis/policy/v1/namespaces/choria/poddisruptionbudgets/prov",
    ];
    const STATUS: &str =
        "PATCH /apis/provisioning.choria.io/v1alpha1/namespaces/choria/provisioners/prov/status";

    #[tokio::test]
    async fn create_applies_every_owned_object_then_the_status() {
        let r = run(resource_json(json!({})), None).await;
        assert_eq!(r.result.as_ref().unwrap(), &Action::requeue(RESYNC));
        let mut expected: Vec<String> = OWNED.iter().map(|s| s.to_string()).collect();
        expected.push(STATUS.into());
        assert_eq!(r.lines(), expected);
        for s in &r.seen {
            assert!(
                s.query.contains("fieldManager=choria-provisioner-operator")
                    && s.query.contains("force=true"),
                "{}: {}",
                s.line(),
                s.query
            );
            assert_eq!(
                s.content_type,
                "application/apply-patch+yaml",
                "{}",
                s.line()
            );
        }
        for s in &r.seen[..OWNED.len()] {
            let owner = &s.body["metadata"]["ownerReferences"][0];
            assert_eq!(owner["uid"], UID, "{}", s.line());
            assert_eq!(owner["controller"], true, "{}", s.line());
            assert_eq!(owner["kind"], "Provisioner", "{}", s.line());
            assert!(
                s.body["apiVersion"].is_string() && s.body["kind"].is_string(),
                "{}",
                s.line()
            );
        }

        let status_body = &r.find("/status").body;
        assert_eq!(status_body["apiVersion"], "provisioning.choria.io/v1alpha1");
        assert_eq!(status_body["kind"], "Provisioner");
        let st = status_body["status"].as_object().unwrap();
        let mut keys: Vec<&str> = st.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            ["conditions", "observedGeneration", "readyReplicas"],
            "the pod's leader and provisioned are not ours to write"
        );
        let status = r.status();
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(status.ready_replicas, Some(0));
        let ready = condition(&status, READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "NoReadyReplicas")
        );
        assert_eq!(ready.observed_generation, Some(3));
        assert_eq!(condition(&status, DEGRADED).status, "False");
        assert_eq!(condition(&status, PAUSED).status, "False");
        let leader = condition(&status, LEADER_ELECTED);
        assert_eq!(
            (leader.status.as_str(), leader.reason.as_str()),
            ("False", "NoLeader")
        );
        assert_eq!(
            r.metrics
                .value("choria_provisioner_operator_reconciliations_total"),
            Some(1.0)
        );
    }

    #[tokio::test]
    async fn ready_pods_and_a_reported_leader() {
        let mut resource = resource_json(json!({}));
        resource["status"] = json!({"leader": "prov-7d9-abcde", "provisioned": 12});
        let r = run(resource, Some(2)).await;
        let status = r.status();
        assert_eq!(status.ready_replicas, Some(2));
        let ready = condition(&status, READY);
        assert_eq!(
            (ready.status.as_str(), ready.message.as_str()),
            ("True", "2 of 2 pods ready")
        );
        let leader = condition(&status, LEADER_ELECTED);
        assert_eq!(leader.status, "True");
        assert_eq!(leader.message, "prov-7d9-abcde leads");
        assert!(
            status.leader.is_none() && status.provisioned.is_none(),
            "not re-applied"
        );
    }

    #[tokio::test]
    async fn a_changed_spec_rolls_the_pods() {
        let before = run(resource_json(json!({"workers": 2})), Some(1)).await;
        let after = run(resource_json(json!({"workers": 4})), Some(1)).await;
        assert_ne!(before.checksum(), after.checksum());
        let cm = |r: &Run| {
            r.find("/configmaps/").body["data"]["provisioner.yaml"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert!(cm(&before).contains("workers: 2"), "{}", cm(&before));
        assert!(cm(&after).contains("workers: 4"), "{}", cm(&after));
        let again = run(resource_json(json!({"workers": 2})), Some(1)).await;
        assert_eq!(before.checksum(), again.checksum(), "idempotent");
    }

    #[tokio::test]
    async fn pausing_reports_paused_without_rolling_the_pods() {
        let running = run(resource_json(json!({})), Some(1)).await;
        let paused = run(resource_json(json!({"paused": true})), Some(1)).await;
        assert_eq!(running.checksum(), paused.checksum());
        let p = paused.status();
        let c = condition(&p, PAUSED);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "PausedBySpec")
        );
        assert_eq!(condition(&p, READY).status, "True");
        assert_eq!(condition(&running.status(), PAUSED).status, "False");
    }

    #[tokio::test]
    async fn below_two_replicas_the_pdb_is_deleted() {
        let r = run(resource_json(json!({"replicas": 1})), Some(1)).await;
        assert!(r.result.is_ok(), "{:?}", r.result);
        assert!(r.lines().contains(
            &"DELETE /apis/policy/v1/namespaces/choria/poddisruptionbudgets/prov".to_string()
        ));
        assert!(!r
            .lines()
            .iter()
            .any(|l| l.starts_with("PATCH") && l.contains("poddisruptionbudgets")));
    }

    #[tokio::test]
    async fn an_invalid_spec_is_reported_and_changes_nothing() {
        let resource = resource_json(json!({"features": {"jwt": true}, "interval": "30s"}));
        let r = run(resource, Some(1)).await;
        assert!(r.result.is_ok(), "{:?}", r.result);
        assert_eq!(
            r.lines(),
            [
                "POST /apis/events.k8s.io/v1/namespaces/choria/events",
                STATUS
            ]
        );
        let event = &r.seen[0].body;
        assert_eq!(event["type"], "Warning");
        assert_eq!(event["reason"], "InvalidSpec");
        assert_eq!(event["regarding"]["name"], "prov");
        assert_eq!(event["regarding"]["uid"], UID);
        let note = event["note"].as_str().unwrap();
        assert!(
            note.contains("spec.jwtVerifyKeySecret") && note.contains("spec.interval"),
            "{note}"
        );

        let status = r.status();
        let degraded = condition(&status, DEGRADED);
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "InvalidSpec")
        );
        assert_eq!(degraded.message, note);
        let ready = condition(&status, READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSpec")
        );
        assert_eq!(
            r.metrics
                .value("choria_provisioner_operator_invalid_specs_total"),
            Some(1.0)
        );
    }

    #[tokio::test]
    async fn an_invalid_spec_already_reported_gets_no_second_event() {
        let mut resource = resource_json(json!({"features": {"jwt": true}}));
        let p: Provisioner = serde_json::from_value(resource.clone()).unwrap();
        let problems = validate(&p);
        let earlier = operator_status(&p, &problems, Some(1), Timestamp::UNIX_EPOCH);
        resource["status"] = serde_json::to_value(&earlier).unwrap();
        let r = run(resource, Some(1)).await;
        assert_eq!(r.lines(), [STATUS]);
        let status = r.status();
        assert_eq!(
            condition(&status, DEGRADED).last_transition_time,
            Time(Timestamp::UNIX_EPOCH),
            "unchanged conditions keep their transition time"
        );
    }

    #[tokio::test]
    async fn api_failures_are_errors_counted_by_the_error_policy() {
        let resource = resource_json(json!({}));
        let scenario = Scenario {
            ready_replicas: None,
            resource: resource.clone(),
            fail: Some("/configmaps/"),
        };
        let r = reconcile_with(resource, scenario).await;
        let e = r.result.as_ref().unwrap_err();
        assert_eq!(e.metric_label(), "apply");
        let text = e.to_string();
        assert!(
            text.contains("ConfigMap prov-config") && text.contains("500"),
            "{text}"
        );
        assert!(
            !r.lines().iter().any(|l| l.contains("/deployments/")),
            "stops at the failure"
        );
        assert_eq!(
            r.metrics
                .value("choria_provisioner_operator_reconcile_failures_total"),
            Some(1.0)
        );
    }

    #[test]
    fn transition_times_move_only_with_the_status() {
        let then = Timestamp::UNIX_EPOCH;
        let now = Timestamp::from_second(1_000_000).unwrap();
        let mut p: Provisioner = serde_json::from_value(resource_json(json!({}))).unwrap();
        let first = operator_status(&p, &[], Some(0), then);
        p.status = Some(first);
        let same = operator_status(&p, &[], Some(0), now);
        assert_eq!(condition(&same, READY).last_transition_time, Time(then));
        let flipped = operator_status(&p, &[], Some(1), now);
        assert_eq!(condition(&flipped, READY).last_transition_time, Time(now));
        assert_eq!(
            condition(&flipped, DEGRADED).last_transition_time,
            Time(then)
        );
    }

    #[test]
    fn leader_conditions() {
        let with = |spec: Value, leader: Option<&str>, ready: i32| {
            let mut p: Provisioner = serde_json::from_value(resource_json(spec)).unwrap();
            p.status = Some(ProvisionerStatus {
                leader: leader.map(str::to_string),
                ..ProvisionerStatus::default()
            });
            let s = operator_status(&p, &[], Some(ready), Timestamp::UNIX_EPOCH);
            let c = condition(&s, LEADER_ELECTED);
            (c.status.clone(), c.reason.clone())
        };
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(with(json!({}), Some("pod-a"), 1), pair("True", "Elected"));
        assert_eq!(
            with(json!({}), Some("pod-a"), 0),
            pair("False", "NoReadyReplicas")
        );
        assert_eq!(with(json!({}), None, 1), pair("False", "NoLeader"));
        assert_eq!(
            with(json!({"election": {"backend": "none"}}), None, 2),
            pair("False", "ElectionDisabled")
        );
    }
}

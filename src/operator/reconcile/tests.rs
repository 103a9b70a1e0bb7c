use super::*;
use crate::monitor::Exposition;
use crate::operator::build::CHECKSUM_ANNOTATION;
use crate::operator::fixtures::{api_server, resource_json, Scenario, Seen, UID};
use kube::runtime::events::Reporter;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(5);

struct Run {
    result: Result<Action, Error>,
    /// The writes (PATCH, DELETE, POST), in order.
    seen: Vec<Seen>,
    /// Every request, the ownership GETs included.
    all: Vec<Seen>,
    metrics: Arc<Metrics>,
}

impl Run {
    /// The writes, in order (the ownership GETs before them left out).
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
        settings: crate::operator::fixtures::settings(),
    });
    let p: Arc<Provisioner> = Arc::new(serde_json::from_value(resource).unwrap());
    let result = tokio::time::timeout(WAIT, reconcile(p.clone(), ctx.clone()))
        .await
        .expect("reconcile finishes");
    if let Err(e) = &result {
        error_policy(p, e, ctx.clone());
    }
    drop(ctx);
    let all = tokio::time::timeout(WAIT, server)
        .await
        .expect("the mocked API server sees the client go")
        .unwrap();
    let seen = all.iter().filter(|s| s.method != "GET").cloned().collect();
    Run {
        result,
        seen,
        all,
        metrics,
    }
}

async fn run(resource: Value, ready_replicas: Option<i32>) -> Run {
    let scenario = Scenario {
        ready_replicas,
        resource: resource.clone(),
        fail: None,
        existing: Vec::new(),
    };
    reconcile_with(resource, scenario).await
}

fn condition<'a>(status: &'a ProvisionerStatus, type_: &str) -> &'a Condition {
    status
        .condition(type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status:?}"))
}

const OWNED: [&str; 9] = [
    "PATCH /api/v1/namespaces/choria/serviceaccounts/prov",
    "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/choria/roles/prov",
    "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/choria/rolebindings/prov",
    "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/choria/rolebindings/prov-leases",
    "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/choria/rolebindings/prov-certificaterequests",
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

/// Refused for `reason`: only a Warning Event and the status were written,
/// Degraded and Ready say why, the refusal was counted. Returns the note.
fn assert_refused(r: &Run, reason: &str) -> String {
    assert!(r.result.is_ok(), "{:?}", r.result);
    assert_eq!(
        r.lines(),
        [
            "POST /apis/events.k8s.io/v1/namespaces/choria/events",
            STATUS
        ],
        "nothing applied"
    );
    let event = &r.seen[0].body;
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], reason);
    assert_eq!(event["regarding"]["name"], "prov");
    assert_eq!(event["regarding"]["uid"], UID);
    let note = event["note"].as_str().unwrap().to_string();
    let status = r.status();
    let degraded = condition(&status, DEGRADED);
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", reason)
    );
    assert_eq!(degraded.message, note);
    let ready = condition(&status, READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", reason)
    );
    assert_eq!(
        r.metrics
            .value("choria_provisioner_operator_invalid_specs_total"),
        Some(1.0)
    );
    note
}

#[tokio::test]
async fn an_invalid_spec_is_reported_and_changes_nothing() {
    let resource = resource_json(json!({"features": {"jwt": true}, "interval": "30s"}));
    let note = assert_refused(&run(resource, Some(1)).await, INVALID_SPEC);
    assert!(
        note.contains("spec.jwtVerifyKeySecret") && note.contains("spec.interval"),
        "{note}"
    );
}

#[tokio::test]
async fn a_provisioner_asking_for_more_than_the_admin_allows_is_refused() {
    let resource = resource_json(json!({
        "image": "busybox:latest",
        "features": {"pki": true},
        "pki": {"certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}},
    }));
    let note = assert_refused(&run(resource, Some(1)).await, NOT_ALLOWED);
    assert!(
        note.contains("spec.image \"busybox:latest\" is not an image this operator may run")
            && note.contains("ClusterIssuer \"corp-ca\""),
        "{note}"
    );
}

#[tokio::test]
async fn an_invalid_spec_already_reported_gets_no_second_event() {
    let mut resource = resource_json(json!({"features": {"jwt": true}}));
    let p: Provisioner = serde_json::from_value(resource.clone()).unwrap();
    let problems = validate(&p);
    let earlier = operator_status(&p, INVALID_SPEC, &problems, Some(1), Timestamp::UNIX_EPOCH);
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
        existing: Vec::new(),
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
    let first = operator_status(&p, INVALID_SPEC, &[], Some(0), then);
    p.status = Some(first);
    let same = operator_status(&p, INVALID_SPEC, &[], Some(0), now);
    assert_eq!(condition(&same, READY).last_transition_time, Time(then));
    let flipped = operator_status(&p, INVALID_SPEC, &[], Some(1), now);
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
        let s = operator_status(&p, INVALID_SPEC, &[], Some(ready), Timestamp::UNIX_EPOCH);
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

#[tokio::test]
async fn every_owned_name_is_checked_before_anything_is_written() {
    let r = run(resource_json(json!({})), None).await;
    let gets: Vec<String> = r
        .all
        .iter()
        .filter(|s| s.method == "GET")
        .map(Seen::line)
        .collect();
    let paths: Vec<String> = OWNED.iter().map(|l| l.replace("PATCH", "GET")).collect();
    assert_eq!(gets, paths);
    let first_write = r.all.iter().position(|s| s.method != "GET").unwrap();
    assert_eq!(
        first_write,
        OWNED.len(),
        "every GET comes before the first write"
    );
}

#[tokio::test]
async fn objects_of_someone_else_under_our_names_are_left_alone_and_reported() {
    let resource = resource_json(json!({"replicas": 1}));
    let theirs = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "prov-config", "namespace": "choria",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                          "name": "billing", "uid": "other-uid"}]},
    });
    let their_pdb = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "prov", "namespace": "choria",
                     "managedFields": [{"manager": "kubectl-client-side-apply", "operation": "Update"}]},
    });
    let scenario = Scenario {
        ready_replicas: None,
        resource: resource.clone(),
        fail: None,
        existing: vec![
            ("/configmaps/prov-config", theirs),
            ("/poddisruptionbudgets/prov", their_pdb),
        ],
    };
    let r = reconcile_with(resource, scenario).await;
    assert!(r.result.is_ok(), "{:?}", r.result);
    let writes = r.lines();
    assert!(
        !writes
            .iter()
            .any(|l| !l.contains("/status") && !l.contains("/events")),
        "nothing owned was written, nor the PDB deleted: {writes:#?}"
    );
    let status = r.status();
    let degraded = condition(&status, DEGRADED);
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", NOT_OWNED)
    );
    for want in [
        "ConfigMap choria/prov-config exists and is owned by Deployment billing",
        "PodDisruptionBudget choria/prov exists and is not owned by this Provisioner (managed by kubectl-client-side-apply)",
    ] {
        assert!(degraded.message.contains(want), "{}", degraded.message);
    }
    let event = r.find("/events").body.clone();
    assert_eq!(event["reason"], NOT_OWNED);
    assert!(
        event["note"].as_str().unwrap().contains("billing"),
        "{event}"
    );
}

#[tokio::test]
async fn objects_we_own_are_applied_as_usual() {
    let resource = resource_json(json!({}));
    let ours = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "prov-config", "namespace": "choria",
                     "ownerReferences": [{"apiVersion": "provisioning.choria.io/v1alpha1",
                                          "kind": "Provisioner", "name": "prov", "uid": UID}]},
    });
    let scenario = Scenario {
        ready_replicas: None,
        resource: resource.clone(),
        fail: None,
        existing: vec![("/configmaps/prov-config", ours)],
    };
    let r = reconcile_with(resource, scenario).await;
    assert!(r
        .lines()
        .iter()
        .any(|l| l.contains("/configmaps/prov-config")));
    assert_eq!(condition(&r.status(), DEGRADED).status, "False");
}

use super::*;
use crate::build::CHECKSUM_ANNOTATION;
use crate::fixtures::{api_server, resource_json, settings, Scenario, Seen, UID};
use choria_k8s::crd::ProvisionerStatus;
use choria_replica::monitor::Exposition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(5);

struct Run {
    result: Result<Action, Error>,
    /// The writes (PATCH, DELETE, POST), in order.
    seen: Vec<Seen>,
    /// Every request, GETs included.
    all: Vec<Seen>,
    metrics: Arc<Metrics>,
}

impl Run {
    /// The writes, in order.
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

    fn gets(&self) -> Vec<String> {
        self.all
            .iter()
            .filter(|s| s.method == "GET")
            .map(Seen::line)
            .collect()
    }
}

/// A store of the objects of `cluster` of kind `K`, listed once.
fn store_of<K>(cluster: &[Value]) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned,
{
    let (reader, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in cluster
        .iter()
        .filter(|o| o["kind"] == K::kind(&()).as_ref())
    {
        let obj: K = serde_json::from_value(o.clone()).unwrap();
        writer.apply_watcher_event(&watcher::Event::InitApply(obj));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    reader
}

/// The controller's caches, holding `cluster`.
fn stores_with(cluster: &[Value]) -> Stores {
    Stores {
        service_accounts: store_of(cluster),
        roles: store_of(cluster),
        role_bindings: store_of(cluster),
        config_maps: store_of(cluster),
        services: store_of(cluster),
        deployments: store_of(cluster),
        pdbs: store_of(cluster),
    }
}

/// What the API server holds after the operator applied what `resource`
/// asks for: each owned object with our hash, plus what it adds. The
/// Deployment has `ready` of its replicas updated and available.
fn applied(resource: &Value, ready: i32) -> Vec<Value> {
    let p: Provisioner = serde_json::from_value(resource.clone()).unwrap();
    let owned = build::owned(&p, &settings()).unwrap();
    owned::all_desired(&owned)
        .into_iter()
        .map(|d| {
            let mut o = d.object;
            o["metadata"]["resourceVersion"] = json!("500");
            o["metadata"]["uid"] = json!(format!("uid-of-{}", d.name));
            if o["kind"] == "Deployment" {
                o["metadata"]["generation"] = json!(1);
                o["status"] = json!({"observedGeneration": 1, "replicas": ready,
                    "updatedReplicas": ready, "readyReplicas": ready, "availableReplicas": ready});
            }
            o
        })
        .collect()
}

async fn reconcile_in(resource: Value, cluster: &[Value], scenario: Scenario) -> Run {
    let (client, server) = api_server(scenario);
    let metrics = Arc::new(Metrics::new());
    let ctx = Arc::new(Context {
        client,
        reporter: Reporter {
            controller: crate::FIELD_MANAGER.into(),
            instance: Some("operator-0".into()),
        },
        metrics: metrics.clone(),
        settings: settings(),
        stores: stores_with(cluster),
        leaders: Default::default(),
        signing_keys: Default::default(),
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

fn scenario(resource: &Value) -> Scenario {
    Scenario {
        ready_replicas: None,
        resource: resource.clone(),
        fail: None,
        existing: Vec::new(),
    }
}

/// A reconciliation in an empty cluster.
async fn run(resource: Value) -> Run {
    let s = scenario(&resource);
    reconcile_in(resource, &[], s).await
}

/// A reconciliation where the owned objects are as they were applied.
async fn run_applied(resource: Value, ready: i32) -> Run {
    let cluster = applied(&resource, ready);
    let s = scenario(&resource);
    reconcile_in(resource, &cluster, s).await
}

/// The Deployment of `cluster`.
fn deployment_in(cluster: &[Value]) -> Deployment {
    let d = cluster.iter().find(|o| o["kind"] == "Deployment").unwrap();
    serde_json::from_value(d.clone()).unwrap()
}

/// `resource` with the status the operator writes for it now, as if it
/// had reconciled it before.
fn with_status(mut resource: Value, ready: i32) -> Value {
    let cluster = applied(&resource, ready);
    let p: Provisioner = serde_json::from_value(resource.clone()).unwrap();
    let d = deployment_in(&cluster);
    let earlier = operator_status(&p, None, Some(&d), Timestamp::UNIX_EPOCH);
    let mut status = serde_json::to_value(&earlier).unwrap();
    if let Some(leader) = resource["status"]["leader"].as_str() {
        status["leader"] = json!(leader);
    }
    resource["status"] = status;
    resource
}

fn condition<'a>(status: &'a ProvisionerStatus, type_: &str) -> &'a Condition {
    status
        .condition(type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status:?}"))
}

const OWNED: [&str; 9] = [
    "/api/v1/namespaces/choria/serviceaccounts/prov",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/choria/roles/prov",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/choria/rolebindings/prov",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/choria/rolebindings/prov-leases",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/choria/rolebindings/prov-certificaterequests",
    "/api/v1/namespaces/choria/configmaps/prov-config",
    "/api/v1/namespaces/choria/services/prov-metrics",
    "/apis/apps/v1/namespaces/choria/deployments/prov",
    "/apis/policy/v1/namespaces/choria/poddisruptionbudgets/prov",
];
const STATUS: &str =
    "PATCH /apis/provisioning.choria.io/v1alpha1/namespaces/choria/provisioners/prov/status";
const EVENT: &str = "POST /apis/events.k8s.io/v1/namespaces/choria/events";

#[tokio::test]
async fn create_checks_every_name_then_applies_every_owned_object_then_the_status() {
    let r = run(resource_json(json!({}))).await;
    assert_eq!(r.result.as_ref().unwrap(), &Action::requeue(RESYNC));
    let gets: Vec<String> = OWNED.iter().map(|p| format!("GET {p}")).collect();
    assert_eq!(r.gets(), gets, "names not in the caches are looked up");
    let first_write = r.all.iter().position(|s| s.method != "GET").unwrap();
    assert_eq!(first_write, OWNED.len(), "every name is checked first");
    let mut expected: Vec<String> = OWNED.iter().map(|p| format!("PATCH {p}")).collect();
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
        let hash = &s.body["metadata"]["annotations"][APPLIED_ANNOTATION];
        assert_eq!(hash.as_str().map(str::len), Some(64), "{}", s.line());
    }

    let status_body = &r.find("/status").body;
    assert_eq!(status_body["apiVersion"], "provisioning.choria.io/v1alpha1");
    assert_eq!(status_body["kind"], "Provisioner");
    let mut keys: Vec<&str> = status_body["status"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "conditions",
            "observedGeneration",
            "readyReplicas",
            "replicas",
            "selector"
        ],
        "the pods' leader and provisioned are not ours to write"
    );
    let status = r.status();
    assert_eq!(status.observed_generation, Some(3));
    let types: Vec<&str> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(
        types,
        [READY, PROGRESSING, LEADER_ELECTED, PAUSED, DEGRADED]
    );
    assert!(status
        .conditions
        .iter()
        .all(|c| c.observed_generation == Some(3)));
    assert_eq!(
        r.metrics
            .value("choria_provisioner_operator_reconciliations_total"),
        Some(1.0)
    );
}

#[tokio::test]
async fn an_unchanged_provisioner_costs_no_request_at_all() {
    let resource = with_status(resource_json(json!({})), 2);
    let r = run_applied(resource, 2).await;
    assert!(r.result.is_ok(), "{:?}", r.result);
    assert!(
        r.all.is_empty(),
        "read from the caches, nothing written: {:#?}",
        r.all
    );
}

#[tokio::test]
async fn a_hand_edit_is_put_back_and_only_it() {
    let resource = with_status(resource_json(json!({})), 2);
    let mut cluster = applied(&resource, 2);
    let cm = cluster
        .iter_mut()
        .find(|o| o["kind"] == "ConfigMap")
        .unwrap();
    cm["data"]["provisioner.yaml"] = json!("edited by hand");
    let dep = cluster
        .iter_mut()
        .find(|o| o["kind"] == "Deployment")
        .unwrap();
    dep["metadata"]["labels"]["extra"] = json!("someone else's, left alone");
    let s = scenario(&resource);
    let r = reconcile_in(resource, &cluster, s).await;
    assert_eq!(
        r.lines(),
        ["PATCH /api/v1/namespaces/choria/configmaps/prov-config"]
    );
    assert!(r.gets().is_empty());
}

#[tokio::test]
async fn a_changed_spec_applies_what_it_changes_and_rolls_the_pods() {
    let before = resource_json(json!({"workers": 2}));
    let cluster = applied(&before, 2);
    let after = with_status(resource_json(json!({"workers": 4})), 2);
    let s = scenario(&after);
    let r = reconcile_in(after, &cluster, s).await;
    assert_eq!(
        r.lines(),
        [
            "PATCH /api/v1/namespaces/choria/configmaps/prov-config",
            "PATCH /apis/apps/v1/namespaces/choria/deployments/prov",
            STATUS,
        ],
        "what the workers change: the configuration and the checksum; a rollout begins"
    );
    assert_eq!(condition(&r.status(), READY).status, "False");
    let old = cluster.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_ne!(
        old["spec"]["template"]["metadata"]["annotations"][CHECKSUM_ANNOTATION],
        r.checksum()
    );
}

#[tokio::test]
async fn pausing_writes_the_status_and_an_event_and_rolls_nothing() {
    let resource = with_status(resource_json(json!({})), 2);
    let cluster = applied(&resource, 2);
    let mut paused = resource.clone();
    paused["spec"]["paused"] = json!(true);
    let s = scenario(&paused);
    let r = reconcile_in(paused, &cluster, s).await;
    assert_eq!(r.lines(), [STATUS, EVENT], "no owned object is written");
    let c = r.status();
    let c = condition(&c, PAUSED);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "PausedBySpec")
    );
    let event = &r.find("/events").body;
    assert_eq!(
        (event["type"].as_str(), event["reason"].as_str()),
        (Some("Normal"), Some("Paused"))
    );
}

#[tokio::test]
async fn below_two_replicas_our_pdb_is_deleted_and_someone_elses_left_alone() {
    let two = with_status(resource_json(json!({})), 1);
    let cluster = applied(&two, 1);
    let mut one = two.clone();
    one["spec"]["replicas"] = json!(1);
    let s = scenario(&one);
    let r = reconcile_in(one.clone(), &cluster, s).await;
    assert!(r.result.is_ok(), "{:?}", r.result);
    assert!(r.lines().contains(
        &"DELETE /apis/policy/v1/namespaces/choria/poddisruptionbudgets/prov".to_string()
    ));
    // Not in the caches (not ours): not deleted, not even looked at.
    let without: Vec<Value> = applied(&one, 1);
    let s = scenario(&one);
    let r = reconcile_in(one, &without, s).await;
    assert!(
        !r.all
            .iter()
            .any(|s| s.path.contains("poddisruptionbudgets")),
        "{:#?}",
        r.lines()
    );
}

/// Refused for `reason`: only a Warning Event and the status were written,
/// Degraded and Ready say why, the refusal was counted. Returns the note.
fn assert_refused(r: &Run, reason: &str) -> String {
    assert!(r.result.is_ok(), "{:?}", r.result);
    assert_eq!(r.lines(), [EVENT, STATUS], "nothing applied");
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
    note
}

#[tokio::test]
async fn an_invalid_spec_is_reported_and_changes_nothing() {
    let resource = resource_json(json!({"features": {"jwt": true}, "interval": "30s"}));
    let r = run_applied(resource, 1).await;
    let note = assert_refused(&r, INVALID_SPEC);
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
        "pod": {
            "priorityClassName": "system-cluster-critical",
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }));
    let r = run(resource).await;
    let note = assert_refused(&r, NOT_ALLOWED);
    assert!(
        note.contains("spec.image \"busybox:latest\" is not an image this operator may run")
            && note.contains("ClusterIssuer \"corp-ca\"")
            && note.contains("spec.pod.priorityClassName \"system-cluster-critical\"")
            && note.contains(
                "spec.pod.volumes[0] (\"data\") uses the volume type persistentVolumeClaim"
            ),
        "{note}"
    );
}

#[tokio::test]
async fn a_refusal_already_reported_gets_no_second_event_nor_status_write() {
    let mut resource = resource_json(json!({"features": {"jwt": true}}));
    let p: Provisioner = serde_json::from_value(resource.clone()).unwrap();
    let problems = validate(&p);
    let refused = Refusal {
        reason: INVALID_SPEC,
        problems: &problems,
    };
    let earlier = operator_status(&p, Some(&refused), None, Timestamp::UNIX_EPOCH);
    resource["status"] = serde_json::to_value(&earlier).unwrap();
    let r = run(resource).await;
    assert!(r.all.is_empty(), "{:#?}", r.lines());
}

#[tokio::test]
async fn api_failures_are_errors_counted_by_the_error_policy() {
    let resource = resource_json(json!({}));
    let scenario = Scenario {
        fail: Some("/configmaps/"),
        ..scenario(&resource)
    };
    let r = reconcile_in(resource, &[], scenario).await;
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

#[tokio::test]
async fn objects_of_someone_else_under_our_names_are_left_alone_and_reported() {
    let resource = resource_json(json!({}));
    let theirs = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "prov-config", "namespace": "choria",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                          "name": "billing", "uid": "other-uid"}]},
    });
    let their_service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "prov-metrics", "namespace": "choria",
                     "managedFields": [{"manager": "kubectl-client-side-apply", "operation": "Update"}]},
    });
    let scenario = Scenario {
        existing: vec![
            ("/configmaps/prov-config", theirs),
            ("/services/prov-metrics", their_service),
        ],
        ..scenario(&resource)
    };
    let r = reconcile_in(resource, &[], scenario).await;
    assert!(r.result.is_ok(), "{:?}", r.result);
    let note = assert_refused(&r, NOT_OWNED);
    for want in [
        "ConfigMap choria/prov-config exists and is owned by Deployment billing",
        "Service choria/prov-metrics exists and is not owned by this Provisioner (managed by kubectl-client-side-apply)",
    ] {
        assert!(note.contains(want), "{note}");
    }
}

#[tokio::test]
async fn an_object_of_ours_that_lost_our_label_is_found_and_applied() {
    let resource = resource_json(json!({}));
    let ours = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "prov-config", "namespace": "choria",
                     "ownerReferences": [{"apiVersion": "provisioning.choria.io/v1alpha1",
                                          "kind": "Provisioner", "name": "prov", "uid": UID}]},
    });
    let scenario = Scenario {
        existing: vec![("/configmaps/prov-config", ours)],
        ..scenario(&resource)
    };
    let r = reconcile_in(resource, &[], scenario).await;
    assert!(r
        .lines()
        .iter()
        .any(|l| l.contains("/configmaps/prov-config")));
    assert_eq!(condition(&r.status(), DEGRADED).status, "False");
}

#[tokio::test]
async fn a_new_leader_is_an_event_once_this_controller_knew_the_old_one() {
    let mut resource = with_status(resource_json(json!({})), 2);
    resource["status"]["leader"] = json!("prov-a");
    let cluster = applied(&resource, 2);
    let (client, server) = api_server(scenario(&resource));
    let ctx = Arc::new(Context {
        client,
        reporter: Reporter::from("test"),
        metrics: Arc::new(Metrics::new()),
        settings: settings(),
        stores: stores_with(&cluster),
        leaders: Default::default(),
        signing_keys: Default::default(),
    });
    let p = |leader: &str| -> Arc<Provisioner> {
        let mut r = resource.clone();
        r["status"]["leader"] = json!(leader);
        // What the operator last wrote, for this leader.
        let mut p: Provisioner = serde_json::from_value(r).unwrap();
        let st = operator_status(
            &p,
            None,
            Some(&deployment_in(&cluster)),
            Timestamp::UNIX_EPOCH,
        );
        let s = p.status.as_mut().unwrap();
        s.conditions = st.conditions;
        Arc::new(p)
    };
    reconcile(p("prov-a"), ctx.clone()).await.unwrap();
    reconcile(p("prov-b"), ctx.clone()).await.unwrap();
    reconcile(p("prov-b"), ctx.clone()).await.unwrap();
    drop(ctx);
    let seen = tokio::time::timeout(WAIT, server).await.unwrap().unwrap();
    let events: Vec<&Value> = seen
        .iter()
        .filter(|s| s.path.ends_with("/events"))
        .map(|s| &s.body)
        .collect();
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["reason"], "LeaderChanged");
    assert_eq!(events[0]["note"], "prov-b leads (before: prov-a)");
}

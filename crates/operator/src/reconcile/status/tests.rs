use super::*;
use crate::fixtures::resource_json;
use serde_json::{json, Value};

fn provisioner(spec: Value, leader: Option<&str>) -> Provisioner {
    let mut p: Provisioner = serde_json::from_value(resource_json(spec)).unwrap();
    p.status = Some(ProvisionerStatus {
        leader: leader.map(str::to_string),
        ..ProvisionerStatus::default()
    });
    p
}

/// A Deployment at `generation` as its controller reports it.
fn deployment(generation: i64, status: Value) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": "prov", "generation": generation},
        "status": status,
    }))
    .unwrap()
}

fn cond(s: &ProvisionerStatus, t: &str) -> (String, String, String) {
    let c = s.condition(t).unwrap();
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

fn ready(d: &Deployment) -> (String, String, String) {
    let p = provisioner(json!({"replicas": 3}), None);
    cond(
        &operator_status(&p, None, Some(d), Timestamp::UNIX_EPOCH),
        READY,
    )
}

#[test]
fn ready_only_when_the_rollout_is_complete() {
    let all = json!({"observedGeneration": 4, "replicas": 3, "updatedReplicas": 3,
                     "readyReplicas": 3, "availableReplicas": 3});
    assert_eq!(
        ready(&deployment(4, all.clone())),
        (
            "True".into(),
            "Available".into(),
            "3 of 3 pods updated and available".into()
        )
    );
    // New pods crash-looping behind available old ones: ready pods, yet
    // not Ready (the old check read readyReplicas only).
    let behind = json!({"observedGeneration": 5, "replicas": 4, "updatedReplicas": 1,
                        "readyReplicas": 3, "availableReplicas": 3});
    assert_eq!(
        ready(&deployment(5, behind)),
        (
            "False".into(),
            "RolloutInProgress".into(),
            "1 of 3 pods run the current spec".into()
        )
    );
    assert_eq!(
        ready(&deployment(6, all.clone())).1,
        "RolloutPending",
        "the controller has not seen the spec"
    );
    let old_left = json!({"observedGeneration": 4, "replicas": 4, "updatedReplicas": 3,
                          "availableReplicas": 4});
    assert_eq!(
        ready(&deployment(4, old_left)).2,
        "1 old pods are still running"
    );
    let unavailable = json!({"observedGeneration": 4, "replicas": 3, "updatedReplicas": 3,
                             "availableReplicas": 2});
    assert_eq!(
        ready(&deployment(4, unavailable)).2,
        "2 of 3 updated pods are available"
    );
    let p = provisioner(json!({"replicas": 0}), None);
    let s = operator_status(&p, None, Some(&deployment(4, all)), Timestamp::UNIX_EPOCH);
    assert_eq!(cond(&s, READY).1, "ScaledToZero");
    let s = operator_status(&p, None, None, Timestamp::UNIX_EPOCH);
    assert_eq!(cond(&s, READY).1, "NoDeployment");
}

#[test]
fn progressing_is_the_deployments_own() {
    let p = provisioner(json!({}), None);
    let stuck = deployment(
        2,
        json!({"observedGeneration": 2, "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
             "message": "ReplicaSet \"prov-7d9\" has timed out progressing."}]}),
    );
    let s = operator_status(&p, None, Some(&stuck), Timestamp::UNIX_EPOCH);
    assert_eq!(
        cond(&s, PROGRESSING),
        (
            "False".into(),
            "ProgressDeadlineExceeded".into(),
            "ReplicaSet \"prov-7d9\" has timed out progressing.".into()
        )
    );
    let s = operator_status(
        &p,
        None,
        Some(&deployment(1, json!({}))),
        Timestamp::UNIX_EPOCH,
    );
    assert_eq!(cond(&s, PROGRESSING).0, "Unknown");
}

#[test]
fn leader_conditions() {
    let up = deployment(
        1,
        json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}),
    );
    let down = deployment(1, json!({"observedGeneration": 1}));
    let with = |spec: Value, leader: Option<&str>, d: &Deployment| {
        let s = operator_status(
            &provisioner(spec, leader),
            None,
            Some(d),
            Timestamp::UNIX_EPOCH,
        );
        let (status, reason, _) = cond(&s, LEADER_ELECTED);
        (status, reason)
    };
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(with(json!({}), Some("pod-a"), &up), pair("True", "Elected"));
    assert_eq!(
        with(json!({}), Some("pod-a"), &down),
        pair("False", "NoAvailableReplicas")
    );
    assert_eq!(with(json!({}), None, &up), pair("False", "NoLeader"));
    assert_eq!(
        with(json!({"election": {"backend": "none"}}), None, &up),
        pair("False", "ElectionDisabled")
    );
    assert_eq!(
        with(json!({"election": {"mode": "Shards"}}), Some("pod-a"), &up),
        pair("False", "Sharded"),
        "no leader in shards mode, whatever a stale status.leader says"
    );
}

#[test]
fn the_scale_subresource_reads_replicas_and_the_pods_selector() {
    let d = deployment(
        1,
        json!({"observedGeneration": 1, "replicas": 3, "readyReplicas": 2}),
    );
    let p = provisioner(json!({"replicas": 3}), None);
    let s = operator_status(&p, None, Some(&d), Timestamp::UNIX_EPOCH);
    assert_eq!(s.replicas, Some(3));
    assert_eq!(
        s.selector.as_deref(),
        Some("app.kubernetes.io/instance=prov,app.kubernetes.io/name=choria-provisioner")
    );
    let mut old = s.clone();
    assert!(!changed(Some(&old), &s));
    old.replicas = Some(2);
    assert!(changed(Some(&old), &s), "a new replica count is written");
    // The operator's apply leaves the pods' fields out.
    let body = serde_json::to_value(&s).unwrap();
    for pods in ["leader", "provisioned", "members", "records", "renewalsDue"] {
        assert!(body.get(pods).is_none(), "{pods}: {body}");
    }
}

#[test]
fn every_condition_carries_the_generation_and_moves_its_time_only_with_its_status() {
    let then = Timestamp::UNIX_EPOCH;
    let now = Timestamp::from_second(1_000_000).unwrap();
    let mut p = provisioner(json!({}), None);
    let first = operator_status(&p, None, None, then);
    assert!(first
        .conditions
        .iter()
        .all(|c| c.observed_generation == Some(3)));
    p.status = Some(first.clone());
    let same = operator_status(&p, None, None, now);
    assert!(!changed(Some(&first), &same), "nothing to write");
    let problems = vec!["x".to_string()];
    let refused = Refusal {
        reason: "InvalidSpec",
        problems: &problems,
    };
    let flipped = operator_status(&p, Some(&refused), None, now);
    assert!(changed(Some(&first), &flipped));
    assert_eq!(
        flipped.condition(DEGRADED).unwrap().last_transition_time,
        Time(now)
    );
    assert_eq!(
        flipped.condition(READY).unwrap().last_transition_time,
        Time(then),
        "Ready stayed False"
    );
}

#[test]
fn pause_resume_and_recovery_are_events() {
    let p = provisioner(json!({}), None);
    let running = operator_status(&p, None, None, Timestamp::UNIX_EPOCH);
    let paused = operator_status(
        &provisioner(json!({"paused": true}), None),
        None,
        None,
        Timestamp::UNIX_EPOCH,
    );
    let reasons = |n: Vec<Note>| n.into_iter().map(|(_, r, _)| r).collect::<Vec<_>>();
    assert_eq!(reasons(events(Some(&running), &paused)), ["Paused"]);
    assert_eq!(reasons(events(Some(&paused), &running)), ["Resumed"]);
    assert!(events(Some(&running), &running).is_empty());
    assert!(
        events(None, &paused).is_empty(),
        "no event without a before"
    );
    let problems = vec!["x".to_string()];
    let refused = Refusal {
        reason: "InvalidSpec",
        problems: &problems,
    };
    let degraded = operator_status(&p, Some(&refused), None, Timestamp::UNIX_EPOCH);
    assert!(
        events(Some(&running), &degraded).is_empty(),
        "the refusal has its own"
    );
    assert_eq!(reasons(events(Some(&degraded), &running)), ["Recovered"]);
}

#[test]
fn leader_changes() {
    assert_eq!(leader_changed(Some("a"), Some("a")), None);
    assert_eq!(
        leader_changed(Some("a"), Some("b")).map(|n| n.2),
        Some("b leads (before: a)".into())
    );
    assert_eq!(
        leader_changed(Some("a"), None).map(|n| n.2),
        Some("no pod leads (before: a)".into())
    );
    assert_eq!(
        leader_changed(None, Some("b")).map(|n| n.2),
        Some("b leads".into())
    );
}

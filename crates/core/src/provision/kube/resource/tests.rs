use super::*;
use choria_k8s::crd::{Member, API_VERSION, KIND};
use serde_json::json;

#[test]
fn a_pod_name_names_its_candidate_names() {
    assert!(names("prov-7b9f-x2", "prov-7b9f-x2-3fa91c"));
    assert!(names("go-provisioner", "go-provisioner"));
    assert!(!names("prov-7b9f-x2", "prov-7b9f-x2-3fa91"));
    assert!(!names("prov-7b9f-x2", "prov-7b9f-x2-zzzzzz"));
    assert!(!names("prov", "prov-7b9f-x2-3fa91c"), "another pod's");
}

fn me(pod: &str) -> Me {
    Me {
        candidate: format!("{pod}-abcdef"),
        shown: pod.into(),
    }
}

/// The resource at version `rv` with the pods' status fields.
fn seen(rv: u64, leader: Option<&str>, provisioned: u64) -> Provisioner {
    let mut p: Provisioner = serde_json::from_value(json!({
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": "prov", "namespace": "choria", "uid": "u", "resourceVersion": rv.to_string()},
        "spec": {"broker": {"urls": ["nats://b:4222"]}},
    }))
    .unwrap();
    let st = p.status.get_or_insert_with(Default::default);
    st.leader = leader.map(str::to_string);
    st.provisioned = Some(provisioned as i64);
    p
}

fn write(leader: Option<&str>, provisioned: u64, counted: u64, rv: u64) -> Option<Write> {
    Some(Write {
        leader: leader.map(str::to_string),
        provisioned,
        renewal: None,
        refused: 0,
        revoked: None,
        counted,
        refused_counted: 0,
        resource_version: Some(rv.to_string()),
    })
}

#[test]
fn the_leader_names_itself_once_and_writes_its_count_at_most_every_refresh() {
    let mut r = Reporter::new(me("pod-a"));
    let t = Instant::now();
    let holder = Some("pod-a-abcdef");
    let w = r.decide(&seen(1, None, 40), holder, 0, t);
    assert_eq!(
        w,
        write(Some("pod-a"), 40, 0, 1),
        "names itself, keeps the count"
    );
    r.written(&w.unwrap(), t);
    assert_eq!(
        r.decide(&seen(2, Some("pod-a"), 40), holder, 0, t),
        None,
        "idle: nothing"
    );
    let soon = t + Duration::from_secs(1);
    let w = r.decide(&seen(2, Some("pod-a"), 40), holder, 5, soon);
    assert_eq!(w, write(Some("pod-a"), 45, 5, 2), "the first count at once");
    r.written(&w.unwrap(), soon);
    let sooner = soon + Duration::from_secs(2);
    assert_eq!(
        r.decide(&seen(3, Some("pod-a"), 45), holder, 9, sooner),
        None,
        "throttled"
    );
    let later = soon + STATUS_REFRESH;
    assert_eq!(
        r.decide(&seen(3, Some("pod-a"), 45), holder, 9, later),
        write(Some("pod-a"), 49, 9, 3),
        "what it counted since its last write, added to the status"
    );
}

#[test]
fn a_replica_that_loses_names_the_new_holder_and_flushes_its_count() {
    let mut r = Reporter::new(me("pod-a"));
    let t = Instant::now();
    let w = r
        .decide(&seen(1, None, 0), Some("pod-a-abcdef"), 0, t)
        .unwrap();
    r.written(&w, t);
    let w = r
        .decide(&seen(2, Some("pod-a"), 0), Some("pod-a-abcdef"), 3, t)
        .unwrap();
    r.written(&w, t);
    // Lost to a Go candidate one second later, with 2 more provisioned.
    let t2 = t + Duration::from_secs(1);
    assert_eq!(
        r.decide(&seen(3, Some("pod-a"), 3), Some("go-provisioner-1"), 5, t2),
        write(Some("go-provisioner-1"), 5, 5, 3),
        "at once: the holder as the election shows it, and the count"
    );
    // Evicted: nobody holds; the name goes.
    let mut r = Reporter::new(me("pod-a"));
    r.decide(&seen(1, Some("pod-a"), 0), Some("pod-a-abcdef"), 0, t);
    assert_eq!(
        r.decide(&seen(1, Some("pod-a"), 0), None, 0, t2),
        write(None, 0, 0, 1)
    );
    assert!(
        !serde_json::to_value(write(None, 0, 0, 1).unwrap().body("prov")).unwrap()["status"]
            .as_object()
            .unwrap()
            .contains_key("leader")
    );
}

#[test]
fn others_correct_a_wrong_name_only_after_it_lasted() {
    let mut r = Reporter::new(me("pod-b"));
    let t = Instant::now();
    // pod-a just won and will write its name: not ours to do.
    assert_eq!(
        r.decide(&seen(1, None, 7), Some("pod-a-123456"), 0, t),
        None
    );
    assert_eq!(
        r.decide(
            &seen(2, Some("pod-a"), 7),
            Some("pod-a-123456"),
            0,
            t + SETTLE
        ),
        None,
        "named: consistent"
    );
    // A Go candidate holds, and nobody of ours writes its name.
    let go = Some("go-provisioner-1");
    assert_eq!(
        r.decide(&seen(3, Some("pod-a"), 7), go, 0, t + SETTLE),
        None
    );
    assert_eq!(
        r.decide(&seen(3, Some("pod-a"), 7), go, 0, t + SETTLE * 2),
        write(Some("go-provisioner-1"), 7, 0, 3)
    );
}

#[test]
fn without_an_election_every_replica_adds_its_count() {
    let mut r = Reporter::new(me("pod-a"));
    let t = Instant::now();
    assert_eq!(r.decide(&seen(1, None, 10), None, 0, t), None);
    let w = r.decide(&seen(1, None, 10), None, 4, t);
    assert_eq!(w, write(None, 14, 4, 1));
    r.written(&w.unwrap(), t);
    assert_eq!(
        r.decide(&seen(2, None, 20), None, 6, t + Duration::from_secs(1)),
        None
    );
    assert_eq!(
        r.decide(&seen(2, None, 20), None, 6, t + STATUS_REFRESH),
        write(None, 22, 6, 2),
        "another replica's count kept"
    );
}

#[test]
fn the_write_is_conditional_on_what_it_read() {
    let body = serde_json::to_value(write(Some("pod-a"), 3, 3, 42).unwrap().body("prov")).unwrap();
    assert_eq!(body["metadata"]["resourceVersion"], "42");
    assert_eq!(body["kind"], "Provisioner");
    assert_eq!(body["apiVersion"], "provisioning.choria.io/v1alpha1");
    assert_eq!(
        body["status"],
        json!({"leader": "pod-a", "provisioned": 3, "refused": 0})
    );
}

#[test]
fn a_working_replica_writes_the_renewal_counts_when_they_change_and_every_write_carries_them() {
    let counts = |records, due| Some(RenewalCounts { records, due });
    let mut r = Reporter::new(me("pod-a"));
    r.renewal = counts(10, 2);
    let t = Instant::now();
    let holder = Some("pod-b-abcdef");
    // A standby does not write counts on its own.
    assert_eq!(r.decide(&seen(1, Some("pod-b"), 0), holder, 0, t), None);
    // Working (a member, or the leader): it does, once.
    r.working = true;
    let w = r.decide(&seen(1, Some("pod-b"), 0), holder, 0, t).unwrap();
    assert_eq!(w.renewal, counts(10, 2));
    let body = serde_json::to_value(w.body("prov")).unwrap();
    assert_eq!(body["status"]["records"], 10);
    assert_eq!(body["status"]["renewalsDue"], 2);
    r.written(&w, t);
    let mut shown = seen(2, Some("pod-b"), 0);
    let st = shown.status.as_mut().unwrap();
    st.records = Some(10);
    st.renewals_due = Some(2);
    assert_eq!(
        r.decide(&shown, holder, 0, t),
        None,
        "the status shows them"
    );
    r.renewal = counts(10, 0);
    let soon = t + Duration::from_secs(1);
    assert_eq!(r.decide(&shown, holder, 0, soon), None, "throttled");
    let w = r.decide(&shown, holder, 0, t + STATUS_REFRESH).unwrap();
    assert_eq!(w.renewal, counts(10, 0));
    // A count write of a standby carries them too: the manager's writes
    // replace each other, and leaving them out would remove them.
    r.working = false;
    r.written(&w, t + STATUS_REFRESH);
    let w = r.decide(&shown, holder, 4, t + STATUS_REFRESH * 2).unwrap();
    assert_eq!((w.provisioned, w.renewal), (4, counts(10, 0)));
}

fn with_members(mut p: Provisioner, entries: &[(&str, i64)]) -> Provisioner {
    p.status.get_or_insert_with(Default::default).members = entries
        .iter()
        .map(|(n, c)| Member {
            name: n.to_string(),
            pod: None,
            provisioned: *c,
        })
        .collect();
    p
}

fn st(members: &[String], sharded: bool, working: bool, counted: u64) -> Standing<'_> {
    Standing {
        members,
        sharded,
        working,
        counted,
    }
}

#[test]
fn a_member_keeps_its_own_entry_and_the_first_member_prunes_those_that_left() {
    let a = me("pod-a");
    let b = me("pod-b");
    let roster = vec![a.candidate.clone(), b.candidate.clone()];
    let t = Instant::now();
    let mut m = Members::default();
    // Not in the roster yet: nothing.
    assert_eq!(
        m.decide(&seen(1, None, 0), &b, st(&roster[..1], true, true, 0), t),
        None
    );
    // In it: its entry at once.
    let w = m
        .decide(&seen(1, None, 0), &b, st(&roster, true, true, 3), t)
        .unwrap();
    let MemberWrite::Entry(e) = &w else {
        panic!("{w:?}")
    };
    assert_eq!(
        (e.name.as_str(), e.pod.as_deref(), e.provisioned),
        (b.candidate.as_str(), Some("pod-b"), 3)
    );
    assert_eq!(
        patch_body(&w)["status"]["members"][0]["name"],
        b.candidate.as_str()
    );
    m.written(t);
    let p = with_members(seen(2, None, 0), &[(&b.candidate, 3)]);
    assert_eq!(
        m.decide(&p, &b, st(&roster, true, true, 3), t),
        None,
        "up to date"
    );
    assert_eq!(
        m.decide(&p, &b, st(&roster, true, true, 5), t),
        None,
        "behind, throttled"
    );
    assert!(m
        .decide(&p, &b, st(&roster, true, true, 5), t + STATUS_REFRESH)
        .is_some());
    // Pruned by someone who had not seen it join: back at once.
    let gone = with_members(seen(3, None, 0), &[]);
    assert!(matches!(
        m.decide(&gone, &b, st(&roster, true, true, 5), t),
        Some(MemberWrite::Entry(_))
    ));

    // pod-a is first by name: it prunes pod-c, which left, conditionally.
    let stale = with_members(
        seen(4, None, 0),
        &[(&a.candidate, 1), (&b.candidate, 5), ("pod-c-123456", 9)],
    );
    let w = Members::default()
        .decide(&stale, &a, st(&roster, true, true, 1), t)
        .unwrap();
    let MemberWrite::Prune {
        kept,
        resource_version,
    } = &w
    else {
        panic!("{w:?}")
    };
    assert_eq!(
        kept.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        [a.candidate.as_str(), b.candidate.as_str()]
    );
    assert_eq!(resource_version.as_deref(), Some("4"));
    assert_eq!(patch_body(&w)["metadata"]["resourceVersion"], "4");
    // pod-b is not first: it leaves that to pod-a.
    assert_eq!(
        Members::default().decide(&stale, &b, st(&roster, true, true, 5), t),
        None
    );
    // Leader mode: the leader clears what shards left behind; to nothing.
    let w = Members::default()
        .decide(&stale, &a, st(&[], false, true, 1), t)
        .unwrap();
    assert_eq!(patch_body(&w)["status"]["members"], serde_json::Value::Null);
    assert_eq!(
        Members::default().decide(&stale, &a, st(&[], false, false, 1), t),
        None,
        "a standby does not"
    );
}

/// What a member write sends, as JSON.
fn patch_body(w: &MemberWrite) -> serde_json::Value {
    match w.patch("prov") {
        MemberPatch::Apply(b) => serde_json::to_value(b).unwrap(),
        MemberPatch::Merge(b) => serde_json::to_value(b).unwrap(),
    }
}

#[test]
fn refusals_add_up_like_provisioned_and_a_working_replica_shows_the_revoked() {
    let mut r = Reporter::new(me("pod-b"));
    let t = Instant::now();
    let holder = Some("pod-a-abcdef");
    let mut shown = seen(1, Some("pod-a"), 0);
    shown.status.as_mut().unwrap().refused = Some(7);
    r.refused = 3;
    let w = r
        .decide(&shown, holder, 0, t)
        .expect("its refusals are due");
    assert_eq!((w.refused, w.refused_counted, w.provisioned), (10, 3, 0));
    r.written(&w, t);
    shown.status.as_mut().unwrap().refused = Some(10);
    r.revoked = Some(2);
    assert_eq!(
        r.decide(&shown, holder, 0, t + STATUS_REFRESH),
        None,
        "a standby leaves the revoked count to a working replica"
    );
    r.working = true;
    let w = r.decide(&shown, holder, 0, t + STATUS_REFRESH).unwrap();
    assert_eq!((w.revoked, w.refused), (Some(2), 10));
    let body = serde_json::to_value(w.body("prov")).unwrap();
    assert_eq!(body["status"]["revoked"], 2);
    assert_eq!(body["status"]["refused"], 10);
    r.written(&w, t + STATUS_REFRESH);
    shown.status.as_mut().unwrap().revoked = Some(2);
    assert_eq!(
        r.decide(&shown, holder, 0, t + STATUS_REFRESH * 3),
        None,
        "the status shows them"
    );
}

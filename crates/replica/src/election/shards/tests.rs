use super::*;

const T: ShardTimings = ShardTimings {
    ttl: Duration::from_secs(6),
    renew_deadline: Duration::from_secs(4),
    renew_period: Duration::from_secs(1),
};

fn members(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("replica-{i}-a1b2c3")).collect()
}

fn nodes(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node-{i:05}.example.net")).collect()
}

impl Sighting {
    fn leaving(mut self) -> Self {
        self.leaving = true;
        self
    }
}

fn sighting(member: &str, stamp: u32, view: &[&str]) -> Sighting {
    Sighting {
        member: member.into(),
        stamp: stamp.to_string(),
        view: view.iter().map(|v| v.to_string()).collect(),
        leaving: false,
    }
}

#[test]
fn three_members_share_three_thousand_nodes_evenly() {
    let m = members(3);
    let mut shares = BTreeMap::new();
    for n in nodes(3000) {
        *shares.entry(owner(&m, &n).unwrap()).or_insert(0usize) += 1;
    }
    for (member, count) in &shares {
        let share = *count as f64 / 3000.0;
        assert!(
            (0.25..=0.42).contains(&share),
            "{member} owns {count} of 3000"
        );
    }
    assert_eq!(shares.len(), 3);
}

#[test]
fn a_member_coming_or_going_moves_only_its_own_nodes() {
    let three = members(3);
    let four = members(4);
    let mut moved = 0;
    for n in nodes(3000) {
        let before = owner(&three, &n).unwrap();
        let after = owner(&four, &n).unwrap();
        if before != after {
            assert_eq!(after, four[3], "{n} moved between old members");
            moved += 1;
        }
    }
    assert!(
        (500..1000).contains(&moved),
        "{moved} moved to the newcomer"
    );
    // And back: the leaving member's nodes go, the others stay.
    for n in nodes(3000) {
        if owner(&four, &n).unwrap() != four[3] {
            assert_eq!(owner(&four, &n), owner(&three, &n), "{n}");
        }
    }
}

#[test]
fn the_weight_is_stable_across_builds() {
    // Replicas of different versions must agree during a rolling upgrade.
    assert_eq!(weight("a", "b"), weight("a", "b"));
    assert_ne!(weight("a", "b"), weight("b", "a"));
    assert_eq!(weight("replica-0", "node-1"), 0x0807_c05c_234c_564c);
    assert_eq!(owner(&[], "n"), None);
}

#[test]
fn a_member_is_live_while_its_record_changes_as_we_saw_it() {
    let t0 = Instant::now();
    let mut r = Roster::new("me", T);
    r.renewed(t0);
    r.observe(sighting("b", 1, &["b"]), t0);
    assert_eq!(r.live(t0), ["b", "me"]);
    // The same stamp seen again does not renew b.
    r.observe(sighting("b", 1, &["b"]), t0 + Duration::from_secs(5));
    r.renewed(t0 + Duration::from_secs(5));
    assert_eq!(r.live(t0 + Duration::from_secs(6)), ["me"], "b expired");
    // A new stamp does.
    r.observe(sighting("b", 2, &["b"]), t0 + Duration::from_secs(7));
    assert_eq!(r.live(t0 + Duration::from_secs(8)), ["b", "me"]);
    // Saying it leaves removes it at once.
    r.observe(
        Sighting {
            leaving: true,
            ..sighting("b", 3, &[])
        },
        t0 + Duration::from_secs(8),
    );
    assert_eq!(r.live(t0 + Duration::from_secs(8)), ["me"]);
}

#[test]
fn alone_we_still_listen_two_renewal_periods_before_working() {
    // A member whose first heartbeat has not reached us yet must not have
    // its nodes taken for ours.
    let t0 = Instant::now();
    let mut r = Roster::new("me", T);
    r.renewed(t0);
    assert!(!r.may_work(t0));
    assert!(!r.may_work(t0 + Duration::from_millis(1999)));
    r.renewed(t0 + Duration::from_secs(2));
    assert!(r.may_work(t0 + Duration::from_secs(2)));
}

#[test]
fn we_stop_before_the_others_count_us_gone() {
    let t0 = Instant::now();
    let mut r = Roster::new("me", T);
    assert!(!r.alive(t0), "not before our first renewal");
    r.renewed(t0);
    assert!(r.alive(t0 + Duration::from_millis(3999)));
    assert!(!r.may_work(t0 + T.renew_deadline), "renew deadline passed");
    assert!(
        T.renew_deadline < T.ttl,
        "before our record expires for the others"
    );
    assert_eq!(r.live(t0 + T.renew_deadline), Vec::<String>::new());
}

#[test]
fn a_newcomer_works_once_every_member_has_seen_it_or_the_ttl_passed() {
    let t0 = Instant::now();
    let mut r = Roster::new("me", T);
    r.renewed(t0);
    r.observe(sighting("b", 1, &["b"]), t0);
    r.observe(sighting("c", 1, &["c", "me"]), t0);
    assert!(!r.may_work(t0), "b has not seen us yet");
    r.observe(
        sighting("b", 2, &["b", "c", "me"]),
        t0 + Duration::from_secs(1),
    );
    r.renewed(t0 + Duration::from_secs(1));
    assert!(
        !r.may_work(t0 + Duration::from_secs(1)),
        "not before listening for two renewal periods"
    );
    r.observe(
        sighting("b", 3, &["b", "c", "me"]),
        t0 + Duration::from_secs(2),
    );
    r.observe(sighting("c", 2, &["c", "me"]), t0 + Duration::from_secs(2));
    r.renewed(t0 + Duration::from_secs(2));
    assert!(r.may_work(t0 + Duration::from_secs(2)));
    // A member that never updates its view keeps us idle for one TTL at most.
    let mut r = Roster::new("me", T);
    r.renewed(t0);
    for s in 1..=10u32 {
        let at = t0 + Duration::from_millis(700 * u64::from(s));
        r.observe(sighting("mute", s, &["mute"]), at);
        r.renewed(at);
        assert_eq!(r.may_work(at), at >= t0 + T.ttl, "at {:?}", at - t0);
    }
}

#[test]
fn members_past_the_bound_are_refused_and_known_ones_still_renew() {
    let t0 = Instant::now();
    let mut r = Roster::new("me", T);
    for i in 0..MAX_MEMBERS {
        assert!(r.observe(sighting(&format!("m-{i}"), 1, &[]), t0));
    }
    assert!(!r.observe(sighting("one-too-many", 1, &[]), t0));
    assert!(
        r.observe(sighting("m-0", 2, &[]), t0),
        "a known member renews"
    );
    assert!(r.observe(sighting("m-1", 3, &["me"]).leaving(), t0));
    assert!(
        r.observe(sighting("newcomer", 1, &[]), t0),
        "room again after a leave"
    );
    assert_eq!(r.live(t0).len(), MAX_MEMBERS);
}

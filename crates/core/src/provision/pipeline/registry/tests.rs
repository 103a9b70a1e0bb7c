use super::*;
use crate::monitor::Exposition;

fn registry(interval: Duration) -> Arc<Registry> {
    Registry::new(interval, Arc::new(Metrics::new("t"))).0
}

fn small(events: usize, pending: usize) -> Arc<Registry> {
    Registry::with_capacity(
        Duration::from_secs(60),
        Arc::new(Metrics::new("t")),
        Capacity { pending, events },
    )
    .0
}

/// Offers `identity` from discovery and takes its ticket off its lane.
async fn queue(r: &Registry, identity: &str) -> Arc<Ticket> {
    let lane = match r.offer(identity, Source::Discovery) {
        Offered::Queued(lane) => lane,
        other => panic!("{identity} not queued: {other:?}"),
    };
    r.next(lane).await.unwrap()
}

#[tokio::test]
async fn a_host_seen_again_within_the_interval_is_not_queued_twice() {
    let r = registry(Duration::from_secs(60));
    assert!(matches!(
        r.offer("n1", Source::Discovery),
        Offered::Queued(Lane::Discovery)
    ));
    assert!(matches!(r.offer("n1", Source::Discovery), Offered::Recent));
    assert!(matches!(r.offer("n1", Source::Event), Offered::Recent));
    assert_eq!((r.queued(), r.len(), r.pending()), (1, 1, 1));
}

#[tokio::test]
async fn an_old_waiting_registration_is_replaced_and_its_ticket_goes_stale() {
    let r = registry(Duration::from_millis(10));
    r.offer("n1", Source::Discovery);
    tokio::time::sleep(Duration::from_millis(20)).await;
    r.offer("n1", Source::Discovery);
    let first = r.next(Lane::Discovery).await.unwrap();
    let second = r.next(Lane::Discovery).await.unwrap();
    assert!(!r.start(&first), "the replaced registration is skipped");
    assert!(r.start(&second));
    // Removing with the stale ticket leaves the new registration alone.
    r.remove(&first);
    assert!(r.is_current(&second));
}

#[tokio::test]
async fn a_host_being_worked_or_held_is_never_replaced_however_old() {
    // Keep the finisher's receiver: without it held nodes go at once.
    let (r, _finisher) = Registry::new(Duration::from_millis(10), Arc::new(Metrics::new("t")));
    let working = queue(&r, "n1").await;
    assert!(r.start(&working));
    // The sequence outlasts the interval and the node is seen again.
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(matches!(r.offer("n1", Source::Discovery), Offered::Busy));
    assert_eq!(r.queued(), 0, "not queued a second time");
    assert!(r.is_current(&working));
    // Done: held from its success, however long ago it was added.
    r.remove_later(working, HOLD_AFTER_SUCCESS);
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(matches!(r.offer("n1", Source::Discovery), Offered::Recent));
    assert_eq!(r.queued(), 0);
}

#[tokio::test]
async fn clear_empties_the_registry_and_drains_the_lanes() {
    let r = registry(Duration::from_secs(60));
    for i in 0..5 {
        r.offer(&format!("n{i}"), Source::Discovery);
    }
    let taken = r.next(Lane::Discovery).await.unwrap();
    assert!(r.start(&taken));
    assert_eq!(r.clear(), 5);
    assert_eq!(r.queued(), 0);
    assert!(r.is_empty());
    assert!(
        !r.is_current(&taken),
        "a sequence's ticket is rejected after clear"
    );
    // After clearing, the host can be added again at once.
    assert!(matches!(
        r.offer("n0", Source::Discovery),
        Offered::Queued(_)
    ));
}

#[tokio::test]
async fn each_source_waits_in_a_lane_of_its_own_and_a_failed_name_in_the_suspect_lane() {
    let r = registry(Duration::from_secs(60));
    assert!(matches!(
        r.offer("e1", Source::Event),
        Offered::Queued(Lane::Events)
    ));
    let t = queue(&r, "d1").await;
    assert_eq!((t.lane, t.source), (Lane::Discovery, Source::Discovery));
    assert!(r.start(&t));
    // It answered, then stalled: forgotten now, offered again behind the
    // names that have not failed.
    r.failed(&t);
    assert!(!r.is_current(&t), "d1 is forgotten");
    assert!(matches!(
        r.offer("d1", Source::Discovery),
        Offered::Queued(Lane::Suspect)
    ));
    let again = r.next(Lane::Suspect).await.unwrap();
    assert!(r.start(&again));
    // Provisioned at last: no longer a suspect.
    r.remove_later(again, HOLD_AFTER_SUCCESS);
    assert!(!r.lock().failed_recently("d1", Instant::now()));
}

#[tokio::test]
async fn lanes_and_the_registry_are_bounded_and_a_full_one_registers_nothing() {
    let r = small(2, 3);
    assert!(matches!(r.offer("e1", Source::Event), Offered::Queued(_)));
    assert!(matches!(r.offer("e2", Source::Event), Offered::Queued(_)));
    assert!(matches!(r.offer("e3", Source::Event), Offered::Full));
    assert!(matches!(
        r.offer("d1", Source::Discovery),
        Offered::Queued(_)
    ));
    assert!(matches!(r.offer("d2", Source::Discovery), Offered::Full));
    assert_eq!((r.len(), r.pending()), (3, 3));
}

#[tokio::test]
async fn a_ticket_after_clear_or_a_shutdown_is_stale() {
    let r = small(10, 10);
    r.offer("n1", Source::Event);
    r.clear();
    assert_eq!(r.queued(), 0);
    let t = queue(&r, "n2").await;
    assert!(
        r.forget_waiting("n2"),
        "a waiting node that shut down is forgotten"
    );
    assert!(!r.start(&t));
    assert_eq!(r.pending(), 0);
}

#[tokio::test]
async fn a_node_that_shut_down_is_forgotten_only_while_waiting() {
    // Keep the finisher's receiver: without it held nodes go at once.
    let (r, _finisher) = Registry::new(Duration::from_secs(60), Arc::new(Metrics::new("t")));
    let w = queue(&r, "working").await;
    assert!(r.start(&w));
    let d = queue(&r, "done").await;
    assert!(r.start(&d));
    r.remove_later(d, HOLD_AFTER_SUCCESS);
    r.offer("waiting", Source::Discovery);
    assert!(r.forget_waiting("waiting"));
    assert!(!r.forget_waiting("working"), "a node being worked stays");
    assert!(!r.forget_waiting("done"), "a provisioned node stays held");
    assert!(!r.forget_waiting("unknown"));
    assert_eq!(r.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_node_that_shut_down_is_not_offered_again_during_its_restart() {
    let (r, rx) = Registry::with_capacity(
        Duration::from_secs(60),
        Arc::new(Metrics::new("t")),
        Capacity {
            pending: 3,
            events: 10,
        },
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(r.clone().run_finisher(rx, stop.clone()));
    // Provisioned by another replica: we never registered it.
    assert!(r.shut_down("restarting"));
    assert!(matches!(
        r.offer("restarting", Source::Discovery),
        Offered::Recent
    ));
    // A waiting one is forgotten and held too.
    r.offer("queued", Source::Discovery);
    assert!(r.shut_down("queued"));
    assert!(matches!(
        r.offer("queued", Source::Discovery),
        Offered::Recent
    ));
    // Its startup event (it came back into provisioning: an upgrade, a
    // restart without provision=false) offers it at once.
    assert!(matches!(
        r.offer("queued", Source::Event),
        Offered::Queued(Lane::Events)
    ));
    // Holds are bounded.
    r.offer("x", Source::Discovery);
    r.shut_down("flood-1");
    assert_eq!(r.len(), 3, "no hold beyond the bound");
    tokio::time::sleep(HOLD_AFTER_SHUTDOWN + Duration::from_secs(1)).await;
    assert!(matches!(
        r.offer("restarting", Source::Discovery),
        Offered::Queued(_)
    ));
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_shutdown_is_a_hint_taken_once_per_node_every_two_intervals() {
    // Before, a forged shutdown twice a second kept a node held (and out
    // of every discovery) for as long as it went on.
    let interval = Duration::from_millis(100);
    let (r, rx) = Registry::new(interval, Arc::new(Metrics::new("t")));
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(r.clone().run_finisher(rx, stop.clone()));
    r.offer("victim", Source::Discovery);
    assert!(r.shut_down("victim"), "the first is taken");
    assert!(matches!(
        r.offer("victim", Source::Discovery),
        Offered::Recent
    ));
    // Repeated within two intervals: ignored, counted.
    assert!(!r.shut_down("victim"));
    assert!(!r.shut_down("victim"));
    assert_eq!(
        r.metrics.value("choria_provisioner_ignored_shutdowns"),
        Some(2.0)
    );
    // Another node's hint is its own.
    assert!(r.shut_down("other"));
    // Past the window a hint is taken again.
    tokio::time::sleep(r.hint_window() + Duration::from_millis(20)).await;
    assert!(r.shut_down("victim"));
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn shutdown_hints_remembered_are_bounded() {
    let r = small(10, 3);
    for i in 0..3 {
        assert!(r.shut_down(&format!("n{i}")));
    }
    assert!(!r.shut_down("n3"), "none taken past the bound");
}

#[tokio::test(start_paused = true)]
async fn the_finisher_forgets_a_host_after_its_hold_time() {
    let (r, rx) = Registry::new(Duration::from_secs(60), Arc::new(Metrics::new("t")));
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(r.clone().run_finisher(rx, stop.clone()));
    let t = queue(&r, "n1").await;
    assert!(r.start(&t));
    r.remove_later(t, HOLD_AFTER_SUCCESS);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(r.len(), 1, "held during the hold time");
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(r.len(), 0, "forgotten after it");
    stop.cancel();
    task.await.unwrap();
}

#[test]
fn gauges_follow_the_lanes() {
    let r = registry(Duration::from_secs(60));
    r.offer("a", Source::Discovery);
    r.offer("b", Source::Event);
    let m = &r.metrics;
    assert_eq!(m.value("choria_provisioner_work_queue_entries"), Some(2.0));
    assert_eq!(m.value("choria_provisioner_pending_nodes"), Some(2.0));
    assert_eq!(m.value("choria_provisioner_waiting_nodes"), Some(2.0));
}

#[tokio::test]
async fn a_worked_nodes_own_shutdown_is_not_remembered_as_a_hint() {
    // Every node we restart announces its shutdown; remembering each as a
    // hint cost ~100 bytes per node for two intervals.
    let (r, _rx) = Registry::new(Duration::from_secs(60), Arc::new(Metrics::new("t")));
    r.offer("n", Source::Discovery);
    let t = r.next(Lane::Discovery).await.unwrap();
    assert!(r.start(&t));
    assert!(r.shut_down("n"), "our own restart");
    assert_eq!(
        r.metrics.value("choria_provisioner_ignored_shutdowns"),
        Some(0.0)
    );
    // A forger repeating it while the node is worked or held is counted.
    assert!(!r.shut_down("n"), "a repeat changes nothing");
    assert_eq!(
        r.metrics.value("choria_provisioner_ignored_shutdowns"),
        Some(1.0)
    );
    r.remove(&t);
    assert!(
        r.shut_down("n"),
        "a later hint is taken: the first was not remembered"
    );
}

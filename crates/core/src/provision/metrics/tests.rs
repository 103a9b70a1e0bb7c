use super::*;
use crate::monitor::Exposition;
use std::sync::Arc;
use std::time::Duration;

const COUNTERS: [&str; 11] = [
    "choria_provisioner_rpc_errors",
    "choria_provisioner_helper_errors",
    "choria_provisioner_helper_shutdown_requests",
    "choria_provisioner_discovered",
    "choria_provisioner_event_discovered",
    "choria_provisioner_discover_cycles",
    "choria_provisioner_discovery_errors",
    "choria_provisioner_provision_errors",
    "choria_provisioner_provisioned",
    "choria_provisioner_election_errors",
    "choria_provisioner_leadership_transitions",
];
const GAUGES: [&str; 5] = [
    "choria_provisioner_paused",
    "choria_provisioner_busy_workers",
    "choria_provisioner_work_queue_entries",
    "choria_provisioner_waiting_nodes",
    "choria_provisioner_leader",
];
const SUMMARIES: [&str; 2] = [
    "choria_provisioner_rpc_time",
    "choria_provisioner_helper_time",
];

fn lines(m: &Metrics) -> Vec<String> {
    m.encode_text().lines().map(str::to_string).collect()
}

fn has_line(m: &Metrics, line: &str) -> bool {
    lines(m).iter().any(|l| l == line)
}

#[test]
fn metrics_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Metrics>();
}

#[test]
fn every_go_name_is_exported_at_zero_with_its_site() {
    let m = Metrics::new("dc1");
    let text = m.encode_text();
    let site_only = |n: &&&str| **n != "choria_provisioner_rpc_errors";
    for name in COUNTERS.iter().chain(&GAUGES).filter(site_only) {
        let want = format!("{name}{{site=\"dc1\"}} 0");
        assert!(has_line(&m, &want), "missing {want:?} in\n{text}");
        assert_eq!(m.value(name), Some(0.0), "{name}");
    }
    for name in COUNTERS.iter().chain(&GAUGES) {
        let kind = if GAUGES.contains(name) {
            "gauge"
        } else {
            "counter"
        };
        assert!(
            has_line(&m, &format!("# TYPE {name} {kind}")),
            "{name} is not a {kind} in\n{text}"
        );
    }
    let want = "choria_provisioner_helper_time_count{site=\"dc1\"} 0";
    assert!(has_line(&m, want), "missing {want:?} in\n{text}");
    for rpc in RPC_NAMES {
        for want in [
            format!("choria_provisioner_rpc_errors{{rpc=\"{rpc}\",site=\"dc1\"}} 0"),
            format!("choria_provisioner_rpc_time_sum{{rpc=\"{rpc}\",site=\"dc1\"}} 0"),
            format!("choria_provisioner_rpc_time_count{{rpc=\"{rpc}\",site=\"dc1\"}} 0"),
        ] {
            assert!(has_line(&m, &want), "missing {want:?} in\n{text}");
        }
    }
    // Every sample line of ours carries the site label (the standard
    // process_* metrics are unlabelled, as in Go).
    for l in lines(&m)
        .iter()
        .filter(|l| l.starts_with("choria_provisioner_"))
    {
        assert!(l.contains("site=\"dc1\""), "no site label: {l}");
    }
}

#[test]
fn the_help_texts_are_the_go_ones() {
    let m = Metrics::new("dc1");
    for want in [
        "# HELP choria_provisioner_rpc_time How long it took to perform RPC requests",
        "# HELP choria_provisioner_helper_shutdown_requests Host many times the helper asked for a node to be shutdown and it succeeded",
        "# HELP choria_provisioner_work_queue_entries Number of nodes on the work queue waiting to be provisioned",
        "# HELP choria_provisioner_leader Indicates if this instance is the elected leader",
    ] {
        assert!(has_line(&m, want), "missing {want:?}");
    }
}

#[test]
fn no_name_of_ours_has_a_total_suffix() {
    let text = Metrics::new("dc1").encode_text();
    for l in text.lines().filter(|l| l.contains("choria_provisioner_")) {
        assert!(!l.contains("_total"), "{l}");
    }
}

#[test]
fn the_standard_process_metrics_are_exported_without_labels() {
    let m = Metrics::new("dc1");
    let text = m.encode_text();
    for (name, kind) in [
        ("process_resident_memory_bytes", "gauge"),
        ("process_virtual_memory_bytes", "gauge"),
        ("process_cpu_seconds_total", "counter"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("process_start_time_seconds", "gauge"),
    ] {
        assert!(
            has_line(&m, &format!("# TYPE {name} {kind}")),
            "{name} is not a {kind} in\n{text}"
        );
        let sample = lines(&m)
            .into_iter()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no unlabelled {name} sample in\n{text}"));
        let v: f64 = sample.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(v >= 0.0, "{sample}");
    }
    let rss = m.value("process_resident_memory_bytes").unwrap();
    assert!(
        rss > 1_000_000.0,
        "a running test uses more than 1 MB: {rss}"
    );
    let fds = m.value("process_open_fds").unwrap();
    assert!(fds >= 3.0, "stdin, stdout and stderr at least: {fds}");
}

#[test]
fn summaries_export_sum_and_count_without_quantiles() {
    let m = Metrics::new("dc1");
    let text = m.encode_text();
    for name in SUMMARIES {
        assert!(
            has_line(&m, &format!("# TYPE {name} summary")),
            "{name} is not a summary in\n{text}"
        );
        let samples: Vec<_> = lines(&m)
            .into_iter()
            .filter(|l| l.starts_with(name))
            .collect();
        assert!(!samples.is_empty(), "{name} has no samples");
        for s in samples {
            assert!(
                s.starts_with(&format!("{name}_sum{{"))
                    || s.starts_with(&format!("{name}_count{{")),
                "unexpected summary sample {s}"
            );
        }
    }
    assert!(!text.contains("quantile"), "{text}");
}

#[test]
fn observations_land_in_their_own_series() {
    let m = Metrics::new("dc1");
    m.observe_rpc("choria_provision#jwt", Duration::from_millis(1500), None);
    m.observe_rpc("choria_provision#jwt", Duration::from_millis(500), None);
    m.observe_rpc("rpcutil#inventory", Duration::from_millis(250), None);
    m.observe_helper(Duration::from_millis(3000));
    // An rpc name outside the pre-created set still gets its series.
    m.observe_rpc("other#thing", Duration::from_secs(1), None);

    for want in [
        "choria_provisioner_rpc_time_sum{rpc=\"choria_provision#jwt\",site=\"dc1\"} 2",
        "choria_provisioner_rpc_time_count{rpc=\"choria_provision#jwt\",site=\"dc1\"} 2",
        "choria_provisioner_rpc_time_sum{rpc=\"rpcutil#inventory\",site=\"dc1\"} 0.25",
        "choria_provisioner_rpc_time_count{rpc=\"rpcutil#inventory\",site=\"dc1\"} 1",
        "choria_provisioner_rpc_time_count{rpc=\"choria_provision#gencsr\",site=\"dc1\"} 0",
        "choria_provisioner_rpc_time_count{rpc=\"other#thing\",site=\"dc1\"} 1",
        "choria_provisioner_helper_time_sum{site=\"dc1\"} 3",
        "choria_provisioner_helper_time_count{site=\"dc1\"} 1",
    ] {
        assert!(
            has_line(&m, want),
            "missing {want:?} in\n{}",
            m.encode_text()
        );
    }
    assert_eq!(m.value("choria_provisioner_rpc_time"), Some(4.0));
    assert_eq!(m.value("choria_provisioner_helper_time"), Some(1.0));
}

#[test]
fn the_histograms_buckets_keep_the_last_traced_observation_as_exemplar() {
    let m = Metrics::new("dc1");
    let first = "4bf92f3577b34da6a3ce929d0e0e4736";
    let second = "0af7651916cd43dd8448eb211c80319c";
    m.observe_rpc(
        "choria_provision#jwt",
        Duration::from_millis(40),
        Some(first),
    );
    m.observe_rpc(
        "choria_provision#jwt",
        Duration::from_millis(45),
        Some(second),
    );
    // An untraced observation counts but leaves the exemplar alone.
    m.observe_rpc("choria_provision#jwt", Duration::from_millis(41), None);
    m.observe_sequence(Duration::from_secs(7), Some(first));
    let text = m.encode_openmetrics();
    let jwt = "choria_provisioner_rpc_seconds_bucket{rpc=\"choria_provision#jwt\",site=\"dc1\",le=\"0.05\"} 3 # {trace_id=\"0af7651916cd43dd8448eb211c80319c\"} 0.045 ";
    assert!(text.contains(jwt), "{text}");
    let seq = "choria_provisioner_sequence_seconds_bucket{site=\"dc1\",le=\"10\"} 1 # {trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"} 7 ";
    assert!(text.contains(seq), "{text}");
    // Buckets nothing traced fell in carry none.
    assert!(text.contains("choria_provisioner_sequence_seconds_bucket{site=\"dc1\",le=\"5\"} 0\n"));
    assert_eq!(text.matches("trace_id").count(), 2, "{text}");
    // The Prometheus text has the buckets, not the exemplars.
    let plain = m.encode_text();
    assert!(plain.contains("choria_provisioner_rpc_seconds_bucket{rpc=\"choria_provision#jwt\",site=\"dc1\",le=\"0.05\"} 3"));
    assert!(!plain.contains("trace_id"));
}

#[test]
fn rpc_errors_count_per_rpc() {
    let m = Metrics::new("dc1");
    m.rpc_error("choria_provision#configure");
    m.rpc_error("choria_provision#configure");
    m.rpc_error("choria_provision#restart");
    for want in [
        "choria_provisioner_rpc_errors{rpc=\"choria_provision#configure\",site=\"dc1\"} 2",
        "choria_provisioner_rpc_errors{rpc=\"choria_provision#restart\",site=\"dc1\"} 1",
        "choria_provisioner_rpc_errors{rpc=\"choria_provision#jwt\",site=\"dc1\"} 0",
    ] {
        assert!(has_line(&m, want), "missing {want:?}");
    }
    assert_eq!(m.value("choria_provisioner_rpc_errors"), Some(3.0));
}

#[test]
fn each_counter_method_moves_only_its_counter() {
    type Inc = fn(&Metrics);
    let cases: [(Inc, &str); 10] = [
        (Metrics::helper_error, "choria_provisioner_helper_errors"),
        (
            Metrics::helper_shutdown,
            "choria_provisioner_helper_shutdown_requests",
        ),
        (Metrics::discovered, "choria_provisioner_discovered"),
        (
            Metrics::event_discovered,
            "choria_provisioner_event_discovered",
        ),
        (
            Metrics::discover_cycle,
            "choria_provisioner_discover_cycles",
        ),
        (
            Metrics::discovery_error,
            "choria_provisioner_discovery_errors",
        ),
        (
            Metrics::provision_error,
            "choria_provisioner_provision_errors",
        ),
        (Metrics::provisioned, "choria_provisioner_provisioned"),
        (
            Metrics::election_error,
            "choria_provisioner_election_errors",
        ),
        (
            Metrics::leadership_transition,
            "choria_provisioner_leadership_transitions",
        ),
    ];
    for (inc, name) in cases {
        let m = Metrics::new("dc1");
        inc(&m);
        inc(&m);
        assert!(
            has_line(&m, &format!("{name}{{site=\"dc1\"}} 2")),
            "{name} in\n{}",
            m.encode_text()
        );
        for (_, other) in cases.iter().filter(|(_, o)| *o != name) {
            assert_eq!(m.value(other), Some(0.0), "{name} moved {other}");
        }
    }
}

#[test]
fn gauges_follow_their_setters() {
    let m = Metrics::new("dc1");
    m.set_paused(true);
    m.set_leader(true);
    m.set_work_queue_entries(7);
    m.set_waiting_nodes(3);
    assert_eq!(m.value("choria_provisioner_paused"), Some(1.0));
    assert_eq!(m.value("choria_provisioner_leader"), Some(1.0));
    assert_eq!(m.value("choria_provisioner_work_queue_entries"), Some(7.0));
    assert_eq!(m.value("choria_provisioner_waiting_nodes"), Some(3.0));
    assert!(has_line(
        &m,
        "choria_provisioner_waiting_nodes{site=\"dc1\"} 3"
    ));

    m.set_paused(false);
    m.set_leader(false);
    m.set_work_queue_entries(0);
    assert_eq!(m.value("choria_provisioner_paused"), Some(0.0));
    assert_eq!(m.value("choria_provisioner_leader"), Some(0.0));
    assert_eq!(m.value("choria_provisioner_work_queue_entries"), Some(0.0));
}

#[test]
fn busy_worker_guard_counts_while_alive() {
    let m = Metrics::new("dc1");
    let busy = || m.value("choria_provisioner_busy_workers");
    let a = m.busy_worker();
    assert_eq!(busy(), Some(1.0));
    {
        let _b = m.busy_worker();
        assert_eq!(busy(), Some(2.0));
    }
    assert_eq!(busy(), Some(1.0));
    drop(a);
    assert_eq!(busy(), Some(0.0));
}

#[test]
fn instances_are_independent_and_keep_their_site() {
    let a = Metrics::new("dc1");
    let b = Metrics::new("dc2");
    a.provisioned();
    assert_eq!(a.site(), "dc1");
    assert_eq!(b.site(), "dc2");
    assert_eq!(a.value("choria_provisioner_provisioned"), Some(1.0));
    assert_eq!(b.value("choria_provisioner_provisioned"), Some(0.0));
    assert!(has_line(
        &b,
        "choria_provisioner_provisioned{site=\"dc2\"} 0"
    ));
}

#[test]
fn unknown_names_have_no_value() {
    let m = Metrics::new("dc1");
    assert_eq!(m.value("choria_provisioner_nope"), None);
    assert_eq!(m.value("choria_provisioner_provisioned_total"), None);
}

#[test]
fn concurrent_observations_are_all_counted() {
    let m = Arc::new(Metrics::new("dc1"));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    m.observe_rpc("choria_provision#jwt", Duration::from_millis(1), None);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(has_line(
        &m,
        "choria_provisioner_rpc_time_count{rpc=\"choria_provision#jwt\",site=\"dc1\"} 4000"
    ));
}

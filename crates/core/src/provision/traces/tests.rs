use super::export::{encode, Resource};
use super::*;

fn config(sample_percent: u8) -> TelemetryConfig {
    TelemetryConfig {
        otlp_endpoint: "http://127.0.0.1:4318".into(),
        traces_url: "http://127.0.0.1:4318/v1/traces".into(),
        service_name: "choria-provisioner".into(),
        sample_percent,
    }
}

#[test]
fn off_makes_no_trace() {
    assert!(!Tracer::off().is_on());
    assert!(Tracer::off()
        .node("n1", "discovery", Duration::ZERO)
        .is_none());
}

#[test]
fn a_node_trace_is_its_root_the_wait_and_each_step() {
    let (tracer, mut queue) = Tracer::new(&config(100));
    let trace = tracer
        .node("n1.example", "event", Duration::from_millis(250))
        .unwrap();
    let id = trace.trace_id().to_string();
    assert_eq!(id.len(), 32);
    let mut rpc = trace.start("choria_provision#jwt").kind(Kind::Client);
    rpc.attr("choria.attempts", 2i64);
    trace.end(rpc, None);
    let failed = trace.start("helper");
    let long = "x".repeat(2 * MAX_TEXT);
    trace.end(failed, Some(&long as &dyn std::fmt::Display));
    trace.finish(vec![("choria.outcome", "provisioned".into())], None);

    let got = queue.rx.try_recv().unwrap();
    assert_eq!(hex::encode(got.trace_id), id);
    let names: Vec<&str> = got.spans.iter().map(|s| &*s.name).collect();
    assert_eq!(
        names,
        [
            "discovery",
            "choria_provision#jwt",
            "helper",
            "provision node"
        ]
    );
    let root = got.spans.last().unwrap();
    assert!(root.parent.is_none());
    assert!(got.spans[..3]
        .iter()
        .all(|s| s.parent == Some(root.span_id)));
    // The root starts when the name was found, with the wait.
    assert_eq!(root.start, got.spans[0].start);
    assert!(got.spans[0].end - got.spans[0].start >= 250_000_000);
    assert!(root
        .attributes
        .contains(&("choria.identity", "n1.example".to_string().into())));
    assert_eq!(got.spans[2].error.as_ref().unwrap().len(), MAX_TEXT);
    assert_eq!(got.spans[1].kind, Kind::Client);
}

#[test]
fn a_full_queue_drops_traces_and_counts_them() {
    let (tracer, queue) = Tracer::new(&config(100));
    for _ in 0..QUEUE + 3 {
        let t = tracer.node("n", "discovery", Duration::ZERO).unwrap();
        t.finish(Vec::new(), None);
    }
    assert_eq!(queue.dropped.load(Ordering::Relaxed), 3);
}

#[test]
fn sampling_keeps_about_the_share_asked_for() {
    let (tracer, _queue) = Tracer::new(&config(10));
    let kept = (0..2000)
        .filter(|_| tracer.node("n", "discovery", Duration::ZERO).is_some())
        .count();
    assert!((100..=300).contains(&kept), "{kept} of 2000 kept at 10%");
}

#[test]
fn identities_and_errors_are_bounded_and_single_line() {
    assert_eq!(bounded("a\nb\u{1b}c"), "a b c");
    let long = "é".repeat(MAX_TEXT);
    let cut = bounded(&long);
    assert!(cut.len() <= MAX_TEXT && cut.chars().all(|c| c == 'é'));
}

#[test]
fn the_otlp_json_names_ids_in_hex_and_times_as_strings() {
    let (tracer, mut queue) = Tracer::new(&config(100));
    let trace = tracer.node("n1", "discovery", Duration::ZERO).unwrap();
    trace.finish(
        vec![("choria.mode", "template".into())],
        Some(&"refused" as &dyn std::fmt::Display),
    );
    let finished = queue.rx.try_recv().unwrap();
    let resource = Resource {
        service_name: "svc".into(),
        instance: "replica-0".into(),
        site: "lon".into(),
    };
    let doc = encode(&[finished], &resource);
    let rs = &doc["resourceSpans"][0];
    assert_eq!(
        rs["resource"]["attributes"][0]["value"]["stringValue"],
        "svc"
    );
    let spans = rs["scopeSpans"][0]["spans"].as_array().unwrap();
    assert_eq!(spans.len(), 2);
    let root = &spans[1];
    assert_eq!(root["traceId"].as_str().unwrap().len(), 32);
    assert_eq!(root["spanId"].as_str().unwrap().len(), 16);
    assert!(root.get("parentSpanId").is_none());
    assert_eq!(spans[0]["parentSpanId"], root["spanId"]);
    assert!(root["startTimeUnixNano"]
        .as_str()
        .unwrap()
        .parse::<u64>()
        .is_ok());
    assert_eq!(root["status"]["code"], 2);
    assert_eq!(root["status"]["message"], "refused");
    assert_eq!(root["attributes"][1]["key"], "choria.mode");
}

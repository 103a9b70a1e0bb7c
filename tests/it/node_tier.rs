//! The node tier's judgement of leadership (`scripts/node-tier.sh`): the
//! shell script runs real pods on a real kubelet and samples every replica's
//! `choria_provisioner_leader` gauge into a timeline; what the samples mean
//! — hand-overs and their gaps, samples with two leaders, the longest
//! stretch without one — is decided here, in Rust, with tests of its own.
//!
//! The timeline has one line per sample: the time in ms, then a cell per
//! pod, `IP:LEADER:PROVISIONED:OTHER` (`LEADER` 1 or 0) or `IP:-` for a pod
//! that did not answer; a pod with no address has no cell. The pod watch
//! has `IP NAME` lines, the latest naming an address winning.
//!
//! `node-tier.sh` runs [`analyse_the_node_tiers_timeline`] (ignored, so a
//! plain `cargo test` skips it) with the files and the window in the
//! environment; it prints what the script's summary needs.

use std::collections::HashMap;

/// One change of the single replica reporting leader.
#[derive(Debug, PartialEq)]
pub struct Handover {
    pub from: String,
    pub to: String,
    /// From the old leader's last leader sample to the new one's first.
    pub gap_ms: u64,
    /// What the old leader reported in the new one's first sample.
    pub old_then: String,
}

/// What a window of the timeline shows.
#[derive(Debug, Default, PartialEq)]
pub struct Analysis {
    pub handovers: Vec<Handover>,
    /// Samples in which more than one replica reported leader 1.
    pub doubles: Vec<(u64, Vec<String>)>,
    pub samples: usize,
    pub longest_without_leader_ms: u64,
}

/// Pod names by IP from the pod watch's `IP NAME` lines.
pub fn names(podwatch: &str) -> HashMap<String, String> {
    podwatch
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some(ip), Some(name), None) => Some((ip.to_string(), name.to_string())),
                _ => None,
            }
        })
        .collect()
}

/// The samples between `from_ms` and `to_ms`. Leadership before `from_ms`
/// counts as where a hand-over starts from; a line without its newline
/// (the sampler was still writing it) is left out.
pub fn analyse(
    timeline: &str,
    names: &HashMap<String, String>,
    from_ms: u64,
    to_ms: u64,
) -> Analysis {
    let name = |ip: &str| names.get(ip).cloned().unwrap_or_else(|| ip.to_string());
    let mut out = Analysis::default();
    // The last sample with one leader: who, and when.
    let mut prev: Option<(String, u64)> = None;
    let mut without_since: Option<u64> = None;
    for line in timeline.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        let mut words = line.split_whitespace();
        let Some(t) = words.next().and_then(|t| t.parse::<u64>().ok()) else {
            continue;
        };
        if t > to_ms {
            break;
        }
        let cells: Vec<&str> = words.collect();
        let leaders: Vec<&str> = cells
            .iter()
            .filter_map(|c| {
                let parts: Vec<&str> = c.split(':').collect();
                (parts.len() == 4 && parts[1] == "1").then_some(parts[0])
            })
            .collect();
        if t >= from_ms {
            out.samples += 1;
            if leaders.len() > 1 {
                out.doubles
                    .push((t, leaders.iter().map(|ip| name(ip)).collect()));
            }
            if leaders.is_empty() {
                // The stretch starts at the last sample that had a leader.
                without_since.get_or_insert(match &prev {
                    Some((_, p)) if *p >= from_ms => *p,
                    _ => t,
                });
            } else if let Some(since) = without_since.take() {
                out.longest_without_leader_ms = out.longest_without_leader_ms.max(t - since);
            }
        }
        if let [leader] = leaders[..] {
            if let Some((old, old_t)) = &prev {
                if old != leader && t >= from_ms {
                    let cell = cells
                        .iter()
                        .find(|c| c.split(':').next() == Some(old.as_str()));
                    let old_then = match cell {
                        None => "no-address".to_string(),
                        Some(c) if c.ends_with(":-") => "not-answering".to_string(),
                        Some(c) => format!("leader={}", c.split(':').nth(1).unwrap_or("?")),
                    };
                    out.handovers.push(Handover {
                        from: name(old),
                        to: name(leader),
                        gap_ms: t - old_t,
                        old_then,
                    });
                }
            }
            prev = Some((leader.to_string(), t));
        }
    }
    out
}

/// The lines `node-tier.sh` reads: `handover OLD NEW GAP_S THEN`,
/// `double T PODS` and a closing `stats SAMPLES LONGEST_S`.
pub fn report(a: &Analysis) -> String {
    let mut out = String::new();
    for (t, pods) in &a.doubles {
        out.push_str(&format!("double {t} {}\n", pods.join(",")));
    }
    for h in &a.handovers {
        let gap = h.gap_ms as f64 / 1000.0;
        out.push_str(&format!(
            "handover {} {} {gap:.2} {}\n",
            h.from, h.to, h.old_then
        ));
    }
    let longest = a.longest_without_leader_ms as f64 / 1000.0;
    out.push_str(&format!("stats {} {longest:.2}\n", a.samples));
    out
}

/// Run by `node-tier.sh` with `NODE_TIER_TIMELINE`, `NODE_TIER_PODWATCH`,
/// `NODE_TIER_FROM_MS` and `NODE_TIER_TO_MS`; prints [`report`] between
/// `--- analysis ---` markers.
#[test]
#[ignore = "run by scripts/node-tier.sh with its timeline"]
fn analyse_the_node_tiers_timeline() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let timeline = std::fs::read_to_string(var("NODE_TIER_TIMELINE")).unwrap();
    let podwatch = std::fs::read_to_string(var("NODE_TIER_PODWATCH")).unwrap_or_default();
    let ms = |k: &str| var(k).parse::<u64>().unwrap_or_else(|e| panic!("{k}: {e}"));
    let a = analyse(
        &timeline,
        &names(&podwatch),
        ms("NODE_TIER_FROM_MS"),
        ms("NODE_TIER_TO_MS"),
    );
    println!("--- analysis ---\n{}--- end ---", report(&a));
}

/// What the fleet's journal says of the run: each node's final state and
/// how often `configure` and `restart` succeeded for it.
#[derive(Debug, PartialEq)]
pub struct Once {
    /// Nodes with a final state.
    pub finals: usize,
    /// From the first successful configure or restart to the last, in s.
    pub span_s: f64,
    /// How many nodes had each count of successful configures.
    pub configures: std::collections::BTreeMap<u64, usize>,
    /// Why a node was not provisioned exactly once (at most 10 shown).
    pub bad: Vec<String>,
}

/// Judges a journal of `nodes` nodes: every node provisioned, configured
/// once and restarted once.
pub fn once(journal: &str, nodes: usize) -> Once {
    use std::collections::{BTreeMap, HashMap};
    let mut finals: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    let mut actions: HashMap<(String, String), u64> = HashMap::new();
    let (mut first, mut last) = (None::<u64>, None::<u64>);
    for line in journal.lines().filter(|l| !l.trim().is_empty()) {
        let e: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
        let node = e["node"].as_str().unwrap_or_default().to_string();
        match e["kind"].as_str() {
            Some("final") => {
                finals.insert(node, e);
            }
            Some("action") if e["outcome"] == "ok" => {
                let action = e["action"].as_str().unwrap_or_default();
                if action == "configure" || action == "restart" {
                    *actions.entry((node, action.to_string())).or_default() += 1;
                    let t = e["time_us"].as_u64().unwrap_or_default();
                    first = Some(first.map_or(t, |f| f.min(t)));
                    last = Some(last.map_or(t, |l| l.max(t)));
                }
            }
            _ => {}
        }
    }
    let count = |n: &str, a: &str| {
        actions
            .get(&(n.to_string(), a.to_string()))
            .copied()
            .unwrap_or(0)
    };
    let mut bad = Vec::new();
    if finals.len() != nodes {
        bad.push(format!("{} final states, not {nodes}", finals.len()));
    }
    let mut configures = BTreeMap::new();
    for (n, f) in &finals {
        let (c, r) = (count(n, "configure"), count(n, "restart"));
        *configures.entry(c).or_default() += 1;
        let state = f["state"].as_str().unwrap_or_default();
        if state != "provisioned" || f["configured"] != 1 || f["restarts"] != 1 || c != 1 || r != 1
        {
            bad.push(format!(
                "{n}: state {state}, configured {}, restarts {}, configure ok {c}, restart ok {r}",
                f["configured"], f["restarts"]
            ));
        }
    }
    bad.truncate(10);
    let span_s = match (first, last) {
        (Some(f), Some(l)) => (l - f) as f64 / 1e6,
        _ => 0.0,
    };
    Once {
        finals: finals.len(),
        span_s,
        configures,
        bad,
    }
}

/// Run by `node-tier.sh` with `NODE_TIER_JOURNAL` and `NODE_TIER_NODES`:
/// prints `ok|bad FINALS SPAN_S {configures: nodes}` and the first reasons.
#[test]
#[ignore = "run by scripts/node-tier.sh with its fleet's journal"]
fn judge_the_node_tiers_journal() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let journal = std::fs::read_to_string(var("NODE_TIER_JOURNAL")).unwrap();
    let nodes = var("NODE_TIER_NODES").parse().unwrap();
    let o = once(&journal, nodes);
    let hist: Vec<String> = o
        .configures
        .iter()
        .map(|(c, n)| format!("{c}: {n}"))
        .collect();
    let verdict = if o.bad.is_empty() { "ok" } else { "bad" };
    println!(
        "--- once ---\n{verdict} {} {:.1} {{{}}}",
        o.finals,
        o.span_s,
        hist.join(", ")
    );
    for b in &o.bad {
        println!("  {b}");
    }
    println!("--- end ---");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> HashMap<String, String> {
        names("10.0.0.1 pod-a\n10.0.0.2 pod-b\n10.0.0.3 pod-c\nbroken line here\n")
    }

    #[test]
    fn a_hand_over_is_timed_from_the_old_leaders_last_sample_to_the_new_ones_first() {
        let timeline = "1000 10.0.0.1:1:5:0 10.0.0.2:0:0:0\n\
                        1100 10.0.0.1:1:6:0 10.0.0.2:0:0:0\n\
                        1200 10.0.0.1:- 10.0.0.2:0:0:0\n\
                        1300 10.0.0.2:0:0:0\n\
                        1400 10.0.0.2:1:0:0\n";
        let a = analyse(timeline, &pods(), 1000, 5000);
        assert_eq!(
            a.handovers,
            vec![Handover {
                from: "pod-a".into(),
                to: "pod-b".into(),
                gap_ms: 300,
                old_then: "no-address".into(),
            }]
        );
        assert_eq!(a.samples, 5);
        assert_eq!(
            a.longest_without_leader_ms, 300,
            "from 1100, the last leader sample"
        );
        assert!(a.doubles.is_empty());
    }

    #[test]
    fn what_the_old_leader_said_is_read_from_the_new_ones_first_sample() {
        let timeline = "0 10.0.0.1:1:0:0 10.0.0.2:0:0:0\n\
                        100 10.0.0.1:0:0:0 10.0.0.2:1:0:0\n\
                        200 10.0.0.1:- 10.0.0.2:0:0:0 10.0.0.3:1:0:0\n";
        let a = analyse(timeline, &pods(), 0, 1000);
        let then: Vec<&str> = a.handovers.iter().map(|h| h.old_then.as_str()).collect();
        assert_eq!(then, ["leader=0", "leader=0"]);
        let timeline = "0 10.0.0.1:1:0:0\n100 10.0.0.1:- 10.0.0.2:1:0:0\n";
        assert_eq!(
            analyse(timeline, &pods(), 0, 1000).handovers[0].old_then,
            "not-answering"
        );
    }

    #[test]
    fn two_leaders_in_one_sample_are_reported_and_take_no_hand_over() {
        let timeline = "0 10.0.0.1:1:0:0 10.0.0.2:0:0:0\n\
                        100 10.0.0.1:1:0:0 10.0.0.2:1:0:0\n\
                        200 10.0.0.1:1:0:0 10.0.0.2:0:0:0\n";
        let a = analyse(timeline, &pods(), 0, 1000);
        assert_eq!(
            a.doubles,
            vec![(100, vec!["pod-a".to_string(), "pod-b".to_string()])]
        );
        assert!(a.handovers.is_empty());
    }

    #[test]
    fn only_the_window_counts_and_a_half_written_line_is_left_out() {
        let timeline = "0 10.0.0.1:1:0:0\n\
                        100 10.0.0.2:1:0:0\n\
                        200 10.0.0.2:1:0:0\n\
                        300 10.0.0.3:1:0:0\n\
                        400 10.0.0.1:1";
        let a = analyse(timeline, &pods(), 150, 250);
        assert!(
            a.handovers.is_empty(),
            "the one before 150 and after 250 are outside"
        );
        assert_eq!(a.samples, 1);
        let a = analyse(timeline, &pods(), 50, 1000);
        assert_eq!(a.handovers.len(), 2, "{:?}", a.handovers);
        assert_eq!(a.samples, 3, "the line without its newline is not a sample");
    }

    #[test]
    fn the_report_has_the_lines_the_script_reads() {
        let a = Analysis {
            handovers: vec![Handover {
                from: "pod-a".into(),
                to: "pod-b".into(),
                gap_ms: 1234,
                old_then: "leader=0".into(),
            }],
            doubles: vec![(7, vec!["pod-a".into(), "pod-b".into()])],
            samples: 42,
            longest_without_leader_ms: 1500,
        };
        assert_eq!(
            report(&a),
            "double 7 pod-a,pod-b\nhandover pod-a pod-b 1.23 leader=0\nstats 42 1.50\n"
        );
    }

    fn line(kind: &str, node: &str, extra: &str) -> String {
        format!("{{\"kind\":\"{kind}\",\"node\":\"{node}\"{extra}}}\n")
    }

    #[test]
    fn a_node_configured_twice_or_missing_is_reported() {
        let ok_final = r#","state":"provisioned","configured":1,"restarts":1"#;
        let mut journal = String::new();
        for (n, configures) in [("n1", 1), ("n2", 2)] {
            for i in 0..configures {
                journal += &line(
                    "action",
                    n,
                    &format!(
                        r#","action":"configure","outcome":"ok","time_us":{}"#,
                        1_000_000 + i
                    ),
                );
            }
            journal += &line(
                "action",
                n,
                r#","action":"restart","outcome":"ok","time_us":3500000"#,
            );
            journal += &line("final", n, ok_final);
        }
        let o = once(&journal, 3);
        assert_eq!(o.finals, 2);
        assert_eq!(o.span_s, 2.5);
        assert_eq!(o.configures.get(&1), Some(&1));
        assert_eq!(o.configures.get(&2), Some(&1));
        assert_eq!(o.bad.len(), 2, "{:?}", o.bad);
        assert!(o.bad[0].starts_with("2 final states, not 3"));
        assert!(o.bad[1].contains("n2") && o.bad[1].contains("configure ok 2"));
        let mut good = String::new();
        good += &line(
            "action",
            "n1",
            r#","action":"configure","outcome":"ok","time_us":1"#,
        );
        good += &line(
            "action",
            "n1",
            r#","action":"restart","outcome":"ok","time_us":2"#,
        );
        good += &line(
            "action",
            "n1",
            r#","action":"restart","outcome":"error","time_us":3"#,
        );
        good += &line("final", "n1", ok_final);
        assert!(
            once(&good, 1).bad.is_empty(),
            "a failed attempt is no second restart"
        );
    }
}

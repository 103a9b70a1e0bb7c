//! The Go provisioner's Grafana dashboard (grafana.com 12431, shipped in the
//! Helm chart) against our `/metrics`: every metric its panels and template
//! variables query must exist, carry every label they match, group by or
//! print, and the `site` its variable offers must select our series.
//!
//! The queries are read with a small parser for the PromQL subset
//! dashboards use (see [`promql`]); the provisioner runs as the real binary
//! against a simulated fleet in which some nodes fail, so the error panels
//! have something to show too.

use crate::support::provisioner::{binary, ProvisionerProcess};
use crate::support::{NatsServer, RunningFleet};
use choria_fleet::FleetOptions;
use choria_wire::client::BrokerOptions;
use promql::{Matcher, Op, Selector};
use regex::Regex;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The dashboard as the chart ships it (a byte-identical copy of upstream's).
const CHART_COPY: &str = "charts/choria-provisioner-operator/dashboards/choria-provisioner.json";
/// The Go provisioner's own file, where the workspace has the peer checkout.
const UPSTREAM: &str = "../shared/peers/go-provisioner/dashboard.json";
/// Our own dashboard beside it: records, renewal and shards.
const OURS: &str = "charts/choria-provisioner-operator/dashboards/choria-provisioner-day-two.json";
const SITE: &str = "dashboard";

/// Labels the dashboard reads from a metric that has none such, in the Go
/// provisioner as here. The "RPC and Helper Times" panel copies its RPC
/// query for the helper, `by (rpc)` included, but the helper's summary only
/// has `site` (Go's `helperDuration` is `[]string{"site"}`): PromQL then
/// groups everything into one series with an empty `rpc`, which the panel
/// labels "helper". Harmless, and adding the label would break parity.
/// The test fails if one of these stops being absent, so the list stays true.
const ABSENT_IN_GO_TOO: [(&str, &str); 2] = [
    ("choria_provisioner_helper_time_sum", "rpc"),
    ("choria_provisioner_helper_time_count", "rpc"),
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The chart's copy, or upstream's file when the chart has none.
fn dashboard_path() -> PathBuf {
    let chart = repo().join(CHART_COPY);
    if chart.exists() {
        return chart;
    }
    let upstream = repo().join(UPSTREAM);
    assert!(
        upstream.exists(),
        "neither {} nor {} exists",
        chart.display(),
        upstream.display()
    );
    upstream
}

fn load_dashboard() -> Value {
    let path = dashboard_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

#[test]
fn the_chart_ships_the_upstream_dashboard_unchanged() {
    let chart = repo().join(CHART_COPY);
    let ours = std::fs::read(&chart).unwrap_or_else(|e| panic!("{}: {e}", chart.display()));
    let upstream = repo().join(UPSTREAM);
    match std::fs::read(&upstream) {
        Ok(theirs) => assert!(
            ours == theirs,
            "{CHART_COPY} differs from {}: the chart ships the Go provisioner's dashboard byte for byte (cp it again)",
            upstream.display()
        ),
        Err(e) => println!(
            "note: {} not readable ({e}); only the chart's copy is checked",
            upstream.display()
        ),
    }
    let d: Value = serde_json::from_slice(&ours).expect("the chart's dashboard is JSON");
    assert!(
        !panel_queries(&d).is_empty(),
        "the dashboard has no queries"
    );
}

// ---------------------------------------------------------------------------
// What the dashboard asks for.

/// One query of the dashboard and where it is, for messages.
struct Query {
    place: String,
    expr: String,
    /// Labels its legend prints (`{{rpc}}`).
    legend: BTreeSet<String>,
}

/// A template variable of type `query`.
struct Variable {
    name: String,
    query: String,
    regex: String,
}

/// Every panel target's (and annotation's) `expr`, nested and legacy rows too.
fn panel_queries(dashboard: &Value) -> Vec<Query> {
    fn walk(panels: &Value, out: &mut Vec<Query>) {
        for panel in panels.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?");
            for target in panel["targets"].as_array().into_iter().flatten() {
                let Some(expr) = target["expr"].as_str().filter(|e| !e.trim().is_empty()) else {
                    continue;
                };
                out.push(Query {
                    place: format!(
                        "panel {title:?} target {}",
                        target["refId"].as_str().unwrap_or("?")
                    ),
                    expr: expr.to_string(),
                    legend: legend_labels(target["legendFormat"].as_str().unwrap_or("")),
                });
            }
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    for row in dashboard["rows"].as_array().into_iter().flatten() {
        walk(&row["panels"], &mut out);
    }
    for a in dashboard["annotations"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(expr) = a["expr"].as_str().filter(|e| !e.trim().is_empty()) {
            out.push(Query {
                place: format!("annotation {:?}", a["name"].as_str().unwrap_or("?")),
                expr: expr.to_string(),
                legend: legend_labels(a["titleFormat"].as_str().unwrap_or("")),
            });
        }
    }
    out
}

/// `{{label}}` references of a legend format.
fn legend_labels(format: &str) -> BTreeSet<String> {
    let re = Regex::new(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}").unwrap();
    re.captures_iter(format).map(|c| c[1].to_string()).collect()
}

fn variables(dashboard: &Value) -> Vec<Variable> {
    let list = dashboard["templating"]["list"].as_array();
    list.into_iter()
        .flatten()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            // Older Grafana: `query` is the string; newer: an object with a
            // `query` field, and `definition` repeats it.
            let query = v["query"]
                .as_str()
                .or_else(|| v["query"]["query"].as_str())
                .or_else(|| v["definition"].as_str())
                .unwrap_or_default();
            Variable {
                name: v["name"].as_str().unwrap_or("?").to_string(),
                query: query.to_string(),
                regex: v["regex"].as_str().unwrap_or("").to_string(),
            }
        })
        .collect()
}

/// One vector selector the dashboard evaluates, with every label it reads.
struct Use {
    place: String,
    sel: Selector,
    labels: BTreeSet<String>,
}

impl Use {
    fn new(place: &str, sel: Selector, extra: &BTreeSet<String>) -> Self {
        let mut labels: BTreeSet<String> = sel.matchers.iter().map(|m| m.label.clone()).collect();
        labels.extend(sel.grouping.iter().cloned());
        labels.extend(extra.iter().cloned());
        Use {
            place: place.to_string(),
            sel,
            labels,
        }
    }
}

/// Grafana's variable syntaxes: `$name`, `${name}`, `${name:format}`, `[[name]]`.
fn substitute(text: &str, vars: &BTreeMap<String, String>) -> String {
    let re = Regex::new(r"\$\{(\w+)(?::[^}]*)?\}|\[\[(\w+)\]\]|\$(\w+)").unwrap();
    re.replace_all(text, |c: &regex::Captures| {
        let name = c.get(1).or(c.get(2)).or(c.get(3)).unwrap().as_str();
        vars.get(name).cloned().unwrap_or_else(|| c[0].to_string())
    })
    .into_owned()
}

/// The selectors a variable's query evaluates and the values Grafana would
/// offer, computed from our exposition the way Grafana's Prometheus data
/// source does it (series strings for a plain query, then the regex).
fn variable_values(
    v: &Variable,
    vars: &BTreeMap<String, String>,
    expo: &Exposition,
) -> Result<(Vec<Use>, Vec<String>), String> {
    let query = substitute(v.query.trim(), vars);
    let place = format!("variable ${}", v.name);
    let call = Regex::new(r"^(\w+)\((.*)\)$").unwrap();
    // Grafana's own query functions; anything else is a series selector.
    let (function, args) = match call.captures(&query) {
        Some(c) if ["label_values", "query_result", "metrics", "label_names"].contains(&&c[1]) => {
            (c[1].to_string(), c[2].to_string())
        }
        _ => (String::new(), query.clone()),
    };
    // Labels its regex extracts (`/site="(.+)"/`) are read from the series.
    let from_regex: BTreeSet<String> = Regex::new(r#"([a-zA-Z_][a-zA-Z0-9_]*)=\\?""#)
        .unwrap()
        .captures_iter(&v.regex)
        .map(|c| c[1].to_string())
        .collect();
    let mut texts = Vec::new();
    let mut uses = Vec::new();
    match function.as_str() {
        "label_values" => {
            let (expr, label) = match args.rsplit_once(',') {
                Some((expr, label)) => (expr.trim().to_string(), label.trim().to_string()),
                None => (String::new(), args.trim().to_string()),
            };
            let sels = if expr.is_empty() {
                // label_values(label): any metric.
                vec![Selector::any()]
            } else {
                promql::selectors(&expr).map_err(|e| format!("{place}: {e}"))?
            };
            let wanted = BTreeSet::from([label.clone()]);
            for sel in sels {
                for s in expo.selected(&sel) {
                    texts.extend(s.labels.get(&label).cloned());
                }
                uses.push(Use::new(&place, sel, &wanted));
            }
        }
        "query_result" | "" => {
            let expr = if function.is_empty() { &query } else { &args };
            let sels = promql::selectors(expr).map_err(|e| format!("{place}: {e}"))?;
            if function.is_empty() && sels.len() != 1 {
                return Err(format!(
                    "{place}: a plain query is a series selector, not {query:?}"
                ));
            }
            for sel in sels {
                texts.extend(expo.selected(&sel).map(Series::as_scraped));
                uses.push(Use::new(&place, sel, &from_regex));
            }
        }
        other => return Err(format!("{place}: unsupported template query {other}(…)")),
    }
    let mut values = BTreeSet::new();
    if v.regex.is_empty() {
        values.extend(texts);
    } else {
        let pattern = v.regex.trim();
        let pattern = pattern
            .strip_prefix('/')
            .and_then(|p| p.rsplit_once('/'))
            .map_or(pattern, |(p, _flags)| p);
        let re = Regex::new(pattern).map_err(|e| format!("{place}: regex {pattern:?}: {e}"))?;
        for t in &texts {
            if let Some(c) = re.captures(t) {
                values.insert(c.get(1).unwrap_or(c.get(0).unwrap()).as_str().to_string());
            }
        }
    }
    Ok((uses, values.into_iter().collect()))
}

// ---------------------------------------------------------------------------
// What we expose.

struct Series {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

impl Series {
    /// As Prometheus' series API returns it after a scrape, the text
    /// Grafana matches a variable's regex against: the target's `instance`
    /// and `job` added, labels sorted.
    fn as_scraped(&self) -> String {
        let mut labels = self.labels.clone();
        labels.insert("instance".into(), "127.0.0.1:8080".into());
        labels.insert("job".into(), "choria-provisioner".into());
        let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
        format!("{}{{{}}}", self.name, inner.join(","))
    }
}

struct Exposition {
    series: Vec<Series>,
    /// `# TYPE` of each family.
    types: BTreeMap<String, String>,
}

impl Exposition {
    /// Prometheus text format 0.0.4 as `/metrics` serves it.
    fn parse(text: &str) -> Result<Self, String> {
        let mut series = Vec::new();
        let mut types = BTreeMap::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest
                    .split_once(' ')
                    .ok_or_else(|| format!("bad TYPE line {line:?}"))?;
                types.insert(name.to_string(), kind.trim().to_string());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            series.push(Self::sample(line).map_err(|e| format!("{e} in {line:?}"))?);
        }
        Ok(Exposition { series, types })
    }

    fn sample(line: &str) -> Result<Series, String> {
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .ok_or("no value")?;
        let name = line[..name_end].to_string();
        let mut rest = &line[name_end..];
        let mut labels = BTreeMap::new();
        if let Some(inner) = rest.strip_prefix('{') {
            let mut chars = inner.char_indices().peekable();
            loop {
                while chars.next_if(|(_, c)| *c == ',' || *c == ' ').is_some() {}
                match chars.peek() {
                    Some((i, '}')) => {
                        rest = &inner[i + 1..];
                        break;
                    }
                    None => return Err("unterminated labels".into()),
                    _ => {}
                }
                let mut label = String::new();
                while let Some((_, c)) = chars.next_if(|(_, c)| *c != '=') {
                    label.push(c);
                }
                if chars.next().map(|(_, c)| c) != Some('=')
                    || chars.next().map(|(_, c)| c) != Some('"')
                {
                    return Err(format!("label {label} has no quoted value"));
                }
                let mut value = String::new();
                loop {
                    match chars.next().map(|(_, c)| c) {
                        Some('"') => break,
                        Some('\\') => match chars.next().map(|(_, c)| c) {
                            Some('n') => value.push('\n'),
                            Some(c) => value.push(c),
                            None => return Err("unterminated escape".into()),
                        },
                        Some(c) => value.push(c),
                        None => return Err("unterminated label value".into()),
                    }
                }
                labels.insert(label, value);
            }
        }
        let value = rest
            .split_whitespace()
            .next()
            .ok_or("no value")?
            .parse::<f64>()
            .map_err(|e| format!("bad value: {e}"))?;
        Ok(Series {
            name,
            labels,
            value,
        })
    }

    fn named<'a>(&'a self, metric: &'a str) -> impl Iterator<Item = &'a Series> + 'a {
        self.series
            .iter()
            .filter(move |s| metric.is_empty() || s.name == metric)
    }

    /// The series `sel` selects (its matchers already substituted).
    fn selected<'a>(&'a self, sel: &'a Selector) -> impl Iterator<Item = &'a Series> + 'a {
        self.named(&sel.metric)
            .filter(move |s| sel.matchers.iter().all(|m| matches(m, s)))
    }

    /// The type of the family a series name belongs to (`x_sum` of summary `x`).
    fn family_type(&self, name: &str) -> Option<(&str, &str)> {
        if let Some((family, t)) = self.types.get_key_value(name) {
            return Some((family.as_str(), t.as_str()));
        }
        ["_sum", "_count", "_bucket"].iter().find_map(|suffix| {
            let family = name.strip_suffix(suffix)?;
            let (family, t) = self.types.get_key_value(family)?;
            Some((family.as_str(), t.as_str()))
        })
    }
}

/// PromQL matching: a missing label is the empty string, regexes are anchored.
fn matches(m: &Matcher, s: &Series) -> bool {
    let v = s.labels.get(&m.label).map_or("", String::as_str);
    let re = || {
        Regex::new(&format!("^(?:{})$", m.value))
            .unwrap_or_else(|e| panic!("bad regex in matcher {m:?}: {e}"))
    };
    match m.op {
        Op::Eq => v == m.value,
        Op::Ne => v != m.value,
        Op::Re => re().is_match(v),
        Op::NotRe => !re().is_match(v),
    }
}

// ---------------------------------------------------------------------------
// The check.

#[derive(Default)]
struct Findings {
    /// (metric, label) pairs the dashboard reads that the metric lacks.
    absent_labels: BTreeSet<(String, String)>,
    /// Everything else wrong, one sentence each.
    problems: Vec<String>,
}

fn check_use(u: &Use, vars: &BTreeMap<String, String>, expo: &Exposition, f: &mut Findings) {
    let unresolved = Regex::new(r"\$\{?\w|\[\[\w").unwrap();
    let mut sel = u.sel.clone();
    for m in &mut sel.matchers {
        m.value = substitute(&m.value, vars);
        if unresolved.is_match(&m.value) {
            f.problems.push(format!(
                "{}: matcher {} uses an unknown variable",
                u.place, m.label
            ));
        }
    }
    let series: Vec<&Series> = expo.named(&sel.metric).collect();
    if sel.metric.is_empty() {
        for label in &u.labels {
            if !series.iter().any(|s| s.labels.contains_key(label)) {
                f.problems
                    .push(format!("{}: no series has a label {label}", u.place));
            }
        }
        return;
    }
    if series.is_empty() {
        f.problems.push(format!(
            "{}: metric {} is not in our /metrics",
            u.place, sel.metric
        ));
        return;
    }
    for label in &u.labels {
        if series.iter().any(|s| !s.labels.contains_key(label)) {
            f.absent_labels.insert((sel.metric.clone(), label.clone()));
        }
    }
    if let Some(s) = series
        .iter()
        .find(|s| s.labels.get("site").map(String::as_str) != Some(SITE))
    {
        f.problems.push(format!(
            "{}: a {} series has site {:?}, not {SITE:?}",
            u.place,
            sel.metric,
            s.labels.get("site")
        ));
    }
    // rate() and increase() need counters, or a summary's _sum and _count.
    if let Some(func) = sel
        .functions
        .iter()
        .find(|f| ["rate", "irate", "increase"].contains(&f.as_str()))
    {
        let ok = match expo.family_type(&sel.metric) {
            Some((family, t)) if family == sel.metric => t == "counter",
            Some((_, t)) => t == "summary" || t == "histogram",
            None => false,
        };
        if !ok {
            f.problems.push(format!(
                "{}: {func}() of {}, whose type is {:?}",
                u.place,
                sel.metric,
                expo.family_type(&sel.metric)
            ));
        }
    }
    if expo.selected(&sel).next().is_none() {
        f.problems.push(format!(
            "{}: {} with {:?} selects none of our series",
            u.place, sel.metric, sel.matchers
        ));
    }
}

/// Every use the dashboard makes of our metrics, the template's values, and
/// what is wrong.
fn check_dashboard(
    dashboard: &Value,
    expo: &Exposition,
) -> (Vec<Use>, BTreeMap<String, Vec<String>>, Findings) {
    let mut f = Findings::default();
    let mut vars = BTreeMap::new();
    let mut offered = BTreeMap::new();
    let mut uses = Vec::new();
    for v in variables(dashboard) {
        match variable_values(&v, &vars, expo) {
            Ok((var_uses, values)) => {
                if let Some(first) = values.first() {
                    vars.insert(v.name.clone(), first.clone());
                } else {
                    f.problems.push(format!(
                        "variable ${} offers no value from our metrics",
                        v.name
                    ));
                }
                uses.extend(var_uses);
                offered.insert(v.name.clone(), values);
            }
            Err(e) => f.problems.push(e),
        }
    }
    for q in panel_queries(dashboard) {
        match promql::selectors(&q.expr) {
            Ok(sels) if sels.is_empty() => f
                .problems
                .push(format!("{}: no metric in {:?}", q.place, q.expr)),
            Ok(sels) => uses.extend(sels.into_iter().map(|s| Use::new(&q.place, s, &q.legend))),
            Err(e) => f
                .problems
                .push(format!("{}: cannot read {:?}: {e}", q.place, q.expr)),
        }
    }
    for u in &uses {
        check_use(u, &vars, expo, &mut f);
    }
    (uses, offered, f)
}

// ---------------------------------------------------------------------------
// The run.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_is_answered_by_our_metrics() {
    const NODES: usize = 12;
    let started = Instant::now();
    let dashboard = load_dashboard();

    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    // One node answers every request with an error (rpc_errors); the helper
    // crashes for nodes 000 and 001 (helper_errors). Both are provision errors.
    let fleet = RunningFleet::start(FleetOptions {
        broker: BrokerOptions::at([nats.url()]),
        nodes: NODES,
        journal: Some(dir.path().join("journal.jsonl")),
        fail_error: 1.0 / NODES as f64,
        seed: 12,
        key_pool_size: 2,
        connections: 2,
        ..Default::default()
    })
    .await;
    let helper = format!(
        "{} fleet-helper --fail crash {}",
        binary(),
        shell_words::quote(r"--fail-match=-00[01]\.")
    );
    let yaml = format!(
        "interval: 1m\nchoria_insecure: true\nsite: {SITE}\nrpc_timeout: 3s\ndiscovery_window: 500ms\nworkers: 4\nhelper: {helper:?}\n"
    );
    let ccfg = format!(
        "identity = provisioner.{SITE}\nplugin.choria.middleware_hosts = {}\n",
        nats.url()
    );
    let mut p = ProvisionerProcess::start(dir.path(), &yaml, &ccfg, &[]);

    // The panels have data: at most three nodes fail, the others provision.
    let wait = Duration::from_secs(60);
    for (metric, at_least) in [
        ("choria_provisioner_discover_cycles", 1.0),
        ("choria_provisioner_discovered", NODES as f64),
        ("choria_provisioner_provisioned", (NODES - 3) as f64),
        ("choria_provisioner_rpc_time_count", 1.0),
        ("choria_provisioner_helper_time_count", 1.0),
        ("choria_provisioner_rpc_errors", 1.0),
        ("choria_provisioner_helper_errors", 1.0),
        ("choria_provisioner_provision_errors", 1.0),
    ] {
        p.wait_for_metric(metric, at_least, wait).await;
    }
    let (status, text) = p.get("/metrics");
    assert_eq!(status, 200, "/metrics answered {status}: {text}");
    let expo = Exposition::parse(&text).unwrap_or_else(|e| panic!("our /metrics: {e}\n{text}"));
    let (uses, offered, findings) = check_dashboard(&dashboard, &expo);
    // Ours is held to the same rules, with no exception list.
    let ours: Value = serde_json::from_str(&std::fs::read_to_string(repo().join(OURS)).unwrap())
        .unwrap_or_else(|e| panic!("{OURS} is not JSON: {e}"));
    let (our_uses, our_offered, our_findings) = check_dashboard(&ours, &expo);
    drop(p);
    drop(fleet);
    let mut our_problems = our_findings.problems;
    for (m, l) in &our_findings.absent_labels {
        our_problems.push(format!(
            "{OURS} reads label {l} of {m}, which our series lack"
        ));
    }
    assert!(
        our_uses.len() >= 9
            && our_offered
                .get("instance")
                .is_some_and(|v| v.iter().any(|v| v == SITE)),
        "{OURS}: {} uses, variables offer {our_offered:?}",
        our_uses.len()
    );
    assert!(
        our_problems.is_empty(),
        "{OURS} does not work with our /metrics:\n  {}",
        our_problems.join("\n  ")
    );

    let metrics: BTreeSet<&str> = uses.iter().map(|u| u.sel.metric.as_str()).collect();
    println!(
        "{} uses of {} metrics in {}; variables offer {offered:?}",
        uses.len(),
        metrics.len(),
        dashboard_path().display()
    );
    for m in &metrics {
        let labels: BTreeSet<&str> = uses
            .iter()
            .filter(|u| u.sel.metric == *m)
            .flat_map(|u| u.labels.iter().map(String::as_str))
            .collect();
        let total: f64 = expo.named(m).map(|s| s.value).sum();
        println!("  {m:<40} reads {labels:?}, value {total}");
    }
    let known: BTreeSet<(String, String)> = ABSENT_IN_GO_TOO
        .iter()
        .map(|(m, l)| (m.to_string(), l.to_string()))
        .collect();
    for (m, l) in findings.absent_labels.intersection(&known) {
        println!("  note: the dashboard reads label {l} of {m}, which Go does not have either");
    }
    let mut problems = findings.problems;
    for (m, l) in findings.absent_labels.difference(&known) {
        problems.push(format!(
            "the dashboard reads label {l} of {m}, which our series lack"
        ));
    }
    for (m, l) in known.difference(&findings.absent_labels) {
        problems.push(format!(
            "ABSENT_IN_GO_TOO lists label {l} of {m}, but the dashboard no longer misses it: drop it"
        ));
    }
    for (name, values) in &offered {
        if name == "instance" && !values.iter().any(|v| v == SITE) {
            problems.push(format!(
                "variable ${name} offers {values:?}, not our site {SITE:?}"
            ));
        }
    }
    assert!(
        offered.contains_key("instance"),
        "the dashboard has no $instance variable"
    );
    assert!(
        problems.is_empty(),
        "the dashboard does not work with our /metrics:\n  {}",
        problems.join("\n  ")
    );
    println!("checked in {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------
// The parser, on its own.

#[test]
fn the_query_parser_reads_metrics_matchers_grouping_and_functions() {
    let sels = promql::selectors(
        r#"sum(rate(choria_provisioner_rpc_time_sum{site=~"${instance}"}[1m])) by (rpc) / sum by (rpc, site) (rate(choria_provisioner_rpc_time_count{site="a\"b", rpc!='x'}[$__rate_interval]))"#,
    )
    .unwrap();
    assert_eq!(sels.len(), 2);
    assert_eq!(sels[0].metric, "choria_provisioner_rpc_time_sum");
    assert_eq!(
        sels[0].matchers,
        vec![Matcher {
            label: "site".into(),
            op: Op::Re,
            value: "${instance}".into()
        }]
    );
    assert_eq!(sels[0].grouping, BTreeSet::from(["rpc".to_string()]));
    assert_eq!(sels[0].functions, vec!["sum", "rate"]);
    assert_eq!(sels[1].metric, "choria_provisioner_rpc_time_count");
    assert_eq!(
        sels[1].grouping,
        BTreeSet::from(["rpc".to_string(), "site".to_string()])
    );
    assert_eq!(sels[1].matchers[0].value, "a\"b");
    assert_eq!(sels[1].matchers[1].op, Op::Ne);

    // Keywords, numbers, offsets, vector matching and __name__ are no metrics.
    let sels = promql::selectors(
        r#"increase(a_total{job="x"}[5m] offset 1h) > 0.5 and on (job) b == bool 1e3 unless {__name__="c", site!~"d|e"} or max without (pod) (d) # note"#,
    )
    .unwrap();
    let names: Vec<&str> = sels.iter().map(|s| s.metric.as_str()).collect();
    assert_eq!(names, ["a_total", "b", "c", "d"]);
    assert_eq!(sels[0].functions, vec!["increase"]);
    assert!(sels[1].grouping.is_empty(), "on (job) is not grouping");
    assert_eq!(sels[2].matchers.len(), 1);
    assert_eq!(sels[2].matchers[0].op, Op::NotRe);
    assert_eq!(sels[3].grouping, BTreeSet::from(["pod".to_string()]));

    for bad in ["sum(x", "x)", r#"x{site="a}"#, "x{site}", "sum by x"] {
        assert!(promql::selectors(bad).is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn template_variables_read_their_labels_from_the_exposition() {
    let expo = Exposition::parse(
        "# TYPE m counter\nm{site=\"dc1\"} 1\nm{a=\"x\\\"y\",site=\"dc2\"} 2\n# TYPE n gauge\nn 3\n",
    )
    .unwrap();
    assert_eq!(expo.series[1].labels["a"], "x\"y");
    let var = |query: &str, regex: &str| Variable {
        name: "v".into(),
        query: query.into(),
        regex: regex.into(),
    };
    let none = BTreeMap::new();
    let (uses, values) = variable_values(&var("m", r#"/site="(.+)"/"#), &none, &expo).unwrap();
    assert_eq!(values, ["dc1", "dc2"]);
    assert_eq!(uses[0].labels, BTreeSet::from(["site".to_string()]));
    let (_, values) = variable_values(
        &var("label_values(m{a=\"x\\\"y\"}, site)", ""),
        &none,
        &expo,
    )
    .unwrap();
    assert_eq!(values, ["dc2"]);
    let (uses, values) = variable_values(&var("label_values(site)", ""), &none, &expo).unwrap();
    assert_eq!(
        (uses[0].sel.metric.as_str(), &values[..]),
        ("", &["dc1".to_string(), "dc2".to_string()][..])
    );
    assert!(variable_values(&var("metrics(m)", ""), &none, &expo).is_err());
    let vars = BTreeMap::from([("v".to_string(), "dc1".to_string())]);
    assert_eq!(
        substitute("a $v ${v} ${v:regex} [[v]] $w", &vars),
        "a dc1 dc1 dc1 dc1 $w"
    );
}

/// A reader of the PromQL that dashboards hold, enough to find what they
/// select: metric names with their `{…}` matchers, the labels of `by`/
/// `without`, and the functions around each selector. Strings, numbers,
/// ranges (`[5m]`, `[$__interval]`), operators and keywords are skipped;
/// labels named by `on`/`ignoring`/`group_left` and inside string
/// arguments (`label_replace`) are not read.
mod promql {
    use std::collections::BTreeSet;

    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum Op {
        Eq,
        Ne,
        Re,
        NotRe,
    }

    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Matcher {
        pub label: String,
        pub op: Op,
        pub value: String,
    }

    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Selector {
        /// Empty for `{…}` without `__name__`: any metric.
        pub metric: String,
        pub matchers: Vec<Matcher>,
        /// Labels of every enclosing `by (…)` / `without (…)`.
        pub grouping: BTreeSet<String>,
        /// Enclosing functions and aggregations, outermost first.
        pub functions: Vec<String>,
    }

    impl Selector {
        pub fn any() -> Self {
            Selector {
                metric: String::new(),
                matchers: Vec::new(),
                grouping: BTreeSet::new(),
                functions: Vec::new(),
            }
        }
    }

    #[derive(Clone, Debug, PartialEq)]
    enum Tok {
        Ident(String),
        Open,
        Close,
        Comma,
        Braces(Vec<Matcher>),
        /// Numbers, strings, operators, Grafana variables.
        Other,
    }

    const GROUPING: [&str; 2] = ["by", "without"];
    const VECTOR_MATCHING: [&str; 4] = ["on", "ignoring", "group_left", "group_right"];
    const KEYWORDS: [&str; 8] = [
        "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
    ];
    const AGGREGATIONS: [&str; 14] = [
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "limitk",
        "limit_ratio",
    ];

    fn is_ident_start(c: char) -> bool {
        c.is_ascii_alphabetic() || c == '_' || c == ':'
    }

    fn is_ident(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '_' || c == ':'
    }

    fn ident(chars: &[char], mut i: usize) -> (String, usize) {
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        (chars[start..i].iter().collect(), i)
    }

    fn skip_ws(chars: &[char], mut i: usize) -> usize {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        i
    }

    /// A quoted string at `i`: its value and the index after it.
    fn string(chars: &[char], i: usize) -> Result<(String, usize), String> {
        let quote = chars[i];
        let mut value = String::new();
        let mut j = i + 1;
        while j < chars.len() {
            match chars[j] {
                c if c == quote => return Ok((value, j + 1)),
                '\\' if quote != '`' => {
                    j += 1;
                    match chars.get(j) {
                        Some('n') => value.push('\n'),
                        Some('t') => value.push('\t'),
                        Some(c) => value.push(*c),
                        None => break,
                    }
                }
                c => value.push(c),
            }
            j += 1;
        }
        Err(format!("unterminated string from offset {i}"))
    }

    /// The matchers of a `{…}` whose `{` is just before `i`.
    fn matchers(chars: &[char], mut i: usize) -> Result<(Vec<Matcher>, usize), String> {
        let mut out = Vec::new();
        loop {
            i = skip_ws(chars, i);
            match chars.get(i) {
                Some('}') => return Ok((out, i + 1)),
                Some(c) if is_ident_start(*c) => {}
                _ => return Err(format!("expected a label name at offset {i}")),
            }
            let (label, next) = ident(chars, i);
            i = skip_ws(chars, next);
            let two: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let (op, len) = match two.as_str() {
                "=~" => (Op::Re, 2),
                "!~" => (Op::NotRe, 2),
                "!=" => (Op::Ne, 2),
                _ if two.starts_with('=') => (Op::Eq, 1),
                _ => return Err(format!("expected a matcher operator after {label}")),
            };
            i = skip_ws(chars, i + len);
            if !matches!(chars.get(i), Some('"' | '\'' | '`')) {
                return Err(format!("expected a quoted value for {label}"));
            }
            let (value, next) = string(chars, i)?;
            out.push(Matcher { label, op, value });
            i = skip_ws(chars, next);
            if chars.get(i) == Some(&',') {
                i += 1;
            }
        }
    }

    fn lex(expr: &str) -> Result<Vec<Tok>, String> {
        let chars: Vec<char> = expr.chars().collect();
        let mut out = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            i = match c {
                c if c.is_whitespace() => i + 1,
                '#' => chars[i..]
                    .iter()
                    .position(|c| *c == '\n')
                    .map_or(chars.len(), |n| i + n),
                '(' | ')' | ',' => {
                    out.push(match c {
                        '(' => Tok::Open,
                        ')' => Tok::Close,
                        _ => Tok::Comma,
                    });
                    i + 1
                }
                // A range or subquery: durations and Grafana variables only.
                '[' => {
                    let end = chars[i..]
                        .iter()
                        .position(|c| *c == ']')
                        .ok_or_else(|| format!("unterminated [ at offset {i}"))?;
                    i + end + 1
                }
                '{' => {
                    let (m, next) = matchers(&chars, i + 1)?;
                    out.push(Tok::Braces(m));
                    next
                }
                '"' | '\'' | '`' => {
                    out.push(Tok::Other);
                    string(&chars, i)?.1
                }
                c if is_ident_start(c) => {
                    let (word, next) = ident(&chars, i);
                    out.push(Tok::Ident(word));
                    next
                }
                '$' => {
                    out.push(Tok::Other);
                    if chars.get(i + 1) == Some(&'{') {
                        chars[i..]
                            .iter()
                            .position(|c| *c == '}')
                            .map_or(chars.len(), |n| i + n + 1)
                    } else {
                        ident(&chars, i + 1).1
                    }
                }
                c if c.is_ascii_digit() || c == '.' => {
                    out.push(Tok::Other);
                    let mut j = i;
                    while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '.') {
                        j += 1;
                    }
                    j
                }
                _ => {
                    out.push(Tok::Other);
                    i + 1
                }
            };
        }
        Ok(out)
    }

    /// `( label, … )` at `i`: the labels and the index after `)`.
    fn label_list(toks: &[Tok], mut i: usize) -> Result<(BTreeSet<String>, usize), String> {
        if toks.get(i) != Some(&Tok::Open) {
            return Err("expected ( after by/without/on/ignoring".into());
        }
        let mut labels = BTreeSet::new();
        i += 1;
        loop {
            match toks.get(i) {
                Some(Tok::Ident(l)) => {
                    labels.insert(l.clone());
                }
                Some(Tok::Comma) => {}
                Some(Tok::Close) => return Ok((labels, i + 1)),
                other => return Err(format!("unexpected {other:?} in a label list")),
            }
            i += 1;
        }
    }

    /// Every vector selector of `expr`, in order.
    pub fn selectors(expr: &str) -> Result<Vec<Selector>, String> {
        struct Frame {
            function: Option<String>,
            /// Index of its first selector in `out`.
            start: usize,
            /// From `sum by (x) (…)`: the grouping comes before the parenthesis.
            grouping: Option<BTreeSet<String>>,
        }
        let toks = lex(expr)?;
        let mut out: Vec<Selector> = Vec::new();
        let mut stack: Vec<Frame> = Vec::new();
        // An aggregation whose `by (…)` comes before its argument.
        let mut pending: Option<(String, Option<BTreeSet<String>>)> = None;
        // The start of the group the previous token closed (for `sum (…) by (x)`).
        let mut closed: Option<usize> = None;
        let mut i = 0;
        let new = |metric: String, matchers: Vec<Matcher>, stack: &[Frame]| Selector {
            metric,
            matchers,
            grouping: BTreeSet::new(),
            functions: stack.iter().filter_map(|f| f.function.clone()).collect(),
        };
        while i < toks.len() {
            let just_closed = closed.take();
            match &toks[i] {
                Tok::Ident(w) if GROUPING.contains(&w.as_str()) => {
                    let (labels, next) = label_list(&toks, i + 1)?;
                    match (just_closed, &mut pending) {
                        (Some(start), _) => {
                            for s in &mut out[start..] {
                                s.grouping.extend(labels.iter().cloned());
                            }
                        }
                        (None, Some((_, grouping @ None))) => *grouping = Some(labels),
                        _ => return Err(format!("{w} (…) without an aggregation")),
                    }
                    i = next;
                    continue;
                }
                Tok::Ident(w) if VECTOR_MATCHING.contains(&w.as_str()) => {
                    if toks.get(i + 1) == Some(&Tok::Open) {
                        i = label_list(&toks, i + 1)?.1;
                        continue;
                    }
                }
                Tok::Ident(w) if KEYWORDS.contains(&w.to_ascii_lowercase().as_str()) => {}
                Tok::Ident(w) if toks.get(i + 1) == Some(&Tok::Open) => {
                    let grouping = pending.take().and_then(|(_, g)| g);
                    stack.push(Frame {
                        function: Some(w.clone()),
                        start: out.len(),
                        grouping,
                    });
                    i += 2;
                    continue;
                }
                Tok::Ident(w) if AGGREGATIONS.contains(&w.as_str()) => {
                    pending = Some((w.clone(), None));
                }
                Tok::Ident(w) => {
                    let matchers = match toks.get(i + 1) {
                        Some(Tok::Braces(m)) => {
                            i += 1;
                            m.clone()
                        }
                        _ => Vec::new(),
                    };
                    out.push(new(w.clone(), matchers, &stack));
                }
                Tok::Braces(m) => {
                    let name = m
                        .iter()
                        .position(|m| m.label == "__name__" && m.op == Op::Eq);
                    let mut rest = m.clone();
                    let metric = name.map(|n| rest.remove(n).value).unwrap_or_default();
                    out.push(new(metric, rest, &stack));
                }
                Tok::Open => {
                    let (function, grouping) = match pending.take() {
                        Some((f, g)) => (Some(f), g),
                        None => (None, None),
                    };
                    stack.push(Frame {
                        function,
                        start: out.len(),
                        grouping,
                    });
                }
                Tok::Close => {
                    let frame = stack
                        .pop()
                        .ok_or_else(|| format!("unbalanced ) in {expr:?}"))?;
                    if let Some(g) = frame.grouping {
                        for s in &mut out[frame.start..] {
                            s.grouping.extend(g.iter().cloned());
                        }
                    }
                    closed = Some(frame.start);
                }
                Tok::Comma | Tok::Other => {}
            }
            i += 1;
        }
        if !stack.is_empty() {
            return Err(format!("unbalanced ( in {expr:?}"));
        }
        if pending.is_some() {
            return Err(format!("an aggregation without its argument in {expr:?}"));
        }
        Ok(out)
    }
}

//! The Go provisioner's Grafana dashboard (grafana.com 12431, shipped in the
//! Helm chart) against our `/metrics`: every metric its panels and template
//! variables query must exist, carry every label they match, group by or
//! print, and the `site` its variable offers must select our series.
//!
//! The queries are read with a small parser for the PromQL subset
//! dashboards use (see `support/promql.rs`); the provisioner runs as the real binary
//! against a simulated fleet in which some nodes fail, so the error panels
//! have something to show too.

use crate::support::promql::{self, Matcher, Op, Selector};
use crate::support::provisioner::{binary, ProvisionerProcess};
use crate::support::{NatsServer, RunningFleet};
use choria_fleet::FleetOptions;
use choria_wire::client::BrokerOptions;
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

//! `/metrics` in the OpenMetrics text format 1.0, for a scraper that asks
//! for it (`Accept: application/openmetrics-text`): the same series as
//! the Prometheus text, and the exemplars the registry's owner keeps for
//! its histograms' buckets (a trace id beside an observation).
//!
//! Names stay what they are in the Prometheus text: OpenMetrics would
//! name a counter's sample `<name>_total`, which the Go provisioner's
//! counters are not, so counters are written as `unknown` (a sample named
//! as its family), and dashboards read the same series either way.

use prometheus::proto::{LabelPair, Metric, MetricFamily, MetricType};
use std::fmt::Write;

/// Content type of the OpenMetrics text format 1.0.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One exemplar: its labels (`trace_id`), the observed value and when
/// (Unix seconds).
#[derive(Clone, Debug, PartialEq)]
pub struct Exemplar {
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
    pub timestamp: f64,
}

/// Finds the exemplar of bucket `bucket` (an index into the metric's
/// buckets, the last one `+Inf`) of one histogram series.
pub type Exemplars<'a> = dyn Fn(&MetricFamily, &Metric, usize) -> Option<Exemplar> + 'a;

/// Whether an `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|part| {
            part.split(';').next().is_some_and(|t| {
                t.trim()
                    .eq_ignore_ascii_case("application/openmetrics-text")
            })
        })
    })
}

/// `families` in the OpenMetrics text format, `# EOF` last.
pub fn encode(families: &[MetricFamily], exemplars: &Exemplars) -> String {
    let mut out = String::new();
    for family in families {
        let name = family.name();
        let kind = match family.get_field_type() {
            MetricType::GAUGE => "gauge",
            MetricType::SUMMARY => "summary",
            MetricType::HISTOGRAM => "histogram",
            MetricType::COUNTER | MetricType::UNTYPED => "unknown",
        };
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "# HELP {name} {}", escape(family.help()));
        for m in family.get_metric() {
            let labels = m.get_label();
            match family.get_field_type() {
                MetricType::COUNTER => {
                    sample(&mut out, name, labels, None, m.get_counter().get_value())
                }
                MetricType::GAUGE => {
                    sample(&mut out, name, labels, None, m.get_gauge().get_value())
                }
                MetricType::UNTYPED => sample(&mut out, name, labels, None, untyped(m)),
                MetricType::SUMMARY => {
                    let s = m.get_summary();
                    for q in s.get_quantile() {
                        let extra = ("quantile", number(q.quantile()));
                        sample(&mut out, name, labels, Some(extra), q.value());
                    }
                    sample(
                        &mut out,
                        &format!("{name}_sum"),
                        labels,
                        None,
                        s.sample_sum(),
                    );
                    sample(
                        &mut out,
                        &format!("{name}_count"),
                        labels,
                        None,
                        s.sample_count() as f64,
                    );
                }
                MetricType::HISTOGRAM => histogram(&mut out, family, m, exemplars),
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

fn histogram(out: &mut String, family: &MetricFamily, m: &Metric, exemplars: &Exemplars) {
    let name = family.name();
    let h = m.get_histogram();
    let labels = m.get_label();
    let buckets = h.get_bucket();
    let bucket_name = format!("{name}_bucket");
    for (i, b) in buckets.iter().enumerate() {
        let le = ("le", number(b.upper_bound()));
        let e = exemplars(family, m, i);
        sample_with(
            out,
            &bucket_name,
            labels,
            Some(le),
            b.cumulative_count() as f64,
            e,
        );
    }
    // The +Inf bucket is implied in the protobuf form; OpenMetrics wants it.
    if buckets
        .last()
        .is_none_or(|b| b.upper_bound() != f64::INFINITY)
    {
        let e = exemplars(family, m, buckets.len());
        let count = h.get_sample_count() as f64;
        sample_with(
            out,
            &bucket_name,
            labels,
            Some(("le", "+Inf".into())),
            count,
            e,
        );
    }
    sample(
        out,
        &format!("{name}_sum"),
        labels,
        None,
        h.get_sample_sum(),
    );
    sample(
        out,
        &format!("{name}_count"),
        labels,
        None,
        h.get_sample_count() as f64,
    );
}

/// One sample's line.
fn sample(
    out: &mut String,
    name: &str,
    labels: &[LabelPair],
    extra: Option<(&str, String)>,
    value: f64,
) {
    sample_with(out, name, labels, extra, value, None);
}

fn sample_with(
    out: &mut String,
    name: &str,
    labels: &[LabelPair],
    extra: Option<(&str, String)>,
    value: f64,
    e: Option<Exemplar>,
) {
    out.push_str(name);
    let mut pairs: Vec<(&str, String)> = labels
        .iter()
        .map(|l| (l.name(), l.value().to_string()))
        .collect();
    pairs.extend(extra);
    label_set(out, &pairs);
    let _ = write!(out, " {}", number(value));
    exemplar(out, e);
}

/// Ends a sample's line, with ` # {labels} value timestamp` when there is
/// an exemplar.
fn exemplar(out: &mut String, e: Option<Exemplar>) {
    if let Some(e) = e {
        out.push_str(" #");
        let pairs: Vec<(&str, String)> = e.labels.iter().map(|(k, v)| (*k, v.clone())).collect();
        out.push(' ');
        if pairs.is_empty() {
            out.push_str("{}");
        } else {
            label_set(out, &pairs);
        }
        let _ = write!(out, " {} {:.3}", number(e.value), e.timestamp);
    }
    out.push('\n');
}

fn label_set(out: &mut String, pairs: &[(&str, String)]) {
    if pairs.is_empty() {
        return;
    }
    out.push('{');
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{k}=\"{}\"", escape(v));
    }
    out.push('}');
}

/// The prometheus crate keeps untyped values only for its protobuf form.
#[allow(deprecated)]
fn untyped(m: &Metric) -> f64 {
    m.get_untyped().get_value()
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else if v.is_nan() {
        "NaN".into()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> prometheus::Registry {
        let r = prometheus::Registry::new();
        let c = prometheus::IntCounter::new("things_done", "Things \"done\"").unwrap();
        c.inc();
        r.register(Box::new(c)).unwrap();
        let h = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new("took_seconds", "How long").buckets(vec![0.5, 1.0]),
        )
        .unwrap();
        h.observe(0.7);
        r.register(Box::new(h)).unwrap();
        r
    }

    #[test]
    fn counters_keep_their_names_and_buckets_carry_exemplars() {
        let text = encode(&registry().gather(), &|f, _, i| {
            (f.name() == "took_seconds" && i == 1).then(|| Exemplar {
                labels: vec![("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736".into())],
                value: 0.7,
                timestamp: 1700000000.5,
            })
        });
        assert_eq!(
            text,
            "# TYPE things_done unknown\n# HELP things_done Things \\\"done\\\"\nthings_done 1\n\
             # TYPE took_seconds histogram\n# HELP took_seconds How long\n\
             took_seconds_bucket{le=\"0.5\"} 0\n\
             took_seconds_bucket{le=\"1\"} 1 # {trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"} 0.7 1700000000.500\n\
             took_seconds_bucket{le=\"+Inf\"} 1\n\
             took_seconds_sum 0.7\ntook_seconds_count 1\n# EOF\n"
        );
    }

    #[test]
    fn only_an_accept_header_naming_openmetrics_gets_it() {
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        )));
        assert!(!wants_openmetrics(Some("text/plain;version=0.0.4")));
        assert!(!wants_openmetrics(None));
    }
}

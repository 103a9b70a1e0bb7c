//! The histograms we own (the Go provisioner has summaries only), each
//! bucket keeping the last observation made inside a traced sequence as
//! its exemplar: the trace id beside the value, served in OpenMetrics
//! (`crate::monitor::openmetrics`).

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

/// An observation's trace, kept beside its bucket.
#[derive(Clone, Debug, PartialEq)]
pub struct Exemplar {
    /// 32 hex digits (W3C trace context).
    pub trace_id: String,
    pub value: f64,
    /// Unix seconds.
    pub timestamp: f64,
}

#[derive(Clone)]
pub(super) struct Histogram(Arc<Core>);

struct Core {
    desc: Desc,
    /// Upper bounds, ascending; `+Inf` after them is implied.
    bounds: Vec<f64>,
    // A handful of series: a linear scan, as in `Summary`.
    series: Mutex<Vec<Series>>,
}

struct Series {
    label_values: Vec<String>,
    /// Per bucket (not cumulative), the `+Inf` one last.
    counts: Vec<u64>,
    sum: f64,
    exemplars: Vec<Option<Exemplar>>,
}

impl Histogram {
    pub(super) fn new(
        name: &str,
        help: &str,
        site: &str,
        labels: &[&str],
        bounds: &[f64],
    ) -> prometheus::Result<Self> {
        let desc = Desc::new(
            name.to_string(),
            help.to_string(),
            labels.iter().map(|l| l.to_string()).collect(),
            [(super::SITE.to_string(), site.to_string())].into(),
        )?;
        Ok(Histogram(Arc::new(Core {
            desc,
            bounds: bounds.to_vec(),
            series: Mutex::new(Vec::new()),
        })))
    }

    /// Counts `v`; with `trace` (the trace id of the sequence it was
    /// observed in) it becomes its bucket's exemplar.
    pub(super) fn observe(&self, label_values: &[&str], v: f64, trace: Option<&str>) {
        let bucket = self
            .0
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.0.bounds.len());
        let exemplar = trace.map(|t| Exemplar {
            trace_id: t.to_string(),
            value: v,
            timestamp: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
        });
        self.with_series(label_values, |s| {
            s.counts[bucket] += 1;
            s.sum += v;
            if exemplar.is_some() {
                s.exemplars[bucket] = exemplar;
            }
        });
    }

    /// Creates the series at 0 if missing.
    pub(super) fn touch(&self, label_values: &[&str]) {
        self.with_series(label_values, |_| {});
    }

    /// The exemplar of bucket `bucket` (`+Inf` last) of the series with
    /// these labels (the variable ones, in any order).
    pub(super) fn exemplar(&self, labels: &[LabelPair], bucket: usize) -> Option<Exemplar> {
        let values: Vec<&str> = self
            .0
            .desc
            .variable_labels
            .iter()
            .map(|name| {
                labels
                    .iter()
                    .find(|l| l.name() == name)
                    .map_or("", |l| l.value())
            })
            .collect();
        let series = self.0.series.lock().unwrap_or_else(PoisonError::into_inner);
        let s = series.iter().find(|s| {
            s.label_values
                .iter()
                .map(String::as_str)
                .eq(values.iter().copied())
        })?;
        s.exemplars.get(bucket).cloned().flatten()
    }

    pub(super) fn name(&self) -> &str {
        &self.0.desc.fq_name
    }

    fn with_series(&self, label_values: &[&str], f: impl FnOnce(&mut Series)) {
        debug_assert_eq!(label_values.len(), self.0.desc.variable_labels.len());
        let mut series = self.0.series.lock().unwrap_or_else(PoisonError::into_inner);
        let pos = series.iter().position(|s| {
            s.label_values
                .iter()
                .map(String::as_str)
                .eq(label_values.iter().copied())
        });
        let idx = pos.unwrap_or_else(|| {
            let n = self.0.bounds.len() + 1;
            series.push(Series {
                label_values: label_values.iter().map(|v| v.to_string()).collect(),
                counts: vec![0; n],
                sum: 0.0,
                exemplars: vec![None; n],
            });
            series.len() - 1
        });
        f(&mut series[idx]);
    }
}

impl Collector for Histogram {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let desc = &self.0.desc;
        let series = self.0.series.lock().unwrap_or_else(PoisonError::into_inner);
        let metrics = series
            .iter()
            .map(|s| {
                let labels = super::summary::label_pairs(desc, &s.label_values);
                let mut cumulative = 0;
                let buckets = self
                    .0
                    .bounds
                    .iter()
                    .zip(&s.counts)
                    .map(|(bound, n)| {
                        cumulative += n;
                        let mut b = proto::Bucket::default();
                        b.set_upper_bound(*bound);
                        b.set_cumulative_count(cumulative);
                        b
                    })
                    .collect();
                let mut h = proto::Histogram::default();
                h.set_bucket(buckets);
                h.set_sample_count(s.counts.iter().sum());
                h.set_sample_sum(s.sum);
                let mut metric = proto::Metric::default();
                metric.set_label(labels);
                metric.set_histogram(h);
                metric
            })
            .collect();
        drop(series);
        let mut family = MetricFamily::default();
        family.set_name(desc.fq_name.clone());
        family.set_help(desc.help.clone());
        family.set_field_type(MetricType::HISTOGRAM);
        family.set_metric(metrics);
        vec![family]
    }
}

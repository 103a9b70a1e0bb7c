//! The Go provisioner's quantile-less summaries, which the prometheus
//! crate has no type for.

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};
use std::sync::{Arc, Mutex, PoisonError};

/// A summary without quantiles, exported as `_sum` and `_count` only, like
/// the Go provisioner's `NewSummaryVec` without objectives; the prometheus
/// crate has no summary type of its own.
#[derive(Clone)]
pub(super) struct Summary(Arc<SummaryCore>);

struct SummaryCore {
    desc: Desc,
    // A handful of series per summary: a linear scan is as fast as hashing
    // and looks up by `&[&str]` without allocating on the hot path.
    series: Mutex<Vec<SummarySeries>>,
}

struct SummarySeries {
    label_values: Vec<String>,
    count: u64,
    sum: f64,
}

impl Summary {
    pub(super) fn new(
        name: &str,
        help: &str,
        site: &str,
        labels: &[&str],
    ) -> prometheus::Result<Self> {
        let desc = Desc::new(
            name.to_string(),
            help.to_string(),
            labels.iter().map(|l| l.to_string()).collect(),
            [(super::SITE.to_string(), site.to_string())].into(),
        )?;
        Ok(Summary(Arc::new(SummaryCore {
            desc,
            series: Mutex::new(Vec::new()),
        })))
    }

    pub(super) fn observe(&self, label_values: &[&str], v: f64) {
        self.with_series(label_values, |s| {
            s.count += 1;
            s.sum += v;
        });
    }

    /// Creates the series at 0 if missing.
    pub(super) fn touch(&self, label_values: &[&str]) {
        self.with_series(label_values, |_| {});
    }

    fn with_series(&self, label_values: &[&str], f: impl FnOnce(&mut SummarySeries)) {
        debug_assert_eq!(label_values.len(), self.0.desc.variable_labels.len());
        // The series hold plain numbers that no panic can leave half
        // updated, so a poisoned lock is still fine to use.
        let mut series = self.0.series.lock().unwrap_or_else(PoisonError::into_inner);
        let pos = series.iter().position(|s| {
            s.label_values
                .iter()
                .map(String::as_str)
                .eq(label_values.iter().copied())
        });
        let idx = pos.unwrap_or_else(|| {
            series.push(SummarySeries {
                label_values: label_values.iter().map(|v| v.to_string()).collect(),
                count: 0,
                sum: 0.0,
            });
            series.len() - 1
        });
        f(&mut series[idx]);
    }
}

impl Collector for Summary {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let desc = &self.0.desc;
        let series = self.0.series.lock().unwrap_or_else(PoisonError::into_inner);
        let metrics = series
            .iter()
            .map(|s| {
                let labels = label_pairs(desc, &s.label_values);
                let mut summary = proto::Summary::default();
                summary.set_sample_count(s.count);
                summary.set_sample_sum(s.sum);
                let mut metric = proto::Metric::default();
                metric.set_label(labels);
                metric.set_summary(summary);
                metric
            })
            .collect();
        drop(series);

        let mut family = MetricFamily::default();
        family.set_name(desc.fq_name.clone());
        family.set_help(desc.help.clone());
        family.set_field_type(MetricType::SUMMARY);
        family.set_metric(metrics);
        vec![family]
    }
}

/// A series' labels: its own values under the desc's label names, then the
/// constant ones, sorted by name as the crate's own metrics and Go export
/// them.
pub(super) fn label_pairs(desc: &Desc, values: &[String]) -> Vec<LabelPair> {
    let mut labels: Vec<LabelPair> = desc
        .variable_labels
        .iter()
        .zip(values)
        .map(|(name, value)| {
            let mut pair = LabelPair::default();
            pair.set_name(name.clone());
            pair.set_value(value.clone());
            pair
        })
        .chain(desc.const_label_pairs.iter().cloned())
        .collect();
    labels.sort();
    labels
}

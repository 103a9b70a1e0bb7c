//! The operator's metrics, served on its `/metrics`, `/healthz`, `/readyz`
//! endpoint. Readiness comes from [`choria_replica::monitor::Health`] (the election
//! reports there); standbys are ready, so a rollout never waits for them to
//! lead.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// Reconciliation counters and the leader gauge, in a registry of their own.
pub struct Metrics {
    registry: Registry,
    reconciliations: IntCounter,
    failures: IntCounterVec,
    invalid: IntCounter,
    leader: IntGauge,
    admission_policy: IntGauge,
    provisioner_admission_policy: IntGauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        choria_replica::monitor::register_process_metrics(&registry);
        let reconciliations = IntCounter::with_opts(Opts::new(
            "choria_provisioner_operator_reconciliations_total",
            "Reconciliations of Provisioner resources",
        ))
        .expect("valid metric");
        let failures = IntCounterVec::new(
            Opts::new(
                "choria_provisioner_operator_reconcile_failures_total",
                "Reconciliations that failed, by error",
            ),
            &["error"],
        )
        .expect("valid metric");
        let invalid = IntCounter::with_opts(Opts::new(
            "choria_provisioner_operator_invalid_specs_total",
            "Reconciliations that found a spec they could not apply: invalid, or beyond what the cluster admin allows",
        ))
        .expect("valid metric");
        let leader = IntGauge::with_opts(Opts::new(
            "choria_provisioner_operator_leader",
            "1 while this operator replica leads",
        ))
        .expect("valid metric");
        let admission_policy = IntGauge::with_opts(Opts::new(
            "choria_provisioner_operator_admission_policy",
            "1 once this leader applied the ValidatingAdmissionPolicy that bounds Provisioner pods' CertificateRequests; 0 while it could not (or none is configured)",
        ))
        .expect("valid metric");
        let provisioner_admission_policy = IntGauge::with_opts(Opts::new(
            "choria_provisioner_operator_provisioner_admission_policy",
            "1 once this leader applied the ValidatingAdmissionPolicy that bounds the priority class and volume types of Provisioners' spec.pod; 0 while it could not (or none is configured)",
        ))
        .expect("valid metric");
        for c in [
            Box::new(reconciliations.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(failures.clone()),
            Box::new(invalid.clone()),
            Box::new(leader.clone()),
            Box::new(admission_policy.clone()),
            Box::new(provisioner_admission_policy.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        Metrics {
            registry,
            admission_policy,
            provisioner_admission_policy,
            reconciliations,
            failures,
            invalid,
            leader,
        }
    }

    pub fn reconciled(&self) {
        self.reconciliations.inc();
    }

    pub fn failed(&self, error: &str) {
        self.failures.with_label_values(&[error]).inc();
    }

    pub fn invalid_spec(&self) {
        self.invalid.inc();
    }

    pub fn set_admission_policy(&self, applied: bool) {
        self.admission_policy.set(i64::from(applied));
    }

    pub fn set_provisioner_admission_policy(&self, applied: bool) {
        self.provisioner_admission_policy.set(i64::from(applied));
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }
}

impl choria_replica::monitor::Exposition for Metrics {
    fn registry(&self) -> &Registry {
        &self.registry
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use choria_replica::monitor::Exposition;

    #[test]
    fn counters_start_at_zero_and_count() {
        let m = Metrics::new();
        assert_eq!(
            m.value("choria_provisioner_operator_reconciliations_total"),
            Some(0.0)
        );
        m.reconciled();
        m.reconciled();
        m.failed("apply");
        m.set_leader(true);
        assert_eq!(
            m.value("choria_provisioner_operator_reconciliations_total"),
            Some(2.0)
        );
        assert_eq!(
            m.value("choria_provisioner_operator_reconcile_failures_total"),
            Some(1.0)
        );
        assert_eq!(m.value("choria_provisioner_operator_leader"), Some(1.0));
        let text = m.encode_text();
        assert!(
            text.contains(
                "choria_provisioner_operator_reconcile_failures_total{error=\"apply\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_standard_process_metrics_are_exported() {
        let m = Metrics::new();
        let text = m.encode_text();
        for name in [
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(&format!("{name} "))),
                "no {name} in\n{text}"
            );
        }
        assert!(m.value("process_resident_memory_bytes").unwrap() > 1_000_000.0);
    }
}

//! What each room calls to count what happened: one method per event or
//! gauge, each touching its series of [`Metrics`] (registered at 0 by
//! `Metrics::new`).

use super::{saturating_i64, BusyWorker, GaugeGuard, Metrics};
use std::time::Duration;

impl Metrics {
    pub fn ignored_reply(&self, reason: &str) {
        self.ignored_replies.with_label_values(&[reason]).inc();
    }

    /// `decision`: one of [`ADMISSION_DECISIONS`].
    pub fn admission(&self, decision: &str) {
        self.admission.with_label_values(&[decision]).inc();
    }

    /// `outcome`: one of [`EVIDENCE_OUTCOMES`].
    pub fn evidence(&self, outcome: &str) {
        self.evidence.with_label_values(&[outcome]).inc();
    }

    pub fn set_revocations(&self, n: usize) {
        self.revocations.set(saturating_i64(n));
    }

    /// `outcome`: one of [`HELD_OUTCOMES`].
    pub fn held_reprovision(&self, outcome: &str) {
        self.held_reprovisions.with_label_values(&[outcome]).inc();
    }

    /// `action`: one of [`REVOKED_ACTIONS`].
    pub fn revoked_refusal(&self, action: &str) {
        self.revoked_refusals.with_label_values(&[action]).inc();
    }

    /// `outcome`: one of [`AUDIT_OUTCOMES`].
    pub fn audit_event(&self, outcome: &str) {
        self.audit_events.with_label_values(&[outcome]).inc();
    }

    pub fn conflicting_reply(&self) {
        self.conflicting_replies.inc();
    }

    pub fn rejected_identity(&self, source: &str) {
        self.rejected_identities.with_label_values(&[source]).inc();
    }

    pub fn rejected_csr(&self, reason: &str) {
        self.rejected_csrs.with_label_values(&[reason]).inc();
    }

    pub fn unconfirmed_event(&self) {
        self.unconfirmed_events.inc();
    }

    pub fn dropped_event(&self) {
        self.dropped_events.inc();
    }

    pub fn unconfirmed_discovery(&self) {
        self.unconfirmed_discoveries.inc();
    }

    pub fn dropped_discovery(&self) {
        self.dropped_discoveries.inc();
    }

    pub fn set_pending_nodes(&self, n: usize) {
        self.pending_nodes.set(n as i64);
    }

    pub fn set_records(&self, n: usize) {
        self.records.set(n as i64);
    }

    pub fn set_renewals_due(&self, n: usize) {
        self.renewals_due.set(n as i64);
    }

    /// `outcome`: `sent`, `refused` or `failed`.
    pub fn renewal(&self, outcome: &str) {
        self.renewals.with_label_values(&[outcome]).inc();
    }

    /// Counts a sequence in flight while the guard lives.
    /// The gauge of `lane`'s in-flight bound, set by its budget.
    pub fn in_flight_bound(&self, lane: &str) -> prometheus::IntGauge {
        self.in_flight_bound.with_label_values(&[lane])
    }

    pub fn sequence(&self) -> GaugeGuard<'_> {
        self.sequences.inc();
        GaugeGuard {
            gauge: &self.sequences,
        }
    }

    pub fn ignored_shutdown(&self) {
        self.ignored_shutdowns.inc();
    }

    pub fn shard_record_refused(&self, reason: &str) {
        self.shard_records_refused
            .with_label_values(&[reason])
            .inc();
    }

    pub fn record_refused(&self, reason: &str) {
        self.records_refused.with_label_values(&[reason]).inc();
    }

    /// `bucket` (one of [`MEMORY_BUCKETS`]) was found erased in part.
    pub fn memory_erased(&self, bucket: &str) {
        self.memory_erased.with_label_values(&[bucket]).inc();
    }

    /// A read of `bucket` (one of [`MEMORY_BUCKETS`]) failed.
    pub fn memory_read_error(&self, bucket: &str) {
        self.memory_read_errors.with_label_values(&[bucket]).inc();
    }

    pub fn set_renewals_stranded(&self, n: usize) {
        self.renewals_stranded.set(saturating_i64(n));
    }

    pub fn record_written(&self) {
        self.records_written.inc();
    }

    pub fn record_error(&self) {
        self.record_errors.inc();
    }

    pub fn record_dropped(&self) {
        self.records_dropped.inc();
    }

    pub fn lock_refusal(&self) {
        self.lock_refusals.inc();
    }

    pub fn set_shard_members(&self, n: usize) {
        self.shard_members.set(n as i64);
    }

    /// `place` is one of [`REFUSED_PLACES`].
    pub fn refused_value(&self, place: &str) {
        self.refused_values.with_label_values(&[place]).inc();
    }

    /// Counts a node waiting on its reply window until the guard drops.
    pub fn confirming_node(&self) -> GaugeGuard<'_> {
        self.confirming_nodes.inc();
        GaugeGuard {
            gauge: &self.confirming_nodes,
        }
    }

    pub fn site(&self) -> &str {
        &self.site
    }

    /// Records one RPC round trip; `rpc` is `agent#action`, `trace` the
    /// trace id of the node's sequence when it is traced.
    pub fn observe_rpc(&self, rpc: &str, took: Duration, trace: Option<&str>) {
        self.rpc_time.observe(&[rpc], took.as_secs_f64());
        self.rpc_seconds.observe(&[rpc], took.as_secs_f64(), trace);
    }

    /// Records how long a node took, from being found to the end of its
    /// sequence.
    pub fn observe_sequence(&self, took: Duration, trace: Option<&str>) {
        self.sequence_seconds
            .observe(&[], took.as_secs_f64(), trace);
    }

    /// One signed request message for `rpc` went out to `targets` nodes.
    pub fn signed_request(&self, rpc: &str, targets: usize) {
        self.signed_requests.with_label_values(&[rpc]).inc();
        self.request_targets
            .with_label_values(&[rpc])
            .inc_by(targets as u64);
    }

    pub fn rpc_error(&self, rpc: &str) {
        self.rpc_errors.with_label_values(&[rpc]).inc();
    }

    pub fn observe_helper(&self, took: Duration) {
        self.helper_time.observe(&[], took.as_secs_f64());
    }

    pub fn helper_error(&self) {
        self.helper_errors.inc();
    }

    pub fn template_error(&self) {
        self.template_errors.inc();
    }

    pub fn cert_manager_request(&self, outcome: &str) {
        self.cert_manager_requests
            .with_label_values(&[outcome])
            .inc();
    }

    pub fn ca_signature(&self, outcome: &str) {
        self.ca_signatures.with_label_values(&[outcome]).inc();
    }

    pub fn helper_shutdown(&self) {
        self.helper_shutdowns.inc();
    }

    pub fn discovered(&self) {
        self.discovered.inc();
    }

    pub fn event_discovered(&self) {
        self.event_discovered.inc();
    }

    pub fn discover_cycle(&self) {
        self.discover_cycles.inc();
    }

    pub fn discovery_error(&self) {
        self.discovery_errors.inc();
    }

    pub fn provision_error(&self) {
        self.provision_errors.inc();
    }

    /// A node that answered was refused (see `choria_provisioner_refused_nodes`).
    pub fn refused_node(&self) {
        self.refused_nodes.inc();
    }

    pub fn provisioned(&self) {
        self.provisioned.inc();
    }

    pub fn set_paused(&self, paused: bool) {
        self.paused.set(i64::from(paused));
    }

    /// Counts one busy worker until the returned guard drops, so an early
    /// return or panic in the worker cannot leave the gauge too high.
    pub fn busy_worker(&self) -> BusyWorker<'_> {
        self.busy_workers.inc();
        GaugeGuard {
            gauge: &self.busy_workers,
        }
    }

    pub fn set_work_queue_entries(&self, n: usize) {
        self.work_queue_entries.set(saturating_i64(n));
    }

    pub fn set_waiting_nodes(&self, n: usize) {
        self.waiting_nodes.set(saturating_i64(n));
    }

    pub fn election_error(&self) {
        self.election_errors.inc();
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    pub fn leadership_transition(&self) {
        self.leadership_transitions.inc();
    }
}

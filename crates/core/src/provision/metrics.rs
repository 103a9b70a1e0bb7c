//! Prometheus metrics under the Go provisioner's exact names, so existing
//! dashboards and alerts keep working against this rebuild.
//!
//! Every series carries the `site` label and exists from the start at 0:
//! dashboards then show zeros instead of gaps before the first event.

use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

mod histogram;
mod labels;
mod record;
mod summary;
pub use histogram::Exemplar;
use histogram::Histogram;
pub use labels::*;
use summary::Summary;

const SITE: &str = "site";
const RPC: &str = "rpc";
/// The pipeline's lanes (`pipeline::registry::Lane::name`), each with its
/// in-flight bound; 0 until the lanes start.
const LANES: [&str; 3] = ["events", "discovery", "suspect"];

/// All metrics of one provisioner process, labelled with its `site`.
///
/// Each instance owns its registry, so several can live in one process
/// (tests, the demo) without clashing in the global default registry.
pub struct Metrics {
    site: String,
    registry: Registry,
    rpc_time: Summary,
    helper_time: Summary,
    /// Ours: RPC and whole-sequence times as histograms, their buckets
    /// with exemplars (trace ids) when tracing is on.
    rpc_seconds: Histogram,
    sequence_seconds: Histogram,
    rpc_errors: IntCounterVec,
    helper_errors: IntCounter,
    template_errors: IntCounter,
    cert_manager_requests: IntCounterVec,
    ca_signatures: IntCounterVec,
    helper_shutdowns: IntCounter,
    discovered: IntCounter,
    event_discovered: IntCounter,
    discover_cycles: IntCounter,
    discovery_errors: IntCounter,
    provision_errors: IntCounter,
    provisioned: IntCounter,
    refused_nodes: IntCounter,
    paused: IntGauge,
    busy_workers: IntGauge,
    work_queue_entries: IntGauge,
    waiting_nodes: IntGauge,
    election_errors: IntCounter,
    leader: IntGauge,
    leadership_transitions: IntCounter,
    ignored_replies: IntCounterVec,
    signed_requests: IntCounterVec,
    request_targets: IntCounterVec,
    conflicting_replies: IntCounter,
    rejected_identities: IntCounterVec,
    rejected_csrs: IntCounterVec,
    unconfirmed_events: IntCounter,
    dropped_events: IntCounter,
    confirming_nodes: IntGauge,
    unconfirmed_discoveries: IntCounter,
    dropped_discoveries: IntCounter,
    pending_nodes: IntGauge,
    refused_values: IntCounterVec,
    admission: IntCounterVec,
    evidence: IntCounterVec,
    audit_events: IntCounterVec,
    revocations: IntGauge,
    held_reprovisions: IntCounterVec,
    revoked_refusals: IntCounterVec,
    lock_refusals: IntCounter,
    shard_members: IntGauge,
    records_written: IntCounter,
    record_errors: IntCounter,
    records_dropped: IntCounter,
    records: IntGauge,
    renewals_due: IntGauge,
    renewals: IntCounterVec,
    renewals_stranded: IntGauge,
    records_refused: IntCounterVec,
    memory_read_errors: IntCounterVec,
    memory_erased: IntCounterVec,
    shard_records_refused: IntCounterVec,
    ignored_shutdowns: IntCounter,
    sequences: IntGauge,
    in_flight_bound: IntGaugeVec,
}

impl Metrics {
    pub fn new(site: &str) -> Self {
        let registry = Registry::new();
        crate::monitor::register_process_metrics(&registry);
        // `site` is a constant label: it never varies within one process,
        // and the hot paths then need no label lookup for it.
        let opts = |name: &str, help: &str| Opts::new(name, help).const_label(SITE, site);
        let counter = |name: &str, help: &str| {
            let c = IntCounter::with_opts(opts(name, help)).unwrap_or_else(|e| defect(name, e));
            register(&registry, name, c.clone());
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::with_opts(opts(name, help)).unwrap_or_else(|e| defect(name, e));
            register(&registry, name, g.clone());
            g
        };
        let summary = |name: &str, help: &str, labels: &[&str]| {
            let s = Summary::new(name, help, site, labels).unwrap_or_else(|e| defect(name, e));
            register(&registry, name, s.clone());
            s
        };

        let rpc_time = summary(
            "choria_provisioner_rpc_time",
            "How long it took to perform RPC requests",
            &[RPC],
        );
        let helper_time = summary(
            "choria_provisioner_helper_time",
            "How long it took to run the helper",
            &[],
        );
        let histogram = |name: &str, help: &str, labels: &[&str], bounds: &[f64]| {
            let h = Histogram::new(name, help, site, labels, bounds)
                .unwrap_or_else(|e| defect(name, e));
            register(&registry, name, h.clone());
            h
        };
        let rpc_seconds = histogram(
            "choria_provisioner_rpc_seconds",
            "How long RPC requests took, as a histogram (exemplars: the node's trace, with telemetry on)",
            &[RPC],
            &RPC_BUCKETS,
        );
        let sequence_seconds = histogram(
            "choria_provisioner_sequence_seconds",
            "How long nodes took from being found to the end of their sequence, however it ended (exemplars: the node's trace, with telemetry on)",
            &[],
            &SEQUENCE_BUCKETS,
        );
        sequence_seconds.touch(&[]);
        let rpc_errors_name = "choria_provisioner_rpc_errors";
        let rpc_errors = IntCounterVec::new(
            opts(
                rpc_errors_name,
                "How many rpc related errors were encountered",
            ),
            &[RPC],
        )
        .unwrap_or_else(|e| defect(rpc_errors_name, e));
        register(&registry, rpc_errors_name, rpc_errors.clone());
        for rpc in RPC_NAMES {
            rpc_time.touch(&[rpc]);
            rpc_seconds.touch(&[rpc]);
            rpc_errors.with_label_values(&[rpc]);
        }
        helper_time.touch(&[]);
        let labelled = |name: &str, help: &str, label: &str, values: &[&str]| {
            let v =
                IntCounterVec::new(opts(name, help), &[label]).unwrap_or_else(|e| defect(name, e));
            register(&registry, name, v.clone());
            for value in values {
                v.with_label_values(&[value]);
            }
            v
        };
        let ignored_reasons: Vec<&str> = choria_wire::replies::Ignored::ALL
            .iter()
            .map(|r| r.reason())
            .collect();

        let bound_name = "choria_provisioner_in_flight_bound";
        let in_flight_bound = IntGaugeVec::new(
            opts(
                bound_name,
                "Sequences a lane lets exchange requests at once: its ceiling, cut while most answers come slowly or the broker drops or refuses us, raised again as answers come quickly",
            ),
            &["lane"],
        )
        .unwrap_or_else(|e| defect(bound_name, e));
        register(&registry, bound_name, in_flight_bound.clone());
        for lane in LANES {
            in_flight_bound.with_label_values(&[lane]);
        }

        Metrics {
            in_flight_bound,
            rpc_time,
            helper_time,
            rpc_seconds,
            sequence_seconds,
            rpc_errors,
            helper_errors: counter(
                "choria_provisioner_helper_errors",
                "How many helper related errors were encountered",
            ),
            template_errors: counter(
                "choria_provisioner_template_errors",
                "How many nodes failed because configuration_template did not render for them",
            ),
            cert_manager_requests: labelled(
                "choria_provisioner_cert_manager_requests",
                "CertificateRequests made for nodes' CSRs, by how they ended",
                "outcome",
                &CERT_MANAGER_OUTCOMES,
            ),
            ca_signatures: labelled(
                "choria_provisioner_ca_signatures",
                "CSRs the built-in CA was asked to sign, by how it ended",
                "outcome",
                &CA_OUTCOMES,
            ),
            helper_shutdowns: counter(
                "choria_provisioner_helper_shutdown_requests",
                // The Go provisioner's help text, typo included.
                "Host many times the helper asked for a node to be shutdown and it succeeded",
            ),
            discovered: counter(
                "choria_provisioner_discovered",
                "How many nodes were found through discovery",
            ),
            event_discovered: counter(
                "choria_provisioner_event_discovered",
                "How many nodes were found through receiving an event about them",
            ),
            discover_cycles: counter(
                "choria_provisioner_discover_cycles",
                "How many discovery cycles were ran",
            ),
            discovery_errors: counter(
                "choria_provisioner_discovery_errors",
                "How many discovery related errors were encountered",
            ),
            provision_errors: counter(
                "choria_provisioner_provision_errors",
                "How many provision related errors were encountered",
            ),
            provisioned: counter(
                "choria_provisioner_provisioned",
                "How many nodes were successfully provisioned",
            ),
            refused_nodes: counter(
                "choria_provisioner_refused_nodes",
                "Refusals of nodes that answered: by the admission policy, evidence, a revocation, held credentials, the token, the CSR or conflicting replies (what the audit stream records as denied or refused); a node refused again at a later discovery counts again",
            ),
            paused: gauge(
                "choria_provisioner_paused",
                "Indicates if the provisioner is paused",
            ),
            busy_workers: gauge(
                "choria_provisioner_busy_workers",
                "How many workers are busy provisioning nodes",
            ),
            work_queue_entries: gauge(
                "choria_provisioner_work_queue_entries",
                "Number of nodes on the work queue waiting to be provisioned",
            ),
            waiting_nodes: gauge(
                "choria_provisioner_waiting_nodes",
                "The number of nodes currently waiting to be provisioned",
            ),
            election_errors: counter(
                "choria_provisioner_election_errors",
                "How many leader election errors were encountered",
            ),
            leader: gauge(
                "choria_provisioner_leader",
                "Indicates if this instance is the elected leader",
            ),
            leadership_transitions: counter(
                "choria_provisioner_leadership_transitions",
                "How many times leadership was gained or lost",
            ),
            ignored_replies: labelled(
                "choria_provisioner_ignored_replies",
                "Messages on a request's reply subject that were not its answer (another sender, another request, undecodable, a repeat, beyond the discovery limit)",
                "reason",
                &ignored_reasons,
            ),
            signed_requests: labelled(
                "choria_provisioner_signed_requests",
                "Signed request messages sent, by RPC: one goes to every node asked the same within request_batch_window (see choria_provisioner_request_targets)",
                RPC,
                &RPC_NAMES,
            ),
            request_targets: labelled(
                "choria_provisioner_request_targets",
                "Nodes the signed request messages went to, by RPC (divided by choria_provisioner_signed_requests: nodes per signature)",
                RPC,
                &RPC_NAMES,
            ),
            conflicting_replies: counter(
                "choria_provisioner_conflicting_replies",
                "Requests that got two different answers claiming to be the same node; the node was not provisioned that cycle",
            ),
            rejected_identities: labelled(
                "choria_provisioner_rejected_identities",
                "Node identities from discovery replies or lifecycle events refused as invalid",
                "source",
                &IDENTITY_SOURCES,
            ),
            rejected_csrs: labelled(
                "choria_provisioner_rejected_csrs",
                "Node CSRs refused, by reason",
                "reason",
                &CSR_REASONS,
            ),
            unconfirmed_events: counter(
                "choria_provisioner_unconfirmed_events",
                "Names from startup events whose first request got no answer in their own name, so nothing confirms they exist (asked again at the next discovery)",
            ),
            dropped_events: counter(
                "choria_provisioner_dropped_events",
                "Startup events dropped because the events lane was full",
            ),
            confirming_nodes: gauge(
                "choria_provisioner_confirming_nodes",
                "Nodes waiting for the reply window of their trusted answers to close",
            ),
            unconfirmed_discoveries: counter(
                "choria_provisioner_unconfirmed_discoveries",
                "Names from discovery replies whose first request got no answer in their own name, so nothing confirms they exist (asked again at the next discovery)",
            ),
            dropped_discoveries: counter(
                "choria_provisioner_dropped_discoveries",
                "Names from discovery replies dropped because the registry was full",
            ),
            pending_nodes: gauge(
                "choria_provisioner_pending_nodes",
                "Nodes found by discovery or events waiting in their lane for their sequence to start",
            ),
            lock_refusals: counter(
                "choria_provisioner_lock_refusals",
                "Requests a node refused because another provisioner holds its provisioning lock; the node was left to that provisioner",
            ),
            records_written: counter(
                "choria_provisioner_records_written",
                "Records of provisionings written to the records bucket",
            ),
            record_errors: counter(
                "choria_provisioner_record_errors",
                "Failed attempts to reach the records store or write a record (retried)",
            ),
            records_dropped: counter(
                "choria_provisioner_records_dropped",
                "Records dropped unwritten because too many were waiting for the records store",
            ),
            records: gauge(
                "choria_provisioner_records",
                "Nodes on record whose credentials expire (renewal: on)",
            ),
            renewals_due: gauge(
                "choria_provisioner_renewals_due",
                "Nodes whose credentials are due for renewal now (inside their renewal window, not yet renewed)",
            ),
            renewals: labelled(
                "choria_provisioner_renewals",
                "Renewal (reprovision) requests by how they ended",
                "outcome",
                &RENEWAL_OUTCOMES,
            ),
            renewals_stranded: gauge(
                "choria_provisioner_renewals_stranded",
                "Nodes on record that renewal will not ask to reprovision because they could not come back: their provisioning JWT expires before they would be provisioned again",
            ),
            sequences: gauge(
                "choria_provisioner_sequences",
                "Node sequences in flight (waiting for replies or working); the busy_workers among them hold a workers slot",
            ),
            ignored_shutdowns: counter(
                "choria_provisioner_ignored_shutdowns",
                "Shutdown events not acted on: the node's shutdown was taken within the last two discovery intervals, or announced already while it was worked or held (a shutdown event is a hint anyone can publish)",
            ),
            shard_records_refused: labelled(
                "choria_provisioner_shard_records_refused",
                "Shard membership records (heartbeats, member Leases) ignored, by reason: not sealed, a seal that is not ours, malformed, an old record again, older than lease_duration and the clock skew allowed, or more members than are counted",
                "reason",
                &SHARD_REFUSED_REASONS,
            ),
            records_refused: labelled(
                "choria_provisioner_records_refused",
                "Values in the records bucket not acted on, by reason: no seal, a seal that is not ours, sealed for another key or site, older than a record already seen, not a record, or a key deleted (the schedule keeps it)",
                "reason",
                &crate::records::sealed::Refusal::ALL.map(|r| r.reason()),
            ),
            memory_read_errors: labelled(
                "choria_provisioner_memory_read_errors",
                "Reads of what the provisioner remembers that failed, by bucket: revocations (nodes are held until they are read again), bindings (the node is refused and retried), records",
                "bucket",
                &MEMORY_BUCKETS,
            ),
            memory_erased: labelled(
                "choria_provisioner_memory_erased",
                "Times a bucket of what the provisioner remembers was found erased in part by someone with more than write access (the JetStream API): deleted and made again, its protection or history changed, or values removed; /readyz fails until the provisioner restarts",
                "bucket",
                &MEMORY_BUCKETS,
            ),
            shard_members: gauge(
                "choria_provisioner_shard_members",
                "Live members of the shards this replica works in (election.mode shards; 0 otherwise)",
            ),
            refused_values: labelled(
                "choria_provisioner_refused_values",
                "Nodes not provisioned because a value would have widened their grant: an interpolated template value refused for the place it lands, or an invalid collective or publish subject for the server JWT",
                "place",
                &REFUSED_PLACES,
            ),
            admission: labelled(
                "choria_provisioner_admission",
                "Nodes evaluated by the admission policy, by its decision (error: it could not be evaluated, and the node was refused)",
                "decision",
                &ADMISSION_DECISIONS,
            ),
            evidence: labelled(
                "choria_provisioner_evidence",
                "Nodes' cloud instance identity evidence, by outcome (every outcome but verified and forged_binding refused the node)",
                "outcome",
                &EVIDENCE_OUTCOMES,
            ),
            revocations: gauge(
                "choria_provisioner_revocations",
                "Identities revoked now (sealed revocations read from the revocations bucket)",
            ),
            held_reprovisions: labelled(
                "choria_provisioner_held_reprovisions",
                "Nodes back in provisioning while they held valid credentials renewal did not ask them to replace (a reinstall, or someone else under their name): flagged and provisioned, or refused with records.exclusive",
                "outcome",
                &HELD_OUTCOMES,
            ),
            revoked_refusals: labelled(
                "choria_provisioner_revoked_refusals",
                "Provisionings and renewals refused because the identity is revoked",
                "action",
                &REVOKED_ACTIONS,
            ),
            audit_events: labelled(
                "choria_provisioner_audit_events",
                "Audit events by what became of them: written to the stream, dropped (too many waiting), or a failed attempt to write (retried)",
                "outcome",
                &AUDIT_OUTCOMES,
            ),
            site: site.to_string(),
            registry,
        }
    }
}

/// The RPC histogram's bounds, in seconds.
const RPC_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// The sequence histogram's bounds, in seconds.
const SEQUENCE_BUCKETS: [f64; 11] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

impl crate::monitor::Exposition for Metrics {
    fn registry(&self) -> &Registry {
        &self.registry
    }

    /// OpenMetrics, the histograms' buckets with their exemplars.
    fn encode_openmetrics(&self) -> String {
        use crate::monitor::openmetrics::{encode, Exemplar as Shown};
        let ours = [&self.rpc_seconds, &self.sequence_seconds];
        encode(&self.registry.gather(), &|family, metric, bucket| {
            let h = ours.iter().find(|h| h.name() == family.name())?;
            let e = h.exemplar(metric.get_label(), bucket)?;
            Some(Shown {
                labels: vec![("trace_id", e.trace_id)],
                value: e.value,
                timestamp: e.timestamp,
            })
        })
    }
}

/// Counts a busy worker while alive.
pub struct GaugeGuard<'a> {
    gauge: &'a IntGauge,
}

/// The guard of [`Metrics::busy_worker`].
pub type BusyWorker<'a> = GaugeGuard<'a>;

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

fn saturating_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The metric definitions are constants, so a failure to build or register
/// one is a bug in this file (the tests construct every metric), not a
/// runtime condition a caller could handle.
fn defect(name: &str, e: prometheus::Error) -> ! {
    panic!("metric {name} is defined wrongly: {e}")
}

fn register(registry: &Registry, name: &str, collector: impl Collector + 'static) {
    registry
        .register(Box::new(collector))
        .unwrap_or_else(|e| defect(name, e));
}

#[cfg(test)]
mod tests;

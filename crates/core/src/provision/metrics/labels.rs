//! The label values every labelled series is created with at 0, one list
//! per label: a dashboard shows zeros for what has not happened yet instead
//! of gaps, and a value outside its list is a bug caught by the tests.

/// Every RPC the provisioner performs, as `agent#action`; the `rpc`-labelled
/// series are pre-created for each of them.
pub const RPC_NAMES: [&str; 8] = [
    "choria_provision#jwt",
    "choria_provision#gen25519",
    "rpcutil#inventory",
    "choria_provision#gencsr",
    "choria_provision#configure",
    "choria_provision#restart",
    "choria_provision#shutdown",
    "choria_provision#release_update",
];

/// Labels of `choria_provisioner_shard_records_refused{reason}`.
pub const SHARD_REFUSED_REASONS: [&str; 6] = [
    "unsigned",
    "signature",
    "invalid",
    "replayed",
    "stale",
    "too_many",
];

/// Labels of `choria_provisioner_cert_manager_requests{outcome}`: what
/// [`super::signing::certmanager::SignError::outcome`] names.
pub const CERT_MANAGER_OUTCOMES: [&str; 5] = ["issued", "denied", "failed", "timeout", "error"];
/// Labels of `choria_provisioner_ca_signatures{outcome}`: a certificate
/// `issued`, a CSR `refused`, or the CA's key `unavailable` (see
/// [`super::signing::ca::CaSignError::outcome`]).
pub const CA_OUTCOMES: [&str; 3] = ["issued", "refused", "unavailable"];
/// Labels of `choria_provisioner_admission{decision}`: what the admission
/// policy decided for a node (`error`: it could not be evaluated, and the
/// node was refused).
pub const ADMISSION_DECISIONS: [&str; 4] = ["allowed", "denied", "deferred", "error"];
/// Labels of `choria_provisioner_evidence{outcome}`: what became of a
/// node's instance identity evidence (`verified`; refused as `missing`,
/// `malformed`, `signature`, `refused` by a rule, `bound_elsewhere`;
/// `forged_binding`: a binding we did not seal was replaced; `error`: the
/// bindings could not be read).
pub const EVIDENCE_OUTCOMES: [&str; 8] = [
    "verified",
    "missing",
    "malformed",
    "signature",
    "refused",
    "bound_elsewhere",
    "forged_binding",
    "error",
];
/// Labels of `choria_provisioner_audit_events{outcome}`.
pub const AUDIT_OUTCOMES: [&str; 3] = ["written", "dropped", "error"];
/// Labels of `choria_provisioner_held_reprovisions{outcome}`.
pub const HELD_OUTCOMES: [&str; 2] = ["flagged", "refused"];
/// Labels of `choria_provisioner_revoked_refusals{action}`.
pub const REVOKED_ACTIONS: [&str; 2] = ["provision", "renewal"];
/// Labels of `choria_provisioner_memory_read_errors{bucket}`.
pub const MEMORY_BUCKETS: [&str; 3] = ["revocations", "bindings", "records"];
/// Labels of `choria_provisioner_renewals{outcome}`.
pub const RENEWAL_OUTCOMES: [&str; 4] = ["sent", "refused", "failed", "cannot_return"];

/// Labels of `choria_provisioner_rejected_identities{source}`.
pub const IDENTITY_SOURCES: [&str; 2] = ["discovery", "event"];
/// Labels of `choria_provisioner_refused_values{place}`: where a value from
/// a node (through a template or the helper) would have landed.
pub const REFUSED_PLACES: [&str; 8] = [
    "setting",
    "list_setting",
    "action_policy",
    "opa_policy",
    "version",
    "collectives",
    "main_collective",
    "pub_subjects",
];
/// Labels of `choria_provisioner_rejected_csrs{reason}`.
pub const CSR_REASONS: [&str; 9] = [
    "unparsable",
    "unsupported_algorithm",
    "bad_signature",
    "common_name_count",
    "common_name",
    "foreign_dns_name",
    "non_dns_san",
    "denied_name",
    "other",
];

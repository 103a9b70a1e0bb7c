//! `spec.telemetry`: a trace per node sequence, exported over OTLP/HTTP
//! (`telemetry:` of `provisioner.yaml`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where the pods send their traces (`telemetry:`). Unset: nothing is
/// traced and no exporter runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TelemetrySpec {
    /// The OTLP/HTTP endpoint of a collector or tracing backend, such as
    /// `http://otel-collector.monitoring:4318`; traces are posted to
    /// `/v1/traces` under it unless it has a path of its own. Plain
    /// `http://` only, without user information, query or fragment: run a
    /// collector in the cluster when traces must leave it over TLS.
    pub otlp_endpoint: String,
    /// The `service.name` the traces carry, at most 128 characters
    /// (default `choria-provisioner`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// Of every hundred node sequences, how many are traced, 1 to 100
    /// (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_percent: Option<i32>,
}

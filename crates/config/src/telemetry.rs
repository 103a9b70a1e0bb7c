//! `telemetry:` (ours): each node's sequence as one trace, exported over
//! OTLP (HTTP, JSON encoding) to a collector or a tracing backend such as
//! Jaeger.
//!
//! ```yaml
//! telemetry:
//!   otlp_endpoint: http://127.0.0.1:4318
//!   service_name: choria-provisioner
//!   sample_percent: 100
//! ```
//!
//! Unset, nothing is traced and nothing is exported.

use super::schema::TelemetryFile;
use super::yaml::{Node, Section};
use super::{ConfigError, ConfigWarning};
use std::path::Path;

pub const DEFAULT_SERVICE_NAME: &str = "choria-provisioner";
/// OTLP/HTTP's path for traces, added to an endpoint given without a path.
pub const OTLP_TRACES_PATH: &str = "/v1/traces";
/// The longest `service_name`, in bytes.
pub const MAX_SERVICE_NAME: usize = 128;
/// What `sample_percent` may be: to trace nothing, leave the section out.
pub const SAMPLE_PERCENTS: std::ops::RangeInclusive<i64> = 1..=100;

/// `telemetry:`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP endpoint as written (`http://host:port[/path]`).
    pub otlp_endpoint: String,
    /// Where traces are posted: the endpoint with [`OTLP_TRACES_PATH`]
    /// when it has no path of its own.
    pub traces_url: String,
    /// The `service.name` the traces carry.
    pub service_name: String,
    /// Of every hundred node sequences, how many are traced (1–100).
    pub sample_percent: u8,
}

impl TelemetryConfig {
    pub fn to_file(&self) -> TelemetryFile {
        TelemetryFile {
            otlp_endpoint: Some(self.otlp_endpoint.clone()),
            service_name: Some(self.service_name.clone()),
            sample_percent: Some(i64::from(self.sample_percent)),
        }
    }

    /// What `run --check` reports.
    pub fn effective(&self) -> String {
        format!(
            "traces to {} as service {}, {}% of node sequences",
            self.traces_url, self.service_name, self.sample_percent
        )
    }
}

pub(crate) fn telemetry(
    file: &Path,
    sec: &Section,
    w: &mut Vec<ConfigWarning>,
) -> Result<Option<TelemetryConfig>, ConfigError> {
    if !sec.is_set("telemetry") {
        return Ok(None);
    }
    let t = Section::new(
        file,
        &format!("{}.", sec.key("telemetry")),
        sec.node("telemetry").cloned().unwrap_or(Node::Null),
        TelemetryFile::KEYS,
        w,
    )?;
    let Some(endpoint) = t.string("otlp_endpoint")?.filter(|e| !e.trim().is_empty()) else {
        // A section without its endpoint is off, as if it were not there.
        return Ok(None);
    };
    let endpoint = endpoint.trim().to_string();
    let traces_url = traces_url(&endpoint).map_err(|e| t.error("otlp_endpoint", e))?;
    let service_name = t
        .string("service_name")?
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.into());
    if !service_name_ok(&service_name) {
        return Err(t.error(
            "service_name",
            "at most 128 characters, no control characters",
        ));
    }
    let sample_percent = match t.int("sample_percent")? {
        None => 100,
        Some(p) if SAMPLE_PERCENTS.contains(&p) => p as u8,
        Some(p) => {
            return Err(t.error(
                "sample_percent",
                format!(
                    "{p} is not a percentage of 1 to 100; to trace nothing, remove otlp_endpoint"
                ),
            ))
        }
    };
    Ok(Some(TelemetryConfig {
        otlp_endpoint: endpoint,
        traces_url,
        service_name,
        sample_percent,
    }))
}

/// Whether `name` may be the traces' `service.name`: at most
/// [`MAX_SERVICE_NAME`] bytes, no control characters.
pub fn service_name_ok(name: &str) -> bool {
    name.len() <= MAX_SERVICE_NAME && !name.chars().any(char::is_control)
}

/// The URL traces are posted to: `http://host[:port]` plus
/// [`OTLP_TRACES_PATH`] when no path is given. Only plain HTTP: the
/// exporter speaks to a collector or agent beside the provisioner. The
/// operator checks `spec.telemetry.otlpEndpoint` with it.
pub fn traces_url(endpoint: &str) -> Result<String, String> {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return Err(if endpoint.starts_with("https://") {
            format!("{endpoint:?}: only http:// is supported; send traces to a collector beside the provisioner (it may forward them over TLS)")
        } else {
            format!("{endpoint:?} is not an http:// URL such as http://127.0.0.1:4318")
        });
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let valid_authority = !authority.is_empty()
        && !authority.contains('@')
        && authority
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-.:[]_".contains(c));
    if !valid_authority {
        return Err(format!(
            "{endpoint:?}: {authority:?} is not a host and port (no user information)"
        ));
    }
    if path.contains(['?', '#']) || path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{endpoint:?}: the path may not hold a query, a fragment or spaces"
        ));
    }
    let path = match path {
        "" | "/" => OTLP_TRACES_PATH,
        p => p,
    };
    Ok(format!("http://{authority}{path}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProvisionerConfig;

    const BASE: &str =
        "configuration_template:\n  configuration:\n    identity: \"{{ identity }}\"\n";

    fn parse(extra: &str) -> Result<ProvisionerConfig, ConfigError> {
        ProvisionerConfig::parse(&format!("{BASE}{extra}"), "provisioner.yaml")
    }

    #[test]
    fn off_unless_an_endpoint_is_set() {
        assert_eq!(parse("").unwrap().telemetry, None);
        assert_eq!(
            parse("telemetry:\n  service_name: x\n").unwrap().telemetry,
            None
        );
    }

    #[test]
    fn the_section_with_its_defaults_and_round_trip() {
        let cfg = parse("telemetry:\n  otlp_endpoint: http://127.0.0.1:4318\n").unwrap();
        let t = cfg.telemetry.clone().unwrap();
        assert_eq!(t.traces_url, "http://127.0.0.1:4318/v1/traces");
        assert_eq!(t.service_name, DEFAULT_SERVICE_NAME);
        assert_eq!(t.sample_percent, 100);
        let text = cfg.to_file().to_yaml().unwrap();
        let again = ProvisionerConfig::parse(&text, "again.yaml").unwrap();
        assert_eq!(again.telemetry, Some(t));
        let set = parse(
            "telemetry:\n  otlp_endpoint: http://jaeger:4318/\n  service_name: site-a\n  sample_percent: 5\n",
        )
        .unwrap()
        .telemetry
        .unwrap();
        assert_eq!(
            (set.service_name.as_str(), set.sample_percent),
            ("site-a", 5)
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        for (extra, key) in [
            (
                "  otlp_endpoint: https://jaeger:4318\n",
                "telemetry.otlp_endpoint",
            ),
            (
                "  otlp_endpoint: http://j:4318\n  sample_percent: 0\n",
                "telemetry.sample_percent",
            ),
            (
                "  otlp_endpoint: http://j:4318\n  sample_percent: 101\n",
                "telemetry.sample_percent",
            ),
            (
                "  otlp_endpoint: http://j:4318\n  service_name: \"a\\tb\"\n",
                "telemetry.service_name",
            ),
        ] {
            let e = parse(&format!("telemetry:\n{extra}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{extra}: {e}");
        }
    }

    #[test]
    fn an_endpoint_without_a_path_gets_otlps_traces_path() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/custom/traces").unwrap(),
            "http://collector:4318/custom/traces"
        );
        assert_eq!(
            traces_url("http://[::1]:4318").unwrap(),
            "http://[::1]:4318/v1/traces"
        );
    }

    #[test]
    fn endpoints_that_are_not_plain_http_are_refused() {
        for bad in [
            "https://collector:4318",
            "collector:4318",
            "http://",
            "http://user:pw@collector:4318",
            "http://collector:4318/v1/traces?x=1",
            "http://coll ector:4318",
        ] {
            assert!(traces_url(bad).is_err(), "{bad} accepted");
        }
    }
}

//! The spec's plain enums (image pull policy, log level) and the schema
//! spelling they share with `election`'s backend: Kubernetes' spelling,
//! with the lower-case one of earlier versions still accepted.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A container image pull policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ImagePullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl ImagePullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ImagePullPolicy::Always => "Always",
            ImagePullPolicy::IfNotPresent => "IfNotPresent",
            ImagePullPolicy::Never => "Never",
        }
    }
}

/// The provisioner's log level (`loglevel` of `provisioner.yaml`), spelt
/// as Kubernetes spells enum values; the lower-case spelling of earlier
/// versions (and of `provisioner.yaml`) is still accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = also_lower_case)]
pub enum LogLevel {
    #[serde(alias = "debug")]
    Debug,
    #[serde(alias = "info")]
    Info,
    #[serde(alias = "warn")]
    Warn,
    #[serde(alias = "error")]
    Error,
    #[serde(alias = "fatal")]
    Fatal,
}

/// An enum's schema that also takes its values' lower-case spelling (the
/// spelling of earlier versions), after the values themselves: one plain
/// string enum (schemars writes documented variants as `oneOf`).
pub(super) fn also_lower_case(schema: &mut schemars::Schema) {
    use serde_json::Value;
    let mut values: Vec<Value> = match schema.get("enum") {
        Some(Value::Array(v)) => v.clone(),
        _ => Vec::new(),
    };
    if let Some(Value::Array(one_of)) = schema.get("oneOf") {
        for v in one_of {
            match (v.get("const"), v.get("enum")) {
                (Some(c), _) => values.push(c.clone()),
                (None, Some(Value::Array(e))) => values.extend(e.iter().cloned()),
                _ => {}
            }
        }
    }
    let lower: Vec<Value> = values
        .iter()
        .filter_map(Value::as_str)
        .map(|v| Value::String(v.to_lowercase()))
        .collect();
    values.extend(lower);
    schema.remove("oneOf");
    schema.insert("type".into(), "string".into());
    schema.insert("enum".into(), Value::Array(values));
}

impl LogLevel {
    /// As `provisioner.yaml` writes it.
    pub fn as_str(self) -> &'static str {
        choria_config::LogLevel::from(self).as_str()
    }
}

impl From<LogLevel> for choria_config::LogLevel {
    fn from(l: LogLevel) -> Self {
        match l {
            LogLevel::Debug => choria_config::LogLevel::Debug,
            LogLevel::Info => choria_config::LogLevel::Info,
            LogLevel::Warn => choria_config::LogLevel::Warn,
            LogLevel::Error => choria_config::LogLevel::Error,
            LogLevel::Fatal => choria_config::LogLevel::Fatal,
        }
    }
}
